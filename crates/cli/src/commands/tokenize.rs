//! `onebit tokenize`: token ids (and pieces) of text, from a model's or a vocabulary file's
//! own tokenizer. Only the metadata is read; vocabulary-only GGUF files work.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use onebit_gguf::GgufModel;
use onebit_tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model or vocabulary file.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Treat special-token text (`<|im_start|>`) as plain text.
    #[arg(long)]
    pub no_special: bool,
    /// Add BOS (and EOS) as the vocabulary asks.
    #[arg(long)]
    pub add_bos: bool,
    /// Print a JSON array of ids.
    #[arg(long)]
    pub json: bool,
    /// A JSON file holding an array of strings; prints a JSON array of id arrays.
    #[arg(long, value_name = "FILE", conflicts_with = "text")]
    pub batch: Option<PathBuf>,
    /// The text (read from stdin when absent).
    pub text: Option<String>,
}

pub fn load(path: &PathBuf) -> Result<Tokenizer> {
    let file = GgufModel::open(path)?;
    Tokenizer::from_metadata(&file.metadata()).with_context(|| format!("reading the tokenizer of {}", path.display()))
}

pub fn run(args: Args) -> Result<()> {
    let tok = load(&args.model)?;
    let encode = |text: &str| tok.encode(text, args.add_bos, !args.no_special);
    if let Some(batch) = &args.batch {
        let raw = std::fs::read_to_string(batch).with_context(|| format!("reading {}", batch.display()))?;
        let texts: Vec<String> = serde_json::from_str(&raw)
            .with_context(|| format!("{}: expected a JSON array of strings", batch.display()))?;
        let all = texts.iter().map(|t| encode(t)).collect::<Result<Vec<_>, _>>()?;
        println!("{}", serde_json::to_string(&all)?);
        return Ok(());
    }
    let text = match &args.text {
        Some(t) => t.clone(),
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).context("reading text from stdin")?;
            s
        }
    };
    if text.is_empty() && !args.add_bos {
        bail!("no text given (pass TEXT or pipe it on stdin)");
    }
    let ids = encode(&text)?;
    if args.json {
        println!("{}", serde_json::to_string(&ids)?);
    } else {
        for id in ids {
            println!("{id:>8} -> {:?}", String::from_utf8_lossy(tok.piece(id, true)));
        }
    }
    Ok(())
}
