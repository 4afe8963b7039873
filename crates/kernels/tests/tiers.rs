//! Every SIMD tier against the scalar reference, on random inputs: odd sizes, several token
//! counts (decode and batched paths), tiny and huge scales. Products must agree to within
//! 1e-5 of the sum of |terms| (the integer parts are exact; only f32 summation order differs).

use onebit_gguf::GgmlType;
use onebit_kernels::{Acts, Glu, KernelTier, Kernels, MatRef, Pages, Pool};

mod common;

use common::{MATMUL_TYPES, Rng, weights};

fn simd_tiers() -> Vec<KernelTier> {
    KernelTier::available().into_iter().filter(|&t| t != KernelTier::Scalar).collect()
}

/// Random weights of `ty` (`rows` × `cols`), with per-row magnitudes from 1e-3 to 1e3.
fn check_matmul(tier: KernelTier, ty: GgmlType, rows: usize, cols: usize, tokens: usize, rng: &mut Rng) {
    check_matmul_beside(tier, ty, &[], rows, cols, tokens, rng)
}

/// As [`check_matmul`], with activations quantized for `ty` and the types `beside` together
/// (as a forward pass quantizes them once for products that share them).
fn check_matmul_beside(
    tier: KernelTier,
    ty: GgmlType,
    beside: &[GgmlType],
    rows: usize,
    cols: usize,
    tokens: usize,
    rng: &mut Rng,
) {
    let (simd, scalar) = (Kernels::new(tier).unwrap(), Kernels::new(KernelTier::Scalar).unwrap());
    let pool = Pool::new(2);
    let data = weights(rng, ty, rows, cols);
    let w = MatRef::new(ty, rows, cols, &data).unwrap();
    let x: Vec<f32> = (0..tokens * cols).map(|i| rng.f32() * [0.01f32, 1.0, 40.0][i / cols % 3]).collect();
    let (mut a_simd, mut a_ref) = (Acts::new(), Acts::new());
    simd.quantize_acts_for(&pool, &[&[ty], beside].concat(), &x, cols, &mut a_simd).unwrap();
    // The reference rounds the activations as the tier chose to (batches may take a coarser
    // format; see `BatchRounding`).
    scalar.quantize_acts_in(&pool, a_simd.format(), ty, &x, cols, &mut a_ref).unwrap();
    assert_eq!(a_simd.bytes(), a_ref.bytes(), "{tier} {ty}: quantized activations differ from the reference");
    let (mut got, mut want) = (vec![0f32; tokens * rows], vec![0f32; tokens * rows]);
    simd.matmul(&pool, &w, &a_simd, &mut got).unwrap();
    scalar.matmul(&pool, &w, &a_ref, &mut want).unwrap();
    // The tier's repacked layout, where it has one, must give the same products.
    let packed = simd.pack(&pool, &w);
    let mut got_packed = got.clone();
    if let Some(p) = &packed {
        simd.matmul(&pool, &w.with_packed(Some(p)), &a_simd, &mut got_packed).unwrap();
    }
    // The size of the terms: |W| · |X| per output, from the dequantized weights.
    let mut wd = vec![0f32; rows * cols];
    onebit_kernels::formats::dequantize(ty, &data, &mut wd).unwrap();
    for t in 0..tokens {
        for r in 0..rows {
            let mag: f32 = (0..cols).map(|k| (wd[r * cols + k] * x[t * cols + k]).abs()).sum();
            let e = want[t * rows + r];
            for (g, how) in [(got[t * rows + r], "plain"), (got_packed[t * rows + r], "packed")] {
                assert!(
                    (g - e).abs() <= 1e-5 * mag + f32::MIN_POSITIVE,
                    "{tier} {ty} ({how}) {rows}x{cols}, {tokens} tokens: out[{t}][{r}] = {g}, reference {e} (terms {mag})"
                );
            }
        }
    }
}

/// The tiers this CPU should run are there, so that the comparisons below are not vacuous.
#[test]
fn the_cpu_s_tiers_are_available() {
    let have = KernelTier::available();
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
        assert!(have.contains(&KernelTier::Avx2), "{have:?}");
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("dotprod") {
        assert!(have.contains(&KernelTier::Neon), "{have:?}");
    }
    assert!(have.contains(&KernelTier::Scalar));
}

#[test]
fn matmuls_match_the_scalar_reference() {
    let mut rng = Rng(0xdead_beef);
    for tier in simd_tiers() {
        for &ty in MATMUL_TYPES {
            let cols_unit = (ty.block_size() as usize).max(32).max(if ty.block_size() == 1 { 32 } else { 0 });
            let k = (256 / cols_unit).max(1) * cols_unit; // a multiple of every block size
            for (rows, cols, tokens) in [
                (1, k, 1),
                (37, 3 * k, 1),
                (65, 3 * k, 2),
                (45, 2 * k, 4),
                (19, k, 5),
                (33, 5 * k, 17),
                (64, 2 * k, 40),
                (130, 2 * k, 3),
            ] {
                check_matmul(tier, ty, rows, cols, tokens, &mut rng);
            }
        }
    }
}

/// Q1_0 weights beside a type with 32-value activation blocks take those blocks, four to a
/// weight block (the AMX narrow tiles' one-step path), at several token counts and odd rows.
#[test]
fn q1_0_products_with_32_value_activation_blocks_match_the_reference() {
    let mut rng = Rng(0x0b17);
    for tier in simd_tiers() {
        for (rows, tokens) in [(33, 5), (130, 3), (19, 17), (64, 8)] {
            check_matmul_beside(tier, GgmlType::Q1_0, &[GgmlType::Q8_0], rows, 512, tokens, &mut rng);
        }
    }
}

#[test]
fn vector_ops_match_the_scalar_reference() {
    let mut rng = Rng(0x5eed);
    let scalar = Kernels::new(KernelTier::Scalar).unwrap();
    for tier in simd_tiers() {
        let k = Kernels::new(tier).unwrap();
        for n in [1usize, 7, 32, 63, 64, 65, 257, 4096] {
            let x: Vec<f32> = (0..n).map(|_| rng.f32() * 30.0).collect();
            let y: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
            let h: Vec<u16> = y.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
            let close = |a: f32, b: f32, mag: f32| (a - b).abs() <= 1e-5 * mag.max(a.abs()).max(1e-30);

            let (mut o1, mut o2) = (vec![0f32; n], vec![0f32; n]);
            k.rms_norm(&x, &y, 1e-6, &mut o1);
            scalar.rms_norm(&x, &y, 1e-6, &mut o2);
            assert!(o1.iter().zip(&o2).all(|(a, b)| close(*a, *b, b.abs())), "{tier} rms_norm n={n}");

            let (mut s1, mut s2) = (x.clone(), x.clone());
            k.softmax(&mut s1);
            scalar.softmax(&mut s2);
            assert!(s1.iter().zip(&s2).all(|(a, b)| close(*a, *b, *b)), "{tier} softmax n={n}");

            let (mut g1, mut g2) = (x.clone(), x.clone());
            k.silu_mul(&mut g1, &y);
            scalar.silu_mul(&mut g2, &y);
            assert!(g1.iter().zip(&g2).all(|(a, b)| close(*a, *b, b.abs())), "{tier} silu_mul n={n}");

            // GEGLU looks its values up: every tier gives the reference's bits, also at and
            // around the limits of the table (±10) and at values that round to f16 ties.
            let mut gates = x.iter().map(|v| v / 2.0).collect::<Vec<f32>>();
            for (i, g) in gates.iter_mut().enumerate().take(6) {
                *g = [-10.0, 10.0, -10.000001, 9.999999, 1.000_488_3, -0.0][i];
            }
            let (mut g1, mut g2) = (gates.clone(), gates.clone());
            k.gelu_mul(&mut g1, &y);
            scalar.gelu_mul(&mut g2, &y);
            assert_eq!(g1, g2, "{tier} gelu_mul n={n}");

            let mag: f32 = x.iter().zip(&y).map(|(a, b)| (a * b).abs()).sum();
            assert!(close(k.dot_f32(&x, &y), scalar.dot_f32(&x, &y), mag), "{tier} dot_f32 n={n}");

            let (mut w1, mut w2) = (vec![0f32; n], vec![0f32; n]);
            k.f16_to_f32(&h, &mut w1);
            scalar.f16_to_f32(&h, &mut w2);
            assert_eq!(w1, w2, "{tier} f16_to_f32 n={n}");
            let (mut h1, mut h2) = (vec![0u16; n], vec![0u16; n]);
            k.f32_to_f16(&x, &mut h1);
            scalar.f32_to_f16(&x, &mut h2);
            assert_eq!(h1, h2, "{tier} f32_to_f16 n={n}");
            let (mut r1, mut r2) = (x.clone(), x.clone());
            k.round_f16(&mut r1);
            scalar.round_f16(&mut r2);
            assert_eq!(r1, r2, "{tier} round_f16 n={n}");
        }
    }
}

/// The attention block products: `Q·Kᵀ` into a strided score matrix and `P·V` accumulated,
/// with odd shapes (rows that are not multiples of 16, one query, strides with slack).
#[test]
fn attention_blocks_match_the_scalar_reference() {
    let mut rng = Rng(0xa77e);
    let scalar = Kernels::new(KernelTier::Scalar).unwrap();
    for tier in simd_tiers() {
        let k = Kernels::new(tier).unwrap();
        for (m, n, d) in
            [(1, 1, 16), (3, 17, 64), (8, 5, 80), (33, 40, 128), (64, 64, 128), (7, 31, 256), (4, 40, 128), (4, 35, 80)]
        {
            let q: Vec<f32> = (0..m * d).map(|_| rng.f32() * 4.0).collect();
            let kk: Vec<f32> = (0..n * d).map(|_| rng.f32() * 4.0).collect();
            let ldo = n + 3;
            let (mut s1, mut s2) = (vec![0f32; m * ldo], vec![0f32; m * ldo]);
            k.gemm_nt(&q, &kk, d, &mut s1, ldo);
            scalar.gemm_nt(&q, &kk, d, &mut s2, ldo);
            for i in 0..m {
                for j in 0..n {
                    let mag: f32 = (0..d).map(|c| (q[i * d + c] * kk[j * d + c]).abs()).sum();
                    let (a, b) = (s1[i * ldo + j], s2[i * ldo + j]);
                    assert!((a - b).abs() <= 1e-5 * mag, "{tier} gemm_nt {m}x{n}x{d} [{i}][{j}]: {a} vs {b}");
                }
            }
            let p: Vec<f32> = (0..m * ldo).map(|i| if i % 7 == 0 { 0.0 } else { rng.f32().abs() }).collect();
            let init: Vec<f32> = (0..m * d).map(|_| rng.f32()).collect();
            let (mut o1, mut o2) = (init.clone(), init.clone());
            k.gemm_nn_acc(&p, ldo, &kk, d, &mut o1);
            scalar.gemm_nn_acc(&p, ldo, &kk, d, &mut o2);
            for i in 0..m {
                for c in 0..d {
                    let mag: f32 = 1.0 + (0..n).map(|j| (p[i * ldo + j] * kk[j * d + c]).abs()).sum::<f32>();
                    let (a, b) = (o1[i * d + c], o2[i * d + c]);
                    assert!((a - b).abs() <= 1e-5 * mag, "{tier} gemm_nn_acc {m}x{n}x{d} [{i}][{c}]: {a} vs {b}");
                }
            }
        }
    }
}

/// The fused gated product gives exactly the two products followed by the activation (SwiGLU
/// or GEGLU) and the next product's quantization, on every tier, for decode-sized and
/// batch-sized token counts.
#[test]
fn the_fused_gated_product_equals_its_parts() {
    let mut rng = Rng(0x61u64);
    for tier in KernelTier::available() {
        let k = Kernels::new(tier).unwrap();
        let pool = Pool::new(2);
        for &ty in &[GgmlType::Q1_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::F16, GgmlType::TQ2_0] {
            let cols = 256;
            let shapes = [(256, 1, Glu::Silu), (512, 5, Glu::Silu), (768, 20, Glu::Silu)];
            for (rows, tokens, glu) in shapes.into_iter().chain(shapes.map(|(r, t, _)| (r, t, Glu::GeluTanh))) {
                let (gd, ud) = (weights(&mut rng, ty, rows, cols), weights(&mut rng, ty, rows, cols));
                let mut pg = MatRef::new(ty, rows, cols, &gd).unwrap();
                let mut pu = MatRef::new(ty, rows, cols, &ud).unwrap();
                let (packed_g, packed_u) = (k.pack(&pool, &pg), k.pack(&pool, &pu));
                pg = pg.with_packed(packed_g.as_ref());
                pu = pu.with_packed(packed_u.as_ref());
                let x: Vec<f32> = (0..tokens * cols).map(|_| rng.f32() * 3.0).collect();
                let mut acts = Acts::new();
                k.quantize_acts_for(&pool, &[ty, ty], &x, cols, &mut acts).unwrap();
                let (mut g, mut u) = (vec![0f32; tokens * rows], vec![0f32; tokens * rows]);
                k.matmul(&pool, &pg, &acts, &mut g).unwrap();
                k.matmul(&pool, &pu, &acts, &mut u).unwrap();
                k.glu(glu, &mut g, &u);
                // The next product's weights: the same type, `rows` long.
                let (mut want, mut fused) = (Acts::new(), Acts::new());
                k.quantize_acts_for(&pool, &[ty], &g, rows, &mut want).unwrap();
                k.matmul_gated_acts(&pool, glu, &pg, &pu, &acts, &[ty], &mut fused).unwrap();
                let what = format!("{tier} {ty} {rows}x{cols}, {tokens} tokens, {glu:?}");
                assert_eq!(fused.format(), want.format(), "{what}");
                assert_eq!(fused.bytes(), want.bytes(), "{what}");
                assert_eq!(fused.aux_bytes(), want.aux_bytes(), "{what}");
            }
        }
    }
}

/// The attention products over rows in runs (a paged cache), f32 or halves read as they are,
/// give exactly the products of the rows gathered and widened, on every tier.
#[test]
fn attention_products_over_runs_equal_those_over_gathered_rows() {
    let mut rng = Rng(0xf16);
    for tier in KernelTier::available() {
        let k = Kernels::new(tier).unwrap();
        for (m, d, runs) in [
            (1, 128, vec![16, 16, 3]),
            (2, 128, vec![16]),
            (3, 64, vec![5]),
            (8, 80, vec![16, 7]),
            (17, 128, vec![16, 16, 16, 1]),
            (2, 128, vec![300, 16, 33]),
            // Column ranges that leave a remainder after the widest passes, and a scalar tail.
            (4, 40, vec![16, 3]),
            (3, 72, vec![9]),
            (2, 44, vec![5, 2]),
            (7, 120, vec![16, 1]),
            // Four rows: 128 columns in two parts of 64, wider heads in strips of 128, and a
            // part of 64 beside a narrower one.
            (4, 128, vec![64, 16, 5]),
            (4, 256, vec![33]),
            (4, 80, vec![20]),
            (4, 192, vec![17, 16]),
            (8, 128, vec![48]),
        ] {
            let n: usize = runs.iter().sum();
            let q: Vec<f32> = (0..m * d).map(|_| rng.f32() * 4.0).collect();
            let h: Vec<u16> = (0..n * d).map(|_| half::f16::from_f32(rng.f32() * 4.0).to_bits()).collect();
            let mut wide = vec![0f32; n * d];
            k.f16_to_f32(&h, &mut wide);
            let mut at = 0;
            let (mut hr, mut fr) = (Vec::new(), Vec::new());
            for &len in &runs {
                hr.push(&h[at * d..(at + len) * d]);
                fr.push(&wide[at * d..(at + len) * d]);
                at += len;
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let ldo = n + 2;
            let mut want = vec![0f32; m * ldo];
            k.gemm_nt(&q, &wide, d, &mut want, ldo);
            for pages in [Pages::F16(&hr), Pages::F32(&fr)] {
                let mut got = vec![0f32; m * ldo];
                k.gemm_nt_pages(&q, pages, d, &mut got, ldo);
                assert_eq!(bits(&got), bits(&want), "{tier} gemm_nt_pages {m}x{n}x{d} {pages:?}");
            }
            // Zeros in some chunks of 16 rows and not in others (which take no test a row).
            let p: Vec<f32> = (0..m * ldo).map(|i| if i % ldo % 37 == 5 { 0.0 } else { rng.f32().abs() }).collect();
            let init: Vec<f32> = (0..m * d).map(|_| rng.f32()).collect();
            let mut want = init.clone();
            k.gemm_nn_acc(&p, ldo, &wide, d, &mut want);
            for pages in [Pages::F16(&hr), Pages::F32(&fr)] {
                let mut got = init.clone();
                k.gemm_nn_acc_pages(&p, ldo, pages, d, &mut got);
                assert_eq!(bits(&got), bits(&want), "{tier} gemm_nn_acc_pages {m}x{n}x{d}");
            }
        }
    }
}

/// `bytes` cut into consecutive runs of `lens` rows of `row` bytes each (the blocks of a paged
/// cache).
fn runs_of<'a>(bytes: &'a [u8], row: usize, lens: &[usize]) -> Vec<&'a [u8]> {
    let mut at = 0;
    lens.iter()
        .map(|&len| {
            at += len;
            &bytes[(at - len) * row..at * row]
        })
        .collect()
}

/// Scores of Q8_0 queries against runs of Q8_0 keys (a q8_0 KV cache) on every tier against the
/// scalar reference: the same integers and scales, added in another order (so within 1e-5 of
/// the sum of the terms' magnitudes): odd numbers of queries and of rows, odd numbers of blocks.
#[test]
fn q8_0_scores_match_the_scalar_reference() {
    let mut rng = Rng(0x5c08);
    let scalar = Kernels::new(KernelTier::Scalar).unwrap();
    for tier in simd_tiers() {
        let k = Kernels::new(tier).unwrap();
        for (m, d, runs) in [
            (1, 128, vec![16, 16, 3]),
            (2, 128, vec![16]),
            (3, 64, vec![5, 1]),
            (5, 32, vec![16, 7]),
            (2, 96, vec![64, 64, 9]),
            (17, 128, vec![16, 16, 16, 1]),
            (4, 256, vec![300, 17]),
            (7, 160, vec![33]),
        ] {
            let n: usize = runs.iter().sum();
            let row = d / 32 * 34;
            let (mut q, mut keys) = (vec![0u8; m * row], vec![0u8; n * row]);
            let x: Vec<f32> = (0..m * d).map(|_| rng.f32() * 4.0).collect();
            k.quantize_q8_0(&x, &mut q);
            let x: Vec<f32> = (0..n * d).map(|_| rng.f32() * 4.0).collect();
            onebit_kernels::formats::quantize(GgmlType::Q8_0, &x, &mut keys).unwrap();
            let kr = runs_of(&keys, row, &runs);
            let (mut wq, mut wk) = (vec![0f32; m * d], vec![0f32; n * d]);
            onebit_kernels::formats::dequantize(GgmlType::Q8_0, &q, &mut wq).unwrap();
            onebit_kernels::formats::dequantize(GgmlType::Q8_0, &keys, &mut wk).unwrap();
            let ldo = n + 3;
            let (mut got, mut want) = (vec![0f32; m * ldo], vec![0f32; m * ldo]);
            k.scores_q8_0(&q, &kr, d, &mut got, ldo);
            scalar.scores_q8_0(&q, &kr, d, &mut want, ldo);
            for i in 0..m {
                for j in 0..n {
                    let mag: f32 = (0..d).map(|c| (wq[i * d + c] * wk[j * d + c]).abs()).sum();
                    let (a, b) = (got[i * ldo + j], want[i * ldo + j]);
                    assert!((a - b).abs() <= 1e-5 * mag, "{tier} scores_q8_0 {m}x{n}x{d} [{i}][{j}]: {a} vs {b}");
                    // The AVX2 tier adds the blocks' terms as the reference does.
                    if tier == KernelTier::Avx2 {
                        assert_eq!(a.to_bits(), b.to_bits(), "{tier} scores_q8_0 {m}x{n}x{d} [{i}][{j}]");
                    }
                }
            }
        }
    }
}

/// The AVX-512 tier's `P·V` over Q8_0 rows (`bytes`, rows of `d` values), which folds each
/// block's scale into the weight: output (i, c) starts from `init` and takes, for every row j
/// of nonzero weight in order, `fma(w_ij · d_jb, q_jc, ·)` (`d_jb` the scale of the block of row
/// j holding column c).
fn folded_pv(p: &[f32], ldo: usize, bytes: &[u8], d: usize, init: &[f32]) -> Vec<f32> {
    let row = d / 32 * 34;
    let mut out = init.to_vec();
    for (i, o) in out.chunks_exact_mut(d).enumerate() {
        for (j, r) in bytes.chunks_exact(row).enumerate() {
            let w = p[i * ldo + j];
            if w == 0.0 {
                continue;
            }
            for (c, o) in o.iter_mut().enumerate() {
                let blk = &r[c / 32 * 34..];
                let scale = onebit_kernels::formats::f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                *o = (w * scale).mul_add(blk[2 + c % 32] as i8 as f32, *o);
            }
        }
    }
    out
}

/// The same for Q8_0 rows (a q8_0 KV cache): products over runs of blocks read as they are
/// equal the products of the rows dequantized, on every tier (`P·V` on the AVX-512 tiers: the
/// recipe of [`folded_pv`]): odd numbers of queries and rows, runs of one row to hundreds, heads
/// of 32 to 256 values.
#[test]
fn attention_products_over_q8_0_runs_equal_those_over_dequantized_rows() {
    let mut rng = Rng(0x98a0);
    for tier in KernelTier::available() {
        let k = Kernels::new(tier).unwrap();
        for (m, d, runs) in [
            (1, 128, vec![16, 16, 3]),
            (2, 128, vec![16]),
            (3, 64, vec![5, 1]),
            (5, 32, vec![16, 7]),
            (2, 96, vec![64, 64, 9]),
            (17, 128, vec![16, 16, 16, 1]),
            (2, 256, vec![300, 17]),
            (4, 128, vec![1024, 16]),
        ] {
            let n: usize = runs.iter().sum();
            let q: Vec<f32> = (0..m * d).map(|_| rng.f32() * 4.0).collect();
            let x: Vec<f32> = (0..n * d).map(|_| rng.f32() * 4.0).collect();
            let row = d / 32 * 34;
            let mut bytes = vec![0u8; n * row];
            onebit_kernels::formats::quantize(GgmlType::Q8_0, &x, &mut bytes).unwrap();
            let mut wide = vec![0f32; n * d];
            onebit_kernels::formats::dequantize(GgmlType::Q8_0, &bytes, &mut wide).unwrap();
            let qr = runs_of(&bytes, row, &runs);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let ldo = n + 3;
            let mut want = vec![0f32; m * ldo];
            k.gemm_nt(&q, &wide, d, &mut want, ldo);
            let mut got = vec![0f32; m * ldo];
            k.gemm_nt_pages(&q, Pages::Q8_0(&qr), d, &mut got, ldo);
            assert_eq!(bits(&got), bits(&want), "{tier} gemm_nt_pages q8_0 {m}x{n}x{d} {runs:?}");
            let p: Vec<f32> = (0..m * ldo).map(|i| if i % 7 == 0 { 0.0 } else { rng.f32().abs() }).collect();
            let init: Vec<f32> = (0..m * d).map(|_| rng.f32()).collect();
            let want = if matches!(tier, KernelTier::Avx512 | KernelTier::Amx) {
                folded_pv(&p, ldo, &bytes, d, &init)
            } else {
                let mut want = init.clone();
                k.gemm_nn_acc(&p, ldo, &wide, d, &mut want);
                want
            };
            let mut got = init.clone();
            k.gemm_nn_acc_pages(&p, ldo, Pages::Q8_0(&qr), d, &mut got);
            assert_eq!(bits(&got), bits(&want), "{tier} gemm_nn_acc_pages q8_0 {m}x{n}x{d} {runs:?}");
        }
    }
}
