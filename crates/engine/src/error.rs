//! What can go wrong while generating: the model, the tokenizer, or the request.

use onebit_model::ModelError;
use onebit_tokenizer::TokenizerError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),

    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),

    #[error("the prompt is {tokens} tokens, but the context holds {ctx}: shorten it or raise --ctx-size")]
    PromptTooLong { tokens: usize, ctx: usize },

    #[error("the prompt is empty")]
    EmptyPrompt,

    #[error("invalid request: {0}")]
    BadRequest(String),

    /// A schema or grammar that llguidance cannot compile (its message), or GBNF that has no
    /// Lark equivalent.
    #[error("invalid grammar: {0}")]
    Grammar(String),

    #[error("the server is busy: {in_flight} requests are already running or waiting; try again later")]
    Busy { in_flight: usize },

    #[error("a context of {ctx} tokens is more than the {trained} this model was trained for: lower --ctx-size")]
    ContextTooLarge { ctx: usize, trained: usize },

    #[error("{0}")]
    Config(String),

    #[error("the engine has shut down")]
    ShutDown,

    #[error("internal error: {0}")]
    Internal(String),
}

/// A request parameter outside its range: which one (by its API name) and why.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{field} {reason}")]
pub struct ParamError {
    pub field: &'static str,
    pub reason: String,
}

impl ParamError {
    pub fn new(field: &'static str, reason: impl Into<String>) -> ParamError {
        ParamError { field, reason: reason.into() }
    }
}

impl From<ParamError> for EngineError {
    fn from(e: ParamError) -> EngineError {
        EngineError::BadRequest(e.to_string())
    }
}
