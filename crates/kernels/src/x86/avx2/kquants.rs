//! AVX2 dot products of the K-quant rows (Q2_K through Q6_K: the Q2_K/Q3_K/Q4_K/Q5_K mixes)
//! and of ternary TQ2_0 rows with Q8_K activations, one row and one token at a time.
//!
//! Each block's sum is formed exactly in integers, 32 weights per vector: `vpmaddubsw` of the
//! unsigned codes (at most 63) with the signed activations keeps its pair sums under 2 · 63 · 127,
//! and `vpmaddwd` with the sub-block's scale widens them to 32 bits. The offsets (Q2_K/Q4_K/Q5_K's
//! mins, Q3_K's −4, Q6_K's −32, TQ2_0's −1) come off afterwards from the activations' 16-value
//! sums. The float steps are the scalar reference's, block after block, so the results are its
//! bits.

use std::arch::x86_64::*;

use crate::formats::kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, scale_min_k4};
use crate::formats::ternary::BlockTQ2_0;
use crate::formats::{QK_K, blocks};

/// Q2_K row `w` · Q8_K row `a` over `n` values.
pub(crate) fn dot_q2_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: the AVX2 and AVX-512 tables, which hold this kernel, exist only on CPUs with AVX2,
    // FMA and F16C (`KernelTier::is_available`).
    unsafe { dot_q2_k_impl(w, a, n) }
}

/// Q3_K row `w` · Q8_K row `a` over `n` values.
pub(crate) fn dot_q3_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: as for `dot_q2_k`.
    unsafe { dot_q3_k_impl(w, a, n) }
}

/// Q4_K row `w` · Q8_K row `a` over `n` values.
pub(crate) fn dot_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: as for `dot_q2_k`.
    unsafe { dot_q4_k_impl(w, a, n) }
}

/// Q5_K row `w` · Q8_K row `a` over `n` values.
pub(crate) fn dot_q5_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: as for `dot_q4_k`.
    unsafe { dot_q5_k_impl(w, a, n) }
}

/// Q6_K row `w` · Q8_K row `a` over `n` values.
pub(super) fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: as for `dot_q4_k`.
    unsafe { dot_q6_k_impl(w, a, n) }
}

/// TQ2_0 row `w` · Q8_K row `a` over `n` values.
pub(super) fn dot_tq2_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: as for `dot_q4_k`.
    unsafe { dot_tq2_0_impl(w, a, n) }
}

/// 32 unsigned codes times 32 signed activations, times the i16 `scales` (one per pair of
/// values), as eight i32 sums.
#[inline]
#[target_feature(enable = "avx2")]
fn scaled(q: __m256i, a: __m256i, scales: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), scales)
}

/// 16 sub-blocks' scales (i16 lanes, in order) as eight `scaled` operands: operand p has
/// scale 2p in its lower eight lanes and scale 2p + 1 in its upper eight, for the 32 values of
/// sub-blocks 2p and 2p + 1.
#[inline]
#[target_feature(enable = "avx2")]
fn scale_pairs(scales: __m256i) -> [__m256i; 8] {
    // Both 128-bit halves of `halves[h]` hold scales 8h..8h + 8; a byte shuffle then repeats
    // one i16 (bytes 2i, 2i + 1) across each half.
    let halves = [_mm256_permute4x64_epi64::<0x44>(scales), _mm256_permute4x64_epi64::<0xee>(scales)];
    let repeat = |i: i16| _mm_set1_epi16((2 * i) | ((2 * i + 1) << 8));
    std::array::from_fn(|p| {
        let i = 2 * (p % 4) as i16;
        _mm256_shuffle_epi8(halves[p / 4], _mm256_setr_m128i(repeat(i), repeat(i + 1)))
    })
}

/// Q3_K's 16 signed 6-bit scales ([`q3k_scales`]) as i16 lanes: the low four bits are the
/// nibbles of bytes 0..8 (low nibbles first), the high two bits fields 0..4 of bytes 8..12.
#[inline]
#[target_feature(enable = "avx2")]
fn q3k_scales16(packed: &[u8; 12]) -> __m256i {
    let m4 = _mm_set1_epi8(0x0f);
    let low = _mm_set_epi64x(0, i64::from_le_bytes(packed[..8].try_into().unwrap()));
    let low = _mm_unpacklo_epi64(_mm_and_si128(low, m4), _mm_and_si128(_mm_srli_epi16::<4>(low), m4));
    // Dword f takes field f of every byte to its bits 0-1 (bits shifted in from the next byte
    // land above them and are masked off).
    let h = _mm_set1_epi32(i32::from_le_bytes(packed[8..].try_into().unwrap()));
    let high = _mm_and_si128(_mm_srlv_epi32(h, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    let q = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16::<4>(high)), _mm_set1_epi8(32));
    _mm256_cvtepi8_epi16(q)
}

/// An f16 scale (little-endian bytes) as f32 by F16C: the same value as the portable
/// conversion, without its feature check and out-of-line call once per block.
#[inline]
#[target_feature(enable = "f16c")]
pub(super) fn d16(b: [u8; 2]) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes(b) as i32)))
}

#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// The low (`high` false) or high nibbles of 32 bytes, one to a byte.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles(q: __m256i, high: bool) -> __m256i {
    let q = if high { _mm256_srli_epi16::<4>(q) } else { q };
    _mm256_and_si256(q, _mm256_set1_epi8(0x0f))
}

/// The 2-bit fields `l` (bits 2l, 2l + 1) of 32 bytes, one to a byte.
#[inline]
#[target_feature(enable = "avx2")]
fn crumbs(q: __m256i, l: usize) -> __m256i {
    // A 16-bit shift by 2l < 8 brings each byte's field to its bits 0-1.
    _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * l as i32)), _mm256_set1_epi8(3))
}

/// Σ scale_g · bsum_g over the 16 groups of 16 activations, for 16 scales in i16 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn bsums_dot(scales: __m256i, y: &BlockQ8K) -> i32 {
    hsum(_mm256_madd_epi16(scales, load(bytemuck::cast_slice(&y.bsums))))
}

/// 16 bytes at `p`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load16(p: &[u8]) -> __m128i {
    assert!(p.len() >= 16);
    // SAFETY: `p` holds 16 bytes (asserted).
    unsafe { _mm_loadu_si128(p.as_ptr() as *const __m128i) }
}

/// 32 bytes at `p`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn load(p: &[u8]) -> __m256i {
    assert!(p.len() >= 32);
    // SAFETY: `p` holds 32 bytes (asserted).
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// The activations' 32 values `32j ..`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn acts(y: &BlockQ8K, j: usize) -> __m256i {
    load(bytemuck::cast_slice(&y.qs[32 * j..32 * j + 32]))
}

/// Q4_K/Q5_K's common end of a block: Σ scale · (code · a) with the 6-bit scales and mins.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn k4_block(d: [u8; 2], dmin: [u8; 2], scales: &[u8; 12], y: &BlockQ8K, codes: impl Fn(usize) -> __m256i) -> f32 {
    let mut acc = _mm256_setzero_si256();
    let mut msum = 0i32;
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        acc = _mm256_add_epi32(acc, scaled(codes(j), acts(y, j), _mm256_set1_epi16(sc as i16)));
        msum += m as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
    }
    d16(d) * y.d * hsum(acc) as f32 - d16(dmin) * y.d * msum as f32
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q2_k_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ2K>(w), blocks::<BlockQ8K>(a));
    let mut sum = 0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        // Scale bytes: the sub-blocks' scales in the low nibbles, their mins in the high.
        let packed = load16(&b.scales);
        let m4 = _mm_set1_epi8(0x0f);
        let scales = scale_pairs(_mm256_cvtepu8_epi16(_mm_and_si128(packed, m4)));
        let mut acc = _mm256_setzero_si256();
        // Field l of byte k of half j holds weight 128j + 32l + k, of sub-block 8j + 2l + k / 16.
        for j in 0..2 {
            let q = load(&b.qs[32 * j..]);
            for l in 0..4 {
                acc = _mm256_add_epi32(acc, scaled(crumbs(q, l), acts(yb, 4 * j + l), scales[4 * j + l]));
            }
        }
        let msum = bsums_dot(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), m4)), yb);
        sum += yb.d * d16(b.d) * hsum(acc) as f32 - yb.d * d16(b.dmin) * msum as f32;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q3_k_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ3K>(w), blocks::<BlockQ8K>(a));
    let four = _mm256_set1_epi8(4);
    let mut sum = 0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        let scales16 = q3k_scales16(&b.scales);
        let scales = scale_pairs(scales16);
        let hmask = load(&b.hmask);
        let mut acc = _mm256_setzero_si256();
        // As Q2_K's layout, plus bit 4j + l of `hmask` byte k as the code's third bit: the
        // codes are the weights + 4 (a clear bit subtracts 4).
        for j in 0..2 {
            let q = load(&b.qs[32 * j..]);
            for l in 0..4 {
                // Bit 4j + l of each byte to its bit 2 (16-bit shifts by less than 8 keep each
                // byte's bit in its byte).
                let bit = 4 * j + l;
                let high = match bit {
                    0 | 1 => _mm256_sll_epi16(hmask, _mm_cvtsi32_si128(2 - bit as i32)),
                    _ => _mm256_srl_epi16(hmask, _mm_cvtsi32_si128(bit as i32 - 2)),
                };
                let codes = _mm256_or_si256(crumbs(q, l), _mm256_and_si256(high, four));
                acc = _mm256_add_epi32(acc, scaled(codes, acts(yb, 4 * j + l), scales[4 * j + l]));
            }
        }
        let offset = bsums_dot(scales16, yb);
        sum += d16(b.d) * yb.d * (hsum(acc) - 4 * offset) as f32;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4_k_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ4K>(w), blocks::<BlockQ8K>(a));
    let mut sum = 0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        // Sub-block j: the low nibbles (even j) or high nibbles (odd j) of bytes 32·(j/2)...
        sum += k4_block(b.d, b.dmin, &b.scales, yb, |j| nibbles(load(&b.qs[32 * (j / 2)..]), j % 2 == 1));
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q5_k_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ5K>(w), blocks::<BlockQ8K>(a));
    let one = _mm256_set1_epi8(1);
    let mut sum = 0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        let qh = load(&b.qh);
        // As Q4_K, plus bit j of byte l of `qh` as the fifth bit of value l of sub-block j.
        sum += k4_block(b.d, b.dmin, &b.scales, yb, |j| {
            let low = nibbles(load(&b.qs[32 * (j / 2)..]), j % 2 == 1);
            // A 16-bit shift by j < 8 brings each byte's bit j to its bit 0.
            let bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)), one);
            _mm256_or_si256(low, _mm256_slli_epi16::<4>(bit))
        });
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q6_k_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ6K>(w), blocks::<BlockQ8K>(a));
    let mut sum = 0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        let scales16 = _mm256_cvtepi8_epi16(load16(bytemuck::cast_slice(&b.scales)));
        let scales = scale_pairs(scales16);
        let mut acc = _mm256_setzero_si256();
        for half in 0..2 {
            let (ql0, ql1) = (load(&b.ql[64 * half..]), load(&b.ql[64 * half + 32..]));
            let qh = load(&b.qh[32 * half..]);
            for quarter in 0..4 {
                let ql = if quarter % 2 == 0 { ql0 } else { ql1 };
                let low = nibbles(ql, quarter >= 2);
                let q = _mm256_or_si256(low, _mm256_slli_epi16::<4>(crumbs(qh, quarter)));
                let s = 4 * half + quarter;
                acc = _mm256_add_epi32(acc, scaled(q, acts(yb, s), scales[s]));
            }
        }
        // The codes are the weights + 32.
        sum += d16(b.d) * yb.d * (hsum(acc) - 32 * bsums_dot(scales16, yb)) as f32;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_tq2_0_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockTQ2_0>(w), blocks::<BlockQ8K>(a));
    let one = _mm256_set1_epi16(1);
    let mut sum = 0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        let mut acc = _mm256_setzero_si256();
        // Bits 2l of byte k of half j hold code j·128 + 32l + k (the weight plus 1).
        for j in 0..2 {
            let q = load(&b.qs[32 * j..]);
            for l in 0..4 {
                acc = _mm256_add_epi32(acc, scaled(crumbs(q, l), acts(yb, 4 * j + l), one));
            }
        }
        let offset: i32 = yb.bsums.iter().map(|&s| s as i32).sum();
        sum += (hsum(acc) - offset) as f32 * (yb.d * d16(b.d));
    }
    sum
}

#[cfg(test)]
mod tests {
    use std::ops::Range;

    use onebit_gguf::GgmlType;

    use crate::formats::quantize;
    use crate::tier::KernelTier;

    /// Every Q8_K dot of this tier (those here and TQ1_0's) gives the scalar reference's bits,
    /// over rows of several blocks with scales of every size, and over rows whose codes and
    /// sub-block scales are random bytes.
    #[test]
    fn k_quant_dots_equal_the_reference_bit_for_bit() {
        if !KernelTier::Avx2.is_available() {
            return;
        }
        let n = 4 * super::QK_K;
        let x: Vec<f32> = (0..n).map(|i| ((i * 7919 % 409) as f32 - 204.0) / 9.0).collect();
        let mut a = vec![0u8; GgmlType::Q8_K.bytes_for(n as u64).unwrap() as usize];
        quantize(GgmlType::Q8_K, &x, &mut a).unwrap();
        // Each kernel, and where its blocks keep their f16 scales (left as quantized, finite,
        // when the other bytes are scrambled).
        let kernels: [(GgmlType, crate::scalar::dot::DotFn, Range<usize>); 7] = [
            (GgmlType::Q2_K, super::dot_q2_k, 80..84),
            (GgmlType::Q3_K, super::dot_q3_k, 108..110),
            (GgmlType::Q4_K, super::dot_q4_k, 0..4),
            (GgmlType::Q5_K, super::dot_q5_k, 0..4),
            (GgmlType::Q6_K, super::dot_q6_k, 208..210),
            (GgmlType::TQ2_0, super::dot_tq2_0, 64..66),
            (GgmlType::TQ1_0, super::super::ternary::dot_tq1_0, 52..54),
        ];
        for (ty, dot, halves) in kernels {
            let reference = crate::scalar::dot::dot_fn(ty).unwrap();
            let block = ty.bytes_for(super::QK_K as u64).unwrap() as usize;
            for seed in 0..12usize {
                let scale = [1e-3f32, 0.3, 1.0, 50.0][seed % 4];
                let w: Vec<f32> = (0..n).map(|i| ((i * 31 + seed * 977) % 113) as f32 * scale - 56.0 * scale).collect();
                let mut wq = vec![0u8; ty.bytes_for(n as u64).unwrap() as usize];
                quantize(ty, &w, &mut wq).unwrap();
                if seed >= 8 {
                    for (i, q) in wq.iter_mut().enumerate().filter(|(i, _)| !halves.contains(&(i % block))) {
                        *q = ((i * 2_654_435_761 + seed * 40_503) >> 7) as u8;
                    }
                }
                assert_eq!(dot(&wq, &a, n).to_bits(), reference(&wq, &a, n).to_bits(), "{ty} seed {seed}");
            }
        }
    }
}
