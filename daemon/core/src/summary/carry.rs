//! Reading an earlier summary's sections back into flat entries, so a new summary is
//! written from the earlier one's *content* rather than around it.
//!
//! Summaries used to quote the previous one whole under "Before the previous
//! compaction: …", so each compaction nested one level deeper and grew. Here a section
//! body is split into its top-level bullets; a bullet that is itself such a quotation
//! (one of the wrapper leads below, written by earlier versions) is opened and its own
//! bullets are taken instead, at any depth. What comes out is one flat list per
//! section, which the section writers merge with what followed and bound like any other
//! entries.

use super::text::parse_thousands;

/// Leads of the entries earlier versions wrapped a whole earlier section in.
const WRAPPER_LEADS: &[&str] = &[
    "Before the previous compaction, as summarized then:",
    "Before the previous compaction:",
    "From the previous summary (may be done by now):",
];

/// The top-level bullets of a section body, each without its "- " and with its
/// continuation lines' indentation removed; quotations of earlier sections are opened.
/// A body without any bullet is one entry (a summary written in another shape).
pub(super) fn entries(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    collect(body, &mut out, 0);
    out
}

/// Deepest quotation opened: summaries written before this reader nested at most a
/// dozen levels; deeper input is taken as text.
const MAX_DEPTH: usize = 64;

fn collect(body: &str, out: &mut Vec<String>, depth: usize) {
    for entry in bullets(body) {
        let wrapped = WRAPPER_LEADS.iter().find_map(|lead| entry.strip_prefix(lead));
        match wrapped {
            Some(inner) if depth < MAX_DEPTH => collect(inner, out, depth + 1),
            _ => out.push(entry),
        }
    }
}

/// Splits a body at lines that start a bullet at its shallowest indentation.
fn bullets(body: &str) -> Vec<String> {
    let lines: Vec<&str> = body.lines().collect();
    let indent_of = |l: &str| l.len() - l.trim_start_matches([' ', '\t']).len();
    let Some(base) =
        lines.iter().filter(|l| l.trim_start().starts_with("- ") || l.trim() == "-").map(|l| indent_of(l)).min()
    else {
        let text = body.trim();
        return if text.is_empty() { Vec::new() } else { vec![text.to_owned()] };
    };
    let mut out: Vec<Vec<String>> = Vec::new();
    for line in lines {
        let starts = indent_of(line) == base && line.trim_start().starts_with('-');
        if starts {
            let text = line.trim_start().trim_start_matches('-');
            out.push(vec![text.strip_prefix(' ').unwrap_or(text).to_owned()]);
        } else if let Some(current) = out.last_mut() {
            // Continuation lines sit two columns right of the bullet's dash.
            let strip = (base + 2).min(indent_of(line));
            current.push(line.get(strip..).unwrap_or(line.trim_start()).to_owned());
        } else if !line.trim().is_empty() {
            // Text before the first bullet is an entry of its own.
            out.push(vec![line.trim().to_owned()]);
        }
    }
    out.into_iter().map(|lines| lines.join("\n").trim_end().to_owned()).filter(|e| !e.is_empty()).collect()
}

/// The count of a "[… N more user messages cut …]" line (any noun, and maybe a
/// " (…)" note after it), when `entry` is one.
pub(super) fn folded_count(entry: &str) -> Option<usize> {
    let (rest, note) = entry.trim().strip_prefix("[… ")?.split_once(" cut …]")?;
    if !(note.is_empty() || note.starts_with(" (") && note.ends_with(')')) {
        return None;
    }
    let (number, noun) = rest.split_once(' ')?;
    let noun = noun.strip_prefix("more ")?;
    if noun.is_empty() || noun.contains(['[', ']']) {
        return None;
    }
    parse_thousands(number)
}

/// Lead of a group of identical user messages: "(sent 3 times) ".
pub(super) fn times_lead(times: usize) -> String {
    format!("(sent {} times) ", super::text::thousands(times))
}

/// `entry` without its "(sent N times) " lead, and N (1 without one).
pub(super) fn split_times(entry: &str) -> (usize, &str) {
    let parsed = entry.strip_prefix("(sent ").and_then(|rest| {
        let (number, text) = rest.split_once(" times) ")?;
        Some((parse_thousands(number)?, text))
    });
    parsed.filter(|(n, _)| *n >= 2).unwrap_or((1, entry))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bullets_with_continuations_split_flat() {
        let body = "   - first\n     second line\n   - other\n\n     after a blank";
        assert_eq!(entries(body), vec!["first\nsecond line", "other\n\nafter a blank"]);
        assert_eq!(entries("no bullets at all\nhere"), vec!["no bullets at all\nhere"]);
        assert!(entries("   ").is_empty());
    }

    #[test]
    fn nested_quotations_open_at_any_depth() {
        // Three levels as earlier versions wrote them: each quotation indented under
        // its wrapper bullet.
        let body = "   - Before the previous compaction, as summarized then:\n     - Before the previous compaction, as summarized then:\n       - oldest\n     - middle\n       continued\n   - newest";
        assert_eq!(entries(body), vec!["oldest", "middle\ncontinued", "newest"]);
    }

    #[test]
    fn a_message_that_lists_items_is_not_opened() {
        let body = "   - Please do these:\n     - one\n     - two\n   - next";
        assert_eq!(entries(body), vec!["Please do these:\n- one\n- two", "next"]);
    }

    #[test]
    fn fold_lines_and_repeat_leads_read_back() {
        assert_eq!(folded_count("[… 1,234 more user messages cut …]"), Some(1234));
        assert_eq!(folded_count("[… 1 more file cut …]"), Some(1));
        assert_eq!(folded_count("[… 12 characters cut …]"), None);
        assert_eq!(folded_count("text [… 3 more files cut …]"), None);
        assert_eq!(folded_count("[… 3 more files cut …] (the oldest; the transcript has them)"), Some(3));
        assert_eq!(folded_count("[… 3 more files cut …] and then some"), None);
        assert_eq!(split_times(&format!("{}hello", times_lead(1200))), (1200, "hello"));
        assert_eq!(split_times("(sent 1 times) x"), (1, "(sent 1 times) x"));
        assert_eq!(split_times("plain"), (1, "plain"));
    }
}
