//! GBNF (llama.cpp's grammar format) to llguidance's Lark: a placeholder until the converter lands.

/// The Lark equivalent of a GBNF grammar, or why there is none.
pub fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let _ = src;
    Err("GBNF grammars are not supported yet".into())
}
