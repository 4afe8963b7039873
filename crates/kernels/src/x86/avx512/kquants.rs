//! AVX-512 K-quant products (Q2_K..Q6_K with Q8_K activations). Q6_K has a kernel of its own
//! here; Q2_K..Q5_K take the AVX2 tier's dot products, which every AVX-512 CPU can run and
//! which on AMD Zen 4 are faster than the 512-bit versions they replaced (one token, one thread,
//! `examples/gemv_speed`: Q2_K 34 against 28 Gweights/s, Q3_K 27 against 9, Q4_K 26 against 19,
//! Q5_K 20 against 17; the 512-bit ones multiplied each 32 weights' sums by their scales with
//! `vpmulld`, where the AVX2 ones pair scales into `vpmaddwd`).

use std::arch::x86_64::*;

use onebit_gguf::GgmlType;

use super::matmul::{ByteDot, byte_rows, d16};
use crate::formats::*;
use crate::matmul::{RowKernel, TiledFn};

pub(super) fn kernel(ty: GgmlType) -> Option<RowKernel> {
    use crate::x86::avx2::kquants as avx2;
    use GgmlType::*;
    let dot = match ty {
        Q2_K => avx2::dot_q2_k,
        Q3_K => avx2::dot_q3_k,
        Q4_K => avx2::dot_q4_k,
        Q5_K => avx2::dot_q5_k,
        Q6_K => {
            let f: TiledFn = |w, r, a, o| byte_rows(w, r, a, o, dot_q6_k as ByteDot);
            return Some(RowKernel::Tiled(f));
        }
        _ => return None,
    };
    Some(RowKernel::Dot(dot))
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
