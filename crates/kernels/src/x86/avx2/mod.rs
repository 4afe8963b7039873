//! The AVX2 tier (with FMA and F16C, and AVX-VNNI where present): the packed products of the
//! 1-bit and legacy types, dot products of the K-quants (Q2_K to Q6_K), the ternary types (Q2_0,
//! TQ1_0, TQ2_0) and the float types, the activation quantizer, and every vector operation,
//! eight lanes wide. Every weight type the scalar reference knows has an AVX2 kernel.

mod attn;
mod attn_q8;
mod floats;
pub(crate) mod kquants;
mod legacy;
mod matmul;
mod ops;
mod ternary;

use std::arch::x86_64::*;
use std::ops::Range;

use onebit_gguf::GgmlType;

use crate::act::{ActFormat, Acts, quantize_row_ref};
use crate::matmul::{MatRef, OutPtr, RowKernel, TiledFn};
use crate::pack::PackedMat;
use crate::table::Table;

pub(crate) const TABLE: Table = Table {
    row_kernel: kernel,
    quantize_row,
    batch_format: super::q1_batch_format,
    prepare: |pool, acts, w_tys| {
        let lut = if w_tys.contains(&GgmlType::Q1_0) { super::Lut::Bytes } else { super::Lut::None };
        super::prepare_planar(pool, acts, lut, 0)
    },
    pack: crate::pack::Packer::for_type,
    batch_rows: matmul::batch_rows,
    shrinking: (1, 32),
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
    gemm_nt_pages: Some(attn::gemm_nt_pages),
    gemm_nn_acc_pages: Some(attn::gemm_nn_acc_pages),
    scores_q8_0: attn_q8::scores_q8_0,
};

/// The kernel for `ty`: the packed products where the matrix is packed, else dot products.
fn kernel(ty: GgmlType) -> Option<RowKernel> {
    let scalar = crate::scalar::dot::dot_fn(ty)?;
    let f: TiledFn = match ty {
        GgmlType::Q1_0 => |w, r, a, o| packed_or(w, r, a, o, matmul::q1_0_packed),
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
            |w, r, a, o| packed_or(w, r, a, o, legacy::packed)
        }
        GgmlType::Q2_K => return Some(RowKernel::Dot(kquants::dot_q2_k)),
        GgmlType::Q3_K => return Some(RowKernel::Dot(kquants::dot_q3_k)),
        GgmlType::Q4_K => return Some(RowKernel::Dot(kquants::dot_q4_k)),
        GgmlType::Q5_K => return Some(RowKernel::Dot(kquants::dot_q5_k)),
        GgmlType::Q6_K => return Some(RowKernel::Dot(kquants::dot_q6_k)),
        GgmlType::TQ2_0 => return Some(RowKernel::Dot(kquants::dot_tq2_0)),
        GgmlType::TQ1_0 => return Some(RowKernel::Dot(ternary::dot_tq1_0)),
        GgmlType::Q2_0 => return Some(RowKernel::Dot(ternary::dot_q2_0)),
        GgmlType::F32 => return Some(RowKernel::Dot(floats::dot_f32)),
        GgmlType::F16 => return Some(RowKernel::Dot(floats::dot_f16)),
        GgmlType::BF16 => return Some(RowKernel::Dot(floats::dot_bf16)),
        _ => return Some(RowKernel::Dot(scalar)),
    };
    Some(RowKernel::Tiled(f))
}

/// The packed kernel, or the scalar dot product for a matrix that was not packed.
fn packed_or(
    w: &MatRef,
    rows: Range<usize>,
    acts: &Acts,
    out: OutPtr,
    packed: fn(&PackedMat, Range<usize>, &Acts, OutPtr),
) {
    match w.packed {
        Some(p) => packed(p, rows, acts, out),
        None => {
            let dot = crate::scalar::dot::dot_fn(w.ty).expect("a type with a kernel has a reference dot");
            RowKernel::Dot(dot).run(w, rows, acts, out)
        }
    }
}

/// Quantize one activation row, bit for bit as the reference does.
fn quantize_row(format: ActFormat, x: &[f32], out: &mut [u8]) {
    match format {
        // SAFETY: only reachable through the AVX2 table, which is built only when the CPU
        // reports AVX2, FMA and F16C (`KernelTier::is_available`).
        ActFormat::Q8_0 => unsafe { quantize_q8(x, out, false) },
        // SAFETY: as above.
        ActFormat::Q8_1 => unsafe { quantize_q8(x, out, true) },
        // SAFETY: as above.
        ActFormat::Q8_0x4 => unsafe { quantize_q8_0x4(x, out) },
        _ => quantize_row_ref(format, x, out),
    }
}

/// 32 values to 8-bit with scale max|x|/127 (`127/max` applied, ties to even); returns the
/// scale and the sum of the quants.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn q8_block(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    q8_block_with(x, abs_max(&x[..32]), qs)
}

/// The largest magnitude of `x` (whole vectors of eight).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn abs_max(x: &[f32]) -> f32 {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    // A plain loop, not `fold` with a closure (see `legacy::block_sum`: in the test profile the
    // closure's intrinsics stayed out of line).
    let mut m = _mm256_setzero_ps();
    for v in x.chunks_exact(8) {
        // SAFETY: `v` is eight values.
        let v = unsafe { _mm256_loadu_ps(v.as_ptr()) };
        m = _mm256_max_ps(m, _mm256_and_ps(v, abs));
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// 32 values to 8-bit with the scale `amax / 127` (returned, with the sum of the quants).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn q8_block_with(x: &[f32], amax: f32, qs: &mut [i8; 32]) -> (f32, i32) {
    assert!(x.len() >= 32);
    // SAFETY: `x` holds 32 values (just checked).
    let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    const RNE: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    let i: [__m256i; 4] = std::array::from_fn(|k| _mm256_cvtps_epi32(_mm256_round_ps::<RNE>(_mm256_mul_ps(v[k], id))));
    let sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    let s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256::<1>(sum));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)));
    // Pack to bytes: the packs interleave 128-bit lanes, which the final permute undoes.
    let w01 = _mm256_packs_epi32(i[0], i[1]);
    let w23 = _mm256_packs_epi32(i[2], i[3]);
    let b = _mm256_packs_epi16(w01, w23);
    let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: `qs` is 32 bytes.
    unsafe { _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, b) };
    (d, s)
}

/// Q8_0 blocks whose runs of four share the scale max|x|/127 of their 128 values.
#[target_feature(enable = "avx2,fma")]
fn quantize_q8_0x4(x: &[f32], out: &mut [u8]) {
    for (four, xs) in
        crate::formats::blocks_mut::<crate::formats::BlockQ8_0>(out).chunks_exact_mut(4).zip(x.chunks_exact(128))
    {
        let amax = abs_max(xs);
        for (b, xs) in four.iter_mut().zip(xs.chunks_exact(32)) {
            b.d = crate::formats::f32_to_f16(q8_block_with(xs, amax, &mut b.qs).0).to_le_bytes();
        }
    }
}

#[target_feature(enable = "avx2,fma")]
fn quantize_q8(x: &[f32], out: &mut [u8], with_sum: bool) {
    // SAFETY: this function runs only with the features `q8_block` needs.
    unsafe { super::quantize_q8_with(x, out, with_sum, q8_block) }
}
