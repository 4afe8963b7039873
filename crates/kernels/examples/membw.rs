//! Streaming read bandwidth of this machine: sum a 1 GiB buffer with 1, then 2, ... threads
//! (each reading its own contiguous part), once as plain loads and once asking for each line
//! 8 KiB ahead into L2 as the decode kernels do; the better of the two is the roofline decode is
//! measured against. (On Sapphire Rapids the plain loads stream 28–30 GB/s on two cores and the
//! prefetching ones 31–34: with the plain figure the Q1_0 kernels read above "the roofline".)
//!
//! `cargo run --release -p onebit-kernels --example membw`

use std::time::Instant;

/// How far ahead the prefetching read asks for its lines: the decode kernels' distance.
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 8192;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sum_chunk_avx512(data: &[u64], prefetch: bool) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    for c in data.chunks_exact(32) {
        if prefetch {
            for line in 0..4 {
                let at = (c.as_ptr() as *const i8).wrapping_add(AHEAD + 64 * line);
                _mm_prefetch::<_MM_HINT_T1>(at);
            }
        }
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: vector `i` of the chunk's 32 values (eight each); AVX-512 F is enabled.
            *a = _mm512_add_epi64(*a, unsafe { _mm512_loadu_si512(c.as_ptr().add(8 * i) as *const _) });
        }
    }
    acc.iter().map(|&a| _mm512_reduce_add_epi64(a) as u64).fold(0, u64::wrapping_add)
}

fn sum_chunk(data: &[u64], prefetch: bool) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: the feature was just detected.
        return unsafe { sum_chunk_avx512(data, prefetch) };
    }
    // Only the AVX-512 read has a prefetching form; elsewhere both runs are plain loads.
    let _ = prefetch;
    // Eight independent accumulators keep the loads in flight; the compiler vectorizes this.
    let mut acc = [0u64; 8];
    for c in data.chunks_exact(8) {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    acc.iter().fold(0, |a, &b| a.wrapping_add(b))
}

fn main() {
    let bytes = 1usize << 30;
    let data: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    let max_threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in 1..=max_threads {
        let gbs = |prefetch: bool| {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                let per = data.len() / threads;
                let data = &data;
                let total: u64 = std::thread::scope(|s| {
                    let hs: Vec<_> = (0..threads)
                        .map(|i| s.spawn(move || sum_chunk(&data[i * per..(i + 1) * per], prefetch)))
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).fold(0, u64::wrapping_add)
                });
                std::hint::black_box(total);
                best = best.min(t.elapsed().as_secs_f64());
            }
            bytes as f64 / best / 1e9
        };
        let (plain, ahead) = (gbs(false), gbs(true));
        println!("{threads} thread(s): {:.2} GB/s (plain loads {plain:.2}, asking ahead {ahead:.2})", plain.max(ahead));
    }
}
