//! The interactive channel: what a person types on stdin is input; replies print on stdout.
//! On a terminal the transcript reads as a conversation: the model's text streams as it
//! comes, a spinner runs on stderr while it thinks, and each tool call shows as one line
//! (`· run_code: watch_start(…) → first line of its result`). Piped, stdout carries only the
//! replies, one per line group, and nothing else.

use crate::sync::Recover;
use std::io::IsTerminal as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::agent::runtime::{Channel, Event, ReplyTo};

pub struct Terminal {
    tty: bool,
    /// Whether stderr may be styled (a terminal, no `NO_COLOR`).
    colour: bool,
    /// Whether text of the current answer is on the screen already.
    streamed: AtomicBool,
    /// That text.
    shown: Mutex<String>,
    spinner: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Whether the spinner's line is up, and what it says beside `thinking…` (a retry). Its
    /// line is drawn and cleared only under this lock, so no frame lands after the clear.
    spin: std::sync::Arc<Mutex<Spin>>,
    /// Set when a question got no answer (piped, `herald agent` then exits 1).
    unanswered: std::sync::Arc<AtomicBool>,
}

impl Default for Terminal {
    fn default() -> Self {
        Terminal::new()
    }
}

impl Terminal {
    pub fn new() -> Terminal {
        Terminal {
            tty: std::io::stdout().is_terminal() && std::io::stderr().is_terminal(),
            colour: crate::app::console::stderr_colour(),
            streamed: AtomicBool::new(false),
            shown: Mutex::new(String::new()),
            spinner: Mutex::new(None),
            spin: Default::default(),
            unanswered: Default::default(),
        }
    }

    /// A terminal that sets `flag` when a question got no answer.
    pub fn counting(flag: std::sync::Arc<AtomicBool>) -> Terminal {
        Terminal {
            unanswered: flag,
            ..Terminal::new()
        }
    }

    /// Reads stdin lines into `tx` as inputs (a thread: stdin blocks) until it closes.
    pub fn read_stdin(tx: mpsc::Sender<Event>) {
        let prompt = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            if prompt {
                eprint!("> ");
            }
            for line in std::io::stdin().lock().lines().map_while(Result::ok) {
                let text = line.trim().to_owned();
                if !text.is_empty()
                    && tx
                        .blocking_send(Event::Input {
                            text,
                            reply_to: ReplyTo::Terminal,
                        })
                        .is_err()
                {
                    return;
                }
            }
            let _ = tx.blocking_send(Event::InputClosed);
        });
    }

    /// `text` dimmed, when stderr may be styled.
    fn dim(&self, text: &str) -> String {
        if self.colour {
            format!("\x1b[2m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    fn stop_spinner(&self) {
        if let Some(h) = self.spinner.locked().take() {
            h.abort();
        }
        let mut spin = self.spin.locked();
        if spin.up {
            spin.up = false;
            eprint!("\r\x1b[2K");
        }
        spin.said.clear();
    }
}

#[async_trait]
impl Channel for Terminal {
    fn unanswered(&self) {
        self.unanswered.store(true, Ordering::Release);
    }

    async fn publish(&self, _to: &ReplyTo, text: &str) {
        self.stop_spinner();
        let shown = std::mem::take(&mut *self.shown.locked());
        let mut out = String::new();
        if self.tty && self.streamed.swap(false, Ordering::AcqRel) {
            out.push('\n');
            // What was streamed is the reply unless something else (an error) is published.
            if shown.trim_end() != text.trim_end() {
                out.push_str(&format!("{}\n", text.trim_end()));
            }
        } else {
            out.push_str(&format!("{}\n", text.trim_end()));
        }
        print(&out);
        if self.tty {
            eprint!("> ");
        }
    }

    fn thinking(&self, on: bool) {
        if !self.tty {
            return;
        }
        self.stop_spinner();
        if on && tokio::runtime::Handle::try_current().is_ok() {
            self.spin.locked().up = true;
            let spin = self.spin.clone();
            *self.spinner.locked() = Some(tokio::spawn(async move {
                let frames = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
                let mut i = 0;
                loop {
                    // One line, redrawn in place: a retry is said on it, not under it.
                    {
                        let spin = spin.locked();
                        if !spin.up {
                            return;
                        }
                        eprint!(
                            "\r\x1b[2K{}",
                            spinner_line(frames[i % frames.len()], &spin.said)
                        );
                    }
                    i += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }));
        }
    }

    fn retrying(&self, what: &str) {
        if !self.tty {
            tracing::info!("{what}");
            return;
        }
        // Said on the spinner's line now, and on each frame until the run ends.
        let mut spin = self.spin.locked();
        spin.said = what.to_owned();
        if spin.up {
            eprint!("\r\x1b[2K{}", spinner_line('⠿', &spin.said));
        }
    }

    fn streamed(&self, text: &str) {
        if !self.tty || text.is_empty() {
            return;
        }
        self.stop_spinner();
        self.streamed.store(true, Ordering::Release);
        self.shown.locked().push_str(text);
        print(text);
    }

    fn tool_used(&self, call: &str, result: &str) {
        if !self.tty {
            return;
        }
        self.stop_spinner();
        if self.streamed.swap(false, Ordering::AcqRel) {
            print("\n");
        }
        self.shown.locked().clear();
        let first = result.lines().next().unwrap_or("");
        let first: String = first.chars().take(100).collect();
        eprintln!("{}", self.dim(&format!("· {call} → {first}")));
    }

    fn suppressed(&self) {
        self.stop_spinner();
        if self.tty {
            if self.streamed.swap(false, Ordering::AcqRel) {
                print("\n");
            }
            self.shown.locked().clear();
            eprintln!("{}", self.dim("(nothing to say: NO_REPLY)"));
            eprint!("> ");
        }
    }
}

/// The spinner's state: whether its line is up, and what it says beside `thinking…`.
#[derive(Default)]
struct Spin {
    up: bool,
    said: String,
}

/// The spinner's line: its frame, `thinking…`, and what it says beside (a retry), if anything,
/// cut to the terminal's width (a line that wraps could not be redrawn in place).
fn spinner_line(frame: char, said: &str) -> String {
    let line = if said.is_empty() {
        format!("{frame} thinking…")
    } else {
        format!("{frame} thinking… ({said})")
    };
    let columns = crate::app::console::terminal_size(2).map_or(80, |(c, _)| c);
    let width = columns.saturating_sub(1).max(16);
    if line.chars().count() <= width {
        line
    } else {
        let mut cut: String = line.chars().take(width - 1).collect();
        cut.push('…');
        cut
    }
}

/// Prints `text` on stdout; a failure other than a closed stdout (which ends herald quietly)
/// is logged.
fn print(text: &str) {
    if let Err(e) = crate::app::console::print(text) {
        tracing::warn!(error = %e, "a reply could not be printed");
    }
}
