//! Quantization steered by an importance matrix (ggml's `quantize_row_*_impl`): the scale
//! search minimises the error weighted by how much each column matters.

use onebit_gguf::GgmlType;

use crate::KernelError;

/// One row of `ty` from `x` with column importances `w` (same length as `x`).
pub(super) fn quantize_row(ty: GgmlType, x: &[f32], y: &mut [u8], w: &[f32]) -> Result<(), KernelError> {
    let _ = (x, y, w);
    Err(KernelError::Unsupported { ty, what: "quantization with an importance matrix" })
}
