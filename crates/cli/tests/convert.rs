//! `onebit convert` writes what llama.cpp's `convert_hf_to_gguf.py` writes.
//!
//! The checkpoints are small random Hugging Face models this file writes itself,
//! deterministically (integer hashing only): a Qwen3 in BF16 with tied embeddings and a
//! generation config, a Qwen2 in F16 in two shards with an index, q/k/v biases and a vocabulary
//! padded past its tokenizer, a Llama in BF16 with Llama 3 rope scaling (q/k rows reordered,
//! `rope_freqs`), a Llama 2 (with a `tokenizer.json` beside it) and a Mistral (with added
//! tokens) with a SentencePiece `tokenizer.model`, a ternary Qwen3 (each 256-block ±s or 0)
//! for TQ1_0/TQ2_0, a SmolLM2-shaped Llama with SmolLM2's real vocabulary (from `../shared`),
//! Llama/Qwen3/Mistral configs that leave Transformers' defaults out, and a Qwen3 with a model
//! card (`tests/data/convert/model-card.md`). The other tokenizers are the small real-pipeline
//! BPEs and SentencePiece model of `tests/data/convert/` (scripts/convert/make_tokenizers.py).
//!
//! `tests/data/convert-sha256.txt` holds the SHA-256 of the reference converter's output for
//! each (model, type). To regenerate it, with a Python that has llama.cpp's converter
//! requirements (`requirements/requirements-convert_hf_to_gguf.txt`: torch, Transformers
//! 4.57.6, whose configuration defaults the files depend on) and llama.cpp's source
//! (scripts/convert/reference.py names the stand-in tokenizers' pre-tokenizer, whose hash
//! llama.cpp cannot know; SmolLM's real vocabulary is named by the converter itself):
//!
//! ```text
//! CONVERT_PYTHON=.venv/bin/python LLAMA_CPP_SRC=/path/to/llama.cpp \
//!     cargo test -p onebit-cli --test convert -- --ignored --nocapture regenerate
//! ```
//!
//! The same run converts each model with both tools and checks that `onebit logits` gives
//! identical output on the two files (the round trip).

#[path = "convert/files.rs"]
mod files;

use files::{MODEL_CARD, add_tokens, llama2_tokenizer_json, smollm_tokenizer};
use onebit_testkit::hashed_value;
use std::path::{Path, PathBuf};
use std::process::Command;

use onebit_kernels::formats::{f32_to_bf16, f32_to_f16};
use safetensors::{Dtype, tensor::TensorView};
use serde_json::json;
use sha2::{Digest, Sha256};

const TABLE: &str = "tests/data/convert-sha256.txt";

/// Every (model, type) the table covers.
const CASES: &[(&str, &str)] = &[
    ("qwen3-tiny", "f16"),
    ("qwen3-tiny", "bf16"),
    ("qwen3-tiny", "q8_0"),
    ("qwen3-tiny", "f32"),
    ("qwen3-tiny", "auto"),
    ("qwen2-tiny", "f16"),
    ("qwen2-tiny", "bf16"),
    ("qwen2-tiny", "q8_0"),
    ("qwen2-tiny", "auto"),
    ("llama-tiny", "f16"),
    ("llama-tiny", "bf16"),
    ("llama-tiny", "q8_0"),
    ("llama2-tiny", "f16"),
    ("llama2-tiny", "bf16"),
    ("llama2-tiny", "q8_0"),
    ("mistral-tiny", "f16"),
    ("mistral-tiny", "q8_0"),
    ("ternary-qwen3", "tq1_0"),
    ("ternary-qwen3", "tq2_0"),
    ("ternary-qwen3", "f16"),
    ("smollm-tiny", "bf16"),
    ("smollm-tiny", "q8_0"),
    ("llama-minimal", "f16"),
    ("qwen3-minimal", "bf16"),
    ("mistral-minimal", "f16"),
    ("qwen3-card", "bf16"),
];

#[derive(Clone, Copy, PartialEq)]
enum Weights {
    Random,
    /// Every 128-block is ±s (Bonsai).
    Binary,
    /// Every 256-block is s·{-1, 0, 1}.
    Ternary,
}

struct Spec {
    class: &'static str,
    /// `tests/data/convert/NAME`, or `smollm`: SmolLM2's real vocabulary, taken from
    /// `../shared/models/llama-q4_1.gguf` (see [`smollm_tokenizer`]).
    tokenizer: &'static str,
    /// Only the fields the tensors need in config.json, so that Transformers' defaults fill in
    /// the rest for the reference converter.
    minimal: bool,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    vocab: usize,
    tied: bool,
    bias: bool,
    dtype: Dtype,
    shards: usize,
    weights: Weights,
}

fn spec(name: &str) -> Spec {
    let base = Spec {
        class: "Qwen3ForCausalLM",
        tokenizer: "qwen2",
        minimal: false,
        hidden: 64,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 32,
        ffn: 128,
        vocab: 385,
        tied: true,
        bias: false,
        dtype: Dtype::BF16,
        shards: 1,
        weights: Weights::Random,
    };
    match name {
        "qwen3-tiny" => base,
        // The same with a model card (README.md front matter) and a `_name_or_path`.
        "qwen3-card" => base,
        "qwen2-tiny" => Spec {
            class: "Qwen2ForCausalLM",
            head_dim: 16,
            ffn: 96,
            vocab: 400,
            tied: false,
            bias: true,
            dtype: Dtype::F16,
            shards: 2,
            ..base
        },
        "llama-tiny" => {
            Spec { class: "LlamaForCausalLM", tokenizer: "llama3", head_dim: 16, vocab: 365, tied: false, ..base }
        }
        // Llama 2 and Mistral: the SentencePiece vocabulary (`tokenizer.model`, 400 pieces), the
        // Llama 2 one padded to 408 with [PADn].
        "llama2-tiny" => Spec {
            class: "LlamaForCausalLM",
            tokenizer: "llama2",
            head_dim: 16,
            vocab: 408,
            tied: false,
            dtype: Dtype::F16,
            ..base
        },
        "mistral-tiny" => {
            Spec { class: "MistralForCausalLM", tokenizer: "llama2", head_dim: 16, vocab: 400, tied: false, ..base }
        }
        "ternary-qwen3" => Spec { hidden: 256, layers: 1, head_dim: 64, ffn: 256, weights: Weights::Ternary, ..base },
        "bonsai-qwen3" => Spec { hidden: 128, head_dim: 32, ffn: 256, weights: Weights::Binary, ..base },
        // SmolLM2's shape in small: Llama with its real GPT-2-style vocabulary (49,152 tokens,
        // pre-tokenizer named by hash), tied embeddings, a ChatML template.
        "smollm-tiny" => Spec { class: "LlamaForCausalLM", tokenizer: "smollm", head_dim: 16, vocab: 49152, ..base },
        // config.json without the fields Transformers fills in (context, eps, theta, head_dim).
        "llama-minimal" => Spec {
            class: "LlamaForCausalLM",
            tokenizer: "llama3",
            minimal: true,
            head_dim: 16,
            vocab: 365,
            tied: false,
            dtype: Dtype::F16,
            ..base
        },
        // Qwen3's default head_dim is 128.
        "qwen3-minimal" => Spec { minimal: true, head_dim: 128, ..base },
        "mistral-minimal" => Spec {
            class: "MistralForCausalLM",
            tokenizer: "llama2",
            minimal: true,
            head_dim: 16,
            vocab: 400,
            tied: false,
            dtype: Dtype::F16,
            ..base
        },
        other => panic!("no test checkpoint {other}"),
    }
}

/// The checkpoint's tensors (name, shape) in the order they are generated.
fn tensor_list(s: &Spec) -> Vec<(String, Vec<usize>)> {
    let (q, kv) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let mut v = vec![("model.embed_tokens.weight".to_string(), vec![s.vocab, s.hidden])];
    for l in 0..s.layers {
        let p = format!("model.layers.{l}.");
        let mut add = |n: &str, shape: Vec<usize>| v.push((format!("{p}{n}"), shape));
        add("input_layernorm.weight", vec![s.hidden]);
        add("self_attn.q_proj.weight", vec![q, s.hidden]);
        add("self_attn.k_proj.weight", vec![kv, s.hidden]);
        add("self_attn.v_proj.weight", vec![kv, s.hidden]);
        if s.bias {
            add("self_attn.q_proj.bias", vec![q]);
            add("self_attn.k_proj.bias", vec![kv]);
            add("self_attn.v_proj.bias", vec![kv]);
        }
        add("self_attn.o_proj.weight", vec![s.hidden, q]);
        if s.class == "Qwen3ForCausalLM" {
            add("self_attn.q_norm.weight", vec![s.head_dim]);
            add("self_attn.k_norm.weight", vec![s.head_dim]);
        }
        add("post_attention_layernorm.weight", vec![s.hidden]);
        add("mlp.gate_proj.weight", vec![s.ffn, s.hidden]);
        add("mlp.up_proj.weight", vec![s.ffn, s.hidden]);
        add("mlp.down_proj.weight", vec![s.hidden, s.ffn]);
    }
    v.push(("model.norm.weight".to_string(), vec![s.hidden]));
    if !s.tied {
        v.push(("lm_head.weight".to_string(), vec![s.vocab, s.hidden]));
    }
    v
}

/// A tensor's values as f32 (before rounding to the checkpoint's type).
fn tensor_values(s: &Spec, k: usize, name: &str, shape: &[usize]) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let seed = 7 + k as u64;
    if shape.len() == 1 {
        // Norm weights near 1, biases small.
        let (base, scale) = if name.ends_with("norm.weight") { (1.0, 0.1) } else { (0.0, 0.05) };
        return (0..n).map(|i| base + scale * hashed_value(seed, i as u64)).collect();
    }
    let scale = 0.5 / (shape[1] as f32).sqrt();
    match s.weights {
        Weights::Random => (0..n).map(|i| scale * hashed_value(seed, i as u64)).collect(),
        Weights::Binary | Weights::Ternary => {
            let block = if s.weights == Weights::Binary { 128 } else { 256 };
            (0..n)
                .map(|i| {
                    let b = (i / block) as u64;
                    // A block scale with few mantissa bits: exact in BF16 and F16.
                    let sc = scale * (1.0 + (hashed_value(seed ^ 0x55, b).abs() * 8.0).round() / 8.0);
                    let r = hashed_value(seed, i as u64);
                    match s.weights {
                        Weights::Binary => sc.copysign(r),
                        _ if r.abs() < 0.4 => 0.0,
                        _ => sc.copysign(r),
                    }
                })
                .collect()
        }
    }
}

fn encode(dtype: Dtype, v: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::F16 => v.iter().flat_map(|x| f32_to_f16(*x).to_le_bytes()).collect(),
        Dtype::BF16 => v.iter().flat_map(|x| f32_to_bf16(*x).to_le_bytes()).collect(),
        other => panic!("{other:?}"),
    }
}

/// Write the checkpoint `name` into `root/name` and return its folder.
fn write_checkpoint(name: &str, root: &Path) -> PathBuf {
    let s = spec(name);
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    if s.tokenizer == "smollm" {
        smollm_tokenizer(&dir);
    } else {
        let tok = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/convert").join(s.tokenizer);
        for f in std::fs::read_dir(&tok).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
        }
    }
    match name {
        "qwen3-card" => std::fs::write(dir.join("README.md"), MODEL_CARD).unwrap(),
        "mistral-tiny" => add_tokens(&dir),
        "llama2-tiny" => llama2_tokenizer_json(&dir),
        _ => {}
    }
    let mut config = json!({
        "architectures": [s.class],
        "model_type": s.class.trim_end_matches("ForCausalLM").to_lowercase(),
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "intermediate_size": s.ffn,
        "vocab_size": s.vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": s.tied,
        "torch_dtype": if s.dtype == Dtype::F16 { "float16" } else { "bfloat16" },
    });
    if s.class == "Qwen3ForCausalLM" {
        config["head_dim"] = json!(s.head_dim);
        config["bos_token_id"] = json!(380);
        config["eos_token_id"] = json!(382);
        std::fs::write(
            dir.join("generation_config.json"),
            json!({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [382, 380]})
                .to_string(),
        )
        .unwrap();
    }
    if s.tokenizer == "llama2" {
        config["rope_theta"] = json!(10000.0);
        config["bos_token_id"] = json!(1);
        config["eos_token_id"] = json!(2);
    }
    if s.tokenizer == "llama3" {
        config["rope_theta"] = json!(500000.0);
        config["rope_scaling"] = json!({
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64, "rope_type": "llama3"
        });
        config["bos_token_id"] = json!(360);
        config["eos_token_id"] = json!([361, 364]);
    }
    if s.tokenizer == "smollm" {
        // SmolLM2-135M-Instruct's values.
        config["max_position_embeddings"] = json!(8192);
        config["rms_norm_eps"] = json!(1e-5);
        config["rope_theta"] = json!(100000);
        config["bos_token_id"] = json!(1);
        config["eos_token_id"] = json!(2);
        config["pad_token_id"] = json!(2);
        config["_name_or_path"] = json!("HuggingFaceTB/SmolLM2-135M-Instruct");
    }
    if name == "qwen3-card" {
        config["_name_or_path"] = json!("Qwen/Qwen3-0.6B");
    }
    if s.minimal {
        let keep = ["architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads"];
        let more = ["num_key_value_heads", "intermediate_size", "vocab_size", "torch_dtype"];
        config.as_object_mut().unwrap().retain(|k, _| keep.contains(&k.as_str()) || more.contains(&k.as_str()));
        let _ = std::fs::remove_file(dir.join("generation_config.json"));
    }
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let list = tensor_list(&s);
    let bytes: Vec<Vec<u8>> =
        list.iter().enumerate().map(|(k, (n, shape))| encode(s.dtype, &tensor_values(&s, k, n, shape))).collect();
    let per_shard = list.len().div_ceil(s.shards);
    let mut weight_map = serde_json::Map::new();
    for shard in 0..s.shards {
        let file = if s.shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", shard + 1, s.shards)
        };
        let range = shard * per_shard..((shard + 1) * per_shard).min(list.len());
        let views: Vec<(String, TensorView)> = range
            .map(|k| {
                weight_map.insert(list[k].0.clone(), json!(file));
                (list[k].0.clone(), TensorView::new(s.dtype, list[k].1.clone(), &bytes[k]).unwrap())
            })
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(&file)).unwrap();
    }
    if s.shards > 1 {
        let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    }
    dir
}

fn onebit_convert(dir: &Path, out: &Path, ty: &str) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_onebit"));
    cmd.args(["convert", "-q", "--type", ty]);
    let model = dir.file_name().unwrap().to_str().unwrap();
    if let Some(pre) = stand_in_pre(model) {
        cmd.args(["--pre", pre]);
    }
    cmd.arg(dir).arg(out).output().unwrap()
}

/// The pre-tokenizer name of the small stand-in BPE vocabularies, which llama.cpp's table cannot
/// know (their check text hashes to nothing it lists): both converters are told it, onebit with
/// `--pre`, the reference through scripts/convert/reference.py. `None` where the converters find
/// it themselves (SmolLM's real vocabulary, SentencePiece models).
fn stand_in_pre(model: &str) -> Option<&'static str> {
    match spec(model).tokenizer {
        "qwen2" => Some("qwen2"),
        "llama3" => Some("llama-bpe"),
        _ => None,
    }
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn table() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(TABLE)).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_string(), f[1].to_string(), f[2].to_string())
        })
        .collect()
}

#[test]
fn converted_files_equal_the_reference_converters() {
    let tmp = tempfile::tempdir().unwrap();
    let table = table();
    assert_eq!(table.len(), CASES.len(), "the table covers every case (regenerate it)");
    let mut failures = Vec::new();
    let shared = onebit_testkit::shared().is_some();
    for (model, ty, want) in &table {
        if spec(model).tokenizer == "smollm" && !shared {
            continue;
        }
        let dir = tmp.path().join(model);
        let dir = if dir.exists() { dir } else { write_checkpoint(model, tmp.path()) };
        let out = tmp.path().join(format!("{model}-{ty}.gguf"));
        let o = onebit_convert(&dir, &out, ty);
        assert!(o.status.success(), "{model} {ty}: {}", String::from_utf8_lossy(&o.stderr));
        let got = sha256(&out);
        if &got != want {
            failures.push(format!("{model} {ty}: {got} (reference {want})"));
        }
    }
    assert!(failures.is_empty(), "differ from convert_hf_to_gguf.py:\n{}", failures.join("\n"));
}

/// Logits of every position of a few tokens, as `onebit logits --json` prints them.
fn logits(model: &Path) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(["logits", "-m", model.to_str().unwrap(), "--tokens", "1,17,42,99,3", "--all-positions", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}: {}", model.display(), String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn converted_models_run() {
    let tmp = tempfile::tempdir().unwrap();
    for (model, ty) in [
        ("qwen3-tiny", "bf16"),
        ("qwen2-tiny", "q8_0"),
        ("llama-tiny", "f16"),
        ("llama2-tiny", "q8_0"),
        ("mistral-tiny", "f16"),
        ("ternary-qwen3", "tq2_0"),
    ] {
        let dir = write_checkpoint(model, tmp.path());
        let out = tmp.path().join(format!("{model}.gguf"));
        let o = onebit_convert(&dir, &out, ty);
        assert!(o.status.success(), "{model}: {}", String::from_utf8_lossy(&o.stderr));
        let json: serde_json::Value = serde_json::from_str(&logits(&out)).unwrap();
        let top = &json["positions"][4]["top"][0][1];
        assert!(top.as_f64().is_some_and(f64::is_finite), "{model}: {json}");
    }
}

/// A Bonsai checkpoint (every 128-block ±s) converts to Q1_0 without loss.
#[test]
fn binary_checkpoint_converts_to_q1_0_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_checkpoint("bonsai-qwen3", tmp.path());
    let out = tmp.path().join("bonsai.gguf");
    let o = onebit_convert(&dir, &out, "q1_0");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check_lossless(&spec("bonsai-qwen3"), &out, onebit_gguf::GgmlType::Q1_0);
}

/// A ternary checkpoint (every 256-block s·{-1, 0, 1}) converts to TQ1_0 and TQ2_0 without loss.
#[test]
fn ternary_checkpoint_converts_to_tq_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_checkpoint("ternary-qwen3", tmp.path());
    for (ty, ggml) in [("tq1_0", onebit_gguf::GgmlType::TQ1_0), ("tq2_0", onebit_gguf::GgmlType::TQ2_0)] {
        let out = tmp.path().join(format!("ternary-{ty}.gguf"));
        let o = onebit_convert(&dir, &out, ty);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        check_lossless(&spec("ternary-qwen3"), &out, ggml);
    }
}

/// Every matrix quantized to `ty` dequantizes to the checkpoint's values bit for bit.
fn check_lossless(s: &Spec, path: &Path, ty: onebit_gguf::GgmlType) {
    let file = onebit_gguf::GgufFile::open(path).unwrap();
    let mut checked = 0;
    for (k, (name, shape)) in tensor_list(s).iter().enumerate() {
        let want: Vec<f32> = encode(s.dtype, &tensor_values(s, k, name, shape))
            .chunks_exact(2)
            .map(|b| onebit_kernels::formats::bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect();
        let gguf_name = gguf_name(name);
        let t = file.tensors().find(|t| t.name() == gguf_name).unwrap_or_else(|| panic!("{gguf_name} missing"));
        if t.ggml_type() != ty {
            continue;
        }
        let mut got = vec![0f32; want.len()];
        onebit_kernels::formats::dequantize(ty, t.data(), &mut got).unwrap();
        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits() || (*a == 0.0 && *b == 0.0));
        assert!(same, "{name}: {ty} is not the source exactly");
        checked += 1;
    }
    assert!(checked >= 7 * s.layers, "only {checked} tensors were {ty}");
}

fn gguf_name(hf: &str) -> String {
    let table = [
        ("input_layernorm", "attn_norm"),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("self_attn.q_norm", "attn_q_norm"),
        ("self_attn.k_norm", "attn_k_norm"),
        ("post_attention_layernorm", "ffn_norm"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
    ];
    match hf {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (bid, part) = rest.split_once('.').unwrap();
    let (stem, suffix) = part.rsplit_once('.').unwrap();
    let to = table.iter().find(|(h, _)| *h == stem).unwrap().1;
    format!("blk.{bid}.{to}.{suffix}")
}

/// Run `onebit convert` on a broken folder: it must fail with one clear line, not a panic.
fn expect_error(dir: &Path, needles: &[&str]) {
    let out = dir.with_extension("gguf");
    let o = onebit_convert(dir, &out, "f16");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}: {err}", dir.display());
    assert!(!err.contains("internal error") && !err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "error should name {n:?}: {err}");
    }
    assert!(!out.exists(), "no partial output is left");
}

#[test]
fn bad_checkpoints_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let fresh = |name: &str, what: &str| {
        let root = tmp.path().join(what);
        write_checkpoint(name, &root)
    };
    // A truncated shard.
    let dir = fresh("qwen3-tiny", "truncated");
    let st = dir.join("model.safetensors");
    let len = std::fs::metadata(&st).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&st).unwrap().set_len(len - 100).unwrap();
    expect_error(&dir, &["model.safetensors"]);
    // A header that says a tensor is larger than its bytes.
    let dir = fresh("qwen3-tiny", "lying");
    let st = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&st).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let lied = header.replacen("[32]", "[33]", 1);
    assert_ne!(lied, header);
    bytes.splice(8..8 + n, lied.bytes().take(n));
    std::fs::write(&st, &bytes).unwrap();
    expect_error(&dir, &["model.safetensors"]);
    // A missing shard.
    let dir = fresh("qwen2-tiny", "missing-shard");
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    expect_error(&dir, &["model-00002-of-00002.safetensors", "missing"]);
    // A config that disagrees with the tensors.
    let dir = fresh("qwen3-tiny", "config");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config["intermediate_size"] = json!(256);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    expect_error(&dir, &["model.layers.0.mlp.down_proj.weight", "shape"]);
    // Fewer layers in the checkpoint than the config says.
    config["intermediate_size"] = json!(128);
    config["num_hidden_layers"] = json!(3);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    expect_error(&dir, &["blk.2.", "missing"]);
    // An unknown architecture.
    config["num_hidden_layers"] = json!(2);
    config["architectures"] = json!(["GPTNeoXForCausalLM"]);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    expect_error(&dir, &["GPTNeoXForCausalLM", "not supported"]);
    // A cut-short SentencePiece model.
    let dir = fresh("llama2-tiny", "spm");
    let spm = dir.join("tokenizer.model");
    let len = std::fs::metadata(&spm).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&spm).unwrap().set_len(len - 1).unwrap();
    expect_error(&dir, &["tokenizer.model", "truncated"]);
    // A SentencePiece model for an architecture whose converter does not read one.
    let dir = fresh("qwen3-tiny", "qwen-spm");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    std::fs::copy(spm, dir.join("tokenizer.model")).unwrap();
    expect_error(&dir, &["tokenizer.model", "Llama"]);
    // Missing files.
    let dir = fresh("qwen3-tiny", "no-tokenizer");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    expect_error(&dir, &["tokenizer.json"]);
    std::fs::remove_file(dir.join("config.json")).unwrap();
    expect_error(&dir, &["config.json"]);
}

/// Writes the table with the reference converter, and checks the round trip (see the header).
#[test]
#[ignore = "needs the reference converter (CONVERT_PYTHON, LLAMA_CPP_SRC)"]
fn regenerate() {
    let python = std::env::var("CONVERT_PYTHON").expect("CONVERT_PYTHON: a Python with torch and transformers");
    let llama = std::env::var("LLAMA_CPP_SRC").expect("LLAMA_CPP_SRC: llama.cpp's source (convert_hf_to_gguf.py)");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/convert/reference.py");
    let tmp = tempfile::tempdir().unwrap();
    let mut lines =
        vec!["# model type sha256-of-convert_hf_to_gguf.py-output (see tests/convert.rs to regenerate)".to_string()];
    for (model, ty) in CASES {
        let dir = tmp.path().join(model);
        let dir = if dir.exists() { dir } else { write_checkpoint(model, tmp.path()) };
        let reference = tmp.path().join(format!("{model}-{ty}.ref.gguf"));
        // "-": the converter names the pre-tokenizer itself.
        let pre = stand_in_pre(model).unwrap_or("-");
        let o = Command::new(&python)
            .arg(&script)
            .args([&llama, pre, "--"])
            .arg(&dir)
            .arg("--outfile")
            .arg(&reference)
            .args(["--outtype", ty])
            .output()
            .unwrap();
        assert!(o.status.success(), "{model} {ty}: {}", String::from_utf8_lossy(&o.stderr));
        let ours = tmp.path().join(format!("{model}-{ty}.gguf"));
        let c = onebit_convert(&dir, &ours, ty);
        assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
        let (want, got) = (sha256(&reference), sha256(&ours));
        if want == got {
            println!("{model} {ty}: identical");
        } else {
            // Both files are kept for a look (e.g. with gguf-py's gguf_dump.py).
            let keep = Path::new(env!("CARGO_TARGET_TMPDIR"));
            std::fs::copy(&reference, keep.join(format!("{model}-{ty}.ref.gguf"))).unwrap();
            std::fs::copy(&ours, keep.join(format!("{model}-{ty}.gguf"))).unwrap();
            println!("{model} {ty}: DIFFERENT (both in {})", keep.display());
        }
        assert_eq!(logits(&reference), logits(&ours), "{model} {ty}: the round trip gives other logits");
        lines.push(format!("{model} {ty} {want}"));
    }
    std::fs::write(Path::new(env!("CARGO_MANIFEST_DIR")).join(TABLE), lines.join("\n") + "\n").unwrap();
}

/// A BPE vocabulary whose check-text hash llama.cpp's converter does not know is refused as the
/// converter refuses it (naming the hash), unless `--pre` names the pre-tokenizer.
#[test]
fn unknown_pre_tokenizer_hash_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_checkpoint("qwen3-tiny", tmp.path());
    let out = tmp.path().join("out.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(["convert", "-q", "--type", "f16"])
        .arg(&dir)
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for needle in ["tokenizer.json", "not recognized", "chkhsh", "--pre"] {
        assert!(err.contains(needle), "error should name {needle:?}: {err}");
    }
    assert!(!out.exists());
}

/// The model card's keys as the reference writes them (the table checks the bytes; this says
/// what they are).
#[test]
fn model_card_fills_the_general_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_checkpoint("qwen3-card", tmp.path());
    let out = tmp.path().join("card.gguf");
    let o = onebit_convert(&dir, &out, "bf16");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let file = onebit_gguf::GgufFile::open(&out).unwrap();
    let md = file.metadata();
    let text = |k: &str| md.get_str(k).unwrap_or_else(|e| panic!("{k}: {e}")).to_string();
    assert_eq!(text("general.name"), "Qwen3 0.6B");
    assert_eq!(text("general.organization"), "Qwen");
    assert_eq!(text("general.author"), "Qwen Team");
    assert_eq!(text("general.license"), "apache-2.0");
    assert_eq!(md.get_u32("general.base_model.count").unwrap(), 3);
    assert_eq!(text("general.base_model.0.repo_url"), "https://huggingface.co/Qwen/Qwen3-0.6B-Base");
    assert_eq!(text("general.base_model.1.version"), "v1.2");
    assert_eq!(text("general.base_model.2.organization"), "Acme");
    assert_eq!(text("general.dataset.0.organization"), "HuggingFaceTB");
    assert_eq!(md.get_str_array("general.tags").unwrap(), ["chat", "onebit-test", "text-generation"]);
    assert_eq!(md.get_str_array("general.languages").unwrap(), ["en", "zh", "no"]);
}
