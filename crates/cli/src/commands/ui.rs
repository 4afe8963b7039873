//! What the user sees besides the answer: progress on stderr (only on a terminal, and only for
//! steps that take long), one-line notes, and `--quiet`, which silences all of it.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

#[derive(Clone, Copy, Debug)]
pub struct Ui {
    pub quiet: bool,
}

impl Ui {
    pub fn new(quiet: bool) -> Ui {
        Ui { quiet }
    }

    fn progress_visible(&self) -> bool {
        !self.quiet && std::io::stderr().is_terminal()
    }

    /// A note on stderr (suppressed by `--quiet`).
    pub fn note(&self, msg: &str) {
        if !self.quiet {
            eprintln!("{msg}");
        }
    }

    /// A byte-count progress bar (downloads); hidden when quiet or not on a terminal.
    pub fn bytes_bar(&self, msg: &str) -> ProgressBar {
        if !self.progress_visible() {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message(msg.to_string());
        bar
    }

    /// Run `f`, showing a spinner with `msg` if it takes more than a second.
    pub fn spin_if_slow<T>(&self, msg: &str, f: impl FnOnce() -> T) -> T {
        if !self.progress_visible() {
            return f();
        }
        let done = Arc::new(AtomicBool::new(false));
        let shown = {
            let (done, msg) = (Arc::clone(&done), msg.to_string());
            std::thread::spawn(move || {
                let step = Duration::from_millis(50);
                for _ in 0..20 {
                    if done.load(Ordering::Acquire) {
                        return;
                    }
                    std::thread::sleep(step);
                }
                let bar = ProgressBar::new_spinner();
                bar.set_message(msg);
                bar.enable_steady_tick(Duration::from_millis(100));
                while !done.load(Ordering::Acquire) {
                    std::thread::sleep(step);
                }
                bar.finish_and_clear();
            })
        };
        let out = f();
        done.store(true, Ordering::Release);
        let _ = shown.join();
        out
    }
}

/// ANSI styling for a terminal; plain text otherwise.
#[derive(Clone, Copy, Debug)]
pub struct Style {
    pub color: bool,
}

impl Style {
    pub fn for_stdout() -> Style {
        Style { color: std::io::stdout().is_terminal() }
    }

    pub fn for_stderr() -> Style {
        Style { color: std::io::stderr().is_terminal() }
    }

    pub fn dim_start(&self) -> &'static str {
        if self.color { "\x1b[2m" } else { "" }
    }

    pub fn reset(&self) -> &'static str {
        if self.color { "\x1b[0m" } else { "" }
    }

    pub fn dim(&self, s: &str) -> String {
        format!("{}{s}{}", self.dim_start(), self.reset())
    }
}
