//! The endpoints around generation, in llama-server's shapes: `/health`, `/v1/models`,
//! `/props`, `/slots`, `/metrics`, `/tokenize`, `/detokenize`, `/apply-template`.

use std::sync::Arc;

use axum::Json as JsonBody;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use onebit_engine::ChatOptions;
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use crate::error::ApiError;
use crate::params::{normalize_messages, parse_json};
use crate::state::AppState;

pub async fn health(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    state.ready()?;
    Ok(JsonBody(json!({ "status": "ok" })).into_response())
}

pub async fn models(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let entry = model_entry(state.ready()?);
    Ok(JsonBody(json!({ "object": "list", "data": [entry] })).into_response())
}

/// `GET /v1/models/{id}`: the model, if that is its name.
pub async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    if id != ready.model_id {
        return Err(ApiError::not_found(format!("no model named '{id}'; this server serves '{}'", ready.model_id)));
    }
    Ok(JsonBody(model_entry(ready)).into_response())
}

fn model_entry(ready: &crate::state::Ready) -> Json {
    let model = ready.engine.model();
    let c = model.config();
    let n_params: u64 = model.gguf().tensors().map(|t| t.n_elements()).sum();
    json!({
        "id": ready.model_id,
        "object": "model",
        "created": ready.created,
        "owned_by": "onebit",
        "meta": {
            "n_vocab": c.vocab_size,
            "n_ctx_train": c.context_length,
            "n_embd": c.hidden,
            "n_params": n_params,
            "size": model.gguf().file_bytes(),
        },
    })
}

pub async fn props(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let cfg = ready.scheduler.config();
    let d = onebit_engine::SamplingParams::default();
    Ok(JsonBody(json!({
        "default_generation_settings": {
            "n_ctx": cfg.ctx_size,
            "params": {
                "temperature": d.temperature, "top_k": d.top_k, "top_p": d.top_p, "min_p": d.min_p,
                "repeat_penalty": d.repeat_penalty, "repeat_last_n": d.repeat_last_n,
                "presence_penalty": d.presence_penalty, "frequency_penalty": d.frequency_penalty,
                "n_predict": -1,
            },
        },
        "total_slots": cfg.parallel,
        "model_alias": ready.model_id,
        "model_path": ready.model_path,
        "chat_template": ready.engine.chat_template_source().unwrap_or(""),
        "bos_token": ready.engine.tokenizer().token_text(ready.engine.tokenizer().vocab().specials.bos),
        "eos_token": ready.engine.tokenizer().token_text(ready.engine.tokenizer().vocab().specials.eos),
        "api_key_required": !state.config.api_keys.is_empty(),
        "build_info": crate::shapes::FINGERPRINT,
    }))
    .into_response())
}

/// One entry per place in the batch (`--parallel`): what the sequence there is doing.
pub async fn slots(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let cfg = ready.scheduler.config();
    let running = ready.scheduler.sequences()?;
    let slots: Vec<Json> = (0..cfg.parallel)
        .map(|i| match running.get(i) {
            Some(s) => json!({
                "id": i, "n_ctx": cfg.ctx_size, "is_processing": true, "id_task": s.id,
                "prompt_tokens": s.prompt_tokens, "cached_tokens": s.cached_tokens,
                "n_past": s.computed, "n_decoded": s.generated,
                "n_predict": s.max_tokens.map_or(-1, |n| n as i64), "prefilling": s.prefilling,
            }),
            None => json!({ "id": i, "n_ctx": cfg.ctx_size, "is_processing": false }),
        })
        .collect();
    Ok(JsonBody(Json::Array(slots)).into_response())
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let stats = state.ready().ok().and_then(|r| r.scheduler.stats().ok());
    let text = state.metrics.render(stats.as_ref());
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

#[derive(Deserialize)]
struct TokenizeBody {
    content: String,
    #[serde(default)]
    add_special: bool,
    #[serde(default = "yes")]
    parse_special: bool,
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let req: TokenizeBody = parse_json(&headers, &body)?;
    let tok = ready.engine.tokenizer();
    let ids = tok.encode(&req.content, req.add_special, req.parse_special).map_err(onebit_engine::EngineError::from)?;
    let tokens: Vec<Json> = if req.with_pieces {
        ids.iter()
            .map(|&id| {
                let bytes = tok.piece(id, true);
                let piece = match std::str::from_utf8(bytes) {
                    Ok(s) => json!(s),
                    Err(_) => json!(bytes),
                };
                json!({ "id": id, "piece": piece })
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(JsonBody(json!({ "tokens": tokens })).into_response())
}

#[derive(Deserialize)]
struct DetokenizeBody {
    tokens: Vec<u32>,
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let req: DetokenizeBody = parse_json(&headers, &body)?;
    let vocab = ready.engine.model().config().vocab_size;
    if let Some(bad) = req.tokens.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::field("tokens", format!("{bad} is not a token id of this model (0..{vocab})")));
    }
    let content = ready.engine.tokenizer().decode(&req.tokens, true);
    Ok(JsonBody(json!({ "content": content })).into_response())
}

#[derive(Deserialize)]
struct TemplateBody {
    messages: Vec<Json>,
    #[serde(default)]
    chat_template_kwargs: Option<Map<String, Json>>,
}

pub async fn apply_template(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let req: TemplateBody = parse_json(&headers, &body)?;
    let tools = parse_json::<crate::chat_output::ToolFields>(&headers, &body)?.check(state.config.reasoning_format)?;
    let messages = normalize_messages(&req.messages)?;
    let (messages, extra) =
        tools.prompt_inputs(&ready.chat_format, messages, req.chat_template_kwargs.unwrap_or_default());
    let prompt = ready.engine.chat_prompt(&messages, &ChatOptions { extra })?;
    Ok(JsonBody(json!({ "prompt": prompt })).into_response())
}
