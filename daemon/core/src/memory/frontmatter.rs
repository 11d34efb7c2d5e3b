//! The YAML front matter of a rule file, read only as far as the loader needs: the
//! `paths:` globs that make a rule conditional, and where the body starts.
//!
//! A full YAML parser would be a large dependency for one key. The forms people write
//! for `paths:` are few: a single string, a comma-separated string, a flow list
//! `[a, b]` or a block list of `- a` lines. Those are handled; other keys are ignored.

/// A rule file split into its front matter facts and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontMatter<'a> {
    /// Text after the front matter (all of it when there is none).
    pub body: &'a str,
    /// `None` when there is no `paths:` key; `Some(vec![])` when it is present but empty.
    pub paths: Option<Vec<String>>,
    /// The block was opened with `---` and never closed.
    pub unclosed: bool,
}

/// Splits `text` into front matter and body.
pub fn parse(text: &str) -> FrontMatter<'_> {
    let none = FrontMatter { body: text, paths: None, unclosed: false };
    let Some(first_end) = text.find('\n') else {
        return none;
    };
    if text[..first_end].trim_end() != "---" {
        return none;
    }
    let mut block = Vec::new();
    let mut offset = first_end + 1;
    while offset < text.len() {
        let line_end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
        let line = text[offset..line_end].trim_end_matches('\r');
        let next = (line_end + 1).min(text.len());
        if line.trim_end() == "---" || line.trim_end() == "..." {
            return FrontMatter { body: &text[next..], paths: paths_of(&block), unclosed: false };
        }
        block.push(line);
        offset = next;
    }
    FrontMatter { body: text, paths: None, unclosed: true }
}

/// The `paths:` value of a front matter block, as a list of globs.
fn paths_of(lines: &[&str]) -> Option<Vec<String>> {
    let start = lines.iter().position(|line| line.starts_with("paths:"))?;
    let value = strip_comment(&lines[start]["paths:".len()..]).trim();
    let mut out = Vec::new();
    if value.is_empty() {
        // Block list: the `- item` lines that follow, until the next top-level key.
        for line in &lines[start + 1..] {
            let trimmed = line.trim();
            if trimmed.is_empty() {
                continue;
            }
            let Some(item) = trimmed.strip_prefix('-') else {
                if line.starts_with(char::is_whitespace) {
                    continue;
                }
                break;
            };
            push_items(strip_comment(item).trim(), &mut out);
        }
    } else if let Some(inner) = value.strip_prefix('[') {
        let inner = inner.strip_suffix(']').unwrap_or(inner);
        push_items(inner, &mut out);
    } else {
        push_items(value, &mut out);
    }
    Some(out)
}

/// Splits at commas outside braces and quotes, so `{a,b}` stays one glob while
/// `a, b` becomes two, and adds the unquoted, non-empty pieces.
fn push_items(value: &str, out: &mut Vec<String>) {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut piece = String::new();
    for c in value.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '"' | '\'') => quote = Some(c),
            (None, '{' | '[') => depth += 1,
            (None, '}' | ']') => depth = depth.saturating_sub(1),
            (None, ',') if depth == 0 => {
                push_one(&piece, out);
                piece.clear();
                continue;
            }
            _ => {}
        }
        piece.push(c);
    }
    push_one(&piece, out);
}

fn push_one(piece: &str, out: &mut Vec<String>) {
    let piece = unquote(piece.trim()).trim();
    if !piece.is_empty() {
        out.push(piece.to_owned());
    }
}

fn unquote(s: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|rest| rest.strip_suffix(q)) {
            return inner;
        }
    }
    s
}

/// Drops a YAML comment: `#` at the start or after whitespace, outside quotes.
fn strip_comment(s: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut prev_space = true;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') if prev_space => return &s[..i],
            _ => {}
        }
        prev_space = c.is_whitespace();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(text: &str) -> Option<Vec<String>> {
        parse(text).paths
    }

    #[test]
    fn no_front_matter_keeps_whole_text() {
        let fm = parse("# Rule\n---\nbody\n");
        assert_eq!(fm.body, "# Rule\n---\nbody\n");
        assert_eq!(fm.paths, None);
        assert!(!fm.unclosed);
    }

    #[test]
    fn single_string_and_body() {
        let fm = parse("---\npaths: \"src/**/*.ts\"\n---\nUse strict mode.\n");
        assert_eq!(fm.paths, Some(vec!["src/**/*.ts".to_owned()]));
        assert_eq!(fm.body, "Use strict mode.\n");
    }

    #[test]
    fn block_list_with_other_keys_and_comments() {
        let text =
            "---\ndescription: api\npaths:\n  - \"src/api/**\"   # the api\n  - 'lib/*.rs'\n\nother: x\n---\nbody";
        assert_eq!(paths(text), Some(vec!["src/api/**".to_owned(), "lib/*.rs".to_owned()]));
        assert_eq!(parse(text).body, "body");
    }

    #[test]
    fn flow_list_and_comma_string_keep_braces_whole() {
        assert_eq!(
            paths("---\npaths: [\"src/*.{ts,tsx}\", docs/*.md]\n---\n"),
            Some(vec!["src/*.{ts,tsx}".to_owned(), "docs/*.md".to_owned()])
        );
        assert_eq!(paths("---\npaths: a/*.rs, b/**\n---\n"), Some(vec!["a/*.rs".to_owned(), "b/**".to_owned()]));
    }

    #[test]
    fn empty_paths_and_missing_paths_differ() {
        assert_eq!(paths("---\npaths:\n---\nx"), Some(vec![]));
        assert_eq!(paths("---\ntitle: x\n---\nx"), None);
    }

    #[test]
    fn unclosed_block_is_reported_and_kept_as_text() {
        let fm = parse("---\npaths: a\nno end\n");
        assert!(fm.unclosed);
        assert_eq!(fm.paths, None);
        assert_eq!(fm.body, "---\npaths: a\nno end\n");
    }

    #[test]
    fn crlf_line_endings() {
        let fm = parse("---\r\npaths: src/**\r\n---\r\nbody\r\n");
        assert_eq!(fm.paths, Some(vec!["src/**".to_owned()]));
        assert_eq!(fm.body, "body\r\n");
    }
}
