//! Reading message content out of API messages and transcript records.
//!
//! Message `content` is either a string or an array of typed blocks, and records wrap a
//! message in host fields. Every part of the planner needs the same few questions
//! answered (which blocks, which text, which tool calls), so they are answered here once
//! and the rest of the module works on blocks.

use serde_json::{Map, Value, json};

use crate::record::{Kind, Record};

/// The content of a message as blocks: a string becomes one text block.
pub(super) fn blocks(content: &Value) -> Vec<Value> {
    match content {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    }
}

/// The `type` of a block.
pub(super) fn block_type(block: &Value) -> &str {
    block.get("type").and_then(Value::as_str).unwrap_or("")
}

/// The `role` of an API message.
pub(super) fn role(message: &Value) -> &str {
    message.get("role").and_then(Value::as_str).unwrap_or("")
}

/// The record as a JSON object (the parsed line).
pub(super) fn record_object(record: &Record) -> Map<String, Value> {
    match record.to_value() {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// `message.content` of a user or assistant record.
pub(super) fn record_content(record: &Record) -> Option<Value> {
    if !matches!(record.head().kind, Kind::User | Kind::Assistant) {
        return None;
    }
    let mut object = record_object(record);
    match object.remove("message") {
        Some(Value::Object(mut message)) => message.remove("content"),
        _ => None,
    }
}

/// A tool call found in an assistant record.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ToolCall {
    pub id: String,
    pub name: String,
    pub input: Value,
}

/// The `tool_use` blocks of an assistant record.
pub(super) fn tool_calls(record: &Record) -> Vec<ToolCall> {
    if record.head().kind != Kind::Assistant {
        return Vec::new();
    }
    let Some(content) = record_content(record) else {
        return Vec::new();
    };
    blocks(&content)
        .into_iter()
        .filter(|b| block_type(b) == "tool_use")
        .map(|b| ToolCall {
            id: b.get("id").and_then(Value::as_str).unwrap_or("").to_owned(),
            name: b.get("name").and_then(Value::as_str).unwrap_or("").to_owned(),
            input: b.get("input").cloned().unwrap_or(Value::Null),
        })
        .collect()
}

/// The `tool_use_id`s a user record answers.
pub(super) fn tool_result_ids(record: &Record) -> Vec<String> {
    if record.head().kind != Kind::User {
        return Vec::new();
    }
    let Some(content) = record_content(record) else {
        return Vec::new();
    };
    blocks(&content)
        .iter()
        .filter(|b| block_type(b) == "tool_result")
        .filter_map(|b| b.get("tool_use_id").and_then(Value::as_str))
        .map(str::to_owned)
        .collect()
}

/// The text the user typed in a user record, or `None` for anything else: tool
/// results, meta rows, compact summaries, transcript-only rows, host-written texts.
pub(super) fn user_prompt(record: &Record) -> Option<String> {
    let head = record.head();
    if head.kind != Kind::User || head.is_meta || head.is_compact_summary || head.is_sidechain {
        return None;
    }
    let object = record_object(record);
    if object.get("isVisibleInTranscriptOnly").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    let content = object.get("message")?.get("content")?;
    let parts: Vec<String> = blocks(content)
        .iter()
        .filter(|b| block_type(b) == "text")
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .filter_map(|t| crate::summary::prompt_text(t).map(std::borrow::Cow::into_owned))
        .collect();
    if parts.is_empty() { None } else { Some(parts.join("\n\n")) }
}
