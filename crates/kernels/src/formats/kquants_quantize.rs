//! Reference quantization into the K-quant formats and Q8_K.
//!
//! These search for sub-block scales the way ggml's `quantize_row_q*_K_ref` do (no importance
//! matrix), in the same float order, so files written by onebit and by llama-quantize match
//! byte for byte.

use super::kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K, scale_min_k4};
use super::lanes::make_qkx2_quants_lanes;
use super::{GROUP_MAX_EPS, half, nearest_int, signed_absmax, to_half};

/// Symmetric fit for Q3_K sub-blocks, refined by coordinate descent; L is stored plus `nmax`.
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let max = signed_absmax(x);
    if max.abs() < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (l_i, &xi) in l_out.iter_mut().zip(x) {
        let l = nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
        *l_i = l as i8;
        let w = xi * xi;
        sumlx += w * xi * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..x.len() {
            let w = x[i] * x[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l_out[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    l_out.iter_mut().for_each(|l| *l += nmax as i8);
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// Pack 2-bit values: byte l of each 32-byte group holds weights l, l+32, l+64, l+96.
pub(super) fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for (j, group) in qs.chunks_exact_mut(32).enumerate() {
        let base = 128 * j;
        for (i, q) in group.iter_mut().enumerate() {
            let at = base + i;
            *q = l[at] | (l[at + 32] << 2) | (l[at + 64] << 4) | (l[at + 96] << 6);
        }
    }
}

pub fn quantize_q2_k(x: &[f32], y: &mut [BlockQ2K]) {
    const Q4SCALE: f32 = 15.0;
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut l = [0u8; QK_K];
        let (scales, mins);
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        let weights: [f32; QK_K] = std::array::from_fn(|i| xs[i].abs());
        (scales, mins) = make_qkx2_quants_lanes::<16, 16>(3, xs, &weights, &mut l, -0.5, 0.1, 15, true);
        // ggml's `if (v > max) max = v`: a -0.0 min (a flat sub-block) must not win over the
        // starting +0.0, as `f32::max` may let it once vectorised.
        for j in 0..QK_K / 16 {
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..QK_K / 16 {
                b.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            b.d = to_half(max_scale / Q4SCALE);
        } else {
            b.scales = [0; QK_K / 16];
            b.d = to_half(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..QK_K / 16 {
                b.scales[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            b.dmin = to_half(max_min / Q4SCALE);
        } else {
            b.dmin = to_half(0.0);
        }
        q2k_finish(b, xs, &mut l);
    }
}

/// Q2_K's last steps once its scales, mins, `d` and `dmin` are set: every weight rounded again
/// against its packed sub-block scale and min (left as fitted in `l` where that scale is 0),
/// then packed into `qs`.
pub(super) fn q2k_finish(b: &mut BlockQ2K, xs: &[f32], l: &mut [u8; QK_K]) {
    for j in 0..QK_K / 16 {
        let d = half(b.d) * (b.scales[j] & 0x0f) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = half(b.dmin) * (b.scales[j] >> 4) as f32;
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int((xs[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
        }
    }
    pack_2bit(l, &mut b.qs);
}

pub fn quantize_q3_k(x: &[f32], y: &mut [BlockQ3K]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; QK_K / 16];
        for j in 0..QK_K / 16 {
            scales[j] = make_q3_quants(4, &xs[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        }
        let max_scale = signed_absmax(&scales);
        b.scales = [0; 12];
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            b.scales = q3k_pack_scales(scales.map(|s| (nearest_int(iscale * s) as i8).clamp(-32, 31) as i32 + 32));
            b.d = to_half(1.0 / iscale);
        } else {
            b.d = to_half(0.0);
        }
        q3k_finish(b, xs, &mut l);
    }
}

/// Sixteen 6-bit Q3_K scale levels (0..64) packed into its 12 scale bytes.
pub(super) fn q3k_pack_scales(levels: [i32; 16]) -> [u8; 12] {
    let mut packed = [0u8; 12];
    for (j, lv) in levels.into_iter().enumerate() {
        if j < 8 {
            packed[j] = (lv & 0x0f) as u8;
        } else {
            packed[j - 8] |= ((lv & 0x0f) << 4) as u8;
        }
        packed[j % 4 + 8] |= ((lv >> 4) << (2 * (j / 4))) as u8;
    }
    packed
}

/// Q3_K's last steps once its scales and `d` are set: every weight rounded again against its
/// packed sub-block scale (left as fitted in `l` where that scale is 0), then the high bits
/// into `hmask` and the low two into `qs`.
pub(super) fn q3k_finish(b: &mut BlockQ3K, xs: &[f32], l: &mut [i8; QK_K]) {
    let sc = super::kquants::q3k_scales(&b.scales);
    for j in 0..QK_K / 16 {
        let d = half(b.d) * sc[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(xs[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
        }
    }
    b.hmask = [0; QK_K / 8];
    let mut lu = [0u8; QK_K];
    for (j, (&v, out)) in l.iter().zip(lu.iter_mut()).enumerate() {
        let mut v = v as u8;
        if v > 3 {
            b.hmask[j % (QK_K / 8)] |= 1 << (j / (QK_K / 8));
            v -= 4;
        }
        *out = v;
    }
    pack_2bit(&lu, &mut b.qs);
}

/// Shared by Q4_K and Q5_K: sub-block fits, then 6-bit scales and mins. Returns the quants.
fn quantize_k4_scales(
    xs: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    d: &mut [u8; 2],
    dmin: &mut [u8; 2],
    packed: &mut [u8; 12],
) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let av_x: [f32; QK_K / 32] = std::array::from_fn(|j| {
        let sum_x2 = xs[32 * j..32 * j + 32].iter().fold(0.0f32, |s, v| s + v * v);
        (sum_x2 / 32.0).sqrt()
    });
    let weights: [f32; QK_K] = std::array::from_fn(|i| av_x[i / 32] + xs[i].abs());
    let (scales, mins) = make_qkx2_quants_lanes::<8, 32>(nmax, xs, &weights, &mut l, rmin, 0.1, nstep, false);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    // As in Q2_K: `f32::max` could keep a -0.0 min.
    for j in 0..QK_K / 32 {
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let ls: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm: [u8; 8] = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    *packed = k4_pack_scales(ls, lm);
    *d = to_half(max_scale / 63.0);
    *dmin = to_half(max_min / 63.0);
    k4_requantize(xs, nmax, *d, *dmin, packed, &mut l);
    l
}

/// Eight 6-bit Q4_K/Q5_K sub-block scales and mins packed into their 12 scale bytes.
pub(super) fn k4_pack_scales(ls: [u8; 8], lm: [u8; 8]) -> [u8; 12] {
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let (s, m) = (ls[j], lm[j]);
        if j < 4 {
            packed[j] = s;
            packed[j + 4] = m;
        } else {
            packed[j + 4] = (s & 0x0f) | ((m & 0x0f) << 4);
            packed[j - 4] |= (s >> 4) << 6;
            packed[j] |= (m >> 4) << 6;
        }
    }
    packed
}

/// Every weight rounded again (`0..=nmax`) against its packed Q4_K/Q5_K sub-block scale and
/// min; left as fitted in `l` where that scale is 0.
pub(super) fn k4_requantize(xs: &[f32], nmax: i32, d: [u8; 2], dmin: [u8; 2], packed: &[u8; 12], l: &mut [u8; QK_K]) {
    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(j, packed);
        let dj = half(d) * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = half(dmin) * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((xs[32 * j + ii] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
}

/// Q4_K levels (`0..16`) into `qs`: byte i of each 32-byte group holds weights i (low nibble)
/// and i + 32 (high) of its 64.
pub(super) fn pack_q4_k(l: &[u8; QK_K], qs: &mut [u8; QK_K / 2]) {
    for (j, q) in qs.chunks_exact_mut(32).enumerate() {
        for (i, qb) in q.iter_mut().enumerate() {
            *qb = l[64 * j + i] | (l[64 * j + i + 32] << 4);
        }
    }
}

/// Q5_K levels (`0..32`): the low four bits as Q4_K's, the fifth of weights i and i + 32 of
/// group n in bits 2n and 2n + 1 of `qh[i]`.
pub(super) fn pack_q5_k(l: &[u8; QK_K], qs: &mut [u8; QK_K / 2], qh: &mut [u8; QK_K / 8]) {
    *qh = [0; QK_K / 8];
    let (mut m1, mut m2) = (1u8, 2u8);
    for (n, ql) in qs.chunks_exact_mut(32).enumerate() {
        for (j, q) in ql.iter_mut().enumerate() {
            let (mut l1, mut l2) = (l[64 * n + j], l[64 * n + j + 32]);
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            *q = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
}

pub fn quantize_q4_k(x: &[f32], y: &mut [BlockQ4K]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        b.scales = [0; 12];
        let l = quantize_k4_scales(xs, 15, -1.0, 20, &mut b.d, &mut b.dmin, &mut b.scales);
        pack_q4_k(&l, &mut b.qs);
    }
}

pub fn quantize_q5_k(x: &[f32], y: &mut [BlockQ5K]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        b.scales = [0; 12];
        let l = quantize_k4_scales(xs, 31, -0.5, 15, &mut b.d, &mut b.dmin, &mut b.scales);
        pack_q5_k(&l, &mut b.qs, &mut b.qh);
    }
}

pub fn quantize_q6_k(x: &[f32], y: &mut [BlockQ6K]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut l = [0i8; QK_K];
        let w: [f32; QK_K] = std::array::from_fn(|i| xs[i] * xs[i]);
        let scales = super::lanes::make_qx_quants_x16(32, xs, &w, &mut l);
        q6k_finish(b, xs, &scales, &mut l);
    }
}

/// Q6_K's last steps once its sixteen sub-block scales are fitted (`l` holding the fits): the
/// 8-bit scales and `d` (a block of scales all near 0 is all zeros), every weight rounded again
/// against its scale (left as fitted where that scale is 0), then packed into `ql` and `qh`.
pub(super) fn q6k_finish(b: &mut BlockQ6K, xs: &[f32], scales: &[f32; QK_K / 16], l: &mut [i8; QK_K]) {
    let max_scale = signed_absmax(scales);
    if max_scale.abs() < GROUP_MAX_EPS {
        *b = bytemuck::Zeroable::zeroed();
        return;
    }
    let iscale = -128.0 / max_scale;
    b.d = to_half(1.0 / iscale);
    for (s, &sc) in b.scales.iter_mut().zip(scales) {
        *s = nearest_int(iscale * sc).min(127) as i8;
    }
    for j in 0..QK_K / 16 {
        let d = half(b.d) * b.scales[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(xs[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
        }
    }
    for n in 0..2 {
        let (ql, qh) = (&mut b.ql[64 * n..64 * n + 64], &mut b.qh[32 * n..32 * n + 32]);
        let lv = |i: usize| l[128 * n + i] as u8;
        for i in 0..32 {
            ql[i] = (lv(i) & 0x0f) | ((lv(i + 64) & 0x0f) << 4);
            ql[i + 32] = (lv(i + 32) & 0x0f) | ((lv(i + 96) & 0x0f) << 4);
            qh[i] = (lv(i) >> 4) | ((lv(i + 32) >> 4) << 2) | ((lv(i + 64) >> 4) << 4) | ((lv(i + 96) >> 4) << 6);
        }
    }
}

/// Q8_K: scale = -max / 127 from the signed absolute maximum, round half to even, block sums.
pub fn quantize_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    for (b, xs) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let max = signed_absmax(xs);
        if max == 0.0 {
            *b = bytemuck::Zeroable::zeroed();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, group) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = group.iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
    }
}
