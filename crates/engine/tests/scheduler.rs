//! The serving engine's promises, on the small fixture models: no request starves, the queue
//! is bounded, cancelled requests leave nothing behind, the block accounting survives random
//! traffic, prefixes are shared, contexts that cannot fit are errors, and a request's tokens do
//! not depend on what else shares its steps.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use onebit_engine::sampling::TokenLogprobs;
use onebit_engine::{
    Engine, EngineError, Event, FinishReason, Flow, GenerateRequest, RequestHandle, SamplingParams, Scheduler,
    SchedulerConfig,
};
use onebit_kernels::Pool;
use onebit_model::{BLOCK_TOKENS, Model, ModelOptions};

fn engine(name: &str) -> Option<Arc<Engine>> {
    let path = onebit_testkit::shared_file(&format!("models/{name}.gguf"))?;
    Some(Arc::new(Engine::new(Model::load(path, &ModelOptions::default()).unwrap()).unwrap()))
}

fn start(e: &Arc<Engine>, config: SchedulerConfig) -> Scheduler {
    Scheduler::start(Arc::clone(e), Pool::new(2), config).unwrap()
}

fn config(parallel: usize, batch_size: usize, ctx_size: usize) -> SchedulerConfig {
    SchedulerConfig { parallel, batch_size, ctx_size, queue_size: 256, ..SchedulerConfig::default() }
}

/// `n` greedy tokens past any end-of-text.
fn endless(n: usize) -> GenerateRequest {
    GenerateRequest { sampling: SamplingParams::greedy(), max_tokens: Some(n), ignore_eos: true, ..Default::default() }
}

/// `n` token ids from a generator seeded by `seed` (below `vocab`, above the special tokens'
/// usual range).
fn tokens(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (100 + s % (vocab as u64 - 400)) as u32
        })
        .collect()
}

fn vocab(e: &Engine) -> usize {
    e.model().config().vocab_size
}

/// Wait until nothing is in flight, then check that the pool is back to no blocks in use.
fn assert_idle(s: &Scheduler) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.in_flight() > 0 {
        assert!(Instant::now() < deadline, "requests still in flight");
        std::thread::sleep(Duration::from_millis(2));
    }
    let st = s.stats().unwrap();
    assert_eq!((st.running, st.waiting, st.blocks.in_use), (0, 0, 0), "{st:?}");
    s.check_blocks().unwrap();
}

#[test]
fn a_long_prompt_does_not_stall_the_streams_that_decode() {
    let Some(e) = engine("qwen3-q8_0") else { return };
    let s = start(&e, config(2, 32, 2048));
    let a = s.submit(tokens(8, 1, vocab(&e)), endless(400)).unwrap();
    assert!(matches!(a.recv(), Some(Event::Prefilled { .. })));
    let counted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&counted);
    let reader = std::thread::spawn(move || {
        a.wait(|ev| {
            if matches!(ev, Event::Token { .. }) {
                count.fetch_add(1, Ordering::SeqCst);
            }
            Flow::Continue
        })
    });
    while counted.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    // 1000 prompt tokens at 31 per step (the step's budget less the decoding token).
    let long = s.submit(tokens(1000, 2, vocab(&e)), endless(1)).unwrap();
    let before = counted.load(Ordering::SeqCst);
    assert!(matches!(long.recv(), Some(Event::Prefilled { .. })));
    let during = counted.load(Ordering::SeqCst) - before;
    assert!(during >= 1000 / 31 - 3, "the decoding stream got {during} tokens while the prompt was prefilled");
    drop(long);
    reader.join().unwrap().unwrap();
    assert_idle(&s);
}

#[test]
fn waiting_requests_are_served_in_order() {
    let Some(e) = engine("qwen3-q8_0") else { return };
    let s = start(&e, config(1, 512, 256));
    // Each request's submission instant is bracketed here: on two busy cores this thread can
    // be put to sleep between two submissions, long enough for the one before to finish.
    let mut handles = Vec::new();
    let mut bracket = Vec::new();
    for i in 0..5 {
        let before = Instant::now();
        handles.push(s.submit(tokens(20, i, vocab(&e)), endless(6)).unwrap());
        bracket.push((before, Instant::now()));
    }
    // One at a time, in order: none was admitted before the one ahead of it had been prefilled.
    // Only an order that the instants prove wrong fails: the latest instant at which a request
    // can have been admitted against the earliest at which the one before can have been
    // prefilled (a thread on two busy cores can sleep inside a submission, or wake long after
    // its request is done, so neither the waiting threads' order nor one bracket's bound will do).
    let threads: Vec<_> = handles.into_iter().map(|h| std::thread::spawn(move || h.wait(|_| Flow::Continue))).collect();
    let done: Vec<_> = threads.into_iter().map(|t| t.join().unwrap().unwrap()).collect();
    let secs = Duration::from_secs_f64;
    for i in 1..done.len() {
        let (a, b) = (&done[i - 1].timings, &done[i].timings);
        let a_prefilled_from = bracket[i - 1].0 + secs(a.queue + a.prefill);
        let b_admitted_by = bracket[i].1 + secs(b.queue);
        assert!(b_admitted_by >= a_prefilled_from, "served out of order: {a:?} then {b:?}");
    }
}

#[test]
fn the_queue_is_bounded() {
    let Some(e) = engine("qwen3-q8_0") else { return };
    let s = start(&e, SchedulerConfig { queue_size: 2, ..config(1, 512, 256) });
    let held: Vec<RequestHandle> = (0..3).map(|i| s.submit(tokens(10, i, vocab(&e)), endless(200)).unwrap()).collect();
    let err = s.submit(tokens(10, 9, vocab(&e)), endless(1)).unwrap_err();
    assert!(matches!(err, EngineError::Busy { in_flight: 3 }), "{err}");
    assert!(err.to_string().contains("busy"), "{err}");
    held[0].cancel();
    let done = held.into_iter().next().unwrap().wait(|_| Flow::Continue).unwrap();
    assert_eq!(done.finish, FinishReason::Cancelled);
    s.submit(tokens(10, 9, vocab(&e)), endless(1)).unwrap().wait(|_| Flow::Continue).unwrap();
}

#[test]
fn a_hundred_requests_cancelled_mid_stream_leave_nothing_behind() {
    let Some(e) = engine("qwen3-q8_0") else { return };
    let s = start(&e, SchedulerConfig { kv_size: 8 * 512, ..config(8, 128, 512) });
    let mut handles = Vec::new();
    for i in 0..100u64 {
        // Some prompts share a prefix, so cancelled sequences also held shared blocks.
        let mut p = tokens(40, i % 7, vocab(&e));
        p.extend(tokens(5 + (i % 30) as usize, 1000 + i, vocab(&e)));
        let user = Arc::new(AtomicBool::new(false));
        let req = GenerateRequest { cancel: Some(Arc::clone(&user)), ..endless(10_000) };
        handles.push((s.submit(p, req).unwrap(), user));
    }
    let mut cancelled = 0;
    for (i, (h, user)) in handles.into_iter().enumerate() {
        // Mid-stream: after a few of its tokens.
        let mut seen = 0;
        while seen < 2 + i % 3 {
            match h.recv() {
                Some(Event::Token { .. }) => seen += 1,
                Some(Event::Done(r)) => panic!("ended early: {r:?}"),
                Some(_) => {}
                None => panic!("the stream closed"),
            }
        }
        // Three ways to cancel: the handle, the caller's flag, or going away.
        match i % 3 {
            0 => h.cancel(),
            1 => user.store(true, Ordering::Relaxed),
            _ => {
                drop(h);
                cancelled += 1;
                continue;
            }
        }
        let done = h.wait(|_| Flow::Continue).unwrap();
        assert_eq!(done.finish, FinishReason::Cancelled);
        cancelled += 1;
    }
    assert_eq!(cancelled, 100);
    assert_idle(&s);
    let st = s.stats().unwrap();
    assert!(st.blocks.cached > 0, "the prefixes stay cached: {st:?}");
}

#[test]
fn a_second_request_with_a_long_shared_prefix_prefills_only_its_own_tokens() {
    let Some(e) = engine("qwen3-q8_0") else { return };
    let s = start(&e, config(4, 512, 2048));
    let prefix = tokens(1000, 7, vocab(&e));
    let with = |tail: u64| [&prefix[..], &tokens(24, tail, vocab(&e))[..]].concat();
    let a = s.submit(with(1), endless(40)).unwrap();
    assert!(matches!(a.recv(), Some(Event::Prefilled { cached: 0, .. })));
    // While the first still decodes (its prefix blocks in use), the second shares them.
    let before = s.stats().unwrap().tokens_computed;
    let b = s.submit(with(2), endless(1)).unwrap();
    let done = b.wait(|_| Flow::Continue).unwrap();
    let shared = 1000 / BLOCK_TOKENS * BLOCK_TOKENS;
    assert_eq!(done.usage.cached_tokens, shared);
    let computed = s.stats().unwrap().tokens_computed - before;
    // Its own 24 tokens and the prefix's part-block, plus the first request's decoding.
    let own = 1024 - shared;
    assert!(computed >= own as u64 && computed <= own as u64 + 45, "computed {computed} tokens");
    // The same prompt again, from the cache, gives the same answer.
    let again = s.submit(with(2), endless(1)).unwrap().wait(|_| Flow::Continue).unwrap();
    assert_eq!(again.ids, done.ids);
    drop(a);
    assert_idle(&s);
}

#[test]
fn contexts_that_cannot_fit_are_errors_before_any_work() {
    let Some(e) = engine("qwen3-q8_0") else { return };
    let trained = e.model().config().context_length;
    let err = Scheduler::start(Arc::clone(&e), Pool::new(1), config(1, 512, trained + 1)).unwrap_err();
    assert!(matches!(err, EngineError::ContextTooLarge { .. }), "{err}");
    assert!(err.to_string().contains("--ctx-size"), "{err}");
    let err = Scheduler::start(Arc::clone(&e), Pool::new(1), SchedulerConfig { kv_size: 100, ..config(1, 512, 256) })
        .unwrap_err();
    assert!(err.to_string().contains("--kv-size"), "{err}");
    let huge = SchedulerConfig { parallel: 1 << 40, ..config(1, 512, 256) };
    let err = Scheduler::start(Arc::clone(&e), Pool::new(1), huge).unwrap_err();
    assert!(err.to_string().contains("memory"), "{err}");

    let s = start(&e, config(1, 512, 64));
    let err = s.submit(tokens(64, 1, vocab(&e)), endless(1)).unwrap_err();
    assert!(matches!(err, EngineError::PromptTooLong { tokens: 64, ctx: 64 }), "{err}");
    assert!(matches!(s.submit(Vec::new(), endless(1)), Err(EngineError::EmptyPrompt)));
    let err = s.submit(vec![u32::MAX], endless(1)).unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    let done = s.submit(tokens(60, 1, vocab(&e)), endless(100)).unwrap().wait(|_| Flow::Continue).unwrap();
    assert_eq!((done.finish, done.usage.completion_tokens), (FinishReason::Context, 5));
}

#[test]
fn a_small_pool_makes_requests_wait_and_preempts_without_changing_answers() {
    let Some(e) = engine("qwen3-q8_0") else { return };
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| tokens(50 + 20 * i, 40 + i as u64, vocab(&e))).collect();
    let alone = start(&e, config(1, 512, 512));
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| alone.submit(p.clone(), endless(60)).unwrap().wait(|_| Flow::Continue).unwrap().ids)
        .collect();
    // Room for two sequences' worth of blocks, but six at once allowed.
    let s = start(&e, SchedulerConfig { kv_size: 2 * 256, ..config(6, 64, 256) });
    let handles: Vec<RequestHandle> = prompts.iter().map(|p| s.submit(p.clone(), endless(60)).unwrap()).collect();
    for (h, want) in handles.into_iter().zip(&want) {
        assert_eq!(&h.wait(|_| Flow::Continue).unwrap().ids, want);
    }
    assert!(s.stats().unwrap().preemptions > 0, "the pool was never short");
    assert_idle(&s);
}

/// A request's tokens and their log-probabilities.
type Generated = (Vec<u32>, Vec<TokenLogprobs>);

/// Follow a request to its end on another thread, keeping its tokens' logprobs.
fn follow(h: RequestHandle) -> std::thread::JoinHandle<Generated> {
    std::thread::spawn(move || {
        let mut lps = Vec::new();
        let done = h
            .wait(|ev| {
                if let Event::Token { logprobs: Some(lp), .. } = ev {
                    lps.push(lp.clone());
                }
                Flow::Continue
            })
            .unwrap();
        (done.ids, lps)
    })
}

/// Run `prompts` through `s`: alone (one after the other), or together, each submitted after
/// the previous one's first token, so that prefill chunks share steps with decoding.
fn generate_all(s: &Scheduler, prompts: &[Vec<u32>], together: bool) -> Vec<Generated> {
    let req = GenerateRequest { logprobs: Some(4), ..endless(24) };
    if !together {
        return prompts.iter().map(|p| follow(s.submit(p.clone(), req.clone()).unwrap()).join().unwrap()).collect();
    }
    let mut readers = Vec::new();
    for p in prompts {
        let h = s.submit(p.clone(), req.clone()).unwrap();
        // Wait for its prompt to be in (the next one then prefills while this one decodes).
        assert!(matches!(h.recv(), Some(Event::Prefilled { .. })));
        readers.push(follow(h));
    }
    readers.into_iter().map(|r| r.join().unwrap()).collect()
}

#[test]
fn tokens_do_not_depend_on_what_shares_the_steps() {
    for name in ["qwen3-q1_0", "qwen2-q4_0", "llama-q4_1", "llama-q4_k_m", "qwen3-tq2_0"] {
        let Some(path) = onebit_testkit::shared_file(&format!("models/{name}.gguf")) else { return };
        for tier in onebit_kernels::KernelTier::available() {
            for rounding in [onebit_kernels::BatchRounding::Fast, onebit_kernels::BatchRounding::Reference] {
                let options = ModelOptions { kernel_tier: Some(tier), batch_rounding: rounding, ..Default::default() };
                let e = Arc::new(Engine::new(Model::load(&path, &options).unwrap()).unwrap());
                let v = vocab(&e);
                let lens = [5, 17, 40, 90, 3, 130, 64, 33];
                let prompts: Vec<Vec<u32>> =
                    lens.iter().enumerate().map(|(i, &n)| tokens(n, 50 + i as u64, v)).collect();
                let alone = generate_all(&start(&e, config(1, 48, 512)), &prompts, false);
                let together = generate_all(&start(&e, config(8, 48, 512)), &prompts, true);
                for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
                    let what = format!("{name} [{tier}, {rounding}] prompt {i}");
                    assert_eq!(a.0, t.0, "{what}: tokens differ");
                    for (x, y) in a.1.iter().zip(&t.1) {
                        assert!((x.logprob - y.logprob).abs() <= 1e-5, "{what}: {} vs {}", x.logprob, y.logprob);
                        for (p, q) in x.top.iter().zip(&y.top) {
                            assert!(p.0 == q.0 && (p.1 - q.1).abs() <= 1e-5, "{what}: top {p:?} vs {q:?}");
                        }
                    }
                }
            }
        }
    }
}

#[derive(Clone, Debug)]
enum Traffic {
    /// A request: a prompt starting with one of a few shared prefixes, some tokens to generate.
    Submit { prefix: u8, len: usize, max: usize },
    /// Cancel the `i`-th live request (mod their number) through its handle.
    Cancel(usize),
    /// Drop its handle (the caller goes away).
    Drop(usize),
    /// Wait for it to finish on its own.
    Finish(usize),
}

fn traffic() -> impl proptest::strategy::Strategy<Value = Traffic> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0u8..4, 1usize..90, 0usize..12).prop_map(|(prefix, len, max)| Traffic::Submit { prefix, len, max }),
        2 => (0usize..64).prop_map(Traffic::Cancel),
        1 => (0usize..64).prop_map(Traffic::Drop),
        2 => (0usize..64).prop_map(Traffic::Finish),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 3, ..Default::default() })]
    /// 1,000 random submissions, cancellations and finishes on a pool small enough to evict and
    /// preempt: the block accounting holds throughout, and nothing is left in use at the end.
    #[test]
    fn no_blocks_leak_under_random_traffic(events in proptest::collection::vec(traffic(), 1000)) {
        let Some(e) = engine("qwen3-q8_0") else { return Ok(()) };
        let s = start(&e, SchedulerConfig { kv_size: 3 * 128, queue_size: 1000, ..config(4, 32, 128) });
        let v = vocab(&e);
        let mut live: Vec<RequestHandle> = Vec::new();
        for (n, ev) in events.into_iter().enumerate() {
            match ev {
                Traffic::Submit { prefix, len, max } => {
                    let mut p = tokens(len.min(40), prefix as u64, v);
                    p.extend(tokens(len.saturating_sub(40), 1_000 + n as u64, v));
                    p.truncate(len);
                    live.push(s.submit(p, endless(max)).unwrap());
                }
                Traffic::Cancel(i) if !live.is_empty() => {
                    let h = live.swap_remove(i % live.len());
                    h.cancel();
                    h.wait(|_| Flow::Continue).unwrap();
                }
                Traffic::Drop(i) if !live.is_empty() => drop(live.swap_remove(i % live.len())),
                Traffic::Finish(i) if !live.is_empty() => {
                    let done = live.swap_remove(i % live.len()).wait(|_| Flow::Continue).unwrap();
                    proptest::prop_assert!(done.finish != FinishReason::Cancelled);
                }
                _ => {}
            }
            if n % 50 == 0 {
                s.check_blocks().map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            }
        }
        for h in live.drain(..) {
            h.wait(|_| Flow::Continue).unwrap();
        }
        assert_idle(&s);
    }
}
