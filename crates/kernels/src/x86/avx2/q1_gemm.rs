//! Packed Q1_0 × Q8_0x4 activations for many tokens at once on AVX2 (AMD Zen 3 and every
//! other CPU without AVX-512): the products of long prompts.
//!
//! The lookup kernel (`matmul::lut_group`) reads 8 bytes of tables per activation, and a call
//! takes one 64-row group for all its tokens, so once the tables of all the tokens outgrow the
//! last-level cache every group reads them again from memory. Here a group's 1-bit weights are
//! expanded, once per range of blocks, into bytes in {0, 1} in a per-thread buffer: eight rows
//! in the eight 32-bit lanes of a vector, four consecutive weights per lane. Every token then
//! takes one `vpmaddubsw` per 32 weights (its four activation bytes broadcast to every lane),
//! whose pair sums are added in 16 bits over the 128 values of a block (at most 64 · 127 in a
//! half: activations are quantized to −127..=127) and joined and doubled by one `vpmaddwd`.
//! Less the block's Σa, that is `2·Σ a·b − Σ a = Σ a·(2b − 1)`: the lookup kernel's exact
//! integer. The float recipe after it is the lookup kernel's too (`p = C·d_a`,
//! `acc = fma(p, d_w, acc)`), so a token gets the same bits by either path, whatever else is in
//! its batch. The activations are a byte per value, read again for every group of rows.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::act::{ActFormat, Acts};
use crate::matmul::OutPtr;
use crate::pack::{GROUP, PackedMat, Q1_GROUP_BLOCK};
use crate::x86::{PlanarRow, planar_row};

use super::matmul::scale_run;

/// Bytes of lookup tables (8 per activation) past which products take this kernel. The lookup
/// kernel is faster (measured on Zen 4's AVX2 tier, one thread: 150–165 G multiply-adds a second
/// against 115–135 here, as its float work comes once per 128 values for 32 rows) while every
/// token's tables stay in the last-level cache; but a call takes one 64-row group for all the
/// tokens, so past that each group reads them all again from memory: 2048 × 6144 at 512 tokens
/// (25 MB of tables) ran at 69 G, 4096 × 4096 at 512 (16 MB) at 75–117, and at 8 MB and below
/// at 150 or more.
const LUT_CACHED_BYTES: usize = 8 << 20;

/// Whether this kernel serves a product with `acts`.
pub(super) fn serves(acts: &Acts) -> bool {
    acts.format() == ActFormat::Q8_0x4 && acts.rows() * acts.cols() * 8 > LUT_CACHED_BYTES
}

/// Blocks of a group expanded at a time (8 KiB each; 128 KiB stay in L2 beside the activations
/// of a tile).
const RANGE_BLOCKS: usize = 16;

/// Tokens per tile: with two vectors of rows, eight 16-bit sums, two weight vectors and a
/// broadcast fill most of the sixteen registers.
const TILE: usize = 6;

/// Expanded vectors per block: eight vectors of rows × 32 runs of four weights.
const BLOCK_VECS: usize = 8 * 32;

thread_local! {
    /// Per thread: the expanded weights of up to [`RANGE_BLOCKS`] blocks of a group, and the
    /// float sums (per token, eight vectors of eight rows) while a group's blocks go by in
    /// ranges.
    static SHARED: std::cell::RefCell<(Vec<__m256i>, Vec<__m256>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Rows `rows` of the packed matrix for every token of `acts` (Q8_0x4); `rows` starts at a
/// group.
pub(super) fn rows(p: &PackedMat, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    debug_assert_eq!(acts.format(), ActFormat::Q8_0x4);
    SHARED.with_borrow_mut(|(buf, sums)| {
        // SAFETY: the table holding this kernel exists only on CPUs with AVX2, FMA and F16C;
        // this call owns rows `rows` of the output.
        unsafe { product(p, rows, acts, out, buf, sums) }
    })
}

/// Where one call's tiles read and write.
struct Job<'a> {
    acts: &'a Acts,
    data: &'a [u8],
    nb: usize,
    /// The first block of the expanded range.
    b0: usize,
    /// The group, the rows' end, and the vectors of eight rows that hold any of them.
    g: usize,
    end: usize,
    live: usize,
    out: OutPtr<'a>,
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn product(
    p: &PackedMat,
    rows: Range<usize>,
    acts: &Acts,
    out: OutPtr,
    buf: &mut Vec<__m256i>,
    sums: &mut Vec<__m256>,
) {
    let (n, nb) = (acts.rows(), p.cols / 128);
    buf.resize(RANGE_BLOCKS * BLOCK_VECS, _mm256_setzero_si256());
    sums.resize(n * GROUP / 8, _mm256_setzero_ps());
    for g in rows.start / GROUP..rows.end.div_ceil(GROUP) {
        let data = p.group(g);
        assert!(data.len() >= nb * Q1_GROUP_BLOCK);
        let live = (rows.end - g * GROUP).min(GROUP).div_ceil(8);
        for b0 in (0..nb).step_by(RANGE_BLOCKS) {
            let b1 = nb.min(b0 + RANGE_BLOCKS);
            // SAFETY: blocks b0 .. b1 < nb lie inside the group (asserted); the features are
            // this function's.
            unsafe { expand(data, b0..b1, buf) };
            let job = Job { acts, data, nb, b0, g, end: rows.end, live, out };
            let mut t0 = 0;
            while t0 < n {
                // SAFETY: tokens t0 .. t0 + T ≤ n exist; the buffer holds blocks b0 .. b1.
                t0 += unsafe {
                    match n - t0 {
                        TILE.. => tile::<TILE>(&job, b1, buf, sums, t0),
                        5 => tile::<5>(&job, b1, buf, sums, t0),
                        4 => tile::<4>(&job, b1, buf, sums, t0),
                        3 => tile::<3>(&job, b1, buf, sums, t0),
                        2 => tile::<2>(&job, b1, buf, sums, t0),
                        _ => tile::<1>(&job, b1, buf, sums, t0),
                    }
                };
            }
        }
    }
}

/// Byte `p` of a vector takes byte `4·(p / 16) + (p % 16) / 4` of its 128-bit lane: after a
/// broadcast of eight rows' bytes, lane `i` (four bytes) repeats row `i`'s byte.
const SPREAD: [u8; 32] = {
    let mut s = [0u8; 32];
    let mut p = 0;
    while p < 32 {
        s[p] = (4 * (p / 16) + (p % 16) / 4) as u8;
        p += 1;
    }
    s
};

/// Byte `4i + m` tests bit `m` (weights 8v .. 8v + 4) or bit `4 + m` (8v + 4 .. 8v + 8).
const BITS: [[u8; 32]; 2] = {
    let mut b = [[0u8; 32]; 2];
    let mut p = 0;
    while p < 32 {
        b[0][p] = 1 << (p % 4);
        b[1][p] = 1 << (4 + p % 4);
        p += 1;
    }
    b
};

/// Expand blocks `blocks` of a packed group into `buf`: for block `b`, vector of rows `r`
/// (rows 8r .. 8r + 8) and run `m` (weights 4m .. 4m + 4), vector `((b − b0)·8 + r)·32 + m`.
/// The packed block's vector `v` holds byte `v` of every row's bits (weights 8v .. 8v + 8), row
/// `r` at byte `r`.
///
/// # Safety
/// Blocks `blocks` lie inside `data`; AVX2.
#[target_feature(enable = "avx2")]
unsafe fn expand(data: &[u8], blocks: Range<usize>, buf: &mut [__m256i]) {
    // SAFETY: the constants are 32 bytes each.
    let (spread, bits) = unsafe {
        (
            _mm256_loadu_si256(SPREAD.as_ptr() as *const __m256i),
            BITS.map(|b| _mm256_loadu_si256(b.as_ptr() as *const __m256i)),
        )
    };
    let ones = _mm256_set1_epi8(1);
    let b0 = blocks.start;
    for b in blocks {
        for r in 0..8 {
            let at = ((b - b0) * 8 + r) * 32;
            let dst = &mut buf[at..at + 32];
            for v in 0..16 {
                // SAFETY: block `b` lies inside `data` (the contract); its vector `v` is 64
                // bytes at 2·GROUP + 64v, and rows 8r .. 8r + 8 are 8 of them.
                let x = unsafe {
                    let src = data.as_ptr().add(b * Q1_GROUP_BLOCK + 2 * GROUP + 64 * v + 8 * r);
                    _mm256_set1_epi64x((src as *const i64).read_unaligned())
                };
                let x = _mm256_shuffle_epi8(x, spread);
                for (h, bit) in bits.iter().enumerate() {
                    dst[2 * v + h] = _mm256_min_epu8(_mm256_and_si256(x, *bit), ones);
                }
            }
        }
    }
}

/// Tokens `t0 .. t0 + T` over the expanded blocks `job.b0 .. b1` of group `job.g`, every pair
/// of row vectors that holds live rows; the sums go to `sums` between ranges and to the
/// output after the last. Returns `T`.
///
/// # Safety
/// Tokens `t0 .. t0 + T` exist and lie in the chunk; `buf` holds the expanded blocks; AVX2,
/// FMA, F16C; the call owns rows up to `job.end` of the output.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const T: usize>(job: &Job, b1: usize, buf: &[__m256i], sums: &mut [__m256], t0: usize) -> usize {
    let a: [PlanarRow; T] = std::array::from_fn(|i| planar_row(job.acts, t0 + i));
    for rp in (0..job.live).step_by(2) {
        let at = |i: usize, r: usize| (t0 + i) * 8 + rp + r;
        let mut accf: [[__m256; 2]; T] = if job.b0 == 0 {
            [[_mm256_setzero_ps(); 2]; T]
        } else {
            std::array::from_fn(|i| [sums[at(i, 0)], sums[at(i, 1)]])
        };
        // SAFETY: the contract; rp + 1 < 8.
        unsafe { span::<T>(buf, job.data, job.b0..b1, rp, &a, &mut accf) };
        if b1 < job.nb {
            for (i, acc) in accf.iter().enumerate() {
                sums[at(i, 0)] = acc[0];
                sums[at(i, 1)] = acc[1];
            }
            continue;
        }
        for (i, acc) in accf.iter().enumerate() {
            for (r, v) in acc.iter().enumerate() {
                let row = job.g * GROUP + 8 * (rp + r);
                // SAFETY: the call owns rows below `end` for these tokens.
                unsafe {
                    if row + 8 <= job.end {
                        _mm256_storeu_ps(job.out.ptr_at(t0 + i, row), *v);
                    } else {
                        let mut lanes = [0f32; 8];
                        _mm256_storeu_ps(lanes.as_mut_ptr(), *v);
                        for (l, &x) in lanes.iter().enumerate().take(job.end.saturating_sub(row)) {
                            job.out.write(t0 + i, row + l, x);
                        }
                    }
                }
            }
        }
    }
    T
}

/// Blocks `blocks` (expanded in `buf` from block `blocks.start`) of rows 8·rp .. 8·rp + 16 of
/// a group against `T` tokens, added to `accf` (per token, two vectors of eight rows).
///
/// # Safety
/// `buf` holds the blocks, which lie inside `data`; each token's row holds their quants;
/// rp < 7; AVX2, FMA, F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn span<const T: usize>(
    buf: &[__m256i],
    data: &[u8],
    blocks: Range<usize>,
    rp: usize,
    a: &[PlanarRow; T],
    accf: &mut [[__m256; 2]; T],
) {
    let twos = _mm256_set1_epi16(2);
    let qs: [*const i8; T] = std::array::from_fn(|t| a[t].qs.as_ptr());
    let b0 = blocks.start;
    for b in blocks {
        // SAFETY: the contract: the block lies inside `data`, its scales are its first 128
        // bytes, and rows 8·rp .. 8·rp + 16 are two runs of eight of them.
        let dw: [__m256; 2] = std::array::from_fn(|r| unsafe {
            let blk = data.as_ptr().add(b * Q1_GROUP_BLOCK);
            _mm256_cvtph_ps(_mm_loadu_si128(blk.add(2 * scale_run(rp + r)) as *const __m128i))
        });
        let mut acc = [[_mm256_setzero_si256(); 2]; T];
        let w = &buf[((b - b0) * 8 + rp) * 32..][..64];
        for m in 0..32 {
            let wv = [w[m], w[32 + m]];
            for t in 0..T {
                // SAFETY: each token's row holds the block's 128 quants (the contract).
                let a4 = unsafe { (qs[t].add(128 * b + 4 * m) as *const i32).read_unaligned() };
                let av = _mm256_set1_epi32(a4);
                for r in 0..2 {
                    acc[t][r] = _mm256_add_epi16(acc[t][r], _mm256_maddubs_epi16(wv[r], av));
                }
            }
        }
        for t in 0..T {
            let da = _mm256_set1_ps(a[t].scales[4 * b]);
            let s = &a[t].isums[4 * b..4 * b + 4];
            let sa = _mm256_set1_epi32(s[0] + s[1] + s[2] + s[3]);
            for r in 0..2 {
                let c = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_madd_epi16(acc[t][r], twos), sa));
                accf[t][r] = _mm256_fmadd_ps(_mm256_mul_ps(c, da), dw[r], accf[t][r]);
            }
        }
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
    use onebit_gguf::GgmlType;

    /// Every token count of a tile and its remainders, rows that end inside a group, and rows
    /// of more blocks than a range holds: the bits of the lookup kernel.
    #[test]
    fn tokens_get_the_lookup_kernel_s_bits() {
        if !KernelTier::Avx2.is_available() {
            return;
        }
        let k = Kernels::new(KernelTier::Avx2).unwrap();
        let pool = Pool::new(1);
        for (rows, cols, tokens) in [(64, 128, 1), (70, 128 * (RANGE_BLOCKS + 3), 7), (131, 384, 13), (200, 256, 3)] {
            let rb = GgmlType::Q1_0.bytes_for(cols as u64).unwrap() as usize;
            let mut data = vec![0u8; rows * rb];
            for r in 0..rows {
                let w: Vec<f32> = (0..cols).map(|i| (((r * 31 + i * 17) % 97) as f32 - 48.0) / 7.0).collect();
                quantize(GgmlType::Q1_0, &w, &mut data[r * rb..(r + 1) * rb]).unwrap();
            }
            let x: Vec<f32> =
                (0..cols * tokens).map(|i| ((i * 7919 % 211) as f32 - 105.0) / [13.0, 0.1, 900.0][i % 3]).collect();
            let w = MatRef::new(GgmlType::Q1_0, rows, cols, &data).unwrap();
            let packed = k.pack(&pool, &w).unwrap();
            let w = w.with_packed(Some(&packed));
            let mut acts = Acts::new();
            k.quantize_acts(&pool, GgmlType::Q1_0, &x, cols, &mut acts).unwrap();
            assert_eq!(acts.format(), ActFormat::Q8_0x4);
            assert!(!serves(&acts), "the lookup kernel takes these tokens");
            let mut want = vec![0f32; rows * tokens];
            k.matmul(&pool, &w, &acts, &mut want).unwrap();
            // In two calls, as the pool would hand out groups (the second ending inside one).
            let mut got = vec![f32::NAN; rows * tokens];
            let out = OutPtr::new(&mut got, rows);
            super::rows(&packed, 0..GROUP.min(rows), &acts, out);
            if rows > GROUP {
                super::rows(&packed, GROUP..rows, &acts, out);
            }
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{rows}x{cols}, {tokens} tokens: token {} row {}",
                    i / rows,
                    i % rows
                );
            }
        }
    }
}
