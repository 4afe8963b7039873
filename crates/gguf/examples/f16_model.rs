//! Write an F16 model with the metadata, tensor names and shapes of a template GGUF (random
//! weights), streamed through [`GgufStreamWriter`] so that even an 8B shape needs no memory:
//!
//! ```sh
//! cargo run --release -p onebit-gguf --example f16_model -- bonsai-8b-shape.gguf b8-f16.gguf
//! ```
//!
//! BENCHMARKS.md quantizes such a file with `onebit quantize` and `llama-quantize`.

use std::io::BufWriter;

use onebit_gguf::{GgmlType, GgufFile, GgufStreamWriter, OwnedValue, TensorInfo};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, template, out] = args.as_slice() else {
        return Err("usage: f16_model TEMPLATE.gguf OUT.gguf".into());
    };
    let tpl = GgufFile::open(template)?;
    let kvs: Vec<(String, OwnedValue)> = tpl
        .metadata()
        .iter()
        .map(|(k, v)| {
            // LLAMA_FTYPE_MOSTLY_F16.
            let v = if k == "general.file_type" { OwnedValue::U32(1) } else { OwnedValue::from(v) };
            (k.to_string(), v)
        })
        .collect();
    // Vectors (norms) stay F32; every matrix becomes F16.
    let infos: Vec<TensorInfo> = tpl
        .tensors()
        .map(|t| TensorInfo {
            name: t.name().into(),
            ty: if t.shape().len() < 2 { GgmlType::F32 } else { GgmlType::F16 },
            shape: t.shape().to_vec(),
        })
        .collect();
    let file = std::fs::File::create(out)?;
    let mut w = GgufStreamWriter::new(BufWriter::with_capacity(8 << 20, file), &kvs, &infos)?;
    let mut h: u64 = 0x1234_5678_9abc_def0;
    let mut buf = Vec::with_capacity(1 << 22);
    for info in &infos {
        let n: u64 = info.shape.iter().product();
        let std = 1.7 / (info.shape[0] as f32).sqrt();
        let mut left = n;
        while left > 0 {
            let k = left.min(1 << 20);
            buf.clear();
            for _ in 0..k {
                // xorshift64; the sum of four 16-bit parts is roughly normal around 2.
                h ^= h << 13;
                h ^= h >> 7;
                h ^= h << 17;
                let parts = (h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) + (h >> 48);
                let s = parts as f32 / 65536.0 - 2.0;
                if info.ty == GgmlType::F32 {
                    buf.extend_from_slice(&(1.0 + 0.1 * s).to_le_bytes());
                } else {
                    buf.extend_from_slice(&half::f16::from_f32(s * std).to_bits().to_le_bytes());
                }
            }
            w.write_data(&buf)?;
            left -= k;
        }
        w.end_tensor()?;
    }
    w.finish()?;
    Ok(())
}
