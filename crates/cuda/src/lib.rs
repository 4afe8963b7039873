//! NVIDIA GPUs for onebit, through the CUDA driver API loaded at run time (`cudarc` with
//! dynamic loading): building needs no CUDA toolkit, and a machine without a driver, NVRTC or
//! device gets a [`CudaError`] at [`Gpu::open`], never a crash.
//!
//! The kernels (`src/kernels/*.cu`) are CUDA C compiled by NVRTC for the device found, once per
//! process, and cached on disk as PTX. They take every GGUF block format in the file's own
//! bytes: weights are uploaded as they are mapped, never converted.
//!
//! This crate knows devices, buffers and kernels; which kernels make a transformer is the
//! model crate's business (`onebit_model`'s CUDA forward pass).

mod compile;
mod gpu;

pub use gpu::{Acts, AttnSplit, Buf, DevPtr, Gpu, Graph, KvElem, MATVEC_TOKENS, MAX_HEAD, q1_split};

use onebit_gguf::GgmlType;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA driver found (libcuda.so): install NVIDIA's driver, or run on the CPU (--device cpu)")]
    NoDriver,
    #[error(
        "NVRTC (libnvrtc.so) not found: install the CUDA toolkit or the nvidia-cuda-nvrtc package and put its lib \
         directory on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    #[error("there is no CUDA device {ordinal}: this machine has {count}")]
    NoDevice { ordinal: usize, count: usize },
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("compiling the CUDA kernels failed: {0}")]
    Compile(String),
    #[error("the CUDA backend cannot multiply {0} weights")]
    Unsupported(GgmlType),
    #[error("{0}")]
    Shape(String),
}

/// Whether the CUDA backend multiplies weights of `ty`.
pub fn supports(ty: GgmlType) -> bool {
    gpu::format_name(ty).is_some()
}
