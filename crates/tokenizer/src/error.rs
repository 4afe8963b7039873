//! Tokenizer and chat-template errors.

use onebit_gguf::GgufError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),

    #[error("unknown pre-tokenizer type '{0}' (tokenizer.ggml.pre): onebit refuses to guess how to split text for it")]
    UnknownPre(String),

    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),

    #[error("invalid tokenizer data: {0}")]
    Invalid(String),

    #[error("chat template: {0}")]
    Template(String),
}
