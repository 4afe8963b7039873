//! A model's repacked weights kept in a file, so that the next load maps them instead of
//! repacking.
//!
//! Repacking is fast, but it writes a copy of the weights into fresh memory, and the first
//! write to a fresh page is what a load spends most of its time on (in a VM each page also
//! costs the host a fault: 1–2 s a GiB on the machines this was measured on). A file the kernel
//! already holds in its page cache maps in milliseconds and is shared by every process that
//! runs the same model. The file is written once, beside nothing else that onebit owns (the
//! caller picks the folder), and never changed in place: a new copy is written under a
//! temporary name and renamed over the old, so a file that a process has mapped is never
//! truncated under it.
//!
//! Layout: the 8-byte magic, the header's length (u32 LE), the header (text: format version,
//! kernel tier, the source the caller names, and one line per matrix: type, rows, columns and
//! byte range), zero padding to a 4 KiB boundary, then the packed bytes. A file is used only
//! when its header equals, byte for byte, the one this load would write, and its length is
//! exact; anything else is a miss, and the weights are repacked (and the file rewritten).

use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::Path;

use crate::matmul::MatRef;
use crate::tier::KernelTier;

const MAGIC: &[u8; 8] = b"ONEBITPK";
/// Bump when any packed layout changes.
const VERSION: u32 = 1;
const ALIGN: usize = 4096;

/// What a cache file must say about itself to be used for a load.
pub(crate) struct Header(Vec<u8>);

impl Header {
    /// The header for `mats` packed by `tier` into `ranges` of one buffer of `len` bytes.
    /// `source` names what the weights came from (the caller's: e.g. the model file's path,
    /// size and modification time), so that a changed model file is a miss.
    pub(crate) fn new(
        tier: KernelTier,
        source: &str,
        mats: &[MatRef],
        ranges: &[Option<Range<usize>>],
        len: usize,
    ) -> Header {
        let mut text = format!("version {VERSION}\ntier {tier}\nsource {source}\nbytes {len}\n");
        for (w, r) in mats.iter().zip(ranges) {
            if let Some(r) = r {
                text.push_str(&format!("{} {} {} {}..{}\n", w.ty, w.rows, w.cols, r.start, r.end));
            }
        }
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&(text.len() as u32).to_le_bytes());
        bytes.extend_from_slice(text.as_bytes());
        Header(bytes)
    }

    /// Where the packed bytes start in the file.
    fn data_offset(&self) -> usize {
        self.0.len().next_multiple_of(ALIGN)
    }
}

/// The packed bytes of `path`, mapped read-only, if it is the cache for `header` with
/// `len` bytes of data. Any mismatch or error is a miss (`None`).
pub(crate) fn open(path: &Path, header: &Header, len: usize) -> Option<memmap2::Mmap> {
    let file = File::open(path).ok()?;
    let offset = header.data_offset();
    if file.metadata().ok()?.len() != (offset + len) as u64 {
        return None;
    }
    let mut head = vec![0u8; header.0.len()];
    std::io::Read::read_exact(&mut &file, &mut head).ok()?;
    if head != header.0 {
        return None;
    }
    // SAFETY: onebit never writes to a cache file after renaming it into place (`save`
    // replaces a file by renaming a new one over it, which leaves an existing mapping on the
    // old contents), so the mapped bytes do not change while mapped. A file that something
    // else truncates would fault on access, as any memory-mapped model file would.
    let map = unsafe { memmap2::MmapOptions::new().offset(offset as u64).len(len).populate().map(&file) }.ok()?;
    Some(map)
}

/// Write `data` as the cache file for `header` at `path` (through a temporary file in the
/// same folder, then renamed into place).
pub(crate) fn save(path: &Path, header: &Header, data: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::io::BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        f.write_all(&header.0)?;
        f.write_all(&vec![0u8; header.data_offset() - header.0.len()])?;
        f.write_all(data)?;
        f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use onebit_gguf::GgmlType;

    fn header(source: &str, len: usize) -> (Header, Vec<u8>) {
        let data = vec![7u8; 2 * 18 * 64];
        let w = MatRef::new(GgmlType::Q1_0, 64, 256, &data).unwrap();
        (Header::new(KernelTier::Scalar, source, &[w], &[Some(0..len)], len), data)
    }

    #[test]
    fn a_saved_cache_opens_and_any_change_misses() {
        let dir = std::env::temp_dir().join(format!("onebit-pack-cache-{}", std::process::id()));
        let path = dir.join("m.pack");
        let (h, data) = header("model.gguf 1 2", 2304);
        assert!(open(&path, &h, data.len()).is_none(), "no file yet");
        save(&path, &h, &data).unwrap();
        assert_eq!(&open(&path, &h, data.len()).unwrap()[..], &data[..]);
        let (other, _) = header("model.gguf 1 3", 2304);
        assert!(open(&path, &other, data.len()).is_none(), "another source");
        assert!(open(&path, &h, data.len() - 1).is_none(), "another length");
        // A truncated file is a miss, not a fault.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(4096 + 100).unwrap();
        assert!(open(&path, &h, data.len()).is_none(), "truncated");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
