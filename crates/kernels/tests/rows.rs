//! Row independence: a token's results must not depend on the other tokens of its batch (how
//! many, which, in what order), on every tier and with both batch roundings, because one
//! forward pass serves many sequences and a request's greedy tokens and logprobs must not
//! change with what shares its steps. Each product is taken for a batch of 40 tokens (tiled
//! paths then run two token tiles and a remainder), then for subsets and reorderings of those
//! tokens (of 1, 2, 3, 4, 8, 10, 16 and 17 tokens: every kernel a tier switches between by the
//! number of tokens), and the bits must be equal. The same holds for the attention block products, for
//! the query rows of `gemm_nt` and `gemm_nn_acc` (and the key rows of `gemm_nt`).

use onebit_gguf::GgmlType;
use onebit_kernels::{Acts, BatchRounding, KernelTier, Kernels, MatRef, Pool};

mod common;

use common::{MATMUL_TYPES, Rng, weights};

/// Tokens of the full batch.
const N: usize = 40;

/// The subsets (in the order given) whose results must equal the full batch's.
fn subsets() -> Vec<Vec<usize>> {
    let mut shuffled: Vec<usize> = (0..N).collect();
    let mut rng = Rng(0x5ca1ab1e);
    for i in (1..N).rev() {
        shuffled.swap(i, rng.next() as usize % (i + 1));
    }
    vec![
        vec![0],
        vec![N - 1],
        vec![17],
        vec![9, 30],
        vec![30, 9],
        vec![5, 20, 38],
        vec![38, 5, 20],
        vec![2, 11, 29, 36],
        (0..8).collect(),
        (3..13).collect(),
        (0..16).collect(),
        (0..17).collect(),
        (7..24).collect(),
        (0..N).rev().collect(),
        shuffled,
    ]
}

/// `k`'s product of `w` with the tokens `which` of `x` (rows of `cols`), token-major.
fn product(k: &Kernels, pool: &Pool, w: &MatRef, x: &[f32], cols: usize, which: &[usize]) -> Vec<f32> {
    let xs: Vec<f32> = which.iter().flat_map(|&t| x[t * cols..(t + 1) * cols].iter().copied()).collect();
    let mut acts = Acts::new();
    k.quantize_acts(pool, w.ty, &xs, cols, &mut acts).unwrap();
    let mut out = vec![0f32; which.len() * w.rows];
    k.matmul(pool, w, &acts, &mut out).unwrap();
    out
}

fn check_rows(k: &Kernels, pool: &Pool, ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) {
    let data = weights(rng, ty, rows, cols);
    let w = MatRef::new(ty, rows, cols, &data).unwrap();
    let packed = k.pack(pool, &w);
    let x: Vec<f32> = (0..N * cols).map(|i| rng.f32() * [0.01f32, 1.0, 40.0][i / cols % 3]).collect();
    let all: Vec<usize> = (0..N).collect();
    for (w, how) in [(w, "plain"), (w.with_packed(packed.as_ref()), "packed")] {
        if how == "packed" && packed.is_none() {
            continue;
        }
        let full = product(k, pool, &w, &x, cols, &all);
        for which in subsets() {
            let got = product(k, pool, &w, &x, cols, &which);
            for (i, &t) in which.iter().enumerate() {
                for r in 0..rows {
                    let (a, b) = (got[i * rows + r], full[t * rows + r]);
                    assert!(
                        a.to_bits() == b.to_bits(),
                        "{k:?} {ty} ({how}) {rows}x{cols}: token {t} row {r} is {a} among tokens {which:?}, {b} in the \
                         full batch of {N}"
                    );
                }
            }
        }
    }
}

fn kernels() -> Vec<Kernels> {
    let mut ks = Vec::new();
    for tier in KernelTier::available() {
        for rounding in [BatchRounding::Fast, BatchRounding::Reference] {
            ks.push(Kernels::new(tier).unwrap().with_batch_rounding(rounding));
        }
    }
    ks
}

#[test]
fn matmul_rows_do_not_depend_on_the_batch() {
    let mut rng = Rng(0x0dd_ba7c4);
    let pool = Pool::new(2);
    for k in kernels() {
        for &ty in MATMUL_TYPES {
            for (rows, cols) in [(37, 256), (70, 768), (130, 512)] {
                check_rows(&k, &pool, ty, rows, cols, &mut rng);
            }
        }
        // Rows longer than 32768 weights (past any per-row buffer of a 1-bit kernel).
        check_rows(&k, &pool, GgmlType::Q1_0, 19, 257 * 128, &mut rng);
    }
}

#[test]
fn attention_rows_do_not_depend_on_the_batch() {
    let mut rng = Rng(0xa77e_0001);
    for k in kernels().into_iter().step_by(2) {
        for (m, n, d) in
            [(1, 1, 16), (7, 17, 64), (9, 5, 80), (33, 40, 128), (64, 64, 128), (13, 31, 100), (6, 70, 256)]
        {
            let q: Vec<f32> = (0..m * d).map(|_| rng.f32() * 4.0).collect();
            let kk: Vec<f32> = (0..n * d).map(|_| rng.f32() * 4.0).collect();
            let ldo = n + 3;
            let mut full = vec![0f32; m * ldo];
            k.gemm_nt(&q, &kk, d, &mut full, ldo);
            // Weights with zeros (runs of them in some rows, as a causal mask makes, and whole
            // rows of them) and accumulators that start at -0.
            let zero = |i: usize| i.is_multiple_of(7) || (i / ldo) % 3 == 1 && i % ldo >= n / 2 || (i / ldo) % 4 == 2;
            let p: Vec<f32> = (0..m * ldo).map(|i| if zero(i) { 0.0 } else { rng.f32().abs() }).collect();
            let init: Vec<f32> = (0..m * d).map(|i| if i % 5 == 0 { -0.0 } else { rng.f32() }).collect();
            let mut acc_full = init.clone();
            k.gemm_nn_acc(&p, ldo, &kk, d, &mut acc_full);

            let row_sets: Vec<Vec<usize>> = vec![
                vec![0],
                vec![m - 1],
                (0..m).rev().collect(),
                (0..m).step_by(2).collect(),
                (m / 2..m).collect(),
                (0..m.min(3)).collect(),
            ];
            for which in &row_sets {
                let qs: Vec<f32> = which.iter().flat_map(|&i| q[i * d..(i + 1) * d].iter().copied()).collect();
                let mut s = vec![0f32; which.len() * ldo];
                k.gemm_nt(&qs, &kk, d, &mut s, ldo);
                let ps: Vec<f32> = which.iter().flat_map(|&i| p[i * ldo..(i + 1) * ldo].iter().copied()).collect();
                let mut acc: Vec<f32> = which.iter().flat_map(|&i| init[i * d..(i + 1) * d].iter().copied()).collect();
                k.gemm_nn_acc(&ps, ldo, &kk, d, &mut acc);
                for (r, &i) in which.iter().enumerate() {
                    for j in 0..n {
                        let (a, b) = (s[r * ldo + j], full[i * ldo + j]);
                        assert!(
                            a.to_bits() == b.to_bits(),
                            "{k:?} gemm_nt {m}x{n}x{d}: [{i}][{j}] {a} among rows {which:?}, {b} in all"
                        );
                    }
                    for c in 0..d {
                        let (a, b) = (acc[r * d + c], acc_full[i * d + c]);
                        assert!(
                            a.to_bits() == b.to_bits(),
                            "{k:?} gemm_nn_acc {m}x{n}x{d}: [{i}][{c}] {a} among rows {which:?}, {b} in all"
                        );
                    }
                }
            }
            // Key rows: a block of fewer keys gives each of its scores the same bits.
            for (j0, j1) in [(0, 1), (n / 2, n), (n - 1, n)] {
                let mut s = vec![0f32; m * ldo];
                k.gemm_nt(&q, &kk[j0 * d..j1 * d], d, &mut s, ldo);
                for i in 0..m {
                    for j in j0..j1 {
                        let (a, b) = (s[i * ldo + j - j0], full[i * ldo + j]);
                        assert!(
                            a.to_bits() == b.to_bits(),
                            "{k:?} gemm_nt {m}x{n}x{d}: [{i}][{j}] {a} in keys {j0}..{j1}, {b} in all"
                        );
                    }
                }
            }
        }
    }
}
