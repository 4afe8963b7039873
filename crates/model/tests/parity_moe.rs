//! Parity of the mixture-of-experts models (`qwen3moe-{q8_0,tq2_0,q1_0}`) with llama.cpp, by the
//! rules of `../shared/fixtures/README.md`: per position, the largest |ours − ref| / std over
//! the reference's top-40 ids; top-1 where the reference's margin exceeds 0.1 std; greedy
//! continuations token for token. Where two router logits nearly tie (`route_gap` < 0.05),
//! rounding picks another expert and the logits move by up to a std (llama.cpp's own decode
//! path flips there): those positions are left out of the max-error and top-1 rules, and
//! greedy comparisons stop at the first step whose `greedy_route_gap` is below 0.05.
//!
//! Every kernel tier this machine runs; the prompt as one batch, one token at a time, and all
//! prompts in one pass over a shared pool. Then, bit for bit: a row's result does not depend on
//! what shares its batch.

use std::path::PathBuf;
use std::sync::Mutex;

use onebit_gguf::GgmlType;
use onebit_kernels::{BatchRounding, KernelTier, Pool};
use onebit_model::{BLOCK_TOKENS, LogitsWanted, Model, ModelOptions, Scratch, SeqInput};
use onebit_testkit::{argmax, margin_over_std, position_error, prompt_tokens};
use serde_json::Value;

/// The models use all cores; run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Routes closer than this may go either way.
const ROUTE_GAP: f64 = 0.05;

/// Errors of every position, and the rules on the positions whose routes are stable.
#[derive(Default)]
struct Stats {
    all: Vec<f64>,
    stable: Vec<f64>,
    top1_checked: usize,
    top1_agree: usize,
}

impl Stats {
    fn add(&mut self, ours: &[f32], pos: &Value) {
        let err = position_error(ours, pos);
        self.all.push(err);
        if pos["route_gap"].as_f64().unwrap() < ROUTE_GAP {
            return;
        }
        self.stable.push(err);
        let top = pos["top"].as_array().unwrap();
        let margin = (top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap()) / pos["std"].as_f64().unwrap();
        if margin > onebit_testkit::TIE_MARGIN {
            self.top1_checked += 1;
            self.top1_agree += (argmax(ours) as u64 == pos["argmax"].as_u64().unwrap()) as usize;
        }
    }

    fn mean(v: &[f64]) -> f64 {
        if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 }
    }

    fn max(v: &[f64]) -> f64 {
        v.iter().copied().fold(0.0, f64::max)
    }

    fn summary(&self) -> String {
        format!(
            "stable {}/{}: mean {:.4} max {:.4} top1 {}/{} (all: mean {:.4} max {:.4})",
            self.stable.len(),
            self.all.len(),
            Self::mean(&self.stable),
            Self::max(&self.stable),
            self.top1_agree,
            self.top1_checked,
            Self::mean(&self.all),
            Self::max(&self.all)
        )
    }

    fn check(&self, what: &str) {
        let (mean, max) = (Self::mean(&self.stable), Self::max(&self.stable));
        assert!(max <= 0.5, "{what}: max error {max:.4} > 0.5 std on stable routes");
        assert!(mean <= 0.15, "{what}: mean error {mean:.4} > 0.15 std on stable routes");
        assert_eq!(self.top1_agree, self.top1_checked, "{what}: top-1 disagrees");
    }
}

/// Greedy tokens from `last` while they agree with the reference's, stopping before a step
/// whose routes or top two logits nearly tie: (agreed, compared).
fn greedy(
    model: &Model,
    pool: &Pool,
    cache: &mut onebit_model::KvCache,
    mut last: Vec<f32>,
    prompt: &Value,
    scratch: &mut Scratch,
) -> (usize, usize) {
    let want = prompt["greedy"].as_array().unwrap();
    let gaps = prompt["greedy_route_gap"].as_array().unwrap();
    let (mut compared, mut agreed) = (0, 0);
    for (w, gap) in want.iter().zip(gaps) {
        if gap.as_f64().unwrap() < ROUTE_GAP || margin_over_std(&last) < 0.1 {
            break;
        }
        compared += 1;
        let next = argmax(&last);
        if next as u64 != w.as_u64().unwrap() {
            break;
        }
        agreed += 1;
        let l = model.forward_one(pool, cache, &[next as u32], LogitsWanted::Last, scratch).unwrap();
        last = l.last(0).unwrap().to_vec();
    }
    (agreed, compared)
}

fn check_on(fx: &Value, model: &Model, name: &str) {
    let pool = Pool::new(2);
    let mut scratch = Scratch::new();
    for (pi, prompt) in fx["prompts"].as_array().unwrap().iter().enumerate() {
        let tokens = prompt_tokens(prompt);
        let positions = prompt["positions"].as_array().unwrap();

        let mut cache = model.new_cache(2048).unwrap();
        let logits = model.forward_one(&pool, &mut cache, &tokens, LogitsWanted::All, &mut scratch).unwrap();
        let mut batch = Stats::default();
        for (i, pos) in positions.iter().enumerate() {
            batch.add(logits.get(0, i).unwrap(), pos);
        }
        let last = logits.last(0).unwrap().to_vec();
        let (batch_agreed, batch_compared) = greedy(model, &pool, &mut cache, last, prompt, &mut scratch);

        let mut cache = model.new_cache(2048).unwrap();
        let mut decode = Stats::default();
        let mut last = Vec::new();
        for (&tok, pos) in tokens.iter().zip(positions) {
            let l = model.forward_one(&pool, &mut cache, &[tok], LogitsWanted::Last, &mut scratch).unwrap();
            last = l.last(0).unwrap().to_vec();
            decode.add(&last, pos);
        }
        let (agreed, compared) = greedy(model, &pool, &mut cache, last, prompt, &mut scratch);

        eprintln!(
            "{name} p{pi} ({} tok): batch {} | decode {} | greedy {agreed}/{compared} (after the batch {batch_agreed}/{batch_compared})",
            tokens.len(),
            batch.summary(),
            decode.summary(),
        );
        batch.check(&format!("{name} prompt {pi} batch"));
        decode.check(&format!("{name} prompt {pi} decode"));
        for (how, agreed, compared) in [("decode", agreed, compared), ("batch", batch_agreed, batch_compared)] {
            assert_eq!(agreed, compared, "{name} prompt {pi} ({how}): greedy continuation diverges at step {agreed}");
        }
    }
}

/// Every prompt in one pass over a shared pool (blocks handed out in reverse): each meets the
/// same rules as alone.
fn check_together(fx: &Value, model: &Model, name: &str) {
    let prompts: Vec<Vec<u32>> = fx["prompts"].as_array().unwrap().iter().map(prompt_tokens).collect();
    let (tables, n_blocks) = onebit_testkit::reversed_tables(prompts.iter().map(|p| p.len().div_ceil(BLOCK_TOKENS)));
    let mut kv = model.new_pool(n_blocks).unwrap();
    let batch: Vec<SeqInput> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| SeqInput { tokens: p, start: 0, blocks: t, window_blocks: None, logits: LogitsWanted::All })
        .collect();
    let mut scratch = Scratch::new();
    let logits = model.forward(&Pool::new(2), &mut kv, &batch, &mut scratch).unwrap();
    for (pi, prompt) in fx["prompts"].as_array().unwrap().iter().enumerate() {
        let mut together = Stats::default();
        for (i, pos) in prompt["positions"].as_array().unwrap().iter().enumerate() {
            together.add(logits.get(pi, i).unwrap(), pos);
        }
        eprintln!("{name} p{pi} together: {}", together.summary());
        together.check(&format!("{name} prompt {pi} together"));
    }
}

fn shared_model(name: &str) -> Option<PathBuf> {
    onebit_testkit::shared_file(&format!("models/{name}.gguf"))
}

fn check_model(name: &str) {
    let Some(fx) = onebit_testkit::fixture(&format!("logits-{name}.json")) else {
        return;
    };
    let Some(path) = shared_model(name) else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let has_q1 = onebit_gguf::GgufModel::open(&path).unwrap().tensors().any(|t| t.ggml_type() == GgmlType::Q1_0);
    for tier in KernelTier::available() {
        // AVX-512 and AMX may round Q1_0 products' activations more coarsely (`Fast`): both ways.
        let roundings: &[BatchRounding] = if has_q1 && matches!(tier, KernelTier::Avx512 | KernelTier::Amx) {
            &[BatchRounding::Fast, BatchRounding::Reference]
        } else {
            &[BatchRounding::Fast]
        };
        for &batch_rounding in roundings {
            let options = ModelOptions { kernel_tier: Some(tier), batch_rounding, ..ModelOptions::default() };
            let model = Model::load(&path, &options).unwrap();
            let label = format!("{name} [{tier}, {batch_rounding}]");
            check_on(&fx, &model, &label);
            check_together(&fx, &model, &label);
        }
    }
}

#[test]
fn qwen3moe_q8_0() {
    check_model("qwen3moe-q8_0");
}

#[test]
fn qwen3moe_tq2_0() {
    check_model("qwen3moe-tq2_0");
}

#[test]
fn qwen3moe_q1_0() {
    check_model("qwen3moe-q1_0");
}

/// Rows of a batch route on their own values only, and each expert computes each of its rows
/// alone: the longest fixture prompt as one batch, one token at a time, and beside other
/// sequences gives the same logits bit for bit, on every tier.
#[test]
fn a_rows_result_does_not_depend_on_its_batch() {
    let Some(path) = shared_model("qwen3moe-tq2_0") else { return };
    let Some(fx) = onebit_testkit::fixture("logits-qwen3moe-tq2_0.json") else { return };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let prompts: Vec<Vec<u32>> = fx["prompts"].as_array().unwrap().iter().map(prompt_tokens).collect();
    let toks = &prompts[2];
    let pool = Pool::new(2);
    for tier in KernelTier::available() {
        let model = Model::load(&path, &ModelOptions { kernel_tier: Some(tier), ..ModelOptions::default() }).unwrap();
        let mut sc = Scratch::new();
        let mut cache = model.new_cache(256).unwrap();
        let batch: Vec<Vec<f32>> = model
            .forward_one(&pool, &mut cache, toks, LogitsWanted::All, &mut sc)
            .unwrap()
            .rows_of(0)
            .map(|(_, l)| l.to_vec())
            .collect();
        let mut cache = model.new_cache(256).unwrap();
        for (i, &t) in toks.iter().enumerate() {
            let l = model.forward_one(&pool, &mut cache, &[t], LogitsWanted::Last, &mut sc).unwrap();
            assert_eq!(l.last(0).unwrap(), &batch[i][..], "[{tier}] token {i}: decode differs from the batch");
        }
        // Beside another prompt, in one pass.
        let other = &prompts[1];
        let mut kv = model.new_pool(8).unwrap();
        let (ta, tb) = ([3u32, 1, 6, 0], [5u32, 2]);
        let out = model
            .forward(
                &pool,
                &mut kv,
                &[
                    SeqInput { tokens: other, start: 0, blocks: &tb, window_blocks: None, logits: LogitsWanted::None },
                    SeqInput { tokens: toks, start: 0, blocks: &ta, window_blocks: None, logits: LogitsWanted::All },
                ],
                &mut sc,
            )
            .unwrap();
        for (i, l) in batch.iter().enumerate() {
            assert_eq!(out.get(1, i).unwrap(), &l[..], "[{tier}] token {i}: differs beside another prompt");
        }
    }
}
