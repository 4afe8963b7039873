//! AVX2 attention scores against a Q8_0 key cache, the queries rounded to Q8_0 too (see
//! `Kernels::scores_q8_0`): eight keys at a time, and a block's eight exact integer dots come
//! out summed into one vector, one key per lane, so that the scales cost one conversion and
//! three float operations per query, block and eight keys.
//!
//! Keys and queries are widened to 16 bits once (a group of eight keys is shared by every
//! query of the kv head), and a block's dot is two `vpmaddwd` and an add. On Zen 4 (and 3)
//! the byte multiply-add `vpmaddubsw`, the `vpsignb` it needs for signed keys and `vpmaddwd`
//! all go to the same two pipes: three of them per query, key and block were the bound, two
//! are now. The eight vectors of a block are summed across their lanes by unpacks and adds,
//! which run beside them, not by `vphaddd` (one every two cycles there). Before this, each
//! query and key took the scales per block and a sum across lanes of its own: 9.4 GB/s from
//! L2 with the two queries of a 1.7B-shape kv head on Zen 4.
//!
//! A score is `Σ_b (d_qb · d_kb) · float(I_b)`, the blocks added in order by a separate
//! multiply and add, the scalar reference's operations to the bit.

use std::arch::x86_64::*;

use crate::x86::{RunChunk, RunChunks};

/// Blocks a row may have.
const MAX_BLOCKS: usize = crate::dispatch::MAX_HEAD / 32;

/// Keys taken together: one per lane of a vector of f32.
const KEYS: usize = 8;

/// A group of up to [`KEYS`] key rows as the queries read them: their blocks' values widened
/// to 16 bits, and their scales.
struct Group {
    /// Key l's block b at `wide[b][l]`.
    wide: [[[i16; 32]; KEYS]; MAX_BLOCKS],
    /// Block b's scales, key l in lane l.
    scales: [[f32; KEYS]; MAX_BLOCKS],
}

impl Group {
    /// The group of rows `keys .. keys + live·row` (the last live row repeated past `live`).
    ///
    /// # Safety
    /// `1 ≤ live ≤ KEYS` whole rows of `nb ≤ MAX_BLOCKS` blocks at `keys`; AVX2 and F16C.
    #[inline(always)]
    unsafe fn fill(&mut self, keys: *const u8, live: usize, nb: usize) {
        // SAFETY: the contract: rows l.min(live - 1) < live, blocks b < nb of 34 bytes each.
        unsafe {
            for b in 0..nb {
                let mut half = [0u16; KEYS];
                for (l, half) in half.iter_mut().enumerate() {
                    let block = keys.add(l.min(live - 1) * nb * 34 + 34 * b);
                    *half = (block as *const u16).read_unaligned();
                    widen(block.add(2), self.wide[b][l].as_mut_ptr());
                }
                let d = _mm256_cvtph_ps(_mm_loadu_si128(half.as_ptr() as *const __m128i));
                _mm256_storeu_ps(self.scales[b].as_mut_ptr(), d);
            }
        }
    }

    /// The scores of a query row (its `nb` blocks widened at `q`, their scales at `dq`) against
    /// the group, key l in lane l.
    ///
    /// # Safety
    /// `fill` ran with `nb`; `32·nb` values at `q`, `nb` scales at `dq`; AVX2 and F16C.
    #[inline(always)]
    unsafe fn scores(&self, q: *const i16, dq: *const f32, nb: usize) -> __m256 {
        // SAFETY: the contract: blocks b < nb ≤ MAX_BLOCKS, 32 values (two vectors) each.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for b in 0..nb {
                let q0 = _mm256_loadu_si256(q.add(32 * b) as *const __m256i);
                let q1 = _mm256_loadu_si256(q.add(32 * b + 16) as *const __m256i);
                let mut dots = [_mm256_setzero_si256(); KEYS];
                for (l, dot) in dots.iter_mut().enumerate() {
                    let k = self.wide[b][l].as_ptr();
                    let k0 = _mm256_madd_epi16(_mm256_loadu_si256(k as *const __m256i), q0);
                    let k1 = _mm256_madd_epi16(_mm256_loadu_si256(k.add(16) as *const __m256i), q1);
                    *dot = _mm256_add_epi32(k0, k1);
                }
                // Within each 128-bit half, keys 0-3 (a) and 4-7 (c): their two halves' sums.
                let a = four_sums(&dots[..4]);
                let c = four_sums(&dots[4..]);
                let low = _mm256_permute2x128_si256::<0x20>(a, c);
                let high = _mm256_permute2x128_si256::<0x31>(a, c);
                let dot = _mm256_cvtepi32_ps(_mm256_add_epi32(low, high));
                let scale = _mm256_mul_ps(_mm256_set1_ps(*dq.add(b)), _mm256_loadu_ps(self.scales[b].as_ptr()));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(scale, dot));
            }
            acc
        }
    }
}

/// The 32 bytes at `from` as 32 i16 at `to`.
///
/// # Safety
/// 32 readable bytes at `from`, 64 writable at `to`; AVX2.
#[inline(always)]
unsafe fn widen(from: *const u8, to: *mut i16) {
    // SAFETY: the contract.
    unsafe {
        let bytes = _mm256_loadu_si256(from as *const __m256i);
        _mm256_storeu_si256(to as *mut __m256i, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes)));
        let high = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(bytes));
        _mm256_storeu_si256(to.add(16) as *mut __m256i, high);
    }
}

/// The sums of each 128-bit half of four vectors of eight i32: `[Σ x0, Σ x1, Σ x2, Σ x3]` of
/// the low halves, then of the high halves. Unpacking and adding, because `vphaddd` (the same
/// in two instructions) takes two cycles on Zen 3 and 4, and it was the kernel's bottleneck.
///
/// # Safety
/// AVX2; `x` has four vectors.
#[inline(always)]
unsafe fn four_sums(x: &[__m256i]) -> __m256i {
    // SAFETY: register operations only (AVX2, the contract).
    unsafe {
        // Per half: [x0 lanes 0+2, x1 lanes 0+2, x0 lanes 1+3, x1 lanes 1+3].
        let pair = |a, b| _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
        let (p, q) = (pair(x[0], x[1]), pair(x[2], x[3]));
        _mm256_add_epi32(_mm256_unpacklo_epi64(p, q), _mm256_unpackhi_epi64(p, q))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn scores_impl(q: &[u8], keys: &[&[u8]], k: usize, out: &mut [f32], ldo: usize) {
    let (nb, row) = (k / 32, k / 32 * 34);
    assert!(nb <= MAX_BLOCKS, "scores_q8_0: rows of {k} values are wider than a head");
    let m = q.len() / row;
    let n: usize = keys.iter().map(|r| r.len() / row).sum();
    assert!(m * row <= q.len() && (m == 0 || (m - 1) * ldo + n <= out.len()));
    let scale = |b: &[u8]| crate::formats::f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    // The query rows' blocks widened (32 values each, rows side by side) and their scales.
    let (mut wide, mut dq) = (vec![0i16; m * nb * 32], vec![0f32; m * nb]);
    for ((blk, w), d) in q[..m * row].chunks_exact(34).zip(wide.chunks_exact_mut(32)).zip(&mut dq) {
        *d = scale(blk);
        // SAFETY: the 32 bytes after the block's scale, into 32 values; AVX2 is enabled on this
        // function.
        unsafe { widen(blk.as_ptr().add(2), w.as_mut_ptr()) };
    }
    let mut group = Group { wide: [[[0; 32]; KEYS]; MAX_BLOCKS], scales: [[0.0; KEYS]; MAX_BLOCKS] };
    for RunChunk { run, rows, j } in RunChunks::new(keys, row, KEYS) {
        let live = rows.len();
        let mut lanes = [0f32; KEYS];
        // SAFETY: the chunk's keys are whole rows of the run (`Kernels` checked that the run is
        // whole rows) of nb ≤ MAX_BLOCKS blocks; rows i < m of `wide` and `dq` hold nb blocks
        // each; outputs i·ldo + j + l for l < live are below (m - 1)·ldo + n (asserted); AVX2
        // and F16C are enabled on this function.
        unsafe {
            group.fill(run.as_ptr().add(rows.start * row), live, nb);
            for i in 0..m {
                let s = group.scores(wide.as_ptr().add(i * nb * 32), dq.as_ptr().add(i * nb), nb);
                let to = out.as_mut_ptr().add(i * ldo + j);
                if live == KEYS {
                    _mm256_storeu_ps(to, s);
                } else {
                    _mm256_storeu_ps(lanes.as_mut_ptr(), s);
                    for (l, &x) in lanes.iter().take(live).enumerate() {
                        *to.add(l) = x;
                    }
                }
            }
        }
    }
}

pub(crate) fn scores_q8_0(q: &[u8], keys: &[&[u8]], k: usize, out: &mut [f32], ldo: usize) {
    // SAFETY: the AVX2 table (the only caller) is built only when the CPU reports AVX2, FMA and
    // F16C (`KernelTier::is_available`); `Kernels::scores_q8_0` checked that every row is whole
    // blocks, and the kernel asserts that its outputs lie in `out`.
    unsafe { scores_impl(q, keys, k, out, ldo) }
}
