//! onebit's numeric core: tensor block formats and the kernels that compute with them.
//!
//! - [`formats`]: byte layouts, scalar dequantization and reference quantization for every
//!   supported ggml type. These are the references everything faster is tested against.
//! - [`Kernels`]: one tier's matrix products and vector operations, chosen once at load
//!   ([`KernelTier`]); the portable reference tier lives in [`scalar`].
//! - [`Pool`]: the threads that run them.

// Kernels index several arrays with one counter, mirroring the reference they are checked
// against; iterator chains would hide that correspondence.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "aarch64")]
mod aarch64;
pub mod act;
#[cfg(target_arch = "x86_64")]
mod amx_perm;
mod dispatch;
pub mod formats;
pub mod matmul;
pub mod pack;
pub mod pool;
pub mod scalar;
pub mod tier;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use act::{ActFormat, Acts};
pub use dispatch::{BatchRounding, Kernels};
pub use matmul::MatRef;
pub use pack::PackedMat;
pub use pool::{PerThread, Pool};
pub use tier::KernelTier;

use onebit_gguf::GgmlType;

/// Errors from kernel entry points: a type or tier they cannot handle, or buffers of the wrong size.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{what} is not implemented for tensor type {ty}")]
    Unsupported { ty: GgmlType, what: &'static str },
    #[error("{elements} elements of {ty} need {} bytes, got {bytes}", ty.bytes_for(*elements as u64).map_or("a whole number of blocks".to_string(), |b| b.to_string()))]
    Size { ty: GgmlType, elements: usize, bytes: usize },
    #[error("weights {weights} with {cols} columns do not match activations {acts}")]
    Mismatch { weights: GgmlType, cols: usize, acts: String },
    #[error("kernel tier '{tier}' is not available on this machine (available: {})", available.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "))]
    TierUnavailable { tier: KernelTier, available: Vec<KernelTier> },
}
