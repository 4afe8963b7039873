//! `tokenizer.json` and `tokenizer_config.json` to GGUF's `tokenizer.*` metadata, as llama.cpp's
//! converter writes it for byte-level BPE vocabularies (`tokenizer.ggml.model = gpt2`): tokens
//! and their types, merges, special token ids, the add-BOS/EOS flags and the chat template.
//! Llama-family checkpoints with a `tokenizer.model` get its SentencePiece vocabulary instead
//! ([`spm`], `tokenizer.ggml.model = llama`), as llama.cpp's Llama converter prefers it.
//!
//! The pre-tokenizer is named as llama.cpp names it, by the hash of the ids a fixed text
//! encodes to ([`pre`]); `--pre` names it when that hash is unknown.

use std::path::Path;

use onebit_gguf::{OwnedValue, ValueType};
use serde_json::{Map, Value};

use super::ConvertError;
use super::hf::read_json;
use super::pre::{self, BpeVocab};
use super::spm;

/// llama.cpp's token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// The special token kinds, in the order llama.cpp's converter looks them up.
const KINDS: [&str; 7] = ["bos", "eos", "unk", "sep", "pad", "cls", "mask"];

fn id_key(kind: &str) -> String {
    let k = match kind {
        "unk" => "unknown",
        "sep" => "seperator", // sic: llama.cpp's key
        "pad" => "padding",
        other => other,
    };
    format!("tokenizer.ggml.{k}_token_id")
}

/// The keys, in the converter's order. `add_space_prefix` is read only for Llama (as llama.cpp).
/// The vocabulary's size comes from the `hparams` (with Transformers' defaults), the special
/// token ids from config.json as it is (`config`), as the converter reads each.
pub fn vocab_keys(
    dir: &Path,
    hparams: &Map<String, Value>,
    config: &Map<String, Value>,
    llama: bool,
    pre_override: Option<&str>,
) -> Result<Vec<(String, OwnedValue)>, ConvertError> {
    let mut kv = tokenizer_keys(dir, hparams, config, llama, pre_override)?;
    // The converter's Llama turns BOS off for every 49,152-token vocabulary (meant for Granite's
    // small models; SmolLM's has that size too), overwriting the key in place if it is there.
    if llama && hparams.get("vocab_size").and_then(|v| v.as_u64()).unwrap_or(32000) == 49152 {
        let key = "tokenizer.ggml.add_bos_token";
        match kv.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = OwnedValue::Bool(false),
            None => kv.push((key.into(), OwnedValue::Bool(false))),
        }
    }
    Ok(kv)
}

fn tokenizer_keys(
    dir: &Path,
    hparams: &Map<String, Value>,
    config: &Map<String, Value>,
    llama: bool,
    pre_override: Option<&str>,
) -> Result<Vec<(String, OwnedValue)>, ConvertError> {
    let tok_path = dir.join("tokenizer.json");
    let spm_path = dir.join("tokenizer.model");
    // llama.cpp's Llama converter prefers `tokenizer.model` when there is one; the others read
    // `tokenizer.json` first.
    let spm = spm_path.is_file() && (llama || !tok_path.exists());
    if spm && !llama {
        return Err(ConvertError::Tokenizer(
            spm_path,
            "SentencePiece vocabularies are supported for Llama-family (Llama, Mistral) checkpoints only".into(),
        ));
    }
    let tok = match read_json(&tok_path)? {
        Some(Value::Object(m)) => m,
        Some(_) => return Err(ConvertError::Json(tok_path, "not a JSON object".into())),
        None if spm => Map::new(),
        None => return Err(ConvertError::MissingFile(tok_path)),
    };
    let cfg_path = dir.join("tokenizer_config.json");
    let mut tcfg = match read_json(&cfg_path)? {
        Some(Value::Object(m)) => Some(m),
        _ => None,
    };
    if spm {
        return spm_keys(dir, &tok, tcfg, hparams, config, llama);
    }
    let bad = |why: String| ConvertError::Tokenizer(tok_path.clone(), why);
    let model = tok.get("model").and_then(|m| m.as_object()).ok_or_else(|| bad("no \"model\" object".into()))?;
    if model.get("type").and_then(|t| t.as_str()) != Some("BPE") {
        return Err(bad("only BPE vocabularies are supported".into()));
    }
    if model.get("byte_fallback").and_then(|b| b.as_bool()) == Some(true) {
        return Err(bad("BPE with byte fallback (SentencePiece-style) is not supported by onebit convert yet".into()));
    }
    let mut kv = space_prefix(tcfg.as_ref(), llama);
    let (tokens, types) = token_list(&tok, model, hparams).map_err(bad)?;
    let merges = merges(model).map_err(bad)?;
    let pre = match pre_override {
        Some(p) => p.to_string(),
        None => {
            let v = BpeVocab { tokens: &tokens, types: &types, merges: &merges };
            pre::name_by_hash(&tok_path, &tok, tcfg.as_ref(), &v)?
        }
    };
    kv.push(("tokenizer.ggml.model".into(), OwnedValue::string("gpt2")));
    kv.push(("tokenizer.ggml.pre".into(), OwnedValue::string(pre)));
    kv.push(("tokenizer.ggml.tokens".into(), OwnedValue::strings(&tokens)));
    kv.push((
        "tokenizer.ggml.token_type".into(),
        OwnedValue::Array(ValueType::I32, types.into_iter().map(OwnedValue::I32).collect()),
    ));
    if !merges.is_empty() {
        kv.push(("tokenizer.ggml.merges".into(), OwnedValue::strings(&merges)));
    }
    special_keys(dir, &tok, tcfg.as_mut(), config, None, &mut kv)?;
    Ok(kv)
}

/// The keys for a SentencePiece vocabulary: `llama` tokens with scores and types, then the
/// special tokens found as for BPE (`tokenizer.json`, when present, included).
fn spm_keys(
    dir: &Path,
    tok: &Map<String, Value>,
    mut tcfg: Option<Map<String, Value>>,
    hparams: &Map<String, Value>,
    config: &Map<String, Value>,
    llama: bool,
) -> Result<Vec<(String, OwnedValue)>, ConvertError> {
    let mut kv = space_prefix(tcfg.as_ref(), llama);
    let v = spm::load(dir, hparams, tcfg.as_ref())?;
    let n = v.tokens.len();
    kv.push(("tokenizer.ggml.model".into(), OwnedValue::string("llama")));
    kv.push(("tokenizer.ggml.pre".into(), OwnedValue::string("default")));
    kv.push(("tokenizer.ggml.tokens".into(), OwnedValue::strings(&v.tokens)));
    kv.push((
        "tokenizer.ggml.scores".into(),
        OwnedValue::Array(ValueType::F32, v.scores.into_iter().map(OwnedValue::F32).collect()),
    ));
    kv.push((
        "tokenizer.ggml.token_type".into(),
        OwnedValue::Array(ValueType::I32, v.types.into_iter().map(OwnedValue::I32).collect()),
    ));
    special_keys(dir, tok, tcfg.as_mut(), config, Some(n), &mut kv)?;
    Ok(kv)
}

fn space_prefix(tcfg: Option<&Map<String, Value>>, llama: bool) -> Vec<(String, OwnedValue)> {
    match tcfg.and_then(|c| c.get("add_prefix_space")).and_then(|v| v.as_bool()) {
        Some(b) if llama => vec![("tokenizer.ggml.add_space_prefix".into(), OwnedValue::Bool(b))],
        _ => Vec::new(),
    }
}

/// Special token ids (those under `n_vocab`, when given), add-token flags, chat template and
/// normalizer flags, in llama.cpp's `SpecialVocab` order.
fn special_keys(
    dir: &Path,
    tok: &Map<String, Value>,
    mut tcfg: Option<&mut Map<String, Value>>,
    config: &Map<String, Value>,
    n_vocab: Option<usize>,
    kv: &mut Vec<(String, OwnedValue)>,
) -> Result<(), ConvertError> {
    let bad = |why: String| ConvertError::Tokenizer(dir.join("tokenizer.json"), why);
    let special = Special::load(tok, tcfg.as_deref_mut(), config, n_vocab).map_err(bad)?;
    for (kind, id) in &special.ids {
        kv.push((id_key(kind), OwnedValue::U32(*id)));
    }
    for (kind, on) in &special.add {
        kv.push((format!("tokenizer.ggml.add_{kind}_token"), OwnedValue::Bool(*on)));
    }
    if let Some(cfg) = tcfg.as_deref()
        && let Some(t) = chat_template(dir, cfg)?
    {
        kv.push(("tokenizer.chat_template".into(), OwnedValue::string(t)));
    }
    if let Some(n) = tok.get("normalizer").and_then(|n| n.as_object()) {
        let (mut lower, mut strip) = (None, None);
        normalizer_flags(n, &mut lower, &mut strip);
        if let Some(b) = lower {
            kv.push(("tokenizer.ggml.normalizer.lowercase".into(), OwnedValue::Bool(b)));
        }
        if let Some(b) = strip {
            kv.push(("tokenizer.ggml.normalizer.strip_accents".into(), OwnedValue::Bool(b)));
        }
    }
    Ok(())
}

/// Tokens by id up to the config's vocabulary size (the converter pads with `[PADn]`), and
/// their types.
fn token_list(
    tok: &Map<String, Value>,
    model: &Map<String, Value>,
    config: &Map<String, Value>,
) -> Result<(Vec<String>, Vec<i32>), String> {
    let vocab = model.get("vocab").and_then(|v| v.as_object()).ok_or("no model.vocab object")?;
    let mut by_id: Vec<Option<(String, i32)>> = Vec::new();
    let mut put = |id: u64, text: String, ty: i32| {
        let id = id as usize;
        if by_id.len() <= id {
            by_id.resize(id + 1, None);
        }
        by_id[id] = Some((text, ty));
    };
    for (text, id) in vocab {
        put(id.as_u64().ok_or_else(|| format!("token {text:?} has no integer id"))?, text.clone(), NORMAL);
    }
    for added in tok.get("added_tokens").and_then(|a| a.as_array()).into_iter().flatten() {
        let text = added.get("content").and_then(|c| c.as_str()).ok_or("an added token has no content")?;
        let id = added.get("id").and_then(|i| i.as_u64()).ok_or("an added token has no id")?;
        let special = added.get("special").and_then(|s| s.as_bool()).unwrap_or(false);
        let (text, ty) = if special || looks_special(text) {
            (text.to_string(), CONTROL)
        } else {
            (text.replace('\u{2581}', " "), USER_DEFINED)
        };
        put(id, text, ty);
    }
    let n = config.get("vocab_size").and_then(|v| v.as_u64()).map(|v| v as usize).unwrap_or(by_id.len());
    if by_id.len() > n {
        return Err(format!("token id {} is past config.json's vocab_size {n}", by_id.len() - 1));
    }
    let (tokens, types) = (0..n)
        .map(|i| match by_id.get(i).cloned().flatten() {
            Some(t) => t,
            None => (format!("[PAD{i}]"), UNUSED),
        })
        .unzip();
    Ok((tokens, types))
}

/// Added tokens llama.cpp treats as control tokens whatever their `special` flag says.
pub(super) fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<\u{ff5c}") && t.ends_with("\u{ff5c}>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

/// Merges as "a b" strings; pairs (Transformers 4.45+) are joined, a space inside a part
/// written as U+0120 as llama.cpp does.
fn merges(model: &Map<String, Value>) -> Result<Vec<String>, String> {
    let Some(list) = model.get("merges").and_then(|m| m.as_array()) else {
        return Ok(Vec::new());
    };
    list.iter()
        .map(|m| match m {
            Value::String(s) => Ok(s.clone()),
            Value::Array(pair) if pair.len() == 2 => {
                let part = |v: &Value| v.as_str().map(|s| s.replace(' ', "\u{120}"));
                match (part(&pair[0]), part(&pair[1])) {
                    (Some(a), Some(b)) => Ok(format!("{a} {b}")),
                    _ => Err("a merge is not a pair of strings".to_string()),
                }
            }
            _ => Err("unknown merges format".to_string()),
        })
        .collect()
}

fn normalizer_flags(n: &Map<String, Value>, lower: &mut Option<bool>, strip: &mut Option<bool>) {
    match n.get("type").and_then(|t| t.as_str()) {
        Some("Lowercase") => *lower = Some(true),
        Some("StripAccents") => *strip = Some(true),
        Some("BertNormalizer") => {
            if let Some(b) = n.get("lowercase").and_then(|v| v.as_bool()) {
                *lower = Some(b);
            }
            if let Some(b) = n.get("strip_accents").and_then(|v| v.as_bool()) {
                *strip = Some(b);
            }
        }
        Some("Sequence") => {
            for inner in n.get("normalizers").and_then(|v| v.as_array()).into_iter().flatten() {
                if let Some(m) = inner.as_object() {
                    normalizer_flags(m, lower, strip);
                }
            }
        }
        _ => {}
    }
}

fn chat_template(dir: &Path, cfg: &Map<String, Value>) -> Result<Option<String>, ConvertError> {
    let value = match cfg.get("chat_template") {
        Some(v) => Some(v.clone()),
        None => {
            let jinja = dir.join("chat_template.jinja");
            if jinja.is_file() {
                let text = std::fs::read_to_string(&jinja).map_err(|e| ConvertError::Io(jinja, e))?;
                Some(Value::String(text))
            } else {
                read_json(&dir.join("chat_template.json"))?.and_then(|j| j.get("chat_template").cloned())
            }
        }
    };
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ConvertError::Tokenizer(
            dir.join("tokenizer_config.json"),
            "named chat templates (a list) are not supported by onebit convert yet".into(),
        )),
    }
}

/// Special token ids and add-token flags, found as llama.cpp's `SpecialVocab` finds them.
#[derive(Default)]
struct Special {
    ids: Vec<(String, u32)>,
    add: Vec<(String, bool)>,
    /// Ids at or past this are skipped (SentencePiece vocabularies give it; BPE does not).
    n_vocab: Option<usize>,
}

impl Special {
    fn set_add(&mut self, kind: &str, on: bool, overwrite: bool) {
        match self.add.iter_mut().find(|(k, _)| k == kind) {
            Some(slot) if overwrite => slot.1 = on,
            Some(_) => {}
            None => self.add.push((kind.to_string(), on)),
        }
    }

    fn set_id(&mut self, kind: &str, id: Option<u64>) {
        if let Some(id) = id.and_then(|i| u32::try_from(i).ok())
            && self.n_vocab.is_none_or(|n| (id as usize) < n)
            && !self.ids.iter().any(|(k, _)| k == kind)
        {
            self.ids.push((kind.to_string(), id));
        }
    }

    fn load(
        tok: &Map<String, Value>,
        mut tcfg: Option<&mut Map<String, Value>>,
        config: &Map<String, Value>,
        n_vocab: Option<usize>,
    ) -> Result<Special, String> {
        let mut s = Special { n_vocab, ..Special::default() };
        let token_of = |c: Option<&Map<String, Value>>, k: &str| -> Option<String> {
            match c?.get(&format!("{k}_token"))? {
                Value::String(t) => Some(t.clone()),
                Value::Object(o) => o.get("content").and_then(|t| t.as_str()).map(String::from),
                _ => None,
            }
        };
        let special_bos = token_of(tcfg.as_deref(), "bos");
        let special_cls = token_of(tcfg.as_deref(), "cls");
        let special_eos = token_of(tcfg.as_deref(), "eos");
        let special_sep = token_of(tcfg.as_deref(), "sep");
        if let Some(cfg) = tcfg.as_deref_mut() {
            if special_bos.is_none() && special_cls.is_some() {
                cfg.insert("bos_token".into(), special_cls.clone().into());
            }
            if special_eos.is_none() && special_sep.is_some() {
                cfg.insert("eos_token".into(), special_sep.clone().into());
            }
        }
        let (special_bos, special_eos) = (special_bos.or(special_cls.clone()), special_eos.or(special_sep.clone()));
        if let Some(post) = tok.get("post_processor").filter(|p| !p.is_null()) {
            let procs: Vec<&Value> = match post.get("processors").and_then(|p| p.as_array()) {
                Some(list) => list.iter().collect(),
                None => vec![post],
            };
            for p in procs {
                match p.get("type").and_then(|t| t.as_str()) {
                    Some("ByteLevel") => {
                        s.set_add("bos", false, false);
                        s.set_add("eos", false, false);
                    }
                    Some("TemplateProcessing") => {
                        s.template(
                            p,
                            special_bos.as_deref(),
                            special_cls.as_deref(),
                            special_eos.as_deref(),
                            special_sep.as_deref(),
                            tcfg.is_some(),
                        )?;
                    }
                    Some("RobertaProcessing") => {
                        return Err("RobertaProcessing post-processors are not supported".into());
                    }
                    _ => {}
                }
            }
        }
        let added: Vec<(String, u64)> = tok
            .get("added_tokens")
            .and_then(|a| a.as_array())
            .into_iter()
            .flatten()
            .filter_map(|t| Some((t.get("content")?.as_str()?.to_string(), t.get("id")?.as_u64()?)))
            .collect();
        if let Some(cfg) = tcfg.as_deref() {
            for kind in &KINDS {
                if let Some(on) = cfg.get(&format!("add_{kind}_token")).and_then(|v| v.as_bool()) {
                    s.set_add(kind, on, false);
                }
                if let Some(content) = token_of(Some(cfg), kind) {
                    s.set_id(kind, added.iter().find(|(c, _)| *c == content).map(|(_, id)| *id));
                }
            }
        }
        let text = config.get("text_config").and_then(|t| t.as_object());
        for kind in &KINDS {
            let key = format!("{kind}_token_id");
            let v = config.get(&key).or_else(|| text.and_then(|t| t.get(&key)));
            s.set_id(kind, v.and_then(|v| v.as_u64()));
        }
        Ok(s)
    }

    /// The simple `TemplateProcessing` cases: a leading BOS/CLS, a trailing EOS, a separator
    /// between a pair. Anything else is refused rather than guessed.
    #[allow(clippy::too_many_arguments)]
    fn template(
        &mut self,
        p: &Value,
        bos: Option<&str>,
        cls: Option<&str>,
        eos: Option<&str>,
        sep: Option<&str>,
        has_config: bool,
    ) -> Result<(), String> {
        let special_id =
            |v: &Value| v.get("SpecialToken").and_then(|s| s.get("id")).and_then(|i| i.as_str()).map(String::from);
        let seq_id = |v: &Value| v.get("Sequence").and_then(|s| s.get("id")).and_then(|i| i.as_str()).map(String::from);
        let empty = Vec::new();
        let single = p.get("single").and_then(|v| v.as_array()).unwrap_or(&empty);
        let pair = p.get("pair").and_then(|v| v.as_array()).unwrap_or(&empty);
        let (mut first, mut last) = (None, None);
        if single.len() > 1 {
            first = special_id(&single[0]);
            if let Some(f) = &first {
                let known = !has_config || Some(f.as_str()) == bos || Some(f.as_str()) == cls;
                if !known {
                    return Err(format!("the post-processor adds {f:?} first, which is not the BOS token"));
                }
                self.set_add("bos", true, true);
            }
            last = special_id(&single[single.len() - 1]);
            if let Some(l) = &last {
                if has_config && Some(l.as_str()) != eos {
                    return Err(format!("the post-processor adds {l:?} last, which is not the EOS token"));
                }
                self.set_add("eos", true, true);
            }
        }
        if pair.is_empty() {
            return Ok(());
        }
        let start = usize::from(first.is_some() && special_id(&pair[0]) == first);
        let stop =
            if last.is_some() && special_id(&pair[pair.len() - 1]) == last { pair.len() - 1 } else { pair.len() };
        let inner = &pair[start..stop.max(start)];
        if inner.len() < 2
            || seq_id(&inner[0]).as_deref() != Some("A")
            || seq_id(&inner[inner.len() - 1]).as_deref() != Some("B")
        {
            return Ok(());
        }
        let middle = &inner[1..inner.len() - 1];
        if middle.is_empty() {
            return Ok(());
        }
        let mut add_sep = false;
        let is_sep = |t: &Option<String>| t.as_deref().is_some_and(|t| Some(t) == sep || Some(t) == eos);
        let entry = special_id(&middle[0]);
        if is_sep(&entry) && last.is_none() {
            add_sep = true;
        }
        if middle.len() == 2 && is_sep(&special_id(&middle[1])) {
            add_sep = true;
        }
        self.set_add("sep", add_sep, true);
        Ok(())
    }
}
