//! AVX2 dot product of Q2_0 rows (Bonsai's 2-bit ternary blocks: 64 codes and an f16 scale;
//! weight = code − 1) with Q8_0 activations, one row and one token at a time.
//!
//! A sub-block's 32 codes are spread one to a byte by a shuffle (each source byte four times)
//! and two compares against its bit positions; `vpmaddubsw` of |code − 1| with the activations
//! carrying code − 1's sign then sums them exactly. The float steps are the scalar reference's.

use std::arch::x86_64::*;

use super::kquants::hsum;
use crate::formats::ternary::BlockQ2_0;
use crate::formats::{BlockQ8_0, blocks, half as d16};

/// Q2_0 row `w` · Q8_0 row `a` over `n` values.
pub(super) fn dot_q2_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: the AVX2 table, which holds this kernel, exists only on CPUs with AVX2 and FMA.
    unsafe { dot_q2_0_impl(w, a, n) }
}

#[target_feature(enable = "avx2,fma")]
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
