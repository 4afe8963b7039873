//! The kernels' source, compiled by NVRTC for one compute capability and kept as PTX in
//! `~/.cache/onebit/cuda/` (keyed by the source, the architecture and NVRTC's version), so that
//! only the first run on a machine pays the compile.

use std::path::PathBuf;

use cudarc::nvrtc::{CompileOptions, Ptx};

use crate::CudaError;

/// Every kernel, in one translation unit (the order matters: formats, then their users).
pub(crate) const SOURCE: &str = concat!(
    include_str!("kernels/formats.cuh"),
    include_str!("kernels/matvec.cu"),
    include_str!("kernels/ops.cu"),
    include_str!("kernels/q1.cu")
);

/// 64-bit FNV-1a: a hash that stays the same from build to build.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("onebit").join("cuda"))
}

/// PTX of [`SOURCE`] for compute capability `major.minor`.
pub(crate) fn ptx_for(major: i32, minor: i32) -> Result<Ptx, CudaError> {
    // SAFETY: only looks for the library by name (dlopen), calling nothing in it.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::NoNvrtc);
    }
    let (mut nv_major, mut nv_minor) = (0, 0);
    // SAFETY: the library is present (above); the call writes two ints we own.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut nv_major, &mut nv_minor) };
    let arch = format!("compute_{major}{minor}");
    let key = fnv1a(format!("{SOURCE}\0{arch}\0{nv_major}.{nv_minor}").as_bytes());
    let cached = cache_dir().map(|d| d.join(format!("kernels-{arch}-{key:016x}.ptx")));
    if let Some(text) = cached.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        return Ok(Ptx::from_src(text));
    }
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        ..CompileOptions::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts).map_err(|e| CudaError::Compile(format!("{e}")))?;
    if let Some(path) = cached {
        // A cache that cannot be written only costs the next run a compile.
        let _ = path.parent().map(std::fs::create_dir_all);
        let _ = std::fs::write(&path, ptx.to_src());
    }
    Ok(ptx)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles the kernels where NVRTC is installed (no GPU needed), so that a syntax error
    /// shows without a device; elsewhere says why it checked nothing.
    #[test]
    fn kernels_compile_with_nvrtc() {
        // SAFETY: looks for the library by name only.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("NVRTC not found: the CUDA kernels were not compiled");
            return;
        }
        let opts = CompileOptions { options: vec!["--gpu-architecture=compute_80".into()], ..Default::default() };
        if let Err(e) = cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts) {
            panic!("{e}");
        }
    }
}
