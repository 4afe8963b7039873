//! Every tool grammar compiles with llguidance, over a byte-level vocabulary with a few control
//! tokens, and accepts what the format's parser reads as calls (and refuses other text).

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value as Json, json};
use toktrie::{TokEnv, TokRxInfo, TokTrie};

use super::grammar::tool_constraint;
use super::{ChatFormat, ReasoningFormat, ToolChoice, ToolFormat};
use crate::constraint::Grammar;

/// Control tokens of the test vocabulary, after the 256 single bytes.
const SPECIALS: [&str; 3] = ["[TOOL_CALLS]", "<|python_tag|>", "<|eot|>"];

fn env() -> TokEnv {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for s in SPECIALS {
        let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        w.extend_from_slice(s.as_bytes());
        words.push(w);
    }
    let n = words.len() as u32;
    let info =
        TokRxInfo { vocab_size: n, tok_eos: n - 1, tok_bos: None, tok_pad: None, tok_unk: None, tok_end_of_turn: None };
    Arc::new(toktrie::ApproximateTokEnv::new(TokTrie::from(&info, &words)))
}

/// The id of a control token of the test vocabulary (the real one asks the tokenizer).
fn special(text: &str) -> Option<u32> {
    SPECIALS.iter().position(|s| *s == text).map(|i| 256 + i as u32)
}

/// Bytes as tokens, the control tokens' text as their ids.
fn tokens(text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let mut rest = text;
    'outer: while !rest.is_empty() {
        for s in SPECIALS {
            if let Some(r) = rest.strip_prefix(s) {
                out.push(special(s).unwrap_or(0));
                rest = r;
                continue 'outer;
            }
        }
        let c = rest.chars().next().unwrap_or(' ');
        out.extend(rest[..c.len_utf8()].bytes().map(u32::from));
        rest = &rest[c.len_utf8()..];
    }
    out
}

fn matcher(src: &str) -> Matcher {
    let env = env();
    let mut factory = ParserFactory::new_simple(&env).expect("factory");
    factory.quiet();
    let parser = factory.create_parser(TopLevelGrammar::from_lark(src.to_string()));
    let m = Matcher::new(parser);
    assert!(m.get_error().is_none(), "grammar does not compile: {:?}\n{src}", m.get_error());
    m
}

/// Whether the grammar takes all of `text` and may end there.
fn accepts(src: &str, text: &str) -> bool {
    let mut m = matcher(src);
    let ids = tokens(text);
    match m.validate_tokens(&ids) {
        Ok(n) if n == ids.len() => {}
        _ => return false,
    }
    m.consume_tokens(&ids).is_ok() && m.is_accepting().unwrap_or(false)
}

fn tools() -> Vec<Json> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"]}}}),
        json!({"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}),
    ]
}

fn lark(f: &ChatFormat, choice: &ToolChoice, parallel: bool, in_think: bool) -> (String, Option<String>) {
    let c = tool_constraint(f, &tools(), choice, parallel, in_think, &special).expect("constraint").expect("some");
    match c.grammar {
        Grammar::Lark(src) => (src, c.trigger),
        other => panic!("not Lark: {other:?}"),
    }
}

/// The calls the format's parser reads from `text` (name, arguments).
fn parsed_calls(f: &ChatFormat, text: &str, in_think: bool) -> Vec<(String, String)> {
    let mut p = f.parser(ReasoningFormat::Deepseek, in_think, true);
    p.push(text);
    p.finish();
    p.message().tool_calls.into_iter().map(|c| (c.name, c.arguments)).collect()
}

const W: &str = r#"{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}"#;

#[test]
fn hermes_required_auto_named() {
    let f = ChatFormat::new(ToolFormat::Hermes, false);
    let one = format!("<tool_call>\n{W}\n</tool_call>");
    let two = format!("{one}\n<tool_call>\n{{\"name\": \"now\", \"arguments\": {{}}}}\n</tool_call>");
    let (req, trig) = lark(&f, &ToolChoice::Required, false, false);
    assert_eq!(trig, None);
    assert!(accepts(&req, &one), "{req}");
    assert!(!accepts(&req, &two));
    assert!(!accepts(&req, "Sure!"));
    assert!(!accepts(&req, &one.replace("Paris\"", "Paris\", \"x\": 1")));
    assert_eq!(parsed_calls(&f, &two, false).len(), 2);
    let (par, _) = lark(&f, &ToolChoice::Required, true, false);
    assert!(accepts(&par, &one) && accepts(&par, &two));
    let (auto, trig) = lark(&f, &ToolChoice::Auto, true, false);
    assert_eq!(trig.as_deref(), Some("<tool_call>"));
    assert!(accepts(&auto, &two["<tool_call>".len()..]), "{auto}");
    let (named, _) = lark(&f, &ToolChoice::Named("now".into()), false, false);
    assert!(accepts(&named, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
    assert!(!accepts(&named, &one));
}

#[test]
fn hermes_thinking_first() {
    let f = ChatFormat::new(ToolFormat::Hermes, true);
    let call = format!("<tool_call>\n{W}\n</tool_call>");
    let (src, _) = lark(&f, &ToolChoice::Required, false, false);
    assert!(accepts(&src, &call));
    let thought = format!("<think>\nThe user wants <b>weather</b>.\n</think>\n\n{call}");
    assert!(accepts(&src, &thought), "{src}");
    assert_eq!(parsed_calls(&f, &thought, false).len(), 1);
    let (src, _) = lark(&f, &ToolChoice::Required, false, true);
    assert!(accepts(&src, &thought["<think>".len()..]), "{src}");
    assert!(!accepts(&src, &call));
}

#[test]
fn llama3_forms() {
    let f = ChatFormat::new(ToolFormat::Llama3, false);
    let one = r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#;
    let (req, _) = lark(&f, &ToolChoice::Required, false, false);
    assert!(accepts(&req, one), "{req}");
    assert_eq!(parsed_calls(&f, one, false), vec![("get_weather".into(), r#"{"city":"Paris"}"#.into())]);
    let (auto, trig) = lark(&f, &ToolChoice::Auto, false, false);
    let trig = trig.expect("lazy");
    assert!(one.starts_with(&trig));
    assert!(accepts(&auto, &one[trig.len()..]), "{auto}");
}

#[test]
fn mistral_forms() {
    let f = ChatFormat::new(ToolFormat::Mistral, false);
    let two = r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "arguments": {}, "id": "a1B2c3D4e"}]"#;
    let (req, _) = lark(&f, &ToolChoice::Required, true, false);
    assert!(req.contains("<[256]>"), "the control token by id: {req}");
    assert!(accepts(&req, two), "{req}");
    // Its text alone is not the token.
    assert!(!accepts(&req, &two.replace("[TOOL_CALLS]", "[TOOL_CALLS ]")));
    assert_eq!(parsed_calls(&f, two, false).len(), 2);
    let (auto, trig) = lark(&f, &ToolChoice::Auto, true, false);
    assert_eq!(trig.as_deref(), Some("[TOOL_CALLS]"));
    assert!(accepts(&auto, &two["[TOOL_CALLS]".len()..]));
}

#[test]
fn generic_forms() {
    let f = ChatFormat::new(ToolFormat::Generic, false);
    let one = format!("{{\"tool_call\": {W}}}");
    let many = format!("{{\"tool_calls\": [{W}, {{\"name\": \"now\", \"arguments\": {{}}}}]}}");
    let (req, trig) = lark(&f, &ToolChoice::Required, true, false);
    assert_eq!(trig, None);
    assert!(accepts(&req, &one) && accepts(&req, &many), "{req}");
    assert!(!accepts(&req, "{\"response\": \"hi\"}"));
    let (auto, trig) = lark(&f, &ToolChoice::Auto, false, false);
    assert_eq!(trig, None);
    assert!(accepts(&auto, "{\"response\": \"Il fait beau \u{2600}\"}") && accepts(&auto, &one));
    assert!(!accepts(&auto, &many));
    assert_eq!(parsed_calls(&f, &many, false).len(), 2);
}

#[test]
fn qwen_xml_forms() {
    let f = ChatFormat::new(ToolFormat::QwenXml, true);
    let call = "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    let (req, _) = lark(&f, &ToolChoice::Required, false, false);
    assert!(accepts(&req, call), "{req}");
    assert_eq!(parsed_calls(&f, call, false), vec![("get_weather".into(), r#"{"city":"São Paulo","days":3}"#.into())]);
    let (auto, trig) = lark(&f, &ToolChoice::Auto, false, false);
    assert_eq!(trig.as_deref(), Some("<tool_call>"));
    assert!(accepts(&auto, &call["<tool_call>".len()..]), "{auto}");
}

#[test]
fn choices_without_a_grammar_and_errors() {
    let f = ChatFormat::new(ToolFormat::Hermes, false);
    assert_eq!(tool_constraint(&f, &tools(), &ToolChoice::None, false, false, &special), Ok(None));
    assert_eq!(tool_constraint(&f, &[], &ToolChoice::Auto, false, false, &special), Ok(None));
    assert!(tool_constraint(&f, &[], &ToolChoice::Required, false, false, &special).is_err());
    assert!(tool_constraint(&f, &tools(), &ToolChoice::Named("nope".into()), false, false, &special).is_err());
    assert!(
        tool_constraint(&f, &[json!({"type": "function"})], &ToolChoice::Required, false, false, &special).is_err()
    );
    // Odd names are escaped, and a schema with its own references still compiles.
    let odd = vec![json!({"type": "function", "function": {"name": "a\"b\\c", "parameters": {
        "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": "integer"}}}}})];
    let c = tool_constraint(&f, &odd, &ToolChoice::Required, false, false, &special).unwrap().unwrap();
    let Grammar::Lark(src) = c.grammar else { panic!("not Lark") };
    assert!(
        accepts(&src, "<tool_call>\n{\"name\": \"a\\\"b\\\\c\", \"arguments\": {\"p\": 5}}\n</tool_call>"),
        "{src}"
    );
}

#[test]
fn tool_choice_from_json() {
    assert_eq!(ToolChoice::from_json(&json!("auto")), Ok(ToolChoice::Auto));
    assert_eq!(ToolChoice::from_json(&json!("none")), Ok(ToolChoice::None));
    assert_eq!(ToolChoice::from_json(&json!("required")), Ok(ToolChoice::Required));
    let named = json!({"type": "function", "function": {"name": "f"}});
    assert_eq!(ToolChoice::from_json(&named), Ok(ToolChoice::Named("f".into())));
    assert!(ToolChoice::from_json(&json!("any")).is_err());
    assert!(ToolChoice::from_json(&json!({"type": "function"})).is_err());
    assert!(ToolChoice::from_json(&json!(3)).is_err());
}

/// A random output the grammar allows (structural bytes favoured so that it ends), or `None`
/// if it did not end within the budget.
fn sample(src: &str, rng: &mut rand_chacha::ChaCha8Rng) -> Option<String> {
    use rand::Rng;
    let mut m = matcher(src);
    let eos = SPECIALS.len() as u32 + 255;
    let mut text = Vec::new();
    // Now and then the sampler tries to close thinking (random bytes would hardly ever).
    let mut plan: Vec<u32> = Vec::new();
    for _ in 0..800 {
        if m.is_stopped() {
            break;
        }
        let mask = m.compute_mask().ok()?;
        if plan.is_empty() && rng.random_bool(0.03) {
            plan = b"</think>".iter().rev().map(|&b| u32::from(b)).collect();
        }
        if let Some(&t) = plan.last() {
            plan.pop();
            if mask.is_allowed(t) {
                m.consume_token(t).ok()?;
                text.push(t as u8);
                continue;
            }
            plan.clear();
        }
        let allowed = mask.to_list();
        let structural: Vec<u32> =
            allowed.iter().copied().filter(|&t| t >= 256 || b"\"}]\n<>/:,0123".contains(&(t as u8))).collect();
        let printable: Vec<u32> = allowed.iter().copied().filter(|&t| (32..127).contains(&t)).collect();
        let pool = if !structural.is_empty() && rng.random_bool(0.4) {
            &structural
        } else if !printable.is_empty() && rng.random_bool(0.9) {
            &printable
        } else {
            &allowed
        };
        let t = *pool.get(rng.random_range(0..pool.len().max(1)))?;
        if t == eos {
            break;
        }
        m.consume_token(t).ok()?;
        match t {
            0..256 => text.push(t as u8),
            _ => text.extend_from_slice(SPECIALS[(t - 256) as usize].as_bytes()),
        }
    }
    if !(m.is_stopped() || m.is_accepting().unwrap_or(false)) {
        return None;
    }
    String::from_utf8(text).ok()
}

/// Whatever a Required grammar lets the model write, the parser reads as calls and nothing
/// else (a lazy one: the trigger plus what its grammar allows).
#[test]
fn grammar_outputs_parse_as_calls() {
    use rand::SeedableRng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let formats =
        [ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral, ToolFormat::QwenXml, ToolFormat::Generic];
    for fmt in formats {
        for thinking in [false, true] {
            let f = ChatFormat::new(fmt, thinking);
            for (choice, parallel) in
                [(ToolChoice::Required, true), (ToolChoice::Named("now".into()), false), (ToolChoice::Auto, true)]
            {
                let (src, trigger) = lark(&f, &choice, parallel, false);
                let mut done = 0;
                for _ in 0..12 {
                    let Some(out) = sample(&src, &mut rng) else { continue };
                    if huge_exponent(&out) {
                        // JSON allows 1e999; serde_json (f64) refuses it, so such a call is text.
                        continue;
                    }
                    let out = format!("{}{out}", trigger.as_deref().unwrap_or(""));
                    let mut p = f.parser(ReasoningFormat::Deepseek, false, true);
                    p.push(&out);
                    p.finish();
                    let m = p.message();
                    let generic_answer =
                        fmt == ToolFormat::Generic && choice == ToolChoice::Auto && m.tool_calls.is_empty();
                    assert!(
                        !m.tool_calls.is_empty() || generic_answer,
                        "{fmt:?} {choice:?}: no call in {out:?}\n{src}"
                    );
                    assert!(m.content.is_empty() || generic_answer, "{fmt:?} {choice:?}: content in {out:?}");
                    if let ToolChoice::Named(n) = &choice {
                        assert!(m.tool_calls.iter().all(|c| &c.name == n));
                    }
                    done += 1;
                }
                assert!(done >= 3, "{fmt:?} {choice:?} thinking {thinking}: only {done} samples ended\n{src}");
            }
        }
    }
}

/// Whether `s` has a number with a three-digit exponent.
fn huge_exponent(s: &str) -> bool {
    let b = s.as_bytes();
    (1..b.len()).any(|i| {
        let rest = &b[i + 1..];
        let rest = rest.strip_prefix(b"-").or_else(|| rest.strip_prefix(b"+")).unwrap_or(rest);
        b[i - 1].is_ascii_digit()
            && (b[i] | 0x20) == b'e'
            && rest.iter().take_while(|c| c.is_ascii_digit()).count() >= 3
    })
}
