//! The gateway's own answer to a compaction request it can answer from a prepared
//! summary: the text (the prepared summary, with whatever came after it folded in
//! without a model) and the event stream that carries it in the Messages API's shape.
//!
//! A prepared summary covers the messages of the request it forked. By the time Claude
//! Code asks for its compaction, the conversation has usually grown by the answer to
//! that request, and maybe by more turns: that *delta* is summarized by ctxd's offline
//! summarizer (no model call) and appended under a heading of its own, and the fidelity
//! check then makes sure every user message of the delta is named. The `<analysis>`
//! part says how the answer was made, so the transcript tells a reader that ctxd wrote
//! it, not a model just now.
//!
//! The stream is what Claude Code reads from any Messages answer: `message_start` with
//! the usage, one text block (its text in deltas of bounded size), `message_delta` with
//! the stop reason and output count, `message_stop`. The usage is the preparation's:
//! what was spent on this summary, nothing invented.

use serde_json::{Value, json};

use crate::compact::{FidelityFacts, HistoryTools, appended_budget, check_fidelity, history_tools_line};
use crate::record::{Record, TokenUsage};
use crate::summary::{OfflineOptions, parse_summary_reply, summarize_offline};

/// The offline summary of a delta: at most this many estimated tokens.
pub const DELTA_CAP_TOKENS: u64 = 4_000;
/// Largest text delta event, in bytes of text.
const DELTA_EVENT_BYTES: usize = 16 * 1024;

/// Why a prepared reply cannot answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoAnswer {
    #[error("the prepared reply holds no summary ({0})")]
    NoSummary(#[from] crate::summary::SummaryParseError),
}

/// Transcript records standing for API messages, so the offline summarizer and the
/// fidelity check (which read transcripts) can read a conversation the gateway saw.
pub fn records_of(messages: &[Value]) -> Vec<Record> {
    let mut out = Vec::with_capacity(messages.len());
    let mut parent: Option<String> = None;
    for (i, message) in messages.iter().enumerate() {
        let kind = match message.get("role").and_then(Value::as_str) {
            Some("assistant") => "assistant",
            Some("user") => "user",
            _ => continue,
        };
        let uuid = format!("gateway-message-{i}");
        let line = json!({"type": kind, "uuid": uuid, "parentUuid": parent, "isSidechain": false,
            "message": {"role": kind, "content": message.get("content").cloned().unwrap_or(Value::Null)}});
        if let Ok(record) = Record::parse(&line.to_string()) {
            out.push(record);
            parent = Some(uuid);
        }
    }
    out
}

/// A prepared reply with what it cannot have named checked in: every user message of
/// `covered` (the messages the preparation saw). Run once, when the preparation's reply
/// arrives.
pub fn checked_reply(reply: &str, covered: &[Value], cap_tokens: u64) -> Result<String, NoAnswer> {
    let body = parse_summary_reply(reply)?;
    let facts = FidelityFacts::from_records(&records_of(covered), crate::compact::DEFAULT_RECENT_TURNS);
    let outcome = check_fidelity(&body, &facts, appended_budget(cap_tokens, body.len()));
    Ok(rebuild(reply, &outcome.summary))
}

/// `reply` with its `<summary>` body replaced by `body` (its `<analysis>` kept).
fn rebuild(reply: &str, body: &str) -> String {
    match analysis_of(reply) {
        Some(analysis) => format!("<analysis>\n{analysis}\n</analysis>\n\n<summary>\n{body}\n</summary>"),
        None => format!("<summary>\n{body}\n</summary>"),
    }
}

/// The draft of a reply, if it has one.
fn analysis_of(reply: &str) -> Option<&str> {
    let start = reply.find("<analysis>")? + "<analysis>".len();
    let end = reply[start..].find("</analysis>").map_or(reply.len(), |e| start + e);
    Some(reply[start..end].trim())
}

/// The answer's text: the prepared reply (already checked), and `delta`, the messages
/// after those it covers, folded in offline.
pub fn answer_text(
    prepared: &str,
    covered: usize,
    delta: &[Value],
    tools: Option<&HistoryTools>,
) -> Result<String, NoAnswer> {
    let mut body = parse_summary_reply(prepared)?;
    // The program puts its own line with the transcript's path after the summary; the
    // tools that search it are ctxd's to name.
    if let Some(tools) = tools {
        body = format!("{body}\n\n{}", history_tools_line(tools, None));
    }
    let draft = analysis_of(prepared).unwrap_or("");
    let note = if delta.is_empty() {
        format!(
            "ctxd answered this compaction from a summary it prepared earlier through a fork of this session's own request, covering all {covered} messages."
        )
    } else {
        format!(
            "ctxd answered this compaction from a summary it prepared earlier through a fork of this session's own request, covering the first {covered} messages; the {} messages after them were summarized by ctxd without a model and appended.",
            delta.len()
        )
    };
    let analysis = if draft.is_empty() { note } else { format!("{draft}\n\n{note}") };
    if delta.is_empty() {
        return Ok(format!("<analysis>\n{analysis}\n</analysis>\n\n<summary>\n{body}\n</summary>"));
    }
    let records = records_of(delta);
    let options = OfflineOptions { max_output_tokens: DELTA_CAP_TOKENS, ..OfflineOptions::default() };
    let offline = summarize_offline(&records, &options);
    let later = parse_summary_reply(&offline.text).unwrap_or_default();
    let combined = format!(
        "{body}\n\nSince the summary above was written (the newest {} messages, summarized by ctxd):\n\n{later}",
        delta.len()
    );
    let facts = FidelityFacts::from_records(&records, crate::compact::DEFAULT_RECENT_TURNS);
    let outcome = check_fidelity(&combined, &facts, appended_budget(DELTA_CAP_TOKENS, 0));
    Ok(format!("<analysis>\n{analysis}\n</analysis>\n\n<summary>\n{}\n</summary>", outcome.summary))
}

/// What Claude Code's system prompt names as the session's working directory
/// ("Primary working directory: …" in its environment section), read from the request
/// body's JSON text; `None` when the body names none.
pub fn working_directory(body: &[u8]) -> Option<String> {
    const MARKER: &[u8] = b"Primary working directory: ";
    let start = memchr::memmem::find(body, MARKER)? + MARKER.len();
    // The rest of that JSON string, up to its closing quote (not an escaped one).
    let rest = &body[start..];
    let mut end = 0;
    while end < rest.len() && rest[end] != b'"' {
        end += if rest[end] == b'\\' { 2 } else { 1 };
    }
    let quoted = [&b"\""[..], rest.get(..end)?, &b"\""[..]].concat();
    let text: String = serde_json::from_slice(&quoted).ok()?;
    let line = text.lines().next()?.trim();
    (line.starts_with('/')).then(|| line.to_owned())
}

/// The text and usage of a whole Messages answer (the preparation's), streamed or JSON.
/// `None` when it reports no usage (an error, or not an answer at all).
pub fn reply_of(kind: super::AnswerKind, bytes: &[u8]) -> Option<(String, TokenUsage)> {
    let mut scan = super::AnswerScan::new(kind);
    scan.feed(bytes);
    let usage = scan.into_facts().usage?;
    let mut text = String::new();
    match kind {
        super::AnswerKind::EventStream => {
            for line in bytes.split(|b| *b == b'\n') {
                let Some(data) = line.strip_prefix(b"data:") else { continue };
                let Ok(event) = serde_json::from_slice::<Value>(data) else { continue };
                if event["type"] == "content_block_delta" && event["delta"]["type"] == "text_delta" {
                    text.push_str(event["delta"]["text"].as_str().unwrap_or(""));
                }
            }
        }
        super::AnswerKind::Json => {
            let answer: Value = serde_json::from_slice(bytes).ok()?;
            for block in answer["content"].as_array().into_iter().flatten() {
                if block["type"] == "text" {
                    text.push_str(block["text"].as_str().unwrap_or(""));
                }
            }
        }
        super::AnswerKind::Other => return None,
    }
    Some((text, usage))
}

/// One server-sent event.
fn event(out: &mut String, name: &str, data: &Value) {
    out.push_str("event: ");
    out.push_str(name);
    out.push_str("\ndata: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
}

/// The event stream of a Messages answer whose one text block is `text`.
pub fn event_stream(message_id: &str, model: &str, text: &str, usage: &TokenUsage) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8 + 1024);
    event(
        &mut out,
        "message_start",
        &json!({"type": "message_start", "message": {"id": message_id, "type": "message", "role": "assistant",
            "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": usage.input_tokens,
                "cache_creation_input_tokens": usage.cache_creation_input_tokens,
                "cache_read_input_tokens": usage.cache_read_input_tokens, "output_tokens": 1}}}),
    );
    event(
        &mut out,
        "content_block_start",
        &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    );
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = rest.len().min(DELTA_EVENT_BYTES);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (piece, after) = rest.split_at(cut);
        event(
            &mut out,
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}),
        );
        rest = after;
    }
    event(&mut out, "content_block_stop", &json!({"type": "content_block_stop", "index": 0}));
    event(
        &mut out,
        "message_delta",
        &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"output_tokens": usage.output_tokens}}),
    );
    event(&mut out, "message_stop", &json!({"type": "message_stop"}));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::answer::{AnswerKind, AnswerScan};

    const REPLY: &str = "<analysis>the model's draft</analysis>\n<summary>\n1. Primary Request and Intent:\n   build the parser (first prompt)\n6. All User Messages:\n   - build the parser\n</summary>";

    fn user(text: &str) -> Value {
        json!({"role": "user", "content": [{"type": "text", "text": text}]})
    }

    fn assistant(text: &str) -> Value {
        json!({"role": "assistant", "content": [{"type": "text", "text": text}]})
    }

    #[test]
    fn a_full_cover_is_the_prepared_summary_with_a_note() {
        let text = answer_text(REPLY, 3, &[], None).unwrap();
        assert!(text.starts_with("<analysis>\nthe model's draft"));
        assert!(text.contains("covering all 3 messages"));
        assert_eq!(parse_summary_reply(&text).unwrap(), parse_summary_reply(REPLY).unwrap());
    }

    #[test]
    fn a_delta_is_folded_in_and_its_user_messages_named() {
        let delta = [
            assistant("I wrote the tokenizer in src/lex.rs."),
            user("now add golden tests for the tokenizer please"),
            assistant("Added tests/golden.rs."),
            user("finally rename the crate to quill"),
        ];
        let text = answer_text(REPLY, 3, &delta, None).unwrap();
        let body = parse_summary_reply(&text).unwrap();
        assert!(body.starts_with("1. Primary Request and Intent:\n   build the parser"), "{body}");
        assert!(body.contains("golden tests"), "{body}");
        assert!(body.contains("rename the crate to quill"), "{body}");
        assert!(text.contains("the 4 messages after them"));
    }

    #[test]
    fn a_reply_without_summary_cannot_answer() {
        assert!(answer_text("<analysis>only a draft</analysis>", 1, &[], None).is_err());
    }

    #[test]
    fn the_answer_names_the_history_tools_when_given_them() {
        let tools = HistoryTools { search: "mcp__ctxd__search_history".into(), read: "mcp__ctxd__read_history".into() };
        let text = answer_text(REPLY, 3, &[], Some(&tools)).unwrap();
        let summary = &text[text.find("<summary>").unwrap()..];
        assert!(summary.contains("mcp__ctxd__search_history"), "{summary}");
        assert!(summary.contains("mcp__ctxd__read_history"), "{summary}");
        let plain = answer_text(REPLY, 3, &[], None).unwrap();
        assert!(!plain.contains("search_history"), "{plain}");
    }

    #[test]
    fn the_working_directory_comes_from_the_system_prompt() {
        let body = serde_json::to_vec(&json!({"model": "m", "system": [
            {"type": "text", "text": "You are an agent."},
            {"type": "text", "text": "Env:\nPrimary working directory: /home/dev/caf\u{e9} \"x\"\n - Is a git repository"}
        ], "messages": []}))
        .unwrap();
        assert_eq!(working_directory(&body).as_deref(), Some("/home/dev/caf\u{e9} \"x\""));
        let none = serde_json::to_vec(&json!({"system": "no directory here", "messages": []})).unwrap();
        assert_eq!(working_directory(&none), None);
        let relative = serde_json::to_vec(&json!({"system": "Primary working directory: proj\n"})).unwrap();
        assert_eq!(working_directory(&relative), None);
        assert!(checked_reply("nothing", &[], 1000).is_err());
    }

    #[test]
    fn the_checked_reply_names_every_user_message_the_model_left_out() {
        let covered = [user("build the parser"), assistant("ok"), user("also support unicode identifiers everywhere")];
        let checked = checked_reply(REPLY, &covered, 8_000).unwrap();
        let body = parse_summary_reply(&checked).unwrap();
        assert!(body.contains("unicode identifiers"), "{body}");
        assert!(checked.starts_with("<analysis>\nthe model's draft"));
    }

    #[test]
    fn a_preparations_reply_is_read_from_a_stream_or_json() {
        let usage = TokenUsage { input_tokens: 5, output_tokens: 9, ..TokenUsage::default() };
        let stream = event_stream("m", "claude-opus-5-5", REPLY, &usage);
        assert_eq!(reply_of(AnswerKind::EventStream, stream.as_bytes()), Some((REPLY.to_owned(), usage)));
        let json = json!({"content": [{"type": "text", "text": "a"}, {"type": "tool_use"}, {"type": "text", "text": "b"}],
            "usage": {"input_tokens": 5, "output_tokens": 9}});
        assert_eq!(reply_of(AnswerKind::Json, json.to_string().as_bytes()), Some(("ab".to_owned(), usage)));
        assert_eq!(reply_of(AnswerKind::Json, br#"{"type":"error","error":{"type":"overloaded_error"}}"#), None);
    }

    #[test]
    fn the_stream_parses_and_carries_the_text_and_honest_usage() {
        let usage = TokenUsage {
            input_tokens: 3,
            cache_creation_input_tokens: 10,
            cache_read_input_tokens: 90_000,
            output_tokens: 1_500,
        };
        let text = format!("<summary>{}é</summary>", "x".repeat(40_000));
        let stream = event_stream("msg_ctxd_1", "claude-opus-5-5", &text, &usage);
        let mut scan = AnswerScan::new(AnswerKind::EventStream);
        scan.feed(stream.as_bytes());
        let facts = scan.into_facts();
        assert!(facts.stopped);
        assert_eq!(facts.usage, Some(usage));
        assert_eq!(facts.message_id.as_deref(), Some("msg_ctxd_1"));
        let mut joined = String::new();
        let mut names = Vec::new();
        for block in stream.split("\n\n").filter(|b| !b.is_empty()) {
            let (name, data) = block.split_once('\n').unwrap();
            names.push(name.trim_start_matches("event: ").to_owned());
            let data: Value = serde_json::from_str(data.trim_start_matches("data: ")).unwrap();
            if let Some(piece) = data["delta"]["text"].as_str() {
                joined.push_str(piece);
            }
        }
        assert_eq!(joined, text);
        assert_eq!(names.first().map(String::as_str), Some("message_start"));
        assert_eq!(names.last().map(String::as_str), Some("message_stop"));
        assert!(names.iter().filter(|n| *n == "content_block_delta").count() >= 3, "bounded deltas");
    }
}
