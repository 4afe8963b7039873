//! The f32 products of attention (scores and the weighted sum of values), four lanes wide.

use std::arch::aarch64::*;

pub(super) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: the NEON table is handed out only after checking NEON.
    unsafe { dot(a, b) }
}

#[target_feature(enable = "neon")]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (u, acc) in acc.iter_mut().enumerate() {
            // SAFETY: i + 16 <= n.
            let (x, y) = unsafe { (vld1q_f32(a.as_ptr().add(i + 4 * u)), vld1q_f32(b.as_ptr().add(i + 4 * u))) };
            *acc = vfmaq_f32(*acc, x, y);
        }
        i += 16;
    }
    let mut sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for j in i..n {
        sum += a[j] * b[j];
    }
    sum
}

pub(super) fn gemm_nt(a: &[f32], b: &[f32], k: usize, out: &mut [f32], ldo: usize) {
    for (i, ai) in a.chunks_exact(k).enumerate() {
        for (j, bj) in b.chunks_exact(k).enumerate() {
            out[i * ldo + j] = dot_f32(ai, bj);
        }
    }
}

pub(super) fn gemm_nn_acc(a: &[f32], lda: usize, b: &[f32], n: usize, out: &mut [f32]) {
    // SAFETY: the NEON table is handed out only after checking NEON.
    unsafe { nn_acc(a, lda, b, n, out) }
}

#[target_feature(enable = "neon")]
fn nn_acc(a: &[f32], lda: usize, b: &[f32], n: usize, out: &mut [f32]) {
    for (i, oi) in out.chunks_exact_mut(n).enumerate() {
        for (j, bj) in b.chunks_exact(n).enumerate() {
            let w = a[i * lda + j];
            let wv = vdupq_n_f32(w);
            let mut c = 0;
            while c + 4 <= n {
                // SAFETY: c + 4 <= n, the length of both rows.
                unsafe {
                    let o = vld1q_f32(oi.as_ptr().add(c));
                    vst1q_f32(oi.as_mut_ptr().add(c), vfmaq_f32(o, wv, vld1q_f32(bj.as_ptr().add(c))));
                }
                c += 4;
            }
            for (o, &v) in oi[c..].iter_mut().zip(&bj[c..]) {
                *o += w * v;
            }
        }
    }
}
