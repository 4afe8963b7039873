//! `onebit chat`: a conversation in the terminal.
//!
//! A line editor with history (kept in onebit's cache folder) reads each message; a line
//! ending in `\` continues on the next, and `"""` opens and closes a block of lines. `/reset`
//! starts over, `/exit` (or Ctrl-D) leaves. Ctrl-C stops the answer being written, not the
//! program. The conversation stays in the KV cache, so each turn only prefills what is new.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use onebit_engine::{Engine, Event, FinishReason, Flow, GenerateRequest, Scheduler};
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;
use serde_json::Value as Json;

use super::gen_args::{AnswerPrinter, GenArgs};
use super::model_args::{EngineArgs, ModelArgs, start_engine};
use super::resolve::cache_dir;
use super::ui::{Style, Ui};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub gen_args: GenArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
}

const HELP: &str = "Type a message and press Enter. End a line with \\ to continue it, or wrap lines in \"\"\".\n/reset starts a new conversation, /exit (or Ctrl-D) quits, Ctrl-C stops an answer.";

pub fn run(args: Args) -> Result<u8> {
    args.gen_args.check()?;
    let ui = Ui::new(args.gen_args.quiet);
    let (engine, scheduler) = start_engine(&args.model, &args.engine, &ui)?;
    if !engine.has_chat_template() {
        ui.note("note: this model has no chat template; using ChatML");
    }
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed)).context("installing the Ctrl-C handler")?;

    let mut chat = Chat {
        engine: &engine,
        scheduler: &scheduler,
        messages: args.gen_args.system_messages(),
        args: &args.gen_args,
        ui,
        cancel,
    };
    let mut editor = DefaultEditor::new().context("starting the line editor")?;
    let history = cache_dir().map(|d| d.join("chat_history.txt"));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    ui.note(&Style::for_stderr().dim(HELP));
    loop {
        let input = match read_message(&mut editor) {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(e) => return Err(e).context("reading input"),
        };
        match input.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                chat.reset();
                ui.note(&Style::for_stderr().dim("(new conversation)"));
                continue;
            }
            "/help" | "/?" => {
                ui.note(HELP);
                continue;
            }
            _ => {}
        }
        chat.turn(&input)?;
    }
    if let Some(h) = &history {
        if let Some(dir) = h.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = editor.save_history(h);
    }
    Ok(0)
}

/// One message: `Ok(None)` at the end of input.
fn read_message(editor: &mut DefaultEditor) -> rustyline::Result<Option<String>> {
    let mut text = String::new();
    let mut block = false;
    loop {
        let prompt = if text.is_empty() && !block { "> " } else { ". " };
        match editor.readline(prompt) {
            Ok(line) => {
                if line.trim() == "\"\"\"" {
                    if block {
                        break;
                    }
                    block = true;
                    continue;
                }
                if let Some(head) = line.strip_suffix('\\').filter(|_| !block) {
                    text.push_str(head);
                    text.push('\n');
                    continue;
                }
                text.push_str(&line);
                if !block {
                    break;
                }
                text.push('\n');
            }
            Err(ReadlineError::Interrupted) => {
                // Ctrl-C at the prompt drops what was typed.
                text.clear();
                block = false;
                eprintln!("{}", Style::for_stderr().dim("(Ctrl-D or /exit to quit)"));
            }
            Err(ReadlineError::Eof) => return Ok(if text.is_empty() { None } else { Some(text) }),
            Err(e) => return Err(e),
        }
    }
    let _ = editor.add_history_entry(text.as_str());
    Ok(Some(text))
}

/// The conversation. Each turn sends the whole of it; the engine's prefix cache holds what
/// earlier turns computed, so only the new turn is prefilled.
struct Chat<'e> {
    engine: &'e Engine,
    scheduler: &'e Scheduler,
    messages: Vec<Json>,
    args: &'e GenArgs,
    ui: Ui,
    cancel: Arc<AtomicBool>,
}

impl Chat<'_> {
    fn reset(&mut self) {
        self.messages = self.args.system_messages();
    }

    fn turn(&mut self, input: &str) -> Result<()> {
        self.messages.push(onebit_engine::message("user", input));
        let prompt = self.engine.chat_prompt(&self.messages, &self.args.chat_options())?;
        let ids = self.engine.tokenize(&prompt, true)?;
        let req = GenerateRequest {
            sampling: self.args.sampling(),
            max_tokens: self.args.max_tokens(),
            stop: self.args.stop.clone(),
            cancel: Some(Arc::clone(&self.cancel)),
            constraint: self.args.constraint()?,
            ..Default::default()
        };
        self.cancel.store(false, Ordering::Relaxed);
        let mut printer = AnswerPrinter::new(Style::for_stdout(), self.args.no_think);
        let mut out = std::io::stdout().lock();
        let result = self.scheduler.submit(ids, req).and_then(|h| {
            h.wait(|ev| {
                if let Event::Token { text, .. } | Event::Text { text } = ev {
                    let _ = out.write_all(printer.push(text).as_bytes());
                    let _ = out.flush();
                }
                Flow::Continue
            })
        });
        let _ = writeln!(out, "{}", printer.finish());
        drop(out);
        let done = match result {
            Ok(done) => done,
            Err(e) => {
                self.messages.pop();
                return Err(e.into());
            }
        };
        self.messages.push(onebit_engine::message("assistant", &done.text));
        let style = Style::for_stderr();
        if done.finish == FinishReason::Cancelled {
            eprintln!("{}", style.dim("(answer stopped)"));
        }
        if !self.ui.quiet {
            eprintln!("{}", style.dim(&format!("[{}]", super::run::stats(&done))));
        }
        Ok(())
    }
}
