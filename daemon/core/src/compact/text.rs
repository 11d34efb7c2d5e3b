//! Small text helpers shared by the planner: token estimates of text and JSON, cutting
//! a text to a token budget with a visible marker, and the word normalization the
//! fidelity check compares by.
//!
//! The estimate is the one the rest of ctxd uses (bytes divided by four, rounded up), so
//! a budget computed here agrees with the tally and the offline summarizer.

use serde_json::Value;

pub(super) use crate::tally::estimate_tokens;

/// Estimated tokens of a JSON value as it would be sent (its compact text).
pub(super) fn json_tokens(value: &Value) -> u64 {
    serde_json::to_string(value).map_or(0, |s| estimate_tokens(&s))
}

/// `text` cut so that it and the marker fit in `max_tokens`, keeping the beginning, cut
/// at a line break when one is near. Returns the text and whether it was cut.
pub(super) fn cut_to_tokens(text: &str, max_tokens: u64, what: &str) -> (String, bool) {
    if estimate_tokens(text) <= max_tokens {
        return (text.to_owned(), false);
    }
    let marker = format!("\n[… {what} cut here to fit the post-compact budget …]");
    let budget_bytes = usize::try_from(max_tokens.saturating_mul(4)).unwrap_or(usize::MAX).saturating_sub(marker.len());
    let mut end = text.floor_char_boundary(budget_bytes);
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

/// Words too common to say anything about content, sorted (bytewise) so a lookup is a
/// binary search: the check looks up every word of every user message.
const STOPWORDS: &[&str] = &[
    "about", "after", "again", "all", "also", "and", "any", "are", "aren", "because", "been", "before", "but", "can",
    "can't", "could", "did", "didn", "does", "doesn", "don", "done", "each", "for", "from", "get", "had", "has",
    "have", "her", "here", "him", "his", "how", "i'm", "into", "isn", "it's", "its", "just", "let", "like", "make",
    "may", "more", "most", "much", "must", "need", "new", "not", "now", "okay", "old", "one", "only", "our", "out",
    "please", "put", "say", "see", "she", "should", "some", "still", "sure", "than", "thank", "thanks", "that", "the",
    "their", "them", "then", "there", "these", "they", "this", "those", "too", "two", "use", "very", "want", "was",
    "were", "what", "when", "where", "which", "while", "who", "why", "will", "with", "won", "would", "yes", "you",
    "your",
];

/// The stopwords packed as [`word_key`]s, in the same (sorted) order: a lookup compares
/// integers instead of calling `memcmp` for every probe.
const STOPWORD_KEYS: [u64; STOPWORDS.len()] = {
    let mut keys = [0u64; STOPWORDS.len()];
    let mut i = 0;
    while i < STOPWORDS.len() {
        keys[i] = match word_key(STOPWORDS[i]) {
            Some(key) => key,
            None => panic!("a stopword is longer than eight bytes"),
        };
        i += 1;
    }
    keys
};

/// A word of at most eight bytes as a big-endian integer, zero-padded: ordering the keys
/// orders the words bytewise, as `str` does.
const fn word_key(word: &str) -> Option<u64> {
    let bytes = word.as_bytes();
    if bytes.len() > 8 {
        return None;
    }
    let mut key = 0u64;
    let mut i = 0;
    while i < 8 {
        let byte = if i < bytes.len() { bytes[i] } else { 0 };
        key = (key << 8) | byte as u64;
        i += 1;
    }
    Some(key)
}

fn is_stopword(word: &str) -> bool {
    word_key(word).is_some_and(|key| STOPWORD_KEYS.binary_search(&key).is_ok())
}

/// Lowercase content words of a text, lightly stemmed, without stopwords or words
/// shorter than three characters. Identifiers keep their inner `_`, `.`, `/` and `-`
/// so `parse_reply` or `src/app.py` stay one token.
pub(super) fn content_words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lower = String::new();
    for raw in text.split(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '/' | '-' | '\''))) {
        let word = raw.trim_matches(|c: char| matches!(c, '.' | '-' | '/' | '\''));
        // Most words are ASCII: their length in bytes is their length in characters.
        let short = if word.is_ascii() { word.len() < 3 } else { word.chars().count() < 3 };
        if short {
            continue;
        }
        lower.clear();
        if word.is_ascii() {
            lower.extend(word.bytes().map(|b| char::from(b.to_ascii_lowercase())));
        } else {
            lower.push_str(&word.to_lowercase());
        }
        if is_stopword(&lower) {
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
    fn stopwords_are_sorted_for_the_binary_search() {
        assert!(STOPWORDS.windows(2).all(|w| w[0] < w[1]), "STOPWORDS must stay sorted and unique");
        assert!(STOPWORD_KEYS.windows(2).all(|k| k[0] < k[1]));
        assert!(is_stopword("the") && is_stopword("i'm") && is_stopword("you"));
        assert!(!is_stopword("retry") && !is_stopword("th") && !is_stopword("thee") && !is_stopword("abouts"));
        assert_eq!(content_words("THE Retries ÉTÉ été"), vec!["retry", "été", "été"]);
    }

    #[test]
    fn shorten_counts_characters() {
        assert_eq!(shorten("a  b\nc", 10), "a b c");
        assert_eq!(shorten("ééééé", 3), "éé…");
    }
}
