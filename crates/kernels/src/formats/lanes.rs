//! The scale searches of a super-block's sixteen sub-blocks, run side by side.
//!
//! ggml fits each sub-block's scale by trying 19 candidates, and each try sums over the
//! sub-block in order: a chain of dependent float additions, so one sub-block at a time runs at
//! the adder's latency, not its throughput. The sums must stay in that order (they decide which
//! candidate wins, and so the bytes), but the sixteen sub-blocks are independent: here lane `b`
//! of every array is sub-block `b`, each lane does exactly the scalar operations in the scalar
//! order, and the loops over lanes vectorise. Results are bit-identical to one-at-a-time.

use super::nearest_int;

const LANES: usize = 16;
const GROUP_MAX_EPS: f32 = 1e-15;

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
