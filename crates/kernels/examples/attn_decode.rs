//! Decode attention over a paged f16 cache, as the model runs it for one sequence: every
//! layer, every kv head, one token's group of queries against `DEPTH` cached positions, the
//! heads split over the pool's threads. Prints the time per token and the bandwidth of the
//! cache bytes read (the roofline is the machine's streaming read, see `membw`).
//!
//! By default a head's positions lie in one run; `SUPER=64` lays them out as the model's pool
//! does, in superblocks of 64 blocks (runs of 1,024 positions, the other heads' runs of the
//! superblock between them), and `SCATTERED=1` in blocks of 16 positions, 32 KiB apart (the
//! pool's layout before superblocks, or a fragmented block table). On Sapphire Rapids the
//! q8_0 attention at 4,096 positions took 6–10 % longer in superblocks of 64 than in one run
//! (runs of 128 or 256 blocks: as one run; of 4 blocks: 25 % longer), one thread or two.
//!
//! `PART=s` times the scores (and softmax) alone, `PART=v` the softmax and weighted values
//! alone: which of the two products reads the cache slower than the memory allows. `PART=r`
//! only reads the f16 cache's bytes in the same order, adding them up: what the layout
//! allows (on Zen 2, two threads, 4,096 positions: 14.4 ms a token, 32.5 GB/s, about
//! `membw`).
//!
//! With `q8_0` as the fourth argument the cache holds Q8_0 blocks (34 bytes per 32 values) and
//! the queries are rounded to Q8_0 for the scores, as the model does.
//!
//! `cargo run --release -p onebit-kernels --example attn_decode [DEPTH] [THREADS] [LAYERS] [f16|q8_0] [TIER] [GROUP]`

use std::time::Instant;

use onebit_kernels::arena::Arena;
use onebit_kernels::{DisjointRows, KernelTier, Kernels, Pages, PerThread, Pool};

const BLOCK: usize = 16;
const HEADS: usize = 8;
const D: usize = 128;

fn main() {
    let arg = |i: usize| std::env::args().nth(i);
    let depth: usize = arg(1).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let threads: usize = arg(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let layers: usize = arg(3).and_then(|s| s.parse().ok()).unwrap_or(28);
    let scattered = std::env::var("SCATTERED").is_ok_and(|v| v == "1");
    let superblocks = std::env::var("SUPER").ok().and_then(|v| v.parse::<usize>().ok()).filter(|&n| n > 0);
    let part = std::env::var("PART").unwrap_or_default();
    let (scores_too, values_too) = (part != "v", part != "s");
    let q8 = arg(4).is_some_and(|s| s == "q8_0");
    let tier = arg(5).map_or(KernelTier::best(), |s| s.parse().unwrap());
    // Query heads per kv head: 2 for the 1.7B shape, 4 for the 8B shape.
    let group: usize = arg(6).and_then(|s| s.parse().ok()).unwrap_or(2);
    let k = Kernels::new(tier).unwrap();
    let pool = Pool::new(threads);
    let blocks = depth.div_ceil(BLOCK);
    // [layer][k|v][head][block][slot][dim], or [layer][k|v][block][head][slot][dim] scattered.
    let per = blocks * HEADS * BLOCK * D;
    // In an arena, as the model's pool: huge pages where the system allows them (a `Vec` has
    // 4 KiB pages, which the pool has only in each layer's first superblock: on Sapphire Rapids
    // the f16 cache read 10–20 % slower that way on two threads, 20 % on one).
    let mut arena16 = Arena::zeroed(2 * layers * 2 * per);
    let cache: &mut [u16] = bytemuck::cast_slice_mut(arena16.bytes_mut());
    pool.for_each_mut(&mut cache.chunks_mut(1 << 20).collect::<Vec<_>>(), &|_, c| {
        for (i, x) in c.iter_mut().enumerate() {
            *x = half::f16::from_f32(((i * 7919 % 2003) as f32 / 1001.0 - 1.0) * 0.5).to_bits();
        }
    });
    // The same cache as Q8_0 rows: per row of D values, D / 32 blocks of a scale and 32 bytes.
    let row8 = D / 32 * 34;
    // Filled where it lies, as the f16 cache is (no second copy of the whole cache).
    let mut arena8 = Arena::zeroed(if q8 { cache.len() / D * row8 } else { 0 });
    for (r, (row, out)) in cache.chunks(D).zip(arena8.bytes_mut().chunks_mut(row8)).enumerate() {
        let d = half::f16::from_f32(0.004 + (r % 7) as f32 * 0.001).to_bits().to_le_bytes();
        for (b, block) in row.chunks(32).zip(out.chunks_mut(34)) {
            block[..2].copy_from_slice(&d);
            block[2..].iter_mut().zip(b).for_each(|(o, &x)| *o = (x % 251) as u8);
        }
    }
    let cache8 = arena8.bytes();
    let cache: &[u16] = cache;
    let q: Vec<f32> = (0..HEADS * group * D).map(|i| ((i * 104729 % 997) as f32 / 498.0 - 1.0) * 0.5).collect();
    let mut out = vec![0f32; HEADS * group * D];
    let scratch = PerThread::new(threads, || (vec![0f32; group * depth], vec![0f32; group * D]));
    let bytes = if q8 { (layers * 2 * per / D * row8) as f64 } else { (layers * 2 * per * 2) as f64 };
    for rep in 0..6 {
        let t = Instant::now();
        let toks = 8;
        for _ in 0..toks {
            for l in 0..layers {
                let outs = DisjointRows::new(&mut out, group * D);
                pool.for_chunks(HEADS, 1, &|tid, range| {
                    // SAFETY: this thread's own slot.
                    let (scores, o) = unsafe { scratch.get(tid) };
                    for h in range {
                        // Runs of rows, as (first row, rows) of the cache.
                        let spans = |v: usize| -> Vec<(usize, usize)> {
                            let base = (l * 2 + v) * per / D;
                            if scattered {
                                (0..blocks).map(|b| (base + (b * HEADS + h) * BLOCK, BLOCK)).collect()
                            } else if let Some(sb) = superblocks {
                                // As the pool's `row_index`: the last superblock is as wide as
                                // the blocks left.
                                (0..blocks.div_ceil(sb))
                                    .map(|s| {
                                        let (first, span) = (s * sb, (blocks - s * sb).min(sb));
                                        (base + (first * HEADS + h * span) * BLOCK, span * BLOCK)
                                    })
                                    .collect()
                            } else {
                                vec![(base + h * blocks * BLOCK, blocks * BLOCK)]
                            }
                        };
                        let f16 = |v| spans(v).into_iter().map(|(r, n)| &cache[r * D..][..n * D]).collect::<Vec<_>>();
                        let b8 =
                            |v| spans(v).into_iter().map(|(r, n)| &cache8[r * row8..][..n * row8]).collect::<Vec<_>>();
                        let (k16, v16, k8, v8);
                        let (keys, values) = if q8 {
                            (k8, v8) = (b8(0), b8(1));
                            (Pages::Q8_0(&k8), Pages::Q8_0(&v8))
                        } else {
                            (k16, v16) = (f16(0), f16(1));
                            (Pages::F16(&k16), Pages::F16(&v16))
                        };
                        let qh = &q[h * group * D..][..group * D];
                        if part == "r" {
                            let mut acc = 0u64;
                            for v in [0, 1] {
                                for (r, n) in spans(v) {
                                    let b: &[u64] = bytemuck::cast_slice(&cache[r * D..][..n * D]);
                                    acc = b.iter().fold(acc, |a, &x| a.wrapping_add(x));
                                }
                            }
                            scores[0] = acc as f32;
                            continue;
                        }
                        if !scores_too {
                        } else if let Pages::Q8_0(runs) = keys {
                            let mut q8 = vec![0u8; group * row8];
                            k.quantize_q8_0(qh, &mut q8);
                            k.scores_q8_0(&q8, runs, D, scores, depth);
                        } else {
                            k.gemm_nt_pages(qh, keys, D, scores, depth);
                        }
                        for r in 0..group {
                            let row = &mut scores[r * depth..][..depth];
                            row.iter_mut().for_each(|s| *s *= 0.088);
                            k.softmax(row);
                            k.round_f16(row);
                        }
                        o.fill(0.0);
                        if values_too {
                            k.gemm_nn_acc_pages(scores, depth, values, D, o);
                        }
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
