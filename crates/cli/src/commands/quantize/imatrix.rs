//! Importance matrices: llama-imatrix's GGUF files (and its older `.dat` files), read into
//! per-tensor weights the way llama-quantize reads them.
//!
//! A GGUF imatrix holds, for every weight matrix, `NAME.in_sum2` (the sum of squared
//! activations per column, one row per expert) and `NAME.counts` (how many tokens were summed,
//! one per expert). The weight of a column is `in_sum2 / count` (1 where the count is 0).
//! A legacy file has one sum per column and a single call count per matrix.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use onebit_gguf::{GgmlType, GgufFile, OwnedValue};

use super::QuantizeError;

/// llama-quantize copies at most this many bytes of a string into the output's metadata.
const MAX_STRING: usize = 127;

pub struct Imatrix {
    path: PathBuf,
    entries: HashMap<String, Vec<f32>>,
    datasets: Vec<String>,
    chunk_count: u32,
}

impl Imatrix {
    pub fn load(path: &Path) -> Result<Imatrix, QuantizeError> {
        let fail = |reason: String| QuantizeError::Imatrix { path: path.to_path_buf(), reason };
        let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
        let m = if bytes.starts_with(b"GGUF") {
            let file = GgufFile::from_bytes(bytes).map_err(|e| fail(e.to_string()))?;
            Self::from_gguf(path, &file).map_err(fail)?
        } else {
            Self::from_legacy(path, &bytes).map_err(fail)?
        };
        if let Some((name, _)) = m.entries.iter().find(|(_, v)| v.iter().any(|x| !x.is_finite())) {
            return Err(fail(format!("the weights of {name} are not all finite")));
        }
        Ok(m)
    }

    fn from_gguf(path: &Path, file: &GgufFile) -> Result<Imatrix, String> {
        if file.tensor_count() == 0 {
            return Err("no data in the file".into());
        }
        let md = file.metadata();
        let datasets = md.get_str_array("imatrix.datasets").ok();
        let chunk_count = md.opt_u32("imatrix.chunk_count").ok().flatten();
        let chunk_size = md.opt_u32("imatrix.chunk_size").ok().flatten();
        if datasets.is_none() || chunk_count.is_none() || chunk_size.is_none() {
            return Err("imatrix.datasets, imatrix.chunk_count or imatrix.chunk_size is missing".into());
        }
        let mut pairs: HashMap<&str, [Option<onebit_gguf::Tensor>; 2]> = HashMap::new();
        for t in file.tensors() {
            if let Some(name) = t.name().strip_suffix(".in_sum2") {
                pairs.entry(name).or_default()[0] = Some(t);
            } else if let Some(name) = t.name().strip_suffix(".counts") {
                pairs.entry(name).or_default()[1] = Some(t);
            }
        }
        let mut entries = HashMap::with_capacity(pairs.len());
        for (name, pair) in pairs {
            let [Some(sums), Some(counts)] = pair else {
                return Err(format!("{name} lacks its sums or its counts"));
            };
            if sums.ggml_type() != GgmlType::F32 || counts.ggml_type() != GgmlType::F32 {
                return Err(format!("the sums and counts of {name} must be F32"));
            }
            let sums = f32s(sums.data());
            // Counts are stored as floats and rounded to whole numbers on reading.
            let counts: Vec<f32> = f32s(counts.data()).iter().map(|c| c.round() as i64 as f32).collect();
            if counts.is_empty() || !sums.len().is_multiple_of(counts.len()) {
                return Err(format!("{name}: {} sums do not split into {} experts", sums.len(), counts.len()));
            }
            let per = sums.len() / counts.len();
            let mut w = vec![0f32; sums.len()];
            for (j, &count) in counts.iter().enumerate() {
                for i in j * per..(j + 1) * per {
                    w[i] = if count > 0.0 { sums[i] / count } else { 1.0 };
                }
            }
            entries.insert(name.to_string(), w);
        }
        Ok(Imatrix {
            path: path.to_path_buf(),
            entries,
            datasets: datasets.unwrap_or_default().into_iter().map(str::to_string).collect(),
            chunk_count: chunk_count.unwrap_or(0),
        })
    }

    /// The older format: i32 entry count; per entry an i32-length name, i32 call count, i32
    /// value count and the f32 sums; then optionally the chunk count and a dataset name.
    fn from_legacy(path: &Path, b: &[u8]) -> Result<Imatrix, String> {
        let mut pos = 0usize;
        let mut take = |n: usize, what: &str| -> Result<&[u8], String> {
            let s = b.get(pos..pos + n).ok_or_else(|| format!("truncated at {what} (byte {pos})"))?;
            pos += n;
            Ok(s)
        };
        let i32_at = |s: &[u8]| i32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let n_entries = i32_at(take(4, "the entry count")?);
        if n_entries < 1 {
            return Err("not a GGUF file, and no data as a legacy imatrix file".into());
        }
        let mut entries = HashMap::new();
        for i in 0..n_entries {
            let len = i32_at(take(4, "a name length")?).max(0) as usize;
            let raw = take(len, "a name")?;
            let name = String::from_utf8_lossy(raw.split(|&c| c == 0).next().unwrap_or_default()).into_owned();
            let ncall = i32_at(take(4, "a call count")?);
            let nval = i32_at(take(4, "a value count")?);
            if nval < 1 {
                return Err(format!("entry {i} ({name}) has {nval} values"));
            }
            let sums = f32s(take(nval as usize * 4, "the sums")?);
            let w = if ncall > 0 { sums.iter().map(|s| s / ncall as f32).collect() } else { sums };
            entries.insert(name, w);
        }
        let mut chunk_count = 0;
        let mut datasets = Vec::new();
        if let Ok(n) = take(4, "the chunk count") {
            chunk_count = i32_at(n).max(0) as u32;
            if let Ok(l) = take(4, "the dataset name length") {
                let len = i32_at(l);
                if len > 0
                    && let Ok(d) = take(len as usize, "the dataset name")
                {
                    datasets
                        .push(String::from_utf8_lossy(d.split(|&c| c == 0).next().unwrap_or_default()).into_owned());
                }
            }
        }
        Ok(Imatrix { path: path.to_path_buf(), entries, datasets, chunk_count })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.entries.get(name).map(Vec::as_slice)
    }

    /// The weights for a tensor with `expected` = columns × experts values: `None` when the
    /// matrix has none for it (llama-quantize then quantizes without), an error when their
    /// number is wrong (except for the token embeddings, which llama-quantize lets through).
    pub fn weights_for(&self, name: &str, expected: u64) -> Result<Option<&[f32]>, QuantizeError> {
        let Some(w) = self.get(name) else {
            return Ok(None);
        };
        if w.len() as u64 == expected {
            return Ok(Some(w));
        }
        if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
            return Ok(None);
        }
        Err(QuantizeError::Imatrix {
            path: self.path.clone(),
            reason: format!("{} values for {name}, which needs {expected}", w.len()),
        })
    }

    /// The keys llama-quantize adds to a file quantized with this matrix, in its order.
    pub fn metadata(&self) -> Vec<(&'static str, OwnedValue)> {
        let clip = |s: &str| {
            let b = s.as_bytes();
            let b = &b[..b.len().min(MAX_STRING)];
            OwnedValue::String(b.split(|&c| c == 0).next().unwrap_or_default().to_vec())
        };
        let mut out = vec![("quantize.imatrix.file", clip(&self.path.to_string_lossy()))];
        if let Some(d) = self.datasets.first() {
            out.push(("quantize.imatrix.dataset", clip(d)));
        }
        out.push(("quantize.imatrix.entries_count", OwnedValue::U32(self.entries.len() as u32)));
        if self.chunk_count > 0 {
            out.push(("quantize.imatrix.chunks_count", OwnedValue::U32(self.chunk_count)));
        }
        out
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
