//! The output parser: the model's text, fed as it is generated, split into reasoning, content
//! and tool calls.
//!
//! It is a small state machine over an unconsumed buffer. Each step either decides a prefix
//! of the buffer (text, a marker, a whole call) or stops because the decision needs more text
//! (a possible marker's start at the end, a call not yet closed), like stop-string handling.
//! A decision never depends on where the chunks were cut, so streaming and whole parsing agree,
//! and [`OutputParser::message`] is assembled from the very deltas that were released.
//!
//! Rules worth knowing:
//! - A call is released only when complete and valid; one that is malformed, or still open at
//!   the end, is released as text (content, or reasoning inside thinking), never as an error.
//! - Tool calls are parsed inside thinking too (a Qwen3 model sometimes calls before `</think>`,
//!   and a lazy grammar's trigger fires there as well); the call is taken out of the reasoning.
//! - Content and reasoning are trimmed at both ends, and whitespace right before a call or a
//!   thinking tag is dropped, so calls and tags leave no stray newlines behind.
//! - The text must include control tokens' text (`[TOOL_CALLS]`, `<|python_tag|>`).

use rand::Rng;
use serde_json::Value as Json;

use super::{ChatFormat, ReasoningFormat, THINK_CLOSE, THINK_OPEN, ToolFormat};

/// Part of the output, released as soon as it is decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChatDelta {
    Content(String),
    Reasoning(String),
    /// A whole call; `arguments` is the compact JSON text of its arguments object.
    ToolCall {
        index: usize,
        id: String,
        name: String,
        arguments: String,
    },
}

/// One tool call of the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// Compact JSON text of the arguments object.
    pub arguments: String,
}

/// The answer so far, assembled from the released deltas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedMessage {
    pub content: String,
    pub reasoning_content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

/// What a marker (or a bare JSON answer) turned out to be.
enum Parsed {
    /// `len` bytes of the buffer make these items.
    Done(Vec<Item>, usize),
    /// Undecided until more text comes.
    Need,
    /// Not a call: the text stays text.
    Invalid,
}

enum Item {
    Call(String, Json),
    Content(String),
}

/// The streaming parser of one response (see the module header).
#[derive(Debug)]
pub struct OutputParser {
    format: ToolFormat,
    /// `<think>` tags are parsed (the template thinks and the reasoning format extracts it).
    think: bool,
    tools: bool,
    in_think: bool,
    buf: String,
    /// Trailing whitespace of the current stretch, released only if text follows.
    pending_ws: String,
    /// A bare JSON answer may still come (Llama 3, generic): no content yet.
    bare_open: bool,
    reasoning: String,
    msg: ParsedMessage,
}

impl OutputParser {
    pub(super) fn new(f: &ChatFormat, reasoning: ReasoningFormat, starts_in_thinking: bool, tools: bool) -> Self {
        let think = f.has_thinking() && reasoning == ReasoningFormat::Deepseek;
        OutputParser {
            format: f.tool_format(),
            think,
            tools,
            in_think: think && starts_in_thinking,
            buf: String::new(),
            pending_ws: String::new(),
            bare_open: tools && matches!(f.tool_format(), ToolFormat::Llama3 | ToolFormat::Generic),
            reasoning: String::new(),
            msg: ParsedMessage::default(),
        }
    }

    /// Feed the next piece of output; returns what is decided now.
    pub fn push(&mut self, text: &str) -> Vec<ChatDelta> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.step(false, &mut out);
        out
    }

    /// End of output: everything held back is decided (an open or malformed call is text).
    pub fn finish(&mut self) -> Vec<ChatDelta> {
        let mut out = Vec::new();
        self.step(true, &mut out);
        self.pending_ws.clear();
        out
    }

    /// The message assembled from every delta released so far.
    pub fn message(&self) -> ParsedMessage {
        let mut m = self.msg.clone();
        m.reasoning_content = (!self.reasoning.is_empty()).then(|| self.reasoning.clone());
        m
    }

    /// The markers that matter in the current state.
    fn markers(&self) -> Vec<&'static str> {
        let mut m = Vec::with_capacity(2);
        if self.think {
            m.push(if self.in_think { THINK_CLOSE } else { THINK_OPEN });
        }
        if self.tools {
            match self.format {
                ToolFormat::Hermes | ToolFormat::QwenXml => m.push("<tool_call>"),
                ToolFormat::Mistral => m.push("[TOOL_CALLS]"),
                ToolFormat::Llama3 => m.push("<|python_tag|>"),
                ToolFormat::Generic => {}
            }
        }
        m
    }

    fn step(&mut self, last: bool, out: &mut Vec<ChatDelta>) {
        loop {
            if self.bare_open && !self.in_think {
                let lead = self.buf.len() - self.buf.trim_start().len();
                if lead == self.buf.len() {
                    // Only whitespace so far: it is dropped whatever follows.
                    self.buf.clear();
                    return;
                }
                if self.buf[lead..].starts_with('{') {
                    match parse_bare(self.format, &self.buf[lead..]) {
                        Parsed::Done(items, len) => {
                            self.emit_items(items, out);
                            self.buf.drain(..lead + len);
                            // Llama 3 may follow a call with another.
                            self.bare_open = self.format == ToolFormat::Llama3 && self.msg.content.is_empty();
                            continue;
                        }
                        Parsed::Need if !last => return,
                        _ => {}
                    }
                }
                // A thinking model may open with `<think>`: the bare answer may come after it.
                let s = &self.buf[lead..];
                if !(self.think && (s.starts_with(THINK_OPEN) || THINK_OPEN.starts_with(s))) {
                    self.bare_open = false;
                }
            }
            let markers = self.markers();
            let found = markers.iter().filter_map(|m| self.buf.find(m).map(|p| (p, *m))).min_by_key(|&(p, _)| p);
            let Some((pos, marker)) = found else {
                let end = if last { self.buf.len() } else { partial_start(&self.buf, &markers) };
                let text: String = self.buf.drain(..end).collect();
                self.emit_text(&text, out);
                if !last && self.bare_open {
                    self.bare_open = self.msg.content.is_empty();
                }
                return;
            };
            let before: String = self.buf.drain(..pos).collect();
            self.emit_text(&before, out);
            if marker == THINK_OPEN || marker == THINK_CLOSE {
                self.buf.drain(..marker.len());
                self.in_think = marker == THINK_OPEN;
                self.pending_ws.clear();
                continue;
            }
            match parse_marked(self.format, marker, &self.buf) {
                Parsed::Done(items, len) => {
                    self.emit_items(items, out);
                    self.buf.drain(..len);
                }
                Parsed::Need if !last => return,
                _ => {
                    // Not a call after all: the marker is text, and the search goes on after it.
                    self.buf.drain(..marker.len());
                    self.emit_text(marker, out);
                }
            }
        }
    }

    fn emit_items(&mut self, items: Vec<Item>, out: &mut Vec<ChatDelta>) {
        for item in items {
            match item {
                Item::Content(s) => self.emit_text(&s, out),
                Item::Call(name, args) => {
                    self.pending_ws.clear();
                    let id = self.new_id();
                    let arguments = serde_json::to_string(&args).unwrap_or_else(|_| "{}".into());
                    let index = self.msg.tool_calls.len();
                    self.msg.tool_calls.push(super::ToolCall {
                        id: id.clone(),
                        name: name.clone(),
                        arguments: arguments.clone(),
                    });
                    out.push(ChatDelta::ToolCall { index, id, name, arguments });
                }
            }
        }
        self.pending_ws.clear();
    }

    /// Release `t` to the current channel: leading whitespace dropped while the channel is
    /// empty, trailing whitespace held until text follows (dropped before a call, a thinking
    /// tag or the end).
    fn emit_text(&mut self, t: &str, out: &mut Vec<ChatDelta>) {
        let empty = if self.in_think { self.reasoning.is_empty() } else { self.msg.content.is_empty() };
        let t = if empty && self.pending_ws.is_empty() { t.trim_start() } else { t };
        let body = t.trim_end().len();
        if body == 0 {
            self.pending_ws.push_str(t);
            return;
        }
        let mut s = std::mem::take(&mut self.pending_ws);
        s.push_str(&t[..body]);
        self.pending_ws.push_str(&t[body..]);
        if self.in_think {
            self.reasoning.push_str(&s);
            out.push(ChatDelta::Reasoning(s));
        } else {
            self.msg.content.push_str(&s);
            out.push(ChatDelta::Content(s));
        }
    }

    /// `call_` + 24 alphanumerics (Mistral: exactly 9, as its template demands), unique here.
    fn new_id(&self) -> String {
        let mut rng = rand::rng();
        loop {
            let n = if self.format == ToolFormat::Mistral { 9 } else { 24 };
            let tail: String = (0..n).map(|_| rng.sample(rand::distr::Alphanumeric) as char).collect();
            let id = if self.format == ToolFormat::Mistral { tail } else { format!("call_{tail}") };
            if self.msg.tool_calls.iter().all(|c| c.id != id) {
                return id;
            }
        }
    }
}

/// Where the tail of `buf` that may still grow into a marker starts (`buf.len()`: none).
fn partial_start(buf: &str, markers: &[&str]) -> usize {
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    for k in (1..longest.min(buf.len() + 1)).rev() {
        let at = buf.len() - k;
        if buf.is_char_boundary(at) && markers.iter().any(|m| m.len() > k && m.starts_with(&buf[at..])) {
            return at;
        }
    }
    buf.len()
}

/// One JSON value at the start of `s`: its value and length, `Need` if `s` ends inside it.
fn json_prefix(s: &str) -> Result<(Json, usize), bool> {
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<Json>();
    match it.next() {
        Some(Ok(v)) => Ok((v, it.byte_offset())),
        Some(Err(e)) if e.is_eof() => Err(true),
        None => Err(true),
        Some(Err(_)) => Err(false),
    }
}

fn need_or_invalid(need: bool) -> Parsed {
    if need { Parsed::Need } else { Parsed::Invalid }
}

/// `lit` at the start of `s`: `Some(true)` present, `Some(false)` impossible, `None` undecided.
fn expect(s: &str, lit: &str) -> Option<bool> {
    if s.starts_with(lit) {
        Some(true)
    } else if lit.starts_with(s) {
        None
    } else {
        Some(false)
    }
}

/// Length of the leading whitespace of `s`.
fn ws(s: &str) -> usize {
    s.len() - s.trim_start().len()
}

/// A call object: `name` and its arguments (`arguments` or `parameters`, an object or a string
/// holding one), optionally `{"type": "function", ...}` or nested under `function`.
fn call_from(v: &Json) -> Option<(String, Json)> {
    let v = v.get("function").filter(|f| f.is_object()).unwrap_or(v);
    let name = v.get("name")?.as_str()?.to_string();
    if name.is_empty() {
        return None;
    }
    let args = match v.get("arguments").or_else(|| v.get("parameters")) {
        None => Json::Object(Default::default()),
        Some(Json::String(s)) => serde_json::from_str::<Json>(s).ok()?,
        Some(a) => a.clone(),
    };
    args.is_object().then_some((name, args))
}

/// The call(s) after `marker` at the start of `s`.
fn parse_marked(format: ToolFormat, marker: &str, s: &str) -> Parsed {
    let at = marker.len();
    let at = at + ws(&s[at..]);
    let rest = &s[at..];
    if rest.is_empty() {
        return Parsed::Need;
    }
    match format {
        ToolFormat::Hermes => {
            let (v, n) = match json_prefix(rest) {
                Ok(x) => x,
                Err(need) => return need_or_invalid(need),
            };
            let Some(call) = call_from(&v) else { return Parsed::Invalid };
            let after = at + n + ws(&rest[n..]);
            match expect(&s[after..], "</tool_call>") {
                Some(true) => Parsed::Done(vec![Item::Call(call.0, call.1)], after + "</tool_call>".len()),
                Some(false) => Parsed::Invalid,
                None => Parsed::Need,
            }
        }
        ToolFormat::Llama3 => {
            if !rest.starts_with('{') {
                return Parsed::Invalid;
            }
            match json_prefix(rest) {
                Ok((v, n)) => match call_from(&v) {
                    Some((name, args)) => Parsed::Done(vec![Item::Call(name, args)], at + n),
                    None => Parsed::Invalid,
                },
                Err(need) => need_or_invalid(need),
            }
        }
        ToolFormat::Mistral => parse_mistral(rest, at),
        ToolFormat::QwenXml => parse_qwen_xml(rest, at),
        ToolFormat::Generic => Parsed::Invalid,
    }
}

/// `[{...}, ...]` or `name[ARGS]{...}` after `[TOOL_CALLS]` (`rest` starts at offset `at`).
fn parse_mistral(rest: &str, at: usize) -> Parsed {
    if rest.starts_with('[') {
        let (v, n) = match json_prefix(rest) {
            Ok(x) => x,
            Err(need) => return need_or_invalid(need),
        };
        let Some(list) = v.as_array() else { return Parsed::Invalid };
        let calls: Option<Vec<Item>> = list.iter().map(|c| call_from(c).map(|(n, a)| Item::Call(n, a))).collect();
        return match calls {
            Some(c) if !c.is_empty() => Parsed::Done(c, at + n),
            _ => Parsed::Invalid,
        };
    }
    let name_len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || "_-.".contains(c))).unwrap_or(rest.len());
    if name_len == 0 {
        return Parsed::Invalid;
    }
    let after = &rest[name_len..];
    match expect(after, "[ARGS]") {
        Some(true) => {}
        Some(false) => return Parsed::Invalid,
        None => return Parsed::Need,
    }
    let body = &after["[ARGS]".len()..];
    match json_prefix(body) {
        Ok((args, n)) if args.is_object() => {
            let len = at + name_len + "[ARGS]".len() + n;
            Parsed::Done(vec![Item::Call(rest[..name_len].to_string(), args)], len)
        }
        Ok(_) => Parsed::Invalid,
        Err(need) => need_or_invalid(need),
    }
}

/// `<function=f>` + `<parameter=p>value</parameter>`… + `</function>` + `</tool_call>`. A
/// value is taken as JSON where it parses as JSON (numbers, booleans, objects), else as a
/// string; the newline the template puts on each side of it is not part of it.
fn parse_qwen_xml(rest: &str, at: usize) -> Parsed {
    let mut pos = 0;
    // `<function=` / `<parameter=` + name + `>`: the name's end, or the decision.
    fn open_tag(s: &str, tag: &str) -> Result<(String, usize), Parsed> {
        match expect(s, tag) {
            Some(true) => {}
            Some(false) => return Err(Parsed::Invalid),
            None => return Err(Parsed::Need),
        }
        let Some(end) = s[tag.len()..].find('>') else {
            return Err(if s.contains('\n') { Parsed::Invalid } else { Parsed::Need });
        };
        let name = &s[tag.len()..tag.len() + end];
        if name.is_empty() || name.contains(['\n', '<']) {
            return Err(Parsed::Invalid);
        }
        Ok((name.to_string(), tag.len() + end + 1))
    }
    let (name, n) = match open_tag(rest, "<function=") {
        Ok(x) => x,
        Err(p) => return p,
    };
    pos += n;
    let mut args = serde_json::Map::new();
    loop {
        pos += ws(&rest[pos..]);
        let s = &rest[pos..];
        if s.is_empty() {
            return Parsed::Need;
        }
        let (param, close) = (expect(s, "<parameter="), expect(s, "</function>"));
        if param == Some(true) {
            let (p, n) = match open_tag(s, "<parameter=") {
                Ok(x) => x,
                Err(r) => return r,
            };
            let Some(end) = s[n..].find("</parameter>") else { return Parsed::Need };
            let raw = &s[n..n + end];
            let raw = raw.strip_prefix('\n').unwrap_or(raw);
            let raw = raw.strip_suffix('\n').unwrap_or(raw);
            let value = serde_json::from_str::<Json>(raw).unwrap_or_else(|_| Json::String(raw.to_string()));
            args.insert(p, value);
            pos += n + end + "</parameter>".len();
            continue;
        }
        match (param, close) {
            (_, Some(true)) => {}
            (None, _) | (_, None) => return Parsed::Need,
            _ => return Parsed::Invalid,
        }
        pos += "</function>".len();
        pos += ws(&rest[pos..]);
        return match expect(&rest[pos..], "</tool_call>") {
            Some(true) => Parsed::Done(vec![Item::Call(name, Json::Object(args))], at + pos + "</tool_call>".len()),
            Some(false) => Parsed::Invalid,
            None => Parsed::Need,
        };
    }
}

/// A bare JSON answer at the start of the output (`s` starts with `{`): a Llama 3 call, or the
/// generic format's object. The first key decides early whether it can be one, so that an
/// ordinary JSON answer is not held back to its end.
fn parse_bare(format: ToolFormat, s: &str) -> Parsed {
    let keys: &[&str] = match format {
        ToolFormat::Llama3 => &["\"name\"", "\"type\"", "\"function\""],
        _ => &["\"tool_call\"", "\"tool_calls\"", "\"response\""],
    };
    let inner = &s[1..];
    let inner = &inner[ws(inner)..];
    if !keys.iter().any(|k| inner.starts_with(k) || k.starts_with(inner)) {
        return Parsed::Invalid;
    }
    let (v, n) = match json_prefix(s) {
        Ok(x) => x,
        Err(need) => return need_or_invalid(need),
    };
    let items = match format {
        ToolFormat::Llama3 => call_from(&v).map(|(name, args)| vec![Item::Call(name, args)]),
        _ => generic_items(&v),
    };
    match items {
        Some(items) => Parsed::Done(items, n),
        None => Parsed::Invalid,
    }
}

/// The generic format's answer: `{"tool_call": c}`, `{"tool_calls": [c, ...]}` or
/// `{"response": "text"}`.
fn generic_items(v: &Json) -> Option<Vec<Item>> {
    let o = v.as_object()?;
    if o.len() != 1 {
        return None;
    }
    if let Some(c) = o.get("tool_call") {
        let (name, args) = call_from(c)?;
        return Some(vec![Item::Call(name, args)]);
    }
    if let Some(list) = o.get("tool_calls").and_then(Json::as_array) {
        let calls: Option<Vec<Item>> = list.iter().map(|c| call_from(c).map(|(n, a)| Item::Call(n, a))).collect();
        return calls.filter(|c| !c.is_empty());
    }
    match o.get("response")? {
        Json::String(s) => Some(vec![Item::Content(s.clone())]),
        other => Some(vec![Item::Content(other.to_string())]),
    }
}
