//! Constrained decoding: what a request's output must look like (a JSON schema, a regular
//! expression, a grammar), compiled by llguidance over a token trie built from the GGUF
//! vocabulary, and applied as a mask on the logits before sampling.

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

impl Grammar {
    /// A grammar as users write one (llama.cpp's `grammar` field and `--grammar-file`): GBNF,
    /// or llguidance's Lark when it starts with `%llguidance`.
    pub fn from_source(src: String) -> Grammar {
        if src.trim_start().starts_with("%llguidance") { Grammar::Lark(src) } else { Grammar::Gbnf(src) }
    }
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

pub mod env;
pub mod gbnf;
mod state;

use std::sync::Arc;
use std::time::Instant;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use onebit_tokenizer::Tokenizer;
use toktrie::{InferenceCapabilities, TokEnv};

use crate::EngineError;
pub(crate) use state::{ConstraintState, Progress, apply_mask};

/// The grammar compiler of one model: its token trie and llguidance's parser factory. Built
/// once per [`crate::Engine`] (a large vocabulary takes a while) and shared by every request.
pub struct Guidance {
    factory: ParserFactory,
}

impl std::fmt::Debug for Guidance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Guidance({} tokens)", self.factory.tok_env().tok_trie().vocab_size())
    }
}

impl Guidance {
    /// The trie of `tokenizer`'s vocabulary (`n_vocab` long: the model's logits) and a factory
    /// over it.
    pub fn new(tokenizer: Arc<Tokenizer>, n_vocab: usize) -> Result<Guidance, String> {
        let t = Instant::now();
        let env: TokEnv = Arc::new(env::OnebitTokEnv::new(tokenizer, n_vocab)?);
        // Forced tokens are spliced in by the scheduler; nothing else (no backtracking, no
        // forking) is.
        let caps = InferenceCapabilities { ff_tokens: true, ..InferenceCapabilities::default() };
        let slices = llguidance::earley::SlicedBiasComputer::general_slices();
        let mut factory = ParserFactory::new(&env, caps, &slices).map_err(|e| e.to_string())?;
        // llguidance's own logging goes to stderr; its errors reach the caller as values.
        factory.quiet();
        tracing::debug!(secs = t.elapsed().as_secs_f64(), "grammar token trie built");
        Ok(Guidance { factory })
    }

    /// The token environment (trie and tokenizer) grammars compile against.
    pub fn tok_env(&self) -> &TokEnv {
        self.factory.tok_env()
    }

    /// A fresh matcher for `c`, or llguidance's reason for refusing it.
    pub fn matcher(&self, c: &Constraint) -> Result<Matcher, EngineError> {
        let grammar = top_level(&c.grammar)?;
        let parser = self.factory.create_parser(grammar).map_err(|e| EngineError::Grammar(e.to_string()))?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(EngineError::Grammar(e));
        }
        Ok(m)
    }
}

/// llguidance's grammar for `g`. JSON is compact (no whitespace between tokens unless the schema
/// asks otherwise through `x-guidance`): free whitespace lets a weak model pad forever.
fn top_level(g: &Grammar) -> Result<TopLevelGrammar, EngineError> {
    Ok(match g {
        Grammar::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({ "type": "object" }))),
        Grammar::JsonSchema(schema) => {
            if !schema.is_object() && !schema.is_boolean() {
                return Err(EngineError::Grammar("a JSON schema must be an object or a boolean".into()));
            }
            TopLevelGrammar::from_json_schema(compact(schema.clone()))
        }
        Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
        Grammar::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
        Grammar::Gbnf(src) => TopLevelGrammar::from_lark(gbnf::gbnf_to_lark(src).map_err(EngineError::Grammar)?),
    })
}

/// `schema` with compact separators unless it chose its own `x-guidance` options.
fn compact(mut schema: Json) -> Json {
    if let Some(obj) = schema.as_object_mut() {
        let opts = obj.entry("x-guidance").or_insert_with(|| serde_json::json!({}));
        if let Some(opts) = opts.as_object_mut() {
            opts.entry("whitespace_flexible").or_insert(Json::Bool(false));
        }
    } else if schema == Json::Bool(true) {
        // `true` accepts anything; spelled as an object it can carry the options.
        return compact(serde_json::json!({}));
    }
    schema
}
