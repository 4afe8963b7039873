//! The 32-weight "legacy" formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and Q8_1 (an activation format).
//!
//! In the 4- and 5-bit formats byte `j` holds weight `j` in its low nibble and weight `j + 16`
//! in its high nibble; the fifth bits of Q5 live in a 32-bit mask `qh`.

use bytemuck::{Pod, Zeroable};
use onebit_gguf::GgmlType;

use super::{Block, half, signed_absmax, to_half};

pub const QK: usize = 32;

macro_rules! block {
    ($name:ident, $ty:ident { $($field:ident : $fty:ty),* $(,)? }) => {
        #[repr(C)]
        #[derive(Clone, Copy, Pod, Zeroable, Debug)]
        pub struct $name { $(pub $field: $fty),* }
        impl Block for $name {
            const TYPE: GgmlType = GgmlType::$ty;
            const QK: usize = QK;
        }
    };
}

block!(BlockQ4_0, Q4_0 { d: [u8; 2], qs: [u8; QK / 2] });
block!(BlockQ4_1, Q4_1 { d: [u8; 2], m: [u8; 2], qs: [u8; QK / 2] });
block!(BlockQ5_0, Q5_0 { d: [u8; 2], qh: [u8; 4], qs: [u8; QK / 2] });
block!(BlockQ5_1, Q5_1 { d: [u8; 2], m: [u8; 2], qh: [u8; 4], qs: [u8; QK / 2] });
block!(BlockQ8_0, Q8_0 { d: [u8; 2], qs: [i8; QK] });
block!(BlockQ8_1, Q8_1 { d: [u8; 2], s: [u8; 2], qs: [i8; QK] });

pub fn dequantize_q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = half(b.d);
        for (j, &q) in b.qs.iter().enumerate() {
            out[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
            out[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

pub fn dequantize_q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let (d, m) = (half(b.d), half(b.m));
        for (j, &q) in b.qs.iter().enumerate() {
            out[j] = (q & 0x0f) as f32 * d + m;
            out[j + QK / 2] = (q >> 4) as f32 * d + m;
        }
    }
}

/// The 5-bit values of a Q5 block, before the offset/scale.
fn q5_values(qh: [u8; 4], qs: &[u8; QK / 2]) -> [i32; QK] {
    let qh = u32::from_le_bytes(qh);
    let mut v = [0i32; QK];
    for (j, &q) in qs.iter().enumerate() {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        v[j] = ((q & 0x0f) as u32 | h0) as i32;
        v[j + QK / 2] = ((q >> 4) as u32 | h1) as i32;
    }
    v
}

pub fn dequantize_q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = half(b.d);
        for (o, v) in out.iter_mut().zip(q5_values(b.qh, &b.qs)) {
            *o = (v - 16) as f32 * d;
        }
    }
}

pub fn dequantize_q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let (d, m) = (half(b.d), half(b.m));
        for (o, v) in out.iter_mut().zip(q5_values(b.qh, &b.qs)) {
            *o = v as f32 * d + m;
        }
    }
}

pub fn dequantize_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = half(b.d);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

pub fn dequantize_q8_1(x: &[BlockQ8_1], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = half(b.d);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

fn min_max(xs: &[f32]) -> (f32, f32) {
    xs.iter().fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (if v < lo { v } else { lo }, if v > hi { v } else { hi }))
}

fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

pub fn quantize_q4_0(x: &[f32], y: &mut [BlockQ4_0]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let d = signed_absmax(xs) / -8.0;
        let id = inverse(d);
        b.d = to_half(d);
        for j in 0..QK / 2 {
            let q0 = ((xs[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((xs[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

pub fn quantize_q4_1(x: &[f32], y: &mut [BlockQ4_1]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let (min, max) = min_max(xs);
        let d = (max - min) / 15.0;
        let id = inverse(d);
        b.d = to_half(d);
        b.m = to_half(min);
        for j in 0..QK / 2 {
            let q0 = (((xs[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((xs[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// Pack 32 five-bit values into nibbles and the high-bit mask.
pub(super) fn pack_q5(v: &[u8; QK]) -> ([u8; 4], [u8; QK / 2]) {
    let mut qh = 0u32;
    let mut qs = [0u8; QK / 2];
    for j in 0..QK / 2 {
        let (a, b) = (v[j], v[j + QK / 2]);
        qs[j] = (a & 0x0f) | ((b & 0x0f) << 4);
        qh |= ((a as u32 & 0x10) >> 4) << j;
        qh |= ((b as u32 & 0x10) >> 4) << (j + QK / 2);
    }
    (qh.to_le_bytes(), qs)
}

pub fn quantize_q5_0(x: &[f32], y: &mut [BlockQ5_0]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let d = signed_absmax(xs) / -16.0;
        let id = inverse(d);
        b.d = to_half(d);
        let mut v = [0u8; QK];
        for (q, &x) in v.iter_mut().zip(xs) {
            *q = ((x * id + 16.5) as i8).min(31) as u8;
        }
        (b.qh, b.qs) = pack_q5(&v);
    }
}

pub fn quantize_q5_1(x: &[f32], y: &mut [BlockQ5_1]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let (min, max) = min_max(xs);
        let d = (max - min) / 31.0;
        let id = inverse(d);
        b.d = to_half(d);
        b.m = to_half(min);
        let mut v = [0u8; QK];
        for (q, &x) in v.iter_mut().zip(xs) {
            *q = ((x - min) * id + 0.5) as u8;
        }
        (b.qh, b.qs) = pack_q5(&v);
    }
}

/// Q8_0 reference: scale = absmax / 127, each weight rounded half away from zero.
pub fn quantize_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = inverse(d);
        b.d = to_half(d);
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = (v * id).round() as i8;
        }
    }
}

/// Q8_1: Q8_0 plus `s = d * sum(q)`, which lets Q4_1/Q5_1 dots fold in their minimum.
pub fn quantize_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = inverse(d);
        b.d = to_half(d);
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        b.s = to_half(sum as f32 * d);
    }
}
