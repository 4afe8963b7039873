//! The AMX tier: AVX-512 everywhere, plus AMX-INT8 tiles for products with several tokens.
//!
//! Three paths, chosen per weight type by the number of tokens ([`path`]):
//!
//! - Pairs (batches: prefill): weights of the types in [`expand`] are expanded, 16 rows at a
//!   time, to signed bytes (the A operand of `tdpbssd`) and multiplied with the activations,
//!   laid out once per product in the VNNI order of the B operand. A 2 × 2 block of tiles
//!   (32 weight rows × 32 tokens) shares each loaded tile between two products.
//! - Narrow ([`narrow`], packed Q1_0 with a few tokens, e.g. one decoding token of each of
//!   several sequences): the tokens are the A operand, one tile of up to 16, and the weights
//!   the B operand, four tiles of 16 rows at a time.
//! - Vector: the AVX-512 kernels (single tokens; the packed legacy types up to 32 tokens).
//!
//! Each tile product covers one activation block (32 values of Q8_0/Q8_1, 128 of Q8_0x4, 256
//! of Q8_K), so every block keeps its own scales and the integer arithmetic is exactly the
//! reference's; the i32 tiles are stored and scaled with AVX-512 after each block. A tile
//! product costs the same whether its rows hold 32 or 64 bytes, and each store about as much
//! again, so products with Q1_0 ask for Q8_0x4 activations ([`super::q1_batch_format`]): whole
//! 128-blocks at full width, one store per block instead of four.
//!
//! All paths follow one float recipe per element, so that a token's results are the same bits
//! whichever runs: the exact integer sum of each activation block, `p = C_0·d_a0`,
//! `p = fma(C_k, d_ak, p)` for the other blocks under one weight scale, `acc = fma(p, d_w,
//! acc)`, then `acc = fma(s_a, m_w, acc)` for Q4_1/Q5_1 ([`Pair::scale`]; the AVX-512 side is
//! `avx512::rows16`, `legacy16` and the Q1_0 lookup tables).
//!
//! Measured on this tier's machine: the tile unit and the vector unit do not overlap (a tile
//! block and a weight expansion beside it take the sum of their times), and a tile load from
//! a row that is not 64-byte aligned costs about six times an aligned one; every tile operand
//! here is aligned. Tile instructions are inline assembly; Linux grants the tile state once
//! per process (see `amx_perm`).

mod expand;
mod narrow;

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use onebit_gguf::GgmlType;

use super::LutAhead;
use super::avx512;
use super::avx512::legacy16::Ahead;
use super::{Lut, prepare_planar};
use crate::act::{ActFormat, Acts, AlignedBuf};
use crate::disjoint::DisjointRows;
use crate::formats::{BlockQ8_0, BlockQ8_1, BlockQ8K, blocks, f16_to_f32};
use crate::matmul::{MatRef, OutPtr, RowKernel};
use crate::pack::LEGACY_GROUP;
use crate::pool::Pool;
use crate::table::Table;
use expand::TileRows;

/// Its batch format is the AVX-512 tier's ([`super::q1_batch_format`]).
// The tiles read Q5_0/Q5_1 from the rows as they are, so this tier does not repack them.
pub(crate) const TABLE: Table =
    Table { row_kernel, prepare, pack: crate::pack::Packer::for_type_amx, shrinking: (1, 32), ..avx512::TABLE };

/// Which kernel a product with weights of one type takes, by the number of tokens. Every path
/// follows the same float recipe, so the choice is free to depend on the count.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    /// The AVX-512 kernels (Q1_0: lookup tables).
    Vector,
    /// Tiles of up to 16 tokens against four weight tiles at a time ([`narrow`]): packed Q1_0
    /// only, whose expansion to tiles is cheap and whose 128-value blocks fill them.
    Narrow,
    /// Pairs of 16-token tiles against pairs of weight tiles ([`gemm_tiles`]), the weight
    /// expansion shared by all tokens.
    Pairs,
}

/// Chosen by measurement on Sapphire Rapids (one thread, 2048–6144 × 2048, products only):
///
/// - packed Q1_0: lookup tables cost about 0.07 ms a token (6144 × 2048); the narrow tiles
///   0.26 ms for 2–4 tokens, 0.31 for 8, 0.48 for 16, 0.8–1.0 for 17–31 (two token tiles),
///   the pairs 1.03 for any count up to 32. On a whole model's weights, which stream from
///   memory (`examples/batch_decode.rs`), the tiles win from 3 tokens.
/// - Q4_0, Q4_1, Q8_0 (packed, 16 rows per vector): their AVX-512 kernel shares each block's
///   unpacking among 8 tokens and beats the pairs below about 32 tokens (Q4_1 2048²: 0.43 vs
///   0.87 ms at 16, 0.59 vs 0.90 at 24); the narrow tiles lose to it too, storing and
///   scaling a tile per 32 values.
/// - The types taken from their rows as they are (`avx512::rows16`, which decodes the weights
///   again for every token): the pairs win from 3–4 tokens for TQ1_0, 6–8 for Q2_0, Q5_0 and
///   Q5_1, 9–10 for TQ2_0.
fn path(ty: GgmlType, rows: usize) -> Path {
    use GgmlType::*;
    let pairs = match ty {
        Q4_0 | Q4_1 | Q8_0 | Q1_0 => 32,
        TQ1_0 => 4,
        Q2_0 | Q5_0 | Q5_1 => 8,
        _ => 10,
    };
    match ty {
        _ if rows >= pairs => Path::Pairs,
        Q1_0 if rows >= 3 => Path::Narrow,
        _ => Path::Vector,
    }
}

/// The activation copy a token block keeps in L2 while the weight tiles pass over it.
const TOKEN_BLOCK_BYTES: usize = 512 << 10;

/// Values per activation block (`kb`) and bytes of K per tile product (`colsb`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Geometry {
    pub kb: usize,
    pub colsb: usize,
}

impl Geometry {
    fn of(format: ActFormat) -> Option<Geometry> {
        match format {
            ActFormat::Q8_0 | ActFormat::Q8_1 => Some(Geometry { kb: 32, colsb: 32 }),
            ActFormat::Q8_0x4 => Some(Geometry { kb: 128, colsb: 64 }),
            ActFormat::Q8K => Some(Geometry { kb: 256, colsb: 64 }),
            ActFormat::F32 => None,
        }
    }

    fn steps(self) -> usize {
        self.kb / self.colsb
    }

    /// Bytes of one block of 16 rows (weights) or 16 tokens (activations).
    fn block_bytes(self) -> usize {
        16 * self.kb
    }

    fn step_bytes(self) -> usize {
        16 * self.colsb
    }
}

/// Consecutive activation blocks that share one weight scale (Q1_0 with 32-value blocks: 4,
/// Q2_0: 2), which the tiles scale together: the per-token scales first, the weight scale once.
pub(super) fn blocks_per_scale(ty: GgmlType, g: Geometry) -> usize {
    match ty {
        GgmlType::Q1_0 if g.kb == 32 => 4,
        GgmlType::Q2_0 => 2,
        _ => 1,
    }
}

fn row_kernel(ty: GgmlType) -> Option<RowKernel> {
    if expand::supports(ty) { Some(RowKernel::Tiled(gemm)) } else { avx512::row_kernel(ty) }
}

/// The activations as B tiles, after the planar rows (if any): per 16-token tile and block,
/// `kb / colsb` tiles of `colsb / 4` rows × 64 bytes (token `t`'s values `4r..4r+4` of the
/// step at `64r + 4t`), tokens padded with zeros to whole pairs of tiles; then per tile and
/// block the 16 scales, and the 16 Q8_1 sums.
struct TileActs<'a> {
    geom: Geometry,
    tiles: usize,
    qs: &'a [u8],
    d: &'a [f32],
    s: &'a [f32],
}

/// (tiles, bytes of quants, bytes of scales) for `rows` tokens of `cols` values.
fn tile_layout(rows: usize, cols: usize, g: Geometry) -> (usize, usize, usize) {
    let tiles = rows.div_ceil(32) * 2;
    let nblk = cols / g.kb;
    (tiles, tiles * nblk * g.block_bytes(), tiles * nblk * 16 * 4)
}

fn tile_acts(acts: &Acts) -> Option<TileActs<'_>> {
    let geom = Geometry::of(acts.format())?;
    let (tiles, qs_len, sc_len) = tile_layout(acts.rows(), acts.cols(), geom);
    let extra = acts.aux_extra();
    if extra.len() != qs_len + 2 * sc_len {
        return None;
    }
    let (qs, rest) = extra.split_at(qs_len);
    let (d, s) = rest.split_at(sc_len);
    Some(TileActs { geom, tiles, qs, d: bytemuck::cast_slice(d), s: bytemuck::cast_slice(s) })
}

/// Lay the activations out for every path the weight types take at this number of tokens:
/// the planar rows (AVX-512 kernels, narrow tiles; lookup tables for Q1_0's vector path), and
/// the pairs' token tiles after them.
fn prepare(pool: &Pool, acts: &mut Acts, w_tys: &[GgmlType]) {
    let rows = acts.rows();
    let paths = |p: Path| w_tys.iter().any(|&t| expand::supports(t) && path(t, rows) == p);
    let vector_q1 = w_tys.contains(&GgmlType::Q1_0) && path(GgmlType::Q1_0, rows) == Path::Vector;
    let lut = if vector_q1 { Lut::Words } else { Lut::None };
    let planar = w_tys.iter().any(|&t| !expand::supports(t)) || paths(Path::Vector) || paths(Path::Narrow);
    let Some(geom) = Geometry::of(acts.format()).filter(|_| paths(Path::Pairs)) else {
        return prepare_planar(pool, acts, lut, 0);
    };
    let cols = acts.cols();
    let (_, qs_len, sc_len) = tile_layout(rows, cols, geom);
    let extra = qs_len + 2 * sc_len;
    if planar {
        prepare_planar(pool, acts, lut, extra);
    } else {
        acts.reset_aux(0, extra);
    }
    let (format, rb, at) = (acts.format(), acts.row_bytes(), rows * acts.aux_row_bytes());
    let (src, aux) = acts.reset_aux(acts.aux_row_bytes(), extra);
    // The `qs_len + 2 · sc_len` bytes reserved after the rows: per tile, its blocks of quants,
    // then per tile its scales, then per tile its sums.
    let (qs, scales) = aux[at..].split_at_mut(qs_len);
    let (d, s) = scales.split_at_mut(sc_len);
    let nblk = cols / geom.kb;
    let qs = DisjointRows::new(qs, nblk * geom.block_bytes());
    let d = DisjointRows::new(bytemuck::cast_slice_mut::<u8, f32>(d), nblk * 16);
    let s = DisjointRows::new(bytemuck::cast_slice_mut::<u8, f32>(s), nblk * 16);
    let tiles = rows.div_ceil(32) * 2;
    pool.for_chunks(tiles, 1, &|_, range| {
        for tile in range {
            let first = (16 * tile).min(rows);
            let tokens: [&[u8]; 16] =
                std::array::from_fn(|n| src.get((first + n) * rb..(first + n + 1) * rb).unwrap_or(&[]));
            let tokens = &tokens[..(rows - first).min(16)];
            // SAFETY: the pool hands each tile to one thread, and tile `tile` owns row `tile` of
            // its quants, scales and sums. `fill_tile` needs AVX-512 F/BW/VL and F16C, which
            // the AMX tier (the only caller, through its table) requires.
            unsafe { fill_tile(format, geom, tokens, qs.row(tile), d.row(tile), s.row(tile)) };
        }
    });
}

/// One 16-token tile of B operands: per block, each token's values and scale (and Q8_1 sum);
/// tokens past the end stay zero. A step's B tile is a 16 × (colsb / 4) transpose of 4-byte
/// groups: row r holds values 4r..4r+4 of tokens 0..16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn fill_tile(format: ActFormat, geom: Geometry, tokens: &[&[u8]], qs: &mut [u8], d: &mut [f32], s: &mut [f32]) {
    let mut vals = [[0i8; 256]; 16];
    d.fill(0.0);
    s.fill(0.0);
    for blk in 0..qs.len() / geom.block_bytes() {
        for (n, row) in tokens.iter().enumerate() {
            let v = &mut vals[n];
            let (scale, sum) = match format {
                ActFormat::Q8_0 => {
                    let b = &blocks::<BlockQ8_0>(row)[blk];
                    v[..32].copy_from_slice(&b.qs);
                    (f16_to_f32(u16::from_le_bytes(b.d)), 0.0)
                }
                ActFormat::Q8_1 => {
                    let b = &blocks::<BlockQ8_1>(row)[blk];
                    v[..32].copy_from_slice(&b.qs);
                    (f16_to_f32(u16::from_le_bytes(b.d)), f16_to_f32(u16::from_le_bytes(b.s)))
                }
                ActFormat::Q8_0x4 => {
                    let four = &blocks::<BlockQ8_0>(row)[4 * blk..4 * blk + 4];
                    for (k, b) in four.iter().enumerate() {
                        v[32 * k..32 * k + 32].copy_from_slice(&b.qs);
                    }
                    (f16_to_f32(u16::from_le_bytes(four[0].d)), 0.0)
                }
                _ => {
                    let b = &blocks::<BlockQ8K>(row)[blk];
                    v.copy_from_slice(&b.qs);
                    (b.d, 0.0)
                }
            };
            d[16 * blk + n] = scale;
            s[16 * blk + n] = sum;
        }
        for step in 0..geom.steps() {
            let at = step * geom.colsb;
            // SAFETY: each token's values of the step are `colsb` (32 or 64) bytes of its 256.
            let rows: [__m512; 16] = std::array::from_fn(|n| unsafe {
                let p = vals[n].as_ptr().add(at);
                _mm512_castsi512_ps(if geom.colsb == 64 {
                    _mm512_loadu_si512(p as *const __m512i)
                } else {
                    _mm512_zextsi256_si512(_mm256_loadu_si256(p as *const __m256i))
                })
            });
            let cols = avx512::transpose16(&rows);
            let tile = &mut qs[blk * geom.block_bytes() + step * geom.step_bytes()..][..geom.step_bytes()];
            for (r, c) in cols.iter().take(geom.colsb / 4).enumerate() {
                // SAFETY: row r of the step's tile is 64 bytes at 64r.
                unsafe { _mm512_storeu_ps(tile.as_mut_ptr().add(64 * r) as *mut f32, *c) };
            }
        }
    }
}

fn gemm(w: &MatRef, rows: Range<usize>, acts: &Acts, out: OutPtr) {
    // Activations with one scale per 128 values take 128-value tile blocks, which only Q1_0
    // weights expand to; other types read them as Q8_0 blocks in AVX-512.
    let geom = Geometry::of(acts.format()).filter(|g| g.kb != 128 || w.ty == GgmlType::Q1_0);
    let m = acts.rows();
    match (geom, path(w.ty, m)) {
        (Some(_), Path::Pairs) if let Some(a) = tile_acts(acts) => {
            // SAFETY: the AMX table is handed out only when AMX-INT8 is present and permitted
            // (and AVX-512 with VBMI, which every AMX CPU has).
            unsafe { gemm_tiles(w, rows, &a, m, out) }
        }
        (Some(g), Path::Narrow) if w.packed.is_some() => narrow::gemm(w, rows, acts, g, out),
        // Packed in 16-row groups: the layout of the AVX-512 16-row kernel (Q4_0..Q8_0).
        _ if w.packed.is_some_and(|p| p.group_rows == LEGACY_GROUP) => {
            avx512::legacy16::rows(w, rows, acts, out, Ahead::Kib8)
        }
        // Q1_0 with too few tokens for the tiles: the AVX-512 kernels, the lookup tables asking
        // ahead as suits this CPU.
        _ if w.ty == GgmlType::Q1_0 => avx512::matmul::q1_0_rows_ahead(w, rows, acts, out, LutAhead::L2AndL1),
        _ => match avx512::row_kernel(w.ty) {
            Some(k) => k.run(w, rows, acts, out),
            None => unreachable!("every AMX type has an AVX-512 kernel"),
        },
    }
}

/// The 64-byte tile configuration that `ldtilecfg` reads (palette 1).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// tmm0-3: C, 16 × 16 i32. tmm4-5: A, 16 weight rows × `colsb` bytes. tmm6-7: B, `colsb / 4`
/// rows × 64 bytes (16 tokens × 4).
fn config(g: Geometry) -> TileConfig {
    let mut c = TileConfig { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
    for i in 0..8 {
        (c.colsb[i], c.rows[i]) = match i {
            0..4 => (64, 16),
            4 | 5 => (g.colsb as u16, 16),
            _ => (64, (g.colsb / 4) as u8),
        };
    }
    c
}

/// Per thread: expanded weight tiles, their scales and offsets, two sets of four stored C
/// tiles, and the f32 accumulators of one 2 × 2 block.
#[derive(Default)]
struct Scratch {
    w: AlignedBuf,
    d: Vec<f32>,
    m: Vec<f32>,
    c: AlignedBuf,
    acc: AlignedBuf,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,f16c")]
unsafe fn gemm_tiles(w: &MatRef, rows: Range<usize>, a: &TileActs, m: usize, out: OutPtr) {
    let g = a.geom;
    let nblk = w.cols / g.kb;
    let w_tiles = rows.len().div_ceil(32) * 2;
    let tile_bytes = nblk * g.block_bytes();
    let has_offset = matches!(w.ty, GgmlType::Q4_1 | GgmlType::Q5_1);
    let group = blocks_per_scale(w.ty, g);
    SCRATCH.with_borrow_mut(|s| {
        s.w.resize(w_tiles * tile_bytes);
        s.d.resize(w_tiles * nblk * 16, 0.0);
        s.m.resize(w_tiles * nblk * 16, 0.0);
        s.c.resize(2 * 4 * 4096);
        s.acc.resize(64 * 64);
        for i in 0..w_tiles {
            let mut tr = TileRows {
                qs: &mut s.w.as_bytes_mut()[i * tile_bytes..(i + 1) * tile_bytes],
                d: &mut s.d[i * nblk * 16..(i + 1) * nblk * 16],
                m: &mut s.m[i * nblk * 16..(i + 1) * nblk * 16],
            };
            expand::expand(w, rows.start + 16 * i, g, &mut tr);
        }
        let cfg = config(g);
        // SAFETY: a valid palette-1 configuration; released below.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly)) };
        let block_tiles = (TOKEN_BLOCK_BYTES / (16 * w.cols)).max(2) & !1;
        for tb in (0..a.tiles).step_by(block_tiles) {
            for wi in (0..w_tiles).step_by(2) {
                for tj in (tb..(tb + block_tiles).min(a.tiles)).step_by(2) {
                    let pair = Pair {
                        g,
                        nblk,
                        group,
                        w: s.w.as_bytes()[wi * tile_bytes..].as_ptr(),
                        w_stride: tile_bytes,
                        wd: s.d[wi * nblk * 16..].as_ptr(),
                        wm: has_offset.then(|| s.m[wi * nblk * 16..].as_ptr()),
                        w_sc_stride: nblk * 16,
                        a: a.qs[tj * tile_bytes..].as_ptr(),
                        a_stride: tile_bytes,
                        ad: a.d[tj * nblk * 16..].as_ptr(),
                        as_: a.s[tj * nblk * 16..].as_ptr(),
                        a_sc_stride: nblk * 16,
                    };
                    // SAFETY: both pairs of tiles lie inside the buffers they point into.
                    unsafe { pair.product(s.c.as_bytes_mut().as_mut_ptr(), s.acc.as_f32_mut()) };
                    let acc: &[[f32; 16]] = bytemuck::cast_slice(s.acc.as_f32());
                    store_pair(acc, rows.start + 16 * wi, rows.end, 16 * tj, m, out);
                }
            }
        }
        // SAFETY: ends this thread's use of the tiles.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    });
}

/// Write a 2 × 2 block of results: `acc[16 (2i + j) + n]` is weight row `16i + n` for the 16
/// tokens of tile `j`; each tile is transposed so that a token's 16 rows are one store.
#[target_feature(enable = "avx512f")]
fn store_pair(acc: &[[f32; 16]], row0: usize, row_end: usize, tok0: usize, m: usize, out: OutPtr) {
    for (q, tile) in acc.chunks_exact(16).enumerate() {
        let (i, j) = (q / 2, q % 2);
        let (row, tok) = (row0 + 16 * i, tok0 + 16 * j);
        if row >= row_end || tok >= m {
            continue;
        }
        let mask = (((1u32 << (row_end - row).min(16)) - 1) & 0xffff) as __mmask16;
        // SAFETY: `tile` is 16 rows of 16 f32.
        let cols = avx512::transpose16(&std::array::from_fn(|n| unsafe { _mm512_loadu_ps(tile[n].as_ptr()) }));
        for (t, v) in cols.iter().enumerate().take(m - tok) {
            // SAFETY: this call owns rows `row0..row_end` of the output; the mask keeps the
            // store inside them.
            unsafe { _mm512_mask_storeu_ps(out.ptr_at(tok + t, row), mask, *v) };
        }
    }
}

/// Two weight tiles and two token tiles, with their scales.
struct Pair {
    g: Geometry,
    nblk: usize,
    /// Consecutive blocks that share one weight scale (1, 2 or 4).
    group: usize,
    w: *const u8,
    w_stride: usize,
    wd: *const f32,
    wm: Option<*const f32>,
    w_sc_stride: usize,
    a: *const u8,
    a_stride: usize,
    ad: *const f32,
    as_: *const f32,
    a_sc_stride: usize,
}

impl Pair {
    /// The 32 × 32 products over every block.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn product(&self, c: *mut u8, acc: &mut [f32]) {
        assert!(acc.len() >= 1024);
        let acc = acc.as_mut_ptr() as *mut __m512;
        // SAFETY: the caller's contract: as for `product_by`.
        unsafe {
            match self.group {
                4 => self.product_by::<4>(c, acc),
                2 => self.product_by::<2>(c, acc),
                _ => self.product_by::<1>(c, acc),
            }
        }
    }

    /// `G` consecutive blocks share one weight scale (Q1_0 with Q8_0: 4, Q2_0: 2), so their
    /// tiles are scaled together: the per-token scales first, the weight scale once.
    #[inline(always)]
    unsafe fn product_by<const G: usize>(&self, c: *mut u8, acc: *mut __m512) {
        let groups = self.nblk / G;
        // Software pipeline: the tile unit computes group `g` while the vector unit scales the
        // stored tiles of `g - 1` (the first group sets the sums, the others add to them).
        // SAFETY: the caller's contract (`product`'s): the pair's pointers cover `nblk` blocks
        // of tiles and scales, `c` holds two sets of G stored tiles of 4 KiB (alternating by
        // group), `acc` 1024 floats, and this thread has configured its tiles. Blocks
        // `G·g + k` and `G·(g - 1)` are below `nblk`.
        unsafe {
            for g in 0..=groups {
                if g < groups {
                    for k in 0..G {
                        self.tiles(G * g + k);
                        Pair::store(c.add(4096 * (G * (g % 2) + k)));
                    }
                }
                match g {
                    0 => {}
                    1 => self.scale::<G, true>(0, c, acc),
                    _ => self.scale::<G, false>(G * (g - 1), c.add(4096 * G * ((g - 1) % 2)), acc),
                }
            }
        }
    }

    /// The four C tiles of block `blk` (tile 2i + j: weight tile i, token tile j).
    #[inline(always)]
    unsafe fn tiles(&self, blk: usize) {
        let g = self.g;
        // SAFETY: the caller's contract: the block's tiles lie inside the expanded weights and activations.
        unsafe {
            asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
            for step in 0..g.steps() {
                let off = blk * g.block_bytes() + step * g.step_bytes();
                asm!(
                    "tileloadd tmm4, [{w0} + {ws} * 1]",
                    "tileloadd tmm5, [{w1} + {ws} * 1]",
                    "tileloadd tmm6, [{a0} + {s64} * 1]",
                    "tileloadd tmm7, [{a1} + {s64} * 1]",
                    "tdpbssd tmm0, tmm4, tmm6",
                    "tdpbssd tmm1, tmm4, tmm7",
                    "tdpbssd tmm2, tmm5, tmm6",
                    "tdpbssd tmm3, tmm5, tmm7",
                    w0 = in(reg) self.w.add(off),
                    w1 = in(reg) self.w.add(self.w_stride + off),
                    ws = in(reg) g.colsb,
                    a0 = in(reg) self.a.add(off),
                    a1 = in(reg) self.a.add(self.a_stride + off),
                    s64 = in(reg) 64usize,
                    options(nostack, readonly),
                );
            }
        }
    }

    /// Store the four C tiles at `c`.
    #[inline(always)]
    unsafe fn store(c: *mut u8) {
        // SAFETY: the caller's contract: `c` has 4 KiB.
        unsafe {
            asm!(
                "tilestored [{c} + {s64} * 1], tmm0",
                "tilestored [{c} + {s64} * 1 + 1024], tmm1",
                "tilestored [{c} + {s64} * 1 + 2048], tmm2",
                "tilestored [{c} + {s64} * 1 + 3072], tmm3",
                c = in(reg) c, s64 = in(reg) 64usize,
                options(nostack),
            );
        }
    }

    /// acc[16q + n] += d_w[n] · Σ_k C_kq[n] · d_a[k] (+ s_a · m_w[n]) for the stored tiles of
    /// blocks `blk .. blk + G`.
    #[inline(always)]
    unsafe fn scale<const G: usize, const FIRST: bool>(&self, blk: usize, c: *const u8, acc: *mut __m512) {
        // SAFETY: the caller's contract: G stored sets of four tiles at `c`, the scales (and
        // offsets and sums) of blocks `blk .. blk + G` at the pair's pointers, 1024 floats
        // (64 vectors) at `acc`; AVX-512 F from `product`, into which this is inlined.
        unsafe {
            let c = c as *const __m512i;
            for j in 0..2 {
                let at = j * self.a_sc_stride + 16 * blk;
                let da: [__m512; G] = std::array::from_fn(|k| _mm512_loadu_ps(self.ad.add(at + 16 * k)));
                for i in 0..2 {
                    let q = 2 * i + j;
                    let wd = self.wd.add(i * self.w_sc_stride + 16 * blk);
                    for n in 0..16 {
                        let ck = |k: usize| _mm512_cvtepi32_ps(_mm512_load_si512(c.add(64 * k + 16 * q + n)));
                        let mut p = _mm512_mul_ps(ck(0), da[0]);
                        for (k, da) in da.iter().enumerate().skip(1) {
                            p = _mm512_fmadd_ps(ck(k), *da, p);
                        }
                        let prev = if FIRST { _mm512_setzero_ps() } else { *acc.add(16 * q + n) };
                        let mut a = _mm512_fmadd_ps(p, _mm512_set1_ps(*wd.add(n)), prev);
                        if let Some(wm) = self.wm {
                            let m = *wm.add(i * self.w_sc_stride + 16 * blk + n);
                            a = _mm512_fmadd_ps(_mm512_loadu_ps(self.as_.add(at)), _mm512_set1_ps(m), a);
                        }
                        *acc.add(16 * q + n) = a;
                    }
                }
            }
        }
    }
}
