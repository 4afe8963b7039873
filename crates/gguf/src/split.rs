//! Models split over several files (`name-00001-of-00003.gguf`) opened as one.
//!
//! llama.cpp's `gguf-split` writes `split.no` (u16, zero-based), `split.count` (u16) and
//! `split.tensors.count` (i32) into every part; the metadata that describes the model lives in
//! the first part. Opening any part opens them all.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::file::{GgufFile, Tensor};
use crate::metadata::Metadata;

pub const KEY_SPLIT_NO: &str = "split.no";
pub const KEY_SPLIT_COUNT: &str = "split.count";
pub const KEY_SPLIT_TENSORS: &str = "split.tensors.count";

/// A model: one GGUF file, or every part of a split model.
#[derive(Debug)]
pub struct GgufModel {
    parts: Vec<GgufFile>,
}

impl GgufModel {
    /// Open a GGUF model. A part of a split model brings in all its parts.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufModel> {
        let path = path.as_ref();
        let first = GgufFile::open(path)?;
        let count = split_field(&first, KEY_SPLIT_COUNT, path)?.unwrap_or(1);
        if count <= 1 {
            return Ok(GgufModel { parts: vec![first] });
        }
        let prefix = split_prefix(path).ok_or_else(|| GgufError::Split {
            reason: format!(
                "{} declares {KEY_SPLIT_COUNT} = {count} but its name does not end in -NNNNN-of-NNNNN.gguf",
                path.display()
            ),
        })?;
        let mut parts = Vec::with_capacity(count as usize);
        for no in 0..count {
            let part_path = part_name(&prefix, no, count);
            let part = if part_path == path { GgufFile::open(path)? } else { GgufFile::open(&part_path)? };
            check_part(&part, &part_path, no, count)?;
            parts.push(part);
        }
        drop(first);
        let model = GgufModel { parts };
        model.check_tensor_set(&prefix)?;
        Ok(model)
    }

    /// A model made of one already-open file.
    pub fn from_file(file: GgufFile) -> GgufModel {
        GgufModel { parts: vec![file] }
    }

    pub fn parts(&self) -> &[GgufFile] {
        &self.parts
    }

    /// The model's metadata (the first part's).
    pub fn metadata(&self) -> Metadata<'_> {
        self.parts[0].metadata()
    }

    pub fn tensor(&self, name: &str) -> Option<Tensor<'_>> {
        self.parts.iter().find_map(|p| p.tensor(name))
    }

    /// Every tensor, part by part, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = Tensor<'_>> {
        self.parts.iter().flat_map(|p| p.tensors())
    }

    pub fn tensor_count(&self) -> usize {
        self.parts.iter().map(|p| p.tensor_count()).sum()
    }

    /// Total size of all parts on disk.
    pub fn file_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes().len() as u64).sum()
    }

    fn check_tensor_set(&self, prefix: &str) -> Result<()> {
        let declared = self.metadata().get_i64(KEY_SPLIT_TENSORS).ok();
        let total = self.tensor_count() as i64;
        if let Some(d) = declared
            && d != total
        {
            return Err(GgufError::Split {
                reason: format!("{prefix}: {KEY_SPLIT_TENSORS} is {d} but the parts hold {total} tensors"),
            });
        }
        let mut seen = HashSet::with_capacity(self.tensor_count());
        for t in self.tensors() {
            if !seen.insert(t.name()) {
                return Err(GgufError::Split {
                    reason: format!("{prefix}: tensor '{}' appears in more than one part", t.name()),
                });
            }
        }
        Ok(())
    }
}

fn split_field(file: &GgufFile, key: &str, path: &Path) -> Result<Option<u32>> {
    file.metadata().opt_u32(key).map_err(|e| e.in_file(path))
}

fn check_part(part: &GgufFile, path: &Path, no: u32, count: u32) -> Result<()> {
    let found_no = split_field(part, KEY_SPLIT_NO, path)?;
    let found_count = split_field(part, KEY_SPLIT_COUNT, path)?;
    if found_no != Some(no) || found_count != Some(count) {
        return Err(GgufError::Split {
            reason: format!(
                "{} should be part {} of {count} but says {KEY_SPLIT_NO} = {found_no:?}, {KEY_SPLIT_COUNT} = {found_count:?}",
                path.display(),
                no + 1
            ),
        });
    }
    Ok(())
}

/// `dir/name` for `dir/name-00002-of-00003.gguf`.
fn split_prefix(path: &Path) -> Option<String> {
    let s = path.to_str()?;
    let stem = s.strip_suffix(".gguf")?;
    let (rest, total) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |d: &str| d.len() == 5 && d.bytes().all(|b| b.is_ascii_digit());
    (digits(total) && digits(no)).then(|| prefix.to_string())
}

/// llama.cpp's naming: `{prefix}-{no+1:05}-of-{count:05}.gguf`.
pub fn part_name(prefix: &str, no: u32, count: u32) -> PathBuf {
    PathBuf::from(format!("{prefix}-{:05}-of-{count:05}.gguf", no + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_and_names() {
        assert_eq!(split_prefix(Path::new("/m/a-b-00002-of-00003.gguf")).as_deref(), Some("/m/a-b"));
        assert_eq!(split_prefix(Path::new("/m/model.gguf")), None);
        assert_eq!(split_prefix(Path::new("/m/x-1-of-3.gguf")), None);
        assert_eq!(part_name("/m/a", 0, 3), PathBuf::from("/m/a-00001-of-00003.gguf"));
    }
}
