//! AVX2 tier (in progress): the scalar table.
pub(crate) use crate::scalar::TABLE;
