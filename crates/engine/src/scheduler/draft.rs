//! The draft model of speculative decoding: its own KV pool and block tables beside the
//! target's, kept in step with each sequence, and greedy drafting for many sequences at once.
//!
//! A sequence's draft cache holds the keys and values of its first `draft_computed` tokens. A
//! drafting step first brings it up to the sequence's newest token (the prompt the first time,
//! then the tokens the target added), which gives the first guess; each further guess is one
//! more batched pass over the sequences still drafting. After verification the draft cache is
//! cut back to what the target kept, as the target's is.

use onebit_kernels::Pool;
use onebit_model::{BLOCK_TOKENS, KvPool, LogitsWanted, Model, Scratch, SeqInput};

use super::sequence::Sequence;
use super::worker::Plan;
use crate::blocks::{BlockManager, KvBlocks};
use crate::speculative::{DraftCandidate, DraftCost, SpecMode, StepCost, amortized, choose_drafts, lookup};
use crate::{Engine, EngineError};

/// A sequence drafting with a model that chose to draft nothing tries one token after this many
/// steps, so that its acceptance estimate can recover; each probe that does not bring drafting
/// back doubles the wait, up to the longest. A probe first brings the draft cache up to date
/// with the tokens since, which costs a share of their time as large as the draft model's
/// share of the target: it is made only where that is at most [`PROBE_SHARE`] of the time since
/// the sequence's last draft or probe.
pub(super) const PROBE_FIRST: usize = 8;
const PROBE_MAX: usize = 64;
const PROBE_SHARE: f64 = 0.02;

/// What drafting needs of the engine loop.
pub(super) struct Parts<'a> {
    pub engine: &'a Engine,
    pub pool: &'a Pool,
    pub blocks: &'a mut KvBlocks,
    pub drafter: Option<&'a mut Drafter>,
    pub cost: &'a StepCost,
    pub ctx: usize,
    /// The step's token budget (`--batch-size`).
    pub room: usize,
}

/// Drafts for the decoding sequences that speculate: as many drafted tokens as pay (see
/// [`choose_drafts`]), within the step's token budget and the free blocks (keeping a block of
/// headroom per running sequence). They go into the sequences' tokens after the newest one, and
/// into the plan.
pub(super) fn add_drafts(mut plan: Plan, running: &mut [Sequence], parts: Parts<'_>) -> Result<Plan, EngineError> {
    let Parts { engine, pool, blocks, drafter, cost, ctx, room } = parts;
    if !running.iter().any(|s| s.spec.is_on()) {
        return Ok(plan);
    }
    let mut cands: Vec<Cand> = Vec::new();
    for (p, &(i, n)) in plan.iter().enumerate() {
        let s = &mut running[i];
        s.predicted = None;
        if n != 1 || s.remaining() != 1 || !s.may_draft() {
            continue;
        }
        let max = s.spec.draft_max.min(s.budget_left(ctx).saturating_sub(1));
        match s.spec.mode {
            SpecMode::Lookup => {
                let draft = lookup(&s.tokens, s.spec.ngram_min, s.spec.ngram_max, max);
                s.predicted = draft.first().copied();
                if draft.len() >= s.spec.draft_min.max(1) {
                    let len = draft.len();
                    cands.push((p, Some(draft), len));
                }
            }
            SpecMode::Draft if drafter.is_some() && max >= s.spec.draft_min.max(1) => cands.push((p, None, max)),
            _ => {}
        }
    }
    if cands.is_empty() {
        return Ok(plan);
    }
    let base_tokens: usize = plan.iter().map(|e| e.1).sum();
    let base_yield = plan.iter().filter(|&&(i, n)| running[i].n_computed + n == running[i].tokens.len()).count();
    let target = cost.model();
    let (priced, catch_up) = price(&cands, running, &plan, drafter.as_deref(), target, ctx);
    let mut take = choose_drafts(cost, base_tokens, base_yield as f64, &priced);
    // Within the budget and the blocks, before any drafting work.
    let mut room = room.saturating_sub(base_tokens);
    let mut spare = blocks.available().saturating_sub(running.len());
    for (((t, c), price), catch_up) in take.iter_mut().zip(&cands).zip(&priced).zip(catch_up) {
        let s = &mut running[plan[c.0].0];
        if !s.spec.adaptive {
            *t = c.2;
        }
        if c.1.is_none() && *t == 0 {
            s.undrafted_steps += 1;
            // A probe: its catch-up, its guess and its place in the step, against the time
            // since its last draft or probe.
            let cheap = target.is_some_and(|(fixed, per)| {
                catch_up + price.extra + per <= PROBE_SHARE * s.undrafted_steps as f64 * (fixed + per)
            });
            if s.undrafted_steps >= s.probe_every && cheap {
                *t = 1;
                // Counted from this probe on, whatever it brings (a guess under p_min is none).
                s.undrafted_steps = 0;
                s.probe_every = (s.probe_every * 2).min(PROBE_MAX);
            }
        } else if c.1.is_none() {
            s.undrafted_steps = 0;
            s.probe_every = PROBE_FIRST;
        }
        let fits = (s.table.capacity() + spare * BLOCK_TOKENS).saturating_sub(s.n_computed + 1);
        *t = (*t).min(room).min(fits);
        if *t < s.spec.draft_min.max(1) {
            *t = 0;
        }
        room -= *t;
        spare -= s.table.need(s.n_computed + 1 + *t);
    }
    // The draft model guesses for the sequences that use it, all together.
    let wanted: Vec<usize> = cands.iter().zip(&take).map(|(c, &t)| if c.1.is_none() { t } else { 0 }).collect();
    let mut guessed: Vec<Vec<u32>> = vec![Vec::new(); cands.len()];
    if let (Some(d), Some(model)) = (drafter, engine.draft())
        && wanted.iter().any(|&w| w > 0)
    {
        let rows: Vec<usize> = cands.iter().map(|c| plan[c.0].0).collect();
        let mut seqs: Vec<&mut Sequence> =
            running.iter_mut().enumerate().filter(|(i, _)| rows.contains(i)).map(|(_, s)| s).collect();
        // `rows` follows the plan, which follows `running`: the same order as `seqs`.
        guessed = d.propose(model, pool, &mut seqs, &wanted)?;
        // A draft model that offers nothing sure enough (`--draft-p-min`) has failed too: its
        // pass was paid for.
        for ((s, &w), g) in seqs.iter_mut().zip(&wanted).zip(&guessed) {
            if w > 0 && g.is_empty() {
                s.acceptance.observe(false);
            }
        }
    }
    for ((c, k), guess) in cands.into_iter().zip(take).zip(guessed) {
        let (p, lookup_draft, _) = c;
        let s = &mut running[plan[p].0];
        let draft = match lookup_draft {
            Some(mut d) => {
                d.truncate(k);
                d
            }
            None => guess,
        };
        if draft.is_empty() || draft.len() < s.spec.draft_min {
            continue;
        }
        s.undrafted_steps = 0;
        blocks.grow(&mut s.table, s.n_computed + 1 + draft.len());
        s.n_draft = draft.len();
        plan[p].1 += draft.len();
        s.tokens.extend(draft);
    }
    Ok(plan)
}

/// A drafting candidate: (its place in the plan, the lookup's draft or none for a draft model,
/// its longest draft).
type Cand = (usize, Option<Vec<u32>>, usize);

/// How [`choose_drafts`] sees each candidate, and the seconds a draft model's catch-up costs it
/// whole (for its probes); `target` is the target's fitted step cost.
fn price(
    cands: &[Cand],
    running: &[Sequence],
    plan: &Plan,
    drafter: Option<&Drafter>,
    target: Option<(f64, f64)>,
    ctx: usize,
) -> (Vec<DraftCandidate>, Vec<f64>) {
    cands
        .iter()
        .map(|c| {
            let s = &running[plan[c.0].0];
            let free =
                DraftCandidate { rate_on: s.acceptance.rate_on(), ..DraftCandidate::lookup(s.acceptance.rate(), c.2) };
            match (&c.1, drafter, target) {
                (Some(_), _, _) => (free, 0.0),
                (None, Some(d), Some(t)) => {
                    let (extra, entry) = d.cost.price(t, s.tokens.len() - s.draft_computed);
                    let amortized = amortized(entry, s.budget_left(ctx));
                    (DraftCandidate { extra, entry: amortized, by_model: true, ..free }, entry)
                }
                (None, _, _) => (DraftCandidate { by_model: true, ..free }, 0.0),
            }
        })
        .unzip()
}

pub(super) struct Drafter {
    kv: KvPool,
    blocks: BlockManager,
    scratch: Scratch,
    /// What the draft model's passes cost.
    cost: DraftCost,
    /// Whether a pass was made (the first touches the weights and is not timed).
    warm: bool,
}

impl Drafter {
    /// A draft pool of `n_blocks` blocks (as many as the target's: a sequence never needs
    /// more positions there).
    pub fn new(draft: &Model, target: &Model, n_blocks: usize) -> Result<Drafter, EngineError> {
        Ok(Drafter {
            kv: draft.new_pool(n_blocks)?,
            blocks: BlockManager::new(n_blocks, BLOCK_TOKENS),
            scratch: Scratch::new(),
            cost: DraftCost::new(weight_bytes(draft), weight_bytes(target)),
            warm: false,
        })
    }

    /// Give back a sequence's draft blocks (it ended, or was put back in the queue).
    pub fn release(&mut self, s: &mut Sequence) {
        while let Some(b) = s.draft_blocks.pop() {
            self.blocks.release(b);
        }
        s.draft_computed = 0;
    }

    /// Up to `want[i]` greedy guesses of `draft` for each of `seqs`, each stopping at a guess
    /// the draft model gives less than the sequence's `p_min`.
    pub fn propose(
        &mut self,
        draft: &Model,
        pool: &Pool,
        seqs: &mut [&mut Sequence],
        want: &[usize],
    ) -> Result<Vec<Vec<u32>>, EngineError> {
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); seqs.len()];
        // Blocks first: a sequence the pool cannot hold drafts nothing.
        let mut going: Vec<usize> = Vec::new();
        for (i, s) in seqs.iter_mut().enumerate() {
            if want[i] == 0 {
                continue;
            }
            // Positions up to the newest token, and one per guess but the last.
            let need = s.tokens.len() + want[i] - 1;
            while s.draft_blocks.len() * BLOCK_TOKENS < need {
                match self.blocks.allocate(s.draft_blocks.last().copied()) {
                    Some(b) => s.draft_blocks.push(b),
                    None => break,
                }
            }
            if s.draft_blocks.len() * BLOCK_TOKENS >= need {
                going.push(i);
            }
        }
        let mut first = true;
        while !going.is_empty() {
            let inputs: Vec<SeqInput> = going
                .iter()
                .map(|&i| {
                    let s = &seqs[i];
                    let tokens = if first { &s.tokens[s.draft_computed..] } else { &out[i][out[i].len() - 1..] };
                    SeqInput {
                        tokens,
                        start: s.draft_computed,
                        blocks: &s.draft_blocks,
                        window_blocks: None,
                        logits: LogitsWanted::Last,
                    }
                })
                .collect();
            let computed: Vec<usize> = inputs.iter().map(|x| x.tokens.len()).collect();
            let t = std::time::Instant::now();
            let logits = draft.forward(pool, &mut self.kv, &inputs, &mut self.scratch)?;
            if self.warm {
                self.cost.observe(computed.iter().sum(), t.elapsed().as_secs_f64());
            }
            self.warm = true;
            drop(inputs);
            let mut still = Vec::with_capacity(going.len());
            for (p, &i) in going.iter().enumerate() {
                let s = &mut seqs[i];
                s.draft_computed += computed[p];
                let row = logits.last(p).ok_or_else(|| EngineError::Internal("no draft logits".into()))?;
                let (id, prob) = top(row);
                if prob < s.spec.p_min {
                    continue;
                }
                out[i].push(id);
                if out[i].len() < want[i] {
                    still.push(i);
                }
            }
            going = still;
            first = false;
        }
        Ok(out)
    }
}

/// The bytes of a model's weights (what a decoding pass reads).
fn weight_bytes(m: &Model) -> u64 {
    m.gguf().tensors().map(|t| t.data().len() as u64).sum()
}

/// The most likely token of `logits` and its probability.
fn top(logits: &[f32]) -> (u32, f32) {
    let (mut best, mut max) = (0, f32::NEG_INFINITY);
    for (i, &x) in logits.iter().enumerate() {
        if x > max {
            (best, max) = (i, x);
        }
    }
    let z: f32 = logits.iter().map(|&x| (x - max).exp()).sum();
    (best as u32, 1.0 / z)
}
