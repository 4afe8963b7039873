//! Text generation: a loaded model with its tokenizer and chat template ([`Engine`], shared
//! behind an `Arc`), and the serving engine that runs many requests at once over it
//! ([`Scheduler`]: continuous batching, a paged KV cache with a prefix cache, cancellation).
//!
//! ```no_run
//! use std::sync::Arc;
//! use onebit_engine::{Engine, Event, Flow, GenerateRequest, SamplingParams, Scheduler, SchedulerConfig};
//! use onebit_kernels::Pool;
//! use onebit_model::{Model, ModelOptions};
//!
//! let engine = Arc::new(Engine::new(Model::load("model.gguf", &ModelOptions::default())?)?);
//! let scheduler = Scheduler::start(Arc::clone(&engine), Pool::new(2), SchedulerConfig::default())?;
//! let prompt = engine.chat_prompt(&[onebit_engine::message("user", "Hi!")], &Default::default())?;
//! let ids = engine.tokenize(&prompt, true)?;
//! let req = GenerateRequest { sampling: SamplingParams::greedy(), max_tokens: Some(32), ..Default::default() };
//! let done = scheduler.submit(ids, req)?.wait(|event| {
//!     if let Event::Token { text, .. } = event {
//!         print!("{text}");
//!     }
//!     Flow::Continue
//! })?;
//! println!("\n{:?}", done.finish);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod blocks;
pub mod chat_format;
pub mod constraint;
mod error;
mod lora;
mod request;
pub mod sampling;
pub mod scheduler;
pub mod speculative;
pub mod stop;

use std::sync::{Arc, OnceLock};

use onebit_model::Model;
use onebit_tokenizer::{ChatRequest, ChatTemplate, Tokenizer};
use serde_json::{Map, Value as Json};

pub use constraint::{Constraint, Grammar};
pub use error::{EngineError, ParamError};
pub use request::{Completion, Event, EventSink, FinishReason, Flow, GenerateRequest, RequestHandle, Timings, Usage};
pub use sampling::{Sampler, SamplingParams, TokenLogprobs};
pub use scheduler::{BlockCounts, PoolMemory, Scheduler, SchedulerConfig, SchedulerStats, SequenceInfo, Submitted};
pub use speculative::{SpecMode, SpecOverride, Speculation};

/// A chat message for [`Engine::chat_prompt`].
pub fn message(role: &str, content: &str) -> Json {
    serde_json::json!({ "role": role, "content": content })
}

/// How a conversation is rendered.
#[derive(Clone, Debug, Default)]
pub struct ChatOptions {
    /// Other template variables (for Qwen3, `enable_thinking: false` turns thinking off).
    pub extra: Map<String, Json>,
}

/// A model ready to generate: weights, tokenizer and chat template.
pub struct Engine {
    model: Model,
    tokenizer: Arc<Tokenizer>,
    /// Built on the first constrained request: a large vocabulary's trie takes a while.
    guidance: OnceLock<Result<constraint::Guidance, String>>,
    template: Option<ChatTemplate>,
    template_source: Option<String>,
    /// The draft model of speculative decoding (`--model-draft`), if any.
    draft: Option<Model>,
    /// The global scales of the model's LoRA adapters.
    lora: lora::LoraScales,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Engine({:?}, {:?})", self.model, self.tokenizer)
    }
}

impl Engine {
    /// Build the tokenizer and the chat template from the model's own metadata.
    pub fn new(model: Model) -> Result<Engine, EngineError> {
        let tokenizer = Tokenizer::from_metadata(&model.gguf().metadata())?;
        let template_source = tokenizer.chat_template().map(str::to_string);
        let template = template_source.as_deref().map(ChatTemplate::new).transpose()?;
        let lora = lora::LoraScales::new(model.loras().len());
        Ok(Engine {
            model,
            tokenizer: Arc::new(tokenizer),
            template,
            template_source,
            guidance: OnceLock::new(),
            draft: None,
            lora,
        })
    }

    /// Render chats with `source` instead of the model's own template (`--chat-template-file`).
    pub fn set_chat_template(&mut self, source: &str) -> Result<(), EngineError> {
        self.template = Some(ChatTemplate::new(source)?);
        self.template_source = Some(source.to_string());
        Ok(())
    }

    /// The Jinja source of the chat template in use.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.template_source.as_deref()
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Draft with `draft` (`--model-draft`): it must speak the same vocabulary, token for
    /// token, or its guesses would be other tokens than they seem.
    pub fn set_draft(&mut self, draft: Model) -> Result<(), EngineError> {
        let theirs = Tokenizer::from_metadata(&draft.gguf().metadata())?;
        let (n, m) = (self.model.config().vocab_size, draft.config().vocab_size);
        let refuse =
            |why: String| Err(EngineError::Config(format!("the draft model cannot draft for this model: {why}")));
        if n != m {
            return refuse(format!("its vocabulary has {m} tokens, this model's {n}"));
        }
        let ours = &self.tokenizer;
        if let Some(id) = (0..n as u32).find(|&id| ours.piece(id, true) != theirs.piece(id, true)) {
            return refuse(format!(
                "token {id} is {:?} there and {:?} here",
                String::from_utf8_lossy(theirs.piece(id, true)),
                String::from_utf8_lossy(ours.piece(id, true))
            ));
        }
        self.draft = Some(draft);
        Ok(())
    }

    /// The draft model, if one was set.
    pub fn draft(&self) -> Option<&Model> {
        self.draft.as_ref()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The grammar compiler over this model's vocabulary, built on first use.
    pub fn guidance(&self) -> Result<&constraint::Guidance, EngineError> {
        let g = self
            .guidance
            .get_or_init(|| constraint::Guidance::new(Arc::clone(&self.tokenizer), self.model.config().vocab_size));
        g.as_ref().map_err(|e| EngineError::Grammar(e.clone()))
    }

    /// Whether `c` compiles: the check a server makes before accepting a request
    /// ([`Scheduler::submit`] makes it too).
    pub fn check_constraint(&self, c: &Constraint) -> Result<(), EngineError> {
        self.guidance()?.matcher(c).map(drop)
    }

    /// A running sequence's state for `c` (compiled now: errors come before any work).
    pub(crate) fn constraint_state(&self, c: &Constraint) -> Result<constraint::ConstraintState, EngineError> {
        let g = self.guidance()?;
        let matcher = g.matcher(c)?;
        Ok(constraint::ConstraintState::new(matcher, Arc::clone(g.tok_env()), c.trigger.as_deref()))
    }

    /// Whether the model brings a chat template (a model without one is prompted as text).
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// The prompt for a conversation, ending where the assistant's answer begins.
    pub fn chat_prompt(&self, messages: &[Json], opts: &ChatOptions) -> Result<String, EngineError> {
        let template = match &self.template {
            Some(t) => t,
            None => return Err(EngineError::BadRequest("this model has no chat template; send plain text".into())),
        };
        let specials = &self.tokenizer.vocab().specials;
        let req = ChatRequest {
            messages: messages.to_vec(),
            add_generation_prompt: true,
            bos_token: self.tokenizer.token_text(specials.bos),
            eos_token: self.tokenizer.token_text(specials.eos),
            extra: opts.extra.clone(),
            ..ChatRequest::default()
        };
        Ok(template.render(&req)?)
    }

    /// Token ids of a prompt. With `special` (a rendered chat, or a raw prompt written like
    /// one, as llama-completion and llama-server read prompts), special-token text becomes the
    /// special tokens, and BOS is added as the vocabulary asks unless the text already starts
    /// with it. Without, the text is tokenized as text, with BOS as the vocabulary asks.
    pub fn tokenize(&self, text: &str, special: bool) -> Result<Vec<u32>, EngineError> {
        let specials = &self.tokenizer.vocab().specials;
        let bos_text = self.tokenizer.token_text(specials.bos);
        let starts_with_bos = special && !bos_text.is_empty() && text.starts_with(&bos_text);
        let ids = self.tokenizer.encode(text, !starts_with_bos, special)?;
        if ids.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        Ok(ids)
    }
}
