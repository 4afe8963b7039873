//! Products of packed Q1_0 with a few tokens (3 to 31, e.g. one decoding token of each of
//! several sequences) on AMX: a tile of the tokens against up to four 16-row weight tiles.
//!
//! The tokens are the A operand (M rows, one per token, of 32 or 64 activation bytes, loaded
//! straight from the planar layout) and the weights the B operand (VNNI order, expanded block
//! by block just before use, see [`expand_b`]). A C tile then holds M tokens × 16 weight rows,
//! so its store and its scaling cost grow with the tokens, not with a padded 16-token tile,
//! and a token's 16 results are one vector store. Each expanded weight tile is loaded once
//! per token tile. The scaling is the module's recipe, so a token's results are the same
//! bits as on the other paths.
//!
//! Per block of 64 rows × 128 values, 8 tokens, one thread on Sapphire Rapids: alone, in a
//! microbenchmark with everything in L1, the weight expansion about 52 ns and the tile loads,
//! products and stores about 40; in place (`gemm_speed`, the matrix in L2) the expansion about
//! 60, the tile work 60, the scaling 30 and the loops and stores of results 20. The tile unit
//! and the vector unit do not overlap, even interleaved instruction by instruction (an
//! expansion of the next block beside each product: the sum of the two times), so these add
//! up; within the tile work a product with M = 8 tokens costs about 60 % of one with 16, and
//! the B loads about as much again. A whole model's weights come from memory, which the
//! expansion prefetches ahead; the same block costs the same from memory as from L2.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use onebit_gguf::GgmlType;

use super::Geometry;
use super::TileConfig;
use super::expand::{BTiles, b_tile_bytes, expand_b};
use crate::act::{ActFormat, Acts, AlignedBuf};
use crate::matmul::{MatRef, OutPtr};
use crate::x86::Planar;

/// Weight tiles per pass (16 rows each).
const TILES: usize = 4;

/// tmm0-1: C, M × 16 i32 (a pair of weight tiles at a time). tmm2-3: A, M tokens × `colsb`
/// bytes, the two steps of an activation block. tmm4-7: B, `colsb / 4` rows × 64 bytes (16
/// weight rows × 4 values), taken in turn, so that each load has three products' time before
/// its register is needed again. (With four C tiles, one A and three B registers, a block of
/// 64 rows × 128 values took 49 ns of tile work, L1-resident, one thread; this way 40.)
fn config(g: Geometry, m: usize) -> TileConfig {
    let mut c = TileConfig { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
    for i in 0..8 {
        (c.colsb[i], c.rows[i]) = match i {
            0..2 => (64, m as u8),
            2..4 => (g.colsb as u16, m as u8),
            _ => (64, (g.colsb / 4) as u8),
        };
    }
    c
}

/// Weight blocks are expanded a run at a time, as many as fit in this many bytes of B operands.
/// Measured on a model's weights streaming from memory: one Q1_0 block (8 KiB) at a time is
/// fastest (8 tokens, Bonsai-1.7B shape: 33.6 ms a step against 37.7 with 24 KiB runs and 46.6
/// with 48), as the run's operands, its C tiles and the incoming weights stay in L1.
const RUN_BYTES: usize = 8 << 10;

/// Per thread: a run of weight blocks' B operands, weight scales and C tiles, and the
/// f32 sums of four tiles × 16 tokens.
#[derive(Default)]
struct Scratch {
    b: AlignedBuf,
    d: Vec<[[f32; 16]; TILES]>,
    c: AlignedBuf,
    acc: AlignedBuf,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Rows `rows` of the packed Q1_0 matrix `w` for the tokens of `acts`, whose planar layout is
/// built.
pub(super) fn gemm(w: &MatRef, rows: Range<usize>, acts: &Acts, g: Geometry, out: OutPtr) {
    assert!(acts.rows() > 0 && acts.aux_row_bytes() == Planar::new(acts.cols()).row_bytes);
    assert!(w.ty == GgmlType::Q1_0 && w.packed.is_some(), "narrow tiles take packed Q1_0");
    // SAFETY: the AMX table is handed out only when AMX-INT8 is present and permitted (and
    // AVX-512 BW/VL and F16C, which every AMX CPU has).
    unsafe { gemm_tiles(w, rows, acts, g, out) }
}

/// Weight blocks go by runs: expand the run's B operands, multiply them with every token tile
/// (the tile unit and the vector unit do not overlap here, so the phases are simply
/// sequential), then scale each (tile, token) sum over the run's blocks in a register.
///
/// More than 16 tokens take several token tiles of equal height M, the last one moved back to
/// end at the last token (a token in two tiles gets the same bits from both).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn gemm_tiles(w: &MatRef, rows: Range<usize>, acts: &Acts, g: Geometry, out: OutPtr) {
    let all = acts.rows();
    let nt = all.div_ceil(16);
    let m = all.div_ceil(nt);
    let first = |tt: usize| (tt * m).min(all - m);
    let group = super::blocks_per_scale(w.ty, g);
    let nwb = w.cols / (group * g.kb);
    let tb = b_tile_bytes(g, group);
    let run = (RUN_BYTES / (TILES * tb)).clamp(1, nwb);
    let p = Planar::new(acts.cols());
    let (base, stride) = (acts.aux_bytes().as_ptr(), acts.aux_row_bytes());
    let a = |tt: usize| Acts0 {
        // SAFETY: token `first(tt)` has a planar row.
        base: unsafe { base.add(first(tt) * stride) },
        stride,
        scales: p.scales,
        x4: acts.format() == ActFormat::Q8_0x4,
    };
    let packed = w.packed.expect("checked above");
    let job = Job { g, group, steps: g.kb / g.colsb, tb, m };
    assert!(job.steps <= 2, "narrow tiles take activation blocks of one or two steps");
    // C tiles: per run position, per token tile, per activation block, four 1 KiB tiles.
    let c_block = group * TILES * 1024;
    SCRATCH.with_borrow_mut(|s| {
        s.b.resize(run * TILES * tb);
        s.d.resize(run, [[0.0; 16]; TILES]);
        s.c.resize(run * nt * c_block);
        s.acc.resize(nt * TILES * 16 * 64);
        let cfg = config(g, m);
        // SAFETY: a valid palette-1 configuration; released below.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly)) };
        let c = s.c.as_bytes_mut().as_mut_ptr();
        let acc = s.acc.as_f32_mut().as_mut_ptr() as *mut __m512;
        for row0 in rows.clone().step_by(16 * TILES) {
            let tiles = (rows.end - row0).div_ceil(16).min(TILES);
            for q in 0..nt * TILES * 16 {
                // SAFETY: `acc` holds nt × TILES × 16 vectors.
                unsafe { *acc.add(q) = _mm512_setzero_ps() };
            }
            for r0 in (0..nwb).step_by(run) {
                let blocks = r0..(r0 + run).min(nwb);
                for (wb, (qs, d)) in blocks.clone().zip(s.b.as_bytes_mut().chunks_exact_mut(TILES * tb).zip(&mut s.d)) {
                    expand_b(packed, row0, tiles, wb, &mut BTiles { qs, d });
                }
                for wb in blocks.clone() {
                    let r = wb - r0;
                    for tt in 0..nt {
                        // SAFETY: block wb's B operands were just expanded at run position r,
                        // and its C tiles go to their own slot of `c`; the activation tiles
                        // lie inside the planar rows of the token tile.
                        unsafe {
                            let b = s.b.as_bytes().as_ptr().add(r * TILES * tb);
                            job.products(&a(tt), wb, tiles, b, c.add((r * nt + tt) * c_block));
                        }
                    }
                }
                for tt in 0..nt {
                    let (ct, acct) = (c.wrapping_add(tt * c_block), acc.wrapping_add(tt * TILES * 16));
                    let cs = nt * c_block;
                    // SAFETY: the run's C tiles are stored; `acc` holds this token tile's sums.
                    unsafe {
                        match group {
                            4 => job.scale::<4>(&a(tt), blocks.clone(), tiles, ct, cs, &s.d, acct),
                            _ => job.scale::<1>(&a(tt), blocks.clone(), tiles, ct, cs, &s.d, acct),
                        }
                    }
                }
            }
            for tt in 0..nt {
                for i in 0..tiles {
                    let row = row0 + 16 * i;
                    let mask = (((1u32 << (rows.end - row).min(16)) - 1) & 0xffff) as __mmask16;
                    for t in 0..m {
                        // SAFETY: this call owns rows `rows` of the output; the mask stops at
                        // them.
                        unsafe {
                            let v = *acc.add((tt * TILES + i) * 16 + t);
                            _mm512_mask_storeu_ps(out.ptr_at(first(tt) + t, row), mask, v);
                        }
                    }
                }
            }
        }
        // SAFETY: ends this thread's use of the tiles.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    });
}

/// The planar activation rows: token t's quants at `base + t · stride`, its scales at the
/// planar offset `scales` after them.
struct Acts0 {
    base: *const u8,
    stride: usize,
    scales: usize,
    x4: bool,
}

struct Job {
    g: Geometry,
    /// Activation blocks per weight scale.
    group: usize,
    steps: usize,
    /// Bytes of one weight tile's B operands per weight block.
    tb: usize,
    m: usize,
}

impl Job {
    /// The C tiles of weight block `wb` for one token tile: per activation block k of it, tile
    /// i at `c + 4096 k + 1024 i` (row t: token t of the tile).
    #[inline(always)]
    unsafe fn products(&self, a: &Acts0, wb: usize, tiles: usize, b: *const u8, c: *mut u8) {
        let g = self.g;
        // SAFETY: the caller's contract: the operands lie where the offsets say.
        unsafe {
            for k in 0..self.group {
                let at = (wb * self.group + k) * g.kb;
                asm!("tileloadd tmm2, [{a} + {s} * 1]", a = in(reg) a.base.add(at), s = in(reg) a.stride,
                     options(nostack, readonly));
                if self.steps == 2 {
                    asm!("tileloadd tmm3, [{a} + {s} * 1]", a = in(reg) a.base.add(at + g.colsb), s = in(reg) a.stride,
                         options(nostack, readonly));
                }
                // B operand of tile i, step st.
                let bk = |i: usize, st: usize| b.add(i * self.tb + (k * self.steps + st) * 16 * g.colsb);
                let ck = c.add(4096 * k);
                for i in (0..tiles).step_by(2) {
                    asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
                    let both = i + 1 < tiles;
                    if self.steps == 2 {
                        product::<0, 0, 4>(bk(i, 0));
                        product::<0, 1, 5>(bk(i, 1));
                        if both {
                            product::<1, 0, 6>(bk(i + 1, 0));
                            product::<1, 1, 7>(bk(i + 1, 1));
                        }
                    } else if i % 4 == 0 {
                        product::<0, 0, 4>(bk(i, 0));
                        if both {
                            product::<1, 0, 5>(bk(i + 1, 0));
                        }
                    } else {
                        product::<0, 0, 6>(bk(i, 0));
                        if both {
                            product::<1, 0, 7>(bk(i + 1, 0));
                        }
                    }
                    asm!("tilestored [{c} + {s} * 1], tmm0", c = in(reg) ck.add(1024 * i), s = in(reg) 64usize,
                         options(nostack));
                    if both {
                        asm!("tilestored [{c} + {s} * 1], tmm1", c = in(reg) ck.add(1024 * (i + 1)),
                             s = in(reg) 64usize, options(nostack));
                    }
                }
            }
        }
    }

    /// For every tile i and token t of a token tile, over the run's blocks in order (their C
    /// tiles `c_stride` apart): with C_k the exact integer
    /// sums, p = C_0·d_a0, p = fma(C_k, d_ak, p), acc = fma(p, d_w, acc).
    /// Four tokens at a time, their sums for every tile in registers.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn scale<const G: usize>(
        &self,
        a: &Acts0,
        blocks: Range<usize>,
        tiles: usize,
        c: *const u8,
        c_stride: usize,
        d: &[[[f32; 16]; TILES]],
        acc: *mut __m512,
    ) {
        // Bytes between the scales of consecutive activation blocks (Q8_0x4 keeps a scale per
        // 32-block, the four of a 128 equal; Q8_K one per 256).
        let step = if a.x4 { 16 } else { 4 };
        // SAFETY: the caller's contract: the C tiles of the run's blocks are at `c`; `acc` holds TILES × 16
        // vectors. Tokens past `m` (up to the next four) read rows of C tiles that exist
        // (1 KiB each) and clamped activation rows, and are never stored.
        unsafe {
            for t0 in (0..self.m).step_by(4) {
                let tok: [usize; 4] = std::array::from_fn(|j| (t0 + j).min(self.m - 1));
                let row: [*const u8; 4] = std::array::from_fn(|j| a.base.add(tok[j] * a.stride));
                let mut v: [[__m512; 4]; TILES] =
                    std::array::from_fn(|i| std::array::from_fn(|j| *acc.add(16 * i + tok[j])));
                for wb in blocks.clone() {
                    let r = wb - blocks.start;
                    let blk = wb * G;
                    let cr = c.add(c_stride * r + 64 * t0);
                    let da: [[__m512; 4]; G] = std::array::from_fn(|k| {
                        std::array::from_fn(|j| {
                            let at = a.scales + step * (blk + k);
                            _mm512_set1_ps(std::ptr::read_unaligned(row[j].add(at) as *const f32))
                        })
                    });
                    for i in 0..tiles {
                        let wd = _mm512_loadu_ps(d[r][i].as_ptr());
                        for j in 0..4 {
                            let ck = |k: usize| {
                                let at = cr.add(4096 * k + 1024 * i + 64 * j);
                                _mm512_cvtepi32_ps(_mm512_load_si512(at as *const __m512i))
                            };
                            let mut p = _mm512_mul_ps(ck(0), da[0][j]);
                            for k in 1..G {
                                p = _mm512_fmadd_ps(ck(k), da[k][j], p);
                            }
                            v[i][j] = _mm512_fmadd_ps(p, wd, v[i][j]);
                        }
                    }
                }
                for (i, v) in v.iter().enumerate() {
                    for (j, v) in v.iter().enumerate().take(self.m - t0) {
                        *acc.add(16 * i + t0 + j) = *v;
                    }
                }
            }
        }
    }
}

/// C += A · B: tmm`C` (0-1) += tmm`2 + A` (the step's activations) · tmm`B` (4-7), loaded from
/// `b`.
#[inline(always)]
unsafe fn product<const C: usize, const A: usize, const B: usize>(b: *const u8) {
    // SAFETY: the caller's contract: `b` holds a B operand of the configured shape.
    unsafe {
        macro_rules! tile {
            ($c:literal, $a:literal, $b:literal) => {
                asm!(concat!("tileloadd ", $b, ", [{b} + {s} * 1]"), concat!("tdpbssd ", $c, ", ", $a, ", ", $b),
                     b = in(reg) b, s = in(reg) 64usize, options(nostack, readonly))
            };
        }
        match (C, A, B) {
            (0, 0, 4) => tile!("tmm0", "tmm2", "tmm4"),
            (0, 1, 5) => tile!("tmm0", "tmm3", "tmm5"),
            (1, 0, 6) => tile!("tmm1", "tmm2", "tmm6"),
            (1, 1, 7) => tile!("tmm1", "tmm3", "tmm7"),
            (1, 0, 5) => tile!("tmm1", "tmm2", "tmm5"),
            (0, 0, 6) => tile!("tmm0", "tmm2", "tmm6"),
            (1, 0, 7) => tile!("tmm1", "tmm2", "tmm7"),
            _ => unreachable!("no product is issued with these registers"),
        }
    }
}
