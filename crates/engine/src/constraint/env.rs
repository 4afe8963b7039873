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

#[cfg(test)]
mod tests {
    use onebit_gguf::GgufFile;
    use toktrie::TokenizerEnv;

    use super::*;

    fn env(rel: &str) -> Option<OnebitTokEnv> {
        let path = onebit_testkit::shared_file(rel).filter(|p| p.is_file())?;
        let file = GgufFile::open(path).unwrap();
        let tok = Arc::new(Tokenizer::from_metadata(&file.metadata()).unwrap());
        let n = tok.vocab().len();
        Some(OnebitTokEnv::new(tok, n).unwrap())
    }

    /// Text tokens spell their decoded bytes; literals tokenize back to themselves.
    fn check_text(e: &OnebitTokEnv, text: &str) {
        let ids = e.tokenize_bytes(text.as_bytes());
        assert_eq!(e.tok_trie().decode_raw(&ids), text.as_bytes(), "{text:?} -> {ids:?}");
        assert!(ids.iter().all(|&id| !e.tok_trie().is_special_token(id)));
    }

    #[test]
    fn qwen3_special_tokens_carry_the_marker_and_every_eog_ends() {
        let Some(e) = env("models/qwen3-q8_0.gguf") else { return };
        let trie = e.tok_trie();
        let im_end = e.tokenizer.vocab().id("<|im_end|>").unwrap();
        let eot = e.tokenizer.vocab().id("<|endoftext|>").unwrap();
        assert!(trie.is_special_token(im_end));
        assert_eq!(trie.token(im_end), b"\xff<|im_end|>");
        assert_eq!(trie.token_id_at_bytes(b"\xff<|im_end|>"), Some(im_end));
        for id in [im_end, eot] {
            assert!(trie.eos_tokens().contains(&id), "{id} is not an EOS of the trie");
        }
        // Plain text that looks like a special token is text.
        check_text(&e, "<|im_end|> is not the end");
        check_text(&e, "{\"naïve\": [1, 2.5e3, null]} 日本語 🙂");
        // A user-defined token (Qwen's <tool_call>, where the vocabulary has it) is plain text.
        if let Some(call) = e.tokenizer.vocab().id("<tool_call>") {
            assert_eq!(trie.token(call), b"<tool_call>");
        }
    }

    #[test]
    fn gpt2_byte_level_tokens_are_raw_bytes() {
        let Some(e) = env("models/vocab/ggml-vocab-gpt-2.gguf") else { return };
        // "Ġthe" is " the" as bytes.
        let id = e.tokenizer.vocab().id("Ġthe").unwrap();
        assert_eq!(e.tok_trie().token(id), b" the");
        check_text(&e, " the quick\n\tbrown ünïcödé");
    }

    #[test]
    fn spm_pieces_have_spaces_and_byte_tokens_their_byte() {
        let Some(e) = env("models/vocab/ggml-vocab-llama-spm.gguf") else { return };
        let v = e.tokenizer.vocab();
        let id = v.id("▁the").unwrap();
        assert_eq!(e.tok_trie().token(id), b" the");
        let byte = v.id("<0x0A>").unwrap();
        assert_eq!(e.tok_trie().token(byte), b"\n");
        let bos = v.specials.bos.unwrap();
        assert!(e.tok_trie().is_special_token(bos));
        // A literal in the middle of the output gets no leading space.
        check_text(&e, "the cat");
        check_text(&e, "{\"a\":1}");
    }

    #[test]
    fn the_single_byte_env_compiles_a_grammar() {
        // llguidance's own byte-level environment: a sanity check of the compile path.
        let env = toktrie::ApproximateTokEnv::single_byte_env();
        let f = llguidance::ParserFactory::new_simple(&env).unwrap();
        let p = f.create_parser(llguidance::api::TopLevelGrammar::from_regex("ab[0-9]")).unwrap();
        let mut m = llguidance::Matcher::new(Ok(p));
        assert_eq!(m.compute_ff_tokens(), vec![b'a' as u32, b'b' as u32]);
    }
}
