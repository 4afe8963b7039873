//! AVX2 products over the packed layouts (see [`crate::pack`]): Q1_0 by lookup tables (32
//! rows per `vpshufb`) here, Q4_0/Q4_1/Q8_0 in [`super::legacy`]. The tier's choice of kernel
//! per type is in its `mod.rs`.

use std::arch::x86_64::*;
use std::ops::Range;

use onebit_gguf::GgmlType;

use crate::act::{ActFormat, Acts};
use crate::matmul::{MatRef, OutPtr};
use crate::pack::{GROUP, PackedMat, Q1_GROUP_BLOCK, scale_order};
use crate::x86::{Lut, PlanarRow, planar_row, with_tables};

/// Bytes of lookup tables (8 per activation) that the tokens sharing a pass over a unit's
/// row groups may have: they stay in L2 while the groups go by.
const LUT_CHUNK_BYTES: usize = 256 << 10;

/// Rows of a unit of work for a batch of packed Q1_0 (see [`batch_rows`]).
const LUT_BATCH_ROWS: usize = 1024;

/// Rows per unit of work for a batch against `w`: packed Q1_0 takes [`LUT_BATCH_ROWS`], so that
/// each chunk of tokens whose lookup tables stay in L2 meets many row groups. A unit of one
/// 64-row group (the default for batches) reads every token's tables again for every group,
/// from memory once they outgrow the last-level cache: on Zen 4's AVX2 tier (one thread,
/// `gemm_speed q1_0 512 1 ROWS COLS avx2`), 2048 × 6144 at 512 tokens (25 MB of tables) ran at
/// 69 G multiply-adds a second against 150–165 with tables in cache; in units of 1024 rows it
/// runs at 145–151, and two threads at 260–330.
pub(super) fn batch_rows(w: &MatRef) -> Option<usize> {
    (w.ty == GgmlType::Q1_0 && w.packed.is_some()).then_some(LUT_BATCH_ROWS)
}

pub(super) fn q1_0_packed(p: &PackedMat, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    let nb = p.cols / 128;
    let x4 = acts.format() == ActFormat::Q8_0x4;
    let chunk = (LUT_CHUNK_BYTES / (8 * p.cols)).max(1);
    with_tables(acts, Lut::Bytes, |tables| {
        for t0 in (0..acts.rows()).step_by(chunk) {
            for g in rows.start / GROUP..rows.end.div_ceil(GROUP) {
                let data = p.group(g);
                for t in t0..acts.rows().min(t0 + chunk) {
                    let (a, lut) = (planar_row(acts, t), tables.row(t));
                    // SAFETY: the AVX2 table is handed out only on AVX2 CPUs; `lut` holds the
                    // row's tables of its `p.cols` values.
                    let res = unsafe {
                        if x4 { lut_group::<true>(data, a, lut, nb) } else { lut_group::<false>(data, a, lut, nb) }
                    };
                    // SAFETY: this call owns rows `rows` of the output, and the group's rows
                    // start at or after `rows.start` (whole groups are handed out).
                    unsafe { store_group(&out, t, g * GROUP, &res, rows.end) };
                }
            }
        }
    })
}

/// Results of rows `row0 ..` for token `t`, those below `end` (the rows this call owns, from
/// `row0` on). A whole group goes out as four floats a move (SSE, which every x86-64 has, as
/// the callers are not compiled for AVX): one result at a time, with the output's fields read
/// again for each, was 6 % of a batched decode step, and a copy of the whole group by
/// `copy_nonoverlapping` became a call to `memmove` for 64 rows (1 % of a decode step).
///
/// # Safety
/// The caller owns rows `row0 .. end` of the output for token `t`, and they lie inside it.
#[inline(always)]
pub(super) unsafe fn store_group<const N: usize>(out: &OutPtr, t: usize, row0: usize, res: &[f32; N], end: usize) {
    let n = N.min(end.saturating_sub(row0));
    if n == 0 {
        return;
    }
    // SAFETY: the n places from (t, row0) are rows below `end` that the caller owns and that
    // lie inside the output (the contract); `res` holds N floats, read four at a time only
    // when N is a multiple of 4. SSE is part of x86-64.
    unsafe {
        let to = out.ptr_at(t, row0);
        if n == N && N.is_multiple_of(4) {
            for c in (0..N).step_by(4) {
                _mm_storeu_ps(to.add(c), _mm_loadu_ps(res.as_ptr().add(c)));
            }
        } else {
            std::ptr::copy_nonoverlapping(res.as_ptr(), to, n)
        }
    }
}

/// Where the packed scales of rows `8s..8s+8` (s = 0..8) start: the layout stores them in the
/// AVX-512 kernels' order ([`scale_order`]), eight consecutive rows at a time.
fn scale_run(s: usize) -> usize {
    let (v, l) = scale_order(8 * s);
    16 * v + l
}

/// One 64-row group against one token, in row order.
///
/// The float recipe per 128-block: with Q8_0 activations `p = fma(C_k, d_ak, p)` over the four
/// 32-blocks from `p = 0`; with Q8_0x4 (`X4`: one scale for the 128) the four sums are added
/// as integers (at most 128 · 127, so i16 holds them) and `p = C·d_a`, as the AVX-512 tier
/// does; then `acc = fma(p, d_w, acc)`. With one scale a block, the float work is a twelfth of
/// what it is with four (on Zen 4, one thread: 100 → 150–165 G multiply-adds a second).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lut_group<const X4: bool>(data: &[u8], a: PlanarRow, lut: &[u8], nb: usize) -> [f32; GROUP] {
    let m = _mm256_set1_epi8(0x0f);
    // acc[h][q]: half h (rows 32h..32h+32); q = rows 0-7, 16-23, 8-15, 24-31 of the half.
    let mut acc = [[_mm256_setzero_ps(); 4]; 2];
    for b in 0..nb {
        // SAFETY: block `b` of the group is Q1_GROUP_BLOCK bytes, and the lookup tables hold
        // 32 bytes per 4 activations.
        unsafe {
            let blk = data.as_ptr().add(b * Q1_GROUP_BLOCK);
            // The weights stream from memory once: the scales' lines here, each line of bits
            // beside its lookups (a burst of the block's 18 lines at once left a core waiting).
            crate::x86::prefetch_ahead(blk, 2 * GROUP);
            let mut t = [[_mm256_setzero_ps(); 4]; 2];
            let mut s = [[_mm256_setzero_si256(); 2]; 2];
            for k in 0..4 {
                if !X4 {
                    s = [[_mm256_setzero_si256(); 2]; 2];
                }
                for j in 0..4 {
                    crate::x86::prefetch_ahead(blk.add(2 * GROUP + (4 * k + j) * 64), 64);
                    let base = lut.as_ptr().add(32 * (32 * b + 8 * k + 2 * j));
                    for (h, s) in s.iter_mut().enumerate() {
                        let wv = _mm256_loadu_si256(blk.add(2 * GROUP + (4 * k + j) * 64 + 32 * h) as *const __m256i);
                        let lo = _mm256_and_si256(wv, m);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(wv), m);
                        for (off, idx) in [(0, lo), (32, hi)] {
                            let tl = _mm256_broadcastsi128_si256(_mm_loadu_si128(base.add(off) as *const __m128i));
                            let th = _mm256_broadcastsi128_si256(_mm_loadu_si128(base.add(off + 16) as *const __m128i));
                            let (rl, rh) = (_mm256_shuffle_epi8(tl, idx), _mm256_shuffle_epi8(th, idx));
                            s[0] = _mm256_add_epi16(s[0], _mm256_unpacklo_epi8(rl, rh));
                            s[1] = _mm256_add_epi16(s[1], _mm256_unpackhi_epi8(rl, rh));
                        }
                    }
                }
                if X4 && k < 3 {
                    continue;
                }
                let d = _mm256_set1_ps(*a.scales.get_unchecked(4 * b + k));
                for h in 0..2 {
                    let parts = [
                        _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s[h][0])),
                        _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(s[h][0])),
                        _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s[h][1])),
                        _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(s[h][1])),
                    ];
                    for q in 0..4 {
                        let c = _mm256_cvtepi32_ps(parts[q]);
                        t[h][q] = if X4 { _mm256_mul_ps(c, d) } else { _mm256_fmadd_ps(c, d, t[h][q]) };
                    }
                }
            }
            // parts order per half: rows 0-7 (lo, lane 0), 16-23 (lo, lane 1), 8-15, 24-31.
            for h in 0..2 {
                for (q, first) in [0usize, 2, 1, 3].into_iter().enumerate() {
                    let d0 = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(2 * scale_run(4 * h + first)) as *const __m128i));
                    acc[h][q] = _mm256_fmadd_ps(t[h][q], d0, acc[h][q]);
                }
            }
        }
    }
    let mut res = [0f32; GROUP];
    for h in 0..2 {
        for (q, first) in [0usize, 2, 1, 3].into_iter().enumerate() {
            // SAFETY: rows 8·first.. of the half are eight floats inside `res`.
            unsafe { _mm256_storeu_ps(res.as_mut_ptr().add(32 * h + 8 * first), acc[h][q]) };
        }
    }
    res
}
