//! Ternary and 2-bit formats: TQ1_0 (base-3, 1.6875 bpw), TQ2_0 (2-bit codes, 2.0625 bpw) and
//! Q2_0 (64 weights, codes {-1, 0, +1, +2} times an f16 scale).
//!
//! TQ1_0 packs five trits per byte as a fixed-point fraction: byte = ceil(t * 256 / 243) for the
//! base-3 number t, so trit k is recovered as `((byte * 3^k) mod 256) * 3 >> 8`. The first 32
//! bytes hold weights 0..160 (weight m + 32n in trit n of byte m), the next 16 bytes weights
//! 160..240 (m + 16n), and `qh`'s 4 bytes the last 16 (four trits each).

use bytemuck::{Pod, Zeroable};
use onebit_gguf::GgmlType;

use super::{Block, QK_K, half, to_half};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockTQ1_0 {
    pub qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
    pub qh: [u8; QK_K / 64],
    pub d: [u8; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockTQ2_0 {
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
}

pub const QK2_0: usize = 64;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ2_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK2_0 / 4],
}

impl Block for BlockTQ1_0 {
    const TYPE: GgmlType = GgmlType::TQ1_0;
    const QK: usize = QK_K;
}

impl Block for BlockTQ2_0 {
    const TYPE: GgmlType = GgmlType::TQ2_0;
    const QK: usize = QK_K;
}

impl Block for BlockQ2_0 {
    const TYPE: GgmlType = GgmlType::Q2_0;
    const QK: usize = QK2_0;
}

const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];

/// Trit `n` (0, 1 or 2) of a TQ1_0 byte.
#[inline(always)]
pub fn tq1_trit(byte: u8, n: usize) -> i32 {
    let q = byte.wrapping_mul(POW3[n]);
    ((q as u16 * 3) >> 8) as i32
}

/// The 256 trits of a TQ1_0 block in weight order, each in {0, 1, 2}.
pub fn tq1_trits(b: &BlockTQ1_0) -> [i8; QK_K] {
    let mut t = [0i8; QK_K];
    let mut k = 0;
    for (base, width) in [(0usize, 32usize), (32, 16)] {
        for n in 0..5 {
            for m in 0..width {
                t[k] = tq1_trit(b.qs[base + m], n) as i8;
                k += 1;
            }
        }
    }
    for n in 0..4 {
        for j in 0..QK_K / 64 {
            t[k] = tq1_trit(b.qh[j], n) as i8;
            k += 1;
        }
    }
    t
}

pub fn dequantize_tq1_0(x: &[BlockTQ1_0], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = half(b.d);
        for (o, t) in out.iter_mut().zip(tq1_trits(b)) {
            *o = (t as i32 - 1) as f32 * d;
        }
    }
}

pub fn dequantize_tq2_0(x: &[BlockTQ2_0], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = half(b.d);
        for (j, chunk) in b.qs.chunks_exact(32).enumerate() {
            for l in 0..4 {
                for (m, &q) in chunk.iter().enumerate() {
                    out[j * 128 + l * 32 + m] = (((q >> (2 * l)) & 3) as i32 - 1) as f32 * d;
                }
            }
        }
    }
}

pub fn dequantize_q2_0(x: &[BlockQ2_0], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK2_0)) {
        let d = half(b.d);
        for (j, o) in out.iter_mut().enumerate() {
            let q = (b.qs[j / 4] >> ((j % 4) * 2)) & 3;
            *o = (q as i32 - 1) as f32 * d;
        }
    }
}

fn absmax(xs: &[f32]) -> f32 {
    xs.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Trit code (0, 1, 2) of a weight scaled by 1/d: C's `lroundf(x * id) + 1`.
#[inline(always)]
fn trit(x: f32, id: f32) -> u8 {
    ((x * id).round() as i32 + 1) as u8
}

/// Encode a base-3 number (up to 5 trits) as the byte ceil(t * 256 / 243).
#[inline(always)]
fn pack_trits(t: u8) -> u8 {
    (t as u16 * 256).div_ceil(243) as u8
}

pub fn quantize_tq1_0(x: &[f32], y: &mut [BlockTQ1_0]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let d = absmax(xs);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = to_half(d);
        let mut at = 0;
        for (base, width) in [(0usize, 32usize), (32, 16)] {
            for m in 0..width {
                let t = (0..5).fold(0u8, |q, n| q.wrapping_mul(3).wrapping_add(trit(xs[at + m + n * width], id)));
                b.qs[base + m] = pack_trits(t);
            }
            at += 5 * width;
        }
        for j in 0..QK_K / 64 {
            let t = (0..4).fold(0u8, |q, m| q.wrapping_mul(3).wrapping_add(trit(xs[at + j + m * 4], id)));
            b.qh[j] = pack_trits(t.wrapping_mul(3));
        }
    }
}

pub fn quantize_tq2_0(x: &[f32], y: &mut [BlockTQ2_0]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let d = absmax(xs);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = to_half(d);
        for (j, chunk) in b.qs.chunks_exact_mut(32).enumerate() {
            for (m, q) in chunk.iter_mut().enumerate() {
                *q = (0..4).fold(0u8, |acc, n| acc + ((trit(xs[j * 128 + m + n * 32], id) & 3) << (2 * n)));
            }
        }
    }
}

/// Q2_0: scale = absmax, codes round(x / d) clamped to [-1, 2], stored plus one.
pub fn quantize_q2_0(x: &[f32], y: &mut [BlockQ2_0]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK2_0)) {
        let amax = xs.iter().fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
        let id = if amax > 0.0 { 1.0 / amax } else { 0.0 };
        b.d = to_half(amax);
        b.qs = [0; QK2_0 / 4];
        for (j, &v) in xs.iter().enumerate() {
            let q = ((v * id).round() as i32 + 1).clamp(0, 3) as u8;
            b.qs[j / 4] |= q << ((j % 4) * 2);
        }
    }
}
