//! Text generation: a loaded model with its tokenizer and chat template ([`Engine`]), and
//! conversations that keep their KV cache between requests ([`Session`]).
//!
//! ```no_run
//! use onebit_engine::{Engine, Flow, GenerateRequest, SamplingParams};
//! use onebit_model::{Model, ModelOptions};
//!
//! let engine = Engine::new(Model::load("model.gguf", &ModelOptions::default())?)?;
//! let prompt = engine.chat_prompt(&[onebit_engine::message("user", "Hi!")], &Default::default())?;
//! let ids = engine.tokenize(&prompt, true)?;
//! let mut session = engine.session(4096);
//! let req = GenerateRequest { sampling: SamplingParams::greedy(), max_tokens: Some(32), ..Default::default() };
//! let done = session.generate(&ids, &req, &mut |event| {
//!     if let onebit_engine::Event::Token { text, .. } = event {
//!         print!("{text}");
//!     }
//!     Flow::Continue
//! })?;
//! println!("\n{:?}", done.finish);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
pub mod sampling;
mod session;
pub mod stop;

use onebit_model::Model;
use onebit_tokenizer::{ChatRequest, ChatTemplate, Tokenizer};
use serde_json::{Map, Value as Json};

pub use error::EngineError;
pub use sampling::{Sampler, SamplingParams, TokenLogprobs};
pub use session::{Completion, Event, FinishReason, Flow, GenerateRequest, Session};

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
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
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
        let template = tokenizer.chat_template().map(ChatTemplate::new).transpose()?;
        Ok(Engine { model, tokenizer, template })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
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

    /// Token ids of a prompt. A rendered chat (`templated`) may contain special-token text,
    /// which becomes the special tokens; BOS is added as the vocabulary asks, unless the text
    /// already starts with it. Plain text is tokenized as text, with BOS as the vocabulary asks.
    pub fn tokenize(&self, text: &str, templated: bool) -> Result<Vec<u32>, EngineError> {
        let specials = &self.tokenizer.vocab().specials;
        let bos_text = self.tokenizer.token_text(specials.bos);
        let starts_with_bos = templated && !bos_text.is_empty() && text.starts_with(&bos_text);
        let ids = self.tokenizer.encode(text, !starts_with_bos, templated)?;
        if ids.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        Ok(ids)
    }

    /// A new conversation with room for `ctx` tokens (0: the model's trained context).
    pub fn session(&self, ctx: usize) -> Session<'_> {
        Session::new(self, ctx)
    }
}
