//! What Python code's syntax says before it runs, read with Monty's own parser: whether an
//! `on_event` filter can give a notice at all (its value is its last expression, so code that
//! ends in a statement has none), and code mode's top-level statements, one at a time.
//!
//! Code that does not parse gets no answer here: running it reports the `SyntaxError`, with
//! its line.

use ruff_python_ast::visitor::{Visitor, walk_expr};
use ruff_python_ast::{Expr, Stmt};
use ruff_text_size::Ranged;

/// Why `code` can never give a notice: it ends in a statement, which has no value, and
/// nothing in it prints. `None` when it can, or when it does not parse.
pub fn never_notices(code: &str) -> Option<String> {
    let module = ruff_python_parser::parse_module(code).ok()?.into_syntax();
    let last = module.body.last()?;
    if matches!(last, Stmt::Expr(_)) || prints(&module.body) {
        return None;
    }
    let line = line_of(code, last.range().start().to_usize());
    let (what, instead) = match last {
        Stmt::If(_) => (
            format!("an `if` statement (line {line})"),
            "write the choice as one expression, `x if cond else None`, or end with an expression"
                .to_owned(),
        ),
        Stmt::For(_) | Stmt::While(_) => (
            format!("a loop (line {line})"),
            "collect what to say in a list and end with it, e.g. `\"; \".join(lines) or None`"
                .to_owned(),
        ),
        Stmt::Assign(a) => {
            let end = match a.targets.as_slice() {
                [Expr::Name(n)] => format!("end with `{}` on a line of its own", n.id.as_str()),
                _ => "end with the value on a line of its own".to_owned(),
            };
            (format!("an assignment (line {line})"), end)
        }
        Stmt::AugAssign(_) | Stmt::AnnAssign(_) => (
            format!("an assignment (line {line})"),
            "end with the value on a line of its own".to_owned(),
        ),
        Stmt::FunctionDef(f) => (
            format!("a `def` (line {line})"),
            format!("end by calling it: `{}(event)`", f.name.id.as_str()),
        ),
        _ => (
            format!("a statement (line {line})"),
            "end with an expression".to_owned(),
        ),
    };
    Some(format!(
        "on_event gives no notice for any event: the filter's value is its last expression, \
         and it ends with {what}, which has no value; {instead} (or print() the notice)"
    ))
}

/// A top-level statement of some code: its text with blank lines in front, so that the
/// line numbers Monty reports in it are the lines of the whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The line it starts on, 1-based.
    pub line: u32,
    pub code: String,
}

/// `code`'s top-level statements in order (statements sharing a line, `a = 1; a`, stay
/// together). `None` when it does not parse.
pub fn statements(code: &str) -> Option<Vec<Statement>> {
    let module = ruff_python_parser::parse_module(code).ok()?.into_syntax();
    let mut out: Vec<(usize, usize)> = Vec::new();
    for stmt in &module.body {
        let (start, end) = (
            stmt.range().start().to_usize(),
            stmt.range().end().to_usize(),
        );
        match out.last_mut() {
            Some(prev) if !code[prev.1..start].contains('\n') => prev.1 = end,
            _ => out.push((start, end)),
        }
    }
    Some(
        out.into_iter()
            .map(|(start, end)| {
                let line = line_of(code, start);
                let mut text = "\n".repeat(line as usize - 1);
                text.push_str(&code[start..end]);
                text.push('\n');
                Statement { line, code: text }
            })
            .collect(),
    )
}

/// The 1-based line of byte `offset` in `code`.
fn line_of(code: &str, offset: usize) -> u32 {
    code[..offset].matches('\n').count() as u32 + 1
}

/// Whether `body` names `print` anywhere (a call, or the function passed around).
fn prints(body: &[Stmt]) -> bool {
    struct Names(bool);
    impl<'a> Visitor<'a> for Names {
        fn visit_expr(&mut self, expr: &'a Expr) {
            if let Expr::Name(n) = expr
                && n.id.as_str() == "print"
            {
                self.0 = true;
            }
            walk_expr(self, expr);
        }
    }
    let mut names = Names(false);
    names.visit_body(body);
    names.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_that_ends_in_a_statement_and_prints_nothing_never_notices() {
        let why = never_notices(
            "t = event['type']\nif t == 'ADDED':\n    f'added {event[\"key\"]}'\nelse:\n    None\n",
        )
        .expect("an if statement has no value");
        assert!(
            why.contains("the filter's value is its last expression")
                && why.contains("an `if` statement (line 2)")
                && why.contains("`x if cond else None`"),
            "{why}"
        );
        let why = never_notices("msg = f\"{event['key']} changed\"\n").unwrap();
        assert!(why.contains("end with `msg` on a line of its own"), "{why}");
        let why = never_notices("def fmt(e):\n    return e['key']\n").unwrap();
        assert!(why.contains("`fmt(event)`"), "{why}");
        let why = never_notices("for c in event['changed']:\n    c\n").unwrap();
        assert!(why.contains("a loop (line 1)"), "{why}");
        assert!(never_notices("import json\n").is_some());
    }

    #[test]
    fn code_that_ends_in_an_expression_or_prints_may_notice() {
        for code in [
            "event['key']",
            "x = 1\nf'{x}' if event['type'] == 'ADDED' else None\n",
            "None",
            "if event['type'] == 'ADDED':\n    print('added', event['key'])\n",
            "def out(s):\n    print(s)\nfor k in event['changed']:\n    out(k)\n",
            // Does not parse: the run says why, with its line.
            "x = (\n",
            "",
        ] {
            assert_eq!(never_notices(code), None, "{code:?}");
        }
    }

    #[test]
    fn statements_keep_their_lines() {
        let code = "x = 1\n\n# a comment\nif x:\n    y = 2\nelse:\n    y = 3\ny\n@dec\ndef f():\n    pass\na = 1; a\n";
        let s = statements(code).unwrap();
        let starts: Vec<u32> = s.iter().map(|s| s.line).collect();
        assert_eq!(starts, [1, 4, 8, 9, 12]);
        assert_eq!(s[1].code, "\n\n\nif x:\n    y = 2\nelse:\n    y = 3\n");
        assert_eq!(s[3].code.trim_start(), "@dec\ndef f():\n    pass\n");
        assert_eq!(s[4].code.trim_start(), "a = 1; a\n");
        assert_eq!(statements("x = (\n"), None);
        assert_eq!(statements(""), Some(vec![]));
    }
}
