//! LoRA adapters in the serving engine: requests with different adapters (or none) share steps
//! without changing each other's tokens, the prefix cache never hands a request blocks computed
//! with other adapters, and the global scales apply to requests that name none.

use std::sync::Arc;

use onebit_engine::{Engine, Event, Flow, GenerateRequest, SamplingParams, Scheduler, SchedulerConfig};
use onebit_kernels::Pool;
use onebit_model::{LoraUse, Model, ModelOptions};

fn engine(tier: Option<onebit_kernels::KernelTier>) -> Option<Arc<Engine>> {
    let model = onebit_testkit::shared_file("models/qwen3-q8_0.gguf")?;
    let adapter = onebit_testkit::shared_file("models/lora-qwen3-q8_0-r8.gguf")?;
    let options = ModelOptions { kernel_tier: tier, lora: vec![adapter.clone(), adapter], ..Default::default() };
    Some(Arc::new(Engine::new(Model::load(model, &options).unwrap()).unwrap()))
}

fn start(e: &Arc<Engine>, parallel: usize) -> Scheduler {
    let config = SchedulerConfig { parallel, batch_size: 48, ctx_size: 512, queue_size: 64, ..Default::default() };
    Scheduler::start(Arc::clone(e), Pool::new(2), config).unwrap()
}

fn request(lora: Option<Vec<LoraUse>>) -> GenerateRequest {
    let sampling = SamplingParams::greedy();
    GenerateRequest { sampling, max_tokens: Some(20), ignore_eos: true, logprobs: Some(2), lora, ..Default::default() }
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 100 + (i * 7919 + seed * 104_729) % 40_000).collect()
}

/// The adapter sets of the requests: none, adapter 0 at 1, at 0.5, both adapters, the global
/// scales.
fn sets() -> Vec<Option<Vec<LoraUse>>> {
    let u = |id, scale| LoraUse { id, scale };
    vec![Some(vec![]), Some(vec![u(0, 1.0)]), Some(vec![u(0, 0.5)]), Some(vec![u(0, 0.5), u(1, 0.25)]), None]
}

type Generated = (Vec<u32>, Vec<f32>);

fn run(s: &Scheduler, prompt: Vec<u32>, req: GenerateRequest) -> std::thread::JoinHandle<Generated> {
    let h = s.submit(prompt, req).unwrap();
    std::thread::spawn(move || {
        let mut lps = Vec::new();
        let done = h
            .wait(|e| {
                if let Event::Token { logprobs: Some(l), .. } = e {
                    // The random model is sure of its choice: the runners-up tell more.
                    lps.push(l.logprob);
                    lps.extend(l.top.iter().map(|t| t.1));
                }
                Flow::Continue
            })
            .unwrap();
        (done.ids, lps)
    })
}

#[test]
fn requests_with_different_adapters_batched_together_match_each_alone() {
    for tier in onebit_kernels::KernelTier::available() {
        let Some(e) = engine(Some(tier)) else { return };
        let sets = sets();
        let prompts: Vec<Vec<u32>> = (0..sets.len()).map(|i| prompt(20 + 13 * i, i as u32)).collect();
        let alone_s = start(&e, 1);
        let alone: Vec<Generated> = prompts
            .iter()
            .zip(&sets)
            .map(|(p, l)| run(&alone_s, p.clone(), request(l.clone())).join().unwrap())
            .collect();
        let together_s = start(&e, sets.len());
        let handles: Vec<_> =
            prompts.iter().zip(&sets).map(|(p, l)| run(&together_s, p.clone(), request(l.clone()))).collect();
        let together: Vec<Generated> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
            assert_eq!(a.0, t.0, "[{tier}] request {i} ({:?}): tokens differ", sets[i]);
            for (x, y) in a.1.iter().zip(&t.1) {
                assert!((x - y).abs() <= 1e-5, "[{tier}] request {i}: logprob {x} vs {y}");
            }
        }
        // The adapter matters: the same prompt with and without it goes elsewhere.
        let p = &prompts[0];
        let with = run(&alone_s, p.clone(), request(sets[1].clone())).join().unwrap();
        assert_ne!(with.1, alone[0].1, "[{tier}] the adapter changed nothing");
        // The global scales (1 for both adapters at load) are what a request without a list gets.
        let both = Some(vec![LoraUse { id: 0, scale: 1.0 }, LoraUse { id: 1, scale: 1.0 }]);
        assert_eq!(alone[4], run(&alone_s, prompts[4].clone(), request(both)).join().unwrap());
    }
}

fn cached(s: &Scheduler, prompt: &[u32], lora: Option<Vec<LoraUse>>) -> usize {
    let h = s.submit(prompt.to_vec(), GenerateRequest { max_tokens: Some(1), ..request(lora) }).unwrap();
    let mut cached = None;
    h.wait(|e| {
        if let Event::Prefilled { cached: c, .. } = e {
            cached = Some(*c);
        }
        Flow::Continue
    })
    .unwrap();
    cached.unwrap()
}

#[test]
fn the_prefix_cache_keeps_adapters_apart() {
    let Some(e) = engine(None) else { return };
    let s = start(&e, 1);
    let p = prompt(100, 9);
    let one = Some(vec![LoraUse { id: 0, scale: 1.0 }]);
    let half = Some(vec![LoraUse { id: 0, scale: 0.5 }]);
    assert_eq!(cached(&s, &p, Some(vec![])), 0);
    assert!(cached(&s, &p, Some(vec![])) > 0, "the same request finds its prefix");
    assert_eq!(cached(&s, &p, one.clone()), 0, "blocks computed without the adapter are not reused with it");
    assert!(cached(&s, &p, one) > 0);
    assert_eq!(cached(&s, &p, half), 0, "another scale is another adapter");
}

#[test]
fn global_scales_and_bad_ids() {
    let Some(e) = engine(None) else { return };
    assert_eq!(e.lora_scales(), vec![1.0, 1.0]);
    e.set_lora_scales(&[LoraUse { id: 1, scale: 0.5 }]).unwrap();
    assert_eq!(e.lora_scales(), vec![0.0, 0.5], "adapters not listed go to 0");
    assert_eq!(e.resolve_lora(None).unwrap(), vec![LoraUse { id: 1, scale: 0.5 }]);
    let err = e.set_lora_scales(&[LoraUse { id: 2, scale: 1.0 }]).unwrap_err().to_string();
    assert!(err.contains("no LoRA adapter with id 2"), "{err}");
    let s = start(&e, 1);
    let bad = Some(vec![LoraUse { id: 7, scale: 1.0 }]);
    let err = s.submit(prompt(5, 1), request(bad)).unwrap_err().to_string();
    assert!(err.contains("id 7"), "{err}");
}
