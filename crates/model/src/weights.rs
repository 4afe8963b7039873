//! The table of tensors a Llama-family model needs, and the weights it points at.
//!
//! Matrices stay in their GGUF format inside the memory map: a [`MatRef`] is a view of the
//! file's bytes, including the embedding table, whose rows are dequantized one token at a time.
//! Where the kernel tier has a repacked layout for a matrix's type, the matrix is repacked at
//! load, all of them into one arena, and its file pages are let go. Only vectors (norm weights,
//! biases, RoPE frequency factors) are converted to f32 at load.
//!
//! A mixture-of-experts layer has a router and stacked experts (`ffn_{gate,up,down}_exps`, 3-D:
//! one matrix per expert, one after another) instead of the dense MLP's three matrices; each
//! expert's matrix is a view of its rows of the stacked tensor, repacked like any other.

use std::collections::HashSet;

use onebit_gguf::{GgmlType, GgufModel, Tensor};
use onebit_kernels::formats::{can_dequantize, dequantize};
use onebit_kernels::{Kernels, MatRef, PackedMat, Pool};

/// A matrix as mapped from the file, and — where the kernel tier has a repacked layout for its
/// type — that layout, made at load, which then replaces the file's pages in memory.
pub(crate) struct Weight {
    raw: MatRef<'static>,
    packed: Option<PackedMat>,
}

impl Weight {
    fn new(raw: MatRef<'static>) -> Weight {
        Weight { raw, packed: None }
    }

    /// The matrix for a product (with its packed layout, if it has one).
    pub fn get(&self) -> MatRef<'_> {
        self.raw.with_packed(self.packed.as_ref())
    }
}

/// Tell the kernel it may drop the file pages of `data` (they are re-read if touched again):
/// once a matrix is repacked, its mapped copy would only double the resident memory.
fn release_pages(data: &[u8]) {
    #[cfg(unix)]
    {
        const PAGE: usize = 4096;
        let start = (data.as_ptr() as usize).next_multiple_of(PAGE);
        let end = (data.as_ptr() as usize + data.len()) / PAGE * PAGE;
        if end > start {
            // SAFETY: the range lies inside a read-only file mapping we own; MADV_DONTNEED on it
            // only drops pages, whose contents are read back from the file on the next access.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
            }
        }
    }
    #[cfg(not(unix))]
    let _ = data;
}

use crate::config::{Config, Need};
use crate::error::ModelError;

/// One transformer block.
pub(crate) struct Layer {
    pub attn_norm: Vec<f32>,
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    pub wo: Weight,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
    /// Norms of the attention's and the MLP's outputs (Gemma).
    pub attn_post_norm: Option<Vec<f32>>,
    pub ffn_post_norm: Option<Vec<f32>>,
}

/// A layer's MLP: one gated MLP, or a router over experts.
// One per layer: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Ffn {
    Dense { gate: Weight, up: Weight, down: Weight },
    Moe(Experts),
}

/// A mixture of experts: the router (one row of logits per expert), and each expert's gated
/// MLP as views of the stacked tensors (`ffn_*_exps`, one matrix after another).
pub(crate) struct Experts {
    pub router: Weight,
    pub gate: Vec<Weight>,
    pub up: Vec<Weight>,
    pub down: Vec<Weight>,
}

impl Ffn {
    /// Every matrix of the MLP, in the file's order.
    fn mats_mut(&mut self) -> Vec<&mut Weight> {
        match self {
            Ffn::Dense { gate, up, down } => vec![gate, up, down],
            Ffn::Moe(e) => {
                let mut v = vec![&mut e.router];
                for ((g, u), d) in e.gate.iter_mut().zip(&mut e.up).zip(&mut e.down) {
                    v.extend([g, u, d]);
                }
                v
            }
        }
    }
}

pub(crate) struct Weights {
    pub embedding: MatRef<'static>,
    /// `None` when the output projection is tied to the embedding.
    pub output: Option<Weight>,
    /// The embedding used as the output projection (when tied).
    tied_output: Weight,
    pub output_norm: Vec<f32>,
    pub rope_freqs: Option<Vec<f32>>,
    pub layers: Vec<Layer>,
}

/// Looks tensors up by name, checks their shapes, and records which ones were used.
struct Table<'a> {
    file: &'a GgufModel,
    kernels: Kernels,
    used: HashSet<String>,
}

impl<'a> Table<'a> {
    fn find(&mut self, name: &str, shape: &[usize], need: Need) -> Result<Option<Tensor<'a>>, ModelError> {
        let t = match (self.file.tensor(name), need) {
            (Some(_), Need::Absent) => return Err(ModelError::UnexpectedTensor(name.into())),
            (None, Need::Required) => return Err(ModelError::MissingTensor(name.into())),
            (None, _) => return Ok(None),
            (Some(t), _) => t,
        };
        let expected: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        if t.shape() != expected.as_slice() {
            return Err(ModelError::TensorShape { name: name.into(), found: t.shape().to_vec(), expected });
        }
        self.used.insert(name.to_string());
        Ok(Some(t))
    }

    /// A matrix of `rows` rows of `cols` weights, in a type the kernels can multiply.
    fn matrix(
        &mut self,
        name: &str,
        cols: usize,
        rows: usize,
        need: Need,
    ) -> Result<Option<MatRef<'static>>, ModelError> {
        let Some(t) = self.find(name, &[cols, rows], need)? else {
            return Ok(None);
        };
        if !self.kernels.supports(t.ggml_type()) {
            return Err(ModelError::TensorType { name: name.into(), ty: t.ggml_type(), what: "multiply" });
        }
        Ok(Some(extend(MatRef::from_tensor(&t)?)))
    }

    fn required_matrix(&mut self, name: &str, cols: usize, rows: usize) -> Result<Weight, ModelError> {
        Ok(Weight::new(self.matrix(name, cols, rows, Need::Required)?.expect("required")))
    }

    /// `count` matrices of `rows` × `cols` stacked in one 3-D tensor, as a view of each.
    fn stacked(
        &mut self,
        name: &str,
        cols: usize,
        rows: usize,
        count: usize,
        need: Need,
    ) -> Result<Option<Vec<Weight>>, ModelError> {
        let Some(t) = self.find(name, &[cols, rows, count], need)? else {
            return Ok(None);
        };
        if !self.kernels.supports(t.ggml_type()) {
            return Err(ModelError::TensorType { name: name.into(), ty: t.ggml_type(), what: "multiply" });
        }
        let all = extend(MatRef::from_tensor(&t)?);
        Ok(Some((0..count).map(|e| Weight::new(all.slice_rows(e * rows..(e + 1) * rows))).collect()))
    }

    /// A vector, converted to f32.
    fn vector(&mut self, name: &str, len: usize, need: Need) -> Result<Option<Vec<f32>>, ModelError> {
        let Some(t) = self.find(name, &[len], need)? else {
            return Ok(None);
        };
        let mut out = vec![0f32; len];
        if !matches!(t.ggml_type(), GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return Err(ModelError::TensorType { name: name.into(), ty: t.ggml_type(), what: "use as a vector" });
        }
        dequantize(t.ggml_type(), t.data(), &mut out)?;
        Ok(Some(out))
    }

    fn required_vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        Ok(self.vector(name, len, Need::Required)?.expect("required"))
    }
}

/// Erase the lifetime of a view into the model's memory map.
///
/// The map is owned by the same [`Model`](crate::Model) that owns these views, lives at a
/// fixed address, and is dropped after them; views are only handed out borrowed from the model.
fn extend(m: MatRef<'_>) -> MatRef<'static> {
    // SAFETY: see above.
    unsafe { std::mem::transmute::<MatRef<'_>, MatRef<'static>>(m) }
}

impl Weights {
    /// Find, check and map every tensor of `config`'s architecture. Fills in `vocab_size`.
    pub fn load(file: &GgufModel, config: &mut Config, kernels: Kernels) -> Result<Weights, ModelError> {
        let mut tab = Table { file, kernels, used: HashSet::new() };
        let h = config.hidden;
        let embd =
            file.tensor("token_embd.weight").ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        let vocab = embd.dim(1) as usize;
        config.vocab_size = vocab;
        let et = tab.find("token_embd.weight", &[h, vocab], Need::Required)?.expect("required");
        if !can_dequantize(et.ggml_type()) {
            return Err(ModelError::TensorType {
                name: "token_embd.weight".into(),
                ty: et.ggml_type(),
                what: "look up rows of",
            });
        }
        let embedding = extend(MatRef::from_tensor(&et)?);
        let output = tab.matrix("output.weight", h, vocab, Need::Optional)?.map(Weight::new);
        if output.is_none() && !kernels.supports(embedding.ty) {
            return Err(ModelError::TensorType {
                name: "token_embd.weight".into(),
                ty: embedding.ty,
                what: "multiply (as the tied output)",
            });
        }
        let output_norm = tab.required_vector("output_norm.weight", h)?;
        let rope_freqs = tab.vector("rope_freqs.weight", config.rope.dims / 2, Need::Optional)?;
        let layers = (0..config.n_layers).map(|i| load_layer(&mut tab, config, i)).collect::<Result<Vec<_>, _>>()?;

        if let Some(extra) = file.tensors().find(|t| !tab.used.contains(t.name())) {
            return Err(ModelError::UnexpectedTensor(extra.name().to_string()));
        }
        Ok(Weights { embedding, output, tied_output: Weight::new(embedding), output_norm, rope_freqs, layers })
    }

    /// The output projection (the embedding when tied).
    pub fn output(&self) -> &Weight {
        self.output.as_ref().unwrap_or(&self.tied_output)
    }

    /// Repack every matrix the kernel tier has a layout for, all into one arena, the pool's
    /// threads sharing each matrix; each matrix's file pages are let go once it is packed, so
    /// the resident memory stays about the file's size.
    ///
    /// With `cache` (a file and the source string its header carries), the packed weights come
    /// from that file when an earlier load wrote it, and are written there when not; failing to
    /// write it is only logged.
    pub fn pack(&mut self, kernels: Kernels, pool: &Pool, cache: Option<(&std::path::Path, &str)>) {
        let output = match &mut self.output {
            Some(w) => w,
            None => &mut self.tied_output,
        };
        let mut mats: Vec<&mut Weight> = vec![output];
        for l in &mut self.layers {
            mats.extend([&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo]);
            mats.extend(l.ffn.mats_mut());
        }
        // Layer by layer, the output last: the order of the file and of the first forward pass.
        mats.rotate_left(1);
        let raws: Vec<MatRef<'static>> = mats.iter().map(|w| w.raw).collect();
        let (packed, failed) = kernels.pack_all(pool, &raws, &mut |i| release_pages(raws[i].data), cache);
        if let (Some(e), Some((path, _))) = (failed, cache) {
            tracing::warn!("could not keep the repacked weights in {}: {e}", path.display());
        }
        for (w, p) in mats.into_iter().zip(packed) {
            w.packed = p;
        }
    }
}

fn load_layer(tab: &mut Table, c: &Config, i: usize) -> Result<Layer, ModelError> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let (h, arch) = (c.hidden, c.arch);
    let bias = arch.qkv_bias();
    let layer = Layer {
        attn_norm: tab.required_vector(&n("attn_norm.weight"), h)?,
        wq: tab.required_matrix(&n("attn_q.weight"), h, c.q_dim())?,
        wk: tab.required_matrix(&n("attn_k.weight"), h, c.kv_dim())?,
        wv: tab.required_matrix(&n("attn_v.weight"), h, c.v_dim())?,
        wo: tab.required_matrix(&n("attn_output.weight"), c.n_heads * c.value_dim, h)?,
        bq: tab.vector(&n("attn_q.bias"), c.q_dim(), bias)?,
        bk: tab.vector(&n("attn_k.bias"), c.kv_dim(), bias)?,
        bv: tab.vector(&n("attn_v.bias"), c.v_dim(), bias)?,
        q_norm: tab.vector(&n("attn_q_norm.weight"), c.head_dim, arch.qk_norm())?,
        k_norm: tab.vector(&n("attn_k_norm.weight"), c.head_dim, arch.qk_norm())?,
        ffn_norm: tab.required_vector(&n("ffn_norm.weight"), h)?,
        ffn: load_ffn(tab, c, i)?,
        attn_post_norm: tab.vector(&n("post_attention_norm.weight"), h, arch.post_norms())?,
        ffn_post_norm: tab.vector(&n("post_ffw_norm.weight"), h, arch.post_norms())?,
    };
    // Optional biases come in complete sets or not at all.
    if layer.bq.is_some() != layer.bk.is_some() || layer.bk.is_some() != layer.bv.is_some() {
        return Err(ModelError::Unsupported(format!("layer {i} has biases on only some of q, k, v")));
    }
    Ok(layer)
}

/// A layer's MLP: dense, or (for a mixture-of-experts architecture) the router and stacked
/// experts; the other kind's tensors must be absent.
fn load_ffn(tab: &mut Table, c: &Config, i: usize) -> Result<Ffn, ModelError> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let h = c.hidden;
    let (dense, moe) = if c.arch.moe() { (Need::Absent, Need::Required) } else { (Need::Required, Need::Absent) };
    let w = Weight::new;
    let gate = tab.matrix(&n("ffn_gate.weight"), h, c.ffn, dense)?.map(w);
    let up = tab.matrix(&n("ffn_up.weight"), h, c.ffn, dense)?.map(w);
    let down = tab.matrix(&n("ffn_down.weight"), c.ffn, h, dense)?.map(w);
    let (ne, ef) = c.moe.map_or((0, 0), |m| (m.n_experts, m.ffn));
    let router = tab.matrix(&n("ffn_gate_inp.weight"), h, ne, moe)?.map(w);
    let gate_exps = tab.stacked(&n("ffn_gate_exps.weight"), h, ef, ne, moe)?;
    let up_exps = tab.stacked(&n("ffn_up_exps.weight"), h, ef, ne, moe)?;
    let down_exps = tab.stacked(&n("ffn_down_exps.weight"), ef, h, ne, moe)?;
    Ok(match (gate, up, down, router, gate_exps, up_exps, down_exps) {
        (Some(gate), Some(up), Some(down), None, None, None, None) => Ffn::Dense { gate, up, down },
        (None, None, None, Some(router), Some(gate), Some(up), Some(down)) => {
            Ffn::Moe(Experts { router, gate, up, down })
        }
        _ => unreachable!("the needs above admit one set of tensors"),
    })
}
