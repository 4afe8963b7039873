//! Packed Q1_0 × Q8_0x4 activations for several tokens at once, on AVX-512 VNNI without AMX
//! (AMD Zen 4, Intel Ice Lake and later): the products of prefill and of batched decode.
//!
//! The lookup-table kernel (`matmul::lut_group`) costs nearly the same per token however many
//! tokens share the weights (up to four share the loads of the bits), so a batch is
//! compute-bound there. Here each 1-bit weight is expanded once per tile of tokens into a byte
//! in {0, 2}, laid out for `vpdpbusd`: sixteen rows in the sixteen lanes, four consecutive
//! weights per lane. Every token of the tile then costs one
//! `vpdpbusd` per 64 weights, its four activation bytes broadcast from memory. Since
//! `Σ a·(2b − 1) = 2·Σ a·b − Σ a`, the block's integer sum is the lookup kernel's exactly (the
//! activations' exact block sums come with the planar layout), and the float recipe after it is
//! the lookup kernel's (`p = C·d_a`, `acc = fma(p, d_w, acc)`), so a token gets the same bits by
//! either path, whatever else is in its batch.
//!
//! The expansion reads the lookup kernels' packed layout (`pack::pack_q1_0`), so one copy of
//! the weights serves both: per 128-weight block and 64-row group, vector `v` holds byte `v` of
//! every row's sign bits (weights `8v .. 8v + 8`), row `r` at byte `r`.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::act::{ActFormat, Acts};
use crate::matmul::OutPtr;
use crate::pack::{GROUP, PackedMat, Q1_GROUP_BLOCK, scale_order};
use crate::x86::{PlanarRow, planar_row};

/// Tokens at which products switch from the lookup tables to this kernel: below it the
/// lookups, which share each load of the bits between up to four tokens, are cheaper than
/// expanding the weights. On a Xeon without AMX (family 6 model 207), the Bonsai-1.7B shape's
/// sequences decoding together (`batched-bench -npl 3,4,5`): 3 by lookup 140.6 tokens/s against
/// 114–118 in a tile, 4 143–145 against 133–134, 5 (four and one) 137–141 against 145–146.
/// (Zen 4, before the lookups shared their loads, measured 3.)
pub(super) const MIN_TOKENS: usize = 5;

/// Whether this kernel serves a product with `acts`.
pub(super) fn serves(acts: &Acts) -> bool {
    acts.format() == ActFormat::Q8_0x4 && acts.rows() >= MIN_TOKENS
}

/// Tokens from which a call expands each group's weights once, into a per-thread buffer that
/// every tile of 16 tokens then reads (below it, each tile expands the weights itself; the
/// expansion is about a tenth of the work of a tile of 16).
const SHARED_TOKENS: usize = 32;

/// Blocks expanded at a time (8 KiB each).
const RANGE_BLOCKS: usize = 16;

/// Bytes of activations that the tiles sharing an expansion may read: all of them are read
/// again for every group of rows, so they should stay in L2 with the expanded weights.
const SHARED_ACT_BYTES: usize = 512 << 10;

/// The float sums of a tile: per token, four vectors of sixteen rows.
type TileSums = [[__m512; 4]; 16];

thread_local! {
    /// Per thread: expanded weights of up to [`RANGE_BLOCKS`] blocks of a group, and the float
    /// sums of a chunk of tiles while a group's blocks go by in ranges.
    static SHARED: std::cell::RefCell<(Vec<__m512i>, Vec<TileSums>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Rows `rows` of the packed matrix for every token of `acts` (Q8_0x4).
pub(super) fn rows(p: &PackedMat, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    debug_assert!(serves(acts));
    let n = acts.rows();
    let mut t0 = 0;
    if n >= SHARED_TOKENS {
        // SAFETY: the table holding this kernel exists only on AVX-512 VNNI CPUs; this call
        // owns rows `rows` of the output.
        t0 = unsafe { shared_tiles(p, rows.clone(), acts, out) };
    }
    // Whole tiles of 16, then one tile of the rest: each tile expands the weights again, so a
    // rest of 7 taken as 4 + 2 + 1 cost three expansions (3 tokens ran at half the speed of 4).
    while t0 < n {
        let rows = rows.clone();
        macro_rules! tile_of {
            ($($t:literal)*) => {
                match n - t0 {
                    16.. => tile::<16>(p, rows, acts, t0, out),
                    $($t => tile::<$t>(p, rows, acts, t0, out),)*
                    _ => unreachable!("t0 < n"),
                }
            };
        }
        // SAFETY: the table holding this kernel exists only on AVX-512 VNNI CPUs; tokens
        // t0 .. t0 + T exist, and this call owns rows `rows` of the output.
        t0 += unsafe { tile_of!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15) };
    }
}

/// Byte `16L + j` of a vector takes byte `4L + j / 4` of its 128-bit lane: lane `i` of the
/// result (four bytes) repeats row `i`'s byte.
const SPREAD: [u8; 64] = {
    let mut s = [0u8; 64];
    let mut p = 0;
    while p < 64 {
        s[p] = (4 * (p / 16) + (p % 16) / 4) as u8;
        p += 1;
    }
    s
};

/// Byte `4i + m` tests bit `m` (low half) or bit `4 + m` (high half) of row `i`'s byte.
const BITS: [[u8; 64]; 2] = {
    let mut b = [[0u8; 64]; 2];
    let mut p = 0;
    while p < 64 {
        b[0][p] = 1 << (p % 4);
        b[1][p] = 1 << (4 + p % 4);
        p += 1;
    }
    b
};

/// Where the expanded weights of a group come from: for block `b`, quarter `q` (rows
/// 16q .. 16q + 16) and vector `v` (weights 8v .. 8v + 8), the two vectors of bytes in {0, 2}
/// of weights 8v .. 8v + 4 and 8v + 4 .. 8v + 8, sixteen rows in the sixteen lanes.
trait Weights {
    /// # Safety
    /// `b` is a block this source holds, `q < 4`, `v < 16`; AVX-512 F/BW/VL.
    unsafe fn get(&self, b: usize, q: usize, v: usize) -> [__m512i; 2];
}

/// Blocks ahead of the one being expanded whose lines are asked for into L1.
const AHEAD_BLOCKS: usize = 2;

/// Ask for line `16q + v` of the block [`AHEAD_BLOCKS`] after the one at `blk` to be brought
/// into L1, for the first 18 expansions of a block (its 18 lines: scales, then sign bits).
///
/// Nothing asked for the weights before, and the hardware's prefetcher stops at every 4 KiB
/// page: a tile of 8 tokens waited on the bits' loads (a fifth of the tile kernel's samples on
/// the shuffle that takes them). On a Xeon without AMX (family 6 model 207) eight sequences of
/// the Bonsai-1.7B shape decoded 151–153 → 174–181 tokens/s (`batched-bench -npl 8`); one, two
/// or four blocks ahead, into L1 or L2, read the same, six or nine into L2 slower.
#[inline(always)]
fn ask_ahead(blk: *const u8, q: usize, v: usize) {
    let line = 16 * q + v;
    if line < Q1_GROUP_BLOCK / 64 {
        crate::x86::prefetch_l1(blk.wrapping_add(AHEAD_BLOCKS * Q1_GROUP_BLOCK + 64 * line), 64);
    }
}

/// Expanded from a group's packed bits when asked.
struct Expand<'a> {
    data: &'a [u8],
    spread: __m512i,
    bits: [__m512i; 2],
    twos: __m512i,
}

impl<'a> Expand<'a> {
    /// # Safety
    /// AVX-512 F.
    #[inline(always)]
    unsafe fn new(data: &'a [u8]) -> Expand<'a> {
        // SAFETY: the constants are 64 bytes each; AVX-512 F (the contract).
        unsafe {
            Expand {
                data,
                spread: _mm512_loadu_si512(SPREAD.as_ptr() as *const _),
                bits: [
                    _mm512_loadu_si512(BITS[0].as_ptr() as *const _),
                    _mm512_loadu_si512(BITS[1].as_ptr() as *const _),
                ],
                twos: _mm512_set1_epi8(2),
            }
        }
    }
}

impl Weights for Expand<'_> {
    /// Also asks for a line of the block [`AHEAD_BLOCKS`] on ([`ask_ahead`]).
    #[inline(always)]
    unsafe fn get(&self, b: usize, q: usize, v: usize) -> [__m512i; 2] {
        ask_ahead(self.data.as_ptr().wrapping_add(b * Q1_GROUP_BLOCK), q, v);
        // SAFETY: vector `v` of block `b` (inside the group: the caller's contract) is 64 bytes
        // at 128 + 64v; rows 16q .. 16q + 16 are its bytes 16q .. 16q + 16.
        unsafe {
            let blk = self.data.as_ptr().add(b * Q1_GROUP_BLOCK);
            let src = _mm_loadu_si128(blk.add(2 * GROUP + 64 * v + 16 * q) as *const __m128i);
            let x = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(src), self.spread);
            self.bits.map(|bit| _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(x, bit), self.twos))
        }
    }
}

/// Read from a buffer of blocks `b0 ..` that [`Expand`] filled, in the order of [`Weights::get`].
struct Expanded<'a> {
    buf: &'a [__m512i],
    b0: usize,
}

impl Weights for Expanded<'_> {
    #[inline(always)]
    unsafe fn get(&self, b: usize, q: usize, v: usize) -> [__m512i; 2] {
        let at = (((b - self.b0) * 4 + q) * 16 + v) * 2;
        [self.buf[at], self.buf[at + 1]]
    }
}

/// Tokens `t0 .. t0 + T` against rows `rows`; returns `T`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn tile<const T: usize>(p: &PackedMat, rows: Range<usize>, acts: &Acts, t0: usize, out: OutPtr) -> usize {
    let a: [PlanarRow; T] = std::array::from_fn(|t| planar_row(acts, t0 + t));
    let nb = p.cols / 128;
    for g in rows.start / GROUP..rows.end.div_ceil(GROUP) {
        let data = p.group(g);
        let mut res = [[_mm512_setzero_ps(); 4]; T];
        // SAFETY: this tier's CPUs have the features; `group` checks the group's length and
        // reads each token's `cols` quants, which its planar row holds.
        unsafe { group::<T, _>(&Expand::new(data), data, 0..nb, &a, &mut res) };
        // SAFETY: this call owns rows `rows` of the output.
        unsafe { store(&res, g, rows.end, t0, out) };
    }
    T
}

/// Every full tile of 16 tokens against rows `rows`; returns the tokens done. Tiles go in
/// chunks whose activations stay in L2, and for each chunk each group's weights are expanded
/// once per range of blocks for all its tiles.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn shared_tiles(p: &PackedMat, rows: Range<usize>, acts: &Acts, out: OutPtr) -> usize {
    let (tiles, nb) = (acts.rows() / 16, p.cols / 128);
    let chunk = (SHARED_ACT_BYTES / (16 * p.cols)).clamp(2, tiles.max(2));
    SHARED.with_borrow_mut(|(buf, sums)| {
        buf.resize(RANGE_BLOCKS * 4 * 16 * 2, _mm512_setzero_si512());
        sums.resize(chunk, [[_mm512_setzero_ps(); 4]; 16]);
        for c0 in (0..tiles).step_by(chunk) {
            let c1 = tiles.min(c0 + chunk);
            for g in rows.start / GROUP..rows.end.div_ceil(GROUP) {
                let data = p.group(g);
                assert!(data.len() >= nb * Q1_GROUP_BLOCK);
                // SAFETY: AVX-512 F is enabled on this function.
                let expand = unsafe { Expand::new(data) };
                for b0 in (0..nb).step_by(RANGE_BLOCKS) {
                    let b1 = nb.min(b0 + RANGE_BLOCKS);
                    for (i, v2) in buf.chunks_exact_mut(2).take((b1 - b0) * 64).enumerate() {
                        let (b, q, v) = (b0 + i / 64, i / 16 % 4, i % 16);
                        // SAFETY: blocks b0 .. b1 < nb lie inside the group (asserted); AVX-512.
                        v2.copy_from_slice(&unsafe { expand.get(b, q, v) });
                    }
                    let weights = Expanded { buf, b0 };
                    for (tile, res) in (c0..c1).zip(sums.iter_mut()) {
                        let a: [PlanarRow; 16] = std::array::from_fn(|t| planar_row(acts, 16 * tile + t));
                        if b0 == 0 {
                            *res = [[_mm512_setzero_ps(); 4]; 16];
                        }
                        // SAFETY: as in `tile`; the buffer holds blocks b0 .. b1.
                        unsafe { group::<16, _>(&weights, data, b0..b1, &a, res) };
                        if b1 == nb {
                            // SAFETY: this call owns rows `rows` of the output.
                            unsafe { store(res, g, rows.end, 16 * tile, out) };
                        }
                    }
                }
            }
        }
    });
    16 * tiles
}

/// Store the sums of group `g` for tokens `t0 ..`, rows below `end` only.
///
/// # Safety
/// The caller owns those rows of the output for those tokens; AVX-512 F.
#[inline(always)]
unsafe fn store<const T: usize>(res: &[[__m512; 4]; T], g: usize, end: usize, t0: usize, out: OutPtr) {
    let (row0, n) = (g * GROUP, end - g * GROUP);
    for (t, r) in res.iter().enumerate() {
        for (q, v) in r.iter().enumerate() {
            let mask = ((1u32 << n.saturating_sub(16 * q).min(16)) - 1) as __mmask16;
            if mask != 0 {
                // SAFETY: the caller's contract, and the mask stops at `end`.
                unsafe { _mm512_mask_storeu_ps(out.ptr_at(t0 + t, row0 + 16 * q), mask, *v) };
            }
        }
    }
}

/// Where the scales of `rows` (16 rows of one half of a group) lie in two of the group's four
/// scale vectors ([`scale_order`]), as `vpermt2ps` indices over vectors 0 and 2 (rows below 32)
/// or 1 and 3 (rows from 32); see [`block_scales`].
pub(super) const fn scale_picks(rows: [usize; 16]) -> [i32; 16] {
    let mut idx = [0i32; 16];
    let mut i = 0;
    while i < 16 {
        let (vector, lane) = scale_order(rows[i]);
        idx[i] = (16 * (vector / 2) + lane) as i32;
        i += 1;
    }
    idx
}

/// Rows `first, first + step, …` (16 of them).
pub(super) const fn rows_from(first: usize, step: usize) -> [usize; 16] {
    let mut rows = [0; 16];
    let mut i = 0;
    while i < 16 {
        rows[i] = first + step * i;
        i += 1;
    }
    rows
}

/// The 64 row scales of a packed Q1_0 block (f16, stored in [`crate::pack::scale_order`]: rows
/// 0-7,16-23 | 32-39,48-55 | 8-15,24-31 | 40-47,56-63) as four vectors of the rows a kernel's
/// lanes hold: `vpermt2ps` by `pick[0]`, then `pick[1]`, over stored vectors 0 and 2 (rows
/// below 32), then the same over vectors 1 and 3.
///
/// # Safety
/// `blk` points at a packed block (its scales are its first 128 bytes); AVX-512 F, F16C.
#[target_feature(enable = "avx512f,f16c")]
#[inline]
pub(super) unsafe fn block_scales(blk: *const u8, pick: [__m512i; 2]) -> [__m512; 4] {
    // SAFETY: the contract.
    let d: [__m512; 4] =
        std::array::from_fn(|i| unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32 * i) as *const __m256i)) });
    [
        _mm512_permutex2var_ps(d[0], pick[0], d[2]),
        _mm512_permutex2var_ps(d[0], pick[1], d[2]),
        _mm512_permutex2var_ps(d[1], pick[0], d[3]),
        _mm512_permutex2var_ps(d[1], pick[1], d[3]),
    ]
}

/// Blocks `blocks` of one 64-row group against `T` tokens, added to `accf` (per token, four
/// vectors of sixteen rows, row order), the weights from `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn group<const T: usize, W: Weights>(
    w: &W,
    data: &[u8],
    blocks: Range<usize>,
    a: &[PlanarRow; T],
    accf: &mut [[__m512; 4]; T],
) {
    // Row order: rows 0-15 and 16-31 of each half.
    const LO: [i32; 16] = scale_picks(rows_from(0, 1));
    const HI: [i32; 16] = scale_picks(rows_from(16, 1));
    // SAFETY: each constant is 16 i32.
    let [lo, hi] = [LO, HI].map(|c| unsafe { _mm512_loadu_si512(c.as_ptr() as *const _) });
    let qs: [*const i8; T] = std::array::from_fn(|t| a[t].qs.as_ptr());
    assert!(data.len() >= blocks.end * Q1_GROUP_BLOCK);
    for b in blocks {
        // SAFETY: block `b` lies inside the group (asserted above).
        let blk = unsafe { data.as_ptr().add(b * Q1_GROUP_BLOCK) };
        // SAFETY: the block's 64 f16 scales are its first 128 bytes.
        let dw = unsafe { block_scales(blk, [lo, hi]) };
        let da: [__m512; T] = std::array::from_fn(|t| _mm512_set1_ps(a[t].scales[4 * b]));
        // The sums start at −Σa and add 2·a per set bit: C = 2·Σ a·b − Σ a.
        let neg_sa: [__m512i; T] = std::array::from_fn(|t| {
            let s = &a[t].isums[4 * b..4 * b + 4];
            _mm512_set1_epi32(-(s[0] + s[1] + s[2] + s[3]))
        });
        for q in 0..4 {
            let mut acc = neg_sa;
            for v in 0..16 {
                // SAFETY: block `b` is one `w` holds (the caller's contract), q < 4, v < 16.
                let ws = unsafe { w.get(b, q, v) };
                for (h, wh) in ws.iter().enumerate() {
                    let off = 128 * b + 8 * v + 4 * h;
                    for t in 0..T {
                        // SAFETY: each token's row holds `128 nb` quants.
                        let a4 = unsafe { (qs[t].add(off) as *const i32).read_unaligned() };
                        acc[t] = _mm512_dpbusd_epi32(acc[t], *wh, _mm512_set1_epi32(a4));
                    }
                }
            }
            for t in 0..T {
                let pr = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[t]), da[t]);
                accf[t][q] = _mm512_fmadd_ps(pr, dw[q], accf[t][q]);
            }
        }
    }
}
