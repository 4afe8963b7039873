//! Quantization steered by an importance matrix (what ggml's `quantize_q*` do when given one):
//! each block's scale search minimises the squared error weighted by how much each column
//! matters, `importance * sqrt(sigma² + x²)`, and the K-quants' sub-block scales and mins are
//! themselves fitted with those weights.
//!
//! Float operations keep ggml's order (left to right, no fused multiply-add), so results match
//! llama-quantize byte for byte. Quant levels are held as bytes exactly where ggml holds them in
//! `uint8_t` (a negative level wraps there, and the wrapped value is what later steps see).

use onebit_gguf::GgmlType;

use super::kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, QK_K};
use super::kquants_quantize::{
    k4_pack_scales, k4_requantize, pack_q4_k, pack_q5_k, q2k_finish, q3k_finish, q3k_pack_scales, q6k_finish,
};
use super::lanes::make_qx_quants_x16;
use super::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, pack_q5};
use super::{GROUP_MAX_EPS, blocks_mut, nearest_int, signed_absmax, to_half};
use crate::KernelError;

/// One row of `ty` from `x` with column importances `w` (same length as `x`).
pub(super) fn quantize_row(ty: GgmlType, x: &[f32], y: &mut [u8], w: &[f32]) -> Result<(), KernelError> {
    use GgmlType::*;
    match ty {
        Q4_0 => q4_0(x, blocks_mut(y), w),
        Q4_1 => q4_1(x, blocks_mut(y), w),
        Q5_0 => q5_0(x, blocks_mut(y), w),
        Q5_1 => q5_1(x, blocks_mut(y), w),
        Q2_K => q2_k(x, blocks_mut(y), w),
        Q3_K => q3_k(x, blocks_mut(y), w),
        Q4_K => q4_k(x, blocks_mut(y), w),
        Q5_K => q5_k(x, blocks_mut(y), w),
        Q6_K => q6_k(x, blocks_mut(y), w),
        other => return Err(KernelError::Unsupported { ty: other, what: "quantization with an importance matrix" }),
    }
    Ok(())
}

/// `sum(x²)` in order.
fn sum_sq(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |s, v| s + v * v)
}

/// Column weights of one block: importance times `sqrt(sigma2 + x²)`.
fn block_weights<const N: usize>(x: &[f32], qw: &[f32], sigma2: f32) -> [f32; N] {
    std::array::from_fn(|l| qw[l] * (sigma2 + x[l] * x[l]).sqrt())
}

/// Symmetric fit with explicit weights (ggml's `make_qx_quants`, rmse_type 1): levels
/// `-nmax..nmax` (stored plus `nmax`), trying 18 scales around `-nmax / max`.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8], w: &[f32]) -> f32 {
    let max = signed_absmax(x);
    if max.abs() < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let level = |iscale: f32, xi: f32| nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
    let fit = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for (&xi, &wi) in x.iter().zip(w) {
            let l = level(iscale, xi) as f32;
            sumlx += wi * xi * l;
            suml2 += wi * l * l;
        }
        (sumlx, suml2)
    };
    let store = |iscale: f32, l_out: &mut [i8]| {
        for (l, &xi) in l_out.iter_mut().zip(x) {
            *l = (nmax + level(iscale, xi)) as i8;
        }
    };
    let iscale = -(nmax as f32) / max;
    store(iscale, l_out);
    let (sumlx, suml2) = fit(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = fit(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            store(iscale, l_out);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Asymmetric fit `x ≈ scale * L + min`, L in `0..=nmax`, weighted squared error, trying
/// `nstep + 1` scales from `rmin` up by `rdelta` (ggml's `make_qkx3_quants`). Returns
/// (scale, -min).
fn make_qkx3_quants(
    nmax: i32,
    x: &[f32],
    w: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max <= min {
        l_out.iter_mut().for_each(|l| *l = 0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0.0f32;
    for i in 0..n {
        l_out[i] = nearest_int(iscale * (x[i] - min)).clamp(0, nmax) as u8;
        let diff = scale * l_out[i] as f32 + min - x[i];
        best += w[i] * (diff * diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let lf = l as f32;
            sum_l += w[i] * lf;
            sum_l2 += w[i] * lf * lf;
            sum_xl += w[i] * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut err = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                err += w[i] * (diff * diff);
            }
            if err < best {
                l_out[..n].copy_from_slice(&laux[..n]);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Fit non-negative values (sub-block scales or mins) with levels `0..=nmax`, weighted, then
/// refine levels one at a time (ggml's `make_qp_quants`).
fn make_qp_quants(nmax: i32, x: &[f32], l_out: &mut [u8], w: &[f32]) -> f32 {
    let mut max = 0.0f32;
    for &v in x {
        if v > max {
            max = v;
        }
    }
    if max < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for (l, &xi) in l_out.iter_mut().zip(x) {
        *l = nearest_int(iscale * xi) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best = 0.0f32;
    for i in 0..x.len() {
        let diff = x[i] - scale * l_out[i] as f32;
        best += w[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut err = 0.0f32;
        for i in 0..x.len() {
            let l = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * l as f32;
            err += w[i] * diff * diff;
        }
        if err < best {
            best = err;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..x.len() {
        let l = nearest_int(iscale * x[i]).min(nmax);
        l_out[i] = l as u8;
        sumlx += w[i] * x[i] * l as f32;
        suml2 += w[i] * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for i in 0..x.len() {
            let li = l_out[i] as f32;
            let mut slx = sumlx - w[i] * x[i] * li;
            let mut sl2 = suml2 - w[i] * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l_out[i] as i32 {
                    slx += w[i] * x[i] * new_l as f32;
                    sl2 += w[i] * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// The row's mean square, the base of the legacy formats' weights.
fn row_sigma2(x: &[f32]) -> f32 {
    sum_sq(x) / x.len() as f32
}

fn q4_0(x: &[f32], y: &mut [BlockQ4_0], qw: &[f32]) {
    let sigma2 = row_sigma2(x);
    for (ib, b) in y.iter_mut().enumerate() {
        let xb = &x[32 * ib..32 * ib + 32];
        let w: [f32; 32] = block_weights(xb, &qw[32 * ib..], sigma2);
        let mut l = [0i8; 32];
        b.d = to_half(make_qx_quants(8, xb, &mut l, &w));
        for j in 0..16 {
            b.qs[j] = l[j] as u8 | ((l[j + 16] as u8) << 4);
        }
    }
}

fn q4_1(x: &[f32], y: &mut [BlockQ4_1], qw: &[f32]) {
    let sigma2 = row_sigma2(x);
    for (ib, b) in y.iter_mut().enumerate() {
        let xb = &x[32 * ib..32 * ib + 32];
        let w: [f32; 32] = block_weights(xb, &qw[32 * ib..], sigma2);
        let mut l = [0u8; 32];
        let (d, the_min) = make_qkx3_quants(15, xb, &w, &mut l, -0.9, 0.05, 36);
        b.d = to_half(d);
        b.m = to_half(-the_min);
        for j in 0..16 {
            b.qs[j] = l[j] | (l[j + 16] << 4);
        }
    }
}

fn q5_0(x: &[f32], y: &mut [BlockQ5_0], qw: &[f32]) {
    let sigma2 = row_sigma2(x);
    for (ib, b) in y.iter_mut().enumerate() {
        let xb = &x[32 * ib..32 * ib + 32];
        let w: [f32; 32] = block_weights(xb, &qw[32 * ib..], sigma2);
        let mut l = [0i8; 32];
        b.d = to_half(make_qx_quants(16, xb, &mut l, &w));
        (b.qh, b.qs) = pack_q5(&l.map(|v| v as u8));
    }
}

fn q5_1(x: &[f32], y: &mut [BlockQ5_1], qw: &[f32]) {
    let sigma2 = row_sigma2(x);
    for (ib, b) in y.iter_mut().enumerate() {
        let xb = &x[32 * ib..32 * ib + 32];
        let w: [f32; 32] = block_weights(xb, &qw[32 * ib..], sigma2);
        let mut l = [0u8; 32];
        let (d, the_min) = make_qkx3_quants(31, xb, &w, &mut l, -0.9, 0.05, 36);
        b.d = to_half(d);
        b.m = to_half(-the_min);
        (b.qh, b.qs) = pack_q5(&l);
    }
}

fn q2_k(x: &[f32], y: &mut [BlockQ2K], qw: &[f32]) {
    for (i, (b, xs)) in y.iter_mut().zip(x.chunks_exact(QK_K)).enumerate() {
        let qw = &qw[QK_K * i..];
        let sigma2 = sum_sq(xs) / QK_K as f32;
        let mut l = [0u8; QK_K];
        let (mut scales, mut mins, mut sw) = ([0f32; 16], [0f32; 16], [0f32; 16]);
        for j in 0..16 {
            let sub = &xs[16 * j..16 * j + 16];
            let w: [f32; 16] = block_weights(sub, &qw[16 * j..], sigma2);
            sw[j] = w.iter().fold(0.0f32, |s, v| s + v);
            (scales[j], mins[j]) = make_qkx3_quants(3, sub, &w, &mut l[16 * j..16 * j + 16], -0.9, 0.05, 36);
        }
        let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
        let dm = make_qp_quants(15, &scales, &mut ls, &sw);
        let mm = make_qp_quants(15, &mins, &mut lm, &sw);
        b.d = to_half(dm);
        b.dmin = to_half(mm);
        for j in 0..16 {
            b.scales[j] = ls[j] | (lm[j] << 4);
        }
        q2k_finish(b, xs, &mut l);
    }
}

fn q3_k(x: &[f32], y: &mut [BlockQ3K], qw: &[f32]) {
    for (i, (b, xs)) in y.iter_mut().zip(x.chunks_exact(QK_K)).enumerate() {
        let qw = &qw[QK_K * i..];
        let sigma2 = 2.0 * sum_sq(xs) / QK_K as f32;
        let mut l = [0i8; QK_K];
        let w: [f32; QK_K] = block_weights(xs, qw, sigma2);
        let sw: [f32; 16] = std::array::from_fn(|j| w[16 * j..16 * j + 16].iter().fold(0.0f32, |s, v| s + v));
        let scales = make_qx_quants_x16(4, xs, &w, &mut l);
        let mut ls = [0i8; 16];
        let d_block = make_qx_quants(32, &scales, &mut ls, &sw);
        b.scales = q3k_pack_scales(ls.map(i32::from));
        b.d = to_half(d_block);
        q3k_finish(b, xs, &mut l);
    }
}

/// Q4_K and Q5_K: weighted sub-block fits, then weighted 6-bit scales and mins; returns the
/// quant levels (`0..=nmax`).
fn k4_levels(
    xs: &[f32],
    qw: &[f32],
    nmax: i32,
    clip63: bool,
    d: &mut [u8; 2],
    dmin: &mut [u8; 2],
    packed: &mut [u8; 12],
) -> [u8; QK_K] {
    let sigma2 = 2.0 * sum_sq(xs) / QK_K as f32;
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins, mut sw) = ([0f32; 8], [0f32; 8], [0f32; 8]);
    for j in 0..8 {
        let sub = &xs[32 * j..32 * j + 32];
        let w: [f32; 32] = block_weights(sub, &qw[32 * j..], sigma2);
        sw[j] = w.iter().fold(0.0f32, |s, v| s + v);
        (scales[j], mins[j]) = make_qkx3_quants(nmax, sub, &w, &mut l[32 * j..32 * j + 32], -0.9, 0.05, 36);
    }
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
    if clip63 {
        (ls, lm) = (ls.map(|s| s.min(63)), lm.map(|m| m.min(63)));
    }
    *packed = k4_pack_scales(ls, lm);
    *d = to_half(d_block);
    *dmin = to_half(m_block);
    k4_requantize(xs, nmax, *d, *dmin, packed, &mut l);
    l
}

fn q4_k(x: &[f32], y: &mut [BlockQ4K], qw: &[f32]) {
    for (i, (b, xs)) in y.iter_mut().zip(x.chunks_exact(QK_K)).enumerate() {
        let l = k4_levels(xs, &qw[QK_K * i..], 15, false, &mut b.d, &mut b.dmin, &mut b.scales);
        pack_q4_k(&l, &mut b.qs);
    }
}

fn q5_k(x: &[f32], y: &mut [BlockQ5K], qw: &[f32]) {
    for (i, (b, xs)) in y.iter_mut().zip(x.chunks_exact(QK_K)).enumerate() {
        let l = k4_levels(xs, &qw[QK_K * i..], 31, true, &mut b.d, &mut b.dmin, &mut b.scales);
        pack_q5_k(&l, &mut b.qs, &mut b.qh);
    }
}

fn q6_k(x: &[f32], y: &mut [BlockQ6K], qw: &[f32]) {
    for (i, (b, xs)) in y.iter_mut().zip(x.chunks_exact(QK_K)).enumerate() {
        let qw = &qw[QK_K * i..];
        let mut l = [0i8; QK_K];
        let scales = make_qx_quants_x16(32, xs, &qw[..QK_K], &mut l);
        q6k_finish(b, xs, &scales, &mut l);
    }
}
