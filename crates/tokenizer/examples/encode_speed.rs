//! Encoding speed on the long prompt of `../shared/fixtures/prompts.json`, per vocabulary.
//!
//! `cargo run --release -p onebit-tokenizer --example encode_speed [SHARED_DIR]`

use std::time::Instant;

use onebit_gguf::GgufFile;
use onebit_tokenizer::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let shared = std::env::args().nth(1).unwrap_or_else(|| "../shared".into());
    let prompts: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(format!("{shared}/fixtures/prompts.json"))?)?;
    let long = prompts.iter().max_by_key(|p| p.len()).ok_or("no prompts")?;
    let text = long.repeat(64);
    println!("{:<42} {:>8} {:>8} {:>8} {:>8}", "vocabulary", "tokens", "MB/s", "ms", "load ms");
    for model in [
        "models/qwen3-q1_0.gguf",
        "models/llama-q4_1.gguf",
        "models/vocab/ggml-vocab-llama-bpe.gguf",
        "models/vocab/ggml-vocab-gpt-2.gguf",
        "models/vocab/ggml-vocab-deepseek-llm.gguf",
        "models/vocab/ggml-vocab-llama-spm.gguf",
        "models/vocab/ggml-vocab-phi-3.gguf",
    ]
    .into_iter()
    .filter(|m| std::env::var("ONLY").map_or(true, |o| m.contains(&o)))
    {
        let file = GgufFile::open(format!("{shared}/{model}"))?;
        let t0 = Instant::now();
        let tok = Tokenizer::from_metadata(&file.metadata())?;
        let load_ms = t0.elapsed().as_secs_f64() * 1e3;
        let n = tok.encode(&text, false, true)?.len(); // warm the caches
        let runs: usize = std::env::var("RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(5);
        let t = Instant::now();
        for _ in 0..runs {
            std::hint::black_box(tok.encode(&text, false, true)?);
        }
        let secs = t.elapsed().as_secs_f64() / runs as f64;
        println!("{model:<42} {n:>8} {:>8.1} {:>8.1} {load_ms:>8.1}", text.len() as f64 / secs / 1e6, secs * 1e3);
    }
    Ok(())
}
