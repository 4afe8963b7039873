//! Chat templates: `tokenizer.chat_template` rendered with MiniJinja the way Hugging Face
//! transformers renders it with Jinja2 (trim_blocks, lstrip_blocks, loop controls, `tojson`
//! without ASCII escaping, `raise_exception`, `strftime_now`, Python string and dict methods).
//!
//! A model without a template gets ChatML, with a warning.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use serde_json::{Map, Value as Json};

use crate::error::TokenizerError;

/// ChatML, used when a model has no template.
pub const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// What a template is rendered with.
#[derive(Clone, Debug, Default)]
pub struct ChatRequest {
    /// `{"role", "content", "tool_calls"?, "reasoning_content"?, ...}` objects.
    pub messages: Vec<Json>,
    /// Tool definitions, if any.
    pub tools: Option<Vec<Json>>,
    pub add_generation_prompt: bool,
    pub bos_token: String,
    pub eos_token: String,
    /// Any other variables (`enable_thinking`, ...).
    pub extra: Map<String, Json>,
    /// The date `strftime_now` reports (default: today).
    pub today: Option<chrono::NaiveDate>,
}

impl ChatRequest {
    /// Read a request object: `{"messages": [...], "tools": [...], "add_generation_prompt": bool, ...}`.
    /// Keys other than these become template variables (`bos_token`/`eos_token` included).
    pub fn from_json(v: &Json) -> Result<ChatRequest, TokenizerError> {
        let obj = v.as_object().ok_or_else(|| TokenizerError::Template("a request must be a JSON object".into()))?;
        let messages = obj
            .get("messages")
            .and_then(Json::as_array)
            .cloned()
            .ok_or_else(|| TokenizerError::Template("a request needs a \"messages\" array".into()))?;
        let mut req = ChatRequest { messages, ..ChatRequest::default() };
        for (k, v) in obj {
            match k.as_str() {
                "messages" => {}
                "tools" => req.tools = v.as_array().cloned(),
                "add_generation_prompt" => req.add_generation_prompt = v.as_bool().unwrap_or(false),
                "bos_token" => req.bos_token = v.as_str().unwrap_or_default().to_string(),
                "eos_token" => req.eos_token = v.as_str().unwrap_or_default().to_string(),
                _ => {
                    req.extra.insert(k.clone(), v.clone());
                }
            }
        }
        Ok(req)
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    pub fn new(source: &str) -> Result<ChatTemplate, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned("chat", source.to_string()).map_err(|e| TokenizerError::Template(describe(&e)))?;
        Ok(ChatTemplate { env })
    }

    /// The template of a model, or ChatML (with a warning) when it has none.
    pub fn for_model(source: Option<&str>) -> Result<ChatTemplate, TokenizerError> {
        match source {
            Some(s) => ChatTemplate::new(s),
            None => {
                tracing::warn!("the model has no chat template; using ChatML");
                ChatTemplate::new(CHATML)
            }
        }
    }

    /// Render a conversation. A template that raises gives an error carrying its message.
    pub fn render(&self, req: &ChatRequest) -> Result<String, TokenizerError> {
        let today = req.today.unwrap_or_else(|| chrono::Local::now().date_naive());
        let mut ctx = req.extra.clone();
        ctx.insert("messages".into(), Json::Array(req.messages.clone()));
        if let Some(tools) = &req.tools {
            ctx.insert("tools".into(), Json::Array(tools.clone()));
        }
        ctx.insert("add_generation_prompt".into(), Json::Bool(req.add_generation_prompt));
        ctx.insert("bos_token".into(), Json::String(req.bos_token.clone()));
        ctx.insert("eos_token".into(), Json::String(req.eos_token.clone()));
        let mut values: Vec<(String, Value)> = ctx.into_iter().map(|(k, v)| (k, Value::from_serialize(&v))).collect();
        values.push(("strftime_now".into(), Value::from_function(move |fmt: &str| today.format(fmt).to_string())));
        let ctx: Value = values.into_iter().collect();
        let tpl = self.env.get_template("chat").map_err(|e| TokenizerError::Template(describe(&e)))?;
        tpl.render(ctx).map_err(|e| TokenizerError::Template(describe(&e)))
    }
}

/// The message a template raised, or MiniJinja's description of what went wrong.
fn describe(e: &Error) -> String {
    match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(d)) if d.starts_with(RAISED) => d[RAISED.len()..].to_string(),
        _ => {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(inner) = src {
                s.push_str(&format!(": {inner}"));
                src = inner.source();
            }
            s
        }
    }
}

const RAISED: &str = "raised: ";

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, format!("{RAISED}{msg}")))
}

/// Print values as Python's `str()` would: `True`, `False`, `None`.
fn python_formatter(out: &mut minijinja::Output, state: &State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Bool => out.write_str(if value.is_true() { "True" } else { "False" }).map_err(Error::from),
        ValueKind::None => out.write_str("None").map_err(Error::from),
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.max(0) as usize)),
            None => Some(v.as_str().unwrap_or_default().to_string()),
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let parts: Vec<String> = v.try_iter()?.map(|p| p.as_str().unwrap_or_default().to_string()).collect();
            (parts.first().cloned().unwrap_or_default(), parts.get(1).cloned().unwrap_or_default())
        }
        _ => (if indent.is_some() { ",".into() } else { ", ".into() }, ": ".into()),
    };
    let mut out = String::new();
    let fmt = JsonFmt { indent, item_sep, key_sep, sort_keys: sort_keys.unwrap_or(false) };
    fmt.write(&value, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

struct JsonFmt {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonFmt {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, v: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => match v.as_i64() {
                Some(i) if v.is_integer() => out.push_str(&i.to_string()),
                _ => out.push_str(&python_float(f64::try_from(v.clone()).unwrap_or(f64::NAN))),
            },
            ValueKind::String => json_string(v.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container('[', ']', depth, out, items.len(), |i, out| self.write(&items[i], depth + 1, out))?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                self.container('{', '}', depth, out, keys.len(), |i, out| {
                    let k = &keys[i];
                    match k.as_str() {
                        Some(s) => json_string(s, out),
                        None => json_string(&k.to_string(), out),
                    }
                    out.push_str(&self.key_sep);
                    self.write(&v.get_item(k)?, depth + 1, out)
                })?;
            }
            _ => json_string(&v.to_string(), out),
        }
        Ok(())
    }

    fn container(
        &self,
        open: char,
        close: char,
        depth: usize,
        out: &mut String,
        n: usize,
        mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if n == 0 {
            out.push(close);
            return Ok(());
        }
        for i in 0..n {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            self.newline(depth + 1, out);
            item(i, out)?;
        }
        self.newline(depth, out);
        out.push(close);
        Ok(())
    }
}

/// A JSON string as Python writes it with `ensure_ascii=False`.
fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round-trip digits, fixed notation for exponents in
/// -4..16, scientific (`1e-05`, `1e+16`) outside, and always a decimal point or exponent.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').expect("exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    if (-4..16).contains(&exp) {
        let s = format!("{x}");
        if s.contains('.') { s } else { format!("{s}.0") }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python() {
        for (x, want) in [
            (0.1, "0.1"),
            (3.0, "3.0"),
            (1e-5, "1e-05"),
            (1e16, "1e+16"),
            (123456.5, "123456.5"),
            (-2.5e-7, "-2.5e-07"),
        ] {
            assert_eq!(python_float(x), want);
        }
    }

    #[test]
    fn tojson_matches_json_dumps() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}").unwrap();
        let mut req = ChatRequest::default();
        req.extra.insert("x".into(), serde_json::json!({"b": [1, 2.5, "é<>\n"], "a": {}, "c": true, "d": null}));
        let out = t.render(&req).unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, 2.5, \"é<>\\n\"], \"a\": {}, \"c\": true, \"d\": null}|{\n  \"b\": [\n    1,\n    2.5,\n    \"é<>\\n\"\n  ],\n  \"a\": {},\n  \"c\": true,\n  \"d\": null\n}"
        );
    }

    #[test]
    fn raised_messages_come_back() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}").unwrap();
        let e = t.render(&ChatRequest::default()).unwrap_err().to_string();
        assert_eq!(e, "chat template: no system role");
    }
}
