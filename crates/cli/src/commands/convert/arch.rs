//! The architectures `onebit convert` knows: which Hugging Face classes they are, how their
//! tensor names map to GGUF's, what shape each tensor must have, and the `{arch}.*` metadata
//! llama.cpp's converter writes for them (Llama, Mistral and SmolLM are `llama`).

use onebit_gguf::OwnedValue;
use serde_json::{Map, Value};

use super::ConvertError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
}

/// The Hugging Face class names and the architecture each converts to.
const CLASSES: &[(&str, Arch)] = &[
    ("LlamaForCausalLM", Arch::Llama),
    ("LLaMAForCausalLM", Arch::Llama),
    ("MistralForCausalLM", Arch::Llama),
    ("Qwen2ForCausalLM", Arch::Qwen2),
    ("Qwen3ForCausalLM", Arch::Qwen3),
];

impl Arch {
    pub fn from_config(config: &Map<String, Value>) -> Result<Arch, ConvertError> {
        let class = config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(|a| a.as_str())
            .ok_or_else(|| ConvertError::Config("config.json has no \"architectures\" list".into()))?;
        CLASSES.iter().find(|(c, _)| *c == class).map(|(_, a)| *a).ok_or_else(|| {
            let known: Vec<&str> = CLASSES.iter().map(|(c, _)| *c).collect();
            ConvertError::UnknownArch { class: class.to_string(), known: known.join(", ") }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }
}

/// How Transformers fills in a field that config.json leaves out.
#[derive(Clone, Copy)]
enum Fill {
    Int(u64),
    Float(f64),
    /// `num_attention_heads`.
    Heads,
    /// `hidden_size / num_attention_heads`.
    HeadDim,
}

/// The defaults of Transformers' (4.57) configuration classes, by `model_type` (which is how
/// `AutoConfig` picks the class), for the fields the converter reads.
const DEFAULTS: &[(&str, &[(&str, Fill)])] = &[
    (
        "llama",
        &[
            ("vocab_size", Fill::Int(32000)),
            ("hidden_size", Fill::Int(4096)),
            ("intermediate_size", Fill::Int(11008)),
            ("num_hidden_layers", Fill::Int(32)),
            ("num_attention_heads", Fill::Int(32)),
            ("num_key_value_heads", Fill::Heads),
            ("head_dim", Fill::HeadDim),
            ("max_position_embeddings", Fill::Int(2048)),
            ("rms_norm_eps", Fill::Float(1e-6)),
            ("rope_theta", Fill::Float(10000.0)),
        ],
    ),
    (
        "mistral",
        &[
            ("vocab_size", Fill::Int(32000)),
            ("hidden_size", Fill::Int(4096)),
            ("intermediate_size", Fill::Int(14336)),
            ("num_hidden_layers", Fill::Int(32)),
            ("num_attention_heads", Fill::Int(32)),
            ("num_key_value_heads", Fill::Int(8)),
            ("max_position_embeddings", Fill::Int(131072)),
            ("rms_norm_eps", Fill::Float(1e-6)),
            ("rope_theta", Fill::Float(10000.0)),
        ],
    ),
    (
        "qwen2",
        &[
            ("vocab_size", Fill::Int(151936)),
            ("hidden_size", Fill::Int(4096)),
            ("intermediate_size", Fill::Int(22016)),
            ("num_hidden_layers", Fill::Int(32)),
            ("num_attention_heads", Fill::Int(32)),
            ("num_key_value_heads", Fill::Int(32)),
            ("max_position_embeddings", Fill::Int(32768)),
            ("rms_norm_eps", Fill::Float(1e-6)),
            ("rope_theta", Fill::Float(10000.0)),
        ],
    ),
    (
        "qwen3",
        &[
            ("vocab_size", Fill::Int(151936)),
            ("hidden_size", Fill::Int(4096)),
            ("intermediate_size", Fill::Int(22016)),
            ("num_hidden_layers", Fill::Int(32)),
            ("num_attention_heads", Fill::Int(32)),
            ("num_key_value_heads", Fill::Int(32)),
            ("head_dim", Fill::Int(128)),
            ("max_position_embeddings", Fill::Int(32768)),
            ("rms_norm_eps", Fill::Float(1e-6)),
            ("rope_theta", Fill::Float(10000.0)),
        ],
    ),
];

/// The hyperparameters as the converter sees them: config.json read through Transformers'
/// `AutoConfig`, which fills in its class's defaults. A null `num_key_value_heads` becomes the
/// head count (every class), a null `head_dim` the hidden size per head (Llama's class only;
/// Mistral's and Qwen3's keep it null). An unknown or missing `model_type` makes `AutoConfig`
/// fail, and the converter then reads config.json as it is.
pub fn hparams(config: &Map<String, Value>) -> Map<String, Value> {
    let mut h = config.clone();
    let kind = config.get("model_type").and_then(|m| m.as_str()).unwrap_or_default();
    let Some((_, fields)) = DEFAULTS.iter().find(|(t, _)| *t == kind) else { return h };
    for &(key, fill) in fields.iter() {
        let value = match (h.get(key), fill) {
            (Some(v), _) if !v.is_null() => continue,
            (None, Fill::Int(n)) => Value::from(n),
            (None, Fill::Float(x)) => Value::from(x),
            (None, _) => derived(&h, fill),
            (Some(_), _) if key == "num_key_value_heads" => derived(&h, Fill::Heads),
            (Some(_), _) if key == "head_dim" && kind == "llama" => derived(&h, Fill::HeadDim),
            (Some(_), _) => continue,
        };
        h.insert(key.to_string(), value);
    }
    h
}

/// A field Transformers computes from others (null when they are not numbers).
fn derived(h: &Map<String, Value>, fill: Fill) -> Value {
    let heads = h.get("num_attention_heads").and_then(|v| v.as_u64());
    match (fill, heads, h.get("hidden_size").and_then(|v| v.as_u64())) {
        (Fill::HeadDim, Some(n), Some(hidden)) if n > 0 => Value::from(hidden / n),
        (Fill::Heads, Some(n), _) => Value::from(n),
        _ => Value::Null,
    }
}

/// The hyperparameters the tensors are checked against.
#[derive(Clone, Debug)]
pub struct Dims {
    pub n_layer: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub vocab: usize,
}

fn uint(config: &Map<String, Value>, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|k| config.get(*k)).and_then(|v| v.as_u64())
}

fn need(config: &Map<String, Value>, keys: &[&str]) -> Result<usize, ConvertError> {
    uint(config, keys)
        .map(|v| v as usize)
        .ok_or_else(|| ConvertError::Config(format!("config.json has no positive integer {}", keys.join(" / "))))
}

impl Dims {
    /// From the [`hparams`]; a head size they do not give is the hidden size per head.
    pub fn from_config(config: &Map<String, Value>) -> Result<Dims, ConvertError> {
        let hidden = need(config, &["hidden_size", "n_embd", "dim"])?;
        let n_head = need(config, &["num_attention_heads", "n_head", "n_heads"])?;
        if n_head == 0 {
            return Err(ConvertError::Config("num_attention_heads is 0".into()));
        }
        let n_head_kv = uint(config, &["num_key_value_heads", "n_kv_heads"]).map(|v| v as usize).unwrap_or(n_head);
        let head_dim = uint(config, &["head_dim"]).map(|v| v as usize).unwrap_or(hidden / n_head);
        Ok(Dims {
            n_layer: need(config, &["n_layers", "num_hidden_layers", "n_layer", "num_layers"])?,
            hidden,
            ffn: need(config, &["intermediate_size", "n_inner", "hidden_dim"])?,
            n_head,
            n_head_kv,
            head_dim,
            vocab: need(config, &["vocab_size"])?,
        })
    }
}

/// What a Hugging Face tensor becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapped {
    pub name: String,
    /// Rows of q/k to reorder for llama.cpp's RoPE (`Some(heads)` for Llama's q_proj/k_proj).
    pub permute_heads: Option<usize>,
    /// The shape the tensor must have (outermost first), from config.json.
    pub shape: Vec<usize>,
}

/// GGUF's name (and expected shape) for a Hugging Face tensor; `Ok(None)` for tensors the
/// converter drops.
pub fn map_tensor(arch: Arch, d: &Dims, name: &str) -> Result<Option<Mapped>, ConvertError> {
    if name.ends_with(".rotary_emb.inv_freq") || name.ends_with(".attention.masked_bias") {
        return Ok(None);
    }
    let unknown = || ConvertError::UnknownTensor { tensor: name.to_string(), arch: arch.name() };
    let (stem, suffix) = match name.rsplit_once('.') {
        Some((s, x @ ("weight" | "bias"))) => (s, x),
        _ => return Err(unknown()),
    };
    let (q, kv) = (d.n_head * d.head_dim, d.n_head_kv * d.head_dim);
    let matrix = |rows: usize, cols: usize| if suffix == "weight" { vec![rows, cols] } else { vec![rows] };
    let plain = |n: &str, shape: Vec<usize>| Mapped { name: format!("{n}.{suffix}"), permute_heads: None, shape };
    let mapped = match stem {
        "model.embed_tokens" => plain("token_embd", matrix(d.vocab, d.hidden)),
        "lm_head" => plain("output", matrix(d.vocab, d.hidden)),
        "model.norm" => plain("output_norm", vec![d.hidden]),
        _ => {
            let rest = stem.strip_prefix("model.layers.").ok_or_else(unknown)?;
            let (bid, part) = rest.split_once('.').ok_or_else(unknown)?;
            let bid: usize = bid.parse().map_err(|_| unknown())?;
            if bid >= d.n_layer {
                return Err(ConvertError::Mismatch {
                    tensor: name.to_string(),
                    reason: format!("layer {bid}, but config.json says num_hidden_layers = {}", d.n_layer),
                });
            }
            let blk = |n: &str, shape: Vec<usize>| plain(&format!("blk.{bid}.{n}"), shape);
            let llama = arch == Arch::Llama;
            let mut m = match part {
                "input_layernorm" => blk("attn_norm", vec![d.hidden]),
                "post_attention_layernorm" => blk("ffn_norm", vec![d.hidden]),
                "self_attn.q_proj" => blk("attn_q", matrix(q, d.hidden)),
                "self_attn.k_proj" => blk("attn_k", matrix(kv, d.hidden)),
                "self_attn.v_proj" => blk("attn_v", matrix(kv, d.hidden)),
                "self_attn.o_proj" => blk("attn_output", matrix(d.hidden, q)),
                "self_attn.q_norm" if arch == Arch::Qwen3 => blk("attn_q_norm", vec![d.head_dim]),
                "self_attn.k_norm" if arch == Arch::Qwen3 => blk("attn_k_norm", vec![d.head_dim]),
                "mlp.gate_proj" => blk("ffn_gate", matrix(d.ffn, d.hidden)),
                "mlp.up_proj" => blk("ffn_up", matrix(d.ffn, d.hidden)),
                "mlp.down_proj" => blk("ffn_down", matrix(d.hidden, d.ffn)),
                _ => return Err(unknown()),
            };
            // llama.cpp's Llama rotates pairs (i, i + 1); Hugging Face's rotates halves: the
            // converter reorders q and k rows head by head (k with the key-value head count).
            m.permute_heads = match part {
                "self_attn.q_proj" if llama => Some(d.n_head),
                "self_attn.k_proj" if llama => Some(d.n_head_kv),
                _ => None,
            };
            m
        }
    };
    Ok(Some(mapped))
}

/// The row order llama.cpp's converter gives q/k of `heads` heads: within each head, the
/// first half's rows and the second half's interleaved (`reshape(h, 2, r/h/2).swapaxes(1, 2)`).
pub fn permuted_rows(rows: usize, heads: usize) -> Option<Vec<usize>> {
    if heads == 0 || !rows.is_multiple_of(heads * 2) {
        return None;
    }
    let half = rows / heads / 2;
    let mut order = Vec::with_capacity(rows);
    for h in 0..heads {
        for i in 0..half {
            for two in 0..2 {
                order.push(h * 2 * half + two * half + i);
            }
        }
    }
    Some(order)
}

/// The `{arch}.*` keys and the rope scaling, in the order llama.cpp's converter writes them
/// (up to `general.file_type`, which the caller adds, then `after`).
pub struct ArchKeys {
    pub before_file_type: Vec<(String, OwnedValue)>,
    pub after_file_type: Vec<(String, OwnedValue)>,
}

pub fn arch_keys(arch: Arch, config: &Map<String, Value>, d: &Dims) -> Result<ArchKeys, ConvertError> {
    let a = arch.name();
    let mut kv: Vec<(String, OwnedValue)> = Vec::new();
    let mut put = |k: &str, v: OwnedValue| kv.push((format!("{a}.{k}"), v));
    let u32_of = |v: u64, what: &str| {
        u32::try_from(v).map(OwnedValue::U32).map_err(|_| ConvertError::Config(format!("{what} = {v} is too large")))
    };
    put("block_count", u32_of(d.n_layer as u64, "num_hidden_layers")?);
    let ctx_keys = ["max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length"];
    if let Some(n) = uint(config, &ctx_keys) {
        put("context_length", u32_of(n, "max_position_embeddings")?);
    }
    put("embedding_length", u32_of(d.hidden as u64, "hidden_size")?);
    put("feed_forward_length", u32_of(d.ffn as u64, "intermediate_size")?);
    put("attention.head_count", u32_of(d.n_head as u64, "num_attention_heads")?);
    if let Some(n) = uint(config, &["num_key_value_heads", "n_kv_heads"]) {
        put("attention.head_count_kv", u32_of(n, "num_key_value_heads")?);
    }
    let rope = rope_parameters(config);
    if let Some(kind) = rope.get("rope_type").or_else(|| rope.get("type")).and_then(|v| v.as_str()) {
        let factor = rope.get("factor").and_then(|v| v.as_f64());
        match (kind, factor) {
            ("linear", Some(f)) => {
                put("rope.scaling.type", OwnedValue::string("linear"));
                put("rope.scaling.factor", OwnedValue::F32(f as f32));
            }
            ("default" | "llama3", _) => {}
            (other, _) => {
                return Err(ConvertError::Config(format!(
                    "rope scaling type {other:?} is not supported by onebit convert"
                )));
            }
        }
    }
    // The converter mirrors the top-level theta into the rope parameters unless they have one.
    let theta =
        rope.get("rope_theta").or_else(|| ["rope_theta", "rotary_emb_base"].iter().find_map(|k| config.get(*k)));
    if let Some(t) = theta.and_then(|v| v.as_f64()) {
        put("rope.freq_base", OwnedValue::F32(t as f32));
    }
    if let Some(eps) = ["rms_norm_eps", "norm_eps"].iter().find_map(|k| config.get(*k)).and_then(|v| v.as_f64()) {
        put("attention.layer_norm_rms_epsilon", OwnedValue::F32(eps as f32));
    }
    // Written only when the hparams have one (Qwen2's and Mistral's classes may not).
    if config.get("head_dim").is_some_and(|v| !v.is_null()) {
        put("attention.key_length", u32_of(d.head_dim as u64, "head_dim")?);
        put("attention.value_length", u32_of(d.head_dim as u64, "head_dim")?);
    }
    let mut after = Vec::new();
    if arch == Arch::Llama {
        after.push((format!("{a}.vocab_size"), u32_of(d.vocab as u64, "vocab_size")?));
        after.push((format!("{a}.rope.dimension_count"), u32_of(d.head_dim as u64, "head_dim")?));
    }
    Ok(ArchKeys { before_file_type: kv, after_file_type: after })
}

/// `rope_parameters` (Transformers 5) or `rope_scaling` (4), with `rope_theta` mirrored in.
pub fn rope_parameters(config: &Map<String, Value>) -> Map<String, Value> {
    let mut rope = match config.get("rope_parameters").or_else(|| config.get("rope_scaling")) {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    if let Some(Value::Object(full)) = rope.get("full_attention") {
        rope = full.clone();
    }
    rope
}

/// Llama 3's per-dimension rope factors (`rope_freqs.weight`), computed in f32 as the
/// converter computes them with PyTorch; `None` unless the rope type is `llama3`.
pub fn llama3_rope_factors(config: &Map<String, Value>, d: &Dims) -> Option<Vec<f32>> {
    let rope = rope_parameters(config);
    let kind = rope.get("rope_type").or_else(|| rope.get("type")).and_then(|v| v.as_str())?;
    if !kind.eq_ignore_ascii_case("llama3") {
        return None;
    }
    let get = |k: &str, default: f64| rope.get(k).and_then(|v| v.as_f64()).unwrap_or(default);
    let base = rope.get("rope_theta").or_else(|| config.get("rope_theta")).and_then(|v| v.as_f64()).unwrap_or(10000.0);
    let factor = get("factor", 8.0) as f32;
    let low = get("low_freq_factor", 1.0) as f32;
    let high = get("high_freq_factor", 4.0) as f32;
    let old_ctx = get("original_max_position_embeddings", 8192.0) as f32;
    let (low_wavelen, high_wavelen) = (old_ctx / low, old_ctx / high);
    let dim = d.head_dim;
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    let factors = (0..dim)
        .step_by(2)
        .map(|i| {
            let freq = 1.0 / (base as f32).powf(i as f32 / dim as f32);
            let wavelen = two_pi / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect();
    Some(factors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_interleaves_the_halves_of_each_head() {
        // Two heads of four rows: [a0 a1 b0 b1] -> [a0 b0 a1 b1] per head.
        assert_eq!(permuted_rows(8, 2).unwrap(), vec![0, 2, 1, 3, 4, 6, 5, 7]);
        assert!(permuted_rows(6, 2).is_none());
    }

    /// Values printed by Transformers 4.57: `AutoConfig.from_pretrained(dir).to_dict()`.
    #[test]
    fn hparams_fill_in_transformers_defaults() {
        let cfg = |v: serde_json::Value| v.as_object().unwrap().clone();
        let base = serde_json::json!({"hidden_size": 64, "num_attention_heads": 4});
        let with = |t: &str| {
            let mut c = cfg(base.clone());
            c.insert("model_type".into(), t.into());
            hparams(&c)
        };
        let llama = with("llama");
        assert_eq!((llama["head_dim"].as_u64(), llama["num_key_value_heads"].as_u64()), (Some(16), Some(4)));
        assert_eq!(llama["max_position_embeddings"], 2048);
        assert_eq!(llama["rms_norm_eps"].as_f64(), Some(1e-6));
        let mistral = with("mistral");
        assert!(!mistral.contains_key("head_dim"));
        assert_eq!(
            (mistral["num_key_value_heads"].as_u64(), mistral["max_position_embeddings"].as_u64()),
            (Some(8), Some(131072))
        );
        let qwen2 = with("qwen2");
        assert!(!qwen2.contains_key("head_dim"));
        assert_eq!(qwen2["num_key_value_heads"], 32);
        assert_eq!(with("qwen3")["head_dim"], 128);
        // A null head count is the attention heads' count in every class.
        let mut c = cfg(base.clone());
        c.insert("model_type".into(), "qwen2".into());
        c.insert("num_key_value_heads".into(), serde_json::Value::Null);
        assert_eq!(hparams(&c)["num_key_value_heads"], 4);
        // No model_type: AutoConfig fails and config.json is read as it is.
        assert_eq!(hparams(&cfg(base.clone())), cfg(base));
    }

    #[test]
    fn names_map_and_unknown_ones_are_errors() {
        let d = Dims { n_layer: 2, hidden: 8, ffn: 16, n_head: 2, n_head_kv: 1, head_dim: 4, vocab: 10 };
        let m = map_tensor(Arch::Llama, &d, "model.layers.1.self_attn.k_proj.weight").unwrap().unwrap();
        assert_eq!((m.name.as_str(), m.permute_heads, m.shape), ("blk.1.attn_k.weight", Some(1), vec![4, 8]));
        let m = map_tensor(Arch::Qwen2, &d, "model.layers.0.self_attn.q_proj.bias").unwrap().unwrap();
        assert_eq!((m.name.as_str(), m.permute_heads, m.shape), ("blk.0.attn_q.bias", None, vec![8]));
        assert!(map_tensor(Arch::Qwen2, &d, "model.layers.0.self_attn.q_norm.weight").is_err());
        assert!(map_tensor(Arch::Qwen3, &d, "model.layers.2.mlp.up_proj.weight").is_err());
        assert!(map_tensor(Arch::Qwen3, &d, "model.layers.0.rotary_emb.inv_freq").unwrap().is_none());
    }
}
