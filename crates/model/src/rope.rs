//! Rotary position embeddings, computed the way ggml does: the angle of pair i at position p is
//! `p * freq_scale * base^(-2i/dims) / freq_factor[i]`, built by repeated multiplication so
//! the rounding matches llama.cpp's.

use crate::config::{RopeConfig, RopeStyle};

/// cos/sin of every rotated pair at one position.
pub(crate) struct RopeAngles {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeAngles {
    pub fn new(rope: &RopeConfig) -> RopeAngles {
        RopeAngles { cos: vec![0.0; rope.dims / 2], sin: vec![0.0; rope.dims / 2] }
    }

    /// Fill in the angles for position `pos`.
    pub fn set(&mut self, rope: &RopeConfig, freq_factors: Option<&[f32]>, pos: usize) {
        let theta_scale = rope.freq_base.powf(-2.0 / rope.dims as f32);
        let mut theta = pos as f32;
        for i in 0..rope.dims / 2 {
            let ff = freq_factors.map_or(1.0, |f| f[i]);
            let angle = rope.freq_scale * (theta / ff);
            self.cos[i] = angle.cos();
            self.sin[i] = angle.sin();
            theta *= theta_scale;
        }
    }

    /// The cosines of the rotated pairs' angles (for kernels that rotate elsewhere).
    pub fn cos(&self) -> &[f32] {
        &self.cos
    }

    pub fn sin(&self) -> &[f32] {
        &self.sin
    }

    /// Rotate one head vector in place.
    pub fn apply(&self, rope: &RopeConfig, x: &mut [f32]) {
        let half = rope.dims / 2;
        match rope.style {
            RopeStyle::Normal => {
                for i in 0..half {
                    let (x0, x1) = (x[2 * i], x[2 * i + 1]);
                    x[2 * i] = x0 * self.cos[i] - x1 * self.sin[i];
                    x[2 * i + 1] = x0 * self.sin[i] + x1 * self.cos[i];
                }
            }
            RopeStyle::Neox => {
                // Halves split and zipped, so that the compiler vectorizes the loop.
                let (lo, hi) = x[..2 * half].split_at_mut(half);
                for (((a, b), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(&self.cos).zip(&self.sin) {
                    let (x0, x1) = (*a, *b);
                    *a = x0 * c - x1 * s;
                    *b = x0 * s + x1 * c;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_rotation_preserves_norm() {
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            let rope = RopeConfig { style, dims: 8, freq_base: 10_000.0, freq_scale: 1.0 };
            let mut a = RopeAngles::new(&rope);
            let x0: Vec<f32> = (0..10).map(|i| i as f32 * 0.3 - 1.0).collect();
            let mut x = x0.clone();
            a.set(&rope, None, 0);
            a.apply(&rope, &mut x);
            assert_eq!(x, x0);
            a.set(&rope, None, 17);
            a.apply(&rope, &mut x);
            let norm = |v: &[f32]| v[..8].iter().map(|x| x * x).sum::<f32>();
            assert!((norm(&x) - norm(&x0)).abs() < 1e-4);
            assert_eq!(&x[8..], &x0[8..], "dims past rope.dims pass through");
        }
    }
}
