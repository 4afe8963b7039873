//! Mixture-of-experts models built by hand (the GGUF writer, tiny random weights): the table of
//! tensors a `qwen3moe` layer needs, the GPU's refusal, and the experts' sum checked against a
//! dense model holding the same experts side by side.

use onebit_gguf::{GgmlType, GgufFile, GgufModel, GgufWriter, OwnedValue};
use onebit_kernels::formats::quantize;
use onebit_kernels::{KernelTier, Pool};
use onebit_model::{Device, LogitsWanted, Model, ModelError, ModelOptions, Scratch};

/// Wide enough for every format's blocks (TQ2_0: 256).
const H: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 64;
const VOCAB: usize = 40;
const EXPERTS: usize = 4;
const USED: usize = 2;
/// One expert's width.
const EF: usize = 256;

fn floats(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            ((s % 2000) as f32 / 1000.0 - 1.0) * 0.2
        })
        .collect()
}

fn bytes(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
    quantize(ty, x, &mut out).unwrap();
    out
}

/// A one-layer Qwen3 (`arch` "qwen3" or "qwen3moe") with everything but its MLP.
fn base(arch: &str, ffn: usize) -> GgufWriter<'static> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", OwnedValue::string(arch));
    let key = |k: &str| format!("{arch}.{k}");
    for (k, v) in [
        ("block_count", 1),
        ("context_length", 64),
        ("embedding_length", H),
        ("feed_forward_length", ffn),
        ("attention.head_count", HEADS),
        ("attention.head_count_kv", KV_HEADS),
        ("attention.key_length", HEAD_DIM),
        ("attention.value_length", HEAD_DIM),
    ] {
        w.set(key(k), OwnedValue::U32(v as u32));
    }
    w.set(key("attention.layer_norm_rms_epsilon"), OwnedValue::F32(1e-6));
    let (h, q, kv) = (H as u64, (HEADS * HEAD_DIM) as u64, (KV_HEADS * HEAD_DIM) as u64);
    let mut t = |name: &str, shape: &[u64], seed: u32| {
        let n: u64 = shape.iter().product();
        w.add_tensor(name, GgmlType::F32, shape, bytes(GgmlType::F32, &floats(n as usize, seed))).unwrap();
    };
    t("token_embd.weight", &[h, VOCAB as u64], 1);
    t("output_norm.weight", &[h], 2);
    t("blk.0.attn_norm.weight", &[h], 3);
    t("blk.0.attn_q.weight", &[h, q], 4);
    t("blk.0.attn_k.weight", &[h, kv], 5);
    t("blk.0.attn_v.weight", &[h, kv], 6);
    t("blk.0.attn_output.weight", &[q, h], 7);
    t("blk.0.attn_q_norm.weight", &[HEAD_DIM as u64], 8);
    t("blk.0.attn_k_norm.weight", &[HEAD_DIM as u64], 9);
    t("blk.0.ffn_norm.weight", &[h], 10);
    w
}

/// Each expert's gate, up (`EF` rows of `H`) and down (`H` rows of `EF`).
struct ExpertWeights {
    gate: Vec<Vec<f32>>,
    up: Vec<Vec<f32>>,
    down: Vec<Vec<f32>>,
}

fn experts() -> ExpertWeights {
    let each = |seed: u32, n: usize| (0..EXPERTS).map(|e| floats(n, seed + e as u32)).collect();
    ExpertWeights { gate: each(20, EF * H), up: each(30, EF * H), down: each(40, H * EF) }
}

/// A qwen3moe model of `ex` (stacked in `ty`) whose router is `router` (`EXPERTS` rows of `H`).
fn moe_model(
    ex: &ExpertWeights,
    ty: GgmlType,
    router: &[f32],
    edit: impl FnOnce(&mut GgufWriter<'static>),
) -> GgufWriter<'static> {
    let mut w = base("qwen3moe", EF * USED);
    w.set("qwen3moe.expert_count", OwnedValue::U32(EXPERTS as u32));
    w.set("qwen3moe.expert_used_count", OwnedValue::U32(USED as u32));
    w.set("qwen3moe.expert_feed_forward_length", OwnedValue::U32(EF as u32));
    let (h, ef, ne) = (H as u64, EF as u64, EXPERTS as u64);
    w.add_tensor("blk.0.ffn_gate_inp.weight", GgmlType::F32, &[h, ne], bytes(GgmlType::F32, router)).unwrap();
    let stack = |m: &[Vec<f32>]| bytes(ty, &m.concat());
    w.add_tensor("blk.0.ffn_gate_exps.weight", ty, &[h, ef, ne], stack(&ex.gate)).unwrap();
    w.add_tensor("blk.0.ffn_up_exps.weight", ty, &[h, ef, ne], stack(&ex.up)).unwrap();
    w.add_tensor("blk.0.ffn_down_exps.weight", ty, &[ef, h, ne], stack(&ex.down)).unwrap();
    edit(&mut w);
    w
}

fn load(w: GgufWriter<'static>, options: &ModelOptions) -> Result<Model, ModelError> {
    Model::from_gguf(GgufModel::from_file(GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()), options)
}

/// Every row of logits of `toks` as one batch, and one token at a time.
fn batch_and_decode(m: &Model, toks: &[u32]) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let (pool, mut sc) = (Pool::new(2), Scratch::new());
    let mut c = m.new_cache(0).unwrap();
    let out = m.forward_one(&pool, &mut c, toks, LogitsWanted::All, &mut sc).unwrap();
    let batch = out.rows_of(0).map(|(_, l)| l.to_vec()).collect();
    let mut c = m.new_cache(0).unwrap();
    let decode = toks
        .iter()
        .map(|&t| m.forward_one(&pool, &mut c, &[t], LogitsWanted::Last, &mut sc).unwrap().last(0).unwrap().to_vec())
        .collect();
    (batch, decode)
}

const TOKENS: [u32; 9] = [3, 17, 5, 39, 0, 22, 8, 8, 31];

/// A router of zeros gives every expert the same probability: every token takes experts 0 and
/// 1 (ties go to the lower index), each weighted 1/2. Batched or token by token, on every tier,
/// with experts in Q8_0, TQ2_0 and Q1_0: the same logits bit for bit.
#[test]
fn the_same_experts_for_every_token_give_the_same_result_batched_and_token_by_token() {
    let ex = experts();
    for ty in [GgmlType::Q8_0, GgmlType::TQ2_0, GgmlType::Q1_0, GgmlType::F32] {
        for tier in KernelTier::available() {
            let options = ModelOptions { kernel_tier: Some(tier), ..ModelOptions::default() };
            let m = load(moe_model(&ex, ty, &[0.0; EXPERTS * H], |_| {}), &options).unwrap();
            let (batch, decode) = batch_and_decode(&m, &TOKENS);
            for (i, (b, d)) in batch.iter().zip(&decode).enumerate() {
                assert!(b.iter().all(|v| v.is_finite()));
                assert_eq!(b, d, "[{ty}, {tier}] token {i}: batch and decode differ");
            }
        }
    }
}

/// With every token on experts 0 and 1 at 1/2 each, the mixture is a dense gated MLP twice as
/// wide: both experts' gate and up rows one after the other, and their down rows side by side,
/// halved. The MoE model's logits match that dense Qwen3's (F32 weights: only the order of sums
/// differs).
#[test]
fn two_experts_at_half_weight_are_one_dense_mlp_of_both() {
    let ex = experts();
    let moe = load(moe_model(&ex, GgmlType::F32, &[0.0; EXPERTS * H], |_| {}), &ModelOptions::default()).unwrap();
    let mut w = base("qwen3", 2 * EF);
    let (h, f) = (H as u64, 2 * EF as u64);
    let gate = [&ex.gate[0][..], &ex.gate[1][..]].concat();
    let up = [&ex.up[0][..], &ex.up[1][..]].concat();
    let down: Vec<f32> = (0..H)
        .flat_map(|r| {
            let (d0, d1) = (&ex.down[0][r * EF..(r + 1) * EF], &ex.down[1][r * EF..(r + 1) * EF]);
            d0.iter().chain(d1).map(|v| v * 0.5).collect::<Vec<_>>()
        })
        .collect();
    w.add_tensor("blk.0.ffn_gate.weight", GgmlType::F32, &[h, f], bytes(GgmlType::F32, &gate)).unwrap();
    w.add_tensor("blk.0.ffn_up.weight", GgmlType::F32, &[h, f], bytes(GgmlType::F32, &up)).unwrap();
    w.add_tensor("blk.0.ffn_down.weight", GgmlType::F32, &[f, h], bytes(GgmlType::F32, &down)).unwrap();
    let dense = load(w, &ModelOptions::default()).unwrap();
    let (a, _) = batch_and_decode(&moe, &TOKENS);
    let (b, _) = batch_and_decode(&dense, &TOKENS);
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
        let scale = b.iter().map(|v| v.abs()).fold(0.0, f32::max);
        assert!(worst <= 1e-4 * scale, "token {i}: the mixture differs from the dense MLP by {worst} (of {scale})");
    }
}

/// A router that prefers different experts for different tokens still gives a token the same
/// logits batched as alone.
#[test]
fn tokens_routed_apart_give_the_same_result_batched_and_token_by_token() {
    let ex = experts();
    let router: Vec<f32> = floats(EXPERTS * H, 99).iter().map(|v| v * 20.0).collect();
    let m = load(moe_model(&ex, GgmlType::Q8_0, &router, |_| {}), &ModelOptions::default()).unwrap();
    let (batch, decode) = batch_and_decode(&m, &TOKENS);
    assert_eq!(batch, decode);
}

#[test]
fn the_table_of_a_moe_layer_is_enforced() {
    let ex = experts();
    let zeros = [0.0; EXPERTS * H];
    let opts = ModelOptions::default();
    let m = load(moe_model(&ex, GgmlType::Q8_0, &zeros, |_| {}), &opts).unwrap();
    let moe = m.config().moe.unwrap();
    assert_eq!((moe.n_experts, moe.n_used, moe.ffn), (EXPERTS, USED, EF));
    // A dense MLP's tensor in a MoE layer.
    let e = load(
        moe_model(&ex, GgmlType::Q8_0, &zeros, |w| {
            w.add_tensor(
                "blk.0.ffn_up.weight",
                GgmlType::F32,
                &[H as u64, EF as u64],
                bytes(GgmlType::F32, &floats(EF * H, 1)),
            )
            .unwrap();
        }),
        &opts,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("blk.0.ffn_up.weight"), "{e}");
    // More experts used than there are.
    let e = load(
        moe_model(&ex, GgmlType::Q8_0, &zeros, |w| {
            w.set("qwen3moe.expert_used_count", OwnedValue::U32(EXPERTS as u32 + 1));
        }),
        &opts,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("expert_used_count"), "{e}");
    // The stacked experts' third dimension is the expert count.
    let e = load(
        moe_model(&ex, GgmlType::Q8_0, &zeros, |w| {
            w.set("qwen3moe.expert_count", OwnedValue::U32(EXPERTS as u32 * 2));
        }),
        &opts,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("blk.0.ffn_gate_inp.weight"), "{e}");
}

/// The GPU backend has no MoE kernels: it says so at load, before it looks for a GPU.
#[test]
fn the_gpu_refuses_a_mixture_of_experts() {
    let ex = experts();
    let options = ModelOptions { device: Device::Cuda(0), ..ModelOptions::default() };
    let e = load(moe_model(&ex, GgmlType::Q8_0, &[0.0; EXPERTS * H], |_| {}), &options).err().unwrap();
    assert!(matches!(e, ModelError::Unsupported(_)), "{e:?}");
    assert!(e.to_string().contains("mixture-of-experts"), "{e}");
}
