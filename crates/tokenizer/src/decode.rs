//! Turning ids back into text: each token's piece of bytes (as llama.cpp's `token_to_piece`),
//! whole sequences, and a streaming decoder that never splits a UTF-8 character.

use crate::vocab::{Kind, Vocab, attr};

/// The bytes every token stands for when special tokens are rendered, stored end to end.
pub(crate) struct Pieces {
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

impl Pieces {
    pub(crate) fn build(vocab: &Vocab) -> Pieces {
        let unbyte = crate::bpe::unicode_to_byte();
        let mut p = Pieces { bytes: Vec::with_capacity(vocab.len() * 8), ends: Vec::with_capacity(vocab.len()) };
        for id in 0..vocab.len() as u32 {
            let piece = piece_of(vocab, id, &unbyte);
            p.bytes.extend_from_slice(&piece);
            p.ends.push(p.bytes.len() as u32);
        }
        p
    }

    pub(crate) fn get(&self, id: u32) -> &[u8] {
        let i = id as usize;
        let Some(&end) = self.ends.get(i) else {
            return &[];
        };
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start as usize..end as usize]
    }
}

fn piece_of(vocab: &Vocab, id: u32, unbyte: &[Option<u8>]) -> Vec<u8> {
    let a = vocab.attr(id);
    let text = vocab.text(id).unwrap_or_default();
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        return text.as_bytes().to_vec();
    }
    if a & attr::NORMAL != 0 {
        return match vocab.kind {
            Kind::Spm => text.replace('\u{2581}', " ").into_bytes(),
            Kind::Bpe { .. } => byte_level_decode(text, unbyte),
        };
    }
    if a & attr::BYTE != 0 {
        return byte_of(text).map(|b| vec![b]).unwrap_or_default();
    }
    Vec::new()
}

/// `<0xNN>` to its byte.
fn byte_of(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

/// Undo the GPT-2 byte-to-unicode mapping; characters outside it are kept visible, as
/// llama.cpp does.
fn byte_level_decode(text: &str, unbyte: &[Option<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match unbyte.get(c as usize).copied().flatten() {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// Text as it arrives token by token: complete characters only, never half of one.
#[derive(Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Add a token's bytes and return the text that is now complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).expect("valid prefix"));
                    match e.error_len() {
                        // An incomplete character at the end: wait for the rest.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        // Bytes that can never be valid: show the replacement character.
                        Some(bad) => {
                            out.push('\u{fffd}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is left at the end (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }
}
