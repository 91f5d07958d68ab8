//! RFC 6570 URI template matching, for routing a URI to the upstream whose template covers it
//! (the shared routing rule in [`crate::mcp::upstream`], used by the watch client and the gateway).
//!
//! Covers the levels the reference URIs need: simple `{var}` (any characters but `/`, `?`,
//! `#`; lenient, so `root:app` matches as a kcp workspace), reserved `{+var}` (anything but `?`
//! and `#`), form-style query `{?a,b}` and continuation `{&a,b}` (every key present must be
//! one of the names; all optional). Variable modifiers (`:3`, `*`) are accepted and ignored.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Simple,
    Reserved,
    Query(Vec<String>),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad URI template {template:?}: {reason}")]
pub struct TemplateError {
    pub template: String,
    pub reason: String,
}

impl Template {
    pub fn parse(template: &str) -> Result<Template, TemplateError> {
        let err = |reason: &str| TemplateError {
            template: template.to_owned(),
            reason: reason.to_owned(),
        };
        let mut parts = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest.find('}').ok_or_else(|| err("unclosed {"))?;
                    let expr = &rest[1..end];
                    rest = &rest[end + 1..];
                    let (op, vars) = match expr.chars().next() {
                        Some(c @ ('+' | '?' | '&' | '#' | '.' | '/' | ';')) => {
                            (Some(c), &expr[1..])
                        }
                        Some(_) => (None, expr),
                        None => return Err(err("empty expression {}")),
                    };
                    let names: Vec<String> = vars
                        .split(',')
                        .map(|v| {
                            v.trim_end_matches('*')
                                .split(':')
                                .next()
                                .unwrap_or("")
                                .to_owned()
                        })
                        .collect();
                    if names.iter().any(|n| n.is_empty()) {
                        return Err(err("empty variable name"));
                    }
                    parts.push(match op {
                        None => Part::Simple,
                        Some('+') | Some('#') => Part::Reserved,
                        Some('?') | Some('&') => Part::Query(names),
                        Some(other) => {
                            return Err(err(&format!("operator {other} is not supported")));
                        }
                    });
                }
                Some(i) => {
                    parts.push(Part::Literal(rest[..i].to_owned()));
                    rest = &rest[i..];
                }
                None => {
                    if rest.contains('}') {
                        return Err(err("} without {"));
                    }
                    parts.push(Part::Literal(rest.to_owned()));
                    rest = "";
                }
            }
        }
        Ok(Template { parts })
    }

    /// Whether `uri` is an expansion of this template.
    pub fn matches(&self, uri: &str) -> bool {
        match_from(&self.parts, uri, 0)
    }
}

/// Parses and matches in one go; a bad template matches nothing.
pub fn matches(template: &str, uri: &str) -> bool {
    Template::parse(template).is_ok_and(|t| t.matches(uri))
}

fn match_from(parts: &[Part], s: &str, depth: usize) -> bool {
    // Templates are short; bound the backtracking anyway.
    if depth > 64 {
        return false;
    }
    let Some((part, rest)) = parts.split_first() else {
        return s.is_empty();
    };
    match part {
        Part::Literal(l) => s
            .strip_prefix(l.as_str())
            .is_some_and(|tail| match_from(rest, tail, depth + 1)),
        Part::Simple | Part::Reserved => {
            let stop = |c: char| match part {
                Part::Simple => matches!(c, '/' | '?' | '#'),
                _ => matches!(c, '?' | '#'),
            };
            let max = s.find(stop).unwrap_or(s.len());
            (0..=max)
                .rev()
                .filter(|k| s.is_char_boundary(*k))
                .any(|k| match_from(rest, &s[k..], depth + 1))
        }
        Part::Query(names) => {
            let lead = s.chars().next();
            if lead != Some('?') && lead != Some('&') {
                // All query variables are optional.
                return match_from(rest, s, depth + 1);
            }
            let end = s[1..].find('#').map_or(s.len(), |i| i + 1);
            let query = &s[1..end];
            let ok = query.split('&').filter(|kv| !kv.is_empty()).all(|kv| {
                let key = kv.split('=').next().unwrap_or("");
                names.iter().any(|n| n == key)
            });
            ok && match_from(rest, &s[end..], depth + 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KCP: &str =
        "kcp-events://watch/{workspace}/{resource}{?namespace,labelSelector,fieldSelector,kcp}";

    #[test]
    fn reference_uris_match_their_templates() {
        assert!(matches(
            KCP,
            "kcp-events://watch/root:app/configmaps?namespace=*"
        ));
        assert!(matches(KCP, "kcp-events://watch/root/configmaps"));
        assert!(matches(
            KCP,
            "kcp-events://watch/root/bids?namespace=a&labelSelector=x%3Dy"
        ));
        assert!(matches("file:///{+path}", "file:///etc/herald/config.json"));
        assert!(matches(
            "file-events://watch/{+path}{?recursive,glob}",
            "file-events://watch/srv/data?recursive=true&glob=*.json"
        ));
        assert!(matches(
            "kcp-api://{workspace}/resources{?kcp}",
            "kcp-api://root:org/resources"
        ));
    }

    #[test]
    fn non_matches() {
        assert!(
            !matches(KCP, "kcp-events://watch/root/a/b"),
            "simple vars stop at /"
        );
        assert!(
            !matches(KCP, "kcp-events://watch/root/cm?bogus=1"),
            "unknown query key"
        );
        assert!(!matches(KCP, "k8s-events://watch/root/cm"));
        assert!(
            !matches("file:///{+path}", "file:///a?x=1"),
            "no query in the template"
        );
        assert!(!matches("memo://notes", "memo://notes2"));
        assert!(matches("memo://notes", "memo://notes"));
    }

    #[test]
    fn bad_templates_are_errors() {
        assert!(Template::parse("a{b").is_err());
        assert!(Template::parse("a}b").is_err());
        assert!(Template::parse("a{}").is_err());
        assert!(Template::parse("a{;x}").is_err());
        assert!(!matches("a{b", "ab"));
    }

    #[test]
    fn arbitrary_input_never_panics() {
        let samples = [
            "",
            "{",
            "}",
            "{?}",
            "{+a}{b}{?c}",
            "x{a:3}{b*}",
            "é{a}ü",
            "{a}{b}{c}{d}{e}{f}",
        ];
        let uris = ["", "é/ü?a=1", "////", "?&&=", "xyzé"];
        for t in samples {
            for u in uris {
                let _ = matches(t, u);
            }
        }
    }
}

#[cfg(test)]
#[path = "template_fuzz.rs"]
mod fuzz;
