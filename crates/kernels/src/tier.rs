//! Instruction-set tiers: which family of kernels runs, detected once at run time.
//!
//! Nothing is compiled for a specific CPU: every SIMD path is behind `#[target_feature]` and is
//! only chosen when the running CPU reports the features (and, for AMX, when the kernel grants
//! the tile state). A tier that this build or this CPU lacks is an error, not a crash.

use std::fmt;
use std::str::FromStr;

/// A family of kernels. Higher tiers fall back to lower ones for operations they do not cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KernelTier {
    /// Portable Rust: the reference every other tier is tested against.
    Scalar,
    /// x86-64 with AVX2 and FMA (and AVX-VNNI where present).
    Avx2,
    /// x86-64 with AVX-512 F/BW/VL and VNNI.
    Avx512,
    /// AVX-512 plus AMX-INT8 tiles for batched products.
    Amx,
    /// aarch64 with NEON and the dot-product extension.
    Neon,
}

impl KernelTier {
    pub const ALL: [KernelTier; 5] =
        [KernelTier::Scalar, KernelTier::Avx2, KernelTier::Avx512, KernelTier::Amx, KernelTier::Neon];

    pub fn name(self) -> &'static str {
        match self {
            KernelTier::Scalar => "scalar",
            KernelTier::Avx2 => "avx2",
            KernelTier::Avx512 => "avx512",
            KernelTier::Amx => "amx",
            KernelTier::Neon => "neon",
        }
    }

    /// Whether this build and this CPU can run the tier.
    pub fn is_available(self) -> bool {
        // Miri interprets no SIMD intrinsics or inline assembly: under it, the scalar tier only
        // (`scripts/test-sanitizers.sh` checks the SIMD tiers with AddressSanitizer instead).
        if cfg!(miri) && self != KernelTier::Scalar {
            return false;
        }
        match self {
            KernelTier::Scalar => true,
            KernelTier::Avx2 => cpu::has_avx2(),
            KernelTier::Avx512 => cpu::has_avx512(),
            KernelTier::Amx => cpu::has_avx512() && cpu::has_vbmi() && cpu::amx_usable(),
            KernelTier::Neon => cpu::has_neon(),
        }
    }

    /// Every tier this machine can run, lowest first.
    pub fn available() -> Vec<KernelTier> {
        KernelTier::ALL.into_iter().filter(|t| t.is_available()).collect()
    }

    /// The best tier this machine can run.
    pub fn best() -> KernelTier {
        *KernelTier::available().last().unwrap_or(&KernelTier::Scalar)
    }
}

impl fmt::Display for KernelTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KernelTier {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        KernelTier::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown kernel tier '{s}' (known: scalar, avx2, avx512, amx, neon)"))
    }
}

#[cfg(target_arch = "x86_64")]
mod cpu {
    pub fn has_avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }

    pub fn has_avx512() -> bool {
        has_avx2()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    }

    /// VBMI and BITALG (byte permutes and bit shuffles), which the AMX tier's weight expansion
    /// uses; every AMX CPU has both.
    pub fn has_vbmi() -> bool {
        is_x86_feature_detected!("avx512vbmi") && is_x86_feature_detected!("avx512bitalg")
    }

    pub fn amx_usable() -> bool {
        crate::amx_perm::request()
    }

    pub fn has_neon() -> bool {
        false
    }
}

#[cfg(target_arch = "aarch64")]
mod cpu {
    pub fn has_avx2() -> bool {
        false
    }
    pub fn has_avx512() -> bool {
        false
    }
    pub fn amx_usable() -> bool {
        false
    }
    pub fn has_vbmi() -> bool {
        false
    }
    pub fn has_neon() -> bool {
        std::arch::is_aarch64_feature_detected!("neon") && std::arch::is_aarch64_feature_detected!("dotprod")
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod cpu {
    pub fn has_avx2() -> bool {
        false
    }
    pub fn has_avx512() -> bool {
        false
    }
    pub fn amx_usable() -> bool {
        false
    }
    pub fn has_vbmi() -> bool {
        false
    }
    pub fn has_neon() -> bool {
        false
    }
}
