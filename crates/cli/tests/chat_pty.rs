//! `onebit chat` driven through a pseudo-terminal, as a person would: it answers, keeps the
//! conversation in its cache across turns, survives Ctrl-C during an answer and at the prompt,
//! and leaves on `/exit`.

use std::process::Command;
use std::time::Duration;

use expectrl::{ControlCode, Eof, Expect, Session};

#[test]
fn chat_answers_keeps_context_and_survives_ctrl_c() {
    let Some(model) = onebit_testkit::demo_model() else { return };
    let home = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_onebit"));
    // Room for an answer far longer than the 2.5 s the test lets it run, however fast the machine.
    cmd.args(["chat", "--temp", "0", "-n", "4000", "-m"]).arg(&model);
    // The line editor's history goes to this scratch cache, not the user's.
    cmd.env("XDG_CACHE_HOME", home.path());
    let mut p = Session::spawn(cmd).unwrap();
    p.set_expect_timeout(Some(Duration::from_secs(180)));

    p.expect("/reset starts").unwrap();
    p.expect("> ").unwrap();
    p.send_line("Hello! Who are you?").unwrap();
    p.expect("generated:").unwrap();
    p.expect("> ").unwrap();

    // Ctrl-C at the prompt drops the line and keeps going.
    p.send("half a thought").unwrap();
    p.send(ControlCode::EndOfText).unwrap();
    p.expect("/exit to quit").unwrap();
    p.expect("> ").unwrap();

    // A long answer, interrupted once it is under way.
    p.send_line("Write a very long story about a dragon who learns to bake bread.").unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    p.send(ControlCode::EndOfText).unwrap();
    p.expect("(answer stopped)").unwrap();
    // The second turn found the first one in the cache: only its new tokens were prefilled.
    p.expect("cached)").unwrap();
    p.expect("> ").unwrap();

    p.send_line("/exit").unwrap();
    p.expect(Eof).unwrap();
    let status = p.get_process().wait().unwrap();
    assert!(matches!(status, expectrl::process::unix::WaitStatus::Exited(_, 0)), "{status:?}");
}
