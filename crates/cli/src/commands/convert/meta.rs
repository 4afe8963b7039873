//! The `general.*` keys llama.cpp's converter writes (gguf-py's `Metadata`): sampling defaults
//! from `generation_config.json`, then the authorship keys, found in its order of precedence:
//! the model card ([`card`]: name, author, license, tags, languages, base models, datasets,
//! ...), config.json's `_name_or_path`, the folder's name (each split into basename, size
//! label, finetune and version by its rules), and a size label from the parameter count.

use std::path::Path;

use onebit_gguf::OwnedValue;
use serde_json::{Map, Value};

use super::hf::read_json;
use super::{ConvertError, card};

/// `general.sampling.*` from generation_config.json, in the converter's order.
pub fn sampling_keys(dir: &Path) -> Result<Vec<(String, OwnedValue)>, ConvertError> {
    let Some(Value::Object(g)) = read_json(&dir.join("generation_config.json")).unwrap_or(None) else {
        // The converter ignores a missing or unreadable generation config.
        return Ok(Vec::new());
    };
    let mut kv = Vec::new();
    let f32_of = |v: &Value| v.as_f64().map(|x| OwnedValue::F32(x as f32));
    let i32_of = |v: &Value| v.as_i64().and_then(|x| i32::try_from(x).ok()).map(OwnedValue::I32);
    let fields: [(&str, &[&str], bool); 12] = [
        ("sequence", &["sequence"], false),
        ("top_k", &["top_k"], true),
        ("top_p", &["top_p"], false),
        ("min_p", &["min_p"], false),
        ("xtc_probability", &["xtc_probability"], false),
        ("xtc_threshold", &["xtc_threshold"], false),
        ("temp", &["temperature"], false),
        ("penalty_last_n", &["penalty_last_n"], true),
        ("penalty_repeat", &["penalty_repeat", "repetition_penalty"], false),
        ("mirostat", &["mirostat"], true),
        ("mirostat_tau", &["mirostat_tau"], false),
        ("mirostat_eta", &["mirostat_eta"], false),
    ];
    for (key, sources, int) in fields {
        let Some(v) = sources.iter().find_map(|s| g.get(*s)).filter(|v| !v.is_null()) else { continue };
        let value = match (key, int) {
            ("sequence", _) => v.as_str().map(OwnedValue::string),
            (_, true) => i32_of(v),
            (_, false) => f32_of(v),
        };
        let value = value.ok_or_else(|| {
            ConvertError::Json(
                dir.join("generation_config.json"),
                format!("{} has an unexpected value {v}", sources[0]),
            )
        })?;
        kv.push((format!("general.sampling.{key}"), value));
    }
    Ok(kv)
}

/// What gguf-py's `Metadata` holds for the authorship keys (the model card's raw values).
#[derive(Default)]
struct Authorship {
    fields: Vec<(&'static str, Value)>,
    base_models: Option<Vec<Map<String, Value>>>,
    datasets: Option<Vec<Map<String, Value>>>,
    tags: Option<Vec<Value>>,
    languages: Option<Vec<Value>>,
}

impl Authorship {
    fn get(&self, field: &str) -> Option<&Value> {
        self.fields.iter().find(|(f, _)| *f == field).map(|(_, v)| v)
    }

    /// Set `field` unless it is set; a null leaves it unset, as `None` does in Python.
    fn offer(&mut self, field: &'static str, value: Option<Value>) {
        if let Some(v) = value.filter(|v| !v.is_null())
            && self.get(field).is_none()
        {
            self.fields.push((field, v));
        }
    }
}

/// The model card's keys the converter takes, by the field each fills (first come, first kept).
const CARD_FIELDS: &[(&str, &str)] = &[
    ("name", "name"),
    ("author", "author"),
    ("version", "version"),
    ("organization", "organization"),
    ("description", "description"),
    ("finetune", "finetune"),
    ("basename", "basename"),
    ("size_label", "size_label"),
    ("source_url", "url"),
    ("source_doi", "doi"),
    ("source_uuid", "uuid"),
    ("source_repo_url", "repo_url"),
    ("name", "model_name"),
    ("author", "model_author"),
    ("version", "model_version"),
    ("organization", "model_organization"),
    ("description", "model_description"),
    ("finetune", "model_finetune"),
    ("basename", "model_basename"),
    ("size_label", "model_size_label"),
    ("source_url", "model_url"),
    ("source_doi", "model_doi"),
    ("source_uuid", "model_uuid"),
    ("source_repo_url", "model_repo_url"),
    ("author", "model_creator"),
    ("basename", "model_type"),
];

/// The authorship keys and the size label, in the converter's order.
pub fn name_keys(
    dir: &Path,
    config: &Map<String, Value>,
    total_params: u64,
) -> Result<Vec<(String, OwnedValue)>, ConvertError> {
    let card = card::load(dir)?;
    let mut a = Authorship::default();
    for &(field, key) in CARD_FIELDS {
        a.offer(field, card.get(key).cloned());
    }
    a.base_models = references(&card, &["base_model", "base_models", "base_model_sources"], total_params);
    a.datasets = references(&card, &["datasets", "dataset", "dataset_sources"], total_params);
    for (field, key) in [("license", "license"), ("license_name", "license_name"), ("license_link", "license_link")] {
        a.offer(field, card.get(key).cloned());
    }
    a.tags = card_list(&card, &["tags", "pipeline_tag"]);
    a.languages = card_list(&card, &["languages", "language"]);
    // `_name_or_path` when it is a model id rather than a path, then the folder's name.
    let named = config.get("_name_or_path").and_then(|v| v.as_str()).filter(|n| n.matches('/').count() <= 1);
    let folder = dir.canonicalize().ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let folder = folder.unwrap_or_else(|| dir.to_string_lossy().into_owned());
    for id in named.into_iter().chain([folder.as_str()]) {
        let p = id_parts(id, total_params);
        a.offer("name", Some(Value::String(id_to_title(&p.full_name))));
        a.offer("organization", p.org.as_deref().map(|o| Value::String(id_to_title(o))));
        let c = p.components;
        for (field, v) in [("basename", c.basename), ("finetune", c.finetune), ("version", c.version)] {
            a.offer(field, v.map(Value::String));
        }
        a.offer("size_label", c.size_label.map(Value::String));
    }
    if total_params > 0 {
        a.offer("size_label", Some(Value::String(rounded_notation(total_params))));
    }
    a.keys()
}

impl Authorship {
    /// gguf-py's `set_gguf_meta_model` (empty strings and lists are not written).
    fn keys(&self) -> Result<Vec<(String, OwnedValue)>, ConvertError> {
        let mut kv = Vec::new();
        let order = [
            ("name", "name"),
            ("author", "author"),
            ("version", "version"),
            ("organization", "organization"),
            ("finetune", "finetune"),
            ("basename", "basename"),
            ("description", "description"),
            ("size_label", "size_label"),
            ("license", "license"),
            ("license_name", "license.name"),
            ("license_link", "license.link"),
            ("source_url", "source.url"),
            ("source_doi", "source.doi"),
            ("source_uuid", "source.uuid"),
            ("source_repo_url", "source.repo_url"),
        ];
        for (field, key) in order {
            let Some(v) = self.get(field) else { continue };
            let text = match (field, v) {
                ("license", Value::Array(items)) => {
                    items.iter().map(|i| text_of(i, "license")).collect::<Result<Vec<_>, _>>()?.join(",")
                }
                _ => text_of(v, field)?,
            };
            if !text.is_empty() {
                kv.push((format!("general.{key}"), OwnedValue::string(text)));
            }
        }
        for (what, list) in [("base_model", &self.base_models), ("dataset", &self.datasets)] {
            let Some(list) = list else { continue };
            kv.push((format!("general.{what}.count"), OwnedValue::U32(list.len() as u32)));
            for (i, entry) in list.iter().enumerate() {
                for field in
                    ["name", "author", "version", "organization", "description", "url", "doi", "uuid", "repo_url"]
                {
                    if let Some(v) = entry.get(field) {
                        let text = text_of(v, &format!("{what} {field}"))?;
                        if !text.is_empty() {
                            kv.push((format!("general.{what}.{i}.{field}"), OwnedValue::string(text)));
                        }
                    }
                }
            }
        }
        for (key, list) in [("tags", &self.tags), ("languages", &self.languages)] {
            let Some(list) = list.as_ref().filter(|l| !l.is_empty()) else { continue };
            let items = list.iter().map(|v| text_of(v, key)).collect::<Result<Vec<_>, _>>()?;
            kv.push((format!("general.{key}"), OwnedValue::strings(&items)));
        }
        Ok(kv)
    }
}

/// A model card value that must be text (the converter cannot write anything else there).
fn text_of(v: &Value, what: &str) -> Result<String, ConvertError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| ConvertError::Json("README.md".into(), format!("the model card's {what} is {v}, not text")))
}

/// Tags or languages: every key's text or list, appended in order.
fn card_list(card: &Map<String, Value>, keys: &[&str]) -> Option<Vec<Value>> {
    let mut out: Option<Vec<Value>> = None;
    for key in keys {
        match card.get(*key) {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => out.get_or_insert_default().extend(items.iter().cloned()),
            Some(Value::String(s)) => out.get_or_insert_default().push(Value::String(s.clone())),
            Some(_) => {
                out.get_or_insert_default();
            }
        }
    }
    out
}

/// Base models or datasets: the first of `keys` present, each entry a Hugging Face id, a URL
/// or a mapping, turned into name/organization/version/repo_url as gguf-py does.
fn references(card: &Map<String, Value>, keys: &[&str], total_params: u64) -> Option<Vec<Map<String, Value>>> {
    let present = keys.iter().find(|k| card.contains_key(**k))?;
    let ids: Vec<Value> = match card.get(*present) {
        Some(Value::String(s)) => vec![Value::String(s.clone())],
        Some(Value::Array(items)) => items.clone(),
        _ => Vec::new(),
    };
    let entries = ids
        .iter()
        .map(|id| match id {
            Value::String(id) => reference(id, total_params),
            Value::Object(m) => m.clone(),
            _ => Map::new(),
        })
        .collect();
    Some(entries)
}

fn reference(id: &str, total_params: u64) -> Map<String, Value> {
    let mut entry = Map::new();
    let mut put = |k: &str, v: String| {
        entry.insert(k.to_string(), Value::String(v));
    };
    let hf_id = if ["http://", "https://", "ssh://"].iter().any(|p| id.starts_with(p)) {
        put("repo_url", id.to_string());
        hugging_face_url_id(id)
    } else {
        Some(id)
    };
    let Some(hf_id) = hf_id else { return entry };
    let p = id_parts(hf_id, total_params);
    put("name", id_to_title(&p.full_name));
    if let Some(org) = &p.org {
        put("organization", id_to_title(org));
    }
    if let Some(v) = p.components.version {
        put("version", v);
    }
    if !id.contains("://")
        && let Some(org) = &p.org
    {
        put("repo_url", format!("https://huggingface.co/{org}/{}", p.full_name));
    }
    entry
}

/// `org/name` of a `https?://huggingface.co/org/name` URL (nothing after).
fn hugging_face_url_id(url: &str) -> Option<&str> {
    if !url.contains("huggingface.co") {
        return None;
    }
    let rest = url.strip_prefix("https://huggingface.co/").or_else(|| url.strip_prefix("http://huggingface.co/"))?;
    let (org, name) = rest.split_once('/')?;
    (!org.is_empty() && !name.is_empty() && !name.contains('/')).then_some(rest)
}

/// A model id's full name, organization and name parts.
struct IdParts {
    full_name: String,
    org: Option<String>,
    components: Components,
}

fn id_parts(id: &str, total_params: u64) -> IdParts {
    let (org, full_name) = match id.split_once('/') {
        Some((o, n)) if !id.contains(' ') => (Some(o.to_string()), n.to_string()),
        _ => (None, id.to_string()),
    };
    IdParts { full_name, org, components: id_components(id, total_params) }
}

/// A name in title case, except acronyms and version numbers.
fn id_to_title(s: &str) -> String {
    let version = |w: &str| {
        let v = w.strip_prefix('v').unwrap_or("");
        w.starts_with(|c: char| c.is_ascii_digit())
            || (!v.is_empty() && v.split('.').all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit())))
    };
    let is_lower = |w: &str| w.chars().any(|c| c.is_lowercase()) && !w.chars().any(|c| c.is_uppercase());
    s.trim()
        .replace('-', " ")
        .split_whitespace()
        .map(|w| if is_lower(w) && !version(w) { title(w) } else { w.to_string() })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Python's `str.title()`: a letter after a non-letter is upper case, the others lower case.
fn title(w: &str) -> String {
    let mut out = String::with_capacity(w.len());
    let mut prev_letter = false;
    for c in w.chars() {
        if prev_letter {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        prev_letter = c.is_alphabetic();
    }
    out
}

#[derive(Default)]
struct Components {
    basename: Option<String>,
    finetune: Option<String>,
    version: Option<String>,
    size_label: Option<String>,
}

#[derive(Clone, Copy, PartialEq)]
enum Part {
    Basename,
    Size,
    Finetune,
    Version,
    Type,
}

/// The parts of a Hugging Face style name (`Qwen3-0.6B-Instruct`), with llama.cpp's rules.
fn id_components(id: &str, total_params: u64) -> Components {
    if id.contains(' ') {
        return Components::default();
    }
    let full = id.split_once('/').map(|(_, n)| n).unwrap_or(id);
    let mut parts: Vec<String> = full.split('-').filter(|p| !p.is_empty()).map(String::from).collect();
    let mut kinds: Vec<Vec<Part>> = vec![Vec::new(); parts.len()];
    for (i, part) in parts.iter_mut().enumerate() {
        let lower = part.to_lowercase();
        if is_version(&lower) {
            kinds[i].push(Part::Version);
        } else if is_quant_type(&lower) {
            kinds[i].push(Part::Type);
            *part = part.to_uppercase();
        } else if i > 0 && is_size(&lower) {
            let mut p = part.replace('_', ".");
            let b = p.as_bytes();
            if b[b.len() - 1].is_ascii_digit() && b.len() >= 2 {
                // bloom-7b1 -> 7.1b
                let n = p.len();
                p = format!("{}.{}{}", &p[..n - 2], &p[n - 1..], &p[n - 2..n - 1]);
            }
            let b = p.as_bytes();
            if b.len() > 1 && b[b.len() - 2].is_ascii_digit() && b"kmbt".contains(&b[b.len() - 1]) {
                p = format!("{}{}", &p[..p.len() - 1], (b[b.len() - 1] as char).to_ascii_uppercase());
            }
            if total_params != 0
                && let Ok(n) = p[..p.len() - 1].parse::<f64>()
                && let Some(scale) = " KMBT".find(&p[p.len() - 1..])
            {
                let label = n * 1000f64.powi(scale as i32);
                if (label - total_params as f64).abs() > (7 * total_params / 8) as f64 {
                    kinds[i].push(Part::Finetune);
                    p = format!("{}{}", &p[..p.len() - 1], p[p.len() - 1..].to_lowercase());
                }
            }
            if kinds[i].is_empty() {
                kinds[i].push(Part::Size);
            }
            *part = p;
        } else if i > 0 && matches!(lower.as_str(), "chat" | "instruct" | "vision" | "lora") {
            kinds[i].push(Part::Finetune);
        }
    }
    let numeric_size =
        parts.iter().zip(&kinds).any(|(p, k)| k.contains(&Part::Size) && p.chars().any(|c| c.is_ascii_digit()));
    if numeric_size {
        for (p, k) in parts.iter().zip(kinds.iter_mut()) {
            if k.contains(&Part::Size) && p.chars().all(|c| c.is_alphabetic()) {
                k.retain(|x| *x != Part::Size);
            }
        }
    }
    let mut at_start = true;
    for (p, k) in parts.iter().zip(kinds.iter_mut()) {
        let alpha_first = p.chars().next().is_some_and(|c| c.is_alphabetic());
        if at_start && ((k.is_empty() && alpha_first) || k.contains(&Part::Version)) {
            k.push(Part::Basename);
        } else {
            at_start = false;
            if k.is_empty() {
                k.push(Part::Finetune);
            }
        }
    }
    for k in kinds.iter_mut().rev() {
        if k.contains(&Part::Basename) && k.len() > 1 {
            k.retain(|x| *x != Part::Basename);
        } else {
            break;
        }
    }
    let join = |want: Part, skip: Option<Part>| {
        let mut seen: Vec<&str> = Vec::new();
        for (p, k) in parts.iter().zip(&kinds) {
            if k.contains(&want)
                && !skip.is_some_and(|s| k.contains(&s))
                && !(want == Part::Size && seen.contains(&p.as_str()))
            {
                seen.push(p);
            }
        }
        (!seen.is_empty()).then(|| seen.join("-"))
    };
    let mut c = Components {
        basename: join(Part::Basename, None),
        finetune: join(Part::Finetune, None),
        version: join(Part::Version, Some(Part::Basename)),
        size_label: join(Part::Size, None),
    };
    if c.size_label.is_none() && c.finetune.is_none() && c.version.is_none() {
        c.basename = None;
    }
    c
}

fn is_version(s: &str) -> bool {
    let s = s.strip_prefix("iter").or_else(|| s.strip_prefix('v')).unwrap_or(s);
    !s.is_empty() && s.split('.').all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

fn is_quant_type(s: &str) -> bool {
    let q = s.strip_prefix('i').unwrap_or(s);
    let quant = q.len() >= 2
        && q.starts_with('q')
        && q.as_bytes()[1].is_ascii_digit()
        && q[2..].split('_').skip(1).all(|w| !w.is_empty() && w.chars().all(|c| c.is_alphanumeric() || c == '_'))
        && (q.len() == 2 || q.as_bytes()[2] == b'_');
    let float = {
        let f = s.strip_prefix('b').unwrap_or(s);
        let f = f.strip_prefix('f').unwrap_or("");
        let f = f.strip_prefix('p').unwrap_or(f);
        f == "16" || f == "32"
    };
    quant || float
}

/// `(([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?|small|mini|medium|large|x?xl)`, case-insensitive.
fn is_size(s: &str) -> bool {
    if matches!(s, "small" | "mini" | "medium" | "large" | "xl" | "xxl") {
        return true;
    }
    let mut rest = s;
    if let Some(r) = rest.strip_prefix('a') {
        rest = r;
    } else if let Some(x) = rest.find('x')
        && x > 0
        && rest[..x].chars().all(|c| c.is_ascii_digit())
    {
        rest = &rest[x + 1..];
    }
    let digits = rest.chars().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 {
        return false;
    }
    rest = &rest[digits..];
    if let Some(r) = rest.strip_prefix(['.', '_']) {
        let d = r.chars().take_while(|c| c.is_ascii_digit()).count();
        if d == 0 {
            return false;
        }
        rest = &r[d..];
    }
    let Some(r) = rest.strip_prefix(['k', 'm', 'b', 't']) else { return false };
    r.is_empty() || (r.len() == 1 && r.as_bytes()[0].is_ascii_digit())
}

/// llama.cpp's `model_weight_count_rounded_notation` with two significant digits at least.
pub fn rounded_notation(n: u64) -> String {
    let x = n as f64;
    let (scaled, suffix) = if x > 1e12 {
        (x * 1e-12, "T")
    } else if x > 1e9 {
        (x * 1e-9, "B")
    } else if x > 1e6 {
        (x * 1e-6, "M")
    } else {
        (x * 1e-3, "K")
    };
    let whole = scaled.round_ties_even() as u64;
    let digits = if whole == 0 { 0 } else { whole.to_string().len() };
    let fix = 2usize.saturating_sub(digits);
    format!("{scaled:.fix$}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_as_llama_cpp_splits_them() {
        let c = id_components("Qwen3-0.6B-Instruct", 600_000_000);
        assert_eq!(c.basename.as_deref(), Some("Qwen3"));
        assert_eq!(c.size_label.as_deref(), Some("0.6B"));
        assert_eq!(c.finetune.as_deref(), Some("Instruct"));
        let c = id_components("qwen3-test", 99_000);
        assert_eq!((c.basename, c.size_label, c.finetune), (None, None, None));
        assert_eq!(id_to_title("qwen3-test"), "Qwen3 Test");
        assert_eq!(id_to_title("SmolLM2-135M-v0.1"), "SmolLM2 135M v0.1");
        assert_eq!(rounded_notation(99_136), "99K");
        assert_eq!(rounded_notation(1_234_567), "1.2M");
    }
}
