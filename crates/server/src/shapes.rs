//! The JSON shapes of OpenAI's chat and text completions, whole and as streamed chunks, with
//! their two logprobs formats. One [`Shape`] value knows the request's id, model and kind.

use onebit_engine::{Completion, TokenLogprobs};
use onebit_tokenizer::Tokenizer;
use serde_json::{Value as Json, json};

use crate::chat_output::{self, OutputPlan};
use crate::generate::finish_reason;
use crate::params::Generation;
use crate::state::Ready;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Text,
}

/// What every object of one answer shares.
pub struct Shape {
    pub kind: Kind,
    pub id: String,
    pub model: String,
    pub created: u64,
    /// Whether logprobs go into the answer.
    pub logprobs: bool,
    /// How the model's text becomes a chat message (none: all of it is `content`).
    pub output: Option<OutputPlan>,
}

pub const FINGERPRINT: &str = concat!("onebit-", env!("CARGO_PKG_VERSION"));

impl Shape {
    pub fn new(kind: Kind, id: String, ready: &Ready, job: &Generation, output: Option<OutputPlan>) -> Shape {
        let created = crate::generate::unix_now();
        Shape { kind, id, model: ready.model_id.clone(), created, logprobs: job.logprobs, output }
    }

    /// The whole answer (not streamed).
    pub fn response(
        &self,
        tok: &Tokenizer,
        choices: &[(&Completion, &[TokenLogprobs])],
        usage: Json,
        timings: Json,
    ) -> Json {
        let choices: Vec<Json> = choices
            .iter()
            .enumerate()
            .map(|(i, (c, lps))| {
                let logprobs = if self.logprobs { self.logprobs_json(tok, lps, 0) } else { Json::Null };
                let finish = finish_reason(c.finish);
                match (self.kind, &self.output) {
                    (Kind::Chat, None) => json!({
                        "index": i,
                        "message": { "role": "assistant", "content": c.text },
                        "logprobs": logprobs,
                        "finish_reason": finish,
                    }),
                    (Kind::Chat, Some(plan)) => {
                        let m = plan.message(&c.text);
                        let finish = chat_output::finish_with(!m.tool_calls.is_empty(), finish);
                        json!({
                            "index": i,
                            "message": chat_output::message_json(&m),
                            "logprobs": logprobs,
                            "finish_reason": finish,
                        })
                    }
                    (Kind::Text, _) => {
                        json!({ "index": i, "text": c.text, "logprobs": logprobs, "finish_reason": finish })
                    }
                }
            })
            .collect();
        let object = match self.kind {
            Kind::Chat => "chat.completion",
            Kind::Text => "text_completion",
        };
        let mut whole = self.frame(object, choices);
        whole["usage"] = usage;
        whole["timings"] = timings;
        whole
    }

    /// A streamed chunk with one choice's delta.
    pub fn chunk(&self, index: usize, text: Option<&str>, logprobs: Json, finish: Option<&str>) -> Json {
        match self.kind {
            Kind::Chat => {
                let delta = match text {
                    Some(t) => json!({ "content": t }),
                    None => json!({}),
                };
                self.delta_chunk(index, delta, logprobs, finish)
            }
            Kind::Text => {
                let choice = json!({ "index": index, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish });
                self.envelope(vec![choice])
            }
        }
    }

    /// A streamed chat chunk with one choice's `delta` object.
    pub fn delta_chunk(&self, index: usize, delta: Json, logprobs: Json, finish: Option<&str>) -> Json {
        self.envelope(vec![json!({ "index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish })])
    }

    /// The first chunk of a chat choice: the role.
    pub fn role_chunk(&self, index: usize) -> Json {
        let choice = json!({ "index": index, "delta": { "role": "assistant", "content": "" }, "logprobs": null, "finish_reason": null });
        self.envelope(vec![choice])
    }

    /// A streamed chunk around `choices`.
    pub fn envelope(&self, choices: Vec<Json>) -> Json {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text => "text_completion",
        };
        self.frame(object, choices)
    }

    /// What every object of the answer carries, around `choices`.
    fn frame(&self, object: &str, choices: Vec<Json>) -> Json {
        json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
        })
    }

    /// Logprobs of some tokens in this kind's format; `offset` is where their text starts in
    /// the answer (the legacy format's `text_offset`).
    pub fn logprobs_json(&self, tok: &Tokenizer, lps: &[TokenLogprobs], offset: usize) -> Json {
        match self.kind {
            Kind::Chat => json!({ "content": lps.iter().map(|lp| chat_entry(tok, lp)).collect::<Vec<_>>() }),
            Kind::Text => {
                let mut at = offset;
                let mut offsets = Vec::with_capacity(lps.len());
                for lp in lps {
                    offsets.push(at);
                    at += piece(tok, lp.id).len();
                }
                json!({
                    "tokens": lps.iter().map(|lp| piece(tok, lp.id)).collect::<Vec<_>>(),
                    "token_logprobs": lps.iter().map(|lp| lp.logprob).collect::<Vec<_>>(),
                    "top_logprobs": lps.iter().map(|lp| {
                        lp.top.iter().map(|&(id, l)| (piece(tok, id), json!(l))).collect::<serde_json::Map<_, _>>()
                    }).collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
        }
    }
}

fn piece(tok: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(tok.piece(id, true)).into_owned()
}

fn chat_entry(tok: &Tokenizer, lp: &TokenLogprobs) -> Json {
    let alt = |id: u32, l: f32| {
        let bytes = tok.piece(id, true);
        json!({ "token": String::from_utf8_lossy(bytes), "logprob": l, "bytes": bytes })
    };
    let mut entry = alt(lp.id, lp.logprob);
    entry["top_logprobs"] = Json::Array(lp.top.iter().map(|&(id, l)| alt(id, l)).collect());
    entry
}
