//! GGUF, the model file format of llama.cpp: a validating, zero-copy reader and a writer.
//!
//! ```no_run
//! let model = onebit_gguf::GgufModel::open("model.gguf")?;
//! let layers = model.metadata().get_u32("qwen3.block_count")?;
//! let embd = model.tensor("token_embd.weight").expect("present");
//! println!("{layers} layers, embedding {:?} {}", embd.shape(), embd.ggml_type());
//! # Ok::<(), onebit_gguf::GgufError>(())
//! ```
//!
//! Opening a file maps it read-only and checks every structural rule up front (see
//! [`reader`](crate::reader) for the list), so later code can slice tensors without re-checking.
//! No input panics, hangs, or makes the index use more memory than the file's own size.

mod error;
mod file;
mod metadata;
mod reader;
mod split;
mod types;
mod writer;

pub use error::{GgufError, Result};
pub use file::{GgufFile, Tensor};
pub use metadata::{Array, ArrayIter, Metadata, Value, ValueType};
pub use reader::{DEFAULT_ALIGNMENT, INDEX_SLACK, MAX_DIMS};
pub use split::{GgufModel, KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS, part_name};
pub use types::GgmlType;
pub use writer::{GgufStreamWriter, GgufWriter, OwnedValue, TensorInfo};
