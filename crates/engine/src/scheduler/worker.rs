//! The engine loop: take requests, give them places in the batch, plan each step within the
//! token budget and the KV pool, run it, sample every sequence that got logits, and stream.
//!
//! Memory: a request gets a place only when the pool can hold its whole prompt (beyond what
//! the prefix cache already holds) plus a block of headroom per running sequence. If a step
//! still cannot get the blocks it needs, the newest sequence goes back to the front of the
//! queue with its blocks released (they stay in the prefix cache while nobody needs them, so
//! taking it up again usually recomputes little).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use onebit_kernels::{PerThread, Pool};
use onebit_model::{BLOCK_TOKENS, KvPool, LogitsWanted, LoraUse, Scratch, SeqInput};

use super::draft::{self, Drafter};
use super::sequence::{After, Sequence};
use super::{Command, SchedulerConfig, SchedulerStats, Shared};
use crate::blocks::KvBlocks;
use crate::constraint::{ConstraintState, apply_mask};
use crate::request::FinishReason;
use crate::sampling::{self, Candidate, TokenLogprobs};
use crate::speculative::StepCost;
use crate::{Engine, EngineError};

/// (index in `running`, tokens to compute this step), in `running` order.
pub(super) type Plan = Vec<(usize, usize)>;

pub(super) struct Worker {
    engine: Arc<Engine>,
    pool: Pool,
    kv: KvPool,
    blocks: KvBlocks,
    scratch: Scratch,
    /// Per pool thread: the sampler's vocabulary-sized work space.
    work: PerThread<DrawSpace>,
    config: SchedulerConfig,
    rx: Receiver<Command>,
    shared: Arc<Shared>,
    waiting: VecDeque<Sequence>,
    /// In the order they got their places.
    running: Vec<Sequence>,
    stats: SchedulerStats,
    /// What a step costs per token, for deciding whether drafts pay.
    cost: StepCost,
    /// The draft model's cache (`--model-draft`).
    drafter: Option<Drafter>,
}

/// One sequence's draws from its logits, made on a pool thread: one token, or with a draft, one
/// per verified position up to the first that disagrees with the draft.
struct Draw<'a> {
    seq: usize,
    sequence: &'a mut Sequence,
    rows: Vec<&'a [f32]>,
    draft: Vec<u32>,
    out: Option<DrawResult>,
}

/// The drawn tokens and their log-probabilities, or why the sequence's grammar allowed none.
type DrawResult = Result<Vec<(u32, Option<TokenLogprobs>)>, String>;

/// A pool thread's work space for draws: the sampler's candidates, and the masked logits of
/// a constrained sequence.
#[derive(Default)]
struct DrawSpace {
    candidates: Vec<Candidate>,
    masked: Vec<f32>,
}

/// Constrained sequences whose next mask is being computed, by index in `running`.
type Masking = Vec<(usize, Box<ConstraintState>)>;

impl Worker {
    pub fn new(
        engine: Arc<Engine>,
        pool: Pool,
        (kv, blocks): (KvPool, KvBlocks),
        drafter: Option<Drafter>,
        config: SchedulerConfig,
        rx: Receiver<Command>,
        shared: Arc<Shared>,
    ) -> Worker {
        let work = PerThread::new(pool.n_threads(), DrawSpace::default);
        Worker {
            engine,
            pool,
            kv,
            blocks,
            scratch: Scratch::new(),
            work,
            config,
            rx,
            shared,
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats: SchedulerStats::default(),
            cost: StepCost::default(),
            drafter,
        }
    }

    pub fn run(mut self) {
        while self.receive() {
            self.reap_cancelled();
            self.admit();
            let plan = self.plan();
            if plan.is_empty() {
                continue;
            }
            let plan = match self.drafts(plan) {
                Ok(plan) => plan,
                Err(e) => {
                    self.fail_running(&e);
                    continue;
                }
            };
            if let Err(e) = self.step(&plan) {
                self.fail_running(&e);
            }
        }
        self.shut_down();
    }

    /// Handle every command that has arrived, waiting for one when there is nothing to do.
    /// Returns false when the loop must stop.
    fn receive(&mut self) -> bool {
        if self.running.is_empty() && self.waiting.is_empty() {
            match self.rx.recv() {
                Ok(cmd) => {
                    if !self.handle(cmd) {
                        return false;
                    }
                }
                Err(_) => return false,
            }
        }
        loop {
            match self.rx.try_recv() {
                Ok(cmd) => {
                    if !self.handle(cmd) {
                        return false;
                    }
                }
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit(seq) => self.waiting.push_back(*seq),
            Command::Stats(reply) => {
                let (blocks, window_blocks) = self.blocks.counts();
                let _ = reply.send(SchedulerStats {
                    running: self.running.len(),
                    waiting: self.waiting.len(),
                    blocks,
                    window_blocks,
                    ..self.stats
                });
            }
            Command::Sequences(reply) => {
                let _ = reply.send(self.running.iter().map(Sequence::info).collect());
            }
            Command::CheckBlocks(reply) => {
                let held = self.waiting.iter().any(|s| !s.table.is_empty());
                let result = if held {
                    Err("a waiting sequence holds blocks".into())
                } else {
                    self.blocks.check(self.running.iter().map(|s| &s.table))
                };
                let _ = reply.send(result);
            }
            Command::ClearCache => self.blocks.clear_cache(),
            Command::Shutdown => return false,
        }
        true
    }

    /// Sequences whose caller cancelled or went away leave now.
    fn reap_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].is_cancelled() {
                let mut seq = self.running.remove(i);
                self.finish(&mut seq, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
        let mut kept = VecDeque::with_capacity(self.waiting.len());
        while let Some(mut seq) = self.waiting.pop_front() {
            if seq.is_cancelled() {
                self.finish(&mut seq, FinishReason::Cancelled);
            } else {
                kept.push_back(seq);
            }
        }
        self.waiting = kept;
    }

    /// Give waiting requests places, in order, while there are places and memory.
    fn admit(&mut self) {
        let b = BLOCK_TOKENS;
        while self.running.len() < self.config.parallel {
            let Some(seq) = self.waiting.front() else { return };
            if self.held_back(seq) {
                return;
            }
            let total = seq.tokens.len();
            // The block holding the last token is always computed (it needs logits), so a
            // sequence never writes into a block it shares.
            let found = self.blocks.find(&seq.lora, &seq.tokens, (total - 1) / b);
            if !self.blocks.can_take(&found, total, self.running.len()) {
                return;
            }
            let mut seq = self.waiting.pop_front().expect("a front");
            seq.n_computed = found.len() * b;
            seq.table = self.blocks.take(found);
            let cached = seq.n_computed;
            seq.admitted(cached);
            self.running.push(seq);
        }
    }

    /// Whether `seq` should wait for a running prompt that starts like it to be computed
    /// first, so that it can take that prefix from the cache instead of computing it again.
    fn held_back(&self, seq: &Sequence) -> bool {
        let b = BLOCK_TOKENS;
        self.running.iter().any(|r| {
            if r.n_computed >= r.n_prompt || r.lora != seq.lora {
                return false;
            }
            let common = r.tokens[..r.n_prompt].iter().zip(&seq.tokens).take_while(|(x, y)| x == y).count();
            let useful = common.min(seq.tokens.len() - 1) / b * b;
            useful >= b && r.n_computed < useful
        })
    }

    /// The step's tokens: one for every decoding sequence, then prompt chunks in order up to
    /// the budget; with the blocks they need allocated (preempting the newest sequences when
    /// the pool is short).
    fn plan(&mut self) -> Plan {
        loop {
            let plan = self.budget();
            let need: usize =
                plan.iter().map(|&(i, n)| self.running[i].table.need(self.running[i].n_computed + n)).sum();
            if need <= self.blocks.available() {
                for &(i, n) in &plan {
                    let s = &mut self.running[i];
                    self.blocks.grow(&mut s.table, s.n_computed + n);
                }
                return plan;
            }
            let Some(mut victim) = self.running.pop() else { return Vec::new() };
            self.release_blocks(&mut victim);
            victim.n_computed = 0;
            self.waiting.push_front(victim);
            self.stats.preemptions += 1;
        }
    }

    fn budget(&self) -> Plan {
        let batch = self.config.batch_size;
        let decoding = self.running.iter().filter(|s| s.remaining() == 1).count();
        // Prompts always get some of the step, however many sequences decode.
        let mut budget = batch.saturating_sub(decoding).max(batch.div_ceil(4));
        let mut plan = Vec::with_capacity(self.running.len());
        for (i, s) in self.running.iter().enumerate() {
            match s.remaining() {
                0 => {}
                1 => plan.push((i, 1)),
                r => {
                    let take = r.min(budget);
                    if take > 0 {
                        budget -= take;
                        plan.push((i, take));
                    }
                }
            }
        }
        plan
    }

    /// The plan with the drafts of the sequences that speculate (see [`draft::add_drafts`]).
    fn drafts(&mut self, plan: Plan) -> Result<Plan, EngineError> {
        let Worker { engine, pool, blocks, running, cost, config, drafter, .. } = self;
        let room = config.batch_size;
        let parts = draft::Parts { engine, pool, blocks, drafter: drafter.as_mut(), cost, ctx: config.ctx_size, room };
        draft::add_drafts(plan, running, parts)
    }

    /// Run one forward pass for `plan` (computing the grammar masks of constrained sequences
    /// beside it), then sample and stream.
    fn step(&mut self, plan: &[(usize, usize)]) -> Result<(), EngineError> {
        let started = Instant::now();
        let Worker { engine, pool, kv, blocks, scratch, work, running, stats, cost, .. } = self;
        let decoding_only = plan.iter().all(|&(i, n)| {
            let s = &running[i];
            n == 1 + s.n_draft && s.n_computed >= s.n_prompt
        });
        // The constraints of sequences that get logits this step leave their sequences while
        // their masks are computed on a pool worker.
        let mut masking: Masking = Vec::new();
        for &(i, n) in plan {
            let s = &mut running[i];
            if s.n_computed + n == s.tokens.len()
                && s.wants_more()
                && s.constraint.as_ref().is_some_and(|c| c.is_active())
            {
                masking.extend(s.constraint.take().map(|c| (i, c)));
            }
        }
        let inputs: Vec<SeqInput> = plan
            .iter()
            .map(|&(i, n)| {
                let s = &running[i];
                let end = s.n_computed + n;
                SeqInput {
                    tokens: &s.tokens[s.n_computed..end],
                    start: s.n_computed,
                    blocks: &s.table.full,
                    window_blocks: s.table.window.as_deref(),
                    logits: if s.n_draft > 0 {
                        LogitsWanted::All
                    } else if end == s.tokens.len() {
                        LogitsWanted::Last
                    } else {
                        LogitsWanted::None
                    },
                }
            })
            .collect();
        let lora: Vec<&[LoraUse]> = plan.iter().map(|&(i, _)| running[i].lora.as_slice()).collect();
        let (logits, masking) = if masking.is_empty() {
            (engine.model().forward_adapted(pool, kv, &inputs, &lora, scratch), masking)
        } else {
            stats.masks += masking.len() as u64;
            // On a pool worker, not a thread of its own: a third thread would take a core from
            // a pool thread mid-job and every job would wait for it (see `Pool::beside`).
            let ((masking, micros), logits) = pool.beside(
                move || compute_masks(masking),
                || engine.model().forward_adapted(pool, kv, &inputs, &lora, scratch),
            );
            stats.mask_micros += micros;
            (logits, masking)
        };
        drop((inputs, lora));
        for (i, c) in masking {
            running[i].constraint = Some(c);
        }
        let logits = logits?;
        stats.steps += 1;
        stats.busy_slot_steps += plan.len() as u64;
        // A drafted sequence's cache holds its newest token for sure; the drafted tokens leave
        // its tokens until the draws say which of them stay.
        let mut drafts: Vec<Vec<u32>> = Vec::with_capacity(plan.len());
        for &(i, n) in plan {
            let s = &mut running[i];
            s.n_computed += n - s.n_draft;
            drafts.push(s.tokens.split_off(s.tokens.len() - s.n_draft));
            stats.tokens_computed += n as u64;
            blocks.advance(&mut s.table, &s.tokens, s.n_computed);
            s.note_prefilled();
        }

        // Every sequence that got logits draws its next token; the draws run on the pool.
        let mut draws = Vec::new();
        let mut length_done = Vec::new();
        let mut p = 0;
        for (i, s) in running.iter_mut().enumerate() {
            while p < plan.len() && plan[p].0 < i {
                p += 1;
            }
            let Some(row) = plan.get(p).filter(|e| e.0 == i).and_then(|_| logits.last(p)) else { continue };
            if s.wants_more() {
                let draft = std::mem::take(&mut drafts[p]);
                let rows = match draft.len() {
                    0 => vec![row],
                    k => (0..=k).filter_map(|j| logits.get(p, j)).collect(),
                };
                draws.push(Draw { seq: i, sequence: s, rows, draft, out: None });
            } else {
                length_done.push(i);
            }
        }
        pool.for_each_mut(&mut draws, &|tid, d| {
            // SAFETY: `tid` is this thread's own index in the running job.
            let w = unsafe { work.get(tid) };
            d.out = Some(d.sequence.verify(&d.rows, &d.draft, w));
        });
        let drawn: Vec<(usize, DrawResult)> =
            draws.into_iter().map(|d| (d.seq, d.out.expect("every draw ran"))).collect();
        // Only decoding steps teach the cost of a drafted token: prompt chunks cost less per
        // token (and the first ones include the cache's first touch).
        if decoding_only {
            cost.observe(plan.iter().map(|e| e.1).sum(), started.elapsed().as_secs_f64());
        }

        let tok = engine.tokenizer();
        let mut finished: Vec<(usize, After)> =
            length_done.into_iter().map(|i| (i, After::Finish(FinishReason::Length))).collect();
        for (i, out) in drawn {
            let after = match out {
                Ok(tokens) => push_verified(&mut running[i], tokens, tok, self.config.ctx_size, blocks, stats),
                Err(e) => After::Fail(e),
            };
            if after != After::Continue {
                finished.push((i, after));
            }
        }
        finished.sort_by_key(|&(i, _)| std::cmp::Reverse(i));
        for (i, after) in finished {
            let mut seq = self.running.remove(i);
            match after {
                After::Finish(reason) => self.finish(&mut seq, reason),
                After::Fail(e) => self.abort(seq, EngineError::Grammar(e)),
                After::Continue => unreachable!("only ended sequences are listed"),
            }
        }
        Ok(())
    }

    /// End a sequence: its blocks back to the pool, its completion to the caller (last, so
    /// that a caller who hears of it can submit again at once).
    fn finish(&mut self, seq: &mut Sequence, reason: FinishReason) {
        self.release_blocks(seq);
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        seq.finish(reason);
    }

    /// Release a sequence's blocks (and its draft model's).
    fn release_blocks(&mut self, seq: &mut Sequence) {
        self.blocks.release(&mut seq.table);
        if let Some(d) = self.drafter.as_mut() {
            d.release(seq);
        }
    }

    /// End a sequence with an error instead (its blocks back to the pool).
    fn abort(&mut self, mut seq: Sequence, error: EngineError) {
        self.release_blocks(&mut seq);
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        seq.fail(error);
    }

    fn fail_running(&mut self, e: &EngineError) {
        for seq in std::mem::take(&mut self.running) {
            self.abort(seq, EngineError::Internal(e.to_string()));
        }
    }

    fn shut_down(&mut self) {
        let all: Vec<Sequence> = self.running.drain(..).chain(self.waiting.drain(..)).collect();
        for seq in all {
            self.abort(seq, EngineError::ShutDown);
        }
    }
}

/// Take a sequence's drawn tokens: with a draft, the kept drafted tokens (now in the cache) and
/// the one drawn after them; learn from how the draft, or the lookup's guess, fared.
fn push_verified(
    s: &mut Sequence,
    tokens: Vec<(u32, Option<TokenLogprobs>)>,
    tok: &onebit_tokenizer::Tokenizer,
    ctx: usize,
    blocks: &mut KvBlocks,
    stats: &mut SchedulerStats,
) -> After {
    let k = std::mem::take(&mut s.n_draft);
    let kept = tokens.len() - 1;
    if k > 0 {
        (0..kept).for_each(|_| s.acceptance.observe(true));
        if kept < k {
            s.acceptance.observe(false);
        }
        s.drafted += k;
        s.accepted += kept;
        stats.drafted += k as u64;
        stats.accepted += kept as u64;
    } else if let (Some(guess), Some(&(id, _))) = (s.predicted.take(), tokens.first()) {
        s.acceptance.observe(guess == id);
    }
    for (j, (id, lp)) in tokens.into_iter().enumerate() {
        if j > 0 {
            // The previous token was a kept draft: its keys and values are in the cache.
            s.n_computed += 1;
        }
        let after = s.push_token(tok, id, lp, ctx);
        if after != After::Continue {
            return after;
        }
    }
    // The draft cache keeps what the target kept.
    s.draft_computed = s.draft_computed.min(s.n_computed);
    blocks.advance(&mut s.table, &s.tokens, s.n_computed);
    After::Continue
}

/// Compute the masks of `masking` (on a pool worker, beside the forward pass); returns the
/// constraints back and the time taken in microseconds.
fn compute_masks(mut masking: Masking) -> (Masking, u64) {
    let t = Instant::now();
    masking.iter_mut().for_each(|(_, c)| c.compute_mask());
    (masking, t.elapsed().as_micros() as u64)
}

impl Sequence {
    /// Draw a token from each row in turn (each seen by the sampler before the next), while the
    /// drawn token equals the draft's: the first that differs, or the one after the whole
    /// draft, is the last.
    fn verify(&mut self, rows: &[&[f32]], draft: &[u32], w: &mut DrawSpace) -> DrawResult {
        let mut out = Vec::with_capacity(rows.len());
        for (j, row) in rows.iter().enumerate() {
            let (id, lp) = self.draw(row, w)?;
            self.sampler_mut().accept(id);
            out.push((id, lp));
            if draft.get(j) != Some(&id) {
                break;
            }
        }
        Ok(out)
    }

    /// The next token from `logits` (only among those its grammar allows, if it has one), and
    /// its log-probabilities if the request asked: those of the masked distribution, so that
    /// a disallowed token never shows up among the likely ones.
    fn draw(&mut self, logits: &[f32], w: &mut DrawSpace) -> Result<(u32, Option<TokenLogprobs>), String> {
        let logits = match self.constraint.as_mut() {
            Some(c) if c.is_active() => match c.mask.take() {
                Some(Ok(mask)) => {
                    apply_mask(logits, &mask, &mut w.masked);
                    &w.masked[..]
                }
                Some(Err(e)) => return Err(e),
                None => return Err("internal error: no grammar mask was computed".into()),
            },
            _ => logits,
        };
        let n = self.logprobs;
        let id = self.sampler_mut().sample_with(logits, &mut w.candidates);
        let mut lp = n.map(|n| sampling::logprobs(logits, id, n));
        // Fewer tokens than asked for may be allowed: the rest are not candidates at all.
        if let Some(lp) = lp.as_mut() {
            lp.top.retain(|&(_, p)| p.is_finite());
        }
        Ok((id, lp))
    }
}
