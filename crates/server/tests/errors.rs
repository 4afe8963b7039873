//! Errors and limits: every error in llama-server's shape with the right status, API keys, a
//! full queue, oversized bodies, 1,000 hostile requests, and clients that go away mid-answer.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{chat, default_server, engine_config, start};
use onebit_engine::SchedulerConfig;
use onebit_server::ServerConfig;
use serde_json::{Value as Json, json};

fn assert_error(status: u16, body: &Json, want_status: u16, kind: &str) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["error"]["code"], want_status, "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(!body["error"]["message"].as_str().unwrap_or("").is_empty(), "{body}");
}

/// A raw request, for what a well-behaved client would not send.
async fn raw(s: &common::TestServer, method: &str, path: &str, ctype: Option<&str>, body: Vec<u8>) -> (u16, Json) {
    let len = body.len();
    let mut req = s.http.request(method.parse().unwrap(), s.url(path)).body(body);
    if let Some(c) = ctype {
        req = req.header("content-type", c);
    }
    let res = req.send().await.unwrap_or_else(|e| panic!("{method} {path} ({len} bytes): {e:?}"));
    let status = res.status().as_u16();
    let text = res.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_400_naming_the_problem() {
    let Some(s) = default_server().await else { return };
    let json_ct = Some("application/json");
    let (st, b) = raw(&s, "POST", "/v1/chat/completions", json_ct, b"{not json".to_vec()).await;
    assert_error(st, &b, 400, "invalid_request_error");
    let (st, b) = raw(&s, "POST", "/v1/chat/completions", Some("text/plain"), br#"{"messages":[]}"#.to_vec()).await;
    assert_error(st, &b, 400, "invalid_request_error");
    assert!(b["error"]["message"].as_str().unwrap().contains("Content-Type"));
    let (st, b) = s.post("/v1/chat/completions", &json!({"messages": []})).await;
    assert_error(st, &b, 400, "invalid_request_error");
    for (field, value) in [
        ("top_p", json!(7)),
        ("temperature", json!("hot")),
        ("max_tokens", json!(-5)),
        ("n", json!(1000)),
        ("seed", json!(1.5)),
        ("presence_penalty", json!(1e300)),
    ] {
        let mut req = chat("Hi", 4);
        req[field] = value;
        let (st, b) = s.post("/v1/chat/completions", &req).await;
        assert_error(st, &b, 400, "invalid_request_error");
        assert!(b["error"]["message"].as_str().unwrap().starts_with(field), "{b}");
    }
    let (st, b) = s.get("/nowhere").await;
    assert_error(st, &b, 404, "not_found_error");
    let (st, b) = s.get("/v1/chat/completions").await;
    assert_eq!(st, 405, "{b}");
    assert_eq!(b["error"]["code"], 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_longer_than_the_context_is_refused_before_any_work() {
    let Some(s) = start(ServerConfig::default(), SchedulerConfig { ctx_size: 64, ..engine_config() }).await else {
        return;
    };
    let (st, b) = s.post("/v1/chat/completions", &chat(&"many words ".repeat(100), 4)).await;
    assert_error(st, &b, 400, "exceed_context_size_error");
    assert_eq!(b["error"]["n_ctx"], 64);
    assert!(b["error"]["n_prompt_tokens"].as_u64().unwrap() > 64);
    let (st, b) = s.post("/v1/completions", &json!({"prompt": "word ".repeat(100)})).await;
    assert_error(st, &b, 400, "exceed_context_size_error");
    assert_eq!(s.server.engine_stats().unwrap().steps, 0, "nothing ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_guard_everything_but_health() {
    let config = ServerConfig { api_keys: vec!["k1".into(), "k2".into()], ..ServerConfig::default() };
    let Some(s) = start(config, engine_config()).await else { return };
    assert_eq!(s.get("/health").await.0, 200);
    let (st, b) = s.get("/v1/models").await;
    assert_error(st, &b, 401, "authentication_error");
    let (st, b) = s.post("/v1/chat/completions", &chat("Hi", 2)).await;
    assert_error(st, &b, 401, "authentication_error");
    let wrong = s.http.get(s.url("/v1/models")).bearer_auth("k3").send().await.unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let bearer = s.http.get(s.url("/v1/models")).bearer_auth("k2").send().await.unwrap();
    assert_eq!(bearer.status().as_u16(), 200);
    let x_key = s.http.get(s.url("/metrics")).header("x-api-key", "k1").send().await.unwrap();
    assert_eq!(x_key.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_503_with_retry_after() {
    let engine = SchedulerConfig { parallel: 1, queue_size: 0, ..engine_config() };
    let Some(s) = start(ServerConfig::default(), engine).await else { return };
    let mut long = chat("Tell me a long story.", 400);
    long["ignore_eos"] = json!(true);
    long["stream"] = json!(true);
    let busy = s.http.post(s.url("/v1/chat/completions")).json(&long).send().await.unwrap();
    assert_eq!(busy.status().as_u16(), 200);
    let res = s.http.post(s.url("/v1/chat/completions")).json(&chat("Hi", 2)).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 503);
    assert_eq!(res.headers()["retry-after"], "1");
    let b: Json = res.json().await.unwrap();
    assert_error(503, &b, 503, "unavailable_error");
    drop(busy);
    s.assert_idle_and_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_get_413() {
    let config = ServerConfig { body_limit: 4096, ..ServerConfig::default() };
    let Some(s) = start(config, engine_config()).await else { return };
    let (st, b) = s.post("/v1/chat/completions", &chat(&"x".repeat(10_000), 2)).await;
    assert_error(st, &b, 413, "invalid_request_error");
    // Without a Content-Length the limit is found while reading; the client still gets the
    // answer (the rest of the body is read and dropped, not reset).
    let addr = s.server.addr();
    let answer = tokio::task::spawn_blocking(move || {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n").unwrap();
        c.write_all(b"Transfer-Encoding: chunked\r\n\r\n").unwrap();
        for _ in 0..64 {
            c.write_all(format!("{:x}\r\n{}\r\n", 8192, "x".repeat(8192)).as_bytes()).unwrap();
        }
        c.write_all(b"0\r\n\r\n").unwrap();
        let mut text = String::new();
        c.read_to_string(&mut text).unwrap();
        text
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("--body-limit"), "{answer}");
}

/// Requests no client should send: each gets a 4xx, and the server goes on serving.
fn hostile_bodies() -> Vec<(&'static str, Option<&'static str>, Vec<u8>)> {
    let chat_path = "/v1/chat/completions";
    let j = Some("application/json");
    let mut out: Vec<(&'static str, Option<&'static str>, Vec<u8>)> = Vec::new();
    let deep = format!("{{\"messages\":{}{}}}", "[".repeat(5000), "]".repeat(5000));
    let fixed: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"null".to_vec(),
        b"[]".to_vec(),
        b"\"messages\"".to_vec(),
        b"{\"messages\": 5}".to_vec(),
        b"{\"messages\": [5]}".to_vec(),
        b"{\"messages\": [{\"role\": 1, \"content\": \"x\"}]}".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": {\"a\": 1}}]}".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}".to_vec(),
        deep.into_bytes(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 1e999}".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 99999999999999999999999}"
            .to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": -0.5}".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"top_k\": \"all\"}".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stop\": {\"x\": 1}}".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logit_bias\": {\"abc\": 1}}".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logit_bias\": {\"1\": 1e9}}".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": -1}".to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"top_logprobs\": 100, \"logprobs\": true}"
            .to_vec(),
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]} trailing".to_vec(),
    ];
    for (i, b) in fixed.into_iter().enumerate() {
        out.push((chat_path, if i == 3 { Some("text/plain") } else { j }, b));
    }
    let text_bodies: Vec<Vec<u8>> = vec![
        b"{\"prompt\": []}".to_vec(),
        b"{\"prompt\": [1, -2]}".to_vec(),
        b"{\"prompt\": [4294967296]}".to_vec(),
        b"{\"prompt\": [999999999]}".to_vec(),
        b"{\"prompt\": \"\"}".to_vec(),
        b"{\"prompt\": {\"a\": 1}}".to_vec(),
        b"{\"prompt\": \"hi\", \"logprobs\": true}".to_vec(),
        b"{\"prompt\": \"hi\", \"logprobs\": 50}".to_vec(),
    ];
    out.extend(text_bodies.into_iter().map(|b| ("/v1/completions", j, b)));
    out.push(("/detokenize", j, b"{\"tokens\": [99999999]}".to_vec()));
    out.push(("/tokenize", j, b"{\"content\": 5}".to_vec()));
    out.push(("/apply-template", j, b"{\"messages\": \"no\"}".to_vec()));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_hostile_requests_each_get_a_4xx() {
    let config = ServerConfig { body_limit: 1 << 20, ..ServerConfig::default() };
    let Some(s) = start(config, engine_config()).await else { return };
    let bodies = hostile_bodies();
    // A slow client that sends half a request and stalls must not hold anyone else up.
    let mut slow = std::net::TcpStream::connect(s.server.addr()).unwrap();
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"mess").unwrap();
    let mut n = 0;
    while n < 1000 {
        for (path, ctype, body) in &bodies {
            let (st, b) = raw(&s, "POST", path, *ctype, body.clone()).await;
            assert!((400..500).contains(&st), "{path} {:?}: {st} {b}", String::from_utf8_lossy(body));
            assert_eq!(b["error"]["code"], st);
            n += 1;
        }
        let huge = vec![b'x'; 2 << 20];
        let (st, _) = raw(&s, "POST", "/v1/chat/completions", Some("application/json"), huge).await;
        assert_eq!(st, 413);
        n += 1;
    }
    let (st, ok) = s.post("/v1/chat/completions", &chat("Still there?", 4)).await;
    assert_eq!(st, 200, "{ok}");
    slow.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
    let _ = slow.read(&mut [0u8; 16]);
    s.assert_idle_and_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_go_away_mid_stream_leave_nothing_behind() {
    let engine = SchedulerConfig { parallel: 8, queue_size: 128, ..engine_config() };
    let Some(s) = start(ServerConfig::default(), engine).await else { return };
    let mut tasks = Vec::new();
    for i in 0..100 {
        let http = s.http.clone();
        let url = s.url("/v1/chat/completions");
        tasks.push(tokio::spawn(async move {
            let mut req = chat(&format!("Story number {i}:"), 500);
            req["stream"] = json!(true);
            req["ignore_eos"] = json!(true);
            let mut res = http.post(url).json(&req).send().await.unwrap();
            assert_eq!(res.status().as_u16(), 200);
            // Read the first chunk or two, then hang up.
            let _ = res.chunk().await;
            if i % 2 == 0 {
                let _ = res.chunk().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.assert_idle_and_clean().await;
    let (_, metrics) = s.get("/metrics").await;
    assert!(metrics.as_str().unwrap().contains("llamacpp:requests_processing 0"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_past_the_timeout_is_408_and_is_cancelled() {
    let config = ServerConfig { timeout: Duration::from_millis(300), ..ServerConfig::default() };
    let Some(s) = start(config, engine_config()).await else { return };
    let mut long = chat("Tell me a long story.", 5000);
    long["ignore_eos"] = json!(true);
    let (st, b) = s.post("/v1/chat/completions", &long).await;
    assert_error(st, &b, 408, "invalid_request_error");
    s.assert_idle_and_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_on_a_whole_answer_cancels_it() {
    let Some(s) = default_server().await else { return };
    let mut long = chat("Tell me a long story.", 5000);
    long["ignore_eos"] = json!(true);
    let body = long.to_string();
    let mut conn = std::net::TcpStream::connect(s.server.addr()).unwrap();
    write!(
        conn,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Wait until it is decoding, then hang up.
    for _ in 0..500 {
        if s.server.engine_stats().unwrap().running == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(conn);
    s.assert_idle_and_clean().await;
}
