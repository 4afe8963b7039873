//! Parser and detection tests: realistic outputs of each family, parsed whole and streamed
//! (one character at a time and in random chunks), which must agree exactly.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::{ChatDelta, ChatFormat, ParsedMessage, ReasoningFormat, ToolFormat};

/// What a response comes to, ids aside (they are random).
#[derive(Debug, PartialEq)]
struct Seen {
    content: String,
    reasoning: Option<String>,
    calls: Vec<(String, String)>,
}

fn seen(m: &ParsedMessage) -> Seen {
    Seen {
        content: m.content.clone(),
        reasoning: m.reasoning_content.clone(),
        calls: m.tool_calls.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect(),
    }
}

/// Feed `chunks`, check the deltas add up to the message, return it.
fn feed<'a>(f: &ChatFormat, r: ReasoningFormat, in_think: bool, chunks: impl IntoIterator<Item = &'a str>) -> Seen {
    let mut p = f.parser(r, in_think, true);
    let mut deltas = Vec::new();
    for c in chunks {
        deltas.extend(p.push(c));
    }
    deltas.extend(p.finish());
    let m = p.message();
    let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    for d in deltas {
        match d {
            ChatDelta::Content(s) => content.push_str(&s),
            ChatDelta::Reasoning(s) => reasoning.push_str(&s),
            ChatDelta::ToolCall { index, id, name, arguments } => {
                assert_eq!(index, calls.len());
                calls.push(super::ToolCall { id, name, arguments });
            }
        }
    }
    assert_eq!(content, m.content);
    assert_eq!(reasoning, m.reasoning_content.clone().unwrap_or_default());
    assert_eq!(calls, m.tool_calls);
    seen(&m)
}

/// Parse `text` whole, one character at a time and in random chunks; all three must agree.
fn parse(f: &ChatFormat, r: ReasoningFormat, in_think: bool, text: &str) -> Seen {
    let whole = feed(f, r, in_think, [text]);
    let chars: Vec<String> = text.chars().map(String::from).collect();
    assert_eq!(feed(f, r, in_think, chars.iter().map(String::as_str)), whole, "char by char: {text:?}");
    let mut rng = ChaCha8Rng::seed_from_u64(text.len() as u64);
    for _ in 0..5 {
        let mut chunks = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut n = rng.random_range(1..=12).min(rest.len());
            while !rest.is_char_boundary(n) {
                n += 1;
            }
            chunks.push(&rest[..n]);
            rest = &rest[n..];
        }
        assert_eq!(feed(f, r, in_think, chunks), whole, "random chunks: {text:?}");
    }
    whole
}

fn calls(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(n, a)| (n.to_string(), a.to_string())).collect()
}

fn want(content: &str, reasoning: Option<&str>, c: &[(&str, &str)]) -> Seen {
    Seen { content: content.into(), reasoning: reasoning.map(String::from), calls: calls(c) }
}

const DS: ReasoningFormat = ReasoningFormat::Deepseek;
const WEATHER: &str = r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}"#;
const WEATHER_ARGS: &str = r#"{"city":"Paris","unit":"celsius"}"#;

fn hermes() -> ChatFormat {
    ChatFormat::new(ToolFormat::Hermes, true)
}

#[test]
fn hermes_calls_and_text() {
    let f = hermes();
    let one = format!("<tool_call>\n{WEATHER}\n</tool_call>");
    assert_eq!(parse(&f, DS, false, &one), want("", None, &[("get_weather", WEATHER_ARGS)]));
    let two =
        format!("Let me check both.\n{one}\n<tool_call>\n{{\"name\": \"now\", \"arguments\": {{}}}}\n</tool_call>");
    assert_eq!(
        parse(&f, DS, false, &two),
        want("Let me check both.", None, &[("get_weather", WEATHER_ARGS), ("now", "{}")])
    );
    let after = format!("{one}\nThe call is on its way.");
    assert_eq!(parse(&f, DS, false, &after), want("The call is on its way.", None, &[("get_weather", WEATHER_ARGS)]));
    // Arguments given as a JSON string, whitespace of all kinds, unicode.
    let odd = "<tool_call>{\"name\":\"say\",\"arguments\":\"{\\\"text\\\": \\\"Zürich 東京 🌧\\\"}\"}</tool_call>";
    assert_eq!(parse(&f, DS, false, odd), want("", None, &[("say", r#"{"text":"Zürich 東京 🌧"}"#)]));
    let plain = "No tools needed: 2 < 3 and <b>bold</b>.";
    assert_eq!(parse(&f, DS, false, plain), want(plain, None, &[]));
}

#[test]
fn hermes_malformed_calls_are_content() {
    let f = hermes();
    for bad in [
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {oops}}\n</tool_call>",
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": 3}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_cal",
        "<tool_call>\n{\"name\": \"f\", \"argu",
        "<tool_call>",
        "<tool_ca",
    ] {
        assert_eq!(parse(&f, DS, false, bad), want(bad, None, &[]), "{bad:?}");
    }
    // A broken call then a good one.
    let mixed = format!("<tool_call>\n{{nope}}\n</tool_call>\n<tool_call>\n{WEATHER}\n</tool_call>");
    let got = parse(&f, DS, false, &mixed);
    assert_eq!(got.content, "<tool_call>\n{nope}\n</tool_call>");
    assert_eq!(got.calls, calls(&[("get_weather", WEATHER_ARGS)]));
}

#[test]
fn thinking_explicit_and_prompt_opened() {
    let f = hermes();
    let out = format!(
        "<think>\nThe user wants the weather.\nI'll call the tool.\n</think>\n\n<tool_call>\n{WEATHER}\n</tool_call>"
    );
    let thought = "The user wants the weather.\nI'll call the tool.";
    assert_eq!(parse(&f, DS, false, &out), want("", Some(thought), &[("get_weather", WEATHER_ARGS)]));
    // The prompt ended with `<think>\n`: the output starts inside.
    let opened = "Short thought.\n</think>\n\nHello there!";
    assert_eq!(parse(&f, DS, true, opened), want("Hello there!", Some("Short thought."), &[]));
    // Never closed: it all stays reasoning.
    assert_eq!(parse(&f, DS, true, "Still thinking about <tool"), want("", Some("Still thinking about <tool"), &[]));
    // Qwen3 with thinking off: an empty block in the prompt, plain output.
    assert_eq!(parse(&f, DS, false, "Hi!"), want("Hi!", None, &[]));
    assert_eq!(parse(&f, DS, false, "<think>\n\n</think>\n\nHi!"), want("Hi!", None, &[]));
    // A call inside thinking is still a call; the reasoning goes on around it.
    let inside = format!("<think>\nLet me call.\n<tool_call>\n{WEATHER}\n</tool_call>\nDone.\n</think>\nOK");
    assert_eq!(
        parse(&f, DS, false, &inside),
        want("OK", Some("Let me call.\nDone."), &[("get_weather", WEATHER_ARGS)])
    );
}

#[test]
fn reasoning_format_none_keeps_tags() {
    let f = hermes();
    let out = "<think>\nhmm\n</think>\n\nAnswer.";
    assert_eq!(parse(&f, ReasoningFormat::None, false, out), want(out, None, &[]));
    assert_eq!(
        parse(&f, ReasoningFormat::None, true, "hmm\n</think>\nAnswer."),
        want("hmm\n</think>\nAnswer.", None, &[])
    );
    let call = format!("<think>x</think>\n<tool_call>\n{WEATHER}\n</tool_call>");
    assert_eq!(
        parse(&f, ReasoningFormat::None, false, &call),
        want("<think>x</think>", None, &[("get_weather", WEATHER_ARGS)])
    );
}

#[test]
fn no_tools_means_no_calls() {
    let f = hermes();
    let text = format!("<tool_call>\n{WEATHER}\n</tool_call>");
    let mut p = f.parser(DS, false, false);
    p.push(&text);
    p.finish();
    assert_eq!(seen(&p.message()), want(&text, None, &[]));
}

#[test]
fn llama3_forms() {
    let f = ChatFormat::new(ToolFormat::Llama3, false);
    let args = r#"{"city":"Paris"}"#;
    let bare = r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#;
    assert_eq!(parse(&f, DS, false, bare), want("", None, &[("get_weather", args)]));
    let typed = r#" {"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}"#;
    assert_eq!(parse(&f, DS, false, typed), want("", None, &[("get_weather", args)]));
    let tagged = r#"<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}"#;
    assert_eq!(parse(&f, DS, false, tagged), want("", None, &[("get_weather", args)]));
    let two = format!("{bare}\n{bare}");
    assert_eq!(parse(&f, DS, false, &two).calls.len(), 2);
    // Builtin tools' Python call syntax is returned as content.
    let builtin = "<|python_tag|>brave_search.call(query=\"weather Paris\")";
    assert_eq!(parse(&f, DS, false, builtin), want(builtin, None, &[]));
    // JSON that is not a call is content, and is not held back to its end.
    let answer = "{\"answer\": 42, \"note\": \"not a call\"}";
    assert_eq!(parse(&f, DS, false, answer), want(answer, None, &[]));
    let mut p = f.parser(DS, false, true);
    assert_eq!(p.push("{\"answer\": 4"), vec![ChatDelta::Content("{\"answer\": 4".into())]);
    // Text first: a later JSON object is content.
    let later = format!("Sure. {bare}");
    assert_eq!(parse(&f, DS, false, &later), want(&later, None, &[]));
    assert_eq!(parse(&f, DS, false, "{\"name\": \"f\", \"parameters\": [1]}").calls, vec![]);
}

#[test]
fn mistral_forms_and_ids() {
    let f = ChatFormat::new(ToolFormat::Mistral, false);
    let list = r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}, {"name": "now", "arguments": {}}]"#;
    let got = parse(&f, DS, false, list);
    assert_eq!(got, want("", None, &[("get_weather", r#"{"city":"Paris"}"#), ("now", "{}")]));
    let newer = r#"I'll check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]now[ARGS]{}"#;
    assert_eq!(
        parse(&f, DS, false, newer),
        want("I'll check.", None, &[("get_weather", r#"{"city":"Paris"}"#), ("now", "{}")])
    );
    for bad in
        ["[TOOL_CALLS]", "[TOOL_CALLS][{\"name\": 1}]", "[TOOL_CALLS]f[ARGS]{", "[TOOL_CALLS]f(x)", "[TOOL_CALLS][]"]
    {
        assert_eq!(parse(&f, DS, false, bad), want(bad, None, &[]), "{bad:?}");
    }
    let mut p = f.parser(DS, false, true);
    p.push(list);
    p.finish();
    let m = p.message();
    assert!(m.tool_calls.iter().all(|c| c.id.len() == 9 && c.id.chars().all(|c| c.is_ascii_alphanumeric())));
    assert_ne!(m.tool_calls[0].id, m.tool_calls[1].id);
}

#[test]
fn openai_style_ids() {
    let f = hermes();
    let mut p = f.parser(DS, false, true);
    p.push(&format!("<tool_call>{WEATHER}</tool_call><tool_call>{WEATHER}</tool_call>"));
    p.finish();
    let ids: Vec<String> = p.message().tool_calls.into_iter().map(|c| c.id).collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    for id in ids {
        let tail = id.strip_prefix("call_").expect("call_ prefix");
        assert!(tail.len() == 24 && tail.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
    }
}

#[test]
fn generic_forms() {
    let f = ChatFormat::new(ToolFormat::Generic, false);
    let one = format!("{{\"tool_call\": {WEATHER}}}");
    assert_eq!(parse(&f, DS, false, &one), want("", None, &[("get_weather", WEATHER_ARGS)]));
    let many = format!("{{\"tool_calls\": [{WEATHER}, {{\"name\": \"now\", \"arguments\": {{}}}}]}}");
    assert_eq!(parse(&f, DS, false, &many).calls.len(), 2);
    let resp = "{\"response\": \"Bonjour ! Il fait 20 °C.\"}";
    assert_eq!(parse(&f, DS, false, resp), want("Bonjour ! Il fait 20 °C.", None, &[]));
    for other in ["Plain text answer.", "{\"tool_call\": {\"arguments\": {}}}", "{\"tool_call\": ", "{\"other\": 1}"] {
        assert_eq!(parse(&f, DS, false, other), want(other.trim_end(), None, &[]), "{other:?}");
    }
    // DeepSeek-R1: generic tools, a prompt that opened thinking.
    let r1 = ChatFormat::new(ToolFormat::Generic, true);
    let out = format!("I need the weather tool.\n</think>\n\n{one}");
    assert_eq!(
        parse(&r1, DS, true, &out),
        want("", Some("I need the weather tool."), &[("get_weather", WEATHER_ARGS)])
    );
    let explicit = format!("<think>\nhm\n</think>\n{resp}");
    assert_eq!(parse(&r1, DS, false, &explicit), want("Bonjour ! Il fait 20 °C.", Some("hm"), &[]));
}

#[test]
fn qwen_xml_forms() {
    let f = ChatFormat::new(ToolFormat::QwenXml, false);
    let call = "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"metric\": true}\n</parameter>\n</function>\n</tool_call>";
    let args = r#"{"city":"New York","days":3,"opts":{"metric":true}}"#;
    assert_eq!(parse(&f, DS, false, call), want("Checking.", None, &[("get_weather", args)]));
    let none = "<tool_call>\n<function=now>\n</function>\n</tool_call>";
    assert_eq!(parse(&f, DS, false, none), want("", None, &[("now", "{}")]));
    for bad in [
        "<tool_call>\n<function=f>\n<parameter=x>\n1\n",
        "<tool_call>\n<function=f>\nhello</function></tool_call>",
        "<tool_call>\n<fun",
    ] {
        assert_eq!(parse(&f, DS, false, bad), want(bad.trim_end(), None, &[]), "{bad:?}");
    }
}

/// Random mixes of markers, JSON and text: no panic, and streaming always agrees.
#[test]
fn random_mixes_agree() {
    let parts = [
        "<tool_call>",
        "</tool_call>",
        "<think>",
        "</think>",
        "[TOOL_CALLS]",
        "[ARGS]",
        "<|python_tag|>",
        WEATHER,
        "{",
        "}",
        "\"name\": \"f\"",
        " ",
        "\n",
        "é",
        "東京",
        "<",
        "[",
        "text",
        "{\"tool_call\": ",
        "<function=f>",
        "</function>",
        "<parameter=p>",
        "</parameter>",
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for case in 0..1500 {
        let n = rng.random_range(0..14);
        let text: String = (0..n).map(|_| parts[rng.random_range(0..parts.len())]).collect();
        for fmt in
            [ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral, ToolFormat::QwenXml, ToolFormat::Generic]
        {
            let f = ChatFormat::new(fmt, case % 2 == 0);
            for r in [ReasoningFormat::None, DS] {
                parse(&f, r, case % 3 == 0, &text);
            }
        }
    }
}

#[test]
fn detection_from_templates() {
    let q3 = include_str!("testdata/Qwen-Qwen3-0.6B.jinja");
    let f = ChatFormat::detect(Some(q3));
    assert_eq!((f.tool_format(), f.has_thinking()), (ToolFormat::Hermes, true));
    assert!(!f.prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    assert!(f.prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
    assert_eq!(ChatFormat::detect(None), ChatFormat::new(ToolFormat::Generic, false));
    assert_eq!(f.output_markers(), ["<think>", "</think>", "<tool_call>", "</tool_call>"]);
    assert_eq!(ChatFormat::new(ToolFormat::Mistral, false).output_markers(), ["[TOOL_CALLS]", "[ARGS]"]);
    let Some(dir) = onebit_testkit::shared_file("templates") else { return };
    let cases = [
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ToolFormat::Hermes, false),
        ("Qwen-Qwen2.5-7B-Instruct.jinja", ToolFormat::Hermes, false),
        ("Qwen3-Coder.jinja", ToolFormat::QwenXml, false),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::Llama3, false),
        ("mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolFormat::Mistral, false),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ToolFormat::Generic, true),
        ("HuggingFaceTB-SmolLM3-3B.jinja", ToolFormat::Generic, true),
        ("ibm-granite-granite-3.3-2B-Instruct.jinja", ToolFormat::Generic, true),
        ("google-gemma-2-2b-it.jinja", ToolFormat::Generic, false),
        ("microsoft-Phi-3.5-mini-instruct.jinja", ToolFormat::Generic, false),
    ];
    for (file, tools, thinks) in cases {
        let src = std::fs::read_to_string(dir.join(file)).expect("template");
        let f = ChatFormat::detect(Some(&src));
        assert_eq!((f.tool_format(), f.has_thinking()), (tools, thinks), "{file}");
    }
    // The generic format's messages render with every template that uses it, history included.
    let tools = vec![json!({"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}})];
    let history = [
        json!({"role": "user", "content": "time?"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "now", "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_1", "content": "12:00"}),
    ];
    for (file, tools_fmt, _) in cases {
        if tools_fmt != ToolFormat::Generic {
            continue;
        }
        let src = std::fs::read_to_string(dir.join(file)).expect("template");
        let f = ChatFormat::detect(Some(&src));
        let req = onebit_tokenizer::ChatRequest {
            messages: f.messages_with_tools(&history, &tools),
            add_generation_prompt: true,
            ..Default::default()
        };
        let out = onebit_tokenizer::ChatTemplate::new(&src).and_then(|t| t.render(&req));
        let out = out.unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(out.contains("\"tool_response\"") && out.contains("You can call the following tools"), "{file}");
    }
    let r1 = ChatFormat::detect(std::fs::read_to_string(dir.join(cases[5].0)).ok().as_deref());
    assert!(r1.prompt_opens_thinking("<｜User｜>Hi<｜Assistant｜><think>\n"));
    // The small test "qwen3" model carries SmolLM2's plain ChatML template.
    let gguf = dir.join("../models/qwen3-q8_0.gguf");
    if let Ok(file) = onebit_gguf::GgufFile::open(&gguf) {
        let src = file.metadata().opt_str("tokenizer.chat_template").ok().flatten().map(str::to_string);
        assert_eq!(ChatFormat::detect(src.as_deref()), ChatFormat::new(ToolFormat::Generic, false));
    }
}

#[test]
fn generic_system_message() {
    let tools = vec![json!({"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}})];
    let user = json!({"role": "user", "content": "time?"});
    let g = ChatFormat::new(ToolFormat::Generic, false);
    let out = g.messages_with_tools(std::slice::from_ref(&user), &tools);
    assert_eq!(out.len(), 2);
    assert_eq!(out[0]["role"], "system");
    let text = out[0]["content"].as_str().unwrap_or("");
    assert!(text.contains("\"now\"") && text.contains("tool_call") && text.contains("response"));
    let sys = json!({"role": "system", "content": "Be brief."});
    let out = g.messages_with_tools(&[sys, user.clone()], &tools);
    assert_eq!(out.len(), 2);
    assert!(out[0]["content"].as_str().unwrap_or("").starts_with("Be brief.\n\n"));
    // History: calls become the JSON answer, results a user message.
    let history = [
        user.clone(),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "now", "arguments": "{\"tz\": \"UTC\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_1", "content": "12:00"}),
    ];
    let out = g.messages_with_tools(&history, &tools);
    assert_eq!(out.len(), 4);
    assert_eq!(
        out[2],
        json!({"role": "assistant", "content": "{\"tool_calls\":[{\"name\":\"now\",\"arguments\":{\"tz\":\"UTC\"}}]}"})
    );
    assert_eq!(out[3]["role"], "user");
    assert!(out[3]["content"].as_str().unwrap_or("").contains("\"tool_response\""));
    let parts = json!({"role": "system", "content": [{"type": "text", "text": "Be brief."}]});
    let out = g.messages_with_tools(&[parts], &tools);
    assert_eq!(out[0]["content"].as_array().map(Vec::len), Some(2));
    // Templates that render tools themselves get the messages unchanged.
    let h = ChatFormat::new(ToolFormat::Hermes, false);
    assert_eq!(h.messages_with_tools(std::slice::from_ref(&user), &tools), vec![user.clone()]);
    assert_eq!(g.messages_with_tools(std::slice::from_ref(&user), &[]), vec![user]);
}

proptest::proptest! {
    /// Any text, cut anywhere: no panic, and the stream agrees with the whole.
    #[test]
    fn any_text_streams_like_whole(text in "(<tool_call>|</tool_call>|<think>|</think>|\\[TOOL_CALLS\\]|\\{\"name\": |\\PC){0,40}", seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let fmt = [ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral, ToolFormat::QwenXml, ToolFormat::Generic][rng.random_range(0..5)];
        let f = ChatFormat::new(fmt, rng.random_bool(0.5));
        parse(&f, DS, rng.random_bool(0.3), &text);
    }
}
