//! Speed of the attention block products on one thread: scores `Q·Kᵀ` (`gemm_nt`) and weighted
//! values `P·V` (`gemm_nn_acc`) for `M` query rows against a block of `N` cached rows of
//! `D` values, as attention calls them (prefill: 64 × 64; decode: the few query heads that
//! share a kv head).
//!
//! Then the same products over a Q8_0 cache read where it lies (`scores_q8_0`, the queries
//! rounded to Q8_0, and `gemm_nn_acc_pages`), and over an f16 cache (`gemm_nt_pages`,
//! `gemm_nn_acc_pages`), in GB/s of cache bytes: decode attention over such a cache should
//! read it at the memory's speed.
//!
//! `cargo run --release -p onebit-kernels --example attn_speed [M,..] [N] [D] [TIER]`

use std::time::Instant;

use onebit_kernels::{KernelTier, Kernels, Pages};

fn main() {
    let arg = |i: usize| std::env::args().nth(i);
    let ms: Vec<usize> = arg(1).unwrap_or("1,2,3,4,8,64".into()).split(',').map(|s| s.parse().unwrap()).collect();
    let n = arg(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let d = arg(3).and_then(|s| s.parse().ok()).unwrap_or(128);
    let tier = arg(4).map_or(KernelTier::best(), |s| s.parse().unwrap());
    let k = Kernels::new(tier).unwrap();
    let kv: Vec<f32> = (0..n * d).map(|i| ((i * 7919 % 2003) as f32 / 1001.0 - 1.0) * 0.5).collect();
    for &m in &ms {
        let q: Vec<f32> = (0..m * d).map(|i| ((i * 104729 % 997) as f32 / 498.0 - 1.0) * 0.5).collect();
        let p: Vec<f32> = (0..m * n).map(|i| (i % 13 + 1) as f32 / 14.0).collect();
        let mut s = vec![0f32; m * n];
        let mut o = vec![0f32; m * d];
        let reps = (2e8 / (m * n * d) as f64).clamp(10.0, 1e6) as usize;
        let time = |f: &mut dyn FnMut()| {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                for _ in 0..reps {
                    f();
                }
                best = best.min(t.elapsed().as_secs_f64() / reps as f64);
            }
            best
        };
        let nt = time(&mut || k.gemm_nt(&q, &kv, d, &mut s, n));
        let nn = time(&mut || k.gemm_nn_acc(&p, n, &kv, d, &mut o));
        let gf = |secs: f64| (m * n * d) as f64 / secs / 1e9;
        println!(
            "{tier} m={m:<3} n={n} d={d}: gemm_nt {:>8.2} µs {:>6.1} G MAC/s | gemm_nn_acc {:>8.2} µs {:>6.1} G MAC/s",
            nt * 1e6,
            gf(nt),
            nn * 1e6,
            gf(nn)
        );
        let row8 = d / 32 * 34;
        let mut kv8 = vec![0u8; n * row8];
        k.quantize_q8_0(&kv, &mut kv8);
        let mut q8 = vec![0u8; m * row8];
        k.quantize_q8_0(&q, &mut q8);
        let runs = [&kv8[..]];
        let sc = time(&mut || k.scores_q8_0(&q8, &runs, d, &mut s, n));
        let pv = time(&mut || k.gemm_nn_acc_pages(&p, n, Pages::Q8_0(&runs), d, &mut o));
        let gb = |secs: f64| kv8.len() as f64 / secs / 1e9;
        println!("{tier} m={m:<3} n={n} d={d}: q8_0 scores {:>6.1} GB/s | q8_0 P·V {:>6.1} GB/s", gb(sc), gb(pv));
        let kv16: Vec<u16> = kv.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect();
        let runs16 = [&kv16[..]];
        let sc = time(&mut || k.gemm_nt_pages(&q, Pages::F16(&runs16), d, &mut s, n));
        let pv = time(&mut || k.gemm_nn_acc_pages(&p, n, Pages::F16(&runs16), d, &mut o));
        let gb = |secs: f64| 2.0 * kv16.len() as f64 / secs / 1e9;
        println!("{tier} m={m:<3} n={n} d={d}: f16 scores {:>6.1} GB/s | f16 P·V {:>6.1} GB/s", gb(sc), gb(pv));
    }
}
