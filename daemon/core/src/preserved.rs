//! The messages a compact boundary keeps in view from before it: one reader for every
//! consumer (the request view's slice, the offline summary's scan, the session actor
//! that carries them across a boundary it folds in).
//!
//! Claude Code does not copy the messages a compaction keeps. They stay where they are,
//! before the boundary, and the boundary points at them: `compactMetadata.preservedSegment`
//! names the first and last (`headUuid`, `tailUuid`) and the record they follow once
//! relinked (`anchorUuid`, the summary); `preservedMessages` lists their uuids
//! (`allUuids`, or `uuids`). On resume the program puts them back after the anchor.
//!
//! ctxd's own boundaries reference the newest kept messages the same way. Before they
//! did, ctxd copied those messages after the summary and still named the originals in a
//! segment: a boundary ctxd installed (`compactMetadata.ctxdBatch`) without the
//! `ctxdReferences` mark is one of those, and its segment is evidence only, so the kept
//! messages are never seen twice.

use std::collections::HashSet;

use serde::Deserialize;

use crate::record::{Kind, Record};

/// Field a boundary ctxd installs carries when its segment references kept messages
/// (rather than naming the originals of copies, as ctxd did before).
pub const REFERENCES_FIELD: &str = "ctxdReferences";

/// What a boundary keeps from before it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preserved {
    /// Indices into the records before the boundary, in file order.
    pub kept: Vec<usize>,
    /// The record the kept messages follow once relinked (the summary).
    pub anchor: Option<String>,
    /// Why a segment the boundary names could not be put back.
    pub note: Option<&'static str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BoundaryLine {
    #[serde(default)]
    compact_metadata: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Segment {
    head_uuid: String,
    anchor_uuid: Option<String>,
    tail_uuid: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Messages {
    #[serde(default)]
    anchor_uuid: Option<String>,
    #[serde(default)]
    all_uuids: Option<Vec<String>>,
    #[serde(default)]
    uuids: Option<Vec<String>>,
}

/// What the boundary's metadata names, before looking for it.
#[derive(Debug, Default)]
struct Named {
    segment: Option<Segment>,
    uuids: Option<HashSet<String>>,
    anchor: Option<String>,
}

fn named(boundary: &Record) -> Named {
    // Most boundaries keep nothing: skip the parse unless a field can be there.
    let line = boundary.line();
    if !line.contains("\"preserved") {
        return Named::default();
    }
    let Some(serde_json::Value::Object(metadata)) =
        serde_json::from_str::<BoundaryLine>(line).ok().and_then(|b| b.compact_metadata)
    else {
        return Named::default();
    };
    if metadata.contains_key("ctxdBatch") && !metadata.contains_key(REFERENCES_FIELD) {
        return Named::default();
    }
    let segment = metadata.get("preservedSegment").and_then(|v| Segment::deserialize(v).ok());
    let messages = metadata.get("preservedMessages").and_then(|v| Messages::deserialize(v).ok());
    let anchor = segment
        .as_ref()
        .and_then(|s| s.anchor_uuid.clone())
        .or_else(|| messages.as_ref().and_then(|m| m.anchor_uuid.clone()));
    let uuids = messages.and_then(|m| m.all_uuids.or(m.uuids)).map(|u| u.into_iter().collect());
    Named { segment, uuids, anchor }
}

/// A record that can be a message of the main chain.
fn is_message(record: &Record) -> bool {
    let head = record.head();
    !head.is_sidechain && matches!(head.kind, Kind::User | Kind::Assistant | Kind::Attachment)
}

/// The records of `before` (what precedes `boundary`, all of it or a tail that holds the
/// segment) that `boundary` keeps in view.
///
/// With a `preservedSegment`, the messages from its head to its tail in file order (a
/// walk of parent pointers would miss parallel tool results, which hang off different
/// tool-use lines), narrowed to `preservedMessages` when that lists them. With only
/// `preservedMessages`, the messages it lists.
pub fn preserved(boundary: &Record, before: &[Record]) -> Preserved {
    let Named { segment, uuids, anchor } = named(boundary);
    let listed = |r: &Record| uuids.as_ref().is_none_or(|set| r.uuid().is_some_and(|u| set.contains(u)));
    let kept: Vec<usize> = match &segment {
        Some(segment) => {
            let head = before.iter().position(|r| r.uuid() == Some(segment.head_uuid.as_str()));
            let tail = before.iter().rposition(|r| r.uuid() == Some(segment.tail_uuid.as_str()));
            let (Some(head), Some(tail)) = (head, tail) else {
                return Preserved {
                    note: Some("its preserved segment is not among the records given"),
                    ..Preserved::default()
                };
            };
            if head > tail {
                return Preserved { note: Some("its preserved segment ends before it starts"), ..Preserved::default() };
            }
            (head..=tail).filter(|&i| is_message(&before[i]) && listed(&before[i])).collect()
        }
        None if uuids.is_some() => {
            (0..before.len()).filter(|&i| is_message(&before[i]) && listed(&before[i])).collect()
        }
        None => return Preserved::default(),
    };
    Preserved { kept, anchor, note: None }
}

/// `record` without `message.usage`: a kept message counted again after a boundary is
/// part of the new context, and the usage it reported measured the old one.
pub fn without_usage(record: &Record) -> Record {
    if !record.line().contains("\"usage\"") {
        return record.clone();
    }
    let Ok(mut object) = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(record.line()) else {
        return record.clone();
    };
    if let Some(serde_json::Value::Object(message)) = object.get_mut("message") {
        message.remove("usage");
    }
    Record::from_object(&object).unwrap_or_else(|_| record.clone())
}

/// The uuid of the record a boundary's kept messages start at, when it keeps any: how
/// far back before a boundary a reader must look (the segment's head, else the first
/// listed uuid in file order is not known without the records, so `None`).
pub fn segment_head(boundary: &Record) -> Option<String> {
    named(boundary).segment.map(|s| s.head_uuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(text: &str) -> Record {
        Record::parse(text).unwrap()
    }

    fn user(uuid: &str) -> Record {
        rec(&format!(r#"{{"type":"user","uuid":"{uuid}","message":{{"role":"user","content":"{uuid}"}}}}"#))
    }

    fn assistant(uuid: &str) -> Record {
        rec(&format!(
            r#"{{"type":"assistant","uuid":"{uuid}","message":{{"role":"assistant","content":[{{"type":"text","text":"{uuid}"}}]}}}}"#
        ))
    }

    fn boundary(metadata: &str) -> Record {
        rec(&format!(r#"{{"type":"system","subtype":"compact_boundary","uuid":"b","compactMetadata":{metadata}}}"#))
    }

    #[test]
    fn a_segment_keeps_its_messages_in_file_order() {
        let before = [
            user("u1"),
            assistant("a1"),
            rec(r#"{"type":"last-prompt","lastPrompt":"x"}"#),
            user("u2"),
            rec(
                r#"{"type":"assistant","uuid":"side","isSidechain":true,"message":{"role":"assistant","content":"s"}}"#,
            ),
            assistant("a2"),
            user("u3"),
        ];
        let b = boundary(r#"{"preservedSegment":{"headUuid":"a1","anchorUuid":"s","tailUuid":"a2"}}"#);
        assert_eq!(preserved(&b, &before), Preserved { kept: vec![1, 3, 5], anchor: Some("s".into()), note: None });
        // Narrowed to the uuids listed.
        let b = boundary(
            r#"{"preservedSegment":{"headUuid":"a1","anchorUuid":"s","tailUuid":"a2"},"preservedMessages":{"anchorUuid":"s","allUuids":["a1","a2"]}}"#,
        );
        assert_eq!(preserved(&b, &before).kept, vec![1, 5]);
        // Only the list.
        let b = boundary(r#"{"preservedMessages":{"anchorUuid":"s","uuids":["u2","u3"]}}"#);
        assert_eq!(preserved(&b, &before), Preserved { kept: vec![3, 6], anchor: Some("s".into()), note: None });
    }

    #[test]
    fn missing_or_reversed_segments_keep_nothing_and_say_why() {
        let before = [user("u1"), assistant("a1")];
        let b = boundary(r#"{"preservedSegment":{"headUuid":"zz","anchorUuid":"s","tailUuid":"a1"}}"#);
        assert!(preserved(&b, &before).kept.is_empty());
        assert!(preserved(&b, &before).note.is_some());
        let b = boundary(r#"{"preservedSegment":{"headUuid":"a1","anchorUuid":"s","tailUuid":"u1"}}"#);
        assert_eq!(preserved(&b, &before).note, Some("its preserved segment ends before it starts"));
        // Nothing named, nothing kept.
        assert_eq!(preserved(&boundary(r#"{"trigger":"auto"}"#), &before), Preserved::default());
        assert_eq!(preserved(&boundary(r#"{"preservedSegment":7}"#), &before), Preserved::default());
    }

    #[test]
    fn ctxds_older_boundaries_copied_what_they_kept() {
        let before = [user("u1"), assistant("a1")];
        let b = boundary(r#"{"ctxdBatch":4,"preservedSegment":{"headUuid":"a1","anchorUuid":"s","tailUuid":"a1"}}"#);
        assert_eq!(preserved(&b, &before), Preserved::default());
        assert_eq!(segment_head(&b), None);
        // Marked: the segment references the messages, which were not copied.
        let b = boundary(
            r#"{"ctxdBatch":4,"ctxdReferences":true,"preservedSegment":{"headUuid":"a1","anchorUuid":"s","tailUuid":"a1"}}"#,
        );
        assert_eq!(preserved(&b, &before).kept, vec![1]);
        let b = boundary(r#"{"preservedSegment":{"headUuid":"a1","anchorUuid":"s","tailUuid":"a1"}}"#);
        assert_eq!(segment_head(&b).as_deref(), Some("a1"));
    }
}
