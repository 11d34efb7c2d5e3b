//! Reading a summary back: the `<summary>` body out of a model's reply, and the nine
//! numbered sections out of a summary body.
//!
//! Both compaction paths end here. A model writes an `<analysis>` draft and then a
//! `<summary>`; the offline summarizer writes only the `<summary>`. Installing either
//! goes through [`parse_summary_reply`], so the two can never drift apart in what they
//! accept. [`split_sections`] lets a later compaction carry an earlier summary forward.

/// The nine section headings, in order, as written after their number
/// (`"1. Primary Request and Intent:"`).
pub const SECTION_TITLES: [&str; 9] = [
    "Primary Request and Intent",
    "Key Technical Concepts",
    "Files and Code Sections",
    "Errors and Fixes",
    "Problem Solving",
    "All User Messages",
    "Pending Tasks",
    "Current Work",
    "Optional Next Step",
];

const OPEN_SUMMARY: &str = "<summary>";
const CLOSE_SUMMARY: &str = "</summary>";
const OPEN_ANALYSIS: &str = "<analysis>";
const CLOSE_ANALYSIS: &str = "</analysis>";

/// Why a reply did not yield a summary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SummaryParseError {
    /// No `<summary>` tag outside the analysis draft. The caller may ask once more,
    /// saying the summary must be inside `<summary>` tags.
    #[error("the reply has no <summary> block")]
    MissingSummary,
    /// A `<summary>` tag with nothing but whitespace in it.
    #[error("the reply's <summary> block is empty")]
    EmptySummary,
}

/// Extracts the summary body from a model's reply (or from an offline summary).
///
/// Rules:
/// - `<analysis>…</analysis>` drafts before the summary are skipped, so a draft that
///   mentions `<summary>` does not start it. An analysis that is never closed ends at
///   the next `<summary>` tag.
/// - The body runs from the first `<summary>` outside a draft to the **last**
///   `</summary>`: a summary that quotes the tag (a user message about this very
///   feature) is kept whole rather than cut at the quote.
/// - A `<summary>` that is never closed (the reply ran into its output limit) yields
///   everything after the tag: a truncated summary is still better than failing the
///   compaction.
/// - The body is trimmed; an empty body is an error.
pub fn parse_summary_reply(reply: &str) -> Result<String, SummaryParseError> {
    let mut pos = 0;
    let start = loop {
        let rest = &reply[pos..];
        let summary_at = rest.find(OPEN_SUMMARY);
        let analysis_at = rest.find(OPEN_ANALYSIS);
        match (summary_at, analysis_at) {
            (None, _) => return Err(SummaryParseError::MissingSummary),
            (Some(s), Some(a)) if a < s => {
                let draft = pos + a + OPEN_ANALYSIS.len();
                match reply[draft..].find(CLOSE_ANALYSIS) {
                    Some(end) => pos = draft + end + CLOSE_ANALYSIS.len(),
                    // Unclosed draft: it ends where the summary begins.
                    None => pos += s,
                }
            }
            (Some(s), _) => break pos + s + OPEN_SUMMARY.len(),
        }
    };
    let body = match reply[start..].rfind(CLOSE_SUMMARY) {
        Some(end) => &reply[start..start + end],
        None => &reply[start..],
    };
    let body = body.trim();
    if body.is_empty() {
        return Err(SummaryParseError::EmptySummary);
    }
    Ok(body.to_owned())
}

/// One numbered section of a summary body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummarySection<'a> {
    /// 1 to 9.
    pub number: u8,
    /// The heading text after the number, without the colon, as written.
    pub title: &'a str,
    /// Everything up to the next heading, trimmed of surrounding blank lines.
    pub body: &'a str,
}

/// Splits a summary body into its numbered sections: lines that start (no indentation)
/// with `N. Title:` where N counts up from 1. Headings may be wrapped in Markdown
/// emphasis or start with `#`. Numbers that skip ahead are accepted (a section may be
/// missing); a number that does not increase is treated as body text.
pub fn split_sections(body: &str) -> Vec<SummarySection<'_>> {
    // (number, title, byte offset where the heading line starts, where its body starts)
    let mut heads: Vec<(u8, &str, usize, usize)> = Vec::new();
    let mut offset = 0;
    for line in body.split_inclusive('\n') {
        let line_start = offset;
        offset += line.len();
        let last = heads.last().map_or(0, |h| h.0);
        if let Some((number, title)) = heading(line)
            && number > last
        {
            heads.push((number, title, line_start, offset));
        }
    }
    let mut sections = Vec::with_capacity(heads.len());
    for (i, &(number, title, _, body_start)) in heads.iter().enumerate() {
        let body_end = heads.get(i + 1).map_or(body.len(), |next| next.2);
        let text = body[body_start..body_end].trim_matches(['\n', '\r']);
        let text = text.trim_end();
        sections.push(SummarySection { number, title, body: text });
    }
    sections
}

/// `N. Title:` at the start of a line (N in 1..=9), with optional `#`/`*` decoration.
fn heading(line: &str) -> Option<(u8, &str)> {
    let line = line.trim_end();
    let first = line.as_bytes().first()?;
    if first.is_ascii_whitespace() {
        return None;
    }
    let line = line.trim_start_matches(['#', '*', ' ']);
    let mut chars = line.chars();
    let digit = chars.next()?.to_digit(10)?;
    if digit == 0 || chars.next()? != '.' {
        return None;
    }
    let rest = chars.as_str().trim_start().trim_end_matches('*').trim_end();
    let title = rest.strip_suffix(':')?.trim_end_matches('*').trim();
    if title.is_empty() || title.len() > 60 {
        return None;
    }
    u8::try_from(digit).ok().map(|n| (n, title))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn analysis_then_summary() {
        let reply = "<analysis>\nI should write a <summary> now.\n</analysis>\n\n<summary>\n1. Primary Request and Intent:\n   Fix the bug.\n</summary>";
        assert_eq!(parse_summary_reply(reply), Ok("1. Primary Request and Intent:\n   Fix the bug.".to_owned()));
    }

    #[test]
    fn summary_only() {
        assert_eq!(parse_summary_reply("  <summary> body </summary>\n"), Ok("body".to_owned()));
    }

    #[test]
    fn missing_summary() {
        assert_eq!(parse_summary_reply("Here is my summary: it went well."), Err(SummaryParseError::MissingSummary));
        assert_eq!(parse_summary_reply(""), Err(SummaryParseError::MissingSummary));
        // Only mentioned inside a closed draft.
        assert_eq!(
            parse_summary_reply("<analysis>next comes the <summary> block</analysis> oops"),
            Err(SummaryParseError::MissingSummary)
        );
        assert_eq!(SummaryParseError::MissingSummary.to_string(), "the reply has no <summary> block");
    }

    #[test]
    fn empty_summary() {
        assert_eq!(parse_summary_reply("<summary>  \n\t</summary>"), Err(SummaryParseError::EmptySummary));
        assert_eq!(
            parse_summary_reply("<analysis>x</analysis><summary></summary>"),
            Err(SummaryParseError::EmptySummary)
        );
        assert_eq!(parse_summary_reply("<summary>"), Err(SummaryParseError::EmptySummary));
    }

    #[test]
    fn unclosed_tags() {
        // Output limit hit inside the summary: keep what was written.
        assert_eq!(
            parse_summary_reply("<summary>\n1. Primary Request and Intent:\n   Fix"),
            Ok("1. Primary Request and Intent:\n   Fix".to_owned())
        );
        // A draft that never closes ends where the summary starts.
        assert_eq!(parse_summary_reply("<analysis>thinking aloud\n<summary>body</summary>"), Ok("body".to_owned()));
        // An unclosed draft with no summary at all.
        assert_eq!(parse_summary_reply("<analysis>thinking aloud"), Err(SummaryParseError::MissingSummary));
    }

    #[test]
    fn quoted_closing_tag_inside_the_summary_is_kept() {
        let reply = "<summary>The user said: wrap it in </summary> tags.\nMore.</summary> trailing";
        assert_eq!(parse_summary_reply(reply), Ok("The user said: wrap it in </summary> tags.\nMore.".to_owned()));
    }

    #[test]
    fn analysis_after_the_summary_is_ignored_and_inside_is_kept() {
        let reply = "<summary>A <analysis>quoted</analysis> B</summary><analysis>late</analysis>";
        assert_eq!(parse_summary_reply(reply), Ok("A <analysis>quoted</analysis> B".to_owned()));
    }

    #[test]
    fn sections_split_on_numbered_headings() {
        let body = "1. Primary Request and Intent:\n   Fix it.\n   2. Not a heading: indented\n\n**2. Key Technical Concepts:**\n   - Rust\n4. Errors and fixes:\n   - none\n3. Too late:\n   body\n";
        let s = split_sections(body);
        let got: Vec<_> = s.iter().map(|s| (s.number, s.title, s.body)).collect();
        assert_eq!(
            got,
            vec![
                (1, "Primary Request and Intent", "   Fix it.\n   2. Not a heading: indented"),
                (2, "Key Technical Concepts", "   - Rust"),
                (4, "Errors and fixes", "   - none\n3. Too late:\n   body"),
            ]
        );
        assert!(split_sections("no headings here").is_empty());
    }
}
