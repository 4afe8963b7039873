//! The serving engine: continuous batching over a paged KV cache with a shared prefix cache.
//!
//! One thread (the engine loop, in [`worker`]) owns the model's threads, the KV pool and every
//! sequence, and runs steps. A step is one forward pass over one new token of every decoding
//! sequence plus chunks of prompts being prefilled, up to `batch_size` tokens, so a long prompt
//! never stalls the streams already decoding. At most `parallel` sequences run at once; further
//! requests wait in a FIFO queue of at most `queue_size`, and past it submission fails at once
//! with [`EngineError::Busy`]. Each request carries its own sampling parameters and hears about
//! its progress through its own channel ([`RequestHandle`]).
//!
//! ```no_run
//! use std::sync::Arc;
//! use onebit_engine::{Engine, GenerateRequest, SamplingParams, Scheduler, SchedulerConfig};
//! use onebit_kernels::Pool;
//! use onebit_model::{Model, ModelOptions};
//!
//! let engine = Arc::new(Engine::new(Model::load("model.gguf", &ModelOptions::default())?)?);
//! let scheduler = Scheduler::start(Arc::clone(&engine), Pool::new(2), SchedulerConfig::default())?;
//! let ids = engine.tokenize("The capital of France is", false)?;
//! let req = GenerateRequest { sampling: SamplingParams::greedy(), max_tokens: Some(16), ..Default::default() };
//! let done = scheduler.submit(ids, req)?.wait(|_| onebit_engine::Flow::Continue)?;
//! println!("{}", done.text);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod draft;
mod sequence;
mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;

use onebit_kernels::Pool;
use onebit_model::{BLOCK_TOKENS, KvPool, human_bytes};

pub use crate::blocks::BlockCounts;
use crate::blocks::{KvBlocks, WindowPart};
use crate::request::{EventSink, GenerateRequest, RequestHandle};
use crate::speculative::{SpecMode, Speculation};
use crate::{Engine, EngineError};
use sequence::Sequence;
pub use sequence::SequenceInfo;

/// How the engine serves requests. Every field is a command-line option of the same name.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// Sequences in the batch at once (`--parallel`, llama.cpp's `-np`).
    pub parallel: usize,
    /// Tokens per step, decoding and prefilling together (`--batch-size`, llama.cpp's `-b`).
    pub batch_size: usize,
    /// Requests that may wait for a place beyond `parallel` (`--queue-size`).
    pub queue_size: usize,
    /// Positions of one sequence, prompt and answer (`--ctx-size`).
    pub ctx_size: usize,
    /// Positions in the KV pool all sequences share (`--kv-size`; 0: `parallel × ctx_size`).
    pub kv_size: usize,
    /// Speculative decoding for requests that do not choose (`--spec` and its settings).
    pub speculative: Speculation,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            parallel: 1,
            batch_size: 512,
            queue_size: 64,
            ctx_size: 4096,
            kv_size: 0,
            speculative: Speculation::default(),
        }
    }
}

/// What the engine loop holds at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    pub running: usize,
    pub waiting: usize,
    pub blocks: BlockCounts,
    /// The blocks of the sliding-window layers, when the model has some (they have their own).
    pub window_blocks: Option<BlockCounts>,
    /// Forward passes run so far.
    pub steps: u64,
    /// Tokens computed so far (prompt chunks and decoded tokens).
    pub tokens_computed: u64,
    /// Sequences put back in the queue to free memory (their work is recomputed).
    pub preemptions: u64,
    /// The sum over steps of the sequences in each (busy places per step, times steps).
    pub busy_slot_steps: u64,
    /// Grammar masks computed (one per constrained token drawn), and the time they took in
    /// all, in microseconds (they run beside the forward pass, not after it).
    pub masks: u64,
    pub mask_micros: u64,
    /// Tokens drafted by speculative decoding and verified, and those of them kept.
    pub drafted: u64,
    pub accepted: u64,
}

pub(crate) enum Command {
    Submit(Box<Sequence>),
    Stats(Sender<SchedulerStats>),
    Sequences(Sender<Vec<SequenceInfo>>),
    CheckBlocks(Sender<Result<(), String>>),
    ClearCache,
    Shutdown,
}

/// State shared by the handle and the engine loop.
pub(crate) struct Shared {
    /// Requests submitted and not yet finished (waiting or running).
    pub in_flight: AtomicUsize,
    next_id: AtomicU64,
}

/// A request submitted with [`Scheduler::submit_to`]: its number, and the flag that cancels it.
#[derive(Clone, Debug)]
pub struct Submitted {
    pub id: u64,
    pub cancel: Arc<AtomicBool>,
}

impl Submitted {
    /// Ask for the request to stop at the next step.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// What the KV pool reserved: its bytes, and the positions the blocks of sliding-window layers
/// hold (sequences give theirs back as their windows move on) where the model has such layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolMemory {
    pub bytes: usize,
    pub window_tokens: Option<usize>,
}

/// The handle to a running engine loop. Dropping it stops the loop (requests still in flight
/// end with [`EngineError::ShutDown`]).
pub struct Scheduler {
    tx: Sender<Command>,
    shared: Arc<Shared>,
    memory: PoolMemory,
    config: SchedulerConfig,
    vocab: usize,
    engine: Arc<Engine>,
    worker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scheduler({:?})", self.config)
    }
}

impl Scheduler {
    /// Check `config` against the model and the machine, reserve the KV pool, and start the
    /// engine loop on `pool`'s threads.
    pub fn start(engine: Arc<Engine>, pool: Pool, config: SchedulerConfig) -> Result<Scheduler, EngineError> {
        let config = resolve(&engine, config)?;
        let model = engine.model();
        let n_blocks = config.kv_size / BLOCK_TOKENS;
        let part = window_part(model.config(), &config);
        let window_tokens = part.as_ref().map(|p| p.n_blocks * BLOCK_TOKENS);
        let (kv, blocks) = match part {
            Some(part) => (model.new_split_pool(n_blocks, part.n_blocks)?, KvBlocks::new(n_blocks, Some(part))),
            None => (model.new_pool(n_blocks)?, KvBlocks::new(n_blocks, None)),
        };
        let drafter = engine.draft().map(|d| draft::Drafter::new(d, model, n_blocks)).transpose()?;
        let memory = PoolMemory { bytes: kv.capacity_bytes(), window_tokens };
        let shared = Arc::new(Shared { in_flight: AtomicUsize::new(0), next_id: AtomicU64::new(1) });
        let (tx, rx) = mpsc::channel();
        let vocab = model.config().vocab_size;
        let worker =
            worker::Worker::new(Arc::clone(&engine), pool, (kv, blocks), drafter, config, rx, Arc::clone(&shared));
        let worker = std::thread::Builder::new()
            .name("onebit-engine".into())
            .spawn(move || worker.run())
            .map_err(|e| EngineError::Config(format!("starting the engine thread: {e}")))?;
        Ok(Scheduler { tx, shared, memory, config, vocab, engine, worker: Some(worker) })
    }

    /// The configuration in effect (with `kv_size` filled in).
    pub fn config(&self) -> SchedulerConfig {
        self.config
    }

    /// What the KV pool reserved (it becomes resident as blocks are written).
    pub fn pool_memory(&self) -> PoolMemory {
        self.memory
    }

    /// Queue a request: generate after `prompt` (token ids) as `req` says. Fails at once if the
    /// prompt does not fit the context, if the request's constraint does not compile
    /// ([`EngineError::Grammar`]), or if `parallel + queue_size` requests are in flight.
    pub fn submit(&self, prompt: Vec<u32>, req: GenerateRequest) -> Result<RequestHandle, EngineError> {
        let (events_tx, events) = mpsc::channel();
        let Submitted { id, cancel } = self.submit_to(prompt, req, events_tx)?;
        Ok(RequestHandle { id, events, cancel })
    }

    /// [`Scheduler::submit`], with the events going to `sink` (an async channel, say). The
    /// request is cancelled when `sink` reports its receiver gone, or through the returned flag.
    pub fn submit_to(
        &self,
        prompt: Vec<u32>,
        req: GenerateRequest,
        sink: impl EventSink,
    ) -> Result<Submitted, EngineError> {
        self.check_prompt(&prompt)?;
        // Compiled here, on the caller's thread: a bad grammar fails before anything is queued,
        // and the engine loop never waits for a compilation.
        let constraint = req.constraint.as_ref().map(|c| self.engine.constraint_state(c)).transpose()?;
        let spec = self.config.speculative.with(&req.speculative);
        let lora = self.engine.resolve_lora(req.lora.as_deref())?;
        if spec.mode == SpecMode::Draft && self.engine.draft().is_none() {
            return Err(EngineError::BadRequest("speculative mode draft needs a draft model (--model-draft)".into()));
        }
        let limit = self.config.parallel + self.config.queue_size;
        if self.shared.in_flight.fetch_add(1, Ordering::AcqRel) >= limit {
            self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::Busy { in_flight: limit });
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let cancel = Arc::new(AtomicBool::new(false));
        let mut seq = Sequence::new(id, prompt, req, Box::new(sink), Arc::clone(&cancel), constraint, spec);
        seq.lora = lora;
        if self.tx.send(Command::Submit(Box::new(seq))).is_err() {
            self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(EngineError::ShutDown);
        }
        Ok(Submitted { id, cancel })
    }

    /// Whether `prompt` can be submitted at all: not empty, shorter than the context, every id
    /// in the vocabulary.
    pub fn check_prompt(&self, prompt: &[u32]) -> Result<(), EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() >= self.config.ctx_size {
            return Err(EngineError::PromptTooLong { tokens: prompt.len(), ctx: self.config.ctx_size });
        }
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(EngineError::BadRequest(format!(
                "token id {id} is outside the vocabulary (0..{})",
                self.vocab
            )));
        }
        Ok(())
    }

    /// Requests submitted and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    /// What the engine loop holds, after its current step.
    pub fn stats(&self) -> Result<SchedulerStats, EngineError> {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Command::Stats(tx)).map_err(|_| EngineError::ShutDown)?;
        rx.recv().map_err(|_| EngineError::ShutDown)
    }

    /// The running sequences, in the order they got their places.
    pub fn sequences(&self) -> Result<Vec<SequenceInfo>, EngineError> {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Command::Sequences(tx)).map_err(|_| EngineError::ShutDown)?;
        rx.recv().map_err(|_| EngineError::ShutDown)
    }

    /// Verify the block accounting: every block free, in use by exactly the block tables that
    /// hold it, or cached; the prefix cache's index agreeing with the blocks.
    pub fn check_blocks(&self) -> Result<(), EngineError> {
        let (tx, rx) = mpsc::channel();
        self.tx.send(Command::CheckBlocks(tx)).map_err(|_| EngineError::ShutDown)?;
        rx.recv().map_err(|_| EngineError::ShutDown)?.map_err(EngineError::Internal)
    }

    /// Empty the prefix cache (blocks in use stay).
    pub fn clear_cache(&self) -> Result<(), EngineError> {
        self.tx.send(Command::ClearCache).map_err(|_| EngineError::ShutDown)
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// `config` checked against the model and the machine, with the pool size filled in.
fn resolve(engine: &Engine, mut c: SchedulerConfig) -> Result<SchedulerConfig, EngineError> {
    let bad = |m: String| Err(EngineError::Config(m));
    if c.parallel == 0 || c.batch_size == 0 {
        return bad("--parallel and --batch-size must be at least 1".into());
    }
    if c.speculative.mode == SpecMode::Draft && engine.draft().is_none() {
        return bad("--spec draft needs a draft model: give it with --model-draft".into());
    }
    crate::sampling::in_range("--draft-p-min", c.speculative.p_min, 0.0, 1.0)
        .map_err(|e| EngineError::Config(e.to_string()))?;
    let model = engine.model().config();
    if c.ctx_size < 2 {
        return bad(format!("a context of {} tokens cannot hold a prompt and an answer", c.ctx_size));
    }
    if c.ctx_size > model.context_length {
        return Err(EngineError::ContextTooLarge { ctx: c.ctx_size, trained: model.context_length });
    }
    if c.kv_size == 0 {
        c.kv_size = c.parallel.saturating_mul(c.ctx_size);
    }
    if c.kv_size < c.ctx_size {
        return bad(format!(
            "the KV pool of {} tokens cannot hold one full context of {}: raise --kv-size or lower --ctx-size",
            c.kv_size, c.ctx_size
        ));
    }
    c.kv_size = c.kv_size.div_ceil(BLOCK_TOKENS).saturating_mul(BLOCK_TOKENS);
    let n_blocks = c.kv_size / BLOCK_TOKENS;
    let n_window = window_part(model, &c).map_or(n_blocks, |w| w.n_blocks);
    let bytes = KvPool::bytes_for(model, engine.model().kv_type(), n_blocks, n_window);
    if let Some(avail) = available_memory()
        && bytes > avail as u128
    {
        return bad(format!(
            "a KV cache of {} tokens ({} sequences × {}) needs {}, more than the {} of memory available: \
             lower --parallel, --ctx-size or --kv-size, or use --kv-type q8_0",
            c.kv_size,
            c.parallel,
            c.ctx_size,
            human_bytes(bytes.min(u64::MAX as u128) as u64),
            human_bytes(avail)
        ));
    }
    Ok(c)
}

/// The blocks of a model's sliding-window layers, which have their own (see
/// [`onebit_model::KvPool::new_split`]): as many as `parallel` sequences hold at once plus one
/// sequence's worth for the prefix cache, and no more than the pool's; `None` when no layer
/// slides.
fn window_part(model: &onebit_model::Config, c: &SchedulerConfig) -> Option<WindowPart> {
    let per_seq = model.window_span(c.batch_size)?.div_ceil(BLOCK_TOKENS);
    let n_blocks = per_seq.saturating_mul(c.parallel + 1).min(c.kv_size / BLOCK_TOKENS);
    Some(WindowPart { n_blocks, per_seq, window: model.sliding_window()? })
}

/// Memory the OS could give us now (Linux: `MemAvailable`), and no more than the room left
/// under this process's cgroup limit (a container's memory limit), if known.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    let system = kib * 1024;
    Some(cgroup_room().map_or(system, |room| room.min(system)))
}

/// The room left under the memory limit of this process's cgroup (v2: `memory.max` −
/// `memory.current`; v1: `memory.limit_in_bytes` − `memory.usage_in_bytes`); none without one.
fn cgroup_room() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok();
    let root = std::path::Path::new("/sys/fs/cgroup");
    let rel = |p: &str| p.trim().trim_start_matches('/').to_string();
    let room = |dir: std::path::PathBuf, max: &str, current: &str| {
        // v2's "max" (no limit) does not parse: no room to report.
        let max = read(dir.join(max))?;
        Some(max.saturating_sub(read(dir.join(current)).unwrap_or(0)))
    };
    let v2 = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .and_then(|p| room(root.join(rel(p)), "memory.max", "memory.current"));
    v2.or_else(|| {
        let p = cgroup.lines().find_map(|l| l.split_once(":memory:").map(|(_, p)| p))?;
        room(root.join("memory").join(rel(p)), "memory.limit_in_bytes", "memory.usage_in_bytes")
    })
}
