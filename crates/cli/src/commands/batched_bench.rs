//! `onebit batched-bench`: llama.cpp's `llama-batched-bench` (its flags, table and JSON lines),
//! measured through the serving engine exactly as a server uses it.
//!
//! For every prompt length PP, generation length TG and number of sequences B: B requests of
//! PP random tokens are submitted at once (with `-pps`, one prompt shared by all of them),
//! each generating TG tokens greedily past any end-of-text. T_PP runs from submission until
//! the last prompt is in the cache, T_TG from there until the last request ends; the speeds
//! and N_KV follow llama-batched-bench's formulas. Unlike it, prefill and decoding may overlap
//! (a sequence whose prompt is done starts decoding while later prompts are prefilled, as in
//! a server), so with more prompt tokens than `--batch-size` some generated tokens fall in
//! T_PP. The prefix cache is emptied before every test, so that only `-pps` shares prompts.

use std::time::Instant;

use anyhow::{Result, bail};
use onebit_engine::{GenerateRequest, SamplingParams, Scheduler, SchedulerConfig};
use onebit_model::LoraUse;
use serde_json::json;

use super::model_args::ModelArgs;
use super::ui::Ui;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths (PP), comma-separated.
    #[arg(long = "npp", value_delimiter = ',', default_value = "128,256,512", value_name = "N,...")]
    pub npp: Vec<usize>,
    /// Generation lengths (TG), comma-separated.
    #[arg(long = "ntg", value_delimiter = ',', default_value = "128,256", value_name = "N,...")]
    pub ntg: Vec<usize>,
    /// Numbers of parallel sequences (B), comma-separated.
    #[arg(long = "npl", value_delimiter = ',', default_value = "1,2,4,8,16,32", value_name = "N,...")]
    pub npl: Vec<usize>,
    /// One prompt shared by all the sequences of a test (computed once, through the prefix cache).
    #[arg(long = "pps")]
    pub pps: bool,
    /// Tokens per forward pass (llama.cpp's -b).
    #[arg(short = 'b', long = "batch-size", default_value_t = 512, value_name = "N")]
    pub batch_size: usize,
    /// Positions in the KV pool [default: what the largest test needs].
    #[arg(long = "kv-size", value_name = "TOKENS")]
    pub kv_size: Option<usize>,
    /// Sequence j of a test runs with LoRA adapter j mod N alone (N: the adapters of --lora and
    /// --lora-scaled, at their scales), instead of all of them: a batch of different adapters.
    #[arg(long = "lora-each")]
    pub lora_each: bool,
    /// md (a table) or jsonl (one JSON object per test, llama-batched-bench's keys).
    #[arg(long = "output-format", default_value = "md", value_name = "FORMAT")]
    pub output_format: Format,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Md,
    Jsonl,
}

/// One row of the table.
struct Row {
    pp: usize,
    tg: usize,
    pl: usize,
    n_kv: usize,
    t_pp: f64,
    t_tg: f64,
}

pub fn run(args: Args) -> Result<()> {
    if [&args.npp, &args.ntg, &args.npl].iter().any(|v| v.is_empty() || v.contains(&0)) {
        bail!("-npp, -ntg and -npl take positive numbers");
    }
    let ui = Ui::new(true);
    let model = args.model.load_with(&ui)?;
    let (max_pp, max_tg, max_pl) = (max(&args.npp), max(&args.ntg), max(&args.npl));
    // A sequence holds its prompt, its answer and the one token sampled after it.
    let ctx = args.model.ctx_size.unwrap_or(max_pp + max_tg + 2);
    let engine = std::sync::Arc::new(args.model.engine(model)?);
    let pool = args.model.pool();
    let threads = pool.n_threads();
    let config = SchedulerConfig {
        parallel: max_pl,
        batch_size: args.batch_size,
        queue_size: 0,
        ctx_size: ctx,
        kv_size: args.kv_size.unwrap_or(max_pl * ctx),
        speculative: onebit_engine::Speculation::default(),
    };
    let scheduler = Scheduler::start(std::sync::Arc::clone(&engine), pool, config)?;
    let n_kv_max = scheduler.config().kv_size;
    let vocab = engine.model().config().vocab_size;
    if args.output_format == Format::Md {
        println!();
        println!(
            "main: n_kv_max = {n_kv_max}, n_batch = {}, n_ubatch = {}, flash_attn = 0, is_pp_shared = {}, n_gpu_layers = 0, n_threads = {threads}, n_threads_batch = {threads}",
            args.batch_size, args.batch_size, args.pps as u8
        );
        println!();
        println!(
            "|{:>6} | {:>6} | {:>4} | {:>6} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} |",
            "PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s"
        );
        println!(
            "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|"
        );
    }
    let each: Vec<Vec<LoraUse>> = if args.lora_each {
        let uses = args.model.lora.uses()?;
        if uses.is_empty() {
            bail!("--lora-each needs adapters (--lora, --lora-scaled)");
        }
        uses.into_iter().map(|u| vec![u]).collect()
    } else {
        Vec::new()
    };
    let mut seed = 0u64;
    for &pp in &args.npp {
        for &tg in &args.ntg {
            for &pl in &args.npl {
                if pp + tg + 2 > ctx {
                    continue;
                }
                seed += 1;
                let row = measure(&scheduler, vocab, (pp, tg, pl), args.pps, seed, &each)?;
                print_row(&args, &row, n_kv_max, threads);
            }
        }
    }
    Ok(())
}

fn max(v: &[usize]) -> usize {
    v.iter().copied().max().unwrap_or(0)
}

/// Run one test through the scheduler; with `each`, request j runs with adapters `each[j mod
/// each.len()]`.
fn measure(
    s: &Scheduler,
    vocab: usize,
    (pp, tg, pl): (usize, usize, usize),
    pps: bool,
    seed: u64,
    each: &[Vec<LoraUse>],
) -> Result<Row> {
    s.clear_cache()?;
    let shared = random_tokens(vocab, pp, seed << 32);
    let req = GenerateRequest {
        sampling: SamplingParams::greedy(),
        // The first token comes from the prompt's logits: TG more forward passes follow.
        max_tokens: Some(tg + 1),
        ignore_eos: true,
        ..Default::default()
    };
    let start = Instant::now();
    let mut handles = Vec::with_capacity(pl);
    for j in 0..pl {
        let prompt = if pps { shared.clone() } else { random_tokens(vocab, pp, (seed << 32) + j as u64) };
        let lora = (!each.is_empty()).then(|| each[j % each.len()].clone());
        handles.push(s.submit(prompt, GenerateRequest { lora, ..req.clone() })?);
    }
    let (mut t_pp, mut t_end) = (0f64, 0f64);
    for h in handles {
        let done = h.wait(|_| onebit_engine::Flow::Continue)?;
        let t = &done.timings;
        t_pp = t_pp.max(t.queue + t.prefill);
        t_end = t_end.max(t.queue + t.prefill + t.decode);
    }
    // Requests are submitted within microseconds of `start`; the wall clock bounds the end.
    let t_end = t_end.min(start.elapsed().as_secs_f64());
    let n_kv = if pps { pp + pl * tg } else { pl * (pp + tg) };
    Ok(Row { pp, tg, pl, n_kv, t_pp, t_tg: (t_end - t_pp).max(f64::MIN_POSITIVE) })
}

fn print_row(args: &Args, r: &Row, n_kv_max: usize, threads: usize) {
    let pp_tokens = if args.pps { r.pp } else { r.pl * r.pp };
    let speed_pp = pp_tokens as f64 / r.t_pp;
    let speed_tg = (r.pl * r.tg) as f64 / r.t_tg;
    let t = r.t_pp + r.t_tg;
    let speed = (pp_tokens + r.pl * r.tg) as f64 / t;
    match args.output_format {
        Format::Md => println!(
            "|{:>6} | {:>6} | {:>4} | {:>6} | {:>8.3} | {:>8.2} | {:>8.3} | {:>8.2} | {:>8.3} | {:>8.2} |",
            r.pp, r.tg, r.pl, r.n_kv, r.t_pp, speed_pp, r.t_tg, speed_tg, t, speed
        ),
        Format::Jsonl => println!(
            "{}",
            json!({
                "n_kv_max": n_kv_max, "n_batch": args.batch_size, "n_ubatch": args.batch_size, "flash_attn": 0,
                "is_pp_shared": args.pps as u8, "n_gpu_layers": 0, "n_threads": threads, "n_threads_batch": threads,
                "pp": r.pp, "tg": r.tg, "pl": r.pl, "n_kv": r.n_kv, "t_pp": r.t_pp, "speed_pp": speed_pp,
                "t_tg": r.t_tg, "speed_tg": speed_tg, "t": t, "speed": speed,
            })
        ),
    }
}

/// `n` token ids from a fixed generator (xorshift), below `vocab`.
fn random_tokens(vocab: usize, n: usize, seed: u64) -> Vec<u32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}
