//! LoRA adapters against llama.cpp: the fixtures `logits-lora-*.json` hold llama.cpp's logits
//! for a shared model with `../shared/models/lora-qwen3-q8_0-r8.gguf` applied at a scale.
//! On every kernel tier, each prompt runs as one batch and one token at a time (then 32 greedy
//! tokens) under the rules of `../shared/fixtures/README.md`; all prompts then run in one batch
//! where sequences use the adapter at different scales or not at all, each checked against its
//! own reference. Adapters that do not fit are refused by name.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use onebit_gguf::{GgmlType, GgufWriter, OwnedValue};
use onebit_kernels::{KernelTier, Pool};
use onebit_model::{BLOCK_TOKENS, Device, LogitsWanted, LoraUse, Model, ModelError, ModelOptions, Scratch, SeqInput};
use onebit_testkit::{PositionStats, argmax, margin_over_std, prompt_tokens, reversed_tables};
use serde_json::Value;

/// The models use all cores; run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const ADAPTER: &str = "models/lora-qwen3-q8_0-r8.gguf";

/// The fixture, the base model and the adapter, if all are present.
fn inputs(fixture: &str) -> Option<(Value, PathBuf, PathBuf)> {
    let fx = onebit_testkit::fixture(fixture)?;
    let model = onebit_testkit::shared_file(&format!("models/{}", fx["model"].as_str().unwrap()))?;
    let adapter = onebit_testkit::shared_file(ADAPTER)?;
    Some((fx, model, adapter))
}

fn load(model: &Path, adapter: &Path, tier: KernelTier) -> Model {
    let options =
        ModelOptions { kernel_tier: Some(tier), lora: vec![adapter.to_path_buf()], ..ModelOptions::default() };
    Model::load(model, &options).unwrap()
}

fn check_fixture(fixture: &str) {
    let Some((fx, model_path, adapter)) = inputs(fixture) else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let scale = fx["lora"]["scale"].as_f64().unwrap() as f32;
    let lora = [LoraUse { id: 0, scale }];
    for tier in KernelTier::available() {
        let model = load(&model_path, &adapter, tier);
        let name = format!("{} + LoRA × {scale} [{tier}]", fx["model"].as_str().unwrap());
        let pool = Pool::new(2);
        let mut scratch = Scratch::new();
        for (pi, prompt) in fx["prompts"].as_array().unwrap().iter().enumerate() {
            let tokens = prompt_tokens(prompt);
            let positions = prompt["positions"].as_array().unwrap();
            let mut cache = model.new_cache(2048).unwrap();
            let logits =
                model.forward_one_adapted(&pool, &mut cache, &tokens, &lora, LogitsWanted::All, &mut scratch).unwrap();
            let mut batch = PositionStats::default();
            positions.iter().enumerate().for_each(|(i, pos)| batch.add(logits.get(0, i).unwrap(), pos));

            let mut cache = model.new_cache(2048).unwrap();
            let mut decode = PositionStats::default();
            let mut last = Vec::new();
            for (i, &tok) in tokens.iter().enumerate() {
                let l = model
                    .forward_one_adapted(&pool, &mut cache, &[tok], &lora, LogitsWanted::Last, &mut scratch)
                    .unwrap();
                last = l.last(0).unwrap().to_vec();
                decode.add(&last, &positions[i]);
            }
            let want: Vec<u64> = prompt["greedy"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
            let (mut agreed, mut compared) = (0, 0);
            for &w in &want {
                if margin_over_std(&last) < onebit_testkit::TIE_MARGIN {
                    break; // a near tie: the reference may go either way from here
                }
                compared += 1;
                let next = argmax(&last) as u32;
                if next as u64 != w {
                    break;
                }
                agreed += 1;
                let l = model
                    .forward_one_adapted(&pool, &mut cache, &[next], &lora, LogitsWanted::Last, &mut scratch)
                    .unwrap();
                last = l.last(0).unwrap().to_vec();
            }
            eprintln!(
                "{name} p{pi} ({} tok): batch mean {:.4} max {:.4} | decode mean {:.4} max {:.4} | greedy {agreed}/{compared}",
                tokens.len(),
                batch.mean(),
                batch.max(),
                decode.mean(),
                decode.max()
            );
            batch.assert_within(&format!("{name} prompt {pi} batch"), 0.5, 0.15);
            decode.assert_within(&format!("{name} prompt {pi} decode"), 0.5, 0.15);
            assert_eq!(agreed, compared, "{name} prompt {pi}: greedy continuation diverges at step {agreed}");
        }
    }
}

#[test]
fn qwen3_q8_0_at_scale_1() {
    check_fixture("logits-lora-qwen3-q8_0-s1.json");
}

#[test]
fn qwen3_q8_0_at_scale_half() {
    check_fixture("logits-lora-qwen3-q8_0-s0.5.json");
}

#[test]
fn qwen3_tq2_0_at_scale_1() {
    check_fixture("logits-lora-qwen3-tq2_0-s1.json");
}

/// Every prompt of the fixtures in one pass over a shared pool: prompt i without the adapter,
/// at scale 1 or at scale 0.5 (by i mod 3), each against its own reference.
#[test]
fn sequences_with_different_adapters_share_a_batch() {
    let (Some((s1, model_path, adapter)), Some(half), Some(base)) = (
        inputs("logits-lora-qwen3-q8_0-s1.json"),
        onebit_testkit::fixture("logits-lora-qwen3-q8_0-s0.5.json"),
        onebit_testkit::fixture("logits-qwen3-q8_0.json"),
    ) else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let refs = [&base, &s1, &half];
    let sets: [&[LoraUse]; 3] = [&[], &[LoraUse { id: 0, scale: 1.0 }], &[LoraUse { id: 0, scale: 0.5 }]];
    let n_prompts = base["prompts"].as_array().unwrap().len();
    // Each prompt twice, so that every adapter set has several sequences.
    let order: Vec<usize> = (0..2 * n_prompts).map(|i| i % n_prompts).collect();
    for tier in KernelTier::available() {
        let model = load(&model_path, &adapter, tier);
        let prompts: Vec<Vec<u32>> = order.iter().map(|&p| prompt_tokens(&base["prompts"][p])).collect();
        let (tables, n_blocks) = reversed_tables(prompts.iter().map(|p| p.len().div_ceil(BLOCK_TOKENS)));
        let mut kv = model.new_pool(n_blocks).unwrap();
        let batch: Vec<SeqInput> = prompts
            .iter()
            .zip(&tables)
            .map(|(p, t)| SeqInput { tokens: p, start: 0, blocks: t, window_blocks: None, logits: LogitsWanted::All })
            .collect();
        let lora: Vec<&[LoraUse]> = (0..batch.len()).map(|i| sets[i % 3]).collect();
        let mut scratch = Scratch::new();
        let logits = model.forward_adapted(&Pool::new(2), &mut kv, &batch, &lora, &mut scratch).unwrap();
        for (s, &p) in order.iter().enumerate() {
            let reference = refs[s % 3];
            assert_eq!(prompt_tokens(&reference["prompts"][p]), prompts[s], "the fixtures share their prompts");
            let mut stats = PositionStats::default();
            for (i, pos) in reference["prompts"][p]["positions"].as_array().unwrap().iter().enumerate() {
                stats.add(logits.get(s, i).unwrap(), pos);
            }
            stats.assert_within(&format!("[{tier}] sequence {s} (prompt {p}, set {})", s % 3), 0.5, 0.15);
        }
    }
}

/// An adapter file written here: the shared adapter's metadata with `tweak` applied, and one
/// pair for `blk.0.attn_q.weight` of the given shapes.
fn adapter_file(name: &str, tweak: impl FnOnce(&mut GgufWriter<'static>), a: [u64; 2], b: [u64; 2]) -> PathBuf {
    let mut w = GgufWriter::new();
    w.set("general.type", OwnedValue::string("adapter"));
    w.set("general.architecture", OwnedValue::string("qwen3"));
    w.set("adapter.type", OwnedValue::string("lora"));
    w.set("adapter.lora.alpha", OwnedValue::F32(16.0));
    let zeros = |s: [u64; 2]| vec![0u8; (s[0] * s[1] * 4) as usize];
    w.add_tensor("blk.0.attn_q.weight.lora_a", GgmlType::F32, &a, zeros(a)).unwrap();
    w.add_tensor("blk.0.attn_q.weight.lora_b", GgmlType::F32, &b, zeros(b)).unwrap();
    tweak(&mut w);
    let path = std::env::temp_dir().join(format!("onebit-lora-{}-{name}.gguf", std::process::id()));
    w.write_file(&path).unwrap();
    path
}

fn load_error(adapter: PathBuf) -> String {
    let model = onebit_testkit::shared_file("models/qwen3-q8_0.gguf").unwrap();
    let options = ModelOptions { lora: vec![adapter.clone()], ..ModelOptions::default() };
    let err = Model::load(&model, &options).expect_err("the adapter must be refused");
    // Only the adapters this test wrote (never a shared model handed in as one).
    if adapter.starts_with(std::env::temp_dir()) {
        let _ = std::fs::remove_file(&adapter);
    }
    assert!(matches!(err, ModelError::BadAdapter { .. }), "{err:?}");
    err.to_string()
}

#[test]
fn adapters_that_do_not_fit_are_refused_by_name() {
    if onebit_testkit::shared_file("models/qwen3-q8_0.gguf").is_none() {
        return;
    }
    let ok = [256, 8];
    let msg = load_error(adapter_file("shape", |_| {}, [256, 8], [8, 255]));
    assert!(msg.contains("blk.0.attn_q.weight") && msg.contains("lora_b has shape [8, 255]"), "{msg}");
    let msg = load_error(adapter_file("in", |_| {}, [128, 8], [8, 256]));
    assert!(msg.contains("lora_a has shape [128, 8]"), "{msg}");
    let msg = load_error(adapter_file(
        "arch",
        |w| _ = w.set("general.architecture", OwnedValue::string("llama")),
        ok,
        [8, 256],
    ));
    assert!(msg.contains("'llama'") && msg.contains("'qwen3'"), "{msg}");
    let msg = load_error(adapter_file(
        "type",
        |w| _ = w.set("adapter.type", OwnedValue::string("control_vector")),
        ok,
        [8, 256],
    ));
    assert!(msg.contains("control_vector"), "{msg}");
    // The tied model has no output matrix of its own.
    let missing = |w: &mut GgufWriter<'static>| {
        w.add_tensor("output.weight.lora_a", GgmlType::F32, &[256, 8], vec![0; 256 * 8 * 4]).unwrap();
        w.add_tensor("output.weight.lora_b", GgmlType::F32, &[8, 49152], vec![0; 8 * 49152 * 4]).unwrap();
    };
    let msg = load_error(adapter_file("missing", missing, ok, [8, 256]));
    assert!(msg.contains("'output.weight'") && msg.contains("does not exist in the base model"), "{msg}");
    let lonely = |w: &mut GgufWriter<'static>| {
        w.add_tensor("blk.1.attn_k.weight.lora_a", GgmlType::F32, &[256, 8], vec![0; 256 * 8 * 4]).unwrap();
    };
    let msg = load_error(adapter_file("lonely", lonely, ok, [8, 256]));
    assert!(msg.contains("blk.1.attn_k.weight.lora_a") && msg.contains("no partner"), "{msg}");
    // A model is not an adapter.
    let msg = load_error(onebit_testkit::shared_file("models/qwen2-q4_0.gguf").unwrap());
    assert!(msg.contains("not an adapter"), "{msg}");
}

#[test]
fn adapters_are_refused_on_the_gpu_before_it_is_opened() {
    let (Some(model), Some(adapter)) =
        (onebit_testkit::shared_file("models/qwen3-q8_0.gguf"), onebit_testkit::shared_file(ADAPTER))
    else {
        return;
    };
    let options = ModelOptions { device: Device::Cuda(0), lora: vec![adapter], ..ModelOptions::default() };
    let err = Model::load(&model, &options).unwrap_err();
    assert!(matches!(err, ModelError::Device(_)) && err.to_string().contains("CPU only"), "{err}");
}
