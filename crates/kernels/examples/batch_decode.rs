//! The matrix products of one decode step that serves N sequences at once (N tokens), on a
//! model file's own weights: every layer's projections grouped as a forward pass groups them
//! (q, k and v on one set of activations, gate and up on another, then the output and down
//! projections) and the vocabulary projection. Prints the time per step, the tokens per second
//! of all sequences together and the multiply-adds per second, against one token per step.
//!
//! `cargo run --release -p onebit-kernels --example batch_decode -- MODEL.gguf [TOKENS,..] [THREADS] [TIER]`
//! (default tokens 1,2,4,8,16; 2 threads; the best tier).

use std::time::Instant;

use onebit_gguf::GgufModel;
use onebit_kernels::{Acts, KernelTier, Kernels, MatRef, Pool};

fn main() {
    let arg = |i: usize| std::env::args().nth(i);
    let path = arg(1).expect("usage: batch_decode MODEL.gguf [TOKENS,..] [THREADS] [TIER]");
    let tokens: Vec<usize> =
        arg(2).unwrap_or("1,2,4,8,16".into()).split(',').map(|s| s.parse().expect("a token count")).collect();
    let threads = arg(3).and_then(|s| s.parse().ok()).unwrap_or(2);
    let tier = arg(4).map_or(KernelTier::best(), |s| s.parse().expect("a kernel tier"));
    let k = Kernels::new(tier).unwrap();
    let pool = Pool::new(threads);
    let model = GgufModel::open(&path).unwrap();

    let mut names: Vec<Vec<String>> = Vec::new();
    for l in 0.. {
        if model.tensor(&format!("blk.{l}.attn_q.weight")).is_none() {
            break;
        }
        let t = |s: &str| format!("blk.{l}.{s}.weight");
        names.push(vec![t("attn_q"), t("attn_k"), t("attn_v")]);
        names.push(vec![t("attn_output")]);
        names.push(vec![t("ffn_gate"), t("ffn_up")]);
        names.push(vec![t("ffn_down")]);
    }
    names
        .push(vec![if model.tensor("output.weight").is_some() { "output.weight" } else { "token_embd.weight" }.into()]);
    // One arena for all, as a model load packs them (huge pages).
    let flat: Vec<MatRef> = names
        .iter()
        .flatten()
        .map(|n| MatRef::from_tensor(&model.tensor(n).unwrap_or_else(|| panic!("no tensor {n}"))).unwrap())
        .collect();
    let (packed, _) = k.pack_all(&pool, &flat, &mut |_| {}, None);
    let mut at = 0;
    let groups: Vec<Vec<MatRef>> = names
        .iter()
        .map(|g| {
            let group = (at..at + g.len()).map(|i| flat[i].with_packed(packed[i].as_ref())).collect();
            at += g.len();
            group
        })
        .collect();
    let macs_per_token: usize = groups.iter().flatten().map(|w| w.rows * w.cols).sum();
    println!("{path}: {:.2} G multiply-adds per token, {tier}, {threads} threads", macs_per_token as f64 / 1e9);

    let mut base = None;
    for &n in &tokens {
        let max_cols = groups.iter().flatten().map(|w| w.cols).max().unwrap();
        let x: Vec<f32> = (0..n * max_cols).map(|i| ((i * 7919 % 2003) as f32 / 1001.0 - 1.0) * 0.7).collect();
        let mut outs: Vec<Vec<Vec<f32>>> =
            groups.iter().map(|g| g.iter().map(|w| vec![0f32; n * w.rows]).collect()).collect();
        let mut acts = Acts::new();
        let mut step = || {
            for (g, out) in groups.iter().zip(outs.iter_mut()) {
                let cols = g[0].cols;
                let tys: Vec<_> = g.iter().map(|w| w.ty).collect();
                k.quantize_acts_for(&pool, &tys, &x[..n * cols], cols, &mut acts).unwrap();
                let ws: Vec<&MatRef> = g.iter().collect();
                let mut os: Vec<&mut [f32]> = out.iter_mut().map(|o| o.as_mut_slice()).collect();
                k.matmul_many(&pool, &ws, &acts, &mut os).unwrap();
            }
        };
        step();
        let mut times = Vec::new();
        let start = Instant::now();
        while times.len() < 5 || (start.elapsed().as_secs_f64() < 2.0 && times.len() < 200) {
            let t = Instant::now();
            step();
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let secs = times[times.len() / 2];
        let per_token = secs / n as f64;
        let base = *base.get_or_insert(per_token);
        println!(
            "{n:>3} tokens: {:>8.2} ms/step {:>9.1} tok/s {:>8.1} G MAC/s  {:>5.2}x the tokens/s of 1 per step",
            secs * 1e3,
            n as f64 / secs,
            (macs_per_token * n) as f64 / secs / 1e9,
            base / per_token
        );
    }
}
