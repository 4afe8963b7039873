//! What every handler shares: the configuration, the model once it has loaded, the metrics.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use onebit_engine::chat_format::ChatFormat;
use onebit_engine::{Engine, Scheduler};

use crate::ServerConfig;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// A loaded model with its engine loop running.
pub struct Loaded {
    pub engine: Arc<Engine>,
    pub scheduler: Scheduler,
    /// The file the model came from (shown by `/props` and `/v1/models`).
    pub model_path: String,
}

/// The model as the handlers see it.
pub struct Ready {
    pub engine: Arc<Engine>,
    pub scheduler: Scheduler,
    pub model_path: String,
    /// The name clients use (`--alias`, else the file name).
    pub model_id: String,
    /// When it became ready (`created` of `/v1/models`).
    pub created: u64,
    /// How its chat template writes tool calls and thinking.
    pub chat_format: Arc<ChatFormat>,
}

pub struct AppState {
    pub config: ServerConfig,
    ready: OnceLock<Ready>,
    pub metrics: Metrics,
    next_id: AtomicU64,
    /// Shutting down: new requests are refused while running ones finish.
    pub draining: AtomicBool,
    /// Generation requests between submission and their last byte sent.
    pub active: AtomicUsize,
}

impl AppState {
    pub fn new(config: ServerConfig) -> AppState {
        AppState {
            config,
            ready: OnceLock::new(),
            metrics: Metrics::new(),
            next_id: AtomicU64::new(1),
            draining: AtomicBool::new(false),
            active: AtomicUsize::new(0),
        }
    }

    /// The model, or 503 "Loading model" while it loads.
    pub fn ready(&self) -> Result<&Ready, ApiError> {
        self.ready.get().ok_or_else(ApiError::loading)
    }

    pub fn is_ready(&self) -> bool {
        self.ready.get().is_some()
    }

    pub fn set_ready(&self, loaded: Loaded) {
        let model_id = self.config.alias.clone().unwrap_or_else(|| {
            std::path::Path::new(&loaded.model_path)
                .file_name()
                .map_or_else(|| loaded.model_path.clone(), |f| f.to_string_lossy().into_owned())
        });
        let chat_format = Arc::new(ChatFormat::detect(loaded.engine.chat_template_source()));
        tracing::info!(tools = ?chat_format.tool_format(), thinking = chat_format.has_thinking(), "chat format");
        let ready = Ready {
            chat_format,
            engine: loaded.engine,
            scheduler: loaded.scheduler,
            model_path: loaded.model_path,
            model_id,
            created: crate::generate::unix_now(),
        };
        if self.ready.set(ready).is_err() {
            tracing::warn!("the model was already loaded");
        }
    }

    /// A fresh request id with the given prefix (`chatcmpl-`, `cmpl-`, ...).
    pub fn request_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}{:x}{n:04}", crate::generate::unix_now())
    }
}
