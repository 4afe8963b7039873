//! Speculative decoding (prompt lookup) changes nothing but speed: on the fixture models and
//! the demo model, the tokens with drafting, forced or adaptive, are the tokens without it,
//! greedy and sampled with a seed; the kept drafts are counted.

use std::sync::Arc;

use onebit_engine::{
    Completion, Engine, Flow, GenerateRequest, SamplingParams, Scheduler, SchedulerConfig, SpecMode, SpecOverride,
};
use onebit_kernels::Pool;
use onebit_model::{Model, ModelOptions};

fn start(e: &Arc<Engine>, parallel: usize) -> Scheduler {
    let config = SchedulerConfig { parallel, ctx_size: 1024, ..SchedulerConfig::default() };
    Scheduler::start(Arc::clone(e), Pool::new(2), config).unwrap()
}

fn spec(adaptive: bool, draft_max: usize) -> SpecOverride {
    SpecOverride { mode: Some(SpecMode::Lookup), draft_max: Some(draft_max), adaptive: Some(adaptive), draft_min: None }
}

/// Prompts with something to look up (repeated phrases, lists, code) and without.
const PROMPTS: [&str; 20] = [
    "The cat sat on the mat. The cat sat on the mat. The cat sat on the",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Once upon a time",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown",
    "Monday, Tuesday, Wednesday, Thursday,",
    "<html><body><p>Hello</p><p>World</p><p>",
    "Q: What is 2+2?\nA: 4\nQ: What is 3+3?\nA: 6\nQ: What is 4+4?\nA:",
    "The capital of France is",
    "a b c d e f g h i j k l m n o p",
    "SELECT name FROM users WHERE id = 1; SELECT name FROM users WHERE id = 2; SELECT",
    "Roses are red, violets are blue,",
    "{\"a\": 1, \"b\": 2, \"c\": 3, \"d\":",
    "To be or not to be, that is the question.",
    "I like apples. I like pears. I like",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n",
    "The the the the the the the",
    "Summary of the text above:",
    "- item one\n- item two\n- item three\n-",
    "Hello! How are you today? Hello! How are",
];

fn generate(s: &Scheduler, prompt: &[u32], req: GenerateRequest) -> Completion {
    s.submit(prompt.to_vec(), req).unwrap().wait(|_| Flow::Continue).unwrap()
}

fn request(sampling: SamplingParams, n: usize, speculative: SpecOverride) -> GenerateRequest {
    GenerateRequest { sampling, max_tokens: Some(n), ignore_eos: true, speculative, ..Default::default() }
}

/// For every prompt: plain, forced-drafting and adaptive runs give the same tokens. Returns
/// (drafted, kept) over the forced runs.
fn same_tokens(e: &Arc<Engine>, sampling: SamplingParams, n: usize, parallel: usize) -> (usize, usize) {
    let s = start(e, parallel);
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| e.tokenize(p, true).unwrap()).collect();
    let mut totals = (0, 0);
    for ids in &prompts {
        let plain = generate(&s, ids, request(sampling.clone(), n, SpecOverride::default()));
        assert_eq!(plain.drafted, 0);
        for sp in [spec(false, 8), spec(true, 16)] {
            let got = generate(&s, ids, request(sampling.clone(), n, sp));
            assert_eq!(got.ids, plain.ids, "with {sp:?} on {ids:?}");
            assert_eq!(got.text, plain.text);
            if sp.adaptive == Some(false) {
                totals.0 += got.drafted;
                totals.1 += got.accepted;
            }
        }
    }
    totals
}

fn fixture_engine(name: &str) -> Option<Arc<Engine>> {
    let path = onebit_testkit::shared_file(&format!("models/{name}"))?;
    Some(Arc::new(Engine::new(Model::load(path, &ModelOptions::default()).unwrap()).unwrap()))
}

#[test]
fn greedy_tokens_are_the_same_with_drafts_on_fixture_models() {
    for name in ["qwen3-q1_0.gguf", "llama-q4_1.gguf", "qwen2-q4_0.gguf", "qwen3-tq2_0.gguf"] {
        let Some(e) = fixture_engine(name) else { return };
        let (drafted, kept) = same_tokens(&e, SamplingParams::greedy(), 128, 1);
        // Random weights repeat themselves: the lookup finds drafts and some are kept.
        assert!(drafted > 0 && kept > 0, "{name}: drafted {drafted}, kept {kept}");
    }
}

#[test]
fn greedy_and_seeded_tokens_are_the_same_with_drafts_on_the_demo_model() {
    let Some(path) = onebit_testkit::demo_model() else { return };
    let e = Arc::new(Engine::new(Model::load(path, &ModelOptions::default()).unwrap()).unwrap());
    let (drafted, kept) = same_tokens(&e, SamplingParams::greedy(), 128, 1);
    assert!(drafted > 0 && kept > 0, "drafted {drafted}, kept {kept}");
    let seeded = SamplingParams { temperature: 0.8, seed: Some(7), ..SamplingParams::default() };
    same_tokens(&e, seeded, 48, 1);
}

#[test]
fn drafting_sequences_share_steps_with_others() {
    let Some(e) = fixture_engine("qwen3-q8_0.gguf") else { return };
    let s = start(&e, 4);
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().take(8).map(|p| e.tokenize(p, true).unwrap()).collect();
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| generate(&s, p, request(SamplingParams::greedy(), 64, SpecOverride::default())).ids)
        .collect();
    // Half draft, half do not, all at once.
    let handles: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let sp = if i % 2 == 0 { spec(false, 6) } else { SpecOverride::default() };
            s.submit(p.clone(), request(SamplingParams::greedy(), 64, sp)).unwrap()
        })
        .collect();
    for (h, want) in handles.into_iter().zip(want) {
        assert_eq!(h.wait(|_| Flow::Continue).unwrap().ids, want);
    }
    s.check_blocks().unwrap();
}
