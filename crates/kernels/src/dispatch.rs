//! The single dispatch point: a [`Kernels`] value picks one tier's function table at load
//! time, and every caller goes through it. No `cfg` or feature checks outside this crate.

use onebit_gguf::GgmlType;

use crate::KernelError;
use crate::act::{ActFormat, Acts};
use crate::matmul::{MatRef, OutPtr, RowKernel};
use crate::pack::PackedMat;
use crate::pool::Pool;
use crate::tier::KernelTier;

/// One tier's entry points. A tier that does not specialise an operation uses the scalar one.
pub(crate) struct Table {
    pub row_kernel: fn(GgmlType) -> Option<RowKernel>,
    pub quantize_row: fn(ActFormat, &[f32], &mut [u8]),
    /// Build the tier's private layout of freshly quantized activations (or nothing), for
    /// products with weights of the given type.
    pub prepare: fn(&Pool, &mut Acts, GgmlType),
    /// Repack a matrix for this tier's kernels, where it has a packed kernel for the type.
    pub pack: fn(&MatRef, &Pool) -> Option<PackedMat>,
    pub rms_norm: fn(&[f32], &[f32], f32, &mut [f32]),
    pub softmax: fn(&mut [f32]),
    pub silu_mul: fn(&mut [f32], &[f32]),
    pub dot_f32: fn(&[f32], &[f32]) -> f32,
    pub dot_f16: fn(&[f32], &[u16]) -> f32,
    pub axpy_f32: fn(f32, &[f32], &mut [f32]),
    pub axpy_f16: fn(f32, &[u16], &mut [f32]),
}

/// The kernels of one tier.
#[derive(Clone, Copy)]
pub struct Kernels {
    tier: KernelTier,
    table: &'static Table,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernels({})", self.tier)
    }
}

/// Rows of output per unit of work handed to a thread (packed matrices: their row group).
const ROW_CHUNK: usize = 16;

fn chunk_rows(w: &MatRef) -> usize {
    if w.packed.is_some() { crate::pack::GROUP } else { ROW_CHUNK }
}

impl Kernels {
    /// The kernels of `tier`, if this build and CPU can run it.
    pub fn new(tier: KernelTier) -> Result<Kernels, KernelError> {
        if !tier.is_available() {
            return Err(KernelError::TierUnavailable { tier, available: KernelTier::available() });
        }
        Ok(Kernels { tier, table: table_for(tier) })
    }

    /// The best tier of this machine.
    pub fn best() -> Kernels {
        Kernels::new(KernelTier::best()).unwrap_or(Kernels { tier: KernelTier::Scalar, table: &crate::scalar::TABLE })
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
        let format = ActFormat::for_weights(w_ty)?;
        let rows = x.len() / cols.max(1);
        acts.reset(format, rows, cols)?;
        let quantize = self.table.quantize_row;
        if rows < 4 {
            for t in 0..rows {
                quantize(format, &x[t * cols..(t + 1) * cols], acts.row_mut(t));
            }
            (self.table.prepare)(pool, acts, w_ty);
            return Ok(());
        }
        let rb = acts.row_bytes();
        let out = SharedBytes(acts.bytes_mut().as_mut_ptr());
        pool.for_chunks(rows, 4, &|_, range| {
            for t in range {
                // SAFETY: each row index is handed to exactly one thread.
                let row = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(t * rb), rb) };
                quantize(format, &x[t * cols..(t + 1) * cols], row);
            }
        });
        (self.table.prepare)(pool, acts, w_ty);
        Ok(())
    }

    /// `out[t * w.rows + r] = W[r] · X[t]` for every token `t` of `acts`.
    pub fn matmul(&self, pool: &Pool, w: &MatRef, acts: &Acts, out: &mut [f32]) -> Result<(), KernelError> {
        let kernel = self.row_kernel(w, acts)?;
        if out.len() < acts.rows() * w.rows {
            return Err(KernelError::Size { ty: GgmlType::F32, elements: acts.rows() * w.rows, bytes: out.len() * 4 });
        }
        let ptr = OutPtr::new(out, w.rows);
        pool.for_chunks(w.rows, chunk_rows(w), &|_, rows| kernel.run(w, rows, acts, ptr));
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
            total += w.rows.div_ceil(chunk_rows(w));
        }
        pool.for_chunks(total, 1, &|_, chunks| {
            for c in chunks {
                let i = offsets.partition_point(|&o| o <= c) - 1;
                let size = chunk_rows(ws[i]);
                let start = (c - offsets[i]) * size;
                let rows = start..(start + size).min(ws[i].rows);
                jobs[i].0.run(ws[i], rows, acts, jobs[i].1);
            }
        });
        Ok(())
    }

    fn row_kernel(&self, w: &MatRef, acts: &Acts) -> Result<RowKernel, KernelError> {
        let format = ActFormat::for_weights(w.ty)?;
        if acts.format() != format || acts.cols() != w.cols {
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
        (self.table.pack)(w, pool)
    }

    pub fn rms_norm(&self, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        (self.table.rms_norm)(x, w, eps, out)
    }

    pub fn softmax(&self, x: &mut [f32]) {
        (self.table.softmax)(x)
    }

    pub fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        (self.table.silu_mul)(gate, up)
    }

    pub fn dot_f32(&self, a: &[f32], b: &[f32]) -> f32 {
        (self.table.dot_f32)(a, b)
    }

    pub fn dot_f16(&self, a: &[f32], b: &[u16]) -> f32 {
        (self.table.dot_f16)(a, b)
    }

    pub fn axpy_f32(&self, alpha: f32, x: &[f32], y: &mut [f32]) {
        (self.table.axpy_f32)(alpha, x, y)
    }

    pub fn axpy_f16(&self, alpha: f32, x: &[u16], y: &mut [f32]) {
        (self.table.axpy_f16)(alpha, x, y)
    }
}

struct SharedBytes(*mut u8);
// SAFETY: used only to hand disjoint rows of one buffer to different threads.
unsafe impl Sync for SharedBytes {}

impl SharedBytes {
    fn ptr(&self) -> *mut u8 {
        self.0
    }
}

fn table_for(tier: KernelTier) -> &'static Table {
    match tier {
        KernelTier::Scalar => &crate::scalar::TABLE,
        #[cfg(target_arch = "x86_64")]
        KernelTier::Avx2 => &crate::x86::avx2::TABLE,
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
