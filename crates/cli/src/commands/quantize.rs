//! `onebit quantize IN.gguf OUT.gguf TYPE`: llama-quantize, with the same bytes out.
//!
//! The output file is what llama-quantize writes for the same input and options: the input's
//! metadata in order, then `general.quantization_version` and `general.file_type` (moved to the
//! end, as llama.cpp's GGUF writer does when it sets a key), tensors in llama.cpp's order with
//! the types its rules choose ([`rules`]), and each tensor's data quantized by the reference
//! quantizers in `onebit_kernels::formats`, which match ggml's byte for byte.
//!
//! The input is memory-mapped and read one tensor at a time, in slabs of rows ([`convert`]);
//! each slab's input pages are released once its output is written, so memory stays near one
//! slab whatever the size of the model or of its largest tensor.

pub(crate) mod convert;
pub mod imatrix;
pub mod rules;

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use onebit_gguf::{GgmlType, GgufError, GgufModel, GgufStreamWriter, OwnedValue, TensorInfo, Value};
use onebit_kernels::Pool;
use onebit_kernels::formats::can_dequantize;

use self::rules::{FileType, Hparams, Options, TensorDesc};

#[derive(clap::Args)]
pub struct Args {
    /// The model to quantize (F32, F16 or BF16 tensors; a quantized one with --allow-requantize).
    pub input: PathBuf,
    /// Where to write the quantized model.
    pub output: PathBuf,
    /// Q1_0, Q2_0, TQ1_0, TQ2_0, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q2_K_S, Q3_K_S, Q3_K_M, Q3_K_L,
    /// Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, F16, BF16 or F32 (or llama.cpp's file type number).
    #[arg(name = "TYPE")]
    pub ftype: String,
    /// Threads (llama-quantize's optional last argument); all cores by default.
    #[arg(name = "NTHREADS")]
    pub nthreads: Option<usize>,
    /// Threads to use (all cores by default).
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// The type of output.weight (e.g. q8_0).
    #[arg(long)]
    pub output_tensor_type: Option<String>,
    /// The type of token_embd.weight.
    #[arg(long)]
    pub token_embedding_type: Option<String>,
    /// Leave output.weight as it is.
    #[arg(long)]
    pub leave_output_tensor: bool,
    /// Give every quantizable tensor the type itself: no mixes, no output or embedding rules.
    #[arg(long)]
    pub pure: bool,
    /// An importance matrix (llama-imatrix's GGUF or legacy .dat file) for the quantizers that use one.
    #[arg(long)]
    pub imatrix: Option<PathBuf>,
    /// Allow tensors that are already quantized to be quantized again (loses quality).
    #[arg(long)]
    pub allow_requantize: bool,
    /// Print nothing but errors.
    #[arg(short, long)]
    pub quiet: bool,
}

/// What can go wrong, each naming the tensor or option at fault.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error("unknown quantization type '{0}' (try Q4_K_M, Q8_0, TQ2_0, Q1_0, F16, ...)")]
    UnknownFileType(String),
    #[error("quantization type {0} is not supported by onebit (its quantizer needs formats onebit does not have)")]
    UnsupportedFileType(String),
    #[error("unknown ggml type '{0}' for {1}")]
    UnknownTensorType(String, &'static str),
    #[error(
        "tensor {tensor}: rows of {ncols} are not a whole number of {ty} blocks and llama.cpp has no fallback type for {ty}"
    )]
    NoFallback { tensor: String, ty: GgmlType, ncols: u64 },
    #[error("{0}")]
    Rules(String),
    #[error(
        "tensor {tensor} is already quantized ({ty}); quantizing it again loses quality, pass --allow-requantize to do it anyway"
    )]
    Requantize { tensor: String, ty: GgmlType },
    #[error("tensor {tensor} has type {ty}, which onebit cannot read back to quantize again")]
    CannotDequantize { tensor: String, ty: GgmlType },
    #[error("onebit cannot quantize to {ty} (tensor {tensor})")]
    CannotQuantize { tensor: String, ty: GgmlType },
    #[error("tensor {tensor}: type {ty} needs an importance matrix (--imatrix) in a {ftype} file")]
    NeedsImatrix { tensor: String, ty: GgmlType, ftype: &'static str },
    #[error("tensor {tensor}: rows of {n_per_row} do not fit type {ty}")]
    Shape { tensor: String, ty: GgmlType, n_per_row: u64 },
    #[error("tensor {tensor} holds NaN or infinite values")]
    NotFinite { tensor: String },
    #[error("tensor {tensor}: {source}")]
    Kernel { tensor: String, source: onebit_kernels::KernelError },
    #[error("the model has no {0} in its metadata")]
    MissingKey(String),
    #[error(
        "the input declares general.alignment = {0}; llama-quantize writes such a file with 32-byte alignment under that key, which no reader accepts, so onebit refuses"
    )]
    Alignment(u64),
    #[error("importance matrix {path}: {reason}")]
    Imatrix { path: PathBuf, reason: String },
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let ftype = FileType::parse(&args.ftype)?;
    let parse_type = |s: &Option<String>, what: &'static str| -> Result<Option<GgmlType>, QuantizeError> {
        s.as_deref()
            .map(|s| GgmlType::from_name(s).ok_or_else(|| QuantizeError::UnknownTensorType(s.to_string(), what)))
            .transpose()
    };
    let output_tensor_type = parse_type(&args.output_tensor_type, "--output-tensor-type")?;
    let token_embedding_type = parse_type(&args.token_embedding_type, "--token-embedding-type")?;
    if same_file(&args.input, &args.output) {
        anyhow::bail!("input and output are the same file: {}", args.input.display());
    }
    let model = GgufModel::open(&args.input).with_context(|| format!("opening {}", args.input.display()))?;
    let imatrix = args.imatrix.as_deref().map(imatrix::Imatrix::load).transpose()?;
    let opts = Options {
        ftype,
        output_tensor_type,
        token_embedding_type,
        quantize_output: !args.leave_output_tensor,
        pure: args.pure,
        has_imatrix: imatrix.as_ref().is_some_and(|m| !m.is_empty()),
    };
    let threads = args.threads.or(args.nthreads).unwrap_or_else(Pool::default_threads).max(1);
    let job = Job::plan(&model, &opts, imatrix.as_ref(), args.allow_requantize)?;
    let quiet = args.quiet;
    if !quiet {
        for (name, why) in &job.fallbacks {
            eprintln!("note: {name}: {why}");
        }
        eprintln!(
            "quantizing {} to {} as {} on {threads} threads",
            args.input.display(),
            args.output.display(),
            ftype.name()
        );
    }
    let pool = Pool::new(threads);
    let (bytes_in, bytes_out) = super::output_file::write_atomically(&args.output, |tmp| {
        job.write(&model, tmp, &pool, imatrix.as_ref(), quiet)
    })?;
    if !quiet {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        eprintln!("{:.2} MiB -> {:.2} MiB in {:.2} s", mib(bytes_in), mib(bytes_out), started.elapsed().as_secs_f64());
    }
    Ok(())
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// One output tensor: where it comes from and what it becomes.
struct Planned {
    name: String,
    to: GgmlType,
    /// `ne` trimmed of trailing 1s, as ggml writes a tensor's shape.
    shape: Vec<u64>,
}

/// Everything decided before a byte is written.
struct Job {
    kvs: Vec<(String, OwnedValue)>,
    tensors: Vec<Planned>,
    fallbacks: Vec<(String, String)>,
}

impl Job {
    fn plan(
        model: &GgufModel,
        opts: &Options,
        imatrix: Option<&imatrix::Imatrix>,
        allow_requantize: bool,
    ) -> Result<Job, QuantizeError> {
        let md = model.metadata();
        let hp = hparams(model)?;
        let all: Vec<_> = model.tensors().collect();
        let names: Vec<&str> = all.iter().map(|t| t.name()).collect();
        let ordered: Vec<_> = rules::llama_order(&names).into_iter().map(|i| all[i]).collect();
        let descs: Vec<TensorDesc> = ordered
            .iter()
            .map(|t| TensorDesc { name: t.name(), ty: t.ggml_type(), ne: [t.dim(0), t.dim(1), t.dim(2), t.dim(3)] })
            .collect();
        let choices = rules::plan(&hp, opts, &descs)?;
        let mut tensors = Vec::with_capacity(descs.len());
        let mut fallbacks = Vec::new();
        for (d, choice) in descs.iter().zip(choices) {
            let to = choice.ty;
            if let Some(why) = choice.fallback {
                fallbacks.push((d.name.to_string(), why));
            }
            if to != d.ty {
                check_convertible(d, to, allow_requantize)?;
                let wants_imatrix = requires_imatrix(d.name, to, opts.ftype);
                if wants_imatrix && imatrix.is_none_or(|m| m.get(d.name).is_none()) {
                    return Err(QuantizeError::NeedsImatrix {
                        tensor: d.name.into(),
                        ty: to,
                        ftype: opts.ftype.name(),
                    });
                }
            }
            tensors.push(Planned { name: d.name.to_string(), to, shape: d.ne[..d.n_dims()].to_vec() });
        }
        let mut kvs = Vec::with_capacity(md.len() + 6);
        for (key, value) in md.iter() {
            if key == "general.alignment" {
                match value.as_i128() {
                    Some(32) => {}
                    other => return Err(QuantizeError::Alignment(other.unwrap_or(0) as u64)),
                }
            }
            kvs.push((key.to_string(), c_string(OwnedValue::from(value))));
        }
        set(&mut kvs, "general.quantization_version", OwnedValue::U32(2));
        set(&mut kvs, "general.file_type", OwnedValue::U32(opts.ftype.id()));
        for key in [onebit_gguf::KEY_SPLIT_NO, onebit_gguf::KEY_SPLIT_COUNT, onebit_gguf::KEY_SPLIT_TENSORS] {
            kvs.retain(|(k, _)| k != key);
        }
        if let Some(m) = imatrix.filter(|m| !m.is_empty()) {
            for (key, value) in m.metadata() {
                set(&mut kvs, key, value);
            }
        }
        Ok(Job { kvs, tensors, fallbacks })
    }

    /// Write the file; returns (input tensor bytes, output tensor bytes).
    fn write(
        &self,
        model: &GgufModel,
        path: &Path,
        pool: &Pool,
        imatrix: Option<&imatrix::Imatrix>,
        quiet: bool,
    ) -> Result<(u64, u64)> {
        let infos: Vec<TensorInfo> = self
            .tensors
            .iter()
            .map(|t| TensorInfo { name: t.name.clone(), ty: t.to, shape: t.shape.clone() })
            .collect();
        let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = GgufStreamWriter::new(BufWriter::with_capacity(4 << 20, file), &self.kvs, &infos)
            .with_context(|| format!("writing {}", path.display()))?;
        let total: u64 = self.tensors.iter().filter_map(|t| model.tensor(&t.name)).map(|t| t.data().len() as u64).sum();
        let bar = progress_bar(total, quiet);
        let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
        for planned in &self.tensors {
            let t = model.tensor(&planned.name).expect("planned from this model");
            bar.set_message(planned.name.clone());
            let src = convert::Source {
                name: t.name(),
                ty: t.ggml_type(),
                data: t.data(),
                n_per_row: t.dim(0) as usize,
                rows_per_expert: t.dim(1) as usize,
            };
            // llama-quantize looks the weights up (and checks their size) for every tensor it
            // converts; only some quantizers then use them.
            let weights = match imatrix {
                Some(m) if t.ggml_type() != planned.to => m.weights_for(t.name(), t.dim(0) * t.dim(2))?,
                _ => None,
            };
            let mut sink = |bytes: &[u8]| -> Result<(), QuantizeError> {
                bytes_out += bytes.len() as u64;
                Ok(out.write_data(bytes)?)
            };
            // Each slab's input pages leave memory as soon as the slab is written.
            let mut done = |used: &[u8]| {
                bar.inc(used.len() as u64);
                for part in model.parts() {
                    part.release(used);
                }
            };
            convert::convert(pool, &src, planned.to, weights, &mut sink, &mut done)?;
            out.end_tensor()?;
            bytes_in += t.data().len() as u64;
        }
        let mut w = out.finish()?;
        w.flush().with_context(|| format!("writing {}", path.display()))?;
        bar.finish_and_clear();
        Ok((bytes_in, bytes_out))
    }
}

fn progress_bar(total: u64, quiet: bool) -> ProgressBar {
    if quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("[{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

/// Set a key as llama.cpp's GGUF writer does: remove it, then append it.
fn set(kvs: &mut Vec<(String, OwnedValue)>, key: &str, value: OwnedValue) {
    kvs.retain(|(k, _)| k != key);
    kvs.push((key.to_string(), value));
}

/// llama.cpp copies strings through C strings: anything after a NUL byte is lost.
fn c_string(v: OwnedValue) -> OwnedValue {
    match v {
        OwnedValue::String(mut s) => {
            if let Some(end) = s.iter().position(|&b| b == 0) {
                s.truncate(end);
            }
            OwnedValue::String(s)
        }
        OwnedValue::Array(ty, items) => OwnedValue::Array(ty, items.into_iter().map(c_string).collect()),
        other => other,
    }
}

/// The hyperparameters the mixes depend on, read as llama.cpp reads them.
fn hparams(model: &GgufModel) -> Result<Hparams, QuantizeError> {
    let md = model.metadata();
    let arch =
        md.get_str("general.architecture").map_err(|_| QuantizeError::MissingKey("general.architecture".into()))?;
    let first = |key: &str| -> Option<u32> {
        match md.get(key)? {
            Value::Array(a) => a.iter().next().and_then(|v| v.as_i128()).and_then(|v| u32::try_from(v).ok()),
            v => v.as_i128().and_then(|v| u32::try_from(v).ok()),
        }
    };
    let key = |k: &str| format!("{arch}.{k}");
    let n_layer = first(&key("block_count")).ok_or_else(|| QuantizeError::MissingKey(key("block_count")))?;
    let n_head = first(&key("attention.head_count")).unwrap_or(0);
    let n_head_kv = first(&key("attention.head_count_kv")).unwrap_or(n_head);
    let n_expert = first(&key("expert_count")).unwrap_or(0);
    let is_70b = match arch {
        "llama" => n_layer == 80 && n_head != n_head_kv,
        "qwen2" | "deci" | "olmo" => n_layer == 80,
        "jais2" => n_layer == 68,
        _ => false,
    };
    Ok(Hparams { arch: arch.to_string(), n_layer, n_head, n_head_kv, n_expert, is_70b })
}

/// Whether onebit can turn a tensor of `d.ty` into `to`.
fn check_convertible(d: &TensorDesc, to: GgmlType, allow_requantize: bool) -> Result<(), QuantizeError> {
    let plain = matches!(d.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    if !plain && !allow_requantize {
        return Err(QuantizeError::Requantize { tensor: d.name.into(), ty: d.ty });
    }
    if !can_dequantize(d.ty) {
        return Err(QuantizeError::CannotDequantize { tensor: d.name.into(), ty: d.ty });
    }
    if !onebit_kernels::formats::can_quantize(to) {
        return Err(QuantizeError::CannotQuantize { tensor: d.name.into(), ty: to });
    }
    Ok(())
}

/// llama.cpp refuses these without an importance matrix (the result would be garbage).
fn requires_imatrix(name: &str, ty: GgmlType, ftype: FileType) -> bool {
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" || name == "output.weight" {
        return false;
    }
    ty == GgmlType::Q2_K && ftype == FileType::Q2_K_S
}
