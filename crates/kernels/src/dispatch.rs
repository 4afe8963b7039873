//! The single dispatch point: a [`Kernels`] value picks one tier's function table at load
//! time, and every caller goes through it. No `cfg` or feature checks outside this crate.

use std::path::Path;

use onebit_gguf::GgmlType;

use crate::KernelError;
use crate::act::{ActFormat, Acts};
use crate::arena::Arena;
use crate::disjoint::DisjointRows;
use crate::matmul::{MatRef, OutPtr, RowKernel};
use crate::pack::{PackedMat, PackedStore, Packer};
use crate::pack_cache::{self, Header};
use crate::pool::Pool;
use crate::table::{MAX_HEAD, Pages, SERIAL_VALUES, Table};
use crate::tier::KernelTier;

/// The activation of a gated MLP: `act(gate) · up`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Glu {
    /// SwiGLU: `silu(gate) · up` (Llama, Qwen).
    #[default]
    Silu,
    /// GEGLU with GELU's tanh form, as ggml's CPU backend computes it (Gemma).
    GeluTanh,
}

/// The kernels of one tier.
#[derive(Clone, Copy)]
pub struct Kernels {
    tier: KernelTier,
    table: &'static Table,
    batch_rounding: BatchRounding,
}

/// How activations of a batch (prefill) are rounded to 8 bits before integer products.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BatchRounding {
    /// As llama.cpp does: the weight type's own activation format everywhere (Q8_0: one scale
    /// per 32 values).
    Reference,
    /// Let the tier pick a coarser format where that makes batches faster: AMX, AVX-512 and
    /// AVX2 take one scale per 128 values for Q1_0 weights, so that tiles, VNNI products and
    /// lookups sum 128 products before scaling.
    #[default]
    Fast,
}

impl std::str::FromStr for BatchRounding {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "fast" => Ok(BatchRounding::Fast),
            "reference" => Ok(BatchRounding::Reference),
            _ => Err(format!("unknown batch rounding '{s}' (known: fast, reference)")),
        }
    }
}

impl std::fmt::Display for BatchRounding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BatchRounding::Fast => "fast",
            BatchRounding::Reference => "reference",
        })
    }
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernels({}, {} batch rounding)", self.tier, self.batch_rounding)
    }
}

/// Rows of output per unit of work handed to a thread. A batch goes by pairs of 16-row tiles
/// (tiled kernels expand them once for all tokens, and must keep them in cache), or as many as
/// the tier asks for (AVX2's lookup kernel: many groups per unit, see `batch_rows`). A few tokens
/// go by whole row groups of a packed matrix, about four units per thread, so that handing
/// them out (an atomic counter the threads share) stays cheap next to the work.
fn chunk_rows(table: &Table, w: &MatRef, acts: &Acts, threads: usize) -> usize {
    let group = w.packed.map_or(16, |p| p.group_rows);
    if acts.rows() >= 16 {
        return (table.batch_rows)(w).unwrap_or(group.max(32));
    }
    (w.rows / (4 * threads)).max(group).next_multiple_of(group)
}

/// Products of a few tokens against packed weights go by shrinking pieces of whole row groups
/// ([`Pool::for_shrinking`]) rather than `chunk_rows`' equal units: where several tokens share
/// a row, a thread that waits for the other at the end of a product wastes their arithmetic,
/// and the large first pieces keep the pieces few. Which counts, per tier (`Table::shrinking`),
/// measured on Sapphire Rapids (amx tier, 2 threads, `batched-bench -npp 128`, alternated with
/// equal units): SmolLM2 at 8 / 16 sequences +3–7 % / +10 %, the Bonsai-1.7B shape +2–7 % /
/// +3–13 %, 2 and 3 sequences +1–3 %; one token: SmolLM2 +7 %, the 1.7B shape unchanged. On Zen 4
/// shrinking pieces of one token left SmolLM2 8 % behind and the 1.7B shape 5 % ahead, so the
/// avx512 tier keeps equal units for one token on AMD CPUs. On an Intel Xeon without AMX
/// (family 6 model 207, tg64 alternated) they put the 1.7B shape 4–6 % ahead, SmolLM2 0–12 %
/// and the 8B shape 1–4 %: the avx512 tier takes them for one token on Intel CPUs, as the amx
/// tier does. On Zen 2 (avx2 tier, tg64 alternated) they put the 1.7B shape 5–6 % ahead,
/// SmolLM2 5 % and the 8B shape 3 %: the avx2 tier takes them for one token too.
fn shrinking_unit(table: &Table, w: &MatRef, acts: &Acts) -> Option<usize> {
    if !(table.shrinking.0..table.shrinking.1).contains(&acts.rows()) {
        return None;
    }
    w.packed.map(|p| p.group_rows)
}

impl Kernels {
    /// The kernels of `tier`, if this build and CPU can run it.
    pub fn new(tier: KernelTier) -> Result<Kernels, KernelError> {
        if !tier.is_available() {
            return Err(KernelError::TierUnavailable { tier, available: KernelTier::available() });
        }
        Ok(Kernels { tier, table: table_for(tier), batch_rounding: BatchRounding::default() })
    }

    /// The best tier of this machine.
    pub fn best() -> Kernels {
        Kernels::new(KernelTier::best()).unwrap_or(Kernels {
            tier: KernelTier::Scalar,
            table: &crate::scalar::TABLE,
            batch_rounding: BatchRounding::default(),
        })
    }

    /// The same kernels with activations of batches rounded as `rounding` says.
    pub fn with_batch_rounding(self, rounding: BatchRounding) -> Kernels {
        Kernels { batch_rounding: rounding, ..self }
    }

    pub fn tier(&self) -> KernelTier {
        self.tier
    }

    /// Whether matrix products with weights of `ty` are supported.
    pub fn supports(&self, ty: GgmlType) -> bool {
        ActFormat::for_weights(ty).is_ok() && (self.table.row_kernel)(ty).is_some()
    }

    /// Quantize `rows` rows of `x` (each `cols` long) into `acts` in the format `w_ty` needs.
    pub fn quantize_acts(
        &self,
        pool: &Pool,
        w_ty: GgmlType,
        x: &[f32],
        cols: usize,
        acts: &mut Acts,
    ) -> Result<(), KernelError> {
        self.quantize_acts_for(pool, &[w_ty], x, cols, acts)
    }

    /// Quantize `x` once for products with weights of several types that share an activation
    /// format (e.g. q, k and v projections stored in different types).
    pub fn quantize_acts_for(
        &self,
        pool: &Pool,
        w_tys: &[GgmlType],
        x: &[f32],
        cols: usize,
        acts: &mut Acts,
    ) -> Result<(), KernelError> {
        let rows = x.len() / cols.max(1);
        let format = self.format_for(w_tys, cols, rows)?;
        self.quantize_into(pool, format, w_tys, x, cols, acts)
    }

    /// The activation format products with weights of all of `w_tys` take here.
    fn format_for(&self, w_tys: &[GgmlType], cols: usize, rows: usize) -> Result<ActFormat, KernelError> {
        let Some(&first) = w_tys.first() else {
            return Err(KernelError::Unsupported { ty: GgmlType::F32, what: "activations for no weights" });
        };
        let format = ActFormat::for_weights(first)?;
        for &ty in &w_tys[1..] {
            if ActFormat::for_weights(ty)? != format {
                return Err(KernelError::Mismatch { weights: ty, cols, acts: format!("{format:?} × {cols}") });
            }
        }
        Ok(match self.batch_rounding {
            BatchRounding::Fast => (self.table.batch_format)(format, w_tys, rows),
            BatchRounding::Reference => format,
        })
    }

    /// Quantize `x` into a given `format` that weights of `w_ty` accept (e.g. the format
    /// another tier chose, to compare the two).
    pub fn quantize_acts_in(
        &self,
        pool: &Pool,
        format: ActFormat,
        w_ty: GgmlType,
        x: &[f32],
        cols: usize,
        acts: &mut Acts,
    ) -> Result<(), KernelError> {
        if !format.serves(ActFormat::for_weights(w_ty)?) {
            return Err(KernelError::Mismatch { weights: w_ty, cols, acts: format!("{format:?} × {cols}") });
        }
        self.quantize_into(pool, format, &[w_ty], x, cols, acts)
    }

    fn quantize_into(
        &self,
        pool: &Pool,
        format: ActFormat,
        w_tys: &[GgmlType],
        x: &[f32],
        cols: usize,
        acts: &mut Acts,
    ) -> Result<(), KernelError> {
        let rows = x.len() / cols.max(1);
        if rows * cols != x.len() {
            return Err(KernelError::Shape(format!("{} activations are not whole rows of {cols}", x.len())));
        }
        acts.reset(format, rows, cols)?;
        let quantize = self.table.quantize_row;
        if rows * cols < SERIAL_VALUES {
            for t in 0..rows {
                quantize(format, &x[t * cols..(t + 1) * cols], acts.row_mut(t));
            }
            (self.table.prepare)(pool, acts, w_tys);
            return Ok(());
        }
        let rb = acts.row_bytes();
        let out = DisjointRows::new(acts.bytes_mut(), rb);
        pool.for_chunks(rows, 4, &|_, range| {
            for t in range {
                // SAFETY: the pool hands each row index to exactly one thread.
                let row = unsafe { out.row(t) };
                quantize(format, &x[t * cols..(t + 1) * cols], row);
            }
        });
        (self.table.prepare)(pool, acts, w_tys);
        Ok(())
    }

    /// `out[t * w.rows + r] = W[r] · X[t]` for every token `t` of `acts`.
    pub fn matmul(&self, pool: &Pool, w: &MatRef, acts: &Acts, out: &mut [f32]) -> Result<(), KernelError> {
        let kernel = self.row_kernel(w, acts)?;
        if out.len() < acts.rows() * w.rows {
            return Err(KernelError::Size { ty: GgmlType::F32, elements: acts.rows() * w.rows, bytes: out.len() * 4 });
        }
        let ptr = OutPtr::new(out, w.rows);
        if let Some(unit) = shrinking_unit(self.table, w, acts) {
            pool.for_shrinking(&[(w.rows, unit)], &|_, _, rows| kernel.run(w, rows, acts, ptr));
            return Ok(());
        }
        pool.for_chunks(w.rows, chunk_rows(self.table, w, acts, pool.n_threads()), &|_, rows| {
            kernel.run(w, rows, acts, ptr)
        });
        Ok(())
    }

    /// Several products over the same activations in one parallel region (e.g. gate and up,
    /// or q, k and v): `outs[i][t * ws[i].rows + r]`.
    pub fn matmul_many(
        &self,
        pool: &Pool,
        ws: &[&MatRef],
        acts: &Acts,
        outs: &mut [&mut [f32]],
    ) -> Result<(), KernelError> {
        if ws.len() != outs.len() {
            return Err(KernelError::Shape(format!("{} matrices but {} outputs", ws.len(), outs.len())));
        }
        let mut jobs = Vec::with_capacity(ws.len());
        let mut offsets = Vec::with_capacity(ws.len() + 1);
        let mut total = 0;
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            let kernel = self.row_kernel(w, acts)?;
            if out.len() < acts.rows() * w.rows {
                return Err(KernelError::Size {
                    ty: GgmlType::F32,
                    elements: acts.rows() * w.rows,
                    bytes: out.len() * 4,
                });
            }
            jobs.push((kernel, OutPtr::new(out, w.rows)));
            offsets.push(total);
            total += w.rows.div_ceil(chunk_rows(self.table, w, acts, pool.n_threads()));
        }
        if let Some(units) = ws.iter().map(|w| shrinking_unit(self.table, w, acts)).collect::<Option<Vec<_>>>() {
            let spaces: Vec<(usize, usize)> = ws.iter().zip(units).map(|(w, u)| (w.rows, u)).collect();
            pool.for_shrinking(&spaces, &|_, i, rows| jobs[i].0.run(ws[i], rows, acts, jobs[i].1));
            return Ok(());
        }
        pool.for_chunks(total, 1, &|_, chunks| {
            for c in chunks {
                let i = offsets.partition_point(|&o| o <= c) - 1;
                let size = chunk_rows(self.table, ws[i], acts, pool.n_threads());
                let start = (c - offsets[i]) * size;
                let rows = start..(start + size).min(ws[i].rows);
                jobs[i].0.run(ws[i], rows, acts, jobs[i].1);
            }
        });
        Ok(())
    }

    /// The gated MLP's two products and its activation, `silu(gate_r · x_t) · (up_r · x_t)`,
    /// in one parallel region, delivered as the activations of the next product (with weights
    /// of `next`: the down projection). A thread computes a run of rows of both products for
    /// every token into its own buffers, applies the activation and quantizes its values, whole
    /// activation blocks at a time: neither product nor their f32 result is ever held whole
    /// (for a batch of prompt tokens they would be the largest buffers of the forward pass).
    /// `out` is bit for bit what the two products, [`Kernels::silu_mul`] and
    /// [`Kernels::quantize_acts_for`] make.
    pub fn matmul_glu_acts(
        &self,
        pool: &Pool,
        gate: &MatRef,
        up: &MatRef,
        acts: &Acts,
        next: &[GgmlType],
        out: &mut Acts,
    ) -> Result<(), KernelError> {
        self.matmul_gated_acts(pool, Glu::Silu, gate, up, acts, next, out)
    }

    /// [`Kernels::matmul_glu_acts`] with the activation `glu`: bit for bit the two products,
    /// [`Kernels::glu`] and [`Kernels::quantize_acts_for`].
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_gated_acts(
        &self,
        pool: &Pool,
        glu: Glu,
        gate: &MatRef,
        up: &MatRef,
        acts: &Acts,
        next: &[GgmlType],
        out: &mut Acts,
    ) -> Result<(), KernelError> {
        let (kg, ku) = (self.row_kernel(gate, acts)?, self.row_kernel(up, acts)?);
        let (rows, n) = (gate.rows, acts.rows());
        if up.rows != rows {
            return Err(KernelError::Size { ty: up.ty, elements: up.rows * up.cols, bytes: up.data.len() });
        }
        let format = self.format_for(next, rows, n)?;
        out.reset(format, n, rows)?;
        let rows_of = |w: &MatRef| chunk_rows(self.table, w, acts, pool.n_threads());
        let chunk = rows_of(gate).max(rows_of(up));
        // Runs of rows are whole activation blocks (and whole groups of packed weights).
        let block = format.block();
        let whole_blocks = |rows: usize| rows / gcd(rows, block) * block;
        let chunk = whole_blocks(chunk);
        let (rb, quantize, act) = (out.row_bytes(), self.table.quantize_row, self.glu_fn(glu));
        let dst = DisjointRows::new(out.bytes_mut(), rb);
        let body = |range: std::ops::Range<usize>| {
            GLU_SCRATCH.with_borrow_mut(|(g, u)| {
                let len = range.len();
                g.resize(n * len, 0.0);
                u.resize(n * len, 0.0);
                kg.run(gate, range.clone(), acts, OutPtr::for_rows(g, range.start, len));
                ku.run(up, range.clone(), acts, OutPtr::for_rows(u, range.start, len));
                act(g, u);
                let (b0, b1) = (format.row_bytes(range.start), format.row_bytes(range.end));
                for t in 0..n {
                    // SAFETY: `range` starts and ends on activation blocks, so bytes `b0..b1` of
                    // token t's row hold exactly its values there, and only this call has them.
                    let row = unsafe { dst.row_part(t, b0..b1) };
                    quantize(format, &g[t * len..(t + 1) * len], row);
                }
            });
        };
        let unit = shrinking_unit(self.table, gate, acts)
            .zip(shrinking_unit(self.table, up, acts))
            .map(|(a, b)| whole_blocks(a.max(b)));
        match unit {
            Some(unit) => pool.for_shrinking(&[(rows, unit)], &|_, _, range| body(range)),
            None => pool.for_chunks(rows, chunk, &|_, range| body(range)),
        }
        (self.table.prepare)(pool, out, next);
        Ok(())
    }

    fn row_kernel(&self, w: &MatRef, acts: &Acts) -> Result<RowKernel, KernelError> {
        // The fields are public: a matrix built by hand must still be what the kernels read.
        w.check()?;
        let format = ActFormat::for_weights(w.ty)?;
        if !acts.format().serves(format) || acts.cols() != w.cols {
            return Err(KernelError::Mismatch {
                weights: w.ty,
                cols: w.cols,
                acts: format!("{:?} × {}", acts.format(), acts.cols()),
            });
        }
        (self.table.row_kernel)(w.ty).ok_or(KernelError::Unsupported { ty: w.ty, what: "matrix products" })
    }

    /// Repack `w` for this tier's kernels, if it has packed kernels for the type. The result is
    /// attached with [`MatRef::with_packed`]; it holds the same weights, so the original bytes
    /// can then be dropped from memory.
    pub fn pack(&self, pool: &Pool, w: &MatRef) -> Option<PackedMat> {
        Some(self.packer(w)?.pack(w, pool))
    }

    /// How this tier repacks `w`, if it has packed kernels for its type (and `w` is whole).
    pub fn packer(&self, w: &MatRef) -> Option<Packer> {
        w.check().ok()?;
        (self.table.pack)(w.ty)
    }

    /// Repack every matrix of `mats` that this tier has packed kernels for, as [`Kernels::pack`]
    /// does, but all into one [`Arena`] (huge pages, one allocation for a whole model), one
    /// matrix after another with the pool's threads sharing each. `done(i)` is called once
    /// matrix `i` is packed (e.g. to let its file pages go).
    ///
    /// With `cache` (a file path, and a `source` string naming the weights' origin, e.g. the
    /// model file with its size and modification time), a cache file written by an earlier load
    /// of the same weights on the same tier is mapped instead, and nothing is repacked; on a
    /// miss the weights are repacked and the file is written for the next load (a failure to
    /// write it is returned beside the result, which stands without it).
    pub fn pack_all(
        &self,
        pool: &Pool,
        mats: &[MatRef],
        done: &mut dyn FnMut(usize),
        cache: Option<(&Path, &str)>,
    ) -> (Vec<Option<PackedMat>>, Option<std::io::Error>) {
        let packers: Vec<Option<Packer>> = mats.iter().map(|w| self.packer(w)).collect();
        // Each matrix starts on a 64-byte boundary (rows of 16-row groups need not end on one).
        let mut ranges = Vec::with_capacity(mats.len());
        let mut len = 0;
        for (w, p) in mats.iter().zip(&packers) {
            ranges.push(p.map(|p| {
                let start = len;
                len = (start + p.packed_len(w)).next_multiple_of(64);
                start..start + p.packed_len(w)
            }));
        }
        if len == 0 {
            return (mats.iter().map(|_| None).collect(), None);
        }
        let cache = cache.map(|(path, source)| (path, Header::new(self.tier, source, mats, &ranges, len)));
        let mut failed = None;
        let store = match cache.as_ref().and_then(|(path, header)| pack_cache::open(path, header, len)) {
            Some(map) => PackedStore::File(map),
            None => {
                let mut arena = Arena::zeroed(len);
                let bytes = arena.bytes_mut();
                for (i, ((w, p), r)) in mats.iter().zip(&packers).zip(&ranges).enumerate() {
                    if let (Some(p), Some(r)) = (p, r) {
                        p.pack_into(w, pool, &mut bytes[r.clone()]);
                        done(i);
                    }
                }
                if let Some((path, header)) = &cache {
                    failed = pack_cache::save(path, header, arena.bytes()).err();
                }
                PackedStore::Arena(arena)
            }
        };
        let store = std::sync::Arc::new(store);
        let packed =
            mats.iter().zip(packers).zip(ranges).map(|((w, p), r)| Some(p?.packed(w, store.clone(), r?))).collect();
        (packed, failed)
    }

    // Shapes are checked here, once for every tier: the SIMD tiers load and store whole
    // vectors up to the length of one slice and trust the others to be as long.

    /// `out = x / sqrt(mean(x²) + eps) * w` (`x`, `w` and `out` of the same length).
    pub fn rms_norm(&self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        assert!(w.len() == x.len() && out.len() == x.len(), "rms_norm: lengths differ");
        (self.table.rms_norm)(x, w, eps, out)
    }

    pub fn softmax(&self, x: &mut [f32]) {
        (self.table.softmax)(x)
    }

    /// `gate[i] = silu(gate[i]) * up[i]` (`gate` and `up` of the same length).
    pub fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len(), "silu_mul: lengths differ");
        (self.table.silu_mul)(gate, up)
    }

    /// `gate[i] = gelu(gate[i]) * up[i]` (`gate` and `up` of the same length), GELU's tanh form
    /// as ggml's CPU backend computes it (by a table of f16 values).
    pub fn gelu_mul(&self, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len(), "gelu_mul: lengths differ");
        (self.table.gelu_mul)(gate, up)
    }

    /// `gate[i] = glu(gate[i]) * up[i]` (`gate` and `up` of the same length).
    pub fn glu(&self, glu: Glu, gate: &mut [f32], up: &[f32]) {
        assert_eq!(gate.len(), up.len(), "glu: lengths differ");
        (self.glu_fn(glu))(gate, up)
    }

    fn glu_fn(&self, glu: Glu) -> fn(&mut [f32], &[f32]) {
        match glu {
            Glu::Silu => self.table.silu_mul,
            Glu::GeluTanh => self.table.gelu_mul,
        }
    }

    /// `a · b` (of the same length).
    pub fn dot_f32(&self, a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len(), "dot_f32: lengths differ");
        (self.table.dot_f32)(a, b)
    }

    /// Widen IEEE halves to f32 (`src` and `dst` of the same length).
    pub fn f16_to_f32(&self, src: &[u16], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len(), "f16_to_f32: lengths differ");
        (self.table.f16_to_f32)(src, dst)
    }

    /// Narrow f32 to IEEE halves, rounding to nearest even (`src` and `dst` of the same length).
    pub fn f32_to_f16(&self, src: &[f32], dst: &mut [u16]) {
        assert_eq!(src.len(), dst.len(), "f32_to_f16: lengths differ");
        (self.table.f32_to_f16)(src, dst)
    }

    /// Round every value to the nearest IEEE half (the values stay f32).
    pub fn round_f16(&self, x: &mut [f32]) {
        (self.table.round_f16)(x)
    }

    /// `out[i·ldo + j] = a_i · b_j` for the rows of `k` values of `a` (m rows) and `b` (n rows):
    /// attention scores of a block of queries against a block of keys.
    pub fn gemm_nt(&self, a: &[f32], b: &[f32], k: usize, out: &mut [f32], ldo: usize) {
        let (m, n) = (a.len() / k.max(1), b.len() / k.max(1));
        assert!(k > 0 && a.len() == m * k && b.len() == n * k, "gemm_nt: rows are not whole");
        assert!(m == 0 || (n <= ldo && (m - 1) * ldo + n <= out.len()), "gemm_nt: output too small");
        (self.table.gemm_nt)(a, b, k, out, ldo)
    }

    /// `out_i += Σ_j a[i·lda + j] · b_j` for the rows `b_j` of `n` values and the rows of `out`:
    /// attention-weighted values of a block of keys.
    pub fn gemm_nn_acc(&self, a: &[f32], lda: usize, b: &[f32], n: usize, out: &mut [f32]) {
        let (m, kk) = (out.len() / n.max(1), b.len() / n.max(1));
        assert!(n > 0 && out.len() == m * n && b.len() == kk * n, "gemm_nn_acc: rows are not whole");
        assert!(m == 0 || (kk <= lda && (m - 1) * lda + kk <= a.len()), "gemm_nn_acc: weights too small");
        (self.table.gemm_nn_acc)(a, lda, b, n, out)
    }

    /// [`Kernels::gemm_nt`] over rows of `b` in runs (the blocks of a paged cache, f32 or IEEE
    /// halves) read where they lie: exactly the values of gathering and widening them first,
    /// without writing them anywhere (attention with few queries is otherwise mostly that).
    pub fn gemm_nt_pages(&self, a: &[f32], b: Pages, k: usize, out: &mut [f32], ldo: usize) {
        let (m, n) = (a.len() / k.max(1), b.len() / k.max(1));
        assert!(k > 0 && a.len() == m * k && b.runs_whole(k), "gemm_nt: rows are not whole");
        assert!(m == 0 || (n <= ldo && (m - 1) * ldo + n <= out.len()), "gemm_nt: output too small");
        if let Some(f) = self.table.gemm_nt_pages {
            return f(a, b, k, out, ldo);
        }
        let mut j = 0;
        self.each_run(b, |run| {
            (self.table.gemm_nt)(a, run, k, &mut out[j..], ldo);
            j += run.len() / k;
        });
    }

    /// [`Kernels::gemm_nn_acc`] over rows of `b` in runs (see [`Kernels::gemm_nt_pages`]). Over
    /// Q8_0 rows the AVX-512 tiers fold each block's scale into the weight instead of widening
    /// the values first: `fma(w · d, q, acc)` for `fma(w, q · d, acc)`, one more rounding per
    /// term, for a third fewer vector operations (a q8_0 cache's `P·V` is bound by them).
    pub fn gemm_nn_acc_pages(&self, a: &[f32], lda: usize, b: Pages, n: usize, out: &mut [f32]) {
        let (m, kk) = (out.len() / n.max(1), b.len() / n.max(1));
        assert!(n > 0 && out.len() == m * n && b.runs_whole(n), "gemm_nn_acc: rows are not whole");
        assert!(m == 0 || (kk <= lda && (m - 1) * lda + kk <= a.len()), "gemm_nn_acc: weights too small");
        if let Some(f) = self.table.gemm_nn_acc_pages {
            return f(a, lda, b, n, out);
        }
        let mut j = 0;
        self.each_run(b, |run| {
            (self.table.gemm_nn_acc)(&a[j..], lda, run, n, out);
            j += run.len() / n;
        });
    }

    /// Round rows of `k` values (`x`) to Q8_0 blocks as the products' activations are rounded:
    /// the queries of [`Kernels::scores_q8_0`].
    pub fn quantize_q8_0(&self, x: &[f32], out: &mut [u8]) {
        assert!(
            x.len().is_multiple_of(32) && out.len() == ActFormat::Q8_0.row_bytes(x.len()),
            "quantize_q8_0: {} values into {} bytes",
            x.len(),
            out.len()
        );
        (self.table.quantize_row)(ActFormat::Q8_0, x, out)
    }

    /// Attention scores against a Q8_0 key cache: `out[i·ldo + j]` is the dot of query row i of
    /// `q` and key row j of `keys` (the rows of all runs in order), both rows of `k` values in
    /// Q8_0 blocks, as llama.cpp takes it for such a cache: per block the exact integer dot
    /// times the product of the two scales. Queries are rounded by [`Kernels::quantize_q8_0`].
    pub fn scores_q8_0(&self, q: &[u8], keys: &[&[u8]], k: usize, out: &mut [f32], ldo: usize) {
        assert!(k > 0 && k.is_multiple_of(32), "scores_q8_0: rows of {k} values are not whole blocks");
        assert!(k <= MAX_HEAD, "scores_q8_0: rows of {k} values are wider than a head ({MAX_HEAD} at most)");
        let row = ActFormat::Q8_0.row_bytes(k);
        let (m, n) = (q.len() / row, keys.iter().map(|r| r.len() / row).sum::<usize>());
        assert!(
            q.len() == m * row && keys.iter().all(|r| r.len().is_multiple_of(row)),
            "scores_q8_0: rows are not whole"
        );
        assert!(m == 0 || (n <= ldo && (m - 1) * ldo + n <= out.len()), "scores_q8_0: output too small");
        (self.table.scores_q8_0)(q, keys, k, out, ldo)
    }

    /// Each run of `b` as f32 (halves widened into a per-thread buffer).
    fn each_run(&self, b: Pages, mut f: impl FnMut(&[f32])) {
        match b {
            Pages::F32(runs) => runs.iter().for_each(|r| f(r)),
            Pages::F16(runs) => WIDENED.with_borrow_mut(|w| {
                for r in runs {
                    w.resize(r.len(), 0.0);
                    (self.table.f16_to_f32)(r, w);
                    f(w);
                }
            }),
            Pages::Q8_0(runs) => WIDENED.with_borrow_mut(|w| {
                for r in runs {
                    w.resize(r.len() / 34 * 32, 0.0);
                    crate::formats::dequantize(GgmlType::Q8_0, r, w).expect("whole Q8_0 blocks");
                    f(w);
                }
            }),
        }
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

thread_local! {
    /// Per thread: rows widened from halves for a tier without products that read halves.
    static WIDENED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Per thread: the gate and up products of the rows it computes (see `matmul_glu_acts`).
    static GLU_SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

fn table_for(tier: KernelTier) -> &'static Table {
    match tier {
        KernelTier::Scalar => &crate::scalar::TABLE,
        #[cfg(target_arch = "x86_64")]
        KernelTier::Avx2 => &crate::x86::avx2::TABLE,
        #[cfg(target_arch = "x86_64")]
        KernelTier::Avx512 if crate::x86::is_intel() => &crate::x86::avx512::TABLE_INTEL,
        #[cfg(target_arch = "x86_64")]
        KernelTier::Avx512 => &crate::x86::avx512::TABLE,
        #[cfg(target_arch = "x86_64")]
        KernelTier::Amx => &crate::x86::amx::TABLE,
        #[cfg(target_arch = "aarch64")]
        KernelTier::Neon => &crate::aarch64::neon::TABLE,
        // Not compiled for this architecture: `is_available` already refused it.
        #[allow(unreachable_patterns)]
        _ => &crate::scalar::TABLE,
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The AVX-512 tier's Intel table differs from the AMD one only in how far ahead its kernels
    /// ask for the weights: both must give the same bits, whichever CPU runs the tests.
    #[test]
    #[cfg_attr(miri, ignore = "SIMD code: Miri interprets no vector intrinsics")]
    fn avx512_tables_for_intel_and_amd_agree() {
        if !KernelTier::Avx512.is_available() {
            return;
        }
        let with = |table| Kernels { tier: KernelTier::Avx512, table, batch_rounding: BatchRounding::default() };
        let (amd, intel) = (with(&crate::x86::avx512::TABLE), with(&crate::x86::avx512::TABLE_INTEL));
        let pool = Pool::new(2);
        let (rows, cols) = (80, 384);
        let mut rng = crate::test_rng::Lcg(1);
        let mut next = move || rng.centered();
        for ty in [GgmlType::Q1_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let x: Vec<f32> = (0..rows * cols).map(|_| next()).collect();
            let mut data = vec![0u8; rows * ty.bytes_for(cols as u64).unwrap() as usize];
            crate::formats::quantize(ty, &x, &mut data).unwrap();
            let w = MatRef::new(ty, rows, cols, &data).unwrap();
            let packed = amd.pack(&pool, &w);
            assert!(packed.is_some(), "{ty}: the kernels that differ read packed weights");
            let w = w.with_packed(packed.as_ref());
            for tokens in [1, 2, 8, 17] {
                let x: Vec<f32> = (0..tokens * cols).map(|_| next() * 4.0).collect();
                let mut acts = Acts::new();
                amd.quantize_acts_for(&pool, &[ty], &x, cols, &mut acts).unwrap();
                let (mut a, mut b) = (vec![0f32; tokens * rows], vec![1f32; tokens * rows]);
                amd.matmul(&pool, &w, &acts, &mut a).unwrap();
                intel.matmul(&pool, &w, &acts, &mut b).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "{ty}, {tokens} tokens");
            }
        }
    }
}
