//! Parity with llama.cpp: for every `../shared/fixtures/logits-*.json` whose model is present,
//! the fixture's tokens are run as one batch and one token at a time, and the top-40 logits
//! at every position are compared by the rules of `../shared/fixtures/README.md`; then 32
//! greedy tokens, following both the batch and the token-by-token pass, are compared with
//! llama.cpp's. A sparse prompt (Gemma 3's, longer than its sliding window) has positions for
//! some of its tokens only, each naming its token (`i`). Every kernel tier this machine runs is checked (scalar, AVX2, AVX-512 and AMX on
//! the CI machines), with both ways of rounding batch activations.

use std::path::PathBuf;
use std::sync::Mutex;

use onebit_gguf::GgmlType;
use onebit_kernels::{BatchRounding, KernelTier, Pool};
use onebit_model::{BLOCK_TOKENS, Device, KvType, LogitsWanted, Model, ModelOptions, Scratch, SeqInput};
use onebit_testkit::{PositionStats, argmax, margin_over_std, prompt_tokens, reversed_tables};
use serde_json::Value;

/// The models use all cores; run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// `exact`: prompts whose 32 greedy tokens must all equal llama.cpp's, with no allowance for
/// near ties (SmolLM2's "The capital of France is").
fn check_model(fixture: &str, model_path: Option<PathBuf>, exact: &[usize]) {
    let Some(fx) = onebit_testkit::fixture(fixture) else {
        return;
    };
    let Some(path) = model_path else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let has_q1 = onebit_gguf::GgufModel::open(&path).unwrap().tensors().any(|t| t.ggml_type() == GgmlType::Q1_0);
    for tier in KernelTier::available() {
        // Only AMX rounds batches differently from the reference (Q1_0: one scale per 128).
        let roundings: &[BatchRounding] = if tier == KernelTier::Amx && has_q1 {
            &[BatchRounding::Fast, BatchRounding::Reference]
        } else {
            &[BatchRounding::Fast]
        };
        // The scalar tier skips long (sparse) prompts: hundreds of token-at-a-time steps of
        // scalar products take most of CI's time for this test, and the window logic they check
        // is the model's, not the tier's (the SIMD tiers run them; the kernels' tier tests hold
        // each SIMD kernel to the scalar one).
        let fx = if tier == KernelTier::Scalar { without_sparse(&fx) } else { fx.clone() };
        for &batch_rounding in roundings {
            let options = ModelOptions { kernel_tier: Some(tier), batch_rounding, ..ModelOptions::default() };
            let model = Model::load(&path, &options).unwrap();
            let name = format!("{} [{tier}, {batch_rounding}]", fx["model"].as_str().unwrap());
            check_on(&fx, &model, &name, exact);
            check_together(&fx, &model, &name);
        }
    }
}

fn check_on(fx: &Value, model: &Model, name: &str, exact: &[usize]) {
    let tol = tolerance(fx);
    let pool = Pool::new(2);
    let mut scratch = Scratch::new();
    for (pi, prompt) in fx["prompts"].as_array().unwrap().iter().enumerate() {
        let tokens: Vec<u32> = prompt_tokens(prompt);
        let positions = positions(prompt);

        // Batch: every position in one pass.
        let mut cache = model.new_cache(2048).unwrap();
        let logits = model.forward_one(&pool, &mut cache, &tokens, LogitsWanted::All, &mut scratch).unwrap();
        let mut batch = PositionStats::with_tie_margin(tol.tie);
        for &(i, pos) in &positions {
            batch.add(logits.get(0, i).unwrap(), pos);
        }
        let want: Vec<u64> = prompt["greedy"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
        let last = logits.last(0).unwrap().to_vec();
        let exact_prompt = exact.contains(&pi);
        let greedy_tie = if exact_prompt { 0.0 } else { tol.tie };
        let (batch_agreed, batch_compared) = greedy(model, &pool, &mut cache, last, &want, greedy_tie, &mut scratch);

        // Decode: one token at a time, then 32 greedy tokens.
        let mut cache = model.new_cache(2048).unwrap();
        let mut decode = PositionStats::with_tie_margin(tol.tie);
        let mut last = Vec::new();
        let mut at = positions.iter().peekable();
        for (i, &tok) in tokens.iter().enumerate() {
            let l = model.forward_one(&pool, &mut cache, &[tok], LogitsWanted::Last, &mut scratch).unwrap();
            last = l.last(0).unwrap().to_vec();
            if let Some((_, pos)) = at.next_if(|(j, _)| *j == i) {
                decode.add(&last, pos);
            }
        }
        let (agreed, compared) = greedy(model, &pool, &mut cache, last, &want, greedy_tie, &mut scratch);

        eprintln!(
            "{name} p{pi} ({} tok): batch mean {:.4} max {:.4} top1 {}/{} | decode mean {:.4} max {:.4} top1 {}/{} | greedy {agreed}/{compared} of {} (after the batch {batch_agreed}/{batch_compared})",
            tokens.len(),
            batch.mean(),
            batch.max(),
            batch.top1_agree,
            batch.top1_checked,
            decode.mean(),
            decode.max(),
            decode.top1_agree,
            decode.top1_checked,
            want.len()
        );
        for (label, s) in [("batch", &batch), ("decode", &decode)] {
            s.assert_within(&format!("{name} prompt {pi} {label}"), tol.max, tol.mean);
        }
        for (how, agreed, compared) in [("decode", agreed, compared), ("batch", batch_agreed, batch_compared)] {
            assert_eq!(agreed, compared, "{name} prompt {pi} ({how}): greedy continuation diverges at step {agreed}");
            if exact_prompt {
                assert_eq!(agreed, want.len(), "{name} prompt {pi} ({how}): the whole greedy continuation must match");
            }
        }
    }
}

/// Every prompt of the fixture in one pass over a shared pool of blocks (the engine's batched
/// path): each prompt's logits must meet the same tolerances as when it runs alone.
fn check_together(fx: &Value, model: &Model, name: &str) {
    let tol = tolerance(fx);
    let prompts: Vec<Vec<u32>> = fx["prompts"].as_array().unwrap().iter().map(prompt_tokens).collect();
    let (tables, n_blocks) = reversed_tables(prompts.iter().map(|p| p.len().div_ceil(BLOCK_TOKENS)));
    let mut kv = model.new_pool(n_blocks).unwrap();
    let batch: Vec<SeqInput> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| SeqInput { tokens: p, start: 0, blocks: t, window_blocks: None, logits: LogitsWanted::All })
        .collect();
    let mut scratch = Scratch::new();
    let logits = model.forward(&Pool::new(2), &mut kv, &batch, &mut scratch).unwrap();
    for (pi, prompt) in fx["prompts"].as_array().unwrap().iter().enumerate() {
        let mut together = PositionStats::with_tie_margin(tol.tie);
        for (i, pos) in positions(prompt) {
            together.add(logits.get(pi, i).unwrap(), pos);
        }
        together.assert_within(&format!("{name} prompt {pi} together"), tol.max, tol.mean);
    }
}

/// What a prompt must meet: its largest and mean error (in std), and the reference margin (in
/// std) above which top-1 and greedy tokens must agree.
#[derive(Clone, Copy)]
struct Tolerance {
    max: f64,
    mean: f64,
    tie: f64,
}

/// The fixtures' rule (0.5, 0.15, ties under 0.1 std), except on Gemma 3. Its activations are
/// rounded to 8 bits before every product, and a 1-ulp difference in any f32 sum (the order of a
/// product's additions) moves an element across a rounding boundary at some position; Gemma's
/// layers amplify that step into logits that move by tenths of a std. So it is with llama.cpp
/// itself (its own batch and decode passes differ by up to 0.73 std, `self_max_err_over_std`)
/// and with onebit's tiers against one another: measured on prompts 0–5, AVX2 against AVX-512
/// differ by up to 0.58 std (mean 0.21), and each against llama.cpp by up to 0.73 (mean 0.26),
/// the same size; traced layer by layer, every divergence from llama.cpp starts as such a
/// boundary crossing, with inputs equal to 1e-7. Two logits that each move that much swap
/// where the reference puts them 0.12 std apart, so Gemma's near ties are those under 0.2.
fn tolerance(fx: &Value) -> Tolerance {
    if fx["model"].as_str().unwrap().starts_with("gemma-3") {
        Tolerance { max: 0.8, mean: 0.3, tie: 0.2 }
    } else {
        Tolerance { max: 0.5, mean: 0.15, tie: onebit_testkit::TIE_MARGIN }
    }
}

/// The fixture without its sparse (long) prompts.
fn without_sparse(fx: &Value) -> Value {
    let mut fx = fx.clone();
    if let Some(prompts) = fx["prompts"].as_array_mut() {
        prompts.retain(|p| p["sparse"].as_bool() != Some(true));
    }
    fx
}

/// A prompt's reference positions with the token each follows: all of them, or a sparse
/// prompt's (each with its `i`).
fn positions(prompt: &Value) -> Vec<(usize, &Value)> {
    let all = prompt["positions"].as_array().unwrap().iter().enumerate();
    all.map(|(k, p)| (p.get("i").map_or(k, |i| i.as_u64().unwrap() as usize), p)).collect()
}

/// Greedy tokens from `last` (the logits after the prompt in `cache`) while they agree with
/// `want`, stopping at a near tie (our margin under `tie` std; 0 never stops): (agreed, compared).
fn greedy(
    model: &Model,
    pool: &Pool,
    cache: &mut onebit_model::KvCache,
    mut last: Vec<f32>,
    want: &[u64],
    tie: f64,
    scratch: &mut onebit_model::Scratch,
) -> (usize, usize) {
    let (mut compared, mut agreed) = (0, 0);
    for &w in want {
        let next = argmax(&last);
        if margin_over_std(&last) < tie {
            break; // a near tie: the reference may go either way from here
        }
        compared += 1;
        if next as u64 != w {
            break;
        }
        agreed += 1;
        let l = model.forward_one(pool, cache, &[next as u32], LogitsWanted::Last, scratch).unwrap();
        last = l.last(0).unwrap().to_vec();
    }
    (agreed, compared)
}

fn shared_model(name: &str) -> Option<PathBuf> {
    onebit_testkit::shared_file(&format!("models/{name}.gguf"))
}

/// The same checks with the model on the GPU (CUDA device 0); without one, says so and
/// checks nothing (`scripts/test-cuda.sh` runs them where there is one). The references were
/// made with llama.cpp's default f16 cache; an f32 cache is checked against them too where
/// `kv_types` asks (on the random-weight models it stays within the tolerances).
fn check_model_cuda(fixture: &str, model_path: Option<PathBuf>, exact: &[usize], kv_types: &[KvType]) {
    let Some(fx) = onebit_testkit::fixture(fixture) else {
        return;
    };
    let Some(path) = model_path else { return };
    if let Err(e) = onebit_cuda::Gpu::open(0) {
        eprintln!("no GPU, {fixture} not checked on CUDA: {e}");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for &kv_type in kv_types {
        let options = ModelOptions { device: Device::Cuda(0), kv_type, ..ModelOptions::default() };
        let model = Model::load(&path, &options).unwrap();
        let name = format!("{} [cuda, {kv_type} cache]", fx["model"].as_str().unwrap());
        check_on(&fx, &model, &name, exact);
        check_together(&fx, &model, &name);
    }
}

macro_rules! parity {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                check_model(concat!("logits-", $name, ".json"), shared_model($name), &[]);
            }
        )*

        mod cuda {
            use super::*;
            $(
                #[test]
                fn $test() {
                    let kv_types = [KvType::F16, KvType::F32];
                    check_model_cuda(concat!("logits-", $name, ".json"), shared_model($name), &[], &kv_types);
                }
            )*

            /// The real model with the reference's cache type only: with an f32 cache its
            /// logits move by up to 0.58 std on prompt 3 (f16 rounding of cached keys matters
            /// on real weights), as they would in llama.cpp.
            #[test]
            fn smollm2_135m_instruct_q4_1() {
                let model = onebit_testkit::demo_model();
                check_model_cuda("logits-SmolLM2-135M-Instruct.Q4_1.json", model, &[0], &[KvType::F16]);
            }
        }
    };
}

parity! {
    qwen3_q1_0 => "qwen3-q1_0",
    qwen3_q2_0 => "qwen3-q2_0",
    qwen3_q8_0 => "qwen3-q8_0",
    qwen3_tq1_0 => "qwen3-tq1_0",
    qwen3_tq2_0 => "qwen3-tq2_0",
    llama_q4_1 => "llama-q4_1",
    llama_q5_1 => "llama-q5_1",
    llama_q4_k_m => "llama-q4_k_m",
    qwen2_q4_0 => "qwen2-q4_0",
    qwen2_f16 => "qwen2-f16",
    qwen2_bf16 => "qwen2-bf16",
}

#[test]
fn smollm2_135m_instruct_q4_1() {
    check_model("logits-SmolLM2-135M-Instruct.Q4_1.json", onebit_testkit::demo_model(), &[0]);
}

/// Gemma 3 270M: GELU gates, four norms a layer, sliding-window layers (512) among global
/// ones, with a 618-token prompt whose batch and decode both pass the window.
#[test]
fn gemma3_270m_q4_k_m() {
    check_model("logits-gemma-3-270m-q4_k_m.json", onebit_testkit::gemma3_model(), &[]);
}
