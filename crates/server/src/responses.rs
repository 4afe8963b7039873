//! `POST /v1/responses`: OpenAI's Responses API over the same engine as chat completions, text
//! in and text out. The input (a string, or message items) and `instructions` become chat
//! messages for the model's template; the answer is one `message` output item, whole or streamed
//! as the Responses API's named events.
//!
//! Nothing is stored, so `previous_response_id` is refused rather than silently ignored (the
//! conversation it names would be lost). Unknown fields are ignored as elsewhere, and
//! llama-server's sampling extensions (`top_k`, `min_p`, `seed`, `stop`, ...) pass through, as
//! llama-server's own Responses endpoint passes them on to chat completions.

use std::sync::Arc;

use axum::Json as JsonBody;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use onebit_engine::{ChatOptions, Completion, Event, FinishReason};
use serde::Deserialize;
use serde_json::{Value as Json, json};

use crate::adapter_stream::{self, Out, Translator};
use crate::error::ApiError;
use crate::generate::{Running, unix_now};
use crate::params::{GenFields, LogprobsStyle, parse_json};
use crate::state::AppState;

#[derive(Deserialize)]
struct ResponseFields {
    #[serde(default)]
    input: Option<Json>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    max_output_tokens: Option<i64>,
    #[serde(default)]
    previous_response_id: Option<String>,
}

pub async fn create(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let fields: ResponseFields = parse_json(&headers, &body)?;
    if fields.previous_response_id.is_some() {
        return Err(ApiError::field(
            "previous_response_id",
            "is not supported: this server stores no responses; send the conversation in \"input\"",
        ));
    }
    let max_output_tokens = match fields.max_output_tokens {
        None => None,
        Some(n) if n >= 1 => Some(n),
        Some(n) => return Err(ApiError::field("max_output_tokens", format!("must be at least 1, not {n}"))),
    };
    let gen_fields = parse_json::<GenFields>(&headers, &body)?.sampling_only(max_output_tokens)?;
    let job = gen_fields.generation(LogprobsStyle::Chat, ready.engine.model().config().vocab_size)?;

    let messages = input_messages(fields.instructions.as_deref(), fields.input.as_ref())?;
    let prompt = ready.engine.chat_prompt(&messages, &ChatOptions::default())?;
    let ids = ready.engine.tokenize(&prompt, true)?;

    let id = state.request_id("resp_");
    let shape = Shape {
        msg_id: format!("msg_{}", &id["resp_".len()..]),
        id: id.clone(),
        model: ready.model_id.clone(),
        created_at: unix_now(),
        instructions: fields.instructions,
        max_output_tokens,
        temperature: job.request.sampling.temperature,
        top_p: job.request.sampling.top_p,
    };
    let running = Running::submit(&state, ready, vec![ids], &job, "responses", id)?;
    if job.stream {
        return Ok(adapter_stream::respond(running, Streamed { shape, seq: 0 }, state.config.sse_ping));
    }
    let (choices, running) = running.collect().await?;
    let c = choices[0].completion.as_ref().expect("collect checks every choice");
    running.report(&[c]);
    Ok(JsonBody(shape.finished(c)).into_response())
}

/// `instructions` as a system message, then the input: a string (one user message) or a list
/// of message items whose content is a string or a list of text parts.
fn input_messages(instructions: Option<&str>, input: Option<&Json>) -> Result<Vec<Json>, ApiError> {
    let mut messages = Vec::new();
    if let Some(s) = instructions {
        messages.push(json!({ "role": "system", "content": s }));
    }
    match input {
        None | Some(Json::Null) => return Err(ApiError::field("input", "is required")),
        Some(Json::String(s)) => messages.push(json!({ "role": "user", "content": s })),
        Some(Json::Array(items)) if items.is_empty() => {
            return Err(ApiError::field("input", "must hold at least one item"));
        }
        Some(Json::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                messages.push(input_item(item, i)?);
            }
        }
        Some(_) => return Err(ApiError::field("input", "must be a string or a list of message items")),
    }
    Ok(messages)
}

fn input_item(item: &Json, i: usize) -> Result<Json, ApiError> {
    let field = format!("input[{i}]");
    let obj = item.as_object().ok_or_else(|| ApiError::field(&field, "must be an object"))?;
    match obj.get("type").and_then(Json::as_str) {
        None | Some("message") => {}
        Some(other) => {
            return Err(ApiError::field(&field, format!("items of type '{other}' are not supported (messages only)")));
        }
    }
    let role = match obj.get("role").and_then(Json::as_str) {
        // Templates know `system`; OpenAI's `developer` plays the same part.
        Some("system" | "developer") => "system",
        Some(r @ ("user" | "assistant")) => r,
        Some(r) => return Err(ApiError::field(&format!("{field}.role"), format!("'{r}' is not a role"))),
        None => return Err(ApiError::field(&format!("{field}.role"), "must be a string")),
    };
    let content = match obj.get("content") {
        Some(Json::String(s)) => s.clone(),
        Some(Json::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                let part = || format!("{field}.content[{j}]");
                match (p.get("type").and_then(Json::as_str), p.get("text").and_then(Json::as_str)) {
                    (Some("input_text" | "output_text"), Some(t)) => text.push_str(t),
                    (Some("input_text" | "output_text"), None) => {
                        return Err(ApiError::field(&part(), "a text part needs a \"text\" string"));
                    }
                    (Some(other), _) => {
                        return Err(ApiError::field(
                            &part(),
                            format!("parts of type '{other}' are not supported (text only)"),
                        ));
                    }
                    (None, _) => return Err(ApiError::field(&part(), "must be an object with a \"type\"")),
                }
            }
            text
        }
        _ => return Err(ApiError::field(&format!("{field}.content"), "must be a string or a list of parts")),
    };
    Ok(json!({ "role": role, "content": content }))
}

/// What every object of one response shares (the request's settings are echoed back, as
/// OpenAI does).
struct Shape {
    id: String,
    msg_id: String,
    model: String,
    created_at: u64,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    temperature: f32,
    top_p: f32,
}

impl Shape {
    /// The Response object.
    fn object(&self, status: &str, output: Vec<Json>, usage: Json, incomplete: Json) -> Json {
        let completed_at = if status == "completed" { json!(unix_now()) } else { Json::Null };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": completed_at,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": false,
            "previous_response_id": null,
            "store": false,
            "temperature": decimal(self.temperature),
            "text": { "format": { "type": "text" } },
            "tool_choice": "auto",
            "tools": [],
            "top_p": decimal(self.top_p),
            "truncation": "disabled",
            "usage": usage,
            "metadata": {},
        })
    }

    /// The one output item: the assistant's message.
    fn message(&self, status: &str, content: Vec<Json>) -> Json {
        json!({ "type": "message", "id": self.msg_id, "status": status, "role": "assistant", "content": content })
    }

    /// The whole response of a finished completion.
    fn finished(&self, c: &Completion) -> Json {
        let (status, incomplete) = outcome(c.finish);
        let item = self.message(status, vec![text_part(&c.text)]);
        self.object(status, vec![item], usage(c), incomplete)
    }
}

/// A setting as the client wrote it (`0.95`, not the `0.949999988` of its `f32` widened).
fn decimal(v: f32) -> Json {
    v.to_string().parse::<f64>().map_or(Json::Null, |v| json!(v))
}

fn text_part(text: &str) -> Json {
    json!({ "type": "output_text", "text": text, "annotations": [], "logprobs": [] })
}

/// The response's status: cut short by the token limit (or a full context, which OpenAI has no
/// other word for) is `incomplete`.
fn outcome(f: FinishReason) -> (&'static str, Json) {
    match f {
        FinishReason::Length | FinishReason::Context => ("incomplete", json!({ "reason": "max_output_tokens" })),
        FinishReason::Stop | FinishReason::Cancelled => ("completed", Json::Null),
    }
}

/// The Responses API's usage: `input_tokens` counts the cached ones too, as OpenAI's does.
fn usage(c: &Completion) -> Json {
    let u = c.usage;
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": { "cached_tokens": u.cached_tokens },
        "output_tokens": u.completion_tokens,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

/// A streamed response: every event carries its `type` and a `sequence_number`.
struct Streamed {
    shape: Shape,
    seq: u64,
}

impl Streamed {
    fn send(&mut self, out: &mut Out, kind: &str, mut data: Json) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.send(kind, &data);
    }

    /// Where a text event belongs: the first content part of the first output item.
    fn at(&self) -> Json {
        json!({ "item_id": self.shape.msg_id, "output_index": 0, "content_index": 0 })
    }

    fn text_event(&mut self, out: &mut Out, kind: &str, key: &str, text: &str) {
        let mut data = self.at();
        data[key] = json!(text);
        data["logprobs"] = json!([]);
        self.send(out, kind, data);
    }
}

impl Translator for Streamed {
    fn start(&mut self, out: &mut Out) {
        let response = self.shape.object("in_progress", Vec::new(), Json::Null, Json::Null);
        self.send(out, "response.created", json!({ "response": response }));
        self.send(out, "response.in_progress", json!({ "response": response }));
        let item = self.shape.message("in_progress", Vec::new());
        self.send(out, "response.output_item.added", json!({ "output_index": 0, "item": item }));
        let mut data = self.at();
        data["part"] = text_part("");
        self.send(out, "response.content_part.added", data);
    }

    fn on_event(&mut self, running: &Running, ev: Event, out: &mut Out) {
        match ev {
            Event::Token { text, .. } | Event::Text { text } if !text.is_empty() => {
                self.text_event(out, "response.output_text.delta", "delta", &text);
            }
            Event::Done(Ok(c)) => {
                running.report(&[&c]);
                self.text_event(out, "response.output_text.done", "text", &c.text);
                let mut data = self.at();
                data["part"] = text_part(&c.text);
                self.send(out, "response.content_part.done", data);
                let (status, incomplete) = outcome(c.finish);
                let item = self.shape.message(status, vec![text_part(&c.text)]);
                self.send(out, "response.output_item.done", json!({ "output_index": 0, "item": item }));
                let response = self.shape.object(status, vec![item], usage(&c), incomplete);
                // OpenAI ends a response cut short with `response.incomplete`.
                let last = if status == "completed" { "response.completed" } else { "response.incomplete" };
                self.send(out, last, json!({ "response": response }));
                out.end();
            }
            _ => {}
        }
    }

    fn fail(&mut self, e: &ApiError, out: &mut Out) {
        let code = if e.status.is_server_error() { "server_error" } else { e.kind };
        self.send(out, "error", json!({ "code": code, "message": e.message, "param": null }));
        let mut response = self.shape.object("failed", Vec::new(), Json::Null, Json::Null);
        response["error"] = json!({ "code": code, "message": e.message });
        self.send(out, "response.failed", json!({ "response": response }));
    }
}
