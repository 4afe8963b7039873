//! Row-interleaved repacking of weights at load time, for the SIMD products.
//!
//! Q1_0 (for the lookup-table products): a Q1_0 matrix is regrouped 64 rows at a time. For each 128-weight block column the group
//! stores the 64 row scales (f16), then, for each of the four 32-weight sub-blocks, four
//! 64-byte vectors: vector `j` holds byte `j` of every row's four bytes of sign bits. Byte
//! position `16L + p` of a vector is row `16L + p`, so one `vpshufb` looks up a 4-bit group of
//! 64 rows at once, and the low and high nibbles of a byte are two consecutive groups of four
//! weights. The row scales are stored in the order the kernels produce their sums (see
//! [`scale_order`]).
//!
//! Q4_0, Q4_1 and Q8_0 (for VNNI products with 16 rows in the 16 lanes of a vector): 16 rows at
//! a time; per 32-weight block the 16 row scales (f16; then the 16 offsets of Q4_1), then the
//! quants as 64-byte vectors whose 4-byte lane `n` holds four consecutive quant bytes of row
//! `n` (Q8_0 quants are stored plus 128, as unsigned bytes).
//!
//! A packed matrix has exactly the size of the original (rows padded to a whole group).

use std::ops::Range;
use std::sync::Arc;

use onebit_gguf::GgmlType;

use crate::arena::Arena;
use crate::formats::{BlockQ1_0, blocks};
use crate::matmul::MatRef;
use crate::pool::Pool;

/// Rows per interleaved group.
pub const GROUP: usize = 64;
/// Bytes one group takes per 128-weight block: 64 scales and 4 × 4 vectors of 64 bytes.
pub const Q1_GROUP_BLOCK: usize = 2 * GROUP + 4 * 4 * 64;

/// Rows per group of the 16-row layout.
pub const LEGACY_GROUP: usize = 16;

/// Where packed matrices live: memory of their own, or a cache file's mapping (see
/// `pack_cache`).
pub enum PackedStore {
    Arena(Arena),
    File(memmap2::Mmap),
}

impl PackedStore {
    pub fn bytes(&self) -> &[u8] {
        match self {
            PackedStore::Arena(a) => a.bytes(),
            PackedStore::File(m) => m,
        }
    }
}

/// A matrix in a kernel's own layout, owned (it replaces the file's copy in memory): its own
/// [`Arena`], or its part of one store that holds a whole model's packed matrices.
pub struct PackedMat {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// Rows per interleaved group.
    pub group_rows: usize,
    group_bytes: usize,
    arena: Arc<PackedStore>,
    range: Range<usize>,
    /// (ty, rows, cols, group_rows) as packed: the public fields can be changed, this cannot.
    packed_as: (GgmlType, usize, usize, usize),
}

impl std::fmt::Debug for PackedMat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedMat({} {}x{})", self.ty, self.rows, self.cols)
    }
}

impl PackedMat {
    /// Whether this is `rows × cols` weights of `ty`, packed as its fields say.
    pub fn holds(&self, ty: GgmlType, rows: usize, cols: usize) -> bool {
        let fields = (self.ty, self.rows, self.cols, self.group_rows);
        fields == (ty, rows, cols, self.group_rows) && fields == self.packed_as
    }

    pub fn bytes(&self) -> &[u8] {
        &self.arena.bytes()[self.range.clone()]
    }

    pub fn groups(&self) -> usize {
        self.rows.div_ceil(self.group_rows)
    }

    /// The bytes of row group `g`.
    pub fn group(&self, g: usize) -> &[u8] {
        &self.bytes()[g * self.group_bytes..(g + 1) * self.group_bytes]
    }
}

/// Where the kernels' sums for row `r` (0..64) of a group land: they produce the rows in the
/// order of `vpunpcklbw`/`vpunpckhbw` and the i16→i32 widening, i.e. four vectors of sixteen:
/// rows 0-7,16-23 | 32-39,48-55 | 8-15,24-31 | 40-47,56-63. Returns (vector, lane).
pub const fn scale_order(r: usize) -> (usize, usize) {
    let (lane128, p) = (r / 16, r % 16);
    let high = p >= 8; // from unpackhi
    let vec = (high as usize) * 2 + lane128 / 2;
    let lane = (lane128 % 2) * 8 + p % 8;
    (vec, lane)
}

/// How a tier repacks matrices of one type: rows per group, and the packing of one group.
#[derive(Clone, Copy)]
pub struct Packer {
    ty: GgmlType,
    group_rows: usize,
    /// Weights per block column, and bytes a group takes per block column.
    block_cols: usize,
    block_bytes: usize,
    pack_group: fn(&MatRef, usize, &mut [u8]),
}

impl std::fmt::Debug for Packer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packer({}, {} rows a group)", self.ty, self.group_rows)
    }
}

impl Packer {
    /// Q1_0 for the lookup-table kernels (groups of [`GROUP`] rows).
    pub fn q1_0() -> Packer {
        Packer {
            ty: GgmlType::Q1_0,
            group_rows: GROUP,
            block_cols: 128,
            block_bytes: Q1_GROUP_BLOCK,
            pack_group: pack_q1_0_group,
        }
    }

    /// Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 in groups of [`LEGACY_GROUP`] rows.
    pub fn legacy(ty: GgmlType) -> Packer {
        use GgmlType::*;
        assert!(matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0), "no 16-row layout for {ty}");
        Packer {
            ty,
            group_rows: LEGACY_GROUP,
            block_cols: 32,
            block_bytes: LEGACY_GROUP * ty.type_size() as usize,
            pack_group: pack_legacy_group,
        }
    }

    /// The packer of the types both x86 SIMD tiers repack: Q1_0 and Q4_0/Q4_1/Q5_0/Q5_1/Q8_0.
    pub fn for_type(ty: GgmlType) -> Option<Packer> {
        use GgmlType::*;
        match ty {
            Q1_0 => Some(Packer::q1_0()),
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 => Some(Packer::legacy(ty)),
            _ => None,
        }
    }

    /// The AMX tier's packers: [`Packer::for_type`]'s but Q5_0/Q5_1, which its tiles read from
    /// the rows as they are.
    pub fn for_type_amx(ty: GgmlType) -> Option<Packer> {
        match ty {
            GgmlType::Q5_0 | GgmlType::Q5_1 => None,
            _ => Packer::for_type(ty),
        }
    }

    fn group_bytes(&self, w: &MatRef) -> usize {
        (w.cols / self.block_cols) * self.block_bytes
    }

    /// Bytes `w` takes packed: exactly its own size, with rows padded to a whole group.
    pub fn packed_len(&self, w: &MatRef) -> usize {
        w.rows.div_ceil(self.group_rows) * self.group_bytes(w)
    }

    /// Repack `w` (of this packer's type) into `dst`, [`Packer::packed_len`] zero bytes (rows
    /// past the matrix's end, padding of the last group, stay zero), row groups in parallel on
    /// `pool`.
    pub fn pack_into(&self, w: &MatRef, pool: &Pool, dst: &mut [u8]) {
        assert_eq!(w.ty, self.ty, "a {} matrix for the {} packer", w.ty, self.ty);
        assert_eq!(dst.len(), self.packed_len(w), "packed length");
        let group_bytes = self.group_bytes(w);
        if group_bytes == 0 {
            return;
        }
        let mut groups: Vec<(usize, &mut [u8])> = dst.chunks_exact_mut(group_bytes).enumerate().collect();
        let row_bytes = w.data.len() / w.rows.max(1);
        pool.for_each_mut(&mut groups, &|_, (g, out)| {
            let rows = (*g * self.group_rows).min(w.rows)..((*g + 1) * self.group_rows).min(w.rows);
            load_lines(&w.data[rows.start * row_bytes..rows.end * row_bytes]);
            (self.pack_group)(w, *g, out);
        });
    }

    /// The packed matrix of `w` held in `arena[range]`, where [`Packer::pack_into`] put it.
    pub fn packed(&self, w: &MatRef, arena: Arc<PackedStore>, range: Range<usize>) -> PackedMat {
        assert_eq!(range.len(), self.packed_len(w), "packed length");
        assert!(range.end <= arena.bytes().len(), "range outside the arena");
        PackedMat {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            group_rows: self.group_rows,
            group_bytes: self.group_bytes(w),
            arena,
            range,
            packed_as: (w.ty, w.rows, w.cols, self.group_rows),
        }
    }

    /// Repack `w` into an arena of its own.
    pub fn pack(&self, w: &MatRef, pool: &Pool) -> PackedMat {
        let len = self.packed_len(w);
        let mut arena = Arena::zeroed(len);
        self.pack_into(w, pool, arena.bytes_mut());
        self.packed(w, Arc::new(PackedStore::Arena(arena)), 0..len)
    }
}

/// Read one byte of every cache line of `data`, in order: a group's rows are one contiguous
/// range of the file, which streams into the cache far faster this way than by the packing's
/// own order (a block of each of the group's rows in turn, as many streams as rows).
fn load_lines(data: &[u8]) {
    let mut acc = 0u8;
    for line in data.chunks(64) {
        acc ^= line[0];
    }
    std::hint::black_box(acc);
}

/// Repack a Q1_0 matrix for the lookup-table kernels, row groups in parallel on `pool`.
pub fn pack_q1_0(w: &MatRef, pool: &Pool) -> PackedMat {
    Packer::q1_0().pack(w, pool)
}

/// Repack a Q4_0, Q4_1 or Q8_0 matrix in groups of 16 rows.
pub fn pack_legacy(w: &MatRef, pool: &Pool) -> PackedMat {
    Packer::legacy(w.ty).pack(w, pool)
}

/// Where a block's parts lie in the 16 rows of a packed block: the 16 scales at 0, then
/// (offset of the 16 Q4_1/Q5_1 offsets, offset of the quant vectors).
pub fn legacy_layout(ty: GgmlType) -> (Option<usize>, usize) {
    match ty {
        GgmlType::Q4_1 => (Some(32), 64),
        GgmlType::Q5_0 => (None, 96),
        GgmlType::Q5_1 => (Some(32), 128),
        _ => (None, 32),
    }
}

/// Where the eight fifth-bit masks of a packed Q5_0/Q5_1 block lie (64 bytes).
pub fn legacy_high_bits(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q5_0 => Some(32),
        GgmlType::Q5_1 => Some(64),
        _ => None,
    }
}

fn pack_legacy_group(w: &MatRef, g: usize, dst: &mut [u8]) {
    let block_bytes = w.ty.type_size() as usize;
    let (m_at, qs_at) = legacy_layout(w.ty);
    let qh_at = legacy_high_bits(w.ty);
    // In a file block: the scale at 0, Q4_1's and Q5_1's offset at 2, Q5's fifth bits (a
    // little-endian u32, bit j for weight j) after that, then the quants.
    let (q_src, qs_len, flip) = match w.ty {
        GgmlType::Q4_0 => (2, 16, 0),
        GgmlType::Q4_1 => (4, 16, 0),
        GgmlType::Q5_0 => (6, 16, 0),
        GgmlType::Q5_1 => (8, 16, 0),
        GgmlType::Q8_0 => (2, 32, 0x80),
        other => unreachable!("no 16-row layout for {other}"),
    };
    for n in 0..LEGACY_GROUP {
        let row = g * LEGACY_GROUP + n;
        if row >= w.rows {
            break;
        }
        for (b, src) in w.row(row).chunks_exact(block_bytes).enumerate() {
            let out = &mut dst[b * LEGACY_GROUP * block_bytes..(b + 1) * LEGACY_GROUP * block_bytes];
            out[2 * n..2 * n + 2].copy_from_slice(&src[..2]);
            if let Some(ma) = m_at {
                out[ma + 2 * n..ma + 2 * n + 2].copy_from_slice(&src[2..4]);
            }
            for (i, &q) in src[q_src..q_src + qs_len].iter().enumerate() {
                out[qs_at + 64 * (i / 4) + 4 * n + i % 4] = q ^ flip;
            }
            if let Some(qh_at) = qh_at {
                let qh = u32::from_le_bytes(src[q_src - 4..q_src].try_into().unwrap());
                for j in (0..32).filter(|j| qh >> j & 1 == 1) {
                    let bit = 4 * n + j % 4;
                    out[qh_at + 8 * (j / 4) + bit / 8] |= 1 << (bit % 8);
                }
            }
        }
    }
}

fn pack_q1_0_group(w: &MatRef, g: usize, dst: &mut [u8]) {
    let live = w.rows.saturating_sub(g * GROUP).min(GROUP);
    let rows: Vec<&[BlockQ1_0]> = (0..live).map(|r| blocks::<BlockQ1_0>(w.row(g * GROUP + r))).collect();
    for (b, out) in dst.chunks_exact_mut(Q1_GROUP_BLOCK).enumerate() {
        for (r, row) in rows.iter().enumerate() {
            let (vec, lane) = scale_order(r);
            out[2 * (16 * vec + lane)..][..2].copy_from_slice(&row[b].d);
        }
        // Bit vector v, byte r = byte v of row r: a 64 × 16 byte transpose, by 8 × 8 tiles.
        let bits = &mut out[2 * GROUP..];
        for r0 in (0..live).step_by(8) {
            for v0 in (0..16).step_by(8) {
                let mut m = [0u64; 8];
                for (i, mi) in m.iter_mut().enumerate().take(live - r0) {
                    let qs = &rows[r0 + i][b].qs[v0..v0 + 8];
                    *mi = u64::from_le_bytes(qs.try_into().expect("8 bytes"));
                }
                for (j, t) in transpose8x8(m).iter().enumerate() {
                    bits[64 * (v0 + j) + r0..][..8].copy_from_slice(&t.to_le_bytes());
                }
            }
        }
    }
}

/// Transpose an 8 × 8 matrix of bytes held as eight little-endian rows: byte `j` of row `i`
/// becomes byte `i` of row `j`.
fn transpose8x8(m: [u64; 8]) -> [u64; 8] {
    // Three rounds that swap the off-diagonal 4 × 4, 2 × 2 and 1 × 1 blocks.
    let mut m = m;
    for (shift, mask) in [(32u32, 0x0000_0000_ffff_ffffu64), (16, 0x0000_ffff_0000_ffff), (8, 0x00ff_00ff_00ff_00ff)] {
        let step = (shift / 8) as usize;
        for i in 0..8 {
            if i & step == 0 {
                let (a, b) = (m[i], m[i + step]);
                m[i] = (a & mask) | ((b & mask) << shift);
                m[i + step] = ((a >> shift) & mask) | (b & !mask);
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose8x8_transposes() {
        let m: [u64; 8] = std::array::from_fn(|i| u64::from_le_bytes(std::array::from_fn(|j| (8 * i + j) as u8)));
        let t = transpose8x8(m);
        for (j, row) in t.iter().enumerate() {
            for (i, &byte) in row.to_le_bytes().iter().enumerate() {
                assert_eq!(byte as usize, 8 * i + j);
            }
        }
    }

    #[test]
    fn scale_order_is_a_permutation() {
        let mut seen = [false; 64];
        for r in 0..64 {
            let (v, l) = scale_order(r);
            assert!(v < 4 && l < 16);
            assert!(!seen[16 * v + l]);
            seen[16 * v + l] = true;
        }
        assert_eq!(scale_order(9), (2, 1));
        assert_eq!(scale_order(16), (0, 8));
        assert_eq!(scale_order(40), (3, 0));
    }
}
