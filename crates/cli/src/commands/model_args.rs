//! Options every command that runs a model shares (`-m`, `--threads`, `--kernel-tier`, ...).

use std::path::PathBuf;

use anyhow::{Context, Result};
use onebit_kernels::{BatchRounding, KernelTier};
use onebit_model::{KvType, Model, ModelOptions};

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
    /// How activations are rounded to 8 bits: fast (on AMX, Q1_0 weights take one scale per 128
    /// values, the weights' block, so tiles sum whole blocks; prompts and decoding alike) or
    /// reference (llama.cpp's Q8_0, one scale per 32 values, everywhere).
    #[arg(long, default_value = "fast", value_name = "MODE")]
    pub batch_rounding: BatchRounding,
}

impl ModelArgs {
    pub fn options(&self) -> ModelOptions {
        ModelOptions {
            threads: self.threads.unwrap_or(0),
            kernel_tier: self.kernel_tier,
            kv_type: self.kv_type,
            batch_rounding: self.batch_rounding,
        }
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
