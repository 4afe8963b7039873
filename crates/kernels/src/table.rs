//! The table of entry points each kernel tier fills in (its `TABLE`), and what the tiers share
//! with the dispatch point ([`crate::dispatch`]): the paged rows attention reads, the widest head,
//! the defaults a tier may take. Tiers depend on this module, the dispatch point on the tiers.

use onebit_gguf::GgmlType;

use crate::act::{ActFormat, Acts};
use crate::matmul::{MatRef, RowKernel};
use crate::pack::Packer;
use crate::pool::Pool;

/// One tier's entry points. A tier that does not specialise an operation uses the scalar one.
pub(crate) struct Table {
    pub row_kernel: fn(GgmlType) -> Option<RowKernel>,
    pub quantize_row: fn(ActFormat, &[f32], &mut [u8]),
    /// The format this tier would rather take for a batch of `rows` tokens against weights of
    /// the types given, when coarser activation rounding is allowed (see [`ActFormat::Q8_0x4`]).
    pub batch_format: fn(ActFormat, &[GgmlType], usize) -> ActFormat,
    /// Build the tier's private layout of freshly quantized activations (or nothing), for
    /// products with weights of every type given (all of them take this activation format).
    pub prepare: fn(&Pool, &mut Acts, &[GgmlType]),
    /// How this tier repacks matrices of a type, where it has packed kernels for it.
    pub pack: fn(GgmlType) -> Option<Packer>,
    /// Rows per unit of work for a batch of 16 tokens or more against a matrix, where the
    /// tier's kernel wants other than the default (see `chunk_rows`).
    pub batch_rows: fn(&MatRef) -> Option<usize>,
    /// The token counts (from, up to but not including) for which products against packed
    /// weights go by shrinking pieces (see `shrinking_unit`).
    pub shrinking: (usize, usize),
    pub rms_norm: fn(&[f32], &[f32], f32, &mut [f32]),
    pub softmax: fn(&mut [f32]),
    pub silu_mul: fn(&mut [f32], &[f32]),
    pub gelu_mul: fn(&mut [f32], &[f32]),
    pub dot_f32: fn(&[f32], &[f32]) -> f32,
    pub f16_to_f32: fn(&[u16], &mut [f32]),
    pub f32_to_f16: fn(&[f32], &mut [u16]),
    pub round_f16: fn(&mut [f32]),
    pub gemm_nt: fn(&[f32], &[f32], usize, &mut [f32], usize),
    pub gemm_nn_acc: fn(&[f32], usize, &[f32], usize, &mut [f32]),
    /// The same two products over rows in runs, f32 or IEEE halves read as they are (None:
    /// each run taken alone, widened first if halves, which gives the same values).
    pub gemm_nt_pages: Option<GemmNtPages>,
    pub gemm_nn_acc_pages: Option<GemmNnAccPages>,
    /// Scores of Q8_0 queries against runs of Q8_0 keys (see [`crate::Kernels::scores_q8_0`]).
    pub scores_q8_0: ScoresQ8,
}

pub(crate) type GemmNtPages = fn(&[f32], Pages, usize, &mut [f32], usize);
pub(crate) type GemmNnAccPages = fn(&[f32], usize, Pages, usize, &mut [f32]);
pub(crate) type ScoresQ8 = fn(&[u8], &[&[u8]], usize, &mut [f32], usize);

/// Rows of keys or values in consecutive runs (the blocks of a paged cache): each run whole
/// rows, all runs together the rows of a product.
#[derive(Clone, Copy, Debug)]
pub enum Pages<'a> {
    F32(&'a [&'a [f32]]),
    /// IEEE halves.
    F16(&'a [&'a [u16]]),
    /// Q8_0 blocks (rows of a multiple of 32 values, 34 bytes per 32).
    Q8_0(&'a [&'a [u8]]),
}

impl Pages<'_> {
    /// Values in all runs.
    pub(crate) fn len(&self) -> usize {
        match self {
            Pages::F32(p) => p.iter().map(|r| r.len()).sum(),
            Pages::F16(p) => p.iter().map(|r| r.len()).sum(),
            Pages::Q8_0(p) => p.iter().map(|r| r.len() / 34 * 32).sum(),
        }
    }

    pub(crate) fn runs_whole(&self, width: usize) -> bool {
        match self {
            Pages::F32(p) => p.iter().all(|r| r.len().is_multiple_of(width)),
            Pages::F16(p) => p.iter().all(|r| r.len().is_multiple_of(width)),
            Pages::Q8_0(p) => width.is_multiple_of(32) && p.iter().all(|r| r.len().is_multiple_of(width / 32 * 34)),
        }
    }
}

/// A tier without units of its own for batches takes the default.
pub(crate) fn default_batch_rows(_: &MatRef) -> Option<usize> {
    None
}

/// A tier without a batch format of its own keeps the one the weights call for.
pub(crate) fn same_format(format: ActFormat, _: &[GgmlType], _: usize) -> ActFormat {
    format
}

/// The widest attention head the Q8_0 score kernels take (heads are 64 to 256 wide).
pub const MAX_HEAD: usize = 512;

/// Activations of fewer values than this are quantized on the calling thread: a parallel region
/// costs a few microseconds, more than rounding a few tokens (e.g. 8 of SmolLM2's 576 values).
pub(crate) const SERIAL_VALUES: usize = 1 << 16;
