//! `onebit template`: render a chat request through a model's chat template (or a template
//! file) and print the prompt the model would see.

use std::path::PathBuf;

use anyhow::{Context, Result};
use onebit_tokenizer::{ChatRequest, ChatTemplate};

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["model", "template_file"])))]
pub struct Args {
    /// Take the template (and the BOS/EOS texts) from this GGUF file.
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Use this Jinja template instead.
    #[arg(long = "template-file", alias = "chat-template-file", value_name = "FILE")]
    pub template_file: Option<PathBuf>,
    /// `{"messages": [...], "tools": [...], "add_generation_prompt": true, ...other variables}`.
    #[arg(long, value_name = "REQ.json")]
    pub request: PathBuf,
}

pub fn run(args: Args) -> Result<()> {
    let raw = std::fs::read_to_string(&args.request).with_context(|| format!("reading {}", args.request.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&raw).with_context(|| format!("{} is not JSON", args.request.display()))?;
    let mut req = ChatRequest::from_json(&json)?;
    let obj = json.as_object();
    let given = |k: &str| obj.is_some_and(|o| o.contains_key(k));
    let template = match (&args.template_file, &args.model) {
        (Some(f), _) => {
            let src = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            ChatTemplate::new(&src)?
        }
        (None, Some(m)) => {
            let tok = super::tokenize::load(m)?;
            if !given("bos_token") {
                req.bos_token = tok.token_text(tok.vocab().specials.bos);
            }
            if !given("eos_token") {
                req.eos_token = tok.token_text(tok.vocab().specials.eos);
            }
            ChatTemplate::for_model(tok.chat_template())?
        }
        (None, None) => unreachable!("clap requires one source"),
    };
    print!("{}", template.render(&req)?);
    Ok(())
}
