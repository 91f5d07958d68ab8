//! The documentation against the command line and itself: every flag `--help` shows is in the
//! README or a reference page under docs/ with its default; every `herald …` command line in
//! their `sh` blocks and in docs/operating.md parses as written (`tests/it/guide.rs` runs the
//! guide's too); every reference page is linked from the README; every relative link in the
//! docs reaches a file and, with `#anchor`, a heading of it.

use clap::{Arg, Command, CommandFactory, Parser};

use super::Cli;

const README: &str = include_str!("../../README.md");
const OPERATING: &str = include_str!("../../docs/operating.md");

/// The README and the reference pages it links, by path.
const DOCS: &[(&str, &str)] = &[
    ("README.md", README),
    ("docs/agent.md", include_str!("../../docs/agent.md")),
    (
        "docs/benchmarks.md",
        include_str!("../../docs/benchmarks.md"),
    ),
    ("docs/client.md", include_str!("../../docs/client.md")),
    (
        "docs/conformance.md",
        include_str!("../../docs/conformance.md"),
    ),
    ("docs/events.md", include_str!("../../docs/events.md")),
    ("docs/file.md", include_str!("../../docs/file.md")),
    ("docs/gateway.md", include_str!("../../docs/gateway.md")),
    ("docs/k8s.md", include_str!("../../docs/k8s.md")),
    ("docs/memo.md", include_str!("../../docs/memo.md")),
    ("docs/protocol.md", include_str!("../../docs/protocol.md")),
    ("docs/running.md", include_str!("../../docs/running.md")),
    ("docs/slack.md", include_str!("../../docs/slack.md")),
    ("docs/tasks.md", include_str!("../../docs/tasks.md")),
    ("docs/up.md", include_str!("../../docs/up.md")),
    ("docs/watch.md", include_str!("../../docs/watch.md")),
];

/// The pages under docs/ that are not reference pages.
const NOT_REFERENCE: &[&str] = &[
    "docs/ARCHITECTURE.md",
    "docs/DESIGN.md",
    "docs/STYLE.md",
    "docs/mcp-2026-07-28.md",
    "docs/operating.md",
];

/// The README and the reference pages as one text.
fn reference() -> String {
    DOCS.iter()
        .map(|(_, text)| *text)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every visible subcommand, with its path (`herald watch`), depth first.
fn commands() -> Vec<(String, Command)> {
    fn walk(path: String, cmd: &Command, out: &mut Vec<(String, Command)>) {
        out.push((path.clone(), cmd.clone()));
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(format!("{path} {}", sub.get_name()), sub, out);
        }
    }
    let mut out = Vec::new();
    let mut cli = Cli::command();
    cli.build();
    walk("herald".into(), &cli, &mut out);
    out
}

/// The flags `--help` shows for `cmd`; the global ones only at the top (they propagate).
fn visible_flags(cmd: &Command, top: bool) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments().filter(move |a| {
        !a.is_hide_set()
            && (top || !a.is_global_set())
            && a.get_long().is_some_and(|l| l != "help" && l != "version")
    })
}

/// `--name` occurs in `text` as a whole flag (not as the start of `--name-more`).
fn mentions(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(i, _)| {
        !text[i + flag.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

#[test]
fn every_flag_is_documented_with_its_default() {
    let docs = reference();
    let mut missing = Vec::new();
    for (path, cmd) in commands() {
        for arg in visible_flags(&cmd, path == "herald") {
            let flag = format!("--{}", arg.get_long().unwrap());
            if !mentions(&docs, &flag) {
                missing.push(format!(
                    "{path}: {flag} is in neither the README nor a reference page"
                ));
                continue;
            }
            // A default clap shows is written on one of the lines naming the flag.
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|d| d.to_string_lossy().into_owned())
                .filter(|d| !d.is_empty() && d != "false")
                .collect();
            // A counted flag (`-v`) has no default worth writing.
            if defaults.is_empty() || matches!(arg.get_action(), clap::ArgAction::Count) {
                continue;
            }
            let documented = docs
                .lines()
                .filter(|l| mentions(l, &flag))
                .any(|l| defaults.iter().all(|d| l.contains(d.as_str())));
            if !documented {
                missing.push(format!(
                    "{path}: {flag}'s default {} is on no line of the docs naming it",
                    defaults.join(",")
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the docs vs --help:\n{}",
        missing.join("\n")
    );
}

/// Splits a shell line into words and operators (`|`, `&`, `&&`, `;`, `>`, `<`, `2>`…), with
/// '…' and "…" quoting and `\` escapes; a `#` starting a word begins a comment.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            // A command substitution is part of its word: `herald-$(date +%F).redb`.
            '$' if chars.peek() == Some(&'(') => {
                in_word = true;
                word.push(c);
                let mut depth = 0;
                for c in chars.by_ref() {
                    word.push(c);
                    match c {
                        '(' => depth += 1,
                        ')' if depth == 1 => break,
                        ')' => depth -= 1,
                        _ => {}
                    }
                }
            }
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '|' | '&' | ';' | '>' | '<' => {
                // `2>` is one operator; a number right before `>` is not a word.
                let fd = in_word && c == '>' && word.chars().all(|d| d.is_ascii_digit());
                let mut op = if fd {
                    std::mem::take(&mut word)
                } else {
                    String::new()
                };
                if in_word && !fd {
                    words.push(std::mem::take(&mut word));
                }
                in_word = false;
                op.push(c);
                while chars.peek().is_some_and(|n| matches!(n, '|' | '&' | '>')) {
                    op.extend(chars.next());
                }
                words.push(op);
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The command lines of `doc`'s `sh` blocks, continuation lines joined.
fn sh_lines(doc: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending: Option<(usize, String)> = None;
    for (n, line) in doc.lines().enumerate() {
        if let Some(fence) = line.strip_prefix("```") {
            in_sh = !in_sh && fence.trim() == "sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let (start, mut text) = pending.take().unwrap_or((n + 1, String::new()));
        match line.strip_suffix('\\') {
            Some(head) => {
                text.push_str(head);
                text.push(' ');
                pending = Some((start, text));
            }
            None => {
                text.push_str(line);
                out.push((start, text));
            }
        }
    }
    out
}

/// The herald invocations of one shell line: each pipeline or list element whose command,
/// after `VAR=value` assignments and `sudo`, is `herald` (or `cargo run … -- ARGS`).
fn invocations(line: &str) -> Vec<Vec<String>> {
    let words = shell_words(line);
    let mut out = Vec::new();
    let mut redirect = false;
    let mut segment: Vec<String> = Vec::new();
    let mut flush = |segment: &mut Vec<String>| {
        let words: Vec<String> = std::mem::take(segment)
            .into_iter()
            .skip_while(|w| (w.contains('=') && !w.starts_with('-')) || w == "sudo")
            .collect();
        match words.first().map(String::as_str) {
            Some("herald") => out.push(words),
            Some("cargo") if words.get(1).is_some_and(|w| w == "run") => {
                if let Some(i) = words.iter().position(|w| w == "--") {
                    let mut args = vec!["herald".to_owned()];
                    args.extend(words[i + 1..].iter().cloned());
                    out.push(args);
                }
            }
            _ => {}
        }
    };
    for w in words {
        if redirect {
            // The file name after `>`: not an argument.
            redirect = false;
            continue;
        }
        match w.as_str() {
            "|" | "||" | "&" | "&&" | ";" => flush(&mut segment),
            op if op.ends_with('>') || op == "<" || op.ends_with(">>") => redirect = true,
            _ => segment.push(w),
        }
    }
    flush(&mut segment);
    out
}

#[test]
fn the_shell_splitter_reads_the_readme_forms() {
    assert_eq!(
        shell_words(r#"A=1 herald call k v='"x y"' | jq . 2>/dev/null # note"#),
        [
            "A=1",
            "herald",
            "call",
            "k",
            "v=\"x y\"",
            "|",
            "jq",
            ".",
            "2>",
            "/dev/null"
        ]
    );
    assert_eq!(
        invocations("HERALD_TOKEN=… herald ls --json > out.json &"),
        [["herald", "ls", "--json"]]
    );
    assert_eq!(invocations("cargo run --release -- up"), [["herald", "up"]]);
    assert_eq!(
        invocations("sudo herald store backup /root/h-$(date +%F).redb"),
        [["herald", "store", "backup", "/root/h-$(date +%F).redb"]]
    );
    assert!(invocations("echo hello > herald-demo/hello.txt").is_empty());
}

/// The herald command lines of `doc`'s `sh` blocks that clap refuses, and how many there are.
fn refused_lines(name: &str, doc: &str) -> (usize, Vec<String>) {
    let mut bad = Vec::new();
    let mut seen = 0;
    for (n, line) in sh_lines(doc) {
        for args in invocations(&line) {
            seen += 1;
            if let Err(e) = Cli::try_parse_from(&args) {
                if matches!(
                    e.kind(),
                    clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
                ) {
                    continue;
                }
                let first = e.to_string();
                let first = first.lines().next().unwrap_or_default().to_owned();
                bad.push(format!("{name}:{n}: {}\n    {first}", args.join(" ")));
            }
        }
    }
    (seen, bad)
}

#[test]
fn every_herald_command_line_in_the_docs_parses() {
    let mut total = 0;
    for (name, doc) in DOCS
        .iter()
        .copied()
        .chain([("docs/operating.md", OPERATING)])
    {
        let (seen, bad) = refused_lines(name, doc);
        total += seen;
        assert!(
            bad.is_empty(),
            "{name} command lines clap refuses:\n{}",
            bad.join("\n")
        );
    }
    assert!(
        total >= 60,
        "only {total} herald command lines found in the docs"
    );
    assert!(refused_lines("docs/operating.md", OPERATING).0 >= 10);
}

/// Every page under docs/ is a reference page (linked from the README, and checked above) or
/// one of the others, named.
#[test]
fn every_reference_page_is_linked_from_the_readme() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = format!("docs/{}", entry.unwrap().file_name().to_string_lossy());
        if !name.ends_with(".md") || NOT_REFERENCE.contains(&name.as_str()) {
            continue;
        }
        assert!(
            DOCS.iter().any(|(n, _)| *n == name),
            "{name} is not in DOCS: add it there (or to NOT_REFERENCE)"
        );
        assert!(
            README.contains(&format!("]({name})")),
            "the README does not link {name}"
        );
    }
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of `text`'s headings (not of `#` lines inside fenced blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            let heading = line.trim_start_matches('#');
            if heading.starts_with(' ') {
                out.push(anchor(heading));
            }
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_reaches_its_file_and_heading() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages: Vec<String> = vec!["README.md".into(), "packaging/README.md".into()];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            pages.push(format!("docs/{name}"));
        }
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(root.join(page)).unwrap();
        let dir = root.join(page).parent().unwrap().to_owned();
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            checked += 1;
            let (file, hash) = match target.split_once('#') {
                Some((f, h)) => (f, Some(h)),
                None => (target, None),
            };
            let path = if file.is_empty() {
                root.join(page)
            } else {
                dir.join(file)
            };
            if !path.exists() {
                broken.push(format!("{page}: {target}: no such file"));
                continue;
            }
            if let Some(hash) = hash
                && path.extension().is_some_and(|e| e == "md")
                && !anchors(&std::fs::read_to_string(&path).unwrap()).contains(&hash.to_owned())
            {
                broken.push(format!("{page}: {target}: no such heading"));
            }
        }
    }
    assert!(checked >= 50, "only {checked} links checked");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The filter examples of docs/watch.md are the files the filter tests run
/// (`tests/it/filter.rs`), so what a reader copies is what was tested.
#[test]
fn the_docs_show_the_tested_filters_as_they_are() {
    let watch = DOCS.iter().find(|(n, _)| *n == "docs/watch.md").unwrap().1;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/filters");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "py") {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                watch.contains(&format!("```python\n{text}```")),
                "docs/watch.md does not show {} as it is",
                path.display()
            );
            seen += 1;
        }
    }
    assert!(seen >= 2, "no filter fixtures in {}", dir.display());
}
