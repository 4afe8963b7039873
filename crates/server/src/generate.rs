//! The bridge from an HTTP request to the engine: its prompts and choices submitted as
//! sequences whose events arrive on one async channel, cancelled together when the request's
//! future or stream is dropped (a client that goes away), and the figures every answer reports
//! (usage, llama-server's `timings`, the log line, the metrics).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use onebit_engine::{Completion, Event, EventSink, FinishReason, Submitted, TokenLogprobs};
use serde_json::{Value as Json, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::error::ApiError;
use crate::params::Generation;
use crate::state::{AppState, Ready};

/// The events of every choice of one request, tagged with the choice's index.
struct ChoiceSink {
    index: usize,
    tx: UnboundedSender<(usize, Event)>,
}

impl EventSink for ChoiceSink {
    fn send(&self, event: Event) -> bool {
        self.tx.send((self.index, event)).is_ok()
    }
}

/// Cancels every sequence of a request when dropped (the client went away mid-answer).
struct CancelOnDrop {
    submitted: Vec<Submitted>,
    done: bool,
    id: String,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.done {
            self.submitted.iter().for_each(Submitted::cancel);
            tracing::info!(id = %self.id, "client went away; request cancelled");
        }
    }
}

/// A request running in the engine: `n` choices for each of its prompts.
pub struct Running {
    rx: UnboundedReceiver<(usize, Event)>,
    guard: CancelOnDrop,
    pub state: Arc<AppState>,
    /// The prompt each choice answers (index into the request's prompts).
    pub prompt_of: Vec<usize>,
    pub started: Instant,
    pub endpoint: &'static str,
    finished: usize,
}

impl Running {
    /// Submit `n` choices for each prompt. Nothing runs unless every prompt fits the context.
    pub fn submit(
        state: &Arc<AppState>,
        ready: &Ready,
        prompts: Vec<Vec<u32>>,
        job: &Generation,
        endpoint: &'static str,
        id: String,
    ) -> Result<Running, ApiError> {
        for p in &prompts {
            ready.scheduler.check_prompt(p)?;
        }
        let (tx, rx) = unbounded_channel();
        let mut guard = CancelOnDrop { submitted: Vec::new(), done: false, id };
        let mut prompt_of = Vec::new();
        for (p, prompt) in prompts.iter().enumerate() {
            for i in 0..job.n {
                let mut req = job.request.clone();
                // Several choices from one seed must still differ, and reproduce.
                req.sampling.seed = req.sampling.seed.map(|s| s.wrapping_add(i as u64));
                let index = prompt_of.len();
                let sink = ChoiceSink { index, tx: tx.clone() };
                match ready.scheduler.submit_to(prompt.clone(), req, sink) {
                    Ok(s) => guard.submitted.push(s),
                    Err(e) => {
                        guard.done = true;
                        guard.submitted.iter().for_each(Submitted::cancel);
                        return Err(e.into());
                    }
                }
                prompt_of.push(p);
            }
        }
        state.active.fetch_add(1, Ordering::AcqRel);
        Ok(Running { rx, guard, state: Arc::clone(state), prompt_of, started: Instant::now(), endpoint, finished: 0 })
    }

    pub fn id(&self) -> &str {
        &self.guard.id
    }

    pub fn n_choices(&self) -> usize {
        self.prompt_of.len()
    }

    /// The next event of any choice; `None` once every choice is done.
    pub async fn next(&mut self) -> Option<(usize, Event)> {
        if self.finished == self.prompt_of.len() {
            self.guard.done = true;
            return None;
        }
        let ev = self.rx.recv().await;
        match &ev {
            Some((_, Event::Done(_))) => {
                self.finished += 1;
                if self.finished == self.prompt_of.len() {
                    self.guard.done = true;
                }
            }
            None => self.guard.done = true,
            _ => {}
        }
        ev
    }

    /// Follow every choice to its end.
    pub async fn collect(mut self) -> Result<(Vec<Choice>, Running), ApiError> {
        let mut choices: Vec<Choice> = (0..self.n_choices()).map(|_| Choice::default()).collect();
        while let Some((i, ev)) = self.next().await {
            match ev {
                Event::Token { logprobs: Some(lp), .. } => choices[i].logprobs.push(lp),
                Event::Done(Ok(c)) => choices[i].completion = Some(c),
                Event::Done(Err(e)) => return Err(e.into()),
                _ => {}
            }
        }
        if choices.iter().any(|c| c.completion.is_none()) {
            return Err(ApiError::internal("the engine stopped before the answer was complete"));
        }
        Ok((choices, self))
    }

    /// Usage over the request's choices (each prompt counted once), and llama-server's
    /// timings of the first choice; also logs the request's line and records its metrics.
    pub fn report(&self, completions: &[&Completion]) -> (Json, Json) {
        let mut prompt = 0;
        let mut cached = 0;
        let mut seen = Vec::new();
        for (c, &p) in completions.iter().zip(&self.prompt_of) {
            if !seen.contains(&p) {
                seen.push(p);
                prompt += c.usage.prompt_tokens;
                cached += c.usage.cached_tokens;
            }
        }
        let generated: usize = completions.iter().map(|c| c.usage.completion_tokens).sum();
        let usage = json!({
            "prompt_tokens": prompt,
            "completion_tokens": generated,
            "total_tokens": prompt + generated,
            "prompt_tokens_details": { "cached_tokens": cached },
        });
        let e2e = self.started.elapsed().as_secs_f64();
        for c in completions {
            self.state.metrics.record(c, e2e);
        }
        let first = completions.first().copied();
        if let Some(c) = first {
            tracing::info!(
                id = %self.id(),
                endpoint = self.endpoint,
                status = 200,
                choices = completions.len(),
                prompt_tokens = prompt,
                cached_tokens = cached,
                generated_tokens = generated,
                queue_ms = (c.timings.queue * 1e3).round(),
                ttft_ms = (c.timings.first_token * 1e3).round(),
                decode_tps = format!("{:.1}", c.decode_rate()),
                "request done"
            );
        }
        (usage, first.map(timings).unwrap_or(Json::Null))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.state.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One choice, followed to its end.
#[derive(Default)]
pub struct Choice {
    pub completion: Option<Completion>,
    pub logprobs: Vec<TokenLogprobs>,
}

/// OpenAI's `finish_reason`: a full context is a `length` too.
pub fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop | FinishReason::Cancelled => "stop",
        FinishReason::Length | FinishReason::Context => "length",
    }
}

/// llama-server's `timings` object.
pub fn timings(c: &Completion) -> Json {
    let prompt_n = c.usage.prompt_tokens - c.usage.cached_tokens;
    let prompt_ms = c.timings.prefill * 1e3;
    let predicted_n = c.usage.completion_tokens;
    let predicted_ms = c.timings.decode * 1e3;
    let per = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
    let rate = |ms: f64, n: usize| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    json!({
        "cache_n": c.usage.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": per(prompt_ms, prompt_n),
        "prompt_per_second": rate(prompt_ms, prompt_n),
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": per(predicted_ms, predicted_n),
        "predicted_per_second": rate(predicted_ms, predicted_n),
    })
}

/// Seconds since the Unix epoch, for `created`.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
