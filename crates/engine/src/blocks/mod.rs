//! Accounting of the KV pool's blocks, and the prefix cache.
//!
//! Every block is in exactly one state: **free**, **in use** (referenced by the block tables of
//! one or more sequences), or **cached** (full, unreferenced, kept for reuse). A full block's
//! content is identified by its parent's content and its own tokens (vLLM's automatic prefix
//! caching, with exact keys rather than hashes, so that a lookup can never return the wrong
//! block). A new sequence looks its prompt up block by block from the start and takes every
//! block found, even while other sequences use it: cached blocks are read-only, since a
//! sequence only writes positions past the prefix it took. When no free block is left, a cached
//! block nobody uses is evicted: one of the least recently used ([`COLD`]), chosen so that a
//! sequence's blocks still follow each other.
//!
//! Content ids ("nodes") are never reused, so a block keyed under an evicted parent can no
//! longer be found; it ages out of the cache like any other.
//!
//! The blocks of a split pool's sliding-window layers have a manager of their own, whose cached
//! blocks are keyed by the node of the content they hold ([`table`]).

mod free;
mod table;

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use free::{FreeBlocks, run_start_in};
pub(crate) use table::{KvBlocks, Table, WindowPart};

/// A full block's content: its parent's node (0 at the start of a sequence) and its tokens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BlockKey {
    parent: u64,
    tokens: Box<[u32]>,
}

#[derive(Clone, Debug)]
struct Meta<K> {
    refs: u32,
    /// Set while the block is in the prefix cache.
    key: Option<K>,
    /// The content node of a cached block keyed by [`BlockKey`].
    node: u64,
    /// When it was last released (its place in the eviction order while cached and unused).
    tick: u64,
}

impl<K> Default for Meta<K> {
    fn default() -> Self {
        Meta { refs: 0, key: None, node: 0, tick: 0 }
    }
}

/// Cached blocks that may be taken out of the prefix cache before older ones, to keep a
/// sequence's blocks in runs: the least recently used ones, at most this many and at most half
/// of the unused cached blocks (a prefix released just now is never cold). Without them, a
/// server whose pool is full of cached blocks would hand each sequence the least recently used
/// block, and sequences decoding together would interleave again (their chains are released
/// last block first, so even one sequence would get its blocks backwards). A sequence grows
/// into a cold block even while other blocks are free: that block is about to go anyway, and a
/// free one elsewhere would break its run.
const COLD: usize = 64;

/// Counts of blocks by state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockCounts {
    pub total: usize,
    pub free: usize,
    pub in_use: usize,
    /// In the prefix cache and unreferenced (evictable).
    pub cached_idle: usize,
    /// In the prefix cache (in use or not).
    pub cached: usize,
}

/// The states of the pool's blocks and the prefix cache's index (keyed by content: a block's
/// parent and tokens, or for a window block the node of its content).
pub(crate) struct BlockManager<K = BlockKey> {
    block_tokens: usize,
    meta: Vec<Meta<K>>,
    /// Free blocks (placed so that a sequence's blocks follow each other, see [`free`]).
    free: FreeBlocks,
    /// Cached blocks with no references, by `tick` (oldest first).
    idle: BTreeMap<u64, u32>,
    index: HashMap<K, u32>,
    tick: u64,
    next_node: u64,
    /// The content node a sequence starts from, per LoRA adapter set (the empty set: 0):
    /// the same tokens computed with other adapters are other content.
    roots: HashMap<Vec<(usize, u32)>, u64>,
}

impl<K: Clone + Eq + Hash> BlockManager<K> {
    pub fn new(n_blocks: usize, block_tokens: usize) -> BlockManager<K> {
        BlockManager {
            block_tokens,
            meta: vec![Meta::default(); n_blocks],
            free: FreeBlocks::all(n_blocks),
            idle: BTreeMap::new(),
            index: HashMap::new(),
            tick: 0,
            next_node: 1,
            roots: HashMap::new(),
        }
    }

    /// Blocks that can be handed out now (free, or cached and evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.idle.len()
    }

    /// The cached block holding the content `key`.
    pub fn get(&self, key: &K) -> Option<u32> {
        self.index.get(key).copied()
    }

    /// Put a sequence's own block in the prefix cache under `key`, unless another block already
    /// holds that content (returned; this block then stays private).
    pub fn insert(&mut self, block: u32, key: K) -> Option<u32> {
        if let Some(&existing) = self.index.get(&key) {
            return Some(existing);
        }
        let m = &mut self.meta[block as usize];
        debug_assert!(m.refs > 0 && m.key.is_none(), "only a sequence's own blocks are registered");
        m.key = Some(key.clone());
        self.index.insert(key, block);
        None
    }

    /// Take a reference to a block found in the cache.
    pub fn acquire(&mut self, block: u32) {
        let m = &mut self.meta[block as usize];
        if m.refs == 0 {
            debug_assert!(m.key.is_some(), "only cached blocks are acquired");
            self.idle.remove(&m.tick);
        }
        m.refs += 1;
    }

    /// A block for new content of a sequence whose last block is `after`: the next one if it
    /// is free or cold (see [`COLD`]), else a free one (where [`free`] places a run), else a
    /// cold one where a run has room.
    pub fn allocate(&mut self, after: Option<u32>) -> Option<u32> {
        let next = after.map(|b| b + 1).filter(|&b| self.is_cold(b));
        let meta = &self.meta;
        let block = match next {
            Some(b) => self.evict(b),
            None => match self.free.take(after, |b| meta[b as usize].refs > 0) {
                Some(b) => b,
                None => self.evict_run_start()?,
            },
        };
        let m = &mut self.meta[block as usize];
        debug_assert_eq!(m.refs, 0);
        *m = Meta { refs: 1, ..Meta::default() };
        Some(block)
    }

    /// The tick of the most recently released cold block (none when nothing is cached unused).
    fn cold_until(&self) -> Option<u64> {
        let k = COLD.min(self.idle.len() / 2).max(1);
        self.idle.keys().nth(k - 1).copied()
    }

    /// Whether `block` is cached, unused and cold.
    fn is_cold(&self, block: u32) -> bool {
        let Some(m) = self.meta.get(block as usize) else { return false };
        m.refs == 0 && m.key.is_some() && self.cold_until().is_some_and(|t| m.tick <= t)
    }

    /// Where a run begins when no block is free: in the longest stretch of consecutive cold
    /// blocks, at its middle if the block before it is in use, else at its start (as [`free`]
    /// places runs among free blocks).
    fn evict_run_start(&mut self) -> Option<u32> {
        let until = self.cold_until()?;
        let mut cold: Vec<u32> = self.idle.range(..=until).map(|(_, &b)| b).collect();
        cold.sort_unstable();
        let (mut best, mut start) = ((cold[0], 1), 0);
        for i in 1..=cold.len() {
            if i == cold.len() || cold[i] != cold[i - 1] + 1 {
                if i - start > best.1 {
                    best = (cold[start], i - start);
                }
                start = i;
            }
        }
        let (first, len) = best;
        let meta = &self.meta;
        let block = run_start_in(first, len as u32, |b| meta[b as usize].refs > 0);
        Some(self.evict(block))
    }

    /// Take a cached, unused block out of the prefix cache.
    fn evict(&mut self, block: u32) -> u32 {
        let m = &mut self.meta[block as usize];
        debug_assert_eq!(m.refs, 0);
        self.idle.remove(&m.tick);
        let key = m.key.take().expect("idle blocks are cached");
        self.index.remove(&key);
        block
    }

    /// Drop a reference. An unreferenced block stays cached (evictable) if it is in the prefix
    /// cache, and is free otherwise.
    pub fn release(&mut self, block: u32) {
        let m = &mut self.meta[block as usize];
        assert!(m.refs > 0, "block {block} released more often than taken");
        m.refs -= 1;
        if m.refs > 0 {
            return;
        }
        if m.key.is_some() {
            self.tick += 1;
            m.tick = self.tick;
            self.idle.insert(self.tick, block);
        } else {
            self.free.insert(block);
        }
    }

    /// Forget every cached block that nobody uses.
    pub fn clear_cache(&mut self) {
        while let Some(b) = self.evict_oldest() {
            self.free.insert(b);
        }
    }

    /// Take the least recently used unreferenced block out of the prefix cache.
    fn evict_oldest(&mut self) -> Option<u32> {
        let (_, &b) = self.idle.first_key_value()?;
        Some(self.evict(b))
    }

    pub fn counts(&self) -> BlockCounts {
        let in_use = self.meta.iter().filter(|m| m.refs > 0).count();
        BlockCounts {
            total: self.meta.len(),
            free: self.free.len(),
            in_use,
            cached_idle: self.idle.len(),
            cached: self.index.len(),
        }
    }

    /// Whether a block is cached and unreferenced (taking it makes it unavailable).
    pub fn is_idle(&self, block: u32) -> bool {
        self.meta[block as usize].refs == 0
    }

    /// Check that every block is in exactly one state and the index agrees with the blocks;
    /// `refs[b]` is how many block tables hold block `b`.
    pub fn check(&self, refs: &[u32]) -> Result<(), String> {
        let fail = |what: String| Err(what);
        if refs.len() != self.meta.len() {
            return fail(format!("{} reference counts for {} blocks", refs.len(), self.meta.len()));
        }
        let mut state = vec![0u8; self.meta.len()];
        for b in self.free.iter() {
            state[b as usize] += 1;
            let m = &self.meta[b as usize];
            if m.refs != 0 || m.key.is_some() {
                return fail(format!("free block {b} is referenced or cached"));
            }
        }
        for (&tick, &b) in &self.idle {
            state[b as usize] += 1;
            let m = &self.meta[b as usize];
            if m.refs != 0 || m.key.is_none() || m.tick != tick {
                return fail(format!("idle block {b} is not cached and unused"));
            }
        }
        for (b, m) in self.meta.iter().enumerate() {
            if m.refs != refs[b] {
                return fail(format!("block {b}: {} references recorded, {} held", m.refs, refs[b]));
            }
            if m.refs > 0 {
                state[b] += 1;
            }
            if let Some(key) = &m.key
                && self.index.get(key) != Some(&(b as u32))
            {
                return fail(format!("cached block {b} is not indexed"));
            }
        }
        if let Some(b) = state.iter().position(|&s| s != 1) {
            return fail(format!("block {b} is in {} states", state[b]));
        }
        if self.index.len() != self.meta.iter().filter(|m| m.key.is_some()).count() {
            return fail("the index holds blocks that are not cached".into());
        }
        Ok(())
    }
}

impl BlockManager<BlockKey> {
    /// The node the content of a sequence with adapters `lora` starts from.
    pub fn root(&mut self, lora: &[onebit_model::LoraUse]) -> u64 {
        if lora.is_empty() {
            return 0;
        }
        let key = lora.iter().map(|u| (u.id, u.scale.to_bits())).collect();
        *self.roots.entry(key).or_insert_with(|| {
            self.next_node += 1;
            self.next_node - 1
        })
    }

    /// The cached blocks holding the longest prefix of `tokens` made of whole blocks after the
    /// content `root` ([`BlockManager::root`]), at most `max_blocks` of them, without taking
    /// them: `(block, node)` in order.
    pub fn find_prefix(&self, root: u64, tokens: &[u32], max_blocks: usize) -> Vec<(u32, u64)> {
        let mut found = Vec::new();
        let mut parent = root;
        for chunk in tokens.chunks_exact(self.block_tokens).take(max_blocks) {
            let key = BlockKey { parent, tokens: chunk.into() };
            let Some(&block) = self.index.get(&key) else { break };
            parent = self.meta[block as usize].node;
            found.push((block, parent));
        }
        found
    }

    /// Put a full block of a sequence in the prefix cache: its content is `tokens` after the
    /// content `parent`. Returns the node that names its content (an existing one if the same
    /// content is already cached in another block; this block then stays private).
    pub fn register(&mut self, block: u32, parent: u64, tokens: &[u32]) -> u64 {
        debug_assert_eq!(tokens.len(), self.block_tokens);
        let key = BlockKey { parent, tokens: tokens.into() };
        if let Some(existing) = self.insert(block, key) {
            return self.meta[existing as usize].node;
        }
        self.meta[block as usize].node = self.next_node;
        self.next_node += 1;
        self.next_node - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_full_block_is_found_again_until_evicted() {
        let mut bm = BlockManager::new(3, 2);
        let a = bm.allocate(None).unwrap();
        let b = bm.allocate(Some(a)).unwrap();
        assert_eq!((a, b), (0, 1), "a sequence's blocks follow each other");
        let na = bm.register(a, 0, &[5, 6]);
        bm.register(b, na, &[7, 8]);
        bm.release(b);
        bm.release(a);
        assert_eq!(bm.find_prefix(0, &[5, 6, 7, 8, 9], 9), vec![(a, na), (b, na + 1)]);
        assert_eq!(bm.find_prefix(0, &[5, 6, 7, 8], 1).len(), 1, "at most max_blocks");
        assert!(bm.find_prefix(0, &[5, 7], 9).is_empty());
        // Two new blocks: the free one, then the least recently released cached one (b, the
        // leaf, was released first).
        assert_eq!(bm.allocate(None), Some(2));
        assert_eq!(bm.allocate(None), Some(b));
        assert_eq!(bm.find_prefix(0, &[5, 6, 7, 8], 9).len(), 1);
        bm.check(&[0, 1, 1]).unwrap();
    }

    #[test]
    fn sequences_growing_together_in_a_pool_full_of_cached_blocks_keep_runs() {
        // Four earlier sequences of 16 blocks fill the pool, then leave it to the prefix cache,
        // each last block first (as `KvBlocks::release` gives them back).
        let mut bm = BlockManager::new(64, 1);
        let mut chains = Vec::new();
        for s in 0..4u32 {
            let (mut blocks, mut parent) = (Vec::<u32>::new(), 0);
            for i in 0..16 {
                let b = bm.allocate(blocks.last().copied()).unwrap();
                parent = bm.register(b, parent, &[100 * s + i]);
                blocks.push(b);
            }
            chains.push(blocks);
        }
        for c in &chains {
            c.iter().rev().for_each(|&b| bm.release(b));
        }
        assert_eq!((bm.counts().free, bm.counts().cached_idle), (0, 64));
        // Four new sequences grow together, a block each in turn.
        let mut tables = vec![Vec::<u32>::new(); 4];
        for _ in 0..8 {
            for t in tables.iter_mut() {
                t.push(bm.allocate(t.last().copied()).unwrap());
            }
        }
        for t in &tables {
            assert!(t.windows(2).all(|w| w[1] == w[0] + 1), "a sequence's blocks follow each other: {tables:?}");
        }
        // Only the two least recently released chains were taken; the last one is found whole.
        let used: std::collections::BTreeSet<u32> = tables.concat().into_iter().collect();
        assert_eq!(used, chains[..2].concat().into_iter().collect());
        let last: Vec<u32> = (0..16).map(|i| 300 + i).collect();
        assert_eq!(bm.find_prefix(0, &last, 16).len(), 16);
        let mut refs = vec![0; 64];
        used.iter().for_each(|&b| refs[b as usize] = 1);
        bm.check(&refs).unwrap();
    }

    #[test]
    fn the_same_tokens_under_other_adapters_are_other_content() {
        use onebit_model::LoraUse;
        let mut bm = BlockManager::new(3, 2);
        let (one, half) = ([LoraUse { id: 0, scale: 1.0 }], [LoraUse { id: 0, scale: 0.5 }]);
        let (r1, r2) = (bm.root(&one), bm.root(&half));
        assert!(r1 != 0 && r2 != 0 && r1 != r2);
        assert_eq!(bm.root(&one), r1, "one root per adapter set");
        assert_eq!(bm.root(&[]), 0);
        let a = bm.allocate(None).unwrap();
        let n = bm.register(a, r1, &[5, 6]);
        bm.release(a);
        assert_eq!(bm.find_prefix(r1, &[5, 6, 7], 9), vec![(a, n)]);
        assert!(bm.find_prefix(r2, &[5, 6, 7], 9).is_empty());
        assert!(bm.find_prefix(0, &[5, 6, 7], 9).is_empty());
    }

    #[test]
    fn shared_blocks_are_counted_and_never_evicted_while_used() {
        let mut bm = BlockManager::new(2, 1);
        let a = bm.allocate(None).unwrap();
        let n = bm.register(a, 0, &[1]);
        bm.acquire(a);
        assert_eq!(bm.find_prefix(0, &[1], 9), vec![(a, n)]);
        bm.release(a);
        assert!(bm.allocate(None).is_some());
        assert!(bm.allocate(None).is_none(), "the used cached block is not evicted");
        bm.check(&[1, 1]).unwrap();
    }

    /// A sequence as the engine loop drives one: tokens, how many are computed, its table.
    struct Seq {
        tokens: Vec<u32>,
        computed: usize,
        blocks: Vec<u32>,
        registered: usize,
        chain: u64,
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// A new sequence whose prompt is `len` tokens drawn from a few shared prefixes.
        Start {
            prefix: u8,
            len: usize,
        },
        /// Compute `n` more tokens of sequence `i` (mod the number alive).
        Grow {
            i: usize,
            n: usize,
        },
        Finish {
            i: usize,
        },
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (0u8..3, 1usize..40).prop_map(|(prefix, len)| Op::Start { prefix, len }),
            (0usize..64, 1usize..9).prop_map(|(i, n)| Op::Grow { i, n }),
            (0usize..64).prop_map(|i| Op::Finish { i }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 64, ..Default::default() })]
        /// Random traffic on a small pool: every block stays in exactly one state, and when
        /// every sequence is gone none is in use.
        #[test]
        fn the_accounting_holds_under_random_traffic(ops in proptest::collection::vec(op(), 1..400)) {
            const B: usize = 4;
            let mut bm = BlockManager::new(24, B);
            let mut seqs: Vec<Seq> = Vec::new();
            for op in ops {
                match op {
                    Op::Start { prefix, len } => {
                        let tokens: Vec<u32> = (0..len as u32).map(|t| if t < 9 { prefix as u32 * 100 + t } else { t }).collect();
                        let found = bm.find_prefix(0, &tokens, (len - 1) / B);
                        let idle = found.iter().filter(|f| bm.is_idle(f.0)).count();
                        if bm.available() < idle + len.div_ceil(B) - found.len() {
                            continue;
                        }
                        found.iter().for_each(|f| bm.acquire(f.0));
                        seqs.push(Seq {
                            computed: found.len() * B,
                            blocks: found.iter().map(|f| f.0).collect(),
                            registered: found.len(),
                            chain: found.last().map_or(0, |f| f.1),
                            tokens,
                        });
                    }
                    Op::Grow { i, n } if !seqs.is_empty() => {
                        let k = i % seqs.len();
                        let s = &mut seqs[k];
                        while s.tokens.len() < s.computed + n {
                            s.tokens.push(7);
                        }
                        while s.blocks.len() * B < s.computed + n {
                            match bm.allocate(None) {
                                Some(b) => s.blocks.push(b),
                                None => break,
                            }
                        }
                        s.computed = (s.computed + n).min(s.blocks.len() * B);
                        while (s.registered + 1) * B <= s.computed {
                            let r = s.registered;
                            s.chain = bm.register(s.blocks[r], s.chain, &s.tokens[r * B..(r + 1) * B]);
                            s.registered += 1;
                        }
                    }
                    Op::Finish { i } if !seqs.is_empty() => {
                        let k = i % seqs.len();
                        let mut s = seqs.swap_remove(k);
                        while let Some(b) = s.blocks.pop() {
                            bm.release(b);
                        }
                    }
                    _ => {}
                }
                let mut refs = vec![0u32; 24];
                seqs.iter().flat_map(|s| &s.blocks).for_each(|&b| refs[b as usize] += 1);
                bm.check(&refs).map_err(proptest::test_runner::TestCaseError::fail)?;
            }
            for mut s in seqs.drain(..) {
                while let Some(b) = s.blocks.pop() {
                    bm.release(b);
                }
            }
            bm.check(&[0; 24]).map_err(proptest::test_runner::TestCaseError::fail)?;
            proptest::prop_assert_eq!(bm.counts().in_use, 0);
        }
    }

    #[test]
    fn the_same_content_twice_keeps_one_cached_copy() {
        let mut bm = BlockManager::new(2, 1);
        let (a, b) = (bm.allocate(None).unwrap(), bm.allocate(None).unwrap());
        let na = bm.register(a, 0, &[3]);
        assert_eq!(bm.register(b, 0, &[3]), na);
        bm.release(b);
        assert_eq!(bm.counts().free, 1, "the duplicate is not cached");
        bm.release(a);
        bm.check(&[0, 0]).unwrap();
        bm.clear_cache();
        assert_eq!(bm.counts(), BlockCounts { total: 2, free: 2, ..BlockCounts::default() });
    }
}
