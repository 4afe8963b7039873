//! Reference vector operations of a transformer layer, in ggml's arithmetic where it matters
//! (RMS norm sums squares in f64, softmax subtracts the maximum).

use crate::formats::f16_to_f32;

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

/// `a` (f32) dotted with `b` stored as IEEE halves.
pub fn dot_f16(a: &[f32], b: &[u16]) -> f32 {
    a.iter().zip(b).map(|(x, &y)| x * f16_to_f32(y)).sum()
}

/// `y += alpha * x`.
pub fn axpy_f32(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o += alpha * v;
    }
}

/// `y += alpha * x`, with `x` stored as IEEE halves.
pub fn axpy_f16(alpha: f32, x: &[u16], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o += alpha * f16_to_f32(v);
    }
}
