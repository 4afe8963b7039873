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
            let r = (m - i).min(4);
            assert!((i + r) * k <= a.len() && (i + r - 1) * ldo + j0 + rows <= out.len());
            // SAFETY: rows i..i + r of `a` and of `out` (from column j0, `rows` wide) lie inside
            // them (just checked); the store mask stops at `rows`.
            unsafe {
                let (pa, po) = (a.as_ptr().add(i * k), out.as_mut_ptr().add(i * ldo + j0));
                match r {
                    4 => dots16::<4>(pa, k, &bt[..k], po, ldo, store),
                    3 => dots16::<3>(pa, k, &bt[..k], po, ldo, store),
                    2 => dots16::<2>(pa, k, &bt[..k], po, ldo, store),
                    _ => dots16::<1>(pa, k, &bt[..k], po, ldo, store),
                }
            }
            i += r;
        }
    }
}

/// Sixteen dot products of each of `R` rows of `k` values at `a` with the transposed block
/// `bt`, stored (lanes in `store`) at `out`, `ldo` apart; two accumulators per row (even and
/// odd `d`) so that FMA latency is hidden.
#[inline(always)]
unsafe fn dots16<const R: usize>(a: *const f32, k: usize, bt: &[__m512], out: *mut f32, ldo: usize, store: __mmask16) {
    unsafe {
        let mut even = [_mm512_setzero_ps(); R];
        let mut odd = [_mm512_setzero_ps(); R];
        for c in 0..k / 2 {
            let d = 2 * c;
            for r in 0..R {
                even[r] = _mm512_fmadd_ps(_mm512_set1_ps(*a.add(r * k + d)), bt[d], even[r]);
                odd[r] = _mm512_fmadd_ps(_mm512_set1_ps(*a.add(r * k + d + 1)), bt[d + 1], odd[r]);
            }
        }
        if k % 2 == 1 {
            for (r, e) in even.iter_mut().enumerate() {
                *e = _mm512_fmadd_ps(_mm512_set1_ps(*a.add(r * k + k - 1)), bt[k - 1], *e);
            }
        }
        for r in 0..R {
            _mm512_mask_storeu_ps(out.add(r * ldo), store, _mm512_add_ps(even[r], odd[r]));
        }
    }
}

/// `out_i += Σ_j a[i·lda + j] · b_j` for rows `b_j` of `n` values (`out` is m × n). Three
/// output rows at a time share each loaded row of `b`.
#[target_feature(enable = "avx512f")]
fn gemm_nn_acc_impl(a: &[f32], lda: usize, b: &[f32], n: usize, out: &mut [f32]) {
    let (m, kk) = (out.len() / n, b.len() / n);
    let mut i = 0;
    while i < m {
        let r = (m - i).min(3);
        assert!((i + r - 1) * lda + kk <= a.len() && (i + r) * n <= out.len());
        for c0 in (0..n).step_by(128) {
            let width = (n - c0).min(128);
            // SAFETY: rows i..i + r of `a` (kk values each) and of `out` lie inside them (just
            // checked), and `width` columns from `c0` lie inside every row of `out` and `b`.
            unsafe {
                let (pa, po) = (a.as_ptr().add(i * lda), out.as_mut_ptr().add(i * n));
                match r {
                    3 => acc_rows::<3>(pa, lda, kk, b, n, c0, width, po),
                    2 => acc_rows::<2>(pa, lda, kk, b, n, c0, width, po),
                    _ => acc_rows::<1>(pa, lda, kk, b, n, c0, width, po),
                }
            }
        }
        i += r;
    }
}

/// `R` output rows (at `o`, `n` apart) of columns `c0 .. c0 + width`, their weights at `p`
/// (`lda` apart, `kk` each).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn acc_rows<const R: usize>(
    p: *const f32,
    lda: usize,
    kk: usize,
    b: &[f32],
    n: usize,
    c0: usize,
    width: usize,
    o: *mut f32,
) {
    // SAFETY (caller): as for `acc_cols`.
    unsafe {
        match width.div_ceil(16) {
            8 => acc_cols::<8, R>(p, lda, kk, b, n, c0, width, o),
            7 => acc_cols::<7, R>(p, lda, kk, b, n, c0, width, o),
            6 => acc_cols::<6, R>(p, lda, kk, b, n, c0, width, o),
            5 => acc_cols::<5, R>(p, lda, kk, b, n, c0, width, o),
            4 => acc_cols::<4, R>(p, lda, kk, b, n, c0, width, o),
            3 => acc_cols::<3, R>(p, lda, kk, b, n, c0, width, o),
            2 => acc_cols::<2, R>(p, lda, kk, b, n, c0, width, o),
            _ => acc_cols::<1, R>(p, lda, kk, b, n, c0, width, o),
        }
    }
}

/// Columns `c0 .. c0 + width` (at most 16 V) of `R` output rows, kept in registers while the
/// weighted rows stream past (each loaded once for the `R` rows; rows all weighted 0 are
/// skipped: the causal tail).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn acc_cols<const V: usize, const R: usize>(
    p: *const f32,
    lda: usize,
    kk: usize,
    b: &[f32],
    n: usize,
    c0: usize,
    width: usize,
    o: *mut f32,
) {
    unsafe {
        let masks: [__mmask16; V] = std::array::from_fn(|v| mask(width.saturating_sub(16 * v)));
        let mut acc: [[__m512; V]; R] = std::array::from_fn(|r| {
            std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], o.add(r * n + c0 + 16 * v)))
        });
        for j in 0..kk {
            let w: [f32; R] = std::array::from_fn(|r| *p.add(r * lda + j));
            if w.iter().all(|&w| w == 0.0) {
                continue;
            }
            let w: [__m512; R] = std::array::from_fn(|r| _mm512_set1_ps(w[r]));
            let row = b.as_ptr().add(j * n + c0);
            for v in 0..V {
                let x = _mm512_maskz_loadu_ps(masks[v], row.add(16 * v));
                for r in 0..R {
                    acc[r][v] = _mm512_fmadd_ps(w[r], x, acc[r][v]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for v in 0..V {
                _mm512_mask_storeu_ps(o.add(r * n + c0 + 16 * v), masks[v], acc[v]);
            }
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
