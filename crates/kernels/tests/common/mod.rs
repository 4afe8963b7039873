//! What the kernel tests share: a small deterministic random source, the weight types that
//! matrix products accept, and random weight matrices over a range of row scales.

#![allow(dead_code)] // each test binary uses its own part of this module

use onebit_gguf::GgmlType;
use onebit_kernels::formats::quantize;

/// xorshift64: the same numbers on every machine, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn f32(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

pub const MATMUL_TYPES: &[GgmlType] = &[
    GgmlType::Q1_0,
    GgmlType::Q2_0,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

/// `rows` random rows of `cols` values quantized to `ty`; row scales cycle from 1e-3 to 1e3.
pub fn weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let row_bytes = ty.bytes_for(cols as u64).unwrap() as usize;
    let mut data = vec![0u8; rows * row_bytes];
    for r in 0..rows {
        let scale = [1e-3f32, 0.5, 1.0, 7.0, 1e3][r % 5];
        let x: Vec<f32> = (0..cols).map(|_| rng.f32() * scale).collect();
        quantize(ty, &x, &mut data[r * row_bytes..(r + 1) * row_bytes]).unwrap();
    }
    data
}
