//! AVX2 attention scores against a Q8_0 key cache, the queries rounded to Q8_0 too (see
//! `Kernels::scores_q8_0`): per 32-value block, the exact integer dot by `vpmaddubsw` on the
//! keys' magnitudes and the queries carrying the keys' signs (|k| ≤ 128 and |q| ≤ 127, so a pair
//! of products fits 16 bits), then `vpmaddwd` into 8 lanes of 32 bits, turned to f32 and
//! multiplied by the two scales into one accumulator per score.

use std::arch::x86_64::*;

/// Query rows taken against each key row at a time.
const ROWS: usize = 4;

#[target_feature(enable = "avx2,fma,f16c")]
fn scores_impl(q: &[u8], keys: &[&[u8]], k: usize, out: &mut [f32], ldo: usize) {
    let (nb, row) = (k / 32, k / 32 * 34);
    let m = q.len() / row;
    let n: usize = keys.iter().map(|r| r.len() / row).sum();
    let scale = |b: &[u8]| crate::formats::f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    let mut i = 0;
    while i < m {
        let r = (m - i).min(ROWS);
        assert!((i + r) * row <= q.len() && (i + r - 1) * ldo + n <= out.len());
        let qrows: Vec<&[u8]> = (0..r).map(|t| &q[(i + t) * row..][..row]).collect();
        let dq: Vec<f32> = qrows.iter().flat_map(|qr| qr.chunks_exact(34).map(scale)).collect();
        for (j, kr) in keys.iter().flat_map(|run| run.chunks_exact(row)).enumerate() {
            // SAFETY: every block read is 34 whole bytes of a row (a 2-byte scale, then the
            // 32 bytes loaded); AVX2, FMA and F16C are enabled on this function.
            let sums = unsafe { key_row(&qrows, &dq, kr, nb) };
            for (t, s) in sums.iter().take(r).enumerate() {
                out[(i + t) * ldo + j] = *s;
            }
        }
        i += r;
    }
}

/// The scores of up to [`ROWS`] query rows against one key row of `nb` blocks.
///
/// # Safety
/// Every row holds `nb` whole blocks; AVX2, FMA and F16C are present.
#[inline(always)]
unsafe fn key_row(qrows: &[&[u8]], dq: &[f32], kr: &[u8], nb: usize) -> [f32; ROWS] {
    // SAFETY: the caller's contract: bytes 34b .. 34b + 34 lie inside every row for b < nb.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); ROWS];
        for b in 0..nb {
            let kb = _mm256_loadu_si256(kr.as_ptr().add(34 * b + 2) as *const __m256i);
            let dk = _mm256_cvtph_ps(_mm_set1_epi16((kr.as_ptr().add(34 * b) as *const i16).read_unaligned()));
            let mag = _mm256_abs_epi8(kb);
            for (t, qr) in qrows.iter().enumerate() {
                let qb = _mm256_loadu_si256(qr.as_ptr().add(34 * b + 2) as *const __m256i);
                let pairs = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(qb, kb));
                let dot = _mm256_madd_epi16(pairs, ones);
                let s = _mm256_mul_ps(_mm256_set1_ps(dq[t * nb + b]), dk);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, acc[t]);
            }
        }
        std::array::from_fn(|t| {
            let x = _mm_add_ps(_mm256_castps256_ps128(acc[t]), _mm256_extractf128_ps::<1>(acc[t]));
            let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
            _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)))
        })
    }
}

pub(crate) fn scores_q8_0(q: &[u8], keys: &[&[u8]], k: usize, out: &mut [f32], ldo: usize) {
    // SAFETY: the AVX2 table (the only caller) is built only when the CPU reports AVX2, FMA and
    // F16C (`KernelTier::is_available`); `Kernels::scores_q8_0` checked that every row is whole
    // blocks, and the kernel asserts that its outputs lie in `out`.
    unsafe { scores_impl(q, keys, k, out, ldo) }
}
