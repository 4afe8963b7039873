//! The forward pass on an NVIDIA GPU: the blocks of [`crate::forward`]'s recipe
//! ([`run_blocks`]: embed; per layer norm, q/k/v, RoPE, attention over the paged cache, output
//! projection, norm, SwiGLU MLP; final norm and logits), each a few kernel launches over the
//! whole batch.
//!
//! Weights are uploaded once, in their GGUF bytes; activations stay f32 on the device. The
//! host only builds the step's small tables (token ids, cache slots, block tables, RoPE
//! angles), sends them in one copy each, and reads back the logits the batch asked for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use onebit_cuda::{Acts, AttnSplit, Buf, DevPtr, Gpu, Graph, KvElem};
use onebit_gguf::GgmlType;

use crate::config::{Config, RopeStyle};
use crate::error::ModelError;
use crate::forward::{Blocks, Logits, SeqInput, check_batch, run_blocks, wanted_rows};
use crate::kv_cache::{BLOCK_TOKENS, KvPool, KvType};
use crate::rope::RopeAngles;
use crate::weights::{Ffn, Layer, Weight, Weights};

impl From<onebit_cuda::CudaError> for ModelError {
    fn from(e: onebit_cuda::CudaError) -> ModelError {
        ModelError::Device(e.to_string())
    }
}

/// A matrix in device memory: in its file format, except Q1_0 in the split layout of
/// `onebit_cuda::q1_split`.
struct Mat {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    buf: Buf<u8>,
}

/// The q, k and v projections: one matrix of all their rows when they share a type (one
/// launch), else three.
enum Qkv {
    Fused(Mat),
    Split([Mat; 3]),
}

impl Qkv {
    fn mats(&self) -> Vec<&Mat> {
        match self {
            Qkv::Fused(m) => vec![m],
            Qkv::Split(ms) => ms.iter().collect(),
        }
    }
}

struct GpuLayer {
    attn_norm: Buf<f32>,
    qkv: Qkv,
    wo: Mat,
    bq: Option<Buf<f32>>,
    bk: Option<Buf<f32>>,
    bv: Option<Buf<f32>>,
    q_norm: Option<Buf<f32>>,
    k_norm: Option<Buf<f32>>,
    ffn_norm: Buf<f32>,
    w_gate: Mat,
    w_up: Mat,
    w_down: Mat,
}

/// Per-step device buffers, grown to the largest batch seen.
#[derive(Default)]
struct Scratch {
    tokens: usize,
    logit_rows: usize,
    bufs: Option<Bufs>,
    /// Recorded decode steps, by (tokens, logit rows, KV pool, cache type); only valid for
    /// the buffers they were recorded with, so dropped whenever those are replaced.
    graphs: HashMap<GraphKey, Graph>,
}

/// Positions one attention block takes when a step's few tokens have long sequences.
const ATTN_CHUNK: usize = 256;
/// Chunks at most per (token, head).
const MAX_SPLITS: usize = 128;

/// What a recorded step depends on: tokens, logit rows, the KV pool (address, blocks, f16),
/// attention chunks and their length.
type GraphKey = (usize, usize, (u64, usize, bool), usize, usize);

/// Steps of up to this many tokens are recorded as graphs and replayed.
const GRAPH_TOKENS: usize = 16;
/// Recorded steps kept at most (a cache of the shapes seen, not a leak).
const MAX_GRAPHS: usize = 64;

struct Bufs {
    x: Buf<f32>,
    xn: Buf<f32>,
    /// Per token: its queries, keys and values, one row.
    qkv: Buf<f32>,
    attn: Buf<f32>,
    /// Rounded activations for the Q1_0 products.
    acts: Buf<u8>,
    /// Rounded f32 activations for the other formats' products, and their per-32 sums.
    xr: Buf<f32>,
    xs: Buf<f32>,
    /// Partial attention results of split steps (up to GRAPH_TOKENS tokens).
    part: Buf<f32>,
    gate: Buf<f32>,
    up: Buf<f32>,
    logits: Buf<f32>,
    /// Per token: cosines and sines of its RoPE angles.
    rope: Buf<f32>,
    /// The step's int tables (see [`Tables`]).
    ints: Buf<i32>,
}

/// The step's int tables, laid out one after another in one upload.
struct Tables {
    ints: Vec<i32>,
    slots: usize,
    table_at: usize,
    n_keys: usize,
    logit_rows: usize,
    tables: usize,
}

/// The input of a product (see [`CudaNet::input`]).
struct Input {
    f32_rows: DevPtr,
    acts: Acts,
}

/// A model's weights on a GPU, and the buffers its passes use.
pub(crate) struct CudaNet {
    gpu: Arc<Gpu>,
    embedding: Mat,
    /// `None` when the output projection is the embedding.
    output: Option<Mat>,
    output_norm: Buf<f32>,
    rope_freqs: Option<Vec<f32>>,
    eps: f32,
    layers: Vec<GpuLayer>,
    scratch: Mutex<Scratch>,
}

fn upload_mat(gpu: &Gpu, w: &Weight, name: &str) -> Result<Mat, ModelError> {
    let raw = w.get();
    if !onebit_cuda::supports(raw.ty) {
        return Err(ModelError::TensorType { name: name.into(), ty: raw.ty, what: "multiply on the GPU" });
    }
    product_mat(gpu, raw.ty, raw.rows, raw.cols, raw.data)
}

/// A matrix for products: Q1_0 in the split layout its kernels read, the rest as in the file.
fn product_mat(gpu: &Gpu, ty: GgmlType, rows: usize, cols: usize, data: &[u8]) -> Result<Mat, ModelError> {
    let buf =
        if ty == GgmlType::Q1_0 { gpu.upload(&onebit_cuda::q1_split(data, rows, cols)?)? } else { gpu.upload(data)? };
    Ok(Mat { ty, rows, cols, buf })
}

fn upload_opt(gpu: &Gpu, v: &Option<Vec<f32>>) -> Result<Option<Buf<f32>>, ModelError> {
    v.as_ref().map(|v| gpu.upload(v)).transpose().map_err(ModelError::from)
}

fn opt_ptr(b: &Option<Buf<f32>>) -> DevPtr {
    b.as_ref().map_or(DevPtr::NULL, Buf::ptr)
}

impl CudaNet {
    /// Whether a model of `config` can run on the GPU (checked before a GPU is opened).
    pub fn check(config: &Config) -> Result<(), ModelError> {
        if config.head_dim > onebit_cuda::MAX_HEAD || config.value_dim > onebit_cuda::MAX_HEAD {
            return Err(ModelError::Unsupported(format!("heads of {} on the GPU", config.head_dim)));
        }
        if config.moe.is_some() {
            return Err(ModelError::Unsupported(format!(
                "mixture-of-experts models ({}) on the GPU; run them on the CPU",
                config.arch.name()
            )));
        }
        // The GPU's recipe is Llama's: none of Gemma's differences, nor a sliding window.
        let gemma_like = config.embed_scale.is_some()
            || config.activation != onebit_kernels::Glu::Silu
            || config.arch.post_norms() != crate::config::Need::Absent
            || config.logit_softcap.is_some()
            || config.attn_scale != 1.0 / (config.head_dim as f32).sqrt();
        if gemma_like || config.sliding.is_some() {
            return Err(ModelError::Unsupported(format!(
                "{} models on the GPU (sliding-window attention, GELU gates and Gemma's extra norms run on the CPU only); \
                 run them on the CPU",
                config.arch.name()
            )));
        }
        Ok(())
    }

    /// Upload the weights (as mapped from the file, before any CPU repacking).
    pub fn upload(gpu: Arc<Gpu>, config: &Config, w: &Weights) -> Result<CudaNet, ModelError> {
        Self::check(config)?;
        let g = &*gpu;
        let e = &w.embedding;
        if !onebit_cuda::supports(e.ty) {
            return Err(ModelError::TensorType { name: "token_embd.weight".into(), ty: e.ty, what: "read on the GPU" });
        }
        let embedding = Mat { ty: e.ty, rows: e.rows, cols: e.cols, buf: g.upload(e.data)? };
        let output = match &w.output {
            Some(o) => Some(upload_mat(g, o, "output.weight")?),
            // A tied Q1_0 table is kept twice: as in the file for looking rows up, and split
            // for the output product.
            None if e.ty == GgmlType::Q1_0 => Some(product_mat(g, e.ty, e.rows, e.cols, e.data)?),
            None => None,
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, l) in w.layers.iter().enumerate() {
            layers.push(upload_layer(g, l, i)?);
        }
        Ok(CudaNet {
            output_norm: g.upload(&w.output_norm)?,
            rope_freqs: w.rope_freqs.clone(),
            eps: config.rms_eps,
            embedding,
            output,
            layers,
            scratch: Mutex::new(Scratch::default()),
            gpu,
        })
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Run a batch: the same contract as [`crate::Model::forward`].
    pub fn forward(
        &self,
        c: &Config,
        kv: &mut KvPool,
        batch: &[SeqInput],
        logits: &mut Logits,
    ) -> Result<(), ModelError> {
        let n = check_batch(c, kv, batch)?;
        let elem = match kv.kv_type() {
            KvType::F16 => KvElem::F16,
            KvType::F32 => KvElem::F32,
            KvType::Q8_0 => return Err(ModelError::Unsupported("a q8_0 KV cache on the GPU".into())),
        };
        let Some(pool_at) = kv.device_layer(0) else {
            return Err(ModelError::BadBatch("a KV pool in host memory for a model on the GPU".into()));
        };
        let wanted = wanted_rows(batch);
        let m = wanted.len();
        let tables = step_tables(batch, &wanted);
        let rope = self.rope_angles(c, batch);
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let sc = &mut *guard;
        self.size_for(sc, c, n, m.max(1), tables.ints.len(), rope.len())?;
        let b = sc.bufs.as_mut().expect("sized");
        self.gpu.write(&mut b.ints, &tables.ints)?;
        self.gpu.write(&mut b.rope, &rope)?;
        let b = &*b;
        let layers: Vec<(DevPtr, DevPtr)> =
            (0..self.layers.len()).map(|l| kv.device_layer(l).expect("a device pool")).collect();
        // SAFETY: the buffers were sized above for `n` tokens and `m` logit rows of this
        // model's shapes; the int tables were checked by `check_batch` (ids in the vocabulary,
        // blocks inside the pool, tables long enough) and the pool's layers are `kv`'s; the
        // weights and the pool outlive the stream's work, which is waited for (reading the
        // logits back, or synchronizing) before returning.
        let split = attention_split(c, batch, n, b.part.ptr());
        let run = || {
            // SAFETY: see above.
            let mut step = unsafe { GpuStep::new(self, c, b, &tables, &layers, (elem, split), (n, m)) };
            run_blocks(&mut step, self.layers.len())
        };
        if n <= GRAPH_TOKENS {
            let (splits, chunk) = split.map_or((1, 0), |s| (s.splits, s.chunk));
            // The pool's address and size fix every layer's cache address the graph records
            // (a new pool of another size may be given the address of a dropped one).
            let pool = (pool_at.0.0, kv.n_blocks(), elem == KvElem::F16);
            let key = (n, m, pool, splits, chunk);
            if !sc.graphs.contains_key(&key) {
                if sc.graphs.len() >= MAX_GRAPHS {
                    sc.graphs.clear();
                }
                sc.graphs
                    .insert(key, self.gpu.capture(|| run().map_err(|e| onebit_cuda::CudaError::Shape(e.to_string())))?);
            }
            sc.graphs[&key].launch()?;
        } else {
            run()?;
        }
        logits.n_vocab = c.vocab_size;
        logits.rows.clear();
        logits.rows.extend(wanted.iter().map(|&(s, i, _)| (s, i)));
        logits.data.resize(m * c.vocab_size, 0.0);
        if m == 0 {
            self.gpu.synchronize()?;
        } else {
            self.gpu.read(&b.logits, &mut logits.data)?;
        }
        Ok(())
    }

    /// The input of products by `mats`: `n` rows of `x` (picked by `rows` unless NULL, and
    /// RMS-normed unless `norm` is None) as f32 rows and, when a matrix is Q1_0, rounded.
    ///
    /// # Safety
    /// `x` holds every row read; `b` is sized for `n` rows of `cols`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn input(
        &self,
        b: &Bufs,
        x: DevPtr,
        norm: Option<&Buf<f32>>,
        rows: DevPtr,
        n: usize,
        cols: usize,
        mats: &[&Mat],
    ) -> Result<Input, ModelError> {
        let g = &self.gpu;
        let (eps, w) = (self.eps, norm.map_or(DevPtr::NULL, Buf::ptr));
        let mut f32_rows = x;
        let acts = Acts::at(b.acts.ptr(), n, cols);
        // SAFETY: the caller's guarantees cover `x`, and `b` holds `n` rows of `cols`.
        unsafe {
            if mats.iter().any(|m| m.ty != GgmlType::Q1_0) && (norm.is_some() || rows != DevPtr::NULL) {
                g.rms_norm(x, w, eps, rows, n, b.xn.ptr(), cols)?;
                f32_rows = b.xn.ptr();
            }
            if mats.iter().any(|m| m.ty == GgmlType::Q1_0) {
                g.quantize_acts(x, w, eps, rows, n, cols, acts)?;
            }
        }
        Ok(Input { f32_rows, acts })
    }

    /// `y (+)= input · wᵀ`, token rows of `y` `ldy` apart. Other formats than Q1_0 take the
    /// input rounded as the reference rounds it for their type (into `b.xr`), then f32 products.
    ///
    /// # Safety
    /// `input` was made by [`CudaNet::input`] for `w`; `y` holds `n` rows `ldy` apart.
    #[allow(clippy::too_many_arguments)]
    unsafe fn product(
        &self,
        b: &Bufs,
        w: &Mat,
        input: &Input,
        n: usize,
        y: DevPtr,
        ldy: usize,
        add: bool,
    ) -> Result<(), ModelError> {
        let (g, p) = (&self.gpu, w.buf.ptr());
        // SAFETY: the caller's guarantees; `b.xr` holds `n` rows of the widest input.
        unsafe {
            if w.ty == GgmlType::Q1_0 {
                g.q1_matvec(p, w.rows, w.cols, input.acts, n, y, ldy, add)?;
            } else {
                let rounded = g.round_acts(w.ty, input.f32_rows, b.xr.ptr(), b.xs.ptr(), n * w.cols)?;
                let x = if rounded { b.xr.ptr() } else { input.f32_rows };
                let sums = if matches!(w.ty, GgmlType::Q4_1 | GgmlType::Q5_1) { b.xs.ptr() } else { DevPtr::NULL };
                g.matvec(w.ty, p, w.rows, w.cols, x, sums, n, y, ldy, add)?;
            }
        }
        Ok(())
    }

    /// # Safety
    /// As [`GpuStep::new`]: `b` sized for `n` tokens, `cache` this layer's.
    #[allow(clippy::too_many_arguments)]
    unsafe fn attention_block(
        &self,
        c: &Config,
        l: &GpuLayer,
        b: &Bufs,
        t: &Tables,
        (cache, elem, split): ((DevPtr, DevPtr), KvElem, Option<AttnSplit>),
        n: usize,
    ) -> Result<(), ModelError> {
        let g = &self.gpu;
        let ld = c.q_dim() + c.kv_dim() + c.v_dim();
        // SAFETY: the caller's guarantees cover every buffer these launches touch.
        unsafe {
            let mats = l.qkv.mats();
            let input = self.input(b, b.x.ptr(), Some(&l.attn_norm), DevPtr::NULL, n, c.hidden, &mats)?;
            let mut at = 0;
            for w in mats {
                self.product(b, w, &input, n, b.qkv.at(at), ld, false)?;
                at += w.rows;
            }
            g.qk_rope_store(
                elem,
                b.qkv.ptr(),
                ld,
                [opt_ptr(&l.bq), opt_ptr(&l.bk), opt_ptr(&l.bv)],
                (opt_ptr(&l.q_norm), opt_ptr(&l.k_norm)),
                c.rms_eps,
                b.rope.ptr(),
                b.ints.at(t.slots),
                cache,
                n,
                (c.n_heads, c.n_kv_heads),
                (c.head_dim, c.value_dim),
                c.rope.dims,
                c.rope.style == RopeStyle::Neox,
            )?;
            g.attention(
                elem,
                b.qkv.ptr(),
                ld,
                cache,
                b.ints.at(t.tables),
                b.ints.at(t.table_at),
                b.ints.at(t.n_keys),
                b.attn.ptr(),
                n,
                (c.n_heads, c.n_kv_heads),
                (c.head_dim, c.value_dim),
                split,
            )?;
            let attn_dim = c.n_heads * c.value_dim;
            let input = self.input(b, b.attn.ptr(), None, DevPtr::NULL, n, attn_dim, &[&l.wo])?;
            self.product(b, &l.wo, &input, n, b.x.ptr(), c.hidden, true)?;
        }
        Ok(())
    }

    /// # Safety
    /// As [`GpuStep::new`]: `b` sized for `n` tokens.
    unsafe fn mlp_block(&self, c: &Config, l: &GpuLayer, b: &Bufs, n: usize) -> Result<(), ModelError> {
        let g = &self.gpu;
        let (gate, up, down) = (&l.w_gate, &l.w_up, &l.w_down);
        // SAFETY: the caller's guarantees cover every buffer these launches touch.
        unsafe {
            let input = self.input(b, b.x.ptr(), Some(&l.ffn_norm), DevPtr::NULL, n, c.hidden, &[gate, up])?;
            if gate.ty == GgmlType::Q1_0 && up.ty == GgmlType::Q1_0 {
                g.q1_glu(gate.buf.ptr(), up.buf.ptr(), c.ffn, c.hidden, input.acts, n, b.gate.ptr())?;
            } else {
                self.product(b, gate, &input, n, b.gate.ptr(), c.ffn, false)?;
                self.product(b, up, &input, n, b.up.ptr(), c.ffn, false)?;
                g.silu_mul(b.gate.ptr(), b.up.ptr(), n * c.ffn)?;
            }
            let input = self.input(b, b.gate.ptr(), None, DevPtr::NULL, n, c.ffn, &[down])?;
            self.product(b, down, &input, n, b.x.ptr(), c.hidden, true)?;
        }
        Ok(())
    }

    /// Per token of the batch: its RoPE cosines, then sines (computed as the CPU path does).
    fn rope_angles(&self, c: &Config, batch: &[SeqInput]) -> Vec<f32> {
        let half = c.rope.dims / 2;
        let mut angles = RopeAngles::new(&c.rope);
        let mut out = Vec::with_capacity(batch.iter().map(|s| s.tokens.len()).sum::<usize>() * 2 * half);
        for item in batch {
            for pos in item.start..item.start + item.tokens.len() {
                angles.set(&c.rope, self.rope_freqs.as_deref(), pos);
                out.extend_from_slice(&angles.cos()[..half]);
                out.extend_from_slice(&angles.sin()[..half]);
            }
        }
        out
    }

    fn size_for(
        &self,
        sc: &mut Scratch,
        c: &Config,
        n: usize,
        m: usize,
        n_ints: usize,
        n_rope: usize,
    ) -> Result<(), ModelError> {
        let fits = sc.bufs.as_ref().is_some_and(|b| b.ints.len() >= n_ints && b.rope.len() >= n_rope);
        if fits && sc.tokens >= n && sc.logit_rows >= m {
            return Ok(());
        }
        let (n, m) = (n.max(sc.tokens), m.max(sc.logit_rows));
        let g = &self.gpu;
        let attn_dim = c.n_heads * c.value_dim;
        // Recorded steps point into the old buffers: drop them, and the buffers before taking new ones.
        sc.graphs.clear();
        sc.bufs = None;
        let widest = c.hidden.max(c.ffn).max(attn_dim);
        sc.bufs = Some(Bufs {
            x: g.zeros(n * c.hidden)?,
            xn: g.zeros(n.max(m) * c.hidden)?,
            qkv: g.zeros(n * (c.q_dim() + c.kv_dim() + c.v_dim()))?,
            attn: g.zeros(n * attn_dim)?,
            acts: g.zeros(Acts::total_bytes(n.max(m), widest))?,
            xr: g.zeros(n.max(m) * widest)?,
            xs: g.zeros(n.max(m) * widest / 32 + 1)?,
            part: g.zeros(GRAPH_TOKENS * c.n_heads * MAX_SPLITS * (c.value_dim + 2))?,
            gate: g.zeros(n * c.ffn)?,
            up: g.zeros(n * c.ffn)?,
            logits: g.zeros(m * c.vocab_size)?,
            rope: g.zeros(n_rope.max(n * c.rope.dims))?,
            ints: g.zeros(n_ints.max(5 * n + 64))?,
        });
        (sc.tokens, sc.logit_rows) = (n, m);
        Ok(())
    }
}

/// One pass on the GPU over a batch, as [`Blocks`]: each block is its launches.
struct GpuStep<'a> {
    net: &'a CudaNet,
    c: &'a Config,
    b: &'a Bufs,
    t: &'a Tables,
    layers: &'a [(DevPtr, DevPtr)],
    elem: KvElem,
    split: Option<AttnSplit>,
    n: usize,
    m: usize,
}

impl<'a> GpuStep<'a> {
    /// # Safety
    /// `b` sized for `n` tokens and `m` logit rows of `c`'s model, its tables `t` uploaded and
    /// checked, `layers` every layer's keys and values in a live device pool of `elem`, and
    /// all of it alive until the stream has run what the step launches.
    #[allow(clippy::too_many_arguments)]
    unsafe fn new(
        net: &'a CudaNet,
        c: &'a Config,
        b: &'a Bufs,
        t: &'a Tables,
        layers: &'a [(DevPtr, DevPtr)],
        (elem, split): (KvElem, Option<AttnSplit>),
        (n, m): (usize, usize),
    ) -> GpuStep<'a> {
        GpuStep { net, c, b, t, layers, elem, split, n, m }
    }
}

impl Blocks for GpuStep<'_> {
    fn embed(&mut self) -> Result<(), ModelError> {
        let (e, b) = (&self.net.embedding, self.b);
        // SAFETY: `GpuStep::new`'s contract: the ids and `x` hold `n` tokens.
        unsafe { self.net.gpu.dequant_rows(e.ty, e.buf.ptr(), self.c.hidden, b.ints.ptr(), self.n, b.x.ptr())? };
        Ok(())
    }

    fn attention(&mut self, layer: usize) -> Result<(), ModelError> {
        let cache = (self.layers[layer], self.elem, self.split);
        // SAFETY: `GpuStep::new`'s contract.
        unsafe { self.net.attention_block(self.c, &self.net.layers[layer], self.b, self.t, cache, self.n) }
    }

    fn mlp(&mut self, layer: usize) -> Result<(), ModelError> {
        // SAFETY: `GpuStep::new`'s contract.
        unsafe { self.net.mlp_block(self.c, &self.net.layers[layer], self.b, self.n) }
    }

    fn logits(&mut self) -> Result<(), ModelError> {
        let (net, b, m) = (self.net, self.b, self.m);
        if m == 0 {
            return Ok(());
        }
        let out = net.output.as_ref().unwrap_or(&net.embedding);
        let rows = b.ints.at(self.t.logit_rows);
        // SAFETY: `GpuStep::new`'s contract: the logit rows' table and buffers hold `m` rows.
        unsafe {
            let input = net.input(b, b.x.ptr(), Some(&net.output_norm), rows, m, self.c.hidden, &[out])?;
            net.product(b, out, &input, m, b.logits.ptr(), out.rows, false)
        }
    }
}

/// Whether a step's attention is cut into chunks of positions: when its few tokens (heads)
/// would leave most of the device idle while walking long sequences. The number of chunks is
/// rounded up to a power of two so that decode steps share few recorded graphs.
fn attention_split(c: &Config, batch: &[SeqInput], n: usize, part: DevPtr) -> Option<AttnSplit> {
    let longest = batch.iter().map(|s| s.start + s.tokens.len()).max().unwrap_or(0);
    if n > GRAPH_TOKENS || longest <= ATTN_CHUNK || n * c.n_heads >= 512 {
        return None;
    }
    let splits = longest.div_ceil(ATTN_CHUNK).next_power_of_two().min(MAX_SPLITS);
    Some(AttnSplit { splits, chunk: longest.div_ceil(splits).max(ATTN_CHUNK), part })
}

fn upload_qkv(g: &Gpu, l: &Layer, i: usize) -> Result<Qkv, ModelError> {
    let (q, k, v) = (l.wq.get(), l.wk.get(), l.wv.get());
    if q.ty == k.ty && k.ty == v.ty {
        for (m, n) in [(&q, "attn_q"), (&k, "attn_k"), (&v, "attn_v")] {
            if !onebit_cuda::supports(m.ty) {
                return Err(ModelError::TensorType {
                    name: format!("blk.{i}.{n}.weight"),
                    ty: m.ty,
                    what: "multiply on the GPU",
                });
            }
        }
        let bytes = [q.data, k.data, v.data].concat();
        return Ok(Qkv::Fused(product_mat(g, q.ty, q.rows + k.rows + v.rows, q.cols, &bytes)?));
    }
    let name = |s: &str| format!("blk.{i}.{s}.weight");
    Ok(Qkv::Split([
        upload_mat(g, &l.wq, &name("attn_q"))?,
        upload_mat(g, &l.wk, &name("attn_k"))?,
        upload_mat(g, &l.wv, &name("attn_v"))?,
    ]))
}

fn upload_layer(g: &Gpu, l: &Layer, i: usize) -> Result<GpuLayer, ModelError> {
    let name = |s: &str| format!("blk.{i}.{s}.weight");
    let Ffn::Dense { gate, up, down } = &l.ffn else {
        return Err(ModelError::Unsupported("a mixture-of-experts MLP on the GPU".into()));
    };
    Ok(GpuLayer {
        attn_norm: g.upload(&l.attn_norm)?,
        qkv: upload_qkv(g, l, i)?,
        wo: upload_mat(g, &l.wo, &name("attn_output"))?,
        bq: upload_opt(g, &l.bq)?,
        bk: upload_opt(g, &l.bk)?,
        bv: upload_opt(g, &l.bv)?,
        q_norm: upload_opt(g, &l.q_norm)?,
        k_norm: upload_opt(g, &l.k_norm)?,
        ffn_norm: g.upload(&l.ffn_norm)?,
        w_gate: upload_mat(g, gate, &name("ffn_gate"))?,
        w_up: upload_mat(g, up, &name("ffn_up"))?,
        w_down: upload_mat(g, down, &name("ffn_down"))?,
    })
}

/// The step's int tables: token ids, cache slots, where each token's block table starts,
/// how many positions each attends over, the rows that want logits, and the block tables.
fn step_tables(batch: &[SeqInput], wanted: &[(usize, usize, usize)]) -> Tables {
    let n: usize = batch.iter().map(|s| s.tokens.len()).sum();
    let mut ints: Vec<i32> =
        Vec::with_capacity(4 * n + wanted.len() + batch.iter().map(|s| s.blocks.len()).sum::<usize>());
    ints.extend(batch.iter().flat_map(|s| s.tokens.iter().map(|&t| t as i32)));
    let slots = ints.len();
    for s in batch {
        for pos in s.start..s.start + s.tokens.len() {
            ints.push(s.blocks[pos / BLOCK_TOKENS] as i32 * BLOCK_TOKENS as i32 + (pos % BLOCK_TOKENS) as i32);
        }
    }
    let table_at = ints.len();
    let tables = 4 * n + wanted.len();
    // Relative to the start of the block tables.
    let mut at = 0;
    for s in batch {
        ints.extend(std::iter::repeat_n(at as i32, s.tokens.len()));
        at += s.blocks.len();
    }
    let n_keys = ints.len();
    for s in batch {
        ints.extend((s.start..s.start + s.tokens.len()).map(|p| p as i32 + 1));
    }
    let logit_rows = ints.len();
    ints.extend(wanted.iter().map(|w| w.2 as i32));
    debug_assert_eq!(ints.len(), tables);
    for s in batch {
        ints.extend(s.blocks.iter().map(|&b| b as i32));
    }
    Tables { ints, slots, table_at, n_keys, logit_rows, tables }
}
