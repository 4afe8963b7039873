//! AVX-512 products of quantized weights with 8-bit activations (and f16/bf16/f32 weights with
//! f32 activations). One output at a time: a weight row stays in L1 while every token of the
//! batch passes over it.
//!
//! All integer dot products go through `vpdpbusd` (unsigned × signed bytes into i32 lanes).
//! Signed weights use the usual trick: |w| × (a with w's sign). 1-bit weights instead select
//! `a` or `-a` by their bit: Σ ±a.

use std::arch::x86_64::*;
use std::ops::Range;

use onebit_gguf::GgmlType;

use crate::act::Acts;
use crate::formats::ternary::BlockTQ1_0;
use crate::formats::*;
use crate::matmul::{MatRef, OutPtr, RowKernel, TiledFn};
use crate::pack::{GROUP, PackedMat, Q1_GROUP_BLOCK};
use crate::x86::{PlanarRow, planar_row};

pub(super) fn kernel(ty: GgmlType) -> Option<RowKernel> {
    use GgmlType::*;
    let f: TiledFn = match ty {
        Q1_0 => q1_0_rows,
        Q2_0 => |w, r, a, o| planar_rows(w, r, a, o, dot_q2_0),
        Q8_0 => |w, r, a, o| legacy_rows(w, r, a, o, dot_q8_0),
        Q4_0 => |w, r, a, o| legacy_rows(w, r, a, o, dot_q4_0),
        Q4_1 => |w, r, a, o| legacy_rows(w, r, a, o, dot_q4_1),
        Q5_0 => |w, r, a, o| planar_rows(w, r, a, o, dot_q5_0),
        Q5_1 => |w, r, a, o| planar_rows(w, r, a, o, dot_q5_1),
        TQ2_0 => |w, r, a, o| byte_rows(w, r, a, o, dot_tq2_0),
        TQ1_0 => |w, r, a, o| byte_rows(w, r, a, o, dot_tq1_0),
        F32 => |w, r, a, o| byte_rows(w, r, a, o, dot_f32w),
        F16 => |w, r, a, o| byte_rows(w, r, a, o, dot_f16w),
        BF16 => |w, r, a, o| byte_rows(w, r, a, o, dot_bf16w),
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => return super::kquants::kernel(ty),
        _ => return None,
    };
    Some(RowKernel::Tiled(f))
}

type PlanarDot = unsafe fn(&[u8], PlanarRow, usize) -> f32;
pub(super) type ByteDot = unsafe fn(&[u8], &[u8], usize) -> f32;

fn planar_rows(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr, dot: PlanarDot) {
    for r in rows {
        let wr = w.row(r);
        for t in 0..acts.rows() {
            // SAFETY: the table holding this kernel exists only on AVX-512 CPUs; the row owns `r`.
            unsafe { out.write(t, r, dot(wr, planar_row(acts, t), w.cols)) };
        }
    }
}

/// Q4_0/Q4_1/Q8_0: sixteen rows at a time when packed, else row by row.
fn legacy_rows(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr, dot: PlanarDot) {
    match w.packed {
        Some(_) => super::legacy16::rows(w, rows, acts, out),
        None => planar_rows(w, rows, acts, out, dot),
    }
}

pub(super) fn byte_rows(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr, dot: ByteDot) {
    for r in rows {
        let wr = w.row(r);
        for t in 0..acts.rows() {
            // SAFETY: as above.
            unsafe { out.write(t, r, dot(wr, acts.row(t), w.cols)) };
        }
    }
}

#[inline(always)]
pub(super) fn d16(b: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(b))
}

/// Q1_0 rows: through lookup tables when the matrix is packed, else two rows at a time.
fn q1_0_rows(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    match w.packed {
        Some(p) => q1_0_packed(p, rows, acts, out),
        None => q1_0_plain(w, rows, acts, out),
    }
}

/// Packed Q1_0 (64-row groups) × Q8_0 by lookup: each 4 weight bits index the 16 precomputed
/// sums ±a0±a1±a2±a3 of their activations, for 64 rows per `vpshufb`.
fn q1_0_packed(p: &PackedMat, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    let nb = p.cols / 128;
    for g in rows.start / GROUP..rows.end.div_ceil(GROUP) {
        let data = p.group(g);
        let row0 = g * GROUP;
        let n = rows.end - row0;
        for t in 0..acts.rows() {
            // SAFETY: the table holding this kernel exists only on AVX-512 CPUs; this call owns
            // rows `rows` of the output and the masks stop at them.
            unsafe {
                let res = lut_group(data, planar_row(acts, t), nb);
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
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn lut_group(data: &[u8], a: PlanarRow, nb: usize) -> [__m512; 4] {
    let m = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); 4];
    for b in 0..nb {
        let blk = unsafe { data.as_ptr().add(b * Q1_GROUP_BLOCK) };
        // The weights stream from memory once: ask for the block after next now.
        let ahead = data.as_ptr().wrapping_add((b + PREFETCH_BLOCKS) * Q1_GROUP_BLOCK);
        if (b + PREFETCH_BLOCKS) < nb {
            for line in (0..Q1_GROUP_BLOCK).step_by(64) {
                unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.add(line) as *const i8) };
            }
        }
        let mut t = [_mm512_setzero_ps(); 4];
        for k in 0..4 {
            let mut s_lo = _mm512_setzero_si512();
            let mut s_hi = _mm512_setzero_si512();
            for j in 0..4 {
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
            let d = _mm512_set1_ps(unsafe { *a.scales.get_unchecked(4 * b + k) });
            let parts = [
                _mm512_cvtepi16_epi32(_mm512_castsi512_si256(s_lo)),
                _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64::<1>(s_lo)),
                _mm512_cvtepi16_epi32(_mm512_castsi512_si256(s_hi)),
                _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64::<1>(s_hi)),
            ];
            for q in 0..4 {
                t[q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(parts[q]), d, t[q]);
            }
        }
        for (q, tq) in t.iter().enumerate() {
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

/// Q1_0 rows two at a time (the activation loads are shared), for every token. A row's block
/// scales are converted to f32 once, before its tokens.
fn q1_0_plain(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    let nb = w.cols / 128;
    assert!(nb <= MAX_BLOCKS, "rows longer than {} weights", MAX_BLOCKS * 128);
    let mut d0 = [0f32; MAX_BLOCKS];
    let mut d1 = [0f32; MAX_BLOCKS];
    let mut r = rows.start;
    while r < rows.end {
        let pair = rows.end - r >= 2;
        let (w0, w1) = (w.row(r), w.row(if pair { r + 1 } else { r }));
        // SAFETY: the table holding this kernel exists only on AVX-512 CPUs; this call owns
        // rows `rows` of the output.
        unsafe {
            q1_0_scales(w0, nb, &mut d0);
            q1_0_scales(w1, nb, &mut d1);
            for t in 0..acts.rows() {
                let (y0, y1) = dot_q1_0_x2(w0, w1, &d0[..nb], &d1[..nb], planar_row(acts, t));
                out.write(t, r, y0);
                if pair {
                    out.write(t, r + 1, y1);
                }
            }
        }
        r += 2;
    }
}

/// Blocks per row the 1-bit kernels handle (rows up to 32768 weights).
pub(super) const MAX_BLOCKS: usize = 256;

/// The f16 scales of a row's Q1_0 blocks as f32, sixteen at a time by a gather.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn q1_0_scales(row: &[u8], nb: usize, out: &mut [f32; MAX_BLOCKS]) {
    let idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(18),
    );
    let mut b = 0;
    while b < nb {
        let k = (nb - b).min(16);
        let mask = ((1u32 << k) - 1) as u16;
        unsafe {
            // Each gathered u32 starts at a block (inside it): its low half is the scale.
            let base = row.as_ptr().add(18 * b) as *const i32;
            let v = _mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), mask, idx, base);
            let h = _mm512_cvtepi32_epi16(v);
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(b), mask, _mm512_cvtph_ps(h));
        }
        b += 16;
    }
}

/// Two Q1_0 rows × Q8_0: per 32-block, Σ ±a from the planar `pos`/`neg` bytes chosen by the
/// weight bits, summed by `psadbw` (bias +128 removed through the per-lane `bias`), scaled by
/// the activation scale per lane and the weight scale per 128.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn dot_q1_0_x2(w0: &[u8], w1: &[u8], d0: &[f32], d1: &[f32], a: PlanarRow) -> (f32, f32) {
    let nb = d0.len();
    let (b0, b1) = (blocks::<BlockQ1_0>(w0), blocks::<BlockQ1_0>(w1));
    let zero = _mm512_setzero_si512();
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for i in 0..nb {
        unsafe {
            let (pp, np) = (a.pos.as_ptr().add(128 * i), a.neg.as_ptr().add(128 * i));
            let (p0, p1) = (_mm512_loadu_si512(pp as *const _), _mm512_loadu_si512(pp.add(64) as *const _));
            let (n0, n1) = (_mm512_loadu_si512(np as *const _), _mm512_loadu_si512(np.add(64) as *const _));
            let lanes = _mm512_loadu_ps(a.lanes.as_ptr().add(16 * i));
            let bias = _mm512_loadu_ps(a.bias.as_ptr().add(16 * i));
            let block = |blk: &BlockQ1_0, d: f32, acc: __m512| -> __m512 {
                let bits0 = u64::from_le_bytes(blk.qs[..8].try_into().unwrap());
                let bits1 = u64::from_le_bytes(blk.qs[8..].try_into().unwrap());
                let s0 = _mm512_sad_epu8(_mm512_mask_blend_epi8(bits0, n0, p0), zero);
                let s1 = _mm512_sad_epu8(_mm512_mask_blend_epi8(bits1, n1, p1), zero);
                let c = _mm512_mask_shuffle_epi32::<_MM_PERM_CDAB>(s0, 0xaaaa, s1);
                let t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), lanes, bias);
                _mm512_fmadd_ps(t, _mm512_set1_ps(d), acc)
            };
            acc0 = block(&b0[i], *d0.get_unchecked(i), acc0);
            acc1 = block(&b1[i], *d1.get_unchecked(i), acc1);
        }
    }
    (_mm512_reduce_add_ps(acc0), _mm512_reduce_add_ps(acc1))
}

/// Signed 8-bit weights (32) times signed activations: |w| · (a · sign(w)), 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn dot_s8(w: __m256i, a: __m256i) -> __m256i {
    let neg = _mm256_movepi8_mask(w);
    let sa = _mm256_mask_sub_epi8(a, neg, _mm256_setzero_si256(), a);
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w), sa)
}

/// Sixteen nibble-packed bytes to 32 values: low nibbles first, then high nibbles.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn nibbles(qs: &[u8; 16]) -> __m256i {
    let v = unsafe { _mm_loadu_si128(qs.as_ptr() as *const __m128i) };
    let m = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(v, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m);
    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi)
}

/// The fifth bits of a Q5 block as 0x10 per byte where set, in value order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn fifth_bits(qh: [u8; 4]) -> __m256i {
    _mm256_maskz_set1_epi8(u32::from_le_bytes(qh), 0x10)
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn load_a32(a: &PlanarRow, i: usize) -> __m256i {
    unsafe { _mm256_loadu_si256(a.qs.as_ptr().add(32 * i) as *const __m256i) }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn hsum8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn dot_q8_0(w: &[u8], a: PlanarRow, n: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (i, b) in blocks::<BlockQ8_0>(w)[..n / 32].iter().enumerate() {
        let wq = unsafe { _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i) };
        let p = dot_s8(wq, load_a32(&a, i));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d16(b.d) * a.scales[i]), _mm256_cvtepi32_ps(p), acc);
    }
    hsum8(acc)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn dot_q4_0(w: &[u8], a: PlanarRow, n: usize) -> f32 {
    let eight = _mm256_set1_epi8(8);
    let mut acc = _mm256_setzero_ps();
    for (i, b) in blocks::<BlockQ4_0>(w)[..n / 32].iter().enumerate() {
        let p = dot_s8(_mm256_sub_epi8(nibbles(&b.qs), eight), load_a32(&a, i));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d16(b.d) * a.scales[i]), _mm256_cvtepi32_ps(p), acc);
    }
    hsum8(acc)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn dot_q5_0(w: &[u8], a: PlanarRow, n: usize) -> f32 {
    let sixteen = _mm256_set1_epi8(16);
    let mut acc = _mm256_setzero_ps();
    for (i, b) in blocks::<BlockQ5_0>(w)[..n / 32].iter().enumerate() {
        let q = _mm256_or_si256(nibbles(&b.qs), fifth_bits(b.qh));
        let p = dot_s8(_mm256_sub_epi8(q, sixteen), load_a32(&a, i));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d16(b.d) * a.scales[i]), _mm256_cvtepi32_ps(p), acc);
    }
    hsum8(acc)
}

/// Q4_1/Q5_1: Σ (d·q + m)·a·d_a = d·d_a·Σ q·a + m·s, with s = d_a·Σ a from Q8_1.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn dot_q4_1(w: &[u8], a: PlanarRow, n: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (i, b) in blocks::<BlockQ4_1>(w)[..n / 32].iter().enumerate() {
        let p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), nibbles(&b.qs), load_a32(&a, i));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d16(b.d) * a.scales[i]), _mm256_cvtepi32_ps(p), acc);
        mins += d16(b.m) * a.sums[i];
    }
    hsum8(acc) + mins
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn dot_q5_1(w: &[u8], a: PlanarRow, n: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (i, b) in blocks::<BlockQ5_1>(w)[..n / 32].iter().enumerate() {
        let q = _mm256_or_si256(nibbles(&b.qs), fifth_bits(b.qh));
        let p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, load_a32(&a, i));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d16(b.d) * a.scales[i]), _mm256_cvtepi32_ps(p), acc);
        mins += d16(b.m) * a.sums[i];
    }
    hsum8(acc) + mins
}

/// 2-bit codes of 32 weights from 8 bytes, byte j holding weights 4j..4j+4 in bits 2i..2i+2.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn codes_4_per_byte(q: &[u8]) -> __m256i {
    let v = u64::from_le_bytes(q[..8].try_into().unwrap());
    // Byte 4j + i becomes a copy of byte j, then keeps its bits 2i..2i+2.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi64x(v as i64),
        _mm256_setr_epi8(
            0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7,
        ),
    );
    let three = _mm256_set1_epi8(3);
    let r = _mm256_and_si256(spread, three);
    let r = _mm256_mask_blend_epi8(0x2222_2222, r, _mm256_and_si256(_mm256_srli_epi16::<2>(spread), three));
    let r = _mm256_mask_blend_epi8(0x4444_4444, r, _mm256_and_si256(_mm256_srli_epi16::<4>(spread), three));
    _mm256_mask_blend_epi8(0x8888_8888, r, _mm256_and_si256(_mm256_srli_epi16::<6>(spread), three))
}

/// Q2_0 × Q8_0: codes c in 0..4 mean c - 1; Σ (c - 1)·a = Σ c·a - Σ a.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn dot_q2_0(w: &[u8], a: PlanarRow, n: usize) -> f32 {
    let one = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    for (i, b) in blocks::<BlockQ2_0>(w)[..n / 64].iter().enumerate() {
        let d = d16(b.d);
        for k in 0..2 {
            let c = _mm256_sub_epi8(codes_4_per_byte(&b.qs[8 * k..]), one);
            let p = dot_s8(c, load_a32(&a, 2 * i + k));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a.scales[2 * i + k]), _mm256_cvtepi32_ps(p), acc);
        }
    }
    hsum8(acc)
}

#[inline]
#[target_feature(enable = "avx512f,avx512vl")]
pub(super) fn hsum_i32(v: __m256i) -> i32 {
    _mm512_reduce_add_epi32(_mm512_zextsi256_si512(v))
}

/// Sum of the 16 block sums of a Q8_K block: Σ a over its 256 values.
#[inline]
pub(super) fn q8k_sum(b: &BlockQ8K) -> i32 {
    b.bsums.iter().map(|&s| s as i32).sum()
}

/// TQ2_0 × Q8_K: Σ (c - 1)·a over a 256-block, c the 2-bit codes: Σ c·a with `vpdpbusd`, less
/// Σ a from the block sums, all in vector lanes; each block's integer sum is scaled in f32
/// lanes, and the lanes are added once per row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn dot_tq2_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let three = _mm512_set1_epi8(3);
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm512_setzero_ps();
    let ys = blocks::<BlockQ8K>(a);
    for (b, y) in blocks::<BlockTQ2_0>(w)[..n / QK_K].iter().zip(ys) {
        // SAFETY: every load reads inside block `b` or `y`.
        unsafe {
            // Bytes 0..32 hold weights 0..128, bytes 32..64 weights 128..256: code l of byte m
            // of group j is weight 128j + 32l + m.
            let v = _mm512_loadu_si512(b.qs.as_ptr() as *const _);
            let yq = y.qs.as_ptr();
            let bsums = _mm256_madd_epi16(_mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i), ones);
            let mut p = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(bsums));
            for l in 0..4 {
                let codes = _mm512_and_si512(_mm512_srl_epi16(v, _mm_set_epi64x(0, 2 * l as i64)), three);
                let lo = _mm256_loadu_si256(yq.add(32 * l) as *const __m256i);
                let hi = _mm256_loadu_si256(yq.add(128 + 32 * l) as *const __m256i);
                let ay = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                p = _mm512_dpbusd_epi32(p, codes, ay);
            }
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_set1_ps(y.d * d16(b.d)), acc);
        }
    }
    _mm512_reduce_add_ps(acc)
}

/// Trit `k` (0, 1 or 2) of 32 base-3 packed bytes: ((byte · 3^k mod 256) · 3) >> 8.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn trits(v16: __m512i, pow: i16) -> __m256i {
    let q = _mm512_and_si512(_mm512_mullo_epi16(v16, _mm512_set1_epi16(pow)), _mm512_set1_epi16(0xff));
    let t = _mm512_srli_epi16::<8>(_mm512_mullo_epi16(q, _mm512_set1_epi16(3)));
    _mm512_cvtepi16_epi8(t)
}

/// TQ1_0 × Q8_K: the trits (t - 1 is the weight) dotted as Σ t·a - Σ a.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn dot_tq1_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    const POW3: [i16; 5] = [1, 3, 9, 27, 81];
    let mut acc = 0.0f32;
    let ys = blocks::<BlockQ8K>(a);
    for (b, y) in blocks::<BlockTQ1_0>(w)[..n / QK_K].iter().zip(ys) {
        let mut p = _mm256_setzero_si256();
        let yq = y.qs.as_ptr();
        unsafe {
            // Bytes 0..32: trit k of byte m is weight 32k + m (weights 0..160).
            let v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(b.qs.as_ptr() as *const __m256i));
            for (k, &pw) in POW3.iter().enumerate() {
                p = _mm256_dpbusd_epi32(p, trits(v, pw), _mm256_loadu_si256(yq.add(32 * k) as *const __m256i));
            }
            // Bytes 32..48 and the 4 bytes of qh (weights 160..256), 16 and 4 at a time.
            let mut tail = [0u8; 96];
            let v2 =
                _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(_mm_loadu_si128(b.qs.as_ptr().add(32) as *const __m128i)));
            for (k, &pw) in POW3.iter().enumerate() {
                let t = trits(v2, pw);
                _mm_storeu_si128(tail.as_mut_ptr().add(16 * k) as *mut __m128i, _mm256_castsi256_si128(t));
            }
            for k in 0..4 {
                for j in 0..4 {
                    tail[80 + 4 * k + j] = crate::formats::ternary::tq1_trit(b.qh[j], k) as u8;
                }
            }
            for c in 0..3 {
                let t = _mm256_loadu_si256(tail.as_ptr().add(32 * c) as *const __m256i);
                p = _mm256_dpbusd_epi32(p, t, _mm256_loadu_si256(yq.add(160 + 32 * c) as *const __m256i));
            }
        }
        let sumi = hsum_i32(p) - q8k_sum(y);
        acc += sumi as f32 * (d16(b.d) * y.d);
    }
    acc
}

#[target_feature(enable = "avx512f")]
unsafe fn dot_f32w(w: &[u8], a: &[u8], n: usize) -> f32 {
    let a: &[f32] = bytemuck::cast_slice(a);
    let mut acc = _mm512_setzero_ps();
    for i in (0..n).step_by(16) {
        unsafe {
            let wv = _mm512_loadu_ps(w.as_ptr().add(4 * i) as *const f32);
            acc = _mm512_fmadd_ps(wv, _mm512_loadu_ps(a.as_ptr().add(i)), acc);
        }
    }
    _mm512_reduce_add_ps(acc)
}

#[target_feature(enable = "avx512f,f16c")]
unsafe fn dot_f16w(w: &[u8], a: &[u8], n: usize) -> f32 {
    let a: &[f32] = bytemuck::cast_slice(a);
    let mut acc = _mm512_setzero_ps();
    for i in (0..n).step_by(16) {
        unsafe {
            let wv = _mm512_cvtph_ps(_mm256_loadu_si256(w.as_ptr().add(2 * i) as *const __m256i));
            acc = _mm512_fmadd_ps(wv, _mm512_loadu_ps(a.as_ptr().add(i)), acc);
        }
    }
    _mm512_reduce_add_ps(acc)
}

#[target_feature(enable = "avx512f")]
unsafe fn dot_bf16w(w: &[u8], a: &[u8], n: usize) -> f32 {
    let a: &[f32] = bytemuck::cast_slice(a);
    let mut acc = _mm512_setzero_ps();
    for i in (0..n).step_by(16) {
        unsafe {
            let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(w.as_ptr().add(2 * i) as *const __m256i));
            let wv = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(h));
            acc = _mm512_fmadd_ps(wv, _mm512_loadu_ps(a.as_ptr().add(i)), acc);
        }
    }
    _mm512_reduce_add_ps(acc)
}
