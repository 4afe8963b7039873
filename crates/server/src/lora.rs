//! LoRA adapters over HTTP, as llama-server serves them: `GET /lora-adapters` lists the
//! adapters loaded at start (`--lora`, `--lora-scaled`) with their global scales,
//! `POST /lora-adapters` sets those scales (`[{"id": 0, "scale": 0.5}]`; adapters not listed go
//! to 0), and a generation request's `lora` field (the same shape) picks its own adapters.

use std::sync::Arc;

use axum::Json as JsonBody;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use onebit_model::LoraUse;
use serde_json::{Value as Json, json};

use crate::error::ApiError;
use crate::params::parse_json;
use crate::state::AppState;

/// `GET /lora-adapters`.
pub async fn list(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let engine = &state.ready()?.engine;
    let scales = engine.lora_scales();
    let entries: Vec<Json> = engine
        .model()
        .loras()
        .iter()
        .zip(scales)
        .enumerate()
        .map(|(id, (a, scale))| {
            json!({ "id": id, "path": a.path().display().to_string(), "scale": scale,
                    "rank": a.rank(), "alpha": a.alpha() })
        })
        .collect();
    Ok(JsonBody(Json::Array(entries)).into_response())
}

/// `POST /lora-adapters`.
pub async fn set(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let engine = &state.ready()?.engine;
    let body: Json = parse_json(&headers, &body)?;
    if !body.is_array() {
        return Err(ApiError::bad_request("the body must be an array such as [{\"id\": 0, \"scale\": 0.5}]"));
    }
    engine.set_lora_scales(&parse("body", &body)?)?;
    Ok(JsonBody(json!({ "success": true })).into_response())
}

/// A request's `lora` field: None (the global scales) when absent or empty, as llama-server.
pub fn request_field(value: Option<&Json>) -> Result<Option<Vec<LoraUse>>, ApiError> {
    match value {
        None | Some(Json::Null) => Ok(None),
        Some(v) => Ok(Some(parse("lora", v)?).filter(|u: &Vec<LoraUse>| !u.is_empty())),
    }
}

/// `[{"id": N, "scale": S}, ...]`.
fn parse(field: &str, value: &Json) -> Result<Vec<LoraUse>, ApiError> {
    let shape = "must be an array of {\"id\": N, \"scale\": S}";
    let items = value.as_array().ok_or_else(|| ApiError::field(field, shape))?;
    items
        .iter()
        .map(|item| {
            let id = item.get("id").and_then(Json::as_u64).ok_or_else(|| ApiError::field(field, shape))?;
            let scale = item.get("scale").and_then(Json::as_f64).ok_or_else(|| ApiError::field(field, shape))?;
            Ok(LoraUse { id: id as usize, scale: scale as f32 })
        })
        .collect()
}
