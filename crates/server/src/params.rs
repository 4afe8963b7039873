//! Request bodies: JSON checked for its content type, parsed with the path of any field of the
//! wrong type, and the generation fields of the OpenAI and llama-server APIs turned into the
//! engine's [`GenerateRequest`], range-checked by the same code as the CLI's flags. Unknown
//! fields are ignored, as OpenAI clients send many.

use axum::http::{HeaderMap, header};
use onebit_engine::{Constraint, GenerateRequest, Grammar, SamplingParams, SpecOverride};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value as Json};

use crate::error::ApiError;

/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: usize = 16;
/// Most alternatives per token (`top_logprobs`), OpenAI's bound.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Parse a JSON body, refusing other content types; a field of the wrong type is named.
pub fn parse_json<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> Result<T, ApiError> {
    let ctype = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = ctype.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if essence != "application/json" && !essence.ends_with("+json") {
        let got = if ctype.is_empty() { "none".to_string() } else { format!("'{ctype}'") };
        return Err(ApiError::bad_request(format!(
            "the body must be JSON, sent with 'Content-Type: application/json' (content type: {got})"
        )));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            ApiError::bad_request(format!("invalid request body: {inner}"))
        } else {
            ApiError::field(&path, inner)
        }
    })?;
    de.end().map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

/// Drafted tokens a request may ask for per step, at most.
const MAX_DRAFT: i64 = 64;

/// The generation fields shared by chat and text completions (OpenAI's names, and
/// llama-server's where OpenAI has none).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct GenFields {
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub n_predict: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<Json>,
    pub logit_bias: Option<Json>,
    pub n: Option<i64>,
    pub logprobs: Option<Json>,
    pub top_logprobs: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub user: Option<String>,
    /// Structured output: OpenAI's `response_format`, llama-server's `json_schema` and `grammar`.
    pub response_format: Option<Json>,
    pub json_schema: Option<Json>,
    pub grammar: Option<String>,
    /// Read by the chat endpoint; the adapter APIs refuse it (see [`GenFields::sampling_only`]).
    pub tools: Option<Json>,
    /// Not served: refused rather than ignored, since a client relying on it would get output
    /// it cannot use.
    pub echo: Option<bool>,
    /// Speculative decoding for this request:
    /// `{"mode": "lookup" | "draft" | "off", "n_max": N, "n_min": N, "p_min": P}`.
    pub speculative: Option<Json>,
    /// llama-server's flat names for the draft bounds and the draft model's `p_min`.
    #[serde(rename = "speculative.n_max")]
    pub speculative_n_max: Option<i64>,
    #[serde(rename = "speculative.n_min")]
    pub speculative_n_min: Option<i64>,
    #[serde(rename = "speculative.p_min")]
    pub speculative_p_min: Option<f64>,
    /// LoRA adapters for this request: `[{"id": N, "scale": S}]` (see `lora.rs`).
    pub lora: Option<Json>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// Logprobs as each API asks for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogprobsStyle {
    /// Chat: `logprobs: true` and `top_logprobs: N`.
    Chat,
    /// Text completions: `logprobs: N`.
    Legacy,
}

/// What a generation request resolves to.
#[derive(Debug)]
pub struct Generation {
    pub request: GenerateRequest,
    /// Choices to generate for each prompt.
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// Whether logprobs were asked for (`request.logprobs` holds how many alternatives).
    pub logprobs: bool,
}

impl GenFields {
    /// Check every field and build the engine's request. `vocab` bounds token ids.
    pub fn generation(&self, style: LogprobsStyle, vocab: usize) -> Result<Generation, ApiError> {
        self.refuse_unsupported()?;
        let d = SamplingParams::default();
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.map_or(d.top_k, |k| k.max(0) as usize),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            repeat_last_n: repeat_last_n(self.repeat_last_n, d.repeat_last_n)?,
            logit_bias: logit_bias(self.logit_bias.as_ref(), vocab)?,
            // llama-server: -1 (or any negative seed) draws a random one.
            seed: self.seed.and_then(|s| u64::try_from(s).ok()),
        };
        sampling.validate()?;
        let max_tokens = self.max_tokens()?;
        let n = match self.n {
            None => 1,
            Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => n as usize,
            Some(n) => return Err(ApiError::field("n", format!("must be between 1 and {MAX_CHOICES}, not {n}"))),
        };
        let (logprobs, top) = self.logprobs(style)?;
        let request = GenerateRequest {
            sampling,
            max_tokens,
            stop: stop_strings(self.stop.as_ref())?,
            logprobs: logprobs.then_some(top),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            cancel: None,
            constraint: self.constraint()?,
            shown_specials: Vec::new(),
            speculative: self.speculative()?,
            lora: crate::lora::request_field(self.lora.as_ref())?,
        };
        Ok(Generation {
            request,
            n,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
            logprobs,
        })
    }

    /// For the adapter APIs (Responses, Messages): keep the sampling fields, drop the chat API's
    /// own names for the limit, `n`, logprobs and stream options (they mean nothing there and
    /// must not contradict the adapter's own), and take `max_tokens` as the limit.
    pub fn sampling_only(mut self, max_tokens: Option<i64>) -> Result<GenFields, ApiError> {
        if self.tools.as_ref().is_some_and(|t| t.as_array().is_none_or(|a| !a.is_empty())) {
            return Err(ApiError::field("tools", "tool calling is served by /v1/chat/completions only"));
        }
        self.max_tokens = max_tokens;
        self.max_completion_tokens = None;
        self.n_predict = None;
        self.n = None;
        self.logprobs = None;
        self.top_logprobs = None;
        self.stream_options = None;
        Ok(self)
    }

    fn refuse_unsupported(&self) -> Result<(), ApiError> {
        if self.echo == Some(true) {
            return Err(ApiError::field("echo", "echoing the prompt is not supported"));
        }
        Ok(())
    }

    /// The request's speculative decoding choices (see [`GenFields::speculative`]).
    fn speculative(&self) -> Result<SpecOverride, ApiError> {
        let count = |field: &str, v: Option<i64>| -> Result<Option<usize>, ApiError> {
            match v {
                None => Ok(None),
                Some(n) if (0..=MAX_DRAFT).contains(&n) => Ok(Some(n as usize)),
                Some(n) => Err(ApiError::field(field, format!("must be between 0 and {MAX_DRAFT}, not {n}"))),
            }
        };
        let mut o = SpecOverride {
            draft_max: count("speculative.n_max", self.speculative_n_max)?,
            draft_min: count("speculative.n_min", self.speculative_n_min)?,
            p_min: self.speculative_p_min.map(|p| p as f32),
            ..SpecOverride::default()
        };
        let Some(spec) = &self.speculative else {
            o.validate()?;
            return Ok(o);
        };
        let Some(obj) = spec.as_object() else {
            return Err(ApiError::field("speculative", "must be an object such as {\"mode\": \"lookup\"}"));
        };
        for (key, v) in obj {
            match key.as_str() {
                "mode" => {
                    let m = v.as_str().ok_or_else(|| ApiError::field("speculative.mode", "must be a string"))?;
                    o.mode = Some(m.parse().map_err(|e: String| ApiError::field("speculative.mode", e))?);
                }
                "n_max" | "n_min" => {
                    let field = format!("speculative.{key}");
                    let n = v.as_i64().ok_or_else(|| ApiError::field(&field, "must be an integer"))?;
                    let n = count(&field, Some(n))?;
                    if key == "n_max" { o.draft_max = n } else { o.draft_min = n }
                }
                "p_min" => {
                    let p = v.as_f64().ok_or_else(|| ApiError::field("speculative.p_min", "must be a number"))?;
                    o.p_min = Some(p as f32);
                }
                other => return Err(ApiError::field("speculative", format!("unknown setting {other:?}"))),
            }
        }
        o.validate()?;
        Ok(o)
    }

    /// The output constraint asked for: `response_format` (OpenAI's JSON mode and JSON schema,
    /// or llama-server's `{"type": "json_object", "schema": ...}`), llama-server's `json_schema`,
    /// or `grammar` (GBNF, or llguidance's Lark when it starts with `%llguidance`). At most one.
    fn constraint(&self) -> Result<Option<Constraint>, ApiError> {
        let mut found: Vec<(&str, Grammar)> = Vec::new();
        if let Some(g) = response_format(self.response_format.as_ref())? {
            found.push(("response_format", g));
        }
        match &self.json_schema {
            None | Some(Json::Null) => {}
            Some(s @ (Json::Object(_) | Json::Bool(_))) => found.push(("json_schema", Grammar::JsonSchema(s.clone()))),
            Some(_) => return Err(ApiError::field("json_schema", "must be a JSON schema object")),
        }
        if let Some(g) = self.grammar.as_deref().filter(|g| !g.trim().is_empty()) {
            found.push(("grammar", Grammar::from_source(g.to_string())));
        }
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop().map(|(_, g)| Constraint::new(g))),
            _ => {
                let names: Vec<&str> = found.iter().map(|(n, _)| *n).collect();
                Err(ApiError::field(names[1], format!("cannot be combined with {}: send one constraint", names[0])))
            }
        }
    }

    /// `max_completion_tokens`, `max_tokens` or llama-server's `n_predict` (-1: no limit).
    fn max_tokens(&self) -> Result<Option<usize>, ApiError> {
        let fields = [
            ("max_completion_tokens", self.max_completion_tokens),
            ("max_tokens", self.max_tokens),
            ("n_predict", self.n_predict),
        ];
        for (name, v) in fields {
            match v {
                None => continue,
                Some(-1) => return Ok(None),
                Some(n) if n >= 0 => return Ok(Some(n as usize)),
                Some(n) => return Err(ApiError::field(name, format!("must be at least 0 (or -1: no limit), not {n}"))),
            }
        }
        Ok(None)
    }

    /// Whether logprobs are wanted, and how many alternatives per token.
    fn logprobs(&self, style: LogprobsStyle) -> Result<(bool, usize), ApiError> {
        let bound = |field: &str, n: i64| {
            if (0..=MAX_TOP_LOGPROBS as i64).contains(&n) {
                Ok(n as usize)
            } else {
                Err(ApiError::field(field, format!("must be between 0 and {MAX_TOP_LOGPROBS}, not {n}")))
            }
        };
        match style {
            LogprobsStyle::Chat => {
                let on = match &self.logprobs {
                    None | Some(Json::Null) => false,
                    Some(Json::Bool(b)) => *b,
                    Some(_) => return Err(ApiError::field("logprobs", "must be true or false")),
                };
                let top = self.top_logprobs.map(|n| bound("top_logprobs", n)).transpose()?.unwrap_or(0);
                if top > 0 && !on {
                    return Err(ApiError::field("top_logprobs", "needs \"logprobs\": true"));
                }
                Ok((on, top))
            }
            LogprobsStyle::Legacy => match &self.logprobs {
                None | Some(Json::Null) => Ok((false, 0)),
                Some(Json::Number(n)) => match n.as_i64() {
                    Some(n) => Ok((true, bound("logprobs", n)?)),
                    None => Err(ApiError::field("logprobs", "must be an integer")),
                },
                Some(_) => Err(ApiError::field("logprobs", "must be an integer (alternatives per token)")),
            },
        }
    }
}

/// OpenAI's `response_format`.
fn response_format(v: Option<&Json>) -> Result<Option<Grammar>, ApiError> {
    let Some(f) = v.filter(|f| !f.is_null()) else { return Ok(None) };
    let field = "response_format";
    let schema_of = |s: &Json, name: &str| match s {
        Json::Object(_) | Json::Bool(_) => Ok(Grammar::JsonSchema(s.clone())),
        _ => Err(ApiError::field(name, "must be a JSON schema object")),
    };
    match f.get("type").and_then(Json::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => match f.get("schema") {
            None | Some(Json::Null) => Ok(Some(Grammar::JsonObject)),
            Some(s) => schema_of(s, "response_format.schema").map(Some),
        },
        Some("json_schema") => {
            let inner = f.get("json_schema").ok_or_else(|| {
                ApiError::field(field, "of type json_schema needs a \"json_schema\": {\"name\", \"schema\"} object")
            })?;
            // OpenAI nests the schema under "schema"; llama-server also took it bare.
            match inner.get("schema") {
                Some(s) => schema_of(s, "response_format.json_schema.schema").map(Some),
                None if inner.get("type").is_some() || inner.get("properties").is_some() => {
                    schema_of(inner, "response_format.json_schema").map(Some)
                }
                None => Err(ApiError::field("response_format.json_schema", "needs a \"schema\"")),
            }
        }
        Some(other) => {
            Err(ApiError::field(field, format!("type must be text, json_object or json_schema, not '{other}'")))
        }
        None => Err(ApiError::field(field, "needs a \"type\"")),
    }
}

fn repeat_last_n(v: Option<i64>, default: usize) -> Result<usize, ApiError> {
    match v {
        None => Ok(default),
        Some(n) if (0..=1 << 20).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::field("repeat_last_n", format!("must be between 0 and 1048576, not {n}"))),
    }
}

/// `stop`: a string or a list of at most 16 strings.
fn stop_strings(v: Option<&Json>) -> Result<Vec<String>, ApiError> {
    let list = match v {
        None | Some(Json::Null) => return Ok(Vec::new()),
        Some(Json::String(s)) => vec![s.clone()],
        Some(Json::Array(items)) => items
            .iter()
            .map(|s| s.as_str().map(str::to_string).ok_or_else(|| ApiError::field("stop", "must hold only strings")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::field("stop", "must be a string or a list of strings")),
    };
    if list.len() > 16 {
        return Err(ApiError::field("stop", format!("may hold at most 16 strings, not {}", list.len())));
    }
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

/// `logit_bias`: OpenAI's `{"token id": bias}`, or llama-server's `[[id, bias], ...]`; a bias of
/// `false` bans the token.
fn logit_bias(v: Option<&Json>, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let pairs: Vec<(Json, &Json)> = match v {
        None | Some(Json::Null) => return Ok(Vec::new()),
        Some(Json::Object(m)) => m.iter().map(|(k, v)| (Json::String(k.clone()), v)).collect(),
        Some(Json::Array(items)) => items
            .iter()
            .map(|p| match p.as_array().map(Vec::as_slice) {
                Some([id, bias]) => Ok((id.clone(), bias)),
                _ => Err(ApiError::field("logit_bias", "entries of the list form must be [token id, bias]")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::field("logit_bias", "must be an object of token ids to biases")),
    };
    pairs
        .into_iter()
        .map(|(id, bias)| {
            let id = match &id {
                Json::String(s) => s.parse::<u64>().ok(),
                Json::Number(n) => n.as_u64(),
                _ => None,
            }
            .filter(|&id| (id as usize) < vocab)
            .ok_or_else(|| {
                ApiError::field("logit_bias", format!("{id} is not a token id of this model (0..{vocab})"))
            })?;
            let bias = match bias {
                Json::Bool(false) => f32::NEG_INFINITY,
                Json::Number(n) => n.as_f64().unwrap_or(f64::NAN) as f32,
                _ => return Err(ApiError::field("logit_bias", "biases must be numbers (or false, to ban a token)")),
            };
            Ok((id as u32, bias))
        })
        .collect()
}

/// Message content as the template wants it: a string; OpenAI's array of parts becomes the
/// concatenation of its text parts.
pub fn normalize_messages(messages: &[Json]) -> Result<Vec<Json>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::field("messages", "must hold at least one message"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let obj = m.as_object().ok_or_else(|| ApiError::field(&format!("messages[{i}]"), "must be an object"))?;
            match obj.get("role") {
                Some(Json::String(_)) => {}
                _ => return Err(ApiError::field(&format!("messages[{i}].role"), "must be a string")),
            }
            let mut out: Map<String, Json> = obj.clone();
            let content = match obj.get("content") {
                None | Some(Json::Null) => Json::String(String::new()),
                Some(Json::String(s)) => Json::String(s.clone()),
                Some(Json::Array(parts)) => Json::String(join_parts(parts, i)?),
                Some(_) => {
                    return Err(ApiError::field(
                        &format!("messages[{i}].content"),
                        "must be a string or a list of parts",
                    ));
                }
            };
            out.insert("content".into(), content);
            crate::chat_output::parse_call_arguments(&mut out);
            Ok(Json::Object(out))
        })
        .collect()
}

fn join_parts(parts: &[Json], i: usize) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, p) in parts.iter().enumerate() {
        let field = || format!("messages[{i}].content[{j}]");
        match (p.get("type").and_then(Json::as_str), p.get("text").and_then(Json::as_str)) {
            (Some("text"), Some(t)) => text.push_str(t),
            (Some("text"), None) => return Err(ApiError::field(&field(), "a text part needs a \"text\" string")),
            (Some(other), _) => {
                return Err(ApiError::field(
                    &field(),
                    format!("parts of type '{other}' are not supported (text only)"),
                ));
            }
            (None, _) => return Err(ApiError::field(&field(), "must be an object with a \"type\"")),
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(v: Json) -> Result<Generation, ApiError> {
        let fields: GenFields = serde_json::from_value(v).unwrap();
        fields.generation(LogprobsStyle::Chat, 1000)
    }

    #[test]
    fn ranges_name_the_field() {
        for (body, field) in [
            (json!({"top_p": 7.0}), "top_p"),
            (json!({"temperature": -1}), "temperature"),
            (json!({"max_tokens": -5}), "max_tokens"),
            (json!({"n": 0}), "n"),
            (json!({"top_logprobs": 3}), "top_logprobs"),
            (json!({"logit_bias": {"99999": 1}}), "logit_bias"),
            (json!({"stop": [1, 2]}), "stop"),
        ] {
            let e = job(body).unwrap_err();
            assert!(e.message.starts_with(field), "{}", e.message);
        }
    }

    #[test]
    fn fields_map_onto_the_request() {
        let g = job(json!({"max_tokens": 9, "temperature": 0, "stop": "x", "seed": 5, "n": 2,
                           "logprobs": true, "top_logprobs": 3, "logit_bias": {"7": false}, "unknown": 1}))
        .unwrap();
        assert_eq!(g.request.max_tokens, Some(9));
        assert_eq!(g.request.stop, vec!["x".to_string()]);
        assert_eq!(g.request.sampling.seed, Some(5));
        assert_eq!(g.request.logprobs, Some(3));
        assert_eq!(g.request.sampling.logit_bias, vec![(7, f32::NEG_INFINITY)]);
        assert_eq!(g.n, 2);
    }

    #[test]
    fn wrong_types_are_named() {
        let h = {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
            h
        };
        let e = parse_json::<GenFields>(&h, br#"{"temperature": "hot"}"#).unwrap_err();
        assert!(e.message.starts_with("temperature:"), "{}", e.message);
        let e = parse_json::<GenFields>(&HeaderMap::new(), b"{}").unwrap_err();
        assert!(e.message.contains("Content-Type"), "{}", e.message);
    }

    #[test]
    fn parts_become_text() {
        let m = normalize_messages(&[
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        ])
        .unwrap();
        assert_eq!(m[0]["content"], "ab");
        assert!(normalize_messages(&[]).is_err());
    }
}
