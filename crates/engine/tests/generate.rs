//! Generation on the real demo model (SmolLM2-135M-Instruct Q4_1): greedy text equal to
//! llama.cpp's, KV-cache reuse between requests, and every way generation ends.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use onebit_engine::{Engine, Event, FinishReason, Flow, GenerateRequest, SamplingParams};
use onebit_model::{Model, ModelOptions};

fn engine() -> Option<Engine> {
    let path = onebit_testkit::demo_model()?;
    Some(Engine::new(Model::load(path, &ModelOptions::default()).unwrap()).unwrap())
}

fn greedy(max: usize) -> GenerateRequest {
    GenerateRequest { sampling: SamplingParams::greedy(), max_tokens: Some(max), ..Default::default() }
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
    let want: Vec<u32> = p["greedy"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    let mut s = e.session(512);
    let mut streamed = String::new();
    let done = s
        .generate(&ids, &greedy(want.len()), &mut |ev| {
            if let Event::Token { text, .. } | Event::Text { text } = ev {
                streamed.push_str(text);
            }
            Flow::Continue
        })
        .unwrap();
    assert_eq!(done.ids, want);
    assert_eq!(done.finish, FinishReason::Length);
    assert_eq!(done.text, streamed);
    assert_eq!(done.text, p["greedy_text"].as_str().unwrap());
}

#[test]
fn a_follow_up_prefills_only_its_new_tokens() {
    let Some(e) = engine() else { return };
    let mut s = e.session(512);
    let first = e.tokenize("One, two, three,", false).unwrap();
    let a = s.generate(&first, &greedy(4), &mut |_| Flow::Continue).unwrap();
    assert_eq!(a.reused_tokens, 0);
    // The next prompt extends the conversation: everything already cached is reused.
    let mut next = first.clone();
    next.extend(&a.ids);
    next.extend(e.tokenize(" and", false).unwrap().iter().skip(1));
    let b = s.generate(&next, &greedy(4), &mut |_| Flow::Continue).unwrap();
    // (The last generated token was sampled but never run, so it is not in the cache.)
    assert_eq!(b.reused_tokens, first.len() + a.ids.len() - 1);
    // Same prompt again: all but the last token come from the cache.
    let c = s.generate(&next, &greedy(4), &mut |_| Flow::Continue).unwrap();
    assert_eq!(c.reused_tokens, next.len() - 1);
    assert_eq!(c.ids, b.ids, "reusing the cache gives the same tokens");
    // A different prompt shares only its prefix.
    s.reset();
    let d = s.generate(&next, &greedy(4), &mut |_| Flow::Continue).unwrap();
    assert_eq!((d.reused_tokens, d.ids.clone()), (0, b.ids));
}

#[test]
fn generation_ends_for_each_reason() {
    let Some(e) = engine() else { return };
    let prompt = e.tokenize("The capital of France is", false).unwrap();

    // A stop string spanning tokens is cut, and never streamed.
    let full = e.session(512).generate(&prompt, &greedy(24), &mut |_| Flow::Continue).unwrap();
    let cut = full.text.find("The").expect("llama.cpp's continuation repeats 'The'");
    let req = GenerateRequest { stop: vec!["The".into()], ..greedy(24) };
    let mut streamed = String::new();
    let stopped = e
        .session(512)
        .generate(&prompt, &req, &mut |ev| {
            if let Event::Token { text, .. } | Event::Text { text } = ev {
                streamed.push_str(text);
            }
            Flow::Continue
        })
        .unwrap();
    assert_eq!(stopped.finish, FinishReason::Stop);
    assert_eq!(stopped.text, full.text[..cut]);
    assert_eq!(streamed, stopped.text);

    // A full context: every position holds a token, and one more is sampled from the last.
    let ctx = prompt.len() + 3;
    let r = e.session(ctx).generate(&prompt, &greedy(100), &mut |_| Flow::Continue).unwrap();
    assert_eq!((r.finish, r.completion_tokens), (FinishReason::Context, ctx - prompt.len() + 1));

    // A prompt that does not fit is an error, not a truncation.
    let err = e.session(4).generate(&prompt, &greedy(1), &mut |_| Flow::Continue).unwrap_err();
    assert!(err.to_string().contains("context"), "{err}");

    // Cancellation, from the event callback or from a flag.
    let r = e.session(512).generate(&prompt, &greedy(100), &mut |_| Flow::Stop).unwrap();
    assert_eq!(r.finish, FinishReason::Cancelled);
    let flag = Arc::new(AtomicBool::new(true));
    let req = GenerateRequest { cancel: Some(flag), ..greedy(100) };
    let r = e.session(512).generate(&prompt, &req, &mut |_| Flow::Continue).unwrap();
    assert_eq!((r.finish, r.completion_tokens), (FinishReason::Cancelled, 0));

    // The chat template's end-of-turn token ends an answer.
    let chat = e.chat_prompt(&[onebit_engine::message("user", "Say hi.")], &Default::default()).unwrap();
    let ids = e.tokenize(&chat, true).unwrap();
    let r = e.session(1024).generate(&ids, &greedy(400), &mut |_| Flow::Continue).unwrap();
    assert_eq!(r.finish, FinishReason::Stop, "{:?}", r.text);
}

#[test]
fn seeded_sampling_is_reproducible_and_logprobs_are_reported() {
    let Some(e) = engine() else { return };
    let prompt = e.tokenize("Once upon a time", false).unwrap();
    let req = GenerateRequest {
        sampling: SamplingParams { seed: Some(1234), ..SamplingParams::default() },
        max_tokens: Some(16),
        logprobs: Some(3),
        ..Default::default()
    };
    let mut tops = Vec::new();
    let a = e
        .session(256)
        .generate(&prompt, &req, &mut |ev| {
            if let Event::Token { logprobs: Some(lp), .. } = ev {
                assert_eq!(lp.top.len(), 3);
                assert!(lp.logprob <= 0.0 && lp.top[0].1 >= lp.logprob);
                tops.push(lp.id);
            }
            Flow::Continue
        })
        .unwrap();
    let b = e.session(256).generate(&prompt, &req, &mut |_| Flow::Continue).unwrap();
    assert_eq!(a.ids, b.ids);
    assert_eq!(tops, a.ids);
    assert_eq!(a.seed, 1234);
}
