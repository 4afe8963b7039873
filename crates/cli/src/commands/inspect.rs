//! `onebit inspect MODEL [--json]`: what a user needs to know about a GGUF file.
//!
//! The JSON form is one object (schema in `docs/inspect.md`); the text form is the same facts
//! laid out for reading, with long arrays summarised.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use onebit_gguf::{GgmlType, GgufModel, Metadata, Value};
use serde_json::{Value as Json, json};

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file (any part of a split model opens all of it).
    pub model: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let model = GgufModel::open(&args.model)?;
    let report = Report::new(&args, &model);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json(&model))?);
    } else {
        report.print(&model);
    }
    Ok(())
}

/// The facts both output forms share.
struct Report<'a> {
    path: String,
    architecture: Option<&'a str>,
    hyperparameters: Vec<(&'a str, Value<'a>)>,
    tokenizer: Option<TokenizerInfo<'a>>,
    bytes_by_type: BTreeMap<GgmlType, (u64, u64)>,
    tensor_bytes: u64,
    parameters: u64,
}

struct TokenizerInfo<'a> {
    model: Option<&'a str>,
    pre: Option<&'a str>,
    vocab_size: u64,
    merges: u64,
    chat_template: Option<&'a str>,
    special: Vec<(String, u32, Option<String>)>,
    add_bos: Option<bool>,
    add_eos: Option<bool>,
}

impl<'a> Report<'a> {
    fn new(args: &Args, model: &'a GgufModel) -> Report<'a> {
        let md = model.metadata();
        let architecture = md.get_str("general.architecture").ok();
        let hyperparameters = match architecture {
            Some(arch) => {
                let prefix = format!("{arch}.");
                md.iter().filter(|(k, _)| k.starts_with(&prefix)).map(|(k, v)| (&k[prefix.len()..], v)).collect()
            }
            None => Vec::new(),
        };
        let mut bytes_by_type = BTreeMap::new();
        let (mut tensor_bytes, mut parameters) = (0, 0);
        for t in model.tensors() {
            let e = bytes_by_type.entry(t.ggml_type()).or_insert((0, 0));
            e.0 += t.data().len() as u64;
            e.1 += t.n_elements();
            tensor_bytes += t.data().len() as u64;
            parameters += t.n_elements();
        }
        Report {
            path: args.model.display().to_string(),
            architecture,
            hyperparameters,
            tokenizer: tokenizer_info(md),
            bytes_by_type,
            tensor_bytes,
            parameters,
        }
    }

    fn to_json(&self, model: &GgufModel) -> Json {
        let part0 = &model.parts()[0];
        let tok = self.tokenizer.as_ref().map(|t| {
            json!({
                "model": t.model, "pre": t.pre, "vocab_size": t.vocab_size, "merges": t.merges,
                "has_chat_template": t.chat_template.is_some(),
                "special_tokens": t.special.iter().map(|(k, id, text)| (k.clone(), json!({"id": id, "text": text}))).collect::<serde_json::Map<_, _>>(),
                "add_bos": t.add_bos, "add_eos": t.add_eos,
            })
        });
        json!({
            "file": self.path,
            "file_bytes": model.file_bytes(),
            "parts": model.parts().len(),
            "version": part0.version(),
            "alignment": part0.alignment(),
            "architecture": self.architecture,
            "hyperparameters": self.hyperparameters.iter().map(|(k, v)| (k.to_string(), value_json(*v))).collect::<serde_json::Map<_, _>>(),
            "tokenizer": tok,
            "metadata": model.metadata().iter().map(|(k, v)| json!({"key": k, "type": type_name(&v), "value": value_json(v)})).collect::<Vec<_>>(),
            "tensors": model.tensors().map(|t| json!({
                "name": t.name(), "type": t.ggml_type().name(), "shape": t.shape(), "bytes": t.data().len(), "offset": t.offset(),
            })).collect::<Vec<_>>(),
            "bytes_by_type": self.bytes_by_type.iter().map(|(t, (b, n))| (t.name().to_string(), json!({"bytes": b, "parameters": n}))).collect::<serde_json::Map<_, _>>(),
            "tensor_bytes": self.tensor_bytes,
            "parameters": self.parameters,
        })
    }

    fn print(&self, model: &GgufModel) {
        let part0 = &model.parts()[0];
        println!(
            "{}: GGUF v{}, {} part(s), {} bytes, alignment {}",
            self.path,
            part0.version(),
            model.parts().len(),
            model.file_bytes(),
            part0.alignment()
        );
        let md = model.metadata();
        match self.architecture {
            Some(a) => println!("architecture: {a}  name: {}", md.get_str("general.name").unwrap_or("-")),
            None => println!("architecture: (none: a vocabulary-only or non-model file)"),
        }
        if !self.hyperparameters.is_empty() {
            println!("hyperparameters:");
            for (k, v) in &self.hyperparameters {
                println!("  {k:<40} {}", value_text(*v));
            }
        }
        if let Some(t) = &self.tokenizer {
            self.print_tokenizer(t);
        }
        let other: Vec<_> = md
            .iter()
            .filter(|(k, _)| {
                !k.starts_with("tokenizer.") && self.architecture.is_none_or(|a| !k.starts_with(&format!("{a}.")))
            })
            .collect();
        if !other.is_empty() {
            println!("other metadata:");
            for (k, v) in other {
                println!("  {k:<40} {}", value_text(v));
            }
        }
        if model.tensor_count() > 0 {
            println!("tensors ({}):", model.tensor_count());
            println!("  {:<40} {:<8} {:<24} {:>14}", "name", "type", "shape", "bytes");
            for t in model.tensors() {
                let shape = format!("{:?}", t.shape());
                println!("  {:<40} {:<8} {:<24} {:>14}", t.name(), t.ggml_type().name(), shape, t.data().len());
            }
            println!("bytes by type:");
            for (ty, (bytes, n)) in &self.bytes_by_type {
                println!("  {:<8} {:>14} bytes {:>14} parameters", ty.name(), bytes, n);
            }
        }
        let bpw = if self.parameters > 0 { self.tensor_bytes as f64 * 8.0 / self.parameters as f64 } else { 0.0 };
        println!(
            "total: {} tensor bytes ({}), {} parameters ({}), {bpw:.3} bits/weight",
            self.tensor_bytes,
            human_bytes(self.tensor_bytes),
            self.parameters,
            human_count(self.parameters)
        );
    }

    fn print_tokenizer(&self, t: &TokenizerInfo) {
        println!(
            "tokenizer: {} (pre: {}), {} tokens, {} merges, chat template: {}",
            t.model.unwrap_or("?"),
            t.pre.unwrap_or("-"),
            t.vocab_size,
            t.merges,
            t.chat_template.map_or("no".to_string(), |s| format!("yes ({} bytes)", s.len()))
        );
        let flag = |b: Option<bool>| b.map_or("-".to_string(), |b| b.to_string());
        println!("  add_bos: {}  add_eos: {}", flag(t.add_bos), flag(t.add_eos));
        for (name, id, text) in &t.special {
            println!(
                "  {name:<10} {id:>8}  {}",
                text.as_deref().map_or("(out of range)".to_string(), |s| format!("{s:?}"))
            );
        }
    }
}

fn tokenizer_info<'a>(md: Metadata<'a>) -> Option<TokenizerInfo<'a>> {
    if !md.iter().any(|(k, _)| k.starts_with("tokenizer.")) {
        return None;
    }
    let tokens = md.get_array("tokenizer.ggml.tokens").ok();
    let token_text = |id: u32| {
        tokens.and_then(|a| a.iter().nth(id as usize)).and_then(|v| match v {
            Value::String(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        })
    };
    let special = md
        .iter()
        .filter_map(|(k, _)| {
            let name = k.strip_prefix("tokenizer.ggml.")?.strip_suffix("_token_id")?;
            let id = md.get_u32(k).ok()?;
            Some((name.to_string(), id, token_text(id)))
        })
        .collect();
    Some(TokenizerInfo {
        model: md.get_str("tokenizer.ggml.model").ok(),
        pre: md.get_str("tokenizer.ggml.pre").ok(),
        vocab_size: tokens.map_or(0, |a| a.len()),
        merges: md.get_array("tokenizer.ggml.merges").map_or(0, |a| a.len()),
        chat_template: md.get_str("tokenizer.chat_template").ok(),
        special,
        add_bos: md.get_bool("tokenizer.ggml.add_bos_token").ok(),
        add_eos: md.get_bool("tokenizer.ggml.add_eos_token").ok(),
    })
}

fn type_name(v: &Value) -> String {
    match v {
        Value::Array(a) => {
            let inner = a.iter().next().map(|e| type_name(&e)).unwrap_or_else(|| a.elem_type().name().to_string());
            format!("array<{inner}>")
        }
        v => v.value_type().name().to_string(),
    }
}

fn value_json(v: Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => json!(x as f64),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(b) => json!(String::from_utf8_lossy(b)),
        Value::Array(a) => Json::Array(a.iter().map(value_json).collect()),
    }
}

/// A value for reading: long strings and arrays are summarised.
fn value_text(v: Value) -> String {
    match v {
        Value::String(b) => {
            let s = String::from_utf8_lossy(b);
            if s.chars().count() > 60 {
                format!("{:?}... ({} bytes)", s.chars().take(57).collect::<String>(), b.len())
            } else {
                format!("{s:?}")
            }
        }
        Value::Array(a) if a.len() > 8 => {
            let head: Vec<String> = a.iter().take(4).map(value_text).collect();
            format!(
                "[{}, ...] ({} × {})",
                head.join(", "),
                a.len(),
                type_name(&Value::Array(a)).trim_start_matches("array<").trim_end_matches('>')
            )
        }
        Value::Array(a) => format!("[{}]", a.iter().map(value_text).collect::<Vec<_>>().join(", ")),
        Value::F32(x) => format!("{x}"),
        Value::F64(x) => format!("{x}"),
        other => value_json(other).to_string(),
    }
}

fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < units.len() {
        x /= 1024.0;
        u += 1;
    }
    format!("{x:.2} {}", units[u])
}

fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2} M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.2} K", n as f64 / 1e3),
        n => n.to_string(),
    }
}
