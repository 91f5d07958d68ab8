//! Fuzz (property) tests of RFC 6570 matching, bounded so they run in every `cargo test`
//! (`cargo test fuzz` runs all of herald's): arbitrary templates and URIs never panic or take
//! long; a URI made by expanding a random template with random values matches it; and URIs
//! that no expansion could give do not.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use crate::fuzzing::config;

use super::{Template, matches};

/// One expression of a template with the values it is expanded with.
#[derive(Debug, Clone)]
enum Expr {
    Literal(String),
    /// `{a,b}`, `{a:3}`, `{a*}`.
    Simple(Vec<(String, Option<String>)>, Modifier),
    /// `{+a}`.
    Reserved(Vec<(String, Option<String>)>),
    /// `{#a}`.
    Fragment(Vec<(String, Option<String>)>),
    /// `{?a,b}` (`'?'`) or `{&a,b}` (`'&'`).
    Query(char, Vec<(String, Option<String>)>),
}

#[derive(Debug, Clone, Copy)]
enum Modifier {
    None,
    Prefix(usize),
    Explode,
}

impl Expr {
    fn template(&self) -> String {
        let names = |vars: &[(String, Option<String>)]| {
            vars.iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            Expr::Literal(l) => l.clone(),
            Expr::Simple(vars, m) => {
                let suffix = match m {
                    Modifier::None => String::new(),
                    Modifier::Prefix(n) => format!(":{n}"),
                    Modifier::Explode => "*".into(),
                };
                let names: Vec<String> = vars.iter().map(|(n, _)| format!("{n}{suffix}")).collect();
                format!("{{{}}}", names.join(","))
            }
            Expr::Reserved(vars) => format!("{{+{}}}", names(vars)),
            Expr::Fragment(vars) => format!("{{#{}}}", names(vars)),
            Expr::Query(op, vars) => format!("{{{op}{}}}", names(vars)),
        }
    }

    /// RFC 6570 expansion (the values are already encoded).
    fn expand(&self) -> String {
        let defined = |vars: &[(String, Option<String>)]| -> Vec<String> {
            vars.iter().filter_map(|(_, v)| v.clone()).collect()
        };
        match self {
            Expr::Literal(l) => l.clone(),
            Expr::Simple(vars, m) => {
                let values: Vec<String> = defined(vars)
                    .into_iter()
                    .map(|v| match m {
                        Modifier::Prefix(n) => v.chars().take(*n).collect(),
                        _ => v,
                    })
                    .collect();
                values.join(",")
            }
            Expr::Reserved(vars) => defined(vars).join(","),
            Expr::Fragment(vars) => {
                let values = defined(vars);
                if values.is_empty() {
                    String::new()
                } else {
                    format!("#{}", values.join(","))
                }
            }
            Expr::Query(op, vars) => {
                let pairs: Vec<String> = vars
                    .iter()
                    .filter_map(|(n, v)| v.as_ref().map(|v| format!("{n}={v}")))
                    .collect();
                if pairs.is_empty() {
                    String::new()
                } else {
                    format!("{op}{}", pairs.join("&"))
                }
            }
        }
    }
}

/// Variable names; `zz` is never one (the tests use it as the unknown query key).
const NAMES: &[&str] = &["a", "b", "ns", "kcp", "path", "x_1", "labelSelector"];

fn vars(value: &'static str) -> impl Strategy<Value = Vec<(String, Option<String>)>> {
    prop::collection::vec(
        (
            prop::sample::select(NAMES).prop_map(String::from),
            prop::option::weighted(0.8, value),
        ),
        1..4,
    )
}

/// Values as an expansion writes them: unreserved characters and percent-encoded triplets
/// (and `:`, which herald accepts raw, as a kcp workspace is written).
const SIMPLE_VALUE: &str = "([a-zA-Z0-9._~:-]|%[0-9A-F]{2}|é){0,8}";
/// `{+var}` keeps reserved characters; `?` and `#` end it, so values never hold them.
const RESERVED_VALUE: &str = "([a-zA-Z0-9._~:/@!$'()*+,;=&-]|%[0-9A-F]{2}){0,10}";
const FRAGMENT_VALUE: &str = "([a-zA-Z0-9._~:/@!$'()*+,;=&?-]|%[0-9A-F]{2}){0,10}";
const QUERY_VALUE: &str = "([a-zA-Z0-9._~-]|%[0-9A-F]{2}){0,6}";
/// Literals: no braces, and no `?`, `#` or `&` (which delimit queries and fragments).
const LITERAL: &str = "[a-z0-9/:._~-]{1,6}|://|/";

fn expr(query: bool, fragment: bool, reserved: bool) -> BoxedStrategy<Expr> {
    let modifier = prop_oneof![
        3 => Just(Modifier::None),
        1 => (1usize..5).prop_map(Modifier::Prefix),
        1 => Just(Modifier::Explode),
    ];
    let mut options: Vec<(u32, BoxedStrategy<Expr>)> = vec![
        (4, LITERAL.prop_map(Expr::Literal).boxed()),
        (
            4,
            (vars(SIMPLE_VALUE), modifier)
                .prop_map(|(v, m)| Expr::Simple(v, m))
                .boxed(),
        ),
    ];
    if reserved {
        options.push((2, vars(RESERVED_VALUE).prop_map(Expr::Reserved).boxed()));
    }
    if fragment {
        options.push((1, vars(FRAGMENT_VALUE).prop_map(Expr::Fragment).boxed()));
    }
    if query {
        options.push((
            2,
            (prop::sample::select(&['?', '&'][..]), vars(QUERY_VALUE))
                .prop_map(|(op, v)| Expr::Query(op, v))
                .boxed(),
        ));
    }
    prop::strategy::Union::new_weighted(options).boxed()
}

/// A template as its expressions; `{?...}` parts come last, after an optional fragment only
/// when `fragment`, as RFC 6570 templates put them.
fn template(query: bool, fragment: bool, reserved: bool) -> impl Strategy<Value = Vec<Expr>> {
    (
        prop::collection::vec(expr(false, false, reserved), 0..7),
        prop::collection::vec(expr(query, false, false), 0..3),
        if fragment {
            prop::option::of(vars(FRAGMENT_VALUE).prop_map(Expr::Fragment)).boxed()
        } else {
            Just(None).boxed()
        },
    )
        .prop_map(|(mut path, tail, frag)| {
            path.extend(tail);
            path.extend(frag);
            path
        })
}

fn render(exprs: &[Expr]) -> (String, String) {
    (
        exprs.iter().map(Expr::template).collect(),
        exprs.iter().map(Expr::expand).collect(),
    )
}

/// Template-like noise: braces, operators, names and separators in any order.
fn template_noise() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        prop::collection::vec(
            prop::sample::select(
                &[
                    "{", "}", "{?", "{&", "{+", "{#", "{;", ",", ":", "*", "a", "b", "é", "/", "?",
                    "&", "#", "=", "x:", ":3", "{a}", "{+p}", "{?q,r}",
                ][..]
            ),
            0..24
        )
        .prop_map(|t| t.concat()),
    ]
}

fn uri_noise() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        prop::collection::vec(
            prop::sample::select(&["a", "b", "/", "?", "&", "#", "=", "é", "q=1", "x:", "%2F"][..]),
            0..40
        )
        .prop_map(|t| t.concat()),
    ]
}

/// Matching stays fast: a client's URI against an upstream's template is matched on the
/// request's path.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let r = f();
    (r, start.elapsed())
}

const SLOW: Duration = Duration::from_millis(500);

proptest! {
    #![proptest_config(config(500))]

    #[test]
    fn fuzz_arbitrary_templates_and_uris_never_panic(
        t in template_noise(),
        uri in uri_noise(),
    ) {
        let (parsed, took) = timed(|| Template::parse(&t));
        prop_assert!(took < SLOW, "parse took {took:?}");
        if let Ok(p) = parsed {
            let (m, took) = timed(|| p.matches(&uri));
            prop_assert!(took < SLOW, "matching took {took:?}");
            prop_assert_eq!(m, matches(&t, &uri));
            // A template without expressions is a literal: it matches itself only.
            if !t.contains('{') {
                prop_assert_eq!(m, t == uri);
            }
        } else {
            prop_assert!(!matches(&t, &uri));
        }
    }

    /// The expansion of a template, with any values defined or not, matches it.
    #[test]
    fn fuzz_an_expansion_matches_its_template(exprs in template(true, true, true)) {
        let (t, uri) = render(&exprs);
        let parsed = Template::parse(&t);
        prop_assert!(parsed.is_ok(), "{t}: {parsed:?}");
        let (m, took) = timed(|| parsed.unwrap().matches(&uri));
        prop_assert!(m, "{t} does not match its expansion {uri}");
        prop_assert!(took < SLOW, "matching took {took:?}");
    }

    /// Nothing in a template without `{?..}`, `{&..}` or `{#..}` takes a `?` or a `#`.
    #[test]
    fn fuzz_no_query_part_no_query(
        exprs in template(false, false, true),
        at in any::<prop::sample::Index>(),
        what in prop::sample::select(&["?", "#", "?a=1", "#a"][..]),
    ) {
        let (t, mut uri) = render(&exprs);
        let i = at.index(uri.len() + 1);
        let i = (0..=i).rev().find(|i| uri.is_char_boundary(*i)).unwrap_or(0);
        uri.insert_str(i, what);
        prop_assert!(!matches(&t, &uri), "{t} matches {uri}");
    }

    /// A simple `{var}` never takes a `/`: one more `/` than the template's literals hold
    /// is no match.
    #[test]
    fn fuzz_simple_vars_stop_at_slash(
        exprs in template(false, false, false),
        at in any::<prop::sample::Index>(),
    ) {
        let (t, mut uri) = render(&exprs);
        prop_assert!(matches(&t, &uri), "{t} does not match its expansion {uri}");
        let i = at.index(uri.len() + 1);
        let i = (0..=i).rev().find(|i| uri.is_char_boundary(*i)).unwrap_or(0);
        uri.insert(i, '/');
        prop_assert!(!matches(&t, &uri), "{t} matches {uri}");
    }

    /// A query matches when every key it names is one of the template's, and only then.
    #[test]
    fn fuzz_query_keys_are_checked(
        prefix in "[a-z]{1,5}://[a-z0-9/]{0,8}",
        names in prop::collection::vec(prop::sample::select(NAMES), 1..4),
        pairs in prop::collection::vec(
            (prop::sample::select(&["a", "b", "ns", "kcp", "zz", "A", ""][..]), QUERY_VALUE),
            1..5,
        ),
    ) {
        let t = format!("{prefix}{{?{}}}", names.join(","));
        let query: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let uri = format!("{prefix}?{}", query.join("&"));
        let known = pairs.iter().all(|(k, _)| names.contains(k));
        prop_assert_eq!(matches(&t, &uri), known, "{} against {}", t, uri);
    }
}

/// Many variables side by side and a URI they cannot cover: no exponential backtracking.
#[test]
fn fuzz_regression_adjacent_variables_are_not_exponential() {
    for (t, uri) in [
        ("{a}{b}{c}{d}{e}{f}{g}{h}Z", "x".repeat(60)),
        ("{a}-{b}-{c}-{d}-{e}-{f}-{g}-{h}Z", "-".repeat(60)),
        ("{+a}{+b}{+c}{+d}{+e}{+f}{+g}{+h}Z", "x/".repeat(30)),
    ] {
        let (m, took) = timed(|| matches(t, &uri));
        assert!(!m);
        assert!(took < SLOW, "{t}: {took:?}");
    }
}

/// RFC 6570's own pair: a form-style query and its continuation.
#[test]
fn fuzz_regression_query_then_continuation() {
    assert!(matches("/search{?q}{&page}", "/search?q=x&page=2"));
    assert!(matches("/search{?q}{&page}", "/search?q=x"));
    assert!(matches("/search{?q}{&page}", "/search"));
    assert!(!matches("/search{?q}{&page}", "/search?q=x&zz=2"));
}

/// A fragment expression expands to `#` and its value.
#[test]
fn fuzz_regression_fragment() {
    assert!(matches("doc://x{#section}", "doc://x#intro"));
    assert!(matches("doc://x{#section}", "doc://x"));
}

/// Found by `fuzz_an_expansion_matches_its_template`: a query took everything up to `#`, so
/// nothing written after it in the template (a literal, a variable) could match.
#[test]
fn fuzz_regression_a_query_is_followed_by_more() {
    assert!(matches("x{?a}/y{b}", "x?a=1/yv"));
    assert!(matches("x{?a}/y{b}", "x/yv"));
    assert!(matches("x{?a}{b}{#c}", "x?a=1v#top"));
    assert!(!matches("x{?a}/y{b}", "x?zz=1/yv"));
}
