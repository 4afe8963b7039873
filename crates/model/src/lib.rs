//! Llama-family transformers from GGUF files: Qwen3 (and PrismML's Bonsai), Qwen2, Llama
//! (SmolLM, Llama 1/2/3, Mistral GGUFs) and `mistral`.
//!
//! ```no_run
//! use onebit_model::{KvCache, LogitsWanted, Model, ModelOptions, SeqInput};
//! let model = Model::load("model.gguf", &ModelOptions::default())?;
//! let mut cache = model.new_cache(2048);
//! let mut scratch = model.new_scratch();
//! let logits = model.forward(&mut [SeqInput { cache: &mut cache, tokens: &[1, 2, 3], logits: LogitsWanted::Last }], &mut scratch)?;
//! let next = logits.last(0).unwrap();
//! # Ok::<(), onebit_model::ModelError>(())
//! ```
//!
//! The shape of the code: [`config`] reads hyperparameters from metadata, [`weights`] maps the
//! table of tensors, [`forward`] runs a batch of sequences through the blocks (norm, attention,
//! MLP), and [`kv_cache`] holds each sequence's keys and values.

mod attention;
pub mod config;
mod error;
pub mod forward;
pub mod kv_cache;
mod rope;
mod weights;

use std::path::Path;
use std::sync::Mutex;

use onebit_gguf::GgufModel;
use onebit_kernels::{BatchRounding, KernelTier, Kernels, Pool};

pub use config::{Arch, Config};
pub use error::ModelError;
pub use forward::{Logits, LogitsWanted, Scratch, SeqInput};
pub use kv_cache::{KvCache, KvType};

/// How to load and run a model.
#[derive(Clone, Debug, Default)]
pub struct ModelOptions {
    /// Threads for the forward pass (0: every core).
    pub threads: usize,
    /// Force a kernel tier instead of the best one available.
    pub kernel_tier: Option<KernelTier>,
    /// How sequences' caches store keys and values.
    pub kv_type: KvType,
    /// How activations of a prompt (a batch of tokens) are rounded to 8 bits.
    pub batch_rounding: BatchRounding,
}

/// A loaded model: its file mapped in memory, its weights, kernels and threads.
pub struct Model {
    // Field order matters: `weights` borrows from `file` and must drop first.
    weights: weights::Weights,
    config: Config,
    kernels: Kernels,
    pool: Mutex<Pool>,
    kv_type: KvType,
    file: GgufModel,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Model({:?}, {} layers, kernels {})", self.config.arch, self.config.n_layers, self.kernels.tier())
    }
}

impl Model {
    /// Open `path` (any part of a split model) and map its weights. Nothing is copied or
    /// dequantized: loading costs the validation of the file and the table of tensors.
    pub fn load(path: impl AsRef<Path>, options: &ModelOptions) -> Result<Model, ModelError> {
        Model::from_gguf(GgufModel::open(path)?, options)
    }

    pub fn from_gguf(file: GgufModel, options: &ModelOptions) -> Result<Model, ModelError> {
        let kernels = match options.kernel_tier {
            Some(tier) => Kernels::new(tier)?,
            None => Kernels::best(),
        }
        .with_batch_rounding(options.batch_rounding);
        let mut config = Config::from_metadata(&file.metadata())?;
        options.kv_type.check(&config)?;
        let weights = weights::Weights::load(&file, &mut config, kernels)?;
        let threads = if options.threads == 0 { Pool::default_threads() } else { options.threads };
        Ok(Model { weights, config, kernels, pool: Mutex::new(Pool::new(threads)), kv_type: options.kv_type, file })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The GGUF file(s) the model was loaded from (metadata, tokenizer, tensors).
    pub fn gguf(&self) -> &GgufModel {
        &self.file
    }

    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    pub fn n_threads(&self) -> usize {
        self.pool.lock().map(|p| p.n_threads()).unwrap_or(1)
    }

    /// A cache for one sequence of up to `capacity` positions (0: the model's trained context).
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        let capacity = if capacity == 0 { self.config.context_length } else { capacity };
        KvCache::new_checked(&self.config, capacity, self.kv_type)
    }

    /// Scratch buffers for [`Model::forward`].
    pub fn new_scratch(&self) -> Scratch {
        Scratch::new(self.n_threads())
    }

    /// Run a batch: append each sequence's tokens to its cache and return the logits asked for.
    /// One pass at a time runs on the model's threads; concurrent callers wait their turn.
    pub fn forward(&self, batch: &mut [SeqInput], scratch: &mut Scratch) -> Result<Logits, ModelError> {
        let pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let net = forward::Net { config: &self.config, weights: &self.weights, kernels: self.kernels, pool: &pool };
        net.forward(batch, scratch)
    }
}
