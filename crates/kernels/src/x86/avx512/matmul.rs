//! AVX-512 products of quantized weights with 8-bit activations (and f16/bf16/f32 weights with
//! f32 activations): the choice of kernel per type, packed Q1_0 through lookup tables, and the
//! float-weight dots. The types the AMX tiles also multiply keep the tiles' float recipe (see
//! `rows16`), so that either path gives a token the same bits; the others have one path.

use std::arch::x86_64::*;
use std::ops::Range;

use onebit_gguf::GgmlType;

use crate::act::{ActFormat, Acts};
use crate::formats::*;
use crate::matmul::{MatRef, OutPtr, RowKernel, TiledFn};
use crate::pack::{GROUP, PackedMat, Q1_GROUP_BLOCK};
use crate::x86::{PlanarRow, planar_row};

pub(super) fn kernel(ty: GgmlType) -> Option<RowKernel> {
    use super::rows16 as r16;
    use GgmlType::*;
    let f: TiledFn = match ty {
        Q1_0 => q1_0_rows,
        Q2_0 => r16::rows::<r16::Q2_0>,
        Q8_0 => |w, r, a, o| legacy_rows(w, r, a, o, r16::rows::<r16::Q8_0>),
        Q4_0 => |w, r, a, o| legacy_rows(w, r, a, o, r16::rows::<r16::Q4_0>),
        Q4_1 => |w, r, a, o| legacy_rows(w, r, a, o, r16::rows::<r16::Q4_1>),
        Q5_0 => |w, r, a, o| legacy_rows(w, r, a, o, r16::rows::<r16::Q5_0>),
        Q5_1 => |w, r, a, o| legacy_rows(w, r, a, o, r16::rows::<r16::Q5_1>),
        TQ2_0 => r16::rows::<r16::TQ2_0>,
        TQ1_0 => r16::rows::<r16::TQ1_0>,
        F32 => |w, r, a, o| byte_rows(w, r, a, o, dot_f32w),
        F16 => |w, r, a, o| byte_rows(w, r, a, o, dot_f16w),
        BF16 => |w, r, a, o| byte_rows(w, r, a, o, dot_bf16w),
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => return super::kquants::kernel(ty),
        _ => return None,
    };
    Some(RowKernel::Tiled(f))
}

pub(super) type ByteDot = unsafe fn(&[u8], &[u8], usize) -> f32;

/// Q4_0/Q4_1/Q5_0/Q5_1/Q8_0: sixteen rows at a time from the packed layout, else from the rows
/// as they are.
fn legacy_rows(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr, plain: TiledFn) {
    match w.packed {
        Some(_) => super::legacy16::rows(w, rows, acts, out),
        None => plain(w, rows, acts, out),
    }
}

pub(super) fn byte_rows(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr, dot: ByteDot) {
    for r in rows {
        let wr = w.row(r);
        for t in 0..acts.rows() {
            // SAFETY: the table holding this kernel exists only on AVX-512 CPUs; the row owns `r`.
            unsafe { out.write(t, r, dot(wr, acts.row(t), w.cols)) };
        }
    }
}

#[inline(always)]
pub(super) fn d16(b: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(b))
}

/// Q1_0 rows: through lookup tables when the matrix is packed, else sixteen rows at a time
/// from the rows as they are.
fn q1_0_rows(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    match w.packed {
        Some(p) if super::q1_gemm::serves(acts) => super::q1_gemm::rows(p, rows, acts, out),
        Some(p) => q1_0_packed(p, rows, acts, out),
        None => super::rows16::rows::<super::rows16::Q1_0>(w, rows, acts, out),
    }
}

/// Packed Q1_0 (64-row groups) × Q8_0 by lookup: each 4 weight bits index the 16 precomputed
/// sums ±a0±a1±a2±a3 of their activations, for 64 rows per `vpshufb`.
fn q1_0_packed(p: &PackedMat, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    // SAFETY: the table holding this kernel exists only on AVX-512 CPUs.
    unsafe { q1_0_packed_rows(p, rows, acts, out) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn q1_0_packed_rows(p: &PackedMat, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    let nb = p.cols / 128;
    let x4 = acts.format() == ActFormat::Q8_0x4;
    for g in rows.start / GROUP..rows.end.div_ceil(GROUP) {
        let data = p.group(g);
        let row0 = g * GROUP;
        let n = rows.end - row0;
        for t in 0..acts.rows() {
            // SAFETY: this call owns rows `rows` of the output and the masks stop at them.
            unsafe {
                let a = planar_row(acts, t);
                let res = if x4 { lut_group::<true>(data, a, nb) } else { lut_group::<false>(data, a, nb) };
                for (q, v) in res.iter().enumerate() {
                    let mask = ((1u32 << n.saturating_sub(16 * q).min(16)) - 1) as __mmask16;
                    if mask != 0 {
                        _mm512_mask_storeu_ps(out.ptr_at(t, row0 + 16 * q), mask, *v);
                    }
                }
            }
        }
    }
}

/// How many blocks ahead the lookup kernels prefetch their weights.
const PREFETCH_BLOCKS: usize = 2;

/// One 64-row group of a packed Q1_0 matrix against one token: four vectors of 16 rows.
///
/// The float work is the AMX tiles' (see `rows16`): with Q8_0 activations, per 128-block
/// `p = C_0·d_a0`, `p = fma(C_k, d_ak, p)` for the other three 32-blocks, `acc = fma(p, d_w,
/// acc)`; with Q8_0x4 (`X4`: one scale for the 128) the four sums are added as integers (at
/// most 128 · 127, so i16 holds them) and `p = C·d_a`.
///
/// # Safety
/// `data` is a group of a packed Q1_0 matrix of `nb` 128-blocks (`nb · Q1_GROUP_BLOCK` bytes),
/// and `a` a planar row of `128 · nb` values with its lookup tables and `4 · nb` scales.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn lut_group<const X4: bool>(data: &[u8], a: PlanarRow, nb: usize) -> [__m512; 4] {
    let m = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); 4];
    for b in 0..nb {
        // SAFETY: block `b < nb` of the group (the contract).
        let blk = unsafe { data.as_ptr().add(b * Q1_GROUP_BLOCK) };
        // The weights stream from memory once: ask for the block after next now.
        let ahead = data.as_ptr().wrapping_add((b + PREFETCH_BLOCKS) * Q1_GROUP_BLOCK);
        if (b + PREFETCH_BLOCKS) < nb {
            for line in (0..Q1_GROUP_BLOCK).step_by(64) {
                // SAFETY: block `b + PREFETCH_BLOCKS < nb` of the group; a prefetch cannot fault.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.add(line) as *const i8) };
            }
        }
        let mut t = [_mm512_setzero_ps(); 4];
        let mut s_lo = _mm512_setzero_si512();
        let mut s_hi = _mm512_setzero_si512();
        for k in 0..4 {
            if !X4 {
                s_lo = _mm512_setzero_si512();
                s_hi = _mm512_setzero_si512();
            }
            for j in 0..4 {
                // SAFETY: vector `4k + j` of the 16 sign-bit vectors after the block's 64 scales
                // (`2 · GROUP + 16 · 64 = Q1_GROUP_BLOCK` bytes), and the 64 table bytes of
                // value group `32b + 8k + 2j` (two of 32) of the row's `128 · nb / 4` (the
                // contract).
                unsafe {
                    let wv = _mm512_loadu_si512(blk.add(2 * GROUP + (4 * k + j) * 64) as *const _);
                    let lo = _mm512_and_si512(wv, m);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wv), m);
                    let base = a.lut.as_ptr().add(32 * (32 * b + 8 * k + 2 * j));
                    for (off, idx) in [(0, lo), (32, hi)] {
                        let tl = _mm512_broadcast_i32x4(_mm_loadu_si128(base.add(off) as *const __m128i));
                        let th = _mm512_broadcast_i32x4(_mm_loadu_si128(base.add(off + 16) as *const __m128i));
                        let rl = _mm512_shuffle_epi8(tl, idx);
                        let rh = _mm512_shuffle_epi8(th, idx);
                        s_lo = _mm512_add_epi16(s_lo, _mm512_unpacklo_epi8(rl, rh));
                        s_hi = _mm512_add_epi16(s_hi, _mm512_unpackhi_epi8(rl, rh));
                    }
                }
            }
            if X4 && k < 3 {
                continue;
            }
            // SAFETY: scale `4b + k < 4 · nb` of the row (the contract).
            let d = _mm512_set1_ps(unsafe { *a.scales.get_unchecked(4 * b + if X4 { 0 } else { k }) });
            let parts = [
                _mm512_cvtepi16_epi32(_mm512_castsi512_si256(s_lo)),
                _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64::<1>(s_lo)),
                _mm512_cvtepi16_epi32(_mm512_castsi512_si256(s_hi)),
                _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64::<1>(s_hi)),
            ];
            for q in 0..4 {
                let c = _mm512_cvtepi32_ps(parts[q]);
                t[q] = if k == 0 || X4 { _mm512_mul_ps(c, d) } else { _mm512_fmadd_ps(c, d, t[q]) };
            }
        }
        for (q, tq) in t.iter().enumerate() {
            // SAFETY: scales `16q .. 16q + 16` of the block's 64 (f16, at its start).
            let d0 = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32 * q) as *const __m256i)) };
            acc[q] = _mm512_fmadd_ps(*tq, d0, acc[q]);
        }
    }
    // From [`scale_order`] (rows 0-7,16-23 | 32-39,48-55 | 8-15,24-31 | 40-47,56-63) to row order.
    let lo = _mm512_set_epi32(23, 22, 21, 20, 19, 18, 17, 16, 7, 6, 5, 4, 3, 2, 1, 0);
    let hi = _mm512_set_epi32(31, 30, 29, 28, 27, 26, 25, 24, 15, 14, 13, 12, 11, 10, 9, 8);
    [
        _mm512_permutex2var_ps(acc[0], lo, acc[2]),
        _mm512_permutex2var_ps(acc[0], hi, acc[2]),
        _mm512_permutex2var_ps(acc[1], lo, acc[3]),
        _mm512_permutex2var_ps(acc[1], hi, acc[3]),
    ]
}

/// The lanes of a vector of 16 that hold values `i .. n` (all 16 when 16 or more remain).
#[inline(always)]
fn lanes(i: usize, n: usize) -> __mmask16 {
    (((1u32 << (n - i).min(16)) - 1) & 0xffff) as __mmask16
}

// The float-weight dots: rows of any width (their activations are f32, one value a block), so
// the last vector is masked to the row's end.
//
// Safety (all three): `w` holds `n` weights of the type, `a` `n` f32 (`byte_rows` passes a row
// of the matrix and one of the activations, which `Kernels` checked are `cols` wide); the
// features enabled are present (the AVX-512 tier).

#[target_feature(enable = "avx512f")]
unsafe fn dot_f32w(w: &[u8], a: &[u8], n: usize) -> f32 {
    let a: &[f32] = bytemuck::cast_slice(a);
    let mut acc = _mm512_setzero_ps();
    for i in (0..n).step_by(16) {
        let m = lanes(i, n);
        // SAFETY: the lanes of `m` are values `i .. min(i + 16, n)`, inside both rows (the
        // contract above); masked-off lanes are not read.
        unsafe {
            let wv = _mm512_maskz_loadu_ps(m, w.as_ptr().add(4 * i) as *const f32);
            acc = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, a.as_ptr().add(i)), acc);
        }
    }
    _mm512_reduce_add_ps(acc)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn dot_f16w(w: &[u8], a: &[u8], n: usize) -> f32 {
    let a: &[f32] = bytemuck::cast_slice(a);
    let mut acc = _mm512_setzero_ps();
    for i in (0..n).step_by(16) {
        let m = lanes(i, n);
        // SAFETY: as in `dot_f32w`, for 16 halves and 16 floats.
        unsafe {
            let wv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w.as_ptr().add(2 * i) as *const i16));
            acc = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, a.as_ptr().add(i)), acc);
        }
    }
    _mm512_reduce_add_ps(acc)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn dot_bf16w(w: &[u8], a: &[u8], n: usize) -> f32 {
    let a: &[f32] = bytemuck::cast_slice(a);
    let mut acc = _mm512_setzero_ps();
    for i in (0..n).step_by(16) {
        let m = lanes(i, n);
        // SAFETY: as in `dot_f32w`, for 16 bfloat16 and 16 floats.
        unsafe {
            let h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, w.as_ptr().add(2 * i) as *const i16));
            let wv = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h));
            acc = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, a.as_ptr().add(i)), acc);
        }
    }
    _mm512_reduce_add_ps(acc)
}
