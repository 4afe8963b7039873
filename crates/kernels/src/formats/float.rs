//! Scalar conversions between f32 and the 16-bit float formats, with ggml's rounding.

use half::f16;

/// IEEE half to f32 (exact).
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// f32 to IEEE half, rounding to nearest even (what F16C's `vcvtps2ph` and ggml do).
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// bfloat16 to f32 (exact: the top half of an f32).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to bfloat16, rounding to nearest even; NaNs stay quiet NaNs.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rounding() {
        for bits in 0..=u16::MAX {
            let x = f16_to_f32(bits);
            if !x.is_nan() {
                assert_eq!(f32_to_f16(x), bits);
            }
            if !bf16_to_f32(bits).is_nan() {
                assert_eq!(f32_to_bf16(bf16_to_f32(bits)), bits);
            }
        }
        // Ties go to even.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_f16(1.0 + 1.0 / 4096.0), 0x3c00);
    }
}
