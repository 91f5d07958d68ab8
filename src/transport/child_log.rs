//! A stdio server's stderr, said in herald's own log: each line it writes becomes one
//! `upstream.stderr` event naming the command (its program: arguments are where secrets go), so a child's lines (its `listening`, its
//! `shutting down`) read as whose they are, in the log format herald was asked for. A line is
//! kept to [`MAX_LINE`] bytes (the rest of it is dropped and the line marked), and the relay ends
//! when the child (and whatever inherited its stderr) closes it.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// The longest line said whole; a longer one is cut there and ends with `…`.
pub const MAX_LINE: usize = 8 * 1024;

/// Relays `stderr` line by line into the log under `upstream` until it closes.
pub fn relay(stderr: impl AsyncRead + Unpin + Send + 'static, upstream: String) {
    tokio::spawn(async move {
        let mut lines = Lines::new(stderr);
        while let Some(line) = lines.next().await {
            tracing::info!(event = "upstream.stderr", %upstream, "{line}");
        }
    });
}

/// Lines of at most [`MAX_LINE`] bytes from a reader, without holding more than that.
struct Lines<R> {
    reader: BufReader<R>,
}

impl<R: AsyncRead + Unpin> Lines<R> {
    fn new(reader: R) -> Lines<R> {
        Lines {
            reader: BufReader::new(reader),
        }
    }

    /// The next line (without its newline, lossily UTF-8), or `None` at the end.
    async fn next(&mut self) -> Option<String> {
        let mut line = Vec::new();
        let mut cut = false;
        loop {
            let buf = match self.reader.fill_buf().await {
                Ok(buf) => buf,
                Err(_) => return None,
            };
            if buf.is_empty() {
                // The end: a last line with no newline is still a line.
                return (!line.is_empty() || cut).then(|| finish(line, cut));
            }
            let (take, end) = match buf.iter().position(|&b| b == b'\n') {
                // A CRLF line's CR is not part of it.
                Some(i) if i > 0 && buf[i - 1] == b'\r' => (i - 1, Some(i + 1)),
                Some(i) => (i, Some(i + 1)),
                None => (buf.len(), None),
            };
            let room = MAX_LINE.saturating_sub(line.len());
            line.extend_from_slice(&buf[..take.min(room)]);
            cut |= take > room;
            let used = end.unwrap_or(take);
            self.reader.consume(used);
            if end.is_some() {
                return Some(finish(line, cut));
            }
        }
    }
}

fn finish(mut line: Vec<u8>, cut: bool) -> String {
    if cut
        && let Err(e) = std::str::from_utf8(&line)
        && e.error_len().is_none()
    {
        // The cut split a character: end before it.
        line.truncate(e.valid_up_to());
    }
    let mut text = String::from_utf8_lossy(&line)
        .trim_end_matches('\r')
        .to_owned();
    if cut {
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn all(input: &[u8]) -> Vec<String> {
        let mut lines = Lines::new(input);
        let mut out = Vec::new();
        while let Some(l) = lines.next().await {
            out.push(l);
        }
        out
    }

    #[tokio::test]
    async fn lines_are_split_and_a_last_line_without_newline_kept() {
        assert_eq!(
            all(b"one\r\ntwo\n\nthree").await,
            ["one", "two", "", "three"]
        );
        assert!(all(b"").await.is_empty());
    }

    #[tokio::test]
    async fn a_long_line_is_cut_and_the_next_one_is_whole() {
        let mut input = vec![b'x'; MAX_LINE * 3];
        input.extend_from_slice(b"\nnext\n");
        let out = all(&input).await;
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].len(), MAX_LINE + '…'.len_utf8());
        assert!(out[0].ends_with('…'));
        assert_eq!(out[1], "next");
    }

    #[tokio::test]
    async fn a_cut_ends_on_a_character_and_a_crlf_line_of_the_limit_is_whole() {
        let mut input = vec![b'x'; MAX_LINE - 1];
        input.extend_from_slice("é and more\n".as_bytes());
        let out = all(&input).await;
        assert!(out[0].ends_with("x…"), "no broken character before the cut");
        let mut exact = vec![b'y'; MAX_LINE];
        exact.extend_from_slice(b"\r\n");
        assert_eq!(
            all(&exact).await,
            [String::from_utf8(vec![b'y'; MAX_LINE]).unwrap()]
        );
    }
}
