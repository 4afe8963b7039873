//! Errors a user can act on: what is wrong with the model file or the request.

use onebit_gguf::{GgmlType, GgufError};
use onebit_kernels::KernelError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),

    #[error(transparent)]
    Kernel(#[from] KernelError),

    #[error("unknown architecture '{0}': onebit runs {supported}", supported = crate::config::Arch::SUPPORTED)]
    UnknownArchitecture(String),

    #[error("bad hyperparameter {key}: {reason}")]
    BadHyperparameter { key: String, reason: String },

    #[error("unsupported model feature: {0}")]
    Unsupported(String),

    #[error("tensor '{0}' is required but missing from the file")]
    MissingTensor(String),

    #[error("tensor '{name}' has shape {found:?}, expected {expected:?}")]
    TensorShape { name: String, found: Vec<u64>, expected: Vec<u64> },

    #[error("tensor '{name}' has type {ty}, which onebit cannot {what}")]
    TensorType { name: String, ty: GgmlType, what: &'static str },

    #[error("tensor '{0}' is not expected in this architecture")]
    UnexpectedTensor(String),

    #[error("token id {id} is outside the vocabulary (0..{vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },

    #[error("position {pos} is past the context size {ctx}: start a new sequence or raise --ctx-size")]
    ContextFull { pos: usize, ctx: usize },

    #[error("cannot reserve {} for {what}: lower the context (--ctx-size) or the pool (--kv-size)", human_bytes(*bytes))]
    OutOfMemory { what: String, bytes: u64 },

    #[error("invalid batch: {0}")]
    BadBatch(String),

    #[error("GPU: {0}")]
    Device(String),

    /// A LoRA adapter that does not fit the model (or is not a LoRA adapter at all).
    #[error("LoRA adapter '{file}'{}: {reason}", tensor.as_ref().map(|t| format!(", tensor '{t}'")).unwrap_or_default())]
    BadAdapter { file: String, tensor: Option<String>, reason: String },
}

/// `1.5 GiB`, `640.0 MiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{b} B") } else { format!("{v:.1} {}", UNITS[u]) }
}
