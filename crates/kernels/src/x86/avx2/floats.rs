//! AVX2 dot products of float weight rows (f32, f16 through F16C, bf16 by a shift) with f32
//! activations, eight lanes at a time and the rest one by one.

use std::arch::x86_64::*;

use crate::formats::{bf16_to_f32, f16_to_f32};

/// f32 row `w` (bytes, at any alignment) · `a` over `n` values.
pub(super) fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: the AVX2 table, which holds this kernel, exists only on CPUs with AVX2 and FMA.
    unsafe {
        dot_impl::<4>(w, a, n, |p| _mm256_loadu_ps(p as *const f32), |b| f32::from_le_bytes(b.try_into().unwrap()))
    }
}

/// f16 row `w` · `a` over `n` values.
pub(super) fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: as for `dot_f32` (the tier also requires F16C).
    unsafe {
        dot_impl::<2>(
            w,
            a,
            n,
            |p| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            |b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
        )
    }
}

/// bf16 row `w` · `a` over `n` values.
pub(super) fn dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
    // SAFETY: as for `dot_f32`.
    unsafe {
        dot_impl::<2>(
            w,
            a,
            n,
            |p| {
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                    p as *const __m128i,
                ))))
            },
            |b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])),
        )
    }
}

/// Σ w·a with weights of `B` bytes each: `wide` widens the 8 weights at a pointer, `one` the
/// weight in `B` bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_impl<const B: usize>(
    w: &[u8],
    a: &[u8],
    n: usize,
    wide: impl Fn(*const u8) -> __m256,
    one: impl Fn(&[u8]) -> f32,
) -> f32 {
    let a: &[f32] = bytemuck::cast_slice(a);
    assert!(w.len() >= B * n && a.len() >= n);
    let mut acc = _mm256_setzero_ps();
    let body = n / 8 * 8;
    for i in (0..body).step_by(8) {
        // SAFETY: values i .. i + 8 lie inside both rows (asserted above).
        unsafe { acc = _mm256_fmadd_ps(wide(w.as_ptr().add(B * i)), _mm256_loadu_ps(a.as_ptr().add(i)), acc) };
    }
    let mut sum = super::ops::hsum(acc);
    for i in body..n {
        sum += one(&w[B * i..B * i + B]) * a[i];
    }
    sum
}

#[cfg(test)]
mod tests {
    use onebit_gguf::GgmlType;

    use crate::formats::quantize;
    use crate::tier::KernelTier;

    /// Odd lengths (a tail after the 8-lane body) and every float type, against the reference.
    #[test]
    fn float_dots_match_the_reference_at_odd_lengths() {
        if !KernelTier::Avx2.is_available() {
            return;
        }
        let kernels: [(GgmlType, crate::scalar::dot::DotFn); 3] =
            [(GgmlType::F32, super::dot_f32), (GgmlType::F16, super::dot_f16), (GgmlType::BF16, super::dot_bf16)];
        for n in [1, 7, 8, 13, 64, 131] {
            let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0).collect();
            let w: Vec<f32> = (0..n).map(|i| ((i * 53 % 29) as f32 - 14.0) / 5.0).collect();
            let a: Vec<u8> = bytemuck::cast_slice(&x).to_vec();
            for (ty, dot) in kernels {
                let mut wq = vec![0u8; ty.bytes_for(n as u64).unwrap() as usize];
                quantize(ty, &w, &mut wq).unwrap();
                let (got, want) = (dot(&wq, &a, n), crate::scalar::dot::dot_fn(ty).unwrap()(&wq, &a, n));
                assert!((got - want).abs() <= 1e-5 * want.abs().max(1.0), "{ty} n={n}: {got} vs {want}");
            }
        }
    }
}
