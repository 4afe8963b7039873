//! GGUF v3 writers: metadata and tensors, with the data section aligned the way llama.cpp
//! and gguf-py lay it out (tensor data in insertion order, each padded to the alignment).
//!
//! [`GgufWriter`] holds every tensor until it writes the file; [`GgufStreamWriter`] writes the
//! header first (from the tensors' types and shapes alone) and then takes each tensor's bytes
//! as they are produced, so a converter never holds more than the piece it is working on.

use std::borrow::Cow;
use std::io::{self, Write};
use std::path::Path;

use crate::error::{GgufError, Result};
use crate::metadata::{Value, ValueType};
use crate::reader::{DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::types::GgmlType;

/// A metadata value owned by the writer.
#[derive(Clone, Debug, PartialEq)]
pub enum OwnedValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    /// Bytes, normally UTF-8.
    String(Vec<u8>),
    /// Elements must all have the given type.
    Array(ValueType, Vec<OwnedValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl OwnedValue {
    pub fn string(s: impl Into<String>) -> OwnedValue {
        OwnedValue::String(s.into().into_bytes())
    }

    pub fn strings<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> OwnedValue {
        let v = items.into_iter().map(|s| OwnedValue::String(s.as_ref().as_bytes().to_vec())).collect();
        OwnedValue::Array(ValueType::String, v)
    }

    pub fn value_type(&self) -> ValueType {
        match self {
            OwnedValue::U8(_) => ValueType::U8,
            OwnedValue::I8(_) => ValueType::I8,
            OwnedValue::U16(_) => ValueType::U16,
            OwnedValue::I16(_) => ValueType::I16,
            OwnedValue::U32(_) => ValueType::U32,
            OwnedValue::I32(_) => ValueType::I32,
            OwnedValue::F32(_) => ValueType::F32,
            OwnedValue::Bool(_) => ValueType::Bool,
            OwnedValue::String(_) => ValueType::String,
            OwnedValue::Array(..) => ValueType::Array,
            OwnedValue::U64(_) => ValueType::U64,
            OwnedValue::I64(_) => ValueType::I64,
            OwnedValue::F64(_) => ValueType::F64,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) -> Result<()> {
        match self {
            OwnedValue::U8(v) => out.push(*v),
            OwnedValue::I8(v) => out.push(*v as u8),
            OwnedValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::Bool(v) => out.push(*v as u8),
            OwnedValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
            OwnedValue::String(s) => encode_str(s, out),
            OwnedValue::Array(elem, items) => {
                out.extend_from_slice(&elem.id().to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for item in items {
                    if item.value_type() != *elem {
                        return Err(GgufError::Write {
                            reason: format!("array of {elem} holds a {}", item.value_type()),
                        });
                    }
                    item.encode(out)?;
                }
            }
        }
        Ok(())
    }
}

impl From<Value<'_>> for OwnedValue {
    fn from(v: Value<'_>) -> OwnedValue {
        match v {
            Value::U8(x) => OwnedValue::U8(x),
            Value::I8(x) => OwnedValue::I8(x),
            Value::U16(x) => OwnedValue::U16(x),
            Value::I16(x) => OwnedValue::I16(x),
            Value::U32(x) => OwnedValue::U32(x),
            Value::I32(x) => OwnedValue::I32(x),
            Value::F32(x) => OwnedValue::F32(x),
            Value::Bool(x) => OwnedValue::Bool(x),
            Value::U64(x) => OwnedValue::U64(x),
            Value::I64(x) => OwnedValue::I64(x),
            Value::F64(x) => OwnedValue::F64(x),
            Value::String(b) => OwnedValue::String(b.to_vec()),
            Value::Array(a) => OwnedValue::Array(a.elem_type(), a.iter().map(OwnedValue::from).collect()),
        }
    }
}

fn encode_str(s: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

/// The byte size of a tensor of `ty` and `shape` (ggml order), checking that it can be stored.
fn tensor_bytes(name: &str, ty: GgmlType, shape: &[u64]) -> Result<u64> {
    let fail = |reason: String| Err(GgufError::Write { reason: format!("tensor '{name}': {reason}") });
    if shape.len() > MAX_DIMS {
        return fail(format!("{} dimensions, at most {MAX_DIMS}", shape.len()));
    }
    let n = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    match n.and_then(|n| ty.bytes_for(n).filter(|_| shape.first().is_none_or(|d| d % ty.block_size() == 0))) {
        Some(bytes) => Ok(bytes),
        None => fail(format!("shape {shape:?} is not a whole number of {ty} blocks per row")),
    }
}

/// `general.alignment` of a metadata list, or the default.
fn kv_alignment(kvs: &[(String, OwnedValue)]) -> Result<u64> {
    match kvs.iter().find(|(k, _)| k == "general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some((_, OwnedValue::U32(a))) if a.is_power_of_two() => Ok(*a as u64),
        Some((_, v)) => {
            Err(GgufError::Write { reason: format!("general.alignment must be a power-of-two u32, not {v:?}") })
        }
    }
}

/// Everything before the tensor data: header, metadata, tensor infos (name, type, shape, data
/// bytes), and the padding that aligns the data section.
fn encode_header<'n>(
    kvs: &[(String, OwnedValue)],
    tensors: impl ExactSizeIterator<Item = (&'n str, GgmlType, &'n [u64], u64)>,
    alignment: u64,
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&3u32.to_le_bytes());
    let n_tensors = tensors.len();
    out.extend_from_slice(&(n_tensors as u64).to_le_bytes());
    out.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (key, value) in kvs {
        encode_str(key.as_bytes(), &mut out);
        out.extend_from_slice(&value.value_type().id().to_le_bytes());
        value.encode(&mut out)?;
    }
    let mut offset = 0u64;
    for (name, ty, shape, bytes) in tensors {
        encode_str(name.as_bytes(), &mut out);
        out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for d in shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&ty.id().to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset += bytes.next_multiple_of(alignment);
    }
    if n_tensors > 0 {
        out.resize((out.len() as u64).next_multiple_of(alignment) as usize, 0);
    }
    Ok(out)
}

struct PendingTensor<'a> {
    name: String,
    ty: GgmlType,
    shape: Vec<u64>,
    data: Cow<'a, [u8]>,
}

/// Collects metadata and tensors, then writes a GGUF v3 file.
#[derive(Default)]
pub struct GgufWriter<'a> {
    kvs: Vec<(String, OwnedValue)>,
    tensors: Vec<PendingTensor<'a>>,
}

impl<'a> GgufWriter<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add or replace a metadata key (insertion order is kept; a replaced key keeps its place).
    pub fn set(&mut self, key: impl Into<String>, value: OwnedValue) -> &mut Self {
        let key = key.into();
        match self.kvs.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.kvs.push((key, value)),
        }
        self
    }

    /// Add a tensor. `shape` is ggml order (`ne[0]` first); the byte size must match it.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        shape: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<&mut Self> {
        let name = name.into();
        let data = data.into();
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::Write { reason: format!("tensor '{name}': added twice") });
        }
        let want = tensor_bytes(&name, ty, shape)?;
        if want != data.len() as u64 {
            let reason = format!("tensor '{name}': {} bytes do not match shape {shape:?} of type {ty}", data.len());
            return Err(GgufError::Write { reason });
        }
        self.tensors.push(PendingTensor { name, ty, shape: shape.to_vec(), data });
        Ok(self)
    }

    /// Everything before the tensor data: header, metadata, tensor infos, padding.
    fn header(&self, alignment: u64) -> Result<Vec<u8>> {
        let infos = self.tensors.iter().map(|t| (t.name.as_str(), t.ty, t.shape.as_slice(), t.data.len() as u64));
        encode_header(&self.kvs, infos, alignment)
    }

    /// Write the file to `w`.
    pub fn write_to(&self, mut w: impl Write) -> Result<()> {
        let alignment = kv_alignment(&self.kvs)?;
        let io = |e: io::Error| GgufError::Write { reason: e.to_string() };
        w.write_all(&self.header(alignment)?).map_err(io)?;
        let zeros = vec![0u8; alignment as usize];
        for t in &self.tensors {
            w.write_all(&t.data).map_err(io)?;
            let pad = (t.data.len() as u64).next_multiple_of(alignment) - t.data.len() as u64;
            w.write_all(&zeros[..pad as usize]).map_err(io)?;
        }
        w.flush().map_err(io)
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    /// Write the file to `path` (through a buffer; the file is replaced).
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let f = std::fs::File::create(path).map_err(|source| GgufError::Io { path: path.into(), source })?;
        self.write_to(io::BufWriter::with_capacity(1 << 20, f))
    }
}

/// One tensor of a streamed file, declared before any data is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// ggml order (`ne[0]` first), stored exactly as given.
    pub shape: Vec<u64>,
}

/// Writes a GGUF v3 file front to back: the header at once, then each tensor's bytes in the
/// declared order, in as many pieces as the caller likes.
pub struct GgufStreamWriter<W: Write> {
    w: W,
    alignment: u64,
    /// (name, byte size) of every declared tensor.
    sizes: Vec<(String, u64)>,
    /// The tensor being written, and how many of its bytes have been.
    current: usize,
    written: u64,
}

impl<W: Write> GgufStreamWriter<W> {
    /// Check the tensors against their types, then write the header to `w`.
    pub fn new(mut w: W, kvs: &[(String, OwnedValue)], tensors: &[TensorInfo]) -> Result<Self> {
        let alignment = kv_alignment(kvs)?;
        let mut sizes: Vec<(String, u64)> = Vec::with_capacity(tensors.len());
        for t in tensors {
            let bytes = tensor_bytes(&t.name, t.ty, &t.shape)?;
            if sizes.iter().any(|(n, _)| *n == t.name) {
                return Err(GgufError::Write { reason: format!("tensor '{}': declared twice", t.name) });
            }
            sizes.push((t.name.clone(), bytes));
        }
        let infos = tensors.iter().zip(&sizes).map(|(t, (_, b))| (t.name.as_str(), t.ty, t.shape.as_slice(), *b));
        let header = encode_header(kvs, infos, alignment)?;
        w.write_all(&header).map_err(write_error)?;
        Ok(GgufStreamWriter { w, alignment, sizes, current: 0, written: 0 })
    }

    /// The next bytes of the current tensor.
    pub fn write_data(&mut self, bytes: &[u8]) -> Result<()> {
        let Some((name, size)) = self.sizes.get(self.current) else {
            return Err(GgufError::Write { reason: "data written after the last tensor".into() });
        };
        if self.written + bytes.len() as u64 > *size {
            let reason = format!("tensor '{name}': more than its {size} bytes written");
            return Err(GgufError::Write { reason });
        }
        self.w.write_all(bytes).map_err(write_error)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Close the current tensor (all its bytes must have been written) and pad to the alignment.
    pub fn end_tensor(&mut self) -> Result<()> {
        let Some((name, size)) = self.sizes.get(self.current) else {
            return Err(GgufError::Write { reason: "no tensor left to end".into() });
        };
        if self.written != *size {
            let reason = format!("tensor '{name}': {} of its {size} bytes written", self.written);
            return Err(GgufError::Write { reason });
        }
        let pad = size.next_multiple_of(self.alignment) - size;
        self.w.write_all(&vec![0u8; pad as usize]).map_err(write_error)?;
        self.current += 1;
        self.written = 0;
        Ok(())
    }

    /// Check that every tensor was written, flush, and hand back the writer.
    pub fn finish(mut self) -> Result<W> {
        if let Some((name, _)) = self.sizes.get(self.current) {
            return Err(GgufError::Write { reason: format!("tensor '{name}' was never written") });
        }
        self.w.flush().map_err(write_error)?;
        Ok(self.w)
    }
}

fn write_error(e: io::Error) -> GgufError {
    GgufError::Write { reason: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_file_equals_the_buffered_one() {
        let kvs = vec![
            ("general.architecture".to_string(), OwnedValue::string("llama")),
            ("x".to_string(), OwnedValue::U32(7)),
        ];
        let a: Vec<u8> = (0..34).collect();
        let b: Vec<u8> = (0..8).collect();
        let mut buffered = GgufWriter::new();
        for (k, v) in &kvs {
            buffered.set(k.clone(), v.clone());
        }
        buffered.add_tensor("a", GgmlType::Q8_0, &[32], a.as_slice()).unwrap();
        buffered.add_tensor("b", GgmlType::F32, &[2, 1], b.as_slice()).unwrap();
        let infos = [
            TensorInfo { name: "a".into(), ty: GgmlType::Q8_0, shape: vec![32] },
            TensorInfo { name: "b".into(), ty: GgmlType::F32, shape: vec![2, 1] },
        ];
        let mut s = GgufStreamWriter::new(Vec::new(), &kvs, &infos).unwrap();
        s.write_data(&a[..10]).unwrap();
        s.write_data(&a[10..]).unwrap();
        assert!(s.write_data(&[0]).is_err(), "past the end of a tensor");
        s.end_tensor().unwrap();
        s.write_data(&b[..4]).unwrap();
        assert!(s.end_tensor().is_err(), "short tensor");
        s.write_data(&b[4..]).unwrap();
        s.end_tensor().unwrap();
        assert_eq!(s.finish().unwrap(), buffered.to_bytes().unwrap());
    }

    #[test]
    fn stream_refuses_bad_declarations_and_missing_data() {
        let bad = [TensorInfo { name: "a".into(), ty: GgmlType::Q4_0, shape: vec![33] }];
        assert!(GgufStreamWriter::new(Vec::new(), &[], &bad).is_err());
        let twice = [
            TensorInfo { name: "a".into(), ty: GgmlType::F32, shape: vec![1] },
            TensorInfo { name: "a".into(), ty: GgmlType::F32, shape: vec![1] },
        ];
        assert!(GgufStreamWriter::new(Vec::new(), &[], &twice).is_err());
        let one = [TensorInfo { name: "a".into(), ty: GgmlType::F32, shape: vec![1] }];
        assert!(GgufStreamWriter::new(Vec::new(), &[], &one).unwrap().finish().is_err());
    }
}
