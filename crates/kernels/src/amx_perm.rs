//! Permission to use AMX tiles.
//!
//! Linux keeps the 8 KiB tile-data state off for processes until they ask for it with
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; an AMX instruction before that is a
//! SIGILL. The request is made once per process, and only where CPUID reports AMX-TILE and
//! AMX-INT8 (stable Rust cannot yet detect those features, so CPUID is read directly).

use std::sync::OnceLock;

/// Whether AMX-INT8 is present and this process may use it (asking the kernel the first time).
pub fn request() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| cpu_has_amx_int8() && ask_kernel())
}

#[cfg(target_arch = "x86_64")]
fn cpu_has_amx_int8() -> bool {
    // CPUID leaf 7, sub-leaf 0, EDX: bit 24 AMX-TILE, bit 25 AMX-INT8.
    let max_leaf = std::arch::x86_64::__cpuid(0).eax;
    if max_leaf < 7 {
        return false;
    }
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    (edx >> 24) & 1 == 1 && (edx >> 25) & 1 == 1
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_has_amx_int8() -> bool {
    false
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn ask_kernel() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call with integer arguments; it only changes this process's
    // permitted extended-state features.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn ask_kernel() -> bool {
    false
}
