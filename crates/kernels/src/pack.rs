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

use onebit_gguf::GgmlType;

use crate::act::AlignedBuf;
use crate::disjoint::DisjointRows;
use crate::formats::{BlockQ1_0, blocks};
use crate::matmul::MatRef;
use crate::pool::Pool;

/// Rows per interleaved group.
pub const GROUP: usize = 64;
/// Bytes one group takes per 128-weight block: 64 scales and 4 × 4 vectors of 64 bytes.
pub const Q1_GROUP_BLOCK: usize = 2 * GROUP + 4 * 4 * 64;

/// Rows per group of the 16-row layout.
pub const LEGACY_GROUP: usize = 16;

/// A matrix in a kernel's own layout, owned (it replaces the file's copy in memory).
pub struct PackedMat {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// Rows per interleaved group.
    pub group_rows: usize,
    group_bytes: usize,
    buf: AlignedBuf,
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
        self.buf.as_bytes()
    }

    pub fn groups(&self) -> usize {
        self.rows.div_ceil(self.group_rows)
    }

    /// The bytes of row group `g`.
    pub fn group(&self, g: usize) -> &[u8] {
        &self.buf.as_bytes()[g * self.group_bytes..(g + 1) * self.group_bytes]
    }
}

/// Where the kernels' sums for row `r` (0..64) of a group land: they produce the rows in the
/// order of `vpunpcklbw`/`vpunpckhbw` and the i16→i32 widening, i.e. four vectors of sixteen:
/// rows 0-7,16-23 | 32-39,48-55 | 8-15,24-31 | 40-47,56-63. Returns (vector, lane).
pub fn scale_order(r: usize) -> (usize, usize) {
    let (lane128, p) = (r / 16, r % 16);
    let high = p >= 8; // from unpackhi
    let vec = (high as usize) * 2 + lane128 / 2;
    let lane = (lane128 % 2) * 8 + p % 8;
    (vec, lane)
}

/// Repack a Q1_0 matrix for the lookup-table kernels, row groups in parallel on `pool`.
pub fn pack_q1_0(w: &MatRef, pool: &Pool) -> PackedMat {
    assert_eq!(w.ty, GgmlType::Q1_0);
    pack_groups(w, pool, GROUP, (w.cols / 128) * Q1_GROUP_BLOCK, pack_q1_0_group)
}

/// Repack a Q4_0, Q4_1 or Q8_0 matrix in groups of 16 rows.
pub fn pack_legacy(w: &MatRef, pool: &Pool) -> PackedMat {
    let block_bytes = w.ty.type_size() as usize;
    pack_groups(w, pool, LEGACY_GROUP, (w.cols / 32) * LEGACY_GROUP * block_bytes, pack_legacy_group)
}

fn pack_groups(
    w: &MatRef,
    pool: &Pool,
    group_rows: usize,
    group_bytes: usize,
    pack: fn(&MatRef, usize, &mut [u8]),
) -> PackedMat {
    let groups = w.rows.div_ceil(group_rows);
    // Zeroed: rows past the matrix's end (padding of the last group) stay zero.
    let mut buf = AlignedBuf::zeroed(groups * group_bytes);
    let out = DisjointRows::new(buf.as_bytes_mut(), group_bytes);
    pool.for_chunks(groups, 1, &|_, range| {
        for g in range {
            // SAFETY: each group's bytes are written by the one thread that took the group.
            let dst = unsafe { out.row(g) };
            pack(w, g, dst);
        }
    });
    let packed_as = (w.ty, w.rows, w.cols, group_rows);
    PackedMat { ty: w.ty, rows: w.rows, cols: w.cols, group_rows, group_bytes, buf, packed_as }
}

/// Where a block's parts lie in the 16 rows of a packed block: the 16 scales at 0, then
/// (offset of the 16 Q4_1 offsets, offset of the quant vectors).
pub fn legacy_layout(ty: GgmlType) -> (Option<usize>, usize) {
    match ty {
        GgmlType::Q4_1 => (Some(32), 64),
        _ => (None, 32),
    }
}

fn pack_legacy_group(w: &MatRef, g: usize, dst: &mut [u8]) {
    let block_bytes = w.ty.type_size() as usize;
    let (m_at, qs_at) = legacy_layout(w.ty);
    // In a file block: the scale at 0, Q4_1's offset at 2, then the quants.
    let (q_src, qs_len, flip) = match w.ty {
        GgmlType::Q4_0 => (2, 16, 0),
        GgmlType::Q4_1 => (4, 16, 0),
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
