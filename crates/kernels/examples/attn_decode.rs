//! Decode attention over a paged f16 cache, as the model runs it: every layer, every kv head,
//! one token's group of queries against `DEPTH` cached positions, the heads split over the
//! pool's threads. Prints the time per token and the bandwidth of the cache bytes read.
//! `cargo run --release -p onebit-kernels --example attn_decode [DEPTH] [THREADS] [LAYERS]`

use std::time::Instant;

use onebit_kernels::{KernelTier, Kernels, Pages, PerThread, Pool};

const BLOCK: usize = 16;
const HEADS: usize = 8;
const GROUP: usize = 2;
const D: usize = 128;

fn main() {
    let arg = |i: usize| std::env::args().nth(i);
    let depth: usize = arg(1).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let threads: usize = arg(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let layers: usize = arg(3).and_then(|s| s.parse().ok()).unwrap_or(28);
    let k = Kernels::new(KernelTier::best()).unwrap();
    let pool = Pool::new(threads);
    let blocks = depth.div_ceil(BLOCK);
    // [layer][k|v][block][head][slot][dim]
    let per = blocks * HEADS * BLOCK * D;
    let headmajor = std::env::var("HEADMAJOR").is_ok_and(|v| v == "1");
    let huge = std::env::var("HUGE").map_or(true, |v| v != "0");
    let cache = huge_vec(layers * 2 * per, huge);
    pool.for_each_mut(&mut cache.chunks_mut(1 << 20).collect::<Vec<_>>(), &|_, c| {
        for (i, x) in c.iter_mut().enumerate() {
            *x = half::f16::from_f32(((i * 7919 % 2003) as f32 / 1001.0 - 1.0) * 0.5).to_bits();
        }
    });
    let q: Vec<f32> = (0..HEADS * GROUP * D).map(|i| ((i * 104729 % 997) as f32 / 498.0 - 1.0) * 0.5).collect();
    let mut out = vec![0f32; HEADS * GROUP * D];
    let g: usize = std::env::var("GROUPED").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let pfd: usize = std::env::var("XPF").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let scratch = PerThread::new(threads, || (vec![0f32; HEADS * GROUP * depth], vec![0f32; HEADS * GROUP * D]));
    let bytes = (layers * 2 * per * 2) as f64;
    let table: Vec<usize> = (0..blocks).collect();
    for rep in 0..6 {
        let t = Instant::now();
        let toks = 8;
        for _ in 0..toks {
            for l in 0..layers {
                let outs = onebit_kernels::DisjointRows::new(&mut out, GROUP * D);
                if g > 0 {
                    pool.for_chunks(HEADS / g, 1, &|tid, range| {
                        // SAFETY: this thread's slot.
                        let (scores, o) = unsafe { scratch.get(tid) };
                        for u in range {
                            let run = |v: usize, b: usize| {
                                let at = ((l * 2 + v) * blocks + b) * HEADS * BLOCK * D + u * g * BLOCK * D;
                                &cache[at..at + g * BLOCK * D]
                            };
                            for b in 0..blocks {
                                if b + pfd < blocks {
                                    prefetch(run(0, b + pfd));
                                }
                                let r = run(0, b);
                                for hh in 0..g {
                                    let h = u * g + hh;
                                    let qh = &q[h * GROUP * D..][..GROUP * D];
                                    k.gemm_nt_pages(
                                        qh,
                                        Pages::F16(&[&r[hh * BLOCK * D..][..BLOCK * D]]),
                                        D,
                                        &mut scores[hh * GROUP * depth + b * BLOCK..],
                                        depth,
                                    );
                                }
                            }
                            for r in 0..g * GROUP {
                                let row = &mut scores[r * depth..][..depth];
                                row.iter_mut().for_each(|s| *s *= 0.088);
                                k.softmax(row);
                                k.round_f16(row);
                            }
                            o.fill(0.0);
                            for b in 0..blocks {
                                if b + pfd < blocks {
                                    prefetch(run(1, b + pfd));
                                }
                                let r = run(1, b);
                                for hh in 0..g {
                                    k.gemm_nn_acc_pages(
                                        &scores[hh * GROUP * depth + b * BLOCK..],
                                        depth,
                                        Pages::F16(&[&r[hh * BLOCK * D..][..BLOCK * D]]),
                                        D,
                                        &mut o[hh * GROUP * D..][..GROUP * D],
                                    );
                                }
                            }
                            for hh in 0..g {
                                // SAFETY: head h's rows are this unit's alone.
                                unsafe { outs.row(u * g + hh) }.copy_from_slice(&o[hh * GROUP * D..][..GROUP * D]);
                            }
                        }
                    });
                    continue;
                }
                pool.for_chunks(HEADS, 1, &|tid, range| {
                    // SAFETY: this thread's slot.
                    let (scores, o) = unsafe { scratch.get(tid) };
                    for h in range {
                        let page = |v: usize, b: usize| {
                            let at = if headmajor {
                                ((l * 2 + v) * HEADS + h) * blocks * BLOCK * D + b * BLOCK * D
                            } else {
                                ((l * 2 + v) * blocks + b) * HEADS * BLOCK * D + h * BLOCK * D
                            };
                            &cache[at..at + BLOCK * D]
                        };
                        let whole = |v: usize| {
                            let at = ((l * 2 + v) * HEADS + h) * blocks * BLOCK * D;
                            vec![&cache[at..at + blocks * BLOCK * D]]
                        };
                        let kp: Vec<&[u16]> =
                            if headmajor { whole(0) } else { table.iter().map(|&b| page(0, b)).collect() };
                        let qh = &q[h * GROUP * D..][..GROUP * D];
                        k.gemm_nt_pages(qh, Pages::F16(&kp), D, scores, depth);
                        for r in 0..GROUP {
                            let row = &mut scores[r * depth..][..depth];
                            row.iter_mut().for_each(|s| *s *= 0.088);
                            k.softmax(row);
                            k.round_f16(row);
                        }
                        let vp: Vec<&[u16]> =
                            if headmajor { whole(1) } else { table.iter().map(|&b| page(1, b)).collect() };
                        let o = &mut o[..GROUP * D];
                        o.fill(0.0);
                        k.gemm_nn_acc_pages(scores, depth, Pages::F16(&vp), D, o);
                        // SAFETY: head h's rows are this unit's alone.
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

/// `n` zeroed halves in 2 MiB-aligned memory advised for huge pages, as the model's KV pool.
fn huge_vec(n: usize, huge: bool) -> &'static mut [u16] {
    let len = n * 2 + (2 << 20);
    // SAFETY: a fresh private anonymous mapping, checked; never unmapped (the example exits).
    unsafe {
        let base = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert!(base != libc::MAP_FAILED);
        let start = (base as usize).next_multiple_of(2 << 20) as *mut libc::c_void;
        if huge {
            libc::madvise(start, n * 2, libc::MADV_HUGEPAGE);
        }
        std::slice::from_raw_parts_mut(start as *mut u16, n)
    }
}

fn prefetch(run: &[u16]) {
    for off in (0..run.len()).step_by(32) {
        // SAFETY: a prefetch of an address inside the run; it cannot fault.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(run.as_ptr().add(off) as *const i8)
        };
    }
}
