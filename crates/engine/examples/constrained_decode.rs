//! What a grammar costs while decoding: the same prompt decoded free and under a JSON schema
//! that never completes, at temperature 1 on 2 threads, with tokens per second and the time
//! per grammar mask (computed beside each forward pass).
//!
//! `cargo run --release -p onebit-engine --example constrained_decode -- MODEL.gguf [TOKENS] [REPS]`

use std::sync::Arc;

use onebit_engine::{Constraint, Engine, Flow, GenerateRequest, Grammar, SamplingParams, Scheduler, SchedulerConfig};
use onebit_kernels::Pool;
use onebit_model::{Model, ModelOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: constrained_decode MODEL.gguf [TOKENS] [REPS]")?;
    let n: usize = args.get(2).map_or(Ok(256), |s| s.parse())?;
    let reps: usize = args.get(3).map_or(Ok(3), |s| s.parse())?;
    let engine = Arc::new(Engine::new(Model::load(path, &ModelOptions::default())?)?);
    let config = SchedulerConfig { parallel: 1, ctx_size: 2048, ..SchedulerConfig::default() };
    let s = Scheduler::start(Arc::clone(&engine), Pool::new(2), config)?;
    let text = "List many short words as a JSON array of strings.";
    let ids = match engine.has_chat_template() {
        true => {
            engine.tokenize(&engine.chat_prompt(&[onebit_engine::message("user", text)], &Default::default())?, true)?
        }
        false => engine.tokenize(text, false)?,
    };
    // Many items are needed: the answer runs to the token limit either way.
    let schema = serde_json::json!({
        "type": "array", "minItems": 100000,
        "items": { "type": "string", "maxLength": 12 }
    });
    let t = std::time::Instant::now();
    engine.check_constraint(&Constraint::new(Grammar::JsonSchema(schema.clone())))?;
    println!("grammar compiler ready (trie and first compilation) in {:.2} s", t.elapsed().as_secs_f64());
    let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for rep in 0..reps {
        for constrained in [false, true] {
            let before = s.stats()?;
            let req = GenerateRequest {
                sampling: SamplingParams { temperature: 1.0, seed: Some(rep as u64), ..Default::default() },
                max_tokens: Some(n),
                ignore_eos: true,
                constraint: constrained.then(|| Constraint::new(Grammar::JsonSchema(schema.clone()))),
                ..Default::default()
            };
            let done = s.submit(ids.clone(), req)?.wait(|_| Flow::Continue)?;
            rates[constrained as usize].push(done.decode_rate());
            let after = s.stats()?;
            let masks = after.masks - before.masks;
            let per_mask = (after.mask_micros - before.mask_micros) as f64 / masks.max(1) as f64;
            println!(
                "{:<12} {:>4} tokens in {:>3} steps  {:7.2} tok/s  masks {:>4} at {:6.1} µs",
                if constrained { "json-schema" } else { "free" },
                done.usage.completion_tokens,
                after.steps - before.steps,
                done.decode_rate(),
                masks,
                per_mask
            );
        }
    }
    // The machine's speed drifts (shared hosts): medians of alternating runs, and the median
    // of each pair's ratio.
    let ratios: Vec<f64> = rates[1].iter().zip(&rates[0]).map(|(c, f)| c / f).collect();
    println!(
        "median: free {:.2} tok/s, json-schema {:.2} tok/s; median pair ratio {:.3} ({:+.1} %)",
        median(&rates[0]),
        median(&rates[1]),
        median(&ratios),
        (median(&ratios) - 1.0) * 100.0
    );
    Ok(())
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
