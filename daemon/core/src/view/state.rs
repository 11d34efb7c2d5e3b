//! What the pipeline must remember between requests, and the records that hold it.
//!
//! Context management never rewrites the transcript: a snip, a collapse, a cleared set of
//! tool results, a stored tool output are new records that the view applies at read time.
//! This module defines those records, folds them into a [`PipelineState`], and describes
//! what a request decided that the daemon must append ([`StateChanges`]), so the next
//! request and a resumed session make the same choices (stable prompt prefix).
//!
//! Record shapes (the daemon adds the common fields: `uuid`, `parentUuid`, `sessionId`,
//! `timestamp`):
//!
//! ```json
//! {"type":"ctxd-snip","removedUuids":["…","…"]}
//! {"type":"ctxd-collapse","from":"<uuid>","to":"<uuid>","summary":"…"}
//! {"type":"ctxd-microcompact","trigger":"time_gap","gapAfterUuid":"<last response uuid>","clearedToolUseIds":["toolu_…"]}
//! {"type":"ctxd-microcompact","trigger":"cache_edits","pinnedToUuid":"<user record uuid>","clearedToolUseIds":["toolu_…"]}
//! {"type":"ctxd-tool-result-replacement","toolUseId":"toolu_…","path":"/…/toolu_….txt","preview":"…","originalBytes":123456}
//! {"type":"attachment","attachment":{"type":"context_efficiency","growthTokens":41000},"rendered":[{"content":"<system-reminder>…</system-reminder>"}],"renderedRole":"user"}
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::record::{Kind, Record};

pub const SNIP_RECORD: &str = "ctxd-snip";
pub const COLLAPSE_RECORD: &str = "ctxd-collapse";
pub const MICROCOMPACT_RECORD: &str = "ctxd-microcompact";
pub const REPLACEMENT_RECORD: &str = "ctxd-tool-result-replacement";
/// `attachment.type` of the context-efficiency reminder.
pub const EFFICIENCY_ATTACHMENT: &str = "context_efficiency";

/// Everything the stages apply that is not in the messages themselves. Built by folding
/// the transcript's state records ([`PipelineState::observe`]); the daemon may also pass
/// state kept elsewhere (a collapse store), which is merged in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipelineState {
    /// Tool results stored on disk, by `tool_use_id`. The first record for an id wins.
    pub replacements: BTreeMap<String, Replacement>,
    /// Results whose content time-based microcompact replaced by the placeholder.
    pub cleared: BTreeSet<String>,
    /// Cache edits, each pinned to the user record whose message carries it.
    pub cache_edits: Vec<PinnedEdits>,
    /// Responses after which a time gap was already handled (once per gap).
    pub handled_gaps: BTreeSet<String>,
    pub snips: Vec<Snip>,
    pub collapses: Vec<Collapse>,
}

/// A stored tool output: where the full text is and what the model sees instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    pub path: String,
    pub preview: String,
    pub original_bytes: u64,
}

/// One snip: records removed from the model's view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snip {
    pub removed_uuids: Vec<String>,
}

/// A committed span summary: the records from `from` to `to` (inclusive, view order)
/// are replaced by `summary`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collapse {
    pub from: String,
    pub to: String,
    pub summary: String,
}

/// Cache edits sent in the message of one user record, on every request from the one
/// that created them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinnedEdits {
    pub pinned_to_uuid: String,
    pub tool_use_ids: Vec<String>,
}

/// Why microcompact acted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The cache was cold: old results were rewritten to the placeholder.
    TimeGap,
    /// The cache was warm: old results were deleted from it by cache edits.
    CacheEdits,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::TimeGap => "time_gap",
            Trigger::CacheEdits => "cache_edits",
        }
    }
}

/// What one microcompact decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicrocompactRecord {
    pub trigger: Trigger,
    /// The response the gap followed (time gap only).
    pub gap_after_uuid: Option<String>,
    /// The user record whose message carries the edits (cache edits only).
    pub pinned_to_uuid: Option<String>,
    pub cleared_tool_use_ids: Vec<String>,
}

/// One state record of the transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateRecord {
    Snip(Snip),
    Collapse(Collapse),
    Microcompact(MicrocompactRecord),
    Replacement { tool_use_id: String, replacement: Replacement },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StateLine {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    removed_uuids: Option<Vec<String>>,
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    to: Option<String>,
    #[serde(default)]
    summary: Option<String>,
    #[serde(default)]
    trigger: Option<String>,
    #[serde(default)]
    gap_after_uuid: Option<String>,
    #[serde(default)]
    pinned_to_uuid: Option<String>,
    #[serde(default)]
    cleared_tool_use_ids: Option<Vec<String>>,
    #[serde(default)]
    tool_use_id: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    preview: Option<String>,
    #[serde(default)]
    original_bytes: Option<u64>,
}

impl StateRecord {
    /// Reads a state record; `None` for every other record (and for a state record
    /// missing what it needs, which is then ignored like any unknown line).
    pub fn from_record(record: &Record) -> Option<StateRecord> {
        // Cheap test first: most records are messages and bookkeeping.
        if record.head().kind != Kind::Other || !record.line().contains("\"ctxd-") {
            return None;
        }
        let line: StateLine = serde_json::from_str(record.line()).ok()?;
        match line.kind.as_str() {
            SNIP_RECORD => Some(StateRecord::Snip(Snip { removed_uuids: line.removed_uuids? })),
            COLLAPSE_RECORD => {
                Some(StateRecord::Collapse(Collapse { from: line.from?, to: line.to?, summary: line.summary? }))
            }
            MICROCOMPACT_RECORD => {
                let trigger = match line.trigger.as_deref()? {
                    "time_gap" => Trigger::TimeGap,
                    "cache_edits" => Trigger::CacheEdits,
                    _ => return None,
                };
                if trigger == Trigger::CacheEdits && line.pinned_to_uuid.is_none() {
                    return None;
                }
                Some(StateRecord::Microcompact(MicrocompactRecord {
                    trigger,
                    gap_after_uuid: line.gap_after_uuid,
                    pinned_to_uuid: line.pinned_to_uuid,
                    cleared_tool_use_ids: line.cleared_tool_use_ids?,
                }))
            }
            REPLACEMENT_RECORD => Some(StateRecord::Replacement {
                tool_use_id: line.tool_use_id?,
                replacement: Replacement {
                    path: line.path?,
                    preview: line.preview?,
                    original_bytes: line.original_bytes.unwrap_or(0),
                },
            }),
            _ => None,
        }
    }

    /// The record's own fields, as the daemon appends them.
    pub fn to_json(&self) -> Map<String, Value> {
        let value = match self {
            StateRecord::Snip(s) => json!({"type": SNIP_RECORD, "removedUuids": s.removed_uuids}),
            StateRecord::Collapse(c) => {
                json!({"type": COLLAPSE_RECORD, "from": c.from, "to": c.to, "summary": c.summary})
            }
            StateRecord::Microcompact(m) => {
                let mut v = json!({"type": MICROCOMPACT_RECORD, "trigger": m.trigger.as_str()});
                if let Some(gap) = &m.gap_after_uuid {
                    v["gapAfterUuid"] = json!(gap);
                }
                if let Some(pin) = &m.pinned_to_uuid {
                    v["pinnedToUuid"] = json!(pin);
                }
                v["clearedToolUseIds"] = json!(m.cleared_tool_use_ids);
                v
            }
            StateRecord::Replacement { tool_use_id, replacement } => json!({
                "type": REPLACEMENT_RECORD,
                "toolUseId": tool_use_id,
                "path": replacement.path,
                "preview": replacement.preview,
                "originalBytes": replacement.original_bytes,
            }),
        };
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }
}

impl PipelineState {
    /// The state of a whole record list.
    pub fn from_records(records: &[Record]) -> PipelineState {
        let mut state = PipelineState::default();
        for record in records {
            state.observe(record);
        }
        state
    }

    /// Folds one record in; returns the state record it was, if any.
    pub fn observe(&mut self, record: &Record) -> Option<StateRecord> {
        let state = StateRecord::from_record(record)?;
        self.apply(&state);
        Some(state)
    }

    /// Folds one state record in. Idempotent: the same record twice changes nothing.
    pub fn apply(&mut self, record: &StateRecord) {
        match record {
            StateRecord::Snip(snip) => {
                if !self.snips.contains(snip) {
                    self.snips.push(snip.clone());
                }
            }
            StateRecord::Collapse(collapse) => {
                if !self.collapses.contains(collapse) {
                    self.collapses.push(collapse.clone());
                }
            }
            StateRecord::Microcompact(m) => match m.trigger {
                Trigger::TimeGap => {
                    self.cleared.extend(m.cleared_tool_use_ids.iter().cloned());
                    if let Some(gap) = &m.gap_after_uuid {
                        self.handled_gaps.insert(gap.clone());
                    }
                }
                Trigger::CacheEdits => {
                    if let Some(pin) = &m.pinned_to_uuid {
                        let edits =
                            PinnedEdits { pinned_to_uuid: pin.clone(), tool_use_ids: m.cleared_tool_use_ids.clone() };
                        if !self.cache_edits.contains(&edits) {
                            self.cache_edits.push(edits);
                        }
                    }
                }
            },
            StateRecord::Replacement { tool_use_id, replacement } => {
                self.replacements.entry(tool_use_id.clone()).or_insert_with(|| replacement.clone());
            }
        }
    }

    /// Adds everything in `other` (union; order of lists kept, duplicates skipped).
    pub fn merge(&mut self, other: &PipelineState) {
        for (id, r) in &other.replacements {
            self.replacements.entry(id.clone()).or_insert_with(|| r.clone());
        }
        self.cleared.extend(other.cleared.iter().cloned());
        self.handled_gaps.extend(other.handled_gaps.iter().cloned());
        for edits in &other.cache_edits {
            if !self.cache_edits.contains(edits) {
                self.cache_edits.push(edits.clone());
            }
        }
        for snip in &other.snips {
            if !self.snips.contains(snip) {
                self.snips.push(snip.clone());
            }
        }
        for collapse in &other.collapses {
            if !self.collapses.contains(collapse) {
                self.collapses.push(collapse.clone());
            }
        }
    }

    /// Tool results whose cached copy was deleted by cache edits.
    pub fn deleted_by_cache_edits(&self) -> BTreeSet<&str> {
        self.cache_edits.iter().flat_map(|e| e.tool_use_ids.iter().map(String::as_str)).collect()
    }
}

/// A tool result to store on disk: the daemon writes `content` to `replacement.path`
/// (once), then appends the replacement record before sending the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offload {
    pub tool_use_id: String,
    pub replacement: Replacement,
    /// The full text of the result.
    pub content: String,
}

/// The context-efficiency reminder added to this request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reminder {
    pub growth_tokens: u64,
    pub text: String,
}

/// What one request decided that later requests must see again: the daemon appends
/// [`StateChanges::records`] to the transcript (after writing offloaded outputs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateChanges {
    pub offloads: Vec<Offload>,
    pub microcompact: Option<MicrocompactRecord>,
    pub reminder: Option<Reminder>,
}

impl StateChanges {
    pub fn is_empty(&self) -> bool {
        self.offloads.is_empty() && self.microcompact.is_none() && self.reminder.is_none()
    }

    /// The records to append, in order, without the common fields.
    pub fn records(&self) -> Vec<Map<String, Value>> {
        let mut out: Vec<Map<String, Value>> = self
            .offloads
            .iter()
            .map(|o| {
                StateRecord::Replacement { tool_use_id: o.tool_use_id.clone(), replacement: o.replacement.clone() }
                    .to_json()
            })
            .collect();
        if let Some(m) = &self.microcompact {
            out.push(StateRecord::Microcompact(m.clone()).to_json());
        }
        if let Some(r) = &self.reminder
            && let Value::Object(map) = json!({
                "type": "attachment",
                "attachment": {"type": EFFICIENCY_ATTACHMENT, "growthTokens": r.growth_tokens},
                "rendered": [{"content": r.text}],
                "renderedRole": "user",
            })
        {
            out.push(map);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(map: Map<String, Value>) -> Record {
        Record::from_object(&map).unwrap()
    }

    #[test]
    fn records_round_trip_through_the_transcript() {
        let changes = StateChanges {
            offloads: vec![Offload {
                tool_use_id: "t1".into(),
                replacement: Replacement { path: "/s/t1.txt".into(), preview: "p".into(), original_bytes: 9 },
                content: "full".into(),
            }],
            microcompact: Some(MicrocompactRecord {
                trigger: Trigger::TimeGap,
                gap_after_uuid: Some("a9".into()),
                pinned_to_uuid: None,
                cleared_tool_use_ids: vec!["t0".into()],
            }),
            reminder: Some(Reminder { growth_tokens: 5, text: "r".into() }),
        };
        let records: Vec<Record> = changes.records().into_iter().map(record).collect();
        assert_eq!(records.len(), 3);
        let state = PipelineState::from_records(&records);
        assert_eq!(state.replacements["t1"].path, "/s/t1.txt");
        assert!(state.cleared.contains("t0") && state.handled_gaps.contains("a9"));
        // The reminder is an ordinary attachment, not state.
        assert_eq!(records[2].head().kind, Kind::Attachment);

        let snip = StateRecord::Snip(Snip { removed_uuids: vec!["u1".into()] });
        let collapse = StateRecord::Collapse(Collapse { from: "a".into(), to: "b".into(), summary: "s".into() });
        for rec in [snip, collapse] {
            assert_eq!(StateRecord::from_record(&record(rec.to_json())), Some(rec));
        }
    }

    #[test]
    fn folding_is_idempotent_and_first_replacement_wins() {
        let mut state = PipelineState::default();
        let first = StateRecord::Replacement {
            tool_use_id: "t".into(),
            replacement: Replacement { path: "a".into(), preview: "1".into(), original_bytes: 1 },
        };
        let second = StateRecord::Replacement {
            tool_use_id: "t".into(),
            replacement: Replacement { path: "b".into(), preview: "2".into(), original_bytes: 2 },
        };
        let edits = StateRecord::Microcompact(MicrocompactRecord {
            trigger: Trigger::CacheEdits,
            gap_after_uuid: None,
            pinned_to_uuid: Some("u".into()),
            cleared_tool_use_ids: vec!["x".into()],
        });
        for rec in [&first, &second, &edits, &edits] {
            state.apply(rec);
        }
        assert_eq!(state.replacements["t"].path, "a");
        assert_eq!(state.cache_edits.len(), 1);
        let mut merged = state.clone();
        merged.merge(&state);
        assert_eq!(merged, state);
        assert!(StateRecord::from_record(&Record::parse(r#"{"type":"ctxd-snip"}"#).unwrap()).is_none());
    }
}
