//! The AVX-512 tier (F/BW/VL/VNNI): 8-bit integer dot products with `vpdpbusd`, 16 lanes of
//! f32 for everything else. Types without a kernel here use the scalar reference.

mod attn;
mod attn_q8;
mod kquants;
pub(super) mod legacy16;
pub(super) mod matmul;
mod ops;
mod q1_gemm;
mod rows16;

pub(crate) use ops::transpose16;

use std::arch::x86_64::*;
use std::ops::Range;

use onebit_gguf::GgmlType;

use crate::act::{ActFormat, Acts, quantize_row_ref};
use crate::matmul::{MatRef, OutPtr, RowKernel, TiledFn};
use crate::table::Table;

pub(crate) const TABLE: Table = Table {
    row_kernel,
    quantize_row,
    batch_format: super::q1_batch_format,
    // The lookup tables serve only products that take the lookup kernel.
    prepare: |pool, acts, w_tys| {
        let lut = w_tys.contains(&GgmlType::Q1_0) && !q1_gemm::serves(acts);
        super::prepare_planar(pool, acts, if lut { super::Lut::Words } else { super::Lut::None }, 0)
    },
    pack: crate::pack::Packer::for_type,
    batch_rows: crate::table::default_batch_rows,
    shrinking: (2, 32),
    rms_norm: ops::rms_norm,
    softmax: ops::softmax,
    silu_mul: ops::silu_mul,
    gelu_mul: ops::gelu_mul,
    dot_f32: ops::dot_f32,
    f16_to_f32: attn::f16_to_f32,
    f32_to_f16: attn::f32_to_f16,
    round_f16: attn::round_f16,
    gemm_nt: attn::gemm_nt,
    gemm_nn_acc: attn::gemm_nn_acc,
    gemm_nt_pages: Some(attn::gemm_nt_pages),
    gemm_nn_acc_pages: Some(attn::gemm_nn_acc_pages),
    scores_q8_0: attn_q8::scores_q8_0,
};

/// [`TABLE`] for Intel CPUs (AVX-512 without AMX): the same kernels, asking for the weights
/// they stream as Sapphire Rapids wants (see [`kernel`]), and one token's products in
/// shrinking pieces as there (see `dispatch::shrinking_unit`).
pub(crate) const TABLE_INTEL: Table = Table { row_kernel: row_kernel_for::<true>, shrinking: (1, 32), ..TABLE };

/// The kernel for `ty` as [`TABLE`] has it (the weights asked for ahead as on AMD).
pub(crate) fn row_kernel(ty: GgmlType) -> Option<RowKernel> {
    row_kernel_for::<false>(ty)
}

/// `INTEL`: see [`kernel`].
fn row_kernel_for<const INTEL: bool>(ty: GgmlType) -> Option<RowKernel> {
    kernel::<INTEL>(ty).or_else(|| crate::scalar::dot::dot_fn(ty).map(RowKernel::Dot))
}

/// The kernel for `ty`. `INTEL`: the Q1_0 lookup tables and the 16-row legacy kernels ask for
/// the weights ahead as on Sapphire Rapids (the `amx` tier), for Intel CPUs without AMX, whose
/// hardware prefetcher also stops at every 4 KiB page; else as measured on AMD Zen 4 (see
/// [`LutAhead`] and `legacy16::Ahead`).
fn kernel<const INTEL: bool>(ty: GgmlType) -> Option<RowKernel> {
    use GgmlType::*;
    use rows16 as r16;
    let f: TiledFn = match ty {
        Q1_0 => matmul::q1_0_rows::<INTEL>,
        Q2_0 => r16::rows::<r16::Q2_0>,
        Q8_0 => |w, r, a, o| legacy_rows::<INTEL>(w, r, a, o, r16::rows::<r16::Q8_0>),
        Q4_0 => |w, r, a, o| legacy_rows::<INTEL>(w, r, a, o, r16::rows::<r16::Q4_0>),
        Q4_1 => |w, r, a, o| legacy_rows::<INTEL>(w, r, a, o, r16::rows::<r16::Q4_1>),
        Q5_0 => |w, r, a, o| legacy_rows::<INTEL>(w, r, a, o, r16::rows::<r16::Q5_0>),
        Q5_1 => |w, r, a, o| legacy_rows::<INTEL>(w, r, a, o, r16::rows::<r16::Q5_1>),
        TQ2_0 => r16::rows::<r16::TQ2_0>,
        TQ1_0 => r16::rows::<r16::TQ1_0>,
        F32 => |w, r, a, o| matmul::byte_rows(w, r, a, o, matmul::dot_f32w),
        F16 => |w, r, a, o| matmul::byte_rows(w, r, a, o, matmul::dot_f16w),
        BF16 => |w, r, a, o| matmul::byte_rows(w, r, a, o, matmul::dot_bf16w),
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => return kquants::kernel(ty),
        _ => return None,
    };
    Some(RowKernel::Tiled(f))
}

/// Q4_0/Q4_1/Q5_0/Q5_1/Q8_0: sixteen rows at a time from the packed layout, else from the rows
/// as they are.
fn legacy_rows<const INTEL: bool>(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr, plain: TiledFn) {
    use legacy16::Ahead;
    match w.packed {
        Some(_) => legacy16::rows(w, rows, acts, out, if INTEL { Ahead::Kib8 } else { Ahead::None }),
        None => plain(w, rows, acts, out),
    }
}

/// Quantize one activation row, bit for bit as the reference does.
pub(crate) fn quantize_row(format: ActFormat, x: &[f32], out: &mut [u8]) {
    match format {
        // SAFETY: only reachable through the AVX-512 table, which is built only when the CPU
        // reports AVX-512 F/BW/VL (`KernelTier::is_available`).
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
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn q8_block(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    assert!(x.len() >= 32);
    // SAFETY: two vectors of 16 inside `x` (just checked).
    let (v0, v1) = unsafe { (_mm512_loadu_ps(x.as_ptr()), _mm512_loadu_ps(x.as_ptr().add(16))) };
    q8_block_with(x, _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1))), qs)
}

/// 32 values to 8-bit with the scale `amax / 127` (returned, with the sum of the quants).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn q8_block_with(x: &[f32], amax: f32, qs: &mut [i8; 32]) -> (f32, i32) {
    assert!(x.len() >= 32);
    // SAFETY: two vectors of 16 inside `x` (just checked).
    let (v0, v1) = unsafe { (_mm512_loadu_ps(x.as_ptr()), _mm512_loadu_ps(x.as_ptr().add(16))) };
    let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    const RNE: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    let i0 = _mm512_cvtps_epi32(_mm512_roundscale_ps::<RNE>(_mm512_mul_ps(v0, id)));
    let i1 = _mm512_cvtps_epi32(_mm512_roundscale_ps::<RNE>(_mm512_mul_ps(v1, id)));
    let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    // To bytes in registers (the quants lie within ±127): `vpackssdw` and `vpacksswb` leave
    // 128-bit lane i holding i0[4i .. 4i + 4], then i1[4i .. 4i + 4], and a permutation puts
    // them in order. (Narrowing stores, `vpmovsdb` to memory, take many cycles on Zen 4.)
    // SAFETY: 16 i32.
    let order =
        unsafe { _mm512_loadu_si512([0i32, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0].as_ptr() as *const _) };
    let words = _mm512_packs_epi32(i0, i1);
    let bytes = _mm512_permutexvar_epi32(order, _mm512_packs_epi16(words, words));
    // SAFETY: one store of 32 bytes into the 32 of `qs`.
    unsafe { _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, _mm512_castsi512_si256(bytes)) };
    (amax / 127.0, sum)
}

/// Q8_0 blocks whose runs of four share the scale max|x|/127 of their 128 values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn quantize_q8_0x4(x: &[f32], out: &mut [u8]) {
    for (four, xs) in
        crate::formats::blocks_mut::<crate::formats::BlockQ8_0>(out).chunks_exact_mut(4).zip(x.chunks_exact(128))
    {
        let amax = (0..8).fold(_mm512_setzero_ps(), |m, i| {
            // SAFETY: `xs` holds 128 values, eight vectors.
            _mm512_max_ps(m, _mm512_abs_ps(unsafe { _mm512_loadu_ps(xs.as_ptr().add(16 * i)) }))
        });
        let amax = _mm512_reduce_max_ps(amax);
        for (b, xs) in four.iter_mut().zip(xs.chunks_exact(32)) {
            b.d = crate::formats::f32_to_f16(q8_block_with(xs, amax, &mut b.qs).0).to_le_bytes();
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn quantize_q8(x: &[f32], out: &mut [u8], with_sum: bool) {
    // SAFETY: this function runs only with the features `q8_block` needs.
    unsafe { super::quantize_q8_with(x, out, with_sum, q8_block) }
}
