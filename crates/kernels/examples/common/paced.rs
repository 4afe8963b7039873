//! The paced read that `membw` and `gemv_ab` both stream with: the roofline decode is measured
//! against, and the read `gemv_ab` sets beside the product of the same bytes.

/// How far ahead the paced read asks for its lines, when it does (7 KiB streamed best).
#[cfg(target_arch = "x86_64")]
pub const PACED_AHEAD: usize = 7168;

/// One line a step, each step waiting on a multiply of the step before (a 4-cycle chain beside
/// the loads, far from binding at these speeds). On Sapphire Rapids this paced read streams
/// more than a tight loop (`membw`'s plain read), which issues its loads as fast as it can:
/// 33–35 GB/s against 29–31 on two cores, huge pages (presumably the hardware prefetcher runs further
/// ahead of fewer demand misses in flight). The decode kernels' arithmetic paces their reads
/// the same way. With `ahead`, three steps of the chain a line and each line asked for 7 KiB
/// ahead into L2: on the same machine 35–43 GB/s against 33–36 (two steps: 35–38; four: 38;
/// five and more bind).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub fn sum_paced_avx512(data: &[u8], ahead: bool) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 8];
    let mut pace = 1u64;
    for (i, line) in data.chunks_exact(64).enumerate() {
        if ahead {
            // Three steps of the chain, the pace at which asking ahead streamed best.
            pace = pace.wrapping_mul(3) ^ i as u64;
            pace = pace.wrapping_mul(3) ^ i as u64;
            _mm_prefetch::<_MM_HINT_T1>((line.as_ptr() as *const i8).wrapping_add(PACED_AHEAD));
        }
        pace = pace.wrapping_mul(3) ^ i as u64;
        // SAFETY: the line is 64 bytes; AVX-512 F is enabled.
        let x = unsafe { _mm512_loadu_si512(line.as_ptr() as *const _) };
        acc[i % 8] = _mm512_add_epi64(acc[i % 8], x);
    }
    acc.iter().map(|&a| _mm512_reduce_add_epi64(a) as u64).fold(pace, u64::wrapping_add)
}
