//! File-name globs for `file-events://watch/...?glob=PATTERN`: `*`, `?`, `[abc]`, `[a-z]`,
//! `[!abc]` and `{a,b}` alternatives, matched against one file name (never a path).
//!
//! Hand-written rather than `globset`: a pattern here only ever sees a single name, so the
//! whole of what is needed is about a hundred lines, where globset would bring regex-automata,
//! aho-corasick and bstr into a binary that has no other use for them. Matching is the
//! classic iterative star-backtracking walk, linear in practice and never exponential.

/// Longest pattern accepted, in bytes.
const MAX_PATTERN: usize = 256;
/// Most alternatives `{a,b}` groups may expand to.
const MAX_ALTERNATIVES: usize = 64;

/// A compiled glob.
#[derive(Debug, Clone, PartialEq)]
pub struct Glob {
    source: String,
    alternatives: Vec<Vec<Token>>,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Char(char),
    Any,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

impl Glob {
    /// Compiles `pattern`; the error says what is wrong with it.
    pub fn new(pattern: &str) -> Result<Glob, String> {
        if pattern.is_empty() {
            return Err("glob must not be empty; e.g. glob=*.json".into());
        }
        if pattern.len() > MAX_PATTERN {
            return Err(format!(
                "glob is {} bytes; globs are at most {MAX_PATTERN} bytes",
                pattern.len()
            ));
        }
        if pattern.contains('/') {
            return Err(format!(
                "glob {pattern} contains '/'; a glob matches file names only (use recursive=true for subdirectories)"
            ));
        }
        let alternatives = expand_braces(pattern)?
            .iter()
            .map(|a| tokens(a, pattern))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Glob {
            source: pattern.to_owned(),
            alternatives,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether `name` (one file name) matches.
    pub fn matches(&self, name: &str) -> bool {
        let name: Vec<char> = name.chars().collect();
        self.alternatives.iter().any(|t| match_tokens(t, &name))
    }
}

/// Expands `{a,b}` groups (nested too) into plain alternatives.
fn expand_braces(p: &str) -> Result<Vec<String>, String> {
    let chars: Vec<char> = p.chars().collect();
    // Find the first top-level '{' outside a class, and its matching '}'.
    let mut i = 0;
    let mut in_class = false;
    let mut open = None;
    while i < chars.len() {
        match chars[i] {
            '[' if !in_class => in_class = true,
            ']' if in_class => in_class = false,
            '{' if !in_class => {
                open = Some(i);
                break;
            }
            '}' if !in_class => return Err(format!("glob {p} has a '}}' without '{{'")),
            _ => {}
        }
        i += 1;
    }
    let Some(open) = open else {
        return Ok(vec![p.to_owned()]);
    };
    let mut depth = 0;
    let mut parts = Vec::new();
    let mut start = open + 1;
    let mut close = None;
    for (j, &c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    parts.push(chars[start..j].iter().collect::<String>());
                    close = Some(j);
                    break;
                }
            }
            ',' if depth == 1 => {
                parts.push(chars[start..j].iter().collect::<String>());
                start = j + 1;
            }
            _ => {}
        }
    }
    let Some(close) = close else {
        return Err(format!("glob {p} has a '{{' without '}}'"));
    };
    let head: String = chars[..open].iter().collect();
    let tail: String = chars[close + 1..].iter().collect();
    let mut out = Vec::new();
    for part in parts {
        for expanded in expand_braces(&format!("{head}{part}{tail}"))? {
            out.push(expanded);
            if out.len() > MAX_ALTERNATIVES {
                return Err(format!(
                    "glob {p} expands to more than {MAX_ALTERNATIVES} alternatives"
                ));
            }
        }
    }
    Ok(out)
}

fn tokens(p: &str, whole: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = p.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => {
                if out.last() != Some(&Token::Star) {
                    out.push(Token::Star);
                }
            }
            '?' => out.push(Token::Any),
            '[' => {
                let mut j = i + 1;
                let negated = matches!(chars.get(j), Some('!') | Some('^'));
                if negated {
                    j += 1;
                }
                let mut ranges = Vec::new();
                let mut first = true;
                loop {
                    let Some(&c) = chars.get(j) else {
                        return Err(format!("glob {whole} has a '[' without ']'"));
                    };
                    if c == ']' && !first {
                        break;
                    }
                    first = false;
                    if chars.get(j + 1) == Some(&'-') && chars.get(j + 2).is_some_and(|&e| e != ']')
                    {
                        let hi = chars[j + 2];
                        if hi < c {
                            return Err(format!("glob {whole} has a reversed range {c}-{hi}"));
                        }
                        ranges.push((c, hi));
                        j += 3;
                    } else {
                        ranges.push((c, c));
                        j += 1;
                    }
                }
                out.push(Token::Class { negated, ranges });
                i = j;
            }
            '\\' => {
                let Some(&c) = chars.get(i + 1) else {
                    return Err(format!("glob {whole} ends with a lone '\\'"));
                };
                out.push(Token::Char(c));
                i += 1;
            }
            c => out.push(Token::Char(c)),
        }
        i += 1;
    }
    Ok(out)
}

fn token_matches(t: &Token, c: char) -> bool {
    match t {
        Token::Char(x) => *x == c,
        Token::Any => true,
        Token::Star => true,
        Token::Class { negated, ranges } => {
            ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
        }
    }
}

/// Iterative matcher: on a mismatch, resume after the last `*`, which then eats one more
/// character. Each star is retried at most once per name position, so it is O(n·m) at worst.
fn match_tokens(p: &[Token], s: &[char]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == Token::Star {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && token_matches(&p[pi], s[si]) {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|t| *t == Token::Star)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        Glob::new(p).unwrap().matches(s)
    }

    #[test]
    fn the_usual_shapes() {
        assert!(m("*.json", "a.json"));
        assert!(m("*.json", ".json"));
        assert!(!m("*.json", "a.json.bak"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "ac"));
        assert!(m("[ab]*", "bcd"));
        assert!(!m("[!ab]*", "bcd"));
        assert!(m("[a-c]x", "bx"));
        assert!(m("*.{json,yaml}", "x.yaml"));
        assert!(!m("*.{json,yaml}", "x.toml"));
        assert!(m("{a,b{c,d}}", "bd"));
        assert!(m("\\*", "*"));
        assert!(!m("\\*", "x"));
        assert!(m("[]]", "]"));
        assert!(m("*", ""));
        assert!(m("**a", "bba"));
    }

    #[test]
    fn bad_patterns_say_what_is_wrong() {
        for (p, needle) in [
            ("", "must not be empty"),
            ("[ab", "without ']'"),
            ("{a,b", "without '}'"),
            ("a}", "without '{'"),
            ("a/b", "file names only"),
            ("[z-a]", "reversed range"),
            ("a\\", "lone"),
        ] {
            let e = Glob::new(p).unwrap_err();
            assert!(e.contains(needle), "{p}: {e}");
        }
        let many = "{a,b}".repeat(7);
        assert!(Glob::new(&many).unwrap_err().contains("alternatives"));
    }

    /// The reference: plain recursion over the tokens, exponential but obviously right.
    fn reference(p: &[Token], s: &[char]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some(Token::Star) => (0..=s.len()).any(|k| reference(&p[1..], &s[k..])),
            Some(t) => !s.is_empty() && token_matches(t, s[0]) && reference(&p[1..], &s[1..]),
        }
    }

    /// Property test: on random patterns and names over a small alphabet, the iterative
    /// matcher agrees with the reference; and a name always matches a pattern made from it
    /// by replacing characters with `?` and runs with `*`.
    #[test]
    fn matcher_agrees_with_the_reference_on_random_input() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let alphabet = ['a', 'b', '.', 'é'];
        let pieces = ["a", "b", ".", "é", "*", "?", "[ab]", "[!a]", "*a*"];
        for _ in 0..20_000 {
            let plen = (next() % 6) as usize;
            let pat: String = (0..plen)
                .map(|_| pieces[(next() % pieces.len() as u64) as usize])
                .collect();
            let slen = (next() % 7) as usize;
            let name: String = (0..slen)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            if pat.is_empty() {
                continue;
            }
            let g = Glob::new(&pat).unwrap();
            let chars: Vec<char> = name.chars().collect();
            assert_eq!(
                g.matches(&name),
                reference(&g.alternatives[0], &chars),
                "pattern {pat:?} name {name:?}"
            );
            // A pattern derived from the name matches it.
            let derived: String = chars
                .iter()
                .map(|&c| match next() % 4 {
                    0 => "?".to_string(),
                    1 => "*".to_string(),
                    _ if c == '.' || c.is_alphanumeric() => c.to_string(),
                    _ => "?".to_string(),
                })
                .collect();
            if !derived.is_empty() {
                assert!(m(&derived, &name), "{derived:?} should match {name:?}");
            }
        }
    }
}
