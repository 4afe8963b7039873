//! A small deterministic random source for the unit tests beside the kernels (the tests in
//! `tests/` share theirs in `tests/common`): the same numbers on every machine, no dependency.

/// A 64-bit linear congruential generator (Knuth's MMIX constants); the high bits are the
/// random ones.
pub(crate) struct Lcg(pub u64);

impl Lcg {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0
    }

    /// A byte from the top of the state.
    pub(crate) fn byte(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }

    /// Uniform in [-0.5, 0.5), 24 bits of it.
    pub(crate) fn centered(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}
