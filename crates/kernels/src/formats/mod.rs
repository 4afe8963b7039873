//! Block formats: the byte layout of every tensor type, its scalar dequantization to f32 and
//! its reference quantization from f32.
//!
//! These are the plain references the fast kernels are tested against, and they follow ggml's
//! order of float operations so that results match llama.cpp bit for bit (dequantization to
//! within 1 ulp where a C compiler may fuse a multiply-add, quantization byte for byte).
//!
//! Layouts are `#[repr(C)]` structs of bytes (alignment 1), so a tensor's bytes can be viewed
//! as a slice of blocks wherever they sit in the file.

mod float;
pub mod kquants;
mod kquants_quantize;
mod lanes;
mod legacy;
mod one_bit;
pub mod ternary;
mod weighted;

use onebit_gguf::GgmlType;

pub use float::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
pub use kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K, scale_min_k4};
pub use legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
pub use one_bit::BlockQ1_0;
pub use ternary::{BlockQ2_0, BlockTQ1_0, BlockTQ2_0};

use crate::KernelError;

/// A block layout: `QK` weights in `size_of::<Self>()` bytes.
pub trait Block: bytemuck::Pod {
    const TYPE: GgmlType;
    const QK: usize;
}

/// View `bytes` as blocks of `B`. The length must be a whole number of blocks.
pub fn blocks<B: Block>(bytes: &[u8]) -> &[B] {
    bytemuck::cast_slice(bytes)
}

pub fn blocks_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    bytemuck::cast_slice_mut(bytes)
}

/// Read an IEEE half stored little-endian.
#[inline(always)]
pub(crate) fn half(b: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(b))
}

#[inline(always)]
pub(crate) fn to_half(x: f32) -> [u8; 2] {
    f32_to_f16(x).to_le_bytes()
}

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below it is quantized as zeros.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// The value of largest magnitude (the first one, on ties), with its sign; 0 for none (ggml's
/// `if (ax > amax) { amax = ax; max = v; }`, so a NaN never wins).
pub(crate) fn signed_absmax(xs: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in xs {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// ggml's `nearest_int`: round half to even through the float adder, for |x| < 2^22.
#[inline(always)]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The types [`dequantize`] understands.
pub fn can_dequantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q8_1
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | Q8_K
            | TQ1_0
            | TQ2_0
            | Q1_0
            | Q2_0
    )
}

/// The types [`quantize`] can produce.
pub fn can_quantize(ty: GgmlType) -> bool {
    can_dequantize(ty)
}

fn check_sizes(ty: GgmlType, n: usize, bytes: usize) -> Result<(), KernelError> {
    if ty.bytes_for(n as u64) != Some(bytes as u64) {
        return Err(KernelError::Size { ty, elements: n, bytes });
    }
    Ok(())
}

/// Dequantize `src` (whole blocks of `ty`) into `dst`, one f32 per weight.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    check_sizes(ty, dst.len(), src.len())?;
    use GgmlType::*;
    match ty {
        F32 => {
            dst.iter_mut().zip(src.chunks_exact(4)).for_each(|(d, s)| *d = f32::from_le_bytes(s.try_into().unwrap()))
        }
        F16 => f16_row_to_f32(src, dst),
        BF16 => dst
            .iter_mut()
            .zip(src.chunks_exact(2))
            .for_each(|(d, s)| *d = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]))),
        Q4_0 => legacy::dequantize_q4_0(blocks(src), dst),
        Q4_1 => legacy::dequantize_q4_1(blocks(src), dst),
        Q5_0 => legacy::dequantize_q5_0(blocks(src), dst),
        Q5_1 => legacy::dequantize_q5_1(blocks(src), dst),
        Q8_0 => legacy::dequantize_q8_0(blocks(src), dst),
        Q8_1 => legacy::dequantize_q8_1(blocks(src), dst),
        Q2_K => kquants::dequantize_q2_k(blocks(src), dst),
        Q3_K => kquants::dequantize_q3_k(blocks(src), dst),
        Q4_K => kquants::dequantize_q4_k(blocks(src), dst),
        Q5_K => kquants::dequantize_q5_k(blocks(src), dst),
        Q6_K => kquants::dequantize_q6_k(blocks(src), dst),
        Q8_K => kquants::dequantize_q8_k(blocks(src), dst),
        TQ1_0 => ternary::dequantize_tq1_0(blocks(src), dst),
        TQ2_0 => ternary::dequantize_tq2_0(blocks(src), dst),
        Q2_0 => ternary::dequantize_q2_0(blocks(src), dst),
        Q1_0 => one_bit::dequantize_q1_0(blocks(src), dst),
        other => {
            return Err(KernelError::Unsupported { ty: other, what: "dequantization" });
        }
    }
    Ok(())
}

/// Halves to f32 (exact). An aligned row goes through `half`'s slice conversion, which uses
/// F16C where the CPU has it (the scalar path is a third of the time of a Q1_0 quantization).
fn f16_row_to_f32(src: &[u8], dst: &mut [f32]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    match bytemuck::try_cast_slice::<u8, u16>(src) {
        Ok(bits) => bits.reinterpret_cast::<half::f16>().convert_to_f32_slice(dst),
        Err(_) => dst.iter_mut().zip(src.chunks_exact(2)).for_each(|(d, s)| *d = half([s[0], s[1]])),
    }
}

/// Quantize `src` into `dst` (whole blocks of `ty`) with ggml's reference quantizer (no
/// importance matrix).
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    check_sizes(ty, src.len(), dst.len())?;
    use GgmlType::*;
    match ty {
        F32 => dst.chunks_exact_mut(4).zip(src).for_each(|(d, s)| d.copy_from_slice(&s.to_le_bytes())),
        F16 => dst.chunks_exact_mut(2).zip(src).for_each(|(d, s)| d.copy_from_slice(&to_half(*s))),
        BF16 => dst.chunks_exact_mut(2).zip(src).for_each(|(d, s)| d.copy_from_slice(&f32_to_bf16(*s).to_le_bytes())),
        Q4_0 => legacy::quantize_q4_0(src, blocks_mut(dst)),
        Q4_1 => legacy::quantize_q4_1(src, blocks_mut(dst)),
        Q5_0 => legacy::quantize_q5_0(src, blocks_mut(dst)),
        Q5_1 => legacy::quantize_q5_1(src, blocks_mut(dst)),
        Q8_0 => legacy::quantize_q8_0(src, blocks_mut(dst)),
        Q8_1 => legacy::quantize_q8_1(src, blocks_mut(dst)),
        Q2_K => kquants_quantize::quantize_q2_k(src, blocks_mut(dst)),
        Q3_K => kquants_quantize::quantize_q3_k(src, blocks_mut(dst)),
        Q4_K => kquants_quantize::quantize_q4_k(src, blocks_mut(dst)),
        Q5_K => kquants_quantize::quantize_q5_k(src, blocks_mut(dst)),
        Q6_K => kquants_quantize::quantize_q6_k(src, blocks_mut(dst)),
        Q8_K => kquants_quantize::quantize_q8_k(src, blocks_mut(dst)),
        TQ1_0 => ternary::quantize_tq1_0(src, blocks_mut(dst)),
        TQ2_0 => ternary::quantize_tq2_0(src, blocks_mut(dst)),
        Q2_0 => ternary::quantize_q2_0(src, blocks_mut(dst)),
        Q1_0 => one_bit::quantize_q1_0(src, blocks_mut(dst)),
        other => {
            return Err(KernelError::Unsupported { ty: other, what: "quantization" });
        }
    }
    Ok(())
}

/// Whether `ty`'s quantizer takes an importance matrix into account (the others ignore one).
pub fn uses_importance(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K)
}

/// Quantize one row `src` into `dst` as ggml's `quantize_*` does given `weights`, the
/// importance of each column (an importance matrix row): without weights, or for a type that
/// has no use for them, this is [`quantize`].
pub fn quantize_weighted(
    ty: GgmlType,
    src: &[f32],
    dst: &mut [u8],
    weights: Option<&[f32]>,
) -> Result<(), KernelError> {
    let Some(w) = weights.filter(|_| uses_importance(ty)) else {
        return quantize(ty, src, dst);
    };
    check_sizes(ty, src.len(), dst.len())?;
    if w.len() != src.len() {
        return Err(KernelError::Shape(format!("{} importance weights for a row of {}", w.len(), src.len())));
    }
    weighted::quantize_row(ty, src, dst, w)
}
