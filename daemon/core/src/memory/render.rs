//! The text the model sees for memory files, and its size in tokens.
//!
//! Kept apart from discovery so the wording can change without touching the loading
//! rules, and so the same block text feeds both the user context and the per-entry
//! token estimates of a context view (the estimate is of what is actually sent).
//! The caller wraps the user context in `<system-reminder>`.

use super::{Cut, MemoryEntry, MemoryKind, MemorySet};

pub use crate::tally::{BYTES_PER_TOKEN, estimate_tokens};

/// Opening line of the user context when at least one memory file is active.
const INTRO: &str = "Standing instructions from the user's memory files follow, lowest \
precedence first: where two of them disagree, the later one applies.";

/// Estimated tokens an entry adds to the context: its header, text and cut note.
pub fn entry_tokens(entry: &MemoryEntry) -> u64 {
    estimate_tokens(&render_entry(entry))
}

/// The user context: every active memory file in placement order, then the date.
pub fn render_user_context(set: &MemorySet, date: &str) -> String {
    let mut out = String::new();
    let mut any = false;
    for entry in set.active() {
        if !any {
            out.push_str(INTRO);
            out.push_str("\n\n");
            any = true;
        }
        out.push_str(&render_entry(entry));
        out.push_str("\n\n");
    }
    out.push_str(DATE_LABEL);
    out.push_str(date);
    out
}

/// How [`render_user_context`] introduces the date, on the context's last line.
const DATE_LABEL: &str = "Current date: ";

/// The user context split into its memory part and its date line (label included),
/// for a request whose host carries one of them itself.
pub fn split_date_line(context: &str) -> (&str, Option<&str>) {
    match context.rfind(DATE_LABEL) {
        Some(at) if !context[at..].contains('\n') => (context[..at].trim_end_matches('\n'), Some(&context[at..])),
        _ => (context, None),
    }
}

/// Some entries on their own, in the order given, for a mid-session message after a
/// read activated them (re-rendering the whole user context would change the cached
/// prompt prefix). Unknown ids are skipped.
pub fn render_entries(set: &MemorySet, ids: &[usize]) -> String {
    ids.iter().filter_map(|&id| set.entry(id)).map(render_entry).collect::<Vec<_>>().join("\n\n")
}

/// One entry: a header line with its path and kind, its text, and a note if it was cut.
pub fn render_entry(entry: &MemoryEntry) -> String {
    let mut out = format!("=== {} ({}) ===\n", entry.path.display(), describe(entry));
    out.push_str(entry.content.trim_end_matches(['\n', '\r']));
    if let Some(cut) = &entry.cut {
        out.push_str("\n\n");
        out.push_str(&cut.note());
    }
    out
}

/// The kind as the header shows it, with what the model needs to weigh the entry: for
/// a rule the files it applies to, for an import the files that pulled it in.
fn describe(entry: &MemoryEntry) -> String {
    match entry.kind {
        MemoryKind::Rule if !entry.rule_paths.is_empty() => {
            format!("rule for {}", entry.rule_paths.join(", "))
        }
        MemoryKind::Import => {
            let chain: Vec<String> = entry.imported_by.iter().map(|p| p.display().to_string()).collect();
            format!("import via {}", chain.join(" > "))
        }
        kind => kind.label().to_owned(),
    }
}

impl Cut {
    /// A line telling the model that it sees only part of the file.
    pub fn note(&self) -> String {
        match self {
            Self::FileCap { kept_chars, total_chars } => {
                format!("[Cut: the file has {total_chars} characters and only the first {kept_chars} are shown.]")
            }
            Self::ImportBudget { kept_chars, total_chars } => format!(
                "[Cut: imports under one memory file share a size limit; {kept_chars} of this file's {total_chars} characters are shown.]"
            ),
            Self::AutoMemory { kept_lines, total_lines, kept_bytes, total_bytes } => format!(
                "[Cut: only lines 1-{kept_lines} ({kept_bytes} bytes) of {total_lines} lines ({total_bytes} bytes) are shown. Keep this file short and move details into separate files.]"
            ),
        }
    }
}
