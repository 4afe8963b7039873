//! SentencePiece vocabularies (`tokenizer.model`, as Llama 2 and Mistral v0.1–v0.3 ship) to
//! GGUF's tokens, scores and token types, as llama.cpp's converter builds them
//! (`tokenizer.ggml.model = llama`).
//!
//! `tokenizer.model` is a protobuf `ModelProto`; only its pieces (field 1: `SentencePiece`
//! with 1 = piece, 2 = score, 3 = type) matter here, so a small wire-format reader skips the
//! rest instead of pulling in a protobuf code generator.

use std::path::Path;

use serde_json::{Map, Value};

use super::ConvertError;
use super::hf::read_json;
use super::vocab::looks_special;

/// llama.cpp's token types (the SentencePiece ones, with BYTE).
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

/// What is wrong with a `tokenizer.model`, and where (byte offset).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProtoError {
    #[error("truncated at byte {0} (the file is cut short or is not a SentencePiece model)")]
    Truncated(usize),
    #[error("bad varint at byte {0}")]
    BadVarint(usize),
    #[error("field {field} at byte {at} has wire type {wire}, expected {want}")]
    WireType { field: u64, wire: u8, want: u8, at: usize },
    #[error("unsupported wire type {wire} at byte {at}")]
    UnknownWire { wire: u8, at: usize },
    #[error("piece {0} is not UTF-8")]
    NotUtf8(usize),
    #[error("piece {index} has unknown type {ty}")]
    UnknownType { index: usize, ty: u64 },
    #[error("no pieces (not a SentencePiece model)")]
    Empty,
}

/// One field of a protobuf message.
enum Field<'a> {
    Varint(u64),
    Fixed32(u32),
    /// The payload and where it starts in the file.
    Bytes(&'a [u8], usize),
    Other,
}

/// Reads a protobuf message's fields in order.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Where `buf` starts in the file, for error offsets.
    base: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ProtoError> {
        let start = self.base + self.pos;
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let &b = self.buf.get(self.pos).ok_or(ProtoError::Truncated(self.base + self.pos))?;
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err(ProtoError::BadVarint(start));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ProtoError::BadVarint(start))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or(ProtoError::Truncated(self.base + self.buf.len()))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// The next (field number, value, its offset), or None at the end.
    fn next(&mut self) -> Result<Option<(u64, Field<'a>, usize)>, ProtoError> {
        if self.pos == self.buf.len() {
            return Ok(None);
        }
        let at = self.base + self.pos;
        let key = self.varint()?;
        let field = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Field::Other
            }
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| ProtoError::Truncated(at))?;
                let off = self.base + self.pos;
                Field::Bytes(self.take(n)?, off)
            }
            5 => {
                let b = self.take(4)?;
                Field::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            }
            w => return Err(ProtoError::UnknownWire { wire: w as u8, at }),
        };
        Ok(Some((key >> 3, field, at)))
    }
}

fn wire_of(f: &Field) -> u8 {
    match f {
        Field::Varint(_) => 0,
        Field::Fixed32(_) => 5,
        Field::Bytes(..) => 2,
        Field::Other => 1,
    }
}

/// One SentencePiece: its text, score and SentencePiece type (1 normal … 6 byte).
#[derive(Debug, PartialEq)]
pub struct Piece {
    pub text: String,
    pub score: f32,
    pub ty: u64,
}

/// The pieces of a serialized `ModelProto`, in id order.
pub fn parse_pieces(buf: &[u8]) -> Result<Vec<Piece>, ProtoError> {
    let mut top = Reader { buf, pos: 0, base: 0 };
    let mut pieces = Vec::new();
    while let Some((field, value, at)) = top.next()? {
        if field != 1 {
            continue;
        }
        let Field::Bytes(msg, base) = value else {
            return Err(ProtoError::WireType { field, wire: wire_of(&value), want: 2, at });
        };
        let index = pieces.len();
        let mut r = Reader { buf: msg, pos: 0, base };
        let mut piece = Piece { text: String::new(), score: 0.0, ty: 1 };
        while let Some((f, v, at)) = r.next()? {
            match (f, v) {
                (1, Field::Bytes(b, _)) => {
                    piece.text = std::str::from_utf8(b).map_err(|_| ProtoError::NotUtf8(index))?.to_string();
                }
                (2, Field::Fixed32(bits)) => piece.score = f32::from_bits(bits),
                (3, Field::Varint(t)) => piece.ty = t,
                (1..=3, v) => {
                    let want = [2, 5, 0][f as usize - 1];
                    return Err(ProtoError::WireType { field: f, wire: wire_of(&v), want, at });
                }
                _ => {}
            }
        }
        if !(1..=6).contains(&piece.ty) {
            return Err(ProtoError::UnknownType { index, ty: piece.ty });
        }
        pieces.push(piece);
    }
    if pieces.is_empty() {
        return Err(ProtoError::Empty);
    }
    Ok(pieces)
}

/// A SentencePiece vocabulary as GGUF lists it.
pub struct SpmVocab {
    pub tokens: Vec<String>,
    pub scores: Vec<f32>,
    pub types: Vec<i32>,
}

/// Tokens, scores and types up to config.json's `vocab_size` (or the model's size): the model's
/// pieces, then `added_tokens.json`, then `tokenizer_config.json`'s `added_tokens_decoder`, the
/// rest `[PAD{i}]`; ids past `vocab_size` are dropped, as llama.cpp drops them.
pub fn load(
    dir: &Path,
    config: &Map<String, Value>,
    tcfg: Option<&Map<String, Value>>,
) -> Result<SpmVocab, ConvertError> {
    let path = dir.join("tokenizer.model");
    let bytes = std::fs::read(&path).map_err(|e| ConvertError::Io(path.clone(), e))?;
    let pieces = parse_pieces(&bytes).map_err(|e| ConvertError::Tokenizer(path.clone(), e.to_string()))?;
    let n = ["vocab_size_per_layer_input", "vocab_size"]
        .iter()
        .find_map(|k| config.get(*k).and_then(|v| v.as_u64()))
        .filter(|&n| n > 0)
        .map_or(pieces.len(), |n| n as usize);
    let mut v = SpmVocab {
        tokens: (0..n).map(|i| format!("[PAD{i}]")).collect(),
        scores: vec![-10000.0; n],
        types: vec![UNUSED; n],
    };
    for (id, p) in pieces.into_iter().take(n).enumerate() {
        // llama.cpp asks the library only for unknown/control/unused/byte: user-defined is normal.
        v.types[id] = match p.ty {
            2 => UNKNOWN,
            3 => CONTROL,
            5 => UNUSED,
            6 => BYTE,
            _ => NORMAL,
        };
        v.tokens[id] = p.text;
        v.scores[id] = p.score;
    }
    let added_path = dir.join("added_tokens.json");
    if let Some(added) = read_json(&added_path)? {
        let added =
            added.as_object().ok_or_else(|| ConvertError::Json(added_path.clone(), "not a JSON object".into()))?;
        for (text, id) in added {
            let id = id
                .as_u64()
                .ok_or_else(|| ConvertError::Json(added_path.clone(), format!("{text:?} has no integer id")))?;
            if let Some(id) = usize::try_from(id).ok().filter(|&i| i < n) {
                (v.tokens[id], v.scores[id], v.types[id]) = (text.clone(), -1000.0, USER_DEFINED);
            }
        }
    }
    let decoder = tcfg.and_then(|c| c.get("added_tokens_decoder")).and_then(|d| d.as_object());
    let cfg_path = dir.join("tokenizer_config.json");
    for (id, data) in decoder.into_iter().flatten() {
        let bad = |why: &str| ConvertError::Tokenizer(cfg_path.clone(), format!("added_tokens_decoder {id:?}: {why}"));
        let id: usize = id.parse().map_err(|_| bad("the key is not a token id"))?;
        let text = data.get("content").and_then(|c| c.as_str()).ok_or_else(|| bad("no \"content\" string"))?;
        if id >= n {
            continue;
        }
        let special = data.get("special").and_then(|s| s.as_bool()).unwrap_or(false);
        (v.tokens[id], v.types[id]) = if special || looks_special(text) {
            (text.to_string(), CONTROL)
        } else {
            (text.replace('\u{2581}', " "), USER_DEFINED)
        };
        v.scores[id] = -1000.0;
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn piece(text: &str, score: f32, ty: Option<u64>) -> Vec<u8> {
        let mut m = vec![0x0a];
        varint(text.len() as u64, &mut m);
        m.extend_from_slice(text.as_bytes());
        m.push(0x15);
        m.extend_from_slice(&score.to_le_bytes());
        if let Some(t) = ty {
            m.push(0x18);
            varint(t, &mut m);
        }
        let mut out = vec![0x0a];
        varint(m.len() as u64, &mut out);
        out.extend(m);
        out
    }

    #[test]
    fn reads_pieces_and_skips_other_fields() {
        let mut buf = piece("<unk>", 0.0, Some(2));
        buf.extend(piece("\u{2581}the", -1.5, None));
        // A trainer spec (field 2) with a varint and a fixed64 inside: skipped whole.
        buf.extend([0x12, 0x0c, 0x08, 0x96, 0x01, 0x11, 1, 2, 3, 4, 5, 6, 7, 8]);
        let p = parse_pieces(&buf).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0], Piece { text: "<unk>".into(), score: 0.0, ty: 2 });
        assert_eq!(p[1], Piece { text: "\u{2581}the".into(), score: -1.5, ty: 1 });
    }

    #[test]
    fn malformed_input_is_a_typed_error() {
        let good = piece("ab", 1.0, Some(1));
        for cut in 1..good.len() {
            assert!(matches!(parse_pieces(&good[..cut]), Err(ProtoError::Truncated(_))), "cut at {cut}");
        }
        let mut long = vec![0x10];
        long.extend([0xff; 11]);
        assert_eq!(parse_pieces(&long), Err(ProtoError::BadVarint(1)));
        assert!(matches!(parse_pieces(&[0x10, 0x01]), Err(ProtoError::Empty)));
        assert!(matches!(parse_pieces(&[0x0d, 0, 0, 0, 0]), Err(ProtoError::WireType { field: 1, wire: 5, .. })));
        assert!(matches!(parse_pieces(&[0x0b]), Err(ProtoError::UnknownWire { wire: 3, .. })));
        assert!(matches!(parse_pieces(&piece("a", 0.0, Some(9))), Err(ProtoError::UnknownType { ty: 9, .. })));
        let mut bad_utf8 = piece("ab", 0.0, None);
        bad_utf8[4] = 0xff;
        assert_eq!(parse_pieces(&bad_utf8), Err(ProtoError::NotUtf8(0)));
        assert_eq!(parse_pieces(b""), Err(ProtoError::Empty));
    }
}
