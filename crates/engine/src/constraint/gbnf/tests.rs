//! Tests of the GBNF → Lark converter: output text for simple cases, errors, no panics on
//! mangled input, and — the part that matters — the converted grammars compiled by
//! llguidance over a byte-level tokenizer, accepting and rejecting sample strings exactly as
//! the GBNF language does (greedy lexing must not change the language).
//!
//! `testdata/*.gbnf` are llama.cpp's example grammars (from llama.cpp's `grammars/`
//! directory, MIT licence, copyright the ggml authors: `testdata/LICENSE-llama.cpp`), used as
//! test input only.

use std::collections::BTreeSet;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::{ApproximateTokEnv, TokEnv};

use super::gbnf_to_lark;

fn factory() -> Arc<ParserFactory> {
    use std::sync::OnceLock;
    static F: OnceLock<Arc<ParserFactory>> = OnceLock::new();
    F.get_or_init(|| {
        let env: TokEnv = ApproximateTokEnv::single_byte_env();
        let mut f = ParserFactory::new_simple(&env).expect("factory");
        f.quiet();
        Arc::new(f)
    })
    .clone()
}

/// Converts and compiles; panics with the Lark text when llguidance refuses it.
fn compile(gbnf: &str) -> (String, Matcher) {
    let lark = gbnf_to_lark(gbnf).unwrap_or_else(|e| panic!("conversion failed: {e}"));
    let parser = factory().create_parser(TopLevelGrammar::from_lark(lark.clone()));
    if let Err(e) = &parser {
        panic!("llguidance refused the converted grammar: {e}\n--- lark ---\n{lark}");
    }
    (lark.clone(), Matcher::new(parser))
}

/// Whether the (single-byte-token) matcher accepts exactly `s`.
fn accepts(m: &Matcher, s: &str) -> bool {
    let mut m = m.deep_clone();
    let toks: Vec<u32> = s.bytes().map(u32::from).collect();
    m.consume_tokens(&toks).is_ok() && m.is_accepting().unwrap_or(false)
}

/// Checks every `yes` is accepted and every `no` rejected, reporting all failures at once.
fn check(gbnf: &str, yes: &[&str], no: &[&str]) {
    let (lark, m) = compile(gbnf);
    let mut bad = Vec::new();
    for s in yes {
        if !accepts(&m, s) {
            bad.push(format!("should accept {s:?}"));
        }
    }
    for s in no {
        if accepts(&m, s) {
            bad.push(format!("should reject {s:?}"));
        }
    }
    assert!(bad.is_empty(), "{}\n--- lark ---\n{lark}", bad.join("\n"));
}

fn testdata(name: &str) -> String {
    let path = format!("{}/src/constraint/gbnf/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

const EXAMPLES: [&str; 8] = [
    "arithmetic.gbnf",
    "c.gbnf",
    "chess.gbnf",
    "english.gbnf",
    "japanese.gbnf",
    "json.gbnf",
    "json_arr.gbnf",
    "list.gbnf",
];

#[test]
fn every_llama_cpp_example_converts_and_compiles() {
    for name in EXAMPLES {
        compile(&testdata(name));
    }
}

#[test]
fn json_example_accepts_json_and_rejects_the_rest() {
    let yes = [
        "{}",
        "{ }",
        r#"{"a": 1}"#,
        r#"{"a":1,"b":[true,false,null]}"#,
        "{\"k\": \"esc \\\" \\\\ \\n \\u00e9 \u{e9}\u{1F600}\"}",
        r#"{"n": -0.5e+3}"#,
        r#"{"n": 12345, "o": {"p": []}}"#,
        "{\n\t\"a\": [1, 2]}",
    ];
    let no = [
        "",
        "[]",
        "{",
        r#"{"a"}"#,
        r#"{"a": tru}"#,
        r#"{"a": "x"#,
        "{\"a\": \"line\nbreak\"}",
        r#"{"a": "\q"}"#,
        r#"{"a": 01x}"#,
        r#"{'a': 1}"#,
        "{} {}",
    ];
    check(&testdata("json.gbnf"), &yes, &no);
}

#[test]
fn json_arr_example() {
    let g = testdata("json_arr.gbnf");
    check(&g, &["[\n]", "[\n{\"a\": 1},\n[2]]", "[\n\"x\"]"], &["[]", "{}", "[\n1,]"]);
}

#[test]
fn arithmetic_list_chess_english_japanese_examples() {
    check(
        &testdata("arithmetic.gbnf"),
        &["x=1\n", "a1 +2 = (b+2 *c)\n", "z=3\n1=z\n"],
        &["x=\n", "x=b+2\n", "x=1", "X=1\n"],
    );
    check(&testdata("list.gbnf"), &["- a\n", "- milk\n- eggs\n"], &["", "-a\n", "- a", "- a\u{2028}b\n"]);
    check(
        &testdata("chess.gbnf"),
        &["1. e4 e5\n2. Nf3 Nc6\n", "1. O-O O-O-O\n2. exd5 Qxd5+\n"],
        &["1. e4 e5\n", "1. e9 e5\n2. a3 a4\n"],
    );
    check(&testdata("english.gbnf"), &["Hello, world!", "a b\tc"], &["", "héllo", "a  b"]);
    check(&testdata("japanese.gbnf"), &["こんにちは", "カタカナ 漢字、"], &["", "abc"]);
}

#[test]
fn c_example_parses_a_small_program() {
    let g = testdata("c.gbnf");
    check(
        &g,
        &["int main(){return 0;}", "int f(int x){x = x+1;while(x<10){x = x*2;}}"],
        &["int main(){return 0}", "main(){}"],
    );
}

/// Greedy lexing would eat the final `0` if `[0-9]+` were one regex lexeme, and so on: the
/// converted grammar must keep GBNF's language exactly.
#[test]
fn greedy_lexing_does_not_change_the_language() {
    check(r#"root ::= [0-9]+ "0""#, &["00", "10", "1230"], &["0", "1", "01"]);
    check(r#"root ::= "a"+ "ab""#, &["aab", "aaab"], &["ab", "aa"]);
    check(r#"root ::= "ab" "c" | "a" "bd""#, &["abc", "abd"], &["ab", "abdc"]);
    check(r#"root ::= "foo" | "foobar" | "fo" "obaz""#, &["foo", "foobar", "foobaz"], &["fo", "foob"]);
    check(r#"root ::= [a-z] "x" | "a" "y""#, &["ax", "ay", "bx"], &["by", "a"]);
    check("root ::= s \"!\"? s\ns ::= \"'\" [^']* \"'\"", &["''''", "'a'!'b'"], &["'a'", "'a''"]);
    check(r#"root ::= "<" [a-z]* ">" [a-z]*"#, &["<>", "<ab>cd"], &["<a", "<a>>"]);
    check(r#"root ::= "\"" [a-z]* "\"" | "\"x" [0-9]"#, &["\"\"", "\"ab\"", "\"x1"], &["\"x", "\"1\""]);
}

#[test]
fn every_construct() {
    let g = r#"
# a comment line
root ::= greeting ws list? tail   # trailing comment
greeting ::= "h\x65llo" | "\u00e9t\U0001F600" | [Hh] "i"
ws ::= [ \t\n]*
list ::= "[" (item ("," item){0,2})? "]"
item ::= [^\],\[\\"-] | "\\" ["\\\-\]] | [0-9]{2} | "(" list ")"
tail ::= ( "a"{3} | "b"{2,} | "c"{,1} "!" ) (
    "x" |
    "y"
  )
"#;
    check(
        g,
        &["hello[]aaax", "hello\n[q,([/]),12]bby", "\u{e9}t\u{1F600}bbbby", "Hi[\\-]!x", "hi c!y", "hello!y"],
        &["hello[-]aaax", "hello[a,b,c,d]aaax", "hello[\"]aaax", "Hello aaax", "helloaax", "hi[123]aaax", "hi cc!y"],
    );
    let (_, m) = compile(g);
    assert!(accepts(&m, "hello[1,\\],([([])])]aaax"));
}

#[test]
fn dot_class_edges_and_unicode_ranges() {
    check(r#"root ::= "<" . ">""#, &["<a>", "<\n>", "<\u{e9}>", "<\u{1F600}>", "<>>"], &["<>", "<ab>"]);
    check(r#"root ::= [^a] [ぁ-ゟ]"#, &["bぁ", "\nゟ", "\u{1F600}ぃ"], &["aぁ", "bア"]);
    check(r#"root ::= "a" | [] "b""#, &["a"], &["b", ""]);
    check(r#"root ::= [\uD800-\uDFFF] | "ok""#, &["ok"], &[""]);
    check(r#"root ::= [^] "!""#, &["x!", "\n!"], &["!"]);
    check(r#"root ::= [/] "/" [\-\]] [a-]"#, &["//-a", "//]-"], &["//a-"]);
    check(r#"root ::= "" | "x""#, &["", "x"], &["xx"]);
}

#[test]
fn crlf_line_ends() {
    check("root ::= a |\r\n  b\r\na ::= \"x\" # c\r\nb ::= (\r\n\"y\"\r\n)\r\n", &["x", "y"], &["xy", "\r\n"]);
}

#[test]
fn recursion_and_multiline_rules() {
    let g = "root ::= expr\nexpr ::= term (\n  (\"+\" | \"-\") term\n)*\nterm ::= [0-9]+ | \"(\" expr \")\"\n";
    check(g, &["1", "1+2", "(1-(2+3))+4", "((((9))))"], &["", "1+", "(1", "1)"]);
    // Left recursion works too (Earley).
    check("root ::= root \"a\" | \"b\"", &["b", "baaa"], &["a", "ab"]);
}

#[test]
fn repetition_bounds() {
    check(
        r#"root ::= "a"{2,4} "b"{3} [0-9]{1,}"#,
        &["aabbb1", "aaaabbb123"],
        &["abbb1", "aaaaabbb1", "aabb1", "aabbb"],
    );
    check(r##"root ::= ("ab" | "c"){0,2} ".""##, &[".", "ab.", "cab.", "cc."], &["abcab.", "a."]);
}

#[test]
fn schema_style_grammar_from_the_readme() {
    // The shape llama.cpp's JSON-schema converter produces: uppercase and dashed names,
    // repetition counts, an empty alternative.
    let g = r#"char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
QAPair ::= "{" space QAPair-name-kv "}" space
QAPair-name-kv ::= "\"name\"" space ":" space string
qapair ::= "x"
root ::= "[" space QAPair ("," space QAPair){0,2} "]" space | qapair
space ::= | " " | "\n" [ \t]{0,20}
string ::= "\"" char{1,10} "\"" space
"#;
    check(
        g,
        &[r#"[{"name": "ab"}]"#, "[ {\"name\":\"\\u00e9\"} ,{\"name\":\"q\"}]\n", "x"],
        &[r#"[{"name": ""}]"#, r#"[{"name": "abcdefghijk"}]"#, r#"[{"nam": "a"}]"#],
    );
}

#[test]
fn token_references() {
    // Single-byte tokenizer: token 65 is the byte `A`.
    let lark = gbnf_to_lark("root ::= <[65]> !<[66]>* \"z\"").unwrap();
    assert_eq!(lark, "start: <[65]> <[^66]>* \"z\"\n");
    // The shape of llama.cpp's thinking example: anything but B, then B.
    let (_, m) = compile("root ::= <[65]> !<[66]>* <[66]> \"z\"");
    assert!(accepts(&m, "ABz") && accepts(&m, "ACAzBz"));
    assert!(!accepts(&m, "Bz") && !accepts(&m, "Az") && !accepts(&m, "ABBz"));
    // The documented gap: where a negated token and text could both take a token,
    // llguidance takes the token, so this never reaches its "z".
    let (_, m) = compile("root ::= <[65]> !<[66]>* \"z\"");
    assert!(!accepts(&m, "Az"));
    assert_eq!(gbnf_to_lark("root ::= <think> x\nx ::= \"a\"").unwrap(), "start: <think> x\nx: \"a\"\n");
    let e = gbnf_to_lark("root ::= <think> thinking </think>\nthinking ::= !</think>*").unwrap_err();
    assert!(e.contains("line 2, column 14") && e.contains("by id"), "{e}");
}

#[test]
fn output_text_for_simple_cases() {
    let t = |g: &str| gbnf_to_lark(g).unwrap();
    assert_eq!(t("root ::= \"hi\""), "start: \"hi\"\n");
    assert_eq!(t("root ::= my-Rule\nmy-Rule ::= [a-c]"), "start: my_rule\nmy_rule: /[a-c]/\n");
    // Names that would collide after mapping get suffixes; `start` is reserved for `root`.
    assert_eq!(
        t("root ::= a-b A-B start 9x\na-b ::= \"1\"?\nA-B ::= \"2\"?\nstart ::= \"3\"?\n9x ::= \"4\"?"),
        "start: a_b a_b_2 start_2 r_9x\na_b: \"1\"?\na_b_2: \"2\"?\nstart_2: \"3\"?\nr_9x: \"4\"?\n"
    );
    assert_eq!(t("root ::= [^\"\\\\] .*\n"), "start: /[^\\\"\\\\]/ /(?s:.)/*\n");
    assert_eq!(
        t("root ::= (\"a\" | \"b\")* \"c\"{2,5} \"d\"{3,} \"e\"?"),
        "start: (\"a\" | \"b\")* \"c\"{2,5} \"d\"{3,} \"e\"?\n"
    );
    assert_eq!(t("root ::= \"\\n\\t\\\"\\x01\""), "start: \"\\n\\t\\\"\\u0001\"\n");
    // A prefix-free regular run becomes one regex lexeme.
    assert_eq!(t("root ::= \"'\" [^']* \"'\""), "start: /\\'[^\\']*\\'/\n");
}

#[test]
fn errors_name_the_problem_and_place() {
    let err = |g: &str, want: &[&str]| {
        let e = gbnf_to_lark(g).expect_err(g);
        for w in want {
            assert!(e.contains(w), "{g:?}: {e:?} lacks {w:?}");
        }
    };
    err("root ::= a b\na ::= \"x\"", &["rule `b` is used but never defined", "line 1, column 12"]);
    err("item ::= \"x\"", &["no `root` rule"]);
    err("root ::= \"abc", &["unterminated string literal", "line 1, column 10"]);
    err("root ::= \"a\\qb\"", &["unknown escape `\\q`", "line 1, column 12"]);
    err("root ::= \"\\x4\"", &["`\\x` needs 2 hexadecimal digits"]);
    err("root ::= \"\\uD800\"", &["U+D800 is not a Unicode scalar value"]);
    err("root ::= [a-", &["unterminated character class"]);
    err("root ::= [z-a]", &["character range is reversed"]);
    err("root ::= (\"a\"", &["expected `)`"]);
    err("root ::= \"a\")", &["unexpected `)`"]);
    err("root ::= * \"a\"", &["`*` has nothing to repeat"]);
    err("root ::= \"a\"{3,2}", &["maximum is below its minimum"]);
    err("root ::= \"a\"{99999}", &["over 10000"]);
    err("root ::= \"a\"{2", &["expected `,` or `}`"]);
    err("root = \"a\"", &["expected `::=`"]);
    err("root ::= \"a\"\nroot ::= \"b\"", &["defined twice", "line 2"]);
    err("root ::= <[12x]>", &["bad token id"]);
    err("root ::= <abc", &["unterminated token reference"]);
    err("root ::= !\"a\"", &["expected `<` after `!`"]);
    err("", &["no `root` rule"]);
    err("root ::= \"a\"\n  | \"b\"", &["cannot start with `|`", "line 2, column 3"]);
}

/// Mangled versions of every example and random byte soup: the converter answers (Ok or
/// Err) and never panics; whatever it accepts llguidance compiles.
#[test]
fn never_panics_on_mangled_input() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let pieces = [
        "\"", "[", "]", "(", ")", "|", "*", "{", "}", ",", "\\", "\\x", "\\u", "<", ">", "!", "-", "^", "\n", "::=",
        "#", ".", "root", " ", "é", "{1,2}", "\u{0}",
    ];
    let mut sources: Vec<String> = EXAMPLES.iter().map(|n| testdata(n)).collect();
    sources.push("root ::= \"a\"".to_string());
    let mut compiled = 0;
    for round in 0..400 {
        let base = &sources[round % sources.len()];
        let mut chars: Vec<char> = base.chars().collect();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(chars.len() + 1);
            match rng.below(3) {
                0 if at < chars.len() => {
                    chars.remove(at);
                }
                1 => chars.splice(at..at, pieces[rng.below(pieces.len())].chars()).for_each(drop),
                _ => chars.truncate(at),
            }
        }
        let src: String = chars.into_iter().collect();
        if let Ok(lark) = gbnf_to_lark(&src)
            && round % 8 == 0
        {
            // Token references by name need a vocabulary that has them; skip those.
            if !lark.contains('<') {
                compile(&src);
                compiled += 1;
            }
        }
    }
    for _ in 0..300 {
        let len = rng.below(40);
        let bytes: Vec<u8> = (0..len).map(|_| rng.below(128) as u8).collect();
        let _ = gbnf_to_lark(&String::from_utf8_lossy(&bytes));
    }
    assert!(compiled > 0);
}

/// xorshift64: deterministic and dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

/// The end positions of `e` matched from `at` (a plain, slow reference reading of the GBNF
/// syntax tree; the generated grammars below have no recursion, so it terminates).
fn ends(rules: &[super::parse::Rule], e: &super::parse::Expr, s: &[char], at: usize) -> BTreeSet<usize> {
    use super::parse::Expr;
    match e {
        Expr::Lit(l) => {
            let l: Vec<char> = l.chars().collect();
            let hit = s.len() >= at + l.len() && s[at..at + l.len()] == l[..];
            if hit { BTreeSet::from([at + l.len()]) } else { BTreeSet::new() }
        }
        Expr::Class(set) => match s.get(at) {
            Some(&c) if set.intersects(&super::chars::CharSet::single(c)) => BTreeSet::from([at + 1]),
            _ => BTreeSet::new(),
        },
        Expr::Ref(r) => ends(rules, &rules[*r].body, s, at),
        Expr::Token(_) => BTreeSet::new(),
        Expr::Seq(items) => items
            .iter()
            .fold(BTreeSet::from([at]), |acc, item| acc.iter().flat_map(|&p| ends(rules, item, s, p)).collect()),
        Expr::Alt(alts) => alts.iter().flat_map(|a| ends(rules, a, s, at)).collect(),
        Expr::Rep(inner, min, max) => {
            let mut out = BTreeSet::new();
            let mut cur = BTreeSet::from([at]);
            for k in 0..=(*min as usize + s.len() + 1) {
                if k >= *min as usize {
                    out.extend(cur.iter().copied());
                }
                if max.is_some_and(|m| k >= m as usize) || cur.is_empty() {
                    break;
                }
                cur = cur.iter().flat_map(|&p| ends(rules, inner, s, p)).collect();
            }
            out
        }
    }
}

fn random_grammar(rng: &mut Rng) -> String {
    fn alt(rng: &mut Rng, rule: usize, depth: usize) -> String {
        let n = 1 + rng.below(3);
        let mut alts: Vec<String> = (0..n).map(|_| seq(rng, rule, depth)).collect();
        // A `|` at the end of a line continues the rule onto the next one.
        if alts.last().is_some_and(|a| a.is_empty()) {
            alts.push("\"\"".to_string());
        }
        alts.join(" | ")
    }
    fn seq(rng: &mut Rng, rule: usize, depth: usize) -> String {
        let n = rng.below(4);
        let mut items = Vec::new();
        for _ in 0..n {
            let mut item = match rng.below(7) {
                0 | 1 => {
                    let len = 1 + rng.below(3);
                    let l: String = (0..len).map(|_| ['a', 'b', '\''][rng.below(3)]).collect();
                    format!("\"{l}\"")
                }
                2 => ["[ab]", "[^a]", "[a-b]", "[']", "[b']"][rng.below(5)].to_string(),
                3 => ".".to_string(),
                4 if rule < 3 => format!("r{}", rule + 1 + rng.below(3 - rule)),
                5 if depth < 2 => format!("({})", alt(rng, rule, depth + 1)),
                _ => "\"a\"".to_string(),
            };
            if rng.below(3) == 0 {
                item.push_str(["*", "+", "?", "{0,2}", "{2}", "{1,}"][rng.below(6)]);
            }
            items.push(item);
        }
        items.join(" ")
    }
    let mut g = String::new();
    for r in 0..4 {
        let name = if r == 0 { "root".to_string() } else { format!("r{r}") };
        g.push_str(&format!("{name} ::= {}\n", alt(rng, r, 0)));
    }
    g
}

/// Random grammars over a tiny alphabet: the converted grammar, run by llguidance with its
/// greedy lexer, accepts exactly the strings the reference reading of the GBNF accepts.
#[test]
fn random_grammars_keep_their_language() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let alphabet = ['a', 'b', '\''];
    let mut strings: Vec<Vec<char>> = vec![vec![]];
    let mut frontier: Vec<Vec<char>> = vec![vec![]];
    for _ in 0..5 {
        frontier = frontier.iter().flat_map(|s| alphabet.iter().map(move |&c| [s.clone(), vec![c]].concat())).collect();
        strings.extend(frontier.iter().cloned());
    }
    for _ in 0..300 {
        let g = random_grammar(&mut rng);
        let mut p = super::parse::Parser::new(&g);
        p.grammar().unwrap_or_else(|e| panic!("{e}\n{g}"));
        let root = p.rules.iter().position(|r| r.name == "root").expect("root");
        let (lark, m) = compile(&g);
        for s in &strings {
            let want = ends(&p.rules, &p.rules[root].body, s, 0).contains(&s.len());
            let text: String = s.iter().collect();
            assert_eq!(accepts(&m, &text), want, "{text:?}\n--- gbnf ---\n{g}--- lark ---\n{lark}");
        }
    }
}

/// A regression found by the random test: an exact count before a non-prefix-free tail.
#[test]
fn exact_count_before_open_tail_is_not_one_lexeme() {
    check(r#"root ::= ("a" "a"{2} .*) [']+"#, &["aaa'", "aaab''", "aaa'''"], &["aa'", "aaa"]);
}

/// Inputs built to exhaust the converter: deep nesting is refused, long reference chains
/// and exponentially growing inlining finish quickly.
#[test]
fn hostile_inputs_are_bounded() {
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(5000), ")".repeat(5000));
    assert!(gbnf_to_lark(&deep).unwrap_err().contains("nested deeper than 64"));
    let nested_reps = format!("root ::= {}\"a\"{}", "(".repeat(60), ")*".repeat(60));
    gbnf_to_lark(&nested_reps).unwrap();

    let t = std::time::Instant::now();
    // A chain of 20 000 rules, each referencing the next.
    let mut chain = String::from("root ::= r0\n");
    for i in 0..20_000 {
        chain.push_str(&format!("r{i} ::= \"x\" r{}\n", i + 1));
    }
    chain.push_str("r20000 ::= \"!\"\n");
    let lark = gbnf_to_lark(&chain).unwrap();
    assert!(lark.lines().count() > 100);
    // Each rule doubles the one below: inlined, the last would be 2^40 characters.
    let mut doubling = String::from("root ::= d0 \"!\"\n");
    for i in 0..40 {
        doubling.push_str(&format!("d{i} ::= d{0} \"-\" d{0}\n", i + 1));
    }
    doubling.push_str("d40 ::= \"ab\"\n");
    let lark = gbnf_to_lark(&doubling).unwrap();
    assert!(lark.len() < 200_000, "{}", lark.len());
    assert!(t.elapsed().as_secs() < 20, "{:?}", t.elapsed());
    compile(&doubling);
}

/// With a real 128k-token vocabulary (llama.cpp's vocabulary-only test file, skipped when
/// absent), masks along a JSON string are computed within llguidance's default budgets
/// (and quickly: the string body is one regex lexeme, not one lexeme per character).
#[test]
fn json_masks_with_a_real_vocabulary() {
    let path = "/work/shared/models/vocab/ggml-vocab-llama-bpe.gguf";
    let Ok(file) = onebit_gguf::GgufFile::open(path) else {
        eprintln!("skipped: no {path}");
        return;
    };
    let tok = onebit_tokenizer::Tokenizer::from_metadata(&file.metadata()).expect("tokenizer");
    let n = tok.vocab().len() as u32;
    let words: Vec<Vec<u8>> = (0..n).map(|id| tok.piece(id, false).to_vec()).collect();
    let info = toktrie::TokRxInfo::new(n, n - 1);
    let env: TokEnv = Arc::new(ApproximateTokEnv::new(toktrie::TokTrie::from(&info, &words)));
    let mut f = ParserFactory::new_simple(&env).expect("factory");
    f.quiet();
    let lark = gbnf_to_lark(&testdata("json.gbnf")).unwrap();
    let mut m = Matcher::new(f.create_parser(TopLevelGrammar::from_lark(lark)));
    let t = std::time::Instant::now();
    let prefix = r#"{"name": "some free text, and"#;
    for tid in tok.encode(prefix, false, false).unwrap() {
        m.compute_mask().expect("mask");
        m.consume_token(tid).expect("token");
    }
    let mask = m.compute_mask().expect("mask inside a string");
    assert!(mask.num_set() > 50_000, "{}", mask.num_set());
    eprintln!("{} masks in {:?}", prefix.len(), t.elapsed());
}
