//! SentencePiece-style BPE (`tokenizer.ggml.model = llama`: Llama 2, Mistral, Phi-3).
//!
//! Written here rather than through `tokenizers` because llama.cpp's algorithm is not merge
//! ranks but scores: starting from single characters, the adjacent pair whose concatenation is
//! the highest-scoring vocabulary entry merges first (leftmost on ties). A pair only merges into
//! a vocabulary entry, so every merged piece is a token; a single character that is not one
//! falls back to byte tokens (`<0xNN>`).

use std::collections::BinaryHeap;
use std::sync::Mutex;

use rustc_hash::FxHashMap;

use crate::vocab::Vocab;

const SPACE: char = '\u{2581}';
/// Words cached before the cache is cleared.
const CACHE_WORDS: usize = 1 << 16;

/// The SentencePiece encoder, with a cache of encoded words.
pub(crate) struct Spm {
    /// Whether text may be cut before a ▁ that follows another character: true when no token
    /// has such a ▁ inside it, so no merge can cross the cut. Words then encode independently
    /// (and are cached), with exactly the result of encoding the whole text.
    split_words: bool,
    cache: Mutex<FxHashMap<Box<str>, Box<[u32]>>>,
}

impl Spm {
    pub(crate) fn new(vocab: &Vocab) -> Spm {
        let crosses = |t: &str| t.chars().zip(t.chars().skip(1)).any(|(a, b)| a != SPACE && b == SPACE);
        Spm { split_words: !vocab.tokens.iter().any(|t| crosses(t)), cache: Mutex::new(FxHashMap::default()) }
    }

    /// Encode `text` (spaces already replaced by ▁) and append the ids to `out`.
    pub(crate) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        if !self.split_words {
            return encode(vocab, text, out);
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let mut word = |w: &str, out: &mut Vec<u32>| match cache.get(w) {
            Some(ids) => out.extend_from_slice(ids),
            None => {
                let at = out.len();
                encode(vocab, w, out);
                if cache.len() >= CACHE_WORDS {
                    cache.clear();
                }
                cache.insert(w.into(), out[at..].into());
            }
        };
        let mut start = 0;
        let mut prev = SPACE;
        for (i, c) in text.char_indices() {
            if c == SPACE && prev != SPACE && i > start {
                word(&text[start..i], out);
                start = i;
            }
            prev = c;
        }
        if start < text.len() {
            word(&text[start..], out);
        }
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    prev: Option<usize>,
    next: Option<usize>,
    /// Byte range in the text.
    start: usize,
    len: usize,
}

/// A candidate merge, ordered by score (higher first) and then position (leftmost first).
#[derive(PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score.total_cmp(&other.score).then(other.left.cmp(&self.left))
    }
}

struct Session<'a> {
    vocab: &'a Vocab,
    text: &'a str,
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

/// Encode `text` as one piece and append the ids to `out`.
fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut s = Session { vocab, text, symbols: Vec::new(), queue: BinaryHeap::new() };
    for (i, (start, c)) in text.char_indices().enumerate() {
        let len = c.len_utf8();
        s.symbols.push(Symbol { prev: i.checked_sub(1), next: Some(i + 1), start, len });
    }
    if let Some(last) = s.symbols.last_mut() {
        last.next = None;
    }
    for i in 1..s.symbols.len() {
        s.try_add_bigram(Some(i - 1), Some(i));
    }
    while let Some(b) = s.queue.pop() {
        let (l, r) = (s.symbols[b.left], s.symbols[b.right]);
        // Skip pairs whose symbols have changed since the pair was queued.
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        s.symbols[b.left].len += r.len;
        s.symbols[b.right].len = 0;
        s.symbols[b.left].next = r.next;
        if let Some(n) = r.next {
            s.symbols[n].prev = Some(b.left);
        }
        s.try_add_bigram(s.symbols[b.left].prev, Some(b.left));
        s.try_add_bigram(Some(b.left), s.symbols[b.left].next);
    }
    let mut i = if s.symbols.is_empty() { None } else { Some(0) };
    while let Some(at) = i {
        let piece = s.piece(&s.symbols[at]);
        match vocab.id(piece) {
            Some(id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| byte_token(vocab, b))),
        }
        i = s.symbols[at].next;
    }
}

impl<'a> Session<'a> {
    fn piece(&self, sym: &Symbol) -> &'a str {
        &self.text[sym.start..sym.start + sym.len]
    }

    fn try_add_bigram(&mut self, left: Option<usize>, right: Option<usize>) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (self.symbols[left], self.symbols[right]);
        let text = &self.text[l.start..l.start + l.len + r.len];
        let Some(id) = self.vocab.id(text) else {
            return;
        };
        self.queue.push(Bigram { score: self.vocab.scores[id as usize], left, right, size: text.len() });
    }
}

/// The token for a raw byte: `<0xNN>`, or else the byte itself as a one-character token.
pub(crate) fn byte_token(vocab: &Vocab, b: u8) -> Option<u32> {
    vocab.id(&format!("<0x{b:02X}>")).or_else(|| std::str::from_utf8(&[b]).ok().and_then(|s| vocab.id(s)))
}
