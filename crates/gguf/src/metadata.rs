//! Metadata values: zero-copy views of the key/value section, and typed getters.
//!
//! Strings and arrays are not copied out of the file at open: a value is a byte range of the
//! map that was walked and validated once. Getters convert on demand and fail with an error
//! that names the key, so callers never see a bare `None` for a malformed model.

use std::fmt;

use crate::error::{GgufError, Result};
use crate::reader::Cursor;

/// The GGUF metadata value types, with their on-disk ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// Bytes of one value on disk, for the fixed-size types.
    pub fn fixed_size(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The fewest bytes one value can occupy on disk (a string's length, an array's header).
    pub(crate) fn min_size(self) -> u64 {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A value as stored in the index: scalars inline, strings and arrays as byte ranges.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RawValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    /// Bytes `off..off+len` of the file.
    Str {
        off: u64,
        len: u64,
    },
    /// `len` elements of type `elem`, laid out in bytes `off..end` of the file.
    Array {
        elem: ValueType,
        len: u64,
        off: u64,
        end: u64,
    },
}

impl RawValue {
    pub(crate) fn view(self, file: &[u8]) -> Value<'_> {
        match self {
            RawValue::U8(v) => Value::U8(v),
            RawValue::I8(v) => Value::I8(v),
            RawValue::U16(v) => Value::U16(v),
            RawValue::I16(v) => Value::I16(v),
            RawValue::U32(v) => Value::U32(v),
            RawValue::I32(v) => Value::I32(v),
            RawValue::F32(v) => Value::F32(v),
            RawValue::Bool(v) => Value::Bool(v),
            RawValue::U64(v) => Value::U64(v),
            RawValue::I64(v) => Value::I64(v),
            RawValue::F64(v) => Value::F64(v),
            RawValue::Str { off, len } => Value::String(&file[off as usize..(off + len) as usize]),
            RawValue::Array { elem, len, off, end } => Value::Array(Array { elem, len, file, off, end }),
        }
    }
}

/// A metadata value borrowed from the file.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    /// Raw bytes: GGUF strings are meant to be UTF-8, but that is checked when one is read as text.
    String(&'a [u8]),
    Array(Array<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> Value<'a> {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value, widened.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any float value (f64 narrowed).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }
}

/// An array value: `len` elements of one type, decoded as they are iterated.
#[derive(Clone, Copy, Debug)]
pub struct Array<'a> {
    elem: ValueType,
    len: u64,
    /// The whole file: element offsets are file offsets.
    file: &'a [u8],
    off: u64,
    end: u64,
}

impl<'a> Array<'a> {
    pub fn elem_type(&self) -> ValueType {
        self.elem
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// File offset of the first element.
    pub fn offset(&self) -> u64 {
        self.off
    }

    /// The encoded elements.
    pub fn bytes(&self) -> &'a [u8] {
        &self.file[self.off as usize..self.end as usize]
    }

    /// The elements in order. The region was validated at open, so decoding cannot fail.
    pub fn iter(&self) -> ArrayIter<'a> {
        let cursor = Cursor::at(&self.file[..self.end as usize], self.off);
        ArrayIter { cursor, file: self.file, elem: self.elem, left: self.len }
    }
}

pub struct ArrayIter<'a> {
    cursor: Cursor<'a>,
    file: &'a [u8],
    elem: ValueType,
    left: u64,
}

impl<'a> Iterator for ArrayIter<'a> {
    type Item = Value<'a>;

    fn next(&mut self) -> Option<Value<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let raw = self.cursor.value(self.elem, &|| String::from("array element"), 0).ok()?;
        Some(raw.view(self.file))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.left).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

impl ArrayIter<'_> {
    /// File offset of the next element.
    pub fn offset(&self) -> u64 {
        self.cursor.pos()
    }
}

/// Typed access to the key/value section of one file.
#[derive(Clone, Copy)]
pub struct Metadata<'a> {
    pub(crate) file: &'a [u8],
    pub(crate) entries: &'a [crate::reader::KvEntry],
    pub(crate) sorted: &'a [u32],
}

impl<'a> Metadata<'a> {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every key and value, in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, Value<'a>)> + 'a {
        let file = self.file;
        self.entries.iter().map(move |e| (e.key(file), e.value.view(file)))
    }

    /// Byte offset of the value of `key`.
    pub fn offset_of(&self, key: &str) -> Option<u64> {
        self.find(key).map(|e| e.value_off)
    }

    fn find(&self, key: &str) -> Option<&'a crate::reader::KvEntry> {
        let file = self.file;
        let i = self.sorted.binary_search_by(|&i| self.entries[i as usize].key(file).cmp(key)).ok()?;
        Some(&self.entries[self.sorted[i] as usize])
    }

    pub fn get(&self, key: &str) -> Option<Value<'a>> {
        self.find(key).map(|e| e.value.view(self.file))
    }

    pub fn contains(&self, key: &str) -> bool {
        self.find(key).is_some()
    }

    fn require(&self, key: &str) -> Result<Value<'a>> {
        self.get(key).ok_or_else(|| GgufError::MissingKey { key: key.to_string() })
    }

    fn int<T: TryFrom<i128>>(&self, key: &str, v: Value<'a>, target: &'static str) -> Result<T> {
        let wide = v.as_i128().ok_or_else(|| wrong_type(key, target, v.value_type()))?;
        T::try_from(wide).map_err(|_| GgufError::OutOfRange { key: key.into(), value: wide.to_string(), target })
    }

    /// An integer key as u32. Any integer type is accepted if the value fits.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.int(key, self.require(key)?, "u32")
    }

    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.int(key, self.require(key)?, "u64")
    }

    pub fn get_i32(&self, key: &str) -> Result<i32> {
        self.int(key, self.require(key)?, "i32")
    }

    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.int(key, self.require(key)?, "i64")
    }

    /// A float key (f32, or f64 narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_f64().map(|x| x as f32).ok_or_else(|| wrong_type(key, "f32", v.value_type()))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            Value::Bool(b) => Ok(b),
            v => Err(wrong_type(key, "bool", v.value_type())),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&'a str> {
        match self.require(key)? {
            Value::String(bytes) => std::str::from_utf8(bytes)
                .map_err(|_| GgufError::NotUtf8 { key: key.into(), offset: self.offset_of(key).unwrap_or(0) }),
            v => Err(wrong_type(key, "string", v.value_type())),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<Array<'a>> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            v => Err(wrong_type(key, "array", v.value_type())),
        }
    }

    fn typed_array(&self, key: &str, want: &'static str) -> Result<Array<'a>> {
        let a = self.get_array(key)?;
        let ok = match want {
            "string" => a.elem == ValueType::String,
            "float" => matches!(a.elem, ValueType::F32 | ValueType::F64),
            _ => a.elem.fixed_size().is_some() && !matches!(a.elem, ValueType::F32 | ValueType::F64 | ValueType::Bool),
        };
        if !ok {
            return Err(GgufError::WrongType {
                key: key.into(),
                expected: format!("array of {want}"),
                found: ValueType::Array,
            });
        }
        Ok(a)
    }

    /// An array of strings, each checked to be UTF-8.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&'a str>> {
        let a = self.typed_array(key, "string")?;
        let mut out = Vec::with_capacity(a.len() as usize);
        let mut it = a.iter();
        loop {
            let at = it.offset();
            let Some(Value::String(b)) = it.next() else {
                break;
            };
            out.push(std::str::from_utf8(b).map_err(|_| GgufError::NotUtf8 { key: key.into(), offset: at })?);
        }
        Ok(out)
    }

    /// An array of strings as raw bytes (vocabularies may hold pieces that are not UTF-8).
    pub fn get_bytes_array(&self, key: &str) -> Result<Vec<&'a [u8]>> {
        let a = self.typed_array(key, "string")?;
        Ok(a.iter().filter_map(|v| if let Value::String(b) = v { Some(b) } else { None }).collect())
    }

    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        self.int_array(key, "i32")
    }

    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>> {
        self.int_array(key, "u32")
    }

    fn int_array<T: TryFrom<i128>>(&self, key: &str, target: &'static str) -> Result<Vec<T>> {
        let a = self.typed_array(key, "integer")?;
        a.iter().map(|v| self.int(key, v, target)).collect()
    }

    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        let a = self.typed_array(key, "float")?;
        Ok(a.iter().filter_map(|v| v.as_f64()).map(|x| x as f32).collect())
    }

    /// `get_u32` for a key that may be absent.
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        if self.contains(key) { self.get_u32(key).map(Some) } else { Ok(None) }
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        if self.contains(key) { self.get_f32(key).map(Some) } else { Ok(None) }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        if self.contains(key) { self.get_bool(key).map(Some) } else { Ok(None) }
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        if self.contains(key) { self.get_str(key).map(Some) } else { Ok(None) }
    }
}

fn wrong_type(key: &str, expected: &str, found: ValueType) -> GgufError {
    GgufError::WrongType { key: key.into(), expected: expected.into(), found }
}
