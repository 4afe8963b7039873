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
}
