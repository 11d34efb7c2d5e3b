//! Compaction summaries: the built-in offline summarizer, and reading a summary out of
//! a model's reply.
//!
//! Compaction needs a summary even when no model can be asked (no API key, offline, a
//! provider outage). [`summarize_offline`] writes one from the transcript alone:
//! deterministic, no network, fast enough to run on a session near a one-million-token
//! window. It writes the same nine numbered sections a model is asked for, wrapped in
//! `<summary>` tags, so one reader ([`parse_summary_reply`]) serves both paths and the
//! installed summary looks the same whoever wrote it.
//!
//! What it can know without a model: what the user asked (every message, verbatim or
//! visibly cut), which files were read and changed (with line ranges), which tool calls
//! failed and what came next, the open todo items, and where the work stopped. What it
//! cannot know is why; sections that a model would fill with reasoning are filled with
//! the assistant's own words from around the relevant events instead.
//!
//! Layout of the module:
//! - `scan`: one pass over the records into facts (prompts, steps, files, todos).
//! - `compose`: the nine sections' entries from those facts.
//! - `layout`: fitting the entries under the output cap.
//! - `terms`: identifier and word counts for the concepts section.
//! - `text`: cutting with visible markers, token estimate.
//! - `reply`: `<summary>` extraction and section splitting.

mod carry;
mod compose;
mod layout;
mod reply;
mod scan;

pub(crate) use scan::prompt_text;
mod terms;
mod text;

#[cfg(test)]
mod tests;

pub use reply::{SECTION_TITLES, SummaryParseError, SummarySection, parse_summary_reply, split_sections};
pub use text::{estimate_tokens, thousands};

use crate::record::Record;

/// Default output cap, in estimated tokens: the most a compaction reply may use.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 20_000;
/// The offline summary's cap for a compaction threshold: 8k tokens at a 200k window
/// (threshold 167k), in proportion for other windows, so the session right after a
/// compaction starts far below its threshold whatever the number of compactions.
pub fn offline_cap_tokens(threshold: u64) -> u64 {
    (threshold / 21).clamp(MIN_OFFLINE_CAP_TOKENS, MAX_OFFLINE_CAP_TOKENS)
}
/// Least cap [`offline_cap_tokens`] gives (a tiny configured window).
pub const MIN_OFFLINE_CAP_TOKENS: u64 = 1_000;
/// Most cap [`offline_cap_tokens`] gives (a one-million-token window).
pub const MAX_OFFLINE_CAP_TOKENS: u64 = 48_000;

/// Room an offline summary may take beyond its cap for the paths of the files read or
/// changed since the previous compaction: half the cap (1,595 tokens at a 100k window,
/// 4k at 200k, 24k at most). Paths are short and the next turn cannot do without
/// knowing which files are in play, so they do not compete with the user messages for
/// the cap; bounded, so a part that touched thousands of files still gets a bounded
/// summary, naming the newest and counting the rest. Only what the paths need is used:
/// a summary is at most its cap plus the smaller of this and its paths' length.
pub fn file_list_allowance_tokens(cap_tokens: u64) -> u64 {
    cap_tokens / 2
}

/// Default longest user message kept whole, in characters.
pub const DEFAULT_MAX_USER_MESSAGE_CHARS: usize = 2_000;

/// How the offline summary is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfflineOptions {
    /// Cap on the summary's size in estimated tokens (bytes / 4, rounded up), tags
    /// included, beside the files' paths: those may take up to
    /// [`file_list_allowance_tokens`] more. Met whenever it can hold the nine headings.
    pub max_output_tokens: u64,
    /// The user's focus instructions (`/compact <focus>`), merged with any from hooks.
    /// Named in section 1; entries that mention its words are cut last.
    pub focus: Option<String>,
    /// User messages longer than this many characters are cut (head and tail kept,
    /// with a marker saying how much is missing), before any cut the cap forces.
    pub max_user_message_chars: usize,
}

impl Default for OfflineOptions {
    fn default() -> OfflineOptions {
        OfflineOptions {
            max_output_tokens: DEFAULT_MAX_OUTPUT_TOKENS,
            focus: None,
            max_user_message_chars: DEFAULT_MAX_USER_MESSAGE_CHARS,
        }
    }
}

/// An offline summary and what it was built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfflineSummary {
    /// `<summary>…</summary>` with the nine numbered sections.
    pub text: String,
    /// Estimated tokens of `text`. Above the cap by at most the files' paths (within
    /// [`file_list_allowance_tokens`]), or when the cap cannot hold the nine headings.
    pub tokens: u64,
    /// Every file read, changed or re-attached, newest first: also what post-compact
    /// restoration may want.
    pub files: Vec<FileTouched>,
    /// Number of real user prompts summarized (not tool results, meta rows, command
    /// echoes or earlier summaries).
    pub user_messages: usize,
    /// True when the cap forced anything to be cut or dropped.
    pub trimmed: bool,
}

/// A file the conversation read or changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileTouched {
    pub path: String,
    /// Read with the Read tool (successfully).
    pub read: bool,
    /// Changed with Edit, MultiEdit or NotebookEdit.
    pub edited: bool,
    /// Created or overwritten with Write.
    pub written: bool,
    /// Re-attached after an earlier compaction (a `file` attachment).
    pub restored: bool,
    /// Named after an earlier compaction as too large to re-attach.
    pub referenced: bool,
    /// Line ranges read, 1-based and inclusive, sorted and merged.
    pub ranges: Vec<LineRange>,
    /// Length of the file in lines, when a read reported it.
    pub total_lines: Option<u64>,
    /// Number of successful edits.
    pub edits: u32,
    /// The latest edit, both sides shortened to one line.
    pub last_edit: Option<EditQuote>,
    /// Lines of the latest Write.
    pub written_lines: Option<usize>,
}

/// Both sides of an edit, shortened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EditQuote {
    pub old: String,
    pub new: String,
}

/// Lines `start..=end` of a file, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineRange {
    pub start: u64,
    pub end: u64,
}

/// Writes the offline summary of `records`.
///
/// The records are a transcript or a slice of one. When they contain a compact
/// boundary, only what follows the latest boundary is summarized (what precedes it is
/// represented by the summary installed after it), with the messages that boundary
/// kept verbatim, and the earlier summary's intent, files, user messages and pending
/// tasks are carried forward. Side-chain records, API error stand-ins, synthetic
/// assistant turns, system records and host bookkeeping lines are ignored; assistant
/// lines that share a `message.id` count as one message.
pub fn summarize_offline(records: &[Record], options: &OfflineOptions) -> OfflineSummary {
    let facts = scan::scan(records);
    let sections = compose::sections(&facts, options);
    let (text, trimmed) =
        layout::layout(&sections, options.max_output_tokens, file_list_allowance_tokens(options.max_output_tokens));
    OfflineSummary {
        tokens: estimate_tokens(&text),
        text,
        user_messages: facts.prompts.len(),
        files: facts.files,
        trimmed,
    }
}
