//! Records in, items out: the parsed layer every request reuses.
//!
//! Ingesting a record parses it once into an [`Item`] (or folds it into the pipeline
//! state when it is a state record) and keeps the running facts later stages ask for
//! (the last response, tool names, growth since the last snip), so a request after one
//! appended record costs one record's parse.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::item::{BlockKind, Item, Origin, Role};
use super::slice::Slice;
use super::state::{EFFICIENCY_ATTACHMENT, PipelineState, StateRecord};
use crate::record::Record;

/// The latest model response of the view: where a time gap is measured from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastResponse {
    pub uuid: Option<Arc<str>>,
    pub timestamp_ms: Option<i64>,
}

/// What ingesting one record did.
#[derive(Debug, Clone, PartialEq)]
pub enum Ingested {
    /// A new item at this index of [`Ingest::items`].
    Item(usize),
    State(StateRecord),
    /// Not for the model (bookkeeping, system, sidechain, duplicate, empty).
    Skipped,
}

/// The parsed view of a session from its latest boundary, plus its state.
#[derive(Debug, Clone, Default)]
pub struct Ingest {
    pub items: Vec<Item>,
    /// State records folded so far (including those before the boundary: they may name
    /// records of a preserved segment).
    pub state: PipelineState,
    /// Estimated tokens added since the last snip or context-efficiency reminder.
    pub growth_tokens: u64,
    pub last_response: Option<LastResponse>,
    /// Index in `items` of the last response; results after it are new to the model.
    pub last_response_index: Option<usize>,
    /// Tool name of every tool_use seen, by id.
    pub tool_names: HashMap<Arc<str>, Arc<str>>,
    /// Snip and collapse records after the last response.
    since_response: Vec<StateRecord>,
    seen: HashSet<Arc<str>>,
}

impl Ingest {
    /// Ingests the records of a slice.
    pub fn from_records(records: &[Record], slice: &Slice) -> Ingest {
        let mut ingest = Ingest::default();
        for record in &records[..slice.start.min(records.len())] {
            ingest.state.observe(record);
        }
        for i in slice.kept() {
            if let Some(record) = records.get(i) {
                ingest.push(record);
            }
        }
        ingest
    }

    /// Ingests one record (after the boundary).
    pub fn push(&mut self, record: &Record) -> Ingested {
        if let Some(state) = StateRecord::from_record(record) {
            // A snip or collapse appended again is not a new one.
            let new = match &state {
                StateRecord::Snip(s) => !self.state.snips.contains(s),
                StateRecord::Collapse(c) => !self.state.collapses.contains(c),
                _ => false,
            };
            self.state.apply(&state);
            if matches!(state, StateRecord::Snip(_)) {
                self.growth_tokens = 0;
            }
            if new {
                self.since_response.push(state.clone());
            }
            return Ingested::State(state);
        }
        let Some(item) = Item::from_record(record) else {
            return Ingested::Skipped;
        };
        if let Some(uuid) = &item.uuid {
            // The same line appended twice (a retried append, a resumed import).
            if !self.seen.insert(uuid.clone()) {
                return Ingested::Skipped;
            }
        }
        if matches!(&item.origin, Origin::Attachment(kind) if kind.as_ref() == EFFICIENCY_ATTACHMENT) {
            self.growth_tokens = 0;
        } else {
            self.growth_tokens += item.tokens();
        }
        if item.role == Role::Assistant {
            for block in &item.blocks {
                if let BlockKind::ToolUse { id, name } = &block.kind {
                    self.tool_names.insert(id.clone(), name.clone());
                }
            }
            self.last_response = Some(LastResponse { uuid: item.uuid.clone(), timestamp_ms: item.timestamp_ms });
            self.last_response_index = Some(self.items.len());
            self.since_response.clear();
        }
        self.items.push(item);
        Ingested::Item(self.items.len() - 1)
    }

    /// Snip and collapse records appended after the last response (the provider's
    /// reported usage does not reflect them yet).
    pub fn state_since_response(&self) -> &[StateRecord] {
        &self.since_response
    }

    /// Index of the first item the model has not answered yet.
    pub fn unanswered_from(&self) -> usize {
        self.last_response_index.map_or(0, |i| i + 1)
    }
}
