//! AMX tier (in progress): the AVX-512 table.
pub(crate) use super::avx512::TABLE;
