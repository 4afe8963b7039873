//! Constrained decoding: what a request's output must look like (a JSON schema, a regular
//! expression, a grammar), compiled by llguidance over a token trie built from the GGUF
//! vocabulary, and applied as a mask on the logits before sampling.

pub mod gbnf;

use serde_json::Value as Json;

/// The language the output must belong to.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid under a schema.
    JsonSchema(Json),
    /// A regular expression over the whole output.
    Regex(String),
    /// llguidance's Lark dialect (which may embed `%json { schema }`).
    Lark(String),
    /// llama.cpp's GBNF, converted to Lark (or refused with the reason).
    Gbnf(String),
}

/// A request's constraint.
#[derive(Clone, Debug, PartialEq)]
pub struct Constraint {
    pub grammar: Grammar,
    /// Lazy constraints: the output is free until the generated text contains this string
    /// (a tool call opening, say); from then on the grammar describes the text after it.
    pub trigger: Option<String>,
}

impl Constraint {
    /// A constraint over the whole output.
    pub fn new(grammar: Grammar) -> Constraint {
        Constraint { grammar, trigger: None }
    }
}
