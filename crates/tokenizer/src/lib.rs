//! Tokenizers and chat templates built from a GGUF file's own metadata.
//!
//! ```no_run
//! let file = onebit_gguf::GgufModel::open("model.gguf")?;
//! let tok = onebit_tokenizer::Tokenizer::from_metadata(&file.metadata())?;
//! let ids = tok.encode("Hello, world!", false, true)?;
//! assert_eq!(tok.decode(&ids, false), "Hello, world!");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Ids are llama.cpp's: special-token text is split out first (`special`), then the text
//! between is encoded by byte-level BPE (`bpe`) or SentencePiece BPE (`spm`), per
//! `tokenizer.ggml.model`. Anything this crate does not know (an unknown model or
//! pre-tokenizer type) is an error rather than a guess.

mod bpe;
pub mod chat;
mod decode;
mod error;
mod special;
mod spm;
pub mod vocab;

use onebit_gguf::Metadata;

pub use chat::{ChatRequest, ChatTemplate};
pub use decode::StreamDecoder;
pub use error::TokenizerError;
pub use vocab::{Kind, Specials, Vocab};

use special::Fragment;

enum Engine {
    Bpe(Box<bpe::Bpe>),
    Spm(spm::Spm),
}

/// A model's tokenizer: encoding, decoding, special tokens, and its chat template.
pub struct Tokenizer {
    vocab: Vocab,
    engine: Engine,
    pieces: decode::Pieces,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer({:?}, {} tokens)", self.vocab.kind, self.vocab.len())
    }
}

impl Tokenizer {
    /// Build the tokenizer described by `tokenizer.*` metadata (a model or a vocabulary-only file).
    pub fn from_metadata(md: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let vocab = Vocab::from_metadata(md)?;
        let engine = match vocab.kind {
            Kind::Bpe { .. } => {
                let merges = if md.contains("tokenizer.ggml.merges") {
                    md.get_str_array("tokenizer.ggml.merges")?
                } else {
                    Vec::new()
                };
                Engine::Bpe(Box::new(bpe::Bpe::new(&vocab, &merges)?))
            }
            Kind::Spm => Engine::Spm(spm::Spm::new(&vocab)),
        };
        let pieces = decode::Pieces::build(&vocab);
        let chat_template = md.opt_str("tokenizer.chat_template")?.map(str::to_string);
        Ok(Tokenizer { vocab, engine, pieces, chat_template })
    }

    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// `tokenizer.chat_template`, if the file has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Token ids for `text`. `add_special` adds BOS/EOS as the vocabulary asks;
    /// `parse_special` turns special-token text (`<|im_start|>`) into the special token.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let v = &self.vocab;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && v.add_bos {
            out.extend(v.specials.bos);
        }
        let mut prev_special = true;
        for frag in special::partition(v, text, parse_special) {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    match &self.engine {
                        Engine::Bpe(bpe) => bpe.encode(v, t, &mut out),
                        Engine::Spm(spm) => {
                            // A space goes before text that starts the input or follows a
                            // special token; then spaces become ▁.
                            let mut s = String::with_capacity(t.len() + 3);
                            if v.add_space_prefix && prev_special {
                                s.push(' ');
                            }
                            s.push_str(t);
                            spm.encode(v, &s.replace(' ', "\u{2581}"), &mut out);
                        }
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && v.add_eos {
            out.extend(v.specials.eos);
        }
        Ok(out)
    }

    /// The bytes of one token (empty for control tokens unless `special`).
    pub fn piece(&self, id: u32, special: bool) -> &[u8] {
        if !special && self.vocab.is_special(id) {
            return &[];
        }
        self.pieces.get(id)
    }

    /// The text of `ids`: their pieces joined (invalid UTF-8 replaced), without the leading
    /// space a SentencePiece vocabulary puts after BOS.
    pub fn decode(&self, ids: &[u32], special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.piece(id, special));
        }
        if ids.first().is_some_and(|&id| Some(id) == self.vocab.specials.bos) && bytes.first() == Some(&b' ') {
            bytes.remove(0);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The next piece of text of a stream of ids: complete characters only.
    pub fn decode_next(&self, decoder: &mut StreamDecoder, id: u32, special: bool) -> String {
        decoder.push_bytes(self.piece(id, special))
    }

    /// Whether `id` ends generation (EOS, EOT and their kin).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.is_eog(id)
    }

    /// The text of a special token by id, for chat templates (`bos_token`, `eos_token`).
    pub fn token_text(&self, id: Option<u32>) -> String {
        id.and_then(|id| self.vocab.text(id)).unwrap_or_default().to_string()
    }
}
