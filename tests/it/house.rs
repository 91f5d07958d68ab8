//! The house rules of docs/ARCHITECTURE.md that a reading of `src/` can check: no file over
//! 900 lines, no import cycle (between top-level modules, and between files), roles never
//! import each other, only the listed modules open sockets, no unbounded channels, no
//! task-locals, and locks taken one way. Each check names what breaks it and where.
//!
//! Imports are read from the text: every `crate::`, `super::` and `self::` path (in `use`
//! trees, braces expanded, and inline), resolved to the file of the longest module prefix that
//! exists. Test code (files named `*tests.rs`, `*_fuzz.rs`, `testing.rs`, `fuzzing.rs`, and
//! inline `#[cfg(test)] mod … { … }` blocks) is left out. A folder's `mod.rs` (and `lib.rs`)
//! that only declares and re-exports is its face, no node of the file graph; one with items
//! of its own is a node like any file; a file naming its own folder's `mod.rs` items
//! (`super::X`) is contained in it, not an arrow.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A source file: its path under `src/`, its module path, and its production text.
struct File {
    rel: String,
    module: Vec<String>,
    text: String,
    lines: usize,
}

fn is_test_file(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    name.ends_with("tests.rs")
        || name.ends_with("_fuzz.rs")
        || rel == "testing.rs"
        || rel == "fuzzing.rs"
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every file of `src/`, test files included (flagged by [`is_test_file`]).
fn files() -> Vec<File> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    walk(&src, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let raw = std::fs::read_to_string(&p).unwrap();
            let mut module: Vec<String> = rel
                .trim_end_matches(".rs")
                .split('/')
                .map(str::to_owned)
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            File {
                lines: raw.lines().count(),
                text: without_test_blocks(&raw),
                rel,
                module,
            }
        })
        .collect()
}

/// `text` without its inline `#[cfg(test)] mod NAME { … }` blocks (braces counted; a brace
/// in a string or comment of such a block could fool it, which the checks would show).
fn without_test_blocks(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        let after = &rest[at + "#[cfg(test)]".len()..];
        let head = after.trim_start();
        let inline = head.starts_with("mod ")
            && head
                .find(['{', ';'])
                .is_some_and(|i| head.as_bytes()[i] == b'{');
        if !inline {
            out.push_str(&rest[..at + "#[cfg(test)]".len()]);
            rest = after;
            continue;
        }
        out.push_str(&rest[..at]);
        let open = after.find('{').unwrap();
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Lines without `//` comments (doc comments name modules they do not import).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| match l.trim_start().starts_with("//") {
            true => "",
            false => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        return vec![path.to_owned()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| match p.as_str() {
            "self" => prefix.trim_end_matches("::").to_owned(),
            _ => format!("{prefix}{p}"),
        })
        .collect()
}

/// Every `crate::`/`super::`/`self::` path `text` names, from `use` trees and inline.
fn paths(text: &str) -> Vec<String> {
    let text = code(text);
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("use ") {
        let starts_word = at == 0
            || !rest.as_bytes()[at - 1].is_ascii_alphanumeric() && rest.as_bytes()[at - 1] != b'_';
        let after = &rest[at + 4..];
        let Some(end) = after.find(';') else { break };
        if starts_word {
            let tree: String = after[..end]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            if tree.starts_with("crate::")
                || tree.starts_with("super::")
                || tree.starts_with("self::")
            {
                out.extend(expand(&tree));
            }
        }
        rest = after;
    }
    // Inline paths: `crate::a::b` in expressions, types and attributes.
    let bytes = text.as_bytes();
    for root in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = text[from..].find(root) {
            let at = from + i;
            from = at + root.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let end = text[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(text.len(), |e| at + e);
            out.push(text[at..end].trim_end_matches(':').to_owned());
        }
    }
    out
}

/// The module a path names, as segments from the crate root, relative to module `here`.
fn absolute(path: &str, here: &[String], here_is_face: bool) -> Vec<String> {
    let mut segs: Vec<&str> = path.split("::").collect();
    let mut base: Vec<String> = match segs.first() {
        Some(&"crate") => {
            segs.remove(0);
            Vec::new()
        }
        Some(&"self") => {
            segs.remove(0);
            here.to_vec()
        }
        _ => here.to_vec(),
    };
    // `super` of a file module is its folder's module; `mod.rs` is its folder already.
    let _ = here_is_face;
    while segs.first() == Some(&"super") {
        segs.remove(0);
        base.pop();
    }
    base.extend(segs.into_iter().map(str::to_owned));
    base
}

/// The file that owns module path `m`: the longest prefix that is a file's module.
fn owner<'a>(m: &[String], by_module: &'a BTreeMap<Vec<String>, String>) -> Option<&'a String> {
    (1..=m.len()).rev().find_map(|n| by_module.get(&m[..n]))
}

/// File -> files it imports (production code, faces left out).
fn graph(files: &[File]) -> BTreeMap<String, BTreeSet<String>> {
    let by_module: BTreeMap<Vec<String>, String> = files
        .iter()
        .filter(|f| !is_test_file(&f.rel))
        .map(|f| (f.module.clone(), f.rel.clone()))
        .collect();
    let mut g = BTreeMap::new();
    for f in files.iter().filter(|f| !is_test_file(&f.rel)) {
        let face = f.rel.ends_with("mod.rs") || f.rel == "lib.rs" || f.rel == "main.rs";
        let mut to = BTreeSet::new();
        for p in paths(&f.text) {
            let m = absolute(&p, &f.module, face);
            // A child naming its own folder's items (`super::X` from a file to its
            // `mod.rs`) is containment, not an import between rooms.
            let parent = &f.module[..f.module.len().saturating_sub(1)];
            if let Some(target) = owner(&m, &by_module)
                && *target != f.rel
                && (by_module.get(parent) != Some(target) || face)
            {
                to.insert(target.clone());
            }
        }
        g.insert(f.rel.clone(), to);
    }
    g
}

/// Whether a folder's `mod.rs` (or `lib.rs`, `main.rs`) is only its face: declarations and
/// re-exports, no item of its own. One with code of its own is a node like any file.
fn is_face(file: &File) -> bool {
    let named = file.rel.ends_with("mod.rs") || file.rel == "lib.rs" || file.rel == "main.rs";
    named
        && !code(&file.text).lines().any(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("pub(crate) ")
                .or_else(|| l.strip_prefix("pub(super) "))
                .or_else(|| l.strip_prefix("pub "))
                .unwrap_or(l);
            let l = l.strip_prefix("async ").unwrap_or(l);
            [
                "fn ", "struct ", "enum ", "trait ", "impl ", "impl<", "const ", "static ", "type ",
            ]
            .iter()
            .any(|k| l.starts_with(k))
        })
}

/// The strongly connected components of more than one node (Tarjan's, iterative enough for a
/// tree this size).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.g.contains_key(w) {
                continue;
            }
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn top(rel: &str) -> String {
    rel.split('/')
        .next()
        .unwrap_or(rel)
        .trim_end_matches(".rs")
        .to_owned()
}

#[test]
fn no_file_in_src_is_over_900_lines() {
    let long: Vec<String> = files()
        .iter()
        .filter(|f| f.lines > 900)
        .map(|f| format!("src/{} ({} lines)", f.rel, f.lines))
        .collect();
    assert!(long.is_empty(), "split along its seams: {long:?}");
}

#[test]
fn no_import_cycle_between_files_or_top_level_modules() {
    let files = files();
    let g = graph(&files);
    let faces: BTreeSet<&str> = files
        .iter()
        .filter(|f| is_face(f))
        .map(|f| f.rel.as_str())
        .collect();
    let file_graph: BTreeMap<String, BTreeSet<String>> = g
        .iter()
        .filter(|(k, _)| !faces.contains(k.as_str()))
        .map(|(k, v)| {
            let to = v.iter().filter(|t| !faces.contains(t.as_str()));
            (k.clone(), to.cloned().collect())
        })
        .collect();
    let found = cycles(&file_graph);
    assert!(
        found.is_empty(),
        "files importing each other in a loop: {found:?}"
    );
    let mut tops: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in &g {
        let entry = tops.entry(top(from)).or_default();
        entry.extend(to.iter().map(|t| top(t)).filter(|t| *t != top(from)));
    }
    let found = cycles(&tops);
    assert!(
        found.is_empty(),
        "top-level modules importing each other: {found:?}"
    );
}

#[test]
fn the_reader_sees_imports_and_cycles() {
    // The checks above pass only if the reader finds what is there: a use tree with braces,
    // `super::`, an inline path, and a loop.
    let p: BTreeSet<String> =
        paths("use crate::a::{b::C, d};\nuse super::e::F;\nfn f() { crate::g::h(); }")
            .into_iter()
            .collect();
    for want in [
        "crate::a::b::C",
        "crate::a::d",
        "crate::g::h",
        "super::e::F",
    ] {
        assert!(p.contains(want), "{want} in {p:?}");
    }
    assert_eq!(
        absolute("super::e::F", &["x".into(), "y".into()], false),
        ["x", "e", "F"]
    );
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(cycles(&g), [["a", "b", "c"]]);
    let kept = without_test_blocks(
        "a\n#[cfg(test)]\nmod tests {\n fn x() { {} }\n}\nb\n#[cfg(test)]\nmod t;\n",
    );
    assert_eq!(kept, "a\n\nb\n#[cfg(test)]\nmod t;\n");
}

/// The roles: none imports another (shared code lives below them).
const ROLES: &[&str] = &[
    "source/memo",
    "source/file",
    "source/k8s",
    "source/slack",
    "gateway",
    "watch",
    "agent",
];

fn role_of(rel: &str) -> Option<&'static str> {
    ROLES
        .iter()
        .find(|r| rel == format!("{r}.rs") || rel.starts_with(&format!("{r}/")))
        .copied()
}

#[test]
fn roles_never_import_each_other() {
    let files = files();
    let g = graph(&files);
    let mut wrong = Vec::new();
    for (from, to) in &g {
        let Some(role) = role_of(from) else { continue };
        for t in to {
            if let Some(other) = role_of(t)
                && other != role
            {
                wrong.push(format!("src/{from} -> src/{t}"));
            }
        }
    }
    assert!(wrong.is_empty(), "a role imports another role: {wrong:?}");
}

/// Where sockets are opened: transport/ (every listener and client connection, the pooled
/// HTTP clients the others use), app/ (systemd's notify socket and the sockets it hands over,
/// the bind of each role's addresses through transport), nats/ (the NATS client) and the
/// Kubernetes client's connector.
const SOCKET_OPENERS: &[&str] = &[
    "transport/",
    "app/",
    "nats/mod.rs",
    "source/k8s/api/build.rs",
];

#[test]
fn only_the_listed_modules_open_sockets() {
    let opening = [
        "TcpListener::bind",
        "TcpStream::connect",
        "UdpSocket::bind",
        "UnixDatagram::bind",
        "UnixStream::connect",
        "UnixListener::bind",
        "Endpoint::server",
        "Endpoint::client",
        "Endpoint::new",
        "reqwest::Client::builder",
        "reqwest::Client::new",
        "ClientBuilder::new",
        "async_nats::connect",
        "ConnectOptions::new",
        "connect_async",
        "client::legacy::Client::builder",
    ];
    let mut wrong = Vec::new();
    for f in files().iter().filter(|f| !is_test_file(&f.rel)) {
        let text = code(&f.text);
        for pat in opening {
            if text.contains(pat) && !SOCKET_OPENERS.iter().any(|p| f.rel.starts_with(p)) {
                wrong.push(format!("src/{}: {pat}", f.rel));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a socket opened outside {SOCKET_OPENERS:?} (go through transport/): {wrong:?}"
    );
}

#[test]
fn no_unbounded_channels_no_task_locals_and_locks_one_way() {
    let mut wrong = Vec::new();
    for f in files().iter().filter(|f| !is_test_file(&f.rel)) {
        let text = code(&f.text);
        for (pat, why) in [
            ("unbounded_channel", "an unbounded channel (bound it)"),
            ("UnboundedSender", "an unbounded channel (bound it)"),
            ("task_local!", "a task-local (pass it in the signature)"),
            (
                "e.into_inner())",
                "poison recovery by hand (use crate::sync::Recover)",
            ),
            (
                ".lock().unwrap()",
                "a lock that panics on poison (use crate::sync::Recover)",
            ),
        ] {
            if text.contains(pat) && f.rel != "sync.rs" {
                wrong.push(format!("src/{}: {why}", f.rel));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// Roles reach an upstream only through its operations (`call_tool`, `read`, `listen`,
/// `follow_log`, `request`, `connect`, …), which choose the way themselves: no role holds
/// the connection handle (`Live`) or its rmcp peer, or names it.
#[test]
fn roles_reach_upstreams_only_through_the_client() {
    let mut wrong = Vec::new();
    for f in files().iter().filter(|f| !is_test_file(&f.rel)) {
        if f.rel.starts_with("upstream/") {
            continue;
        }
        let text = code(&f.text);
        for pat in [".live()", ".cached()", ".http_calls("] {
            if text.contains(pat) {
                wrong.push(format!("src/{}: {pat}", f.rel));
            }
        }
        let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        for (i, _) in text.match_indices("Live") {
            if !word(text[..i].chars().next_back()) && !word(text[i + 4..].chars().next()) {
                wrong.push(format!("src/{}: the type Live", f.rel));
                break;
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "an upstream's connection used outside src/upstream/ (use its operations): {wrong:?}"
    );
}

/// `anyhow` is the command line's: everywhere else an error is typed or a sentence.
#[test]
fn anyhow_is_used_only_in_cli() {
    let wrong: Vec<String> = files()
        .iter()
        .filter(|f| !is_test_file(&f.rel) && !f.rel.starts_with("cli/"))
        .filter(|f| code(&f.text).contains("anyhow"))
        .map(|f| format!("src/{}", f.rel))
        .collect();
    assert!(wrong.is_empty(), "anyhow outside src/cli/: {wrong:?}");
}
