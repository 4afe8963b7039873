//! AVX-512 attention scores against a Q8_0 key cache, the queries rounded to Q8_0 too: sixteen
//! keys at a time, one key in each lane, so that a block's exact 8-bit dot comes whole out of
//! eight `vpdpbusd` (four bytes of every key against the same four bytes of the query,
//! broadcast), with no sum across lanes. Per query and block that is then one conversion, one
//! multiplication of scales and one fused multiply-add for sixteen keys.
//!
//! The cache keeps a key's blocks side by side (34 bytes: a scale, 32 bytes), so the sixteen
//! keys' bytes of a block are turned on their side in the registers: two keys to a vector, then
//! three rounds of unpacking and one permutation (24 shuffles for 512 bytes), shared by every
//! query of the kv head. Before, a vector held two blocks of one key and each query took a
//! conversion, a multiplication and an fma per 64 bytes and then a tree of sums across the
//! lanes: 15–20 GB/s from L2 with the two queries of a 1.7B-shape kv head, slower than the
//! memory feeds two cores.
//!
//! `vpdpbusd` multiplies unsigned by signed bytes: a key byte k is taken as k + 128 (its top
//! bit flipped), and each dot starts from −128 times the sum of the query block's bytes. A
//! score is `Σ_b float(I_b) · (d_qb · d_kb)`, the blocks added in order by fma, the same for a
//! key whichever lane or group of sixteen it falls in.

use std::arch::x86_64::*;

use crate::x86::{RUN_AHEAD as AHEAD, prefetch_run as prefetch};

/// Blocks a row may have.
const MAX_BLOCKS: usize = crate::table::MAX_HEAD / 32;

/// Query rows taken against each group of keys at a time.
const ROWS: usize = 4;

/// Per query row and block: −128 · the sum of its bytes, and its scale.
struct Queries {
    start: [[i32; MAX_BLOCKS]; ROWS],
    scale: [[f32; MAX_BLOCKS]; ROWS],
}

impl Queries {
    /// The rows of `row` bytes at `q`, `r` of them, each `nb` blocks.
    fn new(q: &[u8], r: usize, nb: usize) -> Queries {
        let mut qs = Queries { start: [[0; MAX_BLOCKS]; ROWS], scale: [[0.0; MAX_BLOCKS]; ROWS] };
        for (t, qr) in q.chunks_exact(nb * 34).take(r).enumerate() {
            for (b, blk) in qr.chunks_exact(34).enumerate() {
                qs.scale[t][b] = crate::formats::f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                qs.start[t][b] = -128 * blk[2..].iter().map(|&x| x as i8 as i32).sum::<i32>();
            }
        }
        qs
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
fn scores_impl(q: &[u8], keys: &[&[u8]], k: usize, out: &mut [f32], ldo: usize) {
    let (nb, row) = (k / 32, k / 32 * 34);
    assert!(nb <= MAX_BLOCKS, "scores_q8_0: rows of {k} values are wider than a head");
    let m = q.len() / row;
    let n: usize = keys.iter().map(|r| r.len() / row).sum();
    let mut i = 0;
    while i < m {
        let r = (m - i).min(ROWS);
        assert!((i + r) * row <= q.len() && (i + r - 1) * ldo + n <= out.len());
        let qs = Queries::new(&q[i * row..], r, nb);
        let mut j = 0;
        for (pi, run) in keys.iter().enumerate() {
            if let Some(next) = keys.get(pi + 1) {
                prefetch(next, 0, AHEAD);
            }
            let pn = run.len() / row;
            let run_bytes = pn * row;
            for c in (0..pn).step_by(16) {
                // The lines ahead, a block's share at a time (`sixteen`); none past the run.
                let from = c * row + AHEAD;
                let ahead = (run.as_ptr().wrapping_add(from), run_bytes.saturating_sub(from).min(16 * row));
                let live = (pn - c).min(16);
                // SAFETY: rows i..i + r of `q` and of `out` up to column n lie inside them
                // (just checked); keys c .. c + live are whole rows of the run (`Kernels`
                // checked that the run is whole rows), columns j + c .. j + c + live < n.
                unsafe {
                    let (pq, po) = (q.as_ptr().add(i * row), out.as_mut_ptr().add(i * ldo + j + c));
                    let keys = run.as_ptr().add(c * row);
                    match r {
                        4 => sixteen::<4>(pq, &qs, keys, live, nb, po, ldo, ahead),
                        3 => sixteen::<3>(pq, &qs, keys, live, nb, po, ldo, ahead),
                        2 => sixteen::<2>(pq, &qs, keys, live, nb, po, ldo, ahead),
                        _ => sixteen::<1>(pq, &qs, keys, live, nb, po, ldo, ahead),
                    }
                }
            }
            j += pn;
        }
        i += r;
    }
}

/// Qword indices that put 128-bit lanes 0 and 2 (`LOW`) or 1 and 3 (`HIGH`) of two vectors
/// side by side: (a0, b0, a2, b2) and (a1, b1, a3, b3).
const LOW: [i64; 8] = [0, 1, 8, 9, 4, 5, 12, 13];
const HIGH: [i64; 8] = [2, 3, 10, 11, 6, 7, 14, 15];

/// Block `b` of sixteen keys (`rows`: key l at `rows[l]`), on its side: vector s holds, in lane
/// l, bytes 4s .. 4s + 4 of key l's block, each plus 128.
///
/// # Safety
/// Every pointer is a key row holding block `b`; AVX-512 F/BW. The first eight lines of the
/// `ahead_len` bytes at `ahead` (any address) are asked for into L2 beside the loads.
#[inline(always)]
unsafe fn on_its_side(rows: &[*const u8; 16], b: usize, (ahead, ahead_len): (*const u8, usize)) -> [__m512i; 8] {
    // Plain loops, not `array::from_fn`: its closures are not inlined into this target-feature
    // context, and every intrinsic became a call.
    // SAFETY: the 32 bytes after a block's 2-byte scale lie in the row (the contract); the
    // constants are 8 i64 each.
    unsafe {
        let mut x = [_mm512_setzero_si512(); 8];
        // Vector l: key l in the low half, key l + 8 in the high half.
        for l in 0..8 {
            if 64 * l < ahead_len {
                crate::x86::prefetch_l2(ahead.wrapping_add(64 * l), 64);
            }
            let low = _mm256_loadu_si256(rows[l].add(34 * b + 2) as *const __m256i);
            let high = _mm256_loadu_si256(rows[l + 8].add(34 * b + 2) as *const __m256i);
            x[l] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high);
        }
        // Per 128-bit lane, the dwords of keys 2i and 2i + 1 interleaved.
        let mut a = [_mm512_setzero_si512(); 8];
        for i in 0..4 {
            a[2 * i] = _mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
            a[2 * i + 1] = _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
        }
        // Per 128-bit lane, dword d of four keys: quad[d] for keys 0-3 (and 8-11 in the high
        // half), quad[4 + d] for keys 4-7 (and 12-15).
        let mut quad = [_mm512_setzero_si512(); 8];
        for h in 0..2 {
            let base = 4 * h;
            quad[base] = _mm512_unpacklo_epi64(a[base], a[base + 2]);
            quad[base + 1] = _mm512_unpackhi_epi64(a[base], a[base + 2]);
            quad[base + 2] = _mm512_unpacklo_epi64(a[base + 1], a[base + 3]);
            quad[base + 3] = _mm512_unpackhi_epi64(a[base + 1], a[base + 3]);
        }
        // The lanes of quad[d]: keys 0-3 dword d, keys 0-3 dword d + 4, keys 8-11 dword d, keys
        // 8-11 dword d + 4; put beside quad[4 + d]'s, keys in order.
        let (lo, hi) = (_mm512_loadu_si512(LOW.as_ptr() as *const _), _mm512_loadu_si512(HIGH.as_ptr() as *const _));
        let flip = _mm512_set1_epi8(-128);
        let mut t = [_mm512_setzero_si512(); 8];
        for d in 0..4 {
            t[d] = _mm512_xor_si512(_mm512_permutex2var_epi64(quad[d], lo, quad[4 + d]), flip);
            t[d + 4] = _mm512_xor_si512(_mm512_permutex2var_epi64(quad[d], hi, quad[4 + d]), flip);
        }
        t
    }
}

/// `R` query rows (at `q`, their sums and scales in `qs`) against the `live` (≤ 16) key rows at
/// `keys`, the scores at `out` (`R` rows, `ldo` apart).
///
/// # Safety
/// R whole query rows of `nb` blocks at `q`; `live ≥ 1` whole key rows at `keys`; R rows of
/// `live` outputs at `out`; AVX-512 F/BW/VL/VNNI and F16C. `ahead` (any address) is asked
/// for in L2, a block's share of its lines at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn sixteen<const R: usize>(
    q: *const u8,
    qs: &Queries,
    keys: *const u8,
    live: usize,
    nb: usize,
    out: *mut f32,
    ldo: usize,
    (ahead, ahead_len): (*const u8, usize),
) {
    let row = nb * 34;
    let per_block = ahead_len.div_ceil(64).div_ceil(nb) * 64;
    // SAFETY: the caller's contract: key pointers are rows l.min(live - 1) < live; query bytes
    // of block b < nb of the R rows; outputs (r, l) for l < live.
    unsafe {
        let (mut rows, mut offsets) = ([keys; 16], [0i32; 16]);
        for l in 0..16 {
            offsets[l] = (l.min(live - 1) * row) as i32;
            rows[l] = keys.add(offsets[l] as usize);
        }
        let offsets = _mm512_loadu_si512(offsets.as_ptr() as *const _);
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..nb {
            // The block's share of the lines ahead: with two query rows or one, a line beside
            // each pair of keys' loads; with more, whose arithmetic keeps more registers busy,
            // all at once here (1.7B shape, two rows: 12.2–12.5 → 10.9–11.6 ms a token of
            // `attn_decode 4096 2 28 q8_0`; the 8B shape's four rows decoded 4 % slower).
            let at = b * per_block;
            let share = (ahead.wrapping_add(at), per_block.min(ahead_len.saturating_sub(at)));
            let (beside, after) = if R <= 2 { (share, 8 * 64) } else { ((share.0, 0), 0) };
            let kb = on_its_side(&rows, b, beside);
            if share.1 > after {
                crate::x86::prefetch_l2(share.0.wrapping_add(after), share.1 - after);
            }
            // The sixteen keys' scales of block b: the first word of the dword at each.
            let words = _mm512_i32gather_epi32::<1>(offsets, keys.add(34 * b) as *const i32);
            let dk = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
            for (r, acc) in acc.iter_mut().enumerate() {
                let qb = q.add(r * row + 34 * b + 2);
                let mut dot = _mm512_set1_epi32(qs.start[r][b]);
                for (s, kb) in kb.iter().enumerate() {
                    let q4 = (qb.add(4 * s) as *const i32).read_unaligned();
                    dot = _mm512_dpbusd_epi32(dot, *kb, _mm512_set1_epi32(q4));
                }
                let scale = _mm512_mul_ps(_mm512_set1_ps(qs.scale[r][b]), dk);
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, *acc);
            }
        }
        let m = ((1u32 << live) - 1) as __mmask16;
        for (r, acc) in acc.iter().enumerate() {
            _mm512_mask_storeu_ps(out.add(r * ldo), m, *acc);
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
