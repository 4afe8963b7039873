//! Decode attention over a paged f16 cache, as the model runs it for one sequence: every
//! layer, every kv head, one token's group of queries against `DEPTH` cached positions, the
//! heads split over the pool's threads. Prints the time per token and the bandwidth of the
//! cache bytes read (the roofline is the machine's streaming read, see `membw`).
//!
//! By default a head's positions lie in one run, as the model's pool keeps a sequence whose
//! blocks follow each other; `SCATTERED=1` reads them in blocks of 16 positions, 32 KiB
//! apart (the pool's layout before superblocks, or a fragmented block table).
//!
//! `cargo run --release -p onebit-kernels --example attn_decode [DEPTH] [THREADS] [LAYERS]`

use std::time::Instant;

use onebit_kernels::{DisjointRows, KernelTier, Kernels, Pages, PerThread, Pool};

const BLOCK: usize = 16;
const HEADS: usize = 8;
const GROUP: usize = 2;
const D: usize = 128;

fn main() {
    let arg = |i: usize| std::env::args().nth(i);
    let depth: usize = arg(1).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let threads: usize = arg(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let layers: usize = arg(3).and_then(|s| s.parse().ok()).unwrap_or(28);
    let scattered = std::env::var("SCATTERED").is_ok_and(|v| v == "1");
    let k = Kernels::new(KernelTier::best()).unwrap();
    let pool = Pool::new(threads);
    let blocks = depth.div_ceil(BLOCK);
    // [layer][k|v][head][block][slot][dim], or [layer][k|v][block][head][slot][dim] scattered.
    let per = blocks * HEADS * BLOCK * D;
    let mut cache = vec![0u16; layers * 2 * per];
    pool.for_each_mut(&mut cache.chunks_mut(1 << 20).collect::<Vec<_>>(), &|_, c| {
        for (i, x) in c.iter_mut().enumerate() {
            *x = half::f16::from_f32(((i * 7919 % 2003) as f32 / 1001.0 - 1.0) * 0.5).to_bits();
        }
    });
    let q: Vec<f32> = (0..HEADS * GROUP * D).map(|i| ((i * 104729 % 997) as f32 / 498.0 - 1.0) * 0.5).collect();
    let mut out = vec![0f32; HEADS * GROUP * D];
    let scratch = PerThread::new(threads, || (vec![0f32; GROUP * depth], vec![0f32; GROUP * D]));
    let bytes = (layers * 2 * per * 2) as f64;
    for rep in 0..6 {
        let t = Instant::now();
        let toks = 8;
        for _ in 0..toks {
            for l in 0..layers {
                let outs = DisjointRows::new(&mut out, GROUP * D);
                pool.for_chunks(HEADS, 1, &|tid, range| {
                    // SAFETY: this thread's own slot.
                    let (scores, o) = unsafe { scratch.get(tid) };
                    for h in range {
                        let runs = |v: usize| -> Vec<&[u16]> {
                            let base = (l * 2 + v) * per;
                            if scattered {
                                (0..blocks).map(|b| &cache[base + (b * HEADS + h) * BLOCK * D..][..BLOCK * D]).collect()
                            } else {
                                vec![&cache[base + h * blocks * BLOCK * D..][..blocks * BLOCK * D]]
                            }
                        };
                        let qh = &q[h * GROUP * D..][..GROUP * D];
                        k.gemm_nt_pages(qh, Pages::F16(&runs(0)), D, scores, depth);
                        for r in 0..GROUP {
                            let row = &mut scores[r * depth..][..depth];
                            row.iter_mut().for_each(|s| *s *= 0.088);
                            k.softmax(row);
                            k.round_f16(row);
                        }
                        o.fill(0.0);
                        k.gemm_nn_acc_pages(scores, depth, Pages::F16(&runs(1)), D, o);
                        // SAFETY: head h's row is this unit's alone.
                        unsafe { outs.row(h) }.copy_from_slice(o);
                    }
                });
            }
        }
        let s = t.elapsed().as_secs_f64() / toks as f64;
        if rep > 0 {
            println!("depth {depth} threads {threads}: {:.2} ms/token, {:.1} GB/s", s * 1e3, bytes / s / 1e9);
        }
    }
    std::hint::black_box(&out);
}
