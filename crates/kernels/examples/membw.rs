//! Streaming read bandwidth of this machine: sum a 1 GiB buffer with 1, then 2, ... threads
//! (each reading its own contiguous part), as plain loads, asking for each line 8 KiB ahead
//! into L2 as the decode kernels do, paced (see `common/paced.rs`), and paced while asking
//! ahead, from huge pages and from 4 KiB pages; the best of the eight is the roofline decode is
//! measured against. On Sapphire Rapids (2026-12-05) huge pages stream 33–36 GB/s on two cores
//! paced, and 35–43 paced while asking 7 KiB ahead (the fifth session of that day found it:
//! every share of the roofline measured before it divides by a roofline 5–20 % too low), 4 KiB
//! pages 26–33: a buffer in a plain `Vec` (4 KiB pages, as this example read before) understated
//! the roofline by a sixth. The model's packed weights and its cache pool are in huge pages.
//!
//! `cargo run --release -p onebit-kernels --example membw`

use std::time::Instant;

use onebit_kernels::arena::Arena;

#[path = "common/paced.rs"]
mod paced;

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

/// Read `data` tightly (asking ahead or not), or paced (see `paced::sum_paced_avx512`).
fn sum(data: &[u64], how: Read) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if matches!(how, Read::Paced | Read::PacedAhead) && is_x86_feature_detected!("avx512f") {
        // SAFETY: the feature was just detected.
        return unsafe { paced::sum_paced_avx512(bytemuck::cast_slice(data), how == Read::PacedAhead) };
    }
    sum_chunk(data, how == Read::Ahead)
}

#[derive(Clone, Copy, PartialEq)]
enum Read {
    Plain,
    Ahead,
    Paced,
    PacedAhead,
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
    let max_threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The same bytes in huge pages (where the system allows them: the model's packed weights and
    // its cache pool) and in 4 KiB pages (a model file or a pack cache file, mapped).
    let fill = |huge: bool| {
        let mut arena = Arena::try_zeroed_paged(bytes, huge).expect("1 GiB for the buffer");
        for (i, x) in arena.bytes_mut().chunks_exact_mut(8).enumerate() {
            x.copy_from_slice(&(i as u64).to_le_bytes());
        }
        arena
    };
    let (huge, small) = (fill(true), fill(false));
    for threads in 1..=max_threads {
        let gbs = |arena: &Arena, how: Read| {
            let data: &[u64] = bytemuck::cast_slice(arena.bytes());
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                let per = data.len() / threads;
                let total: u64 = std::thread::scope(|s| {
                    let hs: Vec<_> =
                        (0..threads).map(|i| s.spawn(move || sum(&data[i * per..(i + 1) * per], how))).collect();
                    hs.into_iter().map(|h| h.join().unwrap()).fold(0, u64::wrapping_add)
                });
                std::hint::black_box(total);
                best = best.min(t.elapsed().as_secs_f64());
            }
            bytes as f64 / best / 1e9
        };
        let reads = [Read::Plain, Read::Ahead, Read::Paced, Read::PacedAhead];
        let [hp, ha, hs, hb] = reads.map(|how| gbs(&huge, how));
        let [sp, sa, ss, sb] = reads.map(|how| gbs(&small, how));
        let best = [hp, ha, hs, hb, sp, sa, ss, sb].into_iter().fold(0.0, f64::max);
        println!(
            "{threads} thread(s): {best:.2} GB/s (huge pages: plain loads {hp:.2}, asking ahead {ha:.2}, \
             paced {hs:.2}, paced asking ahead {hb:.2}; 4 KiB pages: {sp:.2}, {sa:.2}, {ss:.2}, {sb:.2})"
        );
    }
}
