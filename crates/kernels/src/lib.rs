//! onebit's numeric core: tensor block formats and the kernels that compute with them.
//!
//! - [`formats`]: byte layouts, scalar dequantization and reference quantization for every
//!   supported ggml type. These are the references everything faster is tested against.
//! - [`Kernels`]: one tier's matrix products and vector operations, chosen once at load
//!   ([`KernelTier`]); the portable reference tier lives in [`scalar`].
//! - [`Pool`]: the threads that run them, and [`DisjointRows`] for the rows they write.

// Kernels index several arrays with one counter, mirroring the reference they are checked
// against; iterator chains would hide that correspondence.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "aarch64")]
mod aarch64;
pub mod act;
#[cfg(target_arch = "x86_64")]
mod amx_perm;
pub mod arena;
pub mod disjoint;
mod dispatch;
pub mod formats;
pub mod matmul;
pub mod pack;
mod pack_cache;
pub mod pool;
pub mod scalar;
mod table;
#[cfg(all(test, target_arch = "x86_64"))]
mod test_rng;
pub mod tier;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use act::{ActFormat, Acts};
pub use disjoint::DisjointRows;
pub use dispatch::{BatchRounding, Glu, Kernels};
pub use matmul::MatRef;
pub use pack::{PackedMat, PackedStore, Packer};
pub use pool::{PerThread, Pool};
pub use table::{MAX_HEAD, Pages};
pub use tier::KernelTier;

use onebit_gguf::GgmlType;

/// Ask for the cache lines of `bytes` ahead of reading or writing them. Stores to lines that
/// are not in the cache complete one after another (each waits for its line), so scattered rows
/// written cold (a KV cache's new positions) are much faster when their lines are requested
/// together first. A hint: it changes no value, and does nothing where the CPU has no prefetch.
#[inline]
pub fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..bytes.len()).step_by(64) {
        // SAFETY: a prefetch of an address inside the slice; prefetches cannot fault.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(bytes.as_ptr().add(off) as *const i8)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Errors from kernel entry points: a type or tier they cannot handle, or buffers of the wrong size.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{what} is not implemented for tensor type {ty}")]
    Unsupported { ty: GgmlType, what: &'static str },
    #[error("{elements} elements of {ty} need {} bytes, got {bytes}", ty.bytes_for(*elements as u64).map_or("a whole number of blocks".to_string(), |b| b.to_string()))]
    Size { ty: GgmlType, elements: usize, bytes: usize },
    #[error("weights {weights} with {cols} columns do not match activations {acts}")]
    Mismatch { weights: GgmlType, cols: usize, acts: String },
    /// Arguments whose lengths do not fit together (e.g. values that are not whole rows).
    #[error("{0}")]
    Shape(String),
    #[error("kernel tier '{tier}' is not available on this machine (available: {})", available.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "))]
    TierUnavailable { tier: KernelTier, available: Vec<KernelTier> },
}
