//! One pass over the transcript that collects the facts the offline summary is written
//! from: real user prompts, assistant text, tool calls with their outcomes, files
//! touched, the latest todo list, an earlier summary to carry forward, and term counts.
//!
//! It exists so the section writers never look at JSON: each record's line is parsed
//! once, with borrowing, targeted deserializers that skip whatever the summary does not
//! use (large tool results are borrowed or copied once, never turned into a JSON tree).
//! Records that the host writes for itself, side chains, API error stand-ins and
//! synthetic assistant turns are left out here, in one place.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::terms::{FastHasher, FastMap, FastSet, Terms};
use super::text::short;
use super::{EditQuote, FileTouched, LineRange};
use crate::record::{Kind, Record};

/// A real user prompt.
#[derive(Debug, Clone)]
pub(super) struct Prompt {
    pub seq: usize,
    pub text: String,
}

/// One text block the assistant wrote.
#[derive(Debug, Clone)]
pub(super) struct Said {
    pub seq: usize,
    /// Index into [`Facts::messages`]: blocks of one split response share it.
    pub message: usize,
    pub text: String,
}

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    /// No result in the records (the call was in flight when the records end).
    Pending,
    Ok,
    /// Failed; the line that says why.
    Failed(String),
}

/// One tool call.
#[derive(Debug, Clone)]
pub(super) struct Step {
    pub seq: usize,
    pub tool: String,
    /// Short human description: "Read src/a.rs", "Bash `cargo test`".
    pub label: String,
    pub outcome: Outcome,
    /// Sequence number of the result, once it arrived.
    pub result_seq: Option<usize>,
    /// The file this call reads or changes, applied when the result says it worked.
    file_effect: Option<FileEffect>,
}

/// One assistant API message (the merge of its lines).
#[derive(Debug, Clone, Default)]
pub(super) struct AssistantMessage {
    pub last_seq: usize,
    pub has_text: bool,
    pub has_tool_use: bool,
    pub stop_reason: Option<String>,
}

impl AssistantMessage {
    /// True when this message ended the assistant's turn (a reply, not a tool round).
    pub(super) fn ends_turn(&self) -> bool {
        match self.stop_reason.as_deref() {
            Some("tool_use") => false,
            Some(_) => self.has_text || !self.has_tool_use,
            None => self.has_text && !self.has_tool_use,
        }
    }
}

/// One entry of a todo list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Todo {
    pub content: String,
    pub status: String,
}

/// Everything the section writers need.
#[derive(Debug, Default)]
pub(super) struct Facts {
    pub prompts: Vec<Prompt>,
    pub said: Vec<Said>,
    pub steps: Vec<Step>,
    pub messages: Vec<AssistantMessage>,
    /// Files, newest touch first.
    pub files: Vec<FileTouched>,
    /// Items of the latest todo list written, if any.
    pub todos: Option<Vec<Todo>>,
    /// Text of the latest earlier compaction summary among the records.
    pub prior_summary: Option<String>,
    pub terms: Terms,
}

#[derive(Debug, Clone)]
enum FileEffect {
    Read { path: String, range: Option<LineRange> },
    Edit { path: String, old: String, new: String },
    Write { path: String, lines: usize },
}

/// Per-file state while scanning.
#[derive(Debug, Default)]
struct FileState {
    touched: FileTouched,
    last_seq: usize,
}

/// Weight of each source in the term counts: the user's own words matter most.
const WEIGHT_PROMPT: u32 = 4;
const WEIGHT_ASSISTANT: u32 = 2;
const WEIGHT_TOOL: u32 = 1;
/// Only the head of a tool result feeds the term counts: enough to catch the names in a
/// file or an error, without letting one huge output drown the conversation.
const RESULT_TERMS_BYTES: usize = 2_048;

/// Scanner state.
#[derive(Default)]
struct Scan {
    facts: Facts,
    seq: usize,
    step_by_id: FastMap<String, usize>,
    message_by_id: FastMap<String, usize>,
    /// Texts already taken per message, to drop blocks repeated across split lines.
    seen_text: FastSet<(usize, u64)>,
    files: FastMap<String, FileState>,
}

/// Collects the facts from the records a summary covers.
pub(super) fn scan(records: &[Record]) -> Facts {
    let mut s = Scan::default();
    let active = active_records(records);
    // A subagent's own transcript is side chain from end to end: then the side chain is
    // the conversation. Otherwise side-chain records belong to someone else.
    let own_side_chain =
        active.iter().filter(|r| matches!(r.head().kind, Kind::User | Kind::Assistant)).all(|r| r.head().is_sidechain);
    for record in active {
        let head = record.head();
        if (head.is_sidechain && !own_side_chain) || head.is_api_error {
            continue;
        }
        match head.kind {
            Kind::User => s.user(record),
            Kind::Assistant if head.model.as_deref() != Some("<synthetic>") => s.assistant(record),
            Kind::Attachment => s.attachment(record),
            _ => {}
        }
    }
    s.finish()
}

/// The records a summary covers: after the latest compact boundary (what came before is
/// represented by the summary that follows it), with the messages that boundary kept
/// verbatim put back right after that summary, where the model saw them, and only those
/// on the active chain: a branch the host rewound away from is no part of the
/// conversation (its prompts are not pending, its files not in hand).
fn active_records(records: &[Record]) -> Vec<&Record> {
    let (slice, _) = crate::view::slice::slice_after_boundary(records);
    slice.on_chain().map(|i| &records[i]).collect()
}

// ---------------------------------------------------------------------------------
// Targeted deserializers. Everything is optional and unknown fields are skipped, so a
// host that adds fields never breaks the summary; values of an unexpected shape become
// "absent" rather than failing the record wherever that is cheap to do.

/// A value that is used when it is a JSON object and ignored otherwise.
struct IfObject<T>(Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for IfObject<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = IfObject<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(|t| IfObject(Some(t)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(IfObject(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(IfObject(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(IfObject(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(IfObject(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(IfObject(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(IfObject(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(IfObject(None))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// Message content: a string, a list of blocks, or something else (ignored).
enum Content<'a> {
    Text(Cow<'a, str>),
    Blocks(Vec<IfObject<Block<'a>>>),
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Content<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("message content")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(v)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut blocks = Vec::with_capacity(seq.size_hint().unwrap_or(2));
                while let Some(b) = seq.next_element::<IfObject<Block<'a>>>()? {
                    blocks.push(b);
                }
                Ok(Content::Blocks(blocks))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Content::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// One content block of any type; only the fields the summary reads.
#[derive(Deserialize)]
struct Block<'a> {
    #[serde(borrow, default, rename = "type")]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_use_id: Option<Cow<'a, str>>,
    /// A tool result's content, kept as JSON text and decoded only when needed.
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(default)]
    is_error: Option<bool>,
}

#[derive(Deserialize)]
struct UserLine<'a> {
    #[serde(borrow, default)]
    message: Option<IfObject<MessageBody<'a>>>,
    #[serde(default, rename = "toolUseResult")]
    tool_use_result: Option<IfObject<ResultMeta>>,
}

#[derive(Deserialize)]
struct MessageBody<'a> {
    #[serde(borrow, default)]
    content: Option<Content<'a>>,
    #[serde(borrow, default)]
    stop_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct AssistantLine<'a> {
    #[serde(borrow, default)]
    message: Option<IfObject<MessageBody<'a>>>,
}

/// `toolUseResult` of a Read: which lines of which file came back.
#[derive(Deserialize)]
struct ResultMeta {
    #[serde(default)]
    file: Option<IfObject<FileMeta>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FileMeta {
    #[serde(default)]
    file_path: Option<String>,
    #[serde(default, deserialize_with = "lenient_u64")]
    start_line: Option<u64>,
    #[serde(default, deserialize_with = "lenient_u64")]
    num_lines: Option<u64>,
    #[serde(default, deserialize_with = "lenient_u64")]
    total_lines: Option<u64>,
}

#[derive(Deserialize)]
struct AttachmentLine<'a> {
    #[serde(borrow, default)]
    attachment: Option<IfObject<Attachment<'a>>>,
}

#[derive(Deserialize)]
struct Attachment<'a> {
    #[serde(borrow, default, rename = "type")]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    filename: Option<Cow<'a, str>>,
    #[serde(default)]
    content: Option<IfObject<ResultMeta>>,
}

/// The fields of tool inputs the summary reads, across the common tools.
#[derive(Deserialize, Default)]
struct ToolInput<'a> {
    #[serde(borrow, default)]
    file_path: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    notebook_path: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    path: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    command: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    description: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pattern: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    url: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    query: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    old_string: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    new_string: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    new_source: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "lenient_u64")]
    offset: Option<u64>,
    #[serde(default, deserialize_with = "lenient_u64")]
    limit: Option<u64>,
    #[serde(default)]
    edits: Option<Vec<IfObject<EditPair>>>,
    #[serde(default)]
    todos: Option<Vec<IfObject<TodoInput>>>,
}

#[derive(Deserialize)]
struct EditPair {
    #[serde(default)]
    old_string: Option<String>,
    #[serde(default)]
    new_string: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TodoInput {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    status: Option<String>,
}

/// A number, or absent for anything else (a string, null, a float).
fn lenient_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a number")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(u64::try_from(v).ok())
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Ok((v >= 0.0 && v.fract() == 0.0 && v < 1e15).then_some(v as u64))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(v.trim().parse().ok())
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(None)
        }
    }
    d.deserialize_any(V)
}

// ---------------------------------------------------------------------------------
// Which user text is a real prompt.

/// Starts of texts the host writes into user records: command echoes, caveats,
/// reminders, notifications. None of them is something the user asked.
const HOST_TEXT_PREFIXES: &[&str] = &[
    "<local-command-caveat>",
    "<local-command-stdout>",
    "<local-command-stderr>",
    "<bash-stdout>",
    "<bash-stderr>",
    "<system-reminder>",
    "<task-notification>",
    "<user-prompt-submit-hook>",
    "Caveat: The messages below were generated by the user while running local commands",
    "[Request interrupted by user",
    CONTINUATION_PREFIX,
];

/// How an installed compaction summary starts (for hosts that do not flag it).
const CONTINUATION_PREFIX: &str = "This session is being continued from a previous conversation";

/// Slash commands that only steer the host; their echo is not a request to the model.
const HOST_COMMANDS: &[&str] = &[
    "compact",
    "clear",
    "context",
    "cost",
    "status",
    "help",
    "config",
    "model",
    "exit",
    "quit",
    "resume",
    "login",
    "logout",
    "doctor",
    "permissions",
    "hooks",
    "mcp",
    "memory",
    "ide",
    "autocompact",
    "usage",
    "statusline",
    "theme",
    "vim",
    "export",
    "rewind",
    "terminal-setup",
    "bug",
    "feedback",
    "release-notes",
    "upgrade",
    "agents",
];

/// The text of `<tag>…</tag>` inside `text`.
fn tag_text<'t>(text: &'t str, tag: &str) -> Option<&'t str> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = text.find(&open)? + open.len();
    let end = text[start..].find(&close)? + start;
    Some(text[start..end].trim())
}

/// The prompt a user text stands for, or `None` when the host wrote it. Compaction's
/// fidelity check reads user texts the same way.
pub(crate) fn prompt_text(text: &str) -> Option<Cow<'_, str>> {
    let trimmed = text.trim();
    if trimmed.is_empty() || HOST_TEXT_PREFIXES.iter().any(|p| trimmed.starts_with(p)) {
        return None;
    }
    if trimmed.starts_with("<command-name>") || trimmed.starts_with("<command-message>") {
        // A slash command: keep it as the user typed it unless it only steers the host.
        let name = tag_text(trimmed, "command-name")?.trim_start_matches('/');
        if name.is_empty() || HOST_COMMANDS.contains(&name) {
            return None;
        }
        let args = tag_text(trimmed, "command-args").unwrap_or("");
        return Some(Cow::Owned(if args.is_empty() { format!("/{name}") } else { format!("/{name} {args}") }));
    }
    if trimmed.starts_with("<bash-input>") {
        return tag_text(trimmed, "bash-input").map(|c| Cow::Owned(format!("! {c}")));
    }
    Some(Cow::Borrowed(trimmed))
}

// ---------------------------------------------------------------------------------
// Tool results that failed.

/// Tools whose output is free text where failure shows up as words, not as a flag.
fn is_shell_tool(name: &str) -> bool {
    matches!(name, "Bash" | "BashOutput" | "PowerShell" | "Shell" | "shell" | "KillShell")
}

/// The line that makes a shell output look like a failure, if any. Only the first and
/// last `SHELL_SCAN_BYTES` of a long output are read: compilers report first, test
/// runners and exit codes last, and hosts cut long outputs to about this size anyway.
fn error_line(text: &str) -> Option<&str> {
    if text.len() <= 2 * SHELL_SCAN_BYTES {
        return error_line_in(text);
    }
    let head = text.floor_char_boundary(SHELL_SCAN_BYTES);
    let tail = text.ceil_char_boundary(text.len() - SHELL_SCAN_BYTES);
    error_line_in(&text[..head]).or_else(|| error_line_in(&text[tail..]))
}

/// Bytes read at each end of a long shell output when looking for a failure.
const SHELL_SCAN_BYTES: usize = 32 * 1024;

fn error_line_in(text: &str) -> Option<&str> {
    // Short anchors cover several spellings ("rror" finds error[, error:, Error:);
    // `counts_as_failure` then looks at the match in context. Ordered by how clearly
    // each means failure.
    const ANCHORS: &[&str] = &[
        "rror",
        "RROR:",
        "panicked at",
        "Traceback (most recent call last)",
        "FAILED",
        "ailed",
        "xit ",
        "command not found",
        "fatal: ",
    ];
    for anchor in ANCHORS {
        let mut from = 0;
        while let Some(i) = text[from..].find(anchor) {
            let at = from + i;
            from = at + anchor.len();
            if counts_as_failure(text, at, anchor) {
                return Some(line_around(text, at));
            }
        }
    }
    None
}

/// Decides whether an anchor match means failure, rejecting the common false alarms:
/// "0 failed", "exit code 0", "errors: 0", a warning that mentions a failure.
fn counts_as_failure(text: &str, at: usize, anchor: &str) -> bool {
    let before = &text[..at];
    let after = &text[at + anchor.len()..];
    let prev_byte = before.as_bytes().last().copied();
    let next_byte = after.as_bytes().first().copied();
    let shape_ok = match anchor {
        // error[E0308], error: …, Error: …, TypeError: … (not "errors", "error_count").
        "rror" => matches!(prev_byte, Some(b'e' | b'E')) && matches!(next_byte, Some(b'[' | b':')),
        "FAILED" => true,
        // failed, Failed (not "0 failed", "failedTests").
        "ailed" => {
            matches!(prev_byte, Some(b'f' | b'F'))
                && !next_byte.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
                && {
                    // "0 failed" is a count of zero, "10 failed" is not.
                    let prev = before[..before.len() - 1].trim_end_matches([' ', '\t']);
                    let zero = prev.strip_suffix('0').is_some_and(|p| !p.ends_with(|c: char| c.is_ascii_digit()));
                    !zero
                }
        }
        // Exit code N / exit code N / exit status N, N not zero.
        "xit " => {
            let word_ok = matches!(prev_byte, Some(b'e' | b'E'));
            let rest = after.strip_prefix("code ").or_else(|| after.strip_prefix("status "));
            word_ok
                && rest.is_some_and(|r| {
                    let digits: &str = &r[..r.bytes().take_while(u8::is_ascii_digit).count()];
                    !digits.is_empty() && digits.bytes().any(|b| b != b'0')
                })
        }
        _ => true,
    };
    if !shape_ok {
        return false;
    }
    if anchor != "xit " {
        // A failure a log line warns about is not the command failing.
        let line = line_around(text, at);
        if line.len() < 4096 && line.to_ascii_lowercase().contains("warn") {
            return false;
        }
    }
    true
}

/// The whole line containing byte `at`.
fn line_around(text: &str, at: usize) -> &str {
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    text[start..end].trim()
}

/// Why a result flagged as an error failed: its first non-empty lines, without the
/// host's wrapper tags.
fn error_excerpt(text: &str) -> String {
    let mut lines = Vec::new();
    for line in text.lines() {
        let line = line.replace("<tool_use_error>", "").replace("</tool_use_error>", "");
        let line = line.trim();
        if !line.is_empty() {
            lines.push(line.to_owned());
            if lines.len() == 3 {
                break;
            }
        }
    }
    if lines.is_empty() {
        return "(no error text)".to_owned();
    }
    short(&lines.join(" / "), ERROR_LINE_BYTES)
}

/// Longest error line kept per failure.
const ERROR_LINE_BYTES: usize = 300;

// ---------------------------------------------------------------------------------

impl Scan {
    fn next_seq(&mut self) -> usize {
        self.seq += 1;
        self.seq
    }

    fn user(&mut self, record: &Record) {
        let head = record.head();
        if head.is_compact_summary {
            if let Some(text) = plain_user_text(record.line()) {
                self.facts.prior_summary = Some(text);
            }
            return;
        }
        if head.is_meta {
            return;
        }
        let Ok(line) = serde_json::from_str::<UserLine<'_>>(record.line()) else {
            return;
        };
        let meta = line.tool_use_result.and_then(|r| r.0).and_then(|r| r.file).and_then(|f| f.0);
        let Some(content) = line.message.and_then(|m| m.0).and_then(|m| m.content) else {
            return;
        };
        match content {
            Content::Text(text) => {
                if text.trim_start().starts_with(CONTINUATION_PREFIX) {
                    // An earlier summary written by a host that did not flag it.
                    self.facts.prior_summary = Some(text.into_owned());
                } else if let Some(prompt) = prompt_text(&text) {
                    self.prompt(prompt.into_owned());
                }
            }
            Content::Blocks(blocks) => {
                let mut parts: Vec<String> = Vec::new();
                let mut images = 0usize;
                let mut results = 0usize;
                for block in blocks.into_iter().filter_map(|b| b.0) {
                    match block.ty.as_deref() {
                        Some("text") => {
                            if let Some(p) = block.text.as_deref().and_then(prompt_text) {
                                parts.push(p.into_owned());
                            }
                        }
                        Some("image") => images += 1,
                        Some("document") => parts.push("[document attached]".to_owned()),
                        Some("tool_result") => {
                            results += 1;
                            self.tool_result(&block, meta.as_ref());
                        }
                        _ => {}
                    }
                }
                if results == 0 && meta.is_some() {
                    // A Read result recorded without a matching block: still a read.
                    if let Some(m) = &meta {
                        self.apply_file_meta(m, false);
                    }
                }
                if images > 0 && (!parts.is_empty() || results == 0) {
                    parts.push(if images == 1 {
                        "[image attached]".to_owned()
                    } else {
                        format!("[{images} images attached]")
                    });
                }
                if !parts.is_empty() {
                    self.prompt(parts.join("\n\n"));
                }
            }
            Content::Other => {}
        }
    }

    fn prompt(&mut self, text: String) {
        let seq = self.next_seq();
        self.facts.terms.add(&text, WEIGHT_PROMPT);
        self.facts.prompts.push(Prompt { seq, text });
    }

    fn tool_result(&mut self, block: &Block<'_>, meta: Option<&FileMeta>) {
        let seq = self.next_seq();
        let step_index = block.tool_use_id.as_deref().and_then(|id| self.step_by_id.get(id).copied());
        let tool = step_index.map(|i| self.facts.steps[i].tool.as_str()).unwrap_or("");
        let is_error = block.is_error == Some(true);
        let raw = block.content.map_or("", RawValue::get);
        let failure = if is_error || is_shell_tool(tool) || raw.starts_with('[') {
            // Decode only the results whose words are needed: failures, shell output
            // (where failure shows in the text) and block lists.
            let text = result_text(raw);
            let head_end = text.floor_char_boundary(RESULT_TERMS_BYTES);
            self.facts.terms.add(&text[..head_end], WEIGHT_TOOL);
            if is_error {
                Some(error_excerpt(&text))
            } else if is_shell_tool(tool) {
                error_line(&text).map(|l| short(l, ERROR_LINE_BYTES))
            } else {
                None
            }
        } else {
            // File contents, search hits: counted straight from the stored JSON.
            let head_end = raw.floor_char_boundary(RESULT_TERMS_BYTES);
            self.facts.terms.add_json(&raw[..head_end], WEIGHT_TOOL);
            None
        };
        let failed = failure.is_some();
        if let Some(i) = step_index {
            let effect = {
                let step = &mut self.facts.steps[i];
                step.result_seq = Some(seq);
                step.outcome = match failure {
                    Some(why) => Outcome::Failed(why),
                    None => Outcome::Ok,
                };
                if failed { None } else { step.file_effect.take() }
            };
            if let Some(mut effect) = effect {
                // The result's own line numbers beat the requested window (a limit
                // past the end of the file reads fewer lines).
                if let (FileEffect::Read { range, .. }, Some(_)) = (&mut effect, meta) {
                    *range = None;
                }
                self.apply_effect(effect, seq);
            }
        } else if let Some(why) = failure {
            // A result whose call is not among the records (it came before them).
            self.facts.steps.push(Step {
                seq,
                tool: String::new(),
                label: "an earlier tool call".to_owned(),
                outcome: Outcome::Failed(why),
                result_seq: Some(seq),
                file_effect: None,
            });
        }
        if !failed && let Some(m) = meta {
            self.apply_file_meta(m, false);
        }
    }

    fn assistant(&mut self, record: &Record) {
        let Ok(line) = serde_json::from_str::<AssistantLine<'_>>(record.line()) else {
            return;
        };
        let Some(body) = line.message.and_then(|m| m.0) else {
            return;
        };
        let message = match record.head().message_id.as_deref() {
            Some(id) => match self.message_by_id.get(id) {
                Some(&m) => m,
                None => {
                    self.facts.messages.push(AssistantMessage::default());
                    let m = self.facts.messages.len() - 1;
                    self.message_by_id.insert(id.to_owned(), m);
                    m
                }
            },
            None => {
                self.facts.messages.push(AssistantMessage::default());
                self.facts.messages.len() - 1
            }
        };
        if let Some(reason) = body.stop_reason.as_deref() {
            self.facts.messages[message].stop_reason = Some(reason.to_owned());
        }
        match body.content {
            Some(Content::Text(text)) => self.said(message, &text),
            Some(Content::Blocks(blocks)) => {
                for block in blocks.into_iter().filter_map(|b| b.0) {
                    match block.ty.as_deref() {
                        Some("text") => {
                            if let Some(text) = block.text.as_deref() {
                                self.said(message, text);
                            }
                        }
                        Some("tool_use") => self.tool_use(message, &block),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }

    fn said(&mut self, message: usize, text: &str) {
        let text = text.trim();
        if text.is_empty() || !self.seen_text.insert((message, hash(text))) {
            return;
        }
        let seq = self.next_seq();
        self.facts.terms.add(text, WEIGHT_ASSISTANT);
        let m = &mut self.facts.messages[message];
        m.has_text = true;
        m.last_seq = seq;
        self.facts.said.push(Said { seq, message, text: text.to_owned() });
    }

    fn tool_use(&mut self, message: usize, block: &Block<'_>) {
        let id = block.id.as_deref().unwrap_or("");
        if !id.is_empty() && self.step_by_id.contains_key(id) {
            return; // The same block repeated on another line of the response.
        }
        let seq = self.next_seq();
        let tool = block.name.as_deref().unwrap_or("tool").to_owned();
        let input: ToolInput<'_> = block.input.and_then(|raw| serde_json::from_str(raw.get()).ok()).unwrap_or_default();
        let (label, file_effect) = describe(&tool, &input);
        for text in [&input.command, &input.pattern, &input.query, &input.description].into_iter().flatten() {
            self.facts.terms.add(text, WEIGHT_TOOL);
        }
        if tool == "TodoWrite"
            && let Some(todos) = &input.todos
        {
            self.facts.todos = Some(
                todos
                    .iter()
                    .filter_map(|t| t.0.as_ref())
                    .map(|t| Todo {
                        content: t.content.clone().unwrap_or_default(),
                        status: t.status.clone().unwrap_or_else(|| "pending".to_owned()),
                    })
                    .filter(|t| !t.content.trim().is_empty())
                    .collect(),
            );
        }
        let m = &mut self.facts.messages[message];
        m.has_tool_use = true;
        m.last_seq = seq;
        if !id.is_empty() {
            self.step_by_id.insert(id.to_owned(), self.facts.steps.len());
        }
        self.facts.steps.push(Step { seq, tool, label, outcome: Outcome::Pending, result_seq: None, file_effect });
    }

    fn attachment(&mut self, record: &Record) {
        let Ok(line) = serde_json::from_str::<AttachmentLine<'_>>(record.line()) else {
            return;
        };
        let Some(att) = line.attachment.and_then(|a| a.0) else {
            return;
        };
        match att.ty.as_deref() {
            Some("file") => {
                let meta = att.content.and_then(|c| c.0).and_then(|c| c.file).and_then(|f| f.0);
                match meta {
                    Some(m) => self.apply_file_meta(&m, true),
                    None => {
                        if let Some(name) = att.filename.as_deref() {
                            let seq = self.next_seq();
                            self.file(name, seq).touched.restored = true;
                        }
                    }
                }
            }
            Some("compact_file_reference") => {
                if let Some(name) = att.filename.as_deref() {
                    let seq = self.next_seq();
                    self.file(name, seq).touched.referenced = true;
                }
            }
            _ => {}
        }
    }

    fn file(&mut self, path: &str, seq: usize) -> &mut FileState {
        let state = self.files.entry(path.to_owned()).or_insert_with(|| FileState {
            touched: FileTouched { path: path.to_owned(), ..FileTouched::default() },
            last_seq: 0,
        });
        state.last_seq = state.last_seq.max(seq);
        state
    }

    /// Lines a Read (or a restored file) returned.
    fn apply_file_meta(&mut self, meta: &FileMeta, restored: bool) {
        let Some(path) = meta.file_path.as_deref() else {
            return;
        };
        let seq = self.seq;
        let range = match (meta.start_line, meta.num_lines) {
            (Some(start), Some(n)) if n > 0 => Some(LineRange { start: start.max(1), end: start.max(1) + n - 1 }),
            _ => None,
        };
        let state = self.file(path, seq);
        if restored {
            state.touched.restored = true;
        } else {
            state.touched.read = true;
        }
        if let Some(total) = meta.total_lines {
            state.touched.total_lines = Some(total);
        }
        if let Some(r) = range {
            state.touched.ranges.push(r);
        }
    }

    fn apply_effect(&mut self, effect: FileEffect, seq: usize) {
        match effect {
            FileEffect::Read { path, range } => {
                let state = self.file(&path, seq);
                state.touched.read = true;
                if let Some(r) = range {
                    state.touched.ranges.push(r);
                }
            }
            FileEffect::Edit { path, old, new } => {
                let state = self.file(&path, seq);
                state.touched.edited = true;
                state.touched.edits += 1;
                state.touched.last_edit = Some(EditQuote { old, new });
            }
            FileEffect::Write { path, lines } => {
                let state = self.file(&path, seq);
                state.touched.written = true;
                state.touched.written_lines = Some(lines);
            }
        }
    }

    fn finish(mut self) -> Facts {
        // Calls still waiting for their result count as done for the file list: the
        // agent was acting on those files when the records end.
        let pending: Vec<(FileEffect, usize)> = self
            .facts
            .steps
            .iter_mut()
            .filter(|s| s.outcome == Outcome::Pending)
            .filter_map(|s| s.file_effect.take().map(|e| (e, s.seq)))
            .collect();
        for (effect, seq) in pending {
            self.apply_effect(effect, seq);
        }
        let mut files: Vec<FileState> = self.files.into_values().collect();
        // Newest first; the path breaks ties so the order never depends on hashing.
        files.sort_by(|a, b| b.last_seq.cmp(&a.last_seq).then_with(|| a.touched.path.cmp(&b.touched.path)));
        self.facts.files = files
            .into_iter()
            .map(|mut f| {
                f.touched.ranges = merge_ranges(std::mem::take(&mut f.touched.ranges));
                f.touched
            })
            .collect();
        self.facts
    }
}

/// Sorted, with overlapping and adjacent ranges joined.
fn merge_ranges(mut ranges: Vec<LineRange>) -> Vec<LineRange> {
    ranges.sort_by_key(|r| (r.start, r.end));
    let mut out: Vec<LineRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end.saturating_add(1) => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// A short label for a tool call and the file effect it has once it succeeds.
fn describe(tool: &str, input: &ToolInput<'_>) -> (String, Option<FileEffect>) {
    let file = input.file_path.as_deref().or(input.notebook_path.as_deref());
    match (tool, file) {
        ("Read", Some(path)) => {
            let range = input.limit.filter(|n| *n > 0).map(|n| {
                let start = input.offset.unwrap_or(1).max(1);
                LineRange { start, end: start + n - 1 }
            });
            let label = match (&range, input.offset) {
                (Some(r), _) => format!("Read {path} (lines {}–{})", r.start, r.end),
                (None, Some(o)) => format!("Read {path} (from line {o})"),
                (None, None) => format!("Read {path}"),
            };
            (label, Some(FileEffect::Read { path: path.to_owned(), range }))
        }
        ("Edit" | "MultiEdit" | "NotebookEdit", Some(path)) => {
            let (old, new) = match (&input.old_string, &input.new_string, &input.edits, &input.new_source) {
                (_, Some(new), _, _) => (input.old_string.as_deref().unwrap_or(""), new.as_ref()),
                (_, _, Some(edits), _) => edits.iter().rev().find_map(|e| e.0.as_ref()).map_or(("", ""), |e| {
                    (e.old_string.as_deref().unwrap_or(""), e.new_string.as_deref().unwrap_or(""))
                }),
                (_, _, _, Some(src)) => ("", src.as_ref()),
                _ => ("", ""),
            };
            let (old, new) = edit_quotes(old, new);
            let effect = FileEffect::Edit { path: path.to_owned(), old, new };
            (format!("{tool} {path}"), Some(effect))
        }
        ("Write", Some(path)) => {
            let lines = input.content.as_deref().map_or(0, |c| c.lines().count());
            (format!("Write {path} ({lines} lines)"), Some(FileEffect::Write { path: path.to_owned(), lines }))
        }
        _ => {
            let detail = if let Some(cmd) = input.command.as_deref() {
                format!(" `{}`", short(cmd, LABEL_DETAIL_BYTES))
            } else if let Some(p) = input.pattern.as_deref() {
                match input.path.as_deref() {
                    Some(dir) => format!(" `{}` in {}", short(p, LABEL_DETAIL_BYTES), short(dir, LABEL_DETAIL_BYTES)),
                    None => format!(" `{}`", short(p, LABEL_DETAIL_BYTES)),
                }
            } else if let Some(q) = input.query.as_deref() {
                format!(" `{}`", short(q, LABEL_DETAIL_BYTES))
            } else if let Some(u) = input.url.as_deref() {
                format!(" {}", short(u, LABEL_DETAIL_BYTES))
            } else if let Some(d) = input.description.as_deref() {
                format!(": {}", short(d, LABEL_DETAIL_BYTES))
            } else if let Some(f) = file.or(input.path.as_deref()) {
                format!(" {f}")
            } else if let Some(t) = &input.todos {
                format!(" ({} items)", t.len())
            } else {
                String::new()
            };
            (format!("{tool}{detail}"), None)
        }
    }
}

/// Both sides of an edit on one line each, starting near where they differ: a shared
/// opening (a function signature, a comment) would otherwise fill both quotes.
fn edit_quotes(old: &str, new: &str) -> (String, String) {
    let (old, new) = (one_line_prefix(old), one_line_prefix(new));
    let common = old
        .char_indices()
        .zip(new.chars())
        .take_while(|((_, a), b)| a == b)
        .last()
        .map_or(0, |((i, a), _)| i + a.len_utf8());
    // Keep a little shared context before the difference.
    let mut start = old.floor_char_boundary(common.saturating_sub(EDIT_CONTEXT_BYTES));
    if start > 0
        && let Some(space) = old[..start].rfind(' ')
    {
        start = space + 1;
    }
    let quote = |s: &str| {
        if start == 0 { short(s, EDIT_QUOTE_BYTES) } else { format!("…{}", short(&s[start..], EDIT_QUOTE_BYTES)) }
    };
    (quote(&old), quote(&new))
}

/// The first few hundred bytes of a text, on one line.
fn one_line_prefix(text: &str) -> String {
    short(text, 600)
}

/// Shared text kept before the point where an edit's two sides differ.
const EDIT_CONTEXT_BYTES: usize = 20;
/// Longest quote of an edit's old and new text.
const EDIT_QUOTE_BYTES: usize = 80;
/// Longest command, pattern or query inside a step label.
const LABEL_DETAIL_BYTES: usize = 100;

/// The text of a tool result's content (a string, or its text blocks joined).
fn result_text(raw: &str) -> Cow<'_, str> {
    match serde_json::from_str::<Content<'_>>(raw) {
        Ok(Content::Text(t)) => t,
        Ok(Content::Blocks(blocks)) => {
            let mut joined = String::new();
            for b in blocks.iter().filter_map(|b| b.0.as_ref()) {
                if let Some(t) = b.text.as_deref() {
                    if !joined.is_empty() {
                        joined.push('\n');
                    }
                    joined.push_str(t);
                }
            }
            Cow::Owned(joined)
        }
        _ => Cow::Borrowed(""),
    }
}

/// A cheap fingerprint of a text block, to spot blocks repeated across split lines.
fn hash(text: &str) -> u64 {
    use std::hash::Hasher;
    let mut h = FastHasher::default();
    h.write(text.as_bytes());
    h.finish()
}

/// The text of a user record's content (a string, or its text blocks joined), for the
/// compact summary record.
fn plain_user_text(line: &str) -> Option<String> {
    let line = serde_json::from_str::<UserLine<'_>>(line).ok()?;
    match line.message.and_then(|m| m.0)?.content? {
        Content::Text(t) => Some(t.into_owned()),
        Content::Blocks(blocks) => {
            let texts: Vec<String> =
                blocks.into_iter().filter_map(|b| b.0).filter_map(|b| b.text.map(Cow::into_owned)).collect();
            (!texts.is_empty()).then(|| texts.join("\n"))
        }
        Content::Other => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_text_is_not_a_prompt() {
        assert_eq!(prompt_text("  fix the bug  ").as_deref(), Some("fix the bug"));
        assert_eq!(prompt_text("<local-command-stdout>Compacted</local-command-stdout>"), None);
        assert_eq!(prompt_text("<command-name>/compact</command-name><command-args>x</command-args>"), None);
        assert_eq!(
            prompt_text("<command-message>review</command-message>\n<command-name>/review</command-name>\n<command-args>PR 12</command-args>").as_deref(),
            Some("/review PR 12")
        );
        assert_eq!(prompt_text("<bash-input>ls -la</bash-input>").as_deref(), Some("! ls -la"));
        assert_eq!(prompt_text("[Request interrupted by user for tool use]"), None);
        assert_eq!(prompt_text("<system-reminder>x</system-reminder>"), None);
    }

    #[test]
    fn shell_failures_and_false_alarms() {
        assert_eq!(
            error_line("Compiling x\nerror[E0308]: mismatched types\n  --> a.rs"),
            Some("error[E0308]: mismatched types")
        );
        assert_eq!(error_line("test result: ok. 12 passed; 0 failed; 0 ignored"), None);
        assert_eq!(
            error_line("test result: FAILED. 11 passed; 1 failed"),
            Some("test result: FAILED. 11 passed; 1 failed")
        );
        assert_eq!(error_line("Exit code 0\nfine"), None);
        assert_eq!(error_line("Exit code 2\nusage"), Some("Exit code 2"));
        assert_eq!(error_line("Exit code 01"), Some("Exit code 01"));
        assert_eq!(error_line("all good"), None);
        assert_eq!(
            error_line("thread 'main' panicked at src/x.rs:3:5"),
            Some("thread 'main' panicked at src/x.rs:3:5")
        );
    }

    #[test]
    fn excerpt_strips_wrapper_tags() {
        assert_eq!(error_excerpt("<tool_use_error>File does not exist.</tool_use_error>"), "File does not exist.");
        assert_eq!(error_excerpt("\n\nExit code 1\nfirst\nsecond\nthird"), "Exit code 1 / first / second");
        assert_eq!(error_excerpt(""), "(no error text)");
    }

    #[test]
    fn ranges_merge() {
        let r = |start, end| LineRange { start, end };
        assert_eq!(
            merge_ranges(vec![r(50, 60), r(1, 10), r(11, 20), r(55, 70), r(100, 100)]),
            vec![r(1, 20), r(50, 70), r(100, 100)]
        );
    }

    #[test]
    fn turn_end_rules() {
        let m = |text, tool, stop: Option<&str>| AssistantMessage {
            last_seq: 0,
            has_text: text,
            has_tool_use: tool,
            stop_reason: stop.map(str::to_owned),
        };
        assert!(m(true, false, Some("end_turn")).ends_turn());
        assert!(!m(true, true, Some("tool_use")).ends_turn());
        assert!(m(true, false, None).ends_turn());
        assert!(!m(true, true, None).ends_turn());
        assert!(m(true, false, Some("max_tokens")).ends_turn());
    }
}
