//! The subcommands of `onebit`, one module each.

pub mod inspect;
