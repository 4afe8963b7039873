//! Packed Q4_0, Q4_1 and Q8_0 (16-row groups, see [`crate::pack`]) × 8-bit activations.
//!
//! The 16 rows of a group sit in the 16 lanes of a vector, four quants per lane, so one
//! `vpdpbusd` multiplies four consecutive weights of 16 rows by the same four activations
//! (broadcast): 64 products, no horizontal sums, and one f32 vector of 16 results per token
//! at the end. The quants are the unsigned operand (Q4 nibbles as they are, Q8_0 plus 128),
//! so the offsets are taken out afterwards, in integers, with the activations' block sums:
//! Σ(q−8)a = Σqa − 8Σa, Σ(w+128)a − 128Σa = Σwa. That leaves each row's exact integer sum per
//! block, scaled as the AMX tiles scale theirs (`p = C·d_a`, `acc = fma(p, d_w, acc)`, then
//! `acc = fma(s_a, m_w, acc)` for Q4_1), so the two paths give the same bits. A block's weights
//! are unpacked once and used for up to four tokens.

use std::arch::x86_64::*;
use std::ops::Range;

use onebit_gguf::GgmlType;

use crate::act::Acts;
use crate::matmul::{MatRef, OutPtr};
use crate::pack::{LEGACY_GROUP, legacy_layout};
use crate::x86::{PlanarRow, planar_row};

/// Tokens that share one unpacking of a block.
const TOKENS: usize = 4;

/// Rows `rows` (whole groups, except at the end of the matrix) for every token of `acts`.
pub(super) fn rows(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    let p = w.packed.expect("legacy16::rows needs a packed matrix");
    let nb = p.cols / 32;
    for g in rows.start / LEGACY_GROUP..rows.end.div_ceil(LEGACY_GROUP) {
        let row0 = g * LEGACY_GROUP;
        let n_rows = (rows.end.min(p.rows) - row0).min(LEGACY_GROUP);
        let mask = ((1u32 << n_rows) - 1) as __mmask16;
        let data = p.group(g);
        for t0 in (0..acts.rows()).step_by(TOKENS) {
            let a: [Option<PlanarRow>; TOKENS] =
                std::array::from_fn(|i| (t0 + i < acts.rows()).then(|| planar_row(acts, t0 + i)));
            // SAFETY: the table holding this kernel exists only on AVX-512 VNNI CPUs; the
            // packed group holds `nb` blocks of 16 rows.
            let res = unsafe {
                match a.iter().flatten().count() {
                    4 => group::<4>(w.ty, data, nb, &a),
                    3 => group::<3>(w.ty, data, nb, &a),
                    2 => group::<2>(w.ty, data, nb, &a),
                    _ => group::<1>(w.ty, data, nb, &a),
                }
            };
            for (i, v) in res.iter().enumerate().take(acts.rows() - t0) {
                // SAFETY: this call owns rows `rows` of the output; the mask stops at them.
                unsafe { _mm512_mask_storeu_ps(out.ptr_at(t0 + i, row0), mask, *v) };
            }
        }
    }
}

#[inline(always)]
unsafe fn bcast_dword(qs: &[i8], at: usize) -> __m512i {
    unsafe { _mm512_set1_epi32(std::ptr::read_unaligned(qs.as_ptr().add(at) as *const i32)) }
}

/// One group against `T` tokens: 16 results per token.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
unsafe fn group<const T: usize>(
    ty: GgmlType,
    data: &[u8],
    nb: usize,
    a: &[Option<PlanarRow>; TOKENS],
) -> [__m512; TOKENS] {
    let a: [PlanarRow; T] = std::array::from_fn(|i| a[i].expect("T tokens present"));
    let block = LEGACY_GROUP * ty.type_size() as usize;
    assert!(data.len() >= nb * block);
    let (m_at, qs_at) = legacy_layout(ty);
    let (q8, offset) = match ty {
        GgmlType::Q8_0 => (true, 128),
        GgmlType::Q4_0 => (false, 8),
        _ => (false, 0),
    };
    let nib = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); TOKENS];
    for b in 0..nb {
        // SAFETY: block `b` lies inside `data` (asserted above).
        unsafe {
            let blk = data.as_ptr().add(b * block);
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(4 * block) as *const i8);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
            let mw = m_at.map(|at| _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(at) as *const __m256i)));
            let q = blk.add(qs_at) as *const __m512i;
            // Eight vectors of quants, lane n holding values 4c..4c+4 of row n.
            let w: [__m512i; 8] = if q8 {
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
            for t in 0..T {
                let mut s = _mm512_setzero_si512();
                for (c, wc) in w.iter().enumerate() {
                    s = _mm512_dpbusd_epi32(s, *wc, bcast_dword(a[t].qs, 32 * b + 4 * c));
                }
                let c = _mm512_sub_epi32(s, _mm512_set1_epi32(offset * *a[t].isums.get_unchecked(b)));
                let p = _mm512_mul_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(*a[t].scales.get_unchecked(b)));
                acc[t] = _mm512_fmadd_ps(p, dw, acc[t]);
                if let Some(mw) = mw {
                    acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(*a[t].sums.get_unchecked(b)), mw, acc[t]);
                }
            }
        }
    }
    acc
}
