//! Structured output, tool calls and thinking through the chat API: for each template family a
//! required tool call parses and validates, whole and streamed (the streamed fragments make the
//! whole arguments); JSON schemas hold; `<think>` goes to `reasoning_content`. Random-weight
//! models are held to the format by the constraint alone, which is the point.

mod common;

use common::{TestServer, engine_config, start, start_model};
use onebit_server::ServerConfig;
use serde_json::{Value as Json, json};

fn weather_tool() -> Json {
    json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "maxLength": 24},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7}
                },
                "required": ["location", "unit"],
                "additionalProperties": false
            }
        }
    })
}

fn time_tool() -> Json {
    json!({"type": "function", "function": {"name": "get_time", "description": "The time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string", "enum": ["utc", "local"]}},
        "required": ["zone"], "additionalProperties": false}}})
}

fn validate(schema: &Json, instance: &Json) {
    let v = jsonschema::validator_for(schema).expect("a valid schema");
    let errors: Vec<String> = v.iter_errors(instance).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{instance} does not match: {errors:?}");
}

fn tool_request(choice: Json, seed: u64) -> Json {
    json!({
        "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
        "tools": [weather_tool(), time_tool()],
        "tool_choice": choice,
        "temperature": 0.8,
        "seed": seed,
        "max_tokens": 400,
        // A random-weight model would think forever; thinking then calling is covered by the
        // parser's tests.
        "reasoning_effort": "none",
    })
}

/// The streamed tool calls of one choice, assembled from their fragments: (id, name, arguments).
fn streamed_calls(events: &[String]) -> (Vec<(String, String, String)>, Option<String>) {
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut finish = None;
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Json = serde_json::from_str(e).expect("chunks are JSON");
        let Some(choice) = v["choices"].get(0) else { continue };
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
        for tc in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().expect("an index") as usize;
            if i == calls.len() {
                calls.push(Default::default());
            }
            let call = &mut calls[i];
            if let Some(id) = tc["id"].as_str() {
                call.0 = id.to_string();
            }
            if let Some(name) = tc["function"]["name"].as_str() {
                call.1.push_str(name);
            }
            if let Some(args) = tc["function"]["arguments"].as_str() {
                call.2.push_str(args);
            }
        }
    }
    (calls, finish)
}

/// A required call, whole and streamed, on one server: it parses, names a tool, validates,
/// and the stream carries the same call.
async fn required_call_holds(s: &TestServer, family: &str) {
    for seed in [1, 2] {
        let req = tool_request(json!("required"), seed);
        let (st, whole) = s.post("/v1/chat/completions", &req).await;
        assert_eq!(st, 200, "{family}: {whole}");
        let choice = &whole["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{family}: {whole}");
        let calls = choice["message"]["tool_calls"].as_array().expect("tool_calls");
        assert!(!calls.is_empty(), "{family}: {whole}");
        for c in calls {
            assert_eq!(c["type"], "function");
            assert!(c["id"].as_str().is_some_and(|id| !id.is_empty()), "{family}: {c}");
            let name = c["function"]["name"].as_str().expect("a name");
            let args: Json = serde_json::from_str(c["function"]["arguments"].as_str().expect("arguments text"))
                .unwrap_or_else(|e| panic!("{family}: arguments are not JSON ({e}): {c}"));
            let tool = if name == "get_weather" { weather_tool() } else { time_tool() };
            assert_eq!(tool["function"]["name"], name, "{family}: {c}");
            validate(&tool["function"]["parameters"], &args);
        }
        let mut sreq = req.clone();
        sreq["stream"] = json!(true);
        let events = s.stream("/v1/chat/completions", &sreq).await;
        let (streamed, finish) = streamed_calls(&events);
        assert_eq!(finish.as_deref(), Some("tool_calls"), "{family}: {events:?}");
        assert_eq!(streamed.len(), calls.len(), "{family}: {events:?}");
        for (c, (id, name, args)) in calls.iter().zip(&streamed) {
            assert!(!id.is_empty());
            assert_eq!(c["function"]["name"], name.as_str(), "{family}");
            assert_eq!(c["function"]["arguments"], args.as_str(), "{family}: the fragments make the arguments");
        }
    }
}

/// The random-weight Qwen3 fixture that carries Qwen3's own chat template (tools, thinking).
fn qwen3() -> Option<std::path::PathBuf> {
    onebit_testkit::shared_file("models/qwen3-q1_0.gguf")
}

fn template(name: &str) -> Option<String> {
    std::fs::read_to_string(onebit_testkit::shared_file(&format!("templates/{name}"))?).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_tool_calls_parse_in_every_template_family() {
    let Some(model) = qwen3() else { return };
    let families = [
        ("qwen3 (its own template)", None),
        ("qwen2.5 / hermes", template("Qwen-Qwen2.5-7B-Instruct.jinja")),
        ("hermes 3", template("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja")),
        ("llama 3.1", template("meta-llama-Llama-3.1-8B-Instruct.jinja")),
        ("mistral", template("mistralai-Mistral-Nemo-Instruct-2407.jinja")),
    ];
    for (family, tpl) in families {
        let s = start_model(model.clone(), tpl, ServerConfig::default(), engine_config()).await.expect("a server");
        required_call_holds(&s, family).await;
        s.assert_idle_and_clean().await;
    }
    // The generic format: a template that knows no tools (SmolLM2's ChatML).
    if let Some(s) = start(ServerConfig::default(), engine_config()).await {
        required_call_holds(&s, "generic").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_tool_is_the_one_called() {
    let Some(model) = qwen3() else { return };
    let s = start_model(model, None, ServerConfig::default(), engine_config()).await.expect("a server");
    let req = tool_request(json!({"type": "function", "function": {"name": "get_time"}}), 3);
    let (st, b) = s.post("/v1/chat/completions", &req).await;
    assert_eq!(st, 200, "{b}");
    let calls = b["choices"][0]["message"]["tool_calls"].as_array().expect("tool_calls").clone();
    assert!(calls.iter().all(|c| c["function"]["name"] == "get_time"), "{b}");
    // Unknown names and malformed tools are 400s.
    let (st, b) = s
        .post("/v1/chat/completions", &tool_request(json!({"type": "function", "function": {"name": "nope"}}), 1))
        .await;
    assert_eq!(st, 400, "{b}");
    let mut bad = tool_request(json!("auto"), 1);
    bad["tools"][0]["function"]["name"] = json!("has spaces");
    let (st, b) = s.post("/v1/chat/completions", &bad).await;
    assert_eq!(st, 400, "{b}");
    assert!(b["error"]["message"].as_str().unwrap().starts_with("tools[0].function.name"), "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_result_goes_back_through_the_template() {
    let Some(model) = qwen3() else { return };
    let s = start_model(model, None, ServerConfig::default(), engine_config()).await.expect("a server");
    let (_, first) = s.post("/v1/chat/completions", &tool_request(json!("required"), 5)).await;
    let msg = first["choices"][0]["message"].clone();
    let call = &msg["tool_calls"][0];
    let mut req = tool_request(json!("none"), 5);
    req["max_tokens"] = json!(8);
    req["messages"]
        .as_array_mut()
        .unwrap()
        .extend([msg.clone(), json!({"role": "tool", "tool_call_id": call["id"], "content": "{\"temperature\": 21}"})]);
    let (st, b) = s.post("/v1/chat/completions", &req).await;
    assert_eq!(st, 200, "{b}");
    assert!(b["choices"][0]["message"]["tool_calls"].is_null(), "tool_choice none: {b}");
    // The rendered prompt holds the call and its result.
    let (st, t) = s.post("/apply-template", &json!({"messages": req["messages"], "tools": req["tools"]})).await;
    assert_eq!(st, 200, "{t}");
    let prompt = t["prompt"].as_str().unwrap();
    assert!(prompt.contains("get_weather") || prompt.contains("get_time"), "{prompt}");
    assert!(prompt.contains("\"temperature\": 21"), "{prompt}");
}

/// Schemas through `response_format`, whole and streamed, on the real demo model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_format_json_schema_holds() {
    let Some(s) = start(ServerConfig::default(), engine_config()).await else { return };
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    });
    for (i, format) in [
        json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": true}}),
        json!({"type": "json_object"}),
    ]
    .into_iter()
    .enumerate()
    {
        let req = json!({
            "messages": [{"role": "user", "content": "Describe a person as JSON."}],
            "response_format": format, "temperature": 1.0, "seed": 7, "max_tokens": 300,
        });
        let (st, b) = s.post("/v1/chat/completions", &req).await;
        assert_eq!(st, 200, "{b}");
        let text = b["choices"][0]["message"]["content"].as_str().unwrap();
        let v: Json = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        if i == 0 {
            validate(&schema, &v);
        } else {
            assert!(v.is_object(), "{text}");
        }
        let mut sreq = req.clone();
        sreq["stream"] = json!(true);
        let events = s.stream("/v1/chat/completions", &sreq).await;
        let streamed: String = events
            .iter()
            .filter(|e| *e != "[DONE]")
            .filter_map(|e| serde_json::from_str::<Json>(e).ok())
            .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_string))
            .collect();
        assert_eq!(streamed, text, "the stream is the same answer");
    }
    // An invalid schema is a 400 before any work.
    let req = json!({"messages": [{"role": "user", "content": "x"}],
                     "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}});
    let (st, b) = s.post("/v1/chat/completions", &req).await;
    assert_eq!(st, 400, "{b}");
    let (st, b) = s.post("/v1/completions", &json!({"prompt": "x", "grammar": "root ::= undefined-rule"})).await;
    assert_eq!(st, 400, "{b}");
    s.assert_idle_and_clean().await;
}

/// Thinking goes to `reasoning_content`, whole and streamed; a regex makes the random model
/// write a thinking block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_is_kept_apart_from_the_answer() {
    let Some(model) = qwen3() else { return };
    let cases = [
        // Qwen3: the model opens the block itself.
        (None, "<think>\nhmm [a-z]{1,8}\n</think>\n\nok [a-z]{1,8}"),
        // DeepSeek-R1: the prompt opens it (this template closes it again unless
        // `enable_thinking` is set).
        (template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"), "hmm [a-z]{1,8}\n</think>\n\nok [a-z]{1,8}"),
    ];
    for (tpl, regex) in cases {
        let s = start_model(model.clone(), tpl, ServerConfig::default(), engine_config()).await.expect("a server");
        let grammar = format!("%llguidance {{}}\nstart: /{}/", regex.replace('\n', "\\n").replace('/', "\\/"));
        let req = json!({"messages": [{"role": "user", "content": "Hi"}], "grammar": grammar,
                         "chat_template_kwargs": {"enable_thinking": true},
                         "temperature": 1.0, "seed": 3, "max_tokens": 64});
        let (st, b) = s.post("/v1/chat/completions", &req).await;
        assert_eq!(st, 200, "{b}");
        let m = &b["choices"][0]["message"];
        let reasoning = m["reasoning_content"].as_str().unwrap_or_else(|| panic!("no reasoning: {b}"));
        let content = m["content"].as_str().unwrap();
        assert!(reasoning.trim().starts_with("hmm"), "{b}");
        assert!(content.trim().starts_with("ok"), "{b}");
        assert!(!content.contains("think") && !reasoning.contains("think>"), "{b}");
        let mut sreq = req.clone();
        sreq["stream"] = json!(true);
        let events = s.stream("/v1/chat/completions", &sreq).await;
        let (mut r, mut c) = (String::new(), String::new());
        for e in events.iter().filter(|e| *e != "[DONE]") {
            let v: Json = serde_json::from_str(e).unwrap();
            let d = &v["choices"][0]["delta"];
            r.push_str(d["reasoning_content"].as_str().unwrap_or(""));
            c.push_str(d["content"].as_str().unwrap_or(""));
        }
        assert_eq!((r.as_str(), c.as_str()), (reasoning, content), "streamed as whole");
        // --reasoning-format none per request: everything stays in content.
        let mut none = req.clone();
        none["reasoning_format"] = json!("none");
        let (_, b) = s.post("/v1/chat/completions", &none).await;
        assert!(b["choices"][0]["message"]["reasoning_content"].is_null(), "{b}");
        assert!(b["choices"][0]["message"]["content"].as_str().unwrap().contains("</think>"), "{b}");
    }
}
