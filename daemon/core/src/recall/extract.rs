//! What one transcript line gives the history: its searchable text and role, its links
//! on the chain, or the compaction facts (a boundary, an undo) that decide what stands
//! before the latest compaction.
//!
//! The text is what a person would search for: prompts, replies, tool calls with their
//! inputs (one `key: value` line per string, never escaped JSON, so words stay words),
//! tool results, attachments the host rendered for the model, compact summaries. Left
//! out: thinking, images (named `[image]`), the host's copies of its own requests
//! (`api-request*` lines carry no uuid), `toolUseResult` (the same result again), and the
//! attachments the host repeats at every start (environment, model, date, listings).
//! The line is read with a borrowing deserializer that skips every other field.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::compact::UNDO_SUBTYPE;

/// What kind of record a hit is, as the tools name it (and `ctx/searchHistory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema), schemars(rename = "HistoryRole"))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A prompt the user wrote.
    User,
    /// The model's reply: text and tool calls with their inputs.
    Assistant,
    /// What a tool gave back.
    ToolResult,
    /// Something the host attached for the model (a file it read, a plan, …).
    Attachment,
    /// A compaction's summary (restates what came before it).
    Summary,
    /// A user-side message the host wrote itself (`isMeta`).
    Meta,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::ToolResult => "tool_result",
            Role::Attachment => "attachment",
            Role::Summary => "summary",
            Role::Meta => "meta",
        }
    }

    pub fn parse(name: &str) -> Option<Role> {
        [Role::User, Role::Assistant, Role::ToolResult, Role::Attachment, Role::Summary, Role::Meta]
            .into_iter()
            .find(|r| r.as_str() == name)
    }
}

/// One transcript line as the history sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub uuid: Option<String>,
    /// `parentUuid`; for a compact boundary, `logicalParentUuid` (the record it follows).
    pub parent: Option<String>,
    pub timestamp: Option<String>,
    /// The working directory the host wrote on the record (Claude Code does on each).
    pub cwd: Option<String>,
    pub what: What,
}

/// What the line is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// A record with text to search (always with a uuid).
    Entry(Entry),
    /// A compact boundary.
    Boundary,
    /// ctxd's undo of the compaction whose boundary has this uuid.
    Undo { boundary: String },
    /// Anything else on the chain: bookkeeping, progress, a record with no text.
    Other,
}

/// The searchable part of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub role: Role,
    pub text: String,
    /// The text was cut at the cap given to [`extract`].
    pub cut: bool,
}

/// Attachments Claude Code writes again at every start and after each compaction: the
/// same text many times over, never what someone looks for.
const REPEATED_ATTACHMENTS: &[&str] = &[
    "environment",
    "model",
    "date",
    "deferred_tools_delta",
    "agent_listing_delta",
    "skill_listing",
    "remote_session_change",
    "session_context",
    "instructions",
    "prompt_snapshot",
];

/// Reads one transcript line; `None` when it is not a JSON object. The entry's text is
/// cut at `max_text` bytes (on a character boundary).
pub fn extract(line: &str, max_text: usize) -> Option<Line> {
    let raw: Raw<'_> = serde_json::from_str(line).ok()?;
    let own = |s: &Option<Cow<'_, str>>| s.as_deref().map(str::to_owned);
    let kind = raw.ty.as_deref().unwrap_or("");
    let subtype = raw.subtype.as_deref();
    let mut parent = own(&raw.parent_uuid);
    let what = match kind {
        "system" if subtype == Some("compact_boundary") => {
            parent = own(&raw.logical_parent_uuid).or(parent);
            What::Boundary
        }
        "system" if subtype == Some(UNDO_SUBTYPE) => match &raw.undoes {
            Some(target) => What::Undo { boundary: target.to_string() },
            None => What::Other,
        },
        "user" | "assistant" | "attachment" if raw.uuid.is_some() => {
            let mut text = Text::new(max_text);
            let role = match kind {
                "user" => user_text(&raw, &mut text),
                "assistant" => raw.message.as_ref().and_then(|m| m.content).map(|c| {
                    blocks_text(c, &mut text);
                    Role::Assistant
                }),
                _ => attachment_text(&raw, &mut text),
            };
            match role {
                Some(role) if !text.is_empty() => What::Entry(Entry { role, cut: text.cut, text: text.into_string() }),
                _ => What::Other,
            }
        }
        _ => What::Other,
    };
    Some(Line { uuid: own(&raw.uuid), parent, timestamp: own(&raw.timestamp), cwd: own(&raw.cwd), what })
}

fn user_text(raw: &Raw<'_>, text: &mut Text) -> Option<Role> {
    let content = raw.message.as_ref()?.content?;
    let only_results = blocks_text(content, text);
    Some(if raw.is_compact_summary == Some(true) {
        Role::Summary
    } else if raw.is_meta == Some(true) {
        Role::Meta
    } else if only_results {
        Role::ToolResult
    } else {
        Role::User
    })
}

fn attachment_text(raw: &Raw<'_>, text: &mut Text) -> Option<Role> {
    let attachment = raw.attachment.as_ref()?;
    if attachment.ty.as_deref().is_some_and(|t| REPEATED_ATTACHMENTS.contains(&t)) {
        return None;
    }
    // Claude Code 2.x writes what the model is shown as `rendered`; older records keep
    // the text in the attachment itself.
    match raw.rendered.or(attachment.content) {
        Some(rendered) => rendered_text(rendered, text),
        None => return None,
    }
    Some(Role::Attachment)
}

/// `rendered`: a string, or a list of `{content|text: string}` parts.
fn rendered_text(raw: &RawValue, text: &mut Text) {
    match first_byte(raw) {
        b'"' => {
            if let Ok(s) = serde_json::from_str::<Cow<'_, str>>(raw.get()) {
                text.line(&s);
            }
        }
        b'[' => {
            if let Ok(parts) = serde_json::from_str::<Vec<Block<'_>>>(raw.get()) {
                for part in parts {
                    if let Some(s) = part.text.as_deref() {
                        text.line(s);
                    } else if let Some(c) = part.content {
                        rendered_text(c, text);
                    }
                }
            }
        }
        _ => {}
    }
}

/// The text of message content (a string or blocks). True when it held tool results
/// and nothing a person wrote.
fn blocks_text(content: &RawValue, text: &mut Text) -> bool {
    match first_byte(content) {
        b'"' => {
            if let Ok(s) = serde_json::from_str::<Cow<'_, str>>(content.get()) {
                text.line(&s);
            }
            false
        }
        b'[' => {
            let Ok(blocks) = serde_json::from_str::<Vec<Block<'_>>>(content.get()) else { return false };
            let mut results = 0;
            let mut written = 0;
            for block in &blocks {
                match block.ty.as_deref() {
                    Some("text") => {
                        if let Some(s) = block.text.as_deref() {
                            text.line(s);
                            written += 1;
                        }
                    }
                    Some("tool_use" | "server_tool_use") => {
                        text.line(&format!("[tool_use {}]", block.name.as_deref().unwrap_or("?")));
                        if let Some(input) = block.input
                            && let Ok(value) = serde_json::from_str::<Value>(input.get())
                        {
                            flatten(None, &value, text);
                        }
                    }
                    Some("tool_result") => {
                        results += 1;
                        text.line(if block.is_error == Some(true) { "[tool_result error]" } else { "[tool_result]" });
                        if let Some(c) = block.content {
                            blocks_text(c, text);
                        }
                    }
                    Some("image") => text.line("[image]"),
                    Some("document") => text.line("[document]"),
                    // thinking, redacted thinking, and blocks not known yet.
                    _ => {}
                }
            }
            results > 0 && written == 0
        }
        _ => false,
    }
}

/// A tool's input as `key: value` lines, strings unescaped.
fn flatten(key: Option<&str>, value: &Value, text: &mut Text) {
    if text.full() {
        return;
    }
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                flatten(Some(k), v, text);
            }
        }
        Value::Array(items) => {
            for v in items {
                flatten(key, v, text);
            }
        }
        Value::String(s) => text.keyed(key, s),
        Value::Null => {}
        other => text.keyed(key, &other.to_string()),
    }
}

fn first_byte(raw: &RawValue) -> u8 {
    raw.get().bytes().find(|b| !b.is_ascii_whitespace()).unwrap_or(b' ')
}

/// Text built line by line up to a cap in bytes.
struct Text {
    text: String,
    cap: usize,
    cut: bool,
    /// Something other than whitespace was given, kept or not (so a zero cap still
    /// tells a record with text from one without).
    any: bool,
}

impl Text {
    fn new(cap: usize) -> Text {
        Text { text: String::new(), cap, cut: false, any: false }
    }

    fn full(&self) -> bool {
        self.cut
    }

    fn is_empty(&self) -> bool {
        !self.any
    }

    fn keyed(&mut self, key: Option<&str>, value: &str) {
        match key {
            Some(key) => {
                self.line(key);
                self.push(": ");
                self.push(value);
            }
            None => self.line(value),
        }
    }

    fn line(&mut self, s: &str) {
        self.any = self.any || !s.trim().is_empty();
        if !self.text.is_empty() && !self.text.ends_with('\n') {
            self.push("\n");
        }
        self.push(s);
    }

    fn push(&mut self, s: &str) {
        if self.cut {
            return;
        }
        let room = self.cap.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
        } else {
            self.text.push_str(&s[..s.floor_char_boundary(room)]);
            self.cut = true;
        }
    }

    fn into_string(self) -> String {
        self.text
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw<'a> {
    #[serde(borrow, default, rename = "type")]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    subtype: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    uuid: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    parent_uuid: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    logical_parent_uuid: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    timestamp: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    cwd: Option<Cow<'a, str>>,
    #[serde(default)]
    is_meta: Option<bool>,
    #[serde(default)]
    is_compact_summary: Option<bool>,
    #[serde(borrow, default)]
    undoes: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    message: Option<RawMessage<'a>>,
    #[serde(borrow, default)]
    attachment: Option<RawAttachment<'a>>,
    #[serde(borrow, default)]
    rendered: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawAttachment<'a> {
    #[serde(borrow, default, rename = "type")]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(borrow, default, rename = "type")]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(default)]
    is_error: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: usize = 1 << 20;

    fn entry(line: &str) -> Entry {
        match extract(line, CAP).expect("a record").what {
            What::Entry(e) => e,
            other => panic!("not an entry: {other:?}"),
        }
    }

    #[test]
    fn prompts_replies_tool_calls_and_results() {
        let prompt = r#"{"type":"user","uuid":"u1","parentUuid":null,"timestamp":"2026-11-01T09:00:00Z","cwd":"/p","message":{"role":"user","content":"Why does the \"build\" fail?"}}"#;
        let line = extract(prompt, CAP).unwrap();
        assert_eq!(line.uuid.as_deref(), Some("u1"));
        assert_eq!(line.cwd.as_deref(), Some("/p"));
        assert_eq!(line.timestamp.as_deref(), Some("2026-11-01T09:00:00Z"));
        assert_eq!(
            line.what,
            What::Entry(Entry { role: Role::User, text: "Why does the \"build\" fail?".into(), cut: false })
        );

        let reply = r#"{"type":"assistant","uuid":"a1","parentUuid":"u1","message":{"content":[{"type":"thinking","thinking":"SECRET-THOUGHT"},{"type":"text","text":"Let me read it."},{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"cargo build\nmake","timeout":30,"env":["A","B"]}}]}}"#;
        let e = entry(reply);
        assert_eq!(e.role, Role::Assistant);
        assert_eq!(e.text, "Let me read it.\n[tool_use Bash]\ncommand: cargo build\nmake\ntimeout: 30\nenv: A\nenv: B");
        assert!(!e.text.contains("SECRET-THOUGHT"), "thinking is not indexed");

        let result = r#"{"type":"user","uuid":"r1","parentUuid":"a1","message":{"content":[{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":[{"type":"text","text":"error[E0425]: cannot find value"},{"type":"image","source":{"data":"QUJD"}}]}]},"toolUseResult":{"stdout":"DUPLICATE"}}"#;
        let e = entry(result);
        assert_eq!(e.role, Role::ToolResult);
        assert_eq!(e.text, "[tool_result error]\nerror[E0425]: cannot find value\n[image]");
    }

    #[test]
    fn summaries_meta_and_attachments() {
        let summary =
            r#"{"type":"user","uuid":"s","isCompactSummary":true,"message":{"content":"Summary: 1. Primary Request"}}"#;
        assert_eq!(entry(summary).role, Role::Summary);
        let meta =
            r#"{"type":"user","uuid":"m","isMeta":true,"message":{"content":[{"type":"text","text":"Caveat"}]}}"#;
        assert_eq!(entry(meta).role, Role::Meta);
        let file = r#"{"type":"attachment","uuid":"f","attachment":{"type":"file","filename":"/p/a.rs"},"rendered":[{"content":"Called the Read tool"},{"content":"fn main() {}"}]}"#;
        let e = entry(file);
        assert_eq!((e.role, e.text.as_str()), (Role::Attachment, "Called the Read tool\nfn main() {}"));
        let older = r#"{"type":"attachment","uuid":"o","attachment":{"type":"plan","content":"Step 1"}}"#;
        assert_eq!(entry(older).text, "Step 1");
        let repeated = r#"{"type":"attachment","uuid":"e","attachment":{"type":"environment"},"rendered":[{"content":"Platform: linux"}]}"#;
        assert_eq!(extract(repeated, CAP).unwrap().what, What::Other);
    }

    #[test]
    fn boundaries_undos_and_records_without_text() {
        let boundary =
            r#"{"type":"system","subtype":"compact_boundary","uuid":"b","parentUuid":null,"logicalParentUuid":"a1"}"#;
        let line = extract(boundary, CAP).unwrap();
        assert_eq!((line.what, line.parent.as_deref()), (What::Boundary, Some("a1")));
        let undo = r#"{"type":"system","subtype":"ctxd_undo_compact","uuid":"x","undoes":"b"}"#;
        assert_eq!(extract(undo, CAP).unwrap().what, What::Undo { boundary: "b".into() });
        // No uuid: nothing a reader could open, even with text.
        let blob = r#"{"type":"api-request-blob","message":{"content":[{"type":"text","text":"copy"}]}}"#;
        assert_eq!(extract(blob, CAP).unwrap().what, What::Other);
        let no_uuid = r#"{"type":"user","message":{"content":"hi"}}"#;
        assert_eq!(extract(no_uuid, CAP).unwrap().what, What::Other);
        let thinking_only =
            r#"{"type":"assistant","uuid":"t","message":{"content":[{"type":"thinking","thinking":"x"}]}}"#;
        assert_eq!(extract(thinking_only, CAP).unwrap().what, What::Other);
        assert_eq!(extract("not json", CAP), None);
        assert_eq!(extract("[1]", CAP), None);
        // A field of an unexpected shape costs that record, never a panic.
        assert_eq!(extract(r#"{"type":"user","uuid":7}"#, CAP), None);
    }

    #[test]
    fn text_is_cut_at_the_cap_on_a_character_boundary() {
        let line = format!(r#"{{"type":"user","uuid":"u","message":{{"content":"{}"}}}}"#, "é".repeat(100));
        let e = match extract(&line, 51).unwrap().what {
            What::Entry(e) => e,
            other => panic!("{other:?}"),
        };
        assert!(e.cut);
        assert_eq!(e.text, "é".repeat(25));
        // A zero cap keeps no text but still tells an entry from a record without any.
        assert!(
            matches!(extract(&line, 0).unwrap().what, What::Entry(Entry { ref text, cut: true, .. }) if text.is_empty())
        );
    }
}
