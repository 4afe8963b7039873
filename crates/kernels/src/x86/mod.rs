//! x86-64 kernels: AVX2 (+FMA, F16C, and AVX-VNNI where present), AVX-512 (F/BW/VL/VNNI) and
//! AMX-INT8, each a file with its own function table. Every function here is only reached
//! through a table that [`Kernels::new`](crate::Kernels::new) hands out after checking the CPU.
//!
//! Shared here: the planar layout of 8-bit activations that the SIMD kernels read. A row of
//! Q8_0/Q8_1 blocks becomes:
//! - `qs`: all quants contiguous (64-byte aligned);
//! - `scales`: one f32 per 32-block; `sums`: the Q8_1 block sum `s` (Q8_0: d·Σa);
//! - `isums`: the exact integer sum Σa of each 32-block, so that kernels which multiply
//!   unsigned weight codes can take the codes' offset off in integers (as the AMX tiles, which
//!   multiply signed values, never have to);
//! - `lut` (for products with 1-bit weights): sums of activations signed by weight bits, as
//!   i16, looked up by the bits. For AVX2's `vpshufb` ([`Lut::Bytes`]): for every 4 values the
//!   16 sums ±a0±a1±a2±a3, split into 16 low bytes and 16 high bytes (32 bytes). For
//!   AVX-512's `vpermw` ([`Lut::Words`]): for every 8 values the 32 sums ±a0..±a4 and the 8
//!   sums ±a5±a6±a7 (80 bytes; see [`fill_lut_words`]). Built here, once, for products of more
//!   than [`OWN_TABLE_ROWS`] tokens; each thread builds its own for fewer (see [`with_tables`]).
//!
//! Q8_K rows take the same layout with one scale and one integer sum per 256-block, in the
//! first slots.

pub(crate) mod amx;
pub(crate) mod avx2;
pub(crate) mod avx512;

use crate::act::{ActFormat, Acts};
use crate::disjoint::DisjointRows;
use crate::formats::{BlockQ8_0, BlockQ8_1, BlockQ8K, blocks, blocks_mut, f32_to_f16};
use crate::pool::Pool;

/// Whether the CPU is Intel's (CPUID vendor "GenuineIntel"): the AVX-512 tier asks for the
/// weights it streams differently there than on AMD (see `avx512::TABLE_INTEL`).
pub(crate) fn is_intel() -> bool {
    static INTEL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *INTEL.get_or_init(|| {
        let id = std::arch::x86_64::__cpuid(0);
        // The vendor string's twelve bytes lie in EBX, EDX, ECX.
        let vendor = [id.ebx, id.edx, id.ecx].map(u32::to_le_bytes);
        vendor.concat() == b"GenuineIntel"
    })
}

/// Offsets inside a planar activation row of `cols` values.
#[derive(Clone, Copy)]
pub(crate) struct Planar {
    pub scales: usize,
    pub sums: usize,
    pub isums: usize,
    pub lut: usize,
    pub row_bytes: usize,
}

impl Planar {
    pub fn new(cols: usize) -> Planar {
        let scales = cols.next_multiple_of(64);
        let sums = scales + (cols / 32) * 4;
        let isums = sums + (cols / 32) * 4;
        let lut = (isums + (cols / 32) * 4).next_multiple_of(64);
        let row_bytes = lut + Lut::Words.len(cols).max(Lut::Bytes.len(cols));
        Planar { scales, sums, isums, lut, row_bytes }
    }
}

/// How far ahead of their reads the products ask for the weights they stream: six blocks of
/// packed Q1_0, about 7 KB.
pub(crate) const PREFETCH_AHEAD: usize = 6 * crate::pack::Q1_GROUP_BLOCK;

/// Ask for the `len` bytes that lie [`PREFETCH_AHEAD`] after `at` to be brought into L2 (past
/// the end of a group or a matrix too: the next rows follow, and a prefetch of an address
/// outside any mapping is dropped, never a fault). Measured on Zen 4, decoding on two threads,
/// tokens alternating between two forms in one process: the 1.7B shape (Q1_0 lookup kernel)
/// went from 72 tokens/s with two blocks ahead into L1 within a group to 101 with this (two
/// ahead into L2: 85; sixteen: 98; into L1 across groups: 75; none: about 80 % of this). The
/// 16-row kernels of unpacked types (`rows16`: TQ2_0, Q2_0, TQ1_0) fetch the next 16 rows
/// instead ([`prefetch_l2`]; TQ2_0 GEMV, two threads, 68 → 150 G weights/s). The 16-row
/// kernels of Q4_0..Q8_0 (`legacy16`) were fastest on Zen 4 with no prefetch at all (SmolLM2
/// 4 %, Gemma 3 270M up to 20 % ahead of this), and on Sapphire Rapids with 8 KiB ahead (SmolLM2
/// +40 %): each tier says which (`legacy16::Ahead`). The K-quant row dots measured the same
/// either way and take none.
///
/// The Q1_0 lookup kernels ask for one line at a time, beside the arithmetic on the line
/// before it, not for a block's 18 lines at once: on Sapphire Rapids the burst left the core
/// waiting and the 1.7B shape's decode at 99 tokens/s; spread, 113 (8B shape 19.7 → 25.4; a
/// 600 MB GEMV on two threads 24 → 30 GB/s, the streaming read of `membw`).
#[inline(always)]
pub(crate) fn prefetch_ahead(at: *const u8, len: usize) {
    prefetch_l2(at.wrapping_add(PREFETCH_AHEAD), len)
}

/// How the Q1_0 lookup kernels of the AVX-512 and AMX tiers ask for the weights they stream.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum LutAhead {
    /// [`prefetch_ahead`]: six blocks ahead into L2 (measured on Zen 4, the `avx512` tier on
    /// AMD CPUs).
    L2,
    /// [`prefetch_ahead_l1`]: nine blocks ahead into L2 and six into L1 (Sapphire Rapids, the
    /// `amx` tier; also the `avx512` tier on Intel CPUs: on a Xeon without AMX, family 6 model
    /// 207, the 8B shape decoded at 22.4–23.0 tokens/s with [`prefetch_ahead`], 23.2–23.8
    /// with this).
    L2AndL1,
}

/// Blocks of packed Q1_0 ahead of the reads that [`prefetch_ahead_l1`] asks for into L2, and
/// into L1.
const L2_BLOCKS: usize = 9;
const L1_BLOCKS: usize = 6;

/// Ask for the `len` bytes that lie [`L2_BLOCKS`] packed Q1_0 blocks after `at` to be brought
/// into L2, and those [`L1_BLOCKS`] after it into L1 (where the first ask has brought them into
/// L2 by then). On Sapphire Rapids, two threads streaming a 1 GiB packed Q1_0 matrix of 2,048
/// columns (`examples/gemv_ab`, alternated with the other form in one process) ran at 32.5–33
/// GB/s with this against 27–29.5 with [`prefetch_ahead`] (4,096 columns: 32.4 against 30–31;
/// 6,144: 33–33.7 against 32.2–32.7), the same window's paced read of the same bytes 35–37.
/// Into L1 alone, six blocks ahead: 30–31; L2 at six and L1 at three: 32; L2 at six and L1 at
/// five: 28 (too close behind the first ask to find the lines in L2 yet).
#[inline(always)]
pub(crate) fn prefetch_ahead_l1(at: *const u8, len: usize) {
    prefetch_l2(at.wrapping_add(L2_BLOCKS * crate::pack::Q1_GROUP_BLOCK), len);
    prefetch_l1(at.wrapping_add(L1_BLOCKS * crate::pack::Q1_GROUP_BLOCK), len);
}

/// Ask for the lines of the `len` bytes at `p` to be brought into L1 (see [`prefetch_ahead`]:
/// any address will do).
#[inline(always)]
pub(crate) fn prefetch_l1(p: *const u8, len: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    for line in (0..len).step_by(64) {
        // SAFETY: SSE is part of x86-64, and a prefetch reads nothing into the program.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line) as *const i8) };
    }
}

/// Ask for the lines of the `len` bytes at `p` to be brought into L2 (see [`prefetch_ahead`]:
/// any address will do).
#[inline(always)]
pub(crate) fn prefetch_l2(p: *const u8, len: usize) {
    use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
    for line in (0..len).step_by(64) {
        // SAFETY: SSE is part of x86-64, and a prefetch reads nothing into the program.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(line) as *const i8) };
    }
}

/// Bytes ahead of the rows being read that the attention products (both x86 tiers) ask for.
/// Runs are a few KiB to a few hundred KiB scattered over the pool: the hardware prefetcher
/// finds the long ones late and the short ones not at all, and decode attention is a stream
/// of them.
pub(crate) const RUN_AHEAD: usize = 4096;

/// Ask for the lines of bytes `from .. to` of a run (cut at its end) to be brought into L2.
#[inline(always)]
pub(crate) fn prefetch_run<E>(run: &[E], from: usize, to: usize) {
    let (from, to) = (from & !63, to.min(std::mem::size_of_val(run)));
    if from < to {
        prefetch_l2((run.as_ptr() as *const u8).wrapping_add(from), to - from);
    }
}

/// The rows of consecutive runs (each whole rows of `row_len` elements) in chunks of at most
/// `step` rows, none spanning two runs: how the attention products of both x86 tiers walk a
/// paged cache. As a run begins, the start of the next one is asked for, and each chunk asks
/// for the [`RUN_AHEAD`] bytes past itself, so that the stream of runs reaches L2 ahead of
/// the reads.
pub(crate) struct RunChunks<'a, E> {
    runs: &'a [&'a [E]],
    row_len: usize,
    step: usize,
    /// The run being cut, its next row, and that row's index over all runs.
    run: usize,
    at: usize,
    j: usize,
    /// Whether each chunk asks for the bytes past itself (else its reader does, spread out).
    ahead: bool,
}

/// Rows `rows` of `run`; the first is row `j` over all runs.
pub(crate) struct RunChunk<'a, E> {
    pub run: &'a [E],
    pub rows: std::ops::Range<usize>,
    pub j: usize,
}

impl<'a, E> RunChunks<'a, E> {
    pub(crate) fn new(runs: &'a [&'a [E]], row_len: usize, step: usize) -> Self {
        assert!(row_len > 0 && step > 0);
        RunChunks { runs, row_len, step, run: 0, at: 0, j: 0, ahead: true }
    }

    /// The same chunks, leaving the bytes past each to its reader (the start of the next run
    /// is still asked for).
    pub(crate) fn reader_asks_ahead(self) -> Self {
        RunChunks { ahead: false, ..self }
    }
}

impl<'a, E> Iterator for RunChunks<'a, E> {
    type Item = RunChunk<'a, E>;

    #[inline(always)]
    fn next(&mut self) -> Option<RunChunk<'a, E>> {
        loop {
            let run = *self.runs.get(self.run)?;
            let rows = run.len() / self.row_len;
            if self.at < rows {
                if self.at == 0
                    && let Some(next) = self.runs.get(self.run + 1)
                {
                    prefetch_run(next, 0, RUN_AHEAD);
                }
                let (start, end) = (self.at, rows.min(self.at + self.step));
                if self.ahead {
                    let row_bytes = self.row_len * std::mem::size_of::<E>();
                    prefetch_run(run, start * row_bytes + RUN_AHEAD, end * row_bytes + RUN_AHEAD);
                }
                let j = self.j;
                self.at = end;
                self.j += end - start;
                return Some(RunChunk { run, rows: start..end, j });
            }
            self.run += 1;
            self.at = 0;
        }
    }
}

/// A planar row, borrowed.
#[derive(Clone, Copy)]
pub(crate) struct PlanarRow<'a> {
    pub qs: &'a [i8],
    pub scales: &'a [f32],
    pub sums: &'a [f32],
    pub isums: &'a [i32],
}

/// A tier's quantizer of 32 values to 8-bit: returns the scale and the sum of the quants.
pub(crate) type Q8Block = unsafe fn(&[f32], &mut [i8; 32]) -> (f32, i32);

/// Quantize a row to Q8_0 blocks, or to Q8_1 blocks (with the scaled sum) when `with_sum`,
/// one 32-value block at a time through `block`. Inlined into each tier's entry point, so that
/// `block` is inlined there with that tier's features.
///
/// # Safety
/// The CPU must have the features `block` needs.
#[inline(always)]
pub(crate) unsafe fn quantize_q8_with(x: &[f32], out: &mut [u8], with_sum: bool, block: Q8Block) {
    if with_sum {
        for (b, xs) in blocks_mut::<BlockQ8_1>(out).iter_mut().zip(x.chunks_exact(32)) {
            // SAFETY: the caller's contract: the features are there.
            let (d, sum) = unsafe { block(xs, &mut b.qs) };
            b.d = f32_to_f16(d).to_le_bytes();
            b.s = f32_to_f16(d * sum as f32).to_le_bytes();
        }
    } else {
        for (b, xs) in blocks_mut::<BlockQ8_0>(out).iter_mut().zip(x.chunks_exact(32)) {
            // SAFETY: the caller's contract: as above.
            b.d = f32_to_f16(unsafe { block(xs, &mut b.qs) }.0).to_le_bytes();
        }
    }
}

/// The AVX2, AVX-512 and AMX tiers' activation format: products with Q1_0 weights take one
/// scale per 128 values (the weights' own block), so that tiles, VNNI products and lookups sum
/// whole blocks in integers before they scale them (on AMX a quarter of the stores and scaling,
/// and full-width tile products; on AVX2 a twelfth of the lookup kernel's float work). Every
/// number of tokens takes the same rounding, so that a token's results do not depend on the
/// tokens that share its batch (every kernel sums the same blocks the same way).
pub(crate) fn q1_batch_format(format: ActFormat, w_tys: &[onebit_gguf::GgmlType], _rows: usize) -> ActFormat {
    let all_q1 = !w_tys.is_empty() && w_tys.iter().all(|&t| t == onebit_gguf::GgmlType::Q1_0);
    if format == ActFormat::Q8_0 && all_q1 { ActFormat::Q8_0x4 } else { format }
}

/// The planar rows of every token of `acts`, made once for a product: made again for every
/// 16-row group and tile of tokens, they were half the time of the AVX2 legacy kernel's loop
/// around its products (3 % of an 8-sequence SmolLM2 decode step on Zen 2; the 64-row groups
/// of the Q1_0 kernels do eight times the work a row made).
pub(crate) fn planar_rows(acts: &Acts) -> Vec<PlanarRow<'_>> {
    (0..acts.rows()).map(|t| planar_row(acts, t)).collect()
}

pub(crate) fn planar_row(acts: &Acts, t: usize) -> PlanarRow<'_> {
    let p = Planar::new(acts.cols());
    let row = acts.aux_row(t);
    let (n, nb) = (acts.cols(), acts.cols() / 32);
    PlanarRow {
        qs: bytemuck::cast_slice(&row[..n]),
        scales: bytemuck::cast_slice(&row[p.scales..p.scales + nb * 4]),
        sums: bytemuck::cast_slice(&row[p.sums..p.sums + nb * 4]),
        isums: bytemuck::cast_slice(&row[p.isums..p.isums + nb * 4]),
    }
}

/// Products of at most this many tokens take lookup tables that each thread builds for itself
/// ([`with_tables`]); larger ones share tables built once in the planar rows.
pub(crate) const OWN_TABLE_ROWS: usize = 2;

/// The lookup tables of every row of some activations: row t's are `len` bytes at
/// `at + t · stride` of `bytes`.
#[derive(Clone, Copy)]
pub(crate) struct Tables<'a> {
    bytes: &'a [u8],
    stride: usize,
    at: usize,
    len: usize,
}

impl<'a> Tables<'a> {
    pub fn row(&self, t: usize) -> &'a [u8] {
        &self.bytes[t * self.stride + self.at..][..self.len]
    }
}

thread_local! {
    /// This thread's own lookup tables of the activations it last multiplied (see
    /// [`with_tables`]): their form, their [`Acts::generation`], and the tables.
    static OWN_TABLES: std::cell::RefCell<(Lut, u64, crate::act::AlignedBuf)> =
        std::cell::RefCell::new((Lut::None, 0, Default::default()));
}

/// Call `f` with the lookup tables of form `lut` of the rows of `acts` (prepared by
/// [`prepare_planar`] asking for `lut`).
///
/// A product of up to [`OWN_TABLE_ROWS`] tokens (decoding) gives each thread its own copy, built
/// the first time the thread takes a share of a product with these activations: a microsecond
/// or two for 2,048 values, while the other threads build theirs. Built once on the calling thread,
/// the tables were a serial step with the other threads waiting, slowed by taking back the
/// lines they had just read, and then read by them from the other core's cache (on two cores
/// of a Zen 4, decoding the Bonsai-1.7B shape: 3 % of the samples and the other thread idle
/// 19 % of its time before; about 5 % more tokens a second after).
pub(crate) fn with_tables<R>(acts: &Acts, lut: Lut, f: impl FnOnce(Tables) -> R) -> R {
    assert!(lut != Lut::None, "with_tables: no form of tables asked for");
    let cols = acts.cols();
    let len = lut.len(cols);
    if acts.rows() > OWN_TABLE_ROWS {
        let p = Planar::new(cols);
        assert!(acts.aux_row_bytes() == p.row_bytes, "lookup tables of rows not laid out");
        return f(Tables { bytes: acts.aux_bytes(), stride: p.row_bytes, at: p.lut, len });
    }
    OWN_TABLES.with_borrow_mut(|(form, generation, tables)| {
        // A fresh thread's form is `None`, which no call asks for: its first call builds.
        if *form != lut || *generation != acts.generation() {
            tables.resize(acts.rows() * len);
            for (t, out) in tables.as_bytes_mut().chunks_exact_mut(len).enumerate() {
                fill_lut(lut, bytemuck::cast_slice(planar_row(acts, t).qs), out, cols);
            }
            (*form, *generation) = (lut, acts.generation());
        }
        f(Tables { bytes: tables.as_bytes(), stride: len, at: 0, len })
    })
}

/// The form of a planar row's 1-bit lookup tables, if it has them (see the module's header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lut {
    None,
    Bytes,
    Words,
}

impl Lut {
    /// Bytes of the tables of a row of `cols` values.
    pub(crate) fn len(self, cols: usize) -> usize {
        match self {
            Lut::None => 0,
            Lut::Bytes => cols / 4 * 32,
            Lut::Words => cols / 8 * WORD_TABLES_PER_8,
        }
    }
}

/// Bytes of [`Lut::Words`] tables per 8 values: 32 words for values 0-4, 8 for values 5-7.
const WORD_TABLES_PER_8: usize = 80;

/// The word tables of a 128-value block: the 16 groups' 32-word tables (64 bytes each), then
/// their 8-word tables (16 bytes each).
pub(crate) const WORD_TABLES_BLOCK: usize = 16 * WORD_TABLES_PER_8;
/// Where a block's 8-word tables start, inside its [`WORD_TABLES_BLOCK`] bytes.
pub(crate) const WORD_TABLES_HIGH: usize = 16 * 64;

/// Build the planar layout for 8-bit activations (rows in parallel when there are many), with
/// the 1-bit lookup tables of the form `lut` when the tokens are many enough to share them
/// (see [`with_tables`]). `extra` bytes are reserved after the rows for a tier's own use.
pub(crate) fn prepare_planar(pool: &Pool, acts: &mut Acts, lut: Lut, extra: usize) {
    let format = acts.format();
    if format == ActFormat::F32 {
        return;
    }
    let (rows, cols, rb) = (acts.rows(), acts.cols(), acts.row_bytes());
    let lut = if format == ActFormat::Q8K || rows <= OWN_TABLE_ROWS { Lut::None } else { lut };
    let p = Planar::new(cols);
    let (src, aux) = acts.reset_aux(p.row_bytes, extra);
    // The lookup tables take eight bytes per value (ten as words, counted as eight here), the
    // rest of the layout about one.
    let serial = rows * cols * if lut == Lut::None { 1 } else { 8 } < crate::table::SERIAL_VALUES;
    if serial {
        let used = if lut == Lut::None { p.lut } else { p.row_bytes };
        // This thread alone reads and writes lines that the other threads may hold (it has
        // just quantized the rows, or they read the last product's rows): asked for all at
        // once, they arrive together instead of one line's latency after another (that loop
        // was 6 % of an 8-sequence SmolLM2 decode step, on two cores of a Zen 4).
        crate::prefetch(&src[..rows * rb]);
        for row in aux.chunks(p.row_bytes).take(rows) {
            prefetch_to_own(&row[..used]);
        }
    }
    let out = DisjointRows::new(aux, p.row_bytes);
    let fill = |t: usize| {
        // SAFETY: each row index is handed to one thread (the pool's chunks, or this thread).
        let row = unsafe { out.row(t) };
        // SAFETY: every x86 SIMD tier requires AVX2 and F16C.
        unsafe { fill_planar_row(format, &src[t * rb..(t + 1) * rb], row, &p, cols) };
        let (qs, rest) = row.split_at_mut(p.lut);
        fill_lut(lut, qs, &mut rest[..lut.len(cols)], cols);
    };
    if serial {
        (0..rows).for_each(fill);
    } else {
        pool.for_chunks(rows, 4, &|_, r| r.for_each(fill));
    }
}

/// Ask for the cache lines of `bytes` to own, ahead of writing them: like [`crate::prefetch`],
/// but a line another core holds is taken from it at once, not shared first and then claimed.
fn prefetch_to_own(bytes: &[u8]) {
    for line in bytes.chunks(64) {
        // SAFETY: `prefetchw` is a hint: it reads nothing into registers, writes nothing, and
        // cannot fault; the address lies in `bytes` anyway. CPUs without it decode it as a NOP.
        unsafe {
            std::arch::asm!("prefetchw [{}]", in(reg) line.as_ptr(), options(nostack, preserves_flags, readonly))
        };
    }
}

/// The lookup tables of the `cols` quants `qs` in the form `lut` (see the module's header), into
/// `out` (`lut.len(cols)` bytes).
fn fill_lut(lut: Lut, qs: &[u8], out: &mut [u8], cols: usize) {
    assert!(qs.len() >= cols && out.len() == lut.len(cols), "lookup tables of {cols} values");
    match lut {
        Lut::None => {}
        // SAFETY: every x86 SIMD tier requires AVX2.
        Lut::Bytes => unsafe { fill_lut_avx2(qs, out) },
        // SAFETY: only the AVX-512 and AMX tiers, which require these features, ask for words.
        Lut::Words => unsafe { fill_lut_words(qs, out, cols) },
    }
}

/// The sums Σ_i ±a_i of the `n` quants of `qs` from `at` (bit i of the index set: +a_i).
#[cfg_attr(not(test), allow(dead_code))]
fn signed_sums(qs: &[u8], at: usize, n: usize) -> Vec<i16> {
    (0..1usize << n)
        .map(|v| (0..n).map(|i| if v >> i & 1 == 1 { 1 } else { -1 } * (qs[at + i] as i8 as i16)).sum())
        .collect()
}

/// The scalar form of the tables (the reference the vector forms are tested against).
#[cfg_attr(not(test), allow(dead_code))]
fn fill_lut_ref(lut: Lut, qs: &[u8], tables: &mut [u8]) {
    match lut {
        Lut::None => {}
        Lut::Bytes => {
            for (g, out) in tables.chunks_exact_mut(32).enumerate() {
                for (v, x) in signed_sums(qs, 4 * g, 4).into_iter().enumerate() {
                    (out[v], out[16 + v]) = (x as u8, (x >> 8) as u8);
                }
            }
        }
        Lut::Words => {
            for (b, block) in tables.chunks_exact_mut(WORD_TABLES_BLOCK).enumerate() {
                let (low, high) = block.split_at_mut(WORD_TABLES_HIGH);
                for v in 0..16 {
                    let at = 128 * b + 8 * v;
                    let words = signed_sums(qs, at, 5).into_iter().chain(signed_sums(qs, at + 5, 3));
                    let out = low[64 * v..64 * v + 64]
                        .chunks_exact_mut(2)
                        .chain(high[16 * v..16 * v + 16].chunks_exact_mut(2));
                    for (o, x) in out.zip(words) {
                        o.copy_from_slice(&x.to_le_bytes());
                    }
                }
            }
        }
    }
}

/// The same tables with AVX2: the 16 sums as i16 lanes, then the low and high bytes gathered.
/// `lut` is 32 bytes per 4 values of `qs`.
///
/// Lane v's sum is made by two `vpmaddubsw`, of the pairs (a0, a1) and (a2, a3) by their signs
/// in v: the values offset by 128 to be unsigned (Σ ±(a_i + 128) is the sum plus 128 · Σ ±1,
/// which a constant per lane takes back off). Each value broadcast, masked and added by itself
/// took nearly three times as long (2,048 values on Zen 2: 2.07 → 0.74 µs), and every thread
/// builds its own tables for each one-token product (2 % of a 1.7B-shape decode token).
#[target_feature(enable = "avx2")]
unsafe fn fill_lut_avx2(qs: &[u8], lut: &mut [u8]) {
    use std::arch::x86_64::*;
    /// Lane v's sign bytes for the pairs (a0, a1) (`[0]`) and (a2, a3) (`[1]`): +1 where bit i
    /// of v is set, else −1.
    const SIGNS: [[i8; 32]; 2] = {
        let mut s = [[0i8; 32]; 2];
        let mut v = 0;
        while v < 16 {
            let mut i = 0;
            while i < 4 {
                s[i / 2][2 * v + i % 2] = if v >> i & 1 == 1 { 1 } else { -1 };
                i += 1;
            }
            v += 1;
        }
        s
    };
    /// What the offset adds to lane v: 128 · Σ_i ±1 = 128 · (2 · popcount(v) − 4).
    const OFFSET: [i16; 16] = {
        let mut o = [0i16; 16];
        let mut v = 0;
        while v < 16 {
            o[v] = 128 * (2 * (v as u32).count_ones() as i16 - 4);
            v += 1;
        }
        o
    };
    // SAFETY: both rows of SIGNS and OFFSET are 32 bytes.
    let (s01, s23, offset) = unsafe {
        (
            _mm256_loadu_si256(SIGNS[0].as_ptr() as *const __m256i),
            _mm256_loadu_si256(SIGNS[1].as_ptr() as *const __m256i),
            _mm256_loadu_si256(OFFSET.as_ptr() as *const __m256i),
        )
    };
    let flip = _mm256_set1_epi8(-128);
    // The pair (a0, a1), or (a2, a3), in every 16-bit lane.
    let pair01 = _mm256_set1_epi16(0x0100);
    let pair23 = _mm256_set1_epi16(0x0302);
    // Per 128-bit lane: the low bytes of its 8 entries, then the high bytes.
    let split = _mm256_setr_epi8(
        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
    );
    let groups = lut.len() / 32;
    assert!(qs.len() >= 4 * groups, "lookup tables of {} values from {}", 4 * groups, qs.len());
    for (g, out) in lut.chunks_exact_mut(32).enumerate() {
        // SAFETY: 4g + 4 <= 4 · groups <= qs.len() (asserted above).
        let four = unsafe { _mm256_broadcastd_epi32(_mm_loadu_si32(qs.as_ptr().add(4 * g))) };
        let u = _mm256_xor_si256(four, flip);
        let sums = _mm256_add_epi16(
            _mm256_maddubs_epi16(_mm256_shuffle_epi8(u, pair01), s01),
            _mm256_maddubs_epi16(_mm256_shuffle_epi8(u, pair23), s23),
        );
        let t = _mm256_sub_epi16(sums, offset);
        // [lo 0-7, hi 0-7 | lo 8-15, hi 8-15] -> [lo 0-15 | hi 0-15]
        let bytes = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(t, split));
        // SAFETY: `out` is 32 bytes.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, bytes) };
    }
}

/// The tables as words (see the module's header), for every 8 values `a0..a7`: the 32 sums
/// ±a0..±a4 (`T1`, indexed by a weight byte's bits 0-4) and the 8 sums ±a5±a6±a7 (`T2`, by its
/// bits 5-7), so that the lookup kernel indexes them by shifts alone: `vpermw` reads only the low
/// five bits of an index, and `T2`, broadcast to four copies, ignores bits 3 and 4.
///
/// Both come from the 4-value tables `L` (of a0..a3) and `H` (of a4..a7), built by `vpdpbusd`,
/// sixteen groups of four values per 64 quants loaded: lane v of
/// `Σ_i (a_i + 128)·s_i(v) − 128·Σ_i s_i(v)`, with `s_i(v) = ±1` by bit i of v, is entry v of
/// a group whose four bytes (biased to unsigned) fill every lane. Then `T1(v) = L(v mod 16) ± a4`
/// (+ where bit 4 of v is set) and `T2(u) = (H(2u) + H(2u + 1)) / 2`, exact in integers. `qs`
/// are a row's `cols` quants (a multiple of 128), `lut` its `Lut::Words.len(cols)` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn fill_lut_words(qs: &[u8], lut: &mut [u8], cols: usize) {
    use std::arch::x86_64::*;
    assert!(cols.is_multiple_of(128), "word tables of {cols} values");
    assert!(qs.len() >= cols && lut.len() == Lut::Words.len(cols), "lookup tables of {cols} values");
    // Lane v: the signs s_i(v) as bytes, and −128·Σ_i s_i(v).
    const SIGNS: [i8; 64] = {
        let mut s = [0i8; 64];
        let mut k = 0;
        while k < 64 {
            s[k] = if (k / 4) >> (k % 4) & 1 == 1 { 1 } else { -1 };
            k += 1;
        }
        s
    };
    const BIAS: [i32; 16] = {
        let mut b = [0i32; 16];
        let mut v = 0;
        while v < 16 {
            b[v] = -128 * (2 * (v as u32).count_ones() as i32 - 4);
            v += 1;
        }
        b
    };
    // Word picks from [L | H]: L twice; H's even entries; H's odd entries.
    const PICKS: [[u16; 32]; 3] = {
        let mut p = [[0u16; 32]; 3];
        let mut i = 0;
        while i < 32 {
            p[0][i] = (i % 16) as u16;
            p[1][i] = (16 + 2 * (i % 8)) as u16;
            p[2][i] = (17 + 2 * (i % 8)) as u16;
            i += 1;
        }
        p
    };
    // SAFETY: every constant is 64 bytes.
    let (signs, bias) =
        unsafe { (_mm512_loadu_si512(SIGNS.as_ptr() as *const _), _mm512_loadu_si512(BIAS.as_ptr() as *const _)) };
    // SAFETY: as above.
    let picks = PICKS.map(|p| unsafe { _mm512_loadu_si512(p.as_ptr() as *const _) });
    let flip = _mm512_set1_epi8(-128);
    // Qwords of `vpackssdw`'s result back in order: its 128-bit lane i holds words 4i .. 4i + 4
    // of its first operand, then of its second.
    // SAFETY: 8 i64.
    let order = unsafe { _mm512_loadu_si512([0i64, 2, 4, 6, 1, 3, 5, 7].as_ptr() as *const _) };
    let group = |g: usize, x: __m512i| {
        _mm512_dpbusd_epi32(bias, _mm512_permutexvar_epi32(_mm512_set1_epi32(g as i32), x), signs)
    };
    for c in 0..cols / 64 {
        // SAFETY: values 64c .. 64c + 64 are inside the row's `cols` quants.
        let x = unsafe { _mm512_xor_si512(_mm512_loadu_si512(qs.as_ptr().add(64 * c) as *const _), flip) };
        for p in 0..8 {
            // [L | H] of the 8 values 8g .. 8g + 8, packed to words in registers (a narrowing
            // store, `vpmovdw` to memory, takes many cycles on Zen 4).
            let lh = _mm512_permutexvar_epi64(order, _mm512_packs_epi32(group(2 * p, x), group(2 * p + 1, x)));
            let g = 8 * c + p;
            let a4 = _mm512_set1_epi16(qs[8 * g + 4] as i8 as i16);
            let l = _mm512_permutexvar_epi16(picks[0], lh);
            let t1 = _mm512_mask_add_epi16(_mm512_sub_epi16(l, a4), 0xffff_0000, l, a4);
            let h = _mm512_add_epi16(_mm512_permutexvar_epi16(picks[1], lh), _mm512_permutexvar_epi16(picks[2], lh));
            let t2 = _mm512_castsi512_si128(_mm512_srai_epi16::<1>(h));
            let block = &mut lut[(g / 16) * WORD_TABLES_BLOCK..][..WORD_TABLES_BLOCK];
            let v = g % 16;
            // SAFETY: 64 bytes at 64v and 16 at WORD_TABLES_HIGH + 16v lie inside the block.
            unsafe {
                _mm512_storeu_si512(block.as_mut_ptr().add(64 * v) as *mut _, t1);
                _mm_storeu_si128(block.as_mut_ptr().add(WORD_TABLES_HIGH + 16 * v) as *mut _, t2);
            }
        }
    }
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn fill_planar_row(format: ActFormat, blocks_in: &[u8], out: &mut [u8], p: &Planar, cols: usize) {
    use std::arch::x86_64::*;
    let nb = cols / 32;
    let (qs, rest) = out[..p.isums + 4 * nb].split_at_mut(p.scales);
    let (scales, rest) = rest.split_at_mut(p.sums - p.scales);
    let (sums, isums) = rest.split_at_mut(p.isums - p.sums);
    let (scales, sums): (&mut [f32], &mut [f32]) = (bytemuck::cast_slice_mut(scales), bytemuck::cast_slice_mut(sums));
    let isums: &mut [i32] = bytemuck::cast_slice_mut(isums);
    if format == ActFormat::Q8K {
        // One scale and one sum per 256 values, in the first slots.
        for (i, b) in blocks::<BlockQ8K>(blocks_in)[..cols / 256].iter().enumerate() {
            qs[256 * i..256 * (i + 1)].copy_from_slice(bytemuck::cast_slice(&b.qs));
            scales[i] = b.d;
            isums[i] = b.bsums.iter().map(|&s| s as i32).sum();
        }
        return;
    }
    let half = |h: [u8; 2]| _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes(h) as i32)));
    let mut fill = |i: usize, q: &[i8; 32], d: f32, s: Option<f32>| {
        // SAFETY: `q` is 32 bytes, and `qs` holds `cols` quants, 32 of them block `i`'s.
        let isum = unsafe {
            let q = _mm256_loadu_si256(q.as_ptr() as *const __m256i);
            _mm256_storeu_si256(qs.as_mut_ptr().add(32 * i) as *mut __m256i, q);
            // Σ q = Σ (q + 128) − 32 · 128, the biased bytes summed by `vpsadbw` against zero.
            let sums = _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8(-128)), _mm256_setzero_si256());
            let s = _mm_add_epi64(_mm256_castsi256_si128(sums), _mm256_extracti128_si256::<1>(sums));
            (_mm_cvtsi128_si64(s) + _mm_extract_epi64::<1>(s)) as i32 - 32 * 128
        };
        scales[i] = d;
        sums[i] = s.unwrap_or(d * isum as f32);
        isums[i] = isum;
    };
    match format {
        ActFormat::Q8_0 | ActFormat::Q8_0x4 => {
            for (i, b) in blocks::<BlockQ8_0>(blocks_in)[..nb].iter().enumerate() {
                fill(i, &b.qs, half(b.d), None);
            }
        }
        _ => {
            for (i, b) in blocks::<BlockQ8_1>(blocks_in)[..nb].iter().enumerate() {
                fill(i, &b.qs, half(b.d), Some(half(b.s)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "SIMD code: Miri interprets no vector intrinsics")]
    fn lookup_tables_match_the_reference() {
        // Whole and partial runs of 64 values; every byte value, −128 included.
        for cols in [32, 96, 128, 256, 288, 384, 2080, 2176] {
            let qs: Vec<u8> = (0..cols).map(|i| ((i * 37 + 11) % 256) as u8).collect();
            let mut bytes = vec![0u8; Lut::Bytes.len(cols)];
            fill_lut_ref(Lut::Bytes, &qs, &mut bytes);
            let mut avx2 = vec![0u8; bytes.len()];
            // SAFETY: every x86 machine that runs these tests has AVX2.
            unsafe { fill_lut_avx2(&qs, &mut avx2) };
            assert_eq!(avx2, bytes, "avx2, {cols} values");
            if cols % 128 == 0
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
            {
                let mut words = vec![0u8; Lut::Words.len(cols)];
                fill_lut_ref(Lut::Words, &qs, &mut words);
                let mut avx512 = vec![0u8; words.len()];
                // SAFETY: just checked.
                unsafe { fill_lut_words(&qs, &mut avx512, cols) };
                assert_eq!(avx512, words, "avx512, {cols} values");
            }
        }
    }
}
