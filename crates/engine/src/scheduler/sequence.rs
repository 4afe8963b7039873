//! One request's sequence as the scheduler holds it: its tokens and how many of them are in the
//! cache, its block table, its sampler, stop strings and text decoder, and its event stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use onebit_model::LoraUse;
use onebit_tokenizer::{StreamDecoder, Tokenizer};

use crate::blocks::Table;
use crate::constraint::{ConstraintState, Progress};
use crate::request::{Completion, Event, EventSink, FinishReason, GenerateRequest, Timings, Usage};
use crate::sampling::{Sampler, TokenLogprobs};
use crate::speculative::{Acceptance, Speculation};
use crate::stop::StopMatcher;

/// A running sequence as a status page shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SequenceInfo {
    /// The request's number.
    pub id: u64,
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the prefix cache.
    pub cached_tokens: usize,
    /// Positions in the cache (prompt and answer).
    pub computed: usize,
    pub generated: usize,
    pub max_tokens: Option<usize>,
    /// Still computing its prompt.
    pub prefilling: bool,
}

pub(crate) struct Sequence {
    pub id: u64,
    /// The prompt, then every token sampled so far (the last one not yet computed).
    pub tokens: Vec<u32>,
    pub n_prompt: usize,
    /// Leading tokens whose keys and values are in the blocks.
    pub n_computed: usize,
    /// Its blocks, and its place in the prefix cache.
    pub table: Table,
    /// Its LoRA adapters (resolved at submission; see [`crate::Engine::resolve_lora`]).
    pub lora: Vec<LoraUse>,
    /// Prompt tokens found in the prefix cache when the sequence first got its place.
    pub cached: usize,
    /// The grammar the output must follow (taken out while its mask is computed).
    pub constraint: Option<Box<ConstraintState>>,
    /// Speculative decoding: the settings, how well drafts have fared, the tokens drafted for
    /// this step (already in `tokens`, after the newest sampled one), and the lookup's guess
    /// for the next token when it drafted nothing (to keep learning its acceptance).
    pub spec: Speculation,
    pub acceptance: Acceptance,
    pub n_draft: usize,
    pub predicted: Option<u32>,
    pub drafted: usize,
    pub accepted: usize,
    /// The draft model's block table and how many leading tokens its cache holds.
    pub draft_blocks: Vec<u32>,
    pub draft_computed: usize,
    /// Steps since this sequence last drafted (a draft model's acceptance is learnt only by
    /// drafting, so a sequence that stopped tries again now and then).
    pub undrafted_steps: usize,
    pub probe_every: usize,
    sampler: Sampler,
    stops: StopMatcher,
    decoder: StreamDecoder,
    max_tokens: Option<usize>,
    ignore_eos: bool,
    /// Control tokens whose text goes into the output.
    shown_specials: Vec<u32>,
    pub logprobs: Option<usize>,
    ids: Vec<u32>,
    text: String,
    events: Box<dyn EventSink>,
    cancel: Arc<AtomicBool>,
    user_cancel: Option<Arc<AtomicBool>>,
    submitted: Instant,
    admitted: Option<Instant>,
    prefilled: Option<Instant>,
    first_token: Option<Instant>,
}

/// What became of a sequence after its token of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum After {
    Continue,
    Finish(FinishReason),
    /// The constraint's matcher failed (the message).
    Fail(String),
}

impl Sequence {
    pub fn new(
        id: u64,
        prompt: Vec<u32>,
        req: GenerateRequest,
        events: Box<dyn EventSink>,
        cancel: Arc<AtomicBool>,
        constraint: Option<ConstraintState>,
        spec: Speculation,
    ) -> Sequence {
        let mut sampler = Sampler::new(req.sampling);
        prompt.iter().for_each(|&id| sampler.accept(id));
        Sequence {
            id,
            n_prompt: prompt.len(),
            tokens: prompt,
            n_computed: 0,
            table: Table::default(),
            lora: Vec::new(),
            cached: 0,
            constraint: constraint.map(Box::new),
            spec,
            acceptance: Acceptance::default(),
            n_draft: 0,
            predicted: None,
            drafted: 0,
            accepted: 0,
            draft_blocks: Vec::new(),
            draft_computed: 0,
            undrafted_steps: 0,
            probe_every: super::draft::PROBE_FIRST,
            sampler,
            stops: StopMatcher::new(&req.stop),
            decoder: StreamDecoder::new(),
            max_tokens: req.max_tokens,
            ignore_eos: req.ignore_eos,
            shown_specials: req.shown_specials.clone(),
            logprobs: req.logprobs,
            ids: Vec::new(),
            text: String::new(),
            events,
            cancel,
            user_cancel: req.cancel,
            submitted: Instant::now(),
            admitted: None,
            prefilled: None,
            first_token: None,
        }
    }

    /// What a status page shows of this sequence.
    pub fn info(&self) -> SequenceInfo {
        SequenceInfo {
            id: self.id,
            prompt_tokens: self.n_prompt,
            cached_tokens: self.cached,
            computed: self.n_computed,
            generated: self.ids.len(),
            max_tokens: self.max_tokens,
            prefilling: self.prefilled.is_none(),
        }
    }

    /// Tokens still to compute (1 for a decoding sequence, more with a draft).
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.n_computed
    }

    /// Tokens the sequence may still generate (none: no limit but the context).
    pub fn budget_left(&self, ctx: usize) -> usize {
        let by_ctx = ctx.saturating_sub(self.tokens.len());
        self.max_tokens.map_or(by_ctx, |m| m.saturating_sub(self.ids.len()).min(by_ctx))
    }

    /// Whether this sequence may draft: speculation is on, and no grammar decides its tokens
    /// (a mask is computed for one position at a time).
    pub fn may_draft(&self) -> bool {
        self.spec.is_on() && self.constraint.is_none()
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.user_cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed))
    }

    pub fn sampler_mut(&mut self) -> &mut Sampler {
        &mut self.sampler
    }

    /// Got a place in the batch, with `cached` leading tokens found in the prefix cache.
    pub fn admitted(&mut self, cached: usize) {
        if self.admitted.is_none() {
            self.admitted = Some(Instant::now());
            self.cached = cached.min(self.n_prompt);
        }
    }

    /// The prompt has just been computed: tell the caller, once.
    pub fn note_prefilled(&mut self) {
        if self.prefilled.is_none() && self.n_computed >= self.n_prompt {
            self.prefilled = Some(Instant::now());
            self.send(Event::Prefilled { prompt_tokens: self.n_prompt, cached: self.cached });
        }
    }

    /// Whether the token limit allows another token.
    pub fn wants_more(&self) -> bool {
        self.max_tokens.is_none_or(|n| self.ids.len() < n)
    }

    /// Take the token sampled for this sequence (the sampler has seen it already): emit it, then
    /// any tokens the grammar forces after it (they are computed together at the next step), and
    /// say whether it goes on.
    pub fn push_token(&mut self, tok: &Tokenizer, id: u32, logprobs: Option<TokenLogprobs>, ctx: usize) -> After {
        self.first_token.get_or_insert_with(Instant::now);
        let after = self.push_one(tok, id, logprobs, ctx);
        if after != After::Continue {
            return after;
        }
        let Some(c) = self.constraint.as_mut() else { return After::Continue };
        for id in c.forced() {
            // A forced token has probability 1 under the masked distribution.
            let lp = self.logprobs.map(|_| TokenLogprobs { id, logprob: 0.0, top: vec![(id, 0.0)] });
            self.sampler.accept(id);
            let after = self.push_one(tok, id, lp, ctx);
            if after != After::Continue {
                return after;
            }
        }
        After::Continue
    }

    fn push_one(&mut self, tok: &Tokenizer, id: u32, logprobs: Option<TokenLogprobs>, ctx: usize) -> After {
        // Under an active constraint the grammar decides: an end-of-generation token comes
        // only where it may end the output, and then it ends it even with `ignore_eos`.
        let constrained = self.constraint.as_ref().is_some_and(|c| c.is_active());
        if (constrained || !self.ignore_eos) && tok.is_eog(id) {
            return After::Finish(FinishReason::Stop);
        }
        self.ids.push(id);
        self.tokens.push(id);
        let shown = self.shown_specials.contains(&id);
        let step = self.stops.push(&tok.decode_next(&mut self.decoder, id, shown));
        self.text.push_str(&step.emit);
        self.send(Event::Token { id, text: step.emit, logprobs });
        if step.stopped {
            // What was held back belongs to the stop string: nothing is released at the end.
            self.stops = StopMatcher::new(&[]);
            self.decoder = StreamDecoder::new();
            return After::Finish(FinishReason::Stop);
        }
        if let Some(c) = self.constraint.as_mut() {
            match c.accept(tok, id) {
                Progress::Continue => {}
                Progress::Complete => return After::Finish(FinishReason::Stop),
                Progress::Failed(e) => return After::Fail(e),
            }
        }
        if !self.wants_more() {
            return After::Finish(FinishReason::Length);
        }
        if self.tokens.len() > ctx {
            return After::Finish(FinishReason::Context);
        }
        After::Continue
    }

    /// Release held-back text and send the completion.
    pub fn finish(&mut self, finish: FinishReason) {
        let mut tail = self.stops.push(&self.decoder.finish()).emit;
        tail.push_str(&self.stops.finish());
        if !tail.is_empty() {
            self.text.push_str(&tail);
            self.send(Event::Text { text: tail });
        }
        let now = Instant::now();
        let admitted = self.admitted.unwrap_or(now);
        let prefilled = self.prefilled.unwrap_or(now);
        let completion_tokens = self.ids.len();
        let completion = Completion {
            text: std::mem::take(&mut self.text),
            ids: std::mem::take(&mut self.ids),
            finish,
            usage: Usage { prompt_tokens: self.n_prompt, cached_tokens: self.cached, completion_tokens },
            timings: Timings {
                queue: secs(self.submitted, admitted),
                prefill: secs(admitted, prefilled),
                first_token: secs(self.submitted, self.first_token.unwrap_or(now)),
                decode: secs(prefilled, now),
            },
            seed: self.sampler.seed(),
            drafted: self.drafted,
            accepted: self.accepted,
        };
        tracing::debug!(id = self.id, ?finish, usage = ?completion.usage, "request done");
        self.send(Event::Done(Ok(completion)));
    }

    /// End with an error instead.
    pub fn fail(&mut self, error: crate::EngineError) {
        self.send(Event::Done(Err(error)));
    }

    /// Send an event; a caller that went away cancels the sequence.
    fn send(&self, ev: Event) {
        if !self.events.send(ev) {
            self.cancel.store(true, Ordering::Relaxed);
        }
    }
}

fn secs(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
}
