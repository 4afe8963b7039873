//! `onebit tokenize` and `onebit template` as a user runs them.

use std::process::{Command, Stdio};

fn onebit(args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(s) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn tokenize_matches_the_fixture() {
    let Some(fx) = onebit_testkit::fixture("tokenizer-qwen3.json") else {
        return;
    };
    let model = onebit_testkit::shared_file("models/qwen3-q1_0.gguf").unwrap();
    let m = model.to_str().unwrap();
    let cases: Vec<&serde_json::Value> = fx["cases"].as_array().unwrap().iter().take(40).collect();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let dir = tempfile::tempdir().unwrap();
    let batch = dir.path().join("batch.json");
    std::fs::write(&batch, serde_json::to_string(&texts).unwrap()).unwrap();
    let (ok, out, err) = onebit(&["tokenize", "-m", m, "--batch", batch.to_str().unwrap()], None);
    assert!(ok, "{err}");
    let got: Vec<Vec<u64>> = serde_json::from_str(&out).unwrap();
    for (g, c) in got.iter().zip(&cases) {
        let want: Vec<u64> = c["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(g, &want, "{:?}", c["text"]);
    }
    // One text from stdin, special parsing off, JSON out.
    let (ok, out, _) = onebit(&["tokenize", "-m", m, "--no-special", "--json"], Some("<|im_end|>"));
    assert!(ok);
    let ids: Vec<u64> = serde_json::from_str(&out).unwrap();
    assert!(ids.len() > 1, "special text stays text with --no-special: {ids:?}");
}

#[test]
fn tokenize_accepts_vocabulary_only_files_and_adds_bos_on_request() {
    let Some(v) = onebit_testkit::shared_file("models/vocab/ggml-vocab-llama-spm.gguf") else {
        return;
    };
    let (ok, out, _) = onebit(&["tokenize", "-m", v.to_str().unwrap(), "--json", "Hello world"], None);
    assert!(ok);
    assert_eq!(out.trim(), "[15043,3186]");
    let (ok, out, _) = onebit(&["tokenize", "-m", v.to_str().unwrap(), "--json", "--add-bos", "Hello world"], None);
    assert!(ok);
    assert_eq!(out.trim(), "[1,15043,3186]");
}

#[test]
fn template_renders_a_request_like_the_fixture() {
    let Some(fx) = onebit_testkit::fixture("chat-templates.json") else {
        return;
    };
    let case = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["model"] == "qwen3-q1_0.gguf" && c["case"] == "tools_call_and_result")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let req = dir.path().join("req.json");
    let mut input = case["input"].clone();
    input["bos_token"] = "".into();
    input["eos_token"] = "<|im_end|>".into();
    std::fs::write(&req, input.to_string()).unwrap();
    let model = onebit_testkit::shared_file("models/qwen3-q1_0.gguf").unwrap();
    let (ok, out, err) = onebit(&["template", "-m", model.to_str().unwrap(), "--request", req.to_str().unwrap()], None);
    assert!(ok, "{err}");
    assert_eq!(out, case["rendered"].as_str().unwrap());

    // A template file, and a template that raises.
    let tpl = dir.path().join("t.jinja");
    std::fs::write(
        &tpl,
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('first message must be system') }}{% endif %}ok",
    )
    .unwrap();
    let (ok, _, err) =
        onebit(&["template", "--template-file", tpl.to_str().unwrap(), "--request", req.to_str().unwrap()], None);
    assert!(!ok);
    assert_eq!(err.trim(), "error: chat template: first message must be system");
}
