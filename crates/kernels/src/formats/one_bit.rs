//! Q1_0: 128 weights as an f16 scale `d` and 128 sign bits (set = +d, clear = -d), bit `j % 8`
//! of byte `j / 8`. The 1-bit format of PrismML's Bonsai models.

use bytemuck::{Pod, Zeroable};
use onebit_gguf::GgmlType;

use super::{Block, half, to_half};

pub const QK1_0: usize = 128;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ1_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK1_0 / 8],
}

impl Block for BlockQ1_0 {
    const TYPE: GgmlType = GgmlType::Q1_0;
    const QK: usize = QK1_0;
}

pub fn dequantize_q1_0(x: &[BlockQ1_0], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK1_0)) {
        let d = half(b.d);
        for (j, o) in out.iter_mut().enumerate() {
            *o = if (b.qs[j / 8] >> (j % 8)) & 1 != 0 { d } else { -d };
        }
    }
}

/// The scale is the mean absolute value; a weight's bit is its sign (zero counts as positive).
pub fn quantize_q1_0(x: &[f32], y: &mut [BlockQ1_0]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK1_0)) {
        let sum_abs = xs.iter().fold(0.0f32, |s, v| s + v.abs());
        b.d = to_half(sum_abs / QK1_0 as f32);
        // A byte at a time from its eight weights (this form vectorises; bit-by-bit did not).
        for (q, group) in b.qs.iter_mut().zip(xs.chunks_exact(8)) {
            *q = group.iter().enumerate().fold(0u8, |acc, (i, &v)| acc | (((v >= 0.0) as u8) << i));
        }
    }
}
