//! The base model's log probabilities on disk, in llama-perplexity's `--kl-divergence-base`
//! format, so that a file either tool writes can be read by the other:
//!
//! ```text
//! "_logits_"                 8 bytes
//! n_ctx     u32              tokens per chunk
//! n_vocab   i32
//! n_chunk   i32
//! tokens    i32 × n_chunk·n_ctx   the evaluated text, as tokenized (before any BOS swap)
//! then per chunk, per scored position (n_ctx − 1 − n_ctx/2 of them), record_len(n_vocab) u16:
//!   scale f32, lowest f32, then q_i u16 per token (ln p_i = scale·q_i + lowest), padding
//! ```
//!
//! Everything is little-endian (llama.cpp writes its machine's order; every machine it and
//! onebit run on is little-endian).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::score::record_len;

const MAGIC: &[u8; 8] = b"_logits_";

/// What a file's header says.
#[derive(Clone, Debug)]
pub struct Header {
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    pub tokens: Vec<u32>,
}

#[cfg(test)]
impl Header {
    /// Scored positions per chunk.
    pub fn scored(&self) -> usize {
        self.n_ctx - 1 - self.n_ctx / 2
    }
}

/// Writes the header, then rows as they are scored, in chunk order.
pub struct Writer {
    out: BufWriter<File>,
    path: PathBuf,
    bytes: Vec<u8>,
}

impl Writer {
    pub fn create(path: &Path, header: &Header) -> Result<Writer> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut w =
            Writer { out: BufWriter::with_capacity(1 << 20, file), path: path.to_path_buf(), bytes: Vec::new() };
        let mut head = Vec::with_capacity(20 + 4 * header.tokens.len());
        head.extend_from_slice(MAGIC);
        for v in [header.n_ctx, header.n_vocab, header.n_chunk] {
            head.extend_from_slice(&u32::try_from(v).context("too large for the logits file format")?.to_le_bytes());
        }
        head.extend(header.tokens.iter().flat_map(|t| t.to_le_bytes()));
        w.write(&head)?;
        Ok(w)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).with_context(|| format!("writing {}", self.path.display()))
    }

    /// Append records (each `record_len(n_vocab)` u16).
    pub fn rows(&mut self, records: &[u16]) -> Result<()> {
        let mut bytes = std::mem::take(&mut self.bytes);
        bytes.clear();
        bytes.extend(records.iter().flat_map(|v| v.to_le_bytes()));
        let r = self.write(&bytes);
        self.bytes = bytes;
        r
    }

    pub fn finish(mut self) -> Result<()> {
        self.out.flush().with_context(|| format!("writing {}", self.path.display()))
    }
}

/// Reads the header, then the records chunk by chunk.
pub struct Reader {
    input: BufReader<File>,
    path: PathBuf,
    pub header: Header,
    record: usize,
    bytes: Vec<u8>,
}

impl Reader {
    /// Open a file and check that its length is what its header promises, so that a truncated
    /// or foreign file is refused before any work is done.
    pub fn open(path: &Path) -> Result<Reader> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let len = file.metadata().with_context(|| format!("reading {}", path.display()))?.len();
        let mut input = BufReader::with_capacity(1 << 20, file);
        let what = || format!("{} is not a logits file of --kl-divergence-base", path.display());
        let mut head = [0u8; 20];
        input.read_exact(&mut head).with_context(what)?;
        if &head[..8] != MAGIC {
            bail!("{}", what());
        }
        let word = |i: usize| u32::from_le_bytes(head[8 + 4 * i..12 + 4 * i].try_into().expect("4 bytes")) as usize;
        let (n_ctx, n_vocab, n_chunk) = (word(0), word(1), word(2));
        if n_ctx < 3 || n_vocab == 0 || n_vocab > i32::MAX as usize || n_chunk == 0 || n_chunk > i32::MAX as usize {
            bail!("{}: bad header (n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk})", what());
        }
        let n_tokens = n_ctx as u64 * n_chunk as u64;
        let scored = (n_ctx - 1 - n_ctx / 2) as u64;
        let expected = 20 + 4 * n_tokens + n_chunk as u64 * scored * 2 * record_len(n_vocab) as u64;
        if len != expected {
            bail!(
                "{} holds {len} bytes, but its header (n_ctx {n_ctx}, n_vocab {n_vocab}, {n_chunk} chunks) \
                 means {expected}: truncated or not a logits file",
                path.display()
            );
        }
        let mut raw = vec![0u8; 4 * n_tokens as usize];
        input.read_exact(&mut raw).with_context(|| format!("reading the tokens of {}", path.display()))?;
        let tokens: Vec<u32> =
            raw.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            bail!("{}: token {t} is outside its vocabulary of {n_vocab}", path.display());
        }
        let header = Header { n_ctx, n_vocab, n_chunk, tokens };
        Ok(Reader { input, path: path.to_path_buf(), record: record_len(n_vocab), header, bytes: Vec::new() })
    }

    /// Read the next `n` records into `out`.
    pub fn rows(&mut self, n: usize, out: &mut Vec<u16>) -> Result<()> {
        self.bytes.resize(n * self.record * 2, 0);
        self.input.read_exact(&mut self.bytes).with_context(|| format!("reading {}", self.path.display()))?;
        out.clear();
        out.extend(self.bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.kld");
        let header = Header { n_ctx: 8, n_vocab: 5, n_chunk: 2, tokens: (0..16).map(|i| i % 5).collect() };
        let rec = record_len(5);
        let rows: Vec<u16> = (0..(2 * header.scored() * rec) as u16).collect();
        let mut w = Writer::create(&path, &header).unwrap();
        w.rows(&rows[..rows.len() / 2]).unwrap();
        w.rows(&rows[rows.len() / 2..]).unwrap();
        w.finish().unwrap();
        let mut r = Reader::open(&path).unwrap();
        assert_eq!((r.header.n_ctx, r.header.n_vocab, r.header.n_chunk), (8, 5, 2));
        assert_eq!(r.header.tokens, header.tokens);
        let mut got = Vec::new();
        r.rows(header.scored(), &mut got).unwrap();
        assert_eq!(got, rows[..rows.len() / 2]);
    }

    #[test]
    fn truncated_and_foreign_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.kld");
        let header = Header { n_ctx: 8, n_vocab: 5, n_chunk: 1, tokens: vec![1; 8] };
        let mut w = Writer::create(&path, &header).unwrap();
        w.rows(&vec![0; header.scored() * record_len(5) - 1]).unwrap();
        w.finish().unwrap();
        let err = Reader::open(&path).err().unwrap().to_string();
        assert!(err.contains("truncated"), "{err}");
        std::fs::write(&path, b"GGUF and more bytes than twenty").unwrap();
        let err = Reader::open(&path).err().unwrap().to_string();
        assert!(err.contains("not a logits file"), "{err}");
    }
}
