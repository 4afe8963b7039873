//! One GGUF file: its bytes (a read-only memory map, or a buffer) and its validated index.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{GgufError, Result};
use crate::metadata::Metadata;
use crate::reader::{self, Layout, TensorEntry};
use crate::types::GgmlType;

enum Storage {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Map(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A validated GGUF file. Tensors and metadata are views into its bytes.
pub struct GgufFile {
    storage: Storage,
    path: Option<PathBuf>,
    layout: Layout,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.layout.version)
            .field("metadata", &self.layout.kvs.len())
            .field("tensors", &self.layout.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Map `path` read-only and validate it. Errors name the path.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let io = |source| GgufError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.is_dir() {
            return Err(io(std::io::Error::other("is a directory")));
        }
        // An empty file cannot be mapped on every platform; it is not a GGUF either.
        let storage = if meta.len() == 0 {
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and private to this process. Like every mmap-based
            // model loader we assume the file is not truncated underneath us while mapped.
            Storage::Map(unsafe { Mmap::map(&file) }.map_err(io)?)
        };
        Self::from_storage(storage, Some(path.to_path_buf())).map_err(|e| e.in_file(path))
    }

    /// Validate a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::from_storage(Storage::Owned(bytes), None)
    }

    fn from_storage(storage: Storage, path: Option<PathBuf>) -> Result<GgufFile> {
        let layout = reader::parse(storage.bytes())?;
        Ok(GgufFile { storage, path, layout })
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Let the pages holding `bytes` (a slice of this file, e.g. a tensor's data already used)
    /// leave this process's memory: a tool that streams through a large model touches each
    /// tensor once, and without this every page it read would stay resident until the end.
    /// The bytes stay readable (the kernel reads them from the file again if asked). Does
    /// nothing for an in-memory image or a slice of some other buffer.
    pub fn release(&self, bytes: &[u8]) {
        let Storage::Map(map) = &self.storage else {
            return;
        };
        let base = map.as_ptr() as usize;
        let start = bytes.as_ptr() as usize;
        if bytes.is_empty() || start < base || start + bytes.len() > base + map.len() {
            return;
        }
        #[cfg(unix)]
        // SAFETY: MADV_DONTNEED on a read-only, file-backed private map only drops pages that
        // were never written: a later read faults them back in from the file, unchanged (as long
        // as the file itself is not modified, which `open` already assumes). No reference to
        // the contents is invalidated, only their residency.
        unsafe {
            let _ = map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start - base, bytes.len());
        }
    }

    pub fn version(&self) -> u32 {
        self.layout.version
    }

    pub fn alignment(&self) -> u64 {
        self.layout.alignment
    }

    /// Offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.layout.data_offset
    }

    pub fn metadata(&self) -> Metadata<'_> {
        Metadata { file: self.bytes(), entries: &self.layout.kvs, sorted: &self.layout.kv_sorted }
    }

    pub fn tensor_count(&self) -> usize {
        self.layout.tensors.len()
    }

    /// Tensors in file order.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = Tensor<'_>> {
        self.layout.tensors.iter().map(|t| self.view(t))
    }

    pub fn tensor(&self, name: &str) -> Option<Tensor<'_>> {
        let file = self.bytes();
        let tensors = &self.layout.tensors;
        let sorted = &self.layout.tensor_sorted;
        let i = sorted.binary_search_by(|&i| tensors[i as usize].name(file).cmp(name)).ok()?;
        Some(self.view(&tensors[sorted[i] as usize]))
    }

    fn view<'a>(&'a self, t: &TensorEntry) -> Tensor<'a> {
        let file = self.bytes();
        Tensor {
            name: t.name(file),
            ty: t.ty,
            shape: ShapeRef { ne: t.ne, n_dims: t.n_dims },
            data: &file[t.data_off as usize..(t.data_off + t.n_bytes) as usize],
            offset: t.rel_offset,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ShapeRef {
    ne: [u64; reader::MAX_DIMS],
    n_dims: u8,
}

/// A tensor: a zero-copy view of its bytes in the file.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    name: &'a str,
    ty: GgmlType,
    shape: ShapeRef,
    data: &'a [u8],
    offset: u64,
}

impl<'a> Tensor<'a> {
    pub fn name(&self) -> &'a str {
        self.name
    }

    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Dimensions, `ne[0]` (the fastest-varying, a row's length) first.
    pub fn shape(&self) -> &[u64] {
        // Borrowing from `self` rather than 'a keeps the struct Copy and small.
        &self.shape.ne[..self.shape.n_dims as usize]
    }

    /// Dimension `i`, or 1 past the stored ones (ggml's convention).
    pub fn dim(&self, i: usize) -> u64 {
        self.shape.ne.get(i).copied().unwrap_or(1)
    }

    pub fn n_elements(&self) -> u64 {
        self.shape.ne.iter().product()
    }

    /// Elements per row (`ne[0]`) and the number of rows (the product of the rest).
    pub fn rows_cols(&self) -> (u64, u64) {
        (self.n_elements() / self.shape.ne[0].max(1), self.shape.ne[0])
    }

    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Offset within the data section, as stored in the file.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}
