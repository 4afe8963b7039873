//! AVX2 attention block products over a paged cache: `Q·Kᵀ` and `P·V` read each run of cached
//! rows (f32, IEEE halves or Q8_0 blocks) where it lies, widening eight values at a time in the
//! register. Without them every run was first widened into a buffer of f32 and read again from
//! there, which made decode attention at depth on this tier half as fast as on AVX-512.
//!
//! Widening is exact, and every output goes through the operations of this tier's `gemm_nt`
//! and `gemm_nn_acc` on the widened rows, in their order (the tiers test compares the bits), so
//! a query gets the same bits whichever path its batch takes. Only the loads are shared: up to
//! four query rows per key row for the scores; for `P·V`, up to four output rows per value
//! row, over pieces of a run short enough to stay in L1 while every column range of every
//! output row reads them.
//!
//! `P·V` reads a piece column range by column range, so each pass touches one line of every
//! row: the hardware's prefetchers do not follow that from memory, and a burst of requests at
//! the piece's start (half of them for the piece itself) did little better. So each row of a
//! pass asks for a line or two of the next piece, in the order the piece lies, and the piece is
//! in L2 before its first pass. On Zen 2, two threads, decode attention at 4,096 positions
//! (`examples/attn_decode`, f16): 23.0 → 18.2 ms a token with two query heads per kv head, 25.2
//! → 17.8 with four; q8_0 18.7 → 13.7 and 25.6 → 20.5. Each row of a pass also asks for its
//! line of the next pass into L1, and the scores ask for the key rows only [`ROW_AHEAD`]
//! bytes ahead, two rows at a time where there are one or two query rows: with two query
//! heads per kv head, f16, 18.5 → 16.4 ms a token (four: the same, bound by the fmas).

use std::arch::x86_64::*;

use crate::table::Pages;
use crate::x86::{RunChunk, RunChunks};

/// How the rows of a run are stored.
trait Elem {
    /// What the runs are slices of.
    type E: Copy;

    /// Elements of `E` in a row of `k` values.
    fn row_len(k: usize) -> usize {
        k
    }

    /// What [`Elem::load8`] needs of the block holding value `d` (Q8_0: its scale).
    ///
    /// # Safety
    /// Value `d` lies in the row at `row`; AVX2 and F16C are present.
    #[inline(always)]
    unsafe fn scale(_row: *const Self::E, _d: usize) -> __m256 {
        // SAFETY: register operations only (AVX, the contract).
        unsafe { _mm256_setzero_ps() }
    }

    /// Values `d .. d + 8` of the row at `row` as f32, given [`Elem::scale`] of their block.
    ///
    /// # Safety
    /// The 8 values lie in the row, in one block; AVX2 and F16C are present.
    unsafe fn load8(row: *const Self::E, d: usize, scale: __m256) -> __m256;

    /// Where value `d` lies in a row, in bytes from its start.
    fn byte_of(d: usize) -> usize {
        d * std::mem::size_of::<Self::E>()
    }

    /// Value `d` of the row at `row`, as f32.
    ///
    /// # Safety
    /// Value `d` lies in the row.
    unsafe fn value(row: *const Self::E, d: usize) -> f32;

    /// Rows a `P·V` piece takes for `m` output rows.
    fn piece(_m: usize) -> usize {
        PIECE
    }
}

impl Elem for f32 {
    type E = f32;

    #[inline(always)]
    unsafe fn load8(row: *const f32, d: usize, _scale: __m256) -> __m256 {
        // SAFETY: the 8 values lie in the row; AVX (the contract).
        unsafe { _mm256_loadu_ps(row.add(d)) }
    }

    #[inline(always)]
    unsafe fn value(row: *const f32, d: usize) -> f32 {
        // SAFETY: value `d` lies in the row (the contract).
        unsafe { *row.add(d) }
    }
}

impl Elem for u16 {
    type E = u16;

    #[inline(always)]
    unsafe fn load8(row: *const u16, d: usize, _scale: __m256) -> __m256 {
        // SAFETY: the 8 halves lie in the row; F16C (the contract).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(row.add(d) as *const __m128i)) }
    }

    #[inline(always)]
    unsafe fn value(row: *const u16, d: usize) -> f32 {
        // SAFETY: value `d` lies in the row (the contract).
        crate::formats::f16_to_f32(unsafe { *row.add(d) })
    }

    fn piece(m: usize) -> usize {
        if m <= 2 { FEW_ROWS_PIECE } else { PIECE }
    }
}

/// Rows of Q8_0 blocks (34 bytes: an f16 scale, then 32 signed bytes), widened as
/// `dequantize_q8_0` widens them: `q as f32 · scale`, exact.
struct Q8;

impl Elem for Q8 {
    type E = u8;

    fn byte_of(d: usize) -> usize {
        d / 32 * 34 + 2 + d % 32
    }

    fn row_len(k: usize) -> usize {
        k / 32 * 34
    }

    #[inline(always)]
    unsafe fn scale(row: *const u8, d: usize) -> __m256 {
        // SAFETY: value `d` lies in a block of the row, whose first two bytes are its scale
        // (the contract); AVX and F16C.
        unsafe {
            let bits = (row.add(d / 32 * 34) as *const i16).read_unaligned();
            _mm256_cvtph_ps(_mm_set1_epi16(bits))
        }
    }

    #[inline(always)]
    unsafe fn load8(row: *const u8, d: usize, scale: __m256) -> __m256 {
        // SAFETY: the 8 values (bytes) lie in one block of the row (the contract); AVX2.
        unsafe {
            let q = _mm_loadl_epi64(row.add(Self::byte_of(d)) as *const __m128i);
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), scale)
        }
    }

    #[inline(always)]
    unsafe fn value(row: *const u8, d: usize) -> f32 {
        // SAFETY: value `d` lies in a block of the row (the contract).
        unsafe {
            let blk = row.add(d / 32 * 34);
            let scale = crate::formats::f16_to_f32((blk as *const u16).read_unaligned());
            *blk.add(2 + d % 32) as i8 as f32 * scale
        }
    }
}

/// `out[i·ldo + j] = a_i · b_j` over the rows of all runs, each dot as this tier's `gemm_nt`
/// takes it.
#[target_feature(enable = "avx2,fma,f16c")]
fn gemm_nt_impl<B: Elem>(a: &[f32], pages: &[&[B::E]], k: usize, out: &mut [f32], ldo: usize) {
    let m = a.len() / k;
    let n: usize = pages.iter().map(|p| p.len() / B::row_len(k)).sum();
    let mut i = 0;
    while i < m {
        let r = (m - i).min(4);
        assert!((i + r) * k <= a.len() && (i + r - 1) * ldo + n <= out.len());
        // SAFETY: rows i .. i + r of `a` and of `out` (n columns each) lie inside them (just
        // checked), and every run holds whole rows of `k` (checked by `Kernels`).
        unsafe {
            let (pa, po) = (a.as_ptr().add(i * k), out.as_mut_ptr().add(i * ldo));
            macro_rules! by_rows {
                ($k:literal) => {
                    match r {
                        4 => dots::<B, 4, $k>(pa, pages, k, po, ldo),
                        3 => dots::<B, 3, $k>(pa, pages, k, po, ldo),
                        2 => dots::<B, 2, $k>(pa, pages, k, po, ldo),
                        _ => dots::<B, 1, $k>(pa, pages, k, po, ldo),
                    }
                };
            }
            // The common head sizes as constants: the query rows' addresses are then one
            // register and fixed offsets, where with a variable size four rows' addresses
            // did not fit the registers beside the loop's own and were reloaded from the
            // stack every 16 values (the loads, not the fmas, bounded the scores of four
            // query heads per kv head on Zen 2).
            match k {
                64 => by_rows!(64),
                128 => by_rows!(128),
                256 => by_rows!(256),
                _ => by_rows!(0),
            }
        }
        i += r;
    }
}

/// Key rows whose sums across lanes are taken together (see [`hsum8`]).
const KEYS: usize = 8;

/// Bytes ahead of the key row being read that the scores ask for (five rows of 128 halves).
/// On Zen 2 this loop's work over a 512 MiB stream (`examples/prefetch_distance`) read at the
/// machine's streaming speed, 34.5–35 GB/s on two cores, asking 0.5–1.25 KiB ahead, and 28–31
/// asking 1.5–8 KiB ahead. Presumably the hardware's streamer has brought such close lines into
/// L2 and the ask moves them on to L1, where from farther ahead each ask waits on memory in one
/// of the core's few miss buffers. Decode scores at 4,096 positions (`attn_decode`, two
/// threads, two query heads per kv head): 9.1 → 7.5 ms a token from 4 KiB to this. (Earlier
/// tries at 2–16 KiB, all past that window, measured the same as 4.) Asking for a row's bytes
/// as a chunk, with the arithmetic that cuts them at the run's end, took nearly as long as the
/// rest of the scores from L2; asking for nothing read 5 % slower from memory.
const ROW_AHEAD: usize = 1280;

/// `R` query rows at `a` against every row of the runs, into `R` rows of `out`: per pair, the
/// recipe of `dot_f32` (two accumulators over chunks of 16, one more chunk of 8 into the first,
/// their sum's `hsum`, then the scalar tail). The sums across lanes are taken for eight key
/// rows at once ([`hsum8`], the same additions): one row at a time they took a third of the
/// scores' time on Zen 2.
///
/// # Safety
/// `R` rows of `k` at `a`; `R` rows of at least the runs' rows at `out`, `ldo` apart; every run
/// whole rows of `k`; `K` is `k` or 0; AVX2, FMA and F16C.
#[inline(always)]
unsafe fn dots<B: Elem, const R: usize, const K: usize>(
    a: *const f32,
    pages: &[&[B::E]],
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    debug_assert!(K == 0 || K == k);
    let k = if K > 0 { K } else { k };
    let row_len = B::row_len(k);
    let row_bytes = row_len * std::mem::size_of::<B::E>();
    // Bytes of a row per 16 values (whole: Q8_0 rows are whole blocks of 32).
    let step = row_bytes * 16 / k;
    // Values the vector steps take (chunks of 16, then one of 8); the scalar tail takes the rest.
    let full = k / 8 * 8;
    // Each query row's lane sums of the chunk's key rows; slots past a short chunk's rows
    // hold earlier rows' sums, reduced along and never stored.
    // SAFETY: register operations only (AVX, the contract).
    let mut lanes = [[unsafe { _mm256_setzero_ps() }; KEYS]; R];
    for RunChunk { run, rows, j } in RunChunks::new(pages, row_len, KEYS).reader_asks_ahead() {
        let mut slot = 0;
        while slot < rows.len() {
            let row = rows.start + slot;
            // Two key rows at a time where the registers allow (R ≤ 2: eight sums and four
            // widened vectors): twice the independent chains of fmas per query load.
            let keys = if R <= 2 && slot + 1 < rows.len() { 2 } else { 1 };
            // The rows' bytes ROW_AHEAD on, asked for `step` bytes at a time beside each 16
            // values' loads (none past the run's end).
            let ahead = ((row + keys) * row_bytes + ROW_AHEAD <= std::mem::size_of_val(run))
                .then(|| (run.as_ptr() as *const u8).wrapping_add(row * row_bytes + ROW_AHEAD));
            // SAFETY: the chunk's rows of the run, values below k; query values below k of R
            // rows (the contract).
            unsafe {
                let b = run.as_ptr().add(row * row_len);
                if keys == 2 {
                    key_sums::<B, R, 2>(a, k, [b, b.add(row_len)], row_bytes, step, ahead, &mut lanes, slot);
                } else {
                    key_sums::<B, R, 1>(a, k, [b], row_bytes, step, ahead, &mut lanes, slot);
                }
            }
            slot += keys;
        }
        // SAFETY: outputs (r, j + slot) for r < R and the chunk's rows; the scalar tail reads
        // values full .. k of those rows and of the query rows (the contract).
        unsafe {
            for (r, lanes) in lanes.iter().enumerate() {
                let sums = hsum8(lanes);
                let o = out.add(r * ldo + j);
                if rows.len() == KEYS && full == k {
                    _mm256_storeu_ps(o, sums);
                    continue;
                }
                let mut each = [0f32; KEYS];
                _mm256_storeu_ps(each.as_mut_ptr(), sums);
                for (slot, row) in rows.clone().enumerate() {
                    let (b, mut s) = (run.as_ptr().add(row * row_len), each[slot]);
                    for t in full..k {
                        s += *a.add(r * k + t) * B::value(b, t);
                    }
                    *o.add(slot) = s;
                }
            }
        }
    }
}

/// The lane sums of `R` query rows at `a` against the `P` key rows at `b` (before the scalar
/// tail), into `lanes[r][slot + p]`: per pair, two accumulators over chunks of 16 and one more
/// chunk of 8 into the first, then their sum. The rows' bytes at `ahead` (`row_bytes` apart)
/// are asked for `step` bytes per 16 values.
///
/// # Safety
/// `R` rows of `k` at `a`; `P` rows of `k` values at `b`; `slot + P ≤ KEYS`; AVX2, FMA and
/// F16C.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn key_sums<B: Elem, const R: usize, const P: usize>(
    a: *const f32,
    k: usize,
    b: [*const B::E; P],
    row_bytes: usize,
    step: usize,
    ahead: Option<*const u8>,
    lanes: &mut [[__m256; KEYS]; R],
    slot: usize,
) {
    // SAFETY: values below k of the query and key rows (the contract).
    unsafe {
        let (mut s0, mut s1) = ([[_mm256_setzero_ps(); P]; R], [[_mm256_setzero_ps(); P]; R]);
        let mut d = 0;
        while d + 16 <= k {
            if let Some(ahead) = ahead {
                for p in 0..P {
                    crate::x86::prefetch_l2(ahead.wrapping_add(p * row_bytes + d / 16 * step), 1);
                }
            }
            let mut x = [[_mm256_setzero_ps(); 2]; P];
            for p in 0..P {
                let sc = B::scale(b[p], d);
                x[p] = [B::load8(b[p], d, sc), B::load8(b[p], d + 8, sc)];
            }
            for r in 0..R {
                let q0 = _mm256_loadu_ps(a.add(r * k + d));
                for p in 0..P {
                    s0[r][p] = _mm256_fmadd_ps(q0, x[p][0], s0[r][p]);
                }
                let q1 = _mm256_loadu_ps(a.add(r * k + d + 8));
                for p in 0..P {
                    s1[r][p] = _mm256_fmadd_ps(q1, x[p][1], s1[r][p]);
                }
            }
            d += 16;
        }
        if d + 8 <= k {
            let mut x = [_mm256_setzero_ps(); P];
            for p in 0..P {
                x[p] = B::load8(b[p], d, B::scale(b[p], d));
            }
            for r in 0..R {
                let q0 = _mm256_loadu_ps(a.add(r * k + d));
                for p in 0..P {
                    s0[r][p] = _mm256_fmadd_ps(q0, x[p], s0[r][p]);
                }
            }
        }
        for r in 0..R {
            for p in 0..P {
                lanes[r][slot + p] = _mm256_add_ps(s0[r][p], s1[r][p]);
            }
        }
    }
}

/// `hsum` of each of eight vectors, lane i the sum of `v[i]`: the same additions in the same
/// order (high half onto low, lanes 2 and 3 onto 0 and 1, then lane 1 onto 0), each applied to
/// two or four vectors' lanes at once.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn hsum8(v: &[__m256; KEYS]) -> __m256 {
    // SAFETY: register operations only, with AVX2 (the contract).
    unsafe {
        // [v_a's low half + high half | v_b's]: lanes i and i + 4 of each.
        let halves = |a: __m256, b: __m256| {
            _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b))
        };
        let (h01, h23, h45, h67) = (halves(v[0], v[1]), halves(v[2], v[3]), halves(v[4], v[5]), halves(v[6], v[7]));
        // Per 128-bit half, [x's 0 + 2, x's 1 + 3, y's 0 + 2, y's 1 + 3].
        let pairs = |x: __m256, y: __m256| {
            _mm256_add_ps(_mm256_shuffle_ps::<0b01_00_01_00>(x, y), _mm256_shuffle_ps::<0b11_10_11_10>(x, y))
        };
        let (p0123, p4567) = (pairs(h01, h23), pairs(h45, h67));
        // Lane 0 + lane 1 of each: rows 0, 2, 4, 6 in the low half, 1, 3, 5, 7 in the high.
        let sums = _mm256_add_ps(
            _mm256_shuffle_ps::<0b10_00_10_00>(p0123, p4567),
            _mm256_shuffle_ps::<0b11_01_11_01>(p0123, p4567),
        );
        _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
}

/// Rows of a run read together by every output row and column range of `P·V` (8 KiB of f16
/// rows of 128: they stay in L1 between the passes).
const PIECE: usize = 32;

/// Rows of a piece of f16 rows for one or two output rows, whose passes are light on
/// arithmetic: each pass waits less on the piece's lines when a piece is 2 KiB. On Zen 2, two
/// threads, `P·V` of decode at 4,096 positions (`attn_decode`, `PART=v`, runs of 1,024
/// positions): one query head a kv head 9.8–10.4 → 8.5–8.9 ms a token, two 9.5–9.8 → 8.1–8.5,
/// though from L3 (one layer) they take 5–10 % longer than in pieces of 32. Three or four query rows
/// (16 columns a pass, twice the passes) are bound by their fmas: 8 rows made four 5 % slower,
/// three the same; the q8_0 rows' passes, bound by their widening, were slower with every
/// smaller piece (two rows: 6.8–6.9 ms at 32, 7.2 at 12, 7.6 at 8).
const FEW_ROWS_PIECE: usize = 8;

/// `out_i += Σ_j a[i·lda + j] · b_j` over the rows of all runs (`out` is m × n), each output
/// lane as this tier's `gemm_nn_acc` takes it: an fma per row j in order, zero weights too, and
/// the columns past the last multiple of 8 by scalar sums added at the end.
#[target_feature(enable = "avx2,fma,f16c")]
fn gemm_nn_acc_impl<B: Elem>(a: &[f32], lda: usize, pages: &[&[B::E]], n: usize, out: &mut [f32]) {
    let m = out.len() / n;
    let kk: usize = pages.iter().map(|p| p.len() / B::row_len(n)).sum();
    assert!(m == 0 || ((m - 1) * lda + kk <= a.len() && m * n <= out.len()));
    let (row_len, full) = (B::row_len(n), n / 8 * 8);
    let row_bytes = row_len * std::mem::size_of::<B::E>();
    for RunChunk { run, rows, j } in RunChunks::new(pages, row_len, B::piece(m)).reader_asks_ahead() {
        // The next piece of this run, asked for a line or two beside each row the passes over
        // this one read, in the order it lies (as long as this one: past a short last piece,
        // a few KiB of whatever follows it in the pool); at the run's end, this piece again
        // (lines already read). The next run's start is asked for as this run begins.
        let base = run.as_ptr() as *const u8;
        let next = if rows.end < run.len() / row_len { rows.end } else { rows.start };
        let ahead = Ahead { at: base.wrapping_add(next * row_bytes), bytes: rows.len() * row_bytes };
        let mut i = 0;
        while i < m {
            let r = (m - i).min(4);
            // SAFETY: rows i .. i + r of `out` and of `a` (weights j .. j + rows.len() ≤ kk of
            // each) lie inside them (asserted above); the chunk's rows of the run are whole
            // rows of `n`, and `full <= n`.
            unsafe {
                let (pa, po) = (a.as_ptr().add(i * lda + j), out.as_mut_ptr().add(i * n));
                let (piece, len) = (run.as_ptr().add(rows.start * row_len), rows.len());
                // Three or four rows take 16 columns a pass, so that their sums, weights
                // and a value fit the 16 registers (three rows of 32 columns spilled one).
                let ahead = if i == 0 { ahead } else { Ahead { bytes: 0, ..ahead } };
                match r {
                    4 => weigh::<B, 4, 2>(pa, lda, piece, len, row_len, full, po, n, ahead),
                    3 => weigh::<B, 3, 2>(pa, lda, piece, len, row_len, full, po, n, ahead),
                    2 => weigh::<B, 2, 4>(pa, lda, piece, len, row_len, full, po, n, ahead),
                    _ => weigh::<B, 1, 4>(pa, lda, piece, len, row_len, full, po, n, ahead),
                }
            }
            i += r;
        }
    }
    for i in 0..m {
        for c in full..n {
            let w = &a[i * lda..i * lda + kk];
            let col = pages.iter().flat_map(|run| run.chunks_exact(row_len));
            // SAFETY: column c < n of a whole row of `n` values.
            out[i * n + c] += w.iter().zip(col).map(|(&w, b)| w * unsafe { B::value(b.as_ptr(), c) }).sum::<f32>();
        }
    }
}

/// Columns `0 .. full` of `R` output rows (at `o`, `n` apart) plus the `rows` value rows at `b`
/// (`row_len` elements apart) weighted by the `R` rows of weights at `p` (`lda` apart), `8·V`
/// columns (with V = 4, one Q8_0 block) at a time in registers. Meanwhile it asks for the bytes
/// of `ahead` into L2, an equal share in each pass, spread over its rows (asking reads nothing
/// into the program, wherever it points).
///
/// # Safety
/// `R` rows of at least `full` outputs at `o` and of `rows` weights at `p`; `rows` whole rows at
/// `b`; `full` a multiple of 8 not above their width; AVX2, FMA and F16C.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn weigh<B: Elem, const R: usize, const V: usize>(
    p: *const f32,
    lda: usize,
    b: *const B::E,
    rows: usize,
    row_len: usize,
    full: usize,
    o: *mut f32,
    n: usize,
    ahead: Ahead,
) {
    let mut c0 = 0;
    let passes = full.div_ceil(8 * V);
    // Bytes of the next piece each pass asks for, and each of its rows.
    let per_pass = ahead.bytes.div_ceil(passes.max(1));
    let per_row = per_pass.div_ceil(rows.max(1));
    let mut at = ahead.at;
    // SAFETY: columns c0 .. c0 + 8·V ≤ full, or the fewer vectors left below it (the contract);
    // c0 is a multiple of 8·V, so with V ≤ 4 the vectors of a pass lie in one Q8_0 block.
    unsafe {
        while c0 + 8 * V <= full {
            columns::<B, R, V>(p, lda, b, rows, row_len, c0, o, n, at, per_row);
            c0 += 8 * V;
            at = at.wrapping_add(per_pass);
        }
        // The sums stay in registers only where the number of vectors is a constant.
        match (full - c0) / 8 {
            0 => {}
            1 => columns::<B, R, 1>(p, lda, b, rows, row_len, c0, o, n, at, per_row),
            2 => columns::<B, R, 2>(p, lda, b, rows, row_len, c0, o, n, at, per_row),
            _ => columns::<B, R, 3>(p, lda, b, rows, row_len, c0, o, n, at, per_row),
        }
    }
}

/// Bytes for a reader to ask for while it works (none when `bytes` is 0).
#[derive(Clone, Copy)]
struct Ahead {
    at: *const u8,
    bytes: usize,
}

/// Columns `c0 .. c0 + 8·V` of [`weigh`].
///
/// # Safety
/// As for [`weigh`], with those columns inside one block of every row and below `full`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn columns<B: Elem, const R: usize, const V: usize>(
    p: *const f32,
    lda: usize,
    b: *const B::E,
    rows: usize,
    row_len: usize,
    c0: usize,
    o: *mut f32,
    n: usize,
    ahead: *const u8,
    per_row: usize,
) {
    // SAFETY: columns c0 .. c0 + 8·V of R output rows, of every value row; R weights per
    // value row (the contract).
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); V]; R];
        for (r, acc) in acc.iter_mut().enumerate() {
            for (v, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_loadu_ps(o.add(r * n + c0 + 8 * v));
            }
        }
        for j in 0..rows {
            if per_row > 0 {
                crate::x86::prefetch_l2(ahead.wrapping_add(j * per_row), 1);
            }
            let row = b.add(j * row_len);
            // The line of this row that the next pass reads, into L1 now: the piece is in L2
            // by then, and each pass would otherwise wait on a line of every row (f16 `P·V` of
            // decode at 4,096 positions on Zen 2: 10.4 → 9.6 ms a token).
            crate::x86::prefetch_l1((row as *const u8).wrapping_add(B::byte_of(c0 + 8 * V)), 1);
            let sc = B::scale(row, c0);
            let mut w = [_mm256_setzero_ps(); R];
            for (r, w) in w.iter_mut().enumerate() {
                *w = _mm256_broadcast_ss(&*p.add(r * lda + j));
            }
            for v in 0..V {
                let x = B::load8(row, c0 + 8 * v, sc);
                for r in 0..R {
                    acc[r][v] = _mm256_fmadd_ps(w[r], x, acc[r][v]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.add(r * n + c0 + 8 * v), *acc);
            }
        }
    }
}

pub(crate) fn gemm_nt_pages(a: &[f32], pages: Pages, k: usize, out: &mut [f32], ldo: usize) {
    match pages {
        // SAFETY: the AVX2 table (the only caller) is built only when the CPU reports AVX2, FMA
        // and F16C (`KernelTier::is_available`); the kernel asserts its rows lie in its slices,
        // and `Kernels` checked that every run is whole rows.
        Pages::F32(p) => unsafe { gemm_nt_impl::<f32>(a, p, k, out, ldo) },
        // SAFETY: as above.
        Pages::F16(p) => unsafe { gemm_nt_impl::<u16>(a, p, k, out, ldo) },
        // SAFETY: as above (`Kernels` checked that `k` is a multiple of 32, whole blocks).
        Pages::Q8_0(p) => unsafe { gemm_nt_impl::<Q8>(a, p, k, out, ldo) },
    }
}

pub(crate) fn gemm_nn_acc_pages(a: &[f32], lda: usize, pages: Pages, n: usize, out: &mut [f32]) {
    match pages {
        // SAFETY: as for `gemm_nt_pages`.
        Pages::F32(p) => unsafe { gemm_nn_acc_impl::<f32>(a, lda, p, n, out) },
        // SAFETY: as above.
        Pages::F16(p) => unsafe { gemm_nn_acc_impl::<u16>(a, lda, p, n, out) },
        // SAFETY: as above (`n` a multiple of 32).
        Pages::Q8_0(p) => unsafe { gemm_nn_acc_impl::<Q8>(a, lda, p, n, out) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::KernelTier;

    /// Eight sums at once are the bits of eight `hsum`s, over values whose sums round.
    #[test]
    fn hsum8_is_eight_hsums() {
        if !KernelTier::Avx2.is_available() {
            return;
        }
        let mut rng = crate::test_rng::Lcg(7);
        let mut next = move || {
            let e = (rng.byte() >> 4) as i32 - 8;
            rng.centered() * 2f32.powi(e)
        };
        for _ in 0..1000 {
            let vals: [[f32; 8]; KEYS] = std::array::from_fn(|_| std::array::from_fn(|_| next()));
            // SAFETY: AVX2 is present (checked above); each load reads one array of 8.
            let (got, want) = unsafe {
                let v: [__m256; KEYS] = std::array::from_fn(|i| _mm256_loadu_ps(vals[i].as_ptr()));
                let mut got = [0f32; KEYS];
                _mm256_storeu_ps(got.as_mut_ptr(), hsum8(&v));
                (got, v.map(|v| super::super::ops::hsum(v)))
            };
            assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits), "{vals:?}");
        }
    }
}
