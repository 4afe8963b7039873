//! A sequence's block tables, and the managers of the blocks behind them: one for the pool's
//! blocks, and for a split pool (a model with sliding-window layers, see
//! [`onebit_model::KvPool::new_split`]) a second one for the blocks of the window layers.
//!
//! A window table runs beside the main one, entry for entry. As the sequence advances, its
//! blocks below what the window layers still read ([`onebit_model::Config::window_reads_from`])
//! are given back, [`NO_BLOCK`] in their place: a sequence holds a window's worth of them
//! however long its context. A full window block is cached under the content node of the main
//! block at its place, and a prefix found in the cache is taken only as far as the window
//! blocks its next token reads are cached too.

use onebit_model::{BLOCK_TOKENS, LoraUse, NO_BLOCK, window_reads_from};

use super::{BlockCounts, BlockManager};

/// A sequence's blocks and its place in the prefix cache.
#[derive(Debug, Default)]
pub(crate) struct Table {
    /// Block `i` holds positions `i · BLOCK_TOKENS ..` (of every layer, or in a split pool of
    /// the global ones).
    pub full: Vec<u32>,
    /// In a split pool: the window layers' blocks, as many entries as `full`.
    pub window: Option<Vec<u32>>,
    /// Leading window entries given back.
    window_from: usize,
    /// Leading blocks that are in the prefix cache, and the content node of the last of them
    /// (`root` before the first).
    pub n_registered: usize,
    pub chain: u64,
    /// The prefix cache's root for the sequence's adapters: blocks computed with other
    /// adapters hold other values.
    pub root: u64,
}

impl Table {
    /// Positions its blocks hold.
    pub fn capacity(&self) -> usize {
        self.full.len() * BLOCK_TOKENS
    }

    /// Blocks it lacks to hold `positions` positions.
    pub fn need(&self, positions: usize) -> usize {
        positions.div_ceil(BLOCK_TOKENS).saturating_sub(self.full.len())
    }

    pub fn is_empty(&self) -> bool {
        self.full.is_empty()
    }
}

/// A cached prefix found for a prompt, not yet taken.
pub(crate) struct Found {
    root: u64,
    /// (block, content node) of each whole block found.
    full: Vec<(u32, u64)>,
    /// In a split pool: the window blocks the prefix's next token reads ([`NO_BLOCK`] below).
    window: Option<Vec<u32>>,
}

impl Found {
    /// Blocks found (the prompt's positions they hold, over `BLOCK_TOKENS`).
    pub fn len(&self) -> usize {
        self.full.len()
    }
}

/// The window layers' blocks of a split pool.
struct WindowBlocks {
    blocks: BlockManager<u64>,
    /// The most blocks one sequence holds at once.
    per_seq: usize,
    window: usize,
}

impl WindowBlocks {
    /// The first block the window layers still read when the next position is `pos`.
    fn first_read(&self, pos: usize) -> usize {
        window_reads_from(Some(self.window), pos) / BLOCK_TOKENS
    }
}

/// The states of a pool's blocks (see [`BlockManager`]) and of its window blocks if split.
pub(crate) struct KvBlocks {
    full: BlockManager,
    window: Option<WindowBlocks>,
}

/// A split pool's window part: how many blocks, the most one sequence holds at once, and the
/// model's sliding window.
pub(crate) struct WindowPart {
    pub n_blocks: usize,
    pub per_seq: usize,
    pub window: usize,
}

impl KvBlocks {
    pub fn new(n_blocks: usize, window: Option<WindowPart>) -> KvBlocks {
        KvBlocks {
            full: BlockManager::new(n_blocks, BLOCK_TOKENS),
            window: window.map(|w| WindowBlocks {
                blocks: BlockManager::new(w.n_blocks, BLOCK_TOKENS),
                per_seq: w.per_seq,
                window: w.window,
            }),
        }
    }

    /// Blocks that can be added to every table now (free, or cached and evictable).
    pub fn available(&self) -> usize {
        let window = self.window.as_ref().map_or(usize::MAX, |w| w.blocks.available());
        self.full.available().min(window)
    }

    /// The longest cached prefix of `tokens` (computed with adapters `lora`), at most
    /// `max_blocks` whole blocks, whose next token's window blocks are cached too.
    pub fn find(&mut self, lora: &[LoraUse], tokens: &[u32], max_blocks: usize) -> Found {
        let root = self.full.root(lora);
        let mut full = self.full.find_prefix(root, tokens, max_blocks);
        let window = self.window.as_ref().map(|w| {
            loop {
                let first = w.first_read(full.len() * BLOCK_TOKENS).min(full.len());
                let cached: Option<Vec<u32>> = full[first..].iter().map(|(_, node)| w.blocks.get(node)).collect();
                match cached {
                    Some(blocks) => break [vec![NO_BLOCK; first], blocks].concat(),
                    None => {
                        full.pop();
                    }
                }
            }
        });
        Found { root, full, window }
    }

    /// Whether a sequence of `total` positions can take `found` and the blocks for the rest of
    /// its prompt now, keeping `headroom` blocks for the running sequences.
    pub fn can_take(&self, found: &Found, total: usize, headroom: usize) -> bool {
        let need = total.div_ceil(BLOCK_TOKENS) - found.full.len();
        let idle = found.full.iter().filter(|&&(b, _)| self.full.is_idle(b)).count();
        if self.full.available() < idle + need + headroom {
            return false;
        }
        match (&self.window, &found.window) {
            (Some(w), Some(blocks)) => {
                let idle = blocks.iter().filter(|&&b| b != NO_BLOCK && w.blocks.is_idle(b)).count();
                w.blocks.available() >= idle + need.min(w.per_seq) + headroom
            }
            _ => true,
        }
    }

    /// Take the blocks found: a new sequence's table.
    pub fn take(&mut self, found: Found) -> Table {
        found.full.iter().for_each(|&(b, _)| self.full.acquire(b));
        if let (Some(w), Some(blocks)) = (&mut self.window, &found.window) {
            blocks.iter().filter(|&&b| b != NO_BLOCK).for_each(|&b| w.blocks.acquire(b));
        }
        let window_from = found.window.as_ref().map_or(0, |w| w.iter().take_while(|&&b| b == NO_BLOCK).count());
        Table {
            n_registered: found.full.len(),
            chain: found.full.last().map_or(found.root, |&(_, node)| node),
            root: found.root,
            full: found.full.into_iter().map(|(b, _)| b).collect(),
            window: found.window,
            window_from,
        }
    }

    /// Add blocks to `table` until it holds `positions` positions (as many as
    /// [`KvBlocks::available`] said there were).
    pub fn grow(&mut self, table: &mut Table, positions: usize) {
        while table.capacity() < positions {
            table.full.push(self.full.allocate(table.full.last().copied()).expect("counted as available"));
            if let Some(w) = &mut self.window {
                let window = table.window.get_or_insert_with(Vec::new);
                let last = window.last().copied().filter(|&b| b != NO_BLOCK);
                window.push(w.blocks.allocate(last).expect("counted as available"));
            }
        }
    }

    /// Put every block of `table` that is now full of the first `computed` of `tokens` in the
    /// prefix cache, then give back the window blocks the next position no longer reads.
    pub fn advance(&mut self, table: &mut Table, tokens: &[u32], computed: usize) {
        let b = BLOCK_TOKENS;
        while (table.n_registered + 1) * b <= computed {
            let i = table.n_registered;
            table.chain = self.full.register(table.full[i], table.chain, &tokens[i * b..(i + 1) * b]);
            if let (Some(w), Some(window)) = (&mut self.window, &table.window) {
                // Registered before it can be given back (below), so never NO_BLOCK here.
                w.blocks.insert(window[i], table.chain);
            }
            table.n_registered += 1;
        }
        if let (Some(w), Some(window)) = (&mut self.window, &mut table.window) {
            let upto = w.first_read(computed).min(window.len());
            for entry in &mut window[table.window_from.min(upto)..upto] {
                w.blocks.release(std::mem::replace(entry, NO_BLOCK));
            }
            table.window_from = table.window_from.max(upto);
        }
    }

    /// Give back every block of `table`, last first (when they are equally old in the prefix
    /// cache, the deeper ones are evicted first); it starts again from its root.
    pub fn release(&mut self, table: &mut Table) {
        while let Some(b) = table.full.pop() {
            self.full.release(b);
        }
        if let (Some(w), Some(window)) = (&mut self.window, &mut table.window) {
            while let Some(b) = window.pop() {
                if b != NO_BLOCK {
                    w.blocks.release(b);
                }
            }
        }
        table.window_from = 0;
        table.n_registered = 0;
        table.chain = table.root;
    }

    /// Counts of the blocks by state, and of the window blocks if the pool is split.
    pub fn counts(&self) -> (BlockCounts, Option<BlockCounts>) {
        (self.full.counts(), self.window.as_ref().map(|w| w.blocks.counts()))
    }

    /// Forget every cached block that nobody uses.
    pub fn clear_cache(&mut self) {
        self.full.clear_cache();
        if let Some(w) = &mut self.window {
            w.blocks.clear_cache();
        }
    }

    /// Check every block's state against the tables that hold blocks (see
    /// [`BlockManager::check`]).
    pub fn check<'a>(&self, tables: impl Iterator<Item = &'a Table> + Clone) -> Result<(), String> {
        let mut refs = vec![0u32; self.full.counts().total];
        tables.clone().flat_map(|t| &t.full).for_each(|&b| refs[b as usize] += 1);
        self.full.check(&refs)?;
        if let Some(w) = &self.window {
            let mut refs = vec![0u32; w.blocks.counts().total];
            for t in tables {
                let window = t.window.as_deref().unwrap_or_default();
                if window.len() != t.full.len() {
                    return Err(format!("a window table of {} blocks beside {}", window.len(), t.full.len()));
                }
                window.iter().filter(|&&b| b != NO_BLOCK).for_each(|&b| refs[b as usize] += 1);
            }
            w.blocks.check(&refs).map_err(|e| format!("window blocks: {e}"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: usize = BLOCK_TOKENS;

    fn blocks(n_blocks: usize, n_window: usize, per_seq: usize) -> KvBlocks {
        KvBlocks::new(n_blocks, Some(WindowPart { n_blocks: n_window, per_seq, window: 20 }))
    }

    /// Compute `tokens` in `table` up to `to`, `step` positions at a time.
    fn compute(kv: &mut KvBlocks, table: &mut Table, tokens: &[u32], from: usize, to: usize, step: usize) {
        let mut at = from;
        while at < to {
            at = (at + step).min(to);
            kv.grow(table, at);
            kv.advance(table, tokens, at);
        }
    }

    #[test]
    fn a_prefix_is_taken_only_as_far_as_its_window_blocks_are_cached() {
        // Window 20: the next position p reads from (p + 1 − 20) rounded down to 64.
        let mut kv = blocks(20, 8, 8);
        let tokens: Vec<u32> = (0..161).collect();
        let found = kv.find(&[], &tokens, 10);
        let mut a = kv.take(found);
        compute(&mut kv, &mut a, &tokens, 0, 160, 32);
        assert_eq!(&a.window.as_ref().unwrap()[..8], &[NO_BLOCK; 8], "blocks below 128 given back");
        kv.release(&mut a);
        kv.check([].iter()).unwrap();
        // 8 window blocks for 10 blocks of positions: those of positions 0 and 16 were evicted.
        let found = kv.find(&[], &tokens, 10);
        assert_eq!(found.len(), 10, "the next position reads window blocks 8 and 9 only");
        assert_eq!(found.window.as_ref().unwrap().iter().filter(|&&b| b != NO_BLOCK).count(), 2);
        assert_eq!(kv.find(&[], &tokens[..97], 6).len(), 6, "reads window blocks 4 and 5");
        assert_eq!(kv.find(&[], &tokens[..49], 3).len(), 0, "would read window block 0, evicted");
        let t = kv.take(found);
        kv.check([&t].into_iter()).unwrap();
    }

    #[test]
    fn sequences_decoding_together_keep_their_blocks_and_window_blocks_in_runs() {
        let mut kv = blocks(64, 64, 8);
        let tokens: Vec<u32> = (0..64).collect();
        let mut tables: Vec<Table> = (0..4)
            .map(|_| {
                let found = kv.find(&[], &[], 0);
                kv.take(found)
            })
            .collect();
        for at in 1..=64 {
            for t in &mut tables {
                compute(&mut kv, t, &tokens, at - 1, at, 1);
            }
        }
        for t in &tables {
            assert!(t.full.windows(2).all(|w| w[1] == w[0] + 1), "{:?}", t.full);
            let window: Vec<u32> = t.window.iter().flatten().copied().filter(|&b| b != NO_BLOCK).collect();
            assert!(window.windows(2).all(|w| w[1] == w[0] + 1), "{window:?}");
        }
        kv.check(tables.iter()).unwrap();
    }

    /// A sequence as the engine loop drives one.
    struct Seq {
        tokens: Vec<u32>,
        computed: usize,
        table: Table,
    }

    #[derive(Clone, Debug)]
    enum Op {
        Start { prefix: u8, len: usize },
        Grow { i: usize, n: usize },
        Finish { i: usize },
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            1 => (0u8..3, 1usize..160).prop_map(|(prefix, len)| Op::Start { prefix, len }),
            3 => (0usize..64, 1usize..9).prop_map(|(i, n)| Op::Grow { i, n }),
            1 => (0usize..64).prop_map(|i| Op::Finish { i }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 64, ..Default::default() })]
        /// Random traffic on a split pool: every block of both parts stays in exactly one state,
        /// a sequence holds every window block it still reads and no more than its share, and
        /// when every sequence is gone none is in use.
        #[test]
        fn the_accounting_of_both_parts_holds_under_random_traffic(ops in proptest::collection::vec(op(), 1..400)) {
            // Steps of up to 8 tokens (prompts start from at most 160 − 1 cached ones).
            let per_seq = (20 + 64 + 8usize).div_ceil(B);
            let mut kv = blocks(48, 3 * per_seq, per_seq);
            let mut seqs: Vec<Seq> = Vec::new();
            for op in ops {
                match op {
                    Op::Start { prefix, len } => {
                        let tokens: Vec<u32> =
                            (0..len as u32).map(|t| if t < 100 { prefix as u32 * 1000 + t } else { t }).collect();
                        let found = kv.find(&[], &tokens, (len - 1) / B);
                        if seqs.len() < 3 && kv.can_take(&found, len.min(found.len() * B + 8), seqs.len()) {
                            let computed = found.len() * B;
                            seqs.push(Seq { table: kv.take(found), computed, tokens });
                        }
                    }
                    Op::Grow { i, n } if !seqs.is_empty() => {
                        let k = i % seqs.len();
                        let s = &mut seqs[k];
                        while s.tokens.len() < s.computed + n {
                            s.tokens.push(7);
                        }
                        if s.table.need(s.computed + n) <= kv.available() {
                            s.computed += n;
                            kv.grow(&mut s.table, s.computed);
                            kv.advance(&mut s.table, &s.tokens, s.computed);
                        }
                    }
                    Op::Finish { i } if !seqs.is_empty() => {
                        let mut s = seqs.swap_remove(i % seqs.len());
                        kv.release(&mut s.table);
                    }
                    _ => {}
                }
                kv.check(seqs.iter().map(|s| &s.table)).map_err(proptest::test_runner::TestCaseError::fail)?;
                for s in &seqs {
                    let window = s.table.window.as_deref().unwrap();
                    let first = window_reads_from(Some(20), s.computed) / B;
                    let held = window.iter().filter(|&&b| b != NO_BLOCK).count();
                    proptest::prop_assert!(window[first.min(window.len())..].iter().all(|&b| b != NO_BLOCK));
                    proptest::prop_assert!(held <= per_seq, "{held} window blocks held");
                }
            }
            for mut s in seqs.drain(..) {
                kv.release(&mut s.table);
            }
            kv.check([].iter()).map_err(proptest::test_runner::TestCaseError::fail)?;
            let (full, window) = kv.counts();
            proptest::prop_assert_eq!((full.in_use, window.unwrap().in_use), (0, 0));
        }
    }
}
