//! aarch64 kernels: NEON with the dot-product extension.
pub(crate) mod neon;
