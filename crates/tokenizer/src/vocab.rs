//! The vocabulary of a model, read from `tokenizer.ggml.*` metadata: token texts, scores and
//! types, the special ids, and the flags that steer encoding and decoding, resolved the way
//! llama.cpp resolves them (including its defaults and its by-name fixes for some vocabularies).

use std::collections::BTreeSet;
use std::hash::BuildHasher;

use hashbrown::HashTable;
use onebit_gguf::Metadata;
use rustc_hash::FxBuildHasher;

use crate::error::TokenizerError;

/// Token attributes (llama.cpp's `llama_token_attr`).
pub mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
}

/// The tokenizer algorithm a vocabulary uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Byte-level BPE with merges (`tokenizer.ggml.model = gpt2`), split first by the regexes
    /// of a pre-tokenizer (`tokenizer.ggml.pre`).
    Bpe { pre: String },
    /// SentencePiece-style BPE with scores and byte fallback (`tokenizer.ggml.model = llama`).
    Spm,
}

/// Special token ids. `None` where the vocabulary has none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Specials {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
}

pub struct Vocab {
    pub kind: Kind,
    pub(crate) tokens: Vec<String>,
    pub(crate) scores: Vec<f32>,
    pub(crate) attrs: Vec<u16>,
    /// Token ids by text (the texts live once, in `tokens`).
    index: HashTable<u32>,
    pub specials: Specials,
    pub add_bos: bool,
    pub add_eos: bool,
    pub(crate) add_space_prefix: bool,
    pub(crate) ignore_merges: bool,
    /// Tokens that end generation.
    pub eog: BTreeSet<u32>,
    /// Control, user-defined and unknown tokens, longest text first: the order in which
    /// special-token text is split out of the input.
    pub(crate) special_cache: Vec<u32>,
}

const TOKENS: &str = "tokenizer.ggml.tokens";

/// GGUF token types (llama.cpp's `llama_token_type`) to attributes.
fn attr_of_type(t: i32) -> u16 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => 0,
    }
}

/// Texts llama.cpp treats as end-of-generation whatever their id.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// Texts that name the end-of-turn token when the metadata does not.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

impl Vocab {
    pub fn from_metadata(md: &Metadata) -> Result<Vocab, TokenizerError> {
        let model = md.get_str("tokenizer.ggml.model")?;
        let pre = md.opt_str("tokenizer.ggml.pre")?;
        let (kind, defaults) = match model {
            "gpt2" => {
                let pre = pre.unwrap_or("default");
                let d = crate::bpe::pre_flags(pre)?;
                (Kind::Bpe { pre: pre.to_string() }, d)
            }
            "llama" => (Kind::Spm, Flags { add_bos: true, add_space_prefix: true, ignore_merges: false }),
            other => {
                return Err(TokenizerError::Unsupported(format!(
                    "tokenizer model '{other}' (onebit reads 'gpt2' byte-level BPE and 'llama' SentencePiece vocabularies)"
                )));
            }
        };
        let texts = md.get_str_array(TOKENS)?;
        let n = texts.len();
        if n == 0 || n > u32::MAX as usize / 2 {
            return Err(TokenizerError::Invalid(format!("{TOKENS} has {n} entries")));
        }
        let tokens: Vec<String> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| if t.is_empty() { format!("[EMPTY_{i}]") } else { t.to_string() })
            .collect();
        let scores =
            optional_array(md, "tokenizer.ggml.scores", n, |k| md.get_f32_array(k))?.unwrap_or_else(|| vec![0.0; n]);
        let mut attrs: Vec<u16> = match optional_array(md, "tokenizer.ggml.token_type", n, |k| md.get_i32_array(k))? {
            Some(types) => types.iter().take(n).map(|&t| attr_of_type(t)).collect(),
            None => vec![attr::NORMAL; n],
        };
        let index = build_index(&tokens);

        let specials = read_specials(md, &kind, n)?;
        let flag = |key: &str, default: bool| md.opt_bool(key).map(|v| v.unwrap_or(default));
        let mut vocab = Vocab {
            add_bos: flag("tokenizer.ggml.add_bos_token", defaults.add_bos)?,
            add_eos: flag("tokenizer.ggml.add_eos_token", false)?,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix", defaults.add_space_prefix)?,
            ignore_merges: defaults.ignore_merges,
            kind,
            scores,
            attrs: Vec::new(),
            index,
            specials,
            eog: BTreeSet::new(),
            special_cache: Vec::new(),
            tokens,
        };
        vocab.find_text_specials(&mut attrs);
        vocab.attrs = attrs;
        vocab.special_cache = (0..n as u32)
            .filter(|&i| vocab.attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .collect();
        vocab.special_cache.sort_by_key(|&i| std::cmp::Reverse(vocab.tokens[i as usize].len()));
        vocab.apply_name_fixes(md.opt_str("general.name")?.unwrap_or(""));
        Ok(vocab)
    }

    /// The end-of-turn and end-of-generation tokens llama.cpp finds by their text, marking
    /// them as control tokens as it does.
    fn find_text_specials(&mut self, attrs: &mut [u16]) {
        if self.specials.eot.is_none() {
            self.specials.eot = EOT_TEXTS.iter().find_map(|t| self.id(t));
        }
        if self.specials.eom.is_none() {
            self.specials.eom = self.id("<|eom_id|>");
        }
        for id in [self.specials.eot, self.specials.eom].into_iter().flatten() {
            attrs[id as usize] |= attr::CONTROL;
        }
        // Control tokens named "unused" are unused.
        for (i, t) in self.tokens.iter().enumerate() {
            if attrs[i] & attr::CONTROL != 0 && t.contains("unused") {
                attrs[i] |= attr::UNUSED;
            }
        }
        for text in EOG_TEXTS {
            if let Some(id) = self.id(text) {
                self.eog.insert(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        self.eog.extend([self.specials.eos, self.specials.eot, self.specials.eom].into_iter().flatten());
    }

    /// llama.cpp sets per-token attributes for some vocabularies by name; Phi-3's special tokens
    /// swallow the whitespace that follows them.
    fn apply_name_fixes(&mut self, name: &str) {
        let name = name.to_ascii_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for &id in &self.special_cache {
                self.attrs[id as usize] |= attr::RSTRIP;
            }
            if let Some(id) = self.id("</s>") {
                self.attrs[id as usize] |= attr::RSTRIP;
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(id) = self.id(t) {
                    self.attrs[id as usize] &= !attr::RSTRIP;
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The stored text of a token (byte-level encoded for BPE, with ▁ for SPM).
    pub fn text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(|s| s.as_str())
    }

    pub fn id(&self, text: &str) -> Option<u32> {
        self.index.find(FxBuildHasher.hash_one(text), |&i| self.tokens[i as usize] == text).copied()
    }

    pub fn attr(&self, id: u32) -> u16 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    /// Control or unknown: text that is not rendered unless asked for.
    pub fn is_special(&self, id: u32) -> bool {
        self.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }
}

/// Ids by text. Where texts repeat, the last id wins, as in llama.cpp's map.
fn build_index(tokens: &[String]) -> HashTable<u32> {
    let hash = |t: &str| FxBuildHasher.hash_one(t);
    let mut index = HashTable::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        let h = hash(t);
        match index.find_mut(h, |&j: &u32| tokens[j as usize] == *t) {
            Some(slot) => *slot = i as u32,
            None => {
                index.insert_unique(h, i as u32, |&j: &u32| hash(&tokens[j as usize]));
            }
        }
    }
    index
}

/// Per-vocabulary defaults that llama.cpp derives from the model and pre-tokenizer type.
pub(crate) struct Flags {
    pub add_bos: bool,
    pub add_space_prefix: bool,
    pub ignore_merges: bool,
}

fn optional_array<T>(
    md: &Metadata,
    key: &str,
    n: usize,
    get: impl Fn(&str) -> Result<Vec<T>, onebit_gguf::GgufError>,
) -> Result<Option<Vec<T>>, TokenizerError> {
    if !md.contains(key) {
        return Ok(None);
    }
    let v = get(key)?;
    if v.len() < n {
        return Err(TokenizerError::Invalid(format!("{key} has {} entries for {n} tokens", v.len())));
    }
    Ok(Some(v))
}

fn read_specials(md: &Metadata, kind: &Kind, n: usize) -> Result<Specials, TokenizerError> {
    // llama.cpp's defaults: SentencePiece vocabularies have <unk>=0, <s>=1, </s>=2.
    let mut s = match kind {
        Kind::Spm => Specials { bos: Some(1), eos: Some(2), unk: Some(0), ..Default::default() },
        Kind::Bpe { .. } => Specials { bos: Some(11), eos: Some(11), ..Default::default() },
    };
    let fields: [(&str, &mut Option<u32>); 8] = [
        ("bos", &mut s.bos),
        ("eos", &mut s.eos),
        ("eot", &mut s.eot),
        ("eom", &mut s.eom),
        ("unknown", &mut s.unk),
        ("seperator", &mut s.sep),
        ("padding", &mut s.pad),
        ("mask", &mut s.mask),
    ];
    for (name, slot) in fields {
        if slot.is_some_and(|id| id as usize >= n) {
            *slot = None;
        }
        if let Some(id) = md.opt_u32(&format!("tokenizer.ggml.{name}_token_id"))? {
            // An id outside the vocabulary keeps the default, as llama.cpp does.
            if (id as usize) < n {
                *slot = Some(id);
            }
        }
    }
    Ok(s)
}
