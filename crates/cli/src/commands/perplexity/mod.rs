//! `onebit perplexity`: llama-perplexity's measure of how well a model predicts a text, and its
//! KL divergence from a base model's predictions.
//!
//! The method is llama-perplexity's, so that the figures compare: the tokenized text is cut
//! into chunks of `-c` tokens; each chunk is evaluated from an empty context (its first token
//! replaced by BOS when the vocabulary adds one), and only the predictions of its second half
//! are scored, so that every scored token has at least `c/2` tokens of context. Output:
//! `[k]ppl` after each chunk (over all chunks so far), then `Final estimate: PPL = X +/- Y`.
//!
//! Like llama-perplexity, `-b / -c` chunks share one batch. Each group of chunks takes two
//! passes of the batched forward: the first halves, whose logits nobody reads, then the second
//! halves with logits at every position (a token's result does not depend on its batch, so
//! this is the same as one pass, without the output projection of unscored positions).
//!
//! `--kl-divergence-base FILE` also saves the base model's log probabilities at every scored
//! position; `--kl-divergence-base FILE --kl-divergence` then evaluates another model on the
//! same tokens (read from the file) and compares. The file is llama-perplexity's format
//! ([`logits_file`]), so either tool reads the other's.

mod kld;
mod logits_file;
mod score;

use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use onebit_kernels::Pool;
use onebit_model::{BLOCK_TOKENS, LogitsWanted, LoraUse, Model, Scratch, SeqInput};
use onebit_tokenizer::Tokenizer;

use super::model_args::ModelArgs;
use kld::KldSums;
use logits_file::{Header, Reader, Writer};
use score::{PplSums, compare_row, normalize, quantize_row, record_len};

/// llama-perplexity's default chunk length.
const DEFAULT_CTX: usize = 512;

#[derive(clap::Args)]
#[command(mut_arg("ctx_size", |a| a.help("Tokens per chunk [default: 512] (with --kl-divergence: the base file's)")))]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to evaluate (not needed with --kl-divergence, which reads the base file's
    /// tokens).
    #[arg(short = 'f', long = "file", value_name = "TEXT")]
    pub file: Option<PathBuf>,
    /// Tokens per forward pass: `-b / -c` chunks are evaluated together.
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048, value_name = "N")]
    pub batch_size: usize,
    /// Evaluate at most this many chunks [default: all].
    #[arg(long, value_name = "N")]
    pub chunks: Option<usize>,
    /// Save the log probabilities at every scored position to FILE (llama-perplexity's
    /// format); with --kl-divergence, read them and compare instead.
    #[arg(long = "kl-divergence-base", visible_alias = "save-all-logits", value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare this model with the base whose log probabilities --kl-divergence-base names.
    #[arg(long = "kl-divergence", requires = "kl_divergence_base")]
    pub kl_divergence: bool,
}

/// How the chunks are cut into passes.
#[derive(Clone, Debug)]
struct Plan {
    n_ctx: usize,
    /// Chunks evaluated together.
    n_seq: usize,
    n_chunk: usize,
    /// The first scored position of a chunk.
    first: usize,
    /// Each chunk's positions per pass: its first half, then its second, each cut to the batch.
    pieces: Vec<Range<usize>>,
}

impl Plan {
    fn new(n_ctx: usize, n_batch: usize, n_chunk: usize) -> Plan {
        let n_seq = (n_batch / n_ctx).max(1);
        let piece = n_batch.min(n_seq * n_ctx) / n_seq;
        let first = n_ctx / 2;
        let mut pieces = Vec::new();
        for half in [0..first, first..n_ctx] {
            let mut at = half.start;
            while at < half.end {
                pieces.push(at..(at + piece).min(half.end));
                at += piece;
            }
        }
        Plan { n_ctx, n_seq, n_chunk, first, pieces }
    }
}

/// What receives the logits of scored positions: `(pool, chunk, p0, rows)`, see [`Eval::run`].
type Sink<'s> = dyn FnMut(&Pool, usize, usize, &[&[f32]]) -> Result<()> + 's;

/// A loaded model and what evaluating it needs.
struct Eval<'a> {
    model: &'a Model,
    pool: Pool,
    plan: Plan,
    /// The token that replaces each chunk's first, when the vocabulary adds BOS.
    bos: Option<u32>,
    /// The LoRA adapters every chunk runs with.
    lora: Vec<LoraUse>,
}

impl Eval<'_> {
    /// Evaluate the chunks of `tokens` and hand every scored position's logits to `sink`:
    /// `sink(chunk, p0, rows)` gets the logits at positions `p0 ..` of chunk `chunk`, in order;
    /// the position after the last scored one is left out.
    fn run(&self, tokens: &[u32], sink: &mut Sink) -> Result<()> {
        let p = &self.plan;
        let per_seq = p.n_ctx.div_ceil(BLOCK_TOKENS);
        let mut kv = self.model.new_pool(p.n_seq * per_seq)?;
        let tables: Vec<Vec<u32>> =
            (0..p.n_seq).map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect()).collect();
        let mut scratch = Scratch::new();
        let n_vocab = self.model.config().vocab_size;
        for group in (0..p.n_chunk).step_by(p.n_seq) {
            let t0 = Instant::now();
            let n_in = p.n_seq.min(p.n_chunk - group);
            let inputs: Vec<Vec<u32>> = (group..group + n_in)
                .map(|c| {
                    let mut chunk = tokens[c * p.n_ctx..(c + 1) * p.n_ctx].to_vec();
                    if let Some(bos) = self.bos {
                        chunk[0] = bos;
                    }
                    chunk
                })
                .collect();
            for piece in &p.pieces {
                let logits = if piece.start >= p.first { LogitsWanted::All } else { LogitsWanted::None };
                let batch: Vec<SeqInput> = (0..n_in)
                    .map(|s| SeqInput {
                        tokens: &inputs[s][piece.clone()],
                        start: piece.start,
                        blocks: &tables[s],
                        window_blocks: None,
                        logits,
                    })
                    .collect();
                let lora = vec![self.lora.as_slice(); batch.len()];
                let out = self.model.forward_adapted(&self.pool, &mut kv, &batch, &lora, &mut scratch)?;
                if logits == LogitsWanted::None {
                    continue;
                }
                if out.n_vocab() != n_vocab {
                    bail!("the model's output has {} logits for a vocabulary of {n_vocab}", out.n_vocab());
                }
                for s in 0..n_in {
                    let rows: Vec<&[f32]> =
                        out.rows_of(s).filter(|(i, _)| piece.start + i < p.n_ctx - 1).map(|(_, r)| r).collect();
                    sink(&self.pool, group + s, piece.start, &rows)?;
                }
            }
            if group == 0 {
                let secs = t0.elapsed().as_secs_f64();
                let passes = p.n_chunk.div_ceil(p.n_seq);
                eprintln!("perplexity: {secs:.2} seconds per pass - ETA {:.2} minutes", secs * passes as f64 / 60.0);
            }
        }
        Ok(())
    }
}

/// Run `f(i, item)` for every item on the pool's threads.
fn par_each<T: Send>(pool: &Pool, items: &mut [T], f: impl Fn(&mut T) + Sync) {
    pool.for_each_mut(items, &|_, item| f(item));
}

pub fn run(args: Args) -> Result<()> {
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    if args.chunks == Some(0) {
        bail!("--chunks must be at least 1");
    }
    let text = match (&args.file, args.kl_divergence) {
        (Some(path), false) => Some(read_text(path)?),
        (None, false) => bail!("no text: pass -f FILE (see the README for the corpus onebit measures on)"),
        (_, true) => None,
    };
    let base = if args.kl_divergence {
        Some(Reader::open(args.kl_divergence_base.as_deref().expect("clap requires the base file"))?)
    } else {
        None
    };
    let n_ctx = match &base {
        Some(r) => {
            if args.model.ctx_size.is_some_and(|c| c != r.header.n_ctx) {
                bail!(
                    "-c {} differs from the base file's chunks of {} tokens",
                    args.model.ctx_size.unwrap_or(0),
                    r.header.n_ctx
                );
            }
            r.header.n_ctx
        }
        None => args.model.ctx_size.unwrap_or(DEFAULT_CTX),
    };
    if n_ctx < 4 {
        bail!("-c {n_ctx}: a chunk needs at least 4 tokens (half of them context, half scored)");
    }
    let model = args.model.load_with(&super::ui::Ui::new(false))?;
    let trained = model.config().context_length;
    if n_ctx > trained {
        bail!("-c {n_ctx} is larger than the model's context of {trained} tokens");
    }
    let tok = Tokenizer::from_metadata(&model.gguf().metadata()).context("reading the model's tokenizer")?;
    let vocab = tok.vocab();
    if vocab.add_eos {
        bail!("the model's vocabulary appends EOS to text, which perplexity (like llama-perplexity) does not support");
    }
    let bos = if vocab.add_bos { vocab.specials.bos } else { None };
    let n_vocab = model.config().vocab_size;

    let (tokens, n_chunk_max) = match (&base, &text) {
        (Some(r), _) => {
            if r.header.n_vocab != n_vocab {
                bail!("the base file's vocabulary has {} tokens, this model's {n_vocab}", r.header.n_vocab);
            }
            (r.header.tokens.clone(), r.header.n_chunk)
        }
        (None, Some(text)) => {
            let t0 = Instant::now();
            let tokens = tok.encode(text, true, false)?;
            eprintln!("perplexity: tokenizing the input took {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);
            if tokens.len() < 2 * n_ctx {
                bail!(
                    "the text tokenizes to only {} tokens; perplexity with -c {n_ctx} needs at least {} (2 × ctx)",
                    tokens.len(),
                    2 * n_ctx
                );
            }
            let n = tokens.len() / n_ctx;
            (tokens, n)
        }
        (None, None) => unreachable!("text or base file, checked above"),
    };
    let n_chunk = args.chunks.map_or(n_chunk_max, |c| c.min(n_chunk_max));
    let plan = Plan::new(n_ctx, args.batch_size, n_chunk);
    eprintln!(
        "perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={n_ctx}, batch_size={}, n_seq={}",
        args.batch_size.min(plan.n_seq * n_ctx),
        plan.n_seq
    );
    let eval = Eval { model: &model, pool: args.model.pool(), plan, bos, lora: args.model.lora.uses()? };
    let t0 = Instant::now();
    match base {
        Some(reader) => compare(&eval, &tokens, reader)?,
        None => {
            let writer = match &args.kl_divergence_base {
                Some(path) => {
                    let header = Header { n_ctx, n_vocab, n_chunk, tokens: tokens[..n_chunk * n_ctx].to_vec() };
                    Some(Writer::create(path, &header)?)
                }
                None => None,
            };
            perplexity(&eval, &tokens, writer)?;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let n = n_chunk * n_ctx;
    eprintln!("perplexity: {n} tokens evaluated in {secs:.2} s ({:.1} tokens/s)", n as f64 / secs);
    Ok(())
}

/// The text of `path`, less one trailing newline (as llama.cpp reads `-f`).
fn read_text(path: &PathBuf) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading the text {}", path.display()))?;
    let mut text = String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{} is not UTF-8 text", path.display()))?;
    if text.ends_with('\n') {
        text.pop();
    }
    Ok(text)
}

/// Score every chunk, print `[k]ppl` as each one completes and the final estimate, and save
/// the log probabilities when `writer` is given.
fn perplexity(eval: &Eval, tokens: &[u32], mut writer: Option<Writer>) -> Result<()> {
    let kernels = eval.model.kernels();
    let (n_ctx, scored_end) = (eval.plan.n_ctx, eval.plan.n_ctx - 1);
    let rec = record_len(eval.model.config().vocab_size);
    let mut sums = PplSums::default();
    let mut records: Vec<u16> = Vec::new();
    let mut nlls: Vec<(usize, f64)> = Vec::new();
    let mut out = std::io::stdout().lock();
    eval.run(tokens, &mut |pool, chunk, p0, rows| {
        let target = |i: usize| tokens[chunk * n_ctx + p0 + i + 1] as usize;
        nlls.clear();
        nlls.extend((0..rows.len()).map(|i| (i, 0.0)));
        if writer.is_some() {
            records.resize(rows.len() * rec, 0);
            let mut items: Vec<_> = nlls.iter_mut().zip(records.chunks_mut(rec)).collect();
            par_each(pool, &mut items, |((i, nll), record)| {
                let norm = normalize(kernels, rows[*i]);
                *nll = norm.nll(rows[*i], target(*i));
                quantize_row(rows[*i], &norm, record);
            });
        } else {
            par_each(pool, &mut nlls, |(i, nll)| *nll = normalize(kernels, rows[*i]).nll(rows[*i], target(*i)));
        }
        nlls.iter().for_each(|&(_, v)| sums.add(v));
        if let Some(w) = &mut writer {
            w.rows(&records)?;
        }
        if p0 + rows.len() == scored_end {
            write!(out, "[{}]{:.4},", chunk + 1, sums.ppl())?;
            out.flush()?;
        }
        Ok(())
    })?;
    writeln!(out)?;
    if let Some(w) = writer {
        w.finish()?;
    }
    match sums.estimate() {
        Some((ppl, err)) => writeln!(out, "Final estimate: PPL = {ppl:.4} +/- {err:.5}")?,
        None => writeln!(out, "Final estimate: PPL = {:.4} (no spread to estimate an error from)", sums.ppl())?,
    }
    Ok(())
}

/// Evaluate the base file's tokens and compare with its log probabilities, position by
/// position; print a line per chunk and the statistics.
fn compare(eval: &Eval, tokens: &[u32], mut base: Reader) -> Result<()> {
    let kernels = eval.model.kernels();
    let (n_ctx, scored_end) = (eval.plan.n_ctx, eval.plan.n_ctx - 1);
    let rec = record_len(eval.model.config().vocab_size);
    let mut sums = KldSums::default();
    let mut records: Vec<u16> = Vec::new();
    let mut results: Vec<(usize, score::Compared)> = Vec::new();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", KldSums::HEADER)?;
    eval.run(tokens, &mut |pool, chunk, p0, rows| {
        base.rows(rows.len(), &mut records)?;
        let target = |i: usize| tokens[chunk * n_ctx + p0 + i + 1] as usize;
        results.clear();
        results.extend((0..rows.len()).map(|i| (i, Default::default())));
        par_each(pool, &mut results, |(i, r)| {
            let norm = normalize(kernels, rows[*i]);
            *r = compare_row(rows[*i], &norm, &records[*i * rec..(*i + 1) * rec], target(*i));
        });
        results.iter().for_each(|(_, r)| sums.add(r));
        if p0 + rows.len() == scored_end {
            writeln!(out, "{}", sums.chunk_line(chunk + 1))?;
        }
        Ok(())
    })?;
    writeln!(out)?;
    match sums.report() {
        Some(report) => write!(out, "{report}")?,
        None => writeln!(out, "(fewer than 100 positions: no statistics)")?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Plan;

    #[test]
    fn chunks_share_a_batch_as_in_llama_perplexity() {
        let p = Plan::new(512, 2048, 10);
        assert_eq!((p.n_seq, p.first), (4, 256));
        assert_eq!(p.pieces, vec![0..256, 256..512]);
        // A batch smaller than a chunk: one chunk at a time, in pieces of the batch.
        let p = Plan::new(512, 200, 3);
        assert_eq!(p.n_seq, 1);
        assert_eq!(p.pieces, vec![0..200, 200..256, 256..456, 456..512]);
        // Not a multiple: one chunk per pass.
        let p = Plan::new(512, 1000, 3);
        assert_eq!((p.n_seq, p.pieces.len()), (1, 2));
    }
}
