//! Options shared by `run` and `chat`: sampling, stop strings, the system prompt, thinking, the
//! answer's grammar (`--json-schema`, `--grammar`, `--json-object`); and the display of a streamed answer (a Qwen3-style `<think>` block dimmed or hidden).

use std::path::PathBuf;

use anyhow::Context;
use onebit_engine::{ChatOptions, Constraint, Grammar, SamplingParams};
use serde_json::Value as Json;

use super::ui::Style;

#[derive(clap::Args, Clone, Debug)]
pub struct GenArgs {
    /// Tokens to generate at most (-1: until the model stops or the context is full).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// Sampling temperature (0: greedy).
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the most likely tokens up to this total probability (1: all).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the most likely one (0: none).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalize repeats of recent tokens (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Lower the logits of tokens seen recently by this much (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Lower the logits of recent tokens by this much per occurrence (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Seed for sampling, to reproduce an answer [default: random].
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// A system prompt for the chat template.
    #[arg(long)]
    pub system: Option<String>,
    /// For models that think first (Qwen3): turn thinking off and hide any of it.
    #[arg(long)]
    pub no_think: bool,
    /// Print only the answer: no statistics, no progress.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Make the answer JSON valid under the JSON schema in FILE.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["grammar", "json_object"])]
    pub json_schema: Option<PathBuf>,
    /// Make the answer follow the grammar in FILE: GBNF (as llama.cpp's --grammar-file), or
    /// llguidance's Lark when the file starts with `%llguidance`.
    #[arg(long, value_name = "FILE", conflicts_with = "json_object")]
    pub grammar: Option<PathBuf>,
    /// Make the answer a JSON object.
    #[arg(long)]
    pub json_object: bool,
}

impl GenArgs {
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_last_n: self.repeat_last_n,
            logit_bias: Vec::new(),
            seed: self.seed,
        }
    }

    /// Check the values before any work, with the server's rules, naming the flag at fault.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.n_predict < -1 {
            anyhow::bail!("-n/--n-predict must be -1 (no limit) or at least 0, not {}", self.n_predict);
        }
        self.sampling().validate().map_err(|e| {
            let flag = match e.field {
                "temperature" => "--temp".to_string(),
                f => format!("--{}", f.replace('_', "-")),
            };
            anyhow::anyhow!("{flag}: {}", e.reason)
        })
    }

    /// The answer's constraint, from `--json-schema`, `--grammar` or `--json-object` (the
    /// files read and the schema parsed now; the engine compiles it when the request is sent).
    pub fn constraint(&self) -> anyhow::Result<Option<Constraint>> {
        let read = |p: &PathBuf, flag: &str| {
            std::fs::read_to_string(p).with_context(|| format!("{flag}: reading {}", p.display()))
        };
        let grammar = if let Some(p) = &self.json_schema {
            let schema = serde_json::from_str(&read(p, "--json-schema")?)
                .with_context(|| format!("--json-schema: {} is not JSON", p.display()))?;
            Grammar::JsonSchema(schema)
        } else if let Some(p) = &self.grammar {
            Grammar::from_source(read(p, "--grammar")?)
        } else if self.json_object {
            Grammar::JsonObject
        } else {
            return Ok(None);
        };
        Ok(Some(Constraint::new(grammar)))
    }

    pub fn max_tokens(&self) -> Option<usize> {
        usize::try_from(self.n_predict).ok()
    }

    pub fn chat_options(&self) -> ChatOptions {
        let mut extra = serde_json::Map::new();
        if self.no_think {
            extra.insert("enable_thinking".into(), Json::Bool(false));
        }
        ChatOptions { extra }
    }

    /// The conversation's opening messages.
    pub fn system_messages(&self) -> Vec<Json> {
        self.system.iter().map(|s| onebit_engine::message("system", s)).collect()
    }
}

/// Streams an answer to a writer, showing a `<think>…</think>` block dimmed, or not at all.
pub struct AnswerPrinter {
    style: Style,
    hide_thinking: bool,
    thinking: bool,
    /// Text held back because it may be the start of a tag.
    pending: String,
    /// Only leading whitespace is swallowed after a hidden block.
    after_hidden: bool,
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

impl AnswerPrinter {
    pub fn new(style: Style, hide_thinking: bool) -> AnswerPrinter {
        AnswerPrinter { style, hide_thinking, thinking: false, pending: String::new(), after_hidden: false }
    }

    /// Format a piece of streamed text for display.
    pub fn push(&mut self, text: &str) -> String {
        self.pending.push_str(text);
        let mut out = String::new();
        loop {
            let tag = if self.thinking { CLOSE } else { OPEN };
            if let Some(at) = self.pending.find(tag) {
                let before: String = self.pending.drain(..at).collect();
                self.pending.drain(..tag.len());
                self.emit(&before, &mut out);
                self.switch(&mut out);
                continue;
            }
            // Keep a possible partial tag back.
            let keep = (1..tag.len()).rev().find(|&n| self.pending.ends_with(&tag[..n])).unwrap_or(0);
            let cut = self.pending.len() - keep;
            if self.pending.is_char_boundary(cut) {
                let now: String = self.pending.drain(..cut).collect();
                self.emit(&now, &mut out);
            }
            return out;
        }
    }

    /// Whatever is still held back, at the end.
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        let mut out = String::new();
        self.emit(&rest, &mut out);
        if self.thinking && !self.hide_thinking {
            out.push_str(self.style.reset());
        }
        out
    }

    fn emit(&mut self, text: &str, out: &mut String) {
        if self.thinking && self.hide_thinking {
            return;
        }
        let text = if self.after_hidden { text.trim_start() } else { text };
        if !text.is_empty() {
            self.after_hidden = false;
        }
        out.push_str(text);
    }

    fn switch(&mut self, out: &mut String) {
        self.thinking = !self.thinking;
        if self.hide_thinking {
            self.after_hidden = !self.thinking;
            return;
        }
        if self.thinking {
            out.push_str(self.style.dim_start());
            out.push_str(OPEN);
        } else {
            out.push_str(CLOSE);
            out.push_str(self.style.reset());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(pieces: &[&str], hide: bool) -> String {
        let mut p = AnswerPrinter::new(Style { color: true }, hide);
        let mut out: String = pieces.iter().map(|t| p.push(t)).collect();
        out.push_str(&p.finish());
        out
    }

    #[test]
    fn thinking_is_dimmed_or_hidden() {
        let pieces = ["<th", "ink>", "hmm, ", "2+2</", "think>", "\n\n", "It is 4."];
        assert_eq!(show(&pieces, false), "\x1b[2m<think>hmm, 2+2</think>\x1b[0m\n\nIt is 4.");
        assert_eq!(show(&pieces, true), "It is 4.");
        assert_eq!(show(&["a < b, <thin", "g>"], true), "a < b, <thing>");
    }
}
