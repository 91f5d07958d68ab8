//! The URIs of the file source, parsed and built: `file:///ABS/PATH{?as}` (a state resource)
//! and `file-events://watch/ABS/PATH{?recursive,glob}` (an event log). Syntax only: whether a
//! path lies under a root is `paths`' question, asked after parsing.

use super::glob::Glob;
use super::machine::Mode;
use super::paths;
use crate::mcp::source::SourceError;

pub const STATE_TEMPLATE: &str = "file:///{+path}{?as}";
pub const EVENTS_TEMPLATE: &str = "file-events://watch/{+path}{?recursive,glob}";
const EVENTS_PREFIX: &str = "file-events://watch/";

/// How `?as=` asks a file to be read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum As {
    Auto,
    Json,
    Text,
}

/// A parsed URI of this source (syntax only; no file system access).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Target {
    State {
        path: String,
        read_as: As,
    },
    Events {
        path: String,
        recursive: bool,
        glob: Option<Glob>,
    },
}

impl Target {
    pub(super) fn path(&self) -> &str {
        match self {
            Target::State { path, .. } | Target::Events { path, .. } => path,
        }
    }

    pub(super) fn mode(&self) -> Mode {
        match self {
            Target::State { .. } => Mode::State,
            Target::Events {
                recursive, glob, ..
            } => Mode::Events {
                recursive: *recursive,
                glob: glob.clone(),
            },
        }
    }
}

fn query_pairs(q: &str) -> Result<Vec<(String, String)>, SourceError> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Ok((
                paths::percent_decode(k).map_err(SourceError::InvalidParams)?,
                paths::percent_decode(v).map_err(SourceError::InvalidParams)?,
            ))
        })
        .collect()
}

pub(super) fn parse(uri: &str) -> Result<Target, SourceError> {
    let bad = SourceError::InvalidParams;
    if uri.contains('#') {
        return Err(bad(format!(
            "{uri} has a fragment; file URIs take none (write # in a name as %23)"
        )));
    }
    if let Some(rest) = uri.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(bad(format!(
                "{uri} names no absolute path; file URIs have three slashes, e.g. file:///srv/data/a.txt"
            )));
        }
        let (p, q) = rest.split_once('?').unwrap_or((rest, ""));
        let path = paths::percent_decode(p).map_err(bad)?;
        let mut read_as = As::Auto;
        for (k, v) in query_pairs(q)? {
            match (k.as_str(), v.as_str()) {
                ("as", "json") => read_as = As::Json,
                ("as", "text") => read_as = As::Text,
                ("as", other) => {
                    return Err(bad(format!(
                        "as={other} is not known; use as=json or as=text"
                    )));
                }
                (other, _) => {
                    return Err(bad(format!(
                        "unknown query parameter {other} in {uri}; file URIs take only ?as=json or ?as=text"
                    )));
                }
            }
        }
        return Ok(Target::State { path, read_as });
    }
    if let Some(rest) = uri.strip_prefix(EVENTS_PREFIX) {
        let (p, q) = rest.split_once('?').unwrap_or((rest, ""));
        let path = format!("/{}", paths::percent_decode(p).map_err(bad)?);
        let mut recursive = false;
        let mut glob = None;
        for (k, v) in query_pairs(q)? {
            match k.as_str() {
                "recursive" => {
                    recursive = match v.as_str() {
                        "true" | "1" | "" => true,
                        "false" | "0" => false,
                        other => {
                            return Err(bad(format!(
                                "recursive={other} is not a boolean; use recursive=true or recursive=false"
                            )));
                        }
                    }
                }
                "glob" => glob = Some(Glob::new(&v).map_err(bad)?),
                other => {
                    return Err(bad(format!(
                        "unknown query parameter {other} in {uri}; file-events URIs take recursive and glob"
                    )));
                }
            }
        }
        return Ok(Target::Events {
            path,
            recursive,
            glob,
        });
    }
    Err(SourceError::NotFound { uri: uri.into() })
}

pub(super) fn uri_path(p: &std::path::Path) -> String {
    paths::percent_encode_path(&p.to_string_lossy())
}

/// The state URI of `p`.
pub fn state_uri(p: &std::path::Path) -> String {
    format!("file://{}", uri_path(p))
}

/// The event-log URI of `p` (`?recursive=true` when asked).
pub fn events_uri(p: &std::path::Path, recursive: bool) -> String {
    let q = if recursive { "?recursive=true" } else { "" };
    format!("file-events://watch{}{q}", uri_path(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_strictly() {
        assert_eq!(
            parse("file:///srv/a%20b.json?as=json").unwrap(),
            Target::State {
                path: "/srv/a b.json".into(),
                read_as: As::Json
            }
        );
        assert_eq!(
            parse("file-events://watch/srv/d?recursive=true&glob=*.json").unwrap(),
            Target::Events {
                path: "/srv/d".into(),
                recursive: true,
                glob: Some(Glob::new("*.json").unwrap())
            }
        );
        assert_eq!(
            parse("file-events://watch//srv/d").unwrap().path(),
            "//srv/d",
            "a doubled slash is the same path once confined"
        );
        for (uri, needle) in [
            ("file://srv/a", "three slashes"),
            ("file:///a?x=1", "unknown query parameter x"),
            ("file:///a?as=yaml", "as=yaml"),
            ("file:///a#b", "fragment"),
            ("file-events://watch/a?recursive=maybe", "not a boolean"),
            ("file-events://watch/a?glob=[x", "without ']'"),
            ("file:///a%FF", "UTF-8"),
        ] {
            let e = parse(uri).unwrap_err().to_string();
            assert!(e.contains(needle), "{uri}: {e}");
        }
        assert!(matches!(
            parse("memo://notes"),
            Err(SourceError::NotFound { .. })
        ));
    }

    #[test]
    fn uris_round_trip_through_the_builders() {
        let p = std::path::Path::new("/srv/my dir/100%");
        let s = state_uri(p);
        assert_eq!(s, "file:///srv/my%20dir/100%25");
        assert_eq!(parse(&s).unwrap().path(), "/srv/my dir/100%");
        let e = events_uri(p, true);
        assert_eq!(e, "file-events://watch/srv/my%20dir/100%25?recursive=true");
        assert_eq!(parse(&e).unwrap().path(), "/srv/my dir/100%");
    }
}
