//! Parity with llama.cpp's tokenizers and with Jinja2's chat-template renderings, on every case
//! of `../shared/fixtures/tokenizer-*.json` and `chat-templates.json`. No exceptions.

use onebit_gguf::GgufFile;
use onebit_tokenizer::{ChatRequest, ChatTemplate, Tokenizer};
use serde_json::Value;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn check_vocab(fixture: &str, model: &str) {
    check_vocab_at(fixture, onebit_testkit::shared_file(model));
}

fn check_vocab_at(fixture: &str, model: Option<std::path::PathBuf>) {
    let Some(fx) = onebit_testkit::fixture(fixture) else {
        return;
    };
    let Some(model) = model else { return };
    let file = GgufFile::open(model).unwrap();
    let tok = Tokenizer::from_metadata(&file.metadata()).unwrap();
    let mut failures = Vec::new();
    let cases = fx["cases"].as_array().unwrap();
    for (i, c) in cases.iter().enumerate() {
        let text = c["text"].as_str().unwrap();
        let (want, want_plain) = (ids(&c["ids"]), ids(&c["ids_no_special"]));
        let got = tok.encode(text, false, true).unwrap();
        let got_plain = tok.encode(text, false, false).unwrap();
        let decoded = tok.decode(&want, false);
        let decoded_sp = tok.decode(&want, true);
        let mut bad = Vec::new();
        if got != want {
            bad.push(format!("ids {got:?} != {want:?}"));
        }
        if got_plain != want_plain {
            bad.push(format!("ids_no_special {got_plain:?} != {want_plain:?}"));
        }
        if decoded != c["decoded"].as_str().unwrap() {
            bad.push(format!("decoded {decoded:?} != {:?}", c["decoded"]));
        }
        if decoded_sp != c["decoded_with_special"].as_str().unwrap() {
            bad.push(format!("decoded_with_special {decoded_sp:?} != {:?}", c["decoded_with_special"]));
        }
        if !bad.is_empty() {
            failures.push(format!("case {i} {text:?}: {}", bad.join("; ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{fixture}: {} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.iter().take(8).cloned().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn qwen3() {
    check_vocab("tokenizer-qwen3.json", "models/qwen3-q1_0.gguf");
}

#[test]
fn smollm() {
    check_vocab("tokenizer-smollm.json", "models/llama-q4_1.gguf");
}

#[test]
fn llama_spm() {
    check_vocab("tokenizer-llama-spm.json", "models/vocab/ggml-vocab-llama-spm.gguf");
}

#[test]
fn llama_bpe() {
    check_vocab("tokenizer-llama-bpe.json", "models/vocab/ggml-vocab-llama-bpe.gguf");
}

#[test]
fn phi_3() {
    check_vocab("tokenizer-phi-3.json", "models/vocab/ggml-vocab-phi-3.gguf");
}

#[test]
fn gpt_2() {
    check_vocab("tokenizer-gpt-2.json", "models/vocab/ggml-vocab-gpt-2.gguf");
}

#[test]
fn deepseek_llm() {
    check_vocab("tokenizer-deepseek-llm.json", "models/vocab/ggml-vocab-deepseek-llm.gguf");
}

/// Gemma 3's SentencePiece vocabulary (262,144 tokens, user-defined tokens for whitespace runs
/// and HTML tags that match even in plain text), from the real model in onebit's cache.
#[test]
fn gemma3() {
    check_vocab_at("tokenizer-gemma3.json", onebit_testkit::gemma3_model());
}

#[test]
fn chat_templates_render_like_jinja2() {
    let Some(fx) = onebit_testkit::fixture("chat-templates.json") else {
        return;
    };
    let shared = onebit_testkit::shared().unwrap();
    let mut failures = Vec::new();
    let cases = fx["cases"].as_array().unwrap();
    for c in cases {
        let model = c["model"].as_str().unwrap();
        let source = if model.ends_with(".gguf") {
            let f = GgufFile::open(shared.join("models").join(model)).unwrap();
            f.metadata().get_str("tokenizer.chat_template").unwrap().to_string()
        } else {
            std::fs::read_to_string(shared.join("templates").join(model)).unwrap()
        };
        let mut req = ChatRequest::from_json(&c["input"]).unwrap();
        req.bos_token = String::new();
        req.eos_token = "<|im_end|>".into();
        req.today = chrono::NaiveDate::from_ymd_opt(2026, 11, 21);
        let result = ChatTemplate::new(&source).and_then(|t| t.render(&req));
        let case = format!("{model} / {}", c["case"].as_str().unwrap());
        match (&c["error"], result) {
            (Value::Null, Ok(text)) if text == c["rendered"].as_str().unwrap() => {}
            (Value::Null, Ok(text)) => {
                failures.push(format!("{case}: rendered\n{text:?}\nexpected\n{:?}", c["rendered"].as_str().unwrap()))
            }
            (Value::Null, Err(e)) => failures.push(format!("{case}: error {e}")),
            (want, Err(e)) if e.to_string().contains(want.as_str().unwrap()) => {}
            (want, other) => failures.push(format!("{case}: expected error {want}, got {other:?}")),
        }
    }
    assert!(failures.is_empty(), "{} of {} renderings differ:\n{}", failures.len(), cases.len(), failures.join("\n\n"));
}
