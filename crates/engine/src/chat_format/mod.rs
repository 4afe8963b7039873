//! Chat output formats: how a model writes tool calls and thinking, read from its chat
//! template's source, and the two things the server needs from that:
//!
//! - an [`OutputParser`] that splits the model's output (streamed or whole) into reasoning,
//!   content and tool calls, holding back text that may still become a marker;
//! - the constraint for `tool_choice` ([`ChatFormat::tool_constraint`]): an llguidance Lark
//!   grammar over the format's call syntax, built from each tool's parameter schema.
//!
//! Formats: Hermes/Qwen (`<tool_call>{json}</tool_call>`), Llama 3.x (a bare JSON call or
//! `<|python_tag|>` + JSON), Mistral (`[TOOL_CALLS][...]` and `[TOOL_CALLS]name[ARGS]{...}`),
//! Qwen3-Coder's XML (`<tool_call><function=f><parameter=p>v</parameter></function></tool_call>`),
//! and a generic JSON answer for templates that do not render tools (onebit describes the
//! tools in a system message, [`ChatFormat::messages_with_tools`]). Thinking is
//! `<think>`…`</think>` wherever the template mentions both tags.
//!
//! The detection looks only at the template's text, so every request of one model is treated
//! the same way.

mod grammar;
mod parse;

#[cfg(test)]
mod grammar_tests;
#[cfg(test)]
mod tests;

use serde_json::Value as Json;

pub use parse::{ChatDelta, OutputParser, ParsedMessage, ToolCall};

/// How a model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, repeated (Hermes, Qwen).
    Hermes,
    /// `{"name": "f", "parameters": {...}}` as the whole answer, or after `<|python_tag|>`.
    Llama3,
    /// `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]` or `[TOOL_CALLS]f[ARGS]{...}`.
    Mistral,
    /// Qwen3-Coder: `<tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>`.
    QwenXml,
    /// The template knows no tools: onebit describes them in a system message and the model
    /// answers with one JSON object (`{"tool_call": ...}`, `{"tool_calls": [...]}` or
    /// `{"response": "..."}`).
    Generic,
}

/// Where thinking goes (llama-server's `--reasoning-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Thinking stays in the content, tags included.
    None,
    /// Thinking goes to `reasoning_content`, without its tags.
    #[default]
    Deepseek,
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

impl ToolChoice {
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name": ...}}`.
    pub fn from_json(v: &Json) -> Result<ToolChoice, String> {
        match v {
            Json::String(s) => match s.as_str() {
                "none" => Ok(ToolChoice::None),
                "auto" => Ok(ToolChoice::Auto),
                "required" => Ok(ToolChoice::Required),
                other => Err(format!("tool_choice: unknown value {other:?} (none, auto, required or a function)")),
            },
            Json::Object(o) => {
                if let Some(t) = o.get("type").and_then(Json::as_str)
                    && t != "function"
                {
                    return Err(format!("tool_choice: unknown type {t:?}"));
                }
                // The Responses API puts the name beside the type; Chat Completions nests it.
                let name = o.get("function").and_then(|f| f.get("name")).or_else(|| o.get("name"));
                match name.and_then(Json::as_str) {
                    Some(n) if !n.is_empty() => Ok(ToolChoice::Named(n.to_string())),
                    _ => Err("tool_choice: a function choice needs function.name".into()),
                }
            }
            _ => Err("tool_choice must be a string or an object".into()),
        }
    }
}

/// A model's output conventions, detected from its chat template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatFormat {
    tool_format: ToolFormat,
    thinking: bool,
    /// The template takes a system message (Gemma's refuses one).
    system_role: bool,
}

/// The thinking tags (the only ones in use among the supported templates).
pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

impl ChatFormat {
    /// The format of a template (`None`: no template, so the generic one).
    pub fn detect(template_source: Option<&str>) -> ChatFormat {
        let src = template_source.unwrap_or("");
        let tool_format = if src.contains("<tool_call>") && src.contains("<function=") {
            ToolFormat::QwenXml
        } else if src.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if src.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if src.contains("<|python_tag|>") || (src.contains("<|start_header_id|>") && src.contains("ipython")) {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        };
        let thinking = src.contains(THINK_OPEN) && src.contains(THINK_CLOSE);
        let system_role = !src.contains("System role not supported");
        ChatFormat { tool_format, thinking, system_role }
    }

    /// A format chosen by hand (tests, or a server flag overriding the detection).
    pub fn new(tool_format: ToolFormat, thinking: bool) -> ChatFormat {
        ChatFormat { tool_format, thinking, system_role: true }
    }

    pub fn tool_format(&self) -> ToolFormat {
        self.tool_format
    }

    /// Whether the model may think (`<think>`…`</think>`).
    pub fn has_thinking(&self) -> bool {
        self.thinking
    }

    /// Whether the rendered prompt ends inside thinking (it ends with `<think>`, whitespace
    /// aside: DeepSeek-R1's generation prompt), so the output starts without the open tag.
    pub fn prompt_opens_thinking(&self, rendered_prompt: &str) -> bool {
        self.thinking && rendered_prompt.trim_end().ends_with(THINK_OPEN)
    }

    /// The messages to render. Only the generic format changes them, since its template would
    /// drop what it does not know: the tools and the answer format are described in a system
    /// message (merged into the first one if there is one; into the first user message where
    /// the template refuses system messages), earlier assistant calls become
    /// their JSON answer (`{"tool_calls": [...]}`) and tool results become user messages
    /// (`{"tool_response": {...}}`), as the model was told to expect.
    pub fn messages_with_tools(&self, messages: &[Json], tools: &[Json]) -> Vec<Json> {
        if self.tool_format != ToolFormat::Generic || tools.is_empty() {
            return messages.to_vec();
        }
        let mut out: Vec<Json> = messages.iter().map(generic_history).collect();
        let text = generic_tools_prompt(tools);
        let host = if self.system_role { "system" } else { "user" };
        let at = if self.system_role { Some(0) } else { out.iter().position(|m| m["role"] == "user") };
        match at.and_then(|i| out.get_mut(i)) {
            Some(first) if first.get("role").and_then(Json::as_str) == Some(host) => {
                let merged = match first.get_mut("content") {
                    Some(Json::String(s)) if !s.is_empty() && host == "system" => {
                        Json::String(format!("{s}\n\n{text}"))
                    }
                    Some(Json::String(s)) if !s.is_empty() => Json::String(format!("{text}\n\n{s}")),
                    Some(Json::Array(parts)) => {
                        let mut parts = std::mem::take(parts);
                        let part = serde_json::json!({ "type": "text", "text": text });
                        if host == "system" {
                            parts.push(part)
                        } else {
                            parts.insert(0, part)
                        }
                        Json::Array(parts)
                    }
                    _ => Json::String(text),
                };
                first["content"] = merged;
            }
            _ => out.insert(0, serde_json::json!({ "role": host, "content": text })),
        }
        out
    }

    /// The constraint for `tool_choice`, or none (`none`, or `auto` without tools).
    ///
    /// - `Auto`: lazy. The output is free until the format's opening marker (`<tool_call>`,
    ///   `[TOOL_CALLS]`, `{"name"` for Llama 3); the grammar then describes the call(s) after
    ///   it. The generic format has no marker, so its `Auto` constrains the whole answer to one
    ///   of its JSON shapes (a call or `{"response": ...}`), as llama.cpp does.
    /// - `Required`: the whole output is one call (several with `parallel`). A thinking
    ///   template may think first: an optional `<think>`…`</think>` block, or a required
    ///   `…</think>` when `starts_in_thinking` (the prompt opened it).
    /// - `Named(f)`: as `Required`, calls to `f` only.
    ///
    /// Markers that are control tokens in `tokenizer`'s vocabulary (`[TOOL_CALLS]`,
    /// `<|python_tag|>`) are referenced by id, since their text never matches plain output.
    pub fn tool_constraint(
        &self,
        tools: &[Json],
        choice: &ToolChoice,
        parallel: bool,
        starts_in_thinking: bool,
        tokenizer: Option<&onebit_tokenizer::Tokenizer>,
    ) -> Result<Option<crate::Constraint>, String> {
        let special = |text: &str| {
            let t = tokenizer?;
            let id = t.vocab().id(text)?;
            t.vocab().is_special(id).then_some(id)
        };
        grammar::tool_constraint(self, tools, choice, parallel, starts_in_thinking, &special)
    }

    /// The marker texts the parser looks for in the output. Where one is a control token of
    /// the vocabulary (`[TOOL_CALLS]`, `<|python_tag|>`), the text fed to the parser must
    /// render it, which plain detokenization does not.
    pub fn output_markers(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if self.thinking {
            m.extend([THINK_OPEN, THINK_CLOSE]);
        }
        match self.tool_format {
            ToolFormat::Hermes | ToolFormat::QwenXml => m.extend(["<tool_call>", "</tool_call>"]),
            ToolFormat::Mistral => m.extend(["[TOOL_CALLS]", "[ARGS]"]),
            ToolFormat::Llama3 => m.push("<|python_tag|>"),
            ToolFormat::Generic => {}
        }
        m
    }

    /// A parser for one response. `starts_in_thinking`: the prompt opened thinking (see
    /// [`ChatFormat::prompt_opens_thinking`]). `tools`: whether the request has tools (without,
    /// nothing is parsed as a call).
    pub fn parser(&self, reasoning: ReasoningFormat, starts_in_thinking: bool, tools: bool) -> OutputParser {
        OutputParser::new(self, reasoning, starts_in_thinking, tools)
    }
}

/// The `function` object of an OpenAI tool (`{"type": "function", "function": {...}}`), or
/// the tool itself when it is already bare.
pub(crate) fn tool_function(tool: &Json) -> &Json {
    tool.get("function").unwrap_or(tool)
}

/// One history message as the generic format shows it to the model.
fn generic_history(m: &Json) -> Json {
    let role = m.get("role").and_then(Json::as_str).unwrap_or("");
    let text = |v: Option<&Json>| match v {
        Some(Json::String(s)) => s.clone(),
        Some(Json::Null) | None => String::new(),
        Some(other) => other.to_string(),
    };
    match role {
        "assistant" => {
            let Some(calls) = m.get("tool_calls").and_then(Json::as_array).filter(|c| !c.is_empty()) else {
                return m.clone();
            };
            let calls: Vec<Json> = calls
                .iter()
                .map(|c| {
                    let f = tool_function(c);
                    // OpenAI sends arguments as JSON text; the model wrote an object.
                    let args = match f.get("arguments") {
                        Some(Json::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| Json::String(s.clone())),
                        Some(a) => a.clone(),
                        None => serde_json::json!({}),
                    };
                    serde_json::json!({ "name": f.get("name").cloned().unwrap_or(Json::Null), "arguments": args })
                })
                .collect();
            let answer = serde_json::json!({ "tool_calls": calls }).to_string();
            let content = text(m.get("content"));
            let content = if content.is_empty() { answer } else { format!("{content}\n{answer}") };
            serde_json::json!({ "role": "assistant", "content": content })
        }
        "tool" => {
            let mut resp = serde_json::Map::new();
            for key in ["name", "tool_call_id"] {
                if let Some(v) = m.get(key) {
                    resp.insert(key.into(), v.clone());
                }
            }
            resp.insert("content".into(), Json::String(text(m.get("content"))));
            let content = serde_json::json!({ "tool_response": resp }).to_string();
            serde_json::json!({ "role": "user", "content": content })
        }
        _ => m.clone(),
    }
}

/// The system message text that describes `tools` for the generic format.
pub fn generic_tools_prompt(tools: &[Json]) -> String {
    let list: Vec<Json> = tools.iter().map(|t| tool_function(t).clone()).collect();
    let pretty = serde_json::to_string_pretty(&list).unwrap_or_default();
    format!(
        "You can call the following tools:\n{pretty}\n\n\
         Answer with one JSON object and nothing else:\n\
         - to call a tool: {{\"tool_call\": {{\"name\": <tool name>, \"arguments\": <arguments object>}}}}\n\
         - to call several tools: {{\"tool_calls\": [<call>, ...]}}\n\
         - to answer the user directly: {{\"response\": <your answer as a string>}}"
    )
}
