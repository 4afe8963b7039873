//! Every model in ../shared opens, and writing it back gives the same metadata and tensor bytes.

use onebit_gguf::{GgufFile, GgufWriter, OwnedValue};

fn rewrite(f: &GgufFile) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata().iter() {
        w.set(k, OwnedValue::from(v));
    }
    for t in f.tensors() {
        w.add_tensor(t.name(), t.ggml_type(), t.shape(), t.data()).unwrap();
    }
    w.to_bytes().unwrap()
}

#[test]
fn shared_models_round_trip_through_the_writer() {
    let models = onebit_testkit::shared_models(true);
    for path in &models {
        let f = GgufFile::open(path).unwrap();
        let bytes = rewrite(&f);
        let g = GgufFile::from_bytes(bytes.clone()).unwrap();
        let a: Vec<_> = f.metadata().iter().map(|(k, v)| (k, OwnedValue::from(v))).collect();
        let b: Vec<_> = g.metadata().iter().map(|(k, v)| (k, OwnedValue::from(v))).collect();
        assert_eq!(a, b, "{}: metadata differs", path.display());
        assert_eq!(f.tensor_count(), g.tensor_count());
        for (x, y) in f.tensors().zip(g.tensors()) {
            assert_eq!((x.name(), x.ggml_type(), x.shape()), (y.name(), y.ggml_type(), y.shape()));
            assert!(x.data() == y.data(), "{}: tensor {} bytes differ", path.display(), x.name());
        }
        // The layout is deterministic, so the whole file comes back byte for byte.
        assert!(bytes == f.bytes(), "{}: rewritten file is not byte-identical", path.display());
    }
    eprintln!("{} shared models round-tripped", models.len());
}

#[test]
fn shared_models_have_the_expected_shape() {
    let Some(path) = onebit_testkit::shared_file("models/qwen3-q1_0.gguf") else {
        return;
    };
    let f = GgufFile::open(path).unwrap();
    let md = f.metadata();
    assert_eq!(md.get_str("general.architecture").unwrap(), "qwen3");
    assert_eq!(md.get_u32("qwen3.block_count").unwrap(), 4);
    assert_eq!(md.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 151936);
    let e = f.tensor("token_embd.weight").unwrap();
    assert_eq!(e.shape(), &[256, 151936]);
    assert_eq!(e.ggml_type(), onebit_gguf::GgmlType::Q1_0);
    assert_eq!(e.data().len(), 151936 * 2 * 18);
}
