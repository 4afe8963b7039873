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
    SpecOverride {
        mode: Some(SpecMode::Lookup),
        draft_max: Some(draft_max),
        adaptive: Some(adaptive),
        ..SpecOverride::default()
    }
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
fn same_tokens(e: &Arc<Engine>, sampling: SamplingParams, n: usize) -> (usize, usize) {
    same_tokens_with(&start(e, 1), e, &PROMPTS, sampling, n, [spec(false, 8), spec(true, 16)])
}

/// [`same_tokens`] on `s` for `prompts`, with a forced and an adaptive way of drafting.
fn same_tokens_with(
    s: &Scheduler,
    e: &Engine,
    prompts: &[&str],
    sampling: SamplingParams,
    n: usize,
    [forced, adaptive]: [SpecOverride; 2],
) -> (usize, usize) {
    let mut totals = (0, 0);
    for text in prompts {
        let ids = e.tokenize(text, true).unwrap();
        let plain = generate(s, &ids, request(sampling.clone(), n, SpecOverride::default()));
        assert_eq!(plain.drafted, 0);
        for sp in [forced, adaptive] {
            let got = generate(s, &ids, request(sampling.clone(), n, sp));
            assert_eq!(got.ids, plain.ids, "with {sp:?} on {text:?}");
            assert_eq!(got.text, plain.text);
            if sp == forced {
                totals.0 += got.drafted;
                totals.1 += got.accepted;
            }
        }
    }
    totals
}

/// `prompts` submitted all at once, each drafting as `spec_for(i)` says, give the tokens they
/// give alone without drafting; no block is left behind.
fn same_tokens_together(
    s: &Scheduler,
    e: &Engine,
    prompts: &[&str],
    n: usize,
    spec_for: impl Fn(usize) -> SpecOverride,
) {
    let prompts: Vec<Vec<u32>> = prompts.iter().map(|p| e.tokenize(p, true).unwrap()).collect();
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| generate(s, p, request(SamplingParams::greedy(), n, SpecOverride::default())).ids)
        .collect();
    let handles: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| s.submit(p.clone(), request(SamplingParams::greedy(), n, spec_for(i))).unwrap())
        .collect();
    for (h, want) in handles.into_iter().zip(want) {
        assert_eq!(h.wait(|_| Flow::Continue).unwrap().ids, want);
    }
    s.check_blocks().unwrap();
}

fn fixture_engine(name: &str) -> Option<Arc<Engine>> {
    let path = onebit_testkit::shared_file(&format!("models/{name}"))?;
    Some(Arc::new(Engine::new(Model::load(path, &ModelOptions::default()).unwrap()).unwrap()))
}

#[test]
fn greedy_tokens_are_the_same_with_drafts_on_fixture_models() {
    for name in ["qwen3-q1_0.gguf", "llama-q4_1.gguf", "qwen2-q4_0.gguf", "qwen3-tq2_0.gguf"] {
        let Some(e) = fixture_engine(name) else { return };
        let (drafted, kept) = same_tokens(&e, SamplingParams::greedy(), 128);
        // Random weights repeat themselves: the lookup finds drafts and some are kept.
        assert!(drafted > 0 && kept > 0, "{name}: drafted {drafted}, kept {kept}");
    }
}

#[test]
fn greedy_and_seeded_tokens_are_the_same_with_drafts_on_the_demo_model() {
    let Some(path) = onebit_testkit::demo_model() else { return };
    let e = Arc::new(Engine::new(Model::load(path, &ModelOptions::default()).unwrap()).unwrap());
    let (drafted, kept) = same_tokens(&e, SamplingParams::greedy(), 128);
    assert!(drafted > 0 && kept > 0, "drafted {drafted}, kept {kept}");
    let seeded = SamplingParams { temperature: 0.8, seed: Some(7), ..SamplingParams::default() };
    same_tokens(&e, seeded, 48);
}

#[test]
fn drafting_sequences_share_steps_with_others() {
    let Some(e) = fixture_engine("qwen3-q8_0.gguf") else { return };
    // Half draft, half do not, all at once.
    let spec_for = |i: usize| if i.is_multiple_of(2) { spec(false, 6) } else { SpecOverride::default() };
    same_tokens_together(&start(&e, 4), &e, &PROMPTS[..8], 64, spec_for);
}

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap()
}

/// The cache after verifying drafts with a rejection is, over the positions it keeps, the cache
/// of a run that never drafted, bit for bit: a verification pass computes the same keys and
/// values as single-token steps, and a rejected position is simply forgotten.
#[test]
fn rejected_drafts_leave_the_cache_as_if_never_drafted() {
    use onebit_model::{LogitsWanted, Scratch};
    for name in ["qwen3-q1_0.gguf", "llama-q4_1.gguf", "qwen2-f16.gguf"] {
        let Some(path) = onebit_testkit::shared_file(&format!("models/{name}")) else { return };
        let model = Model::load(path, &ModelOptions::default()).unwrap();
        let vocab = model.config().vocab_size as u32;
        let (pool, mut scratch) = (Pool::new(2), Scratch::new());
        let prompt: Vec<u32> = (0..19).map(|i| (i * 7919 + 11) % vocab).collect();
        // Plain greedy decoding, one token per step.
        let mut plain = model.new_cache(256).unwrap();
        let l = model.forward_one(&pool, &mut plain, &prompt, LogitsWanted::Last, &mut scratch).unwrap();
        let mut toks = vec![argmax(l.last(0).unwrap())];
        for _ in 0..30 {
            let next = *toks.last().unwrap();
            let l = model.forward_one(&pool, &mut plain, &[next], LogitsWanted::Last, &mut scratch).unwrap();
            toks.push(argmax(l.last(0).unwrap()));
        }
        // Each step drafts the two right tokens and a wrong third: two kept, one rejected.
        let mut drafted = model.new_cache(256).unwrap();
        model.forward_one(&pool, &mut drafted, &prompt, LogitsWanted::Last, &mut scratch).unwrap();
        let mut i = 0;
        while i + 3 < toks.len() {
            let wrong = (toks[i + 3] + 1) % vocab;
            let start = drafted.len();
            let input = [toks[i], toks[i + 1], toks[i + 2], wrong];
            let l = model.forward_one(&pool, &mut drafted, &input, LogitsWanted::All, &mut scratch).unwrap();
            for j in 0..3 {
                assert_eq!(argmax(l.get(0, j).unwrap()), toks[i + 1 + j], "{name}: verified position {j}");
            }
            drafted.truncate(start + 3);
            i += 3;
        }
        assert!(drafted.len() > prompt.len() + 20);
        for p in 0..drafted.len() {
            assert!(drafted.position_bytes(p) == plain.position_bytes(p), "{name}: position {p} differs");
        }
    }
}

/// Sampling at a verified position draws from the model's own distribution: the token drawn
/// right after a draft was made (temperature 1, nothing cut) is checked by a chi-square test
/// against the softmax of the logits the model gives that position when it runs alone.
#[test]
fn sampled_tokens_at_verified_positions_follow_the_models_distribution() {
    use onebit_model::{LogitsWanted, Scratch};
    let Some(path) = onebit_testkit::demo_model() else { return };
    let e = Arc::new(Engine::new(Model::load(&path, &ModelOptions::default()).unwrap()).unwrap());
    let s = start(&e, 4);
    let prompt = e.tokenize("one two three four. one two three four. one two three four. one two", false).unwrap();
    let sampling = |seed| SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let runs: Vec<Completion> =
        (0..600).map(|seed| generate(&s, &prompt, request(sampling(seed), 2, spec(false, 4)))).collect();
    assert!(runs.iter().map(|c| c.drafted).sum::<usize>() > 300, "the second token was mostly drafted for");
    // Condition on the most frequent first token.
    let mut first = std::collections::HashMap::new();
    runs.iter().for_each(|c| *first.entry(c.ids[0]).or_insert(0usize) += 1);
    let (&x0, _) = first.iter().max_by_key(|&(_, n)| *n).unwrap();
    let seconds: Vec<u32> = runs.iter().filter(|c| c.ids[0] == x0).map(|c| c.ids[1]).collect();
    let n = seconds.len() as f64;
    assert!(n >= 200.0, "only {n} runs share the first token");
    // The model's distribution there, from a plain single-sequence pass.
    let model = e.model();
    let mut cache = model.new_cache(256).unwrap();
    let mut scratch = Scratch::new();
    let mut ctx = prompt.clone();
    ctx.push(x0);
    let l = model.forward_one(&Pool::new(2), &mut cache, &ctx, LogitsWanted::Last, &mut scratch).unwrap();
    let row = l.last(0).unwrap();
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = row.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let p = |id: u32| ((row[id as usize] - max) as f64).exp() / z;
    // Bins: every token expected at least 5 times, and the rest together.
    let mut ids: Vec<u32> = (0..row.len() as u32).filter(|&id| p(id) * n >= 5.0).collect();
    ids.sort_unstable();
    let observed = |id: u32| seconds.iter().filter(|&&t| t == id).count() as f64;
    let mut chi2 = 0.0;
    let mut rest_expected = n;
    let mut rest_observed = n;
    for &id in &ids {
        let (o, e) = (observed(id), p(id) * n);
        chi2 += (o - e).powi(2) / e;
        rest_expected -= e;
        rest_observed -= o;
    }
    let mut df = ids.len() as f64 - 1.0;
    if rest_expected >= 5.0 {
        chi2 += (rest_observed - rest_expected).powi(2) / rest_expected;
        df += 1.0;
    }
    assert!(df >= 1.0, "the distribution is too peaked to test ({} bins)", ids.len());
    // The 99.9th percentile of chi-square with `df` degrees of freedom (Wilson–Hilferty).
    let a = 2.0 / (9.0 * df);
    let critical = df * (1.0 - a + 3.09 * a.sqrt()).powi(3);
    assert!(chi2 < critical, "chi-square {chi2:.1} over {df} degrees of freedom (critical {critical:.1})");
}

fn with_draft(target: &str, draft: &str) -> Option<Result<Arc<Engine>, onebit_engine::EngineError>> {
    let load = |name: &str| -> Option<Model> {
        let path = match name {
            "demo" => onebit_testkit::demo_model()?,
            _ => onebit_testkit::shared_file(&format!("models/{name}"))?,
        };
        Some(Model::load(path, &ModelOptions::default()).unwrap())
    };
    let mut e = Engine::new(load(target)?).unwrap();
    Some(e.set_draft(load(draft)?).map(|()| Arc::new(e)))
}

fn draft_spec(adaptive: bool) -> SpecOverride {
    SpecOverride {
        mode: Some(SpecMode::Draft),
        draft_max: Some(6),
        adaptive: Some(adaptive),
        p_min: Some(0.0),
        ..SpecOverride::default()
    }
}

/// A draft model guesses, the target decides: the same tokens as without it (20 prompts, 128
/// tokens each), for a draft that is the target itself (every guess kept), another
/// quantization of it, another model with the same vocabulary, and the demo model with the
/// fixture model of its vocabulary as its draft.
#[test]
fn a_draft_model_leaves_the_tokens_unchanged() {
    for (target, draft, all_kept) in [
        ("qwen3-q1_0.gguf", "qwen3-q1_0.gguf", true),
        ("qwen3-q2_0.gguf", "qwen3-q8_0.gguf", false),
        ("llama-q4_1.gguf", "qwen3-tq2_0.gguf", false),
        ("demo", "llama-q4_1.gguf", false),
    ] {
        let Some(e) = with_draft(target, draft) else { return };
        let e = e.unwrap();
        let s = start(&e, 4);
        let ways = [draft_spec(false), draft_spec(true)];
        let (drafted, kept) = same_tokens_with(&s, &e, &PROMPTS, SamplingParams::greedy(), 128, ways);
        assert!(drafted > 0, "{target} drafted by {draft}: nothing drafted");
        if all_kept {
            assert_eq!(kept, drafted, "a model drafting for itself is always right");
        }
        // Several drafting sequences at once, beside one that does not draft.
        let spec_for = |i: usize| if i == 3 { SpecOverride::default() } else { draft_spec(false) };
        same_tokens_together(&s, &e, &PROMPTS[10..14], 48, spec_for);
    }
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused() {
    let Some(r) = with_draft("llama-q4_1.gguf", "qwen3-q1_0.gguf") else { return };
    let msg = r.expect_err("refused").to_string();
    assert!(msg.contains("vocabulary"), "{msg}");
    // Asking for a draft model that is not there is an error too, before any work.
    let Some(e) = fixture_engine("qwen3-q1_0.gguf") else { return };
    let s = start(&e, 1);
    let err = s.submit(vec![1, 2, 3], request(SamplingParams::greedy(), 4, draft_spec(true))).err().unwrap();
    assert!(err.to_string().contains("draft model"), "{err}");
}
