//! Every safe entry point of the kernels, given arguments whose lengths do not fit together,
//! panics or returns an error, on every tier this machine has: the SIMD tiers load and store
//! whole vectors up to one slice's length, so a length that was not checked would read or write
//! out of bounds (AddressSanitizer catches that in `scripts/test-sanitizers.sh`).

use std::panic::{AssertUnwindSafe, catch_unwind};

use onebit_gguf::GgmlType;
use onebit_kernels::{ActFormat, Acts, KernelError, KernelTier, Kernels, MatRef, Pages, Pool};

/// Each tier this machine runs.
fn each_tier(mut f: impl FnMut(Kernels)) {
    for tier in KernelTier::available() {
        f(Kernels::new(tier).unwrap());
    }
}

/// `f` panics (with the message that names the check, not somewhere inside a kernel).
#[track_caller]
fn panics(k: Kernels, what: &str, f: impl FnOnce()) {
    let err = catch_unwind(AssertUnwindSafe(f)).expect_err(&format!("{}: {what} did not panic", k.tier()));
    let msg = err.downcast_ref::<String>().map(String::as_str).or(err.downcast_ref::<&str>().copied()).unwrap_or("");
    assert!(!msg.is_empty(), "{}: {what} panicked without a message", k.tier());
}

#[test]
fn rms_norm_lengths() {
    each_tier(|k| {
        let x = [1.0f32; 33];
        let mut out = [0f32; 33];
        panics(k, "rms_norm with a short weight", || k.rms_norm(&x, &[1.0; 32], 1e-6, &mut out));
        panics(k, "rms_norm with a short output", || k.rms_norm(&x, &[1.0; 33], 1e-6, &mut [0f32; 17]));
        panics(k, "rms_norm with a long weight", || k.rms_norm(&x[..16], &[1.0; 33], 1e-6, &mut out[..16]));
        k.rms_norm(&x, &[1.0; 33], 1e-6, &mut out);
    });
}

/// One slice: any length is fine, including none and lengths that are not whole vectors.
#[test]
fn softmax_and_round_f16_take_any_length() {
    each_tier(|k| {
        for n in 0..70 {
            let mut x: Vec<f32> = (0..n).map(|i| i as f32 * 0.1).collect();
            k.round_f16(&mut x);
            k.softmax(&mut x);
            assert!(n == 0 || (x.iter().sum::<f32>() - 1.0).abs() < 1e-3);
        }
    });
}

#[test]
fn silu_mul_lengths() {
    each_tier(|k| {
        panics(k, "silu_mul with a short up", || k.silu_mul(&mut [1.0; 40], &[1.0; 24]));
        panics(k, "silu_mul with a long up", || k.silu_mul(&mut [1.0; 24], &[1.0; 40]));
    });
}

#[test]
fn dot_f32_lengths() {
    each_tier(|k| {
        panics(k, "dot_f32 with a short b", || {
            k.dot_f32(&[1.0; 48], &[1.0; 17]);
        });
        panics(k, "dot_f32 with a short a", || {
            k.dot_f32(&[1.0; 17], &[1.0; 48]);
        });
    });
}

#[test]
fn f16_conversion_lengths() {
    each_tier(|k| {
        panics(k, "f16_to_f32 into a short output", || k.f16_to_f32(&[0; 40], &mut [0f32; 20]));
        panics(k, "f16_to_f32 from a short input", || k.f16_to_f32(&[0; 20], &mut [0f32; 40]));
        panics(k, "f32_to_f16 into a short output", || k.f32_to_f16(&[0.0; 40], &mut [0u16; 20]));
        panics(k, "f32_to_f16 from a short input", || k.f32_to_f16(&[0.0; 20], &mut [0u16; 40]));
    });
}

#[test]
fn gemm_nt_lengths() {
    each_tier(|k| {
        let (a, b) = ([1.0f32; 3 * 16], [1.0f32; 5 * 16]);
        panics(k, "gemm_nt into a short output", || k.gemm_nt(&a, &b, 16, &mut [0f32; 14], 5));
        panics(k, "gemm_nt with ldo below n", || k.gemm_nt(&a, &b, 16, &mut [0f32; 15], 4));
        panics(k, "gemm_nt with a not whole rows", || k.gemm_nt(&a[..40], &b, 16, &mut [0f32; 15], 5));
        panics(k, "gemm_nt with b not whole rows", || k.gemm_nt(&a, &b[..70], 16, &mut [0f32; 15], 5));
        panics(k, "gemm_nt with k = 0", || k.gemm_nt(&a, &b, 0, &mut [0f32; 15], 5));
        k.gemm_nt(&a, &b, 16, &mut [0f32; 15], 5);
    });
}

#[test]
fn gemm_nn_acc_lengths() {
    each_tier(|k| {
        // out: 3 rows of 16; b: 5 rows of 16; a: 3 rows of 5 weights, lda 5.
        let b = [1.0f32; 5 * 16];
        panics(k, "gemm_nn_acc with short weights", || k.gemm_nn_acc(&[1.0; 14], 5, &b, 16, &mut [0f32; 48]));
        panics(k, "gemm_nn_acc with lda below the rows of b", || k.gemm_nn_acc(&[1.0; 15], 4, &b, 16, &mut [0f32; 48]));
        panics(k, "gemm_nn_acc with b not whole rows", || k.gemm_nn_acc(&[1.0; 15], 5, &b[..70], 16, &mut [0f32; 48]));
        panics(k, "gemm_nn_acc with out not whole rows", || k.gemm_nn_acc(&[1.0; 15], 5, &b, 16, &mut [0f32; 40]));
        panics(k, "gemm_nn_acc with n = 0", || k.gemm_nn_acc(&[1.0; 15], 5, &b, 0, &mut [0f32; 48]));
        k.gemm_nn_acc(&[1.0; 15], 5, &b, 16, &mut [0f32; 48]);
    });
}

#[test]
fn gemm_nt_pages_lengths() {
    each_tier(|k| {
        let a = [1.0f32; 3 * 16];
        let (r0, r1) = ([1.0f32; 2 * 16], [1.0f32; 3 * 16]);
        let (h0, h1) = ([0u16; 2 * 16], [0u16; 3 * 16]);
        let f32_runs: &[&[f32]] = &[&r0, &r1];
        let f16_runs: &[&[u16]] = &[&h0, &h1];
        for b in [Pages::F32(f32_runs), Pages::F16(f16_runs)] {
            panics(k, "gemm_nt_pages into a short output", || k.gemm_nt_pages(&a, b, 16, &mut [0f32; 14], 5));
            panics(k, "gemm_nt_pages with ldo below n", || k.gemm_nt_pages(&a, b, 16, &mut [0f32; 15], 4));
            panics(k, "gemm_nt_pages with a not whole rows", || k.gemm_nt_pages(&a[..40], b, 16, &mut [0f32; 15], 5));
            k.gemm_nt_pages(&a, b, 16, &mut [0f32; 15], 5);
        }
        let ragged: &[&[f32]] = &[&r0[..24], &r1];
        panics(k, "gemm_nt_pages with a run not whole rows", || {
            k.gemm_nt_pages(&a, Pages::F32(ragged), 16, &mut [0f32; 15], 5)
        });
        let ragged: &[&[u16]] = &[&h0, &h1[..40]];
        panics(k, "gemm_nt_pages with a run of halves not whole rows", || {
            k.gemm_nt_pages(&a, Pages::F16(ragged), 16, &mut [0f32; 15], 5)
        });
        // Q8_0 rows: whole blocks of 34 bytes per 32 values, and rows a multiple of 32.
        let a32 = [1.0f32; 3 * 32];
        let q = [0u8; 5 * 34];
        k.gemm_nt_pages(&a32, Pages::Q8_0(&[&q[..2 * 34], &q[2 * 34..]]), 32, &mut [0f32; 15], 5);
        panics(k, "gemm_nt_pages with a run of Q8_0 not whole blocks", || {
            k.gemm_nt_pages(&a32, Pages::Q8_0(&[&q[..2 * 34 + 1], &q[2 * 34 + 1..]]), 32, &mut [0f32; 15], 5)
        });
        panics(k, "gemm_nt_pages with Q8_0 rows not whole blocks", || {
            k.gemm_nt_pages(&a, Pages::Q8_0(&[&q[..3 * 34]]), 16, &mut [0f32; 18], 6)
        });
        panics(k, "gemm_nt_pages of Q8_0 into a short output", || {
            k.gemm_nt_pages(&a32, Pages::Q8_0(&[&q]), 32, &mut [0f32; 14], 5)
        });
    });
}

#[test]
fn scores_q8_0_and_its_queries_lengths() {
    each_tier(|k| {
        let q = [0u8; 3 * 34];
        let keys = [0u8; 5 * 34];
        let runs: &[&[u8]] = &[&keys[..2 * 34], &keys[2 * 34..]];
        k.scores_q8_0(&q, runs, 32, &mut [0f32; 15], 5);
        panics(k, "scores_q8_0 into a short output", || k.scores_q8_0(&q, runs, 32, &mut [0f32; 14], 5));
        panics(k, "scores_q8_0 with ldo below n", || k.scores_q8_0(&q, runs, 32, &mut [0f32; 15], 4));
        panics(k, "scores_q8_0 with queries not whole rows", || k.scores_q8_0(&q[..90], runs, 32, &mut [0f32; 15], 5));
        panics(k, "scores_q8_0 with a run not whole rows", || {
            k.scores_q8_0(&q, &[&keys[..35], &keys[35..]], 32, &mut [0f32; 15], 5)
        });
        panics(k, "scores_q8_0 with rows not whole blocks", || k.scores_q8_0(&q, runs, 16, &mut [0f32; 30], 10));
        panics(k, "scores_q8_0 with rows wider than a head", || {
            k.scores_q8_0(&[0u8; 17 * 34], &[&[0u8; 17 * 34]], 544, &mut [0f32; 1], 1)
        });
        let mut out = [0u8; 2 * 34];
        k.quantize_q8_0(&[1.0; 64], &mut out);
        panics(k, "quantize_q8_0 into a short output", || k.quantize_q8_0(&[1.0; 64], &mut out[..67]));
        panics(k, "quantize_q8_0 of a part of a block", || k.quantize_q8_0(&[1.0; 48], &mut out[..51]));
    });
}

#[test]
fn gemm_nn_acc_pages_lengths() {
    each_tier(|k| {
        let (r0, r1) = ([1.0f32; 2 * 16], [1.0f32; 3 * 16]);
        let (h0, h1) = ([0u16; 2 * 16], [0u16; 3 * 16]);
        let f32_runs: &[&[f32]] = &[&r0, &r1];
        let f16_runs: &[&[u16]] = &[&h0, &h1];
        for b in [Pages::F32(f32_runs), Pages::F16(f16_runs)] {
            panics(k, "gemm_nn_acc_pages with short weights", || {
                k.gemm_nn_acc_pages(&[1.0; 14], 5, b, 16, &mut [0f32; 48])
            });
            panics(k, "gemm_nn_acc_pages with lda below the rows", || {
                k.gemm_nn_acc_pages(&[1.0; 15], 4, b, 16, &mut [0f32; 48])
            });
            panics(k, "gemm_nn_acc_pages with out not whole rows", || {
                k.gemm_nn_acc_pages(&[1.0; 15], 5, b, 16, &mut [0f32; 40])
            });
            k.gemm_nn_acc_pages(&[1.0; 15], 5, b, 16, &mut [0f32; 48]);
        }
        let ragged: &[&[f32]] = &[&r0[..24], &r1];
        panics(k, "gemm_nn_acc_pages with a run not whole rows", || {
            k.gemm_nn_acc_pages(&[1.0; 15], 5, Pages::F32(ragged), 16, &mut [0f32; 48])
        });
        let q = [0u8; 5 * 34];
        k.gemm_nn_acc_pages(&[1.0; 15], 5, Pages::Q8_0(&[&q[..34], &q[34..]]), 32, &mut [0f32; 96]);
        panics(k, "gemm_nn_acc_pages with short weights for Q8_0 rows", || {
            k.gemm_nn_acc_pages(&[1.0; 14], 5, Pages::Q8_0(&[&q]), 32, &mut [0f32; 96])
        });
        panics(k, "gemm_nn_acc_pages with a run of Q8_0 not whole rows", || {
            k.gemm_nn_acc_pages(&[1.0; 15], 5, Pages::Q8_0(&[&q[..35], &q[35..]]), 32, &mut [0f32; 96])
        });
    });
}

/// Zeroed weights of `ty`, `rows` × `cols` (zero scales: valid blocks of every type used here).
fn zeros(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    vec![0u8; rows * ty.bytes_for(cols as u64).unwrap() as usize]
}

fn acts(k: Kernels, pool: &Pool, ty: GgmlType, tokens: usize, cols: usize) -> Acts {
    let mut acts = Acts::new();
    k.quantize_acts(pool, ty, &vec![0.5f32; tokens * cols], cols, &mut acts).unwrap();
    acts
}

#[test]
fn quantize_acts_lengths() {
    let pool = Pool::new(2);
    each_tier(|k| {
        let mut acts = Acts::new();
        let x = vec![1.0f32; 3 * 64 + 5];
        let ty = GgmlType::Q8_0;
        assert!(matches!(k.quantize_acts(&pool, ty, &x, 64, &mut acts), Err(KernelError::Shape(_))));
        assert!(k.quantize_acts_for(&pool, &[ty, ty], &x, 64, &mut acts).is_err());
        assert!(k.quantize_acts_in(&pool, ActFormat::Q8_0, ty, &x, 64, &mut acts).is_err());
        // Rows that are not whole blocks of the format.
        assert!(k.quantize_acts(&pool, ty, &x[..3 * 40], 40, &mut acts).is_err());
        // Values, but rows of nothing.
        assert!(k.quantize_acts(&pool, ty, &x[..64], 0, &mut acts).is_err());
        k.quantize_acts(&pool, ty, &x[..3 * 64], 64, &mut acts).unwrap();
        assert_eq!(acts.rows(), 3);
    });
}

#[test]
fn matmul_lengths() {
    let pool = Pool::new(2);
    each_tier(|k| {
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q1_0] {
            let (rows, cols, tokens) = (64, 256, 3);
            let data = zeros(ty, rows, cols);
            let w = MatRef::new(ty, rows, cols, &data).unwrap();
            let a = acts(k, &pool, ty, tokens, cols);
            let mut out = vec![0f32; tokens * rows];
            assert!(k.matmul(&pool, &w, &a, &mut out[..tokens * rows - 1]).is_err(), "{} {ty}", k.tier());
            // Activations of another width.
            let narrow = acts(k, &pool, ty, tokens, cols / 2);
            assert!(k.matmul(&pool, &w, &narrow, &mut out).is_err());
            // A matrix built by hand whose bytes are short of its shape.
            let short = MatRef { rows: rows + 16, ..w };
            assert!(k.matmul(&pool, &short, &a, &mut vec![0f32; tokens * (rows + 16)]).is_err());
            assert!(MatRef::new(ty, rows + 16, cols, &data).is_err());
            assert!(k.pack(&pool, &short).is_none());
            // A packed form whose public shape was changed after packing.
            if let Some(mut packed) = k.pack(&pool, &w) {
                packed.rows += 64;
                let data2 = zeros(ty, rows + 64, cols);
                let big = MatRef { packed: Some(&packed), ..MatRef::new(ty, rows + 64, cols, &data2).unwrap() };
                assert!(k.matmul(&pool, &big, &a, &mut vec![0f32; tokens * (rows + 64)]).is_err());
                assert!(big.with_packed(Some(&packed)).packed.is_none());
                packed.rows -= 64;
                k.matmul(&pool, &w.with_packed(Some(&packed)), &a, &mut out).unwrap();
            }
            k.matmul(&pool, &w, &a, &mut out).unwrap();
        }
    });
}

#[test]
fn matmul_many_lengths() {
    let pool = Pool::new(2);
    each_tier(|k| {
        let (ty, cols, tokens) = (GgmlType::Q8_0, 128, 2);
        let (d1, d2) = (zeros(ty, 32, cols), zeros(ty, 48, cols));
        let (w1, w2) = (MatRef::new(ty, 32, cols, &d1).unwrap(), MatRef::new(ty, 48, cols, &d2).unwrap());
        let a = acts(k, &pool, ty, tokens, cols);
        let (mut o1, mut o2) = (vec![0f32; tokens * 32], vec![0f32; tokens * 48]);
        assert!(k.matmul_many(&pool, &[&w1, &w2], &a, &mut [&mut o1]).is_err());
        assert!(k.matmul_many(&pool, &[&w1], &a, &mut [&mut o1, &mut o2]).is_err());
        assert!(k.matmul_many(&pool, &[&w1, &w2], &a, &mut [&mut o1, &mut o2[..tokens * 48 - 1]]).is_err());
        assert!(k.matmul_many(&pool, &[&w2, &w1], &a, &mut [&mut o1, &mut o2]).is_err());
        k.matmul_many(&pool, &[&w1, &w2], &a, &mut [&mut o1, &mut o2]).unwrap();
    });
}

#[test]
fn matmul_glu_acts_lengths() {
    let pool = Pool::new(2);
    each_tier(|k| {
        let (ty, cols, tokens) = (GgmlType::Q8_0, 128, 2);
        let (dg, du, du2) = (zeros(ty, 64, cols), zeros(ty, 64, cols), zeros(ty, 96, cols));
        let gate = MatRef::new(ty, 64, cols, &dg).unwrap();
        let up = MatRef::new(ty, 64, cols, &du).unwrap();
        let up_taller = MatRef::new(ty, 96, cols, &du2).unwrap();
        let a = acts(k, &pool, ty, tokens, cols);
        let mut out = Acts::new();
        assert!(k.matmul_glu_acts(&pool, &gate, &up_taller, &a, &[ty], &mut out).is_err());
        let narrow = acts(k, &pool, ty, tokens, cols / 2);
        assert!(k.matmul_glu_acts(&pool, &gate, &up, &narrow, &[ty], &mut out).is_err());
        assert!(k.matmul_glu_acts(&pool, &gate, &up, &a, &[], &mut out).is_err());
        let short = MatRef { rows: 80, ..up };
        assert!(k.matmul_glu_acts(&pool, &gate, &short, &a, &[ty], &mut out).is_err());
        k.matmul_glu_acts(&pool, &gate, &up, &a, &[ty], &mut out).unwrap();
        assert_eq!((out.rows(), out.cols()), (tokens, 64));
    });
}

/// Float weights take rows of any width (their activations are f32, one value per block): the
/// vector products must stop at the row's end, and agree with the scalar reference.
#[test]
fn float_weights_of_any_width() {
    let pool = Pool::new(2);
    let scalar = Kernels::new(KernelTier::Scalar).unwrap();
    each_tier(|k| {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            for cols in [1, 7, 17, 33, 47] {
                let rows = 3;
                let x: Vec<f32> = (0..rows * cols).map(|i| (i % 7) as f32 * 0.25 - 0.5).collect();
                // Exactly the matrix's bytes: a read past a row's end runs past the buffer.
                let mut data = vec![0u8; rows * ty.bytes_for(cols as u64).unwrap() as usize];
                onebit_kernels::formats::quantize(ty, &x, &mut data).unwrap();
                let w = MatRef::new(ty, rows, cols, &data).unwrap();
                let a = acts(k, &pool, ty, 2, cols);
                let (mut got, mut want) = (vec![0f32; 2 * rows], vec![0f32; 2 * rows]);
                k.matmul(&pool, &w, &a, &mut got).unwrap();
                scalar.matmul(&pool, &w, &a, &mut want).unwrap();
                for (g, e) in got.iter().zip(&want) {
                    assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{} {ty} × {cols}: {g} vs {e}", k.tier());
                }
            }
        }
    });
}
