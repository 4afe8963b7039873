//! Each stage of the chain on fixed logits: the distribution it samples from is checked with a
//! chi-square goodness-of-fit test against the distribution computed here independently, and
//! the penalty arithmetic against llama.cpp's formula.

use super::*;

/// Ten logits with distinct, well-spread probabilities.
const LOGITS: [f32; 10] = [2.0, 1.5, 1.2, 0.9, 0.5, 0.3, 0.0, -0.4, -1.0, -2.5];

fn softmax_of(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

/// The chi-square quantile at upper tail 1e-4 (Wilson–Hilferty; ample for a test threshold).
fn chi2_critical(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.719; // upper 1e-4 point of the standard normal
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// Draw `n` tokens with `params` and test them against `expected` (probabilities by id; zero
/// entries must never be drawn).
fn check(params: SamplingParams, expected: &[f64], what: &str) {
    let n = 40_000;
    let mut s = Sampler::new(SamplingParams { seed: Some(7), ..params });
    let mut counts = vec![0usize; LOGITS.len()];
    for _ in 0..n {
        counts[s.sample(&LOGITS) as usize] += 1;
    }
    let mut chi2 = 0.0;
    let mut df = 0;
    for (id, (&c, &p)) in counts.iter().zip(expected).enumerate() {
        if p == 0.0 {
            assert_eq!(c, 0, "{what}: token {id} has probability 0 but was drawn {c} times");
            continue;
        }
        let e = p * n as f64;
        chi2 += (c as f64 - e).powi(2) / e;
        df += 1;
    }
    let crit = chi2_critical(df.max(2) - 1);
    assert!(chi2 < crit, "{what}: chi-square {chi2:.1} over {} df exceeds {crit:.1}; counts {counts:?}", df - 1);
}

fn only(keep: &[usize], logits: &[f32], temp: f32) -> Vec<f64> {
    let kept: Vec<f32> = keep.iter().map(|&i| logits[i] / temp).collect();
    let p = softmax_of(&kept);
    let mut out = vec![0.0; logits.len()];
    for (&i, &pi) in keep.iter().zip(&p) {
        out[i] = pi;
    }
    out
}

fn plain() -> SamplingParams {
    SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplingParams::default() }
}

#[test]
fn draw_follows_the_softmax() {
    check(plain(), &softmax_of(&LOGITS), "softmax");
}

#[test]
fn temperature_scales_the_logits() {
    for t in [0.5f32, 1.7] {
        let want = only(&(0..10).collect::<Vec<_>>(), &LOGITS, t);
        check(SamplingParams { temperature: t, ..plain() }, &want, &format!("temperature {t}"));
    }
}

#[test]
fn top_k_keeps_the_k_best() {
    check(SamplingParams { top_k: 3, ..plain() }, &only(&[0, 1, 2], &LOGITS, 1.0), "top-k 3");
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    let p = softmax_of(&LOGITS);
    // The prefix that first reaches 0.7.
    let mut cum = 0.0;
    let mut keep = Vec::new();
    for (i, pi) in p.iter().enumerate() {
        keep.push(i);
        cum += pi;
        if cum >= 0.7 {
            break;
        }
    }
    check(SamplingParams { top_p: 0.7, ..plain() }, &only(&keep, &LOGITS, 1.0), "top-p 0.7");
}

#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_best() {
    let p = softmax_of(&LOGITS);
    let keep: Vec<usize> = (0..10).filter(|&i| p[i] >= 0.2 * p[0]).collect();
    check(SamplingParams { min_p: 0.2, ..plain() }, &only(&keep, &LOGITS, 1.0), "min-p 0.2");
}

#[test]
fn stages_compose_in_llama_cpp_order() {
    // top-k 6, then top-p 0.9 and min-p 0.1 at temperature 1, then temperature 0.7.
    let p6 = softmax_of(&LOGITS[..6]);
    let mut cum = 0.0;
    let mut keep = Vec::new();
    for (i, pi) in p6.iter().enumerate() {
        keep.push(i);
        cum += pi;
        if cum >= 0.9 {
            break;
        }
    }
    keep.retain(|&i| LOGITS[i] >= LOGITS[0] + 0.1f32.ln());
    let params = SamplingParams { temperature: 0.7, top_k: 6, top_p: 0.9, min_p: 0.1, ..SamplingParams::default() };
    check(params, &only(&keep, &LOGITS, 0.7), "chain");
}

#[test]
fn logit_bias_shifts_and_bans() {
    let mut biased = LOGITS;
    biased[9] += 4.0;
    let mut want = softmax_of(&biased);
    want[0] = 0.0;
    let total: f64 = want.iter().sum();
    want.iter_mut().for_each(|p| *p /= total);
    let params = SamplingParams { logit_bias: vec![(9, 4.0), (0, f32::NEG_INFINITY)], ..plain() };
    check(params, &want, "logit bias");
}

#[test]
fn temperature_zero_is_greedy() {
    let mut s = Sampler::new(SamplingParams::greedy());
    for _ in 0..100 {
        assert_eq!(s.sample(&LOGITS), 0);
    }
    let mut s = Sampler::new(SamplingParams { logit_bias: vec![(4, 10.0)], ..SamplingParams::greedy() });
    assert_eq!(s.sample(&LOGITS), 4);
}

#[test]
fn argmax_picks_what_the_candidates_pick() {
    let candidates = |l: &[f32]| -> Vec<Candidate> {
        l.iter().enumerate().map(|(i, &logit)| Candidate { id: i as u32, logit }).collect()
    };
    let mut seed = 7u64;
    let mut next = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 40) as u32
    };
    // Few distinct values, so that ties are common; signed zeros, infinities and NaNs among them.
    let values = [0.0, -0.0, 1.0, 2.5, -3.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 2.5, -0.0];
    for len in [1, 2, 15, 16, 17, 31, 33, 100, 1000] {
        for _ in 0..200 {
            let l: Vec<f32> = (0..len).map(|_| values[next() as usize % values.len()]).collect();
            assert_eq!(argmax(&l), greedy(&candidates(&l)), "{l:?}");
        }
    }
}

#[test]
fn a_seed_reproduces_the_draws() {
    let run = |seed| {
        let mut s = Sampler::new(SamplingParams { seed: Some(seed), ..plain() });
        (0..64).map(|_| s.sample(&LOGITS)).collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
}

/// llama.cpp (`llama_sampler_penalties_apply`): per distinct token in the window with count n,
/// `l = l <= 0 ? l * repeat : l / repeat`, then `l -= n * frequency + presence`.
#[test]
fn penalties_follow_llama_cpp() {
    let p = SamplingParams { repeat_penalty: 1.3, frequency_penalty: 0.25, presence_penalty: 0.5, ..plain() };
    let mut c: Vec<Candidate> = LOGITS.iter().enumerate().map(|(i, &l)| Candidate { id: i as u32, logit: l }).collect();
    apply_penalties(&mut c, [0u32, 0, 0, 7, 3, 6], &p);
    let close = |a: f32, b: f32| (a - b).abs() < 1e-6;
    assert!(close(c[0].logit, 2.0 / 1.3 - 3.0 * 0.25 - 0.5), "{}", c[0].logit);
    assert!(close(c[7].logit, -0.4 * 1.3 - 0.25 - 0.5), "{}", c[7].logit);
    assert!(close(c[3].logit, 0.9 / 1.3 - 0.25 - 0.5), "{}", c[3].logit);
    assert!(close(c[6].logit, 0.0 - 0.25 - 0.5), "zero logits are multiplied: {}", c[6].logit);
    assert_eq!(c[1].logit, 1.5, "tokens outside the window are untouched");

    // The window: only the last `repeat_last_n` accepted tokens count.
    let mut s = Sampler::new(SamplingParams { repeat_penalty: 100.0, repeat_last_n: 2, ..SamplingParams::greedy() });
    for id in [1, 0, 5, 6] {
        s.accept(id);
    }
    assert_eq!(s.sample(&LOGITS), 0, "token 0 left the window, so it is not penalized");
    s.accept(0);
    assert_eq!(s.sample(&LOGITS), 1);
}

#[test]
fn logprobs_are_log_softmax() {
    let lp = logprobs(&LOGITS, 2, 3);
    let p = softmax_of(&LOGITS);
    assert!((lp.logprob as f64 - p[2].ln()).abs() < 1e-5);
    assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert!((lp.top[0].1 as f64 - p[0].ln()).abs() < 1e-5);
}
