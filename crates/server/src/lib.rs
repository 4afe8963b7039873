//! `onebit serve`: an OpenAI-compatible HTTP server over the serving engine, with
//! llama-server's endpoints, flags, error shapes and metric names.
//!
//! The route table below is the whole map of the server. Handlers only parse a request, build
//! the prompt, queue it on the engine ([`onebit_engine::Scheduler`]) and stream its events back;
//! batching, memory and cancellation live in the engine. The port opens at once and the model
//! loads in the background (`/health` says 503 "Loading model" until it is ready).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use onebit_engine::{Engine, Scheduler, SchedulerConfig};
//! use onebit_model::{Model, ModelOptions};
//! use onebit_server::{Loaded, ServerConfig};
//!
//! let server = onebit_server::start(ServerConfig::default(), || {
//!     let model = Model::load("model.gguf", &ModelOptions::default()).map_err(|e| e.to_string())?;
//!     let engine = Arc::new(Engine::new(model).map_err(|e| e.to_string())?);
//!     let pool = onebit_kernels::Pool::new(2);
//!     let scheduler = Scheduler::start(Arc::clone(&engine), pool, SchedulerConfig::default())
//!         .map_err(|e| e.to_string())?;
//!     Ok(Loaded { engine, scheduler, model_path: "model.gguf".into() })
//! })
//! .await?;
//! println!("listening on {}", server.addr());
//! server.wait().await?;
//! # Ok(()) }
//! ```

mod adapter_stream;
mod anthropic;
mod chat_output;
mod completions;
mod error;
mod generate;
mod info;
mod lora;
mod metrics;
mod params;
mod responses;
mod shapes;
mod state;
mod stream;
mod webui;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use onebit_engine::chat_format::ReasoningFormat;
use tokio::sync::watch;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};
use tower_http::timeout::TimeoutLayer;

pub use chat_output::parse_reasoning_format;
pub use error::ApiError;
use state::AppState;
pub use state::Loaded;

/// How the server listens and whom it serves. Every field is a flag of `onebit serve`.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Keys a client must send (`Authorization: Bearer KEY` or `X-Api-Key`); none: open.
    pub api_keys: Vec<String>,
    /// Longest time to answer a request that is not streamed (seconds).
    pub timeout: Duration,
    /// Origins browsers may call from (none: any origin, as llama-server allows).
    pub cors_origins: Vec<String>,
    /// Serve the chat page at `/`.
    pub webui: bool,
    /// The model's name in the API (default: its file name).
    pub alias: Option<String>,
    /// Largest request body, in bytes.
    pub body_limit: usize,
    /// After SIGINT/SIGTERM, how long running requests may take to finish.
    pub shutdown_grace: Duration,
    /// Where a thinking model's thoughts go: `reasoning_content` (Deepseek) or `content` (None).
    pub reasoning_format: ReasoningFormat,
    /// How long a stream may stay quiet (a long prompt being computed) before a comment ping
    /// goes out, so that proxies keep the connection.
    pub sse_ping: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            api_keys: Vec::new(),
            timeout: Duration::from_secs(600),
            cors_origins: Vec::new(),
            webui: true,
            alias: None,
            body_limit: 8 << 20,
            shutdown_grace: Duration::from_secs(30),
            reasoning_format: ReasoningFormat::Deepseek,
            sse_ping: Duration::from_secs(5),
        }
    }
}

/// Why the server stopped other than by a signal.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("loading the model failed: {0}")]
    Load(String),
    #[error("the server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// The route table.
fn router(state: Arc<AppState>) -> Router {
    let mut routes = Router::new()
        .route("/health", get(info::health))
        .route("/v1/health", get(info::health))
        .route("/v1/models", get(info::models))
        .route("/models", get(info::models))
        .route("/v1/models/{id}", get(info::model))
        .route("/props", get(info::props))
        .route("/slots", get(info::slots))
        .route("/metrics", get(info::metrics))
        .route("/v1/chat/completions", post(completions::chat))
        .route("/chat/completions", post(completions::chat))
        .route("/v1/completions", post(completions::text))
        .route("/completions", post(completions::text))
        .route("/v1/responses", post(responses::create))
        .route("/responses", post(responses::create))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/tokenize", post(info::tokenize))
        .route("/detokenize", post(info::detokenize))
        .route("/apply-template", post(info::apply_template))
        .route("/lora-adapters", get(lora::list).post(lora::set));
    if state.config.webui {
        routes = routes.route("/", get(webui::index));
    }
    let cors = match state.config.cors_origins.as_slice() {
        [] => CorsLayer::new().allow_origin(Any),
        list => {
            CorsLayer::new().allow_origin(AllowOrigin::list(list.iter().filter_map(|o| o.parse::<HeaderValue>().ok())))
        }
    }
    .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
    .allow_headers(Any);
    routes
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .layer(middleware::from_fn_with_state(Arc::clone(&state), require_key))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), refuse_when_draining))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), limit_body))
        .layer(DefaultBodyLimit::max(state.config.body_limit))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, state.config.timeout))
        .layer(middleware::map_response(json_errors))
        .layer(cors)
        .with_state(state)
}

/// With `--api-key`, every endpoint but `/health` (and the chat page, which asks for the key)
/// wants one of the keys.
async fn require_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let keys = &state.config.api_keys;
    let open = matches!(req.uri().path(), "/health" | "/v1/health" | "/") || req.method() == Method::OPTIONS;
    if keys.is_empty() || open {
        return next.run(req).await;
    }
    let h = req.headers();
    // The scheme's name is case-insensitive (RFC 9110).
    let bearer = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, key)| key);
    let x_key = h.get("x-api-key").and_then(|v| v.to_str().ok());
    let given = bearer.or(x_key).map(str::trim);
    if given.is_some_and(|g| keys.iter().any(|k| same(k.as_bytes(), g.as_bytes()))) {
        next.run(req).await
    } else {
        ApiError::unauthorized().into_response()
    }
}

/// While shutting down, running requests finish but new ones (and health checks, so that load
/// balancers look elsewhere) get 503.
async fn refuse_when_draining(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if state.draining.load(std::sync::atomic::Ordering::Acquire) {
        let mut err =
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", "the server is shutting down");
        err.retry_after = Some(1);
        return err.into_response();
    }
    next.run(req).await
}

/// How much of a refused body is still read (and thrown away) before the connection closes.
const LINGER_BYTES: u64 = 64 << 20;
const LINGER_TIME: Duration = Duration::from_secs(10);

/// Reads the body up to `--body-limit`. A larger body gets 413, but only after the rest of it
/// has been read and dropped (up to [`LINGER_BYTES`] or [`LINGER_TIME`]): closing a socket with
/// unread data resets it, and the client would see a broken pipe instead of the answer.
async fn limit_body(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let limit = state.config.body_limit;
    let (parts, body) = req.into_parts();
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let too_large = || {
        let mut res = ApiError::from_status(StatusCode::PAYLOAD_TOO_LARGE, TOO_LARGE.into()).into_response();
        res.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        res
    };
    if declared.is_some_and(|n| n > LINGER_BYTES) {
        return too_large();
    }
    let mut stream = body.into_data_stream();
    let mut kept = Vec::new();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            return ApiError::bad_request("the request body could not be read").into_response();
        };
        if kept.len() + chunk.len() > limit {
            let mut seen = (kept.len() + chunk.len()) as u64;
            let drain = async {
                while let Some(Ok(c)) = stream.next().await {
                    seen += c.len() as u64;
                    if seen > LINGER_BYTES {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(LINGER_TIME, drain).await;
            return too_large();
        }
        kept.extend_from_slice(&chunk);
    }
    next.run(Request::from_parts(parts, Body::from(kept))).await
}

const TOO_LARGE: &str = "the request body is larger than the server's limit (--body-limit)";

/// Compare without stopping at the first difference, so that timing does not reveal a key.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Errors from outside the handlers (unknown routes, wrong methods, body limits, timeouts)
/// in the same JSON shape as every other error.
async fn json_errors(res: Response) -> Response {
    let status = res.status();
    let is_json = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return res;
    }
    let body = axum::body::to_bytes(res.into_body(), 64 << 10).await.unwrap_or_default();
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => TOO_LARGE.into(),
        StatusCode::REQUEST_TIMEOUT => "the request took longer than the server's --timeout".into(),
        _ => String::from_utf8_lossy(&body).into_owned(),
    };
    let mut res = ApiError::from_status(status, message).into_response();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        // The rest of the body is never read, so the connection cannot carry another request:
        // say so, or a client's pool would reuse a connection that is about to close.
        res.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    res
}

/// A server that is listening.
pub struct Server {
    addr: SocketAddr,
    state: Arc<AppState>,
    stop: watch::Sender<bool>,
    close: watch::Sender<bool>,
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
    load_error: Arc<OnceLock<String>>,
}

/// Listen on the configured address, then load the model in the background with `load`.
pub async fn start<F>(config: ServerConfig, load: F) -> Result<Server, ServerError>
where
    F: FnOnce() -> Result<Loaded, String> + Send + 'static,
{
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|source| ServerError::Bind { addr, source })?;
    let local = listener.local_addr()?;
    let state = Arc::new(AppState::new(config));
    let (stop, _) = watch::channel(false);
    let (close, closing) = watch::channel(false);
    let load_error = Arc::new(OnceLock::new());

    let (st, failed, stop_on_fail) = (Arc::clone(&state), Arc::clone(&load_error), stop.clone());
    tokio::task::spawn_blocking(move || {
        let t0 = std::time::Instant::now();
        match load() {
            Ok(loaded) => {
                st.set_ready(loaded);
                tracing::info!("model loaded in {:.1} s; ready", t0.elapsed().as_secs_f64());
            }
            Err(e) => {
                tracing::error!("loading the model failed: {e}");
                let _ = failed.set(e);
                stop_on_fail.send_replace(true);
            }
        }
    });

    let app = router(Arc::clone(&state)).into_make_service_with_connect_info::<SocketAddr>();
    let mut until = closing;
    let serving = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = until.wait_for(|&s| s).await;
            })
            .await
    });
    tracing::info!("listening on http://{local}");
    Ok(Server { addr: local, state, stop, close, serving, load_error })
}

impl Server {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the model has loaded.
    pub fn is_ready(&self) -> bool {
        self.state.is_ready()
    }

    /// The engine's state (none while the model loads).
    pub fn engine_stats(&self) -> Option<onebit_engine::SchedulerStats> {
        self.state.ready().ok().and_then(|r| r.scheduler.stats().ok())
    }

    /// Verify the engine's block accounting (no block leaked or shared wrongly).
    pub fn check_blocks(&self) -> Result<(), String> {
        let ready = self.state.ready().map_err(|e| e.message)?;
        ready.scheduler.check_blocks().map_err(|e| e.to_string())
    }

    /// Stop accepting connections; running requests may finish within the grace period.
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }

    /// A handle that stops the server from elsewhere (a signal handler).
    pub fn stopper(&self) -> impl Fn() + Send + Sync + 'static {
        let stop = self.stop.clone();
        move || {
            stop.send_replace(true);
        }
    }

    /// Run until stopped; then refuse new requests, let running ones finish (at most the
    /// grace period), and close.
    pub async fn wait(self) -> Result<(), ServerError> {
        let mut stopped = self.stop.subscribe();
        let serving = self.serving;
        tokio::pin!(serving);
        let io = |r: Result<std::io::Result<()>, tokio::task::JoinError>| {
            r.map_err(|e| ServerError::Io(std::io::Error::other(e)))?.map_err(ServerError::Io)
        };
        tokio::select! {
            r = &mut serving => return io(r),
            _ = stopped.wait_for(|&s| s) => {}
        }
        self.state.draining.store(true, std::sync::atomic::Ordering::Release);
        let grace = self.state.config.shutdown_grace;
        let deadline = tokio::time::Instant::now() + grace;
        while self.state.active.load(std::sync::atomic::Ordering::Acquire) > 0 {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!("requests still running after the {} s grace period; stopping them", grace.as_secs());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.close.send_replace(true);
        // Idle keep-alive connections close at once; give stragglers a moment.
        let result = match tokio::time::timeout(Duration::from_secs(2), &mut serving).await {
            Ok(r) => io(r),
            Err(_) => Ok(()),
        };
        if let Some(e) = self.load_error.get() {
            return Err(ServerError::Load(e.clone()));
        }
        result
    }
}
