//! LoRA adapters in llama.cpp's GGUF format, applied beside the base weights.
//!
//! An adapter file (`general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`) holds
//! pairs `NAME.lora_a` (ne `[n_in, rank]`: `rank` rows of `n_in`) and `NAME.lora_b` (ne
//! `[rank, n_out]`: `n_out` rows of `rank`) for base matrices `NAME`. As llama.cpp computes it,
//! an adapted product is `y = W·x + s·B·(A·x)` with `s = scale · alpha / rank` (`scale` alone when
//! the file has no alpha).
//!
//! The update is never merged into the weights: a 1-bit matrix cannot hold `W + s·B·A`, and one
//! copy of the base weights serves every adapter. Each row of a batch names its own adapters
//! (S-LoRA / Punica style): the base product runs once over the whole batch, then rows are
//! grouped by their adapter set and each group gets its low-rank products, in f32 (F16 adapter
//! weights stay halves in memory and are widened as they are read). Every value of a row's
//! update is computed from that row alone, in one fixed order of operations, so a row's result
//! never depends on what else shares the batch.

use std::path::{Path, PathBuf};

use onebit_gguf::{GgmlType, GgufFile, GgufModel, Tensor};
use onebit_kernels::formats::{can_dequantize, dequantize};
use onebit_kernels::{DisjointRows, Kernels, MatRef, Pool};

use crate::config::Config;
use crate::error::ModelError;
use crate::forward::{Net, Scratch};

/// One adapter at one scale, as a sequence asks for it: `id` indexes the model's adapters
/// ([`crate::Model::loras`]), in the order they were loaded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraUse {
    pub id: usize,
    pub scale: f32,
}

/// The matrices of a layer an adapter can change, in the order of the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

const TARGETS: [(Target, &str); 7] = [
    (Target::Q, "attn_q"),
    (Target::K, "attn_k"),
    (Target::V, "attn_v"),
    (Target::O, "attn_output"),
    (Target::Gate, "ffn_gate"),
    (Target::Up, "ffn_up"),
    (Target::Down, "ffn_down"),
];

/// Where an adapted matrix sits: a layer's matrix, or the output projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Site {
    Layer(usize, Target),
    Output,
}

/// One adapted matrix's update.
struct LowRank {
    rank: usize,
    n_in: usize,
    n_out: usize,
    /// `rank` rows of `n_in`.
    a: Values,
    /// B transposed: `rank` rows of `n_out` (the second product adds `t_j` times row j to
    /// each output, over whole runs of outputs, instead of one short dot product per output).
    bt: Values,
    /// `alpha / rank`, or 1 without an alpha.
    factor: f32,
}

/// A matrix of the adapter: IEEE halves kept as they are (decoding reads every value of every
/// adapted matrix once per step, so half the bytes is most of the time), anything else
/// widened to f32 at load.
enum Values {
    F16(Vec<u16>),
    F32(Vec<f32>),
}

thread_local! {
    /// Rows of an F16 matrix widened for the dot products of one job.
    static WIDE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Values {
    /// The `cols × rows` transpose of these `rows × cols` values.
    fn transposed(self, rows: usize, cols: usize) -> Values {
        fn t<T: Copy>(v: &[T], rows: usize, cols: usize) -> Vec<T> {
            (0..cols).flat_map(|c| (0..rows).map(move |r| v[r * cols + c])).collect()
        }
        match self {
            Values::F16(v) => Values::F16(t(&v, rows, cols)),
            Values::F32(v) => Values::F32(t(&v, rows, cols)),
        }
    }

    fn is_f16(&self) -> bool {
        matches!(self, Values::F16(_))
    }

    /// `f(values)` for the values `range` as f32 (widened exactly, into a buffer of the thread).
    fn with_f32<R>(&self, k: Kernels, range: std::ops::Range<usize>, f: impl FnOnce(&[f32]) -> R) -> R {
        match self {
            Values::F32(v) => f(&v[range]),
            Values::F16(v) => WIDE.with_borrow_mut(|w| {
                w.resize(range.len(), 0.0);
                k.f16_to_f32(&v[range], w);
                f(w)
            }),
        }
    }
}

/// A LoRA adapter, checked against the model it was loaded for.
pub struct LoraAdapter {
    path: PathBuf,
    alpha: f32,
    /// Per layer, per [`Target`] (in the order of `TARGETS`).
    layers: Vec<[Option<LowRank>; 7]>,
    output: Option<LowRank>,
}

impl std::fmt::Debug for LoraAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LoraAdapter({}, rank {}, alpha {})", self.path.display(), self.rank(), self.alpha)
    }
}

fn bad(path: &Path, tensor: Option<&str>, reason: impl Into<String>) -> ModelError {
    ModelError::BadAdapter {
        file: path.display().to_string(),
        tensor: tensor.map(str::to_string),
        reason: reason.into(),
    }
}

impl LoraAdapter {
    /// Read the adapter at `path` and check it against the base model `base` (its file and
    /// hyperparameters): same architecture, every pair complete, every adapted matrix present
    /// in the base with matching shapes.
    pub(crate) fn load(path: &Path, base: &GgufModel, config: &Config) -> Result<LoraAdapter, ModelError> {
        let file = GgufFile::open(path).map_err(|e| bad(path, None, e.to_string()))?;
        let md = file.metadata();
        let text = |key: &str| md.get_str(key).ok().unwrap_or("");
        if text("general.type") != "adapter" {
            let found = text("general.type");
            return Err(bad(path, None, format!("not an adapter (general.type is '{found}', expected 'adapter')")));
        }
        if text("adapter.type") != "lora" {
            let found = text("adapter.type");
            return Err(bad(path, None, format!("adapter.type is '{found}'; onebit reads 'lora' adapters")));
        }
        let arch = text("general.architecture");
        if arch != config.arch.name() {
            return Err(bad(
                path,
                None,
                format!("made for architecture '{arch}', the model is '{}'", config.arch.name()),
            ));
        }
        // llama.cpp reads a missing alpha as 0: the user's scale alone.
        let alpha = if md.contains("adapter.lora.alpha") {
            md.get_f32("adapter.lora.alpha").map_err(|e| bad(path, None, e.to_string()))?
        } else {
            0.0
        };
        let mut adapter = LoraAdapter {
            path: path.to_path_buf(),
            alpha,
            layers: (0..config.n_layers).map(|_| Default::default()).collect(),
            output: None,
        };
        let mut n_pairs = 0;
        for t in file.tensors() {
            let name = t.name();
            let Some(base_name) = name.strip_suffix(".lora_a") else {
                if name.ends_with(".lora_b") {
                    let a = name.replace(".lora_b", ".lora_a");
                    file.tensor(&a).ok_or_else(|| bad(path, Some(name), format!("has no partner '{a}'")))?;
                    continue;
                }
                // As llama.cpp: norm vectors of an adapter are not applied.
                if name.ends_with("_norm.weight") {
                    continue;
                }
                return Err(bad(path, Some(name), "is neither a .lora_a nor a .lora_b tensor"));
            };
            let b_name = format!("{base_name}.lora_b");
            let b = file.tensor(&b_name).ok_or_else(|| bad(path, Some(name), format!("has no partner '{b_name}'")))?;
            let site = site_of(base_name, config.n_layers).ok_or_else(|| match base.tensor(base_name) {
                Some(_) => bad(path, Some(base_name), "onebit applies LoRA only to attention, MLP and output matrices"),
                None => bad(path, Some(base_name), "does not exist in the base model (made for another model?)"),
            })?;
            let w = base.tensor(base_name).ok_or_else(|| {
                bad(path, Some(base_name), "does not exist in the base model (made for another model?)")
            })?;
            let low = LowRank::read(path, base_name, &t, &b, w.shape(), alpha)?;
            let slot = match site {
                Site::Layer(l, target) => &mut adapter.layers[l][target as usize],
                Site::Output => &mut adapter.output,
            };
            *slot = Some(low);
            n_pairs += 1;
        }
        if n_pairs == 0 {
            return Err(bad(path, None, "holds no lora_a/lora_b pairs"));
        }
        Ok(adapter)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `adapter.lora.alpha` (0 when the file has none).
    pub fn alpha(&self) -> f32 {
        self.alpha
    }

    /// The rank of its first adapted matrix (adapters usually have one rank throughout).
    pub fn rank(&self) -> usize {
        self.mats().next().map_or(0, |m| m.rank)
    }

    /// How many matrices it changes.
    pub fn n_matrices(&self) -> usize {
        self.mats().count()
    }

    fn mats(&self) -> impl Iterator<Item = &LowRank> {
        self.layers.iter().flat_map(|l| l.iter().flatten()).chain(&self.output)
    }

    fn at(&self, site: Site) -> Option<&LowRank> {
        match site {
            Site::Layer(l, t) => self.layers.get(l)?[t as usize].as_ref(),
            Site::Output => self.output.as_ref(),
        }
    }

    /// Whether it changes any matrix of `layer` among `targets`.
    fn touches(&self, layer: usize, targets: &[Target]) -> bool {
        targets.iter().any(|&t| self.at(Site::Layer(layer, t)).is_some())
    }
}

/// The base matrix an adapter pair is for: `blk.N.T.weight` or `output.weight`.
fn site_of(base_name: &str, n_layers: usize) -> Option<Site> {
    if base_name == "output.weight" {
        return Some(Site::Output);
    }
    let rest = base_name.strip_prefix("blk.")?.strip_suffix(".weight")?;
    let (layer, what) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok().filter(|&l| l < n_layers)?;
    TARGETS.iter().find(|(_, n)| *n == what).map(|&(t, _)| Site::Layer(layer, t))
}

impl LowRank {
    fn read(
        path: &Path,
        name: &str,
        a: &Tensor,
        b: &Tensor,
        base_shape: &[u64],
        alpha: f32,
    ) -> Result<LowRank, ModelError> {
        let [n_in, n_out] = base_shape else {
            return Err(bad(path, Some(name), "the base tensor is not a matrix"));
        };
        let (n_in, n_out) = (*n_in as usize, *n_out as usize);
        let rank = match a.shape() {
            &[i, r] if i as usize == n_in && r > 0 => r as usize,
            s => {
                let msg = format!("lora_a has shape {s:?}, the base matrix needs [{n_in}, rank]");
                return Err(bad(path, Some(name), msg));
            }
        };
        if b.shape() != [rank as u64, n_out as u64] {
            let msg = format!("lora_b has shape {:?}, expected [{rank}, {n_out}]", b.shape());
            return Err(bad(path, Some(name), msg));
        }
        let read = |t: &Tensor, len: usize| -> Result<Values, ModelError> {
            if t.ggml_type() == GgmlType::F16 {
                let bits = t.data().chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
                return Ok(Values::F16(bits));
            }
            if !can_dequantize(t.ggml_type()) {
                return Err(bad(path, Some(t.name()), format!("type {} cannot be read", t.ggml_type())));
            }
            let mut out = vec![0f32; len];
            dequantize(t.ggml_type(), t.data(), &mut out).map_err(|e| bad(path, Some(t.name()), e.to_string()))?;
            Ok(Values::F32(out))
        };
        let factor = if alpha != 0.0 { alpha / rank as f32 } else { 1.0 };
        let bt = read(b, n_out * rank)?.transposed(n_out, rank);
        Ok(LowRank { rank, n_in, n_out, a: read(a, rank * n_in)?, bt, factor })
    }
}

/// The adapters of one forward pass: the batch's rows grouped by the adapters they use.
pub(crate) struct LoraBatch<'a> {
    adapters: &'a [LoraAdapter],
    groups: Vec<Group<'a>>,
}

/// Rows (token indices of the batch) that use the same adapters at the same scales.
struct Group<'a> {
    uses: &'a [LoraUse],
    rows: Vec<usize>,
}

impl<'a> LoraBatch<'a> {
    /// Group the tokens of a batch: `per_seq[s]` are the adapters of sequence `s`, whose tokens
    /// are `lens[s]` rows of the batch, one after another. Adapters at scale 0 are left out.
    pub fn new(adapters: &'a [LoraAdapter], per_seq: &'a [&'a [LoraUse]], lens: &[usize]) -> Result<Self, ModelError> {
        let mut groups: Vec<Group> = Vec::new();
        let mut row = 0;
        for (uses, &len) in per_seq.iter().zip(lens) {
            if let Some(u) = uses.iter().find(|u| u.id >= adapters.len()) {
                return Err(ModelError::BadBatch(format!("LoRA adapter {} of {} loaded", u.id, adapters.len())));
            }
            let rows = row..row + len;
            row += len;
            if uses.iter().all(|u| u.scale == 0.0) {
                continue;
            }
            match groups.iter_mut().find(|g| g.uses == *uses) {
                Some(g) => g.rows.extend(rows),
                None => groups.push(Group { uses, rows: rows.collect() }),
            }
        }
        Ok(LoraBatch { adapters, groups })
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Whether any row's adapters change one of `targets` of `layer`.
    pub fn touches(&self, layer: usize, targets: &[Target]) -> bool {
        self.groups.iter().any(|g| g.uses.iter().any(|u| u.scale != 0.0 && self.adapters[u.id].touches(layer, targets)))
    }

    /// `out[r] += s·B·(A·input[r])` for every row `r` of the batch whose adapters change the
    /// matrix at `site`; `input` and `out` are rows of the matrix's `n_in` and `n_out` values.
    /// `row_of` maps a batch row to its row in `input`/`out` (None: not there).
    pub fn add(
        &self,
        kernels: Kernels,
        pool: &Pool,
        site: Site,
        input: &[f32],
        out: &mut [f32],
        row_of: &dyn Fn(usize) -> Option<usize>,
    ) {
        for g in &self.groups {
            let rows: Vec<usize> = g.rows.iter().filter_map(|&r| row_of(r)).collect();
            if rows.is_empty() {
                continue;
            }
            for u in g.uses.iter().filter(|u| u.scale != 0.0) {
                if let Some(m) = self.adapters[u.id].at(site) {
                    m.add(kernels, pool, u.scale * m.factor, &rows, input, out);
                }
            }
        }
    }
}

/// Output values per job of the second product: enough work to be worth handing out.
const OUT_CHUNK: usize = 256;

impl LowRank {
    /// `out[r] += s·B·(A·x[r])` for the rows `rows` of `x` and `out`.
    fn add(&self, k: Kernels, pool: &Pool, s: f32, rows: &[usize], x: &[f32], out: &mut [f32]) {
        let (r, n_in, n_out) = (self.rank, self.n_in, self.n_out);
        // The rows' inputs together, rounded to halves where the weights are halves: what
        // ggml's F16 product does to its input (the updates then match llama.cpp's closely).
        let mut xs = Vec::with_capacity(rows.len() * n_in);
        rows.iter().for_each(|&row| xs.extend_from_slice(&x[row * n_in..(row + 1) * n_in]));
        if self.a.is_f16() {
            k.round_f16(&mut xs);
        }
        let x = &xs;
        // t = A·x: `rank` values per row of x, each one dot product.
        let mut tmp = vec![0f32; rows.len() * r];
        {
            let t = DisjointRows::new(&mut tmp, 1);
            // By rows of A, each widened once for all the rows of x.
            pool.for_chunks(r, 1, &|_, js| {
                for j in js {
                    self.a.with_f32(k, j * n_in..(j + 1) * n_in, |aj| {
                        for (i, xr) in x.chunks_exact(n_in).enumerate() {
                            let v = k.dot_f32(xr, aj);
                            // SAFETY: value (i, j) is written by the one job of row j of A.
                            let ti = unsafe { t.row(i * r + j) };
                            ti[0] = v;
                        }
                    });
                }
            });
        }
        if self.bt.is_f16() {
            k.round_f16(&mut tmp);
        }
        // out += s·B·t, by runs of output values.
        let t = &tmp;
        let dst = DisjointRows::new(out, n_out);
        pool.for_chunks(n_out, OUT_CHUNK, &|_, cols| {
            let w = cols.len();
            // Rows j of Bᵀ over these outputs, one after another.
            let mut b = vec![0f32; r * w];
            for (j, bj) in b.chunks_exact_mut(w).enumerate() {
                self.bt.with_f32(k, j * n_out + cols.start..j * n_out + cols.end, |v| bj.copy_from_slice(v));
            }
            let mut acc = vec![0f32; w];
            for (i, &row) in rows.iter().enumerate() {
                // B·t for this row, summed over j in order (the same order for every row).
                acc.fill(0.0);
                for (&tj, bj) in t[i * r..(i + 1) * r].iter().zip(b.chunks_exact(w)) {
                    acc.iter_mut().zip(bj).for_each(|(a, &bv)| *a += tj * bv);
                }
                // SAFETY: each run of columns goes to one thread, and rows are distinct.
                let o = unsafe { dst.row_part(row, cols.clone()) };
                o.iter_mut().zip(&acc).for_each(|(ov, &a)| *ov += s * a);
            }
        });
    }
}

/// Read every adapter of `paths` for the model of `base` and `config`.
pub(crate) fn load_all(paths: &[PathBuf], base: &GgufModel, config: &Config) -> Result<Vec<LoraAdapter>, ModelError> {
    paths.iter().map(|p| LoraAdapter::load(p, base, config)).collect()
}

impl Net<'_> {
    /// The adapters' updates of the matrix at `site` for the batch's rows (`input` and `out`
    /// hold one row per token of the batch).
    pub(crate) fn lora_add(&self, site: Site, input: &[f32], out: &mut [f32]) {
        if !self.lora.is_empty() {
            self.lora.add(self.kernels, self.pool, site, input, out, &Some);
        }
    }

    /// The gated MLP of layer `l` with the adapters' updates of gate, up and down: the same
    /// products as [`Net::gated_mlp`]'s (whose fused form is bit for bit these), with each
    /// update added before the activation or the residual takes it.
    pub(crate) fn lora_mlp(
        &self,
        l: usize,
        [gate, up, down]: [&MatRef; 3],
        sc: &mut Scratch,
        n: usize,
    ) -> Result<(), ModelError> {
        let (h, f) = (gate.cols, gate.rows);
        let xn = &mut sc.xn[..n * h];
        let bufs = &mut sc.mlp;
        bufs.gate.resize(n * f, 0.0);
        bufs.up.resize(n * f, 0.0);
        let (g, u) = (&mut bufs.gate[..n * f], &mut bufs.up[..n * f]);
        self.project(xn, h, &[gate, up], &mut [&mut *g, &mut *u], &mut sc.acts)?;
        self.lora_add(Site::Layer(l, Target::Gate), xn, g);
        self.lora_add(Site::Layer(l, Target::Up), xn, u);
        self.kernels.glu(self.config.activation, g, u);
        self.project(g, f, &[down], &mut [&mut *xn], &mut sc.acts)?;
        self.lora_add(Site::Layer(l, Target::Down), g, xn);
        Ok(())
    }
}
