//! Single-thread GEMV speed of each tier on an L2-resident matrix (compute roofline) and on a
//! large one (memory bound). `cargo run --release -p onebit-kernels --example gemv_speed [TYPE]`

use std::time::Instant;

use onebit_gguf::GgmlType;
use onebit_kernels::formats::quantize;
use onebit_kernels::{Acts, KernelTier, Kernels, MatRef, Pool};

fn main() {
    let ty = std::env::args().nth(1).and_then(|t| GgmlType::from_name(&t)).unwrap_or(GgmlType::Q1_0);
    let cols = 4096;
    for (rows, label, threads) in [(512usize, "L2-resident", 1usize), (65536, "streaming", 1), (65536, "streaming", 2)]
    {
        let row_bytes = ty.bytes_for(cols as u64).unwrap() as usize;
        let x: Vec<f32> = (0..cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
        let mut data = vec![0u8; rows * row_bytes];
        for r in 0..rows.min(64) {
            quantize(ty, &x, &mut data[r * row_bytes..(r + 1) * row_bytes]).unwrap();
        }
        for r in 64..rows {
            data.copy_within((r % 64) * row_bytes..(r % 64 + 1) * row_bytes, r * row_bytes);
        }
        let w = MatRef::new(ty, rows, cols, &data).unwrap();
        let pool = Pool::new(threads);
        for tier in KernelTier::available() {
            let k = Kernels::new(tier).unwrap();
            let packed = k.pack(&pool, &w);
            let w = w.with_packed(packed.as_ref());
            let mut acts = Acts::new();
            k.quantize_acts(&pool, ty, &x, cols, &mut acts).unwrap();
            let mut out = vec![0f32; rows];
            let reps = if rows > 1000 { 10 } else { 400 };
            k.matmul(&pool, &w, &acts, &mut out).unwrap();
            let t = Instant::now();
            for _ in 0..reps {
                k.matmul(&pool, &w, &acts, &mut out).unwrap();
            }
            let secs = t.elapsed().as_secs_f64() / reps as f64;
            println!(
                "{ty} {label:<12} {threads}t {tier:<7}{} {:>7.2} Gweights/s {:>6.2} GB/s",
                if w.packed.is_some() { " packed" } else { "       " },
                (rows * cols) as f64 / secs / 1e9,
                (rows * row_bytes) as f64 / secs / 1e9
            );
        }
    }
}
