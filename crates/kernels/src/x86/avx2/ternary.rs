//! AVX2 dot products of Q2_0 rows (Bonsai's 2-bit ternary blocks: 64 codes and an f16 scale;
//! weight = code − 1) with Q8_0 activations, and of TQ1_0 rows (base-3, five trits a byte) with
//! Q8_K activations, one row and one token at a time.
//!
//! Q2_0: a sub-block's 32 codes are spread one to a byte by a shuffle (each source byte four
//! times) and two compares against its bit positions; `vpmaddubsw` of |code − 1| with the
//! activations carrying code − 1's sign then sums them exactly.
//!
//! TQ1_0: trit k of byte b is ⌊3 · (b · 3^k mod 256) / 256⌋, that is [p ≥ 86] + [p ≥ 171] for
//! p = b · 3^k mod 256. The products come from wrapping byte additions (p · 3 = p + p + p), and
//! the two unsigned thresholds are signed compares on p − 128 (multiplying by 3 keeps that bias,
//! as 3 · 128 ≡ 128 mod 256). The trits (the weights + 1) go through `vpmaddubsw` in 16-bit
//! sums, small enough for a whole block, and the +1 comes off with the activations' sums.
//!
//! The float steps are the scalar reference's, so the results are its bits.

use std::arch::x86_64::*;

use super::kquants::{acts, d16, hsum, load, load16};
use crate::formats::ternary::{BlockQ2_0, BlockTQ1_0};
use crate::formats::{BlockQ8_0, BlockQ8K, QK_K, blocks};

/// Q2_0 row `w` · Q8_0 row `a` over `n` values.
pub(super) fn dot_q2_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: the AVX2 table, which holds this kernel, exists only on CPUs with AVX2, FMA and F16C.
    unsafe { dot_q2_0_impl(w, a, n) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q2_0_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ2_0>(w), blocks::<BlockQ8_0>(a));
    assert!(y.len() >= 2 * (n / 64));
    // Byte j of a sub-block's vector takes source byte j / 4 and its bits 2 (j % 4) ..
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7,
    );
    let low = _mm256_set1_epi32(0x4010_0401);
    let high = _mm256_set1_epi32(0x8020_0802u32 as i32);
    let (one, two) = (_mm256_set1_epi8(1), _mm256_set1_epi8(2));
    let mut sum = 0f32;
    for (i, b) in w[..n / 64].iter().enumerate() {
        let mut sumi = 0f32;
        for k in 0..2 {
            let yb = &y[2 * i + k];
            let bytes = u64::from_le_bytes(b.qs[8 * k..8 * k + 8].try_into().unwrap());
            let rep = _mm256_shuffle_epi8(_mm256_set1_epi64x(bytes as i64), spread);
            let b0 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(rep, low), low), one);
            let b1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(rep, high), high), two);
            let v = _mm256_sub_epi8(_mm256_or_si256(b0, b1), one);
            // SAFETY: a Q8_0 block holds 32 quants.
            let x = unsafe { _mm256_loadu_si256(yb.qs.as_ptr() as *const __m256i) };
            let p = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(x, v)),
                _mm256_set1_epi16(1),
            );
            sumi += d16(yb.d) * hsum(p) as f32;
        }
        sum += d16(b.d) * sumi;
    }
    sum
}

/// TQ1_0 row `w` · Q8_K row `a` over `n` values.
pub(super) fn dot_tq1_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: as for `dot_q2_0`.
    unsafe { dot_tq1_0_impl(w, a, n) }
}

/// The trits (0, 1 or 2) of 32 products p held as p − 128 (see the module's header).
#[inline]
#[target_feature(enable = "avx2")]
fn trits(biased: __m256i) -> __m256i {
    // Each compare is −1 where true: p ≥ 86 ⇔ p − 128 > −43, p ≥ 171 ⇔ p − 128 > 42.
    let low = _mm256_cmpgt_epi8(biased, _mm256_set1_epi8(-43));
    let high = _mm256_cmpgt_epi8(biased, _mm256_set1_epi8(42));
    _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(low, high))
}

/// The bytes of `p` times 3 (mod 256) where `mask` is set, unchanged elsewhere.
#[inline]
#[target_feature(enable = "avx2")]
fn times3(p: __m256i, mask: __m256i) -> __m256i {
    _mm256_add_epi8(p, _mm256_and_si256(_mm256_add_epi8(p, p), mask))
}

/// `qh`'s 16 trits (weights 240..256: trit k of byte j is weight 240 + 4k + j) as biased
/// products, byte 4k + j holding qh[j] · 3^k − 128.
#[inline]
#[target_feature(enable = "avx2")]
fn qh_products(qh: [u8; 4]) -> __m128i {
    let mut p = _mm_xor_si128(_mm_set1_epi32(i32::from_le_bytes(qh)), _mm_set1_epi8(i8::MIN));
    for k in 1..4 {
        // Dwords k.. take one more factor 3.
        let mask = _mm_cmpgt_epi32(_mm_setr_epi32(0, 1, 2, 3), _mm_set1_epi32(k - 1));
        p = _mm_add_epi8(p, _mm_and_si128(_mm_add_epi8(p, p), mask));
    }
    p
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_tq1_0_impl(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockTQ1_0>(w), blocks::<BlockQ8K>(a));
    let bias = _mm256_set1_epi8(i8::MIN);
    let all = _mm256_set1_epi8(-1);
    let upper = _mm256_setr_m128i(_mm_setzero_si128(), _mm_set1_epi8(-1));
    let mut sum = 0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        // Bytes 0..32: trit k of byte m is weight 32k + m.
        let mut p = _mm256_xor_si256(load(&b.qs), bias);
        let mut acc = _mm256_setzero_si256();
        for k in 0..5 {
            acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(trits(p), acts(yb, k)));
            p = times3(p, all);
        }
        // Bytes 32..48: trit k of byte m is weight 160 + 16k + m, two trits a vector (the upper
        // half one factor 3 ahead); the fifth trit shares its vector with `qh`'s.
        let tail = _mm256_broadcastsi128_si256(load16(&b.qs[32..]));
        let mut p = times3(_mm256_xor_si256(tail, bias), upper);
        for k in 0..3 {
            let v = if k < 2 { p } else { _mm256_inserti128_si256::<1>(p, qh_products(b.qh)) };
            acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(trits(v), acts(yb, 5 + k)));
            p = times3(times3(p, all), all);
        }
        // No 16-bit lane overflows: it adds eight pair products of at most 2 · 2 · 128 and
        // subtracts one sum of 16 activations.
        let s = _mm256_sub_epi16(acc, load(bytemuck::cast_slice(&yb.bsums)));
        let s = hsum(_mm256_madd_epi16(s, _mm256_set1_epi16(1)));
        sum += s as f32 * (d16(b.d) * yb.d);
    }
    sum
}

#[cfg(test)]
mod tests {
    use onebit_gguf::GgmlType;

    use crate::formats::quantize;
    use crate::tier::KernelTier;

    /// The reference's bits, for ternary and for the fourth code (2) a file may hold.
    #[test]
    fn q2_0_dot_equals_the_reference_bit_for_bit() {
        if !KernelTier::Avx2.is_available() {
            return;
        }
        let n = 6 * 64;
        let x: Vec<f32> = (0..n).map(|i| ((i * 7919 % 409) as f32 - 204.0) / 9.0).collect();
        let mut a = vec![0u8; GgmlType::Q8_0.bytes_for(n as u64).unwrap() as usize];
        quantize(GgmlType::Q8_0, &x, &mut a).unwrap();
        let reference = crate::scalar::dot::dot_fn(GgmlType::Q2_0).unwrap();
        for seed in 0..6usize {
            let w: Vec<f32> = (0..n).map(|i| ((i * 31 + seed * 977) % 3) as f32 - 1.0).collect();
            let mut wq = vec![0u8; GgmlType::Q2_0.bytes_for(n as u64).unwrap() as usize];
            quantize(GgmlType::Q2_0, &w, &mut wq).unwrap();
            if seed % 2 == 1 {
                // Raw codes, 3 (weight 2) included.
                for (i, q) in wq.iter_mut().enumerate().filter(|(i, _)| i % 18 >= 2) {
                    *q = (i * 97 + seed) as u8;
                }
            }
            assert_eq!(super::dot_q2_0(&wq, &a, n).to_bits(), reference(&wq, &a, n).to_bits(), "seed {seed}");
        }
    }
}
