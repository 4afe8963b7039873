//! Options every command that runs a model shares (`-m`, `--threads`, `--kernel-tier`, ...),
//! and those of the serving engine (`--parallel`, `--batch-size`, `--kv-size`, ...): the one
//! place where command-line flags become typed configuration.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use onebit_engine::{Engine, Scheduler, SchedulerConfig, SpecMode, Speculation};
use onebit_kernels::{BatchRounding, KernelTier, Pool};
use onebit_model::{Device, KvType, LoraUse, Model, ModelOptions, PackCache};

use super::resolve;
use super::ui::Ui;

/// The context a sequence gets unless `--ctx-size` says otherwise (capped by the model's).
const DEFAULT_CTX: usize = 4096;

#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// A GGUF file, a Hugging Face model (org/repo or org/repo:FILE_OR_QUANT), or nothing for
    /// the demo model in onebit's cache.
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: Option<String>,
    /// Threads for the forward pass [default: every core].
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Kernel family: scalar, avx2, avx512, amx or neon [default: the best this CPU runs].
    #[arg(long, value_name = "TIER")]
    pub kernel_tier: Option<KernelTier>,
    /// Context size of a sequence, in tokens [default: 4096, or the model's if smaller].
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<usize>,
    /// How the KV cache stores keys and values: f16 (as llama.cpp), f32, or q8_0 (half the bytes).
    #[arg(long, default_value = "f16", value_name = "TYPE")]
    pub kv_type: KvType,
    /// How activations are rounded to 8 bits: fast (on AMX, AVX-512 and AVX2, Q1_0 weights take
    /// one scale per 128 values, the weights' block, so products sum whole blocks; prompts and
    /// decoding alike) or reference (llama.cpp's Q8_0, one scale per 32 values, everywhere).
    /// Either way a token's result does not depend on what else is in the batch.
    #[arg(long, default_value = "fast", value_name = "MODE")]
    pub batch_rounding: BatchRounding,
    /// Where the model runs: cpu, or cuda:N for an NVIDIA GPU (needs its driver and NVRTC).
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    pub device: Device,
    /// Keep a model's repacked weights (models from 64 MiB) in this folder, so that later
    /// loads map them instead of repacking: one file per model and kernel tier, about the
    /// size of its 1-bit and 4-bit weights [default: packed/ in onebit's cache folder].
    #[arg(long, value_name = "DIR", conflicts_with = "no_pack_cache")]
    pub pack_cache: Option<PathBuf>,
    /// Repack the weights at every load, and write no cache file.
    #[arg(long)]
    pub no_pack_cache: bool,
    #[command(flatten)]
    pub lora: LoraArgs,
}

/// LoRA adapters (llama.cpp's GGUF adapter format), applied beside the weights.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LoraArgs {
    /// A LoRA adapter to apply at scale 1; repeat for several. Adapters are numbered from 0:
    /// the --lora files in order, then the --lora-scaled ones.
    #[arg(long = "lora", value_name = "FILE")]
    pub lora: Vec<PathBuf>,
    /// A LoRA adapter to apply at scale SCALE (its product is also scaled by the file's alpha
    /// over its rank, as in llama.cpp); repeat for several.
    #[arg(long = "lora-scaled", num_args = 2, value_names = ["FILE", "SCALE"])]
    pub lora_scaled: Vec<String>,
}

impl LoraArgs {
    /// The adapter files, by id.
    pub fn paths(&self) -> Vec<PathBuf> {
        let scaled = self.lora_scaled.chunks_exact(2).map(|p| PathBuf::from(&p[0]));
        self.lora.iter().cloned().chain(scaled).collect()
    }

    /// Every adapter at its scale from the command line.
    pub fn uses(&self) -> Result<Vec<LoraUse>> {
        let mut scales = vec![1.0; self.lora.len()];
        for pair in self.lora_scaled.chunks_exact(2) {
            let scale: f32 = pair[1]
                .parse()
                .ok()
                .filter(|s: &f32| s.is_finite())
                .with_context(|| format!("--lora-scaled {} {}: the scale must be a number", pair[0], pair[1]))?;
            scales.push(scale);
        }
        Ok(scales.into_iter().enumerate().map(|(id, scale)| LoraUse { id, scale }).collect())
    }
}

impl ModelArgs {
    pub fn options(&self) -> ModelOptions {
        ModelOptions {
            device: self.device,
            kernel_tier: self.kernel_tier,
            kv_type: self.kv_type,
            batch_rounding: self.batch_rounding,
            threads: self.threads,
            pack_cache: if self.no_pack_cache {
                None
            } else {
                self.pack_cache.clone().or_else(|| resolve::cache_dir().map(|d| d.join("packed"))).map(PackCache::new)
            },
            lora: self.lora.paths(),
        }
    }

    /// A new engine over `model` with the adapters' scales from the command line.
    pub fn engine(&self, model: Model) -> Result<Engine> {
        let engine = Engine::new(model)?;
        engine.set_lora_scales(&self.lora.uses()?)?;
        Ok(engine)
    }

    /// The process's threads for the forward pass.
    pub fn pool(&self) -> Pool {
        Pool::new(self.threads.filter(|&t| t > 0).unwrap_or_else(Pool::default_threads))
    }

    /// The model file `-m` names (downloading it first if it is a Hugging Face model).
    pub fn path(&self, ui: &Ui) -> Result<PathBuf> {
        resolve::model_path(self.model.as_deref(), ui)
    }

    pub fn load(&self) -> Result<Model> {
        self.load_with(&Ui::new(true))
    }

    /// Resolve and load, with a spinner if loading takes more than a second.
    pub fn load_with(&self, ui: &Ui) -> Result<Model> {
        let path = self.path(ui)?;
        ui.spin_if_slow(&format!("loading {}", path.display()), || Model::load(&path, &self.options()))
            .with_context(|| format!("loading {}", path.display()))
    }

    /// The context size to give a new sequence.
    pub fn ctx(&self, model: &Model) -> usize {
        self.ctx_size.unwrap_or(DEFAULT_CTX.min(model.config().context_length))
    }
}

/// Options of the serving engine: how many sequences share a step, and its memory.
#[derive(clap::Args, Clone, Debug)]
pub struct EngineArgs {
    /// Sequences decoding at once (llama.cpp's -np); further requests wait in a queue
    /// [default: 1; 4 for `serve`].
    #[arg(long = "parallel", visible_alias = "np", value_name = "N")]
    pub parallel: Option<usize>,
    /// Tokens per forward pass, decoding and prompt chunks together (llama.cpp's -b).
    #[arg(short = 'b', long = "batch-size", default_value_t = 512, value_name = "N")]
    pub batch_size: usize,
    /// Requests that may wait for a place beyond --parallel; past that a request is refused
    /// as busy.
    #[arg(long = "queue-size", default_value_t = 64, value_name = "N")]
    pub queue_size: usize,
    /// Positions in the KV pool that all sequences share, in tokens [default: --parallel ×
    /// --ctx-size]. Prompts that share a prefix share its blocks.
    #[arg(long = "kv-size", value_name = "TOKENS")]
    pub kv_size: Option<usize>,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// Speculative decoding: drafts verified in the batched pass, output unchanged.
#[derive(clap::Args, Clone, Debug)]
pub struct SpecArgs {
    /// Speculative decoding: lookup (drafts from the context's own n-grams), draft (drafts from
    /// --model-draft) or off [default: draft with --model-draft, else lookup; `bench` measures
    /// plain decoding unless given]. Drafts are taken only where they are expected to pay, and
    /// the output is the same either way.
    #[arg(long = "spec", value_name = "MODE")]
    pub mode: Option<SpecMode>,
    /// A small model with the same vocabulary that drafts for the main one (llama.cpp's -md).
    #[arg(long = "model-draft", visible_alias = "md", value_name = "FILE")]
    pub model_draft: Option<PathBuf>,
    /// A draft model's drafting stops at a token it gives less than this probability.
    #[arg(long = "draft-p-min", default_value_t = 0.75, value_name = "P")]
    pub p_min: f32,
    /// Drafted tokens per sequence and step, at most.
    #[arg(long = "draft-max", visible_alias = "draft", default_value_t = 16, value_name = "N")]
    pub draft_max: usize,
    /// Fewest drafted tokens worth verifying.
    #[arg(long = "draft-min", default_value_t = 1, value_name = "N")]
    pub draft_min: usize,
    /// Verify every draft, even where the measured step costs say it will not pay (llama.cpp
    /// drafts this way); by default drafts are taken only where they are expected to pay.
    #[arg(long = "draft-always")]
    pub draft_always: bool,
    /// Longest context suffix the lookup matches.
    #[arg(long = "spec-ngram-max", default_value_t = 4, value_name = "N")]
    pub ngram_max: usize,
    /// Shortest context suffix the lookup matches.
    #[arg(long = "spec-ngram-min", default_value_t = 2, value_name = "N")]
    pub ngram_min: usize,
}

impl SpecArgs {
    /// Load `--model-draft` (with the main model's `options`) into `engine`.
    pub fn attach_draft(&self, engine: &mut Engine, options: &ModelOptions) -> Result<()> {
        let Some(path) = &self.model_draft else { return Ok(()) };
        // The adapters are the main model's.
        let options = ModelOptions { lora: Vec::new(), ..options.clone() };
        let draft = Model::load(path, &options).with_context(|| format!("loading {}", path.display()))?;
        engine.set_draft(draft).with_context(|| format!("drafting with {}", path.display()))?;
        Ok(())
    }

    pub fn speculation(&self) -> Speculation {
        // Lookup by default: it has not lost beyond noise anywhere it was measured (one to 16
        // sequences, guesses that always fail; BENCHMARKS.md), and it pays on grounded work.
        let default = if self.model_draft.is_some() { SpecMode::Draft } else { SpecMode::Lookup };
        Speculation {
            mode: self.mode.unwrap_or(default),
            p_min: self.p_min,
            draft_max: self.draft_max,
            draft_min: self.draft_min,
            ngram_max: self.ngram_max.max(1),
            ngram_min: self.ngram_min.clamp(1, self.ngram_max.max(1)),
            adaptive: !self.draft_always,
        }
    }
}

impl EngineArgs {
    /// The engine's configuration; `parallel` is the command's default for `--parallel`.
    pub fn config(&self, ctx_size: usize, parallel: usize) -> SchedulerConfig {
        SchedulerConfig {
            parallel: self.parallel.unwrap_or(parallel),
            batch_size: self.batch_size,
            queue_size: self.queue_size,
            ctx_size,
            kv_size: self.kv_size.unwrap_or(0),
            speculative: self.spec.speculation(),
        }
    }
}

/// Load the model, its tokenizer and template, and start the engine on the process's threads.
pub fn start_engine(model: &ModelArgs, engine: &EngineArgs, ui: &super::ui::Ui) -> Result<(Arc<Engine>, Scheduler)> {
    let loaded = model.load_with(ui)?;
    let ctx = model.ctx(&loaded);
    let mut engine_ = model.engine(loaded)?;
    engine.spec.attach_draft(&mut engine_, &model.options())?;
    let engine_ = Arc::new(engine_);
    let scheduler = Scheduler::start(Arc::clone(&engine_), model.pool(), engine.config(ctx, 1))?;
    Ok((engine_, scheduler))
}
