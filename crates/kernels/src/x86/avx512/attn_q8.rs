//! AVX-512 attention scores against a Q8_0 key cache, the queries rounded to Q8_0 too: exact
//! 8-bit dots by `vpdpbusd`, two 32-value blocks to a vector (lanes 0–7 the first, 8–15 the
//! second, each lane the sum of four products), each lane's integer turned to f32 and multiplied
//! by its block's two scales into one accumulator per score, the 16 lanes then added by the tree
//! of the f32 products ([`store_sums`]).
//!
//! Widening Q8_0 keys to f32 costs four vector operations per 16 values before the products
//! (the scale, the sign extension, the conversion, the multiplication), and made decode
//! attention over such a cache slower than over an f16 one of twice the bytes. Here a vector of
//! 64 key values costs one exclusive-or, and per query one `vpdpbusd`, one conversion, one
//! multiplication of scales and one fused multiply-add.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes: a key byte k is taken as k + 128 (its top
//! bit flipped), and each lane starts from −128 times the sum of its four query bytes.

use std::arch::x86_64::*;

use super::attn::{AHEAD, prefetch, store_sums};

/// Pairs of blocks a row may have.
const MAX_PAIRS: usize = crate::dispatch::MAX_HEAD / 64;

/// One query row, per pair of blocks: its bytes, the correction each lane starts from, and its
/// scales (lanes 8–15 zero past an odd last block).
#[derive(Clone, Copy)]
struct Query {
    bytes: [__m512i; MAX_PAIRS],
    start: [__m512i; MAX_PAIRS],
    scale: [__m512; MAX_PAIRS],
}

/// The bytes of blocks `2p` and `2p + 1` of the Q8_0 row at `row` (`nb` blocks), and their
/// scales as f32 (each over its block's 8 lanes; zero bytes and scale past the last block).
///
/// # Safety
/// `row` points at `nb` whole blocks (34 bytes each), `2p < nb`; AVX-512 F/BW/VL and F16C.
#[inline(always)]
unsafe fn pair(row: *const u8, p: usize, nb: usize) -> (__m512i, __m512) {
    // SAFETY: blocks 2p and (when it exists) 2p + 1 lie inside the row (the contract); each is
    // a 2-byte scale and then 32 bytes.
    unsafe {
        let b0 = row.add(68 * p);
        let d0 = (b0 as *const i16).read_unaligned();
        let lo = _mm256_loadu_si256(b0.add(2) as *const __m256i);
        if 2 * p + 1 < nb {
            let b1 = b0.add(34);
            let d1 = (b1 as *const i16).read_unaligned();
            let hi = _mm256_loadu_si256(b1.add(2) as *const __m256i);
            let d = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_set1_epi16(d0)), _mm_set1_epi16(d1));
            (_mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi), _mm512_cvtph_ps(d))
        } else {
            let d = _mm256_zextsi128_si256(_mm_set1_epi16(d0));
            (_mm512_zextsi256_si512(lo), _mm512_cvtph_ps(d))
        }
    }
}

/// # Safety
/// As for [`pair`], over every pair of the row (`nb <= 2 · MAX_PAIRS`); AVX-512 VNNI.
#[inline(always)]
unsafe fn query(row: *const u8, nb: usize) -> Query {
    // SAFETY: the caller's contract is `pair`'s for every p < nb.div_ceil(2).
    unsafe {
        let mut q = Query {
            bytes: [_mm512_setzero_si512(); MAX_PAIRS],
            start: [_mm512_setzero_si512(); MAX_PAIRS],
            scale: [_mm512_setzero_ps(); MAX_PAIRS],
        };
        for p in 0..nb.div_ceil(2) {
            let (bytes, scale) = pair(row, p, nb);
            let sum128 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(-128), bytes);
            (q.bytes[p], q.start[p], q.scale[p]) = (bytes, _mm512_sub_epi32(_mm512_setzero_si512(), sum128), scale);
        }
        q
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn scores_impl(q: &[u8], keys: &[&[u8]], k: usize, out: &mut [f32], ldo: usize) {
    let (nb, row) = (k / 32, k / 32 * 34);
    assert!(nb.div_ceil(2) <= MAX_PAIRS, "scores_q8_0: rows of {k} values are wider than a head");
    let m = q.len() / row;
    let n: usize = keys.iter().map(|r| r.len() / row).sum();
    let mut i = 0;
    while i < m {
        let r = (m - i).min(4);
        assert!((i + r) * row <= q.len() && (i + r - 1) * ldo + n <= out.len());
        let mut j = 0;
        for (pi, run) in keys.iter().enumerate() {
            if let Some(next) = keys.get(pi + 1) {
                prefetch(next, 0, AHEAD);
            }
            let pn = run.len() / row;
            // SAFETY: rows i..i + r of `q` and of `out` up to column n lie inside them (just
            // checked); the run is `pn` whole rows (checked by `Kernels`), columns j..j + pn < n.
            unsafe {
                let (pq, po) = (q.as_ptr().add(i * row), out.as_mut_ptr().add(i * ldo + j));
                match r {
                    4 => cols::<4, 4>(pq, run, pn, nb, po, ldo),
                    3 => cols::<3, 5>(pq, run, pn, nb, po, ldo),
                    2 => cols::<2, 8>(pq, run, pn, nb, po, ldo),
                    _ => cols::<1, 16>(pq, run, pn, nb, po, ldo),
                }
            }
            j += pn;
        }
        i += r;
    }
}

/// `R` query rows (at `q`) against the `n` key rows of `run`, `C` at a time.
///
/// # Safety
/// R whole rows of `nb` blocks at `q`; R rows of at least `n` outputs at `out`, `ldo` apart;
/// `run` holds `n` whole rows; AVX-512 F/BW/VL/VNNI and F16C.
#[inline(always)]
unsafe fn cols<const R: usize, const C: usize>(
    q: *const u8,
    run: &[u8],
    n: usize,
    nb: usize,
    out: *mut f32,
    ldo: usize,
) {
    let row = nb * 34;
    // SAFETY: the caller's contract: every row pointer below is row j + c.min(live - 1) < n of
    // the run, or one of the R query rows; outputs (r, j + c) for c < live lie in `out`.
    unsafe {
        let qs: [Query; R] = std::array::from_fn(|r| query(q.add(r * row), nb));
        let mut j = 0;
        while j < n {
            prefetch(run, j * row + AHEAD, (j + C) * row + AHEAD);
            let live = (n - j).min(C);
            let rows: [*const u8; C] = std::array::from_fn(|c| run.as_ptr().add((j + c.min(live - 1)) * row));
            let mut acc = [[_mm512_setzero_ps(); C]; R];
            for p in 0..nb.div_ceil(2) {
                for c in 0..C {
                    let (bytes, dk) = pair(rows[c], p, nb);
                    let kx = _mm512_xor_si512(bytes, _mm512_set1_epi8(-128));
                    for (r, qr) in qs.iter().enumerate() {
                        let dot = _mm512_dpbusd_epi32(qr.start[p], kx, qr.bytes[p]);
                        let scale = _mm512_mul_ps(qr.scale[p], dk);
                        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r][c]);
                    }
                }
            }
            store_sums(&acc, out.add(j), ldo, live);
            j += C;
        }
    }
}

pub(crate) fn scores_q8_0(q: &[u8], keys: &[&[u8]], k: usize, out: &mut [f32], ldo: usize) {
    // SAFETY: the AVX-512 table (the only caller) is built only when the CPU reports AVX-512
    // F/BW/VL and VNNI besides the AVX2 tier's features, F16C among them
    // (`KernelTier::is_available`); `Kernels::scores_q8_0` checked that every row is whole
    // blocks, and the kernel asserts the rest.
    unsafe { scores_impl(q, keys, k, out, ldo) }
}
