//! Matrix-product microbenchmarks at Bonsai-8B's shapes (hidden 4096, FFN 12288, 8 KV heads of
//! 128): one token (decode, GEMV) and 128 tokens (prefill, GEMM), on 2 threads with the best
//! tier of this CPU. Items are weights (GEMV) or multiply-adds (GEMM); bytes are the weights'
//! bytes read once.
//!
//! `cargo bench -p onebit-kernels --bench matmul` (add `-- gemv` or `-- gemm` to pick).

use divan::counter::{BytesCount, ItemsCount};
use divan::{Bencher, black_box};
use onebit_gguf::GgmlType;
use onebit_kernels::formats::quantize;
use onebit_kernels::{Acts, Kernels, MatRef, PackedMat, Pool};

fn main() {
    divan::main();
}

/// (name, rows, cols): the query/output, key/value, gate/up and down projections.
const SHAPES: [(&str, usize, usize); 4] =
    [("attn_q", 4096, 4096), ("attn_kv", 1024, 4096), ("ffn_gate_up", 12288, 4096), ("ffn_down", 4096, 12288)];

const THREADS: usize = 2;

struct Case {
    kernels: Kernels,
    pool: Pool,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
    packed: Option<PackedMat>,
}

impl Case {
    fn new(ty: GgmlType, shape: &str) -> Case {
        let &(_, rows, cols) = SHAPES.iter().find(|s| s.0 == shape).expect("known shape");
        let row_bytes = ty.bytes_for(cols as u64).expect("valid width") as usize;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut data = vec![0u8; rows * row_bytes];
        // 64 distinct random rows, repeated: quantizing 50M weights would dominate the run.
        for r in 0..64 {
            let w: Vec<f32> = (0..cols).map(|_| next(&mut seed)).collect();
            quantize(ty, &w, &mut data[r * row_bytes..(r + 1) * row_bytes]).expect("quantizable");
        }
        for r in 64..rows {
            data.copy_within((r % 64) * row_bytes..(r % 64 + 1) * row_bytes, r * row_bytes);
        }
        let kernels = Kernels::best();
        let pool = Pool::new(THREADS);
        let packed = kernels.pack(&pool, &MatRef::new(ty, rows, cols, &data).expect("valid matrix"));
        Case { kernels, pool, ty, rows, cols, data, packed }
    }

    fn run(&self, bencher: Bencher, tokens: usize) {
        let w = MatRef::new(self.ty, self.rows, self.cols, &self.data).unwrap().with_packed(self.packed.as_ref());
        let mut seed = 7u64;
        let x: Vec<f32> = (0..tokens * self.cols).map(|_| next(&mut seed)).collect();
        let mut acts = Acts::new();
        let mut out = vec![0f32; self.rows * tokens];
        let macs = (self.rows * self.cols * tokens) as u64;
        bencher.counter(ItemsCount::new(macs)).counter(BytesCount::new(self.data.len())).bench_local(|| {
            // The activations are quantized once per product, as in the model.
            self.kernels.quantize_acts(&self.pool, self.ty, black_box(&x), self.cols, &mut acts).unwrap();
            self.kernels.matmul(&self.pool, &w, &acts, &mut out).unwrap();
            black_box(&out);
        });
    }
}

fn next(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
}

/// "type shape" for every weight type measured and every shape.
const CASES: [&str; 12] = [
    "q1_0 attn_q",
    "q1_0 attn_kv",
    "q1_0 ffn_gate_up",
    "q1_0 ffn_down",
    "tq2_0 attn_q",
    "tq2_0 attn_kv",
    "tq2_0 ffn_gate_up",
    "tq2_0 ffn_down",
    "q4_1 attn_q",
    "q4_1 attn_kv",
    "q4_1 ffn_gate_up",
    "q4_1 ffn_down",
];

fn case(name: &str) -> Case {
    let (ty, shape) = name.split_once(' ').expect("\"type shape\"");
    Case::new(GgmlType::from_name(ty).expect("known type"), shape)
}

#[divan::bench(args = CASES)]
fn gemv(bencher: Bencher, name: &str) {
    case(name).run(bencher, 1);
}

#[divan::bench(args = CASES, sample_count = 20)]
fn gemm_128(bencher: Bencher, name: &str) {
    case(name).run(bencher, 128);
}
