//! The record model: one line of a Claude Code style transcript.
//!
//! A record keeps the exact JSON text it was stored as (`line`), so fields ctxd does not
//! know survive import, storage and export byte for byte, and a small typed `Head` with
//! the fields ctxd decides on (ids, links, kind, flags, usage, sizes). The head is read
//! with a borrowing deserializer that skips everything else, so loading a long
//! transcript costs one scan of each line, not a JSON tree per record. Message content is
//! parsed only where a stage needs it.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

/// One transcript record.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    line: Arc<str>,
    head: Head,
}

/// The fields of a record that ctxd decides on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Head {
    pub uuid: Option<Box<str>>,
    pub parent_uuid: Option<Box<str>>,
    /// For a compact boundary: the last record before the compaction.
    pub logical_parent_uuid: Option<Box<str>>,
    pub kind: Kind,
    /// `subtype` of system records (`compact_boundary`, `api_error`, …).
    pub subtype: Option<Box<str>>,
    pub timestamp: Option<Box<str>>,
    pub is_meta: bool,
    pub is_sidechain: bool,
    pub is_compact_summary: bool,
    /// `isApiErrorMessage`: an assistant record the host wrote for a failed request.
    pub is_api_error: bool,
    /// `message.id` of assistant records; the lines of one split response share it.
    pub message_id: Option<Box<str>>,
    /// `message.model` of assistant records.
    pub model: Option<Box<str>>,
    /// `message.usage` of assistant records.
    pub usage: Option<TokenUsage>,
    /// Length in bytes of the JSON text of `message.content` (0 without a message).
    pub content_bytes: u32,
}

/// What kind of record a line is, from its `type` field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Kind {
    User,
    Assistant,
    System,
    Attachment,
    /// Older transcripts: a `summary` line naming a leaf.
    Summary,
    /// Any other type (`progress`, `file-history-snapshot`, `api-request`, …) or none;
    /// kept verbatim, never sent to a model.
    #[default]
    Other,
}

impl Kind {
    fn from_type(ty: Option<&str>) -> Kind {
        match ty {
            Some("user") => Kind::User,
            Some("assistant") => Kind::Assistant,
            Some("system") => Kind::System,
            Some("attachment") => Kind::Attachment,
            Some("summary") => Kind::Summary,
            _ => Kind::Other,
        }
    }
}

/// Token usage the provider reported for one response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct TokenUsage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub cache_creation_input_tokens: u64,
    #[serde(default)]
    pub cache_read_input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
}

impl TokenUsage {
    /// Tokens of the context this response leaves behind: everything the request read
    /// plus what the model wrote.
    pub fn context_tokens(&self) -> u64 {
        self.request_tokens() + self.output_tokens
    }

    /// Tokens the request read (fresh, cache written and cache read); what Claude Code
    /// counts for `used_percentage`.
    pub fn request_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.cache_creation_input_tokens).saturating_add(self.cache_read_input_tokens)
    }
}

/// Why a line is not a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("not valid JSON: {0}")]
    Json(String),
    #[error("a record must be a JSON object")]
    NotAnObject,
    #[error("a record must be one line; it contains a line break")]
    LineBreak,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawHead<'a> {
    #[serde(borrow, default)]
    uuid: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    parent_uuid: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    logical_parent_uuid: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "type")]
    ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    subtype: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    timestamp: Option<Cow<'a, str>>,
    #[serde(default)]
    is_meta: Option<bool>,
    #[serde(default)]
    is_sidechain: Option<bool>,
    #[serde(default)]
    is_compact_summary: Option<bool>,
    #[serde(default)]
    is_api_error_message: Option<bool>,
    #[serde(borrow, default)]
    message: Option<RawMessage<'a>>,
}

#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<TokenUsage>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

fn boxed(s: Option<Cow<'_, str>>) -> Option<Box<str>> {
    s.map(|s| Box::from(s.as_ref()))
}

impl Record {
    /// Reads one transcript line (without its line break).
    pub fn parse(line: &str) -> Result<Record, RecordError> {
        Record::from_line(Arc::from(line))
    }

    /// Builds a record from a line already held as shared text.
    pub fn from_line(line: Arc<str>) -> Result<Record, RecordError> {
        if line.contains('\n') {
            return Err(RecordError::LineBreak);
        }
        // JSON's own whitespace only: `str::trim_start` also drops characters JSON does
        // not allow there (vertical tab, form feed, Unicode spaces).
        let trimmed = line.trim_start_matches([' ', '\t', '\r']);
        if !trimmed.starts_with('{') {
            // Distinguish "valid JSON but not an object" from garbage.
            return Err(match serde_json::from_str::<serde::de::IgnoredAny>(trimmed) {
                Ok(_) => RecordError::NotAnObject,
                Err(e) => RecordError::Json(e.to_string()),
            });
        }
        let raw: RawHead<'_> = serde_json::from_str(&line).map_err(|e| RecordError::Json(e.to_string()))?;
        let (message_id, model, usage, content_bytes) = match raw.message {
            Some(m) => (
                boxed(m.id),
                boxed(m.model),
                m.usage,
                m.content.map_or(0, |c| u32::try_from(c.get().len()).unwrap_or(u32::MAX)),
            ),
            None => (None, None, None, 0),
        };
        let head = Head {
            uuid: boxed(raw.uuid),
            parent_uuid: boxed(raw.parent_uuid),
            logical_parent_uuid: boxed(raw.logical_parent_uuid),
            kind: Kind::from_type(raw.ty.as_deref()),
            subtype: boxed(raw.subtype),
            timestamp: boxed(raw.timestamp),
            is_meta: raw.is_meta.unwrap_or(false),
            is_sidechain: raw.is_sidechain.unwrap_or(false),
            is_compact_summary: raw.is_compact_summary.unwrap_or(false),
            is_api_error: raw.is_api_error_message.unwrap_or(false),
            message_id,
            model,
            usage,
            content_bytes,
        };
        Ok(Record { line, head })
    }

    /// Builds a record from a JSON object (as received over the protocol). The stored
    /// line is the object's compact JSON text, keys in the order given.
    pub fn from_object(object: &serde_json::Map<String, serde_json::Value>) -> Result<Record, RecordError> {
        let line = serde_json::to_string(object).map_err(|e| RecordError::Json(e.to_string()))?;
        Record::from_line(Arc::from(line))
    }

    /// The exact JSON text of the record, as stored (no line break).
    pub fn line(&self) -> &str {
        &self.line
    }

    /// The shared line, for callers that keep it without copying.
    pub fn line_arc(&self) -> &Arc<str> {
        &self.line
    }

    pub fn head(&self) -> &Head {
        &self.head
    }

    pub fn uuid(&self) -> Option<&str> {
        self.head.uuid.as_deref()
    }

    /// The whole record as a JSON value (parses the line; not for hot paths).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.line).unwrap_or(serde_json::Value::Null)
    }

    /// True for a `system` record with subtype `compact_boundary`.
    pub fn is_compact_boundary(&self) -> bool {
        self.head.kind == Kind::System && self.head.subtype.as_deref() == Some("compact_boundary")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Shaped like a real Claude Code 2.x assistant line, with fields ctxd does not know.
    const ASSISTANT: &str = r#"{"parentUuid":"5c5ff0e8-52c1-400b-ac07-c134304b923d","isSidechain":false,"message":{"id":"msg_01","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"text","text":"Let me look \u2192 at that."}],"stop_reason":"tool_use","usage":{"input_tokens":12881,"cache_creation_input_tokens":10,"cache_read_input_tokens":20,"output_tokens":50,"output_tokens_details":{"thinking_tokens":0},"service_tier":"standard"}},"requestId":"req_1","type":"assistant","uuid":"e4f44d22-771e-4333-b6ba-f37c61c04d1a","timestamp":"2026-11-29T21:19:51.104Z","futureField":{"nested":[1,2.5,null,"\ud83e\udd16"]},"userType":"external"}"#;

    #[test]
    fn head_fields_of_a_real_shaped_line() {
        let rec = Record::parse(ASSISTANT).unwrap();
        let h = rec.head();
        assert_eq!(h.kind, Kind::Assistant);
        assert_eq!(h.uuid.as_deref(), Some("e4f44d22-771e-4333-b6ba-f37c61c04d1a"));
        assert_eq!(h.parent_uuid.as_deref(), Some("5c5ff0e8-52c1-400b-ac07-c134304b923d"));
        assert_eq!(h.message_id.as_deref(), Some("msg_01"));
        assert_eq!(h.model.as_deref(), Some("claude-opus-5-5"));
        assert_eq!(h.usage.unwrap().context_tokens(), 12881 + 10 + 20 + 50);
        assert!(!h.is_sidechain && !h.is_meta);
        assert!(h.content_bytes > 20);
    }

    #[test]
    fn unknown_fields_round_trip_unchanged() {
        // Through the line: byte for byte.
        let rec = Record::parse(ASSISTANT).unwrap();
        assert_eq!(rec.line(), ASSISTANT);
        // Through a JSON object (the protocol path): same keys, same order, same values.
        let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(ASSISTANT).unwrap();
        let again = Record::from_object(&object).unwrap();
        let back: serde_json::Value = serde_json::from_str(again.line()).unwrap();
        assert_eq!(back, serde_json::Value::Object(object.clone()));
        let keys: Vec<_> = back.as_object().unwrap().keys().cloned().collect();
        let want: Vec<_> = object.keys().cloned().collect();
        assert_eq!(keys, want);
        assert_eq!(back["futureField"]["nested"][3], "\u{1f916}");
        // Only the escaping of non-ASCII text may differ (`\u2192` becomes the character).
        let mut head = again.head().clone();
        head.content_bytes = rec.head().content_bytes;
        assert_eq!(&head, rec.head());
    }

    #[test]
    fn kinds_and_boundary() {
        let boundary = r#"{"parentUuid":null,"logicalParentUuid":"a","type":"system","subtype":"compact_boundary","uuid":"b","compactMetadata":{"trigger":"manual","preTokens":25429}}"#;
        let rec = Record::parse(boundary).unwrap();
        assert!(rec.is_compact_boundary());
        assert_eq!(rec.head().parent_uuid, None);
        assert_eq!(rec.head().logical_parent_uuid.as_deref(), Some("a"));
        let other = Record::parse(r#"{"type":"file-history-snapshot","messageId":"x"}"#).unwrap();
        assert_eq!(other.head().kind, Kind::Other);
        assert!(!other.is_compact_boundary());
        let summary = Record::parse(r#"{"type":"summary","summary":"s","leafUuid":"l"}"#).unwrap();
        assert_eq!(summary.head().kind, Kind::Summary);
    }

    #[test]
    fn bad_lines_are_typed_errors() {
        assert_eq!(Record::parse("[1,2]"), Err(RecordError::NotAnObject));
        assert_eq!(Record::parse("42"), Err(RecordError::NotAnObject));
        assert!(matches!(Record::parse("{\"type\":"), Err(RecordError::Json(_))));
        assert!(matches!(Record::parse("garbage"), Err(RecordError::Json(_))));
        assert_eq!(Record::parse("{\"a\":\n1}"), Err(RecordError::LineBreak));
        // Wrong type for a known field is reported, not silently dropped.
        assert!(matches!(Record::parse(r#"{"isMeta":"yes"}"#), Err(RecordError::Json(_))));
    }

    // Found by the `record` fuzz target: a vertical tab before a number was trimmed as
    // whitespace, so text that is not JSON was reported as "not an object".
    #[test]
    fn only_json_whitespace_is_skipped_before_the_value() {
        assert!(matches!(Record::parse("\u{b}4"), Err(RecordError::Json(_))));
        assert!(matches!(Record::parse("\u{a0}[1]"), Err(RecordError::Json(_))));
        assert!(matches!(Record::parse("\u{c}{}"), Err(RecordError::Json(_))));
        assert_eq!(Record::parse(" \t\r[1]"), Err(RecordError::NotAnObject));
        assert_eq!(Record::parse(" \t{}").unwrap().line(), " \t{}");
    }
}
