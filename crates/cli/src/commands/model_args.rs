//! Options every command that runs a model shares (`-m`, `--threads`, `--kernel-tier`, ...).

use std::path::PathBuf;

use anyhow::{Context, Result};
use onebit_kernels::KernelTier;
use onebit_model::{KvType, Model, ModelOptions};

#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// The GGUF model file.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Threads for the forward pass [default: every core].
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Kernel family: scalar, avx2, avx512, amx or neon [default: the best this CPU runs].
    #[arg(long, value_name = "TIER")]
    pub kernel_tier: Option<KernelTier>,
    /// Context size of a sequence, in tokens [default: the model's trained context].
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<usize>,
    /// How the KV cache stores keys and values: f16 (as llama.cpp), f32, or q8_0 (half the bytes).
    #[arg(long, default_value = "f16", value_name = "TYPE")]
    pub kv_type: KvType,
}

impl ModelArgs {
    pub fn options(&self) -> ModelOptions {
        ModelOptions { threads: self.threads.unwrap_or(0), kernel_tier: self.kernel_tier, kv_type: self.kv_type }
    }

    pub fn load(&self) -> Result<Model> {
        Model::load(&self.model, &self.options()).with_context(|| format!("loading {}", self.model.display()))
    }

    /// The context size to give a new sequence.
    pub fn ctx(&self, model: &Model) -> usize {
        self.ctx_size.unwrap_or(model.config().context_length)
    }
}
