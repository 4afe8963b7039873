//! `onebit`: run extreme low-bit LLMs from GGUF files on the CPU.
//!
//! Every subcommand lives in `commands/`; this file only parses the command line and turns an
//! error into one line on stderr with exit status 1.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "onebit", version, about = "Fast CPU inference for 1-bit, ternary and quantized GGUF models")]
struct Cli {
    /// Log more (-v: info, -vv: debug; `serve` logs every request at info already).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Answer a prompt, streaming the text (through the chat template unless --raw).
    Run(commands::run::Args),
    /// Talk with a model in the terminal; the conversation stays in the cache between turns.
    Chat(commands::chat::Args),
    /// Describe a GGUF file: architecture, hyperparameters, tokenizer, tensors and sizes.
    Inspect(commands::inspect::Args),
    /// Print the top logits after some tokens (as one batch, or one token at a time).
    Logits(commands::logits::Args),
    /// Print the token ids of text, with the model's own tokenizer.
    Tokenize(commands::tokenize::Args),
    /// Render a chat request through a chat template and print the prompt.
    Template(commands::template::Args),
    /// Measure prompt processing (pp) and generation (tg) speed, llama-bench style.
    ///
    /// With --spec or --model-draft, each tg test decodes greedily after a real prompt (-f, or
    /// a built-in request to copy ~1,000 tokens of Moby-Dick), without and then with
    /// speculation, and reports the drafted tokens kept.
    Bench(commands::bench::Args),
    /// Serve the OpenAI API (and a chat page) over HTTP, llama-server style.
    Serve(commands::serve::Args),
    /// Measure many sequences served at once through the engine, llama-batched-bench style.
    BatchedBench(commands::batched_bench::Args),
    /// Perplexity of a text, and KL divergence from a base model, llama-perplexity style.
    Perplexity(commands::perplexity::Args),
    /// Quantize a model (F16/BF16/F32 GGUF in), byte for byte as llama-quantize does.
    Quantize(commands::quantize::Args),
    /// Convert a Hugging Face model folder to GGUF, as llama.cpp's convert_hf_to_gguf.py does.
    Convert(commands::convert::Args),
}

fn main() -> ExitCode {
    // Like other Unix tools, stop quietly when the reader of our output goes away (`| head`).
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of one signal before any threads start.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // A bug must not look like a crash report either: one line, then a distinct status.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("onebit: internal error{at}: {msg} (please report this)");
    }));
    let cli = Cli::parse_from(llama_flags(std::env::args_os()));
    // A server's log is its record of requests, with times: it shows them unless asked for less.
    let serving = matches!(cli.command, Command::Serve(_));
    let level = match cli.verbose + u8::from(serving) {
        0 => tracing::Level::WARN,
        1 => tracing::Level::INFO,
        _ => tracing::Level::DEBUG,
    };
    let log = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_max_level(level)
        .with_target(false);
    if serving {
        log.init();
    } else {
        log.without_time().init();
    }
    let ok = |r: anyhow::Result<()>| r.map(|()| 0u8);
    let result = match cli.command {
        Command::Run(args) => commands::run::run(args),
        Command::Chat(args) => commands::chat::run(args),
        Command::Inspect(args) => ok(commands::inspect::run(args)),
        Command::Logits(args) => ok(commands::logits::run(args)),
        Command::Tokenize(args) => ok(commands::tokenize::run(args)),
        Command::Template(args) => ok(commands::template::run(args)),
        Command::Bench(args) => ok(commands::bench::run(args)),
        Command::BatchedBench(args) => ok(commands::batched_bench::run(args)),
        Command::Perplexity(args) => ok(commands::perplexity::run(args)),
        Command::Serve(args) => commands::serve::run(args),
        Command::Quantize(args) => ok(commands::quantize::run(args)),
        Command::Convert(args) => ok(commands::convert::run(args)),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// llama.cpp spells some options with one dash and several letters (`-npp 128`, `-np 4`);
/// they become the long options of the same name, which clap understands.
fn llama_flags(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    const MULTI: [&str; 5] = ["-npp", "-ntg", "-npl", "-pps", "-np"];
    args.map(|a| match a.to_str() {
        Some(s) if MULTI.contains(&s) => format!("-{s}").into(),
        _ => a,
    })
    .collect()
}

/// The error and its causes on one line.
fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    }
    parts.join(": ").replace('\n', " ")
}
