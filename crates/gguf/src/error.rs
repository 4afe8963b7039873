//! Typed errors for reading, validating and writing GGUF files.
//!
//! Every format error names the field it is about and the byte offset where that field starts,
//! so a user (or a bug report) can point at the exact bytes.

use std::path::PathBuf;

use crate::metadata::ValueType;

pub type Result<T, E = GgufError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    #[error("cannot read {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },

    #[error("{}: {source}", path.display())]
    InFile { path: PathBuf, source: Box<GgufError> },

    #[error("not a GGUF file: magic at byte 0 is {found:?}, expected \"GGUF\"")]
    BadMagic { found: String },

    #[error("unsupported GGUF version {version} at byte 4 (onebit reads versions 2 and 3){hint}")]
    UnsupportedVersion { version: u32, hint: &'static str },

    #[error("truncated file: {field} at byte {offset} needs {needed} bytes, only {available} remain")]
    Truncated { field: String, offset: u64, needed: u64, available: u64 },

    #[error(
        "{field} at byte {offset} is {count}, more than the {remaining} bytes left in the file can hold (a truncated or corrupt file)"
    )]
    CountTooLarge { field: String, offset: u64, count: u64, remaining: u64 },

    #[error("invalid {field} at byte {offset}: {reason}")]
    Invalid { field: String, offset: u64, reason: String },

    #[error("tensor '{tensor}' (info at byte {offset}) has unknown ggml type id {id}")]
    UnknownTensorType { tensor: String, offset: u64, id: u32 },

    #[error("duplicate metadata key '{key}' at byte {offset}")]
    DuplicateKey { key: String, offset: u64 },

    #[error("duplicate tensor name '{name}' (info at byte {offset})")]
    DuplicateTensor { name: String, offset: u64 },

    #[error("tensor '{tensor}' (info at byte {offset}): {reason}")]
    BadTensor { tensor: String, offset: u64, reason: String },

    #[error(
        "tensors '{first}' and '{second}' overlap: bytes {first_start}..{first_end} and {second_start}..{second_end} of the data section"
    )]
    TensorOverlap {
        first: String,
        second: String,
        first_start: u64,
        first_end: u64,
        second_start: u64,
        second_end: u64,
    },

    #[error(
        "the index of this file would need {needed} bytes of memory, more than the file's own {file_len} bytes allow"
    )]
    IndexTooLarge { needed: u64, file_len: u64 },

    #[error("metadata key '{key}' is missing")]
    MissingKey { key: String },

    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    WrongType { key: String, expected: String, found: ValueType },

    #[error("metadata key '{key}' (value at byte {offset}) is not valid UTF-8")]
    NotUtf8 { key: String, offset: u64 },

    #[error("metadata key '{key}': value {value} does not fit in {target}")]
    OutOfRange { key: String, value: String, target: &'static str },

    #[error("split model: {reason}")]
    Split { reason: String },

    #[error("cannot write GGUF: {reason}")]
    Write { reason: String },
}

impl GgufError {
    /// Attach the file path, unless the error already names it.
    pub(crate) fn in_file(self, path: &std::path::Path) -> GgufError {
        match self {
            e @ (GgufError::Io { .. } | GgufError::InFile { .. }) => e,
            e => GgufError::InFile { path: path.to_path_buf(), source: Box::new(e) },
        }
    }
}
