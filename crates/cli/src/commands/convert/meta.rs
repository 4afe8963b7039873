//! The `general.*` keys llama.cpp's converter writes: sampling defaults from
//! `generation_config.json`, then the model's name, the parts of it (basename, size label,
//! finetune, version) its folder name gives, and a size label from the parameter count.
//!
//! The converter also reads a model card (README.md front matter: license, tags, base models,
//! ...); onebit does not, so those optional keys are absent from its files.

use std::path::Path;

use onebit_gguf::OwnedValue;
use serde_json::Value;

use super::ConvertError;
use super::hf::read_json;

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

/// The name keys from the folder's name, and the size label.
pub fn name_keys(dir: &Path, total_params: u64) -> Vec<(String, OwnedValue)> {
    let id = dir.canonicalize().ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let id = id.unwrap_or_else(|| dir.to_string_lossy().into_owned());
    let parts = id_components(&id, total_params);
    let mut kv = vec![("general.name".to_string(), OwnedValue::string(id_to_title(&id)))];
    let mut put = |k: &str, v: &Option<String>| {
        if let Some(v) = v {
            kv.push((format!("general.{k}"), OwnedValue::string(v.clone())));
        }
    };
    put("version", &parts.version);
    put("finetune", &parts.finetune);
    put("basename", &parts.basename);
    let size = parts.size_label.or_else(|| (total_params > 0).then(|| rounded_notation(total_params)));
    put("size_label", &size);
    kv
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
