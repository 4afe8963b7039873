//! Splitting special-token text out of the input before tokenization, as llama.cpp does.
//!
//! Special tokens are taken longest first: each one is found everywhere in the remaining text
//! fragments before the next is looked for. With special parsing off, control and unknown
//! tokens stay text, but user-defined tokens are still split out. A token marked lstrip/rstrip
//! swallows the whitespace beside it.

use crate::vocab::{Vocab, attr};

/// A piece of the input: text still to tokenize, or a token already found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

pub(crate) fn partition<'a>(vocab: &Vocab, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
    let mut frags = vec![Fragment::Text(text)];
    if text.is_empty() {
        return Vec::new();
    }
    for &id in &vocab.special_cache {
        let a = vocab.attr(id);
        if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let needle = vocab.tokens[id as usize].as_str();
        if !frags.iter().any(|f| matches!(f, Fragment::Text(t) if t.contains(needle))) {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            match f {
                Fragment::Text(t) => split_on(t, needle, id, a, &mut next),
                tok => next.push(tok),
            }
        }
        frags = next;
    }
    frags
}

fn split_on<'a>(mut t: &'a str, needle: &str, id: u32, a: u16, out: &mut Vec<Fragment<'a>>) {
    while let Some(at) = t.find(needle) {
        let mut left = &t[..at];
        if a & attr::LSTRIP != 0 {
            left = left.trim_end_matches(|c: char| c.is_ascii_whitespace() || c == '\x0b');
        }
        if !left.is_empty() {
            out.push(Fragment::Text(left));
        }
        out.push(Fragment::Token(id));
        t = &t[at + needle.len()..];
        if a & attr::RSTRIP != 0 {
            t = t.trim_start_matches(|c: char| c.is_ascii_whitespace() || c == '\x0b');
        }
    }
    if !t.is_empty() {
        out.push(Fragment::Text(t));
    }
}
