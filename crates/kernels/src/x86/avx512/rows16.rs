//! Unpacked weights of the types the AMX tiles also multiply (Q1_0, Q2_0, Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, TQ1_0, TQ2_0) × 8-bit activations, sixteen weight rows at a time.
//!
//! The AMX tier switches between its tiles and these kernels on the number of tokens, so both
//! must give a token the same bits. Here, as in the tiles, each row's sum over an activation
//! block is formed exactly in integers first, and the float work then follows the tiles'
//! recipe with one vector lane per weight row:
//!
//! - `p = C_0·d_a0`, then `p = fma(C_k, d_ak, p)` for the other activation blocks that share
//!   one weight block (Q1_0 with Q8_0: four, Q2_0: two);
//! - `acc = fma(p, d_w, acc)`, then `acc = fma(s_a, m_w, acc)` for Q4_1/Q5_1 (`s_a` the Q8_1
//!   block sum).
//!
//! With Q8_0x4 activations (one scale per 128 values) a Q1_0 block is one sum of 128 products.
//!
//! The weights enter `vpdpbusd` as unsigned codes u (value = u − bias: Q4_0 nibble − 8, Q8_0
//! byte + 128 − 128, Q1_0 2·bit − 1, …), and bias·Σa comes off the integer sums afterwards,
//! from the activations' exact block sums. A row's partial sums for a block (eight i32 lanes)
//! are reduced for sixteen rows at once into one vector ([`reduce16`]).

use std::arch::x86_64::*;
use std::ops::Range;

use crate::act::{ActFormat, Acts};
use crate::matmul::{MatRef, OutPtr};
use crate::x86::{PlanarRow, planar_row};

/// How one weight type's blocks meet the activations.
pub(super) trait Codes {
    /// Values and bytes per weight block.
    const QK: usize;
    const BYTES: usize;
    /// The u32 inside a block whose low half (high half if `D_HIGH`) is the f16 scale; for
    /// `MIN` types its high half is the f16 offset `m`.
    const D_AT: usize;
    const D_HIGH: bool;
    const MIN: bool;
    /// Value = code − `BIAS`.
    const BIAS: i32;
    /// Activation values per scale: 32 (Q8_0/Q8_1 blocks) or 256 (Q8_K).
    const KA: usize;
    /// Σ code·a over values `KA·k .. KA·(k + 1)` of the weight block at `w`, with the `KA`
    /// activation quants at `a`, in i32 lanes.
    ///
    /// # Safety
    /// `w` points at a whole block, `a` at `KA` quants; AVX-512 F/BW/VL/VNNI are present.
    unsafe fn partial(w: *const u8, k: usize, a: *const i8) -> __m256i;
}

/// Activation block `i` (of `KA` values): its quants, scale and exact sum Σa.
#[inline(always)]
fn block(a: &PlanarRow, i: usize, ka: usize) -> (*const i8, f32, i32) {
    (a.qs[ka * i..].as_ptr(), a.scales[i], a.isums[i])
}

/// Rows `rows` of `w` (unpacked, of the type `K` describes) for every token of `acts`.
pub(super) fn rows<K: Codes>(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    // SAFETY: the table holding this kernel exists only on AVX-512 VNNI CPUs.
    unsafe { rows_of::<K>(w, rows, acts, out) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn rows_of<K: Codes>(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    // Only Q1_0 batches are given one scale per 128 values; any other type reads such
    // activations as the Q8_0 blocks they also are.
    let x4 = acts.format() == ActFormat::Q8_0x4 && K::QK == 128 && K::KA == 32;
    let nwb = w.cols / K::QK;
    let rb = w.row_bytes();
    for row0 in rows.clone().step_by(16) {
        let n = (rows.end - row0).min(16);
        let mask = ((1u32 << n) - 1) as __mmask16;
        let base = w.row(row0).as_ptr();
        for t in 0..acts.rows() {
            let a = planar_row(acts, t);
            // SAFETY: rows row0 .. row0 + n of `w` lie at `base`, `rb` bytes apart, and this
            // call owns rows `rows` of the output, which the mask stops at.
            unsafe {
                let ahead = t == 0;
                let acc = if x4 {
                    group::<K, true>(base, rb, n, nwb, &a, ahead)
                } else {
                    group::<K, false>(base, rb, n, nwb, &a, ahead)
                };
                _mm512_mask_storeu_ps(out.ptr_at(t, row0), mask, acc);
            }
        }
    }
}

/// Sixteen rows (the first `n` real, the others repeat the last) against one token; with
/// `ahead`, the next sixteen rows (they follow these) are asked for while the blocks go by: all
/// sixteen rows are read from their first block on, so the rows being read cannot be fetched
/// ahead, only the next ones.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn group<K: Codes, const X4: bool>(
    w: *const u8,
    rb: usize,
    n: usize,
    nwb: usize,
    a: &PlanarRow,
    ahead: bool,
) -> __m512 {
    let share = (16 * rb).div_ceil(nwb).next_multiple_of(64);
    let g = K::QK / K::KA;
    let rows: [*const u8; 16] = std::array::from_fn(|r| w.wrapping_add(r.min(n - 1) * rb));
    let idx = _mm512_mullo_epi32(
        _mm512_min_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(n as i32 - 1),
        ),
        _mm512_set1_epi32(rb as i32),
    );
    let mut acc = _mm512_setzero_ps();
    for wb in 0..nwb {
        let at = wb * K::BYTES;
        if ahead {
            crate::x86::prefetch_l2(w.wrapping_add(16 * rb + wb * share), share);
        }
        // SAFETY: the caller's contract: every row holds `nwb` whole blocks; the scale's u32 lies inside one.
        unsafe {
            let sc = _mm512_i32gather_epi32::<1>(idx, w.add(at + K::D_AT) as *const i32);
            let half =
                |hi: bool| _mm512_cvtph_ps(_mm512_cvtepi32_epi16(if hi { _mm512_srli_epi32::<16>(sc) } else { sc }));
            let wd = half(K::D_HIGH);
            let p = if X4 {
                // One scale for the four 32-blocks: their sums are added in integers first.
                let (a0, da, _) = block(a, 4 * wb, 32);
                let parts: [__m256i; 16] = std::array::from_fn(|r| {
                    let s01 = _mm256_add_epi32(
                        K::partial(rows[r].add(at), 0, a0),
                        K::partial(rows[r].add(at), 1, a0.add(32)),
                    );
                    let s23 = _mm256_add_epi32(
                        K::partial(rows[r].add(at), 2, a0.add(64)),
                        K::partial(rows[r].add(at), 3, a0.add(96)),
                    );
                    _mm256_add_epi32(s01, s23)
                });
                let isum: i32 = (0..4).map(|k| block(a, 4 * wb + k, 32).2).sum();
                let c = _mm512_sub_epi32(reduce16(&parts), _mm512_set1_epi32(K::BIAS * isum));
                _mm512_mul_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(da))
            } else {
                let mut p = _mm512_setzero_ps();
                for k in 0..g {
                    let (ak, da, isum) = block(a, wb * g + k, K::KA);
                    let parts: [__m256i; 16] = std::array::from_fn(|r| K::partial(rows[r].add(at), k, ak));
                    let c = _mm512_cvtepi32_ps(_mm512_sub_epi32(reduce16(&parts), _mm512_set1_epi32(K::BIAS * isum)));
                    p = if k == 0 {
                        _mm512_mul_ps(c, _mm512_set1_ps(da))
                    } else {
                        _mm512_fmadd_ps(c, _mm512_set1_ps(da), p)
                    };
                }
                p
            };
            acc = _mm512_fmadd_ps(p, wd, acc);
            if K::MIN {
                acc = _mm512_fmadd_ps(_mm512_set1_ps(a.sums[wb]), half(true), acc);
            }
        }
    }
    acc
}

/// Lane r: the sum of the eight i32 lanes of `p[r]` (exact, so any order will do).
#[inline(always)]
unsafe fn reduce16(p: &[__m256i; 16]) -> __m512i {
    // SAFETY: the caller's contract: AVX-512 F is present.
    unsafe {
        // x[j] holds rows (j, j + 4) for j < 4 and (j + 4, j + 8) after, so that the lanes
        // come out in row order.
        let x: [__m512i; 8] = std::array::from_fn(|j| {
            let (lo, hi) = if j < 4 { (j, j + 4) } else { (j + 4, j + 8) };
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(p[lo]), p[hi])
        });
        // Per 128-bit lane: [x0 + x2, y0 + y2, x1 + x3, y1 + y3] of two inputs x, y.
        let u: [__m512i; 4] = std::array::from_fn(|i| {
            let (a, b) = (x[2 * i], x[2 * i + 1]);
            _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
        });
        // Per 128-bit lane: the four sums of x[4i .. 4i + 4].
        let v: [__m512i; 2] = std::array::from_fn(|i| {
            let (a, b) = (u[2 * i], u[2 * i + 1]);
            _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
        });
        _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0b10_00_10_00>(v[0], v[1]),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(v[0], v[1]),
        )
    }
}

#[inline(always)]
unsafe fn load16(p: *const u8) -> __m128i {
    // SAFETY: the caller's contract: 16 bytes at `p`.
    unsafe { _mm_loadu_si128(p as *const __m128i) }
}

#[inline(always)]
unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: the caller's contract: 32 bytes at `p`.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// Sixteen nibble-packed bytes to 32 codes: byte j holds value j (low) and j + 16 (high).
#[inline(always)]
unsafe fn nibbles(qs: *const u8) -> __m256i {
    // SAFETY: the caller's contract: 16 bytes at `qs`; AVX2 is present.
    unsafe {
        let v = load16(qs);
        let m = _mm_set1_epi8(0x0f);
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(v), m), _mm_and_si128(v, m))
    }
}

/// Q5: the nibbles plus 16 where bit j of the four bytes at `qh` is set.
#[inline(always)]
unsafe fn q5(qh: *const u8, qs: *const u8) -> __m256i {
    // SAFETY: the caller's contract: 4 bytes at `qh`, 16 at `qs`; AVX-512 BW/VL are present.
    unsafe {
        let bits = std::ptr::read_unaligned(qh as *const u32);
        _mm256_or_si256(nibbles(qs), _mm256_maskz_set1_epi8(bits, 0x10))
    }
}

#[inline(always)]
unsafe fn dot(u: __m256i, a: *const i8) -> __m256i {
    // SAFETY: the caller's contract: 32 quants at `a`; AVX-512 VNNI/VL are present.
    unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, load32(a as *const u8)) }
}

pub(super) struct Q8_0;
impl Codes for Q8_0 {
    const QK: usize = 32;
    const BYTES: usize = 34;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const MIN: bool = false;
    const BIAS: i32 = 128;
    const KA: usize = 32;
    #[inline(always)]
    unsafe fn partial(w: *const u8, _: usize, a: *const i8) -> __m256i {
        // SAFETY: the caller's contract: the block's 32 quants follow its scale.
        unsafe { dot(_mm256_xor_si256(load32(w.add(2)), _mm256_set1_epi8(-128)), a) }
    }
}

pub(super) struct Q4_0;
impl Codes for Q4_0 {
    const QK: usize = 32;
    const BYTES: usize = 18;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const MIN: bool = false;
    const BIAS: i32 = 8;
    const KA: usize = 32;
    #[inline(always)]
    unsafe fn partial(w: *const u8, _: usize, a: *const i8) -> __m256i {
        // SAFETY: the caller's contract: 16 bytes of nibbles follow the scale.
        unsafe { dot(nibbles(w.add(2)), a) }
    }
}

pub(super) struct Q4_1;
impl Codes for Q4_1 {
    const QK: usize = 32;
    const BYTES: usize = 20;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const MIN: bool = true;
    const BIAS: i32 = 0;
    const KA: usize = 32;
    #[inline(always)]
    unsafe fn partial(w: *const u8, _: usize, a: *const i8) -> __m256i {
        // SAFETY: the caller's contract: 16 bytes of nibbles follow the scale and offset.
        unsafe { dot(nibbles(w.add(4)), a) }
    }
}

pub(super) struct Q5_0;
impl Codes for Q5_0 {
    const QK: usize = 32;
    const BYTES: usize = 22;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const MIN: bool = false;
    const BIAS: i32 = 16;
    const KA: usize = 32;
    #[inline(always)]
    unsafe fn partial(w: *const u8, _: usize, a: *const i8) -> __m256i {
        // SAFETY: the caller's contract: scale, 4 bytes of fifth bits, 16 bytes of nibbles.
        unsafe { dot(q5(w.add(2), w.add(6)), a) }
    }
}

pub(super) struct Q5_1;
impl Codes for Q5_1 {
    const QK: usize = 32;
    const BYTES: usize = 24;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const MIN: bool = true;
    const BIAS: i32 = 0;
    const KA: usize = 32;
    #[inline(always)]
    unsafe fn partial(w: *const u8, _: usize, a: *const i8) -> __m256i {
        // SAFETY: the caller's contract: scale, offset, 4 bytes of fifth bits, 16 bytes of nibbles.
        unsafe { dot(q5(w.add(4), w.add(8)), a) }
    }
}

pub(super) struct Q2_0;
impl Codes for Q2_0 {
    const QK: usize = 64;
    const BYTES: usize = 18;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const MIN: bool = false;
    const BIAS: i32 = 1;
    const KA: usize = 32;
    #[inline(always)]
    unsafe fn partial(w: *const u8, k: usize, a: *const i8) -> __m256i {
        // SAFETY: the caller's contract: half k of the block is 8 bytes of 2-bit codes after the scale.
        unsafe { dot(crumbs(w.add(2 + 8 * k)), a) }
    }
}

/// The 32 two-bit codes of 8 bytes, byte j holding codes 4j..4j+4 in bits 2i..2i+2.
#[inline(always)]
unsafe fn crumbs(q: *const u8) -> __m256i {
    // SAFETY: the caller's contract: 8 bytes at `q`; AVX-512 BW/VL are present.
    unsafe {
        let v = std::ptr::read_unaligned(q as *const u64);
        // Byte 4j + i becomes a copy of byte j, then keeps its bits 2i..2i+2.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi64x(v as i64),
            _mm256_setr_epi8(
                0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7,
            ),
        );
        let three = _mm256_set1_epi8(3);
        let r = _mm256_and_si256(spread, three);
        let r = _mm256_mask_blend_epi8(0x2222_2222, r, _mm256_and_si256(_mm256_srli_epi16::<2>(spread), three));
        let r = _mm256_mask_blend_epi8(0x4444_4444, r, _mm256_and_si256(_mm256_srli_epi16::<4>(spread), three));
        _mm256_mask_blend_epi8(0x8888_8888, r, _mm256_and_si256(_mm256_srli_epi16::<6>(spread), three))
    }
}

pub(super) struct Q1_0;
impl Codes for Q1_0 {
    const QK: usize = 128;
    const BYTES: usize = 18;
    const D_AT: usize = 0;
    const D_HIGH: bool = false;
    const MIN: bool = false;
    const BIAS: i32 = 1;
    const KA: usize = 32;
    #[inline(always)]
    unsafe fn partial(w: *const u8, k: usize, a: *const i8) -> __m256i {
        // SAFETY: the caller's contract: the 32 sign bits of quarter k lie after the scale. A set bit is
        // +1 = 2·1 − 1, a clear one −1 = 2·0 − 1.
        unsafe {
            let bits = std::ptr::read_unaligned(w.add(2 + 4 * k) as *const u32);
            dot(_mm256_maskz_set1_epi8(bits, 2), a)
        }
    }
}

pub(super) struct TQ2_0;
impl Codes for TQ2_0 {
    const QK: usize = 256;
    const BYTES: usize = 66;
    const D_AT: usize = 62;
    const D_HIGH: bool = true;
    const MIN: bool = false;
    const BIAS: i32 = 1;
    const KA: usize = 256;
    #[inline(always)]
    unsafe fn partial(w: *const u8, _: usize, a: *const i8) -> __m256i {
        // SAFETY: the caller's contract: 64 bytes of codes, then the scale; 256 quants at `a`. Bytes 0..32
        // hold weights 0..128, bytes 32..64 weights 128..256: code l of byte m of half j is
        // weight 128j + 32l + m.
        unsafe {
            let v = _mm512_loadu_si512(w as *const __m512i);
            let three = _mm512_set1_epi8(3);
            let mut p = _mm512_setzero_si512();
            for l in 0..4 {
                let codes = _mm512_and_si512(_mm512_srl_epi16(v, _mm_set_epi64x(0, 2 * l as i64)), three);
                let lo = load32(a.add(32 * l) as *const u8);
                let hi = load32(a.add(128 + 32 * l) as *const u8);
                p = _mm512_dpbusd_epi32(p, codes, _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi));
            }
            _mm256_add_epi32(_mm512_castsi512_si256(p), _mm512_extracti64x4_epi64::<1>(p))
        }
    }
}

/// Trit `k` (0, 1 or 2) of 32 base-3 packed bytes: ((byte · 3^k mod 256) · 3) >> 8.
#[inline(always)]
unsafe fn trits(v16: __m512i, pow: i16) -> __m256i {
    // SAFETY: the caller's contract: AVX-512 BW is present.
    unsafe {
        let q = _mm512_and_si512(_mm512_mullo_epi16(v16, _mm512_set1_epi16(pow)), _mm512_set1_epi16(0xff));
        _mm512_cvtepi16_epi8(_mm512_srli_epi16::<8>(_mm512_mullo_epi16(q, _mm512_set1_epi16(3))))
    }
}

pub(super) struct TQ1_0;
impl Codes for TQ1_0 {
    const QK: usize = 256;
    const BYTES: usize = 54;
    const D_AT: usize = 50;
    const D_HIGH: bool = true;
    const MIN: bool = false;
    const BIAS: i32 = 1;
    const KA: usize = 256;
    #[inline(always)]
    unsafe fn partial(w: *const u8, _: usize, a: *const i8) -> __m256i {
        const POW3: [i16; 5] = [1, 3, 9, 27, 81];
        // SAFETY: the caller's contract: 48 bytes of five trits each, 4 bytes of four trits each (`qh`), then
        // the scale; 256 quants at `a`.
        unsafe {
            let a = a as *const u8;
            let mut p = _mm256_setzero_si256();
            // Bytes 0..32: trit k of byte m is weight 32k + m (weights 0..160).
            let v = _mm512_cvtepu8_epi16(load32(w));
            for (k, &pw) in POW3.iter().enumerate() {
                p = _mm256_dpbusd_epi32(p, trits(v, pw), load32(a.add(32 * k)));
            }
            // Bytes 32..48 (weights 160..240) and the trits of `qh` (240..256).
            let mut tail = [0u8; 96];
            let v2 = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(load16(w.add(32))));
            for (k, &pw) in POW3.iter().enumerate() {
                _mm_storeu_si128(tail.as_mut_ptr().add(16 * k) as *mut __m128i, _mm256_castsi256_si128(trits(v2, pw)));
            }
            for k in 0..4 {
                for j in 0..4 {
                    tail[80 + 4 * k + j] = crate::formats::ternary::tq1_trit(*w.add(48 + j), k) as u8;
                }
            }
            for c in 0..3 {
                p = _mm256_dpbusd_epi32(p, load32(tail.as_ptr().add(32 * c)), load32(a.add(160 + 32 * c)));
            }
            p
        }
    }
}
