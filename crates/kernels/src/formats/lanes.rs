//! The scale searches of a super-block's sixteen sub-blocks, run side by side.
//!
//! ggml fits each sub-block's scale by trying 19 candidates, and each try sums over the
//! sub-block in order: a chain of dependent float additions, so one sub-block at a time runs at
//! the adder's latency, not its throughput. The sums must stay in that order (they decide which
//! candidate wins, and so the bytes), but the sixteen sub-blocks are independent: here lane `b`
//! of every array is sub-block `b`, each lane does exactly the scalar operations in the scalar
//! order, and the loops over lanes vectorise. Results are bit-identical to one-at-a-time.

use super::{GROUP_MAX_EPS, nearest_int};

const LANES: usize = 16;
/// ggml's `make_qx_quants(16, nmax, x, L, 1, w)` for the sixteen 16-weight sub-blocks of `x`
/// at once: levels `-nmax..nmax` stored plus `nmax` in `l_out`, the scales returned. `w` holds
/// each weight's importance (x² where ggml passes no weights).
pub(super) fn make_qx_quants_x16(nmax: i32, x: &[f32], w: &[f32], l_out: &mut [i8]) -> [f32; LANES] {
    // Transpose, so that index [i][b] is weight i of sub-block b.
    let xt: [[f32; LANES]; 16] = std::array::from_fn(|i| std::array::from_fn(|b| x[16 * b + i]));
    let wt: [[f32; LANES]; 16] = std::array::from_fn(|i| std::array::from_fn(|b| w[16 * b + i]));
    let mut max = [0f32; LANES];
    let mut amax = [0f32; LANES];
    for row in &xt {
        for b in 0..LANES {
            let a = row[b].abs();
            if a > amax[b] {
                amax[b] = a;
                max[b] = row[b];
            }
        }
    }
    let nmaxf = nmax as f32;
    let fit = |iscale: &[f32; LANES]| {
        let mut sumlx = [0f32; LANES];
        let mut suml2 = [0f32; LANES];
        for (xr, wr) in xt.iter().zip(&wt) {
            for b in 0..LANES {
                let l = nearest_int(iscale[b] * xr[b]).clamp(-nmax, nmax - 1) as f32;
                sumlx[b] += wr[b] * xr[b] * l;
                suml2[b] += wr[b] * l * l;
            }
        }
        (sumlx, suml2)
    };
    let mut best_iscale: [f32; LANES] = std::array::from_fn(|b| -nmaxf / max[b]);
    let (sumlx, suml2) = fit(&best_iscale);
    let mut scale: [f32; LANES] = std::array::from_fn(|b| if suml2[b] != 0.0 { sumlx[b] / suml2[b] } else { 0.0 });
    let mut best: [f32; LANES] = std::array::from_fn(|b| scale[b] * sumlx[b]);
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale: [f32; LANES] = std::array::from_fn(|b| -(nmaxf + 0.1 * is as f32) / max[b]);
        let (sumlx, suml2) = fit(&iscale);
        for b in 0..LANES {
            if suml2[b] > 0.0 && sumlx[b] * sumlx[b] > best[b] * suml2[b] {
                best_iscale[b] = iscale[b];
                scale[b] = sumlx[b] / suml2[b];
                best[b] = scale[b] * sumlx[b];
            }
        }
    }
    // The levels of the winning candidate (what ggml stored when that candidate won).
    for b in 0..LANES {
        let out = &mut l_out[16 * b..16 * b + 16];
        if amax[b] < GROUP_MAX_EPS {
            out.fill(0);
            scale[b] = 0.0;
            continue;
        }
        for (l, &xi) in out.iter_mut().zip(&x[16 * b..16 * b + 16]) {
            *l = (nmax + nearest_int(best_iscale[b] * xi).clamp(-nmax, nmax - 1)) as i8;
        }
    }
    scale
}

/// ggml's `make_qkx2_quants(S, nmax, x, w, L, &min, Laux, rmin, rdelta, nstep, use_mad)` for
/// `N` sub-blocks of `S` weights at once (Q2_K: 16 × 16, Q4_K/Q5_K: 8 × 32): levels
/// `0..=nmax` in `l_out`; returns each sub-block's (scale, -min).
#[allow(clippy::too_many_arguments)]
pub(super) fn make_qkx2_quants_lanes<const N: usize, const S: usize>(
    nmax: i32,
    x: &[f32],
    w: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> ([f32; N], [f32; N]) {
    let xt: [[f32; N]; S] = std::array::from_fn(|i| std::array::from_fn(|b| x[S * b + i]));
    let wt: [[f32; N]; S] = std::array::from_fn(|i| std::array::from_fn(|b| w[S * b + i]));
    let mut min: [f32; N] = xt[0];
    let mut max: [f32; N] = xt[0];
    let mut sum_w: [f32; N] = wt[0];
    let mut sum_x: [f32; N] = std::array::from_fn(|b| sum_w[b] * xt[0][b]);
    for i in 1..S {
        for b in 0..N {
            let v = xt[i][b];
            if v < min[b] {
                min[b] = v;
            }
            if v > max[b] {
                max[b] = v;
            }
            sum_w[b] += wt[i][b];
            sum_x[b] += wt[i][b] * v;
        }
    }
    for m in min.iter_mut() {
        if *m > 0.0 {
            *m = 0.0;
        }
    }
    // ggml returns at once for a flat sub-block; its lane computes garbage that is never used.
    let flat: [bool; N] = std::array::from_fn(|b| max[b] == min[b]);
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let nmaxf = nmax as f32;
    // The winning candidate of each lane is remembered by what made its levels: its inverse
    // scale and the minimum in force when it was tried.
    let mut best_iscale: [f32; N] = std::array::from_fn(|b| nmaxf / (max[b] - min[b]));
    let mut best_min = min;
    let mut scale: [f32; N] = std::array::from_fn(|b| 1.0 / best_iscale[b]);
    let mut best_error = [0f32; N];
    for i in 0..S {
        for b in 0..N {
            let l = nearest_int(best_iscale[b] * (xt[i][b] - min[b])).clamp(0, nmax) as f32;
            best_error[b] += wt[i][b] * err(scale[b] * l + min[b] - xt[i][b]);
        }
    }
    if nstep >= 1 {
        let mut laux = [[0f32; N]; S];
        for is in 0..=nstep {
            let iscale: [f32; N] = std::array::from_fn(|b| (rmin + rdelta * is as f32 + nmaxf) / (max[b] - min[b]));
            let (mut sum_l, mut sum_l2, mut sum_xl) = ([0f32; N], [0f32; N], [0f32; N]);
            for i in 0..S {
                for b in 0..N {
                    let l = nearest_int(iscale[b] * (xt[i][b] - min[b])).clamp(0, nmax) as f32;
                    laux[i][b] = l;
                    let wv = wt[i][b];
                    sum_l[b] += wv * l;
                    sum_l2[b] += wv * l * l;
                    sum_xl[b] += wv * l * xt[i][b];
                }
            }
            let mut this_scale = [0f32; N];
            let mut this_min = [0f32; N];
            let mut ok = [false; N];
            for b in 0..N {
                let det = sum_w[b] * sum_l2[b] - sum_l[b] * sum_l[b];
                ok[b] = det > 0.0;
                this_scale[b] = (sum_w[b] * sum_xl[b] - sum_x[b] * sum_l[b]) / det;
                this_min[b] = (sum_l2[b] * sum_x[b] - sum_l[b] * sum_xl[b]) / det;
                if this_min[b] > 0.0 {
                    this_min[b] = 0.0;
                    this_scale[b] = sum_xl[b] / sum_l2[b];
                }
            }
            let mut cur_error = [0f32; N];
            for i in 0..S {
                for b in 0..N {
                    cur_error[b] += wt[i][b] * err(this_scale[b] * laux[i][b] + this_min[b] - xt[i][b]);
                }
            }
            for b in 0..N {
                if !flat[b] && ok[b] && cur_error[b] < best_error[b] {
                    best_error[b] = cur_error[b];
                    best_iscale[b] = iscale[b];
                    best_min[b] = min[b];
                    scale[b] = this_scale[b];
                    min[b] = this_min[b];
                }
            }
        }
    }
    let mut neg_min = [0f32; N];
    for b in 0..N {
        let out = &mut l_out[S * b..S * b + S];
        if flat[b] {
            out.fill(0);
            scale[b] = 0.0;
        } else {
            for (l, i) in out.iter_mut().zip(0..S) {
                *l = nearest_int(best_iscale[b] * (xt[i][b] - best_min[b])).clamp(0, nmax) as u8;
            }
        }
        neg_min[b] = -min[b];
    }
    (scale, neg_min)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scalar reference, one sub-block at a time, as ggml writes it.
    fn scalar(nmax: i32, x: &[f32], w: &[f32], l_out: &mut [i8]) -> f32 {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            l_out.fill(0);
            return 0.0;
        }
        let mut iscale = -(nmax as f32) / max;
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for i in 0..x.len() {
            let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            l_out[i] = (l + nmax) as i8;
            sumlx += w[i] * x[i] * l as f32;
            suml2 += w[i] * l as f32 * l as f32;
        }
        let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
        let mut best = scale * sumlx;
        for is in -9..=9 {
            if is == 0 {
                continue;
            }
            iscale = -(nmax as f32 + 0.1 * is as f32) / max;
            let (mut slx, mut sl2) = (0f32, 0f32);
            for i in 0..x.len() {
                let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1) as f32;
                slx += w[i] * x[i] * l;
                sl2 += w[i] * l * l;
            }
            if sl2 > 0.0 && slx * slx > best * sl2 {
                for i in 0..x.len() {
                    l_out[i] = (nmax + nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1)) as i8;
                }
                scale = slx / sl2;
                best = scale * slx;
            }
        }
        scale
    }

    /// ggml's `make_qkx2_quants`, one sub-block at a time.
    #[allow(clippy::too_many_arguments)]
    fn scalar_qkx2(
        nmax: i32,
        x: &[f32],
        w: &[f32],
        l_out: &mut [u8],
        rmin: f32,
        rdelta: f32,
        nstep: i32,
        mad: bool,
    ) -> (f32, f32) {
        let n = x.len();
        let (mut min, mut max, mut sum_w) = (x[0], x[0], w[0]);
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
        if max == min {
            l_out.fill(0);
            return (0.0, -min);
        }
        let err = |d: f32| if mad { d.abs() } else { d * d };
        let mut iscale = nmax as f32 / (max - min);
        let mut scale = 1.0 / iscale;
        let mut best = 0f32;
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l_out[i] = l as u8;
            best += w[i] * err(scale * l as f32 + min - x[i]);
        }
        let mut laux = vec![0u8; n];
        for is in 0..=nstep {
            iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
            let (mut sl, mut sl2, mut sxl) = (0f32, 0f32, 0f32);
            for i in 0..n {
                let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
                laux[i] = l as u8;
                let lf = l as f32;
                sl += w[i] * lf;
                sl2 += w[i] * lf * lf;
                sxl += w[i] * lf * x[i];
            }
            let det = sum_w * sl2 - sl * sl;
            if det > 0.0 {
                let mut ts = (sum_w * sxl - sum_x * sl) / det;
                let mut tm = (sl2 * sum_x - sl * sxl) / det;
                if tm > 0.0 {
                    tm = 0.0;
                    ts = sxl / sl2;
                }
                let mut cur = 0f32;
                for i in 0..n {
                    cur += w[i] * err(ts * laux[i] as f32 + tm - x[i]);
                }
                if cur < best {
                    l_out.copy_from_slice(&laux);
                    best = cur;
                    scale = ts;
                    min = tm;
                }
            }
        }
        (scale, -min)
    }

    #[test]
    fn asymmetric_side_by_side_equals_one_at_a_time() {
        let mut h = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..2000 {
            let x: Vec<f32> = (0..256)
                .map(|i| {
                    h ^= h << 13;
                    h ^= h >> 7;
                    h ^= h << 17;
                    let v = ((h >> 40) as f32 / (1 << 23) as f32 - 1.0) * [1.0, 0.05, 0.003, 7.0][round % 4];
                    match (i / 16 + round / 4) % 8 {
                        0 => -0.25,
                        6 => 0.0,
                        7 => 0.0125,
                        1 => v.abs() + 0.5,
                        2 if i % 16 == 5 => v * 30.0,
                        _ => v,
                    }
                })
                .collect();
            let w: Vec<f32> = if round % 2 == 0 {
                x.iter().map(|v| v.abs() + 0.1).collect()
            } else {
                // Q4_K's weights: the sub-block's RMS plus |x|.
                (0..256)
                    .map(|i| {
                        let s2 = x[32 * (i / 32)..32 * (i / 32) + 32].iter().fold(0f32, |s, v| s + v * v);
                        (s2 / 32.0).sqrt() + x[i].abs()
                    })
                    .collect()
            };
            let check = |got: ([f32; 16], [f32; 16]), got_l: &[u8], s: usize, nmax, rmin, rdelta, nstep, mad| {
                let mut want_l = vec![0u8; 256];
                for b in 0..256 / s {
                    let r = s * b..s * b + s;
                    let (sc, m) =
                        scalar_qkx2(nmax, &x[r.clone()], &w[r.clone()], &mut want_l[r], rmin, rdelta, nstep, mad);
                    assert_eq!(
                        (got.0[b].to_bits(), got.1[b].to_bits()),
                        (sc.to_bits(), m.to_bits()),
                        "round {round} block {b}"
                    );
                }
                assert_eq!(got_l, &want_l[..], "levels, round {round}");
            };
            let mut l = [0u8; 256];
            let (sc, m) = make_qkx2_quants_lanes::<16, 16>(3, &x, &w, &mut l, -0.5, 0.1, 15, true);
            check((sc, m), &l, 16, 3, -0.5, 0.1, 15, true);
            let (sc, m) = make_qkx2_quants_lanes::<8, 32>(15, &x, &w, &mut l, -1.0, 0.1, 20, false);
            let pad = |a: [f32; 8]| std::array::from_fn(|i| if i < 8 { a[i] } else { 0.0 });
            check((pad(sc), pad(m)), &l, 32, 15, -1.0, 0.1, 20, false);
        }
    }

    #[test]
    fn side_by_side_equals_one_at_a_time() {
        let mut h = 0x2545_f491_4f6c_dd1du64;
        for round in 0..200 {
            let x: Vec<f32> = (0..256)
                .map(|i| {
                    h ^= h << 13;
                    h ^= h >> 7;
                    h ^= h << 17;
                    let v = (h >> 40) as f32 / (1 << 23) as f32 - 1.0;
                    // Some sub-blocks all zero, some tiny, some with an outlier.
                    match (i / 16 + round) % 7 {
                        0 => 0.0,
                        1 => v * 1e-20,
                        2 if i % 16 == 3 => v * 40.0,
                        _ => v,
                    }
                })
                .collect();
            let w: Vec<f32> = if round % 2 == 0 {
                x.iter().map(|v| v * v).collect()
            } else {
                x.iter().map(|v| v.abs() + 0.5).collect()
            };
            for nmax in [4, 32] {
                let mut want_l = [0i8; 256];
                let want: Vec<f32> = (0..16)
                    .map(|b| {
                        scalar(nmax, &x[16 * b..16 * b + 16], &w[16 * b..16 * b + 16], &mut want_l[16 * b..16 * b + 16])
                    })
                    .collect();
                let mut got_l = [0i8; 256];
                let got = make_qx_quants_x16(nmax, &x, &w, &mut got_l);
                assert_eq!(got_l, want_l, "levels, round {round} nmax {nmax}");
                for b in 0..16 {
                    assert_eq!(got[b].to_bits(), want[b].to_bits(), "scale {b}, round {round} nmax {nmax}");
                }
            }
        }
    }
}
