//! TOML errors said without quoting the file: [`toml_message`] (every config herald reads goes
//! through it: the gateway's, `herald up`'s, `[slack]`'s, `herald watch --config`'s).

/// A TOML error as `line N: KEY: what is wrong`, quoting nothing of the file but its keys.
/// toml's own Display quotes the offending line, and serde's messages quote the value
/// (`invalid type: string "…", expected …`): a secret put in the wrong place by mistake (a
/// token under a key herald refuses, or where a table belongs) must not reach a terminal or
/// the journal. So the value is described by its type only, the key before `=` on the line is
/// named when it is one herald could have, and an unknown key is named only when it looks
/// like one (lowercase letters and `_`, as all of herald's are).
pub fn toml_message(text: &str, e: &toml::de::Error) -> String {
    let message = without_values(e.message());
    let Some(mut span) = e.span() else {
        return message;
    };
    // A table with keys flattened into it (`[memo]`'s NATS keys) has an unknown key refused
    // at the table's header: point at the key's own line instead.
    if let Some(key) = message
        .strip_prefix("unknown field `")
        .and_then(|r| r.split('`').next())
        && let Some(at) = key_line_after(text, span.start, key)
    {
        span = at..at;
    }
    // Bytes, not a str slice: a span need not fall on a char boundary of mangled text.
    let before = &text.as_bytes()[..span.start.min(text.len())];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    // `key = ` before the span on its line: the value at fault is (in) that key's.
    let key = before[line_start..]
        .iter()
        .position(|b| *b == b'=')
        .and_then(|eq| std::str::from_utf8(&before[line_start..line_start + eq]).ok())
        .map(str::trim)
        .filter(|k| k.split('.').all(herald_like_key));
    match key {
        Some(key) => format!("line {line}: {key}: {message}"),
        None => format!("line {line}: {message}"),
    }
}

/// Where `key = …` starts in the table whose header is at `header`, if it does.
fn key_line_after(text: &str, header: usize, key: &str) -> Option<usize> {
    // `get`: a span need not fall on a char boundary of mangled text.
    let rest = text.get(header..)?;
    if !rest.starts_with('[') {
        return None;
    }
    let mut at = header + rest.find('\n')? + 1;
    for line in text[at..].split_inclusive('\n') {
        let t = line.trim_start();
        if t.starts_with('[') {
            return None;
        }
        if t.strip_prefix(key)
            .is_some_and(|r| r.trim_start().starts_with('='))
        {
            return Some(at + (line.len() - t.len()));
        }
        at += line.len();
    }
    None
}

/// Whether `key` could be one of herald's config keys (all are lowercase letters and `_`),
/// so that naming it in an error cannot show a secret.
fn herald_like_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= 40 && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

const NOT_SHOWN: &str = "(the value is not shown, in case it is a secret)";

/// serde's messages (the ones toml passes on) with the file's values taken out. The others
/// (toml's syntax errors, `missing field`, `invalid length`, std's `invalid socket address
/// syntax`) quote no value and are kept as they are.
fn without_values(message: &str) -> String {
    // `invalid type: string "…", expected a sequence`; `invalid value: integer `-1`, expected
    // u64`. The expected part is herald's (a type's description), so it is split off from
    // the right, whatever the value holds.
    for (head, what) in [
        ("invalid type: ", "expected"),
        ("invalid value: ", "invalid value, expected"),
    ] {
        if let Some(rest) = message.strip_prefix(head) {
            return match rest.rsplit_once(", expected ") {
                Some((found, expected)) => format!(
                    "{what} {}, found {} {NOT_SHOWN}",
                    plain_expected(expected),
                    value_kind(found)
                ),
                None => format!("{} {NOT_SHOWN}", head.trim_end_matches([' ', ':'])),
            };
        }
    }
    // `unknown variant `…`, expected `a` or `b``: the variant is the file's value.
    if message.starts_with("unknown variant ") {
        return match message.rsplit_once(", expected ") {
            Some((_, expected)) => format!("unknown variant, expected {expected} {NOT_SHOWN}"),
            None => format!("unknown variant {NOT_SHOWN}"),
        };
    }
    // `unknown field `…`, expected one of `a`, `b``: a key, named when it looks like one.
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let (field, tail) = rest
            .rsplit_once("`, expected ")
            .map(|(f, e)| (f, format!(", expected {e}")))
            .or_else(|| {
                rest.strip_suffix("`, there are no fields")
                    .map(|f| (f, ": this table takes no keys".to_owned()))
            })
            .unwrap_or((rest.trim_end_matches('`'), String::new()));
        return if herald_like_key(field) {
            format!("unknown field `{field}`{tail}")
        } else {
            format!("unknown field (its name is not shown, in case it is a secret){tail}")
        };
    }
    message.to_owned()
}

/// What serde's `Unexpected` says was found, as a kind of TOML value and nothing of it.
fn value_kind(found: &str) -> &'static str {
    const KINDS: &[(&str, &str)] = &[
        ("string", "a string"),
        ("integer", "an integer"),
        ("floating point", "a float"),
        ("boolean", "a boolean"),
        ("character", "a character"),
        ("map", "a table"),
        ("sequence", "an array"),
    ];
    KINDS
        .iter()
        .find(|(prefix, _)| found.starts_with(prefix))
        .map_or("a value of another type", |(_, kind)| kind)
}

/// serde's description of what was expected, in TOML's words where they differ.
fn plain_expected(expected: &str) -> &str {
    if expected.starts_with("struct ") || expected == "a map" || expected == "map" {
        "a table"
    } else if expected == "a sequence" {
        "an array"
    } else {
        expected
    }
}
