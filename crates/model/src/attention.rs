//! Causal attention over each sequence's cached keys and values, read through its block table.
//!
//! The work is cut into units of one sequence, one kv head and a run of up to ~64 queries (a
//! few of that sequence's batch tokens times the query heads that share the kv head). A unit
//! widens its cached keys to f32 one run of rows at a time (gathered from the pool's blocks
//! where they lie), takes the scores of all its queries against the run in one product, then
//! softmaxes every query over its own causal range and sums the value rows the same way. Each
//! cached row is thus read and widened once per unit rather than once per query.
//!
//! A query's result does not depend on the unit it falls in: the block products give each
//! output row the same arithmetic whatever the other rows, and runs of rows always start at
//! multiples of [`ROW_BLOCK`].
//!
//! A sliding-window layer's query at position q sees only positions q − window + 1 ..= q: a unit
//! reads its rows from the window's start of its first query (rounded down to a run of rows),
//! so rows that left every window of the unit are neither read nor scored.
//!
//! Like llama.cpp without flash attention, products with an f16 cache are taken at f16
//! precision: q is rounded to f16 before q·k, and the softmax weights before they scale v.
//! With a Q8_0 cache, as llama.cpp does, q is rounded to Q8_0 and q·k taken in integers.

use onebit_gguf::GgmlType;
use onebit_kernels::formats::dequantize;
use onebit_kernels::{DisjointRows, Kernels, Pages, PerThread, Pool};

use crate::config::Config;
use crate::kv_cache::{BLOCK_TOKENS, KvPool, KvRow, KvType, SUPER_BLOCKS};

/// Queries per unit to aim for (tokens × heads of a group).
const UNIT_QUERIES: usize = 64;
/// Units with fewer queries than this read the cache where it lies rather than widening it.
const DIRECT_QUERIES: usize = 16;
/// Cached rows widened at a time (a multiple of the pool's block).
pub(crate) const ROW_BLOCK: usize = 64;
const _: () = assert!(ROW_BLOCK.is_multiple_of(BLOCK_TOKENS));

/// Per-thread buffers.
#[derive(Default)]
pub struct AttnScratch {
    q: Vec<f32>,
    /// The queries rounded to Q8_0, for a Q8_0 cache.
    q8: Vec<u8>,
    scores: Vec<f32>,
    rows: Vec<f32>,
    out: Vec<f32>,
}

/// One sequence, one kv head, batch tokens `t0..t1` (all of that sequence).
#[derive(Clone, Copy)]
struct Unit {
    seq: usize,
    group: usize,
    t0: usize,
    t1: usize,
}

/// Where the attention of layer `l` reads and writes.
pub(crate) struct Attention<'a> {
    pub config: &'a Config,
    pub kernels: Kernels,
    pub layer: usize,
    /// The sliding window of this layer, if it has one.
    pub window: Option<usize>,
    pub kv: &'a KvPool,
    /// Per sequence of the batch: its block table.
    pub tables: &'a [&'a [u32]],
    /// Per batch token: (sequence, position).
    pub where_: &'a [(usize, usize)],
}

impl Attention<'_> {
    /// Read every token's queries (`n_heads × head_dim` per token) from `q` and write its
    /// attention output (`n_heads × value_dim`) into `out`, or over its queries in `q` when
    /// `out` is `None` (heads of q and v must then be equally wide: every unit overwrites
    /// exactly the queries it read, after reading them, and no other unit reads them).
    pub fn run(&self, pool: &Pool, scratch: &PerThread<AttnScratch>, q: &mut [f32], out: Option<&mut [f32]>) {
        let c = self.config;
        assert!(out.is_some() || c.head_dim == c.value_dim, "attention in place needs equal head widths");
        let units = self.units();
        // One row per (token, head): units read and write disjoint sets of them.
        let q = DisjointRows::new(q, c.head_dim);
        let out = out.map_or(q, |o| DisjointRows::new(o, c.value_dim));
        pool.for_chunks(units.len(), 1, &|tid, range| {
            // SAFETY: `tid` is this thread's own index in the running job.
            let sc = unsafe { scratch.get(tid) };
            for u in range {
                self.unit(units[u], sc, &q, &out);
            }
        });
    }

    /// Units, longest first so that the dynamic split ends evenly.
    fn units(&self) -> Vec<Unit> {
        let c = self.config;
        let per_unit = (UNIT_QUERIES / c.group()).max(1);
        let mut units = Vec::new();
        let mut t0 = 0;
        while t0 < self.where_.len() {
            let seq = self.where_[t0].0;
            let mut t1 = t0;
            while t1 < self.where_.len() && self.where_[t1].0 == seq && t1 - t0 < per_unit {
                t1 += 1;
            }
            units.extend((0..c.n_kv_heads).map(|group| Unit { seq, group, t0, t1 }));
            t0 = t1;
        }
        units.sort_by_key(|u| std::cmp::Reverse(self.where_[u.t1 - 1].1));
        units
    }

    fn unit(&self, u: Unit, sc: &mut AttnScratch, q: &DisjointRows<f32>, out: &DisjointRows<f32>) {
        let c = self.config;
        let (d, dv, gsize) = (c.head_dim, c.value_dim, c.group());
        let nq = (u.t1 - u.t0) * gsize;
        let seen_all = self.where_[u.t1 - 1].1 + 1;
        let table = self.tables[u.seq];
        let f16 = self.kv.kv_type() == KvType::F16;

        // Queries, token-major: query (t - t0) · gsize + i is head group · gsize + i of token t.
        sc.q.resize(nq * d, 0.0);
        for t in u.t0..u.t1 {
            for i in 0..gsize {
                let h = u.group * gsize + i;
                let dst = &mut sc.q[((t - u.t0) * gsize + i) * d..][..d];
                // SAFETY: this unit alone reads and writes the heads of `group` of its tokens
                // (rows t · n_heads + h), and writes them only at its end, after this read.
                dst.copy_from_slice(unsafe { q.row(t * c.n_heads + h) });
                if f16 {
                    self.kernels.round_f16(dst);
                }
            }
        }

        // Rows from the first one any query of the unit sees (the first token's is the
        // earliest), in whole runs of rows: each query's row of scores spans `first .. seen_all`.
        let first = window_reads_from(self.window, self.where_[u.t0].1);
        let span = seen_all - first;
        sc.scores.resize(nq * span, 0.0);
        sc.rows.resize(ROW_BLOCK * d.max(dv), 0.0);
        // Few queries read each cached row once or twice: products read the blocks where they
        // lie (widening halves in the register). Many queries share a widened copy. Either way
        // every score gets the same bits.
        let direct = nq < DIRECT_QUERIES;
        if self.kv.kv_type() == KvType::Q8_0 {
            // As llama.cpp does for such a cache: queries rounded to Q8_0, integer dots. The
            // keys are read where they lie whatever the unit's size, so that a query's scores
            // do not depend on it.
            sc.q8.resize(nq * d / 32 * 34, 0);
            self.kernels.quantize_q8_0(&sc.q, &mut sc.q8);
            let pages = self.pages(table, first..seen_all, false, u.group);
            self.kernels.scores_q8_0(&sc.q8, &pages.q8, d, &mut sc.scores, span);
        } else if direct {
            let pages = self.pages(table, first..seen_all, false, u.group);
            self.kernels.gemm_nt_pages(&sc.q, pages.as_pages(), d, &mut sc.scores, span);
        } else {
            for j0 in (first..seen_all).step_by(ROW_BLOCK) {
                let n = (seen_all - j0).min(ROW_BLOCK);
                let rows = &mut sc.rows[..n * d];
                self.gather(table, j0, d, rows, |b| self.kv.keys(self.layer, b, u.group));
                self.kernels.gemm_nt(&sc.q, rows, d, &mut sc.scores[j0 - first..], span);
            }
        }

        let scale = c.attn_scale;
        for qi in 0..nq {
            let pos = self.where_[u.t0 + qi / gsize].1;
            let (lo, hi) = (first_seen(self.window, pos) - first, pos + 1 - first);
            let row = &mut sc.scores[qi * span..(qi + 1) * span];
            row[lo..hi].iter_mut().for_each(|s| *s *= scale);
            self.kernels.softmax(&mut row[lo..hi]);
            row[..lo].fill(0.0);
            row[hi..].fill(0.0);
            if f16 {
                self.kernels.round_f16(&mut row[lo..hi]);
            }
        }

        sc.out.clear();
        sc.out.resize(nq * dv, 0.0);
        if direct {
            let pages = self.pages(table, first..seen_all, true, u.group);
            self.kernels.gemm_nn_acc_pages(&sc.scores, span, pages.as_pages(), dv, &mut sc.out);
        } else {
            for j0 in (first..seen_all).step_by(ROW_BLOCK) {
                let n = (seen_all - j0).min(ROW_BLOCK);
                let rows = &mut sc.rows[..n * dv];
                self.gather(table, j0, dv, rows, |b| self.kv.values(self.layer, b, u.group));
                self.kernels.gemm_nn_acc(&sc.scores[j0 - first..], span, rows, dv, &mut sc.out);
            }
        }

        for t in u.t0..u.t1 {
            for i in 0..gsize {
                let h = u.group * gsize + i;
                let src = &sc.out[((t - u.t0) * gsize + i) * dv..][..dv];
                // SAFETY: unit (sequence, group, tokens) alone writes heads of `group` for
                // these tokens (rows t · n_heads + h); its reads of them are done.
                unsafe { out.row(t * c.n_heads + h) }.copy_from_slice(src);
            }
        }
    }
}

/// The first cached position a query at `pos` reads through a sliding window of `window`:
/// the window's start, rounded down to a run of rows (0 without a window). A sequence whose next
/// position is `pos` never reads a row below it again.
pub fn window_reads_from(window: Option<usize>, pos: usize) -> usize {
    first_seen(window, pos) / ROW_BLOCK * ROW_BLOCK
}

/// The first position the query at `pos` sees: 0, or the start of its sliding window of
/// `window` (llama.cpp masks key p for query q when q − p ≥ window).
fn first_seen(window: Option<usize>, pos: usize) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

impl Attention<'_> {
    /// A sequence's rows `range` (keys or values of kv head `head`; the range starts on a
    /// block) as runs where they lie: blocks that follow each other in the table and in the
    /// pool (within a superblock) make one run.
    fn pages(&self, table: &[u32], range: std::ops::Range<usize>, values: bool, head: usize) -> Runs<'_> {
        let c = self.config;
        let width = if values { c.value_dim } else { c.head_dim };
        debug_assert!(range.start.is_multiple_of(BLOCK_TOKENS));
        let n = range.len();
        let blocks = &table[range.start / BLOCK_TOKENS..range.end.div_ceil(BLOCK_TOKENS)];
        let mut runs = Runs::default();
        let mut i = 0;
        while i < blocks.len() {
            let first = blocks[i] as usize;
            let mut m = 1;
            while i + m < blocks.len()
                && blocks[i + m] as usize == first + m
                && !(first + m).is_multiple_of(SUPER_BLOCKS)
            {
                m += 1;
            }
            let len = (n - i * BLOCK_TOKENS).min(m * BLOCK_TOKENS) * width;
            match self.kv.run(self.layer, values, first, m, head) {
                KvRow::F16(v) => runs.f16.push(&v[..len]),
                KvRow::F32(v) => runs.f32.push(&v[..len]),
                KvRow::Q8_0(v) => runs.q8.push(&v[..len / 32 * 34]),
            }
            i += m;
        }
        runs
    }

    /// Rows `j0 .. j0 + dst.len() / width` of a sequence (keys or values of one head, as
    /// `page` gives them for a block), widened to f32 into `dst`.
    fn gather<'k>(&self, table: &[u32], j0: usize, width: usize, dst: &mut [f32], page: impl Fn(usize) -> KvRow<'k>) {
        let n = dst.len() / width;
        let mut j = j0;
        while j < j0 + n {
            let slot = j % BLOCK_TOKENS;
            let take = (BLOCK_TOKENS - slot).min(j0 + n - j);
            let out = &mut dst[(j - j0) * width..(j - j0 + take) * width];
            widen(self.kernels, page(table[j / BLOCK_TOKENS] as usize), slot * width, out);
            j += take;
        }
    }
}

/// Cached values `at .. at + dst.len()` (counted in values) of a run of rows, as f32.
fn widen(kernels: Kernels, rows: KvRow, at: usize, dst: &mut [f32]) {
    match rows {
        KvRow::F16(v) => kernels.f16_to_f32(&v[at..at + dst.len()], dst),
        KvRow::F32(v) => dst.copy_from_slice(&v[at..at + dst.len()]),
        KvRow::Q8_0(v) => {
            let bytes = &v[at / 32 * 34..(at + dst.len()) / 32 * 34];
            dequantize(GgmlType::Q8_0, bytes, dst).expect("whole Q8_0 blocks of a checked cache");
        }
    }
}

/// Runs of cached rows of one kind (the other lists stay empty).
#[derive(Default)]
struct Runs<'k> {
    f16: Vec<&'k [u16]>,
    f32: Vec<&'k [f32]>,
    q8: Vec<&'k [u8]>,
}

impl Runs<'_> {
    fn as_pages(&self) -> Pages<'_> {
        if !self.f16.is_empty() {
            Pages::F16(&self.f16)
        } else if !self.q8.is_empty() {
            Pages::Q8_0(&self.q8)
        } else {
            Pages::F32(&self.f32)
        }
    }
}
