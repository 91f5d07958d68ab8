//! Fuzz (property) tests of the gateway's TOML config, bounded so they run in every
//! `cargo test` (`cargo test fuzz` runs all of herald's): arbitrary text, valid configs with
//! their text mangled, and valid configs with their structure mutated (keys removed, added,
//! retyped, tables duplicated) are parsed; each is `Ok` or `Err`, never a panic; what is
//! `Ok` holds what validation promises; and a TOML error never quotes a string of the file
//! (a secret put in the wrong place must not reach a terminal or the journal).
//!
//! The mutation helpers are shared with the other config harnesses (`herald up`'s).

use proptest::prelude::*;
use proptest::sample::Index;

pub(crate) use crate::fuzzing::{config, mangles};

use super::{ConfigError, GatewayConfig, GatewayFile, toml_message, valid_slug};

/// Marks the strings the mutations put in: no TOML error may quote one.
pub(crate) const SECRET: &str = "s3cret-";

pub(crate) const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// Keys herald knows somewhere in its configs, and some it does not.
pub(crate) const KEYS: &[&str] = &[
    "name",
    "stdio",
    "http",
    "quic",
    "tls_ca",
    "tls_pin",
    "token_env",
    "token_credential",
    "sha256",
    "slugs",
    "slug",
    "token",
    "listen",
    "admin",
    "allowed_hosts",
    "allowed_origins",
    "memo",
    "file",
    "k8s",
    "slack",
    "watch",
    "notify",
    "roots",
    "ring_capacity",
    "max_file_bytes",
    "debounce_ms",
    "max_watches",
    "kubeconfigs",
    "kubectl",
    "token_command",
    "read_write",
    "linger_ms",
    "max_watchers",
    "watch_via",
    "backend",
    "nats_bucket",
    "nats_creds",
    "nats_nkey",
    "nats_tls_ca",
    "api_url",
    "credentials",
    "max_events",
    "socket_idle_ms",
    "uri",
    "on_event",
    "on_event_file",
    "exec",
    "webhook",
    "server",
    "limits",
    "colour",
    "bot_token",
    "password",
    "",
];

/// Strings that mean something to some key (names, addresses, hashes), and bad ones.
const STRINGS: &[&str] = &[
    "",
    " ",
    "*",
    "memo",
    "file",
    "k8s",
    "slack",
    "ext",
    "a__b",
    "a+b",
    "-",
    "-a",
    "Memo",
    "127.0.0.1:0",
    "0.0.0.0:8750",
    "[::1]:1",
    "localhost:1",
    "::1",
    "[::1",
    "10.0.0.5",
    "http://127.0.0.1:1/mcp",
    "https://",
    "herald memo",
    "memo://notes",
    "/",
    ".",
    "..",
    "../x",
    "/nonexistent-herald-fuzz/x",
    "a=b",
    "\u{0}",
    "é",
    "sha256:",
    "HERALD_FUZZ_UNSET",
    HASH,
];

/// A key to add: a known or unknown one, or anything.
pub(crate) fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(KEYS).prop_map(String::from),
        1 => any::<String>(),
    ]
}

/// A string value: meaningful, random, or a marked secret.
pub(crate) fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(STRINGS).prop_map(String::from),
        1 => "[a-z0-9.:/-]{0,12}",
        1 => any::<String>(),
        2 => "[a-z0-9]{0,6}".prop_map(|s| format!("{SECRET}{s}")),
    ]
}

/// Any TOML value.
pub(crate) fn value() -> impl Strategy<Value = toml::Value> {
    let leaf = prop_oneof![
        4 => string().prop_map(toml::Value::String),
        1 => any::<i64>().prop_map(toml::Value::Integer),
        2 => prop::sample::select(&[0i64, -1, 1, 50, 100, i64::MAX, i64::MIN][..])
            .prop_map(toml::Value::Integer),
        1 => any::<f64>().prop_map(toml::Value::Float),
        1 => any::<bool>().prop_map(toml::Value::Boolean),
        1 => Just(toml::Value::Datetime("1979-05-27T07:32:00Z".parse().unwrap())),
    ];
    leaf.prop_recursive(2, 10, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(toml::Value::Array),
            prop::collection::vec((key(), inner), 0..3)
                .prop_map(|kv| toml::Value::Table(kv.into_iter().collect())),
        ]
    })
}

/// One structural change, at a place picked among all the document's places.
#[derive(Debug, Clone)]
pub(crate) enum Edit {
    Remove,
    Set(toml::Value),
    /// Into a table (or onto an array).
    Insert(String, toml::Value),
    /// An array's element again (a second `[[slug]]` of the same name, say).
    Duplicate,
}

pub(crate) fn edits() -> impl Strategy<Value = Vec<(Index, Edit)>> {
    prop::collection::vec(
        (
            any::<Index>(),
            prop_oneof![
                2 => Just(Edit::Remove),
                3 => value().prop_map(Edit::Set),
                3 => (key(), value()).prop_map(|(k, v)| Edit::Insert(k, v)),
                1 => Just(Edit::Duplicate),
            ],
        ),
        1..5,
    )
}

#[derive(Debug, Clone)]
enum Step {
    Key(String),
    At(usize),
}

fn places(v: &toml::Value, path: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(path.clone());
    match v {
        toml::Value::Table(t) => {
            for (k, c) in t {
                path.push(Step::Key(k.clone()));
                places(c, path, out);
                path.pop();
            }
        }
        toml::Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                path.push(Step::At(i));
                places(c, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn at<'a>(mut v: &'a mut toml::Value, path: &[Step]) -> Option<&'a mut toml::Value> {
    for step in path {
        v = match (step, v) {
            (Step::Key(k), toml::Value::Table(t)) => t.get_mut(k)?,
            (Step::At(i), toml::Value::Array(a)) => a.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(v)
}

/// `text` (a valid config) with `edits` applied to its structure, written back as TOML;
/// `None` when toml cannot write the result.
pub(crate) fn mutate(text: &str, edits: &[(Index, Edit)]) -> Option<String> {
    let mut root = toml::Value::Table(toml::from_str(text).expect("a valid seed"));
    for (place, edit) in edits {
        let mut all = Vec::new();
        places(&root, &mut Vec::new(), &mut all);
        let path = &all[place.index(all.len())];
        let (parent, last) = match path.split_last() {
            Some((last, parent)) => (parent, Some(last)),
            None => (&path[..], None),
        };
        match (edit, last) {
            (Edit::Remove, Some(last)) => match (at(&mut root, parent)?, last) {
                (toml::Value::Table(t), Step::Key(k)) => {
                    t.remove(k);
                }
                (toml::Value::Array(a), Step::At(i)) => {
                    a.remove(*i);
                }
                _ => {}
            },
            (Edit::Set(v), Some(_)) => *at(&mut root, path)? = v.clone(),
            (Edit::Insert(k, v), _) => match at(&mut root, path)? {
                toml::Value::Table(t) => {
                    t.insert(k.clone(), v.clone());
                }
                toml::Value::Array(a) => a.push(v.clone()),
                _ => {}
            },
            (Edit::Duplicate, Some(Step::At(i))) => {
                if let toml::Value::Array(a) = at(&mut root, parent)? {
                    let again = a[*i].clone();
                    a.push(again);
                }
            }
            _ => {}
        }
    }
    toml::to_string(&root).ok()
}

/// `text` with bytes replaced, cut out or put in, or cut short (read back lossily).
pub(crate) fn mangle(text: &str, edits: &[(Index, u8, u8)]) -> String {
    const PIECES: &[&str] = &[
        "[",
        "]",
        "[[",
        "]]",
        "\"",
        "'",
        "\"\"\"",
        "=",
        "\n",
        "#",
        ",",
        "{",
        "}",
        ".",
        "\\",
        "\\u",
        "é",
        "\u{0}",
        "\r",
        "1979-05-27",
        "inf",
        "nan",
        "0x",
        "name",
        "slug",
    ];
    let pieces: Vec<&[u8]> = PIECES.iter().map(|p| p.as_bytes()).collect();
    String::from_utf8_lossy(&crate::fuzzing::mangle(text.as_bytes(), edits, &pieces)).into_owned()
}

/// TOML-ish noise.
pub(crate) fn noise() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        prop::collection::vec(
            prop::sample::select(
                &[
                    "[",
                    "]",
                    "[[",
                    "]]",
                    "slug",
                    "token",
                    "listen",
                    "memo",
                    "name",
                    " = ",
                    "\"x\"",
                    "\"",
                    "'",
                    "1",
                    "\n",
                    "#",
                    ".",
                    "é",
                    "\r\n",
                    "{",
                    "}",
                    ",",
                    "\"s3cret-x\"",
                    "\"\"\"",
                ][..]
            ),
            0..40
        )
        .prop_map(|t| t.concat()),
    ]
}

/// A TOML error's message (herald's, without the line) quotes no marked string, and names
/// a line the text has.
pub(crate) fn check_toml_error(text: &str, e: &toml::de::Error) -> Result<(), TestCaseError> {
    let m = toml_message(text, e);
    prop_assert!(!m.contains(SECRET), "a TOML error quotes a value: {}", m);
    if let Some(n) = m
        .strip_prefix("line ")
        .and_then(|r| r.split(':').next())
        .and_then(|n| n.parse::<usize>().ok())
    {
        prop_assert!(
            n >= 1 && n <= text.split('\n').count(),
            "line {} of {:?}",
            n,
            text
        );
    }
    Ok(())
}

/// Parses `text` as a gateway config and checks what an `Ok` promises.
fn check(text: &str) -> Result<(), TestCaseError> {
    if let Err(e) = toml::from_str::<GatewayFile>(text) {
        check_toml_error(text, &e)?;
    }
    match GatewayConfig::parse(text) {
        Ok(c) => {
            for (i, s) in c.slugs.iter().enumerate() {
                prop_assert!(valid_slug(&s.name), "{}", s.name);
                prop_assert!(c.slugs[..i].iter().all(|o| o.name != s.name), "{}", s.name);
            }
            for t in &c.tokens {
                prop_assert!(t.slugs.iter().all(|n| c.slugs.iter().any(|s| &s.name == n)));
            }
        }
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
            if let ConfigError::Toml(m) = &e {
                prop_assert!(!m.contains(SECRET), "{}", m);
            }
        }
    }
    Ok(())
}

/// Valid gateway configs to start from.
pub(crate) fn seeds() -> Vec<String> {
    vec![
        include_str!("../../packaging/etc/herald/gateway.toml").to_owned(),
        format!(
            "http = \"127.0.0.1:8760\"\nquic = \"127.0.0.1:8761\"\n\
             [[slug]]\nname = \"memo\"\nstdio = \"herald memo\"\n\
             [[slug]]\nname = \"cluster\"\nhttp = \"http://10.0.0.5:8750/mcp\"\n\
             [[slug]]\nname = \"q-1\"\nquic = \"10.0.0.6:8751\"\ntls_pin = \"sha256:{HASH}\"\n\
             [[token]]\nname = \"ops\"\nsha256 = \"{HASH}\"\nslugs = [\"memo\", \"cluster\"]\n\
             [[token]]\nsha256 = \"{HASH}\"\nslugs = [\"*\"]\n"
        ),
    ]
}

proptest! {
    #![proptest_config(config(300))]

    #[test]
    fn fuzz_gateway_config_arbitrary_text(text in noise()) {
        check(&text)?;
    }

    #[test]
    fn fuzz_gateway_config_mangled_text(seed in any::<Index>(), m in mangles()) {
        let seeds = seeds();
        check(&mangle(&seeds[seed.index(seeds.len())], &m))?;
    }

    #[test]
    fn fuzz_gateway_config_mutated_structure(seed in any::<Index>(), e in edits()) {
        let seeds = seeds();
        if let Some(text) = mutate(&seeds[seed.index(seeds.len())], &e) {
            check(&text)?;
        }
    }
}

/// The seeds are valid (else the mutations start from nothing).
#[test]
fn fuzz_gateway_config_seeds_are_valid() {
    for s in seeds() {
        GatewayConfig::parse(&s).unwrap();
    }
}
