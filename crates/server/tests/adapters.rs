//! The API adapters over HTTP against an in-process server on the demo model: OpenAI's
//! Responses API (`/v1/responses`) and Anthropic's Messages API (`/v1/messages`), whole and
//! streamed, their limits, stop reasons, usage and errors.

mod common;

use common::{TestServer, default_server, engine_config};
use onebit_server::ServerConfig;
use serde_json::{Value as Json, json};

/// POST a streaming request; its events as (name, data) in order.
async fn events(s: &TestServer, path: &str, body: &Json) -> Vec<(String, Json)> {
    let res = s.http.post(s.url(path)).json(body).send().await.expect("the request goes through");
    assert_eq!(res.status().as_u16(), 200, "streaming request failed");
    let ctype = res.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ctype.starts_with("text/event-stream"), "{ctype}");
    let text = res.text().await.expect("a body");
    let mut out = Vec::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = Some(n.to_string());
        } else if let Some(d) = line.strip_prefix("data: ") {
            let data = serde_json::from_str(d).unwrap_or_else(|e| panic!("event data is JSON ({e}): {d}"));
            out.push((name.take().expect("every data line follows its event line"), data));
        }
    }
    out
}

fn names(evs: &[(String, Json)]) -> Vec<&str> {
    evs.iter().map(|(n, _)| n.as_str()).collect()
}

/// A 400 whose message names `field` first.
fn assert_names_field(status: u16, body: &Json, field: &str) {
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_else(|| panic!("an error message: {body}"));
    assert!(message.starts_with(field), "expected the message to name {field}: {message}");
}

fn response_request(max_output_tokens: usize) -> Json {
    json!({
        "model": "any",
        "instructions": "You are a helpful assistant.",
        "input": "What is the capital of France?",
        "max_output_tokens": max_output_tokens,
        "temperature": 0,
    })
}

fn response_text(r: &Json) -> &str {
    r["output"][0]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("output text in {r}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_whole_and_streamed_agree() {
    let Some(s) = default_server().await else { return };
    let body = response_request(24);
    let (st, r) = s.post("/v1/responses", &body).await;
    assert_eq!(st, 200, "{r}");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
    assert_eq!(r["object"], "response");
    assert!(r["created_at"].as_u64().unwrap() > 0);
    assert_eq!(r["model"], "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(r["instructions"], "You are a helpful assistant.");
    let item = &r["output"][0];
    assert_eq!(r["output"].as_array().unwrap().len(), 1);
    assert_eq!(item["type"], "message");
    assert_eq!(item["role"], "assistant");
    assert!(item["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(item["content"][0]["type"], "output_text");
    assert_eq!(item["content"][0]["annotations"], json!([]));
    let text = response_text(&r);
    assert!(!text.is_empty());
    let u = &r["usage"];
    let (input, output) = (u["input_tokens"].as_u64().unwrap(), u["output_tokens"].as_u64().unwrap());
    assert!(input > 10 && (1..=24).contains(&output), "{u}");
    assert_eq!(u["total_tokens"].as_u64().unwrap(), input + output);
    assert!(u["input_tokens_details"]["cached_tokens"].is_u64());
    assert_eq!(u["output_tokens_details"]["reasoning_tokens"], 0);
    // The status follows from the count: the limit reached means cut short.
    let expect = if output == 24 { "incomplete" } else { "completed" };
    assert_eq!(r["status"], expect, "{r}");
    assert_eq!(item["status"], expect);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let evs = events(&s, "/v1/responses", &streamed).await;
    let n = names(&evs);
    let head =
        ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"];
    assert_eq!(n[..4], head, "{n:?}");
    let last = if expect == "completed" { "response.completed" } else { "response.incomplete" };
    let tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done", last];
    assert_eq!(n[n.len() - 4..], tail, "{n:?}");
    assert!(n[4..n.len() - 4].iter().all(|e| *e == "response.output_text.delta"), "{n:?}");
    for (i, (name, data)) in evs.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], i, "{data}");
    }
    assert_eq!(evs[0].1["response"]["status"], "in_progress");
    let item_id = evs[2].1["item"]["id"].as_str().unwrap();
    let mut deltas = String::new();
    for (_, d) in &evs[4..evs.len() - 4] {
        assert_eq!(
            (d["item_id"].as_str().unwrap(), &d["output_index"], &d["content_index"]),
            (item_id, &json!(0), &json!(0))
        );
        deltas.push_str(d["delta"].as_str().unwrap());
    }
    // Greedy: the streamed text is the whole answer's, piece by piece.
    assert_eq!(deltas, text);
    assert_eq!(evs[evs.len() - 4].1["text"], text);
    assert_eq!(evs[evs.len() - 3].1["part"]["text"], text);
    let done = &evs[evs.len() - 1].1["response"];
    assert_eq!(done["status"], expect);
    assert_eq!(response_text(done), text);
    assert_eq!(done["usage"]["output_tokens"], output);
    assert_eq!(done["usage"]["input_tokens"], input);
    s.assert_idle_and_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_limit_makes_an_incomplete_response() {
    let Some(s) = default_server().await else { return };
    let (st, r) = s.post("/v1/responses", &response_request(3)).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert_eq!(r["usage"]["output_tokens"], 3);
    assert_eq!(r["max_output_tokens"], 3);

    let mut body = response_request(3);
    body["stream"] = json!(true);
    let evs = events(&s, "/v1/responses", &body).await;
    let (name, last) = evs.last().unwrap();
    assert_eq!(name, "response.incomplete");
    assert_eq!(last["response"]["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(last["response"]["output"][0]["status"], "incomplete");
    s.assert_idle_and_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_message_items_build_the_chat_prompt() {
    let Some(s) = default_server().await else { return };
    // Typed parts, a developer message and an earlier assistant turn mean the same prompt as
    // the chat messages they stand for.
    let input = json!([
        {"role": "developer", "content": "You are a helpful assistant."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Blue.", "annotations": []}]},
        {"role": "user", "content": "Another one?"},
    ]);
    let (st, r) = s.post("/v1/responses", &json!({"input": input, "max_output_tokens": 12, "temperature": 0})).await;
    assert_eq!(st, 200, "{r}");
    let chat = json!({
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one?"},
        ],
        "max_tokens": 12,
        "temperature": 0,
    });
    let (st, c) = s.post("/v1/chat/completions", &chat).await;
    assert_eq!(st, 200, "{c}");
    assert_eq!(response_text(&r), c["choices"][0]["message"]["content"]);
    assert_eq!(r["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_bad_values_name_their_field() {
    let Some(s) = default_server().await else { return };
    let with = |k: &str, v: Json| {
        let mut b = response_request(8);
        b[k] = v;
        b
    };
    for (body, field) in [
        (with("temperature", json!(-1)), "temperature"),
        (with("top_p", json!(3)), "top_p"),
        (with("max_output_tokens", json!(0)), "max_output_tokens"),
        (with("max_output_tokens", json!("many")), "max_output_tokens"),
        (with("input", json!(null)), "input"),
        (with("input", json!([])), "input"),
        (
            with("input", json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])),
            "input[0].content[0]",
        ),
        (with("input", json!([{"type": "function_call_output", "call_id": "c", "output": "{}"}])), "input[0]"),
        (with("input", json!([{"role": "tool", "content": "x"}])), "input[0].role"),
        (with("previous_response_id", json!("resp_1")), "previous_response_id"),
    ] {
        let (st, e) = s.post("/v1/responses", &body).await;
        assert_names_field(st, &e, field);
        assert_eq!(e["error"]["type"], "invalid_request_error");
    }
}

fn message_request(max_tokens: usize) -> Json {
    json!({
        "model": "any",
        "max_tokens": max_tokens,
        "system": "You are a helpful assistant.",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0,
    })
}

fn message_text(m: &Json) -> &str {
    m["content"][0]["text"].as_str().unwrap_or_else(|| panic!("a text block in {m}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_whole_and_streamed_agree() {
    let Some(s) = default_server().await else { return };
    let body = message_request(24);
    let (st, m) = s.post("/v1/messages", &body).await;
    assert_eq!(st, 200, "{m}");
    assert!(m["id"].as_str().unwrap().starts_with("msg_"), "{m}");
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["model"], "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(m["content"][0]["type"], "text");
    let text = message_text(&m);
    assert!(!text.is_empty());
    let u = &m["usage"];
    let output = u["output_tokens"].as_u64().unwrap();
    let input = u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    let expect = if output == 24 { "max_tokens" } else { "end_turn" };
    assert_eq!(m["stop_reason"], expect, "{m}");
    assert_eq!(m["stop_sequence"], Json::Null);
    // count_tokens counts the same prompt.
    let (st, count) = s.post("/v1/messages/count_tokens", &body).await;
    assert_eq!(st, 200, "{count}");
    assert_eq!(count, json!({"input_tokens": input}));

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let evs = events(&s, "/v1/messages", &streamed).await;
    let n = names(&evs);
    assert_eq!(n[..3], ["message_start", "content_block_start", "ping"], "{n:?}");
    assert_eq!(n[n.len() - 3..], ["content_block_stop", "message_delta", "message_stop"], "{n:?}");
    assert!(n[3..n.len() - 3].iter().all(|e| *e == "content_block_delta"), "{n:?}");
    for (name, data) in &evs {
        assert_eq!(data["type"], name.as_str());
    }
    let start = &evs[0].1["message"];
    assert_eq!((&start["content"], &start["stop_reason"]), (&json!([]), &Json::Null));
    assert!(start["id"].as_str().unwrap().starts_with("msg_"));
    let su = &start["usage"];
    assert_eq!(su["input_tokens"].as_u64().unwrap() + su["cache_read_input_tokens"].as_u64().unwrap(), input);
    assert_eq!(su["output_tokens"], 0);
    assert_eq!(evs[1].1["content_block"], json!({"type": "text", "text": ""}));
    let mut deltas = String::new();
    for (_, d) in &evs[3..evs.len() - 3] {
        assert_eq!(d["index"], 0);
        assert_eq!(d["delta"]["type"], "text_delta");
        deltas.push_str(d["delta"]["text"].as_str().unwrap());
    }
    assert_eq!(deltas, text);
    let delta = &evs[evs.len() - 2].1;
    assert_eq!(delta["delta"], json!({"stop_reason": expect, "stop_sequence": null}));
    assert_eq!(delta["usage"]["output_tokens"], output);
    s.assert_idle_and_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_stop_reasons() {
    let Some(s) = default_server().await else { return };
    let (st, m) = s.post("/v1/messages", &message_request(3)).await;
    assert_eq!(st, 200, "{m}");
    assert_eq!(m["stop_reason"], "max_tokens");
    assert_eq!(m["usage"]["output_tokens"], 3);

    // A stop sequence taken from the middle of the greedy answer ends it there.
    let (_, whole) = s.post("/v1/messages", &message_request(24)).await;
    let text = message_text(&whole).to_string();
    let from = text.char_indices().map(|(i, _)| i).find(|&i| i >= 2).expect("a long enough answer");
    let stop: String = text[from..].chars().take(2).collect();
    let mut body = message_request(24);
    body["stop_sequences"] = json!(["never appears in any answer", stop]);
    let (st, m) = s.post("/v1/messages", &body).await;
    assert_eq!(st, 200, "{m}");
    assert_eq!(m["stop_reason"], "stop_sequence", "{m}");
    assert_eq!(m["stop_sequence"], stop.as_str());
    assert_eq!(message_text(&m), &text[..text.find(&stop).unwrap()]);

    body["stream"] = json!(true);
    let evs = events(&s, "/v1/messages", &body).await;
    let delta = &evs[evs.len() - 2].1;
    assert_eq!(delta["delta"], json!({"stop_reason": "stop_sequence", "stop_sequence": stop}));
    s.assert_idle_and_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_content_blocks_and_errors() {
    let Some(s) = default_server().await else { return };
    // Text blocks (and a system prompt as blocks) mean the same prompt as plain strings; thinking
    // blocks sent back are dropped.
    let blocks = json!({
        "max_tokens": 8,
        "temperature": 0,
        "system": [{"type": "text", "text": "You are a helpful "}, {"type": "text", "text": "assistant."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""}, {"type": "text", "text": "Blue."}]},
            {"role": "user", "content": "Another one?"},
        ],
    });
    let plain = json!({
        "max_tokens": 8,
        "temperature": 0,
        "system": "You are a helpful assistant.",
        "messages": [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one?"},
        ],
    });
    let (st, a) = s.post("/v1/messages/count_tokens", &blocks).await;
    assert_eq!(st, 200, "{a}");
    assert_eq!(a, s.post("/v1/messages/count_tokens", &plain).await.1);
    let (st, a) = s.post("/v1/messages", &blocks).await;
    assert_eq!(st, 200, "{a}");
    assert_eq!(message_text(&a), message_text(&s.post("/v1/messages", &plain).await.1));

    let with = |k: &str, v: Json| {
        let mut b = message_request(8);
        b[k] = v;
        b
    };
    for (body, field) in [
        (with("temperature", json!(20)), "temperature"),
        (with("max_tokens", json!(0)), "max_tokens"),
        (with("stop_sequences", json!([1])), "stop_sequences"),
        (with("stop_sequences", json!("x")), "stop_sequences"),
        (with("messages", json!([])), "messages"),
        (
            with("messages", json!([{"role": "user", "content": [{"type": "image", "source": {}}]}])),
            "messages[0].content[0]",
        ),
        (with("system", json!([{"type": "text"}])), "system[0]"),
        (with("system", json!(7)), "system"),
    ] {
        let (st, e) = s.post("/v1/messages", &body).await;
        assert_names_field(st, &e, field);
        // Anthropic's error shape, over llama-server's.
        assert_eq!(e["type"], "error", "{e}");
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert_eq!(e["error"]["code"], 400);
    }
    let mut missing = message_request(8);
    missing.as_object_mut().unwrap().remove("messages");
    let (st, e) = s.post("/v1/messages", &missing).await;
    assert_names_field(st, &e, "messages");

    // Without `max_tokens` the request is served (llama-server's leniency), with a limit.
    let mut no_limit = message_request(8);
    no_limit.as_object_mut().unwrap().remove("max_tokens");
    no_limit["stop_sequences"] = json!(["."]);
    let (st, m) = s.post("/v1/messages", &no_limit).await;
    assert_eq!(st, 200, "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_accept_anthropics_key_header() {
    let config = ServerConfig { api_keys: vec!["sk-test".into()], ..ServerConfig::default() };
    let Some(s) = common::start(config, engine_config()).await else { return };
    let body = message_request(2);
    let res = s.http.post(s.url("/v1/messages")).json(&body).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 401);
    let res = s
        .http
        .post(s.url("/v1/messages"))
        .header("x-api-key", "sk-test")
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
}
