//! The tool-call constraint: an llguidance Lark grammar over a format's call syntax.
//!
//! Each tool's `parameters` schema is embedded as its own top-level `%json` rule (so its
//! `$ref`s resolve), wrapped in literal text for the name, written the way the templates
//! render calls (`{"name": "f", "arguments": ...}`, `", "` and `": "` separators): a model
//! constrained to its own rendering stays in distribution. The embedded JSON uses the same
//! fixed separators (no free whitespace, which lets a weak model pad forever).

use serde_json::Value as Json;

use super::{ChatFormat, THINK_CLOSE, THINK_OPEN, ToolChoice, ToolFormat, tool_function};
use crate::constraint::{Constraint, Grammar};

/// See [`ChatFormat::tool_constraint`]. `special(text)` is the id of `text` when it is a single
/// control token of the vocabulary.
pub(super) fn tool_constraint(
    f: &ChatFormat,
    tools: &[Json],
    choice: &ToolChoice,
    parallel: bool,
    starts_in_thinking: bool,
    special: &dyn Fn(&str) -> Option<u32>,
) -> Result<Option<Constraint>, String> {
    let wanted = match choice {
        ToolChoice::None => return Ok(None),
        ToolChoice::Auto if tools.is_empty() => return Ok(None),
        ToolChoice::Named(n) => Some(n.as_str()),
        _ => None,
    };
    if tools.is_empty() {
        return Err("tool_choice requires a tool call, but the request has no tools".into());
    }
    let mut fns = Vec::new();
    for t in tools {
        let func = tool_function(t);
        let name = func.get("name").and_then(Json::as_str).filter(|n| !n.is_empty());
        let Some(name) = name else { return Err("a tool has no function name".into()) };
        if wanted.is_some_and(|w| w != name) {
            continue;
        }
        let params = func.get("parameters").cloned().unwrap_or_else(|| serde_json::json!({ "type": "object" }));
        if !params.is_object() {
            return Err(format!("tool {name:?}: parameters must be a JSON schema object"));
        }
        fns.push((name.to_string(), params));
    }
    if fns.is_empty() {
        return Err(format!("tool_choice names {:?}, which is not among the tools", wanted.unwrap_or("")));
    }
    let g = Builder { f, special };
    let lazy = *choice == ToolChoice::Auto && f.tool_format() != ToolFormat::Generic;
    let (src, trigger) = g.grammar(&fns, lazy, *choice == ToolChoice::Auto, parallel, starts_in_thinking);
    Ok(Some(Constraint { grammar: Grammar::Lark(src), trigger }))
}

struct Builder<'a> {
    f: &'a ChatFormat,
    special: &'a dyn Fn(&str) -> Option<u32>,
}

/// A Lark string literal for `s` (JSON's escapes are Lark's).
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// `params` with the template's JSON separators, unless it chose its own `x-guidance`.
fn with_separators(mut params: Json) -> Json {
    if let Some(o) = params.as_object_mut()
        && !o.contains_key("x-guidance")
    {
        o.insert(
            "x-guidance".into(),
            serde_json::json!({ "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": " }),
        );
    }
    params
}

impl Builder<'_> {
    /// A marker: its control token where it is one, else its text.
    fn marker(&self, text: &str) -> String {
        match (self.special)(text) {
            Some(id) => format!("<[{id}]>"),
            None => lit(text),
        }
    }

    /// Grammar source and trigger. `lazy`: the grammar describes the text after the trigger.
    fn grammar(
        &self,
        fns: &[(String, Json)],
        lazy: bool,
        auto: bool,
        parallel: bool,
        starts_in_thinking: bool,
    ) -> (String, Option<String>) {
        let fmt = self.f.tool_format();
        let mut rules = Vec::new();
        // One rule per tool's call, `call: call0 | call1 | ...`.
        let mut alts = Vec::new();
        for (i, (name, params)) in fns.iter().enumerate() {
            let body = match fmt {
                ToolFormat::QwenXml => self.xml_call(i, name, params, &mut rules),
                _ => {
                    rules.push(format!("p{i}: %json {}", with_separators(params.clone())));
                    let key = if fmt == ToolFormat::Llama3 { "parameters" } else { "arguments" };
                    let head = lit(&format!("{{\"name\": {}, \"{key}\": ", lit(name)));
                    // Mistral Nemo may add its own 9-character call id.
                    let id = if fmt == ToolFormat::Mistral { " mistral_id?" } else { "" };
                    format!("{head} p{i}{id} \"}}\"")
                }
            };
            rules.push(format!("call{i}: {body}"));
            alts.push(format!("call{i}"));
        }
        rules.push(format!("call: {}", alts.join(" | ")));
        if fmt == ToolFormat::Mistral {
            rules.push(r#"mistral_id: ", \"id\": " /"[a-zA-Z0-9]{9}"/"#.to_string());
        }
        let more = |sep: &str, item: &str| if parallel { format!("({sep} {item})*") } else { String::new() };
        let (open, close) = ("<tool_call>", "</tool_call>");
        let (start, trigger) = match fmt {
            ToolFormat::Hermes | ToolFormat::QwenXml => {
                let block = format!("{} \"\\n\" call \"\\n\" {}", self.marker(open), lit(close));
                rules.push(format!("block: {block}"));
                if lazy {
                    let tail = format!("\"\\n\" call \"\\n\" {} {}", lit(close), more("\"\\n\"", "block"));
                    (tail, Some(open.to_string()))
                } else {
                    (format!("block {}", more("\"\\n\"", "block")), None)
                }
            }
            ToolFormat::Llama3 => {
                if lazy {
                    // After `{"name"`: the rest of one call (each alternative's name onward).
                    let mut tails = Vec::new();
                    for (i, (name, _)) in fns.iter().enumerate() {
                        tails.push(format!("{} p{i} \"}}\"", lit(&format!(": {}, \"parameters\": ", lit(name)))));
                    }
                    rules.push(format!("first: {}", tails.join(" | ")));
                    (format!("first {}", more("\"\\n\"", "call")), Some("{\"name\"".to_string()))
                } else {
                    (format!("call {}", more("\"\\n\"", "call")), None)
                }
            }
            ToolFormat::Mistral => {
                let list = format!("\"[\" call {} \"]\"", more("\", \"", "call"));
                if lazy {
                    (list, Some("[TOOL_CALLS]".to_string()))
                } else {
                    (format!("{} {list}", self.marker("[TOOL_CALLS]")), None)
                }
            }
            ToolFormat::Generic => {
                let one = "\"{\\\"tool_call\\\": \" call \"}\"".to_string();
                let calls = if parallel {
                    format!("{one} | \"{{\\\"tool_calls\\\": [\" call (\", \" call)* \"]}}\"")
                } else {
                    one
                };
                rules.push(format!("calls: {calls}"));
                if auto {
                    rules.push("response: \"{\\\"response\\\": \" %json {\"type\": \"string\"} \"}\"".into());
                    ("calls | response".to_string(), None)
                } else {
                    ("calls".to_string(), None)
                }
            }
        };
        // A thinking model may think before the call it must make (a lazy grammar starts
        // after the trigger, wherever that came).
        let start = if !self.f.has_thinking() || trigger.is_some() {
            start
        } else {
            // The thinking runs to the first `</think>`: a lazy match, or every token but the
            // closing one where that is a control token.
            match (self.special)(THINK_CLOSE) {
                Some(id) => rules.push(format!("think_body: <[^{id}]>* <[{id}]>")),
                None => rules.push(r"think_body[lazy]: /(?s:.*)<\/think>/".to_string()),
            }
            rules.push(r"WS: /[ \t\n]*/".to_string());
            if starts_in_thinking {
                format!("think_body WS ({start})")
            } else {
                format!("({} think_body WS)? ({start})", self.marker(THINK_OPEN))
            }
        };
        let mut src = format!("start: {start}\n");
        for r in rules {
            src.push_str(&r);
            src.push('\n');
        }
        (src, trigger)
    }

    /// Qwen3-Coder's `<function=f>` + parameters + `</function>`. Parameter values are free
    /// text (the schema's types are not enforced here), in any order, each a declared name.
    fn xml_call(&self, i: usize, name: &str, params: &Json, rules: &mut Vec<String>) -> String {
        let names: Vec<String> = params
            .get("properties")
            .and_then(Json::as_object)
            .map(|p| p.keys().map(|k| lit(k)).collect())
            .unwrap_or_default();
        if !rules.iter().any(|r| r.starts_with("xml_value")) {
            // Lazy: the value ends at the first closing tag.
            rules.push(r"xml_value[lazy]: /(?s:.*)\n<\/parameter>\n/".to_string());
        }
        let params = if names.is_empty() {
            String::new()
        } else {
            rules.push(format!("xparam{i}: \"<parameter=\" ({}) \">\\n\" xml_value", names.join(" | ")));
            format!("xparam{i}*")
        };
        format!("{} {params} \"</function>\"", lit(&format!("<function={name}>\n")))
    }
}
