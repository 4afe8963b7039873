//! `onebit logits --json`, run as a user runs it, reproduces llama.cpp's fixture within the
//! tolerances of `../shared/fixtures/README.md`, in batch and in `--decode` mode.

use std::process::Command;

fn check(model: &str, prompt: usize, decode: bool) {
    check_fixture(&format!("logits-{model}.json"), &[], prompt, decode);
}

/// Check against `fixture` (whose model is named in it), with more arguments `extra`.
fn check_fixture(fixture: &str, extra: &[&str], prompt: usize, decode: bool) {
    let Some(fx) = onebit_testkit::fixture(fixture) else {
        return;
    };
    let model = fx["model"].as_str().unwrap().trim_end_matches(".gguf").to_string();
    let path = onebit_testkit::shared_file(&format!("models/{model}.gguf")).unwrap();
    let p = &fx["prompts"][prompt];
    let tokens: Vec<String> = p["tokens"].as_array().unwrap().iter().map(|t| t.to_string()).collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_onebit"));
    cmd.args(["logits", "-m", path.to_str().unwrap(), "--tokens", &tokens.join(","), "--all-positions", "--json"]);
    cmd.args(extra);
    if decode {
        cmd.arg("--decode");
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ours: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ours = ours["positions"].as_array().unwrap();
    let refs = p["positions"].as_array().unwrap();
    assert_eq!(ours.len(), refs.len());
    let mut errs = Vec::new();
    for (o, r) in ours.iter().zip(refs) {
        let std = r["std"].as_f64().unwrap();
        let mine: std::collections::HashMap<u64, f64> =
            o["top"].as_array().unwrap().iter().map(|e| (e[0].as_u64().unwrap(), e[1].as_f64().unwrap())).collect();
        // Our top 40 must contain the reference's top 10, and agree on their values.
        let mut worst = 0.0f64;
        for e in r["top"].as_array().unwrap().iter().take(10) {
            let id = e[0].as_u64().unwrap();
            let v = mine.get(&id).unwrap_or_else(|| panic!("reference top id {id} missing from our top 40"));
            worst = worst.max((v - e[1].as_f64().unwrap()).abs() / std);
        }
        errs.push(worst);
        let top = r["top"].as_array().unwrap();
        if (top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap()) / std > 0.1 {
            assert_eq!(o["top"][0][0], r["argmax"], "top-1 differs");
        }
    }
    let mean = errs.iter().sum::<f64>() / errs.len() as f64;
    let max = errs.iter().copied().fold(0.0, f64::max);
    assert!(max <= 0.5 && mean <= 0.15, "{model} prompt {prompt}: mean {mean:.4} max {max:.4}");
}

#[test]
fn logits_json_matches_the_fixture_in_batch() {
    check("qwen2-q4_0", 2, false);
    check("qwen3-q1_0", 1, false);
}

#[test]
fn logits_json_matches_the_fixture_in_decode() {
    check("llama-q4_k_m", 3, true);
}

#[test]
fn lora_flags_match_llama_cpp_with_the_adapter() {
    let Some(adapter) = onebit_testkit::shared_file("models/lora-qwen3-q8_0-r8.gguf") else { return };
    let adapter = adapter.to_str().unwrap();
    check_fixture("logits-lora-qwen3-q8_0-s1.json", &["--lora", adapter], 2, false);
    check_fixture("logits-lora-qwen3-q8_0-s0.5.json", &["--lora-scaled", adapter, "0.5"], 1, true);
    // Two adapters at 0.25 each are one at 0.5.
    check_fixture(
        "logits-lora-qwen3-q8_0-s0.5.json",
        &["--lora-scaled", adapter, "0.25", "--lora-scaled", adapter, "0.25"],
        3,
        false,
    );
}

#[test]
fn an_adapter_for_another_model_is_refused_by_name() {
    let (Some(model), Some(adapter)) = (
        onebit_testkit::shared_file("models/llama-q4_1.gguf"),
        onebit_testkit::shared_file("models/lora-qwen3-q8_0-r8.gguf"),
    ) else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(["logits", "-m", model.to_str().unwrap(), "--tokens", "1,2", "--lora", adapter.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("lora-qwen3-q8_0-r8.gguf") && err.contains("architecture 'qwen3'"), "{err}");
}
