//! The token environment llguidance compiles grammars against, built from the GGUF vocabulary
//! (there is no `tokenizer.json`): every token's bytes, special tokens behind toktrie's marker,
//! the model's end-of-generation tokens as the trie's EOS set, and onebit's own encoder for
//! the literals a grammar forces.

use std::sync::Arc;

use onebit_tokenizer::Tokenizer;
use toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// [`TokenizerEnv`] over onebit's [`Tokenizer`].
pub struct OnebitTokEnv {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
}

impl OnebitTokEnv {
    /// The trie of `tokenizer`'s vocabulary, `n_vocab` entries long (the model's logits may be
    /// longer than the vocabulary; the extra ids get no bytes, so no grammar ever allows them).
    pub fn new(tokenizer: Arc<Tokenizer>, n_vocab: usize) -> Result<OnebitTokEnv, String> {
        let words = token_bytes(&tokenizer, n_vocab);
        let v = tokenizer.vocab();
        let n = words.len() as u32;
        let in_range = |id: Option<u32>| id.filter(|&id| id < n);
        // Every end-of-generation token ends a grammar; the first stands for them all where
        // llguidance wants one.
        let mut eos: Vec<TokenId> = v.eog.iter().copied().filter(|&id| id < n).collect();
        if let Some(e) = in_range(v.specials.eos).or(in_range(v.specials.eot)) {
            eos.retain(|&x| x != e);
            eos.insert(0, e);
        }
        if eos.is_empty() {
            return Err("the vocabulary has no end-of-generation token".into());
        }
        let info = TokRxInfo {
            vocab_size: n,
            tok_eos: eos[0],
            tok_bos: in_range(v.specials.bos),
            tok_pad: in_range(v.specials.pad),
            tok_unk: in_range(v.specials.unk),
            tok_end_of_turn: in_range(v.specials.eot),
        };
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
        Ok(OnebitTokEnv { tokenizer, trie })
    }
}

/// The bytes of each token as the trie holds them: the decoded piece for text (and byte)
/// tokens, `0xFF` + the token's text for control tokens, so that a grammar's `<|im_end|>` finds
/// them and no plain text ever matches them.
pub fn token_bytes(tokenizer: &Tokenizer, n_vocab: usize) -> Vec<Vec<u8>> {
    let v = tokenizer.vocab();
    let n = n_vocab.max(v.len());
    (0..n as u32)
        .map(|id| {
            if id as usize >= v.len() {
                return Vec::new();
            }
            if v.is_special(id) {
                let text = v.text(id).unwrap_or_default();
                // Marker-only entries would match any marker: an unnamed control token is
                // simply never allowed.
                if text.is_empty() {
                    return Vec::new();
                }
                let mut b = Vec::with_capacity(text.len() + 1);
                b.push(TokTrie::SPECIAL_TOKEN_MARKER);
                b.extend_from_slice(text.as_bytes());
                b
            } else {
                tokenizer.piece(id, false).to_vec()
            }
        })
        .collect()
}

impl TokenizerEnv for OnebitTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// onebit's own tokenization where it reproduces `s` exactly; the trie's greedy one where it
    /// does not (bytes that are not UTF-8, or a SentencePiece vocabulary that would put its
    /// leading space before a fragment in the middle of the output).
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        if let Ok(text) = std::str::from_utf8(s)
            && let Ok(ids) = self.tokenizer.encode(text, false, false)
            && self.trie.decode_raw(&ids) == s
        {
            return ids;
        }
        self.trie.greedy_tokenize(s)
    }
}
