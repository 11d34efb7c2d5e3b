//! Small text helpers shared by the offline summarizer: cutting a text to a byte budget
//! with a visible marker, and the token estimate.
//!
//! They live apart from the section builder because every section cuts text the same
//! way, and the cap arithmetic must agree with the marker that cutting inserts: a reader
//! of the summary sees exactly how much was left out ("[… 1,234 characters cut …]").

/// The estimate used for the output cap is the rest of ctxd's.
pub use crate::tally::{BYTES_PER_TOKEN, estimate_tokens};

/// Which part of a text survives a cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CutStyle {
    /// Keep the beginning only.
    Head,
    /// Keep the beginning and, when there is room, the end (requests often end with the
    /// actual question).
    HeadTail,
}

/// Below this many bytes of kept text a head-and-tail cut keeps only the head: two tiny
/// fragments read worse than one short one.
const MIN_SPLIT: usize = 160;

/// `1234567` as `1,234,567`: the one digit grouping of the crate and the daemon (summaries,
/// `ctxd replay`). Takes any unsigned count (`usize`, `u64`, …); a value that does not fit
/// a `u64` shows as `u64::MAX`.
pub fn thousands(n: impl TryInto<u64>) -> String {
    let digits = n.try_into().ok().unwrap_or(u64::MAX).to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// `1,234,567` (or `1234567`) as a number.
pub(super) fn parse_thousands(text: &str) -> Option<usize> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit() || b == b',') || text.starts_with(',') {
        return None;
    }
    text.replace(',', "").parse().ok()
}

/// The marker that replaces `chars` cut characters.
pub(super) fn cut_marker(chars: usize) -> String {
    format!("[… {} characters cut …]", thousands(chars))
}

/// Markers already in a text (a message cut by an earlier summary): byte span and the
/// number of characters each stands for.
fn markers_in(text: &str) -> Vec<(usize, usize, usize)> {
    const OPEN: &str = "[… ";
    const CLOSE: &str = " characters cut …]";
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(OPEN).map(|i| from + i) {
        let digits_start = at + OPEN.len();
        let digits_len = text[digits_start..].bytes().take_while(|b| b.is_ascii_digit() || *b == b',').count();
        let digits_end = digits_start + digits_len;
        match parse_thousands(&text[digits_start..digits_end]) {
            Some(n) if text[digits_end..].starts_with(CLOSE) => {
                let end = digits_end + CLOSE.len();
                out.push((at, end, n));
                from = end;
            }
            _ => from = digits_start,
        }
    }
    out
}

/// How far back (or forward) a cut may move to land on whitespace instead of
/// splitting a word.
const WORD_SLACK: usize = 24;

/// End of a head of at most `max` bytes, moved back to a whitespace when one is close.
fn head_end(s: &str, max: usize) -> usize {
    let end = s.floor_char_boundary(max);
    if end == s.len() {
        return end;
    }
    let window_start = end.saturating_sub(WORD_SLACK);
    match s.as_bytes()[window_start..end].iter().rposition(|b| b.is_ascii_whitespace()) {
        Some(p) if window_start + p > 0 => window_start + p,
        _ => end,
    }
}

/// Start of a tail of at most `max` bytes, moved forward past a whitespace when one is
/// close.
fn tail_start(s: &str, max: usize) -> usize {
    let start = s.ceil_char_boundary(s.len().saturating_sub(max));
    let window_end = (start + WORD_SLACK).min(s.len());
    match s.as_bytes()[start..window_end].iter().position(|b| b.is_ascii_whitespace()) {
        Some(p) if start + p + 1 < s.len() => start + p + 1,
        _ => start,
    }
}

/// Cuts `text` so the result, marker included, is at most `limit` bytes (or just the
/// marker when even that does not fit). Returns the text unchanged when it fits.
pub(super) fn cut(text: &str, limit: usize, style: CutStyle) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    if limit < COUNTED_CUT_MIN {
        return brief_cut(text, limit);
    }
    // A text cut before (an earlier summary's excerpt) stands for more than its own
    // characters: the new marker counts what the old ones it swallows stood for.
    let earlier = markers_in(text);
    let represented = text.chars().count()
        + earlier.iter().map(|&(s, e, n)| n.saturating_sub(text[s..e].chars().count())).sum::<usize>();
    // The marker is longest when every character is cut; reserve that much, plus the
    // spaces around it.
    let reserve = cut_marker(represented).len() + 2;
    let room = limit.saturating_sub(reserve);
    let (mut head, mut tail) = if style == CutStyle::HeadTail && room >= MIN_SPLIT {
        let head_room = room * 2 / 3;
        let h = head_end(text, head_room);
        let t = tail_start(text, room - h.min(room));
        (h, t.max(h))
    } else {
        (head_end(text, room), text.len())
    };
    // One marker per excerpt: the cut widens to swallow every earlier marker (the head
    // ends before the first, the tail starts after the last).
    if let (Some(&(first, _, _)), Some(&(_, last, _))) = (earlier.first(), earlier.last()) {
        head = head.min(first);
        tail = tail.max(last);
    }
    let tail = tail.max(head);
    let head_text = text[..head].trim_end();
    let tail_text = text[tail..].trim_start();
    let swallowed: usize = earlier
        .iter()
        .filter(|&&(s, e, _)| s >= head && e <= tail)
        .map(|&(s, e, n)| n.saturating_sub(text[s..e].chars().count()))
        .sum();
    let kept = head_text.chars().count() + tail_text.chars().count();
    let marker = cut_marker(text.chars().count().saturating_sub(kept) + swallowed);
    let mut out = String::with_capacity(limit.max(marker.len()));
    out.push_str(head_text);
    if !head_text.is_empty() {
        out.push(' ');
    }
    out.push_str(&marker);
    if !tail_text.is_empty() {
        out.push(' ');
        out.push_str(tail_text);
    }
    out
}

/// Below this many bytes a cut keeps the first words and a bare ellipsis: the counted
/// marker would take most of the room.
const COUNTED_CUT_MIN: usize = 80;
const BRIEF_MARK: &str = " …";

/// The first words of `text` and an ellipsis, at most `limit` bytes (the ellipsis alone
/// when no word fits).
fn brief_cut(text: &str, limit: usize) -> String {
    let head = text[..head_end(text, limit.saturating_sub(BRIEF_MARK.len()))].trim_end();
    if head.is_empty() {
        return BRIEF_MARK.trim_start().to_owned();
    }
    format!("{head}{BRIEF_MARK}")
}

/// Cuts to at most `max_chars` characters (not bytes), for the per-message limit the
/// caller configures in characters.
pub(super) fn cut_chars(text: &str, max_chars: usize, style: CutStyle) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_owned(),
        // Byte length of the first `max_chars` characters is a byte limit that keeps
        // about that many characters.
        Some((byte_at_limit, _)) => cut(text, byte_at_limit, style),
    }
}

/// The text on one line (whitespace runs become one space), cut to `limit` bytes: for short quotes inside a line (labels,
/// commands, error lines).
pub(super) fn short(text: &str, limit: usize) -> String {
    let mut line = String::new();
    // Only the first few lines can survive the cut; do not flatten a 200 KB output.
    let mut budget = limit.saturating_mul(2).max(64);
    for word in text.split_whitespace() {
        if budget == 0 {
            break;
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
        budget = budget.saturating_sub(word.len() + 1);
    }
    if line.len() > limit {
        let end = head_end(&line, limit.saturating_sub(1));
        let mut out = line[..end].trim_end().to_owned();
        out.push('…');
        out
    } else {
        line
    }
}

/// Pushes `text` onto `out`, starting every line after the first with `indent`, so a
/// multi-line entry stays inside its bullet and can never look like a section heading.
pub(super) fn push_indented(out: &mut String, text: &str, indent: &str) {
    let mut lines = text.split('\n');
    if let Some(first) = lines.next() {
        out.push_str(first.strip_suffix('\r').unwrap_or(first));
    }
    for line in lines {
        let line = line.strip_suffix('\r').unwrap_or(line);
        out.push('\n');
        // No trailing spaces on blank lines.
        if !line.is_empty() {
            out.push_str(indent);
            out.push_str(line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1234), "1,234");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(1000_u64), "1,000");
        assert_eq!(thousands(u64::MAX), "18,446,744,073,709,551,615");
    }

    #[test]
    fn cut_respects_the_limit_and_counts_what_it_cut() {
        let text = "word ".repeat(400); // 2,000 bytes
        for limit in [COUNTED_CUT_MIN, 100, 159, 200, 500, 1999] {
            for style in [CutStyle::Head, CutStyle::HeadTail] {
                let out = cut(&text, limit, style);
                assert!(out.len() <= limit, "{limit} {style:?}: {} bytes", out.len());
                assert!(out.contains("characters cut …]"), "{out}");
                // The count in the marker is exactly what is missing.
                let kept = out.chars().filter(|c| *c == 'w').count() * 5;
                let start = out.find("[… ").map(|i| i + "[… ".len()).unwrap_or(0);
                let digits: String = out[start..].chars().take_while(|c| c.is_ascii_digit() || *c == ',').collect();
                let n: usize = digits.replace(',', "").parse().unwrap();
                assert!(n + kept >= 2000 - 2 && n + kept <= 2000 + 2, "{limit}: {n} + {kept}");
            }
        }
        assert_eq!(cut("short", 10, CutStyle::Head), "short");
    }

    #[test]
    fn a_short_cut_keeps_the_first_words_and_an_ellipsis() {
        let text = "Please fix the retry writer. Limit compact file memory result queue request. Then test.";
        for style in [CutStyle::Head, CutStyle::HeadTail] {
            assert_eq!(cut(text, 34, style), "Please fix the retry writer. …");
            let out = cut(text, COUNTED_CUT_MIN - 1, style);
            assert!(out.len() < COUNTED_CUT_MIN && out.ends_with(" …") && !out.contains("cut"), "{out}");
        }
        assert_eq!(cut(text, 4, CutStyle::Head), "…");
    }

    #[test]
    fn head_tail_keeps_the_end_of_a_long_text() {
        let text = format!("START {} END", "x ".repeat(1000));
        let out = cut(&text, 300, CutStyle::HeadTail);
        assert!(out.starts_with("START"));
        assert!(out.ends_with("END"));
        let head_only = cut(&text, 300, CutStyle::Head);
        assert!(!head_only.ends_with("END"));
    }

    #[test]
    fn cut_never_splits_a_character() {
        let text = "é".repeat(500) + &"ß".repeat(500);
        for limit in 40..120 {
            let out = cut(&text, limit, CutStyle::HeadTail);
            assert!(out.len() <= limit.max(cut_marker(1000).len()));
        }
        assert_eq!(cut_chars("äöü", 2, CutStyle::Head), cut("äöü", 4, CutStyle::Head));
        assert_eq!(cut_chars("äöü", 3, CutStyle::Head), "äöü");
    }

    #[test]
    fn cutting_an_excerpt_again_counts_what_it_stood_for() {
        // 400 characters kept of 1,400: the excerpt stands for 1,400 characters.
        let excerpt = format!("{} {} {}", "a ".repeat(100).trim_end(), cut_marker(1_000), "b ".repeat(100).trim_end());
        let out = cut(&excerpt, 120, CutStyle::Head);
        assert!(out.len() <= 120, "{out}");
        let marker = markers_in(&out);
        assert_eq!(marker.len(), 1, "{out}");
        let kept = out[..marker[0].0].trim_end().chars().count();
        // Every character of the original is either kept or counted, within the
        // spaces the cut trims.
        let counted = marker[0].2 + kept;
        assert!((1_398..=1_401).contains(&counted), "{counted}: {out}");
        // A cut that lands inside the old marker moves off it.
        for limit in 200..260 {
            let out = cut(&excerpt, limit, CutStyle::HeadTail);
            assert_eq!(markers_in(&out).len(), 1, "{out}");
            assert_eq!(out.matches('[').count(), 1, "{out}");
        }
        assert_eq!(parse_thousands("1,234"), Some(1234));
        assert_eq!(parse_thousands(",12"), None);
        assert_eq!(parse_thousands(""), None);
    }

    #[test]
    fn short_flattens_and_cuts() {
        assert_eq!(short("a\n  b\tc", 50), "a b c");
        let s = short(&"abc ".repeat(100), 21);
        assert!(s.len() <= 21 + '…'.len_utf8(), "{s}");
        assert!(s.ends_with('…'));
    }

    #[test]
    fn indented_lines_cannot_start_a_heading() {
        let mut out = String::new();
        push_indented(&mut out, "first\n7. Pending Tasks:\r\n\nlast", "   ");
        assert_eq!(out, "first\n   7. Pending Tasks:\n\n   last");
    }

    #[test]
    fn token_estimate_rounds_up() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("abc"), 1);
        assert_eq!(estimate_tokens("abcd"), 1);
        assert_eq!(estimate_tokens("abcde"), 2);
    }
}
