//! Weights to AMX A tiles: 16 weight rows of one activation block at a time, as signed bytes
//! with one f32 scale (and, for Q4_1/Q5_1, one f32 offset) per row and block.
//!
//! A block of `kb` values is `kb / colsb` tiles of 16 rows × `colsb` bytes; row `n` of step `s`
//! holds values `s·colsb .. (s+1)·colsb` of weight row `n`. Every decoder here is SIMD because
//! expansion is paid once per 16 rows and 32 tokens; a scalar decoder would cost more than the
//! tile products it feeds.

use std::arch::x86_64::*;

use onebit_gguf::GgmlType;

use super::Geometry;
use crate::formats::{
    BlockQ1_0, BlockQ2_0, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockTQ1_0, BlockTQ2_0, blocks,
    f16_to_f32,
};
use crate::matmul::MatRef;
use crate::pack::{GROUP, LEGACY_GROUP, PackedMat, Q1_GROUP_BLOCK, legacy_layout, scale_order};
use crate::x86::avx512::transpose16;

/// The expanded tiles of up to 16 weight rows: `blocks` blocks of `16 · kb` bytes, and per
/// block 16 scales and 16 offsets.
pub(super) struct TileRows<'a> {
    pub qs: &'a mut [u8],
    pub d: &'a mut [f32],
    pub m: &'a mut [f32],
}

/// Types with an AMX product, and the activation geometry they take.
pub(super) fn supports(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q1_0 | Q2_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | TQ1_0 | TQ2_0)
}

/// Expand rows `row0 .. row0 + 16` of `w` (rows past the end become zeros with scale 0).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,f16c")]
pub(super) fn expand(w: &MatRef, row0: usize, g: Geometry, out: &mut TileRows) {
    let nblk = w.cols / g.kb;
    let n_rows = w.rows.saturating_sub(row0).min(16);
    if n_rows < 16 {
        out.qs[..nblk * 16 * g.kb].fill(0);
        out.d[..nblk * 16].fill(0.0);
        out.m[..nblk * 16].fill(0.0);
    }
    if n_rows == 0 {
        return;
    }
    match (w.ty, w.packed) {
        (GgmlType::Q1_0, Some(p)) => return expand_q1_0_packed(p, row0, g, out),
        (GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0, Some(p)) => {
            // SAFETY: this function's target features include the ones `expand_legacy_packed` needs.
            return unsafe { expand_legacy_packed(p, row0, out) };
        }
        _ => {}
    }
    let mut vals = [0i8; 256];
    for n in 0..n_rows {
        let row = w.row(row0 + n);
        for blk in 0..nblk {
            let (d, m) = decode(w.ty, row, blk, g.kb, &mut vals);
            out.d[16 * blk + n] = d;
            out.m[16 * blk + n] = m;
            let tile = &mut out.qs[blk * 16 * g.kb..(blk + 1) * 16 * g.kb];
            for s in 0..g.kb / g.colsb {
                let at = s * 16 * g.colsb + n * g.colsb;
                tile[at..at + g.colsb].copy_from_slice(bytemuck::cast_slice(&vals[s * g.colsb..(s + 1) * g.colsb]));
            }
        }
    }
}

/// One activation block (`blk`, of `kb` values) of a weight row: values into `v`, returns
/// (scale, offset).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,f16c")]
fn decode(ty: GgmlType, row: &[u8], blk: usize, kb: usize, v: &mut [i8; 256]) -> (f32, f32) {
    let h = |b: [u8; 2]| f16_to_f32(u16::from_le_bytes(b));
    let out = v.as_mut_ptr();
    // SAFETY: every store below writes inside `v` (at most 256 bytes), and the loads read whole
    // blocks of `row`, which `MatRef` guarantees to be whole blocks.
    unsafe {
        match ty {
            GgmlType::Q8_0 => {
                let b = &blocks::<BlockQ8_0>(row)[blk];
                _mm256_storeu_si256(out as *mut __m256i, _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i));
                (h(b.d), 0.0)
            }
            GgmlType::Q4_0 => {
                let b = &blocks::<BlockQ4_0>(row)[blk];
                store_nibbles(&b.qs, -8, out);
                (h(b.d), 0.0)
            }
            GgmlType::Q4_1 => {
                let b = &blocks::<BlockQ4_1>(row)[blk];
                store_nibbles(&b.qs, 0, out);
                (h(b.d), h(b.m))
            }
            GgmlType::Q5_0 => {
                let b = &blocks::<BlockQ5_0>(row)[blk];
                store_q5(&b.qs, b.qh, -16, out);
                (h(b.d), 0.0)
            }
            GgmlType::Q5_1 => {
                let b = &blocks::<BlockQ5_1>(row)[blk];
                store_q5(&b.qs, b.qh, 0, out);
                (h(b.d), h(b.m))
            }
            GgmlType::Q1_0 if kb == 128 => {
                let b = &blocks::<BlockQ1_0>(row)[blk];
                for k in 0..4 {
                    let bits = u32::from_le_bytes(b.qs[4 * k..4 * k + 4].try_into().unwrap());
                    _mm256_storeu_si256(out.add(32 * k) as *mut __m256i, signs(bits));
                }
                (h(b.d), 0.0)
            }
            GgmlType::Q1_0 => {
                let b = &blocks::<BlockQ1_0>(row)[blk / 4];
                let bits = u32::from_le_bytes(b.qs[4 * (blk % 4)..4 * (blk % 4) + 4].try_into().unwrap());
                _mm256_storeu_si256(out as *mut __m256i, signs(bits));
                (h(b.d), 0.0)
            }
            GgmlType::Q2_0 => {
                let b = &blocks::<BlockQ2_0>(row)[blk / 2];
                let q = u64::from_le_bytes(b.qs[8 * (blk % 2)..8 * (blk % 2) + 8].try_into().unwrap());
                let codes = _mm256_multishift_epi64_epi8(CRUMB_SHIFTS_256, _mm256_set1_epi64x(q as i64));
                let vals = _mm256_sub_epi8(_mm256_and_si256(codes, _mm256_set1_epi8(3)), _mm256_set1_epi8(1));
                _mm256_storeu_si256(out as *mut __m256i, vals);
                (h(b.d), 0.0)
            }
            GgmlType::TQ2_0 => {
                let b = &blocks::<BlockTQ2_0>(row)[blk];
                let x = _mm512_loadu_si512(b.qs.as_ptr() as *const __m512i);
                for l in 0..4 {
                    let shifted = _mm512_srlv_epi16(x, _mm512_set1_epi16(2 * l as i16));
                    let vals = _mm512_sub_epi8(_mm512_and_si512(shifted, _mm512_set1_epi8(3)), _mm512_set1_epi8(1));
                    // Bytes 0..32 are weights 32l + m, bytes 32..64 are 128 + 32l + m.
                    _mm256_storeu_si256(out.add(32 * l) as *mut __m256i, _mm512_castsi512_si256(vals));
                    _mm256_storeu_si256(out.add(128 + 32 * l) as *mut __m256i, _mm512_extracti64x4_epi64::<1>(vals));
                }
                (h(b.d), 0.0)
            }
            GgmlType::TQ1_0 => {
                let b = &blocks::<BlockTQ1_0>(row)[blk];
                let mut q = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                for n in 0..5 {
                    _mm256_storeu_si256(out.add(32 * n) as *mut __m256i, trits_256(q));
                    q = _mm256_add_epi8(q, _mm256_add_epi8(q, q));
                }
                let mut q = _mm_loadu_si128(b.qs.as_ptr().add(32) as *const __m128i);
                for n in 0..5 {
                    _mm_storeu_si128(out.add(160 + 16 * n) as *mut __m128i, trits_128(q));
                    q = _mm_add_epi8(q, _mm_add_epi8(q, q));
                }
                let mut q = _mm_cvtsi32_si128(i32::from_le_bytes(b.qh));
                let mut last = [0i8; 16];
                for n in 0..4 {
                    let t: [i8; 16] = std::mem::transmute(trits_128(q));
                    last[4 * n..4 * n + 4].copy_from_slice(&t[..4]);
                    q = _mm_add_epi8(q, _mm_add_epi8(q, q));
                }
                std::ptr::copy_nonoverlapping(last.as_ptr(), out.add(240), 16);
                (h(b.d), 0.0)
            }
            other => unreachable!("no AMX expansion for {other}"),
        }
    }
}

/// For `vpmultishiftqb`: byte i of each 64-bit lane takes bits 2i.. of the lane, except that
/// lanes 1..4 start 16 bits further each, so four lanes cover the 32 crumbs of 8 bytes.
// SAFETY: `[u8; 32]` and `__m256i` are both 32 bytes of plain data; every bit pattern is valid.
const CRUMB_SHIFTS_256: __m256i = unsafe {
    std::mem::transmute::<[u8; 32], __m256i>([
        0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56,
        58, 60, 62,
    ])
};

/// ±1 bytes from 32 sign bits (set: +1).
#[inline(always)]
fn signs(bits: u32) -> __m256i {
    // SAFETY: only called from functions that enable AVX-512 BW/VL.
    unsafe { _mm256_mask_blend_epi8(bits, _mm256_set1_epi8(-1), _mm256_set1_epi8(1)) }
}

/// Q4 layout: byte j holds value j (low nibble) and j + 16 (high nibble).
///
/// # Safety
/// 32 bytes at `out` are writable; AVX2 is present.
#[inline(always)]
unsafe fn store_nibbles(qs: &[u8; 16], offset: i8, out: *mut i8) {
    // SAFETY: the load reads the 16 bytes of `qs`; the store writes the 32 bytes at `out` that
    // the caller's contract provides, with AVX2 (ditto).
    unsafe {
        let x = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
        let mask = _mm_set1_epi8(0x0f);
        let lo = _mm_and_si128(x, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(x, 4), mask);
        let v = _mm256_add_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(offset));
        _mm256_storeu_si256(out as *mut __m256i, v);
    }
}

/// Q5: the nibbles plus bit j of `qh` as 16.
///
/// # Safety
/// 32 bytes at `out` are writable; AVX-512 BW/VL are present.
#[inline(always)]
unsafe fn store_q5(qs: &[u8; 16], qh: [u8; 4], offset: i8, out: *mut i8) {
    // SAFETY: `store_nibbles` writes the 32 bytes at `out` (the caller's contract, which also
    // gives the AVX-512 BW/VL of the masked add), then they are read back and rewritten.
    unsafe {
        store_nibbles(qs, offset, out);
        let v = _mm256_loadu_si256(out as *const __m256i);
        let v = _mm256_mask_add_epi8(v, u32::from_le_bytes(qh), v, _mm256_set1_epi8(16));
        _mm256_storeu_si256(out as *mut __m256i, v);
    }
}

/// Trit (0, 1, 2) of each byte taken as a base-3 fraction, minus one: (q · 3) >> 8.
#[inline(always)]
fn trits_256(q: __m256i) -> __m256i {
    // SAFETY: only called from functions that enable AVX-512 BW/VL.
    unsafe {
        let one = _mm256_set1_epi8(1);
        let v = _mm256_mask_add_epi8(
            _mm256_set1_epi8(-1),
            _mm256_cmpge_epu8_mask(q, _mm256_set1_epi8(86)),
            _mm256_set1_epi8(-1),
            one,
        );
        _mm256_mask_add_epi8(v, _mm256_cmpge_epu8_mask(q, _mm256_set1_epi8(171u8 as i8)), v, one)
    }
}

#[inline(always)]
fn trits_128(q: __m128i) -> __m128i {
    // SAFETY: as above.
    unsafe {
        let one = _mm_set1_epi8(1);
        let v = _mm_mask_add_epi8(_mm_set1_epi8(-1), _mm_cmpge_epu8_mask(q, _mm_set1_epi8(86)), _mm_set1_epi8(-1), one);
        _mm_mask_add_epi8(v, _mm_cmpge_epu8_mask(q, _mm_set1_epi8(171u8 as i8)), v, one)
    }
}

/// Q1_0 rows from the row-interleaved packed layout: per 128-block, the four bytes of sign bits
/// of each 32-block sit in four vectors, 16 rows each; a byte transpose gives every row's
/// 32-bit mask at once. 32-value activation blocks take one 512-byte tile per 32-block;
/// 128-value blocks take two tiles of 64-byte rows, each row one 64-bit mask (32-blocks 0
/// and 1, then 2 and 3).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn expand_q1_0_packed(p: &PackedMat, row0: usize, geom: Geometry, out: &mut TileRows) {
    let group = p.group(row0 / GROUP);
    let tile = (row0 % GROUP) / 16;
    let (minus, plus) = (_mm512_set1_epi8(-1), _mm512_set1_epi8(1));
    for b128 in 0..p.cols / 128 {
        let g = &group[b128 * Q1_GROUP_BLOCK..(b128 + 1) * Q1_GROUP_BLOCK];
        let mut d = [0f32; 16];
        for (n, d) in d.iter_mut().enumerate() {
            let (v, l) = scale_order(16 * tile + n);
            *d = f16_to_f32(u16::from_le_bytes([g[2 * (16 * v + l)], g[2 * (16 * v + l) + 1]]));
        }
        // masks[k][n]: the 32 sign bits of 32-block k of row n.
        let masks: [[u32; 16]; 4] = std::array::from_fn(|k| {
            // SAFETY: the group block has 16 vectors of 64 bytes after the 64 scales.
            unsafe {
                let v = |j: usize| {
                    _mm_loadu_si128(g.as_ptr().add(2 * GROUP + 64 * (4 * k + j) + 16 * tile) as *const __m128i)
                };
                let (v0, v1, v2, v3) = (v(0), v(1), v(2), v(3));
                let (a_lo, a_hi) = (_mm_unpacklo_epi8(v0, v1), _mm_unpackhi_epi8(v0, v1));
                let (b_lo, b_hi) = (_mm_unpacklo_epi8(v2, v3), _mm_unpackhi_epi8(v2, v3));
                std::mem::transmute([
                    _mm_unpacklo_epi16(a_lo, b_lo),
                    _mm_unpackhi_epi16(a_lo, b_lo),
                    _mm_unpacklo_epi16(a_hi, b_hi),
                    _mm_unpackhi_epi16(a_hi, b_hi),
                ])
            }
        });
        if geom.kb == 128 {
            out.d[16 * b128..16 * b128 + 16].copy_from_slice(&d);
            let tiles = &mut out.qs[b128 * 2048..(b128 + 1) * 2048];
            for step in 0..2 {
                for n in 0..16 {
                    let bits = masks[2 * step][n] as u64 | (masks[2 * step + 1][n] as u64) << 32;
                    let row = _mm512_mask_blend_epi8(bits, minus, plus);
                    // SAFETY: row n of the step's tile is 64 bytes at 1024 · step + 64n.
                    unsafe { _mm512_storeu_si512(tiles.as_mut_ptr().add(1024 * step + 64 * n) as *mut __m512i, row) };
                }
            }
            continue;
        }
        for (k, masks) in masks.iter().enumerate() {
            let blk = 4 * b128 + k;
            out.d[16 * blk..16 * blk + 16].copy_from_slice(&d);
            let tile_out = &mut out.qs[blk * 512..(blk + 1) * 512];
            for (n, &bits) in masks.iter().enumerate() {
                // SAFETY: row n of the 512-byte tile is 32 bytes at 32n.
                unsafe { _mm256_storeu_si256(tile_out.as_mut_ptr().add(32 * n) as *mut __m256i, signs(bits)) };
            }
        }
    }
}

/// Q4_0/Q4_1/Q8_0 rows from the 16-row packed layout: each block's eight quant vectors (lane n:
/// four values of row n) are made signed and transposed into the 16 rows of the A tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn expand_legacy_packed(p: &PackedMat, row0: usize, out: &mut TileRows) {
    let group = p.group(row0 / LEGACY_GROUP);
    let block = LEGACY_GROUP * p.ty.type_size() as usize;
    let (m_at, qs_at) = legacy_layout(p.ty);
    let nib = _mm512_set1_epi8(0x0f);
    for blk in 0..p.cols / 32 {
        let b = &group[blk * block..(blk + 1) * block];
        // SAFETY: a packed block holds its scales (and offsets) and 256 or 512 bytes of quants;
        // `out` holds one 512-byte tile and 16 scales per block.
        unsafe {
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(b.as_ptr() as *const __m256i));
            _mm512_storeu_ps(out.d.as_mut_ptr().add(16 * blk), d);
            if let Some(at) = m_at {
                let m = _mm512_cvtph_ps(_mm256_loadu_si256(b.as_ptr().add(at) as *const __m256i));
                _mm512_storeu_ps(out.m.as_mut_ptr().add(16 * blk), m);
            }
            let q = b.as_ptr().add(qs_at) as *const __m512i;
            let w: [__m512i; 8] = match p.ty {
                GgmlType::Q8_0 => {
                    std::array::from_fn(|c| _mm512_xor_si512(_mm512_loadu_si512(q.add(c)), _mm512_set1_epi8(-128)))
                }
                ty => {
                    let shift = _mm512_set1_epi8(if ty == GgmlType::Q4_0 { 8 } else { 0 });
                    std::array::from_fn(|c| {
                        let v = _mm512_loadu_si512(q.add(c % 4));
                        let n = if c < 4 {
                            _mm512_and_si512(v, nib)
                        } else {
                            _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib)
                        };
                        _mm512_sub_epi8(n, shift)
                    })
                }
            };
            let rows =
                transpose16(&std::array::from_fn(
                    |c| if c < 8 { _mm512_castsi512_ps(w[c]) } else { _mm512_setzero_ps() },
                ));
            let tile = out.qs.as_mut_ptr().add(blk * 512);
            for (n, r) in rows.iter().enumerate() {
                _mm256_storeu_si256(tile.add(32 * n) as *mut __m256i, _mm512_castsi512_si256(_mm512_castps_si512(*r)));
            }
        }
    }
}

/// The B operands (VNNI order) of up to four 16-row weight tiles for one weight block, for the
/// few-token products ([`super::narrow`]): per tile, per activation block of the weight block,
/// per step, `colsb / 4` rows of 64 bytes, row r holding values 4r..4r+4 of the step for each
/// of the 16 weight rows (column n is row n); per tile the 16 scales.
pub(super) struct BTiles<'a> {
    pub qs: &'a mut [u8],
    pub d: &'a mut [[f32; 16]; 4],
}

/// Bytes of one tile's B operands for a weight block of `group` activation blocks.
pub(super) fn b_tile_bytes(g: Geometry, group: usize) -> usize {
    16 * group * g.kb
}

/// Expand weight block `wb` of `tiles` 16-row tiles from row `row0` (a multiple of 64) of a
/// packed Q1_0 matrix. Rows past the matrix are zeros in the packed layout, with scale 0.
pub(super) fn expand_b(p: &PackedMat, row0: usize, tiles: usize, wb: usize, out: &mut BTiles) {
    assert!(p.ty == GgmlType::Q1_0 && row0.is_multiple_of(GROUP) && out.qs.len() >= 2048 * tiles);
    // SAFETY: the narrow products run only on the AMX tier, whose CPUs have AVX-512 BW/VL and
    // F16C.
    unsafe { expand_b_q1_0_packed(p, row0, tiles, wb, out) }
}

/// Q1_0 from the 64-row packed layout (128-value weight blocks; 32- or 128-value activation
/// blocks lay out alike): B row 8k + 2j + h of a tile is nibble h of byte j of 32-block k of its
/// 16 rows, which sit in one 16-byte lane of one packed vector (byte n: row n). That lane is
/// broadcast, `vpshufb` repeats byte n at bytes 4n..4n + 4, and `vptestmb` against bits 4h + i
/// (byte 4n + i) gives the mask of the ±1 bytes: per 64 weights half a load, half a shuffle,
/// one test, one blend and one store.
///
/// (`vpshufbitqmb` picks those 64 bits in one instruction, but on Sapphire Rapids it issues
/// about one every three and a half cycles: a block of 64 rows × 128 values took 124 ns to
/// expand that way against 52 ns this way, one thread, L1-resident.)
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn expand_b_q1_0_packed(p: &PackedMat, row0: usize, tiles: usize, wb: usize, out: &mut BTiles) {
    let group = p.group(row0 / GROUP);
    let g = &group[wb * Q1_GROUP_BLOCK..(wb + 1) * Q1_GROUP_BLOCK];
    // The weights stream from memory once: the scales' lines here, each line of bits beside
    // its expansion (below), [`crate::x86::PREFETCH_AHEAD`] ahead into L2. (Two blocks ahead
    // into L1, all 18 lines at once, a 1.7B-shape step's products at 8 tokens took 24.0–24.7
    // ms; spread, 23.1–23.2; at 4 and 16 tokens the same either way. Half of the lines asked
    // for beside the tile products instead, so that lines are asked for all through a block's
    // work: the same.)
    crate::x86::prefetch_ahead(g.as_ptr(), 2 * GROUP);
    // Byte 4n + i of each 16-byte lane (columns 4L..4L + 4 in lane L): byte 4L + n of the
    // broadcast rows, tested against bit i (h = 0) or 4 + i (h = 1).
    let (mut rep, mut bit) = ([0u8; 64], [0u8; 64]);
    for (e, (r, b)) in rep.iter_mut().zip(&mut bit).enumerate() {
        (*r, *b) = ((e / 4) as u8, 1 << (e % 4));
    }
    // SAFETY: 64 bytes are one 512-bit vector.
    let (rep, bit0) = unsafe {
        (_mm512_loadu_si512(rep.as_ptr() as *const __m512i), _mm512_loadu_si512(bit.as_ptr() as *const __m512i))
    };
    let bit1 = _mm512_slli_epi16::<4>(bit0);
    let (minus, plus) = (_mm512_set1_epi8(-1), _mm512_set1_epi8(1));
    for i in 0..tiles {
        // The scales of rows 16i.. are two runs of eight (see `scale_order`).
        let at = 16 * (i / 2) + 8 * (i % 2);
        // SAFETY: the group block starts with its 64 scales; a tile's B operands are 2 KiB.
        unsafe {
            let lo = _mm_loadu_si128(g.as_ptr().add(2 * at) as *const __m128i);
            let hi = _mm_loadu_si128(g.as_ptr().add(2 * (at + 32)) as *const __m128i);
            _mm512_storeu_ps(out.d[i].as_mut_ptr(), _mm512_cvtph_ps(_mm256_set_m128i(hi, lo)));
            let tile = out.qs.as_mut_ptr().add(2048 * i);
            for k in 0..4 {
                for j in 0..4 {
                    if i == 0 {
                        crate::x86::prefetch_ahead(g.as_ptr().add(2 * GROUP + 64 * (4 * k + j)), 64);
                    }
                    let src = g.as_ptr().add(2 * GROUP + 64 * (4 * k + j) + 16 * i);
                    let rows = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(src as *const __m128i)), rep);
                    for (h, bit) in [bit0, bit1].into_iter().enumerate() {
                        let row = _mm512_mask_blend_epi8(_mm512_test_epi8_mask(rows, bit), minus, plus);
                        _mm512_storeu_si512(tile.add(512 * k + 64 * (2 * j + h)) as *mut __m512i, row);
                    }
                }
            }
        }
    }
}
