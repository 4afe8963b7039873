//! Which type each tensor gets: llama-quantize's file types (`Q4_K_M`, ...) and its per-tensor
//! rules, so that a file quantized here has the same tensor types as llama.cpp's.
//!
//! The rules are llama.cpp's `llama-quant.cpp` behaviour, restated: which tensors may be
//! quantized at all, the output and token-embedding rules, the mixes that give some tensors more
//! bits (by category, layer and the model's head and expert counts), and the fallback for rows
//! that are not a whole number of blocks. Tensors are visited in llama.cpp's order (tensors
//! outside the blocks first, then block by block, by name within each), because some rules
//! count the tensors of a category seen so far.

use onebit_gguf::GgmlType;

use super::QuantizeError;

macro_rules! file_types {
    ($( $variant:ident = $id:literal, $name:literal, $default:ident; )*) => {
        /// A llama.cpp file type (`general.file_type`): the target of a whole-model quantization.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[allow(non_camel_case_types)]
        pub enum FileType {
            $( $variant, )*
        }

        impl FileType {
            pub const ALL: &'static [FileType] = &[ $( FileType::$variant, )* ];

            /// The value stored in `general.file_type` (llama.cpp's `llama_ftype`).
            pub fn id(self) -> u32 {
                match self { $( FileType::$variant => $id, )* }
            }

            /// The name llama-quantize accepts.
            pub fn name(self) -> &'static str {
                match self { $( FileType::$variant => $name, )* }
            }

            /// The type most tensors get.
            pub fn default_type(self) -> GgmlType {
                match self { $( FileType::$variant => GgmlType::$default, )* }
            }
        }
    };
}

file_types! {
    Q1_0 = 40, "Q1_0", Q1_0;
    Q2_0 = 41, "Q2_0", Q2_0;
    Q4_0 = 2, "Q4_0", Q4_0;
    Q4_1 = 3, "Q4_1", Q4_1;
    Q5_0 = 8, "Q5_0", Q5_0;
    Q5_1 = 9, "Q5_1", Q5_1;
    TQ1_0 = 36, "TQ1_0", TQ1_0;
    TQ2_0 = 37, "TQ2_0", TQ2_0;
    Q2_K = 10, "Q2_K", Q2_K;
    Q2_K_S = 21, "Q2_K_S", Q2_K;
    Q3_K_S = 11, "Q3_K_S", Q3_K;
    Q3_K_M = 12, "Q3_K_M", Q3_K;
    Q3_K_L = 13, "Q3_K_L", Q3_K;
    Q4_K_S = 14, "Q4_K_S", Q4_K;
    Q4_K_M = 15, "Q4_K_M", Q4_K;
    Q5_K_S = 16, "Q5_K_S", Q5_K;
    Q5_K_M = 17, "Q5_K_M", Q5_K;
    Q6_K = 18, "Q6_K", Q6_K;
    Q8_0 = 7, "Q8_0", Q8_0;
    F16 = 1, "F16", F16;
    BF16 = 32, "BF16", BF16;
    F32 = 0, "F32", F32;
}

/// llama-quantize's types that need an importance-matrix quantizer or a format onebit lacks.
const NOT_SUPPORTED: &[&str] = &[
    "IQ1_S",
    "IQ1_M",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ2_M",
    "IQ3_XXS",
    "IQ3_XS",
    "IQ3_S",
    "IQ3_M",
    "IQ4_NL",
    "IQ4_XS",
    "MXFP4_MOE",
    "NVFP4",
];

impl FileType {
    /// Parse a type as llama-quantize does: a name (any case; `Q3_K`, `Q4_K`, `Q5_K` mean the
    /// `_M` mixes) or the numeric file type.
    pub fn parse(s: &str) -> Result<FileType, QuantizeError> {
        let upper = s.to_ascii_uppercase();
        let alias = match upper.as_str() {
            "Q3_K" => "Q3_K_M",
            "Q4_K" => "Q4_K_M",
            "Q5_K" => "Q5_K_M",
            other => other,
        };
        if let Some(t) = FileType::ALL.iter().find(|t| t.name() == alias) {
            return Ok(*t);
        }
        if let Ok(id) = s.trim().parse::<u32>()
            && let Some(t) = FileType::ALL.iter().find(|t| t.id() == id)
        {
            return Ok(*t);
        }
        if NOT_SUPPORTED.contains(&alias) {
            return Err(QuantizeError::UnsupportedFileType(alias.to_string()));
        }
        Err(QuantizeError::UnknownFileType(s.to_string()))
    }
}

/// The model facts the rules look at.
#[derive(Clone, Debug, Default)]
pub struct Hparams {
    pub arch: String,
    pub n_layer: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub n_expert: u32,
    /// llama.cpp's `LLM_TYPE_70B` (8 heads share each attn_v, so it gets more bits).
    pub is_70b: bool,
}

impl Hparams {
    /// Heads per key/value head (0 when there are none, as in llama.cpp).
    fn n_gqa(&self) -> u32 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }
}

/// What the user asked for besides the file type.
#[derive(Clone, Debug)]
pub struct Options {
    pub ftype: FileType,
    pub output_tensor_type: Option<GgmlType>,
    pub token_embedding_type: Option<GgmlType>,
    /// False with `--leave-output-tensor`.
    pub quantize_output: bool,
    /// `--pure`: no mixes, every quantizable tensor gets the default type.
    pub pure: bool,
    pub has_imatrix: bool,
}

/// One tensor as the rules see it.
#[derive(Clone, Copy, Debug)]
pub struct TensorDesc<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    /// `ne[0..4]`, 1 past the stored dimensions.
    pub ne: [u64; 4],
}

impl TensorDesc<'_> {
    /// ggml's `ggml_n_dims`: dimensions up to the last one above 1 (at least 1).
    pub fn n_dims(&self) -> usize {
        (1..4).rev().find(|&i| self.ne[i] > 1).map_or(1, |i| i + 1)
    }
}

/// What `sscanf(name, "blk.%d.", &n)` finds: the number after `blk.`, if any.
pub fn block_number(name: &str) -> Option<i32> {
    let rest = name.strip_prefix("blk.")?.trim_start();
    let (sign, digits) = match rest.as_bytes().first() {
        Some(b'-') => (-1i64, &rest[1..]),
        Some(b'+') => (1, &rest[1..]),
        _ => (1, rest),
    };
    let end = digits.bytes().take_while(u8::is_ascii_digit).count();
    if end == 0 {
        return None;
    }
    let value = digits[..end].bytes().fold(0i64, |v, d| (v * 10 + (d - b'0') as i64).min(1 << 32));
    Some((sign * value) as i32)
}

/// llama.cpp's tensor order: by block number (none counts as -1), then by name.
pub fn llama_order(names: &[&str]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by(|&a, &b| {
        let key = |i: usize| (block_number(names[i]).unwrap_or(-1), names[i].as_bytes());
        key(a).cmp(&key(b))
    });
    order
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    AttnV,
    AttnK,
    AttnQkv,
    AttnKvB,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn is_token_embd(name: &str) -> bool {
    name == "token_embd.weight" || name == "per_layer_token_embd.weight"
}

fn category(name: &str) -> Category {
    use Category::*;
    if name == "output.weight" {
        return Output;
    }
    if is_token_embd(name) {
        return TokenEmbd;
    }
    let table = [
        ("attn_qkv.weight", AttnQkv),
        ("attn_kv_b.weight", AttnKvB),
        ("attn_v.weight", AttnV),
        ("attn_k.weight", AttnK),
        ("attn_q.weight", AttnQ),
        ("attn_output.weight", AttnOutput),
        ("ffn_up", FfnUp),
        ("ffn_gate", FfnGate),
        ("ffn_down", FfnDown),
    ];
    table.iter().find(|(pat, _)| name.contains(pat)).map_or(Other, |&(_, c)| c)
}

fn is_attn_v_like(c: Category) -> bool {
    matches!(c, Category::AttnV | Category::AttnQkv | Category::AttnKvB)
}

/// Name parts of tensors llama.cpp never quantizes (small, or precision-critical).
const KEEP_PARTS: &[&str] = &[
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
];

/// The same for GLM-5-Next only.
const KEEP_PARTS_GLM5_NEXT: &[&str] = &[
    "hc_",
    "indexer.attn_q_b",
    "indexer.attn_k",
    "indexer.proj",
    "indexer_compressor_gate",
    "indexer_compressor_ape",
    "ssm_f_a.weight",
    "ssm_f_b.weight",
    "ssm_g_a.weight",
    "ssm_g_b.weight",
    "ssm_beta.weight",
    "attn_kv_a_mqa.weight",
    "attn_k_b.weight",
    "attn_v_b.weight",
];

/// Whether a tensor may change type at all: weights of two or more dimensions, minus the
/// exceptions llama.cpp lists.
pub fn allows_quantization(opts: &Options, arch: &str, t: &TensorDesc) -> bool {
    if t.n_dims() < 2 || !t.name.ends_with("weight") {
        return false;
    }
    if !opts.quantize_output && t.name == "output.weight" {
        return false;
    }
    if t.name == "position_embd.weight" || t.name == "token_types.weight" {
        return false;
    }
    let glm = if arch == "glm5-next" { KEEP_PARTS_GLM5_NEXT } else { &[] };
    !KEEP_PARTS.iter().chain(glm).any(|p| t.name.contains(p))
}

/// The running counts some rules depend on.
struct State<'h> {
    hp: &'h Hparams,
    n_attention_wv: u32,
    i_attention_wv: u32,
    i_ffn_down: u32,
    i_ffn_gate: u32,
    i_ffn_up: u32,
    tied_embeddings: bool,
    /// Tensors that fell back to another type because of their row length.
    pub n_fallback: u32,
}

fn use_more_bits(i_layer: i64, n_layers: i64) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

/// One tensor's type and, when it fell back, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub ty: GgmlType,
    pub fallback: Option<String>,
}

/// The type of every tensor (given in llama.cpp's order), as llama-quantize would choose it.
pub fn plan(hp: &Hparams, opts: &Options, tensors: &[TensorDesc]) -> Result<Vec<Choice>, QuantizeError> {
    let mut st = State {
        hp,
        n_attention_wv: 0,
        i_attention_wv: 0,
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
        tied_embeddings: true,
        n_fallback: 0,
    };
    for t in tensors {
        let c = category(t.name);
        st.n_attention_wv += is_attn_v_like(c) as u32;
        if c == Category::Output {
            st.tied_embeddings = false;
        }
    }
    let default = opts.ftype.default_type();
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        if !allows_quantization(opts, &hp.arch, t) {
            out.push(Choice { ty: t.ty, fallback: None });
            continue;
        }
        let cat = category(t.name);
        if let (Some(ty), Category::TokenEmbd) = (opts.token_embedding_type, cat) {
            out.push(Choice { ty, fallback: None });
            continue;
        }
        if let (Some(ty), Category::Output) = (opts.output_tensor_type, cat) {
            out.push(Choice { ty, fallback: None });
            continue;
        }
        let mut ty = default;
        let mut fallback = None;
        if is_quantized(default) {
            if !opts.pure {
                ty = st.mix_type(ty, t, opts, cat)?;
            }
            (ty, fallback) = fall_back(t, ty)?;
            st.n_fallback += fallback.is_some() as u32;
        }
        out.push(Choice { ty, fallback });
    }
    Ok(out)
}

fn is_quantized(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::F64)
        && !matches!(ty, GgmlType::I8 | GgmlType::I16 | GgmlType::I32 | GgmlType::I64)
}

/// A type whose blocks do not divide the row: a smaller-block type, or F16 as the last resort.
fn fall_back(t: &TensorDesc, ty: GgmlType) -> Result<(GgmlType, Option<String>), QuantizeError> {
    use GgmlType::*;
    let ncols = t.ne[0];
    if ncols.is_multiple_of(ty.block_size()) {
        return Ok((ty, None));
    }
    let mut to = match ty {
        IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
        Q2_0 | Q2_K | Q3_K | TQ1_0 | TQ2_0 => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        other if other.block_size() <= 32 => other,
        other => {
            return Err(QuantizeError::NoFallback { tensor: t.name.to_string(), ty: other, ncols });
        }
    };
    if !ncols.is_multiple_of(to.block_size()) {
        to = F16;
    }
    let why = format!("{ncols} columns are not a multiple of {} ({ty}): {to} instead", ty.block_size());
    Ok((to, Some(why)))
}

impl State<'_> {
    /// The layer a ffn tensor belongs to: its running count, or (with experts, whose tensors
    /// are not in layer order) the number in its name.
    fn layer_of(&self, counter: u32, name: &str) -> Result<(i64, i64), QuantizeError> {
        let n_layer = self.hp.n_layer as i64;
        if self.hp.n_expert > 1 {
            let layer = block_number(name)
                .ok_or_else(|| QuantizeError::Rules(format!("cannot tell the layer of tensor {name}")))?;
            if layer < 0 || layer as i64 >= n_layer {
                return Err(QuantizeError::Rules(format!("bad layer {layer} for tensor {name} (of {n_layer})")));
            }
            return Ok((layer as i64, n_layer));
        }
        Ok((counter as i64, n_layer))
    }

    /// llama.cpp's mixes: the type of one quantizable tensor, given the file type.
    fn mix_type(
        &mut self,
        mut ty: GgmlType,
        t: &TensorDesc,
        opts: &Options,
        cat: Category,
    ) -> Result<GgmlType, QuantizeError> {
        use Category::*;
        use FileType as F;
        use GgmlType as G;
        let ftype = opts.ftype;
        let hp = self.hp;
        let (arch, n_gqa, n_expert) = (hp.arch.as_str(), hp.n_gqa(), hp.n_expert);
        let falcon = arch == "falcon";
        if arch == "glm5-next"
            && ["attn_q_a", "attn_q_b", "nextn.eh_proj"].iter().any(|p| t.name.contains(p))
            && !matches!(ty, G::F32 | G::BF16 | G::F16)
        {
            return Ok(G::Q8_0);
        }
        if cat == Output || (self.tied_embeddings && cat == TokenEmbd) {
            if let Some(o) = opts.output_tensor_type {
                return Ok(o);
            }
            if falcon || !t.ne[0].is_multiple_of(ty.block_size()) {
                return Ok(G::Q8_0);
            }
            return Ok(if ty != G::Q8_0 { G::Q6_K } else { ty });
        }
        match cat {
            TokenEmbd => {
                if let Some(e) = opts.token_embedding_type {
                    ty = e;
                } else if matches!(ftype, F::TQ1_0 | F::TQ2_0 | F::Q2_0) {
                    ty = G::Q4_K;
                }
            }
            _ if is_attn_v_like(cat) => {
                let i = self.i_attention_wv;
                ty = match ftype {
                    F::Q2_K => {
                        if n_gqa >= 4 {
                            G::Q4_K
                        } else {
                            G::Q3_K
                        }
                    }
                    F::Q2_K_S if n_gqa >= 4 => G::Q4_K,
                    F::Q3_K_M => {
                        if i < 2 {
                            G::Q5_K
                        } else {
                            G::Q4_K
                        }
                    }
                    F::Q3_K_L => G::Q5_K,
                    F::Q4_K_M | F::Q5_K_M if use_more_bits(i as i64, self.n_attention_wv as i64) => G::Q6_K,
                    F::Q4_K_S if i < 4 => G::Q5_K,
                    _ => ty,
                };
                if hp.is_70b && matches!(ty, G::Q3_K | G::Q4_K) {
                    ty = G::Q5_K;
                }
                if n_expert == 8 {
                    ty = G::Q8_0;
                }
                self.i_attention_wv += 1;
            }
            AttnK if n_expert == 8 => ty = G::Q8_0,
            FfnDown => {
                let (i_layer, n_layer) = self.layer_of(self.i_ffn_down, t.name)?;
                match ftype {
                    F::Q2_K => ty = G::Q3_K,
                    F::Q2_K_S if i_layer < n_layer / 8 => ty = G::Q4_K,
                    F::Q3_K_M => {
                        ty = if i_layer < n_layer / 16 {
                            G::Q5_K
                        } else if !falcon || use_more_bits(i_layer, n_layer) {
                            G::Q4_K
                        } else {
                            G::Q3_K
                        }
                    }
                    F::Q3_K_L => ty = if falcon { G::Q4_K } else { G::Q5_K },
                    F::Q4_K_M => {
                        if falcon {
                            ty = if i_layer < n_layer / 16 {
                                G::Q6_K
                            } else if use_more_bits(i_layer, n_layer) {
                                G::Q5_K
                            } else {
                                G::Q4_K
                            };
                        } else if use_more_bits(i_layer, n_layer) {
                            ty = G::Q6_K;
                        }
                    }
                    F::Q5_K_M if use_more_bits(i_layer, n_layer) => ty = G::Q6_K,
                    F::Q4_K_S if !falcon && i_layer < n_layer / 8 => ty = G::Q5_K,
                    F::Q4_0 | F::Q5_0 if opts.has_imatrix && i_layer < n_layer / 8 => {
                        ty = if ftype == F::Q4_0 { G::Q4_1 } else { G::Q5_1 };
                    }
                    _ => {}
                }
                self.i_ffn_down += 1;
            }
            AttnOutput => {
                if !falcon {
                    if n_expert == 8 {
                        if matches!(ftype, F::Q2_K | F::Q3_K_S | F::Q3_K_M | F::Q4_K_S | F::Q4_K_M) {
                            ty = G::Q5_K;
                        }
                    } else {
                        match ftype {
                            F::Q2_K => ty = G::Q3_K,
                            F::Q3_K_M => ty = G::Q4_K,
                            F::Q3_K_L => ty = G::Q5_K,
                            _ => {}
                        }
                    }
                } else if ftype == F::Q3_K_L {
                    ty = G::Q4_K;
                }
            }
            AttnQkv => match ftype {
                F::Q3_K_M | F::Q3_K_L => ty = G::Q4_K,
                F::Q4_K_M => ty = G::Q5_K,
                F::Q5_K_M => ty = G::Q6_K,
                _ => {}
            },
            // Only the IQ3_XS mix changes these; the counters still move (and the layer is
            // still checked) as in llama.cpp.
            FfnGate => {
                self.layer_of(self.i_ffn_gate, t.name)?;
                self.i_ffn_gate += 1;
            }
            FfnUp => {
                self.layer_of(self.i_ffn_up, t.name)?;
                self.i_ffn_up += 1;
            }
            _ => {}
        }
        Ok(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_numbers_follow_sscanf() {
        assert_eq!(block_number("blk.12.attn_v.weight"), Some(12));
        assert_eq!(block_number("blk.3x"), Some(3));
        assert_eq!(block_number("blk.-1.a"), Some(-1));
        assert_eq!(block_number("output.weight"), None);
        assert_eq!(block_number("blk.x"), None);
        let names = ["blk.10.a", "blk.2.b", "output.weight", "blk.2.a", "token_embd.weight"];
        let order: Vec<&str> = llama_order(&names).into_iter().map(|i| names[i]).collect();
        assert_eq!(order, ["output.weight", "token_embd.weight", "blk.2.a", "blk.2.b", "blk.10.a"]);
    }

    #[test]
    fn file_types_parse_like_llama_quantize() {
        assert_eq!(FileType::parse("q4_k").unwrap(), FileType::Q4_K_M);
        assert_eq!(FileType::parse("Q3_K_S").unwrap(), FileType::Q3_K_S);
        assert_eq!(FileType::parse("40").unwrap(), FileType::Q1_0);
        assert!(matches!(FileType::parse("IQ2_XXS"), Err(QuantizeError::UnsupportedFileType(_))));
        assert!(matches!(FileType::parse("Q9_9"), Err(QuantizeError::UnknownFileType(_))));
    }

    #[test]
    fn ffn_down_and_attn_v_get_more_bits_in_the_m_mixes() {
        let hp = Hparams { arch: "llama".into(), n_layer: 8, n_head: 8, n_head_kv: 8, ..Default::default() };
        let opts = Options {
            ftype: FileType::Q4_K_M,
            output_tensor_type: None,
            token_embedding_type: None,
            quantize_output: true,
            pure: false,
            has_imatrix: false,
        };
        let names: Vec<String> = (0..8).map(|i| format!("blk.{i}.ffn_down.weight")).collect();
        let tensors: Vec<TensorDesc> =
            names.iter().map(|n| TensorDesc { name: n, ty: GgmlType::F16, ne: [256, 256, 1, 1] }).collect();
        let types: Vec<GgmlType> = plan(&hp, &opts, &tensors).unwrap().into_iter().map(|c| c.ty).collect();
        use GgmlType::{Q4_K, Q6_K};
        assert_eq!(types, [Q6_K, Q4_K, Q4_K, Q6_K, Q4_K, Q4_K, Q6_K, Q6_K]);
    }
}
