//! AVX-512 block products for attention: scores `Q·Kᵀ` and weighted values `P·V` over cached
//! rows (f32, or IEEE halves or Q8_0 blocks widened in the register, in runs of a paged cache),
//! and the f16 → f32 widening itself. Over Q8_0 rows `P·V` folds each block's scale into the
//! weight (its [`Elem::add_rows`]); the scores of decoding against such a cache are in `attn_q8`.

use std::arch::x86_64::*;

use crate::table::Pages;
use crate::x86::{RUN_AHEAD as AHEAD, RunChunk, RunChunks, prefetch_run as prefetch};

#[inline(always)]
fn mask(n: usize) -> __mmask16 {
    (((1u32 << n.min(16)) - 1) & 0xffff) as __mmask16
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn f16_to_f32_impl(src: &[u16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i < n {
        let m = mask(n - i);
        // SAFETY: the mask keeps loads and stores inside both slices.
        unsafe {
            let h = _mm256_maskz_loadu_epi16(m, src.as_ptr().add(i) as *const i16);
            _mm512_mask_storeu_ps(dst.as_mut_ptr().add(i), m, _mm512_cvtph_ps(h));
        }
        i += 16;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn f32_to_f16_impl(src: &[f32], dst: &mut [u16]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i < n {
        let m = mask(n - i);
        // SAFETY: the mask keeps loads and stores inside both slices.
        unsafe {
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_maskz_loadu_ps(
                m,
                src.as_ptr().add(i),
            ));
            _mm256_mask_storeu_epi16(dst.as_mut_ptr().add(i) as *mut i16, m, h);
        }
        i += 16;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn round_f16_impl(x: &mut [f32]) {
    let n = x.len();
    let mut i = 0;
    while i < n {
        let m = mask(n - i);
        // SAFETY: the mask keeps loads and stores inside the slice.
        unsafe {
            let v = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            _mm512_mask_storeu_ps(x.as_mut_ptr().add(i), m, _mm512_cvtph_ps(h));
        }
        i += 16;
    }
}

/// Rows per step of [`acc_cols`]' walk over the runs: each step asks for the bytes ahead of it
/// once, and [`Elem::add_rows`] takes its rows' weights sixteen at a time (one vector).
const PV_ROWS: usize = 16;

/// How the keys or values the block products read are stored: f32, IEEE halves or Q8_0 blocks,
/// each widened in the register to exactly the f32 values that widening the rows first gives
/// (so the same products).
pub(super) trait Elem {
    /// What the runs are slices of.
    type E: Copy;

    /// Elements of `E` in a row of `k` values.
    fn row_len(k: usize) -> usize {
        k
    }

    /// The lanes of `m` of values `d .. d + 16` of the row at `row`, as f32 (zero elsewhere).
    ///
    /// # Safety
    /// The lanes of `m` must lie inside the row, which lies inside one slice; `d` is a multiple
    /// of 16; AVX-512 F/BW/VL and F16C must be present.
    unsafe fn load(row: *const Self::E, d: usize, m: __mmask16) -> __m512;

    /// What [`Elem::load_scaled`] needs of the block that holds values `d ..` (Q8_0: its scale),
    /// so that the values of one block share it.
    ///
    /// # Safety
    /// As for [`Elem::load`].
    #[inline(always)]
    unsafe fn scale(_row: *const Self::E, _d: usize) -> __m512 {
        // SAFETY: register operations only (AVX-512 F, the contract).
        unsafe { _mm512_setzero_ps() }
    }

    /// Add `count` (at most [`PV_ROWS`]) consecutive rows of `n` values from `first` into
    /// `acc` ([`acc_cols`]' columns `c0 ..`, the last vector's lanes `last`), row t weighted
    /// by `p[r·lda + t]` for output row r; a row all of whose weights are 0 is skipped. The
    /// `ahead_len` bytes at `ahead` (any address) are asked for into L2 meanwhile.
    ///
    /// # Safety
    /// As for [`acc_cols`]: the rows lie in one run and hold the columns (whole blocks of
    /// them); R rows of `count` weights at `p`, `lda` apart.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn add_rows<const V: usize, const R: usize>(
        first: *const Self::E,
        count: usize,
        p: *const f32,
        lda: usize,
        n: usize,
        c0: usize,
        last: __mmask16,
        (ahead, ahead_len): (*const u8, usize),
        acc: &mut [[__m512; V]; R],
    ) {
        let share = row_share(ahead_len, count);
        // SAFETY: the contract: `count ≤ 16` rows at `first` and their weights at `p` (R rows,
        // `lda` apart), every load masked to them; AVX-512 F/BW/VL.
        unsafe {
            let live = mask(count);
            let mut zero = 0;
            for r in 0..R {
                let w = _mm512_maskz_loadu_ps(live, p.add(r * lda));
                zero |= _mm512_mask_cmpeq_ps_mask(live, w, _mm512_setzero_ps());
            }
            let lanes = |v: usize| if v + 1 < V { 0xffff } else { last };
            for t in 0..count {
                // (Asked for one line at a time between the row's loads instead, the bytes ahead
                // read no faster.)
                ask_share((ahead, ahead_len), share, t);
                let row = first.add(t * Self::row_len(n));
                if zero == 0 {
                    // No weight of the chunk is 0 (decode's rows, all but the causal tail's):
                    // each weight is broadcast from memory, and no row tests its own.
                    let weight = |r: usize, _| _mm512_set1_ps(*p.add(r * lda + t));
                    fma_row(acc, &[1.0; R], 0, weight, |v| Self::load(row, c0 + 16 * v, lanes(v)));
                } else {
                    let w: [f32; R] = std::array::from_fn(|r| *p.add(r * lda + t));
                    let zeros = w.iter().filter(|&&w| w == 0.0).count();
                    if zeros < R {
                        Self::add_row(row, c0, last, &w, zeros, acc);
                    }
                }
            }
        }
    }

    /// Add the row at `row`, weighted by `w` (`zeros` of them 0, not all), into `acc`: columns
    /// `c0 ..` of [`acc_cols`], the last vector's lanes `last`. By default each value is widened
    /// with its block's scale ([`Elem::load_scaled`]) and taken by `fma(w, x, acc)`.
    ///
    /// # Safety
    /// As for [`acc_cols`]: the row holds the columns, whole blocks of them.
    #[inline(always)]
    unsafe fn add_row<const V: usize, const R: usize>(
        row: *const Self::E,
        c0: usize,
        last: __mmask16,
        w: &[f32; R],
        zeros: usize,
        acc: &mut [[__m512; V]; R],
    ) {
        // SAFETY: the same contract; values 32v' .. 32v' + 32 lie in one block (c0 is a
        // multiple of 64): one scale each.
        unsafe {
            let mut s = [_mm512_setzero_ps(); V];
            for v in (0..V).step_by(2) {
                s[v] = Self::scale(row, c0 + 16 * v);
            }
            let wv: [__m512; R] = std::array::from_fn(|r| _mm512_set1_ps(w[r]));
            let lanes = |v: usize| if v + 1 < V { 0xffff } else { last };
            fma_row(acc, w, zeros, |r, _| wv[r], |v| Self::load_scaled(row, c0 + 16 * v, lanes(v), s[v & !1]));
        }
    }

    /// [`Elem::load`], given [`Elem::scale`] of the same block.
    ///
    /// # Safety
    /// As for [`Elem::load`].
    #[inline(always)]
    unsafe fn load_scaled(row: *const Self::E, d: usize, m: __mmask16, _scale: __m512) -> __m512 {
        // SAFETY: the same contract.
        unsafe { Self::load(row, d, m) }
    }
}

impl Elem for f32 {
    type E = f32;

    #[inline(always)]
    unsafe fn load(row: *const f32, d: usize, m: __mmask16) -> __m512 {
        // SAFETY: the lanes of `m` lie inside the row, and AVX-512 F is present (the contract
        // of `Elem::load`).
        unsafe { _mm512_maskz_loadu_ps(m, row.add(d)) }
    }
}

impl Elem for u16 {
    type E = u16;

    #[inline(always)]
    unsafe fn load(row: *const u16, d: usize, m: __mmask16) -> __m512 {
        // SAFETY: the lanes of `m` lie inside the row, and AVX-512 F/BW/VL and F16C are
        // present (the contract of `Elem::load`; the AVX-512 tier requires the AVX2 tier's
        // features, F16C among them: `KernelTier::is_available`).
        unsafe { _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row.add(d) as *const i16)) }
    }
}

/// Rows stored as Q8_0 blocks (34 bytes: an f16 scale, then 32 signed bytes), widened as
/// `dequantize_q8_0` widens them: `q as f32 * scale`, one rounding.
pub(super) struct Q8;

impl Elem for Q8 {
    type E = u8;

    fn row_len(k: usize) -> usize {
        k / 32 * 34
    }

    #[inline(always)]
    unsafe fn load(row: *const u8, d: usize, m: __mmask16) -> __m512 {
        // SAFETY: the contract of `Elem::load`, which `scale` and `load_scaled` share.
        unsafe { Self::load_scaled(row, d, m, Self::scale(row, d)) }
    }

    #[inline(always)]
    unsafe fn scale(row: *const u8, d: usize) -> __m512 {
        // SAFETY: the contract of `Elem::load`: value `d` lies in a block of the row, whose
        // scale is its first two bytes; AVX-512 F and F16C.
        unsafe { _mm512_cvtph_ps(_mm256_set1_epi16((row.add(d / 32 * 34) as *const i16).read_unaligned())) }
    }

    /// The block's scale folded into the weight: each output lane takes `fma(w_j · d_jb, q_jc,
    /// acc)` (`d_jb` the scale of the block of row j that holds column c, `q_jc` its byte),
    /// where widening the values first took `fma(w_j, q_jc · d_jb, acc)`. The products `w_j ·
    /// d_jb` of the chunk's rows are made first, sixteen rows a vector (the scales gathered),
    /// and reach the fmas as broadcast memory operands, which take no shuffle. Made a row at a
    /// time, from its scales read one by one, they cost as much as the row's fmas (the 1.7B
    /// shape's q8_0 `P·V` ran at 16 GB/s on two cores, the f16 one at 23).
    #[inline(always)]
    unsafe fn add_rows<const V: usize, const R: usize>(
        first: *const u8,
        count: usize,
        p: *const f32,
        lda: usize,
        n: usize,
        c0: usize,
        last: __mmask16,
        (ahead, ahead_len): (*const u8, usize),
        acc: &mut [[__m512; V]; R],
    ) {
        // A row's share of the lines ahead beside each row (all 34 at once, a profile found
        // the core waiting on the prefetches).
        let share = row_share(ahead_len, count);
        // SAFETY: the contract: `count ≤ 16` rows of `n / 32` blocks (34 bytes: a 2-byte
        // scale, then 32 bytes) at `first`, the columns' blocks `c0 / 32 ..` (at most 128
        // values: four blocks) inside each; a scale's dword holds the scale and two quants;
        // the masks keep every gather and load to rows t < count. F16C and AVX-512 F/BW/VL.
        unsafe {
            let row = Self::row_len(n);
            let (first_block, blocks) = (c0 / 32, V.div_ceil(2));
            let live = mask(count);
            let offsets = _mm512_mullo_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(row as i32),
            );
            // wd[r][b][t] = weight of row t for output r, times the scale of its block b.
            let mut wd = [[[0f32; 16]; 4]; R];
            for b in 0..blocks {
                let at = first.add((first_block + b) * 34) as *const i32;
                let words = _mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), live, offsets, at);
                let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
                for r in 0..R {
                    let w = _mm512_maskz_loadu_ps(live, p.add(r * lda));
                    _mm512_storeu_ps(wd[r][b].as_mut_ptr(), _mm512_mul_ps(w, d));
                }
            }
            let lanes = |v: usize| if v + 1 < V { 0xffff } else { last };
            for t in 0..count {
                ask_share((ahead, ahead_len), share, t);
                let w: [f32; R] = std::array::from_fn(|r| *p.add(r * lda + t));
                let zeros = w.iter().filter(|&&w| w == 0.0).count();
                if zeros == R {
                    continue;
                }
                let rt = first.add(t * row);
                // Read back through memory: a volatile read keeps the compiler from turning
                // the broadcasts into shuffles, so each becomes the fma's `{1to16}` operand.
                let weight = |r: usize, v: usize| _mm512_set1_ps(std::ptr::read_volatile(&wd[r][v / 2][t]));
                let load = |v: usize| {
                    let at = rt.add((first_block + v / 2) * 34 + 2 + 16 * (v % 2));
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(lanes(v), at as *const i8)))
                };
                fma_row(acc, &w, zeros, weight, load);
            }
        }
    }

    #[inline(always)]
    unsafe fn load_scaled(row: *const u8, d: usize, m: __mmask16, scale: __m512) -> __m512 {
        // SAFETY: the contract of `Elem::load`: the 16 values from `d` (a multiple of 16) lie in
        // one block of the row; AVX-512 F/BW/VL.
        unsafe {
            let q = _mm_maskz_loadu_epi8(m, row.add(d / 32 * 34 + 2 + d % 32) as *const i8);
            _mm512_maskz_mul_ps(m, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), scale)
        }
    }
}

/// Each row's share (whole lines) of the `ahead_len` bytes ahead of a chunk of `count` rows.
#[inline(always)]
fn row_share(ahead_len: usize, count: usize) -> usize {
    ahead_len.div_ceil(count.max(1)).next_multiple_of(64)
}

/// Ask for row `t`'s share of the bytes ahead (none past their end) to be brought into L2.
#[inline(always)]
fn ask_share((ahead, ahead_len): (*const u8, usize), share: usize, t: usize) {
    if t * share < ahead_len {
        crate::x86::prefetch_l2(ahead.wrapping_add(t * share), share.min(ahead_len - t * share));
    }
}

/// `out[i·ldo + j] = a_i · b_j` (rows of `k`).
///
/// Every output takes one recipe, whatever the shape and whichever rows come with it (a
/// query's scores must not depend on the other queries of its batch): lane l of a 16-lane
/// accumulator takes `fma(a[16c + l], b[16c + l], acc)` for c = 0, 1, … (the last chunk
/// zero-padded), and the 16 lanes are then added by the fixed tree of [`hsum16`]. Blocks of R
/// rows of `a` × C rows of `b` (R·C = 16 accumulators, or 15) share their loads, and their 16
/// sums come out of one tree.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
///
/// The rows of `b` come as consecutive runs (`pages`: the blocks of a paged cache), each whole
/// rows of `k`; column j of `out` is the j-th row over all runs.
fn gemm_nt_impl<B: Elem>(a: &[f32], pages: &[&[B::E]], k: usize, out: &mut [f32], ldo: usize) {
    let m = a.len() / k;
    let n: usize = pages.iter().map(|p| p.len() / B::row_len(k)).sum();
    let mut i = 0;
    while i < m {
        let r = (m - i).min(4);
        assert!((i + r) * k <= a.len() && (i + r - 1) * ldo + n <= out.len());
        let mut j = 0;
        if let Some(first) = pages.first() {
            prefetch(first, 0, AHEAD);
        }
        for (pi, b) in pages.iter().enumerate() {
            if let Some(next) = pages.get(pi + 1) {
                prefetch(next, 0, AHEAD);
            }
            let pn = b.len() / B::row_len(k);
            // SAFETY: rows i..i + r of `a`, and of `out` up to column n, lie inside them (just
            // checked); `cols` reads the run's rows and writes its columns j..j + pn < n.
            unsafe {
                let (pa, po) = (a.as_ptr().add(i * k), out.as_mut_ptr().add(i * ldo + j));
                match r {
                    4 => cols::<B, 4, 4>(pa, b, pn, k, po, ldo),
                    3 => cols::<B, 3, 5>(pa, b, pn, k, po, ldo),
                    2 => cols::<B, 2, 8>(pa, b, pn, k, po, ldo),
                    _ => cols::<B, 1, 16>(pa, b, pn, k, po, ldo),
                }
            }
            j += pn;
        }
        i += r;
    }
}

/// `R` rows of `a` (at `a`, `k` apart) against every row of `b`, `C` at a time.
#[inline(always)]
unsafe fn cols<B: Elem, const R: usize, const C: usize>(
    a: *const f32,
    b: &[B::E],
    n: usize,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    let row_bytes = B::row_len(k) * std::mem::size_of::<B::E>();
    let mut j = 0;
    let run_bytes = n * row_bytes;
    while j < n {
        // The lines ahead, asked for a few at a time beside the chunks' arithmetic (all at once,
        // they left the core waiting); none past the run's end.
        let from = j * row_bytes + AHEAD;
        let ahead = (b.as_ptr() as *const u8).wrapping_add(from);
        let ahead_len = run_bytes.saturating_sub(from).min(C * row_bytes);
        let c = (n - j).min(C);
        // SAFETY: the caller's contract (R rows of `k` at `a`, `n` rows of `k` in `b`, R rows
        // of `n` at `out`, `ldo` apart), so every row pointer is row j + q.min(c - 1) < n of `b`
        // (the last block repeats row n - 1 past the end) and `block` gets its contract.
        unsafe {
            let rows: [*const B::E; C] = std::array::from_fn(|q| b.as_ptr().add((j + q.min(c - 1)) * B::row_len(k)));
            block::<B, R, C>(a, &rows, k, out.add(j), ldo, c, (ahead, ahead_len));
        }
        j += C;
    }
}

/// The R × C dots of rows `a + r·k` with `rows[q]`, stored at `out + r·ldo + q` for q < `c`.
#[inline(always)]
unsafe fn block<B: Elem, const R: usize, const C: usize>(
    a: *const f32,
    rows: &[*const B::E; C],
    k: usize,
    out: *mut f32,
    ldo: usize,
    c: usize,
    (ahead, ahead_len): (*const u8, usize),
) {
    // SAFETY: the caller's contract: R rows of `k` at `a`, C rows of `k` at `rows`, R rows of
    // `c` at `out` (`ldo` apart), and AVX-512 F/BW/VL present.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let full = k / 16 * 16;
        let per_chunk = ahead_len.div_ceil(64).div_ceil((full / 16).max(1)) * 64;
        for (i, d) in (0..full).step_by(16).enumerate() {
            let at = i * per_chunk;
            let len = if at < ahead_len { per_chunk.min(ahead_len - at) } else { 0 };
            chunk::<B, R, C>(&mut acc, a, rows, k, d, 0xffff, (ahead.wrapping_add(at), len));
        }
        if full < k {
            chunk::<B, R, C>(&mut acc, a, rows, k, full, mask(k - full), (ahead, 0));
        }
        store_sums(&acc, out, ldo, c);
    }
}

/// Store the lane sums of R × C accumulators (R·C ≤ 16): the sum of `acc[r][q]` at
/// `out + r·ldo + q`, for q < `c`, each by the tree of [`hsum16`].
///
/// # Safety
/// R rows of `c` floats at `out`, `ldo` apart; AVX-512 F.
#[inline(always)]
pub(super) unsafe fn store_sums<const R: usize, const C: usize>(
    acc: &[[__m512; C]; R],
    out: *mut f32,
    ldo: usize,
    c: usize,
) {
    // SAFETY: the caller's contract; the masks stop at `c` values a row.
    unsafe {
        // Output (r, q) is lane C·r + q of the tree's result; `hsum16` puts input 4(o % 4) + o / 4
        // in lane o.
        let mut v = [_mm512_setzero_ps(); 16];
        for r in 0..R {
            for q in 0..C {
                let o = C * r + q;
                v[4 * (o % 4) + o / 4] = acc[r][q];
            }
        }
        let sums = hsum16(&v);
        for r in 0..R {
            let row = _mm512_maskz_compress_ps(mask(C).wrapping_shl((C * r) as u32), sums);
            _mm512_mask_storeu_ps(out.add(r * ldo), mask(c), row);
        }
    }
}

/// One chunk of 16 values (the lanes in `m`) into the R × C accumulators, asking for the `len`
/// bytes at `ahead` (any address) meanwhile.
#[inline(always)]
unsafe fn chunk<B: Elem, const R: usize, const C: usize>(
    acc: &mut [[__m512; C]; R],
    a: *const f32,
    rows: &[*const B::E; C],
    k: usize,
    d: usize,
    m: __mmask16,
    (ahead, len): (*const u8, usize),
) {
    // SAFETY: the caller's contract: the lanes of `m` from `d` lie inside every row, and
    // AVX-512 F is present.
    unsafe {
        let av: [__m512; R] = std::array::from_fn(|r| _mm512_maskz_loadu_ps(m, a.add(r * k + d)));
        let lines = len.div_ceil(64);
        for q in 0..C {
            // The lines ahead one at a time beside the rows' loads: on Sapphire Rapids the
            // 1.7B shape's decode attention read 4 % faster so than with the chunk's lines
            // asked for at its start (at four query heads a kv head, 1 %).
            if lines > 0 && (q * lines) % C < lines {
                crate::x86::prefetch_l2(ahead.wrapping_add(64 * (q * lines / C)), 64);
            }
            let bv = B::load(rows[q], d, m);
            for r in 0..R {
                acc[r][q] = _mm512_fmadd_ps(av[r], bv, acc[r][q]);
            }
        }
    }
}

/// Sixteen horizontal sums at once: lane o holds the sum of the lanes of `v[4(o % 4) + o / 4]`,
/// each by the same tree: y_i = x_i + x_{i+8}, z_i = y_i + y_{i+4}, w_i = z_i + z_{i+2},
/// w_0 + w_1.
#[inline(always)]
unsafe fn hsum16(v: &[__m512; 16]) -> __m512 {
    // SAFETY: the caller's contract: AVX-512 F is present (register operations only).
    unsafe {
        // [x_a + x_a' | x_b + x_b'], halves 256 bits apart.
        // (x_lo + x_hi in the low half, y_hi + y_lo in the high half: one shuffle and a blend.)
        let s: [__m512; 8] = std::array::from_fn(|p| {
            let (x, y) = (v[2 * p], v[2 * p + 1]);
            _mm512_add_ps(_mm512_mask_blend_ps(0xff00, x, y), _mm512_shuffle_f32x4::<0b01_00_11_10>(x, y))
        });
        // 128-bit lane L of t[u]: the four z of v[4u + L].
        let t: [__m512; 4] = std::array::from_fn(|u| {
            let (x, y) = (s[2 * u], s[2 * u + 1]);
            _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(x, y), _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y))
        });
        // Lane L of w[h]: w_0, w_1 of v[8h + L], then of v[8h + 4 + L].
        let w: [__m512; 2] = std::array::from_fn(|h| {
            let (x, y) = (t[2 * h], t[2 * h + 1]);
            _mm512_add_ps(_mm512_shuffle_ps::<0b01_00_01_00>(x, y), _mm512_shuffle_ps::<0b11_10_11_10>(x, y))
        });
        _mm512_add_ps(_mm512_shuffle_ps::<0b10_00_10_00>(w[0], w[1]), _mm512_shuffle_ps::<0b11_01_11_01>(w[0], w[1]))
    }
}

/// `out_i += Σ_j a[i·lda + j] · b_j` for rows `b_j` of `n` values (`out` is m × n). Up to four
/// output rows at a time share each loaded row of `b`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
///
/// The rows of `b` come as consecutive runs (`pages`), as for [`gemm_nt_impl`].
fn gemm_nn_acc_impl<B: Elem>(a: &[f32], lda: usize, pages: &[&[B::E]], n: usize, out: &mut [f32]) {
    let m = out.len() / n;
    let kk: usize = pages.iter().map(|p| p.len() / B::row_len(n)).sum();
    let mut i = 0;
    while i < m {
        let r = (m - i).min(4);
        assert!((i + r - 1) * lda + kk <= a.len() && (i + r) * n <= out.len());
        let mut c0 = 0;
        while c0 < n {
            let width = (n - c0).min(128);
            // SAFETY: rows i..i + r of `a` (kk values each) and of `out` lie inside them (just
            // checked), and `width` columns from `c0` lie inside every row of `out` and `b`.
            unsafe {
                let (pa, po) = (a.as_ptr().add(i * lda), out.as_mut_ptr().add(i * n));
                match r {
                    // Four rows (the query heads of a Bonsai-8B-shape kv head) keep 64 columns
                    // in 16 registers: a chunk of rows adds into columns 0..64, then, while
                    // it is in L1, into 64..128 (the other accumulators parked meanwhile).
                    // Each row thus streams from memory once and is widened once per half.
                    4 if width == 128 => acc_cols::<B, 4, 4, 2>(pa, lda, pages, n, c0, width, po),
                    4 if width > 64 => {
                        acc_cols::<B, 4, 4, 1>(pa, lda, pages, n, c0, 64, po);
                        acc_rows::<B, 4>(pa, lda, pages, n, c0 + 64, width - 64, po);
                    }
                    4 => acc_rows::<B, 4>(pa, lda, pages, n, c0, width, po),
                    3 => acc_rows::<B, 3>(pa, lda, pages, n, c0, width, po),
                    2 => acc_rows::<B, 2>(pa, lda, pages, n, c0, width, po),
                    _ => acc_rows::<B, 1>(pa, lda, pages, n, c0, width, po),
                }
            }
            c0 += width;
        }
        i += r;
    }
}

/// `R` output rows (at `o`, `n` apart) of columns `c0 .. c0 + width` (at most 128; at most 64
/// for four rows), their weights at `p` (`lda` apart, one per row of the runs).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn acc_rows<B: Elem, const R: usize>(
    p: *const f32,
    lda: usize,
    pages: &[&[B::E]],
    n: usize,
    c0: usize,
    width: usize,
    o: *mut f32,
) {
    // SAFETY: the caller's contract is `acc_cols`' (R rows of `n` at `o`, their `kk` weights
    // at `p`, `lda` apart; columns `c0 .. c0 + width` inside every row), and `width <= 128`
    // makes `width.div_ceil(16)` the V it needs, in one part.
    unsafe {
        match width.div_ceil(16) {
            8 => acc_cols::<B, 8, R, 1>(p, lda, pages, n, c0, width, o),
            7 => acc_cols::<B, 7, R, 1>(p, lda, pages, n, c0, width, o),
            6 => acc_cols::<B, 6, R, 1>(p, lda, pages, n, c0, width, o),
            5 => acc_cols::<B, 5, R, 1>(p, lda, pages, n, c0, width, o),
            4 => acc_cols::<B, 4, R, 1>(p, lda, pages, n, c0, width, o),
            3 => acc_cols::<B, 3, R, 1>(p, lda, pages, n, c0, width, o),
            2 => acc_cols::<B, 2, R, 1>(p, lda, pages, n, c0, width, o),
            _ => acc_cols::<B, 1, R, 1>(p, lda, pages, n, c0, width, o),
        }
    }
}

/// Columns `c0 .. c0 + width` of `R` output rows, in `H` parts of `16·V` columns (all whole
/// but the last vector of the last part), each part kept in registers while a chunk of
/// weighted rows streams past (each row loaded once for the `R` output rows, and from memory
/// once for all parts). A row adds only its nonzero weights, in order (rows all weighted 0 are
/// skipped altogether: the causal tail).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn acc_cols<B: Elem, const V: usize, const R: usize, const H: usize>(
    p: *const f32,
    lda: usize,
    pages: &[&[B::E]],
    n: usize,
    c0: usize,
    width: usize,
    o: *mut f32,
) {
    // SAFETY: the caller's contract: R rows of `n` outputs at `o` and R rows of weights at
    // `p` (`lda` apart, one weight per row of the runs), columns `c0 .. c0 + width` inside
    // every output row and every row of the runs (rows of `n`), `width` more than
    // `16·V·H − 16`; `lanes` masks the last vector to `width`. AVX-512 F/BW/VL present.
    unsafe {
        let last = mask(width - 16 * (V * H - 1));
        // The lanes of vector v of part h, and the last vector's lanes of part h.
        let part_last = |h: usize| if h + 1 < H { 0xffff } else { last };
        let lanes = |h: usize, v: usize| if v + 1 < V { 0xffff } else { part_last(h) };
        let col = |h: usize, v: usize| c0 + 16 * (V * h + v);
        let mut parts: [[[__m512; V]; R]; H] = std::array::from_fn(|h| {
            std::array::from_fn(|r| {
                std::array::from_fn(|v| _mm512_maskz_loadu_ps(lanes(h, v), o.add(r * n + col(h, v))))
            })
        });
        let row_len = B::row_len(n);
        if let Some(first) = pages.first() {
            prefetch(first, 0, AHEAD);
        }
        let row_bytes = row_len * std::mem::size_of::<B::E>();
        for RunChunk { run, rows, j } in RunChunks::new(pages, row_len, PV_ROWS).reader_asks_ahead() {
            // The chunk's rows' worth of bytes ahead (none past the run), for `add_rows` to ask
            // for a row's share at a time (in the first part only).
            let from = rows.start * row_bytes + AHEAD;
            let ahead = (
                (run.as_ptr() as *const u8).wrapping_add(from),
                std::mem::size_of_val(run).saturating_sub(from).min(rows.len() * row_bytes),
            );
            for (h, part) in parts.iter_mut().enumerate() {
                // A local copy the compiler keeps in registers through the chunk (adding into
                // the array in place, it stored every accumulator after every row).
                let mut acc = *part;
                B::add_rows(
                    run.as_ptr().add(rows.start * row_len),
                    rows.len(),
                    p.add(j),
                    lda,
                    n,
                    col(h, 0),
                    part_last(h),
                    if h == 0 { ahead } else { (ahead.0, 0) },
                    &mut acc,
                );
                *part = acc;
            }
        }
        for (h, part) in parts.iter().enumerate() {
            for (r, acc) in part.iter().enumerate() {
                for (v, &x) in acc.iter().enumerate() {
                    _mm512_mask_storeu_ps(o.add(r * n + col(h, v)), lanes(h, v), x);
                }
            }
        }
    }
}

/// One weighted row into the accumulators of [`Elem::add_row`]: `fma(weight(r, v), load(v),
/// acc[r][v])` for every output row r of nonzero weight `w[r]` (`zeros` of them are 0), each
/// value loaded once when no weight is 0.
///
/// # Safety
/// AVX-512 F must be present, and `load` safe to call for every `v < V`.
#[inline(always)]
unsafe fn fma_row<const V: usize, const R: usize>(
    acc: &mut [[__m512; V]; R],
    w: &[f32; R],
    zeros: usize,
    weight: impl Fn(usize, usize) -> __m512,
    load: impl Fn(usize) -> __m512,
) {
    // SAFETY: register operations only, AVX-512 F present (the contract).
    unsafe {
        if zeros == 0 {
            for v in 0..V {
                let x = load(v);
                for r in 0..R {
                    acc[r][v] = _mm512_fmadd_ps(weight(r, v), x, acc[r][v]);
                }
            }
        } else {
            // A row skips its own zero weights only, whatever the rows beside it: adding 0·x
            // could still turn a -0 sum into +0.
            for r in 0..R {
                if w[r] != 0.0 {
                    for v in 0..V {
                        acc[r][v] = _mm512_fmadd_ps(weight(r, v), load(v), acc[r][v]);
                    }
                }
            }
        }
    }
}

// Safe entry points for the table.
pub(crate) fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
    // SAFETY: the AVX-512 table (the only caller) is built only when the CPU reports AVX-512
    // F/BW/VL and VNNI besides the AVX2 tier's features, F16C among them
    // (`KernelTier::is_available`); the kernel stops at the shorter slice.
    unsafe { f16_to_f32_impl(src, dst) }
}
pub(crate) fn f32_to_f16(src: &[f32], dst: &mut [u16]) {
    // SAFETY: AVX-512 tier (see `f16_to_f32`); the kernel stops at the shorter slice.
    unsafe { f32_to_f16_impl(src, dst) }
}
pub(crate) fn round_f16(x: &mut [f32]) {
    // SAFETY: AVX-512 tier (see `f16_to_f32`); one slice, any length.
    unsafe { round_f16_impl(x) }
}
pub(crate) fn gemm_nt(a: &[f32], b: &[f32], k: usize, out: &mut [f32], ldo: usize) {
    // SAFETY: AVX-512 tier (see `f16_to_f32`); the kernel asserts its rows lie in its slices.
    unsafe { gemm_nt_impl::<f32>(a, &[b], k, out, ldo) }
}
pub(crate) fn gemm_nn_acc(a: &[f32], lda: usize, b: &[f32], n: usize, out: &mut [f32]) {
    // SAFETY: AVX-512 tier (see `f16_to_f32`); the kernel asserts its rows lie in its slices.
    unsafe { gemm_nn_acc_impl::<f32>(a, lda, &[b], n, out) }
}
pub(crate) fn gemm_nt_pages(a: &[f32], pages: Pages, k: usize, out: &mut [f32], ldo: usize) {
    match pages {
        // SAFETY: AVX-512 tier (see `f16_to_f32`); the kernel asserts its rows lie in its
        // slices, and `Kernels` checked that every run is whole rows.
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
        // SAFETY: as above (`Kernels` checked that `n` is a multiple of 32, whole blocks).
        Pages::Q8_0(p) => unsafe { gemm_nn_acc_impl::<Q8>(a, lda, p, n, out) },
    }
}
