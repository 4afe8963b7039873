//! The model card: the YAML front matter of a Hugging Face folder's `README.md`, read as
//! gguf-py's `Metadata.load_model_card` reads it (the lines between a first line `---` and the
//! next `---`, with its two fixes: `- no` items quoted, tabs as two spaces), as JSON values.
//!
//! gguf-py parses with PyYAML (YAML 1.1); onebit with `yaml-rust2` (YAML 1.2). They differ only
//! on plain scalars such as `yes`/`on` (booleans to PyYAML, text here) and dates; the keys the
//! converter writes hold text, and a value that is not text is refused where it is used.

use std::path::Path;

use serde_json::{Map, Value};
use yaml_rust2::{Yaml, YamlLoader};

use super::ConvertError;

/// The front matter as a JSON object; empty when there is no README.md or no front matter.
pub fn load(dir: &Path) -> Result<Map<String, Value>, ConvertError> {
    let path = dir.join("README.md");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Map::new()),
        Err(e) => return Err(ConvertError::Io(path, e)),
    };
    let Some(yaml) = front_matter(&text) else { return Ok(Map::new()) };
    let docs = YamlLoader::load_from_str(&yaml)
        .map_err(|e| ConvertError::Json(path.clone(), format!("the model card's front matter is not YAML: {e}")))?;
    // Not a mapping: the converter logs an error and reads nothing.
    match docs.first().map(to_json) {
        Some(Value::Object(m)) => Ok(m),
        _ => Ok(Map::new()),
    }
}

/// The YAML between the `---` lines, fixed up as gguf-py fixes it.
fn front_matter(text: &str) -> Option<String> {
    let mut lines = text.lines().map(|l| l.strip_suffix('\r').unwrap_or(l));
    if lines.next()? != "---" {
        return None;
    }
    let body: Vec<&str> = lines.take_while(|l| *l != "---").collect();
    let yaml = body.join("\n") + "\n";
    // The "Norway problem" (YAML 1.1 reads `no` as false) and tab indentation.
    Some(yaml.replace("- no\n", "- \"no\"\n").replace('\t', "  "))
}

fn to_json(y: &Yaml) -> Value {
    match y {
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::Real(r) => r.parse::<f64>().map(Value::from).unwrap_or_else(|_| Value::String(r.clone())),
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .filter_map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        Yaml::Integer(i) => i.to_string(),
                        Yaml::Boolean(b) => if *b { "True" } else { "False" }.to_string(),
                        _ => return None,
                    };
                    Some((key, to_json(v)))
                })
                .collect(),
        ),
        Yaml::Null | Yaml::BadValue | Yaml::Alias(_) => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_matter_is_read_with_gguf_pys_fixes() {
        let text = "---\nlicense: apache-2.0\nlanguage:\n- en\n- no\ntags:\n\t- chat\n---\n# Title\n---\n";
        let yaml = front_matter(text).unwrap();
        assert_eq!(yaml, "license: apache-2.0\nlanguage:\n- en\n- \"no\"\ntags:\n  - chat\n");
        let v = to_json(&YamlLoader::load_from_str(&yaml).unwrap()[0]);
        assert_eq!(v["language"], serde_json::json!(["en", "no"]));
        assert_eq!(v["tags"], serde_json::json!(["chat"]));
        assert!(front_matter("# No front matter\n").is_none());
    }
}
