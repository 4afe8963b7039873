//! Batched product speed (prefill) of each tier at one of Bonsai-8B's matrix shapes.
//! `cargo run --release -p onebit-kernels --example gemm_speed [TYPE] [TOKENS] [THREADS] [ROWS] [COLS]`

use std::time::Instant;

use onebit_gguf::GgmlType;
use onebit_kernels::formats::quantize;
use onebit_kernels::{Acts, KernelTier, Kernels, MatRef, Pool};

fn main() {
    let arg = |i: usize| std::env::args().nth(i);
    let ty = arg(1).and_then(|t| GgmlType::from_name(&t)).unwrap_or(GgmlType::Q1_0);
    let num = |i: usize, d: usize| arg(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (tokens, threads, rows, cols) = (num(2, 128), num(3, 1), num(4, 4096), num(5, 4096));
    let row_bytes = ty.bytes_for(cols as u64).unwrap() as usize;
    let mut seed = 1u64;
    let mut rnd = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    };
    let mut data = vec![0u8; rows * row_bytes];
    for r in 0..rows {
        let w: Vec<f32> = (0..cols).map(|_| rnd()).collect();
        quantize(ty, &w, &mut data[r * row_bytes..(r + 1) * row_bytes]).unwrap();
    }
    let x: Vec<f32> = (0..tokens * cols).map(|_| rnd()).collect();
    let w = MatRef::new(ty, rows, cols, &data).unwrap();
    let pool = Pool::new(threads);
    let only = arg(6).and_then(|t| t.parse::<KernelTier>().ok());
    for tier in KernelTier::available().into_iter().filter(|t| only.is_none_or(|o| o == *t)) {
        let k = Kernels::new(tier).unwrap();
        let packed = k.pack(&pool, &w);
        let w = w.with_packed(packed.as_ref());
        let mut acts = Acts::new();
        let mut out = vec![0f32; rows * tokens];
        let run = |acts: &mut Acts, out: &mut [f32]| {
            k.quantize_acts(&pool, ty, &x, cols, acts).unwrap();
            k.matmul(&pool, &w, acts, out).unwrap();
        };
        run(&mut acts, &mut out);
        let reps = (2e10 / (rows * cols * tokens) as f64).clamp(1.0, 200.0) as usize;
        let t = Instant::now();
        for _ in 0..reps {
            run(&mut acts, &mut out);
        }
        let secs = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "{ty} {rows}x{cols} x {tokens} tokens {threads}t {tier:<7}{} {:>8.1} GMAC/s {:>8.2} ms",
            if w.packed.is_some() { " packed" } else { "       " },
            (rows * cols * tokens) as f64 / secs / 1e9,
            secs * 1e3
        );
    }
}
