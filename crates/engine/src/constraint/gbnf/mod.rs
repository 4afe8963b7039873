//! llama.cpp's GBNF grammars, converted to llguidance's Lark dialect.
//!
//! GBNF is a context-free grammar over Unicode code points with no lexer; llguidance splits a
//! grammar into lexemes (strings and regexes, matched greedily — a lexeme ends only where no
//! allowed lexeme can go on, with no backtracking) and an Earley parser over them. Copying the
//! grammar naively would change its language: `[0-9]+ "0"` as one regex lexeme would eat the
//! final `0`. So the conversion keeps every lexeme *prefix-free* against every other lexeme
//! that could be allowed with it, in which case greedy lexing never cuts at the wrong place:
//!
//! * a character class, `.`, and each character of a string are one-code-point lexemes
//!   (UTF-8 is prefix-free, so these never conflict with one another);
//! * a string of several characters stays one lexeme when no other lexeme of the grammar is
//!   a prefix of it or starts like it would;
//! * in a sequence, a run of two or more regular items (no recursion, no token references,
//!   referenced rules inlined) that is never empty and prefix-free becomes one regex lexeme
//!   — when no other lexeme of the grammar can start with one of its first characters. This
//!   is what makes `"\"" char* "\""` one lexeme, which matters: llguidance walks the
//!   token trie with its parser at every lexeme boundary, so code-point-sized lexemes over
//!   free text make masks slow (measured: 29 masks along a JSON string over a 128k-token
//!   vocabulary, 48 ms with one lexeme per character, 0.6 ms with the string as one).
//!
//! Conflicting multi-character lexemes are demoted (strings split, runs given up) until none
//! is left. Everything else stays Lark parser rules (lowercase, `root` as `start`), which
//! keep the GBNF structure, so the output reads like the input. The prefix-freedom analysis
//! is conservative (first-character sets), never optimistic: a random-grammar test checks
//! the converted languages against a reference reading of the GBNF.
//!
//! Token references map to llguidance's special-token syntax: `<[12]>` stays, `!<[12]>`
//! becomes `<[^12]>`, `<name>` stays (llguidance resolves it among the special tokens, where
//! llama.cpp tokenizes the text; an unknown name fails when the grammar is compiled);
//! `!<name>` is refused (llguidance cannot negate a token given by text). One gap remains:
//! where a token reference and text could both take the next token, llguidance commits to
//! the token reference, so `!<[66]>* "z"` never reaches its `z` (llama.cpp would); the usual
//! shape, `!<[66]>* <[66]>`, is exact.
//!
//! Where this reads GBNF differently from llama.cpp, it refuses rather than guesses: a rule
//! defined twice (llama.cpp keeps the last), repetition counts over 10 000, parentheses
//! nested over 64 deep, a surrogate or out-of-range code point in a string. It accepts
//! `{,n}` as `{0,n}`. In a class, surrogates are dropped (no text contains them), so
//! `[\uD800-\uDFFF]` matches nothing.

mod chars;
mod parse;
#[cfg(test)]
mod tests;

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use chars::CharSet;
use parse::{Expr, Parser, TokenRef};

/// Above this many characters a run's regex (referenced rules inlined, which can blow up
/// with nesting) is given up, and its items stay separate.
const MAX_REGEX: usize = 20_000;

/// How deep a chain of references may be inlined into one regex.
const MAX_INLINE_DEPTH: usize = 32;

/// Convert llama.cpp GBNF to llguidance Lark. Errors name what cannot be expressed (with
/// line/col), so the server can answer 400 with the message.
pub fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let mut p = Parser::new(src);
    p.grammar()?;
    let rules = std::mem::take(&mut p.rules);
    for r in &rules {
        if r.defined_at.is_none() {
            let at = r.first_use.map(|p| format!("line {}, column {}", p.line, p.col));
            return Err(format!(
                "GBNF error at {}: rule `{}` is used but never defined",
                at.unwrap_or_default(),
                r.name
            ));
        }
    }
    let Some(root) = rules.iter().position(|r| r.name == "root") else {
        return Err("GBNF error: the grammar has no `root` rule (its start rule)".to_string());
    };
    let bodies: Vec<&Expr> = rules.iter().map(|r| &r.body).collect();
    let names = lark_names(&rules.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), root);
    Ok(Converter::new(bodies, names).emit(root))
}

/// Lark rule names: `root` is `start`; others lowercased, `-` as `_`, a prefix when they
/// do not start with a letter, and a numeric suffix against collisions (`A` and `a`).
fn lark_names(names: &[&str], root: usize) -> Vec<String> {
    let mut used: HashSet<String> = HashSet::from(["start".to_string()]);
    let mut out = Vec::with_capacity(names.len());
    for (i, n) in names.iter().enumerate() {
        if i == root {
            out.push("start".to_string());
            continue;
        }
        let mut base: String = n.chars().map(|c| if c == '-' { '_' } else { c.to_ascii_lowercase() }).collect();
        if !base.starts_with(|c: char| c.is_ascii_lowercase()) {
            base.insert_str(0, "r_");
        }
        let mut name = base.clone();
        let mut k = 2;
        while used.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        used.insert(name.clone());
        out.push(name);
    }
    out
}

/// What the lexeme-safety analysis knows about a regular expression.
#[derive(Clone)]
struct Info {
    nullable: bool,
    first: CharSet,
    /// No word of the language is a proper prefix of another.
    prefix_free: bool,
}

/// The lexemes a rendering uses, for the conflict check: multi-character ones by identity,
/// single-code-point ones as one union (those never conflict with one another).
#[derive(Default)]
struct Lexemes {
    multi: Vec<(Lexeme, CharSet)>,
    chars: CharSet,
    /// Rules referenced from the rendered text, which must be emitted too.
    refs: Vec<usize>,
}

/// A multi-character lexeme: a string, or a regex made of a run of sequence items.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Lexeme {
    Lit(String),
    Rx(String),
}

struct Converter<'a> {
    bodies: Vec<&'a Expr>,
    names: Vec<String>,
    /// Rules with no recursion and no token references (they can be inlined into regexes).
    regular: Vec<bool>,
    info: HashMap<usize, Info>,
    /// Strings split into one lexeme per character, because they conflicted.
    split: HashSet<String>,
    /// Regex lexemes given up because they conflicted.
    forbidden: HashSet<String>,
    /// Each regular rule's regex, once built.
    rx_memo: RefCell<HashMap<usize, Option<(String, u8)>>>,
}

impl<'a> Converter<'a> {
    fn new(bodies: Vec<&'a Expr>, names: Vec<String>) -> Converter<'a> {
        let n = bodies.len();
        let mut c = Converter {
            bodies,
            names,
            regular: vec![false; n],
            info: HashMap::new(),
            split: HashSet::new(),
            forbidden: HashSet::new(),
            rx_memo: RefCell::new(HashMap::new()),
        };
        let mut state = vec![0u8; n];
        for r in 0..n {
            c.mark_regular(r, &mut state, 0);
        }
        for r in 0..n {
            if c.regular[r] {
                c.rule_info(r);
            }
        }
        c
    }

    /// Depth-first: `state` 1 = on the stack (a cycle), 2 = done. A chain of references
    /// deeper than [`MAX_INLINE_DEPTH`] counts as not regular, which bounds the recursion of
    /// everything that follows references into regular rules.
    fn mark_regular(&mut self, r: usize, state: &mut Vec<u8>, depth: usize) -> bool {
        match state[r] {
            1 => return false,
            2 => return self.regular[r],
            _ if depth > MAX_INLINE_DEPTH => return false,
            _ => {}
        }
        state[r] = 1;
        let mut refs = Vec::new();
        let mut tokens = false;
        walk(self.bodies[r], &mut |e| match e {
            Expr::Ref(t) => refs.push(*t),
            Expr::Token(_) => tokens = true,
            _ => {}
        });
        let mut ok = !tokens;
        for t in refs {
            ok = ok && self.mark_regular(t, state, depth + 1);
        }
        state[r] = 2;
        self.regular[r] = ok;
        ok
    }

    fn is_regular(&self, e: &Expr) -> bool {
        let mut ok = true;
        walk(e, &mut |x| match x {
            Expr::Ref(t) => ok &= self.regular[*t],
            Expr::Token(_) => ok = false,
            _ => {}
        });
        ok
    }

    fn rule_info(&mut self, r: usize) -> Info {
        if let Some(i) = self.info.get(&r) {
            return i.clone();
        }
        let i = self.expr_info(self.bodies[r]);
        self.info.insert(r, i.clone());
        i
    }

    /// Only called on regular expressions (references lead to regular rules, which have no
    /// cycles, so the recursion ends).
    fn expr_info(&mut self, e: &Expr) -> Info {
        match e {
            Expr::Lit(s) => match s.chars().next() {
                Some(c) => Info { nullable: false, first: CharSet::single(c), prefix_free: true },
                None => Info { nullable: true, first: CharSet::empty(), prefix_free: true },
            },
            Expr::Class(set) => Info { nullable: false, first: set.clone(), prefix_free: true },
            Expr::Ref(r) => self.rule_info(*r),
            Expr::Token(_) => Info { nullable: false, first: CharSet::empty(), prefix_free: false },
            Expr::Alt(alts) => {
                let mut first = CharSet::empty();
                let (mut nullable, mut pf) = (false, true);
                for a in alts {
                    let i = self.expr_info(a);
                    // An empty word is a prefix of every other word; overlapping first
                    // characters are a cheap, safe stand-in for "might share a prefix".
                    pf &= i.prefix_free && !i.nullable && !first.intersects(&i.first);
                    nullable |= i.nullable;
                    first = first.union(&i.first);
                }
                Info { nullable, first, prefix_free: pf }
            }
            Expr::Rep(inner, min, max) => {
                let i = self.expr_info(inner);
                rep_info(i, *min, *max)
            }
            Expr::Seq(items) => self.seq_info(items),
        }
    }

    fn seq_info(&mut self, items: &[Expr]) -> Info {
        // Right to left: `tail` describes the items after the current one.
        let mut tail = Info { nullable: true, first: CharSet::empty(), prefix_free: true };
        for item in items.iter().rev() {
            // The inner expression of a repetition is analysed once (nested repetitions
            // would otherwise cost twice per level).
            let inner = match item {
                Expr::Rep(x, _, _) => Some(self.expr_info(x)),
                _ => None,
            };
            let i = match (item, &inner) {
                (Expr::Rep(_, min, max), Some(xi)) => rep_info(xi.clone(), *min, *max),
                _ => self.expr_info(item),
            };
            let pf = match inner {
                // x{m,n} T is prefix-free when x and T are, neither can be empty, and T
                // cannot start like x: a word's split into x's and T is then forced.
                Some(xi) => {
                    i.prefix_free && tail.prefix_free
                        || xi.prefix_free
                            && !xi.nullable
                            && tail.prefix_free
                            && !tail.nullable
                            && !xi.first.intersects(&tail.first)
                }
                // Concatenating prefix-free languages keeps them prefix-free.
                _ => i.prefix_free && tail.prefix_free,
            };
            let first = if i.nullable { i.first.union(&tail.first) } else { i.first };
            tail = Info { nullable: i.nullable && tail.nullable, first, prefix_free: pf };
        }
        tail
    }

    /// Renders the reachable rules until no multi-character lexeme conflicts with another
    /// lexeme, demoting (splitting strings, giving up regex runs) those that do.
    fn emit(mut self, root: usize) -> String {
        loop {
            let mut lx = Lexemes::default();
            let text = self.render_rules(root, &mut lx);
            let mut demote: Vec<Lexeme> = Vec::new();
            for (a, first_a) in &lx.multi {
                let bad = first_a.intersects(&lx.chars)
                    || lx.multi.iter().any(|(b, first_b)| {
                        a != b
                            && match (a, b) {
                                // Two strings only clash when one is a prefix of the other.
                                (Lexeme::Lit(x), Lexeme::Lit(y)) => {
                                    x.starts_with(y.as_str()) || y.starts_with(x.as_str())
                                }
                                _ => first_a.intersects(first_b),
                            }
                    });
                if bad {
                    demote.push(a.clone());
                }
            }
            if demote.is_empty() {
                return text;
            }
            for d in demote {
                match d {
                    Lexeme::Lit(s) => self.split.insert(s),
                    Lexeme::Rx(s) => self.forbidden.insert(s),
                };
            }
        }
    }

    fn render_rules(&mut self, root: usize, lx: &mut Lexemes) -> String {
        let mut lines: Vec<(usize, String)> = Vec::new();
        let mut done = vec![false; self.bodies.len()];
        lx.refs.push(root);
        while let Some(r) = lx.refs.pop() {
            if std::mem::replace(&mut done[r], true) {
                continue;
            }
            let body = self.render(self.bodies[r], lx).0;
            lines.push((if r == root { 0 } else { r + 1 }, format!("{}: {}\n", self.names[r], body)));
        }
        // `start` first, then the source order.
        lines.sort_unstable();
        lines.into_iter().map(|(_, l)| l).collect()
    }

    fn add_multi(lx: &mut Lexemes, l: Lexeme, first: CharSet) {
        if !lx.multi.iter().any(|(m, _)| *m == l) {
            lx.multi.push((l, first));
        }
    }

    /// Lark text of a parser-rule expression, with its precedence (0 alternation,
    /// 1 sequence, 2 atom) so callers know when to parenthesise; records its lexemes.
    fn render(&mut self, e: &Expr, lx: &mut Lexemes) -> (String, u8) {
        match e {
            Expr::Lit(s) if s.is_empty() => ("\"\"".to_string(), 2),
            Expr::Lit(s) if s.chars().count() == 1 || self.split.contains(s) => {
                let parts: Vec<String> = s.chars().map(|c| lark_string(&c.to_string())).collect();
                lx.chars = s.chars().fold(std::mem::take(&mut lx.chars), |a, c| a.union(&CharSet::single(c)));
                let prec = if parts.len() == 1 { 2 } else { 1 };
                (parts.join(" "), prec)
            }
            Expr::Lit(s) => {
                let first = s.chars().next().map(CharSet::single).unwrap_or_default();
                Self::add_multi(lx, Lexeme::Lit(s.clone()), first);
                (lark_string(s), 2)
            }
            Expr::Class(set) => {
                lx.chars = lx.chars.union(set);
                (format!("/{}/", class_regex(set)), 2)
            }
            Expr::Ref(r) => {
                lx.refs.push(*r);
                (self.names[*r].clone(), 2)
            }
            Expr::Token(TokenRef::Id { id, negated: false }) => (format!("<[{id}]>"), 2),
            Expr::Token(TokenRef::Id { id, negated: true }) => (format!("<[^{id}]>"), 2),
            Expr::Token(TokenRef::Text(t)) => (format!("<{t}>"), 2),
            Expr::Seq(items) if items.is_empty() => ("\"\"".to_string(), 2),
            Expr::Seq(items) => self.render_seq(items, lx),
            Expr::Alt(alts) => {
                let parts: Vec<String> = alts.iter().map(|a| paren(self.render(a, lx), 1)).collect();
                (parts.join(" | "), 0)
            }
            Expr::Rep(inner, min, max) => {
                let base = paren(self.render(inner, lx), 2);
                (format!("{base}{}", rep_suffix(*min, *max)), 1)
            }
        }
    }

    /// A sequence, with each longest run of two or more regular items whose language is
    /// prefix-free (and never empty) rendered as one regex lexeme.
    fn render_seq(&mut self, items: &[Expr], lx: &mut Lexemes) -> (String, u8) {
        let mut parts: Vec<(String, u8)> = Vec::new();
        let mut i = 0;
        while i < items.len() {
            let mut taken = false;
            // Runs are capped so that long sequences stay quadratic in a small constant.
            let far = items.len().min(i + 64);
            for j in (i + 2..=far).rev() {
                let run = &items[i..j];
                if !run.iter().all(|x| self.is_regular(x)) {
                    continue;
                }
                let info = self.seq_info(run);
                if info.nullable || !info.prefix_free {
                    continue;
                }
                let Some(rx) = self.regex(&Expr::Seq(run.to_vec())) else { continue };
                let rx = rx.0;
                if self.forbidden.contains(&rx) {
                    continue;
                }
                Self::add_multi(lx, Lexeme::Rx(rx.clone()), info.first);
                parts.push((format!("/{rx}/"), 2));
                i = j;
                taken = true;
                break;
            }
            if !taken {
                parts.push(self.render(&items[i], lx));
                i += 1;
            }
        }
        let prec = if parts.len() == 1 { parts[0].1 } else { 1 };
        let text: Vec<String> = parts.into_iter().map(|p| paren(p, 1)).collect();
        (text.join(" "), prec)
    }

    /// Rust-regex text of a regular expression, rules inlined, with its precedence as in
    /// [`Converter::render`]; `None` past [`MAX_REGEX`] characters (inlining nested rules
    /// can grow exponentially, and this stops it early).
    fn regex(&self, e: &Expr) -> Option<(String, u8)> {
        let r = match e {
            Expr::Lit(s) => (s.chars().map(regex_char).collect(), if s.chars().count() == 1 { 2 } else { 1 }),
            Expr::Class(set) => (class_regex(set), 2),
            Expr::Ref(r) => {
                if let Some(memo) = self.rx_memo.borrow().get(r) {
                    return memo.clone();
                }
                let rx = self.regex(self.bodies[*r]);
                self.rx_memo.borrow_mut().insert(*r, rx.clone());
                return rx;
            }
            // Never reached: runs are regular, and regular rules have no tokens.
            Expr::Token(_) => (NOTHING.to_string(), 2),
            Expr::Seq(items) => {
                let mut text = String::new();
                for i in items {
                    text.push_str(&rx_paren(self.regex(i)?, 1));
                }
                (text, 1)
            }
            Expr::Alt(alts) => {
                let mut parts = Vec::with_capacity(alts.len());
                for a in alts {
                    parts.push(self.regex(a)?.0);
                }
                (parts.join("|"), 0)
            }
            Expr::Rep(inner, min, max) => (format!("{}{}", rx_paren(self.regex(inner)?, 2), rep_suffix(*min, *max)), 1),
        };
        (r.0.len() <= MAX_REGEX).then_some(r)
    }
}

fn rx_paren((text, prec): (String, u8), need: u8) -> String {
    if prec >= need { text } else { format!("(?:{text})") }
}

/// A regex matching nothing (a GBNF `[]`, or a class of surrogates only).
const NOTHING: &str = "[^\\x{0}-\\x{10FFFF}]";

/// Only an exact count of a prefix-free language is prefix-free on its own; a sequence can
/// still make a variable count prefix-free (see `seq_info`).
fn rep_info(i: Info, min: u32, max: Option<u32>) -> Info {
    Info { nullable: min == 0 || i.nullable, first: i.first, prefix_free: i.prefix_free && max == Some(min) }
}

fn paren((text, prec): (String, u8), need: u8) -> String {
    if prec >= need { text } else { format!("({text})") }
}

fn rep_suffix(min: u32, max: Option<u32>) -> String {
    match (min, max) {
        (0, None) => "*".to_string(),
        (1, None) => "+".to_string(),
        (0, Some(1)) => "?".to_string(),
        (m, None) => format!("{{{m},}}"),
        (m, Some(n)) if m == n => format!("{{{m}}}"),
        (m, Some(n)) => format!("{{{m},{n}}}"),
    }
}

/// Calls `f` on `e` and every sub-expression (not following references).
fn walk<'e>(e: &'e Expr, f: &mut dyn FnMut(&'e Expr)) {
    f(e);
    match e {
        Expr::Seq(v) | Expr::Alt(v) => v.iter().for_each(|x| walk(x, f)),
        Expr::Rep(x, _, _) => walk(x, f),
        _ => {}
    }
}

/// A Lark string literal (JSON syntax; non-ASCII text stays as is).
fn lark_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7F => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One code point in a Rust regex: ASCII punctuation escaped (that also covers the `/`
/// that would end Lark's `/.../`), except `<` `>` which regex reads as word boundaries when
/// escaped; invisible characters as `\x{..}`.
fn regex_char(c: char) -> String {
    if c.is_ascii_alphanumeric() || c == '<' || c == '>' {
        c.to_string()
    } else if c.is_ascii_punctuation() {
        format!("\\{c}")
    } else if !c.is_ascii() && !c.is_control() && !c.is_whitespace() {
        c.to_string()
    } else {
        format!("\\x{{{:x}}}", c as u32)
    }
}

fn class_regex(set: &CharSet) -> String {
    if set.is_all() {
        return "(?s:.)".to_string();
    }
    if set.is_empty() {
        return NOTHING.to_string();
    }
    let comp = set.complement();
    let (neg, ranges) = if comp.ranges().len() < set.ranges().len() {
        ("^", comp.ranges().to_vec())
    } else {
        ("", set.ranges().to_vec())
    };
    let mut out = format!("[{neg}");
    for (lo, hi) in ranges {
        let ch = |v: u32| char::from_u32(v).map(regex_char).unwrap_or_default();
        out.push_str(&ch(lo));
        if hi > lo {
            if hi > lo + 1 {
                out.push('-');
            }
            out.push_str(&ch(hi));
        }
    }
    out.push(']');
    out
}
