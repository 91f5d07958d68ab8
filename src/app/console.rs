//! What herald prints for a person or a pipe, outside the protocol: the one way to write
//! stdout (client output, notices, code mode's values, generated scripts and pages), and
//! whether stderr may carry colour.
//!
//! A reader of stdout that went away (`herald ls … | head`, `| true`) is how a pipeline says
//! "enough", not a failure: herald ends at once, quietly, with status 0, as ripgrep does,
//! wherever the write happened (a client's last line, the notice thread, a code-mode value).
//! Nothing it would still print could be read, and a process that keeps running after its
//! stdout is gone only hides that from the pipeline. The store needs no goodbye: it is
//! crash-safe (redb), and every write a caller was told is durable already is. The one
//! exception is `herald up` ([`keep_running_when_stdout_closes`]): its stdout only carries
//! notices, so a closed stdout is a failed write its sink logs once, and the endpoint serves on.

use std::io::{self, IsTerminal as _};
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a closed stdout ends the process (every command but the serving appliance).
static EXIT_WHEN_STDOUT_CLOSES: AtomicBool = AtomicBool::new(true);

/// For a process whose main job is not its stdout (`herald up` serves its endpoint; its
/// stdout only carries notices): a closed stdout is then returned as an error like any other
/// failed write, so the caller stops printing and the process keeps serving.
pub fn keep_running_when_stdout_closes() {
    EXIT_WHEN_STDOUT_CLOSES.store(false, Ordering::Relaxed);
}

/// Writes `text` to stdout and flushes it. A closed stdout ends the process with status 0
/// (see the module doc); any other failure (a full disk under `> file`) is returned.
pub fn print(text: &str) -> Result<(), StdoutError> {
    write(text.as_bytes())
}

/// [`print`] for bytes (a generated manual page or completion script).
pub fn write(bytes: &[u8]) -> Result<(), StdoutError> {
    write_to(&mut io::stdout().lock(), bytes).map_err(StdoutError)
}

/// [`print`] with a newline after `line`.
pub fn println(line: &str) -> Result<(), StdoutError> {
    let mut text = String::with_capacity(line.len() + 1);
    text.push_str(line);
    text.push('\n');
    print(&text)
}

/// Writes `bytes` whole to `out` and flushes it; a broken pipe ends the process quietly.
fn write_to(out: &mut impl io::Write, bytes: &[u8]) -> io::Result<()> {
    gone_ends(write_whole(out, bytes).and_then(|()| retry_when_full(|| out.flush())))
}

/// A write's outcome, where a reader that went away ends the process (see the module doc).
fn gone_ends(written: io::Result<()>) -> io::Result<()> {
    match written {
        Err(e) if reader_gone(&e) && EXIT_WHEN_STDOUT_CLOSES.load(Ordering::Relaxed) => {
            std::process::exit(0)
        }
        other => other,
    }
}

/// `write_all` that also waits out a full pipe: stdout is non-blocking while the stdio
/// transport has it on the reactor (`transport::stdio`), or when whoever shares the pipe made
/// it so, and a write made the ordinary way then says "would block" rather than waiting.
fn write_whole(out: &mut impl io::Write, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match retry_when_full(|| out.write(bytes))? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => bytes = &bytes[n..],
        }
    }
    Ok(())
}

/// Runs `op` again each time it finds stdout full (or is interrupted), once stdout can take
/// more.
fn retry_when_full<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match op() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let mut fd = libc::pollfd {
                    fd: 1,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one pollfd, owned here, for the length given.
                let polled = unsafe { libc::poll(&mut fd, 1, -1) };
                // A poll that fails (other than by a signal) or finds no stdout would only
                // spin: the write's own error is the answer.
                if (polled < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted)
                    || fd.revents & libc::POLLNVAL != 0
                {
                    return Err(e);
                }
            }
            other => return other,
        }
    }
}

/// Whether a write failed because nobody reads the other end any more.
fn reader_gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::BrokenPipe
}

/// stdout could not be written (for a reason other than its reader having gone).
#[derive(Debug, thiserror::Error)]
#[error("cannot write to stdout: {0}")]
pub struct StdoutError(#[source] io::Error);

/// Whether what herald writes on stderr may carry colour and other terminal styling: only
/// when stderr is a terminal and `NO_COLOR` is unset or empty (<https://no-color.org>), so
/// logs in files, pipes and the journal stay plain text.
pub fn stderr_colour() -> bool {
    colour(
        io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

/// `(columns, rows)` of the terminal on descriptor `fd` (1 stdout, 2 stderr); `None` when it
/// is not a terminal or does not say.
pub fn terminal_size(fd: i32) -> Option<(usize, usize)> {
    // SAFETY: winsize is plain data, for which all zeroes is a valid value.
    let mut w: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills the winsize it is given; a bad descriptor is an error return.
    let ok = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut w) } == 0;
    (ok && w.ws_col > 0 && w.ws_row > 0).then(|| (usize::from(w.ws_col), usize::from(w.ws_row)))
}

/// The rule of [`stderr_colour`], for a stream that is or is not a terminal.
fn colour(terminal: bool, no_colour: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_colour.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(
            colour(true, Some(OsStr::new(""))),
            "an empty NO_COLOR is unset"
        );
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }

    #[test]
    fn a_failed_write_other_than_a_closed_pipe_is_returned() {
        struct Full;
        impl io::Write for Full {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::from_raw_os_error(libc::ENOSPC))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let e = write_to(&mut Full, b"x").unwrap_err();
        assert!(!reader_gone(&e));
        let mut v = Vec::new();
        write_to(&mut v, b"all of it").unwrap();
        assert_eq!(v, b"all of it");
    }

    /// A non-blocking stdout that is full says "would block": the write waits and goes on
    /// where it was, losing and repeating nothing.
    #[test]
    fn a_full_pipe_is_waited_out_not_failed() {
        struct Slow {
            got: Vec<u8>,
            calls: usize,
        }
        impl io::Write for Slow {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.calls += 1;
                if self.calls % 2 == 1 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                let n = b.len().min(3);
                self.got.extend_from_slice(&b[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> io::Result<()> {
                self.calls += 1;
                if self.calls % 2 == 1 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(())
            }
        }
        let mut out = Slow {
            got: Vec::new(),
            calls: 0,
        };
        write_to(&mut out, b"a notice line\n").unwrap();
        assert_eq!(out.got, b"a notice line\n");
    }
}
