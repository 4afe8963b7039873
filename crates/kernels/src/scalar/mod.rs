//! The portable reference tier: every operation in plain Rust, written for clarity. Each SIMD
//! tier is tested against these functions.

pub mod dot;
pub mod ops;

use crate::matmul::RowKernel;
use crate::table::Table;

pub(crate) static TABLE: Table = Table {
    row_kernel: |ty| dot::dot_fn(ty).map(RowKernel::Dot),
    quantize_row: crate::act::quantize_row_ref,
    batch_format: crate::table::same_format,
    prepare: |_, _, _| {},
    pack: |_| None,
    batch_rows: crate::table::default_batch_rows,
    shrinking: (2, 32),
    rms_norm: ops::rms_norm,
    softmax: ops::softmax,
    silu_mul: ops::silu_mul,
    gelu_mul: ops::gelu_mul,
    dot_f32: ops::dot_f32,
    f16_to_f32: ops::f16_to_f32,
    f32_to_f16: ops::f32_to_f16,
    round_f16: ops::round_f16,
    gemm_nt: ops::gemm_nt,
    gemm_nn_acc: ops::gemm_nn_acc,
    gemm_nt_pages: None,
    gemm_nn_acc_pages: None,
    scores_q8_0: ops::scores_q8_0,
};
