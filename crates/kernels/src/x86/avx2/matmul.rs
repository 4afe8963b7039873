//! AVX2 products over the packed layouts (see [`crate::pack`]): Q1_0 by lookup tables (32
//! rows per `vpshufb`), and Q4_0/Q4_1/Q8_0 with 8 rows in the 8 lanes of a vector. 8-bit
//! products use AVX-VNNI where the CPU has it, else `vpmaddubsw` with operands kept small
//! enough that its 16-bit sums cannot saturate. Unpacked weights and other types take the
//! scalar dot products.

use std::arch::x86_64::*;
use std::ops::Range;

use onebit_gguf::GgmlType;

use crate::act::Acts;
use crate::matmul::{MatRef, OutPtr, RowKernel, TiledFn};
use crate::pack::{GROUP, LEGACY_GROUP, PackedMat, Q1_GROUP_BLOCK, legacy_layout, scale_order};
use crate::x86::{PlanarRow, planar_row};

pub(super) fn kernel(ty: GgmlType) -> Option<RowKernel> {
    let scalar = crate::scalar::dot::dot_fn(ty)?;
    let f: TiledFn = match ty {
        GgmlType::Q1_0 => |w, r, a, o| packed_or(w, r, a, o, q1_0_packed),
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => |w, r, a, o| packed_or(w, r, a, o, legacy_packed),
        _ => return Some(RowKernel::Dot(scalar)),
    };
    Some(RowKernel::Tiled(f))
}

/// The packed kernel, or the scalar dot product for a matrix that was not packed.
fn packed_or(
    w: &MatRef,
    rows: Range<usize>,
    acts: &Acts,
    out: OutPtr,
    packed: fn(&PackedMat, Range<usize>, &Acts, OutPtr),
) {
    match w.packed {
        Some(p) => packed(p, rows, acts, out),
        None => {
            let dot = crate::scalar::dot::dot_fn(w.ty).expect("a type with a kernel has a reference dot");
            RowKernel::Dot(dot).run(w, rows, acts, out)
        }
    }
}

fn has_vnni() -> bool {
    is_x86_feature_detected!("avxvnni")
}

fn q1_0_packed(p: &PackedMat, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    let nb = p.cols / 128;
    for g in rows.start / GROUP..rows.end.div_ceil(GROUP) {
        let data = p.group(g);
        for t in 0..acts.rows() {
            // SAFETY: the AVX2 table is handed out only on AVX2 CPUs.
            let res = unsafe { lut_group(data, planar_row(acts, t), nb) };
            for (r, &v) in res.iter().enumerate() {
                let row = g * GROUP + r;
                if row >= rows.end {
                    break;
                }
                // SAFETY: this call owns rows `rows` of the output.
                unsafe { out.write(t, row, v) };
            }
        }
    }
}

/// Where the packed scales of rows `8s..8s+8` (s = 0..8) start: the layout stores them in the
/// AVX-512 kernels' order ([`scale_order`]), eight consecutive rows at a time.
fn scale_run(s: usize) -> usize {
    let (v, l) = scale_order(8 * s);
    16 * v + l
}

/// One 64-row group against one token, in row order.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lut_group(data: &[u8], a: PlanarRow, nb: usize) -> [f32; GROUP] {
    let m = _mm256_set1_epi8(0x0f);
    // acc[h][q]: half h (rows 32h..32h+32); q = rows 0-7, 16-23, 8-15, 24-31 of the half.
    let mut acc = [[_mm256_setzero_ps(); 4]; 2];
    for b in 0..nb {
        // SAFETY: block `b` of the group is Q1_GROUP_BLOCK bytes, and the lookup tables hold
        // 32 bytes per 4 activations.
        unsafe {
            let blk = data.as_ptr().add(b * Q1_GROUP_BLOCK);
            let mut t = [[_mm256_setzero_ps(); 4]; 2];
            for k in 0..4 {
                let mut s = [[_mm256_setzero_si256(); 2]; 2];
                for j in 0..4 {
                    let base = a.lut.as_ptr().add(32 * (32 * b + 8 * k + 2 * j));
                    for (h, s) in s.iter_mut().enumerate() {
                        let wv = _mm256_loadu_si256(blk.add(2 * GROUP + (4 * k + j) * 64 + 32 * h) as *const __m256i);
                        let lo = _mm256_and_si256(wv, m);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(wv), m);
                        for (off, idx) in [(0, lo), (32, hi)] {
                            let tl = _mm256_broadcastsi128_si256(_mm_loadu_si128(base.add(off) as *const __m128i));
                            let th = _mm256_broadcastsi128_si256(_mm_loadu_si128(base.add(off + 16) as *const __m128i));
                            let (rl, rh) = (_mm256_shuffle_epi8(tl, idx), _mm256_shuffle_epi8(th, idx));
                            s[0] = _mm256_add_epi16(s[0], _mm256_unpacklo_epi8(rl, rh));
                            s[1] = _mm256_add_epi16(s[1], _mm256_unpackhi_epi8(rl, rh));
                        }
                    }
                }
                let d = _mm256_set1_ps(*a.scales.get_unchecked(4 * b + k));
                for h in 0..2 {
                    let parts = [
                        _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s[h][0])),
                        _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(s[h][0])),
                        _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s[h][1])),
                        _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(s[h][1])),
                    ];
                    for q in 0..4 {
                        t[h][q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(parts[q]), d, t[h][q]);
                    }
                }
            }
            // parts order per half: rows 0-7 (lo, lane 0), 16-23 (lo, lane 1), 8-15, 24-31.
            for h in 0..2 {
                for (q, first) in [0usize, 2, 1, 3].into_iter().enumerate() {
                    let d0 = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(2 * scale_run(4 * h + first)) as *const __m128i));
                    acc[h][q] = _mm256_fmadd_ps(t[h][q], d0, acc[h][q]);
                }
            }
        }
    }
    let mut res = [0f32; GROUP];
    for h in 0..2 {
        for (q, first) in [0usize, 2, 1, 3].into_iter().enumerate() {
            // SAFETY: rows 8·first.. of the half are eight floats inside `res`.
            unsafe { _mm256_storeu_ps(res.as_mut_ptr().add(32 * h + 8 * first), acc[h][q]) };
        }
    }
    res
}

fn legacy_packed(p: &PackedMat, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    let nb = p.cols / 32;
    let vnni = has_vnni();
    for g in rows.start / LEGACY_GROUP..rows.end.div_ceil(LEGACY_GROUP) {
        let data = p.group(g);
        for t in 0..acts.rows() {
            let a = planar_row(acts, t);
            // SAFETY: the AVX2 table is handed out only on AVX2 CPUs; AVX-VNNI only when present.
            let res = unsafe {
                if vnni { legacy_group::<true>(p.ty, data, nb, a) } else { legacy_group::<false>(p.ty, data, nb, a) }
            };
            for (n, &v) in res.iter().enumerate() {
                let row = g * LEGACY_GROUP + n;
                if row >= rows.end {
                    break;
                }
                // SAFETY: this call owns rows `rows` of the output.
                unsafe { out.write(t, row, v) };
            }
        }
    }
}

/// Σ u·s over each lane's four byte pairs, added to `acc` (u < 128 or s > -128 when !VNNI).
#[inline(always)]
unsafe fn dot4<const VNNI: bool>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    unsafe {
        if VNNI {
            _mm256_dpbusd_avx_epi32(acc, u, s)
        } else {
            _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
        }
    }
}

/// One 16-row group against one token, with AVX-VNNI or without.
unsafe fn legacy_group<const VNNI: bool>(ty: GgmlType, data: &[u8], nb: usize, a: PlanarRow) -> [f32; LEGACY_GROUP] {
    // SAFETY (caller): AVX2 (and AVX-VNNI for VNNI) are present.
    unsafe { if VNNI { legacy_group_vnni(ty, data, nb, a) } else { legacy_group_plain(ty, data, nb, a) } }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn legacy_group_vnni(ty: GgmlType, data: &[u8], nb: usize, a: PlanarRow) -> [f32; LEGACY_GROUP] {
    unsafe { legacy_group_body::<true>(ty, data, nb, a) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_group_plain(ty: GgmlType, data: &[u8], nb: usize, a: PlanarRow) -> [f32; LEGACY_GROUP] {
    unsafe { legacy_group_body::<false>(ty, data, nb, a) }
}

/// Rows 0-7 and 8-15 are the two 32-byte halves of each packed vector.
#[inline(always)]
unsafe fn legacy_group_body<const VNNI: bool>(
    ty: GgmlType,
    data: &[u8],
    nb: usize,
    a: PlanarRow,
) -> [f32; LEGACY_GROUP] {
    // SAFETY (caller): AVX2, FMA, F16C (and AVX-VNNI for VNNI) are enabled.
    unsafe {
        let block = LEGACY_GROUP * ty.type_size() as usize;
        assert!(data.len() >= nb * block);
        let (m_at, qs_at) = legacy_layout(ty);
        let nib = _mm256_set1_epi8(0x0f);
        let flip = _mm256_set1_epi8(-128);
        let mut acc = [_mm256_setzero_ps(); 2];
        for b in 0..nb {
            // Block `b` lies inside `data` (asserted above); the activations hold 32 per block.
            {
                let blk = data.as_ptr().add(b * block);
                let da = *a.scales.get_unchecked(b);
                let sa = *a.sums.get_unchecked(b);
                for h in 0..2 {
                    let vec = |c: usize| _mm256_loadu_si256(blk.add(qs_at + 64 * c + 32 * h) as *const __m256i);
                    let act = |c: usize| {
                        _mm256_set1_epi32(std::ptr::read_unaligned(a.qs.as_ptr().add(32 * b + 4 * c) as *const i32))
                    };
                    let mut s = _mm256_setzero_si256();
                    let offset = match ty {
                        GgmlType::Q8_0 => {
                            for c in 0..8 {
                                let w = vec(c);
                                s = if VNNI {
                                    dot4::<true>(s, w, act(c))
                                } else {
                                    // |w| times a with w's sign: both small enough for maddubs.
                                    let w = _mm256_xor_si256(w, flip);
                                    dot4::<false>(s, _mm256_abs_epi8(w), _mm256_sign_epi8(act(c), w))
                                };
                            }
                            if VNNI { 128.0 } else { 0.0 }
                        }
                        _ => {
                            for c in 0..4 {
                                let v = vec(c);
                                s = dot4::<VNNI>(s, _mm256_and_si256(v, nib), act(c));
                                s = dot4::<VNNI>(s, _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib), act(c + 4));
                            }
                            if ty == GgmlType::Q4_0 { 8.0 } else { 0.0 }
                        }
                    };
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * h) as *const __m128i));
                    let v = _mm256_fmsub_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(da), _mm256_set1_ps(offset * sa));
                    acc[h] = _mm256_fmadd_ps(v, dw, acc[h]);
                    if let Some(at) = m_at {
                        let mw = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(at + 16 * h) as *const __m128i));
                        acc[h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(sa), acc[h]);
                    }
                }
            }
        }
        let mut res = [0f32; LEGACY_GROUP];
        // Two vectors of eight into sixteen floats.
        {
            _mm256_storeu_ps(res.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(res.as_mut_ptr().add(8), acc[1]);
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Kernels;
    use crate::formats::quantize;
    use crate::pool::Pool;
    use crate::tier::KernelTier;

    /// Both forms of the 8-bit products (AVX-VNNI and `vpmaddubsw`) against the reference.
    #[test]
    fn both_product_forms_match_the_reference() {
        if !KernelTier::Avx2.is_available() {
            return;
        }
        let (rows, cols) = (19, 96);
        let pool = Pool::new(1);
        let x: Vec<f32> = (0..cols).map(|i| ((i * 7919 % 211) as f32 - 105.0) / 13.0).collect();
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let rb = ty.bytes_for(cols as u64).unwrap() as usize;
            let mut data = vec![0u8; rows * rb];
            for r in 0..rows {
                let w: Vec<f32> = (0..cols).map(|i| (((r * 31 + i * 17) % 97) as f32 - 48.0) / 7.0).collect();
                quantize(ty, &w, &mut data[r * rb..(r + 1) * rb]).unwrap();
            }
            let w = MatRef::new(ty, rows, cols, &data).unwrap();
            let (k, scalar) = (Kernels::new(KernelTier::Avx2).unwrap(), Kernels::new(KernelTier::Scalar).unwrap());
            let packed = k.pack(&pool, &w).unwrap();
            let mut acts = crate::Acts::new();
            k.quantize_acts(&pool, ty, &x, cols, &mut acts).unwrap();
            let mut want = vec![0f32; rows];
            scalar.matmul(&pool, &w, &acts, &mut want).unwrap();
            for g in 0..packed.groups() {
                let a = planar_row(&acts, 0);
                // SAFETY: AVX2 is present (checked above); AVX-VNNI only if reported.
                let forms = unsafe {
                    let mut f = vec![legacy_group::<false>(ty, packed.group(g), cols / 32, a)];
                    if has_vnni() {
                        f.push(legacy_group::<true>(ty, packed.group(g), cols / 32, a));
                    }
                    f
                };
                for res in forms {
                    for n in 0..LEGACY_GROUP.min(rows - 16 * g) {
                        let e = want[16 * g + n];
                        assert!(
                            (res[n] - e).abs() <= 1e-4 * e.abs().max(1.0),
                            "{ty} row {}: {} vs {e}",
                            16 * g + n,
                            res[n]
                        );
                    }
                }
            }
        }
    }
}
