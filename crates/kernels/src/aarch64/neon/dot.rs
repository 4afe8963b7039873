//! Dot products of one weight row with one 8-bit activation row, with `sdot`. Each keeps the
//! reference's order of float operations (an exact integer sum per activation block, then the
//! scales), so results equal the scalar ones up to the sum of the final products.

use std::arch::aarch64::*;

use onebit_gguf::GgmlType;

use super::sdot;
use crate::formats::*;
use crate::scalar::dot::DotFn;

pub(super) fn dot_fn(ty: GgmlType) -> Option<DotFn> {
    // Each dot is a safe function with `#[target_feature]`: calling it needs only the features,
    // and the NEON table (the only caller) is built only when the CPU reports NEON and dotprod
    // (`KernelTier::is_available`). The dots index their blocks with bounds checks.
    Some(match ty {
        // SAFETY: NEON and dotprod are present (see above).
        GgmlType::Q1_0 => |w, a, n| unsafe { dot_q1_0(w, a, n) },
        // SAFETY: NEON and dotprod are present (see above).
        GgmlType::Q2_0 => |w, a, n| unsafe { dot_q2_0(w, a, n) },
        // SAFETY: NEON and dotprod are present (see above).
        GgmlType::Q4_0 => |w, a, n| unsafe { dot_q4_0(w, a, n) },
        // SAFETY: NEON and dotprod are present (see above).
        GgmlType::Q4_1 => |w, a, n| unsafe { dot_q4_1(w, a, n) },
        // SAFETY: NEON and dotprod are present (see above).
        GgmlType::Q8_0 => |w, a, n| unsafe { dot_q8_0(w, a, n) },
        // SAFETY: NEON and dotprod are present (see above).
        GgmlType::TQ2_0 => |w, a, n| unsafe { dot_tq2_0(w, a, n) },
        _ => return None,
    })
}

fn d16(b: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(b))
}

#[inline]
#[target_feature(enable = "neon")]
fn load_i8(x: &[i8]) -> int8x16_t {
    assert!(x.len() >= 16);
    // SAFETY: 16 bytes are there.
    unsafe { vld1q_s8(x.as_ptr()) }
}

#[inline]
#[target_feature(enable = "neon")]
fn load_u8(x: &[u8]) -> uint8x16_t {
    assert!(x.len() >= 16);
    // SAFETY: 16 bytes are there.
    unsafe { vld1q_u8(x.as_ptr()) }
}

/// Two bytes of sign bits (bit j%8 of byte j/8) as 16 weights of +1 or -1.
#[inline]
#[target_feature(enable = "neon")]
fn signs16(bits: u16) -> int8x16_t {
    let lo = vdup_n_u8(bits as u8);
    let hi = vdup_n_u8((bits >> 8) as u8);
    let select = vcombine_u8(lo, hi);
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: BIT is 16 bytes.
    let set = vtstq_u8(select, unsafe { vld1q_u8(BIT.as_ptr()) });
    // set: 0xff -> (0xff & 2) - 1 = +1; clear: 0 - 1 = -1.
    vsubq_s8(vreinterpretq_s8_u8(vandq_u8(set, vdupq_n_u8(2))), vdupq_n_s8(1))
}

#[target_feature(enable = "neon,dotprod")]
fn dot_q1_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ1_0>(w), blocks::<BlockQ8_0>(a));
    let mut sumf = 0.0f32;
    for (b, y) in w[..n / 128].iter().zip(y.chunks_exact(4)) {
        let mut sumi = 0.0f32;
        for (k, yb) in y.iter().enumerate() {
            let bits = |h: usize| u16::from_le_bytes([b.qs[4 * k + 2 * h], b.qs[4 * k + 2 * h + 1]]);
            let acc = sdot(vdupq_n_s32(0), signs16(bits(0)), load_i8(&yb.qs[..16]));
            let acc = sdot(acc, signs16(bits(1)), load_i8(&yb.qs[16..]));
            sumi += d16(yb.d) * vaddvq_s32(acc) as f32;
        }
        sumf += d16(b.d) * sumi;
    }
    sumf
}

/// 16 two-bit codes (bits `shift..shift+2` of each byte) as weights `code - 1`.
#[inline]
#[target_feature(enable = "neon")]
fn crumbs(q: uint8x16_t, shift: i8) -> int8x16_t {
    let c = vandq_u8(vshlq_u8(q, vdupq_n_s8(-shift)), vdupq_n_u8(3));
    vsubq_s8(vreinterpretq_s8_u8(c), vdupq_n_s8(1))
}

#[target_feature(enable = "neon,dotprod")]
fn dot_q2_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ2_0>(w), blocks::<BlockQ8_0>(a));
    let mut sumf = 0.0f32;
    for (b, y) in w[..n / 64].iter().zip(y.chunks_exact(2)) {
        let mut sumi = 0.0f32;
        for (k, yb) in y.iter().enumerate() {
            // Weight j of half k sits in byte 8k + j/4, bits 2(j%4): gather the 32 codes in order.
            let mut codes = [0i8; 32];
            for (j, c) in codes.iter_mut().enumerate() {
                *c = ((b.qs[k * 8 + j / 4] >> ((j % 4) * 2)) & 3) as i8 - 1;
            }
            let acc = sdot(vdupq_n_s32(0), load_i8(&codes[..16]), load_i8(&yb.qs[..16]));
            let acc = sdot(acc, load_i8(&codes[16..]), load_i8(&yb.qs[16..]));
            sumi += d16(yb.d) * vaddvq_s32(acc) as f32;
        }
        sumf += d16(b.d) * sumi;
    }
    sumf
}

#[target_feature(enable = "neon,dotprod")]
fn dot_q4_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ4_0>(w), blocks::<BlockQ8_0>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / 32].iter().zip(y) {
        let q = load_u8(&b.qs);
        let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
        let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(q)), vdupq_n_s8(8));
        let acc = sdot(sdot(vdupq_n_s32(0), lo, load_i8(&yb.qs[..16])), hi, load_i8(&yb.qs[16..]));
        sumf += vaddvq_s32(acc) as f32 * d16(b.d) * d16(yb.d);
    }
    sumf
}

#[target_feature(enable = "neon,dotprod")]
fn dot_q4_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ4_1>(w), blocks::<BlockQ8_1>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / 32].iter().zip(y) {
        let q = load_u8(&b.qs);
        // Nibbles are 0..15, so they read the same as signed bytes.
        let lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f)));
        let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q));
        let acc = sdot(sdot(vdupq_n_s32(0), lo, load_i8(&yb.qs[..16])), hi, load_i8(&yb.qs[16..]));
        sumf += d16(b.d) * d16(yb.d) * vaddvq_s32(acc) as f32 + d16(b.m) * d16(yb.s);
    }
    sumf
}

#[target_feature(enable = "neon,dotprod")]
fn dot_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ8_0>(w), blocks::<BlockQ8_0>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / 32].iter().zip(y) {
        let acc = sdot(vdupq_n_s32(0), load_i8(&b.qs[..16]), load_i8(&yb.qs[..16]));
        let acc = sdot(acc, load_i8(&b.qs[16..]), load_i8(&yb.qs[16..]));
        sumf += vaddvq_s32(acc) as f32 * (d16(b.d) * d16(yb.d));
    }
    sumf
}

#[target_feature(enable = "neon,dotprod")]
fn dot_tq2_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockTQ2_0>(w), blocks::<BlockQ8K>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        let mut acc = vdupq_n_s32(0);
        // Byte k of half j holds weights j·128 + l·32 + k for l = 0..4, in bits 2l.
        for j in 0..2 {
            for h in 0..2 {
                let q = load_u8(&b.qs[j * 32 + h * 16..]);
                for l in 0..4 {
                    let x = load_i8(&yb.qs[j * 128 + l * 32 + h * 16..]);
                    acc = sdot(acc, crumbs(q, 2 * l as i8), x);
                }
            }
        }
        sumf += vaddvq_s32(acc) as f32 * (yb.d * d16(b.d));
    }
    sumf
}
