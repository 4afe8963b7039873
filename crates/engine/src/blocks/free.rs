//! The free blocks of a pool, and where a sequence's next block goes.
//!
//! Attention on a CPU reads a sequence's blocks that follow each other in the pool as one run,
//! which the hardware streams; blocks scattered among other sequences' are read a few KiB at a
//! time, at the memory's latency (see the KV pool's superblocks in `onebit_model`). Sequences
//! that grow together (a batch decoding in lockstep) would interleave their blocks if each took
//! the lowest free one. So a sequence grows into the block after its last one when that is free,
//! and a sequence that starts (or finds its next block taken) begins a run in the largest free
//! stretch: in its middle when the block before it is in use (room on both sides: before it for
//! the sequence whose blocks end there, after it for itself), else at its start (the pool's
//! start, or after blocks kept only in the prefix cache), so that one sequence alone, or a chat
//! whose earlier turns are cached, stays in few pages.

/// Where a run begins in a stretch of `len` blocks from `start` that it may take: its middle
/// if the block before it is in use, else its start (see the module's header).
pub(crate) fn run_start_in(start: u32, len: u32, in_use: impl Fn(u32) -> bool) -> u32 {
    if start > 0 && in_use(start - 1) { start + len / 2 } else { start }
}

/// Free blocks as a bitmap (bit set: free), with their count.
#[derive(Debug)]
pub(crate) struct FreeBlocks {
    bits: Vec<u64>,
    n_blocks: usize,
    len: usize,
}

impl FreeBlocks {
    /// Every one of `n_blocks` blocks free.
    pub fn all(n_blocks: usize) -> FreeBlocks {
        let mut bits = vec![u64::MAX; n_blocks.div_ceil(64)];
        if !n_blocks.is_multiple_of(64) {
            bits[n_blocks / 64] = (1u64 << (n_blocks % 64)) - 1;
        }
        FreeBlocks { bits, n_blocks, len: n_blocks }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn contains(&self, block: u32) -> bool {
        let b = block as usize;
        b < self.n_blocks && self.bits[b / 64] & (1 << (b % 64)) != 0
    }

    pub fn insert(&mut self, block: u32) {
        let b = block as usize;
        debug_assert!(!self.contains(block), "block {block} freed twice");
        self.bits[b / 64] |= 1 << (b % 64);
        self.len += 1;
    }

    fn remove(&mut self, block: u32) {
        let b = block as usize;
        debug_assert!(self.contains(block));
        self.bits[b / 64] &= !(1 << (b % 64));
        self.len -= 1;
    }

    /// Every free block, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.n_blocks as u32).filter(|&b| self.contains(b))
    }

    /// Take a free block for a sequence whose last block is `after` (None: it has none yet), as
    /// the module's header says (`in_use`: whether a block that is not free belongs to a
    /// sequence); None when no block is free.
    pub fn take(&mut self, after: Option<u32>, in_use: impl Fn(u32) -> bool) -> Option<u32> {
        let next = after.map(|b| b + 1).filter(|&b| self.contains(b));
        let block = next.or_else(|| self.run_start(in_use))?;
        self.remove(block);
        Some(block)
    }

    /// Where a new run of blocks begins: in the largest free stretch, at its middle if the
    /// block before it is in use, else at its start.
    fn run_start(&self, in_use: impl Fn(u32) -> bool) -> Option<u32> {
        let (start, len) = self.largest_stretch()?;
        Some(run_start_in(start as u32, len as u32, in_use))
    }

    /// The first of the longest runs of free blocks, as (start, length).
    fn largest_stretch(&self) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize)> = None;
        let mut b = 0;
        while let Some(start) = self.next(b, true) {
            let end = self.next(start, false).unwrap_or(self.n_blocks);
            if best.is_none_or(|(_, len)| end - start > len) {
                best = Some((start, end - start));
            }
            b = end;
        }
        best
    }

    /// The first block at or after `from` that is free (`free`) or not, a word at a time.
    fn next(&self, from: usize, free: bool) -> Option<usize> {
        let mut w = from / 64;
        let flip = if free { 0 } else { u64::MAX };
        let mut word = (self.bits.get(w)? ^ flip) & (u64::MAX << (from % 64));
        loop {
            if word != 0 {
                let b = w * 64 + word.trailing_zeros() as usize;
                return (b < self.n_blocks).then_some(b);
            }
            w += 1;
            word = self.bits.get(w)? ^ flip;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_growing_together_keep_their_blocks_in_runs() {
        let mut free = FreeBlocks::all(128);
        let mut last: Vec<Option<u32>> = vec![None; 4];
        let mut tables: Vec<Vec<u32>> = vec![Vec::new(); 4];
        for _ in 0..16 {
            for s in 0..4 {
                let b = free.take(last[s], |_| true).unwrap();
                tables[s].push(b);
                last[s] = Some(b);
            }
        }
        for t in &tables {
            assert!(t.windows(2).all(|w| w[1] == w[0] + 1), "{t:?}");
        }
        assert_eq!(tables[0][0], 0);
        assert_eq!(free.len(), 128 - 64);
    }

    #[test]
    fn a_taken_next_block_starts_a_new_run_and_every_block_is_handed_out_once() {
        for n in [1, 63, 64, 65, 200] {
            let mut free = FreeBlocks::all(n);
            let mut seen = vec![false; n];
            let mut last = None;
            for i in 0..n {
                // Alternate two sequences so that runs collide.
                let b = free.take(if i % 3 == 0 { None } else { last }, |_| true).unwrap();
                assert!(!seen[b as usize], "block {b} handed out twice");
                seen[b as usize] = true;
                last = Some(b);
            }
            assert_eq!(free.take(last, |_| true), None);
            assert_eq!(free.len(), 0);
            free.insert(5.min(n as u32 - 1));
            assert_eq!(free.iter().collect::<Vec<_>>(), vec![5.min(n as u32 - 1)]);
        }
    }

    #[test]
    fn a_new_run_begins_in_the_middle_of_the_largest_stretch() {
        let mut free = FreeBlocks::all(100);
        assert_eq!(free.take(None, |_| true), Some(0));
        assert_eq!(free.take(None, |_| true), Some(50), "middle of 1..100");
        assert_eq!(free.take(None, |_| true), Some(25), "middle of 1..50");
        // Blocks 0, 25 and 50 cached, not in use: the next run starts the largest stretch.
        assert_eq!(free.take(None, |_| false), Some(51));
    }
}
