//! The server's endpoints, answers and errors, over HTTP against an in-process server on the
//! demo model.

mod common;

use std::time::Duration;

use common::{chat, default_server, engine_config};
use onebit_server::ServerConfig;
use serde_json::{Value as Json, json};

fn parse(chunks: &[String]) -> Vec<Json> {
    chunks.iter().filter(|c| *c != "[DONE]").map(|c| serde_json::from_str(c).expect("chunk JSON")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_endpoints_answer_in_llama_servers_shapes() {
    let Some(s) = default_server().await else { return };
    assert_eq!(s.get("/health").await, (200, json!({"status": "ok"})));
    let (st, models) = s.get("/v1/models").await;
    assert_eq!(st, 200);
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_eq!(s.get("/models").await.1, models);
    let (st, props) = s.get("/props").await;
    assert_eq!(st, 200);
    assert_eq!(props["total_slots"], 4);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 1024);
    assert!(props["chat_template"].as_str().unwrap().contains("im_start"));
    let (st, slots) = s.get("/slots").await;
    assert_eq!(st, 200);
    assert_eq!(slots.as_array().unwrap().len(), 4);
    assert_eq!(slots[0]["is_processing"], false);

    let (st, _) = s.post("/v1/chat/completions", &chat("Hello", 4)).await;
    assert_eq!(st, 200);
    let (st, metrics) = s.get("/metrics").await;
    assert_eq!(st, 200);
    let text = metrics.as_str().expect("Prometheus text");
    for name in [
        "llamacpp:prompt_tokens_total",
        "llamacpp:prompt_seconds_total",
        "llamacpp:tokens_predicted_total",
        "llamacpp:tokens_predicted_seconds_total",
        "llamacpp:n_decode_total",
        "llamacpp:n_busy_slots_per_decode",
        "llamacpp:prompt_tokens_seconds",
        "llamacpp:predicted_tokens_seconds",
        "llamacpp:kv_cache_usage_ratio",
        "llamacpp:kv_cache_tokens",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "onebit:time_to_first_token_seconds_bucket",
        "onebit:time_per_output_token_seconds_bucket",
        "onebit:request_queue_time_seconds_bucket",
        "onebit:e2e_request_latency_seconds_bucket",
        "onebit:prefix_cache_hit_ratio",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }
    assert!(text.contains("llamacpp:tokens_predicted_total 4"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_says_loading_until_the_model_is_ready() {
    let Some(path) = onebit_testkit::demo_model() else { return };
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let config = ServerConfig { port: 0, ..ServerConfig::default() };
    let server = onebit_server::start(config, move || {
        wait.recv().map_err(|e| e.to_string())?;
        let model = onebit_model::Model::load(&path, &Default::default()).map_err(|e| e.to_string())?;
        let engine = std::sync::Arc::new(onebit_engine::Engine::new(model).map_err(|e| e.to_string())?);
        let pool = onebit_kernels::Pool::new(2);
        let scheduler = onebit_engine::Scheduler::start(std::sync::Arc::clone(&engine), pool, engine_config())
            .map_err(|e| e.to_string())?;
        Ok(onebit_server::Loaded { engine, scheduler, model_path: path.display().to_string() })
    })
    .await
    .unwrap();
    let url = format!("http://{}/health", server.addr());
    let res = reqwest::get(&url).await.unwrap();
    assert_eq!(res.status().as_u16(), 503);
    let body: Json = res.json().await.unwrap();
    assert_eq!(body, json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}));
    go.send(()).unwrap();
    for _ in 0..600 {
        if reqwest::get(&url).await.unwrap().status().as_u16() == 200 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never became ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_and_whole_greedy_answers_agree() {
    let Some(s) = default_server().await else { return };
    let mut req = chat("Write a haiku about the sea.", 24);
    let (st, whole) = s.post("/v1/chat/completions", &req).await;
    assert_eq!(st, 200, "{whole}");
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    let usage = &whole["usage"];
    let generated = usage["completion_tokens"].as_u64().unwrap();
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), usage["prompt_tokens"].as_u64().unwrap() + generated);
    assert!(whole["timings"]["predicted_n"].as_u64().unwrap() == generated);

    req["stream"] = json!(true);
    req["stream_options"] = json!({"include_usage": true});
    let chunks = s.stream("/v1/chat/completions", &req).await;
    assert_eq!(chunks.last().map(String::as_str), Some("[DONE]"));
    let chunks = parse(&chunks);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String =
        chunks.iter().filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str().map(str::to_string)).collect();
    assert_eq!(streamed, text);
    let finishes: Vec<&Json> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, vec![&whole["choices"][0]["finish_reason"]], "finish_reason exactly once");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], usage["completion_tokens"]);
    assert_eq!(last["usage"]["prompt_tokens"], usage["prompt_tokens"]);
    // The second time, the prompt came from the prefix cache.
    assert!(last["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0);
    s.assert_idle_and_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_completions_take_every_prompt_form() {
    let Some(s) = default_server().await else { return };
    let base = json!({"temperature": 0, "max_tokens": 6, "ignore_eos": true});
    let with = |prompt: Json, extra: Json| {
        let mut b = base.clone();
        b["prompt"] = prompt;
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    let (st, one) = s.post("/v1/completions", &with(json!("The capital of France is"), json!({}))).await;
    assert_eq!(st, 200, "{one}");
    assert_eq!(one["object"], "text_completion");
    assert_eq!(one["choices"][0]["finish_reason"], "length");
    assert_eq!(one["usage"]["completion_tokens"], 6);

    let (_, tok) = s.post("/tokenize", &json!({"content": "The capital of France is"})).await;
    let (st, by_ids) = s.post("/v1/completions", &with(tok["tokens"].clone(), json!({}))).await;
    assert_eq!(st, 200, "{by_ids}");
    assert_eq!(by_ids["choices"][0]["text"], one["choices"][0]["text"]);

    let (st, many) = s.post("/v1/completions", &with(json!(["One", "Two, three"]), json!({"n": 2}))).await;
    assert_eq!(st, 200, "{many}");
    let choices = many["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    assert!(choices.iter().enumerate().all(|(i, c)| c["index"] == i));
    assert_eq!(many["usage"]["completion_tokens"], 24);

    let (st, lp) = s.post("/v1/completions", &with(json!("Hello"), json!({"logprobs": 2}))).await;
    assert_eq!(st, 200, "{lp}");
    let l = &lp["choices"][0]["logprobs"];
    assert_eq!(l["tokens"].as_array().unwrap().len(), 6);
    assert_eq!(l["token_logprobs"].as_array().unwrap().len(), 6);
    assert_eq!(l["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(l["text_offset"][0], 0);
    s.assert_idle_and_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_logprobs_stop_and_seeds() {
    let Some(s) = default_server().await else { return };
    let mut req = chat("Count from one to ten.", 8);
    req["logprobs"] = json!(true);
    req["top_logprobs"] = json!(3);
    let (st, r) = s.post("/v1/chat/completions", &req).await;
    assert_eq!(st, 200, "{r}");
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len() as u64, r["usage"]["completion_tokens"].as_u64().unwrap());
    for e in content {
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 3);
        assert!(e["bytes"].is_array());
    }

    let (_, plain) = s.post("/v1/chat/completions", &chat("Count from one to ten.", 30)).await;
    let text = plain["choices"][0]["message"]["content"].as_str().unwrap();
    let word = text.split_whitespace().nth(2).expect("a few words");
    let mut stop = chat("Count from one to ten.", 30);
    stop["stop"] = json!([word]);
    let (_, r) = s.post("/v1/chat/completions", &stop).await;
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let cut = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!cut.contains(word) && text.starts_with(cut), "{cut:?} / {text:?}");

    let sampled = json!({"messages": [{"role": "user", "content": "Tell me a story."}],
                         "temperature": 1.0, "seed": 42, "max_tokens": 12, "n": 2});
    let (_, a) = s.post("/v1/chat/completions", &sampled).await;
    let (_, b) = s.post("/v1/chat/completions", &sampled).await;
    assert_eq!(a["choices"], b["choices"], "the same seed gives the same answers");
    s.assert_idle_and_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_detokenize_and_apply_template() {
    let Some(s) = default_server().await else { return };
    let (st, t) = s.post("/tokenize", &json!({"content": "Hello world", "with_pieces": true})).await;
    assert_eq!(st, 200);
    assert_eq!(t["tokens"][0]["piece"], "Hello");
    let ids: Vec<Json> = t["tokens"].as_array().unwrap().iter().map(|p| p["id"].clone()).collect();
    let (_, d) = s.post("/detokenize", &json!({"tokens": ids})).await;
    assert_eq!(d["content"], "Hello world");
    let (st, p) = s.post("/apply-template", &json!({"messages": [{"role": "user", "content": "Hi"}]})).await;
    assert_eq!(st, 200);
    assert!(p["prompt"].as_str().unwrap().ends_with("<|im_start|>assistant\n"), "{p}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_choices_share_their_prompts_blocks() {
    let Some(s) = default_server().await else { return };
    let prompt = "Here is a long text to think about. ".repeat(40);
    let req = json!({"prompt": prompt, "max_tokens": 4, "n": 4, "temperature": 1.0, "seed": 7});
    let (st, r) = s.post("/v1/completions", &req).await;
    assert_eq!(st, 200, "{r}");
    let n_prompt = r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(n_prompt > 300, "{n_prompt}");
    let (_, metrics) = s.get("/metrics").await;
    let computed: u64 = metrics
        .as_str()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("llamacpp:prompt_tokens_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("prompt_tokens_total");
    // The prompt is computed once; the other choices take its full blocks from the cache and
    // compute only their last, partial block.
    let block = onebit_model::BLOCK_TOKENS as u64;
    assert!(computed <= n_prompt + 3 * block, "computed {computed} prompt tokens for 4 choices of {n_prompt}");
    s.assert_idle_and_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_requests_answer_the_same_and_are_counted() {
    let Some(s) = default_server().await else { return };
    let prompt = "Repeat this list twice: apples, pears, plums, cherries, apples, pears, plums, cherries.";
    let (st, plain) = s.post("/v1/chat/completions", &chat(prompt, 64)).await;
    assert_eq!(st, 200, "{plain}");
    let mut req = chat(prompt, 64);
    req["speculative"] = json!({"mode": "lookup", "n_max": 8});
    let (st, spec) = s.post("/v1/chat/completions", &req).await;
    assert_eq!(st, 200, "{spec}");
    assert_eq!(spec["choices"][0]["message"], plain["choices"][0]["message"]);
    // llama-server's flat names are taken too.
    let mut req = chat(prompt, 64);
    req["speculative"] = json!({"mode": "lookup"});
    req["speculative.n_max"] = json!(4);
    req["speculative.p_min"] = json!(0.75);
    let (st, flat) = s.post("/v1/chat/completions", &req).await;
    assert_eq!(st, 200, "{flat}");
    assert_eq!(flat["choices"][0]["message"], plain["choices"][0]["message"]);
    for bad in [json!({"mode": "draft"}), json!({"mode": 3}), json!({"n_max": -1}), json!({"depth": 2}), json!(5)] {
        let mut req = chat(prompt, 4);
        req["speculative"] = bad.clone();
        let (st, body) = s.post("/v1/chat/completions", &req).await;
        assert_eq!(st, 400, "{bad}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("speculative"), "{body}");
    }
    let (_, metrics) = s.get("/metrics").await;
    let text = metrics.as_str().unwrap();
    for name in ["llamacpp:spec_decode_draft_tokens_total", "llamacpp:spec_decode_accepted_tokens_total"] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    s.assert_idle_and_clean().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_streams_get_comment_pings_while_a_long_prompt_is_computed() {
    let config = ServerConfig { sse_ping: Duration::from_millis(20), ..Default::default() };
    let Some(s) = common::start(config, engine_config()).await else { return };
    let words = ["harpoon", "whale", "ship", "captain", "ocean", "sail", "storm", "island"];
    let long: String = (0..200).map(|i| format!("{}{} ", words[i % 8], i)).collect();
    let mut req = chat(&long, 2);
    req["stream"] = json!(true);
    let res = s.http.post(s.url("/v1/chat/completions")).json(&req).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let body = res.text().await.unwrap();
    let lines: Vec<&str> = body.lines().filter(|l| !l.is_empty()).collect();
    let first_ping = lines.iter().position(|l| l.starts_with(':')).expect("a comment ping");
    let data: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].starts_with("data: ")).collect();
    // The prompt takes far longer than 20 ms: a ping went out before the answer's text did.
    assert!(data.len() >= 2 && first_ping < data[1], "{body}");
    assert_eq!(lines.last(), Some(&"data: [DONE]"));
    s.assert_idle_and_clean().await;
}
