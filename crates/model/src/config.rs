//! Hyperparameters of a Llama-family model, read from GGUF metadata only.
//!
//! The architectures differ in data, not code: which RoPE layout they use, whether q/k/v carry
//! biases, whether q and k are RMS-normed per head, whether the MLP is a mixture of experts
//! (and its expert counts and width), Gemma's extra norms, scaled embedding and GELU gate, and
//! which layers attend through a sliding window. Those are flags here; the forward pass reads
//! them.

use onebit_gguf::{Metadata, Value};
use onebit_kernels::Glu;

use crate::error::ModelError;

/// The architectures onebit runs (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// Qwen3's attention with a mixture-of-experts MLP in every layer.
    Qwen3Moe,
    /// Gemma 3: QK-norm, norms before and after attention and MLP, a GELU gate, the embedding
    /// scaled by √hidden, sliding-window layers interleaved with global ones.
    Gemma3,
}

impl Arch {
    pub const SUPPORTED: &'static str = "llama, mistral, qwen2, qwen3, qwen3moe, gemma3";

    pub fn parse(name: &str) -> Result<Arch, ModelError> {
        Ok(match name {
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "qwen3moe" => Arch::Qwen3Moe,
            "gemma3" => Arch::Gemma3,
            other => return Err(ModelError::UnknownArchitecture(other.to_string())),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Gemma3 => "gemma3",
        }
    }

    /// llama.cpp rotates interleaved pairs for llama, and halves (NeoX) for the Qwen family.
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Llama | Arch::Mistral => RopeStyle::Normal,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3 => RopeStyle::Neox,
        }
    }

    /// Whether q, k and v projections have biases: required (Qwen2), optional (Llama), or never.
    pub fn qkv_bias(self) -> Need {
        match self {
            Arch::Qwen2 => Need::Required,
            Arch::Llama | Arch::Mistral => Need::Optional,
            Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3 => Need::Absent,
        }
    }

    /// Whether q and k are RMS-normed per head before RoPE (Qwen3).
    pub fn qk_norm(self) -> Need {
        match self {
            Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3 => Need::Required,
            _ => Need::Absent,
        }
    }

    /// Whether the outputs of attention and of the MLP are RMS-normed before they join the
    /// residual stream (`post_attention_norm`, `post_ffw_norm`: Gemma).
    pub fn post_norms(self) -> Need {
        if self == Arch::Gemma3 { Need::Required } else { Need::Absent }
    }

    /// The gated MLP's activation: SwiGLU, or GELU (tanh) for Gemma.
    pub fn activation(self) -> Glu {
        if self == Arch::Gemma3 { Glu::GeluTanh } else { Glu::Silu }
    }

    /// Every how many layers one is global when the file names a sliding window but no
    /// pattern: llama.cpp fixes it per architecture (Gemma 3: the last of every 6); 0: every
    /// layer slides.
    fn default_swa_pattern(self) -> usize {
        if self == Arch::Gemma3 { 6 } else { 0 }
    }

    /// Whether every layer's MLP is a mixture of experts (a router and stacked expert
    /// matrices) instead of one gated MLP.
    pub fn moe(self) -> bool {
        self == Arch::Qwen3Moe
    }
}

/// Whether a tensor must, may, or must not be present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    Required,
    Optional,
    Absent,
}

/// Which elements RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): GPT-J / original Llama layout.
    Normal,
    /// Pairs (i, i + d/2): GPT-NeoX layout.
    Neox,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub style: RopeStyle,
    /// Dimensions of each head that are rotated (the rest pass through).
    pub dims: usize,
    pub freq_base: f32,
    /// Position scale: 1 / the linear scaling factor.
    pub freq_scale: f32,
}

/// The mixture-of-experts MLP: each token's router picks `n_used` of `n_experts` gated MLPs
/// (each `ffn` wide), whose outputs it adds up weighted by the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub n_experts: usize,
    pub n_used: usize,
    /// Width of one expert's MLP (`expert_feed_forward_length`).
    pub ffn: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub arch: Arch,
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Per-head width of q and k (`attention.key_length`).
    pub head_dim: usize,
    /// Per-head width of v (`attention.value_length`).
    pub value_dim: usize,
    /// Width of the gated MLP (of a MoE model: as the metadata says; each expert's is in `moe`).
    pub ffn: usize,
    /// The experts of a mixture-of-experts model.
    pub moe: Option<MoeConfig>,
    pub rms_eps: f32,
    /// The context length the model was trained for.
    pub context_length: usize,
    pub rope: RopeConfig,
    /// Rows of the embedding table (filled in from the tensor).
    pub vocab_size: usize,
    /// What the embedding rows are multiplied by (Gemma: √hidden).
    pub embed_scale: Option<f32>,
    /// What q·k is multiplied by before the softmax.
    pub attn_scale: f32,
    /// The gated MLP's activation.
    pub activation: Glu,
    /// The sliding-window attention of some or all layers.
    pub sliding: Option<SlidingWindow>,
    /// `cap · tanh(logit / cap)` on the output logits (`final_logit_softcapping`).
    pub logit_softcap: Option<f32>,
}

/// Layers that attend only to the last `window` positions (their own included): a key at
/// position p is out of sight of the query at position q once q − p ≥ `window` (llama.cpp's
/// standard sliding window), and such layers rotate with RoPE of their own.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    pub window: usize,
    /// Per layer: whether it slides (the others attend to every position).
    pub layers: Vec<bool>,
    pub rope: RopeConfig,
}

fn positive(key: &str, v: u32) -> Result<usize, ModelError> {
    if v == 0 {
        return Err(ModelError::BadHyperparameter { key: key.to_string(), reason: "must be positive".into() });
    }
    Ok(v as usize)
}

impl Config {
    /// Read the hyperparameters of the model described by `md`.
    pub fn from_metadata(md: &Metadata) -> Result<Config, ModelError> {
        let arch = Arch::parse(md.get_str("general.architecture")?)?;
        let p = arch.name();
        let key = |k: &str| format!("{p}.{k}");
        let req = |k: &str| -> Result<usize, ModelError> { positive(&key(k), md.get_u32(&key(k))?) };
        let opt = |k: &str| -> Result<Option<usize>, ModelError> {
            md.opt_u32(&key(k))?.map(|v| positive(&key(k), v)).transpose()
        };

        let hidden = req("embedding_length")?;
        let n_heads = req("attention.head_count")?;
        let n_kv_heads = opt("attention.head_count_kv")?.unwrap_or(n_heads);
        let head_dim = opt("attention.key_length")?.unwrap_or(hidden / n_heads);
        let value_dim = opt("attention.value_length")?.unwrap_or(hidden / n_heads);
        let rope = RopeConfig {
            style: arch.rope_style(),
            dims: opt("rope.dimension_count")?.unwrap_or(head_dim),
            freq_base: md.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0),
            freq_scale: rope_freq_scale(md, p)?,
        };
        let moe = if arch.moe() {
            let n_experts = req("expert_count")?;
            let n_used = req("expert_used_count")?;
            // As llama.cpp: without its own key, an expert is the dense width shared by those used.
            let ffn = match opt("expert_feed_forward_length")? {
                Some(f) => f,
                None => positive(&key("expert_feed_forward_length"), (req("feed_forward_length")? / n_used) as u32)?,
            };
            Some(MoeConfig { n_experts, n_used, ffn })
        } else {
            None
        };
        let ffn = match moe {
            Some(m) => opt("feed_forward_length")?.unwrap_or(m.ffn * m.n_used),
            None => req("feed_forward_length")?,
        };
        let n_layers = req("block_count")?;
        let sliding = sliding_window(md, arch, n_layers, &rope)?;
        // As llama.cpp: Gemma 3 27B scales by its hidden size per head, not its key length.
        let attn_scale = if arch == Arch::Gemma3 && n_layers == 62 {
            1.0 / ((hidden / n_heads) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        let config = Config {
            arch,
            n_layers,
            hidden,
            n_heads,
            n_kv_heads,
            head_dim,
            value_dim,
            ffn,
            moe,
            rms_eps: md.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            context_length: req("context_length")?,
            rope,
            vocab_size: 0,
            embed_scale: (arch == Arch::Gemma3).then(|| (hidden as f32).sqrt()),
            attn_scale,
            activation: arch.activation(),
            sliding,
            logit_softcap: md.opt_f32(&key("final_logit_softcapping"))?.filter(|&c| c != 0.0),
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ModelError> {
        let p = self.arch.name();
        let bad = |k: &str, reason: String| Err(ModelError::BadHyperparameter { key: format!("{p}.{k}"), reason });
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(
                "attention.head_count_kv",
                format!("{} query heads are not a multiple of {} kv heads", self.n_heads, self.n_kv_heads),
            );
        }
        if self.rope.dims > self.head_dim || !self.rope.dims.is_multiple_of(2) {
            return bad(
                "rope.dimension_count",
                format!("{} must be even and at most the head size {}", self.rope.dims, self.head_dim),
            );
        }
        if !(self.rms_eps > 0.0 && self.rms_eps < 1.0) {
            return bad("attention.layer_norm_rms_epsilon", format!("{} is not a small positive number", self.rms_eps));
        }
        if !(self.rope.freq_base > 0.0 && self.rope.freq_base.is_finite()) {
            return bad("rope.freq_base", format!("{} is not a positive number", self.rope.freq_base));
        }
        if self.head_dim > 1024 || self.value_dim > 1024 || !self.head_dim.is_multiple_of(2) {
            return bad("attention.key_length", format!("head size {} must be even and at most 1024", self.head_dim));
        }
        // Sizes that would overflow the buffers the forward pass allocates.
        let width = self.n_heads.max(self.n_kv_heads) * self.head_dim.max(self.value_dim);
        if self.hidden > 1 << 20 || self.ffn > 1 << 22 || width > 1 << 20 || self.n_layers > 4096 {
            return bad("embedding_length", "absurd model dimensions".into());
        }
        if let Some(cap) = self.logit_softcap
            && !(cap > 0.0 && cap.is_finite())
        {
            return bad("final_logit_softcapping", format!("{cap} is not a positive number"));
        }
        if let Some(m) = self.moe {
            if m.n_used > m.n_experts || m.n_experts > 1024 {
                return bad(
                    "expert_used_count",
                    format!("{} of {} experts (at most 1024, and no more used than there are)", m.n_used, m.n_experts),
                );
            }
            if m.ffn > 1 << 22 {
                return bad("expert_feed_forward_length", "absurd expert width".into());
            }
        }
        Ok(())
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    pub fn v_dim(&self) -> usize {
        self.n_kv_heads * self.value_dim
    }

    /// Query heads per kv head.
    pub fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// The window layer `layer` attends through, if it slides.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.sliding.as_ref().filter(|s| s.layers[layer]).map(|s| s.window)
    }

    /// The window of the sliding-window layers, if any layer slides.
    pub fn sliding_window(&self) -> Option<usize> {
        self.sliding.as_ref().filter(|s| s.layers.contains(&true)).map(|s| s.window)
    }

    /// The first cached position the sliding-window layers read for a query at `pos` (0 when
    /// none slides): a sequence whose next position is `pos` needs none of their keys and
    /// values below it.
    pub fn window_reads_from(&self, pos: usize) -> usize {
        crate::attention::window_reads_from(self.sliding_window(), pos)
    }

    /// The most positions of one sequence that its sliding-window layers read or write while a
    /// step adds `step` tokens (from [`Config::window_reads_from`] its first to the step's end),
    /// or `None` when no layer slides.
    pub fn window_span(&self, step: usize) -> Option<usize> {
        self.sliding_window().map(|w| w + crate::attention::ROW_BLOCK + step)
    }

    /// The RoPE of layer `layer` (sliding layers may have their own).
    pub fn layer_rope(&self, layer: usize) -> &RopeConfig {
        match &self.sliding {
            Some(s) if s.layers[layer] => &s.rope,
            _ => &self.rope,
        }
    }
}

/// The sliding window of `{arch}.attention.sliding_window`, its layers (the pattern key, as a
/// count or one flag per layer, else the architecture's default) and its RoPE base
/// (`rope.freq_base_swa`, else 10,000 as in llama.cpp, and no position scaling).
fn sliding_window(
    md: &Metadata,
    arch: Arch,
    n_layers: usize,
    rope: &RopeConfig,
) -> Result<Option<SlidingWindow>, ModelError> {
    let p = arch.name();
    let key = |k: &str| format!("{p}.{k}");
    // Only the architectures whose sliding window onebit implements read it.
    if !matches!(arch, Arch::Gemma3 | Arch::Mistral) {
        return Ok(None);
    }
    let window = match md.opt_u32(&key("attention.sliding_window"))? {
        Some(w) if w > 0 => w as usize,
        _ => return Ok(None),
    };
    let pattern_key = key("attention.sliding_window_pattern");
    let layers: Vec<bool> = match md.get(&pattern_key) {
        Some(Value::Array(a)) => {
            let flags: Vec<bool> =
                a.iter().filter_map(|v| if let Value::Bool(b) = v { Some(b) } else { None }).collect();
            if flags.len() != n_layers {
                return Err(ModelError::BadHyperparameter {
                    key: pattern_key,
                    reason: format!("{} flags for {n_layers} layers (one boolean per layer)", a.len()),
                });
            }
            flags
        }
        Some(v) => {
            let n = v.as_i128().filter(|n| (0..=u32::MAX as i128).contains(n)).ok_or_else(|| {
                ModelError::BadHyperparameter {
                    key: pattern_key.clone(),
                    reason: "must be a layer count or one boolean per layer".into(),
                }
            })? as usize;
            swa_layers(n, n_layers)
        }
        None => swa_layers(arch.default_swa_pattern(), n_layers),
    };
    let freq_base = md.opt_f32(&key("rope.freq_base_swa"))?.unwrap_or(10_000.0);
    if !(freq_base > 0.0 && freq_base.is_finite()) {
        return Err(ModelError::BadHyperparameter {
            key: key("rope.freq_base_swa"),
            reason: format!("{freq_base} is not a positive number"),
        });
    }
    Ok(Some(SlidingWindow { window, layers, rope: RopeConfig { freq_base, freq_scale: 1.0, ..rope.clone() } }))
}

/// Of every `pattern` layers the last is global, the others slide (0: all slide).
fn swa_layers(pattern: usize, n_layers: usize) -> Vec<bool> {
    (0..n_layers).map(|l| pattern == 0 || l % pattern < pattern - 1).collect()
}

/// 1 / factor for linear RoPE scaling; refuses scaling types onebit does not implement.
fn rope_freq_scale(md: &Metadata, p: &str) -> Result<f32, ModelError> {
    let kind = md.opt_str(&format!("{p}.rope.scaling.type"))?.unwrap_or("none");
    // Older converters wrote the linear factor as `rope.scale_linear`.
    let factor = match md.opt_f32(&format!("{p}.rope.scale_linear"))? {
        Some(f) => Some(f),
        None => md.opt_f32(&format!("{p}.rope.scaling.factor"))?,
    };
    let kind = if kind == "none" && md.contains(&format!("{p}.rope.scale_linear")) { "linear" } else { kind };
    match kind {
        "none" => Ok(1.0),
        "linear" => match factor {
            Some(f) if f > 0.0 && f.is_finite() => Ok(1.0 / f),
            Some(f) => Err(ModelError::BadHyperparameter {
                key: format!("{p}.rope.scaling.factor"),
                reason: format!("{f} is not a positive number"),
            }),
            None => Ok(1.0),
        },
        other => {
            Err(ModelError::Unsupported(format!("RoPE scaling type '{other}' (onebit implements none and linear)")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma3_pattern_makes_every_sixth_layer_global() {
        let layers = swa_layers(6, 18);
        let global: Vec<usize> = (0..18).filter(|&l| !layers[l]).collect();
        assert_eq!(global, [5, 11, 17]);
        assert!(swa_layers(0, 4).iter().all(|&s| s), "pattern 0: every layer slides");
        assert!(swa_layers(1, 4).iter().all(|&s| !s), "pattern 1: no layer slides");
    }
}
