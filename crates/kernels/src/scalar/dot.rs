//! Reference dot products: one weight row (blocks of its type) with one activation row (blocks
//! of the matching [`ActFormat`](crate::ActFormat)), in the arithmetic of ggml's generic C:
//! exact integer sums per block, then the block scales in f32.

use onebit_gguf::GgmlType;

use crate::formats::kquants::q3k_scales;
use crate::formats::ternary::tq1_trits;
use crate::formats::*;

/// `n` weights of row `w` dotted with activations `a`.
pub type DotFn = fn(w: &[u8], a: &[u8], n: usize) -> f32;

/// The reference dot product for weights of type `ty`, if there is one.
pub fn dot_fn(ty: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    Some(match ty {
        F32 => dot_f32,
        F16 => dot_f16,
        BF16 => dot_bf16,
        Q1_0 => dot_q1_0,
        Q2_0 => dot_q2_0,
        Q4_0 => dot_q4_0,
        Q4_1 => dot_q4_1,
        Q5_0 => dot_q5_0,
        Q5_1 => dot_q5_1,
        Q8_0 => dot_q8_0,
        TQ1_0 => dot_tq1_0,
        TQ2_0 => dot_tq2_0,
        Q2_K => dot_q2_k,
        Q3_K => dot_q3_k,
        Q4_K => dot_q4_k,
        Q5_K => dot_q5_k,
        Q6_K => dot_q6_k,
        _ => return None,
    })
}

fn f32s(a: &[u8]) -> &[f32] {
    bytemuck::cast_slice(a)
}

fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    // Weights in a file may sit at any 4-byte boundary; read them bytewise.
    let a = f32s(a);
    w.chunks_exact(4).zip(&a[..n]).map(|(w, x)| f32::from_le_bytes([w[0], w[1], w[2], w[3]]) * x).sum()
}

fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let a = f32s(a);
    let mut sum = 0.0f32;
    for (w, x) in w.chunks_exact(2).zip(&a[..n]) {
        sum += f16_to_f32(u16::from_le_bytes([w[0], w[1]])) * x;
    }
    sum
}

fn dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let a = f32s(a);
    let mut sum = 0.0f32;
    for (w, x) in w.chunks_exact(2).zip(&a[..n]) {
        sum += bf16_to_f32(u16::from_le_bytes([w[0], w[1]])) * x;
    }
    sum
}

fn d16(b: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(b))
}

fn dot_q1_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ1_0>(w), blocks::<BlockQ8_0>(a));
    let mut sumf = 0.0f32;
    for (i, b) in w[..n / 128].iter().enumerate() {
        let mut sumi = 0.0f32;
        for k in 0..4 {
            let yb = &y[i * 4 + k];
            let mut s = 0i32;
            for j in 0..32 {
                let q = yb.qs[j] as i32;
                s += if (b.qs[k * 4 + j / 8] >> (j % 8)) & 1 != 0 { q } else { -q };
            }
            sumi += d16(yb.d) * s as f32;
        }
        sumf += d16(b.d) * sumi;
    }
    sumf
}

fn dot_q2_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ2_0>(w), blocks::<BlockQ8_0>(a));
    let mut sumf = 0.0f32;
    for (i, b) in w[..n / 64].iter().enumerate() {
        let mut sumi = 0.0f32;
        for k in 0..2 {
            let yb = &y[i * 2 + k];
            let mut s = 0i32;
            for j in 0..32 {
                let q = ((b.qs[k * 8 + j / 4] >> ((j % 4) * 2)) & 3) as i32 - 1;
                s += q * yb.qs[j] as i32;
            }
            sumi += d16(yb.d) * s as f32;
        }
        sumf += d16(b.d) * sumi;
    }
    sumf
}

fn dot_q4_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ4_0>(w), blocks::<BlockQ8_0>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / 32].iter().zip(y) {
        let mut s = 0i32;
        for j in 0..16 {
            s += ((b.qs[j] & 0x0f) as i32 - 8) * yb.qs[j] as i32;
            s += ((b.qs[j] >> 4) as i32 - 8) * yb.qs[j + 16] as i32;
        }
        sumf += s as f32 * d16(b.d) * d16(yb.d);
    }
    sumf
}

fn dot_q4_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ4_1>(w), blocks::<BlockQ8_1>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / 32].iter().zip(y) {
        let mut s = 0i32;
        for j in 0..16 {
            s += (b.qs[j] & 0x0f) as i32 * yb.qs[j] as i32;
            s += (b.qs[j] >> 4) as i32 * yb.qs[j + 16] as i32;
        }
        sumf += d16(b.d) * d16(yb.d) * s as f32 + d16(b.m) * d16(yb.s);
    }
    sumf
}

/// The 32 five-bit values of a Q5 block.
fn q5(qh: [u8; 4], qs: &[u8; 16]) -> [i32; 32] {
    let qh = u32::from_le_bytes(qh);
    std::array::from_fn(|j| {
        let (nib, bit) = if j < 16 { (qs[j] & 0x0f, (qh >> j) & 1) } else { (qs[j - 16] >> 4, (qh >> j) & 1) };
        nib as i32 | (bit as i32) << 4
    })
}

fn dot_q5_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ5_0>(w), blocks::<BlockQ8_0>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / 32].iter().zip(y) {
        let v = q5(b.qh, &b.qs);
        let s: i32 = (0..32).map(|j| (v[j] - 16) * yb.qs[j] as i32).sum();
        sumf += d16(b.d) * d16(yb.d) * s as f32;
    }
    sumf
}

fn dot_q5_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ5_1>(w), blocks::<BlockQ8_1>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / 32].iter().zip(y) {
        let v = q5(b.qh, &b.qs);
        let s: i32 = (0..32).map(|j| v[j] * yb.qs[j] as i32).sum();
        sumf += d16(b.d) * d16(yb.d) * s as f32 + d16(b.m) * d16(yb.s);
    }
    sumf
}

fn dot_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ8_0>(w), blocks::<BlockQ8_0>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / 32].iter().zip(y) {
        let s: i32 = b.qs.iter().zip(&yb.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
        sumf += s as f32 * (d16(b.d) * d16(yb.d));
    }
    sumf
}

fn dot_tq1_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockTQ1_0>(w), blocks::<BlockQ8K>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        let s: i32 = tq1_trits(b).iter().zip(&yb.qs).map(|(&t, &q)| (t as i32 - 1) * q as i32).sum();
        sumf += s as f32 * (d16(b.d) * yb.d);
    }
    sumf
}

fn dot_tq2_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockTQ2_0>(w), blocks::<BlockQ8K>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        let mut s = 0i32;
        for j in 0..2 {
            for l in 0..4 {
                for k in 0..32 {
                    let q = ((b.qs[j * 32 + k] >> (2 * l)) & 3) as i32 - 1;
                    s += q * yb.qs[j * 128 + l * 32 + k] as i32;
                }
            }
        }
        sumf += s as f32 * (yb.d * d16(b.d));
    }
    sumf
}

fn dot_q2_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ2K>(w), blocks::<BlockQ8K>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        let summs: i32 = (0..16).map(|j| yb.bsums[j] as i32 * (b.scales[j] >> 4) as i32).sum();
        let mut isum = 0i32;
        for j in 0..16 {
            // Sub-block j: 16 weights, 2-bit field (j / 2) % 4 of bytes in group j / 8.
            let (group, shift, half) = (j / 8, 2 * ((j / 2) % 4), j % 2);
            let q2 = &b.qs[group * 32 + half * 16..group * 32 + half * 16 + 16];
            let q8 = &yb.qs[16 * j..16 * j + 16];
            let s: i32 = q2.iter().zip(q8).map(|(&q, &x)| ((q >> shift) & 3) as i32 * x as i32).sum();
            isum += (b.scales[j] & 0x0f) as i32 * s;
        }
        sumf += yb.d * d16(b.d) * isum as f32 - yb.d * d16(b.dmin) * summs as f32;
    }
    sumf
}

fn dot_q3_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ3K>(w), blocks::<BlockQ8K>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        let scales = q3k_scales(&b.scales);
        let mut isum = 0i32;
        for j in 0..16 {
            let sub: i32 = (16 * j..16 * j + 16).map(|k| q3k_value(b, k) * yb.qs[k] as i32).sum();
            isum += scales[j] as i32 * sub;
        }
        sumf += d16(b.d) * yb.d * isum as f32;
    }
    sumf
}

/// Weight `k` (0..256) of a Q3_K block as a signed integer in -4..=3.
fn q3k_value(b: &BlockQ3K, k: usize) -> i32 {
    let (group, within) = (k / 128, k % 128);
    let (pair, l) = (within / 32, within % 32);
    let low = ((b.qs[group * 32 + l] >> (2 * pair)) & 3) as i32;
    let bit = group * 4 + pair;
    let high = if b.hmask[l] & (1 << bit) != 0 { 0 } else { 4 };
    low - high
}

/// Dot of a Q4_K/Q5_K super-block given its 256 unsigned quants.
fn k4_block_dot(d: [u8; 2], dmin: [u8; 2], scales: &[u8; 12], q: &[i32; QK_K], yb: &BlockQ8K) -> f32 {
    let mut isum = 0i32;
    let mut msum = 0i32;
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        let s: i32 = (0..32).map(|l| q[32 * j + l] * yb.qs[32 * j + l] as i32).sum();
        isum += sc as i32 * s;
        msum += m as i32 * (yb.bsums[2 * j] as i32 + yb.bsums[2 * j + 1] as i32);
    }
    d16(d) * yb.d * isum as f32 - d16(dmin) * yb.d * msum as f32
}

fn dot_q4_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ4K>(w), blocks::<BlockQ8K>(a));
    w[..n / QK_K]
        .iter()
        .zip(y)
        .map(|(b, yb)| {
            let q: [i32; QK_K] = std::array::from_fn(|k| {
                let byte = b.qs[(k / 64) * 32 + k % 32];
                (if (k % 64) < 32 { byte & 0x0f } else { byte >> 4 }) as i32
            });
            k4_block_dot(b.d, b.dmin, &b.scales, &q, yb)
        })
        .sum()
}

fn dot_q5_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ5K>(w), blocks::<BlockQ8K>(a));
    w[..n / QK_K]
        .iter()
        .zip(y)
        .map(|(b, yb)| {
            let q: [i32; QK_K] = std::array::from_fn(|k| {
                let (j, l) = (k / 32, k % 32);
                let byte = b.qs[(j / 2) * 32 + l];
                let low = if j % 2 == 0 { byte & 0x0f } else { byte >> 4 };
                let high = (b.qh[l] >> j) & 1;
                (low | (high << 4)) as i32
            });
            k4_block_dot(b.d, b.dmin, &b.scales, &q, yb)
        })
        .sum()
}

fn dot_q6_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let (w, y) = (blocks::<BlockQ6K>(w), blocks::<BlockQ8K>(a));
    let mut sumf = 0.0f32;
    for (b, yb) in w[..n / QK_K].iter().zip(y) {
        let mut isum = 0i32;
        for k in 0..QK_K {
            let (half, within) = (k / 128, k % 128);
            let (quarter, l) = (within / 32, within % 32);
            let ql = b.ql[half * 64 + (quarter % 2) * 32 + l];
            let low = if quarter < 2 { ql & 0x0f } else { ql >> 4 };
            let high = (b.qh[half * 32 + l] >> (2 * quarter)) & 3;
            let q = (low | (high << 4)) as i32 - 32;
            isum += b.scales[k / 16] as i32 * q * yb.qs[k] as i32;
        }
        sumf += d16(b.d) * yb.d * isum as f32;
    }
    sumf
}
