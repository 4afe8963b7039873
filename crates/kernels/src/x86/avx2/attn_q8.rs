//! AVX2 attention scores against a Q8_0 key cache, the queries rounded to Q8_0 too (see
//! `Kernels::scores_q8_0`): eight keys at a time, and a block's eight exact integer dots come
//! out summed into one vector, one key per lane, so that the scales cost one conversion and
//! three float operations per query, block and eight keys.
//!
//! A block's dot is `vpmaddubsw` of the key's absolute values by the query's bytes given the
//! key's signs, then `vpmaddwd` by ones: exact, as `|k| ≤ 128` and `|q| ≤ 127` keep a pair's
//! sum below 2¹⁵ (queries from elsewhere with a byte of -128 take the scalar reference). The
//! keys go from the cache into registers, each load serving two queries of
//! the kv head ([`QUERIES`]). Before, each group of eight keys was first widened to 16 bits
//! into a buffer and read back for two `vpmaddwd` a query: as many multiply-adds on the one
//! pipe that runs them on Zen 2 (and 3 and 4), but the widening and its stores and loads
//! took as long again. Zen 2, one thread, from L2 (`attn_speed`): one query 15.7 → 22.1 GB/s,
//! two 11.3 → 15.3, four 7.2 → 8.4; decode scores at 4,096 positions on two threads
//! (`attn_decode`, with [`CHUNK_AHEAD`], then asked all at once): 7.9 → 6.7 ms a token with
//! two query heads a kv head, 11.4 → 10.0 with four. The eight vectors of a block are summed
//! across their lanes by unpacks and adds, which run beside them, not by `vphaddd` (one every
//! two cycles there).
//!
//! A score is `Σ_b (d_qb · d_kb) · float(I_b)`, the blocks added in order by a separate
//! multiply and add, the scalar reference's operations to the bit.

use std::arch::x86_64::*;

use crate::x86::{RunChunk, RunChunks};

/// Blocks a row may have.
const MAX_BLOCKS: usize = crate::table::MAX_HEAD / 32;

/// Keys taken together: one per lane of a vector of f32.
const KEYS: usize = 8;

/// Bytes past a chunk of keys that it asks for into L1, a share beside each block's products.
/// On Zen 2 (decode scores at 4,096 positions, two threads, two query heads a kv head,
/// `attn_decode`), asked all at once as the chunk began: into L1 1 KiB ahead 6.6–6.8 ms a
/// token; into L2 1 KiB ahead 7.2–7.3, 4 KiB ahead 7.1–7.3 as this loop asked and 7.9–8.0 as
/// the run walker asked (its own distance, what this kernel did before), 512 bytes 7.2–7.3;
/// not at all 7.4–7.6. Into L1 640 bytes to 1.5 KiB ahead were alike, 2 KiB 7.1 again; into L2
/// 8 or 16 KiB ahead beside L1 1 KiB ahead 7.6–7.9. But a burst of 17 asks stalls the loop
/// until the lines come (from L3, one layer, the same loop takes 5.3 ms): spread over the
/// blocks' products ([`ASK_SHARE`]), 6.85–6.93 → 5.89–6.15 ms (1 KiB ahead 6.5–6.8, 2.5 to 4
/// KiB as 2); with four query heads 9.83–10.03 → 9.84–9.88.
const CHUNK_AHEAD: usize = 2048;

/// Bytes asked for beside each block's products: a chunk's length a block (eight keys' blocks
/// of 34 bytes) in whole lines, so that the shares of a chunk's blocks cover what the next
/// chunks will read (a few lines twice). A fixed count of asks, and none compiled into the
/// calls for the other query rows of a chunk: a loop over a count the caller chose made the
/// four query heads' scores 4 % slower.
const ASK_SHARE: usize = (KEYS * 34).next_multiple_of(64);

/// Query rows scored together: each key load serves both, and their eight sums fill half the
/// registers. Four at a time spilled: with the 8B shape's four query heads a kv head, 7.6 GB/s
/// from L2 on Zen 2 (one thread), two pairs 8.4.
const QUERIES: usize = 2;

/// The scales of block `b` of the eight keys at `at`, key l in lane l.
///
/// # Safety
/// Every `at[l]` is a row of more than `b` blocks; AVX2 and F16C.
#[inline(always)]
unsafe fn key_scales(at: &[*const u8; KEYS], b: usize) -> __m256 {
    // SAFETY: a block's first two bytes are its scale (the contract).
    unsafe {
        let s = |l: usize| (at[l].add(34 * b) as *const i16).read_unaligned();
        _mm256_cvtph_ps(_mm_setr_epi16(s(0), s(1), s(2), s(3), s(4), s(5), s(6), s(7)))
    }
}

/// The scores of `R` query rows (blocks of 32 bytes at `q`, a row `32·nb` bytes after the one
/// before; their scales at `dq`, `nb` a row) against the eight key rows at `at`, key l in
/// lane l. With `ASK`, beside the products of block b < `ask_blocks` it asks for the
/// [`ASK_SHARE`] bytes at `ask + b · ASK_SHARE` into L1 (asking reads nothing into the program,
/// wherever it points).
///
/// # Safety
/// Every `at[l]` is a row of `nb ≤ MAX_BLOCKS` blocks; `R` rows of `32·nb` bytes at `q` and of
/// `nb` scales at `dq`; AVX2 and F16C.
#[inline(always)]
unsafe fn chunk_scores<const R: usize, const ASK: bool>(
    at: &[*const u8; KEYS],
    q: *const i8,
    dq: *const f32,
    nb: usize,
    ask: *const u8,
    ask_blocks: usize,
) -> [__m256; R] {
    // SAFETY: key l's block b is 34 bytes at `at[l] + 34·b`; query r's block b is 32 bytes at
    // `q + 32·(nb·r + b)`, its scale at `dq + nb·r + b` (the contract).
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        for b in 0..nb {
            if ASK && b < ask_blocks {
                crate::x86::prefetch_l1(ask.wrapping_add(b * ASK_SHARE), ASK_SHARE);
            }
            let scales = key_scales(at, b);
            // halves[h][r]: within each 128-bit half, keys 4h..4h+4's sums for query r.
            let mut halves = [[_mm256_setzero_si256(); R]; 2];
            for (h, half) in halves.iter_mut().enumerate() {
                let mut dots = [[_mm256_setzero_si256(); 4]; R];
                for l in 0..4 {
                    let x = _mm256_loadu_si256(at[4 * h + l].add(34 * b + 2) as *const __m256i);
                    let magnitude = _mm256_abs_epi8(x);
                    for (r, dots) in dots.iter_mut().enumerate() {
                        let qv = _mm256_loadu_si256(q.add(32 * (nb * r + b)) as *const __m256i);
                        let pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(qv, x));
                        dots[l] = _mm256_madd_epi16(pairs, ones);
                    }
                }
                for (half, dots) in half.iter_mut().zip(&dots) {
                    *half = four_sums(dots);
                }
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let (a, c) = (halves[0][r], halves[1][r]);
                let low = _mm256_permute2x128_si256::<0x20>(a, c);
                let high = _mm256_permute2x128_si256::<0x31>(a, c);
                let dot = _mm256_cvtepi32_ps(_mm256_add_epi32(low, high));
                let scale = _mm256_mul_ps(_mm256_set1_ps(*dq.add(nb * r + b)), scales);
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(scale, dot));
            }
        }
        acc
    }
}

/// The sums of each 128-bit half of four vectors of eight i32: `[Σ x0, Σ x1, Σ x2, Σ x3]` of
/// the low halves, then of the high halves. Unpacking and adding, because `vphaddd` (the same
/// in two instructions) takes two cycles on Zen 3 and 4, and it was the kernel's bottleneck.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn four_sums(x: &[__m256i; 4]) -> __m256i {
    // SAFETY: register operations only (AVX2, the contract).
    unsafe {
        // Per half: [x0 lanes 0+2, x1 lanes 0+2, x0 lanes 1+3, x1 lanes 1+3].
        let pair = |a, b| _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
        let (p, q) = (pair(x[0], x[1]), pair(x[2], x[3]));
        _mm256_add_epi32(_mm256_unpacklo_epi64(p, q), _mm256_unpackhi_epi64(p, q))
    }
}

/// Scores of query rows `i .. i + R` against the chunk of keys at `at`, written to columns
/// `j .. j + live` of those rows of the output, asking for the lines ahead as [`chunk_scores`]
/// does where `ask_blocks` is not 0.
///
/// # Safety
/// As for [`chunk_scores`] with `q`, `dq` at row i; `live ≤ KEYS` outputs from `i·ldo + j` in
/// each of the R rows lie in `out`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn write_scores<const R: usize>(
    at: &[*const u8; KEYS],
    q: *const i8,
    dq: *const f32,
    nb: usize,
    out: *mut f32,
    ldo: usize,
    live: usize,
    ask: *const u8,
    ask_blocks: usize,
) {
    // SAFETY: the contract.
    unsafe {
        let scores = if ask_blocks > 0 {
            chunk_scores::<R, true>(at, q, dq, nb, ask, ask_blocks)
        } else {
            chunk_scores::<R, false>(at, q, dq, nb, ask, 0)
        };
        for (r, s) in scores.into_iter().enumerate() {
            let to = out.add(r * ldo);
            if live == KEYS {
                _mm256_storeu_ps(to, s);
            } else {
                let mut lanes = [0f32; KEYS];
                _mm256_storeu_ps(lanes.as_mut_ptr(), s);
                std::ptr::copy_nonoverlapping(lanes.as_ptr(), to, live);
            }
        }
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
    // The query rows' blocks' bytes (rows side by side) and their scales.
    let (mut bytes, mut dq) = (vec![0i8; m * nb * 32], vec![0f32; m * nb]);
    for ((blk, to), d) in q[..m * row].chunks_exact(34).zip(bytes.chunks_exact_mut(32)).zip(&mut dq) {
        *d = scale(blk);
        for (to, &from) in to.iter_mut().zip(&blk[2..]) {
            *to = from as i8;
        }
    }
    for RunChunk { run, rows, j } in RunChunks::new(keys, row, KEYS).reader_asks_ahead() {
        // The bytes CHUNK_AHEAD past the chunk, up to the run's end (give or take a share's
        // lines), asked for into L1 a share beside each block's products by the first query
        // rows' call.
        let (from, to) = ((rows.start * row + CHUNK_AHEAD) & !63, (rows.end * row + CHUNK_AHEAD).min(run.len()));
        let ask = run.as_ptr().wrapping_add(from);
        let ask_blocks = if from < to { (to - from).div_ceil(ASK_SHARE).min(nb) } else { 0 };
        let live = rows.len();
        // SAFETY: the chunk's keys are whole rows of the run (`Kernels` checked that the run
        // is whole rows), the last repeated past `live`.
        let at: [*const u8; KEYS] =
            std::array::from_fn(|l| unsafe { run.as_ptr().add((rows.start + l.min(live - 1)) * row) });
        let mut i = 0;
        while i < m {
            let r = (m - i).min(QUERIES);
            // SAFETY: rows i .. i + r < m of `bytes` and `dq` hold nb blocks each; outputs
            // (i + r')·ldo + j + l for l < live are below (m - 1)·ldo + n (asserted); the keys
            // as above; AVX2 and F16C are enabled on this function.
            unsafe {
                let (qi, di, o) =
                    (bytes.as_ptr().add(i * nb * 32), dq.as_ptr().add(i * nb), out.as_mut_ptr().add(i * ldo + j));
                let asks = if i == 0 { ask_blocks } else { 0 };
                if r == 2 {
                    write_scores::<2>(&at, qi, di, nb, o, ldo, live, ask, asks)
                } else {
                    write_scores::<1>(&at, qi, di, nb, o, ldo, live, ask, asks)
                }
            }
            i += r;
        }
    }
}

pub(crate) fn scores_q8_0(q: &[u8], keys: &[&[u8]], k: usize, out: &mut [f32], ldo: usize) {
    // A query byte of -128 (which `quantize_q8_0` never makes) would overflow the sign trick.
    if q.chunks_exact(34).any(|blk| blk[2..].contains(&0x80)) {
        return crate::scalar::ops::scores_q8_0(q, keys, k, out, ldo);
    }
    // SAFETY: the AVX2 table (the only caller) is built only when the CPU reports AVX2, FMA and
    // F16C (`KernelTier::is_available`); `Kernels::scores_q8_0` checked that every row is whole
    // blocks, and the kernel asserts that its outputs lie in `out`.
    unsafe { scores_impl(q, keys, k, out, ldo) }
}

#[cfg(test)]
mod tests {
    use crate::tier::KernelTier;

    /// Every byte value in keys and queries, -128 too (which the quantizer never makes), gives
    /// the scalar reference's bits: in the keys through the kernel, in a query by its fallback.
    #[test]
    fn every_byte_value_gives_the_reference_bits() {
        if !KernelTier::Avx2.is_available() {
            return;
        }
        let (k, m, n) = (64, 3, 19);
        let row = k / 32 * 34;
        let mut rng = crate::test_rng::Lcg(0x9e37_79b9);
        let mut byte = move || rng.byte();
        let mut rows = |count: usize, no_min: bool| -> Vec<u8> {
            let mut v: Vec<u8> = (0..count * row).map(|_| byte()).collect();
            for (i, b) in v.iter_mut().enumerate() {
                match i % 34 {
                    // A finite scale: 2^-3 .. 2 with a varying mantissa.
                    0 => *b = (i / 34 % 251) as u8,
                    1 => *b = 0x30 + (i / 34 % 12) as u8,
                    _ if no_min && *b == 0x80 => *b = 0x81,
                    _ => {}
                }
            }
            v
        };
        let keys = rows(n, false);
        assert!(keys.chunks_exact(34).any(|b| b[2..].contains(&0x80)), "the keys hold -128");
        let runs: [&[u8]; 2] = [&keys[..8 * row], &keys[8 * row..]];
        for no_min in [true, false] {
            let mut q = rows(m, no_min);
            if !no_min {
                q[2] = 0x80;
            }
            let ldo = n + 1;
            let (mut got, mut want) = (vec![0f32; m * ldo], vec![0f32; m * ldo]);
            super::scores_q8_0(&q, &runs, k, &mut got, ldo);
            crate::scalar::ops::scores_q8_0(&q, &runs, k, &mut want, ldo);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "queries without -128: {no_min}");
        }
    }
}
