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

/// GELU (tanh form) of an f32, in ggml's order of f32 operations.
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// GELU of every f16 value, rounded to f16 and widened (indexed by the f16's bits): ggml's
/// CPU backend computes GELU by this table, so matching it matters for parity.
pub fn gelu_table() -> &'static [f32; 1 << 16] {
    static TABLE: std::sync::OnceLock<Box<[f32; 1 << 16]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([0f32; 1 << 16]);
        for (bits, v) in t.iter_mut().enumerate() {
            let x = crate::formats::f16_to_f32(bits as u16);
            *v = crate::formats::f16_to_f32(crate::formats::f32_to_f16(gelu(x)));
        }
        t
    })
}

/// Below this GELU is 0, above it the identity (as ggml's table lookup has it).
pub const GELU_LIMIT: f32 = 10.0;

/// GEGLU: `gate[i] = gelu(gate[i]) * up[i]`, GELU taken as ggml's CPU backend takes it: by the
/// table of [`gelu_table`] at the gate rounded to f16, 0 at or below −10, the identity at or
/// above 10.
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = if *g <= -GELU_LIMIT {
            0.0
        } else if *g >= GELU_LIMIT {
            *g * u
        } else {
            table[crate::formats::f32_to_f16(*g) as usize] * u
        };
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

/// Attention scores against a Q8_0 key cache, with the queries quantized to Q8_0 as well (as
/// llama.cpp's CPU backend does for such a cache): `out[i·ldo + j] = Σ_b (d_qb · d_kb) · I_b`,
/// where `I_b` is the exact integer dot of block b of query row i and of key row j (the rows of
/// all runs of `keys`, in order). Every tier takes the same integers and scales; how the blocks'
/// terms are added may differ.
pub fn scores_q8_0(q: &[u8], keys: &[&[u8]], k: usize, out: &mut [f32], ldo: usize) {
    let row = crate::act::ActFormat::Q8_0.row_bytes(k);
    fn block(r: &[u8], b: usize) -> (f32, impl Iterator<Item = i32> + '_) {
        let at = &r[b * 34..(b + 1) * 34];
        (crate::formats::f16_to_f32(u16::from_le_bytes([at[0], at[1]])), at[2..].iter().map(|&x| x as i8 as i32))
    }
    for (i, qi) in q.chunks_exact(row).enumerate() {
        for (j, kj) in keys.iter().flat_map(|run| run.chunks_exact(row)).enumerate() {
            let mut s = 0.0f32;
            for b in 0..k / 32 {
                let ((dq, qs), (dk, ks)) = (block(qi, b), block(kj, b));
                let dot: i32 = qs.zip(ks).map(|(x, y)| x * y).sum();
                s += (dq * dk) * dot as f32;
            }
            out[i * ldo + j] = s;
        }
    }
}
