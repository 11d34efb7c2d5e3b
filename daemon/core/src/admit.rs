//! What ctxd admits from outside: records a client appends or an import brings.
//!
//! ctxd writes bookkeeping of its own into a transcript (records of type `ctxd-*`,
//! system records of subtype `ctxd_*`, fields named `ctxd…` on a boundary or a kept
//! copy) and acts on it when a session is reopened: an install batch size decides what a
//! crash cut short, an undo record moves the view. Only ctxd may decide that, so what
//! comes from outside is checked here first: ctxd's own record kinds are refused (append)
//! or left out (import), ctxd's own fields are removed, and the JSON must be strict (no
//! unpaired surrogate escapes, no number a double cannot hold), the same rule for every
//! route a record takes in.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::record::{Kind, Record};

/// The prefix of record types ctxd writes for itself (`ctxd-file-read`, `ctxd-snip`, …).
pub const OWN_TYPE_PREFIX: &str = "ctxd-";
/// The prefix of system subtypes ctxd writes for itself (`ctxd_undo_compact`).
pub const OWN_SUBTYPE_PREFIX: &str = "ctxd_";
/// The prefix of fields ctxd adds to records of other types (`ctxdBatch` on a boundary's
/// `compactMetadata`, `ctxdKeptFrom` on a kept copy).
pub const OWN_FIELD_PREFIX: &str = "ctxd";

/// Why a record from a client was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    NotStrictJson(String),
    #[error(
        "type {0:?} is one of ctxd's own bookkeeping records; ctxd writes these itself (use ctx/fileRead, ctx/snip, ctx/undoCompact, …)"
    )]
    OwnRecord(String),
    #[error("a {0} record needs a \"uuid\" (ctxd drops a resent record by its uuid)")]
    MissingUuid(&'static str),
}

/// Checks a record a client appends: strict JSON, not one of ctxd's own kinds, a uuid
/// on every message-like record. ctxd's own fields are removed (the record is kept).
pub fn from_client(record: Record) -> Result<Record, Refusal> {
    strict_json(record.line()).map_err(Refusal::NotStrictJson)?;
    if let Some(own) = own_kind(&record) {
        return Err(Refusal::OwnRecord(own));
    }
    let kind = match record.head().kind {
        Kind::User => Some("user"),
        Kind::Assistant => Some("assistant"),
        Kind::System => Some("system"),
        Kind::Attachment => Some("attachment"),
        Kind::Summary | Kind::Other => None,
    };
    if let Some(kind) = kind
        && record.uuid().is_none_or(str::is_empty)
    {
        return Err(Refusal::MissingUuid(kind));
    }
    Ok(without_own_fields(record))
}

/// What an import does with one line of a transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Imported<'a> {
    /// Keep this text (the line itself, or with ctxd's fields removed and unpaired
    /// surrogate escapes replaced by U+FFFD).
    Keep { line: Cow<'a, str>, repaired: bool },
    /// One of ctxd's own records: not imported.
    Own(String),
}

/// Checks one line of a transcript being imported (already a valid record). Unlike an
/// append, nothing is refused for a fault the source file cannot fix: an unpaired
/// surrogate (JavaScript writes them) becomes U+FFFD, and ctxd's fields are removed.
pub fn from_import(line: &str) -> Result<Imported<'_>, String> {
    let repaired = replace_unpaired_surrogates(line);
    let text: &str = repaired.as_deref().unwrap_or(line);
    strict_json(text)?;
    let record = Record::parse(text).map_err(|e| e.to_string())?;
    if let Some(own) = own_kind(&record) {
        return Ok(Imported::Own(own));
    }
    let cleaned = without_own_fields(record);
    let changed = cleaned.line() != text;
    let line = match (changed, repaired) {
        (true, _) => Cow::Owned(cleaned.line().to_owned()),
        (false, Some(text)) => Cow::Owned(text),
        (false, None) => Cow::Borrowed(line),
    };
    let repaired = !matches!(line, Cow::Borrowed(_));
    Ok(Imported::Keep { line, repaired })
}

/// The record's type or subtype when it names one of ctxd's own kinds.
pub fn own_kind(record: &Record) -> Option<String> {
    if !record.line().contains(OWN_FIELD_PREFIX) {
        return None;
    }
    if let Some(subtype) = &record.head().subtype
        && subtype.starts_with(OWN_SUBTYPE_PREFIX)
    {
        return Some(format!("system/{subtype}"));
    }
    record_type(record.line()).filter(|t| t.starts_with(OWN_TYPE_PREFIX))
}

fn record_type(line: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Type<'a> {
        #[serde(borrow, default, rename = "type")]
        ty: Option<Cow<'a, str>>,
    }
    serde_json::from_str::<Type<'_>>(line).ok()?.ty.map(Cow::into_owned)
}

/// The record without ctxd's own fields, at the top level and in `compactMetadata`.
/// Lines that cannot hold one (no `ctxd` in the text) are returned as they are.
pub fn without_own_fields(record: Record) -> Record {
    if !record.line().contains(OWN_FIELD_PREFIX) {
        return record;
    }
    let Ok(serde_json::Value::Object(mut object)) = serde_json::from_str::<serde_json::Value>(record.line()) else {
        return record;
    };
    let own = |key: &String| key.starts_with(OWN_FIELD_PREFIX);
    let mut removed = false;
    let before = object.len();
    object.retain(|k, _| !own(k));
    removed |= object.len() != before;
    if let Some(serde_json::Value::Object(meta)) = object.get_mut("compactMetadata") {
        let before = meta.len();
        meta.retain(|k, _| !own(k));
        removed |= meta.len() != before;
    }
    if !removed {
        return record;
    }
    Record::from_object(&object).unwrap_or(record)
}

/// Refuses JSON a strict parser would: unpaired UTF-16 surrogate escapes, numbers out
/// of a double's range, nesting past serde_json's limit. Nothing is built: each value is
/// visited and dropped.
pub fn strict_json(text: &str) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_str(text);
    de.deserialize_any(StrictVisitor).map_err(|e| format!("not strict JSON: {e}"))?;
    de.end().map_err(|e| format!("not strict JSON: {e}"))
}

struct Strict;

impl<'de> de::Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Strict, D::Error> {
        deserializer.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Strict, E> {
        if v.is_finite() { Ok(Strict) } else { Err(E::custom("number out of range")) }
    }
    fn visit_str<E>(self, _: &str) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_borrowed_str<E>(self, _: &'de str) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_unit<E>(self) -> Result<Strict, E> {
        Ok(Strict)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        while seq.next_element::<Strict>()?.is_some() {}
        Ok(Strict)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        while map.next_entry::<Strict, Strict>()?.is_some() {}
        Ok(Strict)
    }
}

/// `text` with every unpaired surrogate escape (`\ud800` alone) replaced by `\ufffd`,
/// or `None` when there is none. Escaped backslashes are skipped, so `\\ud800` (a
/// backslash followed by the letters) is left alone.
pub fn replace_unpaired_surrogates(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let hex_at = |at: usize| -> Option<u16> {
        let digits = bytes.get(at..at + 4)?;
        u16::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    };
    let escape_at = |at: usize| -> Option<u16> {
        (bytes.get(at) == Some(&b'\\') && bytes.get(at + 1) == Some(&b'u')).then(|| hex_at(at + 2)).flatten()
    };
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut i = 0;
    while let Some(found) = text.get(i..).and_then(|rest| rest.find('\\')) {
        let at = i + found;
        match bytes.get(at + 1) {
            Some(b'u') => {
                let Some(unit) = hex_at(at + 2) else {
                    i = at + 2;
                    continue;
                };
                let high = (0xD800..0xDC00).contains(&unit);
                let low = (0xDC00..0xE000).contains(&unit);
                if high && escape_at(at + 6).is_some_and(|next| (0xDC00..0xE000).contains(&next)) {
                    i = at + 12;
                } else if high || low {
                    let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
                    out.push_str(&text[copied..at]);
                    out.push_str("\\ufffd");
                    copied = at + 6;
                    i = at + 6;
                } else {
                    i = at + 6;
                }
            }
            // Any other escape, an escaped backslash among them, is two bytes.
            Some(_) => i = at + 2,
            None => break,
        }
    }
    out.map(|mut out| {
        out.push_str(&text[copied..]);
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(line: &str) -> Record {
        Record::parse(line).unwrap()
    }

    #[test]
    fn strict_json_refuses_lone_surrogates_and_huge_numbers() {
        assert!(strict_json(r#"{"a":"\ud83e\udd16","n":1e300,"d":[1,-2,0.5,null,true]}"#).is_ok());
        assert!(strict_json(r#"{"a":"\ud800"}"#).unwrap_err().contains("not strict JSON"));
        assert!(strict_json(r#"{"a":"\udc00x"}"#).is_err());
        assert!(strict_json(r#"{"a":"\ud800\u0041"}"#).is_err());
        assert!(strict_json(r#"{"n":1e400}"#).is_err());
        assert!(strict_json(r#"{"n":-1e400}"#).is_err());
        // An escaped backslash followed by letters is text, not an escape.
        assert!(strict_json(r#"{"a":"\\ud800"}"#).is_ok());
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(strict_json(&deep).is_err());
    }

    #[test]
    fn unpaired_surrogates_become_replacement_characters() {
        assert_eq!(replace_unpaired_surrogates(r#"{"a":"ok \ud83e\udd16"}"#), None);
        assert_eq!(replace_unpaired_surrogates(r#"{"a":"\\ud800"}"#), None);
        assert_eq!(replace_unpaired_surrogates(r#"{"a":"x\ud800y"}"#).unwrap(), r#"{"a":"x\ufffdy"}"#);
        assert_eq!(
            replace_unpaired_surrogates(r#"{"a":"\udc00\ud800\ud83e\udd16\ud800"}"#).unwrap(),
            r#"{"a":"\ufffd\ufffd\ud83e\udd16\ufffd"}"#
        );
        let fixed = replace_unpaired_surrogates(r#"{"a":"\ud800\u0041"}"#).unwrap();
        assert!(strict_json(&fixed).is_ok(), "{fixed}");
    }

    #[test]
    fn a_client_cannot_send_ctxds_own_records() {
        for own in [
            r#"{"type":"ctxd-file-read","uuid":"u","path":"/etc/passwd"}"#,
            r#"{"type":"ctxd-snip","uuid":"u","removedUuids":["a"]}"#,
            r#"{"type":"system","subtype":"ctxd_undo_compact","uuid":"u","boundaryUuid":"b"}"#,
        ] {
            assert!(matches!(from_client(record(own)), Err(Refusal::OwnRecord(_))), "{own}");
        }
    }

    #[test]
    fn ctxds_fields_on_a_clients_boundary_are_removed() {
        let sent = record(
            r#"{"type":"system","subtype":"compact_boundary","uuid":"b1","ctxdKeptFrom":"x","compactMetadata":{"trigger":"manual","ctxdBatch":50,"ctxdTokensPerKib":300,"preTokens":9}}"#,
        );
        let kept = from_client(sent).unwrap();
        assert_eq!(
            kept.line(),
            r#"{"type":"system","subtype":"compact_boundary","uuid":"b1","compactMetadata":{"trigger":"manual","preTokens":9}}"#
        );
        assert!(kept.is_compact_boundary());
        // A line that only mentions ctxd in its text is kept byte for byte.
        let text = r#"{"type":"user","uuid":"u1","message":{"role":"user","content":"what is ctxdBatch?"}}"#;
        assert_eq!(from_client(record(text)).unwrap().line(), text);
    }

    #[test]
    fn message_records_need_a_uuid() {
        for kind in ["user", "assistant", "system", "attachment"] {
            let line = format!(r#"{{"type":"{kind}","message":{{"role":"user","content":"x"}}}}"#);
            assert_eq!(from_client(record(&line)), Err(Refusal::MissingUuid(kind)));
        }
        // Claude Code writes some kinds without one; they never reach a model.
        assert!(from_client(record(r#"{"type":"file-history-snapshot","messageId":"m"}"#)).is_ok());
        assert!(from_client(record(r#"{"type":"user","uuid":"","message":{}}"#)).is_err());
    }

    #[test]
    fn imports_repair_what_the_source_cannot_fix_and_leave_out_own_records() {
        assert_eq!(from_import(r#"{"type":"ctxd-plan","path":"/p"}"#).unwrap(), Imported::Own("ctxd-plan".into()));
        let same = r#"{"type":"user","uuid":"u"}"#;
        assert_eq!(from_import(same).unwrap(), Imported::Keep { line: Cow::Borrowed(same), repaired: false });
        let Imported::Keep { line, repaired } =
            from_import(r#"{"type":"user","uuid":"u","t":"\ud800","compactMetadata":{"ctxdBatch":3}}"#).unwrap()
        else {
            panic!("kept")
        };
        assert!(repaired);
        assert_eq!(line, "{\"type\":\"user\",\"uuid\":\"u\",\"t\":\"\u{fffd}\",\"compactMetadata\":{}}");
        assert!(from_import(r#"{"n":1e400}"#).is_err());
    }
}
