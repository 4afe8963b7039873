//! LoRA adapters over HTTP: `GET/POST /lora-adapters` as llama-server serves them, and a
//! request's own `lora` field, on a shared model with its random adapter loaded twice.

mod common;

use onebit_model::ModelOptions;
use onebit_server::ServerConfig;
use serde_json::{Value as Json, json};

async fn server() -> Option<common::TestServer> {
    let model = onebit_testkit::shared_file("models/qwen3-q8_0.gguf")?;
    let adapter = onebit_testkit::shared_file("models/lora-qwen3-q8_0-r8.gguf")?;
    let options = ModelOptions { lora: vec![adapter.clone(), adapter], ..ModelOptions::default() };
    common::start_with(model, None, options, ServerConfig::default(), common::engine_config()).await
}

/// Greedy tokens for a fixed prompt, with the request's `lora` field if given.
async fn complete(s: &common::TestServer, lora: Option<Json>) -> (u16, Json) {
    let mut body = json!({ "prompt": "The capital of France is", "temperature": 0, "max_tokens": 12 });
    if let Some(l) = lora {
        body["lora"] = l;
    }
    s.post("/v1/completions", &body).await
}

fn text(r: &(u16, Json)) -> String {
    assert_eq!(r.0, 200, "{}", r.1);
    r.1["choices"][0]["text"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_are_listed_and_their_scales_set() {
    let Some(s) = server().await else { return };
    let (status, list) = s.get("/lora-adapters").await;
    assert_eq!(status, 200);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(
        (list[1]["id"].as_u64(), list[1]["scale"].as_f64(), list[1]["rank"].as_u64()),
        (Some(1), Some(1.0), Some(8))
    );
    assert!(list[0]["path"].as_str().unwrap().ends_with("lora-qwen3-q8_0-r8.gguf"));

    let (status, ok) = s.post("/lora-adapters", &json!([{ "id": 1, "scale": 0.5 }])).await;
    assert_eq!((status, ok), (200, json!({ "success": true })));
    let (_, list) = s.get("/lora-adapters").await;
    let scales: Vec<f64> = list.as_array().unwrap().iter().map(|a| a["scale"].as_f64().unwrap()).collect();
    assert_eq!(scales, [0.0, 0.5], "adapters not listed go to 0");

    for bad in [json!({ "id": 0 }), json!([{ "id": 5, "scale": 1.0 }]), json!([{ "id": "x", "scale": 1.0 }])] {
        let (status, err) = s.post("/lora-adapters", &bad).await;
        assert_eq!(status, 400, "{bad}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_picks_its_own_adapters() {
    let Some(s) = server().await else { return };
    let none = text(&complete(&s, Some(json!([{ "id": 0, "scale": 0.0 }]))).await);
    let one = text(&complete(&s, Some(json!([{ "id": 0, "scale": 1.0 }]))).await);
    assert_ne!(none, one, "the adapter changes the answer");
    // Both adapters at 1 are the global scales at start: the same as naming none.
    let both = text(&complete(&s, Some(json!([{ "id": 0, "scale": 1.0 }, { "id": 1, "scale": 1.0 }]))).await);
    assert_eq!(both, text(&complete(&s, None).await));
    assert_eq!(both, text(&complete(&s, Some(json!([]))).await), "an empty list is the global scales");
    // Global scales now adapter 0 alone: a request without the field follows them.
    s.post("/lora-adapters", &json!([{ "id": 0, "scale": 1.0 }])).await;
    assert_eq!(one, text(&complete(&s, None).await));

    let (status, err) = complete(&s, Some(json!([{ "id": 9, "scale": 1.0 }]))).await;
    assert_eq!(status, 400, "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("id 9"), "{err}");
    let (status, _) = complete(&s, Some(json!({ "id": 0 }))).await;
    assert_eq!(status, 400);
    s.assert_idle_and_clean().await;
}
