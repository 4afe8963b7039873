//! AVX-512 vector operations of a layer: RMS norm, softmax, SwiGLU, GEGLU, f32 dot.

use std::arch::x86_64::*;

/// e^x for 16 lanes: x = n·ln2 + r with |r| <= ln2/2, e^r by a degree-7 polynomial (relative
/// error under 2e-7), then 2^n through the exponent bits. Inputs are clamped to the finite range.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn exp_ps(x: __m512) -> __m512 {
    let x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.72)), _mm512_set1_ps(-87.33));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        x,
        _mm512_set1_ps(std::f32::consts::LOG2_E),
    ));
    // r = x - n·ln2, with ln2 split in two for accuracy.
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm512_set1_ps(1.0 / 5040.0);
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(p, n)
}

/// A 16 × 16 f32 transpose.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn transpose16(r: &[__m512; 16]) -> [__m512; 16] {
    let a: [__m512; 16] = std::array::from_fn(|k| {
        let (x, y) = (r[k & !1], r[k | 1]);
        if k % 2 == 0 { _mm512_unpacklo_ps(x, y) } else { _mm512_unpackhi_ps(x, y) }
    });
    // b[4m + c] holds, in 128-bit lane L, rows 4m..4m+4 of column 4L + c.
    let b: [__m512; 16] = std::array::from_fn(|k| {
        let (m, c) = (k / 4, k % 4);
        let (x, y) = (_mm512_castps_pd(a[4 * m + c / 2]), _mm512_castps_pd(a[4 * m + 2 + c / 2]));
        _mm512_castpd_ps(if c % 2 == 0 { _mm512_unpacklo_pd(x, y) } else { _mm512_unpackhi_pd(x, y) })
    });
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        let e0 = _mm512_shuffle_f32x4::<0x88>(b[c], b[4 + c]);
        let e1 = _mm512_shuffle_f32x4::<0xdd>(b[c], b[4 + c]);
        let f0 = _mm512_shuffle_f32x4::<0x88>(b[8 + c], b[12 + c]);
        let f1 = _mm512_shuffle_f32x4::<0xdd>(b[8 + c], b[12 + c]);
        out[c] = _mm512_shuffle_f32x4::<0x88>(e0, f0);
        out[8 + c] = _mm512_shuffle_f32x4::<0xdd>(e0, f0);
        out[4 + c] = _mm512_shuffle_f32x4::<0x88>(e1, f1);
        out[12 + c] = _mm512_shuffle_f32x4::<0xdd>(e1, f1);
    }
    out
}

#[inline]
#[target_feature(enable = "avx512f")]
fn hsum(v: __m512) -> f32 {
    _mm512_reduce_add_ps(v)
}

/// Load the first up to 16 floats of `x` (zero beyond its end).
#[inline]
#[target_feature(enable = "avx512f")]
fn load_tail(x: &[f32]) -> __m512 {
    let mask = ((1u32 << x.len().min(16)) - 1) as u16;
    // SAFETY: the mask enables only lanes below `x.len()`; masked-off lanes are not read.
    unsafe { _mm512_maskz_loadu_ps(mask, x.as_ptr()) }
}

#[target_feature(enable = "avx512f")]
fn rms_norm_impl(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len();
    // Sum of squares in f64, as the reference (and ggml) do.
    let mut acc = _mm512_setzero_pd();
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n = x.len()`; this function has AVX-512 F.
        let v = unsafe { _mm512_loadu_ps(x.as_ptr().add(i)) };
        let sq = _mm512_mul_ps(v, v);
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(sq)))));
        i += 16;
    }
    let mut sum = _mm512_reduce_add_pd(acc);
    for &v in &x[i..] {
        sum += (v * v) as f64;
    }
    let scale = 1.0 / ((sum / n as f64) as f32 + eps).sqrt();
    let s = _mm512_set1_ps(scale);
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n`, and `Kernels::rms_norm` checked that `w` and `out` are as long as `x`.
        unsafe {
            let v =
                _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x.as_ptr().add(i)), s), _mm512_loadu_ps(w.as_ptr().add(i)));
            _mm512_storeu_ps(out.as_mut_ptr().add(i), v);
        }
        i += 16;
    }
    for j in i..n {
        out[j] = x[j] * scale * w[j];
    }
}

#[target_feature(enable = "avx512f")]
fn softmax_impl(x: &mut [f32]) {
    let n = x.len();
    let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
    for c in x.chunks(16) {
        let v = if c.len() == 16 {
            // SAFETY: the chunk holds 16 floats.
            unsafe { _mm512_loadu_ps(c.as_ptr()) }
        } else {
            _mm512_mask_blend_ps(((1u32 << c.len()) - 1) as u16, m, load_tail(c))
        };
        m = _mm512_max_ps(m, v);
    }
    let max = _mm512_reduce_max_ps(m);
    let mv = _mm512_set1_ps(max);
    let mut sum = _mm512_setzero_ps();
    let mut i = 0;
    while i < n {
        let k = (n - i).min(16);
        let mask = ((1u32 << k) - 1) as u16;
        // SAFETY: the mask enables lanes `i .. i + k` with `i + k <= n = x.len()`; masked-off lanes are
        // neither read nor written.
        unsafe {
            let v = _mm512_maskz_loadu_ps(mask, x.as_ptr().add(i));
            let e = _mm512_maskz_mov_ps(mask, exp_ps(_mm512_sub_ps(v, mv)));
            sum = _mm512_add_ps(sum, e);
            _mm512_mask_storeu_ps(x.as_mut_ptr().add(i), mask, e);
        }
        i += 16;
    }
    let inv = _mm512_set1_ps(1.0 / hsum(sum));
    let mut i = 0;
    while i < n {
        let k = (n - i).min(16);
        let mask = ((1u32 << k) - 1) as u16;
        // SAFETY: as above: only lanes below `n = x.len()` are enabled.
        unsafe {
            let v = _mm512_maskz_loadu_ps(mask, x.as_ptr().add(i));
            _mm512_mask_storeu_ps(x.as_mut_ptr().add(i), mask, _mm512_mul_ps(v, inv));
        }
        i += 16;
    }
}

#[target_feature(enable = "avx512f")]
fn silu_mul_impl(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let one = _mm512_set1_ps(1.0);
    let mut i = 0;
    while i < n {
        let k = (n - i).min(16);
        let mask = ((1u32 << k) - 1) as u16;
        // SAFETY: the mask enables lanes `i .. i + k` with `i + k <= n`, the shorter of the two lengths.
        unsafe {
            let g = _mm512_maskz_loadu_ps(mask, gate.as_ptr().add(i));
            let u = _mm512_maskz_loadu_ps(mask, up.as_ptr().add(i));
            let e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
            let s = _mm512_div_ps(g, _mm512_add_ps(one, e));
            _mm512_mask_storeu_ps(gate.as_mut_ptr().add(i), mask, _mm512_mul_ps(s, u));
        }
        i += 16;
    }
}

/// GEGLU as the scalar reference takes it: each gate rounded to f16 (`vcvtps2ph`, nearest
/// even) indexes the GELU table through a gather.
#[target_feature(enable = "avx512f")]
fn gelu_mul_impl(gate: &mut [f32], up: &[f32]) {
    use crate::scalar::ops::{GELU_LIMIT, gelu_table};
    let n = gate.len().min(up.len());
    let table = gelu_table();
    let (lo, hi) = (_mm512_set1_ps(-GELU_LIMIT), _mm512_set1_ps(GELU_LIMIT));
    let mut i = 0;
    while i < n {
        let k = (n - i).min(16);
        let mask = ((1u32 << k) - 1) as u16;
        // SAFETY: the mask enables lanes `i .. i + k` with `i + k <= n`, the shorter of the two
        // lengths; the gather's indices are 16-bit values, inside the table of 2^16 entries.
        unsafe {
            let g = _mm512_maskz_loadu_ps(mask, gate.as_ptr().add(i));
            let u = _mm512_maskz_loadu_ps(mask, up.as_ptr().add(i));
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(g);
            let t = _mm512_i32gather_ps::<4>(_mm512_cvtepu16_epi32(h), table.as_ptr());
            let v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_GE_OQ>(g, hi), t, g);
            let v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LE_OQ>(g, lo), v, _mm512_setzero_ps());
            _mm512_mask_storeu_ps(gate.as_mut_ptr().add(i), mask, _mm512_mul_ps(v, u));
        }
        i += 16;
    }
}

#[target_feature(enable = "avx512f")]
fn dot_f32_impl(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    // SAFETY: full loads at `i + 32 <= n`, masked loads of lanes below `n`; `n` is the shorter of the two
    // lengths.
    unsafe {
        while i + 32 <= n {
            s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a.as_ptr().add(i)), _mm512_loadu_ps(b.as_ptr().add(i)), s0);
            s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a.as_ptr().add(i + 16)), _mm512_loadu_ps(b.as_ptr().add(i + 16)), s1);
            i += 32;
        }
        while i < n {
            let k = (n - i).min(16);
            let mask = ((1u32 << k) - 1) as u16;
            s0 = _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(mask, a.as_ptr().add(i)),
                _mm512_maskz_loadu_ps(mask, b.as_ptr().add(i)),
                s0,
            );
            i += 16;
        }
    }
    hsum(_mm512_add_ps(s0, s1))
}

// Safe entry points for the table.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    // SAFETY: the AVX-512 table (the only caller) is built only when the CPU reports AVX-512 F/BW/VL and VNNI
    // (`KernelTier::is_available`); `Kernels` checked the lengths.
    unsafe { rms_norm_impl(x, w, eps, out) }
}
pub(crate) fn softmax(x: &mut [f32]) {
    // SAFETY: AVX-512 tier (see `rms_norm`); one slice, any length.
    unsafe { softmax_impl(x) }
}
pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    // SAFETY: AVX-512 tier (see `rms_norm`); the kernel stops at the shorter slice.
    unsafe { silu_mul_impl(gate, up) }
}
pub(crate) fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    // SAFETY: AVX-512 tier (see `rms_norm`); the kernel stops at the shorter slice.
    unsafe { gelu_mul_impl(gate, up) }
}
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: AVX-512 tier (see `rms_norm`); the kernel stops at the shorter slice.
    unsafe { dot_f32_impl(a, b) }
}
