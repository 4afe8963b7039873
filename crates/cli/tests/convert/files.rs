//! The tokenizer and model-card files of `convert.rs`'s checkpoints that are written rather than
//! copied from `tests/data/convert/`.

use std::path::Path;

use serde_json::json;

/// A model card as Hugging Face READMEs carry them: the fields gguf-py reads, in their several
/// forms (a list of base models as an id, a URL and a mapping; a dataset; languages including
/// the YAML 1.1 "no"; tags and a pipeline tag), then the card's text.
pub const MODEL_CARD: &str = include_str!("../data/convert/model-card.md");

/// SmolLM2's tokenizer files, rebuilt from the vocabulary of `../shared/models/llama-q4_1.gguf`
/// (SmolLM2's tokens, merges, special tokens and chat template) in the layout of SmolLM2's own
/// `tokenizer.json` and `tokenizer_config.json`. Being the real vocabulary and pipeline, its check
/// text hashes to a value llama.cpp's converter knows ("smollm").
pub fn smollm_tokenizer(dir: &Path) {
    let path =
        onebit_testkit::shared_file("models/llama-q4_1.gguf").expect("../shared is needed for SmolLM's vocabulary");
    let file = onebit_gguf::GgufFile::open(&path).unwrap();
    let md = file.metadata();
    let tokens = md.get_str_array("tokenizer.ggml.tokens").unwrap();
    let types = md.get_i32_array("tokenizer.ggml.token_type").unwrap();
    let merges = md.get_str_array("tokenizer.ggml.merges").unwrap();
    let template = md.get_str("tokenizer.chat_template").unwrap();
    // As in SmolLM2's file, the special tokens are in the BPE vocabulary too.
    let vocab: serde_json::Map<String, serde_json::Value> =
        tokens.iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
    let specials: Vec<(usize, &str)> =
        tokens.iter().enumerate().filter(|(i, _)| types[*i] == 3).map(|(i, t)| (i, *t)).collect();
    let entry = |content: &str| {
        json!({"content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false,
               "special": true})
    };
    let added: Vec<serde_json::Value> = specials
        .iter()
        .map(|(i, t)| {
            let mut e = entry(t);
            e.as_object_mut().unwrap().insert("id".into(), json!(i));
            e
        })
        .collect();
    let byte_level = |prefix: bool, trim: bool| json!({"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": trim, "use_regex": true});
    let tok = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(false, true)
        ]},
        "post_processor": byte_level(true, false),
        "decoder": byte_level(true, true),
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    });
    std::fs::write(dir.join("tokenizer.json"), serde_json::to_string(&tok).unwrap()).unwrap();
    let decoder: serde_json::Map<String, serde_json::Value> =
        specials.iter().map(|(i, t)| (i.to_string(), entry(t))).collect();
    let cfg = json!({
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": "<|im_start|>",
        "chat_template": template,
        "clean_up_tokenization_spaces": false,
        "eos_token": "<|im_end|>",
        "model_max_length": 8192,
        "pad_token": "<|im_end|>",
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": "<|endoftext|>",
        "vocab_size": 49152
    });
    std::fs::write(dir.join("tokenizer_config.json"), serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
}

/// Llama 2 folders ship a `tokenizer.json` beside `tokenizer.model`: the converter takes the
/// vocabulary from `tokenizer.model` and only the special tokens from it. This is the part it
/// reads (added tokens, normalizer, post-processor), in Llama 2's layout; its BPE vocabulary is
/// left empty, so a converter that read it would write a different file.
pub fn llama2_tokenizer_json(dir: &Path) {
    let added = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true})
    };
    let special = |id: &str, type_id: u32| json!({"SpecialToken": {"id": id, "type_id": type_id}});
    let seq = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let tok = json!({
        "version": "1.0",
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u{2581}"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}
        ]},
        "pre_tokenizer": null,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [special("<s>", 0), seq("A", 0)],
            "pair": [special("<s>", 0), seq("A", 0), special("<s>", 1), seq("B", 1)],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
        },
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "fuse_unk": true,
                  "byte_fallback": true, "vocab": {}, "merges": []}
    });
    std::fs::write(dir.join("tokenizer.json"), serde_json::to_string_pretty(&tok).unwrap()).unwrap();
}

/// Added tokens over the SentencePiece pieces, as fine-tunes add them: `added_tokens.json` (one
/// id past the vocabulary, which the converter drops) and `added_tokens_decoder` entries that are
/// special, not special, not special but special-looking, and not special with a `▁`.
pub fn add_tokens(dir: &Path) {
    std::fs::write(dir.join("added_tokens.json"), json!({"[/INST]": 7, "<beyond>": 999}).to_string()).unwrap();
    let path = dir.join("tokenizer_config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let entry = |content: &str, special: bool| {
        json!({"content": content, "lstrip": false, "normalized": false, "rstrip": false,
               "single_word": false, "special": special})
    };
    let decoder = cfg["added_tokens_decoder"].as_object_mut().unwrap();
    decoder.insert("4".into(), entry("[INST]", true));
    decoder.insert("5".into(), entry("\u{2581}Call", false));
    decoder.insert("6".into(), entry("<|im_end|>", false));
    decoder.insert("7".into(), entry("[/INST]", false));
    std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
}
