//! The GGUF parser: walks the header, metadata and tensor infos once, bounds-checking every
//! read, and produces a compact index of byte ranges into the file.
//!
//! Rules enforced here (each failure is a typed error naming the field and its byte offset):
//! magic and version; every count and length bounded by the bytes that remain; known value and
//! tensor types; at most 4 dimensions, each below 2^63, with an element count that does not
//! overflow and a first dimension that is whole blocks; offsets aligned, in bounds and not
//! overlapping; unique keys and tensor names; and an index no larger than the file itself
//! (plus [`INDEX_SLACK`]).

use std::mem::size_of;

use crate::error::{GgufError, Result};
use crate::metadata::{RawValue, ValueType};
use crate::types::GgmlType;

pub const MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const MAX_DIMS: usize = 4;
/// Arrays of arrays deeper than this are refused, so recursion stays shallow.
const MAX_ARRAY_DEPTH: u32 = 8;

/// A bounds-checked little-endian reader over a byte slice. Positions are offsets in the slice.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: u64,
}

type FieldName<'f> = &'f dyn Fn() -> String;

impl<'a> Cursor<'a> {
    pub(crate) fn at(buf: &'a [u8], pos: u64) -> Self {
        Cursor { buf, pos }
    }

    pub(crate) fn pos(&self) -> u64 {
        self.pos
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() as u64).saturating_sub(self.pos)
    }

    fn take(&mut self, n: u64, field: FieldName) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                field: field(),
                offset: self.pos,
                needed: n,
                available: self.remaining(),
            });
        }
        let start = self.pos as usize;
        self.pos += n;
        Ok(&self.buf[start..start + n as usize])
    }

    fn array<const N: usize>(&mut self, field: FieldName) -> Result<[u8; N]> {
        let bytes = self.take(N as u64, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u32(&mut self, field: FieldName) -> Result<u32> {
        self.array(field).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, field: FieldName) -> Result<u64> {
        self.array(field).map(u64::from_le_bytes)
    }

    /// A count of items that each occupy at least `min_bytes`: refused if the rest of the file
    /// could not possibly hold them.
    fn count(&mut self, min_bytes: u64, field: FieldName) -> Result<u64> {
        let offset = self.pos;
        let count = self.u64(field)?;
        let remaining = self.remaining();
        if count.checked_mul(min_bytes).is_none_or(|need| need > remaining) {
            return Err(GgufError::CountTooLarge { field: field(), offset, count, remaining });
        }
        Ok(count)
    }

    /// A GGUF string: u64 length, then bytes. Returns (offset, length) of the bytes.
    fn string(&mut self, field: FieldName) -> Result<(u64, u64)> {
        let len = self.count(1, field)?;
        let off = self.pos;
        self.pos += len;
        Ok((off, len))
    }

    fn value_type(&mut self, field: FieldName) -> Result<ValueType> {
        let offset = self.pos;
        let id = self.u32(field)?;
        ValueType::from_id(id).ok_or_else(|| GgufError::Invalid {
            field: field(),
            offset,
            reason: format!("unknown value type id {id} (known: 0..=12)"),
        })
    }

    /// One value of type `ty`; arrays are walked (and so validated) but not copied.
    pub(crate) fn value(&mut self, ty: ValueType, field: FieldName, depth: u32) -> Result<RawValue> {
        Ok(match ty {
            ValueType::U8 => RawValue::U8(self.array::<1>(field)?[0]),
            ValueType::I8 => RawValue::I8(self.array::<1>(field)?[0] as i8),
            ValueType::U16 => RawValue::U16(u16::from_le_bytes(self.array(field)?)),
            ValueType::I16 => RawValue::I16(i16::from_le_bytes(self.array(field)?)),
            ValueType::U32 => RawValue::U32(self.u32(field)?),
            ValueType::I32 => RawValue::I32(i32::from_le_bytes(self.array(field)?)),
            ValueType::F32 => RawValue::F32(f32::from_le_bytes(self.array(field)?)),
            ValueType::U64 => RawValue::U64(self.u64(field)?),
            ValueType::I64 => RawValue::I64(i64::from_le_bytes(self.array(field)?)),
            ValueType::F64 => RawValue::F64(f64::from_le_bytes(self.array(field)?)),
            ValueType::Bool => {
                let offset = self.pos;
                match self.array::<1>(field)?[0] {
                    0 => RawValue::Bool(false),
                    1 => RawValue::Bool(true),
                    b => {
                        return Err(GgufError::Invalid {
                            field: field(),
                            offset,
                            reason: format!("bool byte is {b}, not 0 or 1"),
                        });
                    }
                }
            }
            ValueType::String => {
                let (off, len) = self.string(field)?;
                RawValue::Str { off, len }
            }
            ValueType::Array => self.array_value(field, depth)?,
        })
    }

    fn array_value(&mut self, field: FieldName, depth: u32) -> Result<RawValue> {
        let start = self.pos;
        if depth >= MAX_ARRAY_DEPTH {
            return Err(GgufError::Invalid {
                field: field(),
                offset: start,
                reason: format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
            });
        }
        let elem = self.value_type(field)?;
        let len = self.count(elem.min_size(), field)?;
        let off = self.pos;
        if let Some(size) = elem.fixed_size() {
            // `count` proved len * min_size fits; for fixed types min_size is the size.
            self.take(len * size, field)?;
            if elem == ValueType::Bool {
                let bytes = &self.buf[off as usize..self.pos as usize];
                if let Some(i) = bytes.iter().position(|&b| b > 1) {
                    return Err(GgufError::Invalid {
                        field: field(),
                        offset: off + i as u64,
                        reason: format!("bool byte is {}, not 0 or 1", bytes[i]),
                    });
                }
            }
        } else {
            for _ in 0..len {
                self.value(elem, field, depth + 1)?;
            }
        }
        Ok(RawValue::Array { elem, len, off, end: self.pos })
    }
}

/// One key/value pair of the index.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KvEntry {
    pub(crate) key_off: u64,
    pub(crate) key_len: u32,
    pub(crate) value_off: u64,
    pub(crate) value: RawValue,
}

impl KvEntry {
    pub(crate) fn key<'a>(&self, file: &'a [u8]) -> &'a str {
        let bytes = &file[self.key_off as usize..self.key_off as usize + self.key_len as usize];
        // Keys are checked to be UTF-8 when the index is built.
        std::str::from_utf8(bytes).unwrap_or_default()
    }
}

/// One tensor of the index. Offsets are absolute file offsets.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TensorEntry {
    pub(crate) name_off: u64,
    pub(crate) name_len: u32,
    pub(crate) info_off: u64,
    pub(crate) ty: GgmlType,
    pub(crate) n_dims: u8,
    pub(crate) ne: [u64; MAX_DIMS],
    /// Offset relative to the start of the data section, as stored.
    pub(crate) rel_offset: u64,
    pub(crate) data_off: u64,
    pub(crate) n_bytes: u64,
}

impl TensorEntry {
    pub(crate) fn name<'a>(&self, file: &'a [u8]) -> &'a str {
        let bytes = &file[self.name_off as usize..self.name_off as usize + self.name_len as usize];
        std::str::from_utf8(bytes).unwrap_or_default()
    }
}

/// The validated index of one GGUF file.
#[derive(Debug)]
pub(crate) struct Layout {
    pub(crate) version: u32,
    pub(crate) alignment: u64,
    pub(crate) data_offset: u64,
    pub(crate) kvs: Vec<KvEntry>,
    pub(crate) kv_sorted: Vec<u32>,
    pub(crate) tensors: Vec<TensorEntry>,
    pub(crate) tensor_sorted: Vec<u32>,
}

/// Memory the index may take beyond the file's size, so tiny hand-made files stay readable.
pub const INDEX_SLACK: u64 = 64 << 10;

/// Tracks the memory the index takes, refusing to exceed the file's size (plus [`INDEX_SLACK`]).
struct Budget {
    used: u64,
    limit: u64,
}

impl Budget {
    fn charge(&mut self, bytes: u64) -> Result<()> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limit {
            return Err(GgufError::IndexTooLarge { needed: self.used, file_len: self.limit - INDEX_SLACK });
        }
        Ok(())
    }
}

/// Parse and validate a whole GGUF file held in `buf`.
pub(crate) fn parse(buf: &[u8]) -> Result<Layout> {
    let file_len = buf.len() as u64;
    let mut cur = Cursor::at(buf, 0);
    let magic = cur.array::<4>(&|| "magic".into())?;
    if &magic != MAGIC {
        return Err(GgufError::BadMagic { found: magic.escape_ascii().to_string() });
    }
    let version = cur.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        let hint = if matches!(version.swap_bytes(), 2 | 3) {
            "; this looks like a big-endian GGUF file, which onebit does not read"
        } else if version == 1 {
            "; version 1 files use 32-bit counts: convert them with a current gguf tool"
        } else {
            ""
        };
        return Err(GgufError::UnsupportedVersion { version, hint });
    }
    // Minimum on-disk sizes: a tensor info is a name length, n_dims, type and offset (24 bytes);
    // a key/value is a non-empty key, a type and a value of at least one byte (14 bytes).
    let n_tensors = cur.count(24, &|| "tensor count".into())?;
    let n_kv = cur.count(14, &|| "metadata key/value count".into())?;

    let mut budget = Budget { used: 0, limit: file_len + INDEX_SLACK };
    budget.charge(n_kv * (size_of::<KvEntry>() + 4) as u64)?;
    budget.charge(n_tensors * (size_of::<TensorEntry>() + 4) as u64)?;

    let kvs = parse_kvs(&mut cur, n_kv)?;
    let kv_sorted = sorted_unique(
        buf,
        &kvs,
        |e, f| e.key(f),
        |e, f| GgufError::DuplicateKey { key: e.key(f).into(), offset: e.key_off - 8 },
    )?;
    let alignment = alignment_of(buf, &kvs, &kv_sorted)?;
    let mut tensors = parse_tensor_infos(&mut cur, n_tensors)?;
    let tensor_sorted = sorted_unique(
        buf,
        &tensors,
        |t, f| t.name(f),
        |t, f| GgufError::DuplicateTensor { name: t.name(f).into(), offset: t.info_off },
    )?;

    let data_offset = cur.pos().div_ceil(alignment).saturating_mul(alignment);
    if !tensors.is_empty() && data_offset > file_len {
        return Err(GgufError::Truncated {
            field: "padding before the tensor data section".into(),
            offset: cur.pos(),
            needed: data_offset - cur.pos(),
            available: file_len - cur.pos(),
        });
    }
    place_tensors(buf, &mut tensors, data_offset, alignment)?;
    Ok(Layout { version, alignment, data_offset, kvs, kv_sorted, tensors, tensor_sorted })
}

fn parse_kvs(cur: &mut Cursor, n_kv: u64) -> Result<Vec<KvEntry>> {
    let mut kvs = Vec::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let entry_off = cur.pos();
        let key_field = || format!("key of metadata entry {i}");
        let (key_off, key_len) = cur.string(&key_field)?;
        let key_bytes = &cur.buf[key_off as usize..(key_off + key_len) as usize];
        let key = match std::str::from_utf8(key_bytes) {
            Ok(k) if !k.is_empty() && key_len <= u32::MAX as u64 => k,
            _ => {
                return Err(GgufError::Invalid {
                    field: key_field(),
                    offset: entry_off,
                    reason: "keys must be non-empty UTF-8".into(),
                });
            }
        };
        let value_field = || format!("value of metadata key '{key}'");
        let ty = cur.value_type(&|| format!("type of metadata key '{key}'"))?;
        let value_off = cur.pos();
        let value = cur.value(ty, &value_field, 0)?;
        kvs.push(KvEntry { key_off, key_len: key_len as u32, value_off, value });
    }
    Ok(kvs)
}

/// `general.alignment`: a power of two stored as u32, or 32 when absent.
fn alignment_of(buf: &[u8], kvs: &[KvEntry], sorted: &[u32]) -> Result<u64> {
    let found = sorted
        .binary_search_by(|&i| kvs[i as usize].key(buf).cmp("general.alignment"))
        .ok()
        .map(|i| kvs[sorted[i] as usize]);
    let Some(entry) = found else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match entry.value {
        RawValue::U32(a) if a.is_power_of_two() => Ok(a as u64),
        other => Err(GgufError::Invalid {
            field: "general.alignment".into(),
            offset: entry.value_off,
            reason: format!("must be a power of two stored as u32, found {other:?}"),
        }),
    }
}

fn parse_tensor_infos(cur: &mut Cursor, n_tensors: u64) -> Result<Vec<TensorEntry>> {
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let info_off = cur.pos();
        let name_field = || format!("name of tensor {i}");
        let (name_off, name_len) = cur.string(&name_field)?;
        let name_bytes = &cur.buf[name_off as usize..(name_off + name_len) as usize];
        let name = match std::str::from_utf8(name_bytes) {
            Ok(n) if name_len <= u32::MAX as u64 => n,
            _ => {
                return Err(GgufError::Invalid {
                    field: name_field(),
                    offset: info_off,
                    reason: "tensor names must be UTF-8".into(),
                });
            }
        };
        let bad = |reason: String| GgufError::BadTensor { tensor: name.into(), offset: info_off, reason };
        let dims_off = cur.pos();
        let n_dims = cur.u32(&|| format!("dimension count of tensor '{name}'"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::Invalid {
                field: format!("dimension count of tensor '{name}'"),
                offset: dims_off,
                reason: format!("{n_dims} dimensions, at most {MAX_DIMS} are allowed"),
            });
        }
        let mut ne = [1u64; MAX_DIMS];
        for (d, slot) in ne.iter_mut().take(n_dims as usize).enumerate() {
            let at = cur.pos();
            *slot = cur.u64(&|| format!("dimension {d} of tensor '{name}'"))?;
            if *slot > i64::MAX as u64 {
                return Err(GgufError::Invalid {
                    field: format!("dimension {d} of tensor '{name}'"),
                    offset: at,
                    reason: format!("{} is negative as ggml's int64", *slot as i64),
                });
            }
        }
        let type_off = cur.pos();
        let type_id = cur.u32(&|| format!("type of tensor '{name}'"))?;
        let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
            tensor: name.into(),
            offset: type_off,
            id: type_id,
        })?;
        let rel_offset = cur.u64(&|| format!("data offset of tensor '{name}'"))?;
        let n_elems = ne.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d).filter(|&n| n <= i64::MAX as u64));
        let n_elems =
            n_elems.ok_or_else(|| bad(format!("element count of shape {:?} overflows", &ne[..n_dims as usize])))?;
        if ne[0] % ty.block_size() != 0 {
            return Err(bad(format!(
                "first dimension {} is not a multiple of the {} block size {}",
                ne[0],
                ty,
                ty.block_size()
            )));
        }
        let n_bytes = ty.bytes_for(n_elems).ok_or_else(|| bad("byte size overflows".into()))?;
        tensors.push(TensorEntry {
            name_off,
            name_len: name_len as u32,
            info_off,
            ty,
            n_dims: n_dims as u8,
            ne,
            rel_offset,
            data_off: 0,
            n_bytes,
        });
    }
    Ok(tensors)
}

/// Resolve every tensor's absolute range and check alignment, bounds and overlap.
fn place_tensors(buf: &[u8], tensors: &mut [TensorEntry], data_offset: u64, alignment: u64) -> Result<()> {
    let file_len = buf.len() as u64;
    for t in tensors.iter_mut() {
        let bad = |reason: String| GgufError::BadTensor { tensor: t.name(buf).into(), offset: t.info_off, reason };
        if t.rel_offset % alignment != 0 {
            return Err(bad(format!("data offset {} is not a multiple of the alignment {alignment}", t.rel_offset)));
        }
        let start = data_offset.checked_add(t.rel_offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= file_len => t.data_off = s,
            _ => {
                return Err(bad(format!(
                    "data bytes {}..{} (+{} data section start) lie beyond the end of the {file_len}-byte file",
                    t.rel_offset,
                    t.rel_offset.saturating_add(t.n_bytes),
                    data_offset
                )));
            }
        }
    }
    let mut by_offset: Vec<&TensorEntry> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    by_offset.sort_by_key(|t| t.rel_offset);
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.rel_offset + a.n_bytes > b.rel_offset {
            return Err(GgufError::TensorOverlap {
                first: a.name(buf).into(),
                second: b.name(buf).into(),
                first_start: a.rel_offset,
                first_end: a.rel_offset + a.n_bytes,
                second_start: b.rel_offset,
                second_end: b.rel_offset + b.n_bytes,
            });
        }
    }
    Ok(())
}

/// Indices of `items` sorted by name; the first duplicate name is an error.
fn sorted_unique<'b, T>(
    buf: &'b [u8],
    items: &[T],
    name: impl Fn(&T, &'b [u8]) -> &'b str,
    duplicate: impl Fn(&T, &'b [u8]) -> GgufError,
) -> Result<Vec<u32>> {
    let mut idx: Vec<u32> = (0..items.len() as u32).collect();
    idx.sort_by(|&a, &b| name(&items[a as usize], buf).cmp(name(&items[b as usize], buf)).then(a.cmp(&b)));
    for pair in idx.windows(2) {
        let (a, b) = (&items[pair[0] as usize], &items[pair[1] as usize]);
        if name(a, buf) == name(b, buf) {
            return Err(duplicate(b, buf));
        }
    }
    Ok(idx)
}
