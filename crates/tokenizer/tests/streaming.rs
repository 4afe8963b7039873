//! The streaming detokenizer: text arrives whole characters at a time and adds up to the
//! one-shot decoding, even when a character is spread over several byte tokens.

use onebit_gguf::GgufFile;
use onebit_tokenizer::{StreamDecoder, Tokenizer};

fn tokenizer(model: &str) -> Option<Tokenizer> {
    let f = GgufFile::open(onebit_testkit::shared_file(model)?).unwrap();
    Some(Tokenizer::from_metadata(&f.metadata()).unwrap())
}

fn stream(tok: &Tokenizer, ids: &[u32], special: bool) -> (String, Vec<String>) {
    let mut d = StreamDecoder::new();
    let mut parts = Vec::new();
    for &id in ids {
        let s = tok.decode_next(&mut d, id, special);
        assert!(d.pending().len() < 4, "holds back at most an incomplete character");
        parts.push(s);
    }
    parts.push(d.finish());
    (parts.concat(), parts)
}

#[test]
fn multi_token_characters_come_out_whole() {
    for model in
        ["models/qwen3-q1_0.gguf", "models/vocab/ggml-vocab-llama-spm.gguf", "models/vocab/ggml-vocab-gpt-2.gguf"]
    {
        let Some(tok) = tokenizer(model) else { return };
        let text = "emoji 🦀👨‍👩‍👧‍👦 and 日本語のテキスト, Ünïcödé ∑∫√";
        let ids = tok.encode(text, false, false).unwrap();
        let (all, parts) = stream(&tok, &ids, false);
        let want = tok.decode(&ids, false);
        assert_eq!(all.trim_start(), want.trim_start(), "{model}");
        assert!(
            parts.iter().all(|p| !p.contains('\u{fffd}')),
            "{model}: a replacement character means a split character"
        );
        assert!(ids.len() > text.chars().count() / 3, "{model}: the text needs byte-level tokens to be a real test");
    }
}

#[test]
fn special_tokens_are_dropped_or_rendered() {
    let Some(tok) = tokenizer("models/qwen3-q1_0.gguf") else {
        return;
    };
    let ids = tok.encode("<|im_start|>user\nhi<|im_end|>", false, true).unwrap();
    assert_eq!(ids.len(), 5);
    assert_eq!(stream(&tok, &ids, false).0, "user\nhi");
    assert_eq!(stream(&tok, &ids, true).0, "<|im_start|>user\nhi<|im_end|>");
    assert!(tok.is_eog(*ids.last().unwrap()));
}

#[test]
fn invalid_bytes_become_replacement_characters() {
    let mut d = StreamDecoder::new();
    assert_eq!(d.push_bytes(b"a\xff"), "a\u{fffd}");
    assert_eq!(d.push_bytes(b"\xe2\x82"), "");
    assert_eq!(d.push_bytes(b"\xac!"), "\u{20ac}!");
    assert_eq!(d.push_bytes(b"\xe2"), "");
    assert_eq!(d.finish(), "\u{fffd}");
}
