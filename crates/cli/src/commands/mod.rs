//! The subcommands of `onebit`, one module each.

pub mod batched_bench;
pub mod bench;
pub mod bench_spec;
pub mod chat;
pub mod convert;
pub mod gen_args;
pub mod inspect;
pub mod logits;
pub mod model_args;
pub mod output_file;
pub mod perplexity;
pub mod quantize;
pub mod resolve;
pub mod run;
pub mod serve;
pub mod template;
pub mod tokenize;
pub mod ui;
