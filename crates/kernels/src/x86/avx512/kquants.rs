//! AVX-512 K-quant products (Q2_K..Q6_K with Q8_K activations): each 32 weights are unpacked
//! to bytes in registers, dotted with `vpdpbusd`, and weighted by their integer sub-block
//! scales in i32 lanes; the super-block scales and the minimum terms are applied once per 256.

use std::arch::x86_64::*;

use onebit_gguf::GgmlType;

use super::matmul::{ByteDot, byte_rows, d16, dot_s8, hsum_i32};
use crate::formats::kquants::q3k_scales;
use crate::formats::*;
use crate::matmul::{RowKernel, TiledFn};

pub(super) fn kernel(ty: GgmlType) -> Option<RowKernel> {
    use GgmlType::*;
    let f: TiledFn = match ty {
        Q2_K => |w, r, a, o| byte_rows(w, r, a, o, dot_q2_k as ByteDot),
        Q3_K => |w, r, a, o| byte_rows(w, r, a, o, dot_q3_k as ByteDot),
        Q4_K => |w, r, a, o| byte_rows(w, r, a, o, dot_q4_k as ByteDot),
        Q5_K => |w, r, a, o| byte_rows(w, r, a, o, dot_q5_k as ByteDot),
        Q6_K => |w, r, a, o| byte_rows(w, r, a, o, dot_q6_k as ByteDot),
        _ => return None,
    };
    Some(RowKernel::Tiled(f))
}

/// The first 32 bytes of `p` (bytes or signed bytes). The length check folds away: every caller
/// slices a block's fixed-size array at a constant distance from its end.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn load32<T: Copy>(p: &[T]) -> __m256i {
    assert!(std::mem::size_of_val(p) >= 32);
    // SAFETY: 32 bytes inside `p` (just checked); an unaligned load.
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// Two 16-weight groups' scales as i32 lanes: lanes 0..4 `lo`, lanes 4..8 `hi`.
#[inline]
#[target_feature(enable = "avx512f,avx512vl")]
fn pair(lo: i32, hi: i32) -> __m256i {
    _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi)
}

/// Weighted integer sum for 32 unsigned weights: Σ q·a in 8 lanes, times per-16 scales.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
fn acc_u8(acc: __m256i, q: __m256i, a: __m256i, scales: __m256i) -> __m256i {
    let p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a);
    _mm256_add_epi32(acc, _mm256_mullo_epi32(p, scales))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
fn acc_s8(acc: __m256i, q: __m256i, a: __m256i, scales: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_mullo_epi32(dot_s8(q, a), scales))
}

/// Σ_groups m_g · bsum_g for the minimum terms.
fn min_term(mins: &[i32; 16], y: &BlockQ8K) -> i32 {
    mins.iter().zip(&y.bsums).map(|(&m, &b)| m * b as i32).sum()
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn dot_q2_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let three = _mm256_set1_epi8(3);
    let mut sumf = 0.0f32;
    for (b, y) in blocks::<BlockQ2K>(w)[..n / QK_K].iter().zip(blocks::<BlockQ8K>(a)) {
        let mut acc = _mm256_setzero_si256();
        let mut mins = [0i32; 16];
        for (g, m) in mins.iter_mut().enumerate() {
            *m = (b.scales[g] >> 4) as i32;
        }
        for grp in 0..2 {
            let q = load32(&b.qs[32 * grp..]);
            for s in 0..4 {
                let codes = _mm256_and_si256(_mm256_srl_epi16(q, _mm_set_epi64x(0, 2 * s as i64)), three);
                let sub = 8 * grp + 2 * s;
                let sc = pair((b.scales[sub] & 0x0f) as i32, (b.scales[sub + 1] & 0x0f) as i32);
                acc = acc_u8(acc, codes, load32(&y.qs[128 * grp + 32 * s..]), sc);
            }
        }
        sumf += y.d * d16(b.d) * hsum_i32(acc) as f32 - y.d * d16(b.dmin) * min_term(&mins, y) as f32;
    }
    sumf
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn dot_q3_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (three, four, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4), _mm256_set1_epi8(1));
    let mut sumf = 0.0f32;
    for (b, y) in blocks::<BlockQ3K>(w)[..n / QK_K].iter().zip(blocks::<BlockQ8K>(a)) {
        let scales = q3k_scales(&b.scales);
        let hmask = load32(&b.hmask[..]);
        let mut acc = _mm256_setzero_si256();
        for grp in 0..2 {
            let q = load32(&b.qs[32 * grp..]);
            for s in 0..4 {
                let low = _mm256_and_si256(_mm256_srl_epi16(q, _mm_set_epi64x(0, 2 * s as i64)), three);
                let bit = (4 * grp + s) as i64;
                let high = _mm256_and_si256(_mm256_srl_epi16(hmask, _mm_set_epi64x(0, bit)), one);
                // A clear high bit subtracts 4: value = low + 4·high - 4.
                let v = _mm256_sub_epi8(_mm256_add_epi8(low, _mm256_slli_epi16::<2>(high)), four);
                let sub = 8 * grp + 2 * s;
                let sc = pair(scales[sub] as i32, scales[sub + 1] as i32);
                acc = acc_s8(acc, v, load32(&y.qs[128 * grp + 32 * s..]), sc);
            }
        }
        sumf += d16(b.d) * y.d * hsum_i32(acc) as f32;
    }
    sumf
}

/// Q4_K and Q5_K share their scales, mins and nibble layout.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn k4_block(d: [u8; 2], dmin: [u8; 2], scales: &[u8; 12], qs: &[u8; 128], qh: Option<&[u8; 32]>, y: &BlockQ8K) -> f32 {
    let (mask, one) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(1));
    let mut acc = _mm256_setzero_si256();
    let mut mins = [0i32; 16];
    let high = qh.map(|h| load32(&h[..]));
    for j in 0..4 {
        let v = load32(&qs[32 * j..]);
        let mut lo = _mm256_and_si256(v, mask);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
        if let Some(h) = high {
            let bit = |k: i64| _mm256_and_si256(_mm256_srl_epi16(h, _mm_set_epi64x(0, k)), one);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16::<4>(bit(2 * j as i64)));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16::<4>(bit(2 * j as i64 + 1)));
        }
        let (sc0, m0) = scale_min_k4(2 * j, scales);
        let (sc1, m1) = scale_min_k4(2 * j + 1, scales);
        acc = acc_u8(acc, lo, load32(&y.qs[64 * j..]), pair(sc0 as i32, sc0 as i32));
        acc = acc_u8(acc, hi, load32(&y.qs[64 * j + 32..]), pair(sc1 as i32, sc1 as i32));
        mins[4 * j] = m0 as i32;
        mins[4 * j + 1] = m0 as i32;
        mins[4 * j + 2] = m1 as i32;
        mins[4 * j + 3] = m1 as i32;
    }
    y.d * d16(d) * hsum_i32(acc) as f32 - y.d * d16(dmin) * min_term(&mins, y) as f32
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn dot_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    blocks::<BlockQ4K>(w)[..n / QK_K]
        .iter()
        .zip(blocks::<BlockQ8K>(a))
        .map(|(b, y)| k4_block(b.d, b.dmin, &b.scales, &b.qs, None, y))
        .sum()
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn dot_q5_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    blocks::<BlockQ5K>(w)[..n / QK_K]
        .iter()
        .zip(blocks::<BlockQ8K>(a))
        .map(|(b, y)| k4_block(b.d, b.dmin, &b.scales, &b.qs, Some(&b.qh), y))
        .sum()
}

/// Q6_K: the unsigned 6-bit codes q with `vpmaddubsw`, weighted by their 16-value scales with
/// `vpmaddwd`; the offset (q - 32) comes off once per block as 32 Σ scale·bsum. Blocks are
/// scaled in f32 lanes, added once per row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (mask, three) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
    // Lanes 0..8 take scale g, lanes 8..16 scale g + 1, for the quarter starting at group g.
    let pick: [__m256i; 8] = std::array::from_fn(|k| {
        let g = 2 * k as i16;
        _mm256_setr_epi16(g, g, g, g, g, g, g, g, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1, g + 1)
    });
    let mut accf = _mm256_setzero_ps();
    for (b, y) in blocks::<BlockQ6K>(w)[..n / QK_K].iter().zip(blocks::<BlockQ8K>(a)) {
        // SAFETY: every load reads inside block `b` or `y`.
        let scales = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(b.scales.as_ptr() as *const __m128i) });
        // SAFETY: `bsums` is 16 i16, the 32 bytes loaded.
        let bsums = unsafe { _mm256_loadu_si256(y.bsums.as_ptr() as *const __m256i) };
        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(scales, bsums));
        let mut acc = _mm256_sub_epi32(_mm256_setzero_si256(), offset);
        for half in 0..2 {
            let (l0, l1) = (load32(&b.ql[64 * half..]), load32(&b.ql[64 * half + 32..]));
            let h = load32(&b.qh[32 * half..]);
            let hb =
                |k: i64| _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srl_epi16(h, _mm_set_epi64x(0, k)), three));
            let quarters = [
                _mm256_or_si256(_mm256_and_si256(l0, mask), hb(0)),
                _mm256_or_si256(_mm256_and_si256(l1, mask), hb(2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l0), mask), hb(4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l1), mask), hb(6)),
            ];
            for (qi, q) in quarters.into_iter().enumerate() {
                let sc = _mm256_permutexvar_epi16(pick[4 * half + qi], scales);
                let x = load32(&y.qs[128 * half + 32 * qi..]);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), sc));
            }
        }
        accf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(d16(b.d) * y.d), accf);
    }
    let s = _mm_add_ps(_mm256_castps256_ps128(accf), _mm256_extractf128_ps::<1>(accf));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}
