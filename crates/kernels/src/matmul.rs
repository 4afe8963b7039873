//! Matrix products `out[t][r] = Σ_k W[r][k] · X[t][k]` over quantized weights, split across
//! the pool by output rows.
//!
//! A tier provides, per weight type, either a plain dot product (the driver loops it over rows
//! and tokens) or a tiled kernel that computes a block of rows for all tokens at once and can
//! reuse unpacked weights across tokens. Weights are read where they lie (in the memory map).

use std::ops::Range;

use onebit_gguf::{GgmlType, Tensor};

use crate::KernelError;
use crate::act::Acts;
use crate::disjoint::DisjointRows;
use crate::pack::PackedMat;
use crate::scalar::dot::DotFn;

/// A weight matrix: `rows` rows of `cols` weights, each row whole blocks of `ty`, and
/// optionally the same matrix repacked for the tier's kernels (see [`crate::pack`]).
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    pub packed: Option<&'a PackedMat>,
}

impl<'a> MatRef<'a> {
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<MatRef<'a>, KernelError> {
        let w = MatRef { ty, rows, cols, data, packed: None };
        w.check()?;
        Ok(w)
    }

    /// Whether the bytes (and the packed form, if any) hold `rows × cols` weights of `ty`:
    /// what the kernels read without checking again.
    pub(crate) fn check(&self) -> Result<(), KernelError> {
        let (ty, rows, cols) = (self.ty, self.rows, self.cols);
        let want = ty.bytes_for(cols as u64).and_then(|b| b.checked_mul(rows as u64));
        if want != Some(self.data.len() as u64) {
            return Err(KernelError::Size { ty, elements: rows.saturating_mul(cols), bytes: self.data.len() });
        }
        match self.packed {
            Some(p) if !p.holds(ty, rows, cols) => {
                Err(KernelError::Mismatch { weights: ty, cols, acts: format!("a packed matrix of {p:?}") })
            }
            _ => Ok(()),
        }
    }

    /// The same matrix with its repacked form attached.
    pub fn with_packed(self, packed: Option<&'a PackedMat>) -> MatRef<'a> {
        MatRef { packed: packed.filter(|p| p.holds(self.ty, self.rows, self.cols)), ..self }
    }

    /// A 2-D GGUF tensor: `ne[0]` is the row length.
    pub fn from_tensor(t: &Tensor<'a>) -> Result<MatRef<'a>, KernelError> {
        let (rows, cols) = t.rows_cols();
        MatRef::new(t.ggml_type(), rows as usize, cols as usize, t.data())
    }

    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Rows `range` as a matrix of their own.
    pub fn slice_rows(&self, range: Range<usize>) -> MatRef<'a> {
        let rb = self.row_bytes();
        MatRef {
            ty: self.ty,
            rows: range.len(),
            cols: self.cols,
            data: &self.data[range.start * rb..range.end * rb],
            packed: None,
        }
    }
}

/// Where a kernel writes: `out[t * stride + r - row0]`, shared by threads that own disjoint
/// rows `r` of the weights (`row0` lets a buffer hold just a run of rows starting there). Each
/// token's results are a row of the buffer ([`DisjointRows`]); a thread writes its run of
/// weight rows, i.e. a run of values, in every token's row.
#[derive(Clone, Copy)]
pub struct OutPtr<'a> {
    out: DisjointRows<'a, f32>,
    pub stride: usize,
    row0: usize,
}

impl<'a> OutPtr<'a> {
    pub fn new(out: &'a mut [f32], stride: usize) -> OutPtr<'a> {
        OutPtr { out: DisjointRows::new(out, stride), stride, row0: 0 }
    }

    /// A buffer for rows `row0 .. row0 + stride` only.
    pub fn for_rows(out: &'a mut [f32], row0: usize, stride: usize) -> OutPtr<'a> {
        OutPtr { out: DisjointRows::new(out, stride), stride, row0 }
    }

    /// Store one result.
    ///
    /// # Safety
    /// Element (t, r) must be inside the output, and no other thread may write it at the same
    /// time.
    #[inline(always)]
    pub unsafe fn write(&self, t: usize, r: usize, v: f32) {
        // SAFETY: inside the output and not shared, by the caller's contract.
        unsafe { *self.ptr_at(t, r) = v };
    }

    /// Where element (t, r) lies, for vector stores of a run of rows.
    ///
    /// # Safety
    /// Element (t, r) must be inside the output, and the caller may write only the rows it owns.
    #[inline(always)]
    pub unsafe fn ptr_at(&self, t: usize, r: usize) -> *mut f32 {
        let i = t * self.stride + r - self.row0;
        debug_assert!(i < self.out.len());
        // SAFETY: inside the output, by the caller's contract.
        unsafe { self.out.ptr_at(i) }
    }
}

/// A kernel that fills rows `rows` of the output for every token in `acts`.
pub type TiledFn = fn(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr);

/// How a tier computes products for one weight type.
#[derive(Clone, Copy)]
pub enum RowKernel {
    Dot(DotFn),
    Tiled(TiledFn),
}

impl RowKernel {
    pub(crate) fn run(self, w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr) {
        match self {
            RowKernel::Dot(dot) => {
                for r in rows {
                    let wr = w.row(r);
                    for t in 0..acts.rows() {
                        // SAFETY: this call owns rows `rows` of the output, and (t, r) is inside it:
                        // r < w.rows, t < acts.rows(), and the driver checked the output holds both.
                        unsafe { out.write(t, r, dot(wr, acts.row(t), w.cols)) };
                    }
                }
            }
            RowKernel::Tiled(f) => f(w, rows, acts, out),
        }
    }
}
