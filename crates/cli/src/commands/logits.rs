//! `onebit logits`: the top logits after a prompt, at the last position or at every position,
//! computed as one batch or one token at a time (`--decode`). The JSON form matches the
//! fixtures of `../shared/fixtures`: position i holds the logits after tokens 0..=i.

use anyhow::{Result, bail};
use onebit_model::{LogitsWanted, Scratch};
use serde_json::json;

use super::model_args::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Token ids, comma-separated, used as given (no BOS is added).
    #[arg(long, value_delimiter = ',', required_unless_present = "prompt", conflicts_with = "prompt")]
    pub tokens: Vec<u32>,
    /// Text, tokenized as llama.cpp does (BOS as the model asks, special tokens parsed).
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// How many of the largest logits to print per position.
    #[arg(long, default_value_t = 40)]
    pub top: usize,
    /// Print every position, not only the last.
    #[arg(long)]
    pub all_positions: bool,
    /// Feed the tokens one at a time instead of as one batch.
    #[arg(long)]
    pub decode: bool,
    /// Print `{"positions":[{"top":[[id,logit],...]},...]}`.
    #[arg(long)]
    pub json: bool,
}

pub fn run(mut args: Args) -> Result<()> {
    let model = args.model.load()?;
    if let Some(p) = &args.prompt {
        let tok = onebit_tokenizer::Tokenizer::from_metadata(&model.gguf().metadata())?;
        args.tokens = tok.encode(p, true, true)?;
    }
    if args.tokens.is_empty() {
        bail!("no tokens given");
    }
    let pool = args.model.pool();
    let mut cache = model.new_cache(args.model.ctx(&model))?;
    let mut scratch = Scratch::new();
    let tokens = &args.tokens;
    let lora = args.model.lora.uses()?;
    let mut rows: Vec<Vec<f32>> = Vec::new();
    if args.decode {
        for (i, t) in tokens.iter().enumerate() {
            let want =
                if args.all_positions || i + 1 == tokens.len() { LogitsWanted::Last } else { LogitsWanted::None };
            let out =
                model.forward_one_adapted(&pool, &mut cache, std::slice::from_ref(t), &lora, want, &mut scratch)?;
            if let Some(l) = out.last(0) {
                rows.push(l.to_vec());
            }
        }
    } else {
        let want = if args.all_positions { LogitsWanted::All } else { LogitsWanted::Last };
        let out = model.forward_one_adapted(&pool, &mut cache, tokens, &lora, want, &mut scratch)?;
        rows = out.rows_of(0).map(|(_, l)| l.to_vec()).collect();
    }
    let first = if args.all_positions { 0 } else { tokens.len() - 1 };
    let tops: Vec<Vec<(usize, f32)>> = rows.iter().map(|l| top_k(l, args.top)).collect();
    if args.json {
        let positions: Vec<_> =
            tops.iter().map(|t| json!({"top": t.iter().map(|&(i, v)| json!([i, v])).collect::<Vec<_>>()})).collect();
        println!("{}", json!({ "positions": positions }));
    } else {
        for (i, t) in tops.iter().enumerate() {
            let pos = first + i;
            let line: Vec<String> = t.iter().map(|(id, v)| format!("{id}:{v:.4}")).collect();
            println!("position {pos} (after token {}): {}", tokens[pos], line.join(" "));
        }
    }
    Ok(())
}

/// The `k` largest entries, largest first (ties by lower id).
pub fn top_k(x: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    let k = k.min(x.len());
    let cmp = |a: &usize, b: &usize| x[*b].total_cmp(&x[*a]).then(a.cmp(b));
    if k < idx.len() && k > 0 {
        idx.select_nth_unstable_by(k - 1, cmp);
    }
    idx.truncate(k);
    idx.sort_by(cmp);
    idx.into_iter().map(|i| (i, x[i])).collect()
}
