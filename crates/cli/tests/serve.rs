//! `onebit serve` as a user starts it: the port opens, the greedy answer equals `onebit run
//! --temp 0` on the same prompt, CLI ranges are checked like the API's, and SIGTERM lets a
//! running request finish before the process exits 0.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Start the server on a free port; returns the process and its address.
fn serve(model: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(["serve", "--port", "0", "-t", "2", "-c", "512", "--shutdown-grace", "20", "-m"])
        .arg(model)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("the server says where it listens").unwrap();
        if let Some(rest) = line.strip_prefix("onebit: listening on http://") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    // Keep draining the log so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, addr)
}

/// One HTTP/1.1 exchange; the status and the body.
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status = raw.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn wait_ready(addr: &str) {
    for _ in 0..600 {
        if http(addr, "GET", "/health", "").0 == 200 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the server never became ready");
}

#[test]
fn served_greedy_text_equals_onebit_run() {
    let Some(model) = onebit_testkit::demo_model() else { return };
    let prompt = "What is the capital of France? Answer in one sentence.";
    let run = Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(["run", "--temp", "0", "-n", "40", "-q", "-c", "512", "-p", prompt, "-m"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let expected = String::from_utf8(run.stdout).unwrap();

    let (mut child, addr) = serve(&model);
    wait_ready(&addr);
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 40,
    });
    let (status, answer) = http(&addr, "POST", "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text, expected.trim_end_matches('\n'));

    // SIGTERM while a request streams: it finishes, then the process exits 0.
    let streaming = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let long = serde_json::json!({
                "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 200,
                "ignore_eos": true, "stream": true,
            });
            http(&addr, "POST", "/v1/chat/completions", &long.to_string())
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: sending a signal to our own child process, which is still running.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (status, streamed) = streaming.join().unwrap();
    assert_eq!(status, 200);
    assert!(streamed.contains("data: [DONE]"), "the running request finished: {streamed}");
    let exit = child.wait().unwrap();
    assert!(exit.success(), "exit status {exit:?}");
}

#[test]
fn out_of_range_flags_are_refused_like_api_values() {
    for args in [["--top-p", "7"], ["-n", "-5"], ["--temp", "11"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_onebit"))
            .args(["run", "-p", "hi", "-m", "/nonexistent.gguf"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        let flag = if args[0] == "-n" { "--n-predict" } else { args[0] };
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}
