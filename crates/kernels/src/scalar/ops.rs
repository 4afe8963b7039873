//! Reference vector operations of a transformer layer, in ggml's arithmetic where it matters
//! (RMS norm sums squares in f64, softmax subtracts the maximum).

/// `out = x / sqrt(mean(x²) + eps) * w`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// In-place softmax; returns nothing, the values sum to 1.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// SwiGLU: `gate[i] = silu(gate[i]) * up[i]`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Widen IEEE halves to f32.
pub fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
    dst.iter_mut().zip(src).for_each(|(d, &h)| *d = crate::formats::f16_to_f32(h));
}

/// Narrow f32 to IEEE halves, rounding to nearest even.
pub fn f32_to_f16(src: &[f32], dst: &mut [u16]) {
    dst.iter_mut().zip(src).for_each(|(d, &x)| *d = crate::formats::f32_to_f16(x));
}

/// Round every value to the nearest f16 (kept as f32).
pub fn round_f16(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = crate::formats::f16_to_f32(crate::formats::f32_to_f16(*v)));
}

/// `out[i·ldo + j] = a_i · b_j`, for the rows (of `k` values) of `a` and `b`.
pub fn gemm_nt(a: &[f32], b: &[f32], k: usize, out: &mut [f32], ldo: usize) {
    for (i, ai) in a.chunks_exact(k).enumerate() {
        for (j, bj) in b.chunks_exact(k).enumerate() {
            out[i * ldo + j] = dot_f32(ai, bj);
        }
    }
}

/// `out_i += Σ_j a[i·lda + j] · b_j`, for rows `b_j` of `n` values (`out`: rows of `n`).
pub fn gemm_nn_acc(a: &[f32], lda: usize, b: &[f32], n: usize, out: &mut [f32]) {
    for (i, oi) in out.chunks_exact_mut(n).enumerate() {
        for (j, bj) in b.chunks_exact(n).enumerate() {
            let w = a[i * lda + j];
            oi.iter_mut().zip(bj).for_each(|(o, &v)| *o += w * v);
        }
    }
}
