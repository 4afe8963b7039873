//! The portable reference tier: every operation in plain Rust, written for clarity. Each SIMD
//! tier is tested against these functions.

pub mod dot;
pub mod ops;

use crate::dispatch::Table;
use crate::matmul::RowKernel;

pub(crate) static TABLE: Table = Table {
    row_kernel: |ty| dot::dot_fn(ty).map(RowKernel::Dot),
    quantize_row: crate::act::quantize_row_ref,
    prepare: |_, _, _| {},
    pack: |_, _| None,
    rms_norm: ops::rms_norm,
    softmax: ops::softmax,
    silu_mul: ops::silu_mul,
    dot_f32: ops::dot_f32,
    dot_f16: ops::dot_f16,
    axpy_f32: ops::axpy_f32,
    axpy_f16: ops::axpy_f16,
};
