//! A server started in-process on a free port over the demo model (SmolLM2-135M-Instruct, a
//! real chat template and real text), and a client for it.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use onebit_engine::{Engine, Scheduler, SchedulerConfig};
use onebit_kernels::Pool;
use onebit_model::{Model, ModelOptions};
use onebit_server::{Loaded, Server, ServerConfig};
use serde_json::Value as Json;

pub struct TestServer {
    pub server: Server,
    pub base: String,
    pub http: reqwest::Client,
}

/// The engine settings the tests use unless they say otherwise.
pub fn engine_config() -> SchedulerConfig {
    SchedulerConfig { parallel: 4, batch_size: 512, queue_size: 16, ctx_size: 1024, ..SchedulerConfig::default() }
}

/// Start a server on the demo model; `None` (the test skips) when the model is not cached.
pub async fn start(config: ServerConfig, engine: SchedulerConfig) -> Option<TestServer> {
    start_model(onebit_testkit::demo_model()?, None, config, engine).await
}

/// Start a server on any model, with a chat template of its own (`--chat-template-file`).
pub async fn start_model(
    path: std::path::PathBuf,
    template: Option<String>,
    config: ServerConfig,
    engine: SchedulerConfig,
) -> Option<TestServer> {
    start_with(path, template, ModelOptions::default(), config, engine).await
}

/// Start a server on any model loaded with `options` (LoRA adapters, say).
pub async fn start_with(
    path: std::path::PathBuf,
    template: Option<String>,
    options: ModelOptions,
    mut config: ServerConfig,
    engine: SchedulerConfig,
) -> Option<TestServer> {
    config.host = "127.0.0.1".into();
    config.port = 0;
    let server = onebit_server::start(config, move || {
        let model = Model::load(&path, &options).map_err(|e| e.to_string())?;
        let mut eng = Engine::new(model).map_err(|e| e.to_string())?;
        if let Some(t) = &template {
            eng.set_chat_template(t).map_err(|e| e.to_string())?;
        }
        let engine_ = Arc::new(eng);
        let scheduler = Scheduler::start(Arc::clone(&engine_), Pool::new(2), engine).map_err(|e| e.to_string())?;
        Ok(Loaded { engine: engine_, scheduler, model_path: path.display().to_string() })
    })
    .await
    .expect("the server starts");
    let base = format!("http://{}", server.addr());
    let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().expect("a client");
    for _ in 0..600 {
        if server.is_ready() {
            return Some(TestServer { server, base, http });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the model did not load within 12 s");
}

/// The default server.
pub async fn default_server() -> Option<TestServer> {
    start(ServerConfig::default(), engine_config()).await
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POST JSON; the status and the body as JSON (or as a string when it is not JSON).
    pub async fn post(&self, path: &str, body: &Json) -> (u16, Json) {
        let res = self.http.post(self.url(path)).json(body).send().await.expect("the request goes through");
        let status = res.status().as_u16();
        let text = res.text().await.expect("a body");
        (status, serde_json::from_str(&text).unwrap_or(Json::String(text)))
    }

    pub async fn get(&self, path: &str) -> (u16, Json) {
        let res = self.http.get(self.url(path)).send().await.expect("the request goes through");
        let status = res.status().as_u16();
        let text = res.text().await.expect("a body");
        (status, serde_json::from_str(&text).unwrap_or(Json::String(text)))
    }

    /// POST a streaming request and gather its `data:` payloads (up to `[DONE]`).
    pub async fn stream(&self, path: &str, body: &Json) -> Vec<String> {
        let res = self.http.post(self.url(path)).json(body).send().await.expect("the request goes through");
        assert_eq!(res.status().as_u16(), 200, "streaming request failed");
        let text = res.text().await.expect("a body");
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
    }

    /// Wait until the engine holds no sequence, then check its blocks.
    pub async fn assert_idle_and_clean(&self) {
        for _ in 0..500 {
            let s = self.server.engine_stats().expect("stats");
            if s.running == 0 && s.waiting == 0 {
                self.server.check_blocks().expect("block accounting");
                assert_eq!(s.blocks.in_use, 0, "blocks still in use: {s:?}");
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the engine still holds sequences: {:?}", self.server.engine_stats());
    }
}

/// A greedy chat request.
pub fn chat(content: &str, max_tokens: usize) -> Json {
    serde_json::json!({
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": max_tokens,
    })
}
