//! Tools and thinking in chat completions: the request's `tools`, `tool_choice`,
//! `parallel_tool_calls`, `reasoning_format` and `reasoning_effort` checked and turned into the
//! prompt's template variables and a constraint, and the model's text turned back into the
//! assistant's message (`reasoning_content`, `content`, `tool_calls`), whole or as streamed
//! deltas, in the model's own chat format (see `onebit_engine::chat_format`).

use std::sync::Arc;

use onebit_engine::Constraint;
use onebit_engine::chat_format::{
    ChatDelta, ChatFormat, OutputParser, ParsedMessage, ReasoningFormat, THINK_CLOSE, ToolChoice, ToolFormat,
};
use onebit_tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use crate::error::ApiError;

/// The chat-only fields about tools and thinking.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ToolFields {
    pub tools: Option<Json>,
    pub tool_choice: Option<Json>,
    pub parallel_tool_calls: Option<bool>,
    /// OpenAI's; `"none"` turns thinking off where the template can.
    pub reasoning_effort: Option<String>,
    /// llama-server's per-request override of `--reasoning-format`.
    pub reasoning_format: Option<String>,
}

/// What a chat request asks about tools and thinking, checked.
pub struct ToolRequest {
    pub tools: Vec<Json>,
    pub choice: ToolChoice,
    pub parallel: bool,
    pub reasoning: ReasoningFormat,
    /// `reasoning_effort: "none"`.
    pub no_thinking: bool,
}

impl ToolFields {
    pub fn check(&self, default_reasoning: ReasoningFormat) -> Result<ToolRequest, ApiError> {
        let tools = match &self.tools {
            None | Some(Json::Null) => Vec::new(),
            Some(Json::Array(list)) => list.clone(),
            Some(_) => {
                return Err(ApiError::field(
                    "tools",
                    "must be a list of {\"type\": \"function\", \"function\": {...}}",
                ));
            }
        };
        for (i, t) in tools.iter().enumerate() {
            check_tool(t, i)?;
        }
        let choice = match &self.tool_choice {
            None | Some(Json::Null) => {
                if tools.is_empty() {
                    ToolChoice::None
                } else {
                    ToolChoice::Auto
                }
            }
            Some(c) => ToolChoice::from_json(c).map_err(|e| ApiError::field("tool_choice", e))?,
        };
        if let ToolChoice::Named(name) = &choice
            && !tools.iter().any(|t| t["function"]["name"] == name.as_str())
        {
            return Err(ApiError::field("tool_choice", format!("names '{name}', which is not one of the tools")));
        }
        if tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
            return Err(ApiError::field("tool_choice", "asks for a tool call, but there are no tools"));
        }
        let reasoning = match self.reasoning_format.as_deref() {
            None => default_reasoning,
            Some(s) => parse_reasoning_format(s).map_err(|e| ApiError::field("reasoning_format", e))?,
        };
        let no_thinking = match self.reasoning_effort.as_deref() {
            None | Some("low" | "medium" | "high" | "minimal") => false,
            Some("none") => true,
            Some(other) => {
                return Err(ApiError::field(
                    "reasoning_effort",
                    format!("must be none, minimal, low, medium or high, not '{other}'"),
                ));
            }
        };
        Ok(ToolRequest { tools, choice, parallel: self.parallel_tool_calls.unwrap_or(true), reasoning, no_thinking })
    }
}

/// `--reasoning-format` and the per-request field: llama-server's names.
pub fn parse_reasoning_format(s: &str) -> Result<ReasoningFormat, String> {
    match s {
        "none" => Ok(ReasoningFormat::None),
        "deepseek" | "deepseek-legacy" | "auto" => Ok(ReasoningFormat::Deepseek),
        other => Err(format!("must be none, deepseek or auto, not '{other}'")),
    }
}

fn check_tool(t: &Json, i: usize) -> Result<(), ApiError> {
    let field = |f: &str| format!("tools[{i}]{f}");
    if t.get("type").and_then(Json::as_str) != Some("function") {
        return Err(ApiError::field(&field(".type"), "must be \"function\""));
    }
    let Some(f) = t.get("function").and_then(Json::as_object) else {
        return Err(ApiError::field(&field(".function"), "must be an object with a \"name\""));
    };
    let name = f.get("name").and_then(Json::as_str).unwrap_or("");
    let valid =
        (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid {
        return Err(ApiError::field(&field(".function.name"), "must be 1 to 64 letters, digits, '_' or '-'"));
    }
    match f.get("parameters") {
        None | Some(Json::Null | Json::Object(_)) => Ok(()),
        Some(_) => Err(ApiError::field(&field(".function.parameters"), "must be a JSON schema object")),
    }
}

impl ToolRequest {
    /// Whether the model is offered tools at all.
    pub fn active(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }

    /// The messages and template variables for the prompt: the tools go to the template
    /// (`tools`), or for a template that knows none, into a system message.
    pub fn prompt_inputs(
        &self,
        format: &ChatFormat,
        messages: Vec<Json>,
        mut kwargs: Map<String, Json>,
    ) -> (Vec<Json>, Map<String, Json>) {
        if self.no_thinking {
            kwargs.entry("enable_thinking").or_insert(Json::Bool(false));
        }
        if !self.active() {
            return (messages, kwargs);
        }
        if format.tool_format() == ToolFormat::Generic {
            (format.messages_with_tools(&messages, &self.tools), kwargs)
        } else {
            kwargs.insert("tools".into(), Json::Array(self.tools.clone()));
            (messages, kwargs)
        }
    }

    /// The constraint that makes a call parse (lazy under `auto`), for the rendered prompt.
    pub fn constraint(
        &self,
        format: &ChatFormat,
        prompt: &str,
        tok: &Tokenizer,
    ) -> Result<Option<Constraint>, ApiError> {
        if !self.active() {
            return Ok(None);
        }
        let opens = format.prompt_opens_thinking(prompt);
        // A prompt that closes the thinking block (thinking turned off) leaves none to allow.
        let closed = format.has_thinking() && prompt.trim_end().ends_with(THINK_CLOSE);
        let unthinking;
        let format = if closed {
            unthinking = ChatFormat::new(format.tool_format(), false);
            &unthinking
        } else {
            format
        };
        format
            .tool_constraint(&self.tools, &self.choice, self.parallel, opens, Some(tok))
            .map_err(|e| ApiError::field("tools", e))
    }
}

/// How the model's text becomes a message, for every choice of one request.
#[derive(Clone)]
pub struct OutputPlan {
    pub format: Arc<ChatFormat>,
    pub reasoning: ReasoningFormat,
    /// The prompt ends inside a thinking block (DeepSeek-R1's template opens it).
    pub opens_thinking: bool,
    pub tools: bool,
}

impl OutputPlan {
    /// A plan when the output needs one: tools offered, or thinking to split off.
    pub fn needed(format: &Arc<ChatFormat>, req: &ToolRequest, prompt: &str) -> Option<OutputPlan> {
        let split_thinking = format.has_thinking() && req.reasoning != ReasoningFormat::None;
        (req.active() || split_thinking).then(|| OutputPlan {
            format: Arc::clone(format),
            reasoning: req.reasoning,
            opens_thinking: format.prompt_opens_thinking(prompt),
            tools: req.active(),
        })
    }

    /// The format's markers that are control tokens of this vocabulary: their text must reach
    /// the parser, though control tokens are otherwise left out of the output.
    pub fn shown_specials(&self, tok: &Tokenizer) -> Vec<u32> {
        let vocab = tok.vocab();
        self.format
            .output_markers()
            .into_iter()
            .filter_map(|m| vocab.id(m))
            .filter(|&id| vocab.is_special(id))
            .collect()
    }

    pub fn parser(&self) -> OutputParser {
        self.format.parser(self.reasoning, self.opens_thinking, self.tools)
    }

    /// The message the whole text makes.
    pub fn message(&self, text: &str) -> ParsedMessage {
        let mut p = self.parser();
        p.push(text);
        p.finish();
        p.message()
    }
}

/// The assistant's message in OpenAI's shape.
pub fn message_json(m: &ParsedMessage) -> Json {
    let content = if m.content.is_empty() && !m.tool_calls.is_empty() { Json::Null } else { json!(m.content) };
    let mut msg = json!({ "role": "assistant", "content": content });
    if let Some(r) = &m.reasoning_content {
        msg["reasoning_content"] = json!(r);
    }
    if !m.tool_calls.is_empty() {
        let calls: Vec<Json> = m
            .tool_calls
            .iter()
            .map(
                |c| json!({ "id": c.id, "type": "function", "function": { "name": c.name, "arguments": c.arguments } }),
            )
            .collect();
        msg["tool_calls"] = Json::Array(calls);
    }
    msg
}

/// A streamed delta in OpenAI's shape: a tool call comes as its opening (id, name, empty
/// arguments) and then its arguments.
pub fn delta_json(d: &ChatDelta) -> Vec<Json> {
    match d {
        ChatDelta::Content(t) => vec![json!({ "content": t })],
        ChatDelta::Reasoning(t) => vec![json!({ "reasoning_content": t })],
        ChatDelta::ToolCall { index, id, name, arguments } => vec![
            json!({ "tool_calls": [{ "index": index, "id": id, "type": "function",
                                     "function": { "name": name, "arguments": "" } }] }),
            json!({ "tool_calls": [{ "index": index, "function": { "arguments": arguments } }] }),
        ],
    }
}

/// OpenAI's `finish_reason` of a message that made tool calls.
pub fn finish_with(calls: bool, finish: &'static str) -> &'static str {
    if calls && finish == "stop" { "tool_calls" } else { finish }
}

/// Assistant messages' `tool_calls[].function.arguments` arrive as JSON text; templates index
/// into them, so they get the parsed object (text that is not JSON stays text).
pub fn parse_call_arguments(message: &mut Map<String, Json>) {
    let Some(Json::Array(calls)) = message.get_mut("tool_calls") else { return };
    for call in calls {
        if let Some(args) = call.get_mut("function").and_then(|f| f.get_mut("arguments"))
            && let Some(parsed) = args.as_str().and_then(|s| serde_json::from_str::<Json>(s).ok())
        {
            *args = parsed;
        }
    }
}
