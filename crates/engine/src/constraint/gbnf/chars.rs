//! Sets of Unicode scalar values as sorted, disjoint, non-adjacent ranges: what a GBNF
//! character class denotes, with the operations the converter needs (complement for `[^...]`,
//! intersection tests for the lexeme-safety analysis).

const MAX: u32 = 0x10FFFF;
const SUR_LO: u32 = 0xD800;
const SUR_HI: u32 = 0xDFFF;

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub(super) struct CharSet {
    ranges: Vec<(u32, u32)>,
}

impl CharSet {
    pub fn empty() -> CharSet {
        CharSet { ranges: Vec::new() }
    }

    /// Every scalar value (GBNF's `.`, which matches newlines too).
    pub fn all() -> CharSet {
        CharSet::empty().complement()
    }

    pub fn single(c: char) -> CharSet {
        let mut s = CharSet::empty();
        s.add(c as u32, c as u32);
        s
    }

    /// Adds `lo..=hi`, dropping the parts that are not scalar values (surrogates, past
    /// U+10FFFF): no text contains them, so a class naming them matches nothing there.
    pub fn add(&mut self, lo: u32, hi: u32) {
        let hi = hi.min(MAX);
        if lo > hi {
            return;
        }
        // The parts below and above the surrogate block, whichever are non-empty.
        if lo < SUR_LO {
            self.insert(lo, hi.min(SUR_LO - 1));
        }
        if hi > SUR_HI {
            self.insert(lo.max(SUR_HI + 1), hi);
        }
    }

    fn insert(&mut self, lo: u32, hi: u32) {
        self.ranges.push((lo, hi));
        self.ranges.sort_unstable();
        let mut out: Vec<(u32, u32)> = Vec::with_capacity(self.ranges.len());
        for &(l, h) in &self.ranges {
            match out.last_mut() {
                Some(last) if l <= last.1.saturating_add(1) => last.1 = last.1.max(h),
                _ => out.push((l, h)),
            }
        }
        self.ranges = out;
    }

    pub fn complement(&self) -> CharSet {
        let mut out = CharSet::empty();
        let mut next = 0u32;
        for &(l, h) in &self.ranges {
            if l > next {
                out.add(next, l - 1);
            }
            next = h + 1;
        }
        if next <= MAX {
            out.add(next, MAX);
        }
        out
    }

    pub fn union(&self, other: &CharSet) -> CharSet {
        let mut out = self.clone();
        for &(l, h) in &other.ranges {
            out.insert(l, h);
        }
        out
    }

    pub fn intersects(&self, other: &CharSet) -> bool {
        let (mut i, mut j) = (0, 0);
        while i < self.ranges.len() && j < other.ranges.len() {
            let (a, b) = (self.ranges[i], other.ranges[j]);
            if a.1 < b.0 {
                i += 1;
            } else if b.1 < a.0 {
                j += 1;
            } else {
                return true;
            }
        }
        false
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn is_all(&self) -> bool {
        *self == CharSet::all()
    }

    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges
    }
}
