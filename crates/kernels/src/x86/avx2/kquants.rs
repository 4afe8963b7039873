//! AVX2 dot products of the K-quant rows most files use (Q4_K, Q5_K, Q6_K: the Q4_K_M and
//! Q5_K_M mixes) and of ternary TQ2_0 rows with Q8_K activations, one row and one token at a
//! time.
//!
//! Each block's sum is formed exactly in integers, 32 weights per vector: `vpmaddubsw` of the
//! unsigned codes (at most 63) with the signed activations keeps its pair sums under 2 · 63 · 127,
//! and `vpmaddwd` with the sub-block's scale widens them to 32 bits. The offsets (Q4_K/Q5_K's
//! mins, Q6_K's −32, TQ2_0's −1) come off afterwards from the activations' 16-value sums. The float steps
//! are the scalar reference's, block after block, so the results are its bits.

use std::arch::x86_64::*;

use crate::formats::kquants::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, scale_min_k4};
use crate::formats::ternary::BlockTQ2_0;
use crate::formats::{QK_K, blocks, half as d16};

/// Q4_K row `w` · Q8_K row `a` over `n` values.
pub(super) fn dot_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: the AVX2 table, which holds this kernel, exists only on CPUs with AVX2 and FMA.
    unsafe { dot_q4_k_impl(w, a, n) }
}

/// Q5_K row `w` · Q8_K row `a` over `n` values.
pub(super) fn dot_q5_k(w: &[u8], a: &[u8], n: usize) -> f32 {
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

/// 32 unsigned codes times 32 signed activations, the two 16-value halves scaled by `lo` and
/// `hi`, as eight i32 sums.
#[inline]
#[target_feature(enable = "avx2")]
fn scaled(q: __m256i, a: __m256i, lo: i16, hi: i16) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), _mm256_setr_m128i(_mm_set1_epi16(lo), _mm_set1_epi16(hi)))
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

/// 32 bytes at `p`.
#[inline]
#[target_feature(enable = "avx2")]
fn load(p: &[u8]) -> __m256i {
    assert!(p.len() >= 32);
    // SAFETY: `p` holds 32 bytes (asserted).
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// The activations' 32 values `32j ..`.
#[inline]
#[target_feature(enable = "avx2")]
fn acts(y: &BlockQ8K, j: usize) -> __m256i {
    load(bytemuck::cast_slice(&y.qs[32 * j..32 * j + 32]))
}

/// Q4_K/Q5_K's common end of a block: Σ scale · (code · a) with the 6-bit scales and mins.
#[inline]
#[target_feature(enable = "avx2")]
fn k4_block(d: [u8; 2], dmin: [u8; 2], scales: &[u8; 12], y: &BlockQ8K, codes: impl Fn(usize) -> __m256i) -> f32 {
    let mut acc = _mm256_setzero_si256();
    let mut msum = 0i32;
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        acc = _mm256_add_epi32(acc, scaled(codes(j), acts(y, j), sc as i16, sc as i16));
        msum += m as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
    }
    d16(d) * y.d * hsum(acc) as f32 - d16(dmin) * y.d * msum as f32
}

#[target_feature(enable = "avx2,fma")]
fn dot_q4_k_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ4K>(w), blocks::<BlockQ8K>(a));
    let mut sum = 0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        // Sub-block j: the low nibbles (even j) or high nibbles (odd j) of bytes 32·(j/2)...
        sum += k4_block(b.d, b.dmin, &b.scales, yb, |j| nibbles(load(&b.qs[32 * (j / 2)..]), j % 2 == 1));
    }
    sum
}

#[target_feature(enable = "avx2,fma")]
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

#[target_feature(enable = "avx2,fma")]
fn dot_q6_k_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ6K>(w), blocks::<BlockQ8K>(a));
    let three = _mm256_set1_epi8(3);
    let mut sum = 0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        let mut acc = _mm256_setzero_si256();
        for half in 0..2 {
            let (ql0, ql1) = (load(&b.ql[64 * half..]), load(&b.ql[64 * half + 32..]));
            let qh = load(&b.qh[32 * half..]);
            for quarter in 0..4 {
                let ql = if quarter % 2 == 0 { ql0 } else { ql1 };
                let low = nibbles(ql, quarter >= 2);
                let high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * quarter as i32)), three);
                let q = _mm256_or_si256(low, _mm256_slli_epi16::<4>(high));
                let s = 8 * half + 2 * quarter;
                let (lo, hi) = (b.scales[s] as i16, b.scales[s + 1] as i16);
                acc = _mm256_add_epi32(acc, scaled(q, acts(yb, 4 * half + quarter), lo, hi));
            }
        }
        // The codes are the weights + 32.
        let offset: i32 = (0..16).map(|i| b.scales[i] as i32 * yb.bsums[i] as i32).sum();
        sum += d16(b.d) * yb.d * (hsum(acc) - 32 * offset) as f32;
    }
    sum
}

#[target_feature(enable = "avx2,fma")]
fn dot_tq2_0_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockTQ2_0>(w), blocks::<BlockQ8K>(a));
    let three = _mm256_set1_epi8(3);
    let mut sum = 0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        let mut acc = _mm256_setzero_si256();
        // Bits 2l of byte k of half j hold code j·128 + 32l + k (the weight plus 1).
        for j in 0..2 {
            let q = load(&b.qs[32 * j..]);
            for l in 0..4 {
                let codes = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * l as i32)), three);
                acc = _mm256_add_epi32(acc, scaled(codes, acts(yb, 4 * j + l), 1, 1));
            }
        }
        let offset: i32 = yb.bsums.iter().map(|&s| s as i32).sum();
        sum += (hsum(acc) - offset) as f32 * (yb.d * d16(b.d));
    }
    sum
}

#[cfg(test)]
mod tests {
    use onebit_gguf::GgmlType;

    use crate::formats::quantize;
    use crate::tier::KernelTier;

    /// Every dot here gives the scalar reference's bits, over rows of several blocks with
    /// scales of every size.
    #[test]
    fn k_quant_dots_equal_the_reference_bit_for_bit() {
        if !KernelTier::Avx2.is_available() {
            return;
        }
        let n = 4 * super::QK_K;
        let x: Vec<f32> = (0..n).map(|i| ((i * 7919 % 409) as f32 - 204.0) / 9.0).collect();
        let mut a = vec![0u8; GgmlType::Q8_K.bytes_for(n as u64).unwrap() as usize];
        quantize(GgmlType::Q8_K, &x, &mut a).unwrap();
        let kernels: [(GgmlType, crate::scalar::dot::DotFn); 4] = [
            (GgmlType::Q4_K, super::dot_q4_k),
            (GgmlType::Q5_K, super::dot_q5_k),
            (GgmlType::Q6_K, super::dot_q6_k),
            (GgmlType::TQ2_0, super::dot_tq2_0),
        ];
        for (ty, dot) in kernels {
            let reference = crate::scalar::dot::dot_fn(ty).unwrap();
            for seed in 0..8usize {
                let scale = [1e-3f32, 0.3, 1.0, 50.0][seed % 4];
                let w: Vec<f32> = (0..n).map(|i| ((i * 31 + seed * 977) % 113) as f32 * scale - 56.0 * scale).collect();
                let mut wq = vec![0u8; ty.bytes_for(n as u64).unwrap() as usize];
                quantize(ty, &w, &mut wq).unwrap();
                assert_eq!(dot(&wq, &a, n).to_bits(), reference(&wq, &a, n).to_bits(), "{ty} seed {seed}");
            }
        }
    }
}
