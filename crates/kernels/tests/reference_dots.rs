//! The scalar dot products agree with the plain definition: dequantize the weights and the
//! quantized activations to f32 and take the dot product in f64.

use onebit_gguf::GgmlType;
use onebit_kernels::act::{ActFormat, quantize_row_ref};
use onebit_kernels::formats::{BlockQ4_1, BlockQ5_1, BlockQ8_1, blocks, dequantize, f16_to_f32, quantize};
use onebit_kernels::scalar::dot::dot_fn;

mod common;

use common::Rng;

const TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q1_0,
    GgmlType::Q2_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

#[test]
fn scalar_dots_match_dequantized_f64_dots() {
    let mut rng = Rng(0x5eed);
    for &ty in TYPES {
        let format = ActFormat::for_weights(ty).unwrap();
        for n_blocks in [1usize, 3, 7] {
            let n = 256 * n_blocks;
            let w: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
            let x: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
            let mut wq = vec![0u8; ty.bytes_for(n as u64).unwrap() as usize];
            quantize(ty, &w, &mut wq).unwrap();
            let mut xq = vec![0u8; format.row_bytes(n)];
            quantize_row_ref(format, &x, &mut xq);
            let (mut wd, mut xd) = (vec![0f32; n], vec![0f32; n]);
            dequantize(ty, &wq, &mut wd).unwrap();
            dequantize(format.ggml_type(), &xq, &mut xd).unwrap();
            let mut want: f64 = wd.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
            if format == ActFormat::Q8_1 {
                // These dots use the block sum s = f16(d * Σq) stored with the activations:
                // Σ w·x = d_w Σ q_w·x + m Σ x, with Σ x taken from s. Account for its rounding.
                let xb: &[BlockQ8_1] = blocks(&xq);
                for (b, blk) in xb.iter().enumerate() {
                    let m = match ty {
                        GgmlType::Q4_1 => f16_to_f32(u16::from_le_bytes(blocks::<BlockQ4_1>(&wq)[b].m)),
                        _ => f16_to_f32(u16::from_le_bytes(blocks::<BlockQ5_1>(&wq)[b].m)),
                    } as f64;
                    let sum_x: f64 = xd[32 * b..32 * b + 32].iter().map(|&v| v as f64).sum();
                    want += m * (f16_to_f32(u16::from_le_bytes(blk.s)) as f64 - sum_x);
                }
            }
            let scale: f64 = wd.iter().zip(&xd).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
            let got = dot_fn(ty).unwrap()(&wq, &xq, n) as f64;
            assert!((got - want).abs() <= 1e-5 * scale + 1e-6, "{ty} × {format:?}, n = {n}: {got} vs {want}");
        }
    }
}
