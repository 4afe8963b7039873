//! Converting one tensor to another type, in slabs of rows, on every thread of a [`Pool`].
//!
//! The source rows are read from the memory-mapped input, widened to f32 a chunk at a time on
//! the thread that quantizes them (so the f32 copy never exists for a whole tensor), and
//! quantized into a slab buffer that is handed to the writer before the next slab starts.
//! Memory is therefore one slab plus, per thread, one chunk of f32, whatever the tensor's size.
//! Every format quantizes rows independently, so how rows are cut into chunks and slabs does
//! not change a byte of the result.

use onebit_gguf::GgmlType;
use onebit_kernels::Pool;
use onebit_kernels::formats::{self, dequantize};

use super::QuantizeError;

/// Bytes per slab (of input or output, whichever is larger): large enough to keep every thread busy, small enough not to matter.
const SLAB_BYTES: usize = 32 << 20;
/// Elements a thread converts at a time (llama.cpp's chunk is 16K elements as well).
const CHUNK_ELEMENTS: usize = 32 * 512;

/// A tensor to convert: its source bytes and geometry.
pub struct Source<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    pub data: &'a [u8],
    /// Elements per row (`ne[0]`).
    pub n_per_row: usize,
    /// Rows per expert (`ne[1]`): an importance matrix has one row of weights per expert.
    pub rows_per_expert: usize,
}

impl Source<'_> {
    fn rows(&self) -> usize {
        let row_bytes = self.ty.bytes_for(self.n_per_row as u64).unwrap_or(0) as usize;
        self.data.len().checked_div(row_bytes).unwrap_or(0)
    }
}

/// Convert `src` to `to`, handing the result to `sink` in order, slab by slab. `imatrix`
/// (importance per column, one row of `n_per_row` per expert) steers the quantizers that use
/// one. `done` is told how many source bytes each slab consumed (for a progress bar).
pub fn convert(
    pool: &Pool,
    src: &Source,
    to: GgmlType,
    imatrix: Option<&[f32]>,
    sink: &mut dyn FnMut(&[u8]) -> Result<(), QuantizeError>,
    done: &mut dyn FnMut(&[u8]),
) -> Result<(), QuantizeError> {
    let n = src.n_per_row;
    let src_row = src.ty.bytes_for(n as u64).ok_or_else(|| bad_shape(src, src.ty))? as usize;
    let dst_row = to.bytes_for(n as u64).ok_or_else(|| bad_shape(src, to))? as usize;
    let rows = src.rows();
    if src_row == 0 || dst_row == 0 || rows * src_row != src.data.len() {
        return Err(bad_shape(src, src.ty));
    }
    if src.ty == to {
        // Nothing to compute: the bytes go through as they are, a slab at a time (checked
        // first, as llama-quantize checks every float tensor it reads).
        if !floats_are_finite(src.ty, src.data) {
            return Err(QuantizeError::NotFinite { tensor: src.name.to_string() });
        }
        for piece in src.data.chunks(SLAB_BYTES.max(src_row) / src_row * src_row) {
            sink(piece)?;
            done(piece);
        }
        return Ok(());
    }
    // The slab bounds the input touched as well as the output held.
    let slab_rows = (SLAB_BYTES / dst_row.max(src_row)).clamp(1, rows.max(1));
    let chunk_rows = CHUNK_ELEMENTS.div_ceil(n).max(1);
    let mut out = vec![0u8; slab_rows.min(rows) * dst_row];
    let mut first = 0;
    while first < rows {
        let count = slab_rows.min(rows - first);
        let slab = &mut out[..count * dst_row];
        let mut jobs: Vec<(usize, &mut [u8])> =
            slab.chunks_mut(chunk_rows * dst_row).enumerate().map(|(i, c)| (first + i * chunk_rows, c)).collect();
        let failure = std::sync::Mutex::new(None);
        pool.for_each_mut(&mut jobs, &|_, (row0, dst)| {
            let nrows = dst.len() / dst_row;
            let input = &src.data[*row0 * src_row..(*row0 + nrows) * src_row];
            if let Err(e) = convert_rows(src, to, input, *row0, imatrix, dst) {
                failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
            }
        });
        if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        sink(slab)?;
        done(&src.data[first * src_row..(first + count) * src_row]);
        first += count;
    }
    Ok(())
}

/// Widen `input` (whole rows of `src.ty`, the first being row `row0`) to f32 and quantize it
/// into `dst`.
fn convert_rows(
    src: &Source,
    to: GgmlType,
    input: &[u8],
    row0: usize,
    imatrix: Option<&[f32]>,
    dst: &mut [u8],
) -> Result<(), QuantizeError> {
    let n = src.n_per_row;
    let nrows = dst.len() / to.bytes_for(n as u64).unwrap_or(1) as usize;
    let mut f32s = vec![0f32; nrows * n];
    let kernel = |e| QuantizeError::Kernel { tensor: src.name.to_string(), source: e };
    dequantize(src.ty, input, &mut f32s).map_err(kernel)?;
    if !f32s.iter().all(|v| v.is_finite()) {
        return Err(QuantizeError::NotFinite { tensor: src.name.to_string() });
    }
    match imatrix {
        None => formats::quantize(to, &f32s, dst).map_err(kernel)?,
        Some(weights) => {
            let dst_row = dst.len() / nrows;
            for (r, (x, y)) in f32s.chunks_exact(n).zip(dst.chunks_exact_mut(dst_row)).enumerate() {
                let expert = (row0 + r) / src.rows_per_expert.max(1);
                let w = weights.get(expert * n..(expert + 1) * n);
                formats::quantize_weighted(to, x, y, w).map_err(kernel)?;
            }
        }
    }
    Ok(())
}

fn bad_shape(src: &Source, ty: GgmlType) -> QuantizeError {
    QuantizeError::Shape { tensor: src.name.to_string(), ty, n_per_row: src.n_per_row as u64 }
}

/// Whether a float tensor holds no NaN or infinity (other types are not checked).
fn floats_are_finite(ty: GgmlType, data: &[u8]) -> bool {
    let halves = |exp: u16| data.chunks_exact(2).all(|b| u16::from_le_bytes([b[0], b[1]]) & exp != exp);
    match ty {
        GgmlType::F32 => data.chunks_exact(4).all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()),
        GgmlType::F16 => halves(0x7c00),
        GgmlType::BF16 => halves(0x7f80),
        _ => true,
    }
}
