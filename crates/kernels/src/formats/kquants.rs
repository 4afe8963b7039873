//! K-quants: super-blocks of 256 weights with sub-block scales (Q2_K..Q6_K), and Q8_K, the
//! 8-bit activation format their dot products (and the ternary types') use.
//!
//! Layouts, per super-block:
//! - Q2_K: 16 scale bytes (low nibble scale, high nibble min), 2-bit quants, f16 `d`, `dmin`.
//! - Q3_K: high-bit mask, 2-bit quants, 12 bytes of 6-bit scales, f16 `d`.
//! - Q4_K / Q5_K: f16 `d`, `dmin`, 12 bytes of 6-bit scales and mins ([`scale_min_k4`]), quants.
//! - Q6_K: low 4 bits, high 2 bits, 16 signed 8-bit scales, f16 `d`.
//! - Q8_K: f32 `d`, 256 signed bytes, and the sums of each 16 of them.

use bytemuck::{Pod, Zeroable};
use onebit_gguf::GgmlType;

use super::{Block, half};

pub const QK_K: usize = 256;
pub const K_SCALE_SIZE: usize = 12;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; K_SCALE_SIZE],
    pub d: [u8; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: [u8; 2],
}

/// Q8_K is made by onebit itself (never read from a file), so its fields are native types.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

macro_rules! kblock {
    ($($name:ident = $ty:ident),*) => {$(
        impl Block for $name {
            const TYPE: GgmlType = GgmlType::$ty;
            const QK: usize = QK_K;
        }
    )*};
}
kblock!(BlockQ2K = Q2_K, BlockQ3K = Q3_K, BlockQ4K = Q4_K, BlockQ5K = Q5_K, BlockQ6K = Q6_K, BlockQ8K = Q8_K);

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K.
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The 16 signed 6-bit scales of a Q3_K block.
pub fn q3k_scales(packed: &[u8; K_SCALE_SIZE]) -> [i8; 16] {
    let mut s = [0i8; 16];
    for (j, out) in s.iter_mut().enumerate() {
        let low = if j < 8 { packed[j] & 0x0f } else { packed[j - 8] >> 4 };
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        *out = (low | (high << 4)) as i8 - 32;
    }
    s
}

pub fn dequantize_q2_k(x: &[BlockQ2K], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, min) = (half(b.d), half(b.dmin));
        let mut k = 0;
        let mut is = 0;
        for q in b.qs.chunks_exact(32) {
            for shift in (0..8).step_by(2) {
                for half_idx in 0..2 {
                    let sc = b.scales[is];
                    is += 1;
                    let (dl, ml) = (d * (sc & 0x0f) as f32, min * (sc >> 4) as f32);
                    for &qb in &q[16 * half_idx..16 * half_idx + 16] {
                        out[k] = dl * ((qb >> shift) & 3) as f32 - ml;
                        k += 1;
                    }
                }
            }
        }
    }
}

pub fn dequantize_q3_k(x: &[BlockQ3K], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d_all = half(b.d);
        let scales = q3k_scales(&b.scales);
        let mut k = 0;
        let mut is = 0;
        let mut m = 1u8;
        for q in b.qs.chunks_exact(32) {
            for shift in (0..8).step_by(2) {
                for half_idx in 0..2 {
                    let dl = d_all * scales[is] as f32;
                    is += 1;
                    for l in 16 * half_idx..16 * half_idx + 16 {
                        let low = ((q[l] >> shift) & 3) as i32;
                        let high = if b.hmask[l] & m != 0 { 0 } else { 4 };
                        out[k] = dl * (low - high) as f32;
                        k += 1;
                    }
                }
                m <<= 1;
            }
        }
    }
}

pub fn dequantize_q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, min) = (half(b.d), half(b.dmin));
        for (j, q) in b.qs.chunks_exact(32).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * j, &b.scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, &b.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let o = &mut out[64 * j..64 * j + 64];
            for l in 0..32 {
                o[l] = d1 * (q[l] & 0x0f) as f32 - m1;
                o[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

pub fn dequantize_q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, min) = (half(b.d), half(b.dmin));
        for (j, ql) in b.qs.chunks_exact(32).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * j, &b.scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, &b.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
            let o = &mut out[64 * j..64 * j + 64];
            for l in 0..32 {
                let h1 = if b.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if b.qh[l] & u2 != 0 { 16 } else { 0 };
                o[l] = d1 * ((ql[l] & 0x0f) + h1) as f32 - m1;
                o[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
            }
        }
    }
}

pub fn dequantize_q6_k(x: &[BlockQ6K], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = half(b.d);
        for n in 0..2 {
            let (ql, qh, sc) = (&b.ql[64 * n..], &b.qh[32 * n..], &b.scales[8 * n..]);
            let o = &mut out[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                // ggml multiplies d * scale first, then the quant, left to right.
                o[l] = d * sc[is] as f32 * q1 as f32;
                o[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
                o[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
                o[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
            }
        }
    }
}

pub fn dequantize_q8_k(x: &[BlockQ8K], y: &mut [f32]) {
    for (b, out) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = b.d * q as f32;
        }
    }
}
