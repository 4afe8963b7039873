//! Llama-family transformers from GGUF files: Qwen3 (and PrismML's Bonsai), Qwen3-MoE, Qwen2,
//! Llama (SmolLM, Llama 1/2/3, Mistral GGUFs), `mistral`, and Gemma 3 (sliding-window layers).
//!
//! ```no_run
//! use onebit_kernels::Pool;
//! use onebit_model::{LogitsWanted, Model, ModelOptions, Scratch};
//! let pool = Pool::new(2);
//! let model = Model::load("model.gguf", &ModelOptions::default())?;
//! let mut cache = model.new_cache(2048)?;
//! let mut scratch = Scratch::new();
//! let logits = model.forward_one(&pool, &mut cache, &[1, 2, 3], LogitsWanted::Last, &mut scratch)?;
//! let next = logits.last(0).unwrap();
//! # Ok::<(), onebit_model::ModelError>(())
//! ```
//!
//! The shape of the code: [`config`] reads hyperparameters from metadata, [`weights`] maps the
//! table of tensors, [`forward`] runs a batch of sequences through the blocks (norm, attention,
//! MLP, or a mixture of experts in `moe`), and [`kv_cache`] holds keys and values in a pool of blocks that sequences share
//! through block tables. The threads are the caller's ([`Pool`]): one per process, shared by
//! every model it runs.

mod attention;
pub mod config;
mod cuda;
mod error;
pub mod forward;
pub mod kv_cache;
mod lora;
mod moe;
mod rope;
mod weights;

use std::path::{Path, PathBuf};

use onebit_gguf::GgufModel;
use onebit_kernels::{BatchRounding, KernelTier, Kernels, Pool};

pub use attention::window_reads_from;
pub use config::{Arch, Config, MoeConfig};
pub use error::{ModelError, human_bytes};
pub use forward::{Logits, LogitsWanted, Scratch, SeqInput};
pub use kv_cache::{BLOCK_TOKENS, KvCache, KvPool, KvType, NO_BLOCK};
pub use lora::{LoraAdapter, LoraUse};
pub use onebit_cuda::CudaError;

/// Where a model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// The host's cores, through the kernel tiers of `onebit_kernels`.
    #[default]
    Cpu,
    /// An NVIDIA GPU, by ordinal (`cuda:0`).
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Device, String> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("unknown device '{s}' (known: cpu, cuda, cuda:N)")),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// How to load and run a model.
#[derive(Clone, Debug, Default)]
pub struct ModelOptions {
    /// Where the weights live and the forward pass runs.
    pub device: Device,
    /// Force a kernel tier instead of the best one available.
    pub kernel_tier: Option<KernelTier>,
    /// How sequences' caches store keys and values.
    pub kv_type: KvType,
    /// How activations of a prompt (a batch of tokens) are rounded to 8 bits.
    pub batch_rounding: BatchRounding,
    /// Threads that repack the weights at load (None: every core).
    pub threads: Option<usize>,
    /// LoRA adapters to load beside the weights (ids in this order; see [`LoraUse`]).
    pub lora: Vec<PathBuf>,
    /// Where to keep repacked weights between loads (see [`Model::load`]); None repacks at
    /// every load.
    pub pack_cache: Option<PackCache>,
}

/// A folder for models' repacked weights, and the smallest model worth a file there.
#[derive(Clone, Debug)]
pub struct PackCache {
    pub dir: PathBuf,
    /// Model files smaller than this repack at every load (it takes milliseconds) rather
    /// than leave a file behind.
    pub min_bytes: u64,
}

impl PackCache {
    /// `dir`, for models of 64 MiB and more.
    pub fn new(dir: impl Into<PathBuf>) -> PackCache {
        PackCache { dir: dir.into(), min_bytes: 64 << 20 }
    }
}

/// A loaded model: its file mapped in memory, its weights and kernels.
pub struct Model {
    // Field order matters: `weights` borrows from `file` and must drop first.
    weights: weights::Weights,
    /// The weights on a GPU, when the model runs there.
    cuda: Option<cuda::CudaNet>,
    /// LoRA adapters, applied per sequence ([`Model::forward_adapted`]).
    loras: Vec<lora::LoraAdapter>,
    config: Config,
    kernels: Kernels,
    kv_type: KvType,
    file: GgufModel,
}

/// The cache file for `file`'s repacked weights, and the source string that its header must
/// carry: every part's canonical path, size and modification time.
fn pack_cache_file(cache: &PackCache, file: &GgufModel, kernels: Kernels) -> Option<(PathBuf, String)> {
    if file.file_bytes() < cache.min_bytes {
        return None;
    }
    let mut source = String::new();
    for part in file.parts() {
        let path = std::fs::canonicalize(part.path()?).ok()?;
        let meta = std::fs::metadata(&path).ok()?;
        let mtime = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
        source.push_str(&format!("{}|{}|{mtime};", path.display(), meta.len()));
    }
    let name = file.parts()[0].path()?.file_stem()?.to_string_lossy().into_owned();
    // A short digest of the source keeps two models of the same name apart; the header inside
    // is what decides whether the file is used.
    let digest = source.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    Some((cache.dir.join(format!("{name}-{digest:016x}.{}.pack", kernels.tier())), source))
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Model({:?}, {} layers, kernels {})", self.config.arch, self.config.n_layers, self.kernels.tier())
    }
}

impl Model {
    /// Open `path` (any part of a split model) and map its weights. Nothing is dequantized;
    /// matrices the kernel tier has a repacked layout for are repacked (on threads of their
    /// own, [`ModelOptions::threads`]), and their file pages let go. With
    /// [`ModelOptions::pack_cache`], the repacked weights are kept in a file there, one per
    /// model file and kernel tier, and later loads map that file instead of repacking (a
    /// changed model file, by size or modification time, is repacked again).
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
        if !options.lora.is_empty() && options.device != Device::Cpu {
            return Err(ModelError::Device(format!(
                "LoRA adapters run on the CPU only; load without --lora or with --device cpu (not {})",
                options.device
            )));
        }
        let loras = lora::load_all(&options.lora, &file, &config)?;
        let mut weights = weights::Weights::load(&file, &mut config, kernels)?;
        let cuda = match options.device {
            Device::Cpu => {
                let threads = options.threads.filter(|&t| t > 0).unwrap_or_else(Pool::default_threads);
                let cache = options.pack_cache.as_ref().and_then(|c| pack_cache_file(c, &file, kernels));
                let cache = cache.as_ref().map(|(path, source)| (path.as_path(), source.as_str()));
                weights.pack(kernels, &Pool::new(threads), cache);
                None
            }
            Device::Cuda(ordinal) => {
                cuda::CudaNet::check(&config)?;
                let gpu = std::sync::Arc::new(onebit_cuda::Gpu::open(ordinal)?);
                Some(cuda::CudaNet::upload(gpu, &config, &weights)?)
            }
        };
        Ok(Model { weights, cuda, loras, config, kernels, kv_type: options.kv_type, file })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The GGUF file(s) the model was loaded from (metadata, tokenizer, tensors).
    pub fn gguf(&self) -> &GgufModel {
        &self.file
    }

    /// Where the model runs.
    pub fn device(&self) -> Device {
        self.cuda.as_ref().map_or(Device::Cpu, |c| Device::Cuda(c.gpu().ordinal()))
    }

    /// The GPU's name, when the model runs on one.
    pub fn device_name(&self) -> Option<String> {
        self.cuda.as_ref().map(|c| c.gpu().name().to_string())
    }

    /// The LoRA adapters loaded with the model ([`ModelOptions::lora`]), by id.
    pub fn loras(&self) -> &[LoraAdapter] {
        &self.loras
    }

    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// How caches of this model store keys and values.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// A cache for one sequence of up to `capacity` positions (0: the model's trained context).
    pub fn new_cache(&self, capacity: usize) -> Result<KvCache, ModelError> {
        let capacity = if capacity == 0 { self.config.context_length } else { capacity };
        let pool = self.new_pool(capacity.div_ceil(BLOCK_TOKENS))?;
        Ok(KvCache::with_pool(pool, capacity))
    }

    /// A pool of `n_blocks` blocks for many sequences (see [`KvPool`]).
    pub fn new_pool(&self, n_blocks: usize) -> Result<KvPool, ModelError> {
        self.new_split_pool(n_blocks, n_blocks)
    }

    /// A pool whose sliding-window layers have `n_window_blocks` blocks of their own (see
    /// [`KvPool::new_split`]).
    pub fn new_split_pool(&self, n_blocks: usize, n_window_blocks: usize) -> Result<KvPool, ModelError> {
        KvPool::new_on(&self.config, [n_blocks, n_window_blocks], self.kv_type, self.cuda.as_ref().map(|c| &**c.gpu()))
    }

    /// Run a batch on `pool`'s threads: write each sequence's new keys and values into `kv`
    /// through its block table, and return the logits asked for (kept in `scratch`).
    pub fn forward<'s>(
        &self,
        pool: &Pool,
        kv: &mut KvPool,
        batch: &[SeqInput],
        scratch: &'s mut Scratch,
    ) -> Result<&'s Logits, ModelError> {
        self.forward_adapted(pool, kv, batch, &[], scratch)
    }

    /// [`Model::forward`] with LoRA adapters: `lora[s]` are the adapters (and scales) of
    /// sequence `s` of the batch (`lora` empty: none for any). Sequences with different
    /// adapters share the pass over the base weights; each row gets its own adapters' updates.
    pub fn forward_adapted<'s>(
        &self,
        pool: &Pool,
        kv: &mut KvPool,
        batch: &[SeqInput],
        lora: &[&[LoraUse]],
        scratch: &'s mut Scratch,
    ) -> Result<&'s Logits, ModelError> {
        if !lora.is_empty() && lora.len() != batch.len() {
            return Err(ModelError::BadBatch(format!("{} LoRA sets for {} sequences", lora.len(), batch.len())));
        }
        let lens: Vec<usize> = batch.iter().map(|s| s.tokens.len()).collect();
        let lora = lora::LoraBatch::new(&self.loras, lora, &lens)?;
        if kv.kv_type() != self.kv_type {
            return Err(ModelError::BadBatch(format!(
                "a {} cache for a model loaded with {} caches",
                kv.kv_type(),
                self.kv_type
            )));
        }
        if let Some(gpu) = &self.cuda {
            gpu.forward(&self.config, kv, batch, scratch.logits_mut())?;
            return Ok(scratch.logits());
        }
        if kv.on_device() {
            return Err(ModelError::BadBatch("a KV pool on the GPU for a model on the CPU".into()));
        }
        let net =
            forward::Net { config: &self.config, weights: &self.weights, kernels: self.kernels, pool, lora: &lora };
        net.forward(kv, batch, scratch)
    }

    /// Run `tokens` of one sequence at the end of its own cache.
    pub fn forward_one<'s>(
        &self,
        pool: &Pool,
        cache: &mut KvCache,
        tokens: &[u32],
        logits: LogitsWanted,
        scratch: &'s mut Scratch,
    ) -> Result<&'s Logits, ModelError> {
        self.forward_one_adapted(pool, cache, tokens, &[], logits, scratch)
    }

    /// [`Model::forward_one`] with LoRA adapters (`lora`: the sequence's adapters and scales).
    pub fn forward_one_adapted<'s>(
        &self,
        pool: &Pool,
        cache: &mut KvCache,
        tokens: &[u32],
        lora: &[LoraUse],
        logits: LogitsWanted,
        scratch: &'s mut Scratch,
    ) -> Result<&'s Logits, ModelError> {
        cache.check_room(tokens.len())?;
        let input = SeqInput { tokens, start: cache.len(), blocks: &cache.blocks, window_blocks: None, logits };
        let out = self.forward_adapted(pool, &mut cache.pool, &[input], &[lora], scratch)?;
        cache.advance(tokens.len());
        Ok(out)
    }
}
