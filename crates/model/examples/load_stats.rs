//! Load a model and report how long it took and how much memory is resident, before and after
//! one decode step with a cache of the given context size.
//!
//! `cargo run --release -p onebit-model --example load_stats -- MODEL.gguf [CTX [PACK_CACHE_DIR]]`

use std::time::Instant;

use onebit_kernels::Pool;
use onebit_model::{LogitsWanted, Model, ModelOptions, PackCache, Scratch};

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    kb("VmRSS:") / 1024.0
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: load_stats MODEL.gguf [CTX [PACK_CACHE_DIR]]")?;
    let ctx: usize = args.next().map(|c| c.parse()).transpose()?.unwrap_or(4096);
    let options = ModelOptions { pack_cache: args.next().map(PackCache::new), ..ModelOptions::default() };
    let t0 = Instant::now();
    let model = Model::load(&path, &options)?;
    let load = t0.elapsed();
    println!(
        "loaded {path} in {:.1} ms, RSS {:.1} MiB (kernels: {})",
        load.as_secs_f64() * 1e3,
        rss_mib(),
        model.kernels().tier()
    );
    let pool = Pool::new(Pool::default_threads());
    let mut cache = model.new_cache(ctx)?;
    let mut scratch = Scratch::new();
    println!("cache for {ctx} positions: up to {:.1} MiB", cache.capacity_bytes() as f64 / (1 << 20) as f64);
    let t1 = Instant::now();
    model.forward_one(&pool, &mut cache, &[1], LogitsWanted::Last, &mut scratch)?;
    println!(
        "first token in {:.1} ms (load and first token {:.1} ms), RSS {:.1} MiB",
        t1.elapsed().as_secs_f64() * 1e3,
        t0.elapsed().as_secs_f64() * 1e3,
        rss_mib()
    );
    let t2 = Instant::now();
    model.forward_one(&pool, &mut cache, &[2], LogitsWanted::Last, &mut scratch)?;
    println!("second token in {:.1} ms, RSS {:.1} MiB", t2.elapsed().as_secs_f64() * 1e3, rss_mib());
    Ok(())
}
