//! RFC 6570 URI template matching, for routing a URI to the upstream whose template covers it
//! (the shared routing rule in [`crate::upstream`], used by the watch client and the gateway).
//!
//! Covers the levels the reference URIs need: simple `{var}` (any characters but `/`, `?`,
//! `#`; lenient, so `root:app` matches as a kcp workspace), reserved `{+var}` (anything but `?`
//! and `#`), fragment `{#var}` (nothing, or `#` and anything after it), form-style query
//! `{?a,b}` and continuation `{&a,b}` (nothing, or `?` or `&` and then `&`-separated items,
//! each `name`, `name=value` or empty, every name one of the expression's; all optional, so
//! `/search{?q}{&page}` matches `/search?q=x&page=2`, `/search?page=2` and `/search`).
//! Variable modifiers (`:3`, `*`) are accepted and ignored.
//!
//! Matching never backtracks: it walks the parts in order, keeping the set of byte offsets of
//! the URI where the parts so far can end, and each part moves that set forward in one pass
//! over the URI. A match costs O(parts × URI length × query names), whatever the template,
//! so an upstream's template cannot make routing slow (adjacent variables made the old
//! backtracking matcher exponential).

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Simple,
    Reserved,
    Fragment,
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
            let literal = match rest.find('{') {
                Some(0) => None,
                Some(i) => Some(&rest[..i]),
                None => Some(rest),
            };
            if let Some(l) = literal {
                if l.contains('}') {
                    return Err(err("} without {"));
                }
                parts.push(Part::Literal(l.to_owned()));
                rest = &rest[l.len()..];
                continue;
            }
            let end = rest.find('}').ok_or_else(|| err("unclosed {"))?;
            let expr = &rest[1..end];
            rest = &rest[end + 1..];
            if expr.contains('{') {
                return Err(err("{ inside an expression"));
            }
            let (op, vars) = match expr.chars().next() {
                Some(c @ ('+' | '?' | '&' | '#' | '.' | '/' | ';')) => (Some(c), &expr[1..]),
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
                Some('+') => Part::Reserved,
                Some('#') => Part::Fragment,
                Some('?') | Some('&') => Part::Query(names),
                Some(other) => {
                    return Err(err(&format!("operator {other} is not supported")));
                }
            });
        }
        Ok(Template { parts })
    }

    /// Whether `uri` is an expansion of this template.
    pub fn matches(&self, uri: &str) -> bool {
        // ends[i]: the parts so far can match exactly `uri[..i]` (i is a char boundary).
        let mut ends = vec![false; uri.len() + 1];
        ends[0] = true;
        let mut next = vec![false; uri.len() + 1];
        for part in &self.parts {
            next.fill(false);
            advance(part, uri, &ends, &mut next);
            std::mem::swap(&mut ends, &mut next);
            if !ends.contains(&true) {
                return false;
            }
        }
        ends[uri.len()]
    }
}

/// Parses and matches in one go; a bad template matches nothing.
pub fn matches(template: &str, uri: &str) -> bool {
    Template::parse(template).is_ok_and(|t| t.matches(uri))
}

/// Sets `next[j]` for every `j` where `part` can end when it starts at an `i` with `ends[i]`.
fn advance(part: &Part, uri: &str, ends: &[bool], next: &mut [bool]) {
    let b = uri.as_bytes();
    let n = uri.len();
    // The char boundaries of `uri` with the char that starts there (`None` at the end).
    let positions = || {
        uri.char_indices()
            .map(|(i, c)| (i, Some(c)))
            .chain(std::iter::once((n, None)))
    };
    match part {
        Part::Literal(l) => {
            for (i, _) in positions() {
                if ends[i] && b[i..].starts_with(l.as_bytes()) {
                    next[i + l.len()] = true;
                }
            }
        }
        Part::Simple | Part::Reserved => {
            let stops = |c: char| match part {
                Part::Simple => matches!(c, '/' | '?' | '#'),
                _ => matches!(c, '?' | '#'),
            };
            // Whether a run of the variable that started at or before here is still going.
            let mut open = false;
            for (i, c) in positions() {
                open |= ends[i];
                next[i] |= open;
                if c.is_some_and(stops) {
                    open = false;
                }
            }
        }
        Part::Fragment => {
            // Past a `#` the fragment can take everything.
            let mut past_hash = false;
            for (i, c) in positions() {
                next[i] |= ends[i] || past_hash;
                past_hash |= ends[i] && c == Some('#');
            }
        }
        Part::Query(names) => {
            // States within the query, by offset: just after a `?` or `&` (an item starts),
            // inside an item's value, and after a whole item (the query may end or go on).
            let mut item = vec![false; n + 1];
            let mut value = vec![false; n + 1];
            let mut after = vec![false; n + 1];
            let delimits = |j: usize| matches!(b.get(j), None | Some(b'&' | b'#'));
            for (i, c) in positions() {
                if item[i] {
                    // An empty item (`?`, `?&a=1`, `?a=1&`), written by hand now and then.
                    after[i] |= delimits(i);
                    for name in names {
                        if b[i..].starts_with(name.as_bytes()) {
                            let j = i + name.len();
                            if delimits(j) {
                                after[j] = true;
                            } else if b[j] == b'=' {
                                value[j + 1] = true;
                            }
                        }
                    }
                }
                // A value can end anywhere: a literal or a variable may follow the query.
                after[i] |= value[i];
                if let Some(c) = c {
                    if value[i] && c != '&' && c != '#' {
                        value[i + c.len_utf8()] = true;
                    }
                    if (ends[i] && matches!(c, '?' | '&')) || (after[i] && c == '&') {
                        item[i + 1] = true;
                    }
                }
                next[i] |= ends[i] || after[i];
            }
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
        assert!(
            Template::parse("a}b{c}").is_err(),
            "a }} before the first {{"
        );
        assert!(Template::parse("{a{b}").is_err());
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
