//! How close the one-token Q1_0 product comes to the machine's streaming read: a 1 GiB packed
//! matrix (far past any cache) multiplied on two threads, then the same bytes read by the
//! paced, asking-ahead loop of `membw`, alternately, so that both see the same moment of a
//! shared machine. Then the product's rate by matrix size: many distinct matrices of that size
//! (1 GiB in all), one after another, as a decode step runs its layers' products.
//!
//! `cargo run --release -p onebit-kernels --example gemv_ab -- [COLS]` (default 2,048).

use std::time::Instant;

use onebit_gguf::GgmlType;
use onebit_kernels::formats::quantize;
use onebit_kernels::{Acts, KernelTier, Kernels, MatRef, Pool};

#[path = "common/paced.rs"]
mod paced;

const GIB: usize = 1 << 30;

fn main() {
    let cols: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2048);
    let ty = GgmlType::Q1_0;
    let row_bytes = ty.bytes_for(cols as u64).unwrap() as usize;
    let pool = Pool::new(2);
    let tier = KernelTier::best();
    let k = Kernels::new(tier).unwrap();
    let x: Vec<f32> = (0..cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let mut acts = Acts::new();
    k.quantize_acts(&pool, ty, &x, cols, &mut acts).unwrap();
    println!("Q1_0, {cols} columns, {tier} tier, 2 threads");
    for rows in [usize::MAX, 1024, 2048, 4096, 12288, 65536] {
        let rows = if rows == usize::MAX { GIB / row_bytes / 64 * 64 } else { rows };
        let data = matrix(ty, &x, rows, row_bytes);
        let w = MatRef::new(ty, rows, cols, &data).unwrap();
        let n = (GIB / (rows * row_bytes)).max(1);
        let ws = vec![w; n];
        let (packed, _) = k.pack_all(&pool, &ws, &mut |_| {}, None);
        let ws: Vec<MatRef> = ws.iter().zip(&packed).map(|(w, p)| w.with_packed(p.as_ref())).collect();
        let mut out = vec![0f32; rows];
        let bytes = n * rows * row_bytes;
        let mut line = format!("{n:>5} × {rows:>7} rows ({:>7.2} MB):", (rows * row_bytes) as f64 / 1e6);
        for _ in 0..3 {
            let t = Instant::now();
            for w in &ws {
                k.matmul(&pool, w, &acts, &mut out).unwrap();
            }
            line += &format!(" {:5.1}", bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
            if n == 1 {
                let t = Instant::now();
                let whole = packed[0].as_ref().unwrap().bytes();
                std::hint::black_box(read_paced(whole));
                line += &format!(" (read {:4.1})", bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
            }
        }
        println!("{line} GB/s");
    }
}

/// `rows` rows of `x` quantized (the first 64 rows repeated).
fn matrix(ty: GgmlType, x: &[f32], rows: usize, row_bytes: usize) -> Vec<u8> {
    let mut data = vec![0u8; rows * row_bytes];
    for r in 0..rows.min(64) {
        quantize(ty, x, &mut data[r * row_bytes..(r + 1) * row_bytes]).unwrap();
    }
    for r in 64..rows {
        data.copy_within((r % 64) * row_bytes..(r % 64 + 1) * row_bytes, r * row_bytes);
    }
    data
}

/// Both halves of `bytes` read at once, each by its own thread, as `membw` reads them paced and
/// asking ahead ([`paced::sum_paced_avx512`]).
fn read_paced(bytes: &[u8]) -> u64 {
    let half = bytes.len() / 2;
    std::thread::scope(|s| {
        let hs: Vec<_> = bytes.chunks(half).map(|part| s.spawn(move || read_part(part))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).fold(0, u64::wrapping_add)
    })
}

fn read_part(part: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: the feature was just detected.
        return unsafe { paced::sum_paced_avx512(part, true) };
    }
    part.iter().map(|&b| b as u64).sum()
}
