//! Small text helpers shared by the planner: token estimates of text and JSON, cutting
//! a text to a token budget with a visible marker, and the word normalization the
//! fidelity check compares by.
//!
//! The estimate is the one the rest of ctxd uses (bytes divided by four, rounded up), so
//! a budget computed here agrees with the tally and the offline summarizer.

use serde_json::Value;

pub(super) use crate::summary::estimate_tokens;

/// Estimated tokens of a JSON value as it would be sent (its compact text).
pub(super) fn json_tokens(value: &Value) -> u64 {
    serde_json::to_string(value).map_or(0, |s| estimate_tokens(&s))
}

/// Largest char boundary at or below `i`.
pub(super) fn floor_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// `text` cut so that it and the marker fit in `max_tokens`, keeping the beginning, cut
/// at a line break when one is near. Returns the text and whether it was cut.
pub(super) fn cut_to_tokens(text: &str, max_tokens: u64, what: &str) -> (String, bool) {
    if estimate_tokens(text) <= max_tokens {
        return (text.to_owned(), false);
    }
    let marker = format!("\n[… {what} cut here to fit the post-compact budget …]");
    let budget_bytes = usize::try_from(max_tokens.saturating_mul(4))
        .unwrap_or(usize::MAX)
        .saturating_sub(marker.len());
    let mut end = floor_boundary(text, budget_bytes);
    // Prefer a whole line when a line break is close enough.
    if let Some(nl) = text[..end].rfind('\n')
        && end - nl < 200
    {
        end = nl;
    }
    let mut out = String::with_capacity(end + marker.len());
    out.push_str(&text[..end]);
    out.push_str(&marker);
    (out, true)
}

/// Shortens a text to at most `max_chars` characters for quoting, with an ellipsis.
pub(super) fn shorten(text: &str, max_chars: usize) -> String {
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max_chars {
        return one_line;
    }
    let mut out: String = one_line.chars().take(max_chars.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Words too common to say anything about content.
const STOPWORDS: &[&str] = &[
    "the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was",
    "one", "our", "out", "has", "him", "his", "how", "its", "may", "new", "now", "old", "see",
    "two", "who", "did", "get", "let", "put", "say", "she", "too", "use", "that", "this", "with",
    "from", "have", "what", "when", "will", "your", "into", "then", "them", "they", "there",
    "their", "these", "those", "would", "could", "should", "about", "which", "while", "also",
    "just", "like", "make", "some", "than", "only", "very", "been", "were", "here", "does", "done",
    "each", "more", "most", "much", "must", "need", "please", "thanks", "thank", "want", "okay",
    "yes", "sure", "again", "still", "after", "before", "because", "where", "why", "doesn", "don",
    "isn", "aren", "didn", "won", "can't", "it's", "i'm",
];

/// Lowercase content words of a text, lightly stemmed, without stopwords or words
/// shorter than three characters. Identifiers keep their inner `_`, `.`, `/` and `-`
/// so `parse_reply` or `src/app.py` stay one token.
pub(super) fn content_words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for raw in
        text.split(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '/' | '-' | '\'')))
    {
        let word = raw.trim_matches(|c: char| matches!(c, '.' | '-' | '/' | '\''));
        if word.chars().count() < 3 {
            continue;
        }
        let lower = word.to_lowercase();
        if STOPWORDS.contains(&lower.as_str()) {
            continue;
        }
        out.push(stem(&lower));
    }
    out
}

/// Strips one common English ending so "tests", "testing" and "tested" (and "retries"
/// and "retry") compare equal.
/// Both sides of every comparison go through it, so its crudeness cancels out.
fn stem(word: &str) -> String {
    if word.contains(['_', '.', '/']) {
        return word.to_owned();
    }
    if let Some(base) = word.strip_suffix("ies")
        && base.chars().count() >= 3
    {
        return format!("{base}y");
    }
    for suffix in ["ing", "ed", "es", "s"] {
        if let Some(base) = word.strip_suffix(suffix)
            && base.chars().count() >= 3
        {
            return base.to_owned();
        }
    }
    word.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_the_head_and_says_so() {
        let text = "line one\n".repeat(100);
        let (cut, was_cut) = cut_to_tokens(&text, 50, "file");
        assert!(was_cut);
        assert!(estimate_tokens(&cut) <= 50, "{}", estimate_tokens(&cut));
        assert!(cut.starts_with("line one\n"));
        assert!(cut.ends_with("[… file cut here to fit the post-compact budget …]"));
        let (same, was_cut) = cut_to_tokens("short", 50, "file");
        assert_eq!((same.as_str(), was_cut), ("short", false));
    }

    #[test]
    fn words_are_normalized() {
        assert_eq!(
            content_words("Please FIX the failing tests in src/app.py, then run parse_reply."),
            vec!["fix", "fail", "test", "src/app.py", "run", "parse_reply"]
        );
    }

    #[test]
    fn shorten_counts_characters() {
        assert_eq!(shorten("a  b\nc", 10), "a b c");
        assert_eq!(shorten("ééééé", 3), "éé…");
    }
}
