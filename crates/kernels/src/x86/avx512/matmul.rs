//! AVX-512 products of quantized weights with 8-bit activations (and f16/bf16/f32 weights with
//! f32 activations): packed Q1_0 through lookup tables, and the float-weight dots (the choice
//! of kernel per type is the tier's, in `mod.rs`). The types the AMX tiles also multiply keep
//! the tiles' float recipe (see `rows16`), so that either path gives a token the same bits; the
//! others have one path.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::act::{ActFormat, Acts};
use crate::formats::*;
use crate::matmul::{MatRef, OutPtr};
use crate::pack::{GROUP, PackedMat, Q1_GROUP_BLOCK};
use crate::x86::{Lut, LutAhead, PlanarRow, WORD_TABLES_BLOCK, WORD_TABLES_HIGH, planar_row, with_tables};

use super::q1_gemm::{block_scales, rows_from, scale_picks};

pub(super) type ByteDot = unsafe fn(&[u8], &[u8], usize) -> f32;

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
pub(super) fn q1_0_rows<const INTEL: bool>(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    q1_0_rows_ahead(w, rows, acts, out, if INTEL { LutAhead::L2AndL1 } else { LutAhead::L2 })
}

/// [`q1_0_rows`], the lookup kernel asking for the weights ahead as `ahead` says (each tier
/// its own, see [`LutAhead`]).
pub(crate) fn q1_0_rows_ahead(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr, ahead: LutAhead) {
    match w.packed {
        Some(p) if super::q1_gemm::serves(acts) => super::q1_gemm::rows(p, rows, acts, out),
        Some(p) => q1_0_packed(p, rows, acts, out, ahead),
        None => super::rows16::rows::<super::rows16::Q1_0>(w, rows, acts, out),
    }
}

/// Packed Q1_0 (64-row groups) × Q8_0 by lookup: each 4 weight bits index the 16 precomputed
/// sums ±a0±a1±a2±a3 of their activations, for 32 rows per `vpermw`.
fn q1_0_packed(p: &PackedMat, rows: Range<usize>, acts: &Acts, out: OutPtr, ahead: LutAhead) {
    // SAFETY: the tables holding this kernel exist only on AVX-512 CPUs.
    unsafe {
        match ahead {
            LutAhead::L2 => q1_0_packed_rows::<false>(p, rows, acts, out),
            LutAhead::L2AndL1 => q1_0_packed_rows::<true>(p, rows, acts, out),
        }
    }
}

/// `L1`: ask for the weights ahead as [`crate::x86::prefetch_ahead_l1`] does, else as
/// [`crate::x86::prefetch_ahead`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn q1_0_packed_rows<const L1: bool>(p: &PackedMat, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    let nb = p.cols / 128;
    let x4 = acts.format() == ActFormat::Q8_0x4;
    with_tables(acts, Lut::Words, |tables| {
        for g in rows.start / GROUP..rows.end.div_ceil(GROUP) {
            let data = p.group(g);
            let row0 = g * GROUP;
            let n = rows.end - row0;
            // Tokens up to four at a time: each vector of weight bits is loaded, and its indices
            // made, once for all of them (a second token cost as much as the first, the
            // lookups' arithmetic as long as the weights' reading).
            let mut t = 0;
            while t < acts.rows() {
                // SAFETY: this call owns rows `rows` of the output and the masks stop at them;
                // each token's tables hold its `p.cols` values.
                t += unsafe {
                    match acts.rows() - t {
                        4.. => token_group::<4, L1>(x4, data, acts, &tables, t, nb, row0, n, out),
                        3 => token_group::<3, L1>(x4, data, acts, &tables, t, nb, row0, n, out),
                        2 => token_group::<2, L1>(x4, data, acts, &tables, t, nb, row0, n, out),
                        _ => token_group::<1, L1>(x4, data, acts, &tables, t, nb, row0, n, out),
                    }
                };
            }
        }
    })
}

/// Tokens `t .. t + T` against one 64-row group (rows `row0 ..`, `n` of them owned), stored;
/// returns `T`.
///
/// # Safety
/// As for [`lut_group`], with `tables` those of `acts`; this call owns the rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn token_group<const T: usize, const L1: bool>(
    x4: bool,
    data: &[u8],
    acts: &Acts,
    tables: &crate::x86::Tables,
    t: usize,
    nb: usize,
    row0: usize,
    n: usize,
    out: OutPtr,
) -> usize {
    let a: [PlanarRow; T] = std::array::from_fn(|i| planar_row(acts, t + i));
    let lut: [&[u8]; T] = std::array::from_fn(|i| tables.row(t + i));
    // SAFETY: the caller's contract.
    let res = unsafe {
        if x4 { lut_group::<true, L1, T>(data, a, lut, nb) } else { lut_group::<false, L1, T>(data, a, lut, nb) }
    };
    for (i, res) in res.iter().enumerate() {
        for (q, v) in res.iter().enumerate() {
            let mask = ((1u32 << n.saturating_sub(16 * q).min(16)) - 1) as __mmask16;
            if mask != 0 {
                // SAFETY: the caller owns these rows; the mask stops at them.
                unsafe { _mm512_mask_storeu_ps(out.ptr_at(t + i, row0 + 16 * q), mask, *v) };
            }
        }
    }
    T
}

/// One 64-row group of a packed Q1_0 matrix against `T` tokens (one to four): per token, four
/// vectors of 16 rows, in row order. Each token's sums and float work are what it gets alone;
/// only the loads of the bits and their indices are shared. Two tokens cost about 1.1 times
/// one in arithmetic (`gemm_speed q1_0 2 1 2048 2048 avx512`, one thread, on a Xeon without
/// AMX: 161–170 G multiply-adds a second against 141–152 for one token) and read the weights
/// once: two sequences of the Bonsai-1.7B shape decoded 90–91 → 122–127 tokens/s
/// (`batched-bench -npl 2`), the single sequence the same.
///
/// Each 64-byte vector of weight bits (byte r: row r's eight weights of values `8v .. 8v + 8`)
/// is read as 32 words, word i holding rows 2i and 2i + 1; three shifts make the indices from
/// it: bits 0-4 and 5-7 of the even rows and of the odd rows. The tables (`Lut::Words`) are the
/// 32 sums of values 0-4, looked up by one `vpermw` for 32 rows (which reads only an index's
/// low five bits), and the 8 sums of values 5-7, broadcast to four copies (so bits 3-4 of their
/// index, the next row's, do not matter). The sums come out for the even rows (0, 2, … 30;
/// 32, … 62) and the odd rows, and go back to row order at the end.
///
/// The float work is the AMX tiles' (see `rows16`): with Q8_0 activations, per 128-block
/// `p = C_0·d_a0`, `p = fma(C_k, d_ak, p)` for the other three 32-blocks, `acc = fma(p, d_w,
/// acc)`; with Q8_0x4 (`X4`: one scale for the 128) the four sums are added as integers (at
/// most 128 · 128, so i16 holds them) and `p = C·d_a`. Only the lanes differ from the other
/// kernels, not the operations a row's value goes through.
///
/// # Safety
/// `data` is a group of a packed Q1_0 matrix of `nb` 128-blocks (`nb · Q1_GROUP_BLOCK` bytes),
/// each of `a` a planar row of `128 · nb` values with `4 · nb` scales, and the same of `lut`
/// its lookup tables as words (`nb · WORD_TABLES_BLOCK` bytes).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn lut_group<const X4: bool, const L1: bool, const T: usize>(
    data: &[u8],
    a: [PlanarRow; T],
    lut: [&[u8]; T],
    nb: usize,
) -> [[__m512; 4]; T] {
    const EVEN: [i32; 16] = scale_picks(rows_from(0, 2));
    const ODD: [i32; 16] = scale_picks(rows_from(1, 2));
    const FIRST: [i32; 16] = [0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23];
    const SECOND: [i32; 16] = [8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31];
    // SAFETY: each constant is 16 i32.
    let [even, odd, first, second] =
        [EVEN, ODD, FIRST, SECOND].map(|c| unsafe { _mm512_loadu_si512(c.as_ptr() as *const _) });
    // Per token, lanes of `acc`: even rows 0-30, odd rows 1-31, even rows 32-62, odd rows 33-63.
    let mut acc = [[_mm512_setzero_ps(); 4]; T];
    for b in 0..nb {
        // SAFETY: block `b < nb` of the group (the contract).
        let blk = unsafe { data.as_ptr().add(b * Q1_GROUP_BLOCK) };
        // The weights stream from memory once: the scales' lines here, each vector of bits
        // beside its lookups (`lut_sums`; a burst of the block's 18 lines at once left a core
        // waiting).
        ahead::<L1>(blk, 2 * GROUP);
        // SAFETY: each token's tables of the block's 128 values (the contract).
        let luts: [*const u8; T] = std::array::from_fn(|i| unsafe { lut[i].as_ptr().add(WORD_TABLES_BLOCK * b) });
        // SAFETY: the block's 16 vectors of sign bits and the tokens' tables (the contract).
        let sums = |vs: Range<usize>| unsafe { lut_sums::<L1, T>(blk.add(2 * GROUP), luts, vs) };
        // SAFETY: scale `4b + k < 4 · nb` of each row (the contract).
        let scale = |i: usize, k: usize| _mm512_set1_ps(unsafe { *a[i].scales.get_unchecked(4 * b + k) });
        let mut t = [[_mm512_setzero_ps(); 4]; T];
        if X4 {
            let s = sums(0..16);
            for i in 0..T {
                let (c, d) = (widen(s[i]), scale(i, 0));
                for q in 0..4 {
                    t[i][q] = _mm512_mul_ps(_mm512_cvtepi32_ps(c[q]), d);
                }
            }
        } else {
            for k in 0..4 {
                let s = sums(4 * k..4 * k + 4);
                for i in 0..T {
                    let (c, d) = (widen(s[i]), scale(i, k));
                    for q in 0..4 {
                        let c = _mm512_cvtepi32_ps(c[q]);
                        t[i][q] = if k == 0 { _mm512_mul_ps(c, d) } else { _mm512_fmadd_ps(c, d, t[i][q]) };
                    }
                }
            }
        }
        // SAFETY: a block of the group (the contract).
        let scales = unsafe { block_scales(blk, [even, odd]) };
        for i in 0..T {
            for q in 0..4 {
                acc[i][q] = _mm512_fmadd_ps(t[i][q], scales[q], acc[i][q]);
            }
        }
    }
    let mut res = [[_mm512_setzero_ps(); 4]; T];
    for i in 0..T {
        res[i] = [
            _mm512_permutex2var_ps(acc[i][0], first, acc[i][1]),
            _mm512_permutex2var_ps(acc[i][0], second, acc[i][1]),
            _mm512_permutex2var_ps(acc[i][2], first, acc[i][3]),
            _mm512_permutex2var_ps(acc[i][2], second, acc[i][3]),
        ];
    }
    res
}

/// The exact sums of the weight vectors `vs` of a block against each token's tables, for the
/// even rows and for the odd rows of a group (see [`lut_group`]): the bits are loaded and their
/// indices made once for all `T` tokens.
///
/// # Safety
/// `bits` points at a block's 16 vectors of sign bits, each of `lut` at the word tables of its
/// 128 values (`WORD_TABLES_BLOCK` bytes); AVX-512 F/BW.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn lut_sums<const L1: bool, const T: usize>(
    bits: *const u8,
    lut: [*const u8; T],
    vs: Range<usize>,
) -> [(__m512i, __m512i); T] {
    let mut sums = [(_mm512_setzero_si512(), _mm512_setzero_si512()); T];
    for v in vs {
        ahead::<L1>(bits.wrapping_add(64 * v), 64);
        // SAFETY: vector `v < 16` of the bits (the contract).
        let w = unsafe { _mm512_loadu_si512(bits.add(64 * v) as *const _) };
        let idx = [_mm512_srli_epi16::<5>(w), _mm512_srli_epi16::<8>(w), _mm512_srli_epi16::<13>(w)];
        for (i, (even, odd)) in sums.iter_mut().enumerate() {
            // SAFETY: vector `v < 16` of each token's tables (the contract).
            let (low, high) = unsafe {
                (
                    _mm512_loadu_si512(lut[i].add(64 * v) as *const _),
                    _mm512_broadcast_i32x4(_mm_loadu_si128(lut[i].add(WORD_TABLES_HIGH + 16 * v) as *const _)),
                )
            };
            let (lo, hi) = (|i| _mm512_permutexvar_epi16(i, low), |i| _mm512_permutexvar_epi16(i, high));
            *even = _mm512_add_epi16(*even, _mm512_add_epi16(lo(w), hi(idx[0])));
            *odd = _mm512_add_epi16(*odd, _mm512_add_epi16(lo(idx[1]), hi(idx[2])));
        }
    }
    sums
}

/// Ask for the `len` bytes of weights ahead of `at` (see [`q1_0_packed_rows`]).
#[inline(always)]
fn ahead<const L1: bool>(at: *const u8, len: usize) {
    if L1 { crate::x86::prefetch_ahead_l1(at, len) } else { crate::x86::prefetch_ahead(at, len) }
}

/// Sums of 32 even and 32 odd rows (i16) as four vectors of i32: even rows 0-30, odd rows
/// 1-31, even rows 32-62, odd rows 33-63.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
fn widen((even, odd): (__m512i, __m512i)) -> [__m512i; 4] {
    [
        _mm512_cvtepi16_epi32(_mm512_castsi512_si256(even)),
        _mm512_cvtepi16_epi32(_mm512_castsi512_si256(odd)),
        _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64::<1>(even)),
        _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64::<1>(odd)),
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
pub(super) unsafe fn dot_f32w(w: &[u8], a: &[u8], n: usize) -> f32 {
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
pub(super) unsafe fn dot_f16w(w: &[u8], a: &[u8], n: usize) -> f32 {
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
pub(super) unsafe fn dot_bf16w(w: &[u8], a: &[u8], n: usize) -> f32 {
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
