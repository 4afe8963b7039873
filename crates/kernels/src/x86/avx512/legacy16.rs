//! Packed Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (16-row groups, see [`crate::pack`]) × 8-bit
//! activations.
//!
//! The 16 rows of a group sit in the 16 lanes of a vector, four quants per lane, so one
//! `vpdpbusd` multiplies four consecutive weights of 16 rows by the same four activations
//! (broadcast): 64 products, no horizontal sums, and one f32 vector of 16 results per token
//! at the end. The quants are the unsigned operand (Q4 nibbles as they are, Q8_0 plus 128),
//! so the offsets are taken out afterwards, in integers, with the activations' block sums:
//! Σ(q−8)a = Σqa − 8Σa, Σ(w+128)a − 128Σa = Σwa. Q5's fifth bits join the nibbles as 16 by a
//! masked byte add (Q5_0's offset is then 16). That leaves each row's exact integer sum per
//! block, scaled as the AMX tiles scale theirs (`p = C·d_a`, `acc = fma(p, d_w, acc)`, then
//! `acc = fma(s_a, m_w, acc)` for Q4_1), so the two paths give the same bits. A block's weights
//! are unpacked once and used for up to four tokens.

use std::arch::x86_64::*;
use std::ops::Range;

use onebit_gguf::GgmlType;

use crate::act::Acts;
use crate::matmul::{MatRef, OutPtr};
use crate::pack::{LEGACY_GROUP, legacy_high_bits, legacy_layout};
use crate::x86::Planar;

/// Tokens that share one unpacking of a block.
const TOKENS: usize = 8;

/// How far ahead of the block it reads the kernel asks for the weights, into L2: measured per
/// CPU class, so chosen by the tier.
///
/// - AMD Zen 4 (the `avx512` tier on AMD CPUs): none. With a prefetch the 135M-parameter
///   SmolLM2 decoded 4 % slower and Gemma 3 270M up to 20 % (see [`crate::x86::prefetch_ahead`]).
/// - Intel Sapphire Rapids (the `amx` tier): 8 KiB. The hardware prefetcher stops at every 4 KiB
///   page, and these groups are a few KiB: SmolLM2 decoded at 285 tokens/s without, 405 with 4
///   KiB ahead, 420–450 with 8 KiB (2 KiB: 360–410, 16 KiB: 410, 32 KiB: 375); eight sequences
///   of it together 780–810 → 1,000–1,090, Gemma 3 270M 88–90 → 93–98. The same on an Intel
///   Xeon with AVX-512 and no AMX (the `avx512` tier on Intel CPUs, family 6 model 207):
///   SmolLM2 decoded at 240 and 266 tokens/s without, 305 and 347 with 8 KiB ahead.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Ahead {
    None,
    Kib8,
}

/// Rows `rows` (whole groups, except at the end of the matrix) for every token of `acts`.
pub(crate) fn rows(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr, ahead: Ahead) {
    match ahead {
        Ahead::None => rows_by::<0>(w, rows, acts, out),
        Ahead::Kib8 => rows_by::<8192>(w, rows, acts, out),
    }
}

fn rows_by<const AHEAD: usize>(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    // SAFETY: the tables holding this kernel exist only on AVX-512 VNNI CPUs.
    unsafe {
        match w.ty {
            GgmlType::Q8_0 => rows_of::<Q8_0, AHEAD>(w, rows, acts, out),
            GgmlType::Q4_0 => rows_of::<Q4_0, AHEAD>(w, rows, acts, out),
            GgmlType::Q4_1 => rows_of::<Q4_1, AHEAD>(w, rows, acts, out),
            GgmlType::Q5_0 => rows_of::<Q5_0, AHEAD>(w, rows, acts, out),
            GgmlType::Q5_1 => rows_of::<Q5_1, AHEAD>(w, rows, acts, out),
            other => unreachable!("no 16-row layout for {other}"),
        }
    }
}

/// The packed types: 0 Q8_0 (quants + 128), 1 Q4_0 (nibbles, offset 8), 2 Q4_1 (nibbles, and an
/// offset m per row and block), 3 Q5_0 (nibbles and fifth bits, offset 16), 4 Q5_1 (nibbles and
/// fifth bits, and m).
const Q8_0: u8 = 0;
const Q4_0: u8 = 1;
const Q4_1: u8 = 2;
const Q5_0: u8 = 3;
const Q5_1: u8 = 4;

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn rows_of<const TY: u8, const AHEAD: usize>(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    let p = w.packed.expect("legacy16::rows needs a packed matrix");
    let nb = p.cols / 32;
    let planar = Planar::new(acts.cols());
    for g in rows.start / LEGACY_GROUP..rows.end.div_ceil(LEGACY_GROUP) {
        let row0 = g * LEGACY_GROUP;
        let n_rows = (rows.end.min(p.rows) - row0).min(LEGACY_GROUP);
        let mask = ((1u32 << n_rows) - 1) as __mmask16;
        let data = p.group(g);
        for t0 in (0..acts.rows()).step_by(TOKENS) {
            let stride = acts.aux_row_bytes();
            // Token t0's row, from the whole buffer: the kernel reads the rows after it too.
            let a = Tokens { base: acts.aux_bytes()[t0 * stride..].as_ptr(), stride, p: planar };
            // SAFETY: the packed group holds `nb` blocks of 16 rows; tokens t0.. have planar
            // rows.
            let res = unsafe {
                match (acts.rows() - t0).min(TOKENS) {
                    8 => group::<8, TY, AHEAD>(data, nb, &a),
                    7 => group::<7, TY, AHEAD>(data, nb, &a),
                    6 => group::<6, TY, AHEAD>(data, nb, &a),
                    5 => group::<5, TY, AHEAD>(data, nb, &a),
                    4 => group::<4, TY, AHEAD>(data, nb, &a),
                    3 => group::<3, TY, AHEAD>(data, nb, &a),
                    2 => group::<2, TY, AHEAD>(data, nb, &a),
                    _ => group::<1, TY, AHEAD>(data, nb, &a),
                }
            };
            for (i, v) in res.iter().enumerate().take(acts.rows() - t0) {
                // SAFETY: this call owns rows `rows` of the output; the mask stops at them.
                unsafe { _mm512_mask_storeu_ps(out.ptr_at(t0 + i, row0), mask, *v) };
            }
        }
    }
}

/// Consecutive planar activation rows from `base`, `stride` bytes apart.
struct Tokens {
    base: *const u8,
    stride: usize,
    p: Planar,
}

/// One group against `T` tokens: 16 results per token.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn group<const T: usize, const TY: u8, const AHEAD: usize>(
    data: &[u8],
    nb: usize,
    a: &Tokens,
) -> [__m512; TOKENS] {
    let ty = match TY {
        Q8_0 => GgmlType::Q8_0,
        Q4_0 => GgmlType::Q4_0,
        Q4_1 => GgmlType::Q4_1,
        Q5_0 => GgmlType::Q5_0,
        _ => GgmlType::Q5_1,
    };
    let block = LEGACY_GROUP * ty.type_size() as usize;
    assert!(data.len() >= nb * block);
    let (m_at, qs_at) = legacy_layout(ty);
    let qh_at = legacy_high_bits(ty);
    let offset = match TY {
        Q8_0 => 128,
        Q4_0 => 8,
        Q5_0 => 16,
        _ => 0,
    };
    let nib = _mm512_set1_epi8(0x0f);
    let sixteen = _mm512_set1_epi8(0x10);
    let mut acc = [_mm512_setzero_ps(); TOKENS];
    for b in 0..nb {
        // SAFETY: block `b` lies inside `data` (asserted above); every token's planar row holds
        // the quants, scales and sums of block b.
        unsafe {
            let blk = data.as_ptr().add(b * block);
            if AHEAD > 0 {
                crate::x86::prefetch_l2(blk.wrapping_add(AHEAD), block);
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
            let mw = m_at.map(|at| _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(at) as *const __m256i)));
            let q = blk.add(qs_at) as *const __m512i;
            // Eight vectors of quants, lane n holding values 4c..4c+4 of row n.
            let mut w: [__m512i; 8] = if TY == Q8_0 {
                std::array::from_fn(|c| _mm512_loadu_si512(q.add(c)))
            } else {
                let v: [__m512i; 4] = std::array::from_fn(|p| _mm512_loadu_si512(q.add(p)));
                std::array::from_fn(|c| {
                    if c < 4 {
                        _mm512_and_si512(v[c], nib)
                    } else {
                        _mm512_and_si512(_mm512_srli_epi16::<4>(v[c - 4]), nib)
                    }
                })
            };
            if let Some(at) = qh_at {
                let masks = blk.add(at) as *const u64;
                for (c, wc) in w.iter_mut().enumerate() {
                    *wc = _mm512_mask_add_epi8(*wc, std::ptr::read_unaligned(masks.add(c)), *wc, sixteen);
                }
            }
            for t in 0..T {
                let row = a.base.add(t * a.stride);
                let f32_at = |at: usize| std::ptr::read_unaligned(row.add(at + 4 * b) as *const f32);
                // Two chains of products (the integer sum is exact in any order; one chain was
                // slower at four and eight tokens on Intel), the first starting at the offsets'
                // part, −offset·Σa, so that no subtraction follows.
                let start = if offset != 0 {
                    let isum = std::ptr::read_unaligned(row.add(a.p.isums + 4 * b) as *const i32);
                    _mm512_set1_epi32(-offset * isum)
                } else {
                    _mm512_setzero_si512()
                };
                let mut s = [start, _mm512_setzero_si512()];
                for (c, wc) in w.iter().enumerate() {
                    let x = std::ptr::read_unaligned(row.add(32 * b + 4 * c) as *const i32);
                    s[c % 2] = _mm512_dpbusd_epi32(s[c % 2], *wc, _mm512_set1_epi32(x));
                }
                let s = _mm512_add_epi32(s[0], s[1]);
                let p = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(f32_at(a.p.scales)));
                acc[t] = _mm512_fmadd_ps(p, dw, acc[t]);
                if let Some(mw) = mw {
                    acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(f32_at(a.p.sums)), mw, acc[t]);
                }
            }
        }
    }
    acc
}
