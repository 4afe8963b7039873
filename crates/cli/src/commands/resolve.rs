//! What `-m` names: a local GGUF file, a Hugging Face model (`org/repo` or
//! `org/repo:FILE_OR_QUANT`, fetched through the standard Hugging Face cache), or, when absent,
//! the demo model in onebit's own cache.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use hf_hub::api::sync::{ApiBuilder, ApiRepo};
use hf_hub::{Cache, Repo};

use super::ui::Ui;

/// The demo model's file name (fetched by `make fetch-model`).
pub const DEMO_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// onebit's cache folder: `$XDG_CACHE_HOME/onebit` or `~/.cache/onebit`.
pub fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("onebit"))
}

/// The path of the model `spec` names, downloading it first if needed.
pub fn model_path(spec: Option<&str>, ui: &Ui) -> Result<PathBuf> {
    let Some(spec) = spec else {
        let path = cache_dir().map(|d| d.join("models").join(DEMO_MODEL));
        return match path {
            Some(p) if p.is_file() => Ok(p),
            Some(p) => bail!(
                "no model given (-m) and the demo model is not at {}: run `make fetch-model` to fetch it, or pass -m FILE.gguf or -m org/repo",
                p.display()
            ),
            None => bail!("no model given (-m), and no cache folder (HOME is not set): pass -m FILE.gguf"),
        };
    };
    let local = Path::new(spec);
    if local.exists() {
        if local.is_dir() {
            bail!("{spec} is a folder; -m takes a GGUF file");
        }
        return Ok(local.to_path_buf());
    }
    match HfRef::parse(spec) {
        Some(r) => r.fetch(ui),
        None => bail!("no such file: {spec} (a Hugging Face model is named org/repo or org/repo:FILE)"),
    }
}

/// `org/repo` with an optional file name or quantization (`:Q1_0`, `:model-q4_0.gguf`).
#[derive(Debug, PartialEq, Eq)]
struct HfRef {
    repo: String,
    pick: Option<String>,
}

impl HfRef {
    fn parse(spec: &str) -> Option<HfRef> {
        let (repo, pick) = match spec.split_once(':') {
            Some((r, p)) if !p.is_empty() => (r, Some(p.to_string())),
            Some(_) => return None,
            None => (spec, None),
        };
        let ok = |s: &str| {
            !s.is_empty() && !s.starts_with('.') && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        };
        let (org, name) = repo.split_once('/')?;
        (ok(org) && ok(name)).then(|| HfRef { repo: repo.to_string(), pick })
    }

    fn fetch(&self, ui: &Ui) -> Result<PathBuf> {
        let offline = |e: &dyn std::fmt::Display| {
            anyhow!(
                "cannot fetch {} from Hugging Face ({e}); without network access, pass a local file with -m",
                self.repo
            )
        };
        // A file named outright and already in the cache needs no network.
        if let Some(file) = self.pick.as_deref().filter(|p| p.ends_with(".gguf"))
            && let Some(p) = Cache::from_env().repo(Repo::model(self.repo.clone())).get(file)
        {
            return Ok(p);
        }
        let api = ApiBuilder::from_env().with_progress(false).build().map_err(|e| offline(&e))?;
        let repo = api.model(self.repo.clone());
        let files: Vec<String> = match self.pick.as_deref().filter(|p| p.ends_with(".gguf")) {
            Some(file) => split_parts(&[file.to_string()], file),
            None => {
                let info = repo.info().map_err(|e| offline(&e))?;
                let ggufs: Vec<String> =
                    info.siblings.into_iter().map(|s| s.rfilename).filter(|f| f.ends_with(".gguf")).collect();
                let first = choose(&ggufs, self.pick.as_deref()).map_err(|e| anyhow!("{}: {e}", self.repo))?;
                split_parts(&ggufs, &first)
            }
        };
        let mut paths = Vec::new();
        for f in &files {
            paths.push(download(&self.repo, &repo, f, ui).map_err(|e| offline(&e))?);
        }
        paths.into_iter().next().context("no file to download")
    }
}

/// The GGUF file to use among `files`: the one matching `pick` (a quantization such as Q1_0),
/// the only one, or else a Q4_K_M or Q1_0 file. The first part of a split model stands for it.
fn choose(files: &[String], pick: Option<&str>) -> std::result::Result<String, String> {
    let firsts: Vec<&String> = files.iter().filter(|f| !f.contains("-of-") || f.contains("-00001-of-")).collect();
    let list = || firsts.iter().map(|f| f.as_str()).collect::<Vec<_>>().join(", ");
    if firsts.is_empty() {
        return Err("the repository has no GGUF file".into());
    }
    let matching = |q: &str| -> Vec<&String> {
        let q = q.to_ascii_lowercase();
        firsts.iter().copied().filter(|f| f.to_ascii_lowercase().contains(&q)).collect()
    };
    match pick {
        Some(q) => match matching(q).as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(format!("no GGUF file matches '{q}' (files: {})", list())),
            many => Err(format!(
                "'{q}' matches several files: {}",
                many.iter().map(|f| f.as_str()).collect::<Vec<_>>().join(", ")
            )),
        },
        None if firsts.len() == 1 => Ok(firsts[0].clone()),
        None => ["q4_k_m", "q1_0"]
            .iter()
            .find_map(|q| matching(q).first().map(|f| (*f).clone()))
            .ok_or_else(|| format!("several GGUF files; pick one with org/repo:FILE (files: {})", list())),
    }
}

/// All parts of a split model whose first part is `first` (or just `first`).
fn split_parts(files: &[String], first: &str) -> Vec<String> {
    match first.find("-00001-of-") {
        Some(at) => {
            let stem = &first[..at];
            let mut parts: Vec<String> =
                files.iter().filter(|f| f.starts_with(stem) && f.contains("-of-")).cloned().collect();
            parts.sort();
            if parts.is_empty() { vec![first.to_string()] } else { parts }
        }
        None => vec![first.to_string()],
    }
}

/// One file into the Hugging Face cache, with a progress bar.
fn download(
    repo_id: &str,
    repo: &ApiRepo,
    file: &str,
    ui: &Ui,
) -> std::result::Result<PathBuf, hf_hub::api::sync::ApiError> {
    struct Bar(indicatif::ProgressBar);
    impl hf_hub::api::Progress for Bar {
        fn init(&mut self, size: usize, _filename: &str) {
            self.0.set_length(size as u64);
        }
        fn update(&mut self, size: usize) {
            self.0.inc(size as u64);
        }
        fn finish(&mut self) {
            self.0.finish_and_clear();
        }
    }
    if let Some(p) = Cache::from_env().repo(Repo::model(repo_id.to_string())).get(file) {
        return Ok(p);
    }
    repo.download_with_progress(file, Bar(ui.bytes_bar(&format!("downloading {file}"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse() {
        assert_eq!(
            HfRef::parse("prism-ml/Bonsai-8B-gguf"),
            Some(HfRef { repo: "prism-ml/Bonsai-8B-gguf".into(), pick: None })
        );
        assert_eq!(HfRef::parse("org/repo:Q1_0"), Some(HfRef { repo: "org/repo".into(), pick: Some("Q1_0".into()) }));
        for bad in ["model.gguf", "a/b/c", "/abs/path", "./x/y", "org/", "org/repo:"] {
            assert_eq!(HfRef::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn files_are_chosen_by_quant_or_default() {
        let files: Vec<String> =
            ["Bonsai-8B-Q1_0.gguf", "Bonsai-8B-Q4_K_M.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        assert_eq!(choose(&files, Some("q1_0")).unwrap(), "Bonsai-8B-Q1_0.gguf");
        assert_eq!(choose(&files, None).unwrap(), "Bonsai-8B-Q4_K_M.gguf");
        assert!(choose(&files, Some("Q8_0")).unwrap_err().contains("no GGUF file matches"));
        assert_eq!(choose(&files[..1], None).unwrap(), "Bonsai-8B-Q1_0.gguf");
        assert_eq!(split_parts(&files, "big-00001-of-00002.gguf").len(), 2);
        assert!(choose(&[], None).is_err());
    }
}
