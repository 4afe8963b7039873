//! `onebit convert HF_DIR OUT.gguf --type TYPE`: a Hugging Face checkpoint to GGUF, as llama.cpp's
//! `convert_hf_to_gguf.py` writes it.
//!
//! The file has the converter's metadata keys in its order and with its values ([`meta`],
//! [`card`], [`arch`], [`vocab`], [`pre`]), its tensor names, shapes and order, and for
//! F32/F16/BF16/Q8_0/TQ1_0/TQ2_0 its bytes: every type goes through the quantizers of `onebit_kernels::formats`, which match
//! ggml's (and the converter's numpy copies of them) byte for byte. Q1_0, which the converter
//! does not write, follows the same rules as the ternary types except that the embeddings and
//! the output matrix are Q1_0 too (as in PrismML's Bonsai files); a checkpoint whose weights
//! are already ±scale per 128 converts to it losslessly.
//!
//! Shards are memory-mapped ([`hf`]) and each tensor converted in slabs on every thread by the
//! code `onebit quantize` uses, its pages released once written: memory stays near one slab.

mod arch;
mod card;
mod hf;
mod meta;
mod pre;
mod spm;
mod vocab;

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use onebit_gguf::{GgmlType, GgufStreamWriter, OwnedValue, TensorInfo};
use onebit_kernels::Pool;
use safetensors::Dtype;

use self::arch::{Arch, Dims};
use self::hf::{HfModel, HfTensor};
use super::quantize::QuantizeError;
use super::quantize::convert::{Source, convert};

#[derive(clap::Args)]
pub struct Args {
    /// The Hugging Face model folder (config.json, *.safetensors, tokenizer.json, ...).
    pub input: PathBuf,
    /// Where to write the GGUF file.
    pub output: PathBuf,
    /// f32, f16, bf16, q8_0, tq1_0, tq2_0, q1_0, or auto (the checkpoint's own 16-bit type).
    #[arg(long = "type", value_name = "TYPE", default_value = "auto")]
    pub ty: String,
    /// The BPE pre-tokenizer's llama.cpp name (qwen2, llama-bpe, smollm, gpt-2, ...), for a
    /// vocabulary whose check-text hash llama.cpp's converter does not know (otherwise it is
    /// found by that hash, as the converter finds it).
    #[arg(long)]
    pub pre: Option<String>,
    /// Threads to use (all cores by default).
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
}

/// What can go wrong, each naming the file or tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{0} is not a folder")]
    NotAFolder(PathBuf),
    #[error("{0} is missing")]
    MissingFile(PathBuf),
    #[error("no model*.safetensors in {dir}{}", if *.pytorch { " (PyTorch .bin checkpoints are not supported: save it as safetensors)" } else { "" })]
    NoWeights { dir: PathBuf, pytorch: bool },
    #[error("shard {path} is missing (it holds {} tensor(s) of the index, e.g. {})", .tensors.len(), .tensors.first().map(String::as_str).unwrap_or("?"))]
    MissingShard { path: PathBuf, tensors: Vec<String> },
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("{0}: {1}")]
    Json(PathBuf, String),
    #[error("{0}: not a valid safetensors file ({1:?}); it may be truncated or its header may not match its data")]
    Safetensors(PathBuf, safetensors::SafeTensorError),
    #[error("{0}: index does not match the shards: {1}")]
    Index(PathBuf, String),
    #[error("config.json: {0}")]
    Config(String),
    #[error("config.json: architecture {class} is not supported by onebit convert (supported: {known})")]
    UnknownArch { class: String, known: String },
    #[error("tensor {tensor}: no {arch} tensor has this name")]
    UnknownTensor { tensor: String, arch: &'static str },
    #[error("tensor {tensor}: {reason}")]
    Mismatch { tensor: String, reason: String },
    #[error("{0}: {1}")]
    Tokenizer(PathBuf, String),
    #[error("unknown output type '{0}' (f32, f16, bf16, q8_0, tq1_0, tq2_0, q1_0 or auto)")]
    UnknownType(String),
}

/// The output types: llama.cpp's file type id and the type of the quantized matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutType {
    F32,
    F16,
    BF16,
    Q8_0,
    TQ1_0,
    TQ2_0,
    Q1_0,
}

impl OutType {
    fn parse(s: &str) -> Result<Option<OutType>, ConvertError> {
        Ok(Some(match s.to_ascii_lowercase().as_str() {
            "auto" => return Ok(None),
            "f32" => OutType::F32,
            "f16" => OutType::F16,
            "bf16" => OutType::BF16,
            "q8_0" => OutType::Q8_0,
            "tq1_0" => OutType::TQ1_0,
            "tq2_0" => OutType::TQ2_0,
            "q1_0" => OutType::Q1_0,
            _ => return Err(ConvertError::UnknownType(s.to_string())),
        }))
    }

    fn ggml(self) -> GgmlType {
        match self {
            OutType::F32 => GgmlType::F32,
            OutType::F16 => GgmlType::F16,
            OutType::BF16 => GgmlType::BF16,
            OutType::Q8_0 => GgmlType::Q8_0,
            OutType::TQ1_0 => GgmlType::TQ1_0,
            OutType::TQ2_0 => GgmlType::TQ2_0,
            OutType::Q1_0 => GgmlType::Q1_0,
        }
    }

    /// `general.file_type`.
    fn file_type(self) -> u32 {
        match self {
            OutType::F32 => 0,
            OutType::F16 => 1,
            OutType::BF16 => 32,
            OutType::Q8_0 => 7,
            OutType::TQ1_0 => 36,
            OutType::TQ2_0 => 37,
            OutType::Q1_0 => 40,
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let requested = OutType::parse(&args.ty)?;
    // An unknown architecture is reported before any shard is read.
    if let Some(serde_json::Value::Object(config)) = hf::read_json(&args.input.join("config.json"))? {
        Arch::from_config(&config)?;
    }
    let model = HfModel::open(&args.input)?;
    let job = Job::plan(&model, requested, args.pre.as_deref())?;
    let threads = args.threads.unwrap_or_else(Pool::default_threads).max(1);
    if !args.quiet {
        eprintln!(
            "converting {} ({}) to {} as {:?} on {threads} threads",
            args.input.display(),
            job.arch.name(),
            args.output.display(),
            job.out
        );
        for (name, why) in &job.fallbacks {
            eprintln!("note: {name}: {why}");
        }
    }
    let pool = Pool::new(threads);
    let bytes = super::output_file::write_atomically(&args.output, |tmp| job.write(&model, tmp, &pool))?;
    if !args.quiet {
        let mib = bytes as f64 / (1 << 20) as f64;
        eprintln!("wrote {mib:.2} MiB in {:.2} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// Where an output tensor's data comes from.
enum Data {
    /// A checkpoint tensor (index into `HfModel::tensors`), its rows reordered for RoPE or not.
    Tensor { index: usize, permute_heads: Option<usize> },
    /// Computed here (Llama 3's rope factors).
    F32s(Vec<f32>),
}

struct Planned {
    info: TensorInfo,
    data: Data,
}

/// Everything decided before a byte is written.
struct Job {
    arch: Arch,
    out: OutType,
    kvs: Vec<(String, OwnedValue)>,
    tensors: Vec<Planned>,
    fallbacks: Vec<(String, String)>,
}

impl Job {
    fn plan(model: &HfModel, requested: Option<OutType>, pre: Option<&str>) -> Result<Job, ConvertError> {
        let arch = Arch::from_config(&model.config)?;
        let hparams = arch::hparams(&model.config);
        let dims = Dims::from_config(&hparams)?;
        let out = requested.unwrap_or_else(|| auto_type(model));
        let mut tensors = Vec::new();
        let mut fallbacks = Vec::new();
        if arch == Arch::Llama
            && let Some(factors) = arch::llama3_rope_factors(&hparams, &dims)
        {
            let info =
                TensorInfo { name: "rope_freqs.weight".into(), ty: GgmlType::F32, shape: vec![factors.len() as u64] };
            tensors.push(Planned { info, data: Data::F32s(factors) });
        }
        for (index, t) in model.tensors.iter().enumerate() {
            let Some(m) = arch::map_tensor(arch, &dims, &t.name)? else { continue };
            check_tensor(model, t, &m)?;
            let shape: Vec<u64> = t.shape.iter().rev().map(|&d| d as u64).collect();
            let ty = output_type(&m.name, &shape, out, &mut fallbacks);
            tensors.push(Planned {
                info: TensorInfo { name: m.name, ty, shape },
                data: Data::Tensor { index, permute_heads: m.permute_heads },
            });
        }
        check_complete(&tensors, &dims)?;
        let total: u64 = tensors.iter().map(|p| p.info.shape.iter().product::<u64>()).sum();
        let mut kvs = vec![
            ("general.architecture".to_string(), OwnedValue::string(arch.name())),
            ("general.type".to_string(), OwnedValue::string("model")),
        ];
        kvs.extend(meta::sampling_keys(&model.dir)?);
        kvs.extend(meta::name_keys(&model.dir, &model.config, total)?);
        let ak = arch::arch_keys(arch, &hparams, &dims)?;
        kvs.extend(ak.before_file_type);
        kvs.push(("general.file_type".into(), OwnedValue::U32(out.file_type())));
        kvs.extend(ak.after_file_type);
        kvs.push(("general.quantization_version".into(), OwnedValue::U32(2)));
        kvs.extend(vocab::vocab_keys(&model.dir, &hparams, &model.config, arch == Arch::Llama, pre)?);
        Ok(Job { arch, out, kvs, tensors, fallbacks })
    }

    /// Write the file; returns the bytes of tensor data written.
    fn write(&self, model: &HfModel, path: &Path, pool: &Pool) -> Result<u64> {
        let infos: Vec<TensorInfo> = self.tensors.iter().map(|p| p.info.clone()).collect();
        let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = GgufStreamWriter::new(BufWriter::with_capacity(4 << 20, file), &self.kvs, &infos)
            .with_context(|| format!("writing {}", path.display()))?;
        let mut written = 0u64;
        for p in &self.tensors {
            let (bytes, src_ty): (std::borrow::Cow<[u8]>, GgmlType) = match &p.data {
                Data::F32s(v) => (v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>().into(), GgmlType::F32),
                Data::Tensor { index, permute_heads } => {
                    let t = &model.tensors[*index];
                    let data = model.data(t);
                    let ty = ggml_of(t.dtype).expect("checked when planned");
                    match permute_heads {
                        Some(heads) => (permute(data, t, *heads)?.into(), ty),
                        None => (data.into(), ty),
                    }
                }
            };
            let src = Source {
                name: &p.info.name,
                ty: src_ty,
                data: &bytes,
                n_per_row: p.info.shape[0] as usize,
                rows_per_expert: p.info.shape.get(1).copied().unwrap_or(1) as usize,
            };
            let mut sink = |b: &[u8]| -> Result<(), QuantizeError> {
                written += b.len() as u64;
                Ok(out.write_data(b)?)
            };
            convert(pool, &src, p.info.ty, None, &mut sink, &mut |_| {})
                .with_context(|| format!("converting {}", p.info.name))?;
            out.end_tensor()?;
            if let Data::Tensor { index, .. } = &p.data {
                model.release(&model.tensors[*index]);
            }
        }
        let mut w = out.finish()?;
        w.flush().with_context(|| format!("writing {}", path.display()))?;
        Ok(written)
    }
}

fn ggml_of(d: Dtype) -> Option<GgmlType> {
    match d {
        Dtype::F32 => Some(GgmlType::F32),
        Dtype::F16 => Some(GgmlType::F16),
        Dtype::BF16 => Some(GgmlType::BF16),
        _ => None,
    }
}

/// The converter's `auto`: the type of the first matrix, BF16 or F16 (F16 otherwise).
fn auto_type(model: &HfModel) -> OutType {
    match model.tensors.iter().find(|t| t.shape.len() >= 2).map(|t| t.dtype) {
        Some(Dtype::BF16) => OutType::BF16,
        _ => OutType::F16,
    }
}

/// The type llama.cpp's converter gives a tensor (`shape` in ggml order).
fn output_type(name: &str, shape: &[u64], out: OutType, fallbacks: &mut Vec<(String, String)>) -> GgmlType {
    // 1-D tensors, norms and biases stay F32.
    if shape.len() <= 1 || name.ends_with("_norm.weight") || !name.ends_with(".weight") {
        return GgmlType::F32;
    }
    let embedding_or_output = name == "token_embd.weight" || name == "output.weight";
    if embedding_or_output && matches!(out, OutType::TQ1_0 | OutType::TQ2_0) {
        return GgmlType::F16;
    }
    let ty = out.ggml();
    if !shape[0].is_multiple_of(ty.block_size()) {
        fallbacks.push((name.to_string(), format!("rows of {} are not whole {ty} blocks: F16", shape[0])));
        return GgmlType::F16;
    }
    ty
}

/// A tensor's type and shape must be what config.json says.
fn check_tensor(model: &HfModel, t: &HfTensor, m: &arch::Mapped) -> Result<(), ConvertError> {
    let file = model.file_of(t).display();
    if ggml_of(t.dtype).is_none() {
        return Err(ConvertError::Mismatch {
            tensor: t.name.clone(),
            reason: format!("type {:?} in {file}; onebit converts F32, F16 and BF16 checkpoints", t.dtype),
        });
    }
    if t.shape != m.shape {
        return Err(ConvertError::Mismatch {
            tensor: t.name.clone(),
            reason: format!("shape {:?} in {file}, but config.json implies {:?}", t.shape, m.shape),
        });
    }
    Ok(())
}

/// Every layer needs its attention and MLP, and the model its embeddings and final norm.
fn check_complete(tensors: &[Planned], d: &Dims) -> Result<(), ConvertError> {
    let has = |n: &str| tensors.iter().any(|p| p.info.name == n);
    let mut needed = vec!["token_embd.weight".to_string(), "output_norm.weight".to_string()];
    for b in 0..d.n_layer {
        for part in
            ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
        {
            needed.push(format!("blk.{b}.{part}.weight"));
        }
    }
    match needed.iter().find(|n| !has(n)) {
        Some(n) => Err(ConvertError::Mismatch {
            tensor: n.clone(),
            reason: "missing from the checkpoint (config.json's num_hidden_layers needs it)".into(),
        }),
        None => Ok(()),
    }
}

/// q/k rows in llama.cpp's RoPE order.
fn permute(data: &[u8], t: &HfTensor, heads: usize) -> Result<Vec<u8>, ConvertError> {
    let rows = t.shape[0];
    let row_bytes = data.len() / rows.max(1);
    let order = arch::permuted_rows(rows, heads).ok_or_else(|| ConvertError::Mismatch {
        tensor: t.name.clone(),
        reason: format!("{rows} rows do not split into {heads} heads of two halves"),
    })?;
    let mut out = Vec::with_capacity(data.len());
    for r in order {
        out.extend_from_slice(&data[r * row_bytes..(r + 1) * row_bytes]);
    }
    Ok(out)
}
