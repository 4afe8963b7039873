//! Hand-built files that break one rule each: every one must be a typed error naming the field.

use onebit_gguf::{GgmlType, GgufError, GgufFile, GgufModel, GgufWriter, OwnedValue, ValueType};

fn small_model() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", OwnedValue::string("llama"));
    w.set("llama.block_count", OwnedValue::U32(2));
    w.set("tokenizer.ggml.tokens", OwnedValue::strings(["a", "b", "c"]));
    w.set(
        "nested",
        OwnedValue::Array(ValueType::Array, vec![OwnedValue::Array(ValueType::I32, vec![OwnedValue::I32(-1)])]),
    );
    w.add_tensor("a", GgmlType::F32, &[4, 2], vec![0u8; 32]).unwrap();
    w.add_tensor("b", GgmlType::Q8_0, &[32], vec![1u8; 34]).unwrap();
    w.to_bytes().unwrap()
}

/// The starts of the infos of tensors "a" (2 dims) and "b" (1 dim): name length, name, n_dims.
const A_INFO: &[u8] = b"\x01\x00\x00\x00\x00\x00\x00\x00a\x02\x00\x00\x00";
const B_INFO: &[u8] = b"\x01\x00\x00\x00\x00\x00\x00\x00b\x01\x00\x00\x00";

/// Byte offset of the last occurrence of `needle` (tensor infos follow the metadata).
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).rposition(|w| w == needle).expect("needle present")
}

fn open(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(bytes)
}

#[test]
fn a_valid_file_reads_back() {
    let f = open(small_model()).unwrap();
    let md = f.metadata();
    assert_eq!(md.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(md.get_u32("llama.block_count").unwrap(), 2);
    assert_eq!(md.get_u64("llama.block_count").unwrap(), 2);
    assert_eq!(md.get_str_array("tokenizer.ggml.tokens").unwrap(), ["a", "b", "c"]);
    let a = f.tensor("a").unwrap();
    assert_eq!((a.shape(), a.ggml_type(), a.data().len()), (&[4u64, 2][..], GgmlType::F32, 32));
    assert_eq!(f.tensor("b").unwrap().data(), &[1u8; 34]);
    assert_eq!(f.tensor("b").unwrap().offset(), 32);
    assert!(f.tensor("c").is_none());
}

#[test]
fn getters_name_the_key() {
    let f = open(small_model()).unwrap();
    let md = f.metadata();
    let e = md.get_u32("llama.context_length").unwrap_err().to_string();
    assert!(e.contains("'llama.context_length' is missing"), "{e}");
    let e = md.get_str("llama.block_count").unwrap_err().to_string();
    assert!(e.contains("'llama.block_count' has type u32, expected string"), "{e}");
    let e = md.get_i32_array("tokenizer.ggml.tokens").unwrap_err().to_string();
    assert!(e.contains("tokenizer.ggml.tokens"), "{e}");
}

#[test]
fn bad_magic_and_version() {
    let mut b = small_model();
    b[0] = b'X';
    assert!(matches!(open(b).unwrap_err(), GgufError::BadMagic { .. }));
    let mut b = small_model();
    b[4..8].copy_from_slice(&7u32.to_le_bytes());
    let e = open(b).unwrap_err().to_string();
    assert!(e.contains("unsupported GGUF version 7 at byte 4"), "{e}");
    let mut b = small_model();
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(open(b).unwrap_err().to_string().contains("big-endian"));
}

#[test]
fn every_truncation_is_an_error() {
    let full = small_model();
    // Past the last tensor's data only padding remains, and a file may end without it.
    let f = open(full.clone()).unwrap();
    let end = f.data_offset() as usize + 32 + 34;
    for len in 0..end {
        let e = open(full[..len].to_vec()).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("byte") || msg.contains("magic"), "len {len}: {msg}");
    }
}

#[test]
fn oversized_counts_are_refused_before_allocating() {
    let mut b = small_model();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = open(b).unwrap_err().to_string();
    assert!(e.contains("tensor count at byte 8 is 18446744073709551615"), "{e}");
    let mut b = small_model();
    let at = find(&b, b"tokenizer.ggml.tokens") + 21 + 4 + 4; // key, value type, element type
    b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = open(b).unwrap_err().to_string();
    assert!(e.contains("tokenizer.ggml.tokens") && e.contains("1099511627776"), "{e}");
}

#[test]
fn unknown_tensor_type_names_the_id() {
    let mut b = small_model();
    // The info of tensor "b": name, n_dims=1, ne0=32, then the type.
    let at = find(&b, B_INFO) + 9 + 4 + 8;
    assert_eq!(&b[at..at + 4], &8u32.to_le_bytes());
    b[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    let e = open(b).unwrap_err();
    assert!(matches!(e, GgufError::UnknownTensorType { id: 99, .. }), "{e}");
    assert!(e.to_string().contains("unknown ggml type id 99"));
}

#[test]
fn misaligned_overlapping_and_out_of_bounds_offsets() {
    let base = small_model();
    let at = find(&base, B_INFO) + 9 + 4 + 8 + 4;
    let set = |v: u64| {
        let mut b = base.clone();
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        open(b).unwrap_err().to_string()
    };
    assert!(set(33).contains("not a multiple of the alignment 32"));
    assert!(set(0).contains("overlap"));
    assert!(set(1 << 20).contains("beyond the end"));
    assert!(set(u64::MAX - 31).contains("beyond the end"));
}

#[test]
fn shapes_are_checked() {
    let base = small_model();
    let at = find(&base, A_INFO) + 9;
    let mut b = base.clone();
    b[at..at + 4].copy_from_slice(&5u32.to_le_bytes());
    assert!(open(b).unwrap_err().to_string().contains("5 dimensions"));
    let mut b = base.clone();
    b[at + 4..at + 12].copy_from_slice(&(1u64 << 62).to_le_bytes());
    b[at + 12..at + 20].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(open(b).unwrap_err().to_string().contains("overflows"));
    let mut b = base.clone();
    b[at + 4..at + 12].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(open(b).unwrap_err().to_string().contains("negative"));
    // Q8_0 needs whole blocks of 32.
    let bt = find(&base, B_INFO) + 9 + 4;
    let mut b = base.clone();
    b[bt..bt + 8].copy_from_slice(&31u64.to_le_bytes());
    assert!(open(b).unwrap_err().to_string().contains("not a multiple of the Q8_0 block size 32"));
}

#[test]
fn duplicates_are_refused() {
    let mut b = small_model();
    let at = find(&b, B_INFO) + 8;
    b[at] = b'a';
    assert!(matches!(open(b).unwrap_err(), GgufError::DuplicateTensor { .. }));
    let mut w = GgufWriter::new();
    w.set("k1", OwnedValue::U8(1)).set("k2", OwnedValue::U8(2));
    let mut b = w.to_bytes().unwrap();
    let at = find(&b, b"k2");
    b[at + 1] = b'1';
    let e = open(b).unwrap_err().to_string();
    assert!(e.contains("duplicate metadata key 'k1'"), "{e}");
}

#[test]
fn bad_values_are_refused() {
    let mut w = GgufWriter::new();
    w.set("flag", OwnedValue::Bool(true));
    let mut b = w.to_bytes().unwrap();
    let n = b.len();
    b[n - 1] = 7;
    assert!(open(b).unwrap_err().to_string().contains("bool byte is 7"));
    let mut b = w.to_bytes().unwrap();
    b[n - 5] = 13; // the value type
    assert!(open(b).unwrap_err().to_string().contains("unknown value type id 13"));
    let mut w = GgufWriter::new();
    w.set("general.alignment", OwnedValue::U32(24));
    assert!(w.to_bytes().is_err());
}

#[test]
fn deep_nesting_is_refused() {
    let mut v = OwnedValue::Array(ValueType::U8, vec![]);
    for _ in 0..20 {
        v = OwnedValue::Array(ValueType::Array, vec![v]);
    }
    let mut w = GgufWriter::new();
    w.set("deep", v);
    assert!(open(w.to_bytes().unwrap()).unwrap_err().to_string().contains("nested deeper"));
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = GgufWriter::new();
    w.set("general.alignment", OwnedValue::U32(64));
    w.add_tensor("x", GgmlType::F16, &[3], vec![1u8; 6]).unwrap();
    w.add_tensor("y", GgmlType::F16, &[2], vec![2u8; 4]).unwrap();
    let f = open(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.tensor("y").unwrap().offset(), 64);
}

#[test]
fn split_models_open_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("m").to_str().unwrap().to_string();
    for no in 0..3u16 {
        let mut w = GgufWriter::new();
        if no == 0 {
            w.set("general.architecture", OwnedValue::string("llama"));
        }
        w.set("split.no", OwnedValue::U16(no));
        w.set("split.count", OwnedValue::U16(3));
        w.set("split.tensors.count", OwnedValue::I32(3));
        w.add_tensor(format!("t{no}"), GgmlType::F32, &[2], vec![no as u8; 8]).unwrap();
        w.write_file(onebit_gguf::part_name(&prefix, no as u32, 3)).unwrap();
    }
    let m = GgufModel::open(onebit_gguf::part_name(&prefix, 1, 3)).unwrap();
    assert_eq!(m.parts().len(), 3);
    assert_eq!(m.tensor_count(), 3);
    assert_eq!(m.metadata().get_str("general.architecture").unwrap(), "llama");
    assert_eq!(m.tensor("t2").unwrap().data(), &[2u8; 8]);

    std::fs::remove_file(onebit_gguf::part_name(&prefix, 2, 3)).unwrap();
    let e = GgufModel::open(onebit_gguf::part_name(&prefix, 0, 3)).unwrap_err().to_string();
    assert!(e.contains("m-00003-of-00003.gguf"), "{e}");
}
