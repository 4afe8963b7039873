//! The BPE pre-tokenizer's name (`tokenizer.ggml.pre`), found as llama.cpp's converter finds it.
//!
//! The converter does not read the pre-tokenizer's declaration: it encodes a fixed check text
//! with the Hugging Face tokenizer, hashes the id list as Python prints it (`str(list)`), and
//! looks the hash up among the vocabularies it knows (`pre_hashes.txt`), refusing any other.
//! The hash covers the vocabulary too, so two models with one regex (Qwen2 and DeepSeek-R1's
//! distills) get different names. onebit does the same with its own tokenizer: the split regex
//! the `tokenizer.json` declares picks which of its pre-tokenizer families to run (the hash then
//! checks that the choice, the merges and the vocabulary give the Hugging Face ids), and the
//! special tokens `tokenizer.encode` adds go around the ids: the post-processor's, or those of
//! a tokenizer class that replaces it (Llama's: BOS unless `add_bos_token` is false, EOS if
//! `add_eos_token`).

use std::path::Path;

use onebit_gguf::{GgufFile, GgufWriter, OwnedValue, ValueType};
use onebit_tokenizer::Tokenizer;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::ConvertError;

/// llama.cpp's check text (`chktxt` of `get_vocab_base_pre`).
const CHECK_TEXT: &str = "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u{200d}🌫\u{fe0f} (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL";

/// `hash name` lines: the vocabularies llama.cpp's converter knows.
const KNOWN: &str = include_str!("pre_hashes.txt");

/// The split regexes of the families onebit's tokenizer runs, as `tokenizer.json` writes them.
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The vocabulary as the converter writes it (what the check tokenizer is built from).
pub struct BpeVocab<'a> {
    pub tokens: &'a [String],
    pub types: &'a [i32],
    pub merges: &'a [String],
}

/// The name llama.cpp's converter gives this vocabulary's pre-tokenizer, or the error it gives.
pub fn name_by_hash(
    path: &Path,
    tok: &Map<String, Value>,
    tcfg: Option<&Map<String, Value>>,
    v: &BpeVocab,
) -> Result<String, ConvertError> {
    let bad = |why: String| ConvertError::Tokenizer(path.into(), why);
    let family = declared_family(tok).ok_or_else(|| {
        bad("its pre-tokenizer is not one onebit can run to identify the vocabulary; name it with \
             --pre NAME (llama.cpp's name, e.g. qwen2, llama-bpe, smollm, gpt-2)"
            .into())
    })?;
    let ids = check_ids(tok, tcfg, v, family).map_err(bad)?;
    let hash = list_hash(&ids);
    known(&hash).map(str::to_string).ok_or_else(|| {
        bad(format!(
            "the BPE pre-tokenizer was not recognized (chkhsh {hash}): llama.cpp's converter knows no \
             vocabulary that encodes its check text this way and refuses it too; if the tokenizer is a \
             known family, name it with --pre NAME (e.g. {family})"
        ))
    })
}

/// The name a hash stands for in llama.cpp's table.
fn known(hash: &str) -> Option<&'static str> {
    KNOWN
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .find(|(h, _)| *h == hash)
        .map(|(_, name)| name.trim())
}

/// Python's `str()` of a list of ints, hashed as the converter hashes it.
fn list_hash(ids: &[u32]) -> String {
    let text = format!("[{}]", ids.iter().map(u32::to_string).collect::<Vec<_>>().join(", "));
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// The onebit pre-tokenizer family (by a `tokenizer.ggml.pre` name it runs) that the
/// `tokenizer.json` declares: a Qwen2 or Llama 3 split regex before a regex-less byte-level
/// step, single digits before GPT-2's byte-level regex (StarCoder, SmolLM), or GPT-2's alone.
fn declared_family(tok: &Map<String, Value>) -> Option<&'static str> {
    let pre = tok.get("pre_tokenizer")?;
    let steps: Vec<&Value> = match pre.get("pretokenizers").and_then(|p| p.as_array()) {
        Some(list) => list.iter().collect(),
        None => vec![pre],
    };
    let kind = |v: &Value| v.get("type").and_then(|t| t.as_str()).unwrap_or_default().to_string();
    let byte_level = |v: &Value, regex: bool| {
        kind(v) == "ByteLevel" && v.get("use_regex").and_then(|b| b.as_bool()).unwrap_or(true) == regex
    };
    match steps.as_slice() {
        [split, bl] if kind(split) == "Split" && byte_level(bl, false) => {
            match split.get("pattern").and_then(|p| p.get("Regex")).and_then(|r| r.as_str())? {
                QWEN2_SPLIT => Some("qwen2"),
                LLAMA3_SPLIT => Some("llama-bpe"),
                _ => None,
            }
        }
        [digits, bl] if kind(digits) == "Digits" && byte_level(bl, true) => {
            (digits.get("individual_digits").and_then(|b| b.as_bool()) == Some(true)).then_some("smollm")
        }
        [bl] if byte_level(bl, true) => Some("gpt-2"),
        _ => None,
    }
}

/// The ids the Hugging Face tokenizer gives the check text: the text encoded with `family`'s
/// pre-tokenizer, between the special tokens the post-processor adds to a single sequence.
fn check_ids(
    tok: &Map<String, Value>,
    tcfg: Option<&Map<String, Value>>,
    v: &BpeVocab,
    family: &str,
) -> Result<Vec<u32>, String> {
    let mut w = GgufWriter::new();
    w.set("tokenizer.ggml.model", OwnedValue::string("gpt2"))
        .set("tokenizer.ggml.pre", OwnedValue::string(family))
        .set("tokenizer.ggml.tokens", OwnedValue::strings(v.tokens))
        .set(
            "tokenizer.ggml.token_type",
            OwnedValue::Array(ValueType::I32, v.types.iter().map(|&t| OwnedValue::I32(t)).collect()),
        )
        .set("tokenizer.ggml.merges", OwnedValue::strings(v.merges))
        .set("tokenizer.ggml.add_bos_token", OwnedValue::Bool(false))
        .set("tokenizer.ggml.add_eos_token", OwnedValue::Bool(false));
    let bytes = w.to_bytes().map_err(|e| format!("building the check tokenizer: {e}"))?;
    let file = GgufFile::from_bytes(bytes).map_err(|e| format!("building the check tokenizer: {e}"))?;
    let tokenizer =
        Tokenizer::from_metadata(&file.metadata()).map_err(|e| format!("building the check tokenizer: {e}"))?;
    let body = tokenizer.encode(CHECK_TEXT, false, true).map_err(|e| format!("encoding the check text: {e}"))?;
    let (before, after) = match (class_specials(tcfg, v)?, tok.get("post_processor").filter(|p| !p.is_null())) {
        (Some(ids), _) => ids,
        (None, Some(p)) => added_specials(p)?,
        (None, None) => (Vec::new(), Vec::new()),
    };
    Ok([before, body, after].concat())
}

/// The special token ids added before and after the text.
type Around = (Vec<u32>, Vec<u32>);

/// Transformers' Llama tokenizer class (which `AutoTokenizer` loads for `LlamaTokenizer` and
/// `LlamaTokenizerFast`) replaces the post-processor with its own: BOS first unless
/// `add_bos_token` is false, EOS last if `add_eos_token` is true. `None` for other classes.
fn class_specials(tcfg: Option<&Map<String, Value>>, v: &BpeVocab) -> Result<Option<Around>, String> {
    let Some(cfg) = tcfg else { return Ok(None) };
    let class = cfg.get("tokenizer_class").and_then(|c| c.as_str()).unwrap_or_default();
    if !matches!(class, "LlamaTokenizer" | "LlamaTokenizerFast") {
        return Ok(None);
    }
    let flag = |k: &str, default: bool| cfg.get(k).and_then(|b| b.as_bool()).unwrap_or(default);
    let id = |kind: &str| -> Result<u32, String> {
        let text = match cfg.get(&format!("{kind}_token")) {
            Some(Value::String(t)) => Some(t.as_str()),
            Some(Value::Object(o)) => o.get("content").and_then(|c| c.as_str()),
            _ => None,
        };
        let text = text.ok_or_else(|| format!("{class} adds a {kind} token, but tokenizer_config.json names none"))?;
        let pos = v.tokens.iter().position(|t| t == text);
        pos.map(|i| i as u32).ok_or_else(|| format!("the {kind} token {text:?} is not in the vocabulary"))
    };
    let before = if flag("add_bos_token", true) { vec![id("bos")?] } else { Vec::new() };
    let after = if flag("add_eos_token", false) { vec![id("eos")?] } else { Vec::new() };
    Ok(Some((before, after)))
}

/// The ids a post-processor puts before and after a single sequence.
fn added_specials(p: &Value) -> Result<Around, String> {
    let id_of = |v: Option<&Value>| -> Result<u32, String> {
        v.and_then(|v| v.as_u64()).and_then(|i| u32::try_from(i).ok()).ok_or_else(|| format!("bad post-processor {p}"))
    };
    match p.get("type").and_then(|t| t.as_str()) {
        Some("Sequence") => {
            let (mut before, mut after) = (Vec::new(), Vec::new());
            for inner in p.get("processors").and_then(|v| v.as_array()).into_iter().flatten() {
                let (b, a) = added_specials(inner)?;
                // Each processor wraps what the previous ones gave.
                before.splice(0..0, b);
                after.extend(a);
            }
            Ok((before, after))
        }
        Some("TemplateProcessing") => {
            let (mut before, mut after, mut seen_text) = (Vec::new(), Vec::new(), false);
            for piece in p.get("single").and_then(|v| v.as_array()).into_iter().flatten() {
                if piece.get("Sequence").is_some() {
                    seen_text = true;
                    continue;
                }
                let name = piece.get("SpecialToken").and_then(|s| s.get("id")).and_then(|i| i.as_str());
                let name = name.ok_or_else(|| format!("bad post-processor piece {piece}"))?;
                let ids = p.get("special_tokens").and_then(|s| s.get(name)).and_then(|s| s.get("ids"));
                let ids = ids.and_then(|i| i.as_array()).ok_or_else(|| format!("post-processor: no ids for {name}"))?;
                let ids = ids.iter().map(|i| id_of(Some(i))).collect::<Result<Vec<u32>, String>>()?;
                if seen_text { after.extend(ids) } else { before.extend(ids) }
            }
            Ok((before, after))
        }
        Some("BertProcessing" | "RobertaProcessing") => {
            let cls = id_of(p.get("cls").and_then(|c| c.get(1)))?;
            let sep = id_of(p.get("sep").and_then(|c| c.get(1)))?;
            Ok((vec![cls], vec![sep]))
        }
        Some("ByteLevel") => Ok((Vec::new(), Vec::new())),
        other => Err(format!("post-processor {other:?} is not one onebit knows")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values computed by Python: `hashlib.sha256(str(ids).encode()).hexdigest()`.
    #[test]
    fn id_lists_hash_as_python_prints_them() {
        assert_eq!(list_hash(&[128000, 198, 2, 0]), "d9f83d760785fd50b8e643f02aec1d016e4c4af9abcdbbc4c2bcd9cffbd4d6ae");
        assert_eq!(list_hash(&[]), "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945");
    }

    /// `hashlib.sha256(chktxt.encode()).hexdigest()` of llama.cpp's check text.
    #[test]
    fn check_text_is_llama_cpps() {
        let h: String = Sha256::digest(CHECK_TEXT.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(h, "a36179c1e2b1cfcfbfad1dc779addad2ffc778201e4cf0d538bddeafa2c526da");
        assert_eq!(CHECK_TEXT.chars().count(), 350);
    }

    #[test]
    fn table_names_known_vocabularies() {
        assert_eq!(known("855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249"), Some("smollm"));
        assert_eq!(known("d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c"), Some("qwen2"));
        // Listed twice by the converter: its later name wins.
        assert_eq!(known("b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166"), Some("olmo"));
        assert_eq!(known("00"), None);
    }

    /// Real vocabularies (llama.cpp's vocabulary files and a model in `../shared`) with their
    /// families' `tokenizer.json` pipelines hash to the values llama.cpp's table lists for them:
    /// onebit's tokenizer gives the Hugging Face ids on the check text.
    #[test]
    fn real_vocabularies_get_llama_cpps_names() {
        use serde_json::json;
        let split = |re: &str| {
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]})
        };
        let byte_level =
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        let bos = |id: u32| {
            json!({"type": "TemplateProcessing",
                   "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                   "special_tokens": {"<bos>": {"ids": [id]}}})
        };
        let cases = [
            ("models/vocab/ggml-vocab-llama-bpe.gguf", split(LLAMA3_SPLIT), bos(128000), "llama-bpe"),
            ("models/vocab/ggml-vocab-gpt-2.gguf", byte_level.clone(), byte_level.clone(), "gpt-2"),
            ("models/qwen3-q1_0.gguf", split(QWEN2_SPLIT), byte_level.clone(), "qwen2"),
        ];
        for (file, pre, post, want) in cases {
            let Some(path) = onebit_testkit::shared_file(file) else { return };
            let gguf = GgufFile::open(&path).unwrap();
            let md = gguf.metadata();
            let tokens: Vec<String> =
                md.get_str_array("tokenizer.ggml.tokens").unwrap().into_iter().map(String::from).collect();
            let types = md.get_i32_array("tokenizer.ggml.token_type").unwrap();
            let merges: Vec<String> =
                md.get_str_array("tokenizer.ggml.merges").unwrap().into_iter().map(String::from).collect();
            let tok = json!({"pre_tokenizer": pre, "post_processor": post});
            let v = BpeVocab { tokens: &tokens, types: &types, merges: &merges };
            let got = name_by_hash(Path::new(file), tok.as_object().unwrap(), None, &v);
            assert_eq!(got.map_err(|e| e.to_string()).as_deref(), Ok(want), "{file}");
        }
    }

    /// DeepSeek-R1's Qwen distills: Qwen2's vocabulary with its own special tokens, and
    /// Transformers' Llama tokenizer class, which adds BOS whatever `tokenizer.json` says.
    #[test]
    fn llama_tokenizer_class_adds_bos() {
        use serde_json::json;
        let Some(path) = onebit_testkit::shared_file("models/qwen3-q1_0.gguf") else { return };
        let gguf = GgufFile::open(&path).unwrap();
        let md = gguf.metadata();
        let mut tokens: Vec<String> =
            md.get_str_array("tokenizer.ggml.tokens").unwrap().into_iter().map(String::from).collect();
        let bos = "<\u{ff5c}begin\u{2581}of\u{2581}sentence\u{ff5c}>";
        tokens[151646] = bos.to_string();
        let types = md.get_i32_array("tokenizer.ggml.token_type").unwrap();
        let merges: Vec<String> =
            md.get_str_array("tokenizer.ggml.merges").unwrap().into_iter().map(String::from).collect();
        let tok = json!({
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
            "post_processor": {"type": "ByteLevel"}
        });
        let cfg = json!({"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": true,
                         "bos_token": {"content": bos, "special": true}});
        let v = BpeVocab { tokens: &tokens, types: &types, merges: &merges };
        let got = name_by_hash(Path::new("t"), tok.as_object().unwrap(), cfg.as_object(), &v);
        assert_eq!(got.map_err(|e| e.to_string()).as_deref(), Ok("deepseek-r1-qwen"));
    }

    #[test]
    fn post_processors_wrap_the_sequence() {
        let llama3 = serde_json::json!({"type": "Sequence", "processors": [
            {"type": "ByteLevel"},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                        {"SpecialToken": {"id": "</s>", "type_id": 0}}],
             "special_tokens": {"<s>": {"ids": [7]}, "</s>": {"ids": [9]}}}
        ]});
        assert_eq!(added_specials(&llama3).unwrap(), (vec![7], vec![9]));
    }
}
