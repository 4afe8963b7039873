//! Speed of quantizing activations, with the tier's layout for its products, on one thread.
//! `cargo run --release -p onebit-kernels --example quant_speed [TYPE] [TOKENS] [COLS]`: the
//! activations that products with weights of TYPE take (default Q4_1, 8 tokens of 1536).

use std::time::Instant;

use onebit_gguf::GgmlType;
use onebit_kernels::{Acts, KernelTier, Kernels, Pool};

fn main() {
    let arg = |i: usize| std::env::args().nth(i);
    let ty = arg(1).and_then(|t| GgmlType::from_name(&t)).unwrap_or(GgmlType::Q4_1);
    let num = |i: usize, d: usize| arg(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (tokens, cols) = (num(2, 8), num(3, 1536));
    let x: Vec<f32> = (0..tokens * cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let pool = Pool::new(1);
    for tier in KernelTier::available() {
        let k = Kernels::new(tier).unwrap();
        let mut acts = Acts::new();
        let n = 20_000;
        let start = Instant::now();
        for _ in 0..n {
            k.quantize_acts(&pool, ty, &x, cols, &mut acts).unwrap();
        }
        let per = start.elapsed().as_secs_f64() / n as f64;
        let blocks = (tokens * cols / 32) as f64;
        println!("{tier:?}: {:.2} us a call, {:.1} ns a block of 32", per * 1e6, per * 1e9 / blocks);
    }
}
