//! The GBNF reader: source text to a small syntax tree ([`Expr`] per rule), with every error
//! naming its line and column. It follows llama.cpp's reading of the format (a rule ends at a
//! newline outside parentheses, a newline after `|` continues it, `#` comments anywhere
//! whitespace may be), written from the format's description, not from its code.

use std::collections::HashMap;

use super::chars::CharSet;

/// A position in the source, 1-based, counted in characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Pos {
    pub line: usize,
    pub col: usize,
}

/// A token reference (`<[id]>`, `<text>`, and their `!` negations).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum TokenRef {
    Id { id: u32, negated: bool },
    Text(String),
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Expr {
    /// A string literal, already unescaped (may be empty).
    Lit(String),
    /// A character class over code points (negation and `.` already resolved).
    Class(CharSet),
    /// A reference to rule number `.0`.
    Ref(usize),
    Token(TokenRef),
    Seq(Vec<Expr>),
    Alt(Vec<Expr>),
    /// `e{min,max}`; `max: None` is unbounded.
    Rep(Box<Expr>, u32, Option<u32>),
}

pub(super) struct Rule {
    pub name: String,
    /// Where the rule was defined; `None` for a name only referenced.
    pub defined_at: Option<Pos>,
    /// Where it was first referenced (for the "undefined rule" error).
    pub first_use: Option<Pos>,
    pub body: Expr,
}

/// Repetition counts above this are refused: llama.cpp refuses them too, and larger ones are
/// almost always a mistake that would make a huge grammar.
const MAX_REPETITION: u32 = 10_000;

/// Parentheses nested deeper than this are refused: the reader, and the converter after
/// it, recurse once per level, and a server must not overflow its stack on a hostile input.
const MAX_NESTING: usize = 64;

pub(super) struct Parser<'a> {
    chars: Vec<char>,
    /// Index in `chars` where each line starts, for line/column numbers.
    line_starts: Vec<usize>,
    at: usize,
    depth: usize,
    pub rules: Vec<Rule>,
    ids: HashMap<String, usize>,
    src: &'a str,
}

type PResult<T> = Result<T, String>;

impl<'a> Parser<'a> {
    pub fn new(src: &'a str) -> Parser<'a> {
        let chars: Vec<char> = src.chars().collect();
        let mut line_starts = vec![0];
        line_starts.extend(chars.iter().enumerate().filter(|(_, c)| **c == '\n').map(|(i, _)| i + 1));
        Parser { chars, line_starts, at: 0, depth: 0, rules: Vec::new(), ids: HashMap::new(), src }
    }

    fn pos_of(&self, at: usize) -> Pos {
        let line = self.line_starts.partition_point(|&s| s <= at);
        Pos { line, col: at - self.line_starts[line - 1] + 1 }
    }

    pub fn err_at(&self, at: usize, msg: impl std::fmt::Display) -> String {
        let p = self.pos_of(at);
        let line = self.src.lines().nth(p.line - 1).unwrap_or("").trim_end();
        // Quote the line for context, but not a whole megabyte of one-line grammar.
        let mut quoted: String = line.chars().take(100).collect();
        if quoted.len() < line.len() {
            quoted.push('…');
        }
        format!("GBNF error at line {}, column {}: {msg} (in `{quoted}`)", p.line, p.col)
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn peek_at(&self, k: usize) -> Option<char> {
        self.chars.get(self.at + k).copied()
    }

    /// Skips blanks and comments; newlines too when `newlines` (inside parentheses, after
    /// `|`, between rules).
    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.at += 1,
                '\r' | '\n' if newlines => self.at += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n' && c != '\r') {
                        self.at += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn is_word(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '-'
    }

    fn name(&mut self) -> PResult<String> {
        let start = self.at;
        while self.peek().is_some_and(Self::is_word) {
            self.at += 1;
        }
        if start == self.at {
            if self.peek() == Some('|') {
                // The common slip: GBNF continues a rule after a trailing `|`, not before a
                // leading one.
                return Err(self.err_at(start, "a line cannot start with `|`: end the previous line with it instead"));
            }
            return Err(self.err_at(start, "expected a rule name"));
        }
        Ok(self.chars[start..self.at].iter().collect())
    }

    fn rule_id(&mut self, name: &str) -> usize {
        if let Some(&i) = self.ids.get(name) {
            return i;
        }
        self.ids.insert(name.to_string(), self.rules.len());
        self.rules.push(Rule {
            name: name.to_string(),
            defined_at: None,
            first_use: None,
            body: Expr::Seq(Vec::new()),
        });
        self.rules.len() - 1
    }

    /// The whole grammar: rules until the end of input.
    pub fn grammar(&mut self) -> PResult<()> {
        self.skip_space(true);
        while self.peek().is_some() {
            self.rule()?;
            self.skip_space(true);
        }
        Ok(())
    }

    fn rule(&mut self) -> PResult<()> {
        let start = self.at;
        let name = self.name()?;
        self.skip_space(false);
        if !(self.peek() == Some(':') && self.peek_at(1) == Some(':') && self.peek_at(2) == Some('=')) {
            return Err(self.err_at(self.at, format!("expected `::=` after rule name `{name}`")));
        }
        self.at += 3;
        self.skip_space(true);
        let body = self.alternatives(false)?;
        match self.peek() {
            None | Some('\n') | Some('\r') => {}
            Some(c) => return Err(self.err_at(self.at, format!("unexpected `{c}`"))),
        }
        let id = self.rule_id(&name);
        let here = self.pos_of(start);
        if let Some(prev) = self.rules[id].defined_at {
            // llama.cpp silently keeps the last definition; refusing is clearer.
            return Err(self.err_at(start, format!("rule `{name}` is defined twice (first at line {})", prev.line)));
        }
        self.rules[id].defined_at = Some(here);
        self.rules[id].body = body;
        Ok(())
    }

    fn alternatives(&mut self, nested: bool) -> PResult<Expr> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.at += 1;
            self.skip_space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(if alts.len() == 1 { alts.pop().unwrap_or(Expr::Seq(Vec::new())) } else { Expr::Alt(alts) })
    }

    fn sequence(&mut self, nested: bool) -> PResult<Expr> {
        let mut items: Vec<Expr> = Vec::new();
        loop {
            let start = self.at;
            let Some(c) = self.peek() else { break };
            let item = match c {
                '"' => Expr::Lit(self.literal()?),
                '[' => Expr::Class(self.class()?),
                '.' => {
                    self.at += 1;
                    Expr::Class(CharSet::all())
                }
                '(' => {
                    if self.depth >= MAX_NESTING {
                        return Err(self.err_at(start, format!("parentheses nested deeper than {MAX_NESTING}")));
                    }
                    self.at += 1;
                    self.skip_space(true);
                    self.depth += 1;
                    let inner = self.alternatives(true);
                    self.depth -= 1;
                    let inner = inner?;
                    if self.peek() != Some(')') {
                        return Err(self.err_at(self.at, "expected `)`"));
                    }
                    self.at += 1;
                    inner
                }
                '<' | '!' => Expr::Token(self.token()?),
                '*' | '+' | '?' | '{' => {
                    let (min, max) = self.repetition()?;
                    let Some(last) = items.pop() else {
                        return Err(self.err_at(start, format!("`{c}` has nothing to repeat")));
                    };
                    Expr::Rep(Box::new(last), min, max)
                }
                c if Self::is_word(c) => {
                    let name = self.name()?;
                    let id = self.rule_id(&name);
                    if self.rules[id].first_use.is_none() {
                        self.rules[id].first_use = Some(self.pos_of(start));
                    }
                    Expr::Ref(id)
                }
                _ => break,
            };
            items.push(item);
            self.skip_space(nested);
        }
        Ok(if items.len() == 1 { items.pop().unwrap_or(Expr::Seq(Vec::new())) } else { Expr::Seq(items) })
    }

    fn repetition(&mut self) -> PResult<(u32, Option<u32>)> {
        let start = self.at;
        let c = self.peek();
        self.at += 1;
        let r = match c {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            _ => {
                self.skip_space(false);
                // `{,n}` is not llama.cpp syntax but reads unambiguously as `{0,n}`.
                let min = if self.peek() == Some(',') { 0 } else { self.int()? };
                self.skip_space(false);
                let max = match self.peek() {
                    Some('}') => Some(min),
                    Some(',') => {
                        self.at += 1;
                        self.skip_space(false);
                        let max =
                            if self.peek().is_some_and(|c| c.is_ascii_digit()) { Some(self.int()?) } else { None };
                        self.skip_space(false);
                        if self.peek() != Some('}') {
                            return Err(self.err_at(self.at, "expected `}` closing the repetition"));
                        }
                        max
                    }
                    _ => return Err(self.err_at(self.at, "expected `,` or `}` in the repetition")),
                };
                self.at += 1;
                if max.is_some_and(|max| max < min) {
                    return Err(self.err_at(start, "repetition maximum is below its minimum"));
                }
                (min, max)
            }
        };
        Ok(r)
    }

    fn int(&mut self) -> PResult<u32> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
        }
        if start == self.at {
            return Err(self.err_at(start, "expected a number"));
        }
        let s: String = self.chars[start..self.at].iter().collect();
        match s.parse::<u32>() {
            Ok(n) if n <= MAX_REPETITION => Ok(n),
            _ => Err(self.err_at(start, format!("repetition count {s} is over {MAX_REPETITION}"))),
        }
    }

    /// One character of a literal or class, with its escapes resolved to a code point (which
    /// may be a surrogate or beyond U+10FFFF: the callers decide what that means).
    fn char(&mut self) -> PResult<u32> {
        let start = self.at;
        let Some(c) = self.peek() else {
            return Err(self.err_at(start, "unexpected end of input"));
        };
        self.at += 1;
        if c != '\\' {
            return Ok(c as u32);
        }
        let Some(e) = self.peek() else {
            return Err(self.err_at(start, "unexpected end of input after `\\`"));
        };
        self.at += 1;
        let digits = match e {
            'n' => return Ok('\n' as u32),
            't' => return Ok('\t' as u32),
            'r' => return Ok('\r' as u32),
            '\\' | '"' | '[' | ']' | '-' => return Ok(e as u32),
            'x' => 2,
            'u' => 4,
            'U' => 8,
            _ => return Err(self.err_at(start, format!("unknown escape `\\{e}`"))),
        };
        let mut v: u32 = 0;
        for _ in 0..digits {
            match self.peek().and_then(|c| c.to_digit(16)) {
                Some(d) => {
                    v = (v << 4) | d;
                    self.at += 1;
                }
                None => {
                    return Err(self.err_at(start, format!("`\\{e}` needs {digits} hexadecimal digits")));
                }
            }
        }
        Ok(v)
    }

    fn literal(&mut self) -> PResult<String> {
        let open = self.at;
        self.at += 1;
        let mut s = String::new();
        loop {
            match self.peek() {
                None => return Err(self.err_at(open, "unterminated string literal")),
                Some('"') => break,
                _ => {}
            }
            let at = self.at;
            let v = self.char()?;
            match char::from_u32(v) {
                Some(c) => s.push(c),
                None => {
                    return Err(self.err_at(at, format!("U+{v:X} is not a Unicode scalar value")));
                }
            }
        }
        self.at += 1;
        Ok(s)
    }

    fn class(&mut self) -> PResult<CharSet> {
        let open = self.at;
        self.at += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.at += 1;
        }
        let mut set = CharSet::empty();
        loop {
            match self.peek() {
                None => return Err(self.err_at(open, "unterminated character class")),
                Some(']') => break,
                _ => {}
            }
            let lo = self.char()?;
            let mut hi = lo;
            if self.peek() == Some('-') && self.peek_at(1).is_some_and(|c| c != ']') {
                self.at += 1;
                let at = self.at;
                hi = self.char()?;
                if hi < lo {
                    return Err(self.err_at(at, "character range is reversed"));
                }
            }
            // Surrogates and values past U+10FFFF never occur in text: they are dropped.
            set.add(lo, hi);
        }
        self.at += 1;
        Ok(if negated { set.complement() } else { set })
    }

    fn token(&mut self) -> PResult<TokenRef> {
        let start = self.at;
        let negated = self.peek() == Some('!');
        if negated {
            self.at += 1;
        }
        if self.peek() != Some('<') {
            return Err(self.err_at(self.at, "expected `<` after `!`"));
        }
        self.at += 1;
        let body_start = self.at;
        while self.peek().is_some_and(|c| c != '>') {
            self.at += 1;
        }
        if self.peek() != Some('>') {
            return Err(self.err_at(start, "unterminated token reference `<...>`"));
        }
        let body: String = self.chars[body_start..self.at].iter().collect();
        self.at += 1;
        if let Some(id) = body.strip_prefix('[').and_then(|b| b.strip_suffix(']')) {
            let digits = !id.is_empty() && id.chars().all(|c| c.is_ascii_digit());
            return match id.parse::<u32>() {
                Ok(id) if digits => Ok(TokenRef::Id { id, negated }),
                _ => Err(self.err_at(start, format!("bad token id `{id}` in `<[...]>`"))),
            };
        }
        if negated {
            return Err(self.err_at(
                start,
                "a negated token must be given by id (`!<[123]>`): llguidance cannot negate a token named by its text",
            ));
        }
        if body.is_empty() || body.chars().any(|c| c.is_whitespace() || c == '<') {
            return Err(self.err_at(start, format!("token text `<{body}>` cannot be referenced")));
        }
        Ok(TokenRef::Text(body))
    }
}
