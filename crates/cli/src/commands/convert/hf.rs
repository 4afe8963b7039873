//! A Hugging Face model folder: `config.json` and the `*.safetensors` shards (with their index),
//! each shard memory-mapped and its header checked by the `safetensors` crate.
//!
//! Tensors are listed in the order llama.cpp's converter visits them, which decides the order
//! of the GGUF it writes: shards sorted by file name, and within a shard, tensors sorted by name.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use super::ConvertError;

/// One tensor of the checkpoint, located in its shard.
pub struct HfTensor {
    pub name: String,
    pub dtype: Dtype,
    /// Outermost dimension first, as PyTorch writes it.
    pub shape: Vec<usize>,
    shard: usize,
    /// Byte range in the shard's mapping.
    start: usize,
    end: usize,
}

struct Shard {
    path: PathBuf,
    map: Mmap,
}

/// A model folder with its shards mapped.
pub struct HfModel {
    pub dir: PathBuf,
    pub config: serde_json::Map<String, Value>,
    shards: Vec<Shard>,
    /// In the converter's order (see the module header).
    pub tensors: Vec<HfTensor>,
}

impl HfModel {
    pub fn open(dir: &Path) -> Result<HfModel, ConvertError> {
        if !dir.is_dir() {
            return Err(ConvertError::NotAFolder(dir.into()));
        }
        let config = match read_json(&dir.join("config.json"))? {
            Some(Value::Object(m)) => m,
            Some(_) => return Err(ConvertError::Json(dir.join("config.json"), "not a JSON object".into())),
            None => return Err(ConvertError::MissingFile(dir.join("config.json"))),
        };
        let (part_names, weight_map) = part_names(dir)?;
        let mut shards = Vec::with_capacity(part_names.len());
        let mut tensors: Vec<HfTensor> = Vec::new();
        let mut index_of: BTreeMap<String, usize> = BTreeMap::new();
        for part in &part_names {
            let path = dir.join(part);
            let shard = map_shard(&path, weight_map.as_ref())?;
            let st = SafeTensors::deserialize(&shard.map).map_err(|e| ConvertError::Safetensors(path.clone(), e))?;
            let base = shard.map.as_ptr() as usize;
            let mut names: Vec<(String, _)> = st.tensors();
            names.sort_by(|a, b| a.0.cmp(&b.0));
            for (name, view) in names {
                let start = view.data().as_ptr() as usize - base;
                let t = HfTensor {
                    name: name.clone(),
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    shard: shards.len(),
                    start,
                    end: start + view.data().len(),
                };
                // A name in two shards keeps its first place and its last data, as a Python
                // dict does.
                match index_of.get(&name) {
                    Some(&i) => tensors[i] = t,
                    None => {
                        index_of.insert(name, tensors.len());
                        tensors.push(t);
                    }
                }
            }
            shards.push(shard);
        }
        if let Some(map) = &weight_map {
            check_index(dir, map, &index_of)?;
        }
        Ok(HfModel { dir: dir.into(), config, shards, tensors })
    }

    /// The bytes of a tensor, as stored (little-endian).
    pub fn data(&self, t: &HfTensor) -> &[u8] {
        &self.shards[t.shard].map[t.start..t.end]
    }

    /// The shard a tensor is in (for error messages).
    pub fn file_of(&self, t: &HfTensor) -> &Path {
        &self.shards[t.shard].path
    }

    /// Give the pages of a tensor back to the kernel once it is written.
    pub fn release(&self, t: &HfTensor) {
        let map = &self.shards[t.shard].map;
        if t.end <= t.start {
            return;
        }
        #[cfg(unix)]
        // SAFETY: MADV_DONTNEED on a read-only, file-backed private map only drops pages that
        // were never written: a later read faults them back in from the file, unchanged (as
        // long as the file is not modified, which mapping it already assumes). No reference to
        // the contents is invalidated, only their residency.
        unsafe {
            let _ = map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, t.start, t.end - t.start);
        }
    }
}

/// Read a JSON file; `None` when it does not exist.
pub fn read_json(path: &Path) -> Result<Option<Value>, ConvertError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ConvertError::Io(path.into(), e)),
    };
    serde_json::from_str(&text).map(Some).map_err(|e| ConvertError::Json(path.into(), e.to_string()))
}

/// Tensor name to shard file, from `model.safetensors.index.json`.
type WeightMap = BTreeMap<String, String>;

/// The shards to read, sorted, and the index's weight map when there is an index.
fn part_names(dir: &Path) -> Result<(Vec<String>, Option<WeightMap>), ConvertError> {
    let index_path = dir.join("model.safetensors.index.json");
    if let Some(index) = read_json(&index_path)? {
        let Some(Value::Object(map)) = index.get("weight_map") else {
            return Err(ConvertError::Json(index_path, "no \"weight_map\" object".into()));
        };
        let mut weight_map = BTreeMap::new();
        for (name, file) in map {
            let Some(file) = file.as_str() else {
                return Err(ConvertError::Json(index_path, format!("weight_map[{name:?}] is not a file name")));
            };
            weight_map.insert(name.clone(), file.to_string());
        }
        let parts: BTreeSet<String> = weight_map.values().cloned().collect();
        return Ok((parts.into_iter().collect(), Some(weight_map)));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| ConvertError::Io(dir.into(), e))?;
    let mut parts: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("model") && n.ends_with(".safetensors"))
        .collect();
    parts.sort();
    if parts.is_empty() {
        let has_bin = dir.join("pytorch_model.bin").exists() || dir.join("pytorch_model.bin.index.json").exists();
        return Err(ConvertError::NoWeights { dir: dir.into(), pytorch: has_bin });
    }
    Ok((parts, None))
}

fn map_shard(path: &Path, weight_map: Option<&BTreeMap<String, String>>) -> Result<Shard, ConvertError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let tensors: Vec<String> =
                weight_map.into_iter().flatten().filter(|(_, f)| *f == name).map(|(t, _)| t.clone()).collect();
            return Err(ConvertError::MissingShard { path: path.into(), tensors });
        }
        Err(e) => return Err(ConvertError::Io(path.into(), e)),
    };
    // SAFETY: the file is only read through this mapping; like every tool that maps model
    // files (llama.cpp included), we rely on nobody truncating or rewriting it meanwhile.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| ConvertError::Io(path.into(), e))?;
    Ok(Shard { path: path.into(), map })
}

/// The index and the shards must name the same tensors.
fn check_index(
    dir: &Path,
    weight_map: &BTreeMap<String, String>,
    found: &BTreeMap<String, usize>,
) -> Result<(), ConvertError> {
    let missing: Vec<&String> = weight_map.keys().filter(|n| !found.contains_key(*n)).collect();
    let extra: Vec<&String> = found.keys().filter(|n| !weight_map.contains_key(*n)).collect();
    if missing.is_empty() && extra.is_empty() {
        return Ok(());
    }
    let list = |v: &[&String]| v.iter().take(5).map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
    let mut reason = String::new();
    if let Some(first) = missing.first() {
        reason += &format!(
            "{} tensor(s) of the index are in no shard (e.g. {} in {})",
            missing.len(),
            list(&missing),
            weight_map[*first]
        );
    }
    if !extra.is_empty() {
        if !reason.is_empty() {
            reason += "; ";
        }
        reason += &format!("{} tensor(s) in the shards are not in the index (e.g. {})", extra.len(), list(&extra));
    }
    Err(ConvertError::Index(dir.join("model.safetensors.index.json"), reason))
}
