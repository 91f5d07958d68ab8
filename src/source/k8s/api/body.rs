//! Reading response bodies: [`WatchBody`], an open watch read chunk by chunk (a cut
//! connection or a stream silent past [`WATCH_SILENCE`] is an end to watch again after, not
//! an error), the bounded read of a whole body (a list page, a discovery document, an error's
//! Status), and [`body_error`], which tells a cut connection from a broken stream.

use bytes::Bytes;
use http_body_util::BodyExt;

use super::WATCH_SILENCE;

/// An open watch: the response body, read chunk by chunk, holding its place on its
/// connection.
pub struct WatchBody {
    pub(super) body: kube::client::Body,
    pub(super) _stream: tokio::sync::OwnedSemaphorePermit,
}

impl WatchBody {
    /// The next chunk of the stream; `None` when it ended: the server ended it, the
    /// connection was cut (mid-chunk, an h2 GOAWAY or reset: how watches often end behind
    /// proxies), or it was silent past [`WATCH_SILENCE`] (a half-open connection). Either way
    /// the watcher watches again from where it was.
    pub async fn chunk(&mut self) -> Option<Result<Bytes, String>> {
        loop {
            let frame = match tokio::time::timeout(WATCH_SILENCE, self.body.frame()).await {
                Err(_) => {
                    tracing::debug!("a watch stream was silent past its timeout; watching again");
                    return None;
                }
                Ok(f) => f?,
            };
            match frame {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Some(Ok(data));
                    }
                }
                Err(e) => {
                    let (cut, why) = body_error(&e);
                    if cut {
                        tracing::debug!(%why, "a watch stream was cut; watching again");
                        return None;
                    }
                    return Some(Err(format!("the watch stream broke: {why}")));
                }
            }
        }
    }
}

/// Whether a body error is a cut connection (an end to watch again after), and its
/// innermost cause in words.
pub(super) fn body_error(e: &(dyn std::error::Error + 'static)) -> (bool, String) {
    let mut cut = false;
    let mut why = e.to_string();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_closed() || h.is_canceled())
        {
            cut = true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            )
        {
            cut = true;
        }
        let text = err.to_string();
        // h2's GOAWAY or RST_STREAM with NO_ERROR: the server closing politely.
        if text.contains("NO_ERROR") || text.contains("go away") {
            cut = true;
        }
        why = text;
        cur = err.source();
    }
    (cut, why)
}

/// A body over its bound.
pub(super) struct Overflow;

pub(super) type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// Reads a body of at most `max` bytes: `Err(Overflow)` past it, `Ok(Err)` if it broke.
pub(super) async fn read_bounded(
    mut body: kube::client::Body,
    max: usize,
) -> Result<Result<Bytes, BodyError>, Overflow> {
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(d) = frame.into_data() {
                    if out.len() + d.len() > max {
                        return Err(Overflow);
                    }
                    out.extend_from_slice(&d);
                }
            }
            Err(e) => return Ok(Err(Box::new(e))),
        }
    }
    Ok(Ok(out.freeze()))
}
