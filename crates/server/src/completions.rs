//! `POST /v1/chat/completions` and `POST /v1/completions`: parse, build the prompt, queue it,
//! and answer whole or streamed. Everything else happens in the engine.

use std::sync::Arc;

use axum::Json as JsonBody;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use onebit_engine::{ChatOptions, Completion, TokenLogprobs};
use serde::Deserialize;
use serde_json::{Map, Value as Json};

use crate::chat_output::{OutputPlan, ToolFields};
use crate::error::ApiError;
use crate::generate::Running;
use crate::params::{GenFields, Generation, LogprobsStyle, normalize_messages, parse_json};
use crate::shapes::{Kind, Shape};
use crate::state::{AppState, Ready};
use crate::stream;

#[derive(Deserialize)]
struct ChatFields {
    messages: Vec<Json>,
    #[serde(default)]
    chat_template_kwargs: Option<Map<String, Json>>,
}

#[derive(Deserialize)]
struct TextFields {
    prompt: Json,
}

pub async fn chat(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let fields: ChatFields = parse_json(&headers, &body)?;
    let gen_fields: GenFields = parse_json(&headers, &body)?;
    let tool_fields: ToolFields = parse_json(&headers, &body)?;
    let mut job = gen_fields.generation(LogprobsStyle::Chat, ready.engine.model().config().vocab_size)?;
    let tools = tool_fields.check(state.config.reasoning_format)?;
    let messages = normalize_messages(&fields.messages)?;
    let (messages, extra) =
        tools.prompt_inputs(&ready.chat_format, messages, fields.chat_template_kwargs.unwrap_or_default());
    let prompt = ready.engine.chat_prompt(&messages, &ChatOptions { extra })?;
    if let Some(c) = tools.constraint(&ready.chat_format, &prompt, ready.engine.tokenizer())? {
        if job.request.constraint.is_some() {
            return Err(ApiError::field("tools", "cannot be combined with response_format, json_schema or grammar"));
        }
        job.request.constraint = Some(c);
    }
    let ids = ready.engine.tokenize(&prompt, true)?;
    let output = OutputPlan::needed(&ready.chat_format, &tools, &prompt);
    if let Some(plan) = &output {
        job.request.shown_specials = plan.shown_specials(ready.engine.tokenizer());
    }
    let shape = Shape::new(Kind::Chat, state.request_id("chatcmpl-"), ready, &job, output);
    answer(&state, ready, vec![ids], job, shape, "chat").await
}

pub async fn text(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let fields: TextFields = parse_json(&headers, &body)?;
    let gen_fields: GenFields = parse_json(&headers, &body)?;
    let vocab = ready.engine.model().config().vocab_size;
    let job = gen_fields.generation(LogprobsStyle::Legacy, vocab)?;
    let prompts = prompts(ready, &fields.prompt)?;
    let shape = Shape::new(Kind::Text, state.request_id("cmpl-"), ready, &job, None);
    answer(&state, ready, prompts, job, shape, "completions").await
}

async fn answer(
    state: &Arc<AppState>,
    ready: &Ready,
    prompts: Vec<Vec<u32>>,
    job: Generation,
    shape: Shape,
    endpoint: &'static str,
) -> Result<Response, ApiError> {
    let running = Running::submit(state, ready, prompts, &job, endpoint, shape.id.clone())?;
    if job.stream {
        return Ok(stream::respond(running, shape, job.include_usage, state.config.sse_ping));
    }
    let (choices, running) = running.collect().await?;
    let done: Vec<(&Completion, &[TokenLogprobs])> = choices
        .iter()
        .map(|c| (c.completion.as_ref().expect("collect checks every choice"), c.logprobs.as_slice()))
        .collect();
    let (usage, timings) = running.report(&done.iter().map(|(c, _)| *c).collect::<Vec<_>>());
    Ok(JsonBody(shape.response(ready.engine.tokenizer(), &done, usage, timings)).into_response())
}

/// `prompt`: a string, a list of token ids, or a list of strings or token lists (one answer
/// each).
fn prompts(ready: &Ready, prompt: &Json) -> Result<Vec<Vec<u32>>, ApiError> {
    let one = |p: &Json, field: &str| -> Result<Vec<u32>, ApiError> {
        match p {
            Json::String(s) => {
                if s.is_empty() {
                    return Err(ApiError::field(field, "is empty"));
                }
                Ok(ready.engine.tokenize(s, true)?)
            }
            Json::Array(ids) if ids.iter().all(Json::is_number) => {
                if ids.is_empty() {
                    return Err(ApiError::field(field, "is empty"));
                }
                ids.iter()
                    .map(|v| {
                        v.as_u64()
                            .and_then(|id| u32::try_from(id).ok())
                            .ok_or_else(|| ApiError::field(field, format!("{v} is not a token id")))
                    })
                    .collect()
            }
            _ => Err(ApiError::field(field, "must be a string, a list of token ids, or a list of those")),
        }
    };
    match prompt {
        Json::Array(items) if !items.is_empty() && !items.iter().all(Json::is_number) => {
            if items.len() > crate::params::MAX_CHOICES {
                let m = crate::params::MAX_CHOICES;
                return Err(ApiError::field("prompt", format!("may hold at most {m} prompts, not {}", items.len())));
            }
            items.iter().enumerate().map(|(i, p)| one(p, &format!("prompt[{i}]"))).collect()
        }
        p => Ok(vec![one(p, "prompt")?]),
    }
}
