//! The NEON tier (with the dot-product extension, `sdot`): integer dot products of the 1-bit,
//! ternary and legacy types with 8-bit activations, and the f32 products of attention. Types
//! without a NEON kernel, and the remaining vector operations, use the scalar reference.

mod dot;
mod ops;

use std::arch::aarch64::*;
use std::arch::asm;

use crate::matmul::RowKernel;
use crate::scalar;
use crate::table::Table;

pub(crate) const TABLE: Table = Table {
    row_kernel: |ty| dot::dot_fn(ty).or_else(|| scalar::dot::dot_fn(ty)).map(RowKernel::Dot),
    quantize_row: crate::act::quantize_row_ref,
    batch_format: crate::table::same_format,
    prepare: |_, _, _| {},
    pack: |_| None,
    batch_rows: crate::table::default_batch_rows,
    shrinking: (2, 32),
    rms_norm: scalar::ops::rms_norm,
    softmax: scalar::ops::softmax,
    silu_mul: scalar::ops::silu_mul,
    gelu_mul: scalar::ops::gelu_mul,
    dot_f32: ops::dot_f32,
    f16_to_f32: scalar::ops::f16_to_f32,
    f32_to_f16: scalar::ops::f32_to_f16,
    round_f16: scalar::ops::round_f16,
    gemm_nt: ops::gemm_nt,
    gemm_nn_acc: ops::gemm_nn_acc,
    gemm_nt_pages: None,
    gemm_nn_acc_pages: None,
    scores_q8_0: crate::scalar::ops::scores_q8_0,
};

/// `acc + Σ` of four byte products per 32-bit lane (`sdot`; its intrinsic is not stable yet).
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: `sdot` reads and writes only these registers; the feature is enabled.
    unsafe {
        asm!("sdot {0:v}.4s, {1:v}.16b, {2:v}.16b", inout(vreg) acc, in(vreg) a, in(vreg) b,
             options(pure, nomem, nostack));
    }
    acc
}
