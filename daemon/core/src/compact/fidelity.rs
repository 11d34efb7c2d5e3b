//! Checking that a summary kept what the next turn cannot do without, and adding what it
//! left out.
//!
//! A model's summary is good prose and sometimes forgets things: a user message in the
//! middle, the file it was just editing, an open task. Those losses are the ones users
//! notice ("I told you that an hour ago"), and they can be detected without a model: the
//! transcript says what the user wrote, which files the last turns touched, what the
//! todo list holds and what was asked last. Each is looked for in the summary by content
//! (normalized word overlap, file names), not by wording, and whatever is missing is
//! appended in one short section, in a fixed order, so the same inputs always give the
//! same text.

use std::collections::HashSet;

use serde_json::Value;

use crate::record::{Kind, Record};

use super::content::{tool_calls, user_prompt};
use super::text::{content_words, shorten};

const HEADING: &str = include_str!("templates/fidelity_heading.md");

/// Turns whose file reads and edits must be mentioned.
pub const DEFAULT_RECENT_TURNS: usize = 3;

/// A message counts as mentioned when at least half its content words appear in the
/// summary, or this many of them (long messages are paraphrased, not copied).
const ENOUGH_WORDS: usize = 20;

/// Longest quote of a user message in the appended section, in characters.
const QUOTE_CHARS: usize = 400;
/// Longest quote of the latest request: it steers the next step, so more of it stays.
const LATEST_QUOTE_CHARS: usize = 1_000;
/// Characters quoted of an older missing user message when the quotes do not all fit.
const BRIEF_QUOTE_CHARS: usize = 40;

/// Tools whose `file_path` (or `notebook_path`) input names a file the turn touched.
const FILE_TOOLS: &[&str] = &["Read", "Edit", "MultiEdit", "Write", "NotebookEdit"];

/// An open item of the latest todo list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTodo {
    pub content: String,
    /// `pending`, `in_progress`, or whatever the list said.
    pub status: String,
}

/// What the summary must mention.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FidelityFacts {
    /// Every real user message in order, except the latest one.
    pub user_messages: Vec<String>,
    /// The latest real user message.
    pub last_request: Option<String>,
    /// Files read or changed in the last few turns, in order of first touch.
    pub recent_files: Vec<String>,
    /// Items of the latest TodoWrite list that are not completed.
    pub open_todos: Vec<OpenTodo>,
}

impl FidelityFacts {
    /// Collects the facts from the records being summarized. Real user messages are
    /// user records the user typed: not tool results, meta rows, compact summaries,
    /// transcript-only rows, command echoes or reminders. A turn starts at each real
    /// user message; files come from the `recent_turns` latest turns. Only the active
    /// chain counts: what the host rewound away from is no longer the conversation.
    pub fn from_records(records: &[Record], recent_turns: usize) -> FidelityFacts {
        let (slice, _) = crate::view::slice::slice_after_boundary(records);
        let records: Vec<&Record> = slice.on_chain().map(|i| &records[i]).collect();
        let mut prompts: Vec<(usize, String)> = Vec::new();
        let mut todos: Option<Vec<OpenTodo>> = None;
        for (i, record) in records.iter().enumerate() {
            if record.head().is_sidechain {
                continue;
            }
            if let Some(text) = user_prompt(record) {
                prompts.push((i, text));
            }
            if record.head().kind == Kind::Assistant {
                for call in tool_calls(record) {
                    if call.name == "TodoWrite" {
                        todos = Some(open_todos(&call.input));
                    }
                }
            }
        }
        let turns_from = match prompts.len().checked_sub(recent_turns.max(1)) {
            Some(k) => prompts[k].0,
            None => 0,
        };
        let mut recent_files: Vec<String> = Vec::new();
        for record in &records[turns_from..] {
            if record.head().is_sidechain {
                continue;
            }
            for call in tool_calls(record) {
                if !FILE_TOOLS.contains(&call.name.as_str()) {
                    continue;
                }
                let path =
                    call.input.get("file_path").or_else(|| call.input.get("notebook_path")).and_then(Value::as_str);
                if let Some(path) = path
                    && !recent_files.iter().any(|p| p == path)
                {
                    recent_files.push(path.to_owned());
                }
            }
        }
        let last_request = prompts.pop().map(|(_, text)| text);
        FidelityFacts {
            user_messages: prompts.into_iter().map(|(_, text)| text).collect(),
            last_request,
            recent_files,
            open_todos: todos.unwrap_or_default(),
        }
    }
}

fn open_todos(input: &Value) -> Vec<OpenTodo> {
    let Some(items) = input.get("todos").and_then(Value::as_array) else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let content = item.get("content").and_then(Value::as_str)?.trim();
            let status = item.get("status").and_then(Value::as_str).unwrap_or("pending");
            (status != "completed" && !content.is_empty())
                .then(|| OpenTodo { content: content.to_owned(), status: status.to_owned() })
        })
        .collect()
}

/// One thing the summary was checked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FidelityItem {
    UserMessage(String),
    LatestRequest(String),
    File(String),
    OpenTodo(OpenTodo),
}

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FidelityReport {
    /// Items checked. Messages without a content word ("ok", "go on") are not
    /// checkable and not counted.
    pub checked: usize,
    /// Items the model's summary did not mention, in the order they are appended.
    pub missing_before: Vec<FidelityItem>,
    /// The section appended to the summary, if anything was missing.
    pub appended: Option<String>,
}

/// The appended section's room beside a summary body of `body_bytes`, capped at
/// `summary_cap_tokens`: what the cap leaves beside the body, and never less than half
/// the cap, in bytes. A model's summary can leave out nearly everything; a short one
/// leaves room to name all of it, a long one still gets half the cap for the newest of
/// what it left out, and the summary stays near its cap.
pub fn appended_budget(summary_cap_tokens: u64, body_bytes: usize) -> usize {
    let cap = usize::try_from(summary_cap_tokens.saturating_mul(crate::tally::BYTES_PER_TOKEN)).unwrap_or(usize::MAX);
    (cap / 2).max(cap.saturating_sub(body_bytes))
}

/// The summary to install and the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FidelityOutcome {
    pub summary: String,
    pub report: FidelityReport,
}

/// Checks `summary` (the body, tags removed) against `facts` and appends what is
/// missing. The order is fixed: user messages, the latest request, files, open tasks.
///
/// The appended section stays within about `max_appended_bytes`: the latest request,
/// the files and the open tasks always go in; the missing user messages are quoted,
/// the oldest by their first words when the quotes do not all fit; past that, the newest
/// that fit do, and the older ones are counted in one line (a model's short summary of a
/// session with thousands of messages would otherwise grow by all of them).
pub fn check_fidelity(summary: &str, facts: &FidelityFacts, max_appended_bytes: usize) -> FidelityOutcome {
    let words: HashSet<String> = content_words(summary).into_iter().collect();
    let mut checked = 0;
    let mut missing: Vec<FidelityItem> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for message in &facts.user_messages {
        if !seen.insert(message.as_str()) {
            continue;
        }
        match mentioned(message, &words) {
            None => {}
            Some(true) => checked += 1,
            Some(false) => {
                checked += 1;
                missing.push(FidelityItem::UserMessage(message.clone()));
            }
        }
    }
    if let Some(last) = &facts.last_request {
        match mentioned(last, &words) {
            None => {}
            Some(true) => checked += 1,
            Some(false) => {
                checked += 1;
                missing.push(FidelityItem::LatestRequest(last.clone()));
            }
        }
    }
    for path in &facts.recent_files {
        checked += 1;
        if !file_mentioned(path, summary) {
            missing.push(FidelityItem::File(path.clone()));
        }
    }
    for todo in &facts.open_todos {
        match mentioned(&todo.content, &words) {
            None => {}
            Some(true) => checked += 1,
            Some(false) => {
                checked += 1;
                missing.push(FidelityItem::OpenTodo(todo.clone()));
            }
        }
    }
    let appended = (!missing.is_empty()).then(|| render(&missing, max_appended_bytes));
    let summary = match &appended {
        Some(section) => format!("{}\n\n{section}", summary.trim_end()),
        None => summary.to_owned(),
    };
    FidelityOutcome { summary, report: FidelityReport { checked, missing_before: missing, appended } }
}

/// Whether a text's content is in the summary; `None` when it has no content word.
fn mentioned(text: &str, summary_words: &HashSet<String>) -> Option<bool> {
    // Distinct words by sorting: cheaper than hashing each word twice.
    let mut words = content_words(text);
    if words.is_empty() {
        return None;
    }
    words.sort_unstable();
    words.dedup();
    let found = words.iter().filter(|w| summary_words.contains(*w)).count();
    Some(found * 2 >= words.len() || found >= ENOUGH_WORDS)
}

/// A file counts as mentioned when its path or its file name appears.
fn file_mentioned(path: &str, summary: &str) -> bool {
    if summary.contains(path) {
        return true;
    }
    let name = path.rsplit(['/', '\\']).next().unwrap_or(path);
    !name.is_empty() && summary.contains(name)
}

fn render(missing: &[FidelityItem], max_bytes: usize) -> String {
    let lines: Vec<String> = missing.iter().map(line).collect();
    // Everything but the user messages goes in; the user messages share what is left,
    // newest first (they are the likeliest to matter to the next turn).
    let heading = HEADING.trim_end();
    let fixed: usize = heading.len()
        + missing
            .iter()
            .zip(&lines)
            .filter(|(item, _)| !matches!(item, FidelityItem::UserMessage(_)))
            .map(|(_, l)| l.len() + 1)
            .sum::<usize>();
    let messages: Vec<usize> = missing
        .iter()
        .enumerate()
        .filter(|(_, item)| matches!(item, FidelityItem::UserMessage(_)))
        .map(|(i, _)| i)
        .collect();
    let mut lines = lines;
    let mut room = max_bytes.saturating_sub(fixed + left_out_line(messages.len()).len() + 1);
    // The oldest are quoted by their first words, one by one, until every message fits.
    let mut total: usize = messages.iter().map(|&i| lines[i].len() + 1).sum();
    for &i in &messages {
        if total <= room {
            break;
        }
        if let FidelityItem::UserMessage(text) = &missing[i] {
            let brief = user_message_line(text, BRIEF_QUOTE_CHARS);
            total = total - lines[i].len() + brief.len();
            lines[i] = brief;
        }
    }
    // Past that, the oldest are counted instead.
    let mut first_kept = messages.len();
    for (n, &i) in messages.iter().enumerate().rev() {
        let Some(left) = room.checked_sub(lines[i].len() + 1) else { break };
        room = left;
        first_kept = n;
    }
    let mut shown = vec![true; lines.len()];
    for &i in &messages[..first_kept] {
        shown[i] = false;
    }
    let mut out = heading.to_owned();
    if first_kept > 0 {
        out.push('\n');
        out.push_str(&left_out_line(first_kept));
    }
    for (i, l) in lines.iter().enumerate() {
        if shown[i] {
            out.push('\n');
            out.push_str(l);
        }
    }
    out
}

fn user_message_line(text: &str, max_chars: usize) -> String {
    format!("- User message: \"{}\"", shorten(text, max_chars))
}

/// The line that counts the missing user messages left out of the section.
fn left_out_line(count: usize) -> String {
    let noun = if count == 1 { "user message" } else { "user messages" };
    format!("- {count} earlier {noun} the summary does not mention are not repeated here (the transcript has them).")
}

fn line(item: &FidelityItem) -> String {
    match item {
        FidelityItem::UserMessage(text) => user_message_line(text, QUOTE_CHARS),
        FidelityItem::LatestRequest(text) => {
            format!("- Latest user request: \"{}\"", shorten(text, LATEST_QUOTE_CHARS))
        }
        FidelityItem::File(path) => format!("- File touched in the last turns: {path}"),
        FidelityItem::OpenTodo(todo) => {
            format!("- Open task ({}): {}", todo.status.replace('_', " "), shorten(&todo.content, QUOTE_CHARS))
        }
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    fn facts() -> FidelityFacts {
        FidelityFacts {
            user_messages: vec![
                "Add retry logic to the HTTP client with exponential backoff".to_owned(),
                "Also make sure the timeout is configurable through settings.toml".to_owned(),
                "ok".to_owned(),
            ],
            last_request: Some("Now write tests for the retry logic".to_owned()),
            recent_files: vec!["/repo/src/client.rs".to_owned(), "/repo/settings.toml".to_owned()],
            open_todos: vec![OpenTodo { content: "Write retry tests".to_owned(), status: "in_progress".to_owned() }],
        }
    }

    #[test]
    fn a_complete_summary_gets_nothing_appended() {
        let summary = "1. Primary Request and Intent:\n   The user wants retries with exponential backoff in the HTTP client, \
                       a timeout configurable in settings.toml, and tests for the retry logic.\n\
                       3. Files and Code Sections:\n   - client.rs: retry loop\n7. Pending Tasks:\n   - write retry tests";
        let outcome = check_fidelity(summary, &facts(), usize::MAX);
        assert_eq!(outcome.summary, summary);
        assert_eq!(outcome.report.missing_before, Vec::new());
        assert_eq!(outcome.report.appended, None);
        // Two messages, the latest request, two files, one task; "ok" is not checkable.
        assert_eq!(outcome.report.checked, 6);
    }

    #[test]
    fn a_summary_missing_a_message_and_a_file_gets_them_appended() {
        let summary = "1. Primary Request and Intent:\n   Retries with exponential backoff in the HTTP client; \
                       tests for the retry logic are next.\n3. Files and Code Sections:\n   - src/client.rs";
        let outcome = check_fidelity(summary, &facts(), usize::MAX);
        assert_eq!(
            outcome.report.missing_before,
            vec![
                FidelityItem::UserMessage(
                    "Also make sure the timeout is configurable through settings.toml".to_owned()
                ),
                FidelityItem::File("/repo/settings.toml".to_owned()),
            ]
        );
        expect![[r#"
            1. Primary Request and Intent:
               Retries with exponential backoff in the HTTP client; tests for the retry logic are next.
            3. Files and Code Sections:
               - src/client.rs

            Details the summary did not mention (added by ctxd from the transcript):
            - User message: "Also make sure the timeout is configurable through settings.toml"
            - File touched in the last turns: /repo/settings.toml"#]]
        .assert_eq(&outcome.summary);
        // The open task counts as mentioned: "retry" and "test" are both there.
        assert_eq!(outcome.report.checked, 6);
        // Running the check on its own output finds nothing more: the section mentions
        // everything it adds.
        let again = check_fidelity(&outcome.summary, &facts(), usize::MAX);
        assert_eq!(again.report.missing_before, Vec::new());
    }

    #[test]
    fn thousands_of_missing_messages_keep_the_section_within_its_budget() {
        let facts = FidelityFacts {
            user_messages: (0..3_000)
                .map(|i| format!("request number {i} about the parser module {i}, {}", "with more detail ".repeat(5)))
                .collect(),
            last_request: Some("now write the release notes".to_owned()),
            recent_files: vec!["/repo/src/parser.rs".to_owned()],
            open_todos: vec![OpenTodo { content: "Update the changelog".to_owned(), status: "pending".to_owned() }],
        };
        // Room for every message's first words.
        let roomy = check_fidelity("Nothing relevant.", &facts, 200_000).report.appended.unwrap();
        assert!(roomy.len() <= 200_000 && !roomy.contains("earlier user messages"));
        for i in [0, 1_500, 2_999] {
            assert!(roomy.contains(&format!("request number {i} about")), "{i}");
        }
        assert!(roomy.contains("module 2999, with more detail with more detail"), "the newest is whole");
        let oldest = roomy.lines().find(|l| l.contains("request number 0 about")).unwrap();
        assert!(oldest.ends_with("…\"") && oldest.len() < 70, "the oldest is brief: {oldest}");
        let budget = 4_000;
        let outcome = check_fidelity("Nothing relevant.", &facts, budget);
        let section = outcome.report.appended.unwrap();
        assert!(section.len() <= budget, "{} bytes", section.len());
        // Every message is missing; the newest that fit are shown, the rest counted.
        assert_eq!(outcome.report.missing_before.len(), 3_000 + 3);
        let shown = section.lines().filter(|l| l.starts_with("- User message: ")).count();
        assert!(shown > 10, "{section}");
        assert!(section.contains(&format!("- {} earlier user messages the summary does not mention", 3_000 - shown)));
        assert!(section.contains("request number 2999 about"), "the newest is shown");
        assert!(!section.contains("request number 0 about"), "the oldest is counted");
        assert!(section.contains("- Latest user request: \"now write the release notes\""));
        assert!(section.contains("- File touched in the last turns: /repo/src/parser.rs"));
        assert!(section.contains("- Open task (pending): Update the changelog"));
        assert_eq!(appended_budget(20_000, 70_000), 40_000);
        assert_eq!(appended_budget(20_000, 1_000), 79_000);
    }

    #[test]
    fn wording_does_not_matter_but_content_does() {
        let facts = FidelityFacts {
            last_request: Some("please fix the failing parser tests".to_owned()),
            ..FidelityFacts::default()
        };
        // Same content words in other forms: "fixing", "parser", "test".
        let paraphrase = check_fidelity("Work stopped while fixing a parser test that fails.", &facts, usize::MAX);
        assert_eq!(paraphrase.report.missing_before, Vec::new());
        let unrelated = check_fidelity("The user asked about deployment.", &facts, usize::MAX);
        assert_eq!(
            unrelated.report.missing_before,
            vec![FidelityItem::LatestRequest("please fix the failing parser tests".to_owned())]
        );
        assert!(unrelated.summary.ends_with("- Latest user request: \"please fix the failing parser tests\""));
    }

    #[test]
    fn every_missing_kind_is_rendered_in_a_fixed_order() {
        let outcome = check_fidelity("Nothing relevant.", &facts(), usize::MAX);
        expect![[r#"
            Details the summary did not mention (added by ctxd from the transcript):
            - User message: "Add retry logic to the HTTP client with exponential backoff"
            - User message: "Also make sure the timeout is configurable through settings.toml"
            - Latest user request: "Now write tests for the retry logic"
            - File touched in the last turns: /repo/src/client.rs
            - File touched in the last turns: /repo/settings.toml
            - Open task (in progress): Write retry tests"#]]
        .assert_eq(outcome.report.appended.as_deref().unwrap_or(""));
    }
}
