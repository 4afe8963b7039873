//! Repacked weights kept in a cache file: a load that writes the file and a load that maps it
//! give the logits of a load without one, bit for bit, on every kernel tier; a cache file that
//! does not match (damaged, or another tier's) is repacked over, never used.

use std::path::{Path, PathBuf};

use onebit_kernels::{KernelTier, Pool};
use onebit_model::{LogitsWanted, Model, ModelOptions, PackCache, Scratch};

fn logits(path: &Path, tier: KernelTier, cache: Option<&Path>) -> Vec<f32> {
    let options = ModelOptions {
        kernel_tier: Some(tier),
        pack_cache: cache.map(|dir| PackCache { dir: dir.to_path_buf(), min_bytes: 0 }),
        ..ModelOptions::default()
    };
    let model = Model::load(path, &options).unwrap();
    let mut cache = model.new_cache(64).unwrap();
    let toks = [1u32, 50, 200, 7, 3000, 12];
    let mut scratch = Scratch::new();
    let out = model.forward_one(&Pool::new(2), &mut cache, &toks, LogitsWanted::All, &mut scratch).unwrap();
    out.rows_of(0).flat_map(|(_, l)| l.to_vec()).collect()
}

fn files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map(|d| d.map(|e| e.unwrap().path()).collect()).unwrap_or_default()
}

#[test]
fn cached_weights_give_the_same_logits_on_every_tier() {
    let mut cached = 0;
    // Q1_0 (the lookup layout) and Q4_1 (the 16-row layout).
    for name in ["models/qwen3-q1_0.gguf", "models/llama-q4_1.gguf"] {
        let Some(path) = onebit_testkit::shared_file(name) else { return };
        for tier in KernelTier::available() {
            let dir = std::env::temp_dir().join(format!("onebit-pack-cache-{}-{tier}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let plain = logits(&path, tier, None);
            let writing = logits(&path, tier, Some(&dir));
            let written = files(&dir);
            let mapped = logits(&path, tier, Some(&dir));
            assert_eq!(plain, writing, "{name} on {tier}: the load that writes the cache");
            assert_eq!(plain, mapped, "{name} on {tier}: the load that maps the cache");
            if let [file] = &written[..] {
                cached += 1;
                // A damaged header is a miss: the weights are repacked and the file rewritten.
                let mut bytes = std::fs::read(file).unwrap();
                bytes[20] ^= 1;
                std::fs::write(file, &bytes).unwrap();
                assert_eq!(plain, logits(&path, tier, Some(&dir)), "{name} on {tier}: a damaged cache");
                assert_ne!(std::fs::read(file).unwrap()[20], bytes[20], "the damaged file was rewritten");
            } else {
                // Tiers without packed layouts for the type write nothing.
                assert!(written.is_empty(), "{name} on {tier}: {written:?}");
            }
            std::fs::remove_dir_all(&dir).ok();
        }
    }
    assert!(cached > 0, "no tier here packs these models");
}
