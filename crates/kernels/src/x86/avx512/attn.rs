//! AVX-512 block products for attention: scores `Q·Kᵀ` and weighted values `P·V` over a block
//! of cached rows already widened to f32, and the f16 → f32 widening itself.

use std::arch::x86_64::*;

use super::ops::transpose16;

#[inline(always)]
fn mask(n: usize) -> __mmask16 {
    (((1u32 << n.min(16)) - 1) & 0xffff) as __mmask16
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn f16_to_f32_impl(src: &[u16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i < n {
        let m = mask(n - i);
        // SAFETY: the mask keeps loads and stores inside both slices.
        unsafe {
            let h = _mm256_maskz_loadu_epi16(m, src.as_ptr().add(i) as *const i16);
            _mm512_mask_storeu_ps(dst.as_mut_ptr().add(i), m, _mm512_cvtph_ps(h));
        }
        i += 16;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn f32_to_f16_impl(src: &[f32], dst: &mut [u16]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i < n {
        let m = mask(n - i);
        // SAFETY: the mask keeps loads and stores inside both slices.
        unsafe {
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_maskz_loadu_ps(
                m,
                src.as_ptr().add(i),
            ));
            _mm256_mask_storeu_epi16(dst.as_mut_ptr().add(i) as *mut i16, m, h);
        }
        i += 16;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn round_f16_impl(x: &mut [f32]) {
    let n = x.len();
    let mut i = 0;
    while i < n {
        let m = mask(n - i);
        // SAFETY: the mask keeps loads and stores inside the slice.
        unsafe {
            let v = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
            _mm512_mask_storeu_ps(x.as_mut_ptr().add(i), m, _mm512_cvtph_ps(h));
        }
        i += 16;
    }
}

/// `out[i·ldo + j] = a_i · b_j` (rows of `k`). Sixteen rows of `b` are transposed at a time so
/// that every row of `a` meets them with broadcast FMAs; few rows of `a` take plain dots.
#[target_feature(enable = "avx512f")]
fn gemm_nt_impl(a: &[f32], b: &[f32], k: usize, out: &mut [f32], ldo: usize) {
    let (m, n) = (a.len() / k, b.len() / k);
    if m < 4 {
        for i in 0..m {
            for j in 0..n {
                out[i * ldo + j] = super::ops::dot_f32(&a[i * k..(i + 1) * k], &b[j * k..(j + 1) * k]);
            }
        }
        return;
    }
    let kp = k.next_multiple_of(16);
    let mut bt = vec![_mm512_setzero_ps(); kp];
    for j0 in (0..n).step_by(16) {
        let rows = (n - j0).min(16);
        // bt[d] = lanes j of column d of the 16-row block (zero past the last row).
        for d0 in (0..k).step_by(16) {
            let cols = mask(k - d0);
            let blk: [__m512; 16] = std::array::from_fn(|r| {
                if r < rows {
                    // SAFETY: the mask keeps the load inside row j0 + r.
                    unsafe { _mm512_maskz_loadu_ps(cols, b.as_ptr().add((j0 + r) * k + d0)) }
                } else {
                    _mm512_setzero_ps()
                }
            });
            bt[d0..d0 + 16].copy_from_slice(&transpose16(&blk));
        }
        let store = mask(rows);
        let mut i = 0;
        while i < m {
            let two = i + 1 < m;
            let (s0, s1) =
                dots16(&a[i * k..(i + 1) * k], if two { &a[(i + 1) * k..(i + 2) * k] } else { &[] }, &bt[..k]);
            for (r, s) in [(i, s0), (i + 1, s1)].into_iter().take(1 + two as usize) {
                assert!(r * ldo + j0 + rows <= out.len());
                // SAFETY: checked just above; the mask stops at `rows`.
                unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(r * ldo + j0), store, s) };
            }
            i += 2;
        }
    }
}

/// Sixteen dot products of `a0` (and `a1`, if not empty) with the transposed block `bt`, with
/// four independent accumulators per row so that FMA latency is hidden.
#[inline]
#[target_feature(enable = "avx512f")]
fn dots16(a0: &[f32], a1: &[f32], bt: &[__m512]) -> (__m512, __m512) {
    let z = _mm512_setzero_ps();
    let (mut p0, mut p1, mut p2, mut p3) = (z, z, z, z);
    let (mut q0, mut q1, mut q2, mut q3) = (z, z, z, z);
    let k = bt.len();
    let quads = k / 4;
    for c in 0..quads {
        let d = 4 * c;
        p0 = _mm512_fmadd_ps(_mm512_set1_ps(a0[d]), bt[d], p0);
        p1 = _mm512_fmadd_ps(_mm512_set1_ps(a0[d + 1]), bt[d + 1], p1);
        p2 = _mm512_fmadd_ps(_mm512_set1_ps(a0[d + 2]), bt[d + 2], p2);
        p3 = _mm512_fmadd_ps(_mm512_set1_ps(a0[d + 3]), bt[d + 3], p3);
        if !a1.is_empty() {
            q0 = _mm512_fmadd_ps(_mm512_set1_ps(a1[d]), bt[d], q0);
            q1 = _mm512_fmadd_ps(_mm512_set1_ps(a1[d + 1]), bt[d + 1], q1);
            q2 = _mm512_fmadd_ps(_mm512_set1_ps(a1[d + 2]), bt[d + 2], q2);
            q3 = _mm512_fmadd_ps(_mm512_set1_ps(a1[d + 3]), bt[d + 3], q3);
        }
    }
    for d in 4 * quads..k {
        p0 = _mm512_fmadd_ps(_mm512_set1_ps(a0[d]), bt[d], p0);
        if !a1.is_empty() {
            q0 = _mm512_fmadd_ps(_mm512_set1_ps(a1[d]), bt[d], q0);
        }
    }
    let sum = |a, b, c, d| _mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d));
    (sum(p0, p1, p2, p3), sum(q0, q1, q2, q3))
}

/// `out_i += Σ_j a[i·lda + j] · b_j` for rows `b_j` of `n` values (`out` is m × n).
#[target_feature(enable = "avx512f")]
fn gemm_nn_acc_impl(a: &[f32], lda: usize, b: &[f32], n: usize, out: &mut [f32]) {
    let (m, kk) = (out.len() / n, b.len() / n);
    for i in 0..m {
        let p = &a[i * lda..i * lda + kk];
        let o = &mut out[i * n..(i + 1) * n];
        for c0 in (0..n).step_by(128) {
            let width = (n - c0).min(128);
            // SAFETY: `width` columns from `c0` lie inside `o` and inside every row of `b`.
            unsafe {
                match width.div_ceil(16) {
                    8 => acc_cols::<8>(p, b, n, c0, width, o),
                    7 => acc_cols::<7>(p, b, n, c0, width, o),
                    6 => acc_cols::<6>(p, b, n, c0, width, o),
                    5 => acc_cols::<5>(p, b, n, c0, width, o),
                    4 => acc_cols::<4>(p, b, n, c0, width, o),
                    3 => acc_cols::<3>(p, b, n, c0, width, o),
                    2 => acc_cols::<2>(p, b, n, c0, width, o),
                    _ => acc_cols::<1>(p, b, n, c0, width, o),
                }
            }
        }
    }
}

/// Columns `c0 .. c0 + width` (at most 16 V) of one output row, kept in registers while the
/// weighted rows stream past.
#[inline(always)]
unsafe fn acc_cols<const V: usize>(p: &[f32], b: &[f32], n: usize, c0: usize, width: usize, o: &mut [f32]) {
    unsafe {
        let masks: [__mmask16; V] = std::array::from_fn(|v| mask(width.saturating_sub(16 * v)));
        let mut acc: [__m512; V] =
            std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], o.as_ptr().add(c0 + 16 * v)));
        for (j, &w) in p.iter().enumerate() {
            if w == 0.0 {
                continue;
            }
            let w = _mm512_set1_ps(w);
            let row = b.as_ptr().add(j * n + c0);
            for v in 0..V {
                acc[v] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(masks[v], row.add(16 * v)), acc[v]);
            }
        }
        for v in 0..V {
            _mm512_mask_storeu_ps(o.as_mut_ptr().add(c0 + 16 * v), masks[v], acc[v]);
        }
    }
}

// Safe entry points for the table. SAFETY (all): the AVX-512 table is only handed out after
// the CPU reported these features; `Kernels` checked the slice shapes.
pub(crate) fn f16_to_f32(src: &[u16], dst: &mut [f32]) {
    unsafe { f16_to_f32_impl(src, dst) }
}
pub(crate) fn f32_to_f16(src: &[f32], dst: &mut [u16]) {
    unsafe { f32_to_f16_impl(src, dst) }
}
pub(crate) fn round_f16(x: &mut [f32]) {
    unsafe { round_f16_impl(x) }
}
pub(crate) fn gemm_nt(a: &[f32], b: &[f32], k: usize, out: &mut [f32], ldo: usize) {
    unsafe { gemm_nt_impl(a, b, k, out, ldo) }
}
pub(crate) fn gemm_nn_acc(a: &[f32], lda: usize, b: &[f32], n: usize, out: &mut [f32]) {
    unsafe { gemm_nn_acc_impl(a, lda, b, n, out) }
}
