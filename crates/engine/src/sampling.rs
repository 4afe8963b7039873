//! Token sampling: one chain in llama.cpp's order.
//!
//! 1. logit bias (added to the raw logits);
//! 2. repetition, presence and frequency penalties over the last `repeat_last_n` tokens;
//! 3. top-k, then top-p and min-p (both on the distribution at temperature 1);
//! 4. temperature, then a draw from the softmax of what is left.
//!
//! Temperature 0 (or below) is greedy: the most likely token after bias and penalties.
//! A seed makes the draws reproducible.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::ParamError;

/// The sampling parameters of one request (llama.cpp's defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: none).
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recent tokens by this (1: off).
    pub repeat_penalty: f32,
    /// Subtract this from the logits of tokens that appeared recently (0: off).
    pub presence_penalty: f32,
    /// Subtract this times the count of each recent token (0: off).
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Added to the logits of the given tokens (`f32::NEG_INFINITY` bans a token).
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the draws (none: a fresh random seed).
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        SamplingParams { temperature: 0.0, ..SamplingParams::default() }
    }

    /// Check every parameter against its range (the same rules for the CLI and the server).
    pub fn validate(&self) -> Result<(), ParamError> {
        in_range("temperature", self.temperature, 0.0, MAX_TEMPERATURE)?;
        in_range("top_p", self.top_p, 0.0, 1.0)?;
        in_range("min_p", self.min_p, 0.0, 1.0)?;
        in_range("repeat_penalty", self.repeat_penalty, f32::MIN_POSITIVE, 10.0)?;
        in_range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        in_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        for &(id, bias) in &self.logit_bias {
            if bias != f32::NEG_INFINITY && !(-100.0..=100.0).contains(&bias) {
                return Err(ParamError::new(
                    "logit_bias",
                    format!("of token {id} must be between -100 and 100 (or false, to ban it), not {bias}"),
                ));
            }
        }
        Ok(())
    }

    fn penalties_on(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0)
    }
}

/// Above this, every token is about as likely as any other: a larger value is a mistake.
pub const MAX_TEMPERATURE: f32 = 10.0;

pub(crate) fn in_range(field: &'static str, v: f32, lo: f32, hi: f32) -> Result<(), ParamError> {
    if v.is_finite() && (lo..=hi).contains(&v) {
        return Ok(());
    }
    let lo = if lo == f32::MIN_POSITIVE { "above 0".to_string() } else { format!("between {lo}") };
    let range = if lo.starts_with("above") { format!("{lo} and at most {hi}") } else { format!("{lo} and {hi}") };
    Err(ParamError::new(field, format!("must be {range}, not {v}")))
}

/// A token and its logit, as the chain narrows the candidates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logit: f32,
}

/// The sampler of one sequence: parameters, the recent tokens the penalties look at, and the
/// random state. (The vocabulary-sized work space is the caller's, one per thread rather than
/// one per sequence: see [`Sampler::sample_with`].)
pub struct Sampler {
    params: SamplingParams,
    recent: std::collections::VecDeque<u32>,
    rng: ChaCha8Rng,
    seed: u64,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let seed = params.seed.unwrap_or_else(rand::random);
        Sampler {
            recent: std::collections::VecDeque::with_capacity(params.repeat_last_n),
            rng: ChaCha8Rng::seed_from_u64(seed),
            params,
            seed,
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed the draws use (the given one, or the one picked at random).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Record a token of the sequence (prompt or generated) for the penalties.
    pub fn accept(&mut self, id: u32) {
        let n = self.params.repeat_last_n;
        if n == 0 {
            return;
        }
        if self.recent.len() == n {
            self.recent.pop_front();
        }
        self.recent.push_back(id);
    }

    /// Pick the next token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_with(logits, &mut Vec::new())
    }

    /// Pick the next token from `logits`, using `c` as work space.
    pub fn sample_with(&mut self, logits: &[f32], c: &mut Vec<Candidate>) -> u32 {
        // Plain greedy needs no candidates: copying the vocabulary was 3 % of a step of eight
        // SmolLM2 sequences.
        if self.params.temperature <= 0.0 && self.params.logit_bias.is_empty() && !self.params.penalties_on() {
            return argmax(logits);
        }
        c.clear();
        c.extend(logits.iter().enumerate().map(|(i, &l)| Candidate { id: i as u32, logit: l }));
        apply_bias(c, &self.params.logit_bias);
        if self.params.penalties_on() {
            apply_penalties(c, self.recent.iter().copied(), &self.params);
        }
        if self.params.temperature <= 0.0 {
            greedy(c)
        } else {
            top_k(c, self.params.top_k);
            top_p(c, self.params.top_p);
            min_p(c, self.params.min_p);
            temperature(c, self.params.temperature);
            draw(c, &mut self.rng)
        }
    }
}

/// Add each bias to its token's logit (the candidates are still the whole vocabulary).
pub fn apply_bias(c: &mut [Candidate], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(x) = c.get_mut(id as usize) {
            x.logit += b;
        }
    }
}

/// llama.cpp's penalties: for each distinct recent token seen `n` times, its logit is divided
/// by `repeat_penalty` if positive (multiplied if not), then lowered by
/// `n · frequency_penalty + presence_penalty`. `c` is the whole vocabulary, in id order.
pub fn apply_penalties(c: &mut [Candidate], recent: impl IntoIterator<Item = u32>, p: &SamplingParams) {
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for id in recent {
        *counts.entry(id).or_default() += 1;
    }
    for (id, n) in counts {
        let Some(x) = c.get_mut(id as usize) else { continue };
        debug_assert_eq!(x.id, id);
        if x.logit <= 0.0 {
            x.logit *= p.repeat_penalty;
        } else {
            x.logit /= p.repeat_penalty;
        }
        x.logit -= n as f32 * p.frequency_penalty + p.presence_penalty;
    }
}

fn greedy(c: &[Candidate]) -> u32 {
    c.iter().fold(c[0], |best, &x| if x.logit > best.logit { x } else { best }).id
}

/// [`greedy`] over the logits themselves: the first of the largest (NaNs never win, unless
/// the first logit is one). The maximum is found sixteen lanes at a time, then its first
/// position.
fn argmax(logits: &[f32]) -> u32 {
    let Some(&first) = logits.first() else { return 0 };
    if first.is_nan() {
        return 0;
    }
    let mut lanes = [first; 16];
    let chunks = logits.chunks_exact(16);
    for &l in chunks.remainder() {
        lanes[0] = if l > lanes[0] { l } else { lanes[0] };
    }
    for chunk in chunks {
        for (m, &l) in lanes.iter_mut().zip(chunk) {
            *m = if l > *m { l } else { *m };
        }
    }
    let max = lanes.into_iter().fold(first, |m, l| if l > m { l } else { m });
    logits.iter().position(|&l| l == max).unwrap_or(0) as u32
}

/// Keep the `k` highest logits, sorted in descending order (k = 0: sort all).
pub fn top_k(c: &mut Vec<Candidate>, k: usize) {
    let by_logit = |a: &Candidate, b: &Candidate| b.logit.total_cmp(&a.logit);
    if k > 0 && k < c.len() {
        c.select_nth_unstable_by(k - 1, by_logit);
        c.truncate(k);
    }
    c.sort_unstable_by(by_logit);
}

/// Probabilities of sorted candidates at temperature 1.
fn softmax(c: &[Candidate]) -> Vec<f32> {
    let max = c[0].logit;
    let e: Vec<f32> = c.iter().map(|x| (x.logit - max).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

/// Keep the smallest prefix of sorted candidates whose probability reaches `p`.
pub fn top_p(c: &mut Vec<Candidate>, p: f32) {
    if p >= 1.0 || c.len() <= 1 {
        return;
    }
    let probs = softmax(c);
    let mut cum = 0.0;
    for (i, pr) in probs.iter().enumerate() {
        cum += pr;
        if cum >= p {
            c.truncate(i + 1);
            return;
        }
    }
}

/// Drop sorted candidates whose probability is below `p` times the first one's.
pub fn min_p(c: &mut Vec<Candidate>, p: f32) {
    if p <= 0.0 || c.len() <= 1 {
        return;
    }
    let threshold = c[0].logit + p.ln();
    let keep = c.iter().take_while(|x| x.logit >= threshold).count().max(1);
    c.truncate(keep);
}

pub fn temperature(c: &mut [Candidate], t: f32) {
    c.iter_mut().for_each(|x| x.logit /= t);
}

/// Draw from the softmax of sorted candidates.
pub fn draw(c: &[Candidate], rng: &mut impl Rng) -> u32 {
    let probs = softmax(c);
    let mut u: f32 = rng.random::<f32>();
    for (x, p) in c.iter().zip(&probs) {
        if u < *p {
            return x.id;
        }
        u -= p;
    }
    c[c.len() - 1].id
}

/// Log-probabilities of the model's distribution (raw logits): the chosen token's and the
/// `n` most likely.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TokenLogprobs {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

pub fn logprobs(logits: &[f32], chosen: u32, n: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln() as f32;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n);
    if n > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = n.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        idx.truncate(k);
        idx.sort_unstable_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        top = idx.into_iter().map(|i| (i, logits[i as usize] - lse)).collect();
    }
    TokenLogprobs { id: chosen, logprob: logits[chosen as usize] - lse, top }
}

#[cfg(test)]
mod tests;
