//! What the next request carries, in tokens, and where they go.
//!
//! One function answers "how many tokens will the next request carry" for the status
//! bar, `ctx/context` and the auto-compact trigger alike, so they can never disagree.
//! After a provider report the figure is that report plus the estimate of what came
//! after it (the report already counted the system prompt, tools and memory files);
//! before any report (a new session, or right after a compaction) the fixed prefix is
//! added to the estimate of the records.
//!
//! The breakdown splits that figure: the fixed parts by their own estimates, the rest
//! among messages in proportion to the bytes of each kind, so the parts always add up
//! to the total and, with free space and the autocompact buffer, to the window.

use crate::record::{Kind, Record};
use crate::tally::Tally;

/// The parts of a request that do not come from the session's records, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prefix {
    /// The host's system blocks plus the system context (git facts).
    pub system_prompt: u64,
    pub tools: u64,
    /// Memory files (the user context message).
    pub memory_files: u64,
    /// Content of skills the agent invoked that is still in the view.
    pub skills: u64,
}

impl Prefix {
    fn sum(&self) -> u64 {
        self.system_prompt + self.tools + self.memory_files
    }
}

/// Bytes of message content since the latest boundary, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Composition {
    pub tool_results: u64,
    pub summaries: u64,
    pub other: u64,
}

impl Composition {
    /// Folds one record in; records that never reach the model are not counted.
    pub fn observe(&mut self, record: &Record) {
        self.observe_sized(record, u64::from(record.head().content_bytes));
    }

    /// As [`Composition::observe`], the record's content counted as `bytes`.
    pub fn observe_sized(&mut self, record: &Record, bytes: u64) {
        let head = record.head();
        if head.is_sidechain || head.is_api_error {
            return;
        }
        match head.kind {
            Kind::User if head.is_compact_summary => self.summaries += bytes,
            Kind::User if record.line().contains(r#""tool_result""#) => self.tool_results += bytes,
            Kind::User | Kind::Assistant | Kind::Attachment => self.other += bytes,
            Kind::System | Kind::Summary | Kind::Other => {}
        }
    }

    fn total(&self) -> u64 {
        self.tool_results + self.summaries + self.other
    }
}

/// Tokens the next request is expected to carry: see the module docs. `pending` is what
/// the request will add that no record holds yet (memory files activated by a read,
/// changed-file notes).
pub fn next_request_tokens(tally: &Tally, prefix: &Prefix, pending: u64) -> u64 {
    let records = tally.total() + pending;
    if tally.anchored() { records } else { records + prefix.sum() }
}

/// Where the tokens of a request go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Breakdown {
    pub system_prompt: u64,
    pub tools: u64,
    pub memory_files: u64,
    pub skills: u64,
    pub tool_results: u64,
    pub summaries: u64,
    pub other_messages: u64,
}

impl Breakdown {
    pub fn total(&self) -> u64 {
        self.system_prompt
            + self.tools
            + self.memory_files
            + self.skills
            + self.tool_results
            + self.summaries
            + self.other_messages
    }
}

/// Splits `tokens` (from [`next_request_tokens`]) into its parts. The fixed parts take
/// their estimates first (cut down if a stale report is smaller than they are), skills
/// come out of the messages they were delivered in, and what remains is shared among
/// message kinds by bytes. The parts sum to `tokens` exactly.
pub fn split(tokens: u64, prefix: &Prefix, composition: &Composition) -> Breakdown {
    let mut left = tokens;
    let mut take = |want: u64| {
        let got = want.min(left);
        left -= got;
        got
    };
    let system_prompt = take(prefix.system_prompt);
    let tools = take(prefix.tools);
    let memory_files = take(prefix.memory_files);
    let skills = take(prefix.skills);
    let messages = left;
    let bytes = composition.total();
    let share =
        |part: u64| if bytes == 0 { 0 } else { (u128::from(messages) * u128::from(part) / u128::from(bytes)) as u64 };
    let tool_results = share(composition.tool_results);
    let summaries = share(composition.summaries);
    // Rounding leftovers (and everything, when no record was seen) go to "other".
    let other_messages = messages - tool_results - summaries;
    Breakdown { system_prompt, tools, memory_files, skills, tool_results, summaries, other_messages }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(line: &str) -> Record {
        Record::parse(line).unwrap()
    }

    #[test]
    fn the_prefix_counts_only_until_the_first_report() {
        let mut tally = Tally::default();
        let prefix = Prefix { system_prompt: 3_000, tools: 10_000, memory_files: 2_000, skills: 0 };
        tally.observe(&rec(r#"{"type":"user","message":{"role":"user","content":"hello there"}}"#));
        assert_eq!(next_request_tokens(&tally, &prefix, 0), 15_000 + tally.estimated());
        assert_eq!(next_request_tokens(&tally, &prefix, 40), 15_040 + tally.estimated());
        tally.observe(&rec(r#"{"type":"assistant","message":{"id":"m","model":"x","content":[],"usage":{"input_tokens":16000,"output_tokens":100}}}"#));
        assert_eq!(next_request_tokens(&tally, &prefix, 0), 16_100, "the report already holds the prefix");
    }

    #[test]
    fn parts_add_up_and_follow_the_kinds() {
        let mut composition = Composition::default();
        composition.observe(&rec(r#"{"type":"user","isCompactSummary":true,"message":{"role":"user","content":"SUMMARY SUMMARY SUMMARY SUMMARY"}}"#));
        composition.observe(&rec(&format!(
            r#"{{"type":"user","message":{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t","content":"{}"}}]}}}}"#,
            "r".repeat(300)
        )));
        composition
            .observe(&rec(r#"{"type":"assistant","message":{"id":"a","content":[{"type":"text","text":"ok"}]}}"#));
        composition.observe(&rec(
            r#"{"type":"assistant","isSidechain":true,"message":{"id":"s","content":"not mine at all, a subagent's"}}"#,
        ));
        assert!(composition.tool_results > 300 && composition.summaries > 30 && composition.other > 10);
        let prefix = Prefix { system_prompt: 1_000, tools: 2_000, memory_files: 500, skills: 250 };
        let parts = split(10_000, &prefix, &composition);
        assert_eq!(parts.total(), 10_000);
        assert_eq!((parts.system_prompt, parts.tools, parts.memory_files, parts.skills), (1_000, 2_000, 500, 250));
        assert!(parts.tool_results > parts.summaries && parts.summaries > parts.other_messages, "{parts:?}");
    }

    #[test]
    fn a_total_below_the_prefix_is_never_overdrawn() {
        let prefix = Prefix { system_prompt: 1_000, tools: 2_000, memory_files: 500, skills: 0 };
        let parts = split(2_500, &prefix, &Composition::default());
        assert_eq!(parts, Breakdown { system_prompt: 1_000, tools: 1_500, ..Breakdown::default() });
        assert_eq!(split(0, &prefix, &Composition::default()).total(), 0);
    }
}
