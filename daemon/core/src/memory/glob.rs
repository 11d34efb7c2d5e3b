//! Matching of rule `paths:` globs against a file the agent read.
//!
//! Small and dependency-free on purpose: only `*`, `**`, `?`, `[...]` and `{a,b}` are
//! needed. Patterns are read the way `.gitignore` lines are, because that is what users
//! of these rules expect: a pattern without a `/` matches a name at any depth (`*.md`
//! matches `docs/a.md`), and a pattern that matches a folder matches every file in it
//! (`src/api` matches `src/api/x.ts`). A trailing `/` restricts a pattern to folders.

/// Alternatives one pattern may expand to; bounds the work a hostile `{...}` nest can
/// cause.
const MAX_ALTERNATIVES: usize = 256;

/// Whether `pattern` matches `rel`, a `/`-separated path relative to the project root.
pub fn matches(pattern: &str, rel: &str) -> bool {
    let path: Vec<&str> = rel.split('/').filter(|s| !s.is_empty() && *s != ".").collect();
    if path.is_empty() || path.first() == Some(&"..") {
        return false;
    }
    let mut pattern = pattern.trim();
    while let Some(rest) = pattern.strip_prefix("./") {
        pattern = rest;
    }
    let rooted = pattern.starts_with('/');
    let pattern = pattern.trim_start_matches('/');
    let dir_only = pattern.ends_with('/');
    let pattern = pattern.trim_end_matches('/');
    if pattern.is_empty() {
        return false;
    }
    let mut alternatives = Vec::new();
    expand_braces(pattern, &mut alternatives);
    alternatives.iter().any(|alt| {
        let mut segments: Vec<&str> = alt.split('/').filter(|s| !s.is_empty()).collect();
        if !rooted && !alt.contains('/') {
            segments.insert(0, "**");
        }
        matches_segments(&segments, &path, dir_only)
    })
}

/// Segment-wise match where `**` spans any number of folders. True when the pattern
/// matches the whole path (unless `dir_only`) or one of its parent folders.
fn matches_segments(pattern: &[&str], path: &[&str], dir_only: bool) -> bool {
    // reach[j]: the pattern so far matches the first j path segments.
    let mut reach = vec![false; path.len() + 1];
    reach[0] = true;
    for seg in pattern {
        let mut next = vec![false; path.len() + 1];
        for j in 0..=path.len() {
            next[j] = if *seg == "**" {
                reach[j] || (j > 0 && next[j - 1])
            } else {
                j > 0 && reach[j - 1] && matches_segment(seg, path[j - 1])
            };
        }
        reach = next;
    }
    let whole = !dir_only && reach[path.len()];
    let folder = reach[1..path.len()].iter().any(|&r| r);
    whole || folder
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    AnyChar,
    Star,
    Class { negated: bool, ranges: Vec<(char, char)> },
}

fn tokenize(segment: &str) -> Vec<Token> {
    let chars: Vec<char> = segment.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' if i + 1 < chars.len() => {
                tokens.push(Token::Literal(chars[i + 1]));
                i += 2;
                continue;
            }
            '*' => {
                // `a**b` inside a segment means the same as `a*b`.
                if tokens.last() != Some(&Token::Star) {
                    tokens.push(Token::Star);
                }
            }
            '?' => tokens.push(Token::AnyChar),
            '[' => {
                if let Some((class, end)) = parse_class(&chars, i) {
                    tokens.push(class);
                    i = end + 1;
                    continue;
                }
                tokens.push(Token::Literal('['));
            }
            c => tokens.push(Token::Literal(c)),
        }
        i += 1;
    }
    tokens
}

/// A `[...]` class starting at `start`; returns it and the index of its `]`. An
/// unclosed `[` is a literal.
fn parse_class(chars: &[char], start: usize) -> Option<(Token, usize)> {
    let mut i = start + 1;
    let negated = matches!(chars.get(i), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let first = i;
    while i < chars.len() {
        let c = chars[i];
        // A `]` right after the opening is a member, not the end.
        if c == ']' && i > first {
            return Some((Token::Class { negated, ranges }, i));
        }
        if chars.get(i + 1) == Some(&'-') && chars.get(i + 2).is_some_and(|&e| e != ']') {
            ranges.push((c, chars[i + 2]));
            i += 3;
        } else {
            ranges.push((c, c));
            i += 1;
        }
    }
    None
}

fn matches_segment(pattern: &str, name: &str) -> bool {
    let tokens = tokenize(pattern);
    let name: Vec<char> = name.chars().collect();
    let one = |token: &Token, c: char| match token {
        Token::Literal(l) => *l == c,
        Token::AnyChar => true,
        Token::Class { negated, ranges } => ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated,
        Token::Star => false,
    };
    // Greedy match with backtracking to the last star: linear in practice.
    let (mut t, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if t < tokens.len() && tokens[t] == Token::Star {
            star = Some((t, n));
            t += 1;
        } else if t < tokens.len() && one(&tokens[t], name[n]) {
            t += 1;
            n += 1;
        } else if let Some((star_t, star_n)) = star {
            t = star_t + 1;
            n = star_n + 1;
            star = Some((star_t, star_n + 1));
        } else {
            return false;
        }
    }
    tokens[t..].iter().all(|token| *token == Token::Star)
}

/// Expands `{a,b}` groups (nested ones too) into separate patterns.
fn expand_braces(pattern: &str, out: &mut Vec<String>) {
    if out.len() >= MAX_ALTERNATIVES {
        return;
    }
    let bytes = pattern.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1,
            b'{' => {
                // A group without a comma (`{a}`) is literal text, as in shells.
                if let Some((close, commas)) = brace_group(bytes, i)
                    && !commas.is_empty()
                {
                    let prefix = &pattern[..i];
                    let suffix = &pattern[close + 1..];
                    let mut from = i + 1;
                    for cut in commas.into_iter().chain(std::iter::once(close)) {
                        let alt = &pattern[from..cut];
                        expand_braces(&format!("{prefix}{alt}{suffix}"), out);
                        from = cut + 1;
                    }
                    return;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out.push(pattern.to_owned());
}

/// The matching `}` of the `{` at `open` and the commas directly inside the group.
fn brace_group(bytes: &[u8], open: usize) -> Option<(usize, Vec<usize>)> {
    let mut depth = 0usize;
    let mut commas = Vec::new();
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1,
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some((i, commas));
                }
            }
            b',' if depth == 1 => commas.push(i),
            _ => {}
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn double_star_spans_folders() {
        assert!(matches("src/**/*.ts", "src/a.ts"));
        assert!(matches("src/**/*.ts", "src/x/y/a.ts"));
        assert!(!matches("src/**/*.ts", "lib/a.ts"));
        assert!(!matches("src/**/*.ts", "src/a.tsx"));
    }

    #[test]
    fn star_stays_in_one_segment() {
        assert!(matches("src/*.rs", "src/main.rs"));
        assert!(!matches("src/*.rs", "src/bin/main.rs"));
    }

    #[test]
    fn pattern_without_slash_matches_at_any_depth() {
        assert!(matches("*.md", "README.md"));
        assert!(matches("*.md", "docs/guide/a.md"));
        assert!(!matches("/*.md", "docs/a.md"));
        assert!(matches("/*.md", "a.md"));
    }

    #[test]
    fn folder_pattern_matches_files_inside() {
        assert!(matches("src/api", "src/api/handlers/x.ts"));
        assert!(matches("src/api/", "src/api/x.ts"));
        assert!(!matches("src/api/", "src/api"));
        assert!(!matches("src/api", "src/apis/x.ts"));
    }

    #[test]
    fn question_mark_classes_and_braces() {
        assert!(matches("v?.txt", "v1.txt"));
        assert!(!matches("v?.txt", "v10.txt"));
        assert!(matches("log[0-9].txt", "log7.txt"));
        assert!(!matches("log[!0-9].txt", "log7.txt"));
        assert!(matches("{src,lib}/**/*.{ts,tsx}", "lib/ui/button.tsx"));
        assert!(!matches("{src,lib}/**/*.{ts,tsx}", "test/a.ts"));
        assert!(matches("a/{b,{c,d}}/e", "a/d/e"));
    }

    #[test]
    fn leading_dot_slash_and_outside_paths() {
        assert!(matches("./src/*.rs", "src/a.rs"));
        assert!(!matches("**", "../other/a.rs"));
        assert!(matches("**", "a.rs"));
        assert!(!matches("", "a.rs"));
    }

    #[test]
    fn star_backtracks() {
        assert!(matches("*a*b", "xaxab"));
        assert!(!matches("*a*b", "xaxa"));
    }
}
