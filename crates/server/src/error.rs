//! Errors as llama-server and OpenAI shape them: `{"error":{"code","message","type"}}` with the
//! matching HTTP status, so that clients raise their usual typed exceptions.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use onebit_engine::{EngineError, ParamError};
use serde_json::{Map, Value as Json, json};

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// llama-server's `type`: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    pub message: String,
    /// More fields of the error object (`n_prompt_tokens`, `n_ctx`).
    pub extra: Option<Box<Map<String, Json>>>,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, kind, message: message.into(), extra: None, retry_after: None }
    }

    /// 400: the request is malformed or a value is out of range.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault.
    pub fn field(field: &str, reason: impl std::fmt::Display) -> ApiError {
        ApiError::bad_request(format!("{field}: {reason}"))
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", "Invalid API Key")
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    /// 503 while the model loads.
    pub fn loading() -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", "Loading model")
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The error object alone (also sent as an SSE event when a stream fails midway).
    pub fn body(&self) -> Json {
        let mut obj = Map::new();
        obj.insert("code".into(), json!(self.status.as_u16()));
        obj.insert("message".into(), json!(self.message));
        obj.insert("type".into(), json!(self.kind));
        if let Some(extra) = &self.extra {
            obj.extend(extra.as_ref().clone());
        }
        json!({ "error": obj })
    }

    /// An error answer of any other layer (axum's rejections, the timeout, 404, 405) in the
    /// same shape.
    pub fn from_status(status: StatusCode, message: String) -> ApiError {
        let kind = match status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        let message = if message.trim().is_empty() {
            status.canonical_reason().unwrap_or("error").to_string()
        } else {
            message.trim().to_string()
        };
        ApiError::new(status, kind, message)
    }
}

impl ApiError {
    /// The answer for this error with `body` (its own, or an API's variant of it).
    pub fn respond_with(&self, body: Json) -> Response {
        let mut res = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        res
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.respond_with(self.body())
    }
}

impl From<ParamError> for ApiError {
    fn from(e: ParamError) -> ApiError {
        ApiError::field(e.field, e.reason)
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        match e {
            EngineError::PromptTooLong { tokens, ctx } => {
                let mut err = ApiError::bad_request(format!(
                    "the request exceeds the available context size: the prompt is {tokens} tokens and the \
                     context holds {ctx}; shorten the prompt or start the server with a larger --ctx-size"
                ));
                err.kind = "exceed_context_size_error";
                let mut extra = Map::new();
                extra.insert("n_prompt_tokens".into(), json!(tokens));
                extra.insert("n_ctx".into(), json!(ctx));
                err.extra = Some(Box::new(extra));
                err
            }
            EngineError::Busy { .. } => {
                let mut err = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", e.to_string());
                err.retry_after = Some(1);
                err
            }
            EngineError::ShutDown => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", "the server is shutting down")
            }
            EngineError::EmptyPrompt
            | EngineError::BadRequest(_)
            | EngineError::Grammar(_)
            | EngineError::Tokenizer(_) => ApiError::bad_request(e.to_string()),
            _ => ApiError::internal(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_overflow_names_both_sizes() {
        let e = ApiError::from(EngineError::PromptTooLong { tokens: 5000, ctx: 4096 });
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let body = e.body();
        assert_eq!(body["error"]["type"], "exceed_context_size_error");
        assert_eq!(body["error"]["n_prompt_tokens"], 5000);
        assert_eq!(body["error"]["n_ctx"], 4096);
        assert_eq!(body["error"]["code"], 400);
    }

    #[test]
    fn busy_asks_to_retry() {
        let e = ApiError::from(EngineError::Busy { in_flight: 8 });
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.retry_after, Some(1));
    }
}
