//! The subcommands of `onebit`, one module each.

pub mod bench;
pub mod inspect;
pub mod logits;
pub mod model_args;
pub mod template;
pub mod tokenize;
