//! What a caller sends the scheduler and what it hears back: a request's generation
//! parameters, the events of its stream, and the completion that ends it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use serde::Serialize;

use crate::EngineError;
use crate::constraint::Constraint;
use crate::sampling::{SamplingParams, TokenLogprobs};
use crate::speculative::SpecOverride;

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
    /// What the output must look like (none: anything).
    pub constraint: Option<Constraint>,
    /// Control tokens whose text goes into the output (a chat format's tool-call markers such
    /// as `[TOOL_CALLS]`, which a parser must see); other control tokens are left out.
    pub shown_specials: Vec<u32>,
    /// Speculative decoding choices of this request (what it leaves out: the scheduler's).
    pub speculative: SpecOverride,
    /// LoRA adapters and their scales (adapters not listed: scale 0); none: the engine's
    /// global scales ([`crate::Engine::resolve_lora`]).
    pub lora: Option<Vec<onebit_model::LoraUse>>,
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

/// Something a request's caller hears about, in order: `Prefilled` once, then `Token`s, then
/// possibly one `Text`, and always `Done` last.
#[derive(Debug)]
pub enum Event {
    /// The prompt is in the cache: `cached` of its tokens came from the prefix cache.
    Prefilled { prompt_tokens: usize, cached: usize },
    /// A token was chosen; `text` is the new text it completes (possibly empty: a stop string
    /// may be forming, or the token is part of a multi-byte character).
    Token { id: u32, text: String, logprobs: Option<TokenLogprobs> },
    /// Text released at the end: what was held back for a stop string that did not come.
    Text { text: String },
    /// The request is over.
    Done(Result<Completion, EngineError>),
}

/// Where a request's events go: a channel of any kind. `send` returns false when the receiver
/// is gone, which cancels the request at the next step.
pub trait EventSink: Send + 'static {
    fn send(&self, event: Event) -> bool;
}

impl EventSink for std::sync::mpsc::Sender<Event> {
    fn send(&self, event: Event) -> bool {
        std::sync::mpsc::Sender::send(self, event).is_ok()
    }
}

/// Whether to go on after an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// Token counts of a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the prefix cache (not computed again).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// Where a request's time went, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Timings {
    /// From submission until it got a place in the batch.
    pub queue: f64,
    /// From getting a place until its prompt was in the cache.
    pub prefill: f64,
    /// From submission until its first token.
    pub first_token: f64,
    /// From its prompt being in the cache until the end.
    pub decode: f64,
}

/// The result of a request.
#[derive(Clone, Debug, Serialize)]
pub struct Completion {
    pub text: String,
    pub ids: Vec<u32>,
    pub finish: FinishReason,
    pub usage: Usage,
    pub timings: Timings,
    pub seed: u64,
    /// Tokens drafted by speculative decoding, and how many of them were kept.
    pub drafted: usize,
    pub accepted: usize,
}

impl Completion {
    /// Prompt tokens computed per second (those from the cache are not counted).
    pub fn prefill_rate(&self) -> f64 {
        rate(self.usage.prompt_tokens - self.usage.cached_tokens, self.timings.prefill)
    }

    /// Generated tokens per second.
    pub fn decode_rate(&self) -> f64 {
        rate(self.usage.completion_tokens, self.timings.decode)
    }

    /// The share of drafted tokens that were kept (none: nothing was drafted).
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.drafted > 0).then(|| self.accepted as f64 / self.drafted as f64)
    }
}

fn rate(n: usize, secs: f64) -> f64 {
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

/// A submitted request: its stream of events, and a way to stop it. Dropping the handle
/// cancels the request (its sequence leaves the batch at the next step).
#[derive(Debug)]
pub struct RequestHandle {
    pub(crate) id: u64,
    pub(crate) events: Receiver<Event>,
    pub(crate) cancel: Arc<AtomicBool>,
}

impl RequestHandle {
    /// The scheduler's number for this request.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next event, waiting for it; `None` once the stream is over.
    pub fn recv(&self) -> Option<Event> {
        self.events.recv().ok()
    }

    /// The next event if one comes within `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Event, RecvTimeoutError> {
        self.events.recv_timeout(timeout)
    }

    /// Ask for the request to stop; it ends with [`FinishReason::Cancelled`].
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// Follow the stream to its end: `on_event` sees every event but `Done`, and may stop
    /// the request. Returns the completion.
    pub fn wait(self, mut on_event: impl FnMut(&Event) -> Flow) -> Result<Completion, EngineError> {
        while let Some(ev) = self.recv() {
            if let Event::Done(result) = ev {
                return result;
            }
            if on_event(&ev) == Flow::Stop {
                self.cancel();
            }
        }
        Err(EngineError::ShutDown)
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        self.cancel();
    }
}
