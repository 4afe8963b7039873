//! Models with sliding-window layers in the engine (Gemma 3, whose global layers read every
//! position, and a `mistral` model whose layers all slide; windows narrowed to 40 positions):
//! the window layers' blocks are given back as sequences advance, so sequences whose contexts
//! would not fit the window part of the pool whole run side by side without preemption and give
//! the tokens of a cache that keeps everything; a prompt seen before is taken from the prefix
//! cache with the window blocks it needs, and gives the same tokens.

use std::sync::Arc;

use onebit_engine::{Engine, Flow, GenerateRequest, SamplingParams, Scheduler, SchedulerConfig};
use onebit_kernels::Pool;
use onebit_model::{BLOCK_TOKENS, LogitsWanted, Model, ModelOptions, Scratch};

const GENERATED: usize = 24;

fn engine(path: std::path::PathBuf) -> Arc<Engine> {
    Arc::new(Engine::new(Model::load(path, &ModelOptions::default()).unwrap()).unwrap())
}

fn prompt(n: usize, seed: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 1000 + (i * 7919 + seed * 104_729) % (vocab as u32 - 1000)).collect()
}

fn greedy() -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(GENERATED),
        ignore_eos: true,
        ..Default::default()
    }
}

/// Greedy tokens after `prompt` in a cache of its own that keeps every position.
fn alone(m: &Model, prompt: &[u32]) -> Vec<u32> {
    let pool = Pool::new(2);
    let mut cache = m.new_cache(prompt.len() + GENERATED).unwrap();
    let mut sc = Scratch::new();
    let mut ids = Vec::new();
    let mut next = prompt.to_vec();
    while ids.len() < GENERATED {
        let logits = m.forward_one(&pool, &mut cache, &next, LogitsWanted::Last, &mut sc).unwrap();
        let id = onebit_testkit::argmax(logits.last(0).unwrap()) as u32;
        ids.push(id);
        next = vec![id];
    }
    ids
}

#[test]
fn gemma3_window_blocks_slide_and_sequences_keep_their_tokens() {
    let Some(path) = onebit_testkit::gemma3_with_window(40) else { return };
    window_blocks_slide_and_sequences_keep_their_tokens(&engine(path));
}

#[test]
fn all_sliding_mistral_blocks_slide_and_sequences_keep_their_tokens() {
    let Some(src) = onebit_testkit::shared_file("models/llama-q4_1.gguf") else { return };
    let e = engine(onebit_testkit::sliding_window_model(&src, "mistral", 40));
    let c = e.model().config();
    assert!((0..c.n_layers).all(|l| c.window(l) == Some(40)), "every layer slides");
    window_blocks_slide_and_sequences_keep_their_tokens(&e);
}

fn window_blocks_slide_and_sequences_keep_their_tokens(e: &Arc<Engine>) {
    let config = SchedulerConfig { parallel: 2, batch_size: 32, ctx_size: 512, ..SchedulerConfig::default() };
    let s = Scheduler::start(Arc::clone(e), Pool::new(2), config).unwrap();
    let vocab = e.model().config().vocab_size;
    let prompts = [prompt(300, 1, vocab), prompt(90, 2, vocab), prompt(260, 3, vocab)];
    let handles: Vec<_> = prompts.iter().map(|p| s.submit(p.clone(), greedy()).unwrap()).collect();
    for (h, p) in handles.into_iter().zip(&prompts) {
        let done = h.wait(|_| Flow::Continue).unwrap();
        assert_eq!(done.ids, alone(e.model(), p), "a prompt of {} tokens", p.len());
    }
    let st = s.stats().unwrap();
    let window = st.window_blocks.expect("the window layers have blocks of their own");
    // Two sequences at once would need more window blocks than there are, had they kept all.
    let whole = (300 + GENERATED).div_ceil(BLOCK_TOKENS) + (260 + GENERATED).div_ceil(BLOCK_TOKENS);
    assert!(window.total < whole, "{window:?}");
    assert_eq!(st.preemptions, 0, "{st:?}");
    assert_eq!((st.blocks.in_use, window.in_use), (0, 0), "{st:?}");
    s.check_blocks().unwrap();

    // A prompt seen before, global and window blocks, comes from the cache (emptied first, so
    // that no other traffic has evicted them).
    s.clear_cache().unwrap();
    let first = s.submit(prompts[0].clone(), greedy()).unwrap().wait(|_| Flow::Continue).unwrap();
    let again = s.submit(prompts[0].clone(), greedy()).unwrap().wait(|_| Flow::Continue).unwrap();
    assert_eq!(first.usage.cached_tokens, 0);
    assert_eq!(again.usage.cached_tokens, (300 - 1) / BLOCK_TOKENS * BLOCK_TOKENS, "{:?}", again.usage);
    assert_eq!(again.ids, first.ids);
    s.check_blocks().unwrap();
}
