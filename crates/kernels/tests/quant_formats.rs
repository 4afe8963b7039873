//! llama.cpp's own dequantization and reference quantization of 512 values per type
//! (`../shared/fixtures/quant-formats.json`): dequantization within 1 ulp, quantization exact.

use onebit_gguf::GgmlType;
use onebit_kernels::formats::{dequantize, quantize};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// Distance in units in the last place, for finite floats of either sign.
fn ulps(a: f32, b: f32) -> u32 {
    let key = |x: f32| {
        let i = x.to_bits() as i32;
        if i < 0 { i32::MIN.wrapping_sub(i) } else { i }
    };
    key(a).abs_diff(key(b))
}

#[test]
fn matches_llama_cpp_block_formats() {
    let Some(fx) = onebit_testkit::fixture("quant-formats.json") else {
        return;
    };
    let mut checked = Vec::new();
    for (name, entry) in fx["types"].as_object().unwrap() {
        let ty = GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}"));
        assert_eq!(entry["id"].as_u64().unwrap() as u32, ty.id(), "{name} id");
        assert_eq!(entry["block_size"].as_u64().unwrap(), ty.block_size(), "{name} block size");
        assert_eq!(entry["type_size"].as_u64().unwrap(), ty.type_size(), "{name} type size");
        if let Some(input) = entry.get("dequant_input_hex") {
            let raw = hex(input.as_str().unwrap());
            let want = floats(&entry["dequant_output"]);
            let mut got = vec![0f32; want.len()];
            dequantize(ty, &raw, &mut got).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(ulps(*g, *w) <= 1, "{name} dequant[{i}]: {g} vs llama.cpp {w}");
            }
        }
        if let Some(input) = entry.get("quantize_input") {
            let x = floats(input);
            let want = hex(entry["quantize_output_hex"].as_str().unwrap());
            let mut got = vec![0u8; want.len()];
            quantize(ty, &x, &mut got).unwrap();
            if got != want {
                let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
                panic!(
                    "{name} quantization differs from llama.cpp first at byte {at} (block {})",
                    at as u64 / ty.type_size()
                );
            }
        }
        checked.push(name.clone());
    }
    assert!(checked.len() >= 18, "{checked:?}");
}
