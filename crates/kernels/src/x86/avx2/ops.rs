//! AVX2 (+FMA, F16C) vector operations of a layer: RMS norm, softmax, SwiGLU, GEGLU, dots, f16
//! conversions and the attention block products, eight lanes of f32 at a time.

use std::arch::x86_64::*;

/// e^x for 8 lanes: x = n·ln2 + r, e^r by a degree-7 polynomial, 2^n through the exponent
/// bits. Inputs are clamped so that 2^n stays a normal number.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp_ps(x: __m256) -> __m256 {
    let x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0)), _mm256_set1_ps(-87.0));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm256_set1_ps(1.0 / 5040.0);
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_mul_ps(p, _mm256_castsi256_ps(pow2))
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Lanes `i .. i + 8` of `x`.
///
/// # Safety
/// `i + 8 <= x.len()`, and the CPU has AVX (every caller runs in the AVX2 tier).
#[inline(always)]
unsafe fn load(x: &[f32], i: usize) -> __m256 {
    // SAFETY: `i + 8 <= x.len()` by the contract, so the 8 lanes lie in `x`; AVX by the contract.
    unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) }
}

/// Store `v` into lanes `i .. i + 8` of `x`.
///
/// # Safety
/// As for [`load`].
#[inline(always)]
unsafe fn store(x: &mut [f32], i: usize, v: __m256) {
    // SAFETY: as in `load`: the 8 lanes lie in `x`, which we borrow mutably; AVX by the contract.
    unsafe { _mm256_storeu_ps(x.as_mut_ptr().add(i), v) }
}

#[target_feature(enable = "avx2,fma")]
fn rms_norm_impl(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len();
    let mut acc = _mm256_setzero_pd();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n = x.len()`; this function has AVX2.
        let v = unsafe { load(x, i) };
        let sq = _mm256_mul_ps(v, v);
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(sq)));
        i += 8;
    }
    // SAFETY: `__m256d` and `[f64; 4]` are the same 32 bytes of plain f64 lanes.
    let lanes: [f64; 4] = unsafe { std::mem::transmute(acc) };
    let mut sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for &v in &x[i..] {
        sum += (v * v) as f64;
    }
    let scale = 1.0 / ((sum / n as f64) as f32 + eps).sqrt();
    let s = _mm256_set1_ps(scale);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`, and `Kernels::rms_norm` checked that `w` and `out` are as long as `x`.
        unsafe { store(out, i, _mm256_mul_ps(_mm256_mul_ps(load(x, i), s), load(w, i))) };
        i += 8;
    }
    for j in i..n {
        out[j] = x[j] * scale * w[j];
    }
}

#[target_feature(enable = "avx2,fma")]
fn softmax_impl(x: &mut [f32]) {
    let n = x.len();
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mv = _mm256_set1_ps(max);
    let mut sum = _mm256_setzero_ps();
    let mut tail = 0.0f32;
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n = x.len()`; this function has AVX2 and FMA (`exp_ps`'s features).
        unsafe {
            let e = exp_ps(_mm256_sub_ps(load(x, i), mv));
            sum = _mm256_add_ps(sum, e);
            store(x, i, e);
        }
        i += 8;
    }
    for v in &mut x[i..] {
        *v = (*v - max).exp();
        tail += *v;
    }
    let inv = 1.0 / (hsum(sum) + tail);
    let iv = _mm256_set1_ps(inv);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n = x.len()`.
        unsafe { store(x, i, _mm256_mul_ps(load(x, i), iv)) };
        i += 8;
    }
    x[i..].iter_mut().for_each(|v| *v *= inv);
}

#[target_feature(enable = "avx2,fma")]
fn silu_mul_impl(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`, the shorter of the two lengths; this function has AVX2 and FMA.
        unsafe {
            let g = load(gate, i);
            let e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
            store(gate, i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), load(up, i)));
        }
        i += 8;
    }
    if i < n {
        // The tail goes through the same vector arithmetic (padded), so that a value's result
        // does not depend on where it falls in the slice.
        let (mut g, mut u) = ([0f32; 8], [0f32; 8]);
        g[..n - i].copy_from_slice(&gate[i..n]);
        u[..n - i].copy_from_slice(&up[i..n]);
        // SAFETY: both buffers hold the 8 values a vector loads and stores.
        unsafe {
            let gv = load(&g, 0);
            let e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            store(&mut g, 0, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), load(&u, 0)));
        }
        gate[i..n].copy_from_slice(&g[..n - i]);
    }
}

/// GEGLU of 8 lanes as the scalar reference takes it: each gate rounded to f16 (`vcvtps2ph`,
/// nearest even) indexes the GELU table through a gather.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn gelu_mul_ps(g: __m256, u: __m256, table: &[f32; 1 << 16]) -> __m256 {
    use crate::scalar::ops::GELU_LIMIT;
    let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(g);
    // SAFETY: the indices are 16-bit values, inside the table of 2^16 entries.
    let t = unsafe { _mm256_i32gather_ps::<4>(table.as_ptr(), _mm256_cvtepu16_epi32(h)) };
    let v = _mm256_blendv_ps(t, g, _mm256_cmp_ps::<_CMP_GE_OQ>(g, _mm256_set1_ps(GELU_LIMIT)));
    let v = _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps::<_CMP_LE_OQ>(g, _mm256_set1_ps(-GELU_LIMIT)));
    _mm256_mul_ps(v, u)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn gelu_mul_impl(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let table = crate::scalar::ops::gelu_table();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`, the shorter of the two lengths; this function has AVX2 and F16C.
        unsafe {
            let v = gelu_mul_ps(load(gate, i), load(up, i), table);
            store(gate, i, v);
        }
        i += 8;
    }
    if i < n {
        let (mut g, mut u) = ([0f32; 8], [0f32; 8]);
        g[..n - i].copy_from_slice(&gate[i..n]);
        u[..n - i].copy_from_slice(&up[i..n]);
        // SAFETY: both buffers hold the 8 values a vector loads and stores.
        unsafe {
            let v = gelu_mul_ps(load(&g, 0), load(&u, 0), table);
            store(&mut g, 0, v);
        }
        gate[i..n].copy_from_slice(&g[..n - i]);
    }
}

#[target_feature(enable = "avx2,fma")]
fn dot_f32_impl(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n`, the shorter of the two lengths.
        unsafe {
            s0 = _mm256_fmadd_ps(load(a, i), load(b, i), s0);
            s1 = _mm256_fmadd_ps(load(a, i + 8), load(b, i + 8), s1);
        }
        i += 16;
    }
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`, the shorter of the two lengths.
        unsafe { s0 = _mm256_fmadd_ps(load(a, i), load(b, i), s0) };
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(s0, s1));
    for j in i..n {
        s += a[j] * b[j];
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f16_to_f32_impl(src: &[u16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`, the shorter of the two lengths (8 halves read, 8 floats written); F16C
        // enabled.
        unsafe { store(dst, i, _mm256_cvtph_ps(_mm_loadu_si128(src.as_ptr().add(i) as *const __m128i))) };
        i += 8;
    }
    for j in i..n {
        dst[j] = crate::formats::f16_to_f32(src[j]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f32_to_f16_impl(src: &[f32], dst: &mut [u16]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n`, the shorter of the two lengths; F16C enabled.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(load(src, i));
            _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
        }
        i += 8;
    }
    for j in i..n {
        dst[j] = crate::formats::f32_to_f16(src[j]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn round_f16_impl(x: &mut [f32]) {
    let n = x.len();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n = x.len()`; F16C enabled.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(load(x, i));
            store(x, i, _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    for v in &mut x[i..] {
        *v = crate::formats::f16_to_f32(crate::formats::f32_to_f16(*v));
    }
}

/// `out[i·ldo + j] = a_i · b_j`, one dot product per pair.
#[target_feature(enable = "avx2,fma")]
fn gemm_nt_impl(a: &[f32], b: &[f32], k: usize, out: &mut [f32], ldo: usize) {
    for (i, ai) in a.chunks_exact(k).enumerate() {
        for (j, bj) in b.chunks_exact(k).enumerate() {
            out[i * ldo + j] = dot_f32_impl(ai, bj);
        }
    }
}

/// `out_i += Σ_j a[i·lda + j] · b_j`, 64 columns of a row in registers at a time.
#[target_feature(enable = "avx2,fma")]
fn gemm_nn_acc_impl(a: &[f32], lda: usize, b: &[f32], n: usize, out: &mut [f32]) {
    let (m, kk) = (out.len() / n, b.len() / n);
    let full = n / 8 * 8;
    for i in 0..m {
        let p = &a[i * lda..i * lda + kk];
        let o = &mut out[i * n..(i + 1) * n];
        for c0 in (0..full).step_by(64) {
            let vecs = ((full - c0) / 8).min(8);
            let mut acc = [_mm256_setzero_ps(); 8];
            for (v, acc) in acc.iter_mut().enumerate().take(vecs) {
                // SAFETY: `c0 + 8v + 8 <= full <= n = o.len()`.
                *acc = unsafe { load(o, c0 + 8 * v) };
            }
            for (j, &w) in p.iter().enumerate() {
                let wv = _mm256_set1_ps(w);
                for (v, acc) in acc.iter_mut().enumerate().take(vecs) {
                    // SAFETY: `j < kk = b.len() / n` and `c0 + 8v + 8 <= n`, so the lanes lie in row j of
                    // `b`.
                    *acc = _mm256_fmadd_ps(wv, unsafe { load(b, j * n + c0 + 8 * v) }, *acc);
                }
            }
            for (v, acc) in acc.iter().enumerate().take(vecs) {
                // SAFETY: as for the loads from `o` above.
                unsafe { store(o, c0 + 8 * v, *acc) };
            }
        }
        for c in full..n {
            o[c] += p.iter().enumerate().map(|(j, &w)| w * b[j * n + c]).sum::<f32>();
        }
    }
}

// Safe entry points for the table.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    // SAFETY: the AVX2 table (the only caller) is built only when the CPU reports AVX2, FMA and F16C
    // (`KernelTier::is_available`); `Kernels` checked the lengths.
    unsafe { rms_norm_impl(x, w, eps, out) }
}
pub(crate) fn softmax(x: &mut [f32]) {
    // SAFETY: AVX2 tier (see `rms_norm`); one slice, any length.
    unsafe { softmax_impl(x) }
}
pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    // SAFETY: AVX2 tier (see `rms_norm`); the kernel stops at the shorter slice.
    unsafe { silu_mul_impl(gate, up) }
}
pub(crate) fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    // SAFETY: AVX2 tier (see `rms_norm`); the kernel stops at the shorter slice.
    unsafe { gelu_mul_impl(gate, up) }
}
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: AVX2 tier (see `rms_norm`); the kernel stops at the shorter slice.
    unsafe { dot_f32_impl(a, b) }
}
pub(crate) fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
    // SAFETY: AVX2 tier, F16C included (see `rms_norm`); the kernel stops at the shorter slice.
    unsafe { f16_to_f32_impl(src, dst) }
}
pub(crate) fn f32_to_f16(src: &[f32], dst: &mut [u16]) {
    // SAFETY: AVX2 tier, F16C included (see `rms_norm`); the kernel stops at the shorter slice.
    unsafe { f32_to_f16_impl(src, dst) }
}
pub(crate) fn round_f16(x: &mut [f32]) {
    // SAFETY: AVX2 tier, F16C included (see `rms_norm`); one slice, any length.
    unsafe { round_f16_impl(x) }
}
pub(crate) fn gemm_nt(a: &[f32], b: &[f32], k: usize, out: &mut [f32], ldo: usize) {
    // SAFETY: AVX2 tier (see `rms_norm`); the products index `out` with bounds checks.
    unsafe { gemm_nt_impl(a, b, k, out, ldo) }
}
pub(crate) fn gemm_nn_acc(a: &[f32], lda: usize, b: &[f32], n: usize, out: &mut [f32]) {
    // SAFETY: AVX2 tier (see `rms_norm`); every vector access is inside a slice the kernel took (see there).
    unsafe { gemm_nn_acc_impl(a, lda, b, n, out) }
}
