//! The record parser (`ctxd_core::record::Record`).
//!
//! Input: one line of text. The head is read by a borrowing deserializer that skips
//! what it does not know; the properties compare it with a full JSON reading of the
//! same line:
//! - a parsed record keeps the line exactly, has no line break, and its line is a JSON
//!   object (every later stage reads it as one), except for valid JSON past the limits
//!   of serde_json's value tree (see `TREE_LIMITS`), which is kept as written;
//! - each head field is what the object holds (ids, type, flags, model, usage, content);
//! - the record built from the object (the protocol's path) has the same head;
//! - an object whose known fields have the right types always parses (no valid record
//!   is refused), and an error names the right reason.

#![no_main]

use ctxd_core::record::{Kind, Record, RecordError, TokenUsage};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

/// Limits of serde_json's value tree that its skipping reader does not apply: nesting
/// deeper than 128, numbers past `f64`, unpaired UTF-16 surrogates in `\u` escapes.
const TREE_LIMITS: &[&str] = &[
    "recursion limit exceeded",
    "number out of range",
    "lone leading surrogate in hex escape",
    "unexpected end of hex escape",
    "invalid unicode code point",
];

fn str_field<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    object.get(key).and_then(Value::as_str)
}

fn flag(object: &Map<String, Value>, key: &str) -> bool {
    object.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// Whether the fields the head reads have the types it accepts.
fn well_typed(object: &Map<String, Value>) -> bool {
    let str_or_null = |v: Option<&Value>| v.is_none_or(|v| v.is_null() || v.is_string());
    let bool_or_null = |v: Option<&Value>| v.is_none_or(|v| v.is_null() || v.is_boolean());
    let strings = ["uuid", "parentUuid", "logicalParentUuid", "type", "subtype", "timestamp"];
    let flags = ["isMeta", "isSidechain", "isCompactSummary", "isApiErrorMessage"];
    let message_ok = match object.get("message") {
        None | Some(Value::Null) => true,
        Some(Value::Object(m)) => {
            str_or_null(m.get("id"))
                && str_or_null(m.get("model"))
                && match m.get("usage") {
                    None | Some(Value::Null) => true,
                    Some(Value::Object(u)) => {
                        ["input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"]
                            .iter()
                            .all(|k| u.get(*k).is_none_or(Value::is_u64))
                    }
                    Some(_) => false,
                }
        }
        Some(_) => false,
    };
    strings.iter().all(|k| str_or_null(object.get(*k)))
        && flags.iter().all(|k| bool_or_null(object.get(*k)))
        && message_ok
}

fn usage_of(message: &Map<String, Value>) -> Option<TokenUsage> {
    let u = message.get("usage")?.as_object()?;
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    Some(TokenUsage {
        input_tokens: n("input_tokens"),
        cache_creation_input_tokens: n("cache_creation_input_tokens"),
        cache_read_input_tokens: n("cache_read_input_tokens"),
        output_tokens: n("output_tokens"),
    })
}

fn check_head(record: &Record, object: &Map<String, Value>, line: &str) {
    let head = record.head();
    let owned = |s: Option<&str>| s.map(Box::<str>::from);
    assert_eq!(head.uuid, owned(str_field(object, "uuid")), "{line}");
    assert_eq!(record.uuid(), str_field(object, "uuid"));
    assert_eq!(head.parent_uuid, owned(str_field(object, "parentUuid")), "{line}");
    assert_eq!(head.logical_parent_uuid, owned(str_field(object, "logicalParentUuid")), "{line}");
    assert_eq!(head.subtype, owned(str_field(object, "subtype")), "{line}");
    assert_eq!(head.timestamp, owned(str_field(object, "timestamp")), "{line}");
    let kind = match str_field(object, "type") {
        Some("user") => Kind::User,
        Some("assistant") => Kind::Assistant,
        Some("system") => Kind::System,
        Some("attachment") => Kind::Attachment,
        Some("summary") => Kind::Summary,
        _ => Kind::Other,
    };
    assert_eq!(head.kind, kind, "{line}");
    assert_eq!(head.is_meta, flag(object, "isMeta"));
    assert_eq!(head.is_sidechain, flag(object, "isSidechain"));
    assert_eq!(head.is_compact_summary, flag(object, "isCompactSummary"));
    assert_eq!(head.is_api_error, flag(object, "isApiErrorMessage"));
    assert_eq!(
        record.is_compact_boundary(),
        kind == Kind::System && str_field(object, "subtype") == Some("compact_boundary")
    );
    let message = object.get("message").and_then(Value::as_object);
    assert_eq!(head.message_id, owned(message.and_then(|m| str_field(m, "id"))), "{line}");
    assert_eq!(head.model, owned(message.and_then(|m| str_field(m, "model"))), "{line}");
    assert_eq!(head.usage, message.and_then(usage_of), "{line}");
    let has_content = message.and_then(|m| m.get("content")).is_some_and(|c| !c.is_null());
    assert_eq!(head.content_bytes > 0, has_content, "{line}");
    assert!(head.content_bytes as usize <= line.len());
}

fn check(line: &str) {
    let parsed = Record::parse(line);
    let value: Result<Value, _> = serde_json::from_str(line);
    match parsed {
        Ok(record) => {
            assert_eq!(record.line(), line);
            assert_eq!(&**record.line_arc(), line);
            assert!(!line.contains('\n'));
            let object = match &value {
                Ok(Value::Object(object)) => object,
                // Valid JSON that serde_json's value tree cannot hold: the head reader
                // skips unknown fields without these checks, and the record is kept
                // as written (lossless import). Later readers treat it as opaque.
                Err(e) if TREE_LIMITS.iter().any(|limit| e.to_string().starts_with(limit)) => {
                    assert_eq!(record.to_value(), Value::Null);
                    return;
                }
                _ => panic!("a parsed record is not a JSON object: {value:?} for {line:?}"),
            };
            assert_eq!(record.to_value(), Value::Object(object.clone()));
            check_head(&record, object, line);
            // The protocol's path: the same head (only the length of the content text may
            // differ, as the re-serialized text escapes differently).
            let again = match Record::from_object(object) {
                Ok(again) => again,
                Err(e) => panic!("from_object refused a parsed record ({e}): {line}"),
            };
            let mut head = again.head().clone();
            assert_eq!(head.content_bytes > 0, record.head().content_bytes > 0);
            head.content_bytes = record.head().content_bytes;
            assert_eq!(&head, record.head(), "{line}");
            // Parsing is a function of the text.
            assert_eq!(Record::parse(line), Ok(record));
        }
        Err(RecordError::LineBreak) => assert!(line.contains('\n')),
        Err(RecordError::NotAnObject) => {
            assert!(!line.contains('\n'));
            let tree_limit = value.as_ref().is_err_and(|e| TREE_LIMITS.iter().any(|l| e.to_string().starts_with(l)));
            assert!(tree_limit || matches!(&value, Ok(v) if !v.is_object()), "NotAnObject for {line:?}: {value:?}");
        }
        Err(RecordError::Json(why)) => {
            assert!(!line.contains('\n'));
            if let Ok(Value::Object(object)) = &value {
                // Valid JSON refused: a known field has the wrong type, or is given twice.
                if well_typed(object) {
                    // Then the de-duplicated object must be accepted.
                    assert!(Record::from_object(object).is_ok(), "well-typed object refused ({why}): {line}");
                }
            } else {
                assert!(value.is_err(), "{line:?}: {why}");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    check(&text);
    // The same bytes as one line: the common case of a transcript line.
    if text.contains('\n') {
        check(&text.replace('\n', " "));
    }
});
