//! `onebit serve`: the OpenAI-compatible HTTP server, with llama-server's flags. The port opens
//! at once, the model loads in the background; SIGINT or SIGTERM stops accepting connections
//! and lets running requests finish for `--shutdown-grace` seconds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use onebit_engine::Scheduler;
use onebit_server::{Loaded, ServerConfig};

use super::model_args::{EngineArgs, ModelArgs};
use super::ui::Ui;

/// Sequences served at once unless `--parallel` says otherwise (llama-server's automatic value).
const DEFAULT_PARALLEL: usize = 4;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address to listen on (0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The model's name in the API [default: the file name].
    #[arg(short = 'a', long)]
    pub alias: Option<String>,
    /// A key clients must send as `Authorization: Bearer KEY` or `X-Api-Key` (repeatable).
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_keys: Vec<String>,
    /// A file of keys, one per line (blank lines and lines starting with # are skipped).
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Seconds a request that is not streamed may take before it fails with 408.
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    pub timeout: u64,
    /// An origin browsers may call the API from (repeatable) [default: any].
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// Render chats with this Jinja template instead of the model's own.
    #[arg(long, value_name = "FILE")]
    pub chat_template_file: Option<PathBuf>,
    /// Do not serve the chat page at `/`.
    #[arg(long)]
    pub no_webui: bool,
    /// Largest request body, in MiB; larger bodies get 413.
    #[arg(long, default_value_t = 8, value_name = "MIB")]
    pub body_limit: usize,
    /// Seconds running requests get to finish after SIGINT or SIGTERM.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub shutdown_grace: u64,
    /// Where a thinking model's `<think>` block goes: `deepseek` (or `auto`): into
    /// `reasoning_content`; `none`: left in `content`.
    #[arg(long, default_value = "auto", value_parser = ["none", "deepseek", "auto"], value_name = "FORMAT")]
    pub reasoning_format: String,
    /// Seconds a stream may stay quiet (a long prompt being computed) before a comment ping
    /// goes out, so that proxies keep the connection open.
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    pub sse_ping: f64,
}

pub fn run(args: Args) -> Result<u8> {
    let config = server_config(&args)?;
    let template = match &args.chat_template_file {
        Some(f) => Some(std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("onebit-http")
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    let (model, engine) = (args.model.clone(), args.engine.clone());
    runtime.block_on(async move {
        let server =
            onebit_server::start(config, move || load(&model, &engine, template).map_err(|e| format!("{e:#}"))).await?;
        eprintln!("onebit: listening on http://{} (the model loads in the background)", server.addr());
        let stop = server.stopper();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("stopping: no new connections; running requests may finish");
            stop();
        });
        server.wait().await?;
        anyhow::Ok(())
    })?;
    Ok(0)
}

fn server_config(args: &Args) -> Result<ServerConfig> {
    let mut api_keys = args.api_keys.clone();
    if let Some(f) = &args.api_key_file {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading API keys from {}", f.display()))?;
        api_keys.extend(text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from));
        if api_keys.is_empty() {
            bail!("{} holds no API keys", f.display());
        }
    }
    if api_keys.iter().any(|k| k.is_empty() || k.chars().any(char::is_whitespace)) {
        bail!("an API key must not be empty or contain spaces");
    }
    if args.body_limit == 0 || args.timeout == 0 {
        bail!("--body-limit and --timeout must be at least 1");
    }
    if !(0.01..=3600.0).contains(&args.sse_ping) {
        bail!("--sse-ping must be between 0.01 and 3600 seconds");
    }
    Ok(ServerConfig {
        host: args.host.clone(),
        port: args.port,
        api_keys,
        timeout: Duration::from_secs(args.timeout),
        cors_origins: args.cors_origins.clone(),
        webui: !args.no_webui,
        alias: args.alias.clone(),
        body_limit: args.body_limit.saturating_mul(1 << 20),
        shutdown_grace: Duration::from_secs(args.shutdown_grace),
        reasoning_format: onebit_server::parse_reasoning_format(&args.reasoning_format).map_err(anyhow::Error::msg)?,
        sse_ping: Duration::from_secs_f64(args.sse_ping),
    })
}

/// Resolve and load the model, and start the engine (on a blocking thread of the server).
fn load(model: &ModelArgs, engine: &EngineArgs, template: Option<String>) -> Result<Loaded> {
    let ui = Ui::new(true);
    let path = model.path(&ui)?;
    tracing::info!("loading {}", path.display());
    let loaded =
        onebit_model::Model::load(&path, &model.options()).with_context(|| format!("loading {}", path.display()))?;
    let ctx = model.ctx(&loaded);
    let mut eng = model.engine(loaded)?;
    if let Some(src) = template {
        eng.set_chat_template(&src).context("--chat-template-file")?;
    }
    if !eng.has_chat_template() {
        tracing::warn!("the model has no chat template: /v1/chat/completions will refuse; use --chat-template-file");
    }
    engine.spec.attach_draft(&mut eng, &model.options())?;
    let eng = Arc::new(eng);
    let config = engine.config(ctx, DEFAULT_PARALLEL);
    let pool = model.pool();
    let threads = pool.n_threads();
    let scheduler = Scheduler::start(Arc::clone(&eng), pool, config)?;
    let (c, m) = (scheduler.config(), scheduler.pool_memory());
    let window = m.window_tokens.map(|w| format!(", sliding-window layers {w} tokens")).unwrap_or_default();
    tracing::info!(
        "engine: {} sequences of {} tokens, KV pool {} tokens{window} ({}), batch {} tokens, {} threads",
        c.parallel,
        c.ctx_size,
        c.kv_size,
        onebit_model::human_bytes(m.bytes as u64),
        c.batch_size,
        threads
    );
    Ok(Loaded { engine: eng, scheduler, model_path: path.display().to_string() })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
