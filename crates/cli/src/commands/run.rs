//! `onebit run`: answer one prompt, streaming the text to stdout.
//!
//! The prompt comes from `-p`, `-f` or standard input. With a chat template it is sent as a
//! user message (after `--system`, if given); `--raw` sends it as plain text. Afterwards the
//! token counts and speeds go to stderr, or everything goes to stdout as one JSON object with
//! `--json`. Ctrl-C stops the answer and exits with status 130.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use onebit_engine::{Completion, Event, FinishReason, Flow, GenerateRequest};
use serde_json::json;

use super::gen_args::{AnswerPrinter, GenArgs};
use super::model_args::{EngineArgs, ModelArgs, start_engine};
use super::ui::{Style, Ui};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt.
    #[arg(short = 'p', long, conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Send the prompt as it is, without the chat template (special-token text such as
    /// `<|im_start|>` still becomes special tokens, as in llama-completion).
    #[arg(long)]
    pub raw: bool,
    /// Print one JSON object (text, token ids, counts, timings) instead of streaming.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub gen_args: GenArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Exit status after Ctrl-C (128 + SIGINT), as shells expect.
pub const INTERRUPTED: u8 = 130;

pub fn run(args: Args) -> Result<u8> {
    args.gen_args.check()?;
    let ui = Ui::new(args.gen_args.quiet || args.json);
    let prompt = read_prompt(&args)?;
    let constraint = args.gen_args.constraint()?;
    let (engine, scheduler) = start_engine(&args.model, &args.engine, &ui)?;
    let text = if !args.raw && engine.has_chat_template() {
        let mut messages = args.gen_args.system_messages();
        messages.push(onebit_engine::message("user", &prompt));
        engine.chat_prompt(&messages, &args.gen_args.chat_options())?
    } else {
        prompt
    };
    // Special-token text becomes special tokens in a raw prompt too, as in llama-completion:
    // a raw prompt is how a user writes their own template.
    let ids = engine.tokenize(&text, true)?;

    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed)).context("installing the Ctrl-C handler")?;
    let req = GenerateRequest {
        sampling: args.gen_args.sampling(),
        max_tokens: args.gen_args.max_tokens(),
        stop: args.gen_args.stop.clone(),
        cancel: Some(Arc::clone(&cancel)),
        constraint,
        ..Default::default()
    };
    let mut printer = AnswerPrinter::new(Style::for_stdout(), args.gen_args.no_think);
    let mut stdout = std::io::stdout().lock();
    let done = scheduler.submit(ids, req)?.wait(|ev| {
        let text = match ev {
            Event::Token { text, .. } | Event::Text { text } => text,
            _ => return Flow::Continue,
        };
        if !args.json {
            let shown = printer.push(text);
            // A closed stdout (`| head`) ends the answer rather than failing.
            if stdout.write_all(shown.as_bytes()).and_then(|_| stdout.flush()).is_err() {
                return Flow::Stop;
            }
        }
        Flow::Continue
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&report(&done))?);
    } else {
        let _ = writeln!(stdout, "{}", printer.finish());
        drop(stdout);
        if !ui.quiet {
            eprintln!("{}", Style::for_stderr().dim(&stats(&done)));
        }
    }
    Ok(if done.finish == FinishReason::Cancelled && cancel.load(Ordering::Relaxed) { INTERRUPTED } else { 0 })
}

fn read_prompt(args: &Args) -> Result<String> {
    if let Some(p) = &args.prompt {
        return Ok(p.clone());
    }
    if let Some(f) = &args.file {
        return std::fs::read_to_string(f).with_context(|| format!("reading the prompt from {}", f.display()));
    }
    if std::io::stdin().is_terminal() {
        bail!("no prompt: give one with -p TEXT or -f FILE, or pipe it in");
    }
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).context("reading the prompt from standard input")?;
    if s.trim().is_empty() {
        bail!("the prompt on standard input is empty");
    }
    Ok(s)
}

/// The line printed after an answer.
pub fn stats(c: &Completion) -> String {
    let u = &c.usage;
    let reused = if u.cached_tokens > 0 { format!(" ({} cached)", u.cached_tokens) } else { String::new() };
    let drafts = match c.acceptance_rate() {
        Some(r) => format!(", drafts {}/{} kept ({:.0} %)", c.accepted, c.drafted, r * 100.0),
        None => String::new(),
    };
    format!(
        "prompt: {} tokens{reused}, {:.1} tok/s | generated: {} tokens, {:.1} tok/s{drafts}{}",
        u.prompt_tokens,
        c.prefill_rate(),
        u.completion_tokens,
        c.decode_rate(),
        match c.finish {
            FinishReason::Length => " (token limit)",
            FinishReason::Context => " (context full)",
            FinishReason::Cancelled => " (interrupted)",
            FinishReason::Stop => "",
        }
    )
}

fn report(c: &Completion) -> serde_json::Value {
    json!({
        "text": c.text,
        "ids": c.ids,
        "finish_reason": c.finish,
        "prompt_tokens": c.usage.prompt_tokens,
        "cached_tokens": c.usage.cached_tokens,
        "completion_tokens": c.usage.completion_tokens,
        "seed": c.seed,
        "drafted_tokens": c.drafted,
        "accepted_tokens": c.accepted,
        "timings": {
            "queue_seconds": c.timings.queue,
            "prefill_seconds": c.timings.prefill,
            "first_token_seconds": c.timings.first_token,
            "decode_seconds": c.timings.decode,
            "prefill_tokens_per_second": c.prefill_rate(),
            "decode_tokens_per_second": c.decode_rate(),
        },
    })
}
