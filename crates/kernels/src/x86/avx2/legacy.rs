//! AVX2 product of the packed Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 layout ([`crate::pack::pack_legacy`]): 16 rows
//! per group, rows 0-7 and 8-15 in the eight lanes of the two 32-byte halves of each packed
//! vector. A block's weights are unpacked once for a tile of up to four tokens, which is what
//! makes several tokens cheaper than that many single ones. Without AVX-VNNI, Q4_0, Q4_1 and
//! Q8_0 take both halves at once ([`body_nibbles`], [`body_bytes`]); the others a half at a
//! time ([`body`]).
//!
//! Every token's result is the same bits whatever tile it is in: the integer sums are exact,
//! and the float steps per row (scale, offset, accumulate over blocks in order) do not depend
//! on the tile. 8-bit products use AVX-VNNI where the CPU has it, else `vpmaddubsw`; for the
//! 4-bit types its 16-bit pair sums of a whole block stay below 8 · 2 · 15 · 127 = 30480, so
//! they are added as 16-bit values and widened once per block (the 5-bit types' twice per
//! block: 4 · 2 · 31 · 127 = 31496). Q5's fifth bits come from the packed mask plane, spread to
//! one byte each by a shuffle and a compare.

use std::arch::x86_64::*;
use std::ops::Range;

use onebit_gguf::GgmlType;

use crate::act::Acts;
use crate::matmul::OutPtr;
use crate::pack::{LEGACY_GROUP, PackedMat, legacy_high_bits, legacy_layout};
use crate::x86::{PlanarRow, planar_rows};

/// Tokens whose products share one unpacking of the weights.
const TILE: usize = 4;

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;
const Q5_0: u8 = 3;
const Q5_1: u8 = 4;
const KIND_TYPES: [GgmlType; 5] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q5_1];

/// Results of one group for a tile of tokens: `[token][row]`.
type TileOut = [[f32; LEGACY_GROUP]; TILE];

fn has_vnni() -> bool {
    is_x86_feature_detected!("avxvnni")
}

pub(super) fn packed(p: &PackedMat, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    packed_with(has_vnni(), p, rows, acts, &out)
}

/// [`packed`] with AVX-VNNI's products or without (`vnni` only where the CPU has it).
fn packed_with(vnni: bool, p: &PackedMat, rows: Range<usize>, acts: &Acts, out: &OutPtr) {
    let planar = planar_rows(acts);
    macro_rules! groups {
        ($f:ident) => {
            match p.ty {
                GgmlType::Q4_0 => $f::<Q4_0>(p, rows, &planar, out),
                GgmlType::Q4_1 => $f::<Q4_1>(p, rows, &planar, out),
                GgmlType::Q8_0 => $f::<Q8_0>(p, rows, &planar, out),
                GgmlType::Q5_0 => $f::<Q5_0>(p, rows, &planar, out),
                GgmlType::Q5_1 => $f::<Q5_1>(p, rows, &planar, out),
                _ => unreachable!("only Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 are packed this way"),
            }
        };
    }
    // SAFETY: the AVX2 table is handed out only on AVX2 CPUs (with FMA and F16C); `vnni` only
    // when the CPU has AVX-VNNI (`packed`, and the test that asks for both forms).
    unsafe { if vnni { groups!(groups_vnni) } else { groups!(groups_plain) } }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn groups_vnni<const KIND: u8>(p: &PackedMat, rows: Range<usize>, a: &[PlanarRow], out: &OutPtr) {
    // SAFETY: the features are enabled; the caller upholds the rest.
    unsafe { groups::<true, KIND>(p, rows, a, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn groups_plain<const KIND: u8>(p: &PackedMat, rows: Range<usize>, a: &[PlanarRow], out: &OutPtr) {
    // SAFETY: the features are enabled; the caller upholds the rest.
    unsafe { groups::<false, KIND>(p, rows, a, out) }
}

/// The groups of rows `rows` against every token of `planar`, a tile of up to [`TILE`] tokens
/// at a time, compiled with the caller's features: the bodies inline here, and their results
/// go from registers to the output (called once a group and tile, each returned its 256 bytes
/// through memory, 4 % of an 8-sequence SmolLM2 decode step on Zen 2).
///
/// # Safety
/// AVX2, FMA and F16C, and AVX-VNNI when `VNNI`. The call owns rows `rows` of the output.
#[inline(always)]
unsafe fn groups<const VNNI: bool, const KIND: u8>(
    p: &PackedMat,
    rows: Range<usize>,
    planar: &[PlanarRow],
    out: &OutPtr,
) {
    let (nb, n) = (p.cols / 32, planar.len());
    for g in rows.start / LEGACY_GROUP..rows.end.div_ceil(LEGACY_GROUP) {
        let data = p.group(g);
        for t0 in (0..n).step_by(TILE) {
            let tile = (n - t0).min(TILE);
            let a: [PlanarRow; TILE] = std::array::from_fn(|i| planar[t0 + i.min(tile - 1)]);
            // SAFETY: the caller's contract (the features).
            let res = unsafe {
                match tile {
                    1 => tile_body::<VNNI, KIND, 1>(data, nb, &a),
                    2 => tile_body::<VNNI, KIND, 2>(data, nb, &a),
                    3 => tile_body::<VNNI, KIND, 3>(data, nb, &a),
                    _ => tile_body::<VNNI, KIND, 4>(data, nb, &a),
                }
            };
            for (i, res) in res.iter().take(tile).enumerate() {
                // SAFETY: this call owns rows `rows` of the output, and the group's rows start
                // at or after `rows.start` (whole groups are handed out).
                unsafe { super::matmul::store_group(out, t0 + i, g * LEGACY_GROUP, res, rows.end) };
            }
        }
    }
}

/// One group against tokens `a[..T]`: [`body_nibbles`] and [`body_bytes`] for the types they
/// take without AVX-VNNI, else [`body`].
///
/// # Safety
/// AVX2, FMA and F16C, and AVX-VNNI when `VNNI`.
#[inline(always)]
unsafe fn tile_body<const VNNI: bool, const KIND: u8, const T: usize>(
    data: &[u8],
    nb: usize,
    a: &[PlanarRow; TILE],
) -> TileOut {
    // SAFETY: the caller's contract.
    unsafe {
        if !VNNI && (KIND == Q4_0 || KIND == Q4_1) {
            body_nibbles::<KIND, T>(data, nb, a)
        } else if !VNNI && KIND == Q8_0 {
            body_bytes::<T>(data, nb, a)
        } else {
            body::<VNNI, KIND, T>(data, nb, a)
        }
    }
}

/// Σ u·s over each lane's four byte pairs, added to `acc` (u < 128 or s > -128 when !VNNI).
#[inline(always)]
unsafe fn dot4<const VNNI: bool>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    // SAFETY: the caller's contract: AVX2 (and AVX-VNNI for VNNI) are enabled.
    unsafe {
        if VNNI {
            _mm256_dpbusd_avx_epi32(acc, u, s)
        } else {
            _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
        }
    }
}

/// Half `h` (rows 8h..8h+8) of block `blk`, unpacked: Q4 nibbles (low ones pair with
/// activations 4c.., high ones with 16 + 4c..), with Q5's fifth bits (from the masks at
/// `qh_at`) added as 16, or Q8_0's bytes as stored (VNNI: offset by 128) or signed (without
/// VNNI).
#[inline(always)]
unsafe fn unpack<const VNNI: bool, const KIND: u8>(
    blk: *const u8,
    qs_at: usize,
    qh_at: Option<usize>,
    h: usize,
) -> [__m256i; 8] {
    // SAFETY: the caller's contract: the block holds 8 vectors of 64 bytes at `qs_at`.
    unsafe {
        let vec = |c: usize| _mm256_loadu_si256(blk.add(qs_at + 64 * c + 32 * h) as *const __m256i);
        if KIND == Q8_0 {
            let flip = _mm256_set1_epi8(-128);
            std::array::from_fn(|c| if VNNI { vec(c) } else { _mm256_xor_si256(vec(c), flip) })
        } else {
            let nib = _mm256_set1_epi8(0x0f);
            let mut w = [_mm256_setzero_si256(); 8];
            for c in 0..4 {
                let v = vec(c);
                w[c] = _mm256_and_si256(v, nib);
                w[c + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
            }
            if let Some(at) = qh_at {
                // Byte 4n + k of the half's vector c is weight 4c + k of row 8h + n: bit
                // 32h + 4n + k of mask c.
                let spread = _mm256_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                );
                let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                let sixteen = _mm256_set1_epi8(0x10);
                for (c, wc) in w.iter_mut().enumerate() {
                    let bits = std::ptr::read_unaligned(blk.add(at + 8 * c + 4 * h) as *const i32);
                    let set = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(bits), spread), bit);
                    let high = _mm256_and_si256(_mm256_cmpeq_epi8(set, bit), sixteen);
                    *wc = _mm256_or_si256(*wc, high);
                }
            }
            w
        }
    }
}

/// The integer dot products of one unpacked half-block with one token's 32 activations.
#[inline(always)]
unsafe fn block_sum<const VNNI: bool, const KIND: u8>(w: &[__m256i; 8], qs: *const i8) -> __m256i {
    // SAFETY: the caller's contract: `qs` points at 32 activations.
    unsafe {
        // Plain loops, not `fold` with closures: in the test profile (debug assertions on) the
        // compiler kept `fold` out of line, so that no intrinsic inside its closure was inlined
        // either, and the perplexity tests ran 20 times slower than a release build on AVX2.
        let act = |c: usize| _mm256_set1_epi32(std::ptr::read_unaligned(qs.add(4 * c) as *const i32));
        let mut s = _mm256_setzero_si256();
        if VNNI {
            for c in 0..8 {
                s = dot4::<true>(s, w[c], act(c));
            }
            s
        } else if KIND == Q8_0 {
            // |w| times a with w's sign: both small enough for maddubs.
            for c in 0..8 {
                s = dot4::<false>(s, _mm256_abs_epi8(w[c]), _mm256_sign_epi8(act(c), w[c]));
            }
            s
        } else if KIND == Q5_0 || KIND == Q5_1 {
            // Two 16-bit sums of four products each (see the module's note on their range).
            let mut s16 = [_mm256_setzero_si256(); 2];
            for c in 0..8 {
                s16[c / 4] = _mm256_add_epi16(s16[c / 4], _mm256_maddubs_epi16(w[c], act(c)));
            }
            let ones = _mm256_set1_epi16(1);
            _mm256_add_epi32(_mm256_madd_epi16(s16[0], ones), _mm256_madd_epi16(s16[1], ones))
        } else {
            for c in 0..8 {
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[c], act(c)));
            }
            _mm256_madd_epi16(s, _mm256_set1_epi16(1))
        }
    }
}

/// One group against tokens `a[..T]`, a half (8 rows) at a time so that the unpacked weights
/// and every token's accumulator stay in registers.
#[inline(always)]
unsafe fn body<const VNNI: bool, const KIND: u8, const T: usize>(
    data: &[u8],
    nb: usize,
    a: &[PlanarRow; TILE],
) -> TileOut {
    let ty = KIND_TYPES[KIND as usize];
    let block = LEGACY_GROUP * ty.type_size() as usize;
    assert!(data.len() >= nb * block);
    assert!(a[..T].iter().all(|a| a.qs.len() >= 32 * nb && a.scales.len() >= nb && a.sums.len() >= nb));
    let (m_at, qs_at) = legacy_layout(ty);
    let qh_at = legacy_high_bits(ty);
    // What the products of offset weights add: VNNI's Q8_0 weights are stored + 128, Q4_0's
    // nibbles are the weights + 8, Q5_0's codes the weights + 16.
    let offset = match KIND {
        Q8_0 if VNNI => 128.0,
        Q4_0 => 8.0,
        Q5_0 => 16.0,
        _ => 0.0,
    };
    let mut res = [[0f32; LEGACY_GROUP]; TILE];
    // The rows' scales and offsets of the current block, widened once and read back by every
    // token's steps as memory operands: in registers beside the eight unpacked vectors and
    // four accumulators they made the compiler spill the tokens' partial results.
    // SAFETY: a register operation, with AVX (the contract).
    let mut wide = [unsafe { _mm256_setzero_ps() }; 2];
    // SAFETY: the caller's contract: AVX2, FMA, F16C (and AVX-VNNI for VNNI) are enabled. Block `b` lies
    // inside `data`, and each token holds 32 activations, a scale and a sum per block
    // (asserted above).
    unsafe {
        for h in 0..2 {
            let mut acc = [_mm256_setzero_ps(); T];
            for b in 0..nb {
                let blk = data.as_ptr().add(b * block);
                let w = unpack::<VNNI, KIND>(blk, qs_at, qh_at, h);
                let wide_at = wide.as_mut_ptr();
                wide_at.write_volatile(_mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * h) as *const __m128i)));
                if let Some(at) = m_at {
                    wide_at
                        .add(1)
                        .write_volatile(_mm256_cvtph_ps(_mm_loadu_si128(blk.add(at + 16 * h) as *const __m128i)));
                }
                for t in 0..T {
                    let a = &a[t];
                    let s = block_sum::<VNNI, KIND>(&w, a.qs.as_ptr().add(32 * b));
                    let (da, sa) = (*a.scales.get_unchecked(b), *a.sums.get_unchecked(b));
                    // x·da − 0 is x·da to the bit, so the offset-free kinds skip the subtraction.
                    let v = if offset == 0.0 {
                        _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(da))
                    } else {
                        _mm256_fmsub_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(da), _mm256_set1_ps(offset * sa))
                    };
                    acc[t] = _mm256_fmadd_ps(v, *wide_at, acc[t]);
                    if KIND == Q4_1 || KIND == Q5_1 {
                        acc[t] = _mm256_fmadd_ps(*wide_at.add(1), _mm256_set1_ps(sa), acc[t]);
                    }
                }
            }
            for (res, acc) in res.iter_mut().zip(acc) {
                _mm256_storeu_ps(res.as_mut_ptr().add(8 * h), acc);
            }
        }
    }
    res
}

/// The four activations `at..at + 4` of token `a`, in every 32-bit lane.
///
/// # Safety
/// `at + 4 <= a.qs.len()`; AVX.
#[inline(always)]
unsafe fn act4(a: &PlanarRow, at: usize) -> __m256i {
    // SAFETY: the contract.
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(a.qs.as_ptr().add(at) as *const i32)) }
}

/// The 16 rows' f16 values at `p` (a block's scales or offsets), as the two halves' eight f32.
///
/// # Safety
/// 32 bytes at `p`; AVX and F16C.
#[inline(always)]
unsafe fn halves_f16(p: *const u8) -> [__m256; 2] {
    let p = p as *const __m128i;
    // SAFETY: the contract.
    unsafe { [_mm256_cvtph_ps(_mm_loadu_si128(p)), _mm256_cvtph_ps(_mm_loadu_si128(p.add(1)))] }
}

/// The tokens' accumulators of both halves as a group's results.
///
/// # Safety
/// AVX.
#[inline(always)]
unsafe fn tile_results<const T: usize>(acc: [[__m256; 2]; T]) -> TileOut {
    let mut res = [[0f32; LEGACY_GROUP]; TILE];
    for (res, acc) in res.iter_mut().zip(acc) {
        // SAFETY: 16 floats in `res` take the two halves' eight; AVX (the contract).
        unsafe {
            _mm256_storeu_ps(res.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(res.as_mut_ptr().add(8), acc[1]);
        }
    }
    res
}

/// Q4_0 and Q4_1 without AVX-VNNI: one group against tokens `a[..T]`, both halves at once, a
/// packed vector at a time. Each token's four activations are broadcast once for the 16 rows,
/// and the 2·T sums stay in registers beside the two halves' nibbles and the broadcast; the
/// scales follow once a block. [`body`] unpacked a half for a tile and broadcast every token's
/// activations once a half, and its registers spilled: on Zen 2 (one thread, `gemm_speed q4_1
/// 8 1 1536 576 avx2`, SmolLM2's gate and up shape) 54 → 59 G multiply-adds a second, one token
/// from memory (8192 × 4096, two threads) as fast or faster. The float steps per row and block
/// are [`body`]'s, in its order, so the results are the same bits.
///
/// `vpmaddubsw` runs on one pipe of Zen 2, which it shares with `vmulps` and `vpmaddwd`: the
/// products alone would allow about 28 multiply-adds a cycle, the scales' steps a block bring
/// the bound near 20 (a loop of the same instructions); this ran at 17.6, at 20.2 (68 G a
/// second) once inlined into [`groups`], and at 19.4 (65 G) written without closures.
#[inline(always)]
unsafe fn body_nibbles<const KIND: u8, const T: usize>(data: &[u8], nb: usize, a: &[PlanarRow; TILE]) -> TileOut {
    let ty = KIND_TYPES[KIND as usize];
    let block = LEGACY_GROUP * ty.type_size() as usize;
    assert!(data.len() >= nb * block);
    assert!(a[..T].iter().all(|a| a.qs.len() >= 32 * nb && a.scales.len() >= nb && a.sums.len() >= nb));
    let (m_at, qs_at) = legacy_layout(ty);
    let offset = if KIND == Q4_0 { 8.0 } else { 0.0 };
    // SAFETY: the caller's contract: AVX2, FMA and F16C are enabled. Block `b` lies inside
    // `data`, and each token holds 32 activations, a scale and a sum per block (asserted above).
    unsafe {
        let (nib, ones) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi16(1));
        let mut acc = [[_mm256_setzero_ps(); 2]; T];
        for b in 0..nb {
            let blk = data.as_ptr().add(b * block);
            // s[t][h]: 16-bit pair sums of token t with rows 8h..8h+8 (below 2¹⁵, as in `body`).
            let mut s = [[_mm256_setzero_si256(); 2]; T];
            for c in 0..8 {
                // Vector c % 4 of each half: its low nibbles pair with activations 4c.. for c < 4,
                // its high ones with 4c.. = 16 + 4(c − 4).. after.
                // No closures here or below: in the test profile (debug assertions on) their
                // intrinsics stayed out of line, and this kernel ran 15 to 25 times slower there
                // (the perplexity tests on the demo model 210 → 940 s in CI).
                let at = blk.add(qs_at + 64 * (c % 4));
                let v = [_mm256_loadu_si256(at as *const __m256i), _mm256_loadu_si256(at.add(32) as *const __m256i)];
                let w = if c < 4 {
                    [_mm256_and_si256(v[0], nib), _mm256_and_si256(v[1], nib)]
                } else {
                    [
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v[0]), nib),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v[1]), nib),
                    ]
                };
                for (t, s) in s.iter_mut().enumerate() {
                    let act = act4(&a[t], 32 * b + 4 * c);
                    for h in 0..2 {
                        s[h] = _mm256_add_epi16(s[h], _mm256_maddubs_epi16(w[h], act));
                    }
                }
            }
            let d = halves_f16(blk);
            let m = match m_at {
                Some(at) => halves_f16(blk.add(at)),
                None => [_mm256_setzero_ps(); 2],
            };
            for t in 0..T {
                let (da, sa) = (*a[t].scales.get_unchecked(b), *a[t].sums.get_unchecked(b));
                for h in 0..2 {
                    let x = _mm256_cvtepi32_ps(_mm256_madd_epi16(s[t][h], ones));
                    // As in `body`: x·da − 0 is x·da to the bit, so Q4_1 skips the subtraction.
                    let v = if offset == 0.0 {
                        _mm256_mul_ps(x, _mm256_set1_ps(da))
                    } else {
                        _mm256_fmsub_ps(x, _mm256_set1_ps(da), _mm256_set1_ps(offset * sa))
                    };
                    acc[t][h] = _mm256_fmadd_ps(v, d[h], acc[t][h]);
                    if KIND == Q4_1 {
                        acc[t][h] = _mm256_fmadd_ps(m[h], _mm256_set1_ps(sa), acc[t][h]);
                    }
                }
            }
        }
        tile_results(acc)
    }
}

/// Q8_0 without AVX-VNNI: as [`body_nibbles`], both halves at once; the weights' magnitudes
/// made once a vector for every token (in [`body`] once a token), their signs given to each
/// token's activations. Zen 2, one thread, `gemm_speed q8_0 T 1 1536 576 avx2`, with the planar
/// rows made once too ([`planar_rows`]): 8 tokens 39 → 43 G multiply-adds a second, one token
/// 28 → 35. A `vpmaddubsw` and a `vpmaddwd` per 32 products, on the one pipe that runs them,
/// bound it at 16 a cycle (54 G a second at 3.35 GHz).
/// The same integer sums and float steps as [`body`], so the same bits.
#[inline(always)]
unsafe fn body_bytes<const T: usize>(data: &[u8], nb: usize, a: &[PlanarRow; TILE]) -> TileOut {
    let block = LEGACY_GROUP * GgmlType::Q8_0.type_size() as usize;
    assert!(data.len() >= nb * block);
    assert!(a[..T].iter().all(|a| a.qs.len() >= 32 * nb && a.scales.len() >= nb));
    let (_, qs_at) = legacy_layout(GgmlType::Q8_0);
    // SAFETY: the caller's contract: AVX2, FMA and F16C are enabled. Block `b` lies inside
    // `data`, and each token holds 32 activations and a scale per block (asserted above).
    unsafe {
        let (ones, flip) = (_mm256_set1_epi16(1), _mm256_set1_epi8(-128));
        let mut acc = [[_mm256_setzero_ps(); 2]; T];
        for b in 0..nb {
            let blk = data.as_ptr().add(b * block);
            let mut s = [[_mm256_setzero_si256(); 2]; T];
            for c in 0..8 {
                // Stored offset by 128 (for AVX-VNNI's unsigned operand): flipped back to signed.
                let (mut w, mut mag) = ([_mm256_setzero_si256(); 2], [_mm256_setzero_si256(); 2]);
                for h in 0..2 {
                    w[h] =
                        _mm256_xor_si256(_mm256_loadu_si256(blk.add(qs_at + 64 * c + 32 * h) as *const __m256i), flip);
                    mag[h] = _mm256_abs_epi8(w[h]);
                }
                for (t, s) in s.iter_mut().enumerate() {
                    let act = act4(&a[t], 32 * b + 4 * c);
                    for h in 0..2 {
                        let pairs = _mm256_maddubs_epi16(mag[h], _mm256_sign_epi8(act, w[h]));
                        s[h] = _mm256_add_epi32(s[h], _mm256_madd_epi16(pairs, ones));
                    }
                }
            }
            let d = halves_f16(blk);
            for t in 0..T {
                let da = _mm256_set1_ps(*a[t].scales.get_unchecked(b));
                for h in 0..2 {
                    let v = _mm256_mul_ps(_mm256_cvtepi32_ps(s[t][h]), da);
                    acc[t][h] = _mm256_fmadd_ps(v, d[h], acc[t][h]);
                }
            }
        }
        tile_results(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::quantize;
    use crate::matmul::MatRef;
    use crate::pool::Pool;
    use crate::tier::KernelTier;
    use crate::{Acts, Kernels};

    /// Both forms of the 8-bit products (AVX-VNNI and `vpmaddubsw`), for every count of tokens
    /// up to two tiles, against the reference; and every token the same bits whatever tiles
    /// it is in.
    #[test]
    fn both_product_forms_and_every_tile_match_the_reference() {
        if !KernelTier::Avx2.is_available() {
            return;
        }
        let (rows, cols, tokens) = (19, 96, 2 * TILE - 1);
        let pool = Pool::new(1);
        let x: Vec<f32> = (0..cols * tokens).map(|i| ((i * 7919 % 211) as f32 - 105.0) / 13.0).collect();
        for ty in KIND_TYPES {
            let rb = ty.bytes_for(cols as u64).unwrap() as usize;
            let mut data = vec![0u8; rows * rb];
            for r in 0..rows {
                let w: Vec<f32> = (0..cols).map(|i| (((r * 31 + i * 17) % 97) as f32 - 48.0) / 7.0).collect();
                quantize(ty, &w, &mut data[r * rb..(r + 1) * rb]).unwrap();
            }
            let w = MatRef::new(ty, rows, cols, &data).unwrap();
            let (k, scalar) = (Kernels::new(KernelTier::Avx2).unwrap(), Kernels::new(KernelTier::Scalar).unwrap());
            let packed = k.pack(&pool, &w).unwrap();
            // The products of the first n tokens alone, token-major.
            let product = |vnni: bool, n: usize| {
                let mut acts = Acts::new();
                k.quantize_acts(&pool, ty, &x[..n * cols], cols, &mut acts).unwrap();
                let mut out = vec![0f32; rows * n];
                packed_with(vnni, &packed, 0..rows, &acts, &OutPtr::new(&mut out, rows));
                out
            };
            let mut acts = Acts::new();
            k.quantize_acts(&pool, ty, &x, cols, &mut acts).unwrap();
            let mut want = vec![0f32; rows * tokens];
            scalar.matmul(&pool, &w, &acts, &mut want).unwrap();
            let forms: &[bool] = if has_vnni() { &[false, true] } else { &[false] };
            for &vnni in forms {
                let full = product(vnni, tokens);
                for (i, (&got, &e)) in full.iter().zip(&want).enumerate() {
                    assert!(
                        (got - e).abs() <= 1e-4 * e.abs().max(1.0),
                        "{ty} token {} row {}: {got} vs {e}",
                        i / rows,
                        i % rows
                    );
                }
                for n in 1..tokens {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&product(vnni, n)), bits(&full[..n * rows]), "{ty}, {n} tokens");
                }
            }
        }
    }
}
