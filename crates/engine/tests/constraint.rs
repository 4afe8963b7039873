//! Constrained decoding end to end: every output under a JSON schema is complete, parses and
//! validates (sampled at temperature 1 on a real model and on random weights), lazy triggers
//! start the grammar mid-answer, forced tokens skip sampling, bad grammars fail at submission,
//! and unconstrained requests are untouched.

use std::sync::Arc;

use onebit_engine::{
    Completion, Constraint, Engine, EngineError, FinishReason, Flow, GenerateRequest, Grammar, SamplingParams,
    Scheduler, SchedulerConfig,
};
use onebit_kernels::Pool;
use onebit_model::{Model, ModelOptions};
use serde_json::Value as Json;

fn load(path: std::path::PathBuf) -> Arc<Engine> {
    Arc::new(Engine::new(Model::load(path, &ModelOptions::default()).unwrap()).unwrap())
}

fn fixture() -> Option<Arc<Engine>> {
    onebit_testkit::shared_file("models/qwen3-q8_0.gguf").filter(|p| p.is_file()).map(load)
}

fn demo() -> Option<Arc<Engine>> {
    onebit_testkit::demo_model().map(load)
}

fn start(e: &Arc<Engine>, parallel: usize) -> Scheduler {
    let config =
        SchedulerConfig { parallel, batch_size: 512, queue_size: 256, ctx_size: 4096, ..SchedulerConfig::default() };
    Scheduler::start(Arc::clone(e), Pool::new(2), config).unwrap()
}

fn prompt(e: &Engine, text: &str) -> Vec<u32> {
    let p = e.chat_prompt(&[onebit_engine::message("user", text)], &Default::default()).unwrap();
    e.tokenize(&p, true).unwrap()
}

/// Plain sampling at temperature 1 (no truncation), seeded.
fn temp1(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: Some(seed), ..Default::default() }
}

fn schemas() -> Vec<(String, Json)> {
    let doc: Json = serde_json::from_str(include_str!("data/json-schemas.json")).unwrap();
    doc["schemas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap().to_string(), s["schema"].clone()))
        .collect()
}

fn constrained(grammar: Grammar, sampling: SamplingParams, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        sampling,
        max_tokens: Some(max_tokens),
        constraint: Some(Constraint::new(grammar)),
        ..Default::default()
    }
}

#[test]
fn the_schema_set_is_large_and_every_schema_compiles() {
    let Some(e) = fixture() else { return };
    let all = schemas();
    assert!(all.len() >= 50, "{} schemas", all.len());
    for (name, schema) in &all {
        let c = Constraint::new(Grammar::JsonSchema(schema.clone()));
        if let Err(err) = e.check_constraint(&c) {
            panic!("{name}: {err}");
        }
        jsonschema::validator_for(schema).unwrap_or_else(|err| panic!("{name}: the validator refuses it: {err}"));
    }
}

/// Generate under every schema (concurrently through one scheduler) and check each output.
fn every_schema_holds(e: &Arc<Engine>, max_tokens: usize) {
    let s = start(e, 8);
    let all = schemas();
    let t = std::time::Instant::now();
    let handles: Vec<_> = all
        .iter()
        .enumerate()
        .map(|(i, (name, schema))| {
            // Plain text, no chat template: short prompts keep the test's prefill small.
            let ids = e.tokenize(&format!("A JSON value ({name}):"), false).unwrap();
            let req = constrained(Grammar::JsonSchema(schema.clone()), temp1(1000 + i as u64), max_tokens);
            s.submit(ids, req).unwrap()
        })
        .collect();
    eprintln!("{} requests compiled and submitted in {:.2} s", all.len(), t.elapsed().as_secs_f64());
    for ((name, schema), h) in all.iter().zip(handles) {
        let done = h.wait(|_| Flow::Continue).unwrap();
        let head: String = done.text.chars().take(300).collect();
        assert_eq!(done.finish, FinishReason::Stop, "{name}: unfinished after {} tokens: {head}", done.ids.len());
        let value: Json =
            serde_json::from_str(&done.text).unwrap_or_else(|err| panic!("{name}: not JSON ({err}): {}", done.text));
        let validator = jsonschema::validator_for(schema).unwrap();
        if let Err(err) = validator.validate(&value) {
            panic!("{name}: {} does not validate: {err}", done.text);
        }
    }
    let st = s.stats().unwrap();
    eprintln!(
        "{:.2} s; {} masks, {:.0} µs each on average; {} steps",
        t.elapsed().as_secs_f64(),
        st.masks,
        st.mask_micros as f64 / st.masks.max(1) as f64,
        st.steps
    );
}

#[test]
fn json_schemas_hold_at_temperature_1_on_random_weights() {
    let Some(e) = fixture() else { return };
    every_schema_holds(&e, 1000);
}

#[test]
fn json_schemas_hold_at_temperature_1_on_smollm2() {
    let Some(e) = demo() else { return };
    every_schema_holds(&e, 1000);
}

#[test]
fn an_invalid_grammar_fails_at_submission_and_queues_nothing() {
    let Some(e) = fixture() else { return };
    let s = start(&e, 1);
    let bad = [
        Grammar::JsonSchema(serde_json::json!({ "type": "no such type" })),
        Grammar::JsonSchema(serde_json::json!(42)),
        Grammar::Regex("(unclosed".into()),
        Grammar::Lark("start: (".into()),
        Grammar::Gbnf("root ::= undefined-rule".into()),
        Grammar::Gbnf("start ::= \"x\"".into()),
    ];
    for g in bad {
        let c = Constraint::new(g.clone());
        assert!(matches!(e.check_constraint(&c), Err(EngineError::Grammar(_))), "{g:?}");
        let r = s.submit(prompt(&e, "hi"), constrained(g.clone(), SamplingParams::greedy(), 8));
        assert!(matches!(r, Err(EngineError::Grammar(_))), "{g:?}: {r:?}");
        assert_eq!(s.in_flight(), 0);
    }
    let st = s.stats().unwrap();
    assert_eq!((st.running, st.waiting, st.steps), (0, 0, 0));
}

#[test]
fn a_gbnf_grammar_holds() {
    let Some(e) = fixture() else { return };
    let s = start(&e, 1);
    let g = Grammar::Gbnf("root ::= answer \".\"\nanswer ::= (\"yes\" | \"no\") (\", \" [a-z]{2,5})?\n".into());
    for seed in 0..4 {
        let done =
            s.submit(prompt(&e, "Well?"), constrained(g.clone(), temp1(seed), 32)).unwrap().wait(|_| Flow::Continue);
        let text = done.unwrap().text;
        let (word, rest) = text.strip_suffix('.').map(|t| t.split_at(t.find([',']).unwrap_or(t.len()))).unwrap();
        assert!(word == "yes" || word == "no", "{text:?}");
        assert!(rest.is_empty() || (rest.starts_with(", ") && (4..=7).contains(&rest.len())), "{text:?}");
    }
}

#[test]
fn forced_tokens_are_not_sampled_and_share_one_forward() {
    let Some(e) = demo() else { return };
    let s = start(&e, 1);
    let literal = "The quick brown fox jumps over the lazy dog, said the constraint";
    let g = Grammar::Lark(format!("start: \"{literal}\" /[0-9]/"));
    let done = s.submit(prompt(&e, "Say something."), constrained(g, temp1(7), 64)).unwrap().wait(|_| Flow::Continue);
    let done = done.unwrap();
    assert_eq!(done.finish, FinishReason::Stop);
    assert!(done.text.starts_with(literal) && done.text.len() == literal.len() + 1, "{}", done.text);
    assert!(done.text.as_bytes()[literal.len()].is_ascii_digit());
    let st = s.stats().unwrap();
    // The prompt, the literal's tokens after its first (forced, computed together), then the
    // digit: a handful of steps and masks for a dozen tokens.
    assert!(done.ids.len() >= 10, "{:?}", done.ids);
    assert!(st.steps <= 4 && st.masks <= 3, "{st:?} for {} tokens", done.ids.len());
}

/// The greedy answer to `text`, unconstrained.
fn greedy(s: &Scheduler, e: &Engine, text: &str, n: usize) -> Completion {
    let req = GenerateRequest { sampling: SamplingParams::greedy(), max_tokens: Some(n), ..Default::default() };
    s.submit(prompt(e, text), req).unwrap().wait(|_| Flow::Continue).unwrap()
}

#[test]
fn a_lazy_constraint_starts_at_its_trigger() {
    let Some(e) = demo() else { return };
    let s = start(&e, 1);
    let question = "Tell me about the history of Paris.";
    let free = greedy(&s, &e, question, 40);
    let tok = e.tokenizer();
    // Token boundaries of the free answer, in bytes.
    let mut ends = Vec::new();
    let mut at = 0;
    for &id in &free.ids {
        at += tok.piece(id, false).len();
        ends.push(at);
    }
    let text = free.text.as_bytes();
    assert!(ends.len() >= 20, "{}", free.text);

    // A trigger ending on a token boundary: the grammar takes over right after it.
    let cut = ends[9];
    let trigger = String::from_utf8(text[ends[5]..cut].to_vec()).unwrap();
    let c = Constraint { grammar: Grammar::Regex("[0-9]{3}".into()), trigger: Some(trigger.clone()) };
    let req = GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(40),
        constraint: Some(c),
        ..Default::default()
    };
    let done = s.submit(prompt(&e, question), req).unwrap().wait(|_| Flow::Continue).unwrap();
    assert_eq!(done.finish, FinishReason::Stop);
    let head = std::str::from_utf8(&text[..cut]).unwrap();
    let tail = done.text.strip_prefix(head).unwrap_or_else(|| panic!("{:?} vs {head:?}", done.text));
    assert!(tail.len() == 3 && tail.bytes().all(|b| b.is_ascii_digit()), "{tail:?}");

    // A trigger ending inside a token (the first byte of a word of two letters or more): the
    // rest of that token goes to the grammar, which accepts it.
    let (k, start) = (10..ends.len() - 1)
        .map(|k| (k, ends[k]))
        .find(|&(k, start)| {
            ends[k + 1] - start >= 3 && text[start + 1..ends[k + 1]].iter().all(u8::is_ascii_alphabetic)
        })
        .expect("a word token");
    let trigger = String::from_utf8(text[ends[k - 3]..start + 2].to_vec()).unwrap();
    let c = Constraint { grammar: Grammar::Regex("[a-zA-Z]*[0-9]{2}".into()), trigger: Some(trigger.clone()) };
    let req = GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(60),
        constraint: Some(c),
        ..Default::default()
    };
    let done = s.submit(prompt(&e, question), req).unwrap().wait(|_| Flow::Continue).unwrap();
    assert_eq!(done.finish, FinishReason::Stop, "{:?}", done.text);
    let head = std::str::from_utf8(&text[..start + 2]).unwrap();
    let tail = done.text.strip_prefix(head).unwrap_or_else(|| panic!("{:?} vs {head:?}", done.text));
    let digits = tail.trim_start_matches(|c: char| c.is_ascii_alphabetic());
    assert!(digits.len() == 2 && digits.bytes().all(|b| b.is_ascii_digit()), "{tail:?}");
}

#[test]
fn unconstrained_requests_are_unchanged_beside_constrained_ones() {
    let Some(e) = demo() else { return };
    let question = "Write a short poem about the sea.";
    let alone = greedy(&start(&e, 1), &e, question, 48);
    let s = start(&e, 4);
    // Constrained neighbours in the same steps, and a lazy constraint that never triggers.
    let schema = serde_json::json!({ "type": "array", "items": { "type": "integer" } });
    let neighbours: Vec<_> = (0..2)
        .map(|i| s.submit(prompt(&e, "Numbers?"), constrained(Grammar::JsonSchema(schema.clone()), temp1(i), 200)))
        .collect();
    let never = Constraint { grammar: Grammar::JsonObject, trigger: Some("\u{1}never\u{1}".into()) };
    let req = GenerateRequest {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(48),
        constraint: Some(never),
        ..Default::default()
    };
    let lazy = s.submit(prompt(&e, question), req).unwrap();
    let beside = greedy(&s, &e, question, 48);
    let lazy = lazy.wait(|_| Flow::Continue).unwrap();
    for n in neighbours {
        n.unwrap().wait(|_| Flow::Continue).unwrap();
    }
    assert_eq!(beside.ids, alone.ids);
    assert_eq!(lazy.ids, alone.ids);
}

#[test]
fn greedy_picks_the_best_allowed_token_and_logprobs_are_of_the_masked_distribution() {
    let Some(e) = demo() else { return };
    let s = start(&e, 1);
    let g = Grammar::JsonSchema(serde_json::json!({ "enum": ["alpha", "beta", "gamma"] }));
    let req = GenerateRequest { logprobs: Some(5), ..constrained(g, SamplingParams::greedy(), 16) };
    let mut lps = Vec::new();
    let done = s
        .submit(prompt(&e, "Pick one."), req)
        .unwrap()
        .wait(|ev| {
            if let onebit_engine::Event::Token { logprobs: Some(lp), .. } = ev {
                lps.push(lp.clone());
            }
            Flow::Continue
        })
        .unwrap();
    assert!(["\"alpha\"", "\"beta\"", "\"gamma\""].contains(&done.text.as_str()), "{}", done.text);
    for lp in &lps {
        // Everything reported is allowed: its probability is finite, and the chosen is the best.
        assert!(lp.top.iter().all(|&(_, p)| p.is_finite()), "{lp:?}");
        assert_eq!(lp.top[0].0, lp.id);
    }
}
