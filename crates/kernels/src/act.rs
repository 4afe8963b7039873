//! Activations prepared for a matrix product: f32 rows quantized once into the format the
//! weight type's dot product consumes (the same choices llama.cpp makes), then shared by every
//! thread.

use onebit_gguf::GgmlType;

use crate::KernelError;
use crate::formats::{self, QK_K};

/// The format activations take for a product with weights of some type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActFormat {
    /// Plain f32 (for F32/F16/BF16 weights).
    F32,
    /// 32-element blocks, f16 scale (for Q1_0, Q2_0, Q4_0, Q5_0, Q8_0 weights).
    Q8_0,
    /// Q8_0 plus the block sum (for Q4_1, Q5_1 weights).
    Q8_1,
    /// 256-element blocks, f32 scale, 16-element sums (for K-quants and TQ1_0/TQ2_0).
    Q8K,
    /// Q8_0 blocks in which each run of four (128 values) shares one scale, max|x|/127 over
    /// the 128. Every Q8_0 kernel reads it as Q8_0; a tier that knows the scales are shared
    /// can sum 128 products before scaling (AMX tiles: Q1_0 prefill). The rounding is coarser
    /// than llama.cpp's Q8_0, so it is used only where a tier asks for it and the caller allows.
    Q8_0x4,
}

impl ActFormat {
    /// llama.cpp's `vec_dot_type` for weights of type `w`.
    pub fn for_weights(w: GgmlType) -> Result<ActFormat, KernelError> {
        use GgmlType::*;
        Ok(match w {
            F32 | F16 | BF16 => ActFormat::F32,
            Q1_0 | Q2_0 | Q4_0 | Q5_0 | Q8_0 => ActFormat::Q8_0,
            Q4_1 | Q5_1 => ActFormat::Q8_1,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | TQ1_0 | TQ2_0 => ActFormat::Q8K,
            other => {
                return Err(KernelError::Unsupported { ty: other, what: "matrix products" });
            }
        })
    }

    pub fn ggml_type(self) -> GgmlType {
        match self {
            ActFormat::F32 => GgmlType::F32,
            ActFormat::Q8_0 => GgmlType::Q8_0,
            ActFormat::Q8_1 => GgmlType::Q8_1,
            ActFormat::Q8K => GgmlType::Q8_K,
            ActFormat::Q8_0x4 => GgmlType::Q8_0,
        }
    }

    /// Whether activations in this format can feed a product that takes `wanted` (the blocks
    /// are the same).
    pub fn serves(self, wanted: ActFormat) -> bool {
        self == wanted || (self == ActFormat::Q8_0x4 && wanted == ActFormat::Q8_0)
    }

    /// Elements per block.
    pub fn block(self) -> usize {
        match self {
            ActFormat::F32 => 1,
            ActFormat::Q8_0 | ActFormat::Q8_1 => 32,
            ActFormat::Q8K => QK_K,
            ActFormat::Q8_0x4 => 128,
        }
    }

    /// Bytes for a row of `cols` elements (`cols` a whole number of blocks).
    pub fn row_bytes(self, cols: usize) -> usize {
        self.ggml_type().bytes_for(cols as u64).map_or(0, |b| b as usize)
    }
}

/// A 64-byte aligned, growable byte buffer (so SIMD loads of whole rows are aligned).
#[derive(Default)]
pub struct AlignedBuf {
    chunks: Vec<Chunk>,
    len: usize,
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Chunk([u8; 64]);

impl AlignedBuf {
    /// Resize to `len` bytes, keeping capacity; contents are unspecified.
    pub fn resize(&mut self, len: usize) {
        let chunks = len.div_ceil(64);
        if self.chunks.len() < chunks {
            self.chunks.resize(chunks, Chunk([0; 64]));
        }
        self.len = len;
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `Chunk` is 64 plain bytes, so the vector's storage is `64 * len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.chunks.as_ptr().cast::<u8>(), self.len) }
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the view unique.
        unsafe { std::slice::from_raw_parts_mut(self.chunks.as_mut_ptr().cast::<u8>(), self.len) }
    }

    pub fn as_f32(&self) -> &[f32] {
        bytemuck::cast_slice(&self.as_bytes()[..self.len / 4 * 4])
    }

    pub fn as_f32_mut(&mut self) -> &mut [f32] {
        let n = self.len / 4 * 4;
        bytemuck::cast_slice_mut(&mut self.as_bytes_mut()[..n])
    }
}

/// Rows of activations in one [`ActFormat`], reused from product to product.
///
/// Besides the blocks every kernel understands, a tier may keep a second, private layout of
/// the same values (`aux`: e.g. all quants contiguous and the scales as f32), built once per
/// product by [`Kernels::quantize_acts`](crate::Kernels::quantize_acts).
#[derive(Default)]
pub struct Acts {
    format: Option<ActFormat>,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    buf: AlignedBuf,
    aux: AlignedBuf,
    aux_row_bytes: usize,
    /// Which values these are: a new number each time they are rewritten (see
    /// [`Acts::generation`]).
    generation: u64,
}

/// The last number handed out as an [`Acts::generation`].
static GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn next_generation() -> u64 {
    GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
}

impl Acts {
    pub fn new() -> Acts {
        Acts::default()
    }

    /// Shape the buffer for `rows` rows of `cols` elements in `format`.
    pub fn reset(&mut self, format: ActFormat, rows: usize, cols: usize) -> Result<(), KernelError> {
        if !cols.is_multiple_of(format.block()) {
            return Err(KernelError::Size { ty: format.ggml_type(), elements: cols, bytes: 0 });
        }
        self.format = Some(format);
        self.rows = rows;
        self.cols = cols;
        self.row_bytes = format.row_bytes(cols);
        self.buf.resize(rows * self.row_bytes);
        self.aux_row_bytes = 0;
        self.generation = next_generation();
        self.aux.resize(0);
        Ok(())
    }

    pub fn format(&self) -> ActFormat {
        self.format.unwrap_or(ActFormat::F32)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    pub fn row(&self, i: usize) -> &[u8] {
        &self.buf.as_bytes()[i * self.row_bytes..(i + 1) * self.row_bytes]
    }

    pub fn row_mut(&mut self, i: usize) -> &mut [u8] {
        self.generation = next_generation();
        let rb = self.row_bytes;
        &mut self.buf.as_bytes_mut()[i * rb..(i + 1) * rb]
    }

    pub fn bytes(&self) -> &[u8] {
        self.buf.as_bytes()
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.generation = next_generation();
        self.buf.as_bytes_mut()
    }

    /// The tier-private layout of row `i` (empty unless the tier built one).
    pub fn aux_row(&self, i: usize) -> &[u8] {
        &self.aux.as_bytes()[i * self.aux_row_bytes..(i + 1) * self.aux_row_bytes]
    }

    pub fn aux_bytes(&self) -> &[u8] {
        self.aux.as_bytes()
    }

    /// Shape the private layout: `rows` rows of `row_bytes` (a multiple of 64), plus `extra`
    /// bytes after them. Returns the blocks and the private buffer together.
    pub fn reset_aux(&mut self, row_bytes: usize, extra: usize) -> (&[u8], &mut [u8]) {
        self.aux_row_bytes = row_bytes;
        self.generation = next_generation();
        self.aux.resize(self.rows * row_bytes + extra);
        (self.buf.as_bytes(), self.aux.as_bytes_mut())
    }

    /// A number that differs for every set of values these rows have held, in any `Acts` of
    /// the process: a thread may keep something derived from the rows (its own copy of the
    /// lookup tables) and know it still holds by this number alone: every method that can change
    /// the rows takes a new one.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn aux_row_bytes(&self) -> usize {
        self.aux_row_bytes
    }

    /// The tier's bytes after the private rows (see [`Acts::reset_aux`]).
    pub fn aux_extra(&self) -> &[u8] {
        &self.aux.as_bytes()[self.rows * self.aux_row_bytes..]
    }
}

/// The scalar reference: quantize one row of f32 into `format`.
///
/// Activations are quantized the way llama.cpp's CPU backend does it at run time, which is not
/// quite its file-writing reference: Q8_0/Q8_1 scale by `127 / max` and round half to even
/// (the x86 and NEON paths), Q8_K uses the reference.
pub fn quantize_row_ref(format: ActFormat, x: &[f32], out: &mut [u8]) {
    match format {
        ActFormat::F32 => out.copy_from_slice(bytemuck::cast_slice(x)),
        ActFormat::Q8_0 => quantize_q8_0_act(x, formats::blocks_mut(out)),
        ActFormat::Q8_1 => quantize_q8_1_act(x, formats::blocks_mut(out)),
        ActFormat::Q8K => formats::quantize(GgmlType::Q8_K, x, out).expect("activation rows are whole blocks"),
        ActFormat::Q8_0x4 => quantize_q8_0x4_act(x, formats::blocks_mut(out)),
    }
}

/// One 32-block: the f16 scale bits and the rounded values.
#[inline(always)]
fn q8_block(xs: &[f32], qs: &mut [i8; 32]) -> f32 {
    let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    q8_block_with(xs, amax, qs)
}

/// Round `xs` with the scale `amax / 127` (returned).
#[inline(always)]
fn q8_block_with(xs: &[f32], amax: f32, qs: &mut [i8; 32]) -> f32 {
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(xs) {
        *q = (v * id).round_ties_even() as i8;
    }
    amax / 127.0
}

pub fn quantize_q8_0x4_act(x: &[f32], y: &mut [formats::BlockQ8_0]) {
    for (four, xs) in y.chunks_exact_mut(4).zip(x.chunks_exact(128)) {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (b, xs) in four.iter_mut().zip(xs.chunks_exact(32)) {
            b.d = formats::f32_to_f16(q8_block_with(xs, amax, &mut b.qs)).to_le_bytes();
        }
    }
}

pub fn quantize_q8_0_act(x: &[f32], y: &mut [formats::BlockQ8_0]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(32)) {
        let d = q8_block(xs, &mut b.qs);
        b.d = formats::f32_to_f16(d).to_le_bytes();
    }
}

pub fn quantize_q8_1_act(x: &[f32], y: &mut [formats::BlockQ8_1]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(32)) {
        let d = q8_block(xs, &mut b.qs);
        b.d = formats::f32_to_f16(d).to_le_bytes();
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        b.s = formats::f32_to_f16(d * sum as f32).to_le_bytes();
    }
}
