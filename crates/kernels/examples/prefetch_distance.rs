//! How far ahead a stream with arithmetic on it should ask for its lines: the work of the
//! AVX2 decode scores (two query rows against rows of 128 halves: 16 widenings and 32 fmas a
//! row) over a 512 MiB buffer in huge pages, split between the threads, asking for one line
//! per 32 values `DIST` bytes ahead, for a range of distances. Then the same work from L1 and
//! from L2 (the arithmetic alone) and from memory without asking.
//!
//! On Zen 2 (2026-12-07; `membw` 32–35 GB/s on two threads), two threads: the arithmetic
//! alone 69 GB/s, from memory without asking 28.7, asking 0.5–1.25 KiB ahead 34.5–35 (the
//! machine's read), 1.5–2 KiB 28–30, 3–8 KiB 30.5–30.7; one thread: 34, 14.4, 17.5–18.2,
//! 14.2–15.5, 15.5–15.7. So the avx2 scores ask 1,280 bytes ahead.
//!
//! `cargo run --release -p onebit-kernels --example prefetch_distance [THREADS]` (x86-64 with
//! AVX2, FMA and F16C).

#[cfg(target_arch = "x86_64")]
mod stream {
    use std::arch::x86_64::*;

    /// The scores' work over `rows` rows of 128 halves at `rows_at` (row `r % wrap` read for
    /// row r), asking for a line `dist` bytes ahead every 32 values when `dist > 0`.
    ///
    /// # Safety
    /// `rows.min(wrap)` rows of 128 halves at `rows_at`; 256 floats at `q`; AVX2, FMA, F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scan(rows_at: *const u16, rows: usize, wrap: usize, q: &[f32; 256], dist: usize) -> f32 {
        let mut total = 0.0;
        for r in 0..rows {
            // SAFETY: row r % wrap lies in the buffer, and 128 values of it are read (the
            // contract); the query rows are `q`'s 256 values; a prefetch reads nothing.
            unsafe {
                let b = rows_at.add(r % wrap * 128);
                let mut s = [_mm256_setzero_ps(); 4];
                for d in (0..128).step_by(16) {
                    if dist > 0 && d % 32 == 0 {
                        _mm_prefetch::<_MM_HINT_T1>((b.add(d) as *const i8).wrapping_add(dist));
                    }
                    let x0 = _mm256_cvtph_ps(_mm_loadu_si128(b.add(d) as *const __m128i));
                    let x1 = _mm256_cvtph_ps(_mm_loadu_si128(b.add(d + 8) as *const __m128i));
                    for (h, s) in s.chunks_exact_mut(2).enumerate() {
                        s[0] = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(128 * h + d)), x0, s[0]);
                        s[1] = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(128 * h + d + 8)), x1, s[1]);
                    }
                }
                let sum = _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3]));
                total += _mm256_cvtss_f32(sum);
            }
        }
        total
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    use std::time::Instant;

    use onebit_kernels::arena::Arena;

    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
        println!("needs AVX2, FMA and F16C");
        return;
    }
    let threads: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    let bytes = 512 << 20;
    let mut arena = Arena::zeroed(bytes);
    let halves: &mut [u16] = bytemuck::cast_slice_mut(arena.bytes_mut());
    for (i, h) in halves.iter_mut().enumerate() {
        *h = half::f16::from_f32((i % 1009) as f32 / 1009.0 - 0.5).to_bits();
    }
    let halves: &[u16] = halves;
    let q = [0.5f32; 256];
    let rows = bytes / 256 / threads;
    let run = |name: &str, dist: usize, wrap: usize| {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            std::thread::scope(|s| {
                for part in halves.chunks_exact(rows * 128).take(threads) {
                    // SAFETY: the part holds `rows` rows of 128 halves (wrap ≤ rows); the CPU
                    // has AVX2, FMA and F16C (checked above).
                    s.spawn(move || std::hint::black_box(unsafe { stream::scan(part.as_ptr(), rows, wrap, &q, dist) }));
                }
            });
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("{name:<24} {:6.1} GB/s", (threads * rows * 256) as f64 / best / 1e9);
    };
    println!("{threads} thread(s), the scores' work of two query rows over rows of 128 halves");
    run("from L1 (64 rows)", 0, 64);
    run("from L2 (1,024 rows)", 0, 1024);
    run("from memory, no asking", 0, usize::MAX);
    for dist in [256, 512, 768, 1024, 1280, 1536, 2048, 3072, 4096, 8192] {
        run(&format!("asking {dist} B ahead"), dist, usize::MAX);
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("x86-64 only");
}
