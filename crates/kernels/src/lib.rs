//! onebit's numeric core: tensor block formats and the kernels that compute with them.
//!
//! - [`formats`]: byte layouts, scalar dequantization and reference quantization for every
//!   supported ggml type. These are the references everything faster is tested against.

// Kernels index several arrays with one counter, mirroring the reference they are checked
// against; iterator chains would hide that correspondence.
#![allow(clippy::needless_range_loop)]

pub mod formats;

use onebit_gguf::GgmlType;

/// Errors from kernel entry points: a type they cannot handle, or buffers of the wrong size.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{what} is not implemented for tensor type {ty}")]
    Unsupported { ty: GgmlType, what: &'static str },
    #[error("{elements} elements of {ty} need {} bytes, got {bytes}", ty.bytes_for(*elements as u64).map_or("a whole number of blocks".to_string(), |b| b.to_string()))]
    Size {
        ty: GgmlType,
        elements: usize,
        bytes: usize,
    },
}
