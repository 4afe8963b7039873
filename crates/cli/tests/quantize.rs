//! `onebit quantize` writes the same bytes as llama-quantize.
//!
//! Inputs: `../shared/models/qwen2-{f16,bf16}.gguf` (rows of 128: many types fall back), some
//! of the quantized shared models (requantized with `--allow-requantize`), and
//! synthetic models this file writes itself, deterministically (integer hashing only, so every
//! platform makes the same bytes): a Qwen3 in F32 with its own output matrix and grouped-query
//! attention, a Llama in F16 with tied embeddings, a Qwen3-MoE in F16 with 8 experts (the
//! 8-expert rules), and a tiny Llama whose FFN rows (80) fit no block type (F16 fallbacks).
//!
//! With `--imatrix`: synthetic importance matrices for the synthetic models (written here in
//! llama-imatrix's GGUF format) and `tests/data/qwen2-f16.imatrix.gguf`, which llama-imatrix
//! made from qwen2-f16 (`llama-imatrix -m qwen2-f16.gguf -f TEXT -c 128`), and the same in
//! llama-imatrix's older format, `tests/data/qwen2-f16.imatrix.dat` (`--output-format dat`).
//!
//! `tests/data/quantize-sha256.txt` holds the SHA-256 of llama-quantize's output for each
//! (model, options, type), or `error` where llama-quantize refuses. To regenerate it (where
//! llama.cpp is built):
//!
//! ```text
//! LLAMA_QUANTIZE=/work/llama/build/bin/llama-quantize \
//!     cargo test -p onebit-cli --test quantize -- --ignored --nocapture regenerate
//! ```

use onebit_testkit::hashed_value;
use std::path::{Path, PathBuf};
use std::process::Command;

use onebit_gguf::{GgmlType, GgufWriter, OwnedValue};
use onebit_kernels::formats::f32_to_f16;
use sha2::{Digest, Sha256};

const TABLE: &str = "tests/data/quantize-sha256.txt";

const SYNTHETIC: &[&str] = &["qwen3-f32", "llama-f16-tied", "qwen3moe-f16", "llama-odd-f32"];
const ALL_TYPES: &[&str] = &[
    "F16", "BF16", "F32", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S",
    "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "TQ1_0", "TQ2_0", "Q1_0", "Q2_0",
];
const SOME_TYPES: &[&str] = &["Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_S", "Q8_0", "TQ2_0", "Q1_0"];
const FLAG_SETS: &[&str] =
    &["--pure", "--leave-output-tensor", "--output-tensor-type q8_0 --token-embedding-type q4_k"];

/// Every (model, flags, type) the table covers.
fn cases() -> Vec<(&'static str, &'static str, &'static str)> {
    let mut out = Vec::new();
    for model in ["qwen3-f32", "llama-f16-tied", "qwen3moe-f16", "llama-odd-f32", "qwen2-f16"] {
        out.extend(ALL_TYPES.iter().map(|t| (model, "", *t)));
    }
    out.extend(SOME_TYPES.iter().map(|t| ("qwen2-bf16", "", *t)));
    for model in ["qwen3-f32", "llama-f16-tied"] {
        for flags in FLAG_SETS {
            out.extend(SOME_TYPES.iter().map(|t| (model, *flags, *t)));
        }
    }
    // Requantizing already quantized models: dequantization must match ggml's exactly too.
    for model in ["qwen3-q8_0", "qwen3-tq2_0", "qwen3moe-q1_0", "llama-q4_k_m", "llama-q5_1"] {
        out.extend(["Q4_K_M", "TQ1_0", "Q1_0"].iter().map(|t| (model, "--allow-requantize", *t)));
    }
    // Importance matrices: synthetic ones for the synthetic models (K-quant rows, experts with
    // no tokens), and a real one llama-imatrix made for qwen2-f16 (tests/data).
    for (model, flags) in [
        ("qwen3-f32", "--imatrix qwen3-f32.imatrix.gguf"),
        ("qwen3moe-f16", "--imatrix qwen3moe-f16.imatrix.gguf"),
        ("qwen2-f16", "--imatrix qwen2-f16.imatrix.gguf"),
    ] {
        out.extend(ALL_TYPES.iter().chain(&["Q2_K_S"]).map(|t| (model, flags, *t)));
    }
    // llama-imatrix's older format (`--output-format dat`).
    out.extend(
        SOME_TYPES.iter().chain(&["Q4_0", "Q5_1"]).map(|t| ("qwen2-f16", "--imatrix qwen2-f16.imatrix.dat", *t)),
    );
    out.push(("qwen3-f32", "", "Q2_K_S"));
    out
}

/// Put the importance matrix that `flags` names into `dir` (quantizers run there, so the name
/// they record in the output's metadata is the same everywhere).
fn prepare_imatrix(flags: &str, dir: &Path) {
    let Some(name) = flags.split_whitespace().skip_while(|f| *f != "--imatrix").nth(1) else {
        return;
    };
    let path = dir.join(name);
    if path.exists() {
        return;
    }
    if name.starts_with("qwen2-f16.imatrix.") {
        std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name), &path).unwrap();
        return;
    }
    let model = name.trim_end_matches(".imatrix.gguf");
    let model_path = input(model, dir).unwrap();
    let m = onebit_gguf::GgufFile::open(&model_path).unwrap();
    let mut w = GgufWriter::new();
    w.set("general.type", OwnedValue::string("imatrix"));
    w.set("imatrix.datasets", OwnedValue::strings(["synthetic.txt"]));
    w.set("imatrix.chunk_count", OwnedValue::U32(7));
    w.set("imatrix.chunk_size", OwnedValue::U32(512));
    for (k, t) in m.tensors().enumerate() {
        if t.shape().len() < 2 || t.name() == "token_embd.weight" {
            continue;
        }
        let (cols, experts) = (t.dim(0), t.dim(2));
        // Expert e saw 100·(e+1) tokens, except the last expert of layer 0, which saw none.
        let counts: Vec<f32> = (0..experts)
            .map(|e| {
                if experts > 1 && e == experts - 1 && t.name().starts_with("blk.0.") {
                    0.0
                } else {
                    100.0 * (e + 1) as f32
                }
            })
            .collect();
        let sums: Vec<f32> = (0..cols * experts)
            .map(|i| (hashed_value(1000 + k as u64, i) + 2.5) * counts[(i / cols) as usize].max(1.0))
            .collect();
        let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let shape = if experts > 1 { vec![cols, experts] } else { vec![cols] };
        w.add_tensor(format!("{}.in_sum2", t.name()), GgmlType::F32, &shape, f32_bytes(&sums)).unwrap();
        let shape = if experts > 1 { vec![1, experts] } else { vec![1] };
        w.add_tensor(format!("{}.counts", t.name()), GgmlType::F32, &shape, f32_bytes(&counts)).unwrap();
    }
    w.write_file(&path).unwrap();
}

struct Spec {
    arch: &'static str,
    hidden: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    ffn: u64,
    experts: u64,
    vocab: u64,
    tied: bool,
    ty: GgmlType,
}

fn spec(name: &str) -> Spec {
    let base = Spec {
        arch: "qwen3",
        hidden: 256,
        layers: 8,
        heads: 8,
        kv_heads: 2,
        head_dim: 32,
        ffn: 512,
        experts: 0,
        vocab: 512,
        tied: false,
        ty: GgmlType::F32,
    };
    match name {
        "qwen3-f32" => base,
        "llama-f16-tied" => {
            Spec { arch: "llama", heads: 4, kv_heads: 4, head_dim: 64, ffn: 768, tied: true, ty: GgmlType::F16, ..base }
        }
        "qwen3moe-f16" => Spec {
            arch: "qwen3moe",
            layers: 4,
            heads: 4,
            head_dim: 64,
            ffn: 256,
            experts: 8,
            ty: GgmlType::F16,
            ..base
        },
        "llama-odd-f32" => Spec {
            arch: "llama",
            hidden: 64,
            layers: 2,
            heads: 2,
            kv_heads: 1,
            head_dim: 32,
            ffn: 80,
            vocab: 64,
            ..base
        },
        other => panic!("no synthetic model {other}"),
    }
}

/// Write the synthetic model `name` (weights scaled like a real model's, with a few outliers,
/// a zero row and a constant block so that the quantizers' edge cases are exercised).
fn synthetic(name: &str, path: &Path) {
    let s = spec(name);
    let mut w = GgufWriter::new();
    let a = s.arch;
    let u32v = |v: u64| OwnedValue::U32(v as u32);
    w.set("general.architecture", OwnedValue::string(a));
    w.set("general.name", OwnedValue::string(name));
    w.set(format!("{a}.context_length"), u32v(4096));
    w.set(format!("{a}.embedding_length"), u32v(s.hidden));
    w.set(format!("{a}.block_count"), u32v(s.layers));
    w.set(format!("{a}.feed_forward_length"), u32v(s.ffn));
    w.set(format!("{a}.attention.head_count"), u32v(s.heads));
    w.set(format!("{a}.attention.head_count_kv"), u32v(s.kv_heads));
    w.set(format!("{a}.rope.freq_base"), OwnedValue::F32(1e6));
    w.set(format!("{a}.attention.layer_norm_rms_epsilon"), OwnedValue::F32(1e-6));
    w.set(format!("{a}.attention.key_length"), u32v(s.head_dim));
    w.set(format!("{a}.attention.value_length"), u32v(s.head_dim));
    if s.experts > 0 {
        w.set(format!("{a}.expert_count"), u32v(s.experts));
        w.set(format!("{a}.expert_used_count"), u32v(2));
        w.set(format!("{a}.expert_feed_forward_length"), u32v(s.ffn));
    }
    w.set("general.file_type", u32v(if s.ty == GgmlType::F16 { 1 } else { 0 }));
    let mut seed = 0;
    let mut add = |w: &mut GgufWriter, tname: String, shape: &[u64], ty: GgmlType, scale: f32| {
        seed += 1;
        let n: u64 = shape.iter().product();
        let row = shape[0];
        let x: Vec<f32> = (0..n)
            .map(|i| {
                let r = i / row;
                if shape.len() > 1 && r == 3 {
                    return 0.0; // a zero row
                }
                if shape.len() > 1 && r == 5 && i % row < 32 {
                    return 0.25 * scale; // a constant block
                }
                let v = hashed_value(seed, i) * scale;
                if i % 197 == 11 { v * 9.0 } else { v }
            })
            .collect();
        let bytes: Vec<u8> = match ty {
            GgmlType::F16 => x.iter().flat_map(|v| f32_to_f16(*v).to_le_bytes()).collect(),
            _ => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        w.add_tensor(tname, ty, shape, bytes).unwrap();
    };
    let (h, hd) = (s.hidden, s.head_dim);
    add(&mut w, "token_embd.weight".into(), &[h, s.vocab], s.ty, 0.5);
    for l in 0..s.layers {
        let p = format!("blk.{l}.");
        add(&mut w, format!("{p}attn_norm.weight"), &[h], GgmlType::F32, 0.1);
        add(&mut w, format!("{p}attn_q.weight"), &[h, s.heads * hd], s.ty, 0.06);
        add(&mut w, format!("{p}attn_k.weight"), &[h, s.kv_heads * hd], s.ty, 0.06);
        add(&mut w, format!("{p}attn_v.weight"), &[h, s.kv_heads * hd], s.ty, 0.06);
        if a.starts_with("qwen3") {
            add(&mut w, format!("{p}attn_q_norm.weight"), &[hd], GgmlType::F32, 0.1);
            add(&mut w, format!("{p}attn_k_norm.weight"), &[hd], GgmlType::F32, 0.1);
        }
        add(&mut w, format!("{p}attn_output.weight"), &[s.heads * hd, h], s.ty, 0.06);
        add(&mut w, format!("{p}ffn_norm.weight"), &[h], GgmlType::F32, 0.1);
        if s.experts > 0 {
            add(&mut w, format!("{p}ffn_gate_inp.weight"), &[h, s.experts], GgmlType::F32, 0.06);
            add(&mut w, format!("{p}ffn_gate_exps.weight"), &[h, s.ffn, s.experts], s.ty, 0.06);
            add(&mut w, format!("{p}ffn_up_exps.weight"), &[h, s.ffn, s.experts], s.ty, 0.06);
            add(&mut w, format!("{p}ffn_down_exps.weight"), &[s.ffn, h, s.experts], s.ty, 0.04);
        } else {
            add(&mut w, format!("{p}ffn_gate.weight"), &[h, s.ffn], s.ty, 0.06);
            add(&mut w, format!("{p}ffn_up.weight"), &[h, s.ffn], s.ty, 0.06);
            add(&mut w, format!("{p}ffn_down.weight"), &[s.ffn, h], s.ty, 0.04);
        }
    }
    add(&mut w, "output_norm.weight".into(), &[h], GgmlType::F32, 0.1);
    if !s.tied {
        add(&mut w, "output.weight".into(), &[h, s.vocab], s.ty, 0.1);
    }
    w.write_file(path).unwrap();
}

/// The input file for `model`: a shared model, or a synthetic one written into `dir`.
fn input(model: &str, dir: &Path) -> Option<PathBuf> {
    if !SYNTHETIC.contains(&model) {
        return onebit_testkit::shared_file(&format!("models/{model}.gguf"));
    }
    let path = dir.join(format!("{model}.gguf"));
    if !path.exists() {
        synthetic(model, &path);
    }
    Some(path)
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn key(model: &str, flags: &str, ty: &str) -> String {
    let flags = if flags.is_empty() { "-".to_string() } else { flags.replace(' ', ",") };
    format!("{model} {flags} {ty}")
}

/// Run a quantizer (`onebit quantize` or llama-quantize) and return the output's SHA-256, or
/// `error` if it refused.
fn run(cmd: &mut Command, out: &Path) -> (String, String) {
    let _ = std::fs::remove_file(out);
    let o = cmd.output().expect("run quantizer");
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    if o.status.success() { (sha256(out), log) } else { ("error".into(), log) }
}

fn onebit_quantize(input: &Path, out: &Path, flags: &str, ty: &str) -> (String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_onebit"));
    cmd.current_dir(out.parent().unwrap());
    cmd.args(["quantize", "--quiet"]).args(flags.split_whitespace()).arg(input).arg(out).arg(ty);
    run(&mut cmd, out)
}

#[test]
fn output_is_byte_identical_to_llama_quantize() {
    let table = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(TABLE)).unwrap();
    let want: std::collections::HashMap<&str, &str> =
        table.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.rsplit_once(' ')).collect();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let mut failures = Vec::new();
    let mut checked = 0;
    for (model, flags, ty) in cases() {
        let Some(input) = input(model, dir.path()) else {
            continue;
        };
        let k = key(model, flags, ty);
        let expected = want.get(k.as_str()).unwrap_or_else(|| panic!("{TABLE} has no line for {k}"));
        prepare_imatrix(flags, dir.path());
        let (got, log) = onebit_quantize(&input, &out, flags, ty);
        if got != *expected {
            failures.push(format!("{k}: {got} (llama-quantize: {expected}) {}", log.trim()));
        }
        checked += 1;
    }
    assert!(failures.is_empty(), "{} of {checked} differ:\n{}", failures.len(), failures.join("\n"));
}

/// Rewrites the table from llama-quantize's outputs (see the module comment).
#[test]
#[ignore = "needs llama-quantize (LLAMA_QUANTIZE)"]
fn regenerate() {
    let llama = std::env::var("LLAMA_QUANTIZE").expect("set LLAMA_QUANTIZE to llama-quantize's path");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ref.gguf");
    let mut lines =
        vec!["# model flags type sha256-of-llama-quantize-output (see tests/quantize.rs to regenerate)".to_string()];
    for (model, flags, ty) in cases() {
        let input = input(model, dir.path()).expect("shared models present");
        prepare_imatrix(flags, dir.path());
        let mut cmd = Command::new(&llama);
        cmd.current_dir(dir.path());
        cmd.args(flags.split_whitespace()).arg(&input).arg(&out).arg(ty).arg("2");
        let (sha, _) = run(&mut cmd, &out);
        lines.push(format!("{} {sha}", key(model, flags, ty)));
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(TABLE);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    eprintln!("wrote {} lines to {}", lines.len() - 1, path.display());
}

/// Run `onebit quantize ARGS` and return (success, stderr).
fn quantize(args: &[&str]) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_onebit")).arg("quantize").args(args).output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.gguf");
    synthetic("llama-odd-f32", &good);
    let out = dir.path().join("out.gguf");
    let (g, o) = (good.to_str().unwrap(), out.to_str().unwrap());
    let expect_error = |args: &[&str], needle: &str| {
        let (ok, err) = quantize(args);
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("internal error"), "{args:?} panicked: {err}");
        assert!(!out.exists(), "{args:?} left a partial output");
    };
    expect_error(&[g, o, "Q9_9"], "unknown quantization type 'Q9_9'");
    expect_error(&[g, o, "IQ2_XXS"], "not supported by onebit");
    expect_error(&["--output-tensor-type", "q7", g, o, "Q8_0"], "unknown ggml type 'q7'");
    expect_error(&[g, g, "Q8_0"], "same file");
    // Rows of 64 have no Q1_0 fallback in llama.cpp either.
    expect_error(&[g, o, "Q1_0"], "no fallback type for Q1_0");
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 1000]).unwrap();
    expect_error(&[cut.to_str().unwrap(), o, "Q8_0"], "cut.gguf");
    let missing = dir.path().join("missing.gguf");
    expect_error(&[missing.to_str().unwrap(), o, "Q8_0"], "missing.gguf");
    // A quantized model needs --allow-requantize; a type onebit cannot read back stays an error.
    let q8 = dir.path().join("q8.gguf");
    assert!(quantize(&["-q", g, q8.to_str().unwrap(), "Q8_0"]).0);
    expect_error(&[q8.to_str().unwrap(), o, "Q4_0"], "--allow-requantize");
    let mut w = GgufWriter::new();
    w.set("general.architecture", OwnedValue::string("llama"));
    w.set("llama.block_count", OwnedValue::U32(1));
    w.add_tensor("blk.0.ffn_up.weight", GgmlType::IQ2_XXS, &[256, 2], vec![0u8; 2 * 66]).unwrap();
    let iq = dir.path().join("iq.gguf");
    w.write_file(&iq).unwrap();
    expect_error(&["--allow-requantize", iq.to_str().unwrap(), o, "Q4_0"], "cannot read back");
    // A NaN in the weights (llama-quantize refuses such a file too).
    let mut w = GgufWriter::new();
    w.set("general.architecture", OwnedValue::string("llama"));
    w.set("llama.block_count", OwnedValue::U32(1));
    let mut vals = vec![0u8; 4 * 64];
    vals[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
    w.add_tensor("blk.0.ffn_up.weight", GgmlType::F32, &[32, 2], vals).unwrap();
    let nan = dir.path().join("nan.gguf");
    w.write_file(&nan).unwrap();
    expect_error(&[nan.to_str().unwrap(), o, "Q4_0"], "NaN or infinite");
    // No architecture: the rules cannot run.
    let mut w = GgufWriter::new();
    w.add_tensor("a.weight", GgmlType::F32, &[32, 2], vec![0u8; 256]).unwrap();
    let bare = dir.path().join("bare.gguf");
    w.write_file(&bare).unwrap();
    expect_error(&[bare.to_str().unwrap(), o, "Q4_0"], "general.architecture");
}

/// Writes the synthetic models into `$QUANTIZE_MODELS_DIR`, to run other tools on them.
#[test]
#[ignore = "writes files for manual comparisons"]
fn write_synthetic_models() {
    let dir = PathBuf::from(std::env::var("QUANTIZE_MODELS_DIR").expect("set QUANTIZE_MODELS_DIR"));
    for model in SYNTHETIC {
        synthetic(model, &dir.join(format!("{model}.gguf")));
    }
}
