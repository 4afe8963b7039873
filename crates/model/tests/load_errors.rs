//! Models built by hand (the GGUF writer, tiny random weights): hyperparameters come from
//! metadata, the table of tensors is enforced, and what onebit cannot run is refused by name.

use onebit_gguf::{GgmlType, GgufFile, GgufModel, GgufWriter, OwnedValue};
use onebit_kernels::Pool;
use onebit_model::{Arch, Device, LogitsWanted, Model, ModelError, ModelOptions, Scratch};

struct Spec {
    arch: &'static str,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    vocab: usize,
}

const TINY: Spec = Spec { arch: "llama", hidden: 64, heads: 4, kv_heads: 2, head_dim: 32, ffn: 96, vocab: 50 };

fn floats(n: usize, seed: u32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            ((s % 2000) as f32 / 1000.0 - 1.0).mul_add(0.1, 0.0).to_le_bytes()
        })
        .collect()
}

/// A writer holding a complete model of `spec`; tests then break one thing.
fn build(spec: &Spec, extra: impl FnOnce(&mut GgufWriter<'static>)) -> Result<Model, ModelError> {
    build_with(spec, extra, &ModelOptions::default())
}

fn build_with(
    spec: &Spec,
    extra: impl FnOnce(&mut GgufWriter<'static>),
    options: &ModelOptions,
) -> Result<Model, ModelError> {
    let mut w = GgufWriter::new();
    let a = spec.arch;
    w.set("general.architecture", OwnedValue::string(a));
    w.set(format!("{a}.block_count"), OwnedValue::U32(1));
    w.set(format!("{a}.context_length"), OwnedValue::U32(128));
    w.set(format!("{a}.embedding_length"), OwnedValue::U32(spec.hidden as u32));
    w.set(format!("{a}.feed_forward_length"), OwnedValue::U32(spec.ffn as u32));
    w.set(format!("{a}.attention.head_count"), OwnedValue::U32(spec.heads as u32));
    w.set(format!("{a}.attention.head_count_kv"), OwnedValue::U32(spec.kv_heads as u32));
    w.set(format!("{a}.attention.key_length"), OwnedValue::U32(spec.head_dim as u32));
    w.set(format!("{a}.attention.value_length"), OwnedValue::U32(spec.head_dim as u32));
    w.set(format!("{a}.attention.layer_norm_rms_epsilon"), OwnedValue::F32(1e-5));
    let (h, q, kv) = (spec.hidden as u64, (spec.heads * spec.head_dim) as u64, (spec.kv_heads * spec.head_dim) as u64);
    let mut t = |name: &str, shape: &[u64], seed: u32| {
        let n: u64 = shape.iter().product();
        w.add_tensor(name, GgmlType::F32, shape, floats(n as usize, seed)).unwrap();
    };
    t("token_embd.weight", &[h, spec.vocab as u64], 1);
    t("output_norm.weight", &[h], 2);
    t("blk.0.attn_norm.weight", &[h], 3);
    t("blk.0.attn_q.weight", &[h, q], 4);
    t("blk.0.attn_k.weight", &[h, kv], 5);
    t("blk.0.attn_v.weight", &[h, kv], 6);
    t("blk.0.attn_output.weight", &[q, h], 7);
    t("blk.0.ffn_norm.weight", &[h], 8);
    t("blk.0.ffn_gate.weight", &[h, spec.ffn as u64], 9);
    t("blk.0.ffn_up.weight", &[h, spec.ffn as u64], 10);
    t("blk.0.ffn_down.weight", &[spec.ffn as u64, h], 11);
    extra(&mut w);
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    Model::from_gguf(GgufModel::from_file(file), options)
}

#[test]
fn a_hand_built_model_runs() {
    let m = build(&TINY, |_| {}).unwrap();
    assert_eq!(m.config().arch, Arch::Llama);
    assert_eq!(m.config().vocab_size, 50);
    let mut c = m.new_cache(0).unwrap();
    assert_eq!(c.capacity(), 128, "0 means the trained context");
    let mut sc = Scratch::new();
    let out = m.forward_one(&Pool::new(1), &mut c, &[1, 2, 3], LogitsWanted::Last, &mut sc).unwrap();
    assert!(out.last(0).unwrap().iter().all(|v| v.is_finite()));
}

#[test]
fn head_size_comes_from_key_length_not_hidden_over_heads() {
    // 64 / 4 = 16, but the heads are 32 wide.
    let m = build(&TINY, |_| {}).unwrap();
    assert_eq!(m.config().head_dim, 32);
    assert_eq!(m.config().rope.dims, 32);
}

#[test]
fn unknown_architectures_list_the_supported_ones() {
    let e = build(&TINY, |w| {
        w.set("general.architecture", OwnedValue::string("gpt-neox"));
    })
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("unknown architecture 'gpt-neox'") && e.contains("llama, mistral, qwen2, qwen3"), "{e}");
}

#[test]
fn missing_and_misshapen_tensors_are_named() {
    let e = build(&Spec { arch: "qwen2", ..TINY }, |_| {}).err().unwrap().to_string();
    assert!(e.contains("blk.0.attn_q.bias") && e.contains("missing"), "qwen2 needs q/k/v biases: {e}");
    let e = build(&Spec { arch: "qwen3", ..TINY }, |_| {}).err().unwrap().to_string();
    assert!(e.contains("blk.0.attn_q_norm.weight"), "qwen3 needs q/k norms: {e}");
    let e = build(&TINY, |w| {
        w.add_tensor("blk.0.ffn_gate_inp.weight", GgmlType::F32, &[64, 8], floats(512, 3)).unwrap();
    })
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("blk.0.ffn_gate_inp.weight") && e.contains("not expected"), "{e}");
    let e = build(&TINY, |w| {
        w.set("llama.feed_forward_length", OwnedValue::U32(100));
    })
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("blk.0.ffn_gate.weight") && e.contains("shape"), "{e}");
}

#[test]
fn rope_scaling_is_read_or_refused() {
    let m = build(&TINY, |w| {
        w.set("llama.rope.scaling.type", OwnedValue::string("linear"));
        w.set("llama.rope.scaling.factor", OwnedValue::F32(4.0));
        w.set("llama.rope.freq_base", OwnedValue::F32(500000.0));
    })
    .unwrap();
    assert_eq!(m.config().rope.freq_scale, 0.25);
    assert_eq!(m.config().rope.freq_base, 500000.0);
    let e = build(&TINY, |w| {
        w.set("llama.rope.scaling.type", OwnedValue::string("yarn"));
    })
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("RoPE scaling type 'yarn'"), "{e}");
}

#[test]
fn llama3_rope_frequency_factors_are_used() {
    let plain = build(&TINY, |_| {}).unwrap();
    let scaled = build(&TINY, |w| {
        w.add_tensor(
            "rope_freqs.weight",
            GgmlType::F32,
            &[16],
            [4.0f32; 16].iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<_>>(),
        )
        .unwrap();
    })
    .unwrap();
    let run = |m: &Model| {
        let mut c = m.new_cache(16).unwrap();
        m.forward_one(&Pool::new(1), &mut c, &[1, 2, 3], LogitsWanted::Last, &mut Scratch::new())
            .unwrap()
            .last(0)
            .unwrap()
            .to_vec()
    };
    assert_ne!(run(&plain), run(&scaled));
}

#[test]
fn bad_hyperparameters_are_refused() {
    let e = build(&TINY, |w| {
        w.set("llama.attention.head_count_kv", OwnedValue::U32(3));
    })
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("head_count_kv"), "{e}");
    let e = build(&TINY, |w| {
        w.set("llama.block_count", OwnedValue::U32(0));
    })
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("llama.block_count") && e.contains("positive"), "{e}");
}

#[test]
fn devices_parse_and_a_missing_gpu_is_a_clear_error() {
    assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
    assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
    assert_eq!("CUDA:1".parse::<Device>(), Ok(Device::Cuda(1)));
    assert!("tpu".parse::<Device>().unwrap_err().contains("cpu, cuda, cuda:N"));
    // Device 99 exists nowhere: the error names what is missing (driver, NVRTC or device).
    let options = ModelOptions { device: Device::Cuda(99), ..ModelOptions::default() };
    let e = build_with(&TINY, |_| {}, &options).unwrap_err().to_string();
    assert!(e.contains("CUDA") || e.contains("NVRTC") || e.contains("cuda"), "{e}");
    // The default is the CPU.
    let cpu = build(&TINY, |_| {}).unwrap();
    assert_eq!(cpu.device(), Device::Cpu);
}

/// Gemma 3 reads its sliding window and layer pattern from the metadata (the pattern fixed as
/// llama.cpp fixes it), and the GPU refuses it by name, before it looks for a GPU at all.
#[test]
fn gemma3_config_and_the_gpu_refusing_it() {
    let Some(path) = onebit_testkit::gemma3_model() else {
        return;
    };
    let model = Model::load(&path, &ModelOptions::default()).unwrap();
    let c = model.config();
    assert_eq!(c.arch, Arch::Gemma3);
    let s = c.sliding.as_ref().unwrap();
    assert_eq!(s.window, 512);
    assert_eq!((0..18).filter(|&l| c.window(l).is_none()).collect::<Vec<_>>(), [5, 11, 17]);
    assert_eq!((s.rope.freq_base, c.rope.freq_base), (10_000.0, 1_000_000.0));
    assert_eq!(c.embed_scale, Some(640f32.sqrt()));
    let options = ModelOptions { device: Device::Cuda(0), ..ModelOptions::default() };
    let e = Model::load(&path, &options).unwrap_err();
    assert!(matches!(e, ModelError::Unsupported(_)) && e.to_string().contains("gemma3"), "{e}");
}
