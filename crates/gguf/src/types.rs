//! The ggml tensor types a GGUF file may name, with their block geometry.
//!
//! Every id that ggml assigns today is listed, so that `onebit inspect` can describe any file
//! and size validation is exact. Whether onebit can *compute* with a type is the kernels
//! crate's business; here a type is only a name, an id, and (weights per block, bytes per block).

use std::fmt;

macro_rules! ggml_types {
    ($( $variant:ident = $id:literal, $name:literal, $block:literal, $bytes:literal; )*) => {
        /// A ggml tensor element type (the `type` field of a GGUF tensor info).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        #[repr(u32)]
        pub enum GgmlType {
            $( $variant = $id, )*
        }

        impl GgmlType {
            /// Every known type, in id order.
            pub const ALL: &'static [GgmlType] = &[ $( GgmlType::$variant, )* ];

            /// The type with this on-disk id, or `None` for ids ggml does not (or no longer) define.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $( $id => Some(GgmlType::$variant), )*
                    _ => None,
                }
            }

            /// ggml's lower-case name, as `gguf-py` and llama.cpp print it (`q4_K`, `tq1_0`, ...).
            pub fn name(self) -> &'static str {
                match self { $( GgmlType::$variant => $name, )* }
            }

            /// Weights per block.
            pub fn block_size(self) -> u64 {
                match self { $( GgmlType::$variant => $block, )* }
            }

            /// Bytes per block.
            pub fn type_size(self) -> u64 {
                match self { $( GgmlType::$variant => $bytes, )* }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "f32", 1, 4;
    F16 = 1, "f16", 1, 2;
    Q4_0 = 2, "q4_0", 32, 18;
    Q4_1 = 3, "q4_1", 32, 20;
    Q5_0 = 6, "q5_0", 32, 22;
    Q5_1 = 7, "q5_1", 32, 24;
    Q8_0 = 8, "q8_0", 32, 34;
    Q8_1 = 9, "q8_1", 32, 36;
    Q2_K = 10, "q2_K", 256, 84;
    Q3_K = 11, "q3_K", 256, 110;
    Q4_K = 12, "q4_K", 256, 144;
    Q5_K = 13, "q5_K", 256, 176;
    Q6_K = 14, "q6_K", 256, 210;
    Q8_K = 15, "q8_K", 256, 292;
    IQ2_XXS = 16, "iq2_xxs", 256, 66;
    IQ2_XS = 17, "iq2_xs", 256, 74;
    IQ3_XXS = 18, "iq3_xxs", 256, 98;
    IQ1_S = 19, "iq1_s", 256, 50;
    IQ4_NL = 20, "iq4_nl", 32, 18;
    IQ3_S = 21, "iq3_s", 256, 110;
    IQ2_S = 22, "iq2_s", 256, 82;
    IQ4_XS = 23, "iq4_xs", 256, 136;
    I8 = 24, "i8", 1, 1;
    I16 = 25, "i16", 1, 2;
    I32 = 26, "i32", 1, 4;
    I64 = 27, "i64", 1, 8;
    F64 = 28, "f64", 1, 8;
    IQ1_M = 29, "iq1_m", 256, 56;
    BF16 = 30, "bf16", 1, 2;
    TQ1_0 = 34, "tq1_0", 256, 54;
    TQ2_0 = 35, "tq2_0", 256, 66;
    MXFP4 = 39, "mxfp4", 32, 17;
    NVFP4 = 40, "nvfp4", 64, 36;
    Q1_0 = 41, "q1_0", 128, 18;
    Q2_0 = 42, "q2_0", 64, 18;
}

impl GgmlType {
    /// The on-disk id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The type with this name (case-insensitive: `Q4_K`, `q4_k` and `q4_K` all match).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL.iter().copied().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Bytes for `n` elements, or `None` if `n` is not a whole number of blocks or overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }

    /// Average bits per weight.
    pub fn bits_per_weight(self) -> f64 {
        self.type_size() as f64 * 8.0 / self.block_size() as f64
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name().to_ascii_uppercase())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_names_are_unique() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
    }

    #[test]
    fn sizes_match_ggml() {
        assert_eq!(GgmlType::Q1_0.bytes_for(4096), Some(32 * 18));
        assert_eq!(GgmlType::TQ2_0.bits_per_weight(), 2.0625);
        assert_eq!(GgmlType::Q4_K.bytes_for(100), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
