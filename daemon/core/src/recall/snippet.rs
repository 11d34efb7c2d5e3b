//! The piece of a record's text shown with a hit: bounded in characters, around the
//! place where the most of the query's words stand close together, so a model can tell
//! from the hit alone whether the record is the one it wants before reading it whole.
//!
//! Words are matched as the index splits them (runs of letters and digits, compared
//! without case), so what the search matched is what the snippet shows.

/// The words of a query as the index compares them: lowercase runs of letters and
/// digits. Query operators (`AND`, `OR`, `NOT` in capitals) and field names before a
/// `:` are not words of the text.
pub fn query_terms(query: &str) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    for (start, word) in words(query) {
        if matches!(word, "AND" | "OR" | "NOT") || query[start + word.len()..].starts_with(':') {
            continue;
        }
        let lower = word.to_lowercase();
        if !terms.contains(&lower) {
            terms.push(lower);
        }
    }
    terms
}

/// Matching words looked at per snippet.
const MAX_HITS: usize = 4096;

/// At most `max_chars` characters of `text` (plus an ellipsis at a cut end), taken around
/// the densest run of `terms`, whitespace runs shown as one space. Without a match, the
/// start of the text.
pub fn snippet(text: &str, terms: &[String], max_chars: usize) -> String {
    let max_chars = max_chars.max(1);
    // (char position, term) of each matching word, in order.
    let mut hits: Vec<(usize, usize)> = Vec::new();
    let mut chars_before = 0;
    let mut last_byte = 0;
    for (start, word) in words(text) {
        chars_before += text[last_byte..start].chars().count();
        last_byte = start;
        if let Some(t) = terms.iter().position(|t| same_word(word, t)) {
            hits.push((chars_before, t));
            // Enough to place the window; a record of one word repeated stays cheap.
            if hits.len() == MAX_HITS {
                break;
            }
        }
    }
    let start = match best_window(&hits, max_chars * 3 / 4) {
        // Some context before the first matching word, the rest after it.
        Some((first, span)) => first.saturating_sub(max_chars.saturating_sub(span) / 3),
        None => 0,
    };
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    let mut taken = 0;
    let mut space = false;
    let mut cut = false;
    let mut rest = text.chars().skip(start).peekable();
    while taken < max_chars {
        let Some(c) = rest.next() else { break };
        if c.is_whitespace() {
            space = true;
            continue;
        }
        if space && !out.is_empty() && !out.ends_with('…') {
            if taken + 1 == max_chars {
                cut = true;
                break;
            }
            out.push(' ');
            taken += 1;
        }
        space = false;
        out.push(c);
        taken += 1;
    }
    if cut || rest.any(|c| !c.is_whitespace()) {
        out.push('…');
    }
    out
}

/// The window of at most `width` characters holding the most distinct terms (the
/// earliest such): its first hit's position and its span.
fn best_window(hits: &[(usize, usize)], width: usize) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize, usize)> = None; // (distinct, first, span)
    let mut lo = 0;
    for hi in 0..hits.len() {
        while hits[hi].0 - hits[lo].0 > width {
            lo += 1;
        }
        let mut distinct: Vec<usize> = hits[lo..=hi].iter().map(|h| h.1).collect();
        distinct.sort_unstable();
        distinct.dedup();
        if best.is_none_or(|b| distinct.len() > b.0) {
            best = Some((distinct.len(), hits[lo].0, hits[hi].0 - hits[lo].0));
        }
    }
    best.map(|(_, first, span)| (first, span))
}

/// Runs of letters and digits with their byte offsets.
fn words(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut rest = text.char_indices().peekable();
    std::iter::from_fn(move || {
        let (start, _) = rest.by_ref().find(|(_, c)| c.is_alphanumeric())?;
        let mut end = text.len();
        while let Some(&(i, c)) = rest.peek() {
            if !c.is_alphanumeric() {
                end = i;
                break;
            }
            rest.next();
        }
        Some((start, &text[start..end]))
    })
}

fn same_word(word: &str, lower_term: &str) -> bool {
    word.chars().flat_map(char::to_lowercase).eq(lower_term.chars())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_are_the_words_the_index_compares() {
        assert_eq!(query_terms("Cargo BUILD failed"), ["cargo", "build", "failed"]);
        assert_eq!(query_terms("\"E0425\" AND role:user cannot-find"), ["e0425", "user", "cannot", "find"]);
        assert_eq!(query_terms("x x X"), ["x"]);
        assert!(query_terms("  :: ").is_empty());
    }

    #[test]
    fn the_snippet_is_bounded_and_stands_where_the_terms_meet() {
        let filler = "lorem ipsum ".repeat(100);
        let text = format!("{filler}the PURPLE octopus\n\n  sleeps at noon {filler}");
        let terms = query_terms("purple octopus sleeps");
        let s = snippet(&text, &terms, 80);
        assert!(s.contains("the PURPLE octopus sleeps at noon"), "{s}");
        assert!(s.starts_with('…') && s.ends_with('…'), "{s}");
        assert!(s.chars().count() <= 82, "{}", s.chars().count());
        // The densest place wins over an earlier lone word.
        let text = format!("purple {filler} purple octopus {filler}");
        let s = snippet(&text, &terms, 60);
        assert!(s.contains("purple octopus"), "{s}");
    }

    #[test]
    fn no_match_gives_the_start_and_short_text_is_whole() {
        assert_eq!(snippet("short text", &["zzz".into()], 300), "short text");
        assert_eq!(snippet("abcdef", &[], 3), "abc…");
        assert_eq!(snippet("ab c", &[], 3), "ab…", "a space is never the last character shown");
        assert_eq!(snippet("", &["a".into()], 10), "");
        // Characters, not bytes: multi-byte text is never cut inside a character.
        let s = snippet(&"é".repeat(50), &[], 10);
        assert_eq!(s, format!("{}…", "é".repeat(10)));
    }
}
