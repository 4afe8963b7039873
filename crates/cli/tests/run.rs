//! `onebit run` as a user runs it: llama.cpp's greedy continuation, the JSON report, prompts from
//! standard input, `--quiet`, and one-line errors when the model cannot be found.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn onebit(args: &[&str], stdin: Option<&str>, env: &[(&str, &std::path::Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_onebit"));
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn raw_greedy_run_prints_llama_cpp_continuation() {
    let (Some(model), Some(fx)) =
        (onebit_testkit::demo_model(), onebit_testkit::fixture("logits-SmolLM2-135M-Instruct.Q4_1.json"))
    else {
        return;
    };
    let m = model.to_str().unwrap();
    let p = &fx["prompts"][0];
    assert_eq!(p["text"], "The capital of France is");
    let want: Vec<u64> = p["greedy"].as_array().unwrap().iter().take(24).map(|t| t.as_u64().unwrap()).collect();

    let args = ["run", "-m", m, "--raw", "--temp", "0", "-n", "24", "-p", "The capital of France is"];
    let out = onebit(&args, None, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    let printed = printed.strip_suffix('\n').unwrap();
    assert!(p["greedy_text"].as_str().unwrap().starts_with(printed), "printed {printed:?}");
    assert_eq!(
        printed,
        " Paris.\n\nThe United States has a population of approximately 311 million people.\n\nThe United States"
    );
    let stats = text(&out.stderr);
    assert!(stats.contains("prompt: 5 tokens") && stats.contains("generated: 24 tokens"), "{stats}");

    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = onebit(&json_args, None, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<u64> = v["ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    assert_eq!(ids, want);
    assert_eq!(v["text"], printed);
    assert_eq!((v["prompt_tokens"].as_u64(), v["completion_tokens"].as_u64()), (Some(5), Some(24)));
    assert_eq!(v["finish_reason"], "length");
    assert!(v["timings"]["decode_tokens_per_second"].as_f64().unwrap() > 0.0);
    assert!(out.stderr.is_empty(), "--json keeps stderr quiet: {}", text(&out.stderr));
}

/// Gemma 3 270M (sliding-window layers, GELU gates): the fixture prompts continue exactly as
/// llama.cpp's greedy tokens, up to the first end-of-generation token, where `run` stops (the
/// reference's first token after prompt 4 is `<eos>`). Prompts 3 and 6 are left out: llama.cpp's
/// own margin between its two best tokens falls under the fixtures' 0.1 std tie rule at their
/// steps 7 and 3 (0.086 and 0.028 std), where either token is a correct answer. Prompt 0 is
/// compared up to its step 11 for the same reason: there llama.cpp's own AVX2 build (Zen 2)
/// picks " largest" over the fixture's " capital" by 0.21 (0.076 std), and so does onebit's
/// AVX2 tier.
#[test]
fn gemma3_raw_greedy_runs_reproduce_llama_cpp() {
    let (Some(model), Some(fx)) =
        (onebit_testkit::gemma3_model(), onebit_testkit::fixture("logits-gemma-3-270m-q4_k_m.json"))
    else {
        return;
    };
    let m = model.to_str().unwrap();
    let prompts = fx["prompts"].as_array().unwrap();
    for (p, steps) in [(0, 11), (1, 32), (2, 32), (4, 32), (5, 32)].map(|(i, steps)| (&prompts[i], steps)) {
        let prompt = p["text"].as_str().unwrap();
        let out = onebit(&["run", "-m", m, "--raw", "--temp", "0", "-n", "32", "--json", "-p", prompt], None, &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["prompt_tokens"].as_u64(), Some(p["tokens"].as_array().unwrap().len() as u64), "{prompt:?}");
        let greedy: Vec<u64> = p["greedy"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
        // Gemma's ends of generation: <eos> (1) and <end_of_turn> (106).
        let until_eog: Vec<u64> = greedy.iter().copied().take_while(|&t| t != 1 && t != 106).collect();
        let ids: Vec<u64> = v["ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
        if steps < until_eog.len() {
            assert_eq!(ids[..steps.min(ids.len())], until_eog[..steps], "{prompt:?}");
            continue;
        }
        assert_eq!(ids, until_eog, "{prompt:?}");
        if until_eog.len() == greedy.len() {
            assert_eq!(v["text"], p["greedy_text"], "{prompt:?}");
        } else {
            assert_eq!(v["finish_reason"], "stop", "{prompt:?}");
        }
    }
}

#[test]
fn prompt_from_stdin_through_the_chat_template_quietly() {
    let Some(model) = onebit_testkit::demo_model() else { return };
    let args = ["run", "-m", model.to_str().unwrap(), "--temp", "0", "-n", "32", "--quiet"];
    let out = onebit(&args, Some("What is the capital of France? Answer in one sentence."), &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("Paris"), "{}", text(&out.stdout));
    assert!(out.stderr.is_empty(), "--quiet prints only the answer: {}", text(&out.stderr));

    let out = onebit(&args, Some("  \n"), &[]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr).lines().count(), 1, "{}", text(&out.stderr));
}

#[test]
fn a_missing_model_is_one_clear_line() {
    let empty = tempfile::tempdir().unwrap();
    // No -m and no demo model in the cache: say how to fetch it.
    let out = onebit(&["run", "-p", "hi"], None, &[("XDG_CACHE_HOME", empty.path())]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("make fetch-model"), "{err}");

    // Neither a file nor a Hugging Face name.
    let out = onebit(&["run", "-m", "no/such/model.gguf", "-p", "hi"], None, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no such file"), "{}", text(&out.stderr));

    // A Hugging Face name that cannot be fetched (no network here, or no such repository).
    let out =
        onebit(&["run", "-m", "onebit-test-no-such-org/no-such-repo", "-p", "hi"], None, &[("HF_HOME", empty.path())]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("Hugging Face"), "{err}");
}

#[test]
fn impossible_contexts_and_pools_are_one_clear_line() {
    let Some(model) = onebit_testkit::demo_model() else { return };
    let m = model.to_str().unwrap();
    for (args, says) in [
        (vec!["run", "-m", m, "-c", "99999999999", "-p", "hi"], "trained for"),
        (vec!["run", "-m", m, "--parallel", "100000000", "-p", "hi"], "memory"),
        (vec!["run", "-m", m, "-c", "256", "--kv-size", "64", "-p", "hi"], "--kv-size"),
        (vec!["run", "-m", m, "--raw", "-c", "4", "-p", "a long prompt that cannot fit"], "context"),
    ] {
        let out = onebit(&args, None, &[]);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: ") && err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn batched_bench_prints_llama_batched_bench_s_table_and_json_lines() {
    let Some(model) = onebit_testkit::shared_file("models/qwen3-q8_0.gguf") else { return };
    let m = model.to_str().unwrap();
    let out = onebit(&["batched-bench", "-m", m, "-npp", "16,32", "-ntg", "4", "-npl", "1,3", "-t", "2"], None, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(
        rows[0],
        "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |"
    );
    assert_eq!(rows.len(), 2 + 4, "{table}");
    let cells: Vec<&str> = rows[5].split('|').map(str::trim).collect();
    assert_eq!(&cells[1..5], &["32", "4", "3", "108"], "{table}");

    let args = ["batched-bench", "-m", m, "-npp", "16", "-ntg", "4", "-npl", "2", "-pps", "--output-format", "jsonl"];
    let out = onebit(&args, None, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    for key in
        ["pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed", "is_pp_shared", "n_threads"]
    {
        assert!(v.get(key).is_some(), "{key} missing: {v}");
    }
    assert_eq!(
        (v["pp"].as_u64(), v["pl"].as_u64(), v["n_kv"].as_u64(), v["is_pp_shared"].as_u64()),
        (Some(16), Some(2), Some(24), Some(1))
    );
}

#[test]
fn bench_prints_llama_bench_s_table_and_with_spec_the_drafts_kept() {
    let Some(model) = onebit_testkit::shared_file("models/qwen3-q8_0.gguf") else { return };
    let m = model.to_str().unwrap();
    let out = onebit(&["bench", "-m", m, "-p", "8", "-n", "4", "-r", "1", "-t", "2"], None, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let rows: Vec<Vec<&str>> =
        table.lines().filter(|l| l.starts_with('|')).map(|l| l.split('|').map(str::trim).collect()).collect();
    assert_eq!(rows[0][1..8], ["model", "size", "params", "backend", "threads", "test", "t/s"], "{table}");
    assert_eq!(rows.len(), 4, "{table}");
    assert_eq!((rows[2][6], rows[3][6], rows[3].len()), ("pp8", "tg4", 9), "{table}");
    assert!(rows[2][1].starts_with("qwen3 ") && rows[2][1].ends_with(" Q8_0"), "the file type: {table}");

    // With --spec: tg decodes after the built-in copy request, without and with drafts.
    let args = ["bench", "-m", m, "-p", "0", "-n", "32", "-r", "1", "-t", "2", "--spec", "lookup"];
    // --draft-always: whether drafts pay depends on step times, which a loaded CPU distorts.
    let out = onebit(&[&args[..], &["--json", "--draft-always"]].concat(), None, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    assert_eq!((rows[0]["test"].as_str(), rows[1]["test"].as_str()), (Some("tg32 off"), Some("tg32 lookup")));
    assert_eq!((rows[0]["spec"].as_str(), rows[0]["drafted_tokens"].as_u64()), (Some("off"), Some(0)));
    assert!(rows[0]["prompt_tokens"].as_u64().unwrap() > 900, "{v}");
    // Random weights repeat themselves: the lookup drafts, and some drafts are kept.
    let (drafted, kept) = (rows[1]["drafted_tokens"].as_u64().unwrap(), rows[1]["accepted_tokens"].as_u64().unwrap());
    assert!(drafted > 0 && kept > 0 && kept <= drafted, "{v}");
    assert!(rows[1]["t/s"].as_f64().unwrap() > 0.0);

    let out = onebit(&args, None, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let last: Vec<&str> = table.lines().last().unwrap().split('|').map(str::trim).collect();
    // Without --draft-always, drafts are taken only where the measured step costs say they pay,
    // so under a loaded CPU this run may take none ("-"); the JSON run above checked that they are.
    let kept = last[8] == "-" || last[8].contains(" %)");
    assert!(table.contains("drafts kept") && last[6] == "tg32 lookup" && kept, "{table}");

    let out = onebit(&["bench", "-m", m, "-d", "16", "--spec", "lookup"], None, &[]);
    assert!(!out.status.success() && text(&out.stderr).contains("-d"), "{}", text(&out.stderr));
}
