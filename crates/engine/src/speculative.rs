//! Speculative decoding: drafts taken from a sequence's own context (prompt lookup) or guessed
//! by a draft model (`scheduler/draft.rs`), verified in the same batched forward pass as
//! everything else, kept only where the target agrees.
//!
//! A lookup draft is the continuation of the latest earlier occurrence of the context's last n
//! tokens (longest n first); a draft model's is its greedy guesses. The target computes the drafted positions together with the sequence's
//! newest token and samples each position in order with the sequence's own sampler; a drafted
//! token is kept while it equals what was sampled. With a deterministic draft this is exactly
//! speculative sampling (a drafted token survives with the target's probability for it, and a
//! rejection leaves a sample of the residual), and because every position is sampled with the
//! same random stream as plain decoding would use, the output is token for token the one
//! without speculation, greedy or not.
//!
//! Whether a drafted token pays is decided per step: it costs the marginal time of one more
//! token in the pass ([`StepCost`], fitted to the steps as they run) and is worth its chance of
//! being kept ([`Acceptance`], learnt per sequence, also while not drafting). The k-th drafted
//! token of a sequence goes into the step only while it raises the step's expected tokens per
//! second, so a batch that is already compute-bound, or a sequence whose drafts keep failing,
//! drafts nothing.

use crate::ParamError;
use crate::sampling::in_range;

/// How sequences draft (`--spec`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpecMode {
    /// No drafting.
    #[default]
    Off,
    /// Drafts from the sequence's own context (n-gram lookup).
    Lookup,
    /// Drafts from a smaller model with the same vocabulary (`--model-draft`), greedily.
    Draft,
}

impl std::str::FromStr for SpecMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" | "none" => Ok(SpecMode::Off),
            "lookup" | "ngram" => Ok(SpecMode::Lookup),
            "draft" => Ok(SpecMode::Draft),
            _ => Err(format!("unknown speculative mode {s:?}: use lookup, draft or off")),
        }
    }
}

impl std::fmt::Display for SpecMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SpecMode::Off => "off",
            SpecMode::Lookup => "lookup",
            SpecMode::Draft => "draft",
        })
    }
}

/// Speculative decoding settings (the scheduler's default; a request may override them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Speculation {
    pub mode: SpecMode,
    /// Drafted tokens per sequence and step, at most (`--draft-max`).
    pub draft_max: usize,
    /// Shortest run of tokens a draft may start with (`--draft-min`); shorter ones are dropped.
    pub draft_min: usize,
    /// The longest and shortest context suffix matched (`--spec-ngram-max`, `--spec-ngram-min`).
    pub ngram_max: usize,
    pub ngram_min: usize,
    /// A draft model's drafting stops at a token it gives less than this probability
    /// (`--draft-p-min`).
    pub p_min: f32,
    /// Draft only where it is expected to pay (off: always draft what the lookup finds, which
    /// tests and measurements of the verification itself want).
    pub adaptive: bool,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation {
            mode: SpecMode::Off,
            draft_max: 16,
            draft_min: 1,
            ngram_max: 4,
            ngram_min: 2,
            p_min: 0.75,
            adaptive: true,
        }
    }
}

impl Speculation {
    pub fn is_on(&self) -> bool {
        self.mode != SpecMode::Off && self.draft_max > 0
    }

    /// These settings with a request's own choices on top.
    pub fn with(mut self, o: &SpecOverride) -> Speculation {
        self.mode = o.mode.unwrap_or(self.mode);
        self.draft_max = o.draft_max.unwrap_or(self.draft_max);
        self.draft_min = o.draft_min.unwrap_or(self.draft_min);
        self.p_min = o.p_min.unwrap_or(self.p_min);
        self.adaptive = o.adaptive.unwrap_or(self.adaptive);
        self
    }
}

/// A request's speculative decoding choices; what it leaves out comes from the scheduler's
/// [`Speculation`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpecOverride {
    pub mode: Option<SpecMode>,
    pub draft_max: Option<usize>,
    pub draft_min: Option<usize>,
    pub p_min: Option<f32>,
    pub adaptive: Option<bool>,
}

impl SpecOverride {
    /// Check the request's values against their ranges (the rule `--draft-p-min` follows too).
    pub fn validate(&self) -> Result<(), ParamError> {
        match self.p_min {
            Some(p) => in_range("speculative.p_min", p, 0.0, 1.0),
            None => Ok(()),
        }
    }
}

/// How far back a lookup searches (tokens): bounds the per-step cost on long contexts.
const LOOKUP_WINDOW: usize = 8192;

/// Up to `max` tokens that followed the latest earlier occurrence of the last n tokens of
/// `ctx` (n from `ngram_max` down to `ngram_min`); empty when nothing matches. A continuation
/// that runs into the end of the context goes on as the copy it has become (a repeating
/// stretch drafts its repetitions).
pub fn lookup(ctx: &[u32], ngram_min: usize, ngram_max: usize, max: usize) -> Vec<u32> {
    let len = ctx.len();
    let from = len.saturating_sub(LOOKUP_WINDOW);
    for n in (ngram_min.max(1)..=ngram_max).rev() {
        if n >= len {
            continue;
        }
        let key = &ctx[len - n..];
        // Latest occurrence first: recent text predicts best. It must end before the key.
        for start in (from..len - n).rev() {
            if &ctx[start..start + n] == key {
                let cont = start + n;
                let period = len - cont;
                return (0..max).map(|i| ctx[cont + i % period]).collect();
            }
        }
    }
    Vec::new()
}

/// A sequence's chance that a drafted token is kept, learnt with exponential forgetting, apart
/// after a kept token and after a miss: guesses come in runs (a copied stretch is guessed right
/// until the copy ends), so the token after a kept one is much likelier kept than the first
/// one after a miss.
#[derive(Clone, Copy, Debug)]
pub struct Acceptance {
    after_kept: Rate,
    after_miss: Rate,
    last_kept: bool,
}

#[derive(Clone, Copy, Debug)]
struct Rate {
    kept: f64,
    tried: f64,
}

/// Weight kept per observation (about the last 30 observations count).
const FORGET: f64 = 0.97;

impl Default for Rate {
    /// An optimistic start (a kept-rate of 1/2 worth four observations), so that drafting is
    /// tried and measured.
    fn default() -> Self {
        Rate { kept: 2.0, tried: 4.0 }
    }
}

impl Rate {
    fn rate(&self) -> f64 {
        self.kept / self.tried
    }

    fn observe(&mut self, kept: bool) {
        self.kept = self.kept * FORGET + f64::from(u8::from(kept));
        self.tried = self.tried * FORGET + 1.0;
    }
}

impl Default for Acceptance {
    fn default() -> Self {
        Acceptance { after_kept: Rate::default(), after_miss: Rate::default(), last_kept: true }
    }
}

impl Acceptance {
    /// The chance that the next drafted token is kept.
    pub fn rate(&self) -> f64 {
        if self.last_kept { self.after_kept.rate() } else { self.after_miss.rate() }
    }

    /// The chance that a drafted token after a kept one is kept (the second and later tokens
    /// of a draft).
    pub fn rate_on(&self) -> f64 {
        self.after_kept.rate()
    }

    /// One drafted (or predicted) token, kept or not.
    pub fn observe(&mut self, kept: bool) {
        let r = if self.last_kept { &mut self.after_kept } else { &mut self.after_miss };
        r.observe(kept);
        self.last_kept = kept;
    }
}

/// The time of a step as `fixed + per_token × tokens`, fitted by least squares over recent
/// steps (exponentially weighted), with a prior that keeps it defined before the steps vary.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepCost {
    w: f64,
    sn: f64,
    st: f64,
    snn: f64,
    snt: f64,
}

/// Steps with more tokens than this (prompt chunks) do not enter the fit: its tokens cost
/// less each, and the fit is for the few tokens drafts add.
const FIT_MAX_TOKENS: usize = 64;
const STEP_FORGET: f64 = 0.98;

impl StepCost {
    /// A step of `tokens` tokens took `secs`.
    pub fn observe(&mut self, tokens: usize, secs: f64) {
        if tokens == 0 || tokens > FIT_MAX_TOKENS {
            return;
        }
        let n = tokens as f64;
        let f = STEP_FORGET;
        self.w = self.w * f + 1.0;
        self.sn = self.sn * f + n;
        self.st = self.st * f + secs;
        self.snn = self.snn * f + n * n;
        self.snt = self.snt * f + n * secs;
    }

    /// (fixed, per-token) seconds; `None` until any step was seen.
    pub fn model(&self) -> Option<(f64, f64)> {
        if self.w < 0.5 {
            return None;
        }
        let mean_n = self.sn / self.w;
        let mean_t = self.st / self.w;
        // Prior: a token costs a fifth of a one-token step, worth two steps of spread. It
        // dominates only while the step sizes have not varied (no drafts yet), and errs
        // towards trying drafts.
        let prior_w = 2.0;
        let prior_slope = mean_t / (mean_n + 4.0);
        let var = self.snn / self.w - mean_n * mean_n;
        let cov = self.snt / self.w - mean_n * mean_t;
        let slope = ((cov * self.w + prior_slope * prior_w) / (var * self.w + prior_w)).max(1e-7);
        let fixed = (mean_t - slope * mean_n).max(0.0);
        Some((fixed, slope))
    }
}

/// Drafted tokens per sequence before any step was timed.
const FIRST_DRAFT: usize = 2;

/// What a draft model's passes cost: fitted to its passes as they run, and before any was
/// timed, the target's cost scaled by the ratio of their weights' bytes (decode reads every
/// weight once per pass, so a draft half the target's size costs about half a target step).
#[derive(Clone, Copy, Debug)]
pub struct DraftCost {
    ratio: f64,
    fit: StepCost,
}

impl DraftCost {
    /// A draft model of `draft_bytes` of weights for a target of `target_bytes`.
    pub fn new(draft_bytes: u64, target_bytes: u64) -> DraftCost {
        DraftCost { ratio: draft_bytes as f64 / target_bytes.max(1) as f64, fit: StepCost::default() }
    }

    /// A pass of the draft model over `tokens` tokens took `secs`.
    pub fn observe(&mut self, tokens: usize, secs: f64) {
        self.fit.observe(tokens, secs);
    }

    /// (extra seconds per drafted token, seconds once per drafting sequence) for a sequence
    /// whose draft cache is `behind` tokens behind (its newest token included): each guess is a
    /// pass, and the first also computes the tokens it was behind on. `target` is the target's
    /// (fixed, per-token) step cost.
    pub fn price(&self, target: (f64, f64), behind: usize) -> (f64, f64) {
        let (fixed, per) = self.fit.model().unwrap_or((target.0 * self.ratio, target.1 * self.ratio));
        (fixed + per, per * behind.saturating_sub(1) as f64)
    }
}

/// Tokens ahead over which a draft model's catch-up is spread, at most.
const CATCH_UP_HORIZON: usize = 64;

/// The share of a catch-up costing `entry` seconds that one drafting step carries, for a
/// sequence with `left` tokens still to generate: the catch-up serves the steps after it too
/// (its cache stays in step while it drafts), taken as one step per two tokens, over the
/// tokens left but at most [`CATCH_UP_HORIZON`]. A draft that turns out always wrong thus
/// costs its catch-up once, which a short answer may notice and a long one not.
pub fn amortized(entry: f64, left: usize) -> f64 {
    entry / (left.min(CATCH_UP_HORIZON) as f64 / 2.0).max(1.0)
}

/// A sequence that may draft, as [`choose_drafts`] weighs it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftCandidate {
    /// The chance that its first drafted token is kept, and each one after a kept one.
    pub rate: f64,
    pub rate_on: f64,
    /// Drafted tokens it can offer, at most.
    pub len: usize,
    /// Seconds each drafted token costs before the step (a draft model's pass; 0 for a lookup).
    pub extra: f64,
    /// Seconds paid if it drafts at all (a draft model catching up on the context; its share
    /// for this step, see [`amortized`]).
    pub entry: f64,
    /// Drafted by a model (which waits until a step was timed).
    pub by_model: bool,
}

impl DraftCandidate {
    /// A lookup's draft of `len` tokens: free to make.
    pub fn lookup(rate: f64, len: usize) -> DraftCandidate {
        DraftCandidate { rate, rate_on: rate, len, extra: 0.0, entry: 0.0, by_model: false }
    }
}

/// How many drafted tokens each candidate sequence puts into a step.
///
/// `base_tokens` are the step's tokens without drafts and `base_yield` the tokens it is expected
/// to produce. Drafted tokens are added best first (a sequence's k-th token is worth
/// `rate · rate_on^(k-1)`, its chance of being kept)
/// while each raises the step's expected tokens per second; a sequence's first tokens are
/// weighed together with what it pays once to draft at all (the run of them that is worth most
/// for its cost). Before any step was timed, a lookup drafts a little (which also times a
/// longer step) and a draft model nothing: its first pass may cost much.
pub fn choose_drafts(
    cost: &StepCost,
    base_tokens: usize,
    base_yield: f64,
    candidates: &[DraftCandidate],
) -> Vec<usize> {
    let mut take = vec![0; candidates.len()];
    let Some((fixed, per_token)) = cost.model() else {
        return candidates.iter().map(|c| if c.by_model { 0 } else { c.len.min(FIRST_DRAFT) }).collect();
    };
    let mut time = fixed + per_token * base_tokens as f64;
    let mut value = base_yield;
    loop {
        // The next run of tokens (one, or the first ones of a sequence not drafting yet) that
        // is worth most for its cost.
        let best = candidates
            .iter()
            .enumerate()
            .filter_map(|(i, c)| next_run(c, take[i], per_token).map(|(k, worth, price)| (i, k, worth, price)))
            .max_by(|a, b| (a.2 / a.3).total_cmp(&(b.2 / b.3)));
        let Some((i, k, worth, price)) = best else { break };
        // Worth adding when worth / price > value / time.
        if worth * time <= value * price {
            break;
        }
        take[i] += k;
        time += price;
        value += worth;
    }
    take
}

/// The next tokens `c` could add after its first `taken`: (how many, expected kept tokens,
/// seconds). Past its first token, one at a time; its first run is the one of best worth per
/// second, its entry cost included.
fn next_run(c: &DraftCandidate, taken: usize, per_token: f64) -> Option<(usize, f64, f64)> {
    if taken >= c.len {
        return None;
    }
    let price = per_token + c.extra;
    let kept = |k: usize| c.rate * c.rate_on.powi(k as i32 - 1);
    if taken > 0 {
        return Some((1, kept(taken + 1), price));
    }
    let (mut best, mut worth) = (None::<(usize, f64, f64)>, 0.0);
    for k in 1..=c.len {
        worth += kept(k);
        let run = (k, worth, c.entry + price * k as f64);
        if best.is_none_or(|b| run.1 / run.2 > b.1 / b.2) {
            best = Some(run);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_latest_longest_match() {
        let ctx = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3];
        // "2 3" occurs at 1 and 6: the later one continues with 7 8 5.
        assert_eq!(lookup(&ctx, 1, 4, 3), [7, 8, 5]);
        // Past the context's end the copy goes on: "7 8 5 2 3" repeats.
        assert_eq!(lookup(&ctx, 1, 4, 7), [7, 8, 5, 2, 3, 7, 8]);
        assert_eq!(lookup(&[4, 4, 4], 2, 2, 5), [4, 4, 4, 4, 4]);
        assert!(lookup(&[1, 2, 3], 1, 3, 4).is_empty());
        assert!(lookup(&[], 1, 3, 4).is_empty());
        assert!(lookup(&ctx, 1, 4, 0).is_empty());
    }

    #[test]
    fn the_step_cost_fit_finds_a_line() {
        let mut c = StepCost::default();
        assert!(c.model().is_none());
        for i in 0..200 {
            let n = 1 + i % 9;
            c.observe(n, 0.010 + 0.002 * n as f64);
        }
        c.observe(500, 1.0); // a prompt chunk: not in the fit
        let (fixed, per) = c.model().unwrap();
        assert!((fixed - 0.010).abs() < 1e-4, "{fixed}");
        assert!((per - 0.002).abs() < 1e-5, "{per}");
    }

    #[test]
    fn drafts_are_taken_only_while_they_pay() {
        let mut c = StepCost::default();
        for i in 0..100 {
            let n = 1 + i % 5;
            // Memory-bound: a token costs a tenth of a step.
            c.observe(n, 0.010 + 0.001 * n as f64);
        }
        // A good drafter drafts its whole draft, a hopeless one nothing.
        let model = |rate, extra, entry| DraftCandidate { rate, rate_on: rate, len: 8, extra, entry, by_model: true };
        assert_eq!(choose_drafts(&c, 1, 1.0, &[DraftCandidate::lookup(0.9, 8)]), vec![8]);
        assert_eq!(choose_drafts(&c, 1, 1.0, &[DraftCandidate::lookup(0.05, 8)]), vec![0]);
        // A sure draft that costs as much as a step to make does not pay.
        assert_eq!(choose_drafts(&c, 1, 1.0, &[model(1.0, 0.011, 0.0)]), vec![0]);
        assert_eq!(choose_drafts(&c, 1, 1.0, &[model(1.0, 0.001, 0.0)]), vec![8]);
        // What drafting costs once is weighed with the run of tokens it buys: a single token
        // would not pay for it, several do; a catch-up that costs more than they save, not.
        assert_eq!(choose_drafts(&c, 1, 1.0, &[model(0.9, 0.001, 0.004)]), vec![8]);
        assert_eq!(choose_drafts(&c, 1, 1.0, &[model(0.5, 0.001, 0.006)]), vec![0]);
        assert_eq!(choose_drafts(&c, 1, 1.0, &[model(0.9, 0.001, 0.1)]), vec![0]);
        // Compute-bound: a token costs as much as a step; only a near-certain draft pays.
        let mut c = StepCost::default();
        for i in 0..100 {
            let n = 1 + i % 5;
            c.observe(n, 0.010 * n as f64);
        }
        let l = DraftCandidate::lookup(0.6, 8);
        assert_eq!(choose_drafts(&c, 1, 1.0, &[l]), vec![0]);
        assert_eq!(choose_drafts(&c, 8, 8.0, &[l, l]), vec![0, 0]);
        // Before any step was timed: a lookup tries a little, a draft model waits.
        let none = StepCost::default();
        assert_eq!(choose_drafts(&none, 1, 1.0, &[l, model(0.9, 0.001, 0.0)]), vec![2, 0]);
    }

    #[test]
    fn a_draft_model_costs_its_share_of_the_target_until_timed() {
        let d = DraftCost::new(25, 100);
        let (extra, entry) = d.price((0.010, 0.001), 11);
        assert!((extra - 0.00275).abs() < 1e-9 && (entry - 0.0025).abs() < 1e-9, "{extra} {entry}");
        let mut d = d;
        for i in 0..50 {
            d.observe(1 + i % 4, 0.001 + 0.0005 * (1 + i % 4) as f64);
        }
        let (extra, entry) = d.price((0.010, 0.001), 3);
        assert!((extra - 0.0015).abs() < 1e-4 && (entry - 0.001).abs() < 1e-4, "{extra} {entry}");
        // A self-draft (as large as the target) never pays, even if always right.
        let (extra, _) = DraftCost::new(100, 100).price((0.010, 0.001), 1);
        let mut c = StepCost::default();
        (0..100).for_each(|i| c.observe(1 + i % 5, 0.010 + 0.001 * (1 + i % 5) as f64));
        let sure = DraftCandidate { rate: 1.0, rate_on: 1.0, len: 16, extra, entry: 0.0, by_model: true };
        assert_eq!(choose_drafts(&c, 1, 1.0, &[sure]), vec![0]);
        // A catch-up is spread over the steps ahead, at most 32 of them.
        assert_eq!(amortized(3.2, 1000), 0.1);
        assert_eq!(amortized(3.2, 16), 0.4);
        assert_eq!(amortized(3.2, 1), 3.2);
    }

    #[test]
    fn acceptance_follows_recent_outcomes() {
        let mut a = Acceptance::default();
        assert_eq!(a.rate(), 0.5);
        (0..100).for_each(|_| a.observe(true));
        assert!(a.rate() > 0.9);
        (0..100).for_each(|_| a.observe(false));
        assert!(a.rate() < 0.1);
        // Runs of ten kept, then of ten missed: after a kept token the next is likely kept,
        // after a miss not.
        let mut a = Acceptance::default();
        (0..300).for_each(|i| a.observe(i % 20 < 10));
        assert!(a.rate() < 0.2 && a.rate_on() > 0.8, "{} {}", a.rate(), a.rate_on());
        a.observe(true);
        assert!(a.rate() > 0.8);
    }
}
