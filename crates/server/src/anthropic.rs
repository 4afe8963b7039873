//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API over the
//! same engine as chat completions, text in and text out, whole or streamed as Anthropic's named
//! events, so that Anthropic's SDKs and tools built on them can use a local model.
//!
//! Choices made where Anthropic and llama-server differ, or where this server can do less:
//! - `max_tokens` is required by Anthropic; like llama-server, a request without it is served
//!   with a limit of [`DEFAULT_MAX_TOKENS`] rather than refused.
//! - `stop_reason` is Anthropic's: `stop_sequence` (with the matched `stop_sequence`) when one of
//!   `stop_sequences` ended the answer (llama-server says `end_turn` there), `max_tokens`, and
//!   `model_context_window_exceeded` for a full context.
//! - Usage counts as Anthropic does: `input_tokens` are the prompt tokens computed for this
//!   request, `cache_read_input_tokens` those taken from the prefix cache.
//! - Errors keep llama-server's object (`{"error":{"code","message","type"}}`, as its
//!   `/v1/messages` answers) and add Anthropic's top-level `"type":"error"`, so the body is
//!   Anthropic's error shape as well.
//! - Content is text only: `thinking` blocks a client sends back are dropped (this server never
//!   writes them, and they are not part of the conversation's text); images and tool blocks
//!   are refused with the block's path.

use std::sync::Arc;

use axum::Json as JsonBody;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use onebit_engine::{ChatOptions, Completion, Engine, Event, FinishReason};
use serde::Deserialize;
use serde_json::{Value as Json, json};

use crate::adapter_stream::{self, Out, Translator};
use crate::error::ApiError;
use crate::generate::Running;
use crate::params::{GenFields, LogprobsStyle, normalize_messages, parse_json};
use crate::state::{AppState, Ready};

/// The limit when a request names none (llama-server's for this endpoint).
pub const DEFAULT_MAX_TOKENS: i64 = 4096;

#[derive(Deserialize)]
struct MessageFields {
    #[serde(default)]
    system: Option<Json>,
    #[serde(default)]
    messages: Option<Vec<Json>>,
    #[serde(default)]
    stop_sequences: Option<Json>,
}

/// An error in Anthropic's shape (see the module's notes).
pub struct AnthropicError(ApiError);

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let e = self.0;
        let mut body = e.body();
        body["type"] = json!("error");
        e.respond_with(body)
    }
}

pub async fn messages(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, AnthropicError> {
    answer(&state, &headers, &body).await.map_err(AnthropicError)
}

pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, AnthropicError> {
    let count = || -> Result<Response, ApiError> {
        let ready = state.ready()?;
        let fields: MessageFields = parse_json(&headers, &body)?;
        let ids = prompt_ids(ready, &fields)?;
        Ok(JsonBody(json!({ "input_tokens": ids.len() })).into_response())
    };
    count().map_err(AnthropicError)
}

async fn answer(state: &Arc<AppState>, headers: &HeaderMap, body: &[u8]) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let fields: MessageFields = parse_json(headers, body)?;
    let gen_fields: GenFields = parse_json(headers, body)?;
    let max_tokens = gen_fields.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    if max_tokens < 1 {
        return Err(ApiError::field("max_tokens", format!("must be at least 1, not {max_tokens}")));
    }
    let mut gen_fields = gen_fields.sampling_only(Some(max_tokens))?;
    let named_stops = match &fields.stop_sequences {
        None | Some(Json::Null) => false,
        Some(Json::Array(_)) => true,
        Some(_) => return Err(ApiError::field("stop_sequences", "must be a list of strings")),
    };
    if named_stops {
        gen_fields.stop = fields.stop_sequences.clone();
    }
    let vocab = ready.engine.model().config().vocab_size;
    let job = gen_fields.generation(LogprobsStyle::Chat, vocab).map_err(|e| match e.message.strip_prefix("stop:") {
        // The checks of `stop` speak of the field the client actually sent.
        Some(rest) if named_stops => ApiError { message: format!("stop_sequences:{rest}"), ..e },
        _ => e,
    })?;
    let ids = prompt_ids(ready, &fields)?;

    let id = state.request_id("msg_");
    let shape = Shape { id: id.clone(), model: ready.model_id.clone(), stops: job.request.stop.clone() };
    let running = Running::submit(state, ready, vec![ids], &job, "messages", id)?;
    if job.stream {
        let streamed = Streamed { shape, engine: Arc::clone(&ready.engine), started: false };
        return Ok(adapter_stream::respond(running, streamed, state.config.sse_ping));
    }
    let (choices, running) = running.collect().await?;
    let c = choices[0].completion.as_ref().expect("collect checks every choice");
    running.report(&[c]);
    let (stop_reason, stop_sequence) = shape.stop(c, &ready.engine);
    Ok(JsonBody(json!({
        "id": shape.id,
        "type": "message",
        "role": "assistant",
        "model": shape.model,
        "content": [{ "type": "text", "text": c.text }],
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage(c),
    }))
    .into_response())
}

/// `system` (a string or a list of text blocks) as the first message, then `messages`, through
/// the model's chat template.
fn prompt_ids(ready: &Ready, fields: &MessageFields) -> Result<Vec<u32>, ApiError> {
    let mut messages = Vec::new();
    match &fields.system {
        None | Some(Json::Null) => {}
        Some(Json::String(s)) => messages.push(json!({ "role": "system", "content": s })),
        Some(Json::Array(blocks)) => messages.push(json!({ "role": "system", "content": blocks })),
        Some(_) => return Err(ApiError::field("system", "must be a string or a list of text blocks")),
    }
    let given = match &fields.messages {
        None => return Err(ApiError::field("messages", "is required")),
        Some(list) if list.is_empty() => return Err(ApiError::field("messages", "must hold at least one message")),
        Some(list) => list,
    };
    let offset = messages.len();
    for m in given {
        messages.push(without_thinking(m));
    }
    // Anthropic's text blocks are OpenAI's text parts: the same checks join them, with each
    // fault's path shifted back to the client's own fields.
    let messages = normalize_messages(&messages).map_err(|e| {
        let message = match (offset, e.message.strip_prefix("messages[0]")) {
            (1, Some(rest)) => format!("system{}", rest.strip_prefix(".content").unwrap_or(rest)),
            _ => shift_index(&e.message, offset),
        };
        ApiError { message, ..e }
    })?;
    Ok(ready.engine.tokenize(&ready.engine.chat_prompt(&messages, &ChatOptions::default())?, true)?)
}

/// A message without the `thinking` blocks an Anthropic client may send back.
fn without_thinking(m: &Json) -> Json {
    let mut m = m.clone();
    if let Some(Json::Array(blocks)) = m.get_mut("content") {
        blocks.retain(|b| !matches!(b.get("type").and_then(Json::as_str), Some("thinking" | "redacted_thinking")));
    }
    m
}

/// `messages[N]...` → `messages[N - offset]...` (the system message came first).
fn shift_index(message: &str, offset: usize) -> String {
    let shifted = message
        .strip_prefix("messages[")
        .and_then(|rest| rest.split_once(']'))
        .and_then(|(n, rest)| Some((n.parse::<usize>().ok()?.checked_sub(offset)?, rest)));
    match shifted {
        Some((n, rest)) => format!("messages[{n}]{rest}"),
        None => message.to_string(),
    }
}

struct Shape {
    id: String,
    model: String,
    /// The stop strings the request set, to tell which one ended the answer.
    stops: Vec<String>,
}

impl Shape {
    /// `stop_reason` and `stop_sequence`. The engine reports an end-of-generation token and a
    /// stop string alike as `Stop`; a stop string shows in the decoded tokens (the answer's
    /// text ends just before it), an end token does not (it is not among the ids).
    fn stop(&self, c: &Completion, engine: &Engine) -> (&'static str, Option<String>) {
        match c.finish {
            FinishReason::Length => ("max_tokens", None),
            FinishReason::Context => ("model_context_window_exceeded", None),
            FinishReason::Cancelled => ("end_turn", None),
            FinishReason::Stop if self.stops.is_empty() => ("end_turn", None),
            FinishReason::Stop => {
                let full = engine.tokenizer().decode(&c.ids, false);
                // The earliest stop string ends the answer; of two at one place the shorter
                // one is complete first.
                let hit = self.stops.iter().filter_map(|s| full.find(s.as_str()).map(|at| (at, s.len(), s))).min();
                match hit {
                    Some((_, _, s)) => ("stop_sequence", Some(s.clone())),
                    None => ("end_turn", None),
                }
            }
        }
    }
}

/// Anthropic's usage: `input_tokens` excludes the tokens read from the prefix cache.
fn usage(c: &Completion) -> Json {
    let u = c.usage;
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.completion_tokens,
    })
}

/// A streamed message. `message_start` waits for the prompt to be computed, so that its usage
/// can say how much of the prompt came from the cache.
struct Streamed {
    shape: Shape,
    engine: Arc<Engine>,
    started: bool,
}

impl Streamed {
    fn begin(&mut self, out: &mut Out, prompt_tokens: usize, cached: usize) {
        let message = json!({
            "id": self.shape.id,
            "type": "message",
            "role": "assistant",
            "model": self.shape.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": { "input_tokens": prompt_tokens - cached, "cache_read_input_tokens": cached, "output_tokens": 0 },
        });
        out.send("message_start", &json!({ "type": "message_start", "message": message }));
        let block = json!({ "type": "text", "text": "" });
        out.send("content_block_start", &json!({ "type": "content_block_start", "index": 0, "content_block": block }));
        out.send("ping", &json!({ "type": "ping" }));
        self.started = true;
    }
}

impl Translator for Streamed {
    fn start(&mut self, _out: &mut Out) {}

    fn on_event(&mut self, running: &Running, ev: Event, out: &mut Out) {
        match ev {
            Event::Prefilled { prompt_tokens, cached } if !self.started => self.begin(out, prompt_tokens, cached),
            Event::Token { text, .. } | Event::Text { text } if !text.is_empty() => {
                let delta = json!({ "type": "text_delta", "text": text });
                out.send("content_block_delta", &json!({ "type": "content_block_delta", "index": 0, "delta": delta }));
            }
            Event::Done(Ok(c)) => {
                running.report(&[&c]);
                if !self.started {
                    self.begin(out, c.usage.prompt_tokens, c.usage.cached_tokens);
                }
                out.send("content_block_stop", &json!({ "type": "content_block_stop", "index": 0 }));
                let (stop_reason, stop_sequence) = self.shape.stop(&c, &self.engine);
                out.send(
                    "message_delta",
                    &json!({
                        "type": "message_delta",
                        "delta": { "stop_reason": stop_reason, "stop_sequence": stop_sequence },
                        "usage": usage(&c),
                    }),
                );
                out.send("message_stop", &json!({ "type": "message_stop" }));
                out.end();
            }
            _ => {}
        }
    }

    fn fail(&mut self, e: &ApiError, out: &mut Out) {
        let mut body = e.body();
        body["type"] = json!("error");
        out.send("error", &body);
    }
}
