//! The batched forward pass: any number of sequences, each at its own position, each adding any
//! number of tokens, in one pass over the weights.
//!
//! All tokens of the batch form one activation matrix, so every matrix product is a GEMM over
//! the whole batch (a decode step of many sequences, or a chunk of prefill, costs one read of
//! the weights). Attention is the only per-sequence step: each token attends over its own
//! sequence's cached positions up to its own, read through the sequence's block table.

use onebit_gguf::GgmlType;
use onebit_kernels::formats::dequantize;
use onebit_kernels::{ActFormat, Acts, Kernels, MatRef, PerThread, Pool};

use crate::attention::{Attention, AttnScratch};
use crate::config::Config;
use crate::error::ModelError;
use crate::kv_cache::{BLOCK_TOKENS, KvPool};
use crate::lora::{LoraBatch, Site, Target};
use crate::moe::MoeScratch;
use crate::rope::RopeAngles;
use crate::weights::{Ffn, Layer, Weight, Weights};

/// Which logits a sequence wants back from a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    None,
    /// After its last token (generation).
    Last,
    /// After every token (scoring, speculative verification).
    All,
}

/// One sequence's share of a batch: the tokens to add at positions `start ..`, and the block
/// table through which its positions live in the [`KvPool`].
///
/// The table must cover every position up to `start + tokens.len()`; the pass writes the new
/// tokens' keys and values into their blocks and reads positions `0 .. start` as they are. Two
/// sequences of one batch may share blocks only below their `start` (read-only prefixes).
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    pub tokens: &'a [u32],
    pub start: usize,
    pub blocks: &'a [u32],
    /// The table of the sliding-window layers in a split pool ([`KvPool::new_split`]); `None`:
    /// they use `blocks`. Its entries below [`crate::Config::window_reads_from`]`(start)` are
    /// never read and may be [`crate::NO_BLOCK`].
    pub window_blocks: Option<&'a [u32]>,
    pub logits: LogitsWanted,
}

/// The logits a pass produced, in batch order.
#[derive(Default)]
pub struct Logits {
    pub(crate) n_vocab: usize,
    pub(crate) data: Vec<f32>,
    /// (sequence index in the batch, token index within that sequence) of each row.
    pub(crate) rows: Vec<(usize, usize)>,
}

impl std::fmt::Debug for Logits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Logits({} rows of {})", self.rows.len(), self.n_vocab)
    }
}

impl Logits {
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// The logits after token `token` of sequence `seq`, if they were asked for.
    pub fn get(&self, seq: usize, token: usize) -> Option<&[f32]> {
        let i = self.rows.iter().position(|&r| r == (seq, token))?;
        Some(&self.data[i * self.n_vocab..(i + 1) * self.n_vocab])
    }

    /// The logits after the last token of sequence `seq`.
    pub fn last(&self, seq: usize) -> Option<&[f32]> {
        let i = self.rows.iter().rposition(|&(s, _)| s == seq)?;
        Some(&self.data[i * self.n_vocab..(i + 1) * self.n_vocab])
    }

    /// Every row of sequence `seq`, in token order.
    pub fn rows_of(&self, seq: usize) -> impl Iterator<Item = (usize, &[f32])> {
        self.rows
            .iter()
            .enumerate()
            .filter(move |(_, r)| r.0 == seq)
            .map(move |(i, r)| (r.1, &self.data[i * self.n_vocab..(i + 1) * self.n_vocab]))
    }
}

/// Buffers reused from pass to pass (sized for the largest batch seen), and the logits of the
/// last pass.
pub struct Scratch {
    logits: Logits,
    x: Vec<f32>,
    pub(crate) xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    rope: Vec<RopeAngles>,
    /// The angles of sliding-window layers, where they have a RoPE of their own.
    rope_swa: Vec<RopeAngles>,
    /// One row, for norms taken in place.
    row: Vec<f32>,
    pub(crate) acts: Acts,
    pub(crate) mlp: MlpBufs,
    /// The mixture-of-experts MLP's buffers (MoE models only).
    pub(crate) moe: MoeScratch,
    attn_scratch: PerThread<AttnScratch>,
    /// Per batch token: (sequence, position).
    where_: Vec<(usize, usize)>,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::new()
    }
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            logits: Logits::default(),
            x: Vec::new(),
            xn: Vec::new(),
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            attn: Vec::new(),
            rope: Vec::new(),
            rope_swa: Vec::new(),
            row: Vec::new(),
            acts: Acts::new(),
            mlp: MlpBufs::default(),
            moe: MoeScratch::default(),
            attn_scratch: PerThread::new(1, AttnScratch::default),
            where_: Vec::new(),
        }
    }

    pub(crate) fn logits(&self) -> &Logits {
        &self.logits
    }

    pub(crate) fn logits_mut(&mut self) -> &mut Logits {
        &mut self.logits
    }

    fn size_for(&mut self, c: &Config, n: usize, threads: usize) {
        if self.attn_scratch.n_threads() < threads {
            self.attn_scratch = PerThread::new(threads, AttnScratch::default);
        }
        let fit = |v: &mut Vec<f32>, len: usize| v.resize(len, 0.0);
        fit(&mut self.x, n * c.hidden);
        fit(&mut self.xn, n * c.hidden);
        fit(&mut self.q, n * c.q_dim());
        fit(&mut self.k, n * c.kv_dim());
        fit(&mut self.v, n * c.v_dim());
        // Attention writes over the queries when heads of q and v are equally wide.
        fit(&mut self.attn, if c.head_dim == c.value_dim { 0 } else { n * c.n_heads * c.value_dim });
        fit(&mut self.row, c.hidden);
        while self.rope.len() < n {
            self.rope.push(RopeAngles::new(&c.rope));
        }
        if let Some(s) = &c.sliding {
            while self.rope_swa.len() < n {
                self.rope_swa.push(RopeAngles::new(&s.rope));
            }
        }
    }
}

/// The gated MLP's own buffers.
#[derive(Default)]
pub(crate) struct MlpBufs {
    /// The down projection's activations, made by the gated product.
    acts: Acts,
    /// The gated product and its parts, only for models whose gate and up projections take
    /// different activation formats, or with LoRA updates.
    pub(crate) gate: Vec<f32>,
    pub(crate) up: Vec<f32>,
}

/// What the forward pass reads: the model's pieces, borrowed.
pub(crate) struct Net<'a> {
    pub config: &'a Config,
    pub weights: &'a Weights,
    pub kernels: Kernels,
    pub pool: &'a Pool,
    /// The batch's rows grouped by their LoRA adapters (empty without any).
    pub lora: &'a LoraBatch<'a>,
}

/// One token's share of [`Net::prepare_qkv`].
struct TokenQkv<'a> {
    q: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a mut [f32],
    rope: &'a RopeAngles,
    block: usize,
    slot: usize,
}

/// Per sequence of a batch: its block table, and that of its sliding-window layers.
struct Tables<'a> {
    full: Vec<&'a [u32]>,
    window: Vec<&'a [u32]>,
}

impl<'a> Tables<'a> {
    /// The tables layer `l` reads and writes through.
    fn of(&self, config: &Config, l: usize) -> &[&'a [u32]] {
        if config.window(l).is_some() { &self.window } else { &self.full }
    }
}

/// The blocks a forward pass is made of, each run by one device over the whole batch; the
/// recipe that strings them together ([`run_blocks`]) is the same for every device (the CPU's
/// [`Net`], the GPU's `cuda::CudaNet`).
pub(crate) trait Blocks {
    /// Each token's row of the embedding table into the residual stream.
    fn embed(&mut self) -> Result<(), ModelError>;
    /// Norm, q/k/v, biases, q/k norms and RoPE, the cache write, attention, the output
    /// projection, added to the residual stream.
    fn attention(&mut self, layer: usize) -> Result<(), ModelError>;
    /// Norm, gate and up, the gated activation (SwiGLU, GEGLU), down (of each expert the
    /// router picks, for a mixture of experts), the post-norm where there is one, added to the
    /// residual stream.
    fn mlp(&mut self, layer: usize) -> Result<(), ModelError>;
    /// Final norm and output projection of the rows that want logits.
    fn logits(&mut self) -> Result<(), ModelError>;
}

/// The forward pass: embed; per layer attention, then MLP; logits.
pub(crate) fn run_blocks(blocks: &mut impl Blocks, n_layers: usize) -> Result<(), ModelError> {
    blocks.embed()?;
    for layer in 0..n_layers {
        blocks.attention(layer)?;
        blocks.mlp(layer)?;
    }
    blocks.logits()
}

/// One pass of [`Net`] over a batch, as [`Blocks`].
struct CpuStep<'a, 'b> {
    net: &'a Net<'a>,
    kv: &'a mut KvPool,
    batch: &'a [SeqInput<'b>],
    tables: Tables<'a>,
    sc: &'a mut Scratch,
    n: usize,
}

impl Blocks for CpuStep<'_, '_> {
    fn embed(&mut self) -> Result<(), ModelError> {
        self.net.embed(self.batch, &mut self.sc.x)
    }

    fn attention(&mut self, layer: usize) -> Result<(), ModelError> {
        let w = &self.net.weights.layers[layer];
        self.net.attention_block(layer, w, self.kv, &self.tables, self.sc, self.n)
    }

    fn mlp(&mut self, layer: usize) -> Result<(), ModelError> {
        self.net.mlp_block(layer, &self.net.weights.layers[layer], self.sc, self.n)
    }

    fn logits(&mut self) -> Result<(), ModelError> {
        self.net.logits(self.batch, self.sc, self.n)
    }
}

impl Net<'_> {
    pub fn forward<'s>(
        &self,
        kv: &mut KvPool,
        batch: &[SeqInput],
        sc: &'s mut Scratch,
    ) -> Result<&'s Logits, ModelError> {
        let c = self.config;
        let n = check_batch(c, kv, batch)?;
        sc.size_for(c, n, self.pool.n_threads());
        sc.where_.clear();
        for (s, item) in batch.iter().enumerate() {
            sc.where_.extend((0..item.tokens.len()).map(|i| (s, item.start + i)));
        }
        let freqs = self.weights.rope_freqs.as_deref();
        for (t, &(_, pos)) in sc.where_.iter().enumerate() {
            sc.rope[t].set(&c.rope, freqs, pos);
            if let Some(s) = &c.sliding {
                sc.rope_swa[t].set(&s.rope, freqs, pos);
            }
        }
        let tables = Tables {
            full: batch.iter().map(|item| item.blocks).collect(),
            window: batch.iter().map(|item| item.window_blocks.unwrap_or(item.blocks)).collect(),
        };
        let mut step = CpuStep { net: self, kv, batch, tables, sc: &mut *sc, n };
        run_blocks(&mut step, self.weights.layers.len())?;
        Ok(&sc.logits)
    }

    /// Look up each token's row of the embedding table, dequantizing just that row.
    fn embed(&self, batch: &[SeqInput], x: &mut [f32]) -> Result<(), ModelError> {
        let (h, e) = (self.config.hidden, &self.weights.embedding);
        let tokens = batch.iter().flat_map(|item| item.tokens.iter());
        for (row, &id) in x.chunks_exact_mut(h).zip(tokens) {
            dequantize(e.ty, e.row(id as usize), row)?;
            if let Some(scale) = self.config.embed_scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(())
    }

    /// RMS-norm every row of `rows` in place with `w`, if there is one (`tmp`: one row).
    fn post_norm(&self, w: Option<&Vec<f32>>, rows: &mut [f32], tmp: &mut [f32]) {
        let Some(w) = w else { return };
        for row in rows.chunks_exact_mut(self.config.hidden) {
            self.kernels.rms_norm(row, w, self.config.rms_eps, tmp);
            row.copy_from_slice(tmp);
        }
    }

    fn attention_block(
        &self,
        l: usize,
        layer: &Layer,
        kv: &mut KvPool,
        tables: &Tables,
        sc: &mut Scratch,
        n: usize,
    ) -> Result<(), ModelError> {
        let c = self.config;
        let k = self.kernels;
        for (x, xn) in sc.x.chunks_exact(c.hidden).zip(sc.xn.chunks_exact_mut(c.hidden)).take(n) {
            k.rms_norm(x, &layer.attn_norm, c.rms_eps, xn);
        }
        let (q, kk, v) = (&mut sc.q[..n * c.q_dim()], &mut sc.k[..n * c.kv_dim()], &mut sc.v[..n * c.v_dim()]);
        self.project(
            &sc.xn[..n * c.hidden],
            c.hidden,
            &[&self.mat(&layer.wq), &self.mat(&layer.wk), &self.mat(&layer.wv)],
            &mut [q, kk, v],
            &mut sc.acts,
        )?;
        let xn = &sc.xn[..n * c.hidden];
        self.lora_add(Site::Layer(l, Target::Q), xn, &mut sc.q[..n * c.q_dim()]);
        self.lora_add(Site::Layer(l, Target::K), xn, &mut sc.k[..n * c.kv_dim()]);
        self.lora_add(Site::Layer(l, Target::V), xn, &mut sc.v[..n * c.v_dim()]);
        self.prepare_qkv(l, layer, kv, tables, sc, n);
        self.attend(l, kv, tables, sc, n);
        let attn_dim = c.n_heads * c.value_dim;
        let out = &mut sc.xn[..n * c.hidden];
        let attn = if sc.attn.is_empty() { &sc.q[..n * attn_dim] } else { &sc.attn[..n * attn_dim] };
        self.project(attn, attn_dim, &[&self.mat(&layer.wo)], &mut [&mut *out], &mut sc.acts)?;
        self.lora_add(Site::Layer(l, Target::O), attn, out);
        self.post_norm(layer.attn_post_norm.as_ref(), &mut sc.xn[..n * c.hidden], &mut sc.row);
        add_into(&mut sc.x[..n * c.hidden], &sc.xn[..n * c.hidden]);
        Ok(())
    }

    /// Biases, per-head q/k norms and RoPE for every token of the batch, and its key and value
    /// into its sequence's block: one token per thread at a time.
    fn prepare_qkv(&self, l: usize, layer: &Layer, kv: &mut KvPool, tables: &Tables, sc: &mut Scratch, n: usize) {
        let c = self.config;
        let writer = kv.writer(l);
        let tables = tables.of(c, l);
        let (rope, angles) = if c.window(l).is_some() { (c.layer_rope(l), &sc.rope_swa) } else { (&c.rope, &sc.rope) };
        let mut tokens: Vec<TokenQkv> = sc.q[..n * c.q_dim()]
            .chunks_exact_mut(c.q_dim())
            .zip(sc.k.chunks_exact_mut(c.kv_dim()))
            .zip(sc.v.chunks_exact_mut(c.v_dim()))
            .zip(angles)
            .zip(&sc.where_[..n])
            .map(|((((q, k), v), rope), &(s, pos))| TokenQkv {
                q,
                k,
                v,
                rope,
                block: tables[s][pos / BLOCK_TOKENS] as usize,
                slot: pos % BLOCK_TOKENS,
            })
            .collect();
        let prepare = |_: usize, t: &mut TokenQkv| {
            for (x, b) in [(&mut *t.q, &layer.bq), (&mut *t.k, &layer.bk), (&mut *t.v, &layer.bv)] {
                if let Some(b) = b {
                    add_into(x, b);
                }
            }
            let mut tmp = [0f32; 1024];
            for (x, norm) in [(&mut *t.q, &layer.q_norm), (&mut *t.k, &layer.k_norm)] {
                for head in x.chunks_exact_mut(c.head_dim) {
                    if let Some(w) = norm {
                        let tmp = &mut tmp[..c.head_dim];
                        self.kernels.rms_norm(head, w, c.rms_eps, tmp);
                        head.copy_from_slice(tmp);
                    }
                    t.rope.apply(rope, head);
                }
            }
            // SAFETY: every token of a batch has its own position, so its own (block, slot).
            unsafe { writer.write(self.kernels, t.block, t.slot, t.k, t.v) };
        };
        // A decode step's few tokens take less than handing them to the pool would.
        if n < 16 {
            tokens.iter_mut().for_each(|t| prepare(0, t));
        } else {
            self.pool.for_each_mut(&mut tokens, &prepare);
        }
    }

    /// Causal attention of every (token, head) over its sequence's cache.
    fn attend(&self, l: usize, kv: &KvPool, tables: &Tables, sc: &mut Scratch, n: usize) {
        let attention = Attention {
            config: self.config,
            kernels: self.kernels,
            layer: l,
            window: self.config.window(l),
            kv,
            tables: tables.of(self.config, l),
            where_: &sc.where_[..n],
        };
        let q = &mut sc.q[..n * self.config.q_dim()];
        let out = (!sc.attn.is_empty()).then(|| &mut sc.attn[..n * self.config.n_heads * self.config.value_dim]);
        attention.run(self.pool, &sc.attn_scratch, q, out);
    }

    fn mlp_block(&self, l: usize, layer: &Layer, sc: &mut Scratch, n: usize) -> Result<(), ModelError> {
        let c = self.config;
        for (x, xn) in sc.x.chunks_exact(c.hidden).zip(sc.xn.chunks_exact_mut(c.hidden)).take(n) {
            self.kernels.rms_norm(x, &layer.ffn_norm, c.rms_eps, xn);
        }
        match &layer.ffn {
            Ffn::Dense { gate, up, down } => {
                let mats = [&self.mat(gate), &self.mat(up), &self.mat(down)];
                if self.lora.touches(l, &[Target::Gate, Target::Up, Target::Down]) {
                    self.lora_mlp(l, mats, sc, n)?;
                } else {
                    self.gated_mlp(mats, &mut sc.xn[..n * c.hidden], &mut sc.acts, &mut sc.mlp)?;
                }
            }
            Ffn::Moe(experts) => self.moe_mlp(experts, sc, n)?,
        }
        self.post_norm(layer.ffn_post_norm.as_ref(), &mut sc.xn[..n * c.hidden], &mut sc.row);
        add_into(&mut sc.x[..n * c.hidden], &sc.xn[..n * c.hidden]);
        Ok(())
    }

    /// `down · (act(gate · x) ⊙ (up · x))` for every row of `x`, written over it (`act`: the
    /// model's activation, SiLU or GELU).
    pub(crate) fn gated_mlp(
        &self,
        [gate, up, down]: [&MatRef; 3],
        x: &mut [f32],
        acts: &mut Acts,
        bufs: &mut MlpBufs,
    ) -> Result<(), ModelError> {
        let (cols, width) = (gate.cols, gate.rows);
        let n = x.len() / cols;
        if ActFormat::for_weights(gate.ty)? == ActFormat::for_weights(up.ty)? {
            // act(gate) · up straight into the down projection's activations: neither
            // product is ever held whole.
            let types = [gate.ty, up.ty];
            self.kernels.quantize_acts_for(self.pool, &types, x, cols, acts)?;
            let glu = self.config.activation;
            self.kernels.matmul_gated_acts(self.pool, glu, gate, up, acts, &[down.ty], &mut bufs.acts)?;
            self.kernels.matmul(self.pool, down, &bufs.acts, x)?;
        } else {
            bufs.gate.resize(n * width, 0.0);
            bufs.up.resize(n * width, 0.0);
            let (g, u) = (&mut bufs.gate[..n * width], &mut bufs.up[..n * width]);
            self.project(x, cols, &[gate, up], &mut [g, u], acts)?;
            self.kernels.glu(self.config.activation, &mut bufs.gate[..n * width], &bufs.up[..n * width]);
            self.project(&bufs.gate[..n * width], width, &[down], &mut [x], acts)?;
        }
        Ok(())
    }

    /// A weight for a product (packed where the tier can).
    pub(crate) fn mat<'w>(&self, w: &'w Weight) -> MatRef<'w> {
        w.get()
    }

    /// `outs[i] = input · mats[i]ᵀ`, quantizing the input once per activation format and
    /// running the products that share a format in one parallel region.
    pub(crate) fn project(
        &self,
        input: &[f32],
        cols: usize,
        mats: &[&MatRef],
        outs: &mut [&mut [f32]],
        acts: &mut Acts,
    ) -> Result<(), ModelError> {
        let mut done = vec![false; mats.len()];
        for i in 0..mats.len() {
            if done[i] {
                continue;
            }
            let format = ActFormat::for_weights(mats[i].ty)?;
            let group: Vec<usize> = (i..mats.len())
                .filter(|&j| !done[j] && ActFormat::for_weights(mats[j].ty).ok() == Some(format))
                .collect();
            let types: Vec<GgmlType> = group.iter().map(|&j| mats[j].ty).collect();
            self.kernels.quantize_acts_for(self.pool, &types, input, cols, acts)?;
            let ws: Vec<&MatRef> = group.iter().map(|&j| mats[j]).collect();
            let mut os: Vec<&mut [f32]> = Vec::with_capacity(group.len());
            for (j, out) in outs.iter_mut().enumerate() {
                if group.contains(&j) {
                    os.push(out);
                }
            }
            self.kernels.matmul_many(self.pool, &ws, acts, &mut os)?;
            group.iter().for_each(|&j| done[j] = true);
        }
        Ok(())
    }

    /// Fill `sc.logits` with the rows the batch asks for.
    fn logits(&self, batch: &[SeqInput], sc: &mut Scratch, n: usize) -> Result<(), ModelError> {
        let c = self.config;
        let mut rows = std::mem::take(&mut sc.logits.rows);
        rows.clear();
        let wanted = wanted_rows(batch);
        debug_assert!(wanted.iter().all(|w| w.2 < n));
        let out_w = self.mat(self.weights.output());
        let m = wanted.len();
        rows.extend(wanted.iter().map(|&(s, i, _)| (s, i)));
        sc.logits.rows = rows;
        sc.logits.n_vocab = out_w.rows;
        // Sized, not cleared: every row is overwritten by the product.
        sc.logits.data.resize(m * out_w.rows, 0.0);
        if m == 0 {
            return Ok(());
        }
        // Final norm of just the rows that need logits, packed together.
        for (i, &(_, _, t)) in wanted.iter().enumerate() {
            let (x, xn) = (&sc.x[t * c.hidden..(t + 1) * c.hidden], &mut sc.xn[i * c.hidden..(i + 1) * c.hidden]);
            self.kernels.rms_norm(x, &self.weights.output_norm, c.rms_eps, xn);
        }
        let out = &mut sc.logits.data[..m * out_w.rows];
        self.project(&sc.xn[..m * c.hidden], c.hidden, &[&out_w], &mut [&mut *out], &mut sc.acts)?;
        if !self.lora.is_empty() {
            let mut row_of = vec![None; n];
            wanted.iter().enumerate().for_each(|(i, &(_, _, t))| row_of[t] = Some(i));
            let input = &sc.xn[..m * c.hidden];
            self.lora.add(self.kernels, self.pool, Site::Output, input, out, &|t| row_of[t]);
        }
        if let Some(cap) = c.logit_softcap {
            // As ggml: scaled by 1/cap, tanh, scaled by cap.
            let inv = 1.0 / cap;
            out.iter_mut().for_each(|v| *v = (*v * inv).tanh() * cap);
        }
        Ok(())
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// Check a batch against the model and the pool; returns its number of tokens.
pub(crate) fn check_batch(config: &Config, kv: &KvPool, batch: &[SeqInput]) -> Result<usize, ModelError> {
    let vocab = config.vocab_size;
    let mut n = 0;
    for item in batch {
        if item.tokens.is_empty() {
            return Err(ModelError::BadBatch("a sequence in the batch has no tokens".into()));
        }
        if let Some(&id) = item.tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(ModelError::TokenOutOfRange { id, vocab });
        }
        let end = item.start + item.tokens.len();
        check_table(item.blocks, 0..end, kv.n_blocks())?;
        if config.sliding_window().is_some() {
            let table = item.window_blocks.unwrap_or(item.blocks);
            check_table(table, config.window_reads_from(item.start)..end, kv.n_window_blocks())?;
        }
        n += item.tokens.len();
    }
    if n == 0 {
        return Err(ModelError::BadBatch("the batch is empty".into()));
    }
    Ok(n)
}

/// Check that a block table holds blocks of a pool of `n_blocks` for positions `needed`
/// (those it reads or writes; entries below may be [`crate::NO_BLOCK`]).
fn check_table(table: &[u32], needed: std::ops::Range<usize>, n_blocks: usize) -> Result<(), ModelError> {
    let (first, end) = (needed.start / BLOCK_TOKENS, needed.end.div_ceil(BLOCK_TOKENS));
    if table.len() < end {
        return Err(ModelError::BadBatch(format!(
            "a block table of {} blocks does not reach position {}",
            table.len(),
            needed.end - 1
        )));
    }
    if let Some(&b) = table[first..].iter().find(|&&b| b as usize >= n_blocks) {
        return Err(ModelError::BadBatch(format!("block {b} is outside the pool of {n_blocks}")));
    }
    Ok(())
}

/// The rows a batch wants logits for: (sequence, token within it, token within the batch).
pub(crate) fn wanted_rows(batch: &[SeqInput]) -> Vec<(usize, usize, usize)> {
    let mut wanted = Vec::new();
    let mut t = 0;
    for (s, item) in batch.iter().enumerate() {
        let len = item.tokens.len();
        match item.logits {
            LogitsWanted::None => {}
            LogitsWanted::Last => wanted.push((s, len - 1, t + len - 1)),
            LogitsWanted::All => wanted.extend((0..len).map(|i| (s, i, t + i))),
        }
        t += len;
    }
    wanted
}
