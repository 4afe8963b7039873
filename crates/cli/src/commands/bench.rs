//! `onebit bench`: llama-bench's measurements and table. `pp N` times one batch of N tokens
//! (prefill), `tg N` times N single-token steps (decode), both from an empty cache, with random
//! token ids; tokenization and sampling are not part of it. With `-d N` (llama-bench's
//! `--n-depth`) a test runs after N tokens already in the cache (`pp512 @ d4096`): the N tokens
//! are computed once, untimed, and the cache is cut back to them before each run. Each test runs
//! once to warm up, then `-r` times; t/s is reported as mean ± standard deviation. The first
//! line names the CPU and the kernel tier, so that a figure can be traced to its machine.
//! With `--spec` (or `--model-draft`) the tg tests measure speculative decoding instead, after
//! a real prompt, beside the same decode without it (see `bench_spec.rs`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail};
use onebit_engine::Engine;
use onebit_kernels::{BatchRounding, KernelTier, Pool};
use onebit_model::{Device, KvCache, KvType, LogitsWanted, LoraUse, Model, ModelOptions, Scratch};
use serde_json::json;

use super::bench_spec::{self, SpecTotals};
use super::quantize::rules::FileType;

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file, or a Hugging Face model (org/repo or org/repo:FILE_OR_QUANT).
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: String,
    /// Prompt sizes to test (pp), comma-separated; 0 skips.
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512")]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to test (tg), comma-separated; 0 skips.
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128")]
    pub n_gen: Vec<usize>,
    /// Tokens already in the cache before each test, comma-separated (llama-bench's `-d`).
    #[arg(short = 'd', long = "n-depth", value_delimiter = ',', default_value = "0")]
    pub n_depth: Vec<usize>,
    /// Thread counts to test, comma-separated [default: every core].
    #[arg(short = 't', long, value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 3)]
    pub repetitions: usize,
    /// Kernel family [default: the best this CPU runs].
    #[arg(long, value_name = "TIER")]
    pub kernel_tier: Option<KernelTier>,
    /// KV cache type: f16, f32 or q8_0.
    #[arg(long, default_value = "f16", value_name = "TYPE")]
    pub kv_type: KvType,
    /// Activation rounding: fast or reference (see `onebit run --help`).
    #[arg(long, default_value = "fast", value_name = "MODE")]
    pub batch_rounding: BatchRounding,
    /// Where to run: cpu, or cuda:N for an NVIDIA GPU.
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    pub device: Device,
    /// Print the rows as a JSON array.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub lora: super::model_args::LoraArgs,
    /// With --spec: the prompt the tg tests decode after, sent as a user message through the
    /// chat template where the model has one [default: a request to copy the first ~1,000
    /// tokens of Moby-Dick's chapter 1].
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    // With --spec lookup or draft, each tg test is measured without speculation and with it,
    // greedily after the prompt of -f, and reports how many drafted tokens were kept.
    #[command(flatten)]
    pub spec: super::model_args::SpecArgs,
}

struct Row {
    model: String,
    size: u64,
    params: u64,
    threads: usize,
    test: String,
    samples: Vec<f64>,
    spec: Option<SpecTotals>,
}

impl Row {
    fn mean(&self) -> f64 {
        self.samples.iter().sum::<f64>() / self.samples.len() as f64
    }

    fn std(&self) -> f64 {
        let n = self.samples.len();
        if n < 2 {
            return 0.0;
        }
        let m = self.mean();
        (self.samples.iter().map(|s| (s - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    }
}

pub fn run(args: Args) -> Result<()> {
    if args.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    let spec = args.spec.mode.is_some() || args.spec.model_draft.is_some();
    if spec && args.n_depth.iter().any(|&d| d > 0) {
        bail!("--spec: the tg tests decode after the prompt of -f, which takes the place of -d; leave -d out");
    }
    let threads =
        if args.threads.is_empty() { vec![onebit_kernels::Pool::default_threads()] } else { args.threads.clone() };
    let mut rows = Vec::new();
    let tier = args.kernel_tier.unwrap_or_else(KernelTier::best);
    if !args.json {
        println!("cpu: {} | kernel tier: {tier}", cpu_name());
        // With --spec, a wider test column ("tg128 lookup") and the drafts kept.
        let (w, kept) = if spec { (12, format!(" {:>20} |", "drafts kept")) } else { (8, String::new()) };
        println!(
            "| {:<28} | {:>10} | {:>10} | {:<10} | {:>7} | {:>w$} | {:>20} |{kept}",
            "model", "size", "params", "backend", "threads", "test", "t/s"
        );
        let kept = if spec { format!(" {:->20} |", ":") } else { String::new() };
        println!(
            "| {:-<28} | {:->10} | {:->10} | {:-<10} | {:->7} | {:->w$} | {:->20} |{kept}",
            ":", ":", ":", ":", ":", ":", ":"
        );
    }
    let path = super::resolve::model_path(Some(&args.model), &super::ui::Ui::new(args.json))?;
    for &t in &threads {
        let options = ModelOptions {
            device: args.device,
            kernel_tier: args.kernel_tier,
            kv_type: args.kv_type,
            batch_rounding: args.batch_rounding,
            threads: Some(t),
            pack_cache: None,
            lora: args.lora.paths(),
        };
        let lora = args.lora.uses()?;
        let loaded = Model::load(&path, &options)?;
        // With --spec the model serves through the engine, which owns it.
        let (engine, plain) = if spec {
            let mut engine = Engine::new(loaded)?;
            engine.set_lora_scales(&lora)?;
            args.spec.attach_draft(&mut engine, &options)?;
            (Some(Arc::new(engine)), None)
        } else {
            (None, Some(loaded))
        };
        let model = engine.as_deref().map(Engine::model).or(plain.as_ref()).expect("loaded");
        if let (Some(gpu), false) = (model.device_name(), args.json) {
            println!("gpu: {gpu} ({})", model.device());
        }
        let n_threads = if t == 0 { Pool::default_threads() } else { t };
        let pool = Pool::new(n_threads);
        let (size, params) = weight_totals(model);
        let name = model_name(model, params);
        let backend = match model.device() {
            Device::Cpu => format!("CPU/{}", model.kernels().tier()),
            Device::Cuda(_) => "CUDA".to_string(),
        };
        let row = |test: String, samples: Vec<f64>, totals: Option<SpecTotals>| {
            let row = Row { model: name.clone(), size, params, threads: t, test, samples, spec: totals };
            if !args.json {
                print_row(&row, &backend, spec);
            }
            row
        };
        let tests = args.n_prompt.iter().filter(|&&n| n > 0).map(|&n| ("pp", n, true));
        let tests = tests.chain(args.n_gen.iter().filter(|&&n| n > 0).map(|&n| ("tg", n, false))).collect::<Vec<_>>();
        for &depth in &args.n_depth {
            let longest = tests.iter().map(|t| t.1).max().unwrap_or(0);
            let mut cache = model.new_cache(depth + longest)?;
            fill(model, &pool, &mut cache, depth, &lora)?;
            for &(kind, n, prefill) in &tests {
                if let (Some(engine), false) = (&engine, prefill) {
                    for (test, samples, totals) in spec_test(&args, engine, n_threads, n)? {
                        rows.push(row(test, samples, Some(totals)));
                    }
                    continue;
                }
                let mut samples = Vec::new();
                for rep in 0..=args.repetitions {
                    cache.truncate(depth);
                    let secs = time_test(model, &pool, &mut cache, &lora, (n, prefill), rep)?;
                    if rep > 0 {
                        samples.push(n as f64 / secs);
                    }
                }
                let test = if depth > 0 { format!("{kind}{n} @ d{depth}") } else { format!("{kind}{n}") };
                rows.push(row(test, samples, None));
            }
        }
    }
    if args.json {
        let out: Vec<_> = rows.iter().map(row_json).collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}

/// The tg `n` test of `--spec`: a row per mode (without speculation, then with it), with its
/// tokens/s per timed repetition and the drafts over them.
fn spec_test(
    args: &Args,
    engine: &Arc<Engine>,
    threads: usize,
    n: usize,
) -> Result<Vec<(String, Vec<f64>, SpecTotals)>> {
    let prompt = bench_spec::prompt(engine, args.file.as_deref())?;
    let speculation = args.spec.speculation();
    let modes = bench_spec::modes(speculation.mode);
    let scheduler = bench_spec::scheduler(engine, threads, prompt.len() + n, speculation)?;
    let mut out: Vec<(String, Vec<f64>, SpecTotals)> = modes
        .iter()
        .map(|&mode| {
            let totals = SpecTotals { mode, prompt_tokens: prompt.len(), ..SpecTotals::default() };
            (format!("tg{n} {mode}"), Vec::new(), totals)
        })
        .collect();
    for rep in 0..=args.repetitions {
        let measured = bench_spec::run_once(&scheduler, &prompt, n, &modes)?;
        if rep == 0 {
            continue;
        }
        for (o, (rate, drafted, accepted)) in out.iter_mut().zip(measured) {
            o.1.push(rate);
            o.2.drafted += drafted;
            o.2.accepted += accepted;
        }
    }
    Ok(out)
}

fn print_row(row: &Row, backend: &str, spec: bool) {
    let kept = row.spec.map(|s| format!(" {:>20} |", s.cell())).unwrap_or_default();
    let w = if spec { 12 } else { 8 };
    println!(
        "| {:<28} | {:>10} | {:>10} | {:<10} | {:>7} | {:>w$} | {:>20} |{kept}",
        row.model,
        format!("{:.2} GiB", row.size as f64 / (1u64 << 30) as f64),
        format!("{:.2} B", row.params as f64 / 1e9),
        backend,
        row.threads,
        row.test,
        format!("{:.2} ± {:.2}", row.mean(), row.std())
    );
}

fn row_json(r: &Row) -> serde_json::Value {
    let mut v = json!({"model": r.model, "size": r.size, "params": r.params, "threads": r.threads, "test": r.test,
                       "t/s": r.mean(), "stddev": r.std(), "samples_ts": r.samples});
    if let Some(s) = r.spec {
        let extra = json!({"spec": s.mode.to_string(), "prompt_tokens": s.prompt_tokens,
                           "drafted_tokens": s.drafted, "accepted_tokens": s.accepted, "acceptance": s.acceptance()});
        v.as_object_mut().expect("an object").extend(extra.as_object().expect("an object").clone());
    }
    v
}

/// Random token ids (a fixed generator, different per repetition).
fn tokens(model: &Model, n: usize, seed: usize) -> Vec<u32> {
    let vocab = model.config().vocab_size as u64;
    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ seed as u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab) as u32
        })
        .collect()
}

/// Put `depth` random tokens in the cache, 512 at a time (llama-bench's default batch).
fn fill(model: &Model, pool: &Pool, cache: &mut KvCache, depth: usize, lora: &[LoraUse]) -> Result<()> {
    let toks = tokens(model, depth, usize::MAX);
    let mut scratch = Scratch::new();
    for chunk in toks.chunks(512) {
        model.forward_one_adapted(pool, cache, chunk, lora, LogitsWanted::Last, &mut scratch)?;
    }
    Ok(())
}

/// Seconds for one batch of `n` tokens (`prefill`) or `n` single-token steps, after what the
/// cache holds.
fn time_test(
    model: &Model,
    pool: &Pool,
    cache: &mut KvCache,
    lora: &[LoraUse],
    (n, prefill): (usize, bool),
    rep: usize,
) -> Result<f64> {
    let toks = tokens(model, n, rep);
    let mut scratch = Scratch::new();
    let t = Instant::now();
    if prefill {
        model.forward_one_adapted(pool, cache, &toks, lora, LogitsWanted::Last, &mut scratch)?;
    } else {
        for tok in &toks {
            let one = std::slice::from_ref(tok);
            model.forward_one_adapted(pool, cache, one, lora, LogitsWanted::Last, &mut scratch)?;
        }
    }
    Ok(t.elapsed().as_secs_f64())
}

/// The CPU's model name (`lscpu`'s), where the system says.
fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Bytes and parameters of the model's tensors.
fn weight_totals(model: &Model) -> (u64, u64) {
    model.gguf().tensors().fold((0, 0), |(b, p), t| (b + t.data().len() as u64, p + t.n_elements()))
}

/// llama-bench style: architecture, size class and the file's type (`general.file_type`, as
/// llama-quantize names it; else the type most of the weights are in).
fn model_name(model: &Model, params: u64) -> String {
    let md = model.gguf().metadata();
    let file_type = md.opt_u32("general.file_type").ok().flatten();
    let named = file_type.and_then(|id| FileType::ALL.iter().find(|f| f.id() == id)).map(|f| f.name().to_string());
    let main = named.unwrap_or_else(|| {
        let mut by_type = std::collections::BTreeMap::new();
        for t in model.gguf().tensors() {
            *by_type.entry(t.ggml_type()).or_insert(0u64) += t.n_elements();
        }
        by_type.iter().max_by_key(|(_, n)| **n).map(|(t, _)| t.to_string()).unwrap_or_default()
    });
    let label = md.opt_str("general.size_label").ok().flatten().map(str::to_string);
    let size = label.unwrap_or_else(|| match params {
        p if p >= 10_000_000_000 => format!("{:.0}B", p as f64 / 1e9),
        p if p >= 1_000_000_000 => format!("{:.1}B", p as f64 / 1e9),
        p => format!("{:.0}M", p as f64 / 1e6),
    });
    format!("{} {size} {main}", model.config().arch.name())
}
