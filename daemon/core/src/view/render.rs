//! One line per message: a compact text form of a view or a request, for golden tests
//! and logs.
//!
//! `user u3: text("Please read…") tool_result(t1, 3400b) text("[id:u3]")` says what a
//! message holds without the bulk: block kinds, tool ids, sizes, short text excerpts and
//! markers (`+cache`, `ref`, `error`).

use std::fmt::Write as _;

use serde_json::Value;

use super::item::{Item, Origin};

const EXCERPT_CHARS: usize = 32;

fn excerpt(text: &str) -> String {
    let mut out: String = text.chars().take(EXCERPT_CHARS).collect();
    if text.chars().count() > EXCERPT_CHARS {
        out.push('…');
    }
    out.replace('\n', "⏎")
}

/// One block of a request or view, as text.
pub(crate) fn render_block(block: &Value) -> String {
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("?");
    let str_of = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or("");
    let mut out = match kind {
        "text" => format!("text({:?})", excerpt(str_of("text"))),
        "tool_use" => format!("tool_use({} {})", str_of("id"), str_of("name")),
        "tool_result" => {
            let content = block.get("content");
            let mut s = format!("tool_result({}", str_of("tool_use_id"));
            match content {
                Some(Value::String(text)) if text.starts_with('[') && text.len() < 120 => {
                    let _ = write!(s, " {:?}", excerpt(text));
                }
                Some(Value::String(text)) if text.starts_with("[This output was too large") => {
                    s.push_str(" preview");
                }
                Some(c) => {
                    let bytes = match c {
                        Value::String(text) => text.len(),
                        other => serde_json::to_string(other).map_or(0, |t| t.len()),
                    };
                    let _ = write!(s, ", {bytes}b");
                }
                None => s.push_str(", empty"),
            }
            if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                s.push_str(", error");
            }
            if block.get("cache_reference").is_some() {
                s.push_str(", ref");
            }
            s.push(')');
            s
        }
        "cache_edits" => {
            let ids: Vec<&str> = block
                .get("edits")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|e| e.get("cache_reference").and_then(Value::as_str))
                .collect();
            format!("cache_edits(delete {})", ids.join(" "))
        }
        other => other.to_owned(),
    };
    if block.get("cache_control").is_some() {
        out.push_str("+cache");
    }
    out
}

fn origin_flag(origin: &Origin) -> String {
    match origin {
        Origin::Prompt | Origin::ToolResults | Origin::Response => String::new(),
        Origin::Meta => "[meta]".to_owned(),
        Origin::CompactSummary => "[compact-summary]".to_owned(),
        Origin::Attachment(kind) => format!("[attachment:{kind}]"),
        Origin::Collapse => "[collapse]".to_owned(),
        Origin::Context => "[context]".to_owned(),
        Origin::Extra => "[extra]".to_owned(),
        Origin::ForkInstruction => "[fork]".to_owned(),
    }
}

/// A runtime view, one line per item. The parent is shown when it is not the item
/// before (a relinked gap, a branch).
pub fn render_view(items: &[Item]) -> String {
    let mut out = String::new();
    let mut previous: Option<&str> = None;
    for item in items {
        let _ = write!(out, "{}{}", item.role.as_str(), origin_flag(&item.origin));
        if item.snipped {
            out.push_str("[snipped]");
        }
        let _ = write!(out, " {}", item.uuid.as_deref().unwrap_or("-"));
        if item.parent_uuid.as_deref() != previous && item.uuid.is_some() {
            let _ = write!(out, " (parent {})", item.parent_uuid.as_deref().unwrap_or("none"));
        }
        out.push(':');
        for block in &item.blocks {
            let value: Value = serde_json::from_str(block.json()).unwrap_or(Value::Null);
            out.push(' ');
            out.push_str(&render_block(&value));
        }
        out.push('\n');
        if item.uuid.is_some() {
            previous = item.uuid.as_deref();
        }
    }
    out
}

/// A request body: a system line, a tools line, then one line per message.
pub fn render_request(body: &Value) -> String {
    let mut out = String::new();
    if let Some(system) = body.get("system").and_then(Value::as_array) {
        out.push_str("system:");
        for block in system {
            out.push(' ');
            out.push_str(&render_block(block));
        }
        out.push('\n');
    }
    if let Some(tools) = body.get("tools").and_then(Value::as_array) {
        out.push_str("tools:");
        for tool in tools {
            let _ = write!(out, " {}", tool.get("name").and_then(Value::as_str).unwrap_or("?"));
            if tool.get("cache_control").is_some() {
                out.push_str("+cache");
            }
        }
        out.push('\n');
    }
    for message in body.get("messages").and_then(Value::as_array).into_iter().flatten() {
        let _ = write!(out, "{}:", message.get("role").and_then(Value::as_str).unwrap_or("?"));
        match message.get("content") {
            Some(Value::String(text)) => {
                let _ = write!(out, " {:?}", excerpt(text));
            }
            Some(Value::Array(blocks)) => {
                for block in blocks {
                    out.push(' ');
                    out.push_str(&render_block(block));
                }
            }
            _ => {}
        }
        out.push('\n');
    }
    out
}
