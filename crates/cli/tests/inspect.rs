//! `onebit inspect` as a user runs it: output on good files, one error line on bad ones.

use std::process::Command;

fn onebit(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_onebit")).args(args).output().expect("run onebit")
}

#[test]
fn json_describes_a_shared_model() {
    let Some(path) = onebit_testkit::shared_file("models/qwen3-q1_0.gguf") else {
        return;
    };
    let out = onebit(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["architecture"], "qwen3");
    assert_eq!(v["hyperparameters"]["block_count"], 4);
    assert_eq!(v["tokenizer"]["vocab_size"], 151936);
    assert_eq!(v["tokenizer"]["has_chat_template"], true);
    assert_eq!(v["tokenizer"]["special_tokens"]["eos"]["id"], 151645);
    assert_eq!(v["tensors"].as_array().unwrap().len(), 47);
    let total: u64 = v["bytes_by_type"].as_object().unwrap().values().map(|t| t["bytes"].as_u64().unwrap()).sum();
    assert_eq!(total, v["tensor_bytes"].as_u64().unwrap());
}

#[test]
fn text_output_covers_every_section() {
    let Some(path) = onebit_testkit::shared_file("models/llama-q4_k_m.gguf") else {
        return;
    };
    let out = onebit(&["inspect", path.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "architecture: llama",
        "hyperparameters:",
        "tokenizer: gpt2 (pre: smollm)",
        "tensors (38):",
        "bytes by type:",
        "q6_K",
        "parameters",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

/// A damaged copy of a shared model must give exactly one line on stderr and status 1.
fn assert_one_line_error(bytes: &[u8], expect: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.gguf");
    std::fs::write(&path, bytes).unwrap();
    let out = onebit(&["inspect", path.to_str().unwrap()]);
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    assert!(err.starts_with("error: ") && err.contains(expect), "{err}");
    assert!(!err.contains("panicked") && !err.contains("backtrace"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn bad_files_get_one_clear_line() {
    let Some(path) = onebit_testkit::shared_file("models/qwen2-q4_0.gguf") else {
        return;
    };
    let good = std::fs::read(path).unwrap();
    assert_one_line_error(&good[..good.len() / 2], "beyond the end");
    assert_one_line_error(&good[..100], "truncated or corrupt");
    let mut flipped = good.clone();
    flipped[0] ^= 0x20;
    assert_one_line_error(&flipped, "not a GGUF file");
    // The type of the first tensor: find its info after the metadata, by name.
    let name = b"output_norm.weight";
    let at = good.windows(name.len()).rposition(|w| w == name).unwrap() + name.len();
    let n_dims = u32::from_le_bytes(good[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * n_dims;
    let mut unknown = good.clone();
    unknown[ty..ty + 4].copy_from_slice(&77u32.to_le_bytes());
    assert_one_line_error(&unknown, "unknown ggml type id 77");
    let missing = onebit(&["inspect", "/nonexistent/model.gguf"]);
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&missing.stderr).lines().count(), 1);
}
