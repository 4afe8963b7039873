//! Generation through the serving engine on the real demo model (SmolLM2-135M-Instruct Q4_1):
//! greedy text equal to llama.cpp's (alone and with other requests in the batch), prefix reuse
//! between requests, and every way generation ends.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use onebit_engine::{
    Completion, Engine, Event, FinishReason, Flow, GenerateRequest, SamplingParams, Scheduler, SchedulerConfig,
};
use onebit_kernels::Pool;
use onebit_model::{Model, ModelOptions};

fn engine() -> Option<Arc<Engine>> {
    let path = onebit_testkit::demo_model()?;
    Some(Arc::new(Engine::new(Model::load(path, &ModelOptions::default()).unwrap()).unwrap()))
}

fn start(e: &Arc<Engine>, parallel: usize, ctx: usize) -> Scheduler {
    let config = SchedulerConfig { parallel, ctx_size: ctx, ..SchedulerConfig::default() };
    Scheduler::start(Arc::clone(e), Pool::new(2), config).unwrap()
}

fn greedy(max: usize) -> GenerateRequest {
    GenerateRequest { sampling: SamplingParams::greedy(), max_tokens: Some(max), ..Default::default() }
}

/// Run a request to its end: the completion and the text streamed on the way.
fn run(s: &Scheduler, prompt: &[u32], req: &GenerateRequest) -> (Completion, String) {
    let mut streamed = String::new();
    let done = s
        .submit(prompt.to_vec(), req.clone())
        .unwrap()
        .wait(|ev| {
            if let Event::Token { text, .. } | Event::Text { text } = ev {
                streamed.push_str(text);
            }
            Flow::Continue
        })
        .unwrap();
    (done, streamed)
}

fn fixture_greedy(p: &serde_json::Value) -> Vec<u32> {
    p["greedy"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect()
}

#[test]
fn greedy_continuation_matches_llama_cpp() {
    let (Some(e), Some(fx)) = (engine(), onebit_testkit::fixture("logits-SmolLM2-135M-Instruct.Q4_1.json")) else {
        return;
    };
    let p = &fx["prompts"][0];
    let ids = e.tokenize(p["text"].as_str().unwrap(), false).unwrap();
    let want_prompt: Vec<u32> = p["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    assert_eq!(ids, want_prompt);
    let want = fixture_greedy(p);
    let s = start(&e, 1, 512);
    let (done, streamed) = run(&s, &ids, &greedy(want.len()));
    assert_eq!(done.ids, want);
    assert_eq!(done.finish, FinishReason::Length);
    assert_eq!(done.text, streamed);
    assert_eq!(done.text, p["greedy_text"].as_str().unwrap());
}

#[test]
fn the_same_prompt_among_others_gives_the_same_tokens() {
    let (Some(e), Some(fx)) = (engine(), onebit_testkit::fixture("logits-SmolLM2-135M-Instruct.Q4_1.json")) else {
        return;
    };
    let s = start(&e, 6, 1024);
    let p = &fx["prompts"][0];
    let ids = e.tokenize(p["text"].as_str().unwrap(), false).unwrap();
    let want = fixture_greedy(p);
    // The fixture prompt five times (shared blocks, once computed) among every other prompt.
    let mut handles = Vec::new();
    for (i, other) in fx["prompts"].as_array().unwrap().iter().enumerate().skip(1) {
        let toks: Vec<u32> = other["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        handles.push((false, s.submit(toks, greedy(8 + i)).unwrap()));
        handles.push((true, s.submit(ids.clone(), greedy(want.len())).unwrap()));
    }
    for (is_fixture, h) in handles {
        let done = h.wait(|_| Flow::Continue).unwrap();
        if is_fixture {
            assert_eq!(done.ids, want);
        }
    }
    assert_eq!(s.stats().unwrap().blocks.in_use, 0);
}

#[test]
fn a_follow_up_prefills_only_its_new_tokens() {
    let Some(e) = engine() else { return };
    let s = start(&e, 1, 512);
    let text = "One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen, fourteen,";
    let first = e.tokenize(text, false).unwrap();
    let (a, _) = run(&s, &first, &greedy(4));
    assert_eq!(a.usage.cached_tokens, 0);
    // The next prompt extends the conversation: every whole block already computed is reused
    // (the prompt and the answer, but for the last answer token, which was never run).
    let mut next = first.clone();
    next.extend(&a.ids);
    next.extend(e.tokenize(" and", false).unwrap().iter().skip(1));
    let (b, _) = run(&s, &next, &greedy(4));
    let blocks = onebit_model::BLOCK_TOKENS;
    let computed = first.len() + a.ids.len() - 1;
    assert_eq!(b.usage.cached_tokens, (computed / blocks * blocks).min((next.len() - 1) / blocks * blocks));
    assert!(b.usage.cached_tokens >= blocks);
    let fresh = start(&e, 1, 512);
    let (c, _) = run(&fresh, &next, &greedy(4));
    assert_eq!((c.usage.cached_tokens, &c.ids), (0, &b.ids), "the cache changes nothing but the work");
}

#[test]
fn generation_ends_for_each_reason() {
    let Some(e) = engine() else { return };
    let prompt = e.tokenize("The capital of France is", false).unwrap();
    let s = start(&e, 2, 512);

    // A stop string spanning tokens is cut, and never streamed.
    let (full, _) = run(&s, &prompt, &greedy(24));
    let cut = full.text.find("The").expect("llama.cpp's continuation repeats 'The'");
    let req = GenerateRequest { stop: vec!["The".into()], ..greedy(24) };
    let (stopped, streamed) = run(&s, &prompt, &req);
    assert_eq!(stopped.finish, FinishReason::Stop);
    assert_eq!(stopped.text, full.text[..cut]);
    assert_eq!(streamed, stopped.text);

    // A full context: every position holds a token, and one more is sampled from the last.
    let ctx = prompt.len() + 3;
    let small = start(&e, 1, ctx);
    let (r, _) = run(&small, &prompt, &greedy(100));
    assert_eq!((r.finish, r.usage.completion_tokens), (FinishReason::Context, ctx - prompt.len() + 1));

    // A prompt that does not fit is an error, not a truncation.
    let err = start(&e, 1, 4).submit(prompt.clone(), greedy(1)).unwrap_err();
    assert!(err.to_string().contains("context"), "{err}");

    // No tokens asked for: the prompt is computed, nothing is generated.
    let (r, _) = run(&s, &prompt, &greedy(0));
    assert_eq!((r.finish, r.usage.completion_tokens), (FinishReason::Length, 0));

    // Cancellation, from the event callback or from a flag.
    let r = s.submit(prompt.clone(), greedy(100)).unwrap().wait(|_| Flow::Stop).unwrap();
    assert_eq!(r.finish, FinishReason::Cancelled);
    let flag = Arc::new(AtomicBool::new(true));
    let req = GenerateRequest { cancel: Some(flag), ..greedy(100) };
    let (r, _) = run(&s, &prompt, &req);
    assert_eq!((r.finish, r.usage.completion_tokens), (FinishReason::Cancelled, 0));

    // The chat template's end-of-turn token ends an answer.
    let chat = e.chat_prompt(&[onebit_engine::message("user", "Say hi.")], &Default::default()).unwrap();
    let ids = e.tokenize(&chat, true).unwrap();
    let (r, _) = run(&s, &ids, &greedy(400));
    assert_eq!(r.finish, FinishReason::Stop, "{:?}", r.text);
}

#[test]
fn seeded_sampling_is_reproducible_and_logprobs_are_reported() {
    let Some(e) = engine() else { return };
    let s = start(&e, 2, 256);
    let prompt = e.tokenize("Once upon a time", false).unwrap();
    let req = GenerateRequest {
        sampling: SamplingParams { seed: Some(1234), ..SamplingParams::default() },
        max_tokens: Some(16),
        logprobs: Some(3),
        ..Default::default()
    };
    let mut tops = Vec::new();
    let a = s
        .submit(prompt.clone(), req.clone())
        .unwrap()
        .wait(|ev| {
            if let Event::Token { logprobs: Some(lp), .. } = ev {
                assert_eq!(lp.top.len(), 3);
                assert!(lp.logprob <= 0.0 && lp.top[0].1 >= lp.logprob);
                tops.push(lp.id);
            }
            Flow::Continue
        })
        .unwrap();
    let (b, _) = run(&s, &prompt, &req);
    assert_eq!(a.ids, b.ids);
    assert_eq!(tops, a.ids);
    assert_eq!(a.seed, 1234);
}
