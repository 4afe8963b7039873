//! A conversation's state (its KV cache and the tokens in it) and the generation loop.
//!
//! A new request shares its longest common prefix with what the cache holds; only the rest is
//! prefilled, in chunks, as batched forward passes. Then tokens are sampled one at a time and
//! reported as events with their text, until an end-of-generation token, a stop string, the
//! token limit, a full context, or a cancellation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use onebit_model::{KvCache, LogitsWanted, Scratch, SeqInput};
use onebit_tokenizer::StreamDecoder;
use serde::Serialize;

use crate::sampling::{self, Sampler, SamplingParams, TokenLogprobs};
use crate::stop::StopMatcher;
use crate::{Engine, EngineError};

/// Prompt tokens per forward pass while prefilling.
const PREFILL_CHUNK: usize = 512;

/// What to generate.
#[derive(Clone, Debug, Default)]
pub struct GenerateRequest {
    pub sampling: SamplingParams,
    /// At most this many tokens (none: until the end or a full context).
    pub max_tokens: Option<usize>,
    /// Strings that end the answer; they are not part of it.
    pub stop: Vec<String>,
    /// Report the log-probabilities of each chosen token and of the `n` most likely.
    pub logprobs: Option<usize>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Set from elsewhere (a Ctrl-C handler, a closed connection) to stop early.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The context is full.
    Context,
    /// Cancelled by the caller.
    Cancelled,
}

/// Something the caller hears about while generating.
#[derive(Debug)]
pub enum Event<'a> {
    /// The prompt is in the cache: `reused` of its tokens were already there.
    Prefilled { prompt_tokens: usize, reused: usize },
    /// A token was chosen; `text` is the new text it completes (possibly empty: a stop string
    /// may be forming, or the token is part of a multi-byte character).
    Token { id: u32, text: &'a str, logprobs: Option<&'a TokenLogprobs> },
    /// Text released at the end: what was held back for a stop string that did not come.
    Text { text: &'a str },
}

/// Whether to go on after an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// The result of a request.
#[derive(Clone, Debug, Serialize)]
pub struct Completion {
    pub text: String,
    pub ids: Vec<u32>,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens found in the cache (not prefilled again).
    pub reused_tokens: usize,
    pub completion_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub seed: u64,
}

impl Completion {
    /// Prompt tokens prefilled per second.
    pub fn prefill_rate(&self) -> f64 {
        rate(self.prompt_tokens - self.reused_tokens, self.prefill_seconds)
    }

    /// Generated tokens per second.
    pub fn decode_rate(&self) -> f64 {
        rate(self.completion_tokens, self.decode_seconds)
    }
}

fn rate(n: usize, secs: f64) -> f64 {
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

/// One conversation.
pub struct Session<'e> {
    engine: &'e Engine,
    cache: KvCache,
    /// The tokens whose keys and values the cache holds, in order.
    tokens: Vec<u32>,
    scratch: Scratch,
}

impl<'e> Session<'e> {
    pub(crate) fn new(engine: &'e Engine, ctx: usize) -> Session<'e> {
        Session {
            engine,
            cache: engine.model().new_cache(ctx),
            tokens: Vec::new(),
            scratch: engine.model().new_scratch(),
        }
    }

    /// The context size.
    pub fn capacity(&self) -> usize {
        self.cache.capacity()
    }

    /// Tokens currently in the cache.
    pub fn cached(&self) -> &[u32] {
        &self.tokens
    }

    /// Forget everything.
    pub fn reset(&mut self) {
        self.cache.clear();
        self.tokens.clear();
    }

    /// Generate an answer to `prompt` (the whole conversation so far, as token ids).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        req: &GenerateRequest,
        on_event: &mut dyn FnMut(Event) -> Flow,
    ) -> Result<Completion, EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() >= self.capacity() {
            return Err(EngineError::PromptTooLong { tokens: prompt.len(), ctx: self.capacity() });
        }
        let cancelled = || req.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed));
        let mut sampler = Sampler::new(req.sampling.clone());
        prompt.iter().for_each(|&id| sampler.accept(id));

        let start = Instant::now();
        let reused = self.reuse_prefix(prompt);
        let mut logits = Vec::new();
        for chunk_start in (reused..prompt.len()).step_by(PREFILL_CHUNK) {
            if cancelled() {
                return Ok(self.done(
                    Vec::new(),
                    String::new(),
                    FinishReason::Cancelled,
                    prompt.len(),
                    reused,
                    start,
                    start,
                    &sampler,
                ));
            }
            let chunk = &prompt[chunk_start..(chunk_start + PREFILL_CHUNK).min(prompt.len())];
            let last = chunk_start + chunk.len() == prompt.len();
            logits = self.forward(chunk, if last { LogitsWanted::Last } else { LogitsWanted::None })?;
        }
        let prefilled = Instant::now();
        if on_event(Event::Prefilled { prompt_tokens: prompt.len(), reused }) == Flow::Stop {
            return Ok(self.done(
                Vec::new(),
                String::new(),
                FinishReason::Cancelled,
                prompt.len(),
                reused,
                start,
                prefilled,
                &sampler,
            ));
        }

        let tok = self.engine.tokenizer();
        let mut decoder = StreamDecoder::new();
        let mut stops = StopMatcher::new(&req.stop);
        let (mut ids, mut text) = (Vec::new(), String::new());
        let mut stopped_by_string = false;
        let finish = loop {
            if req.max_tokens.is_some_and(|n| ids.len() >= n) {
                break FinishReason::Length;
            }
            if cancelled() {
                break FinishReason::Cancelled;
            }
            let id = sampler.sample(&logits);
            if !req.ignore_eos && tok.is_eog(id) {
                break FinishReason::Stop;
            }
            sampler.accept(id);
            ids.push(id);
            let lp = req.logprobs.map(|n| sampling::logprobs(&logits, id, n));
            let step = stops.push(&tok.decode_next(&mut decoder, id, false));
            text.push_str(&step.emit);
            let flow = on_event(Event::Token { id, text: &step.emit, logprobs: lp.as_ref() });
            if step.stopped {
                stopped_by_string = true;
                break FinishReason::Stop;
            }
            if flow == Flow::Stop {
                break FinishReason::Cancelled;
            }
            if self.tokens.len() >= self.capacity() {
                break FinishReason::Context;
            }
            logits = self.forward(&[id], LogitsWanted::Last)?;
        };
        if !stopped_by_string {
            // Text held back for a stop string that never came, and any unfinished character.
            let mut tail = stops.push(&decoder.finish()).emit;
            tail.push_str(&stops.finish());
            if !tail.is_empty() {
                text.push_str(&tail);
                on_event(Event::Text { text: &tail });
            }
        }
        Ok(self.done(ids, text, finish, prompt.len(), reused, start, prefilled, &sampler))
    }

    #[allow(clippy::too_many_arguments)]
    fn done(
        &self,
        ids: Vec<u32>,
        text: String,
        finish: FinishReason,
        prompt_tokens: usize,
        reused_tokens: usize,
        start: Instant,
        prefilled: Instant,
        sampler: &Sampler,
    ) -> Completion {
        Completion {
            completion_tokens: ids.len(),
            text,
            ids,
            finish,
            prompt_tokens,
            reused_tokens,
            prefill_seconds: (prefilled - start).as_secs_f64(),
            decode_seconds: prefilled.elapsed().as_secs_f64(),
            seed: sampler.seed(),
        }
    }

    /// Keep the longest prefix of the cache that `prompt` starts with (at least one prompt
    /// token is always run again, for its logits). Returns its length.
    fn reuse_prefix(&mut self, prompt: &[u32]) -> usize {
        let common = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let keep = common.min(prompt.len() - 1);
        self.cache.truncate(keep);
        self.tokens.truncate(keep);
        keep
    }

    fn forward(&mut self, tokens: &[u32], want: LogitsWanted) -> Result<Vec<f32>, EngineError> {
        let mut batch = [SeqInput { cache: &mut self.cache, tokens, logits: want }];
        let logits = self.engine.model().forward(&mut batch, &mut self.scratch)?;
        self.tokens.extend_from_slice(tokens);
        Ok(logits.last(0).map(<[f32]>::to_vec).unwrap_or_default())
    }
}
