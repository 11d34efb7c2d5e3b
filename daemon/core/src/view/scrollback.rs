//! The UI view: the whole scrollback, each message marked with why the model no longer
//! sees it (`includeSnipped`).
//!
//! A client that draws the conversation wants every message, not only what the next
//! request carries, and wants to show what was taken out of the model's view and why.
//! [`scrollback`] lists the messages of the active chain of every records given, in view
//! order, with their content as the transcript has it, and marks:
//!
//! - messages before the latest compact boundary: [`Hidden::Compacted`] (the model sees
//!   the compaction summary instead). Each compacted conversation is its own chain, ended
//!   where its boundary's `logicalParentUuid` says. Pass every record of the session for
//!   the whole scrollback, or the records from the latest boundary on (what the daemon
//!   keeps in memory) for the scrollback since then;
//! - messages a snip removed: [`Hidden::Snipped`];
//! - messages a collapse replaced: [`Hidden::Collapsed`], pointing at the entry that holds
//!   the summary the model sees in their place (an entry of kind
//!   [`EntryKind::CollapseSummary`], listed after the span);
//! - tool results whose content the model sees changed: cleared by microcompact, deleted
//!   from the prompt cache by cache edits, or replaced by a stored-output preview
//!   ([`ResultChange`]).
//!
//! Records on a branch the host rewound away from are not listed (only counted): they
//! are no longer the conversation. Each decision comes from the stage that makes it for
//! requests ([`slice`](super::slice), [`chain`](super::chain), [`ingest`](super::ingest),
//! [`snip::plan_snips`], [`collapse::plan_collapses`], the folded
//! [`PipelineState`]); nothing here decides anything on its own. What one request adds
//! (base context, extras, a fork's instruction) and normalization's repairs are not part
//! of the scrollback.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::chain::Chain;
use super::collapse::{plan_collapses, summary_item};
use super::config::PipelineConfig;
use super::content::ContentRules;
use super::ingest::Ingest;
use super::item::{Item, Origin, Role};
use super::slice::slice_after_boundary;
use super::snip::plan_snips;
use super::state::PipelineState;
use crate::record::Record;

/// Every message of the active chain, marked.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Scrollback {
    pub entries: Vec<ScrollbackEntry>,
    /// The latest compact boundary among the records given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundary_uuid: Option<String>,
    /// Message records on branches the host rewound away from, not listed.
    pub off_chain: usize,
}

/// One message of the scrollback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ScrollbackEntry {
    /// The record's uuid (none for a collapse summary, which has no record of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_uuid: Option<String>,
    pub role: EntryRole,
    pub kind: EntryKind,
    /// `attachment.type` of an attachment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment_type: Option<String>,
    /// Milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp_ms: Option<i64>,
    /// Content blocks as the transcript has them (blocks the API would refuse already
    /// left out, as for requests).
    pub content: Vec<Value>,
    /// Estimated tokens of the content as written.
    pub tokens: u64,
    /// Why the model does not see this message; absent when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<Hidden>,
    /// Tool results of this message that the model sees changed, or not at all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<ResultMark>,
    /// For a collapse summary: the first and last record of the span it stands for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span: Option<Span>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum EntryRole {
    User,
    Assistant,
}

/// Where a message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum EntryKind {
    Prompt,
    ToolResults,
    Meta,
    CompactSummary,
    Attachment,
    Response,
    /// The summary the model sees in place of a collapsed span.
    CollapseSummary,
}

/// Why the model does not see a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "reason", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Hidden {
    /// Before a compact boundary: the model sees the compaction summary instead.
    Compacted { boundary_uuid: Option<String> },
    /// Removed by a snip.
    Snipped,
    /// Replaced by the collapse summary in entry `summaryEntry` (its index).
    Collapsed { summary_entry: usize },
}

/// A tool result whose content the model sees changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ResultMark {
    pub tool_use_id: String,
    /// Index of the `tool_result` block in `content`.
    pub block: usize,
    pub change: ResultChange,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum ResultChange {
    /// Time-based microcompact replaced the content by a placeholder.
    Cleared,
    /// Cache edits deleted it from the cached prompt.
    DeletedFromCache,
    /// Too large: stored at `path`, the model sees a preview.
    Replaced { path: String, original_bytes: u64 },
}

/// The records a collapse summary stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Span {
    pub from: String,
    pub to: String,
}

/// The scrollback of `records` (see the module docs). `state` and `config` are the ones
/// requests are assembled with.
pub fn scrollback(records: &[Record], state: &PipelineState, config: &PipelineConfig) -> Scrollback {
    let (slice, _) = slice_after_boundary(records);
    let mut out = Scrollback {
        boundary_uuid: slice.boundary.and_then(|b| records[b].uuid()).map(String::from),
        off_chain: slice.chain.left_out(),
        ..Scrollback::default()
    };

    // Compacted conversations, each up to the boundary that ended it.
    if let Some(latest) = slice.boundary {
        let put_back: HashSet<usize> = slice.order.iter().copied().filter(|&i| i < latest).collect();
        let mut start = 0;
        let mut root = None;
        for end in (0..=latest).filter(|&i| records[i].is_compact_boundary()) {
            let order: Vec<usize> = (start..end).filter(|i| !put_back.contains(i)).collect();
            let mut chain = Chain::build(records, root, &order);
            if let Some(leaf) = records[end].head().logical_parent_uuid.as_deref() {
                chain.end_at(records, leaf);
            }
            out.off_chain += chain.left_out();
            let boundary_uuid = records[end].uuid().map(String::from);
            let mut ingest = Ingest::default();
            for (p, &i) in order.iter().enumerate() {
                if chain.keeps(p) {
                    ingest.push(&records[i]);
                }
            }
            out.entries.extend(ingest.items.iter().map(|item| {
                let mut entry = entry(item);
                entry.hidden = Some(Hidden::Compacted { boundary_uuid: boundary_uuid.clone() });
                entry
            }));
            start = end + 1;
            root = Some(end);
        }
    }

    // The current view, through the stages' own plans.
    let ingest = Ingest::from_records(records, &slice);
    let mut all = ingest.state.clone();
    all.merge(state);
    let rules = ContentRules { replacements: &all.replacements, cleared: &all.cleared, ..ContentRules::NONE };
    let items = &ingest.items;
    let snips = plan_snips(items, &all.snips, &config.snip, &rules);
    let removed = |item: &Item| item.uuid.as_deref().is_some_and(|u| snips.removes(u));
    let after_snip: Vec<Item> =
        items.iter().filter(|i| !removed(i)).filter_map(|i| snips.project(i.clone(), false)).collect();
    let collapses = plan_collapses(&after_snip, &all.collapses, &config.collapse, &rules);
    let covering = collapses.covering();
    let deleted = if config.microcompact.cache_editing { all.deleted_by_cache_edits() } else { Default::default() };

    let first = out.entries.len();
    // Where each collapse's summary goes: after the last item it stands for.
    let mut last_covered: Vec<Option<usize>> = vec![None; all.collapses.len()];
    let mut position = 0;
    let mut collapsed_by: Vec<Option<usize>> = Vec::with_capacity(items.len());
    for item in items {
        let k = if removed(item) {
            None
        } else {
            position += 1;
            covering.get(position - 1).copied().flatten()
        };
        if let Some(k) = k {
            last_covered[k] = Some(collapsed_by.len());
        }
        collapsed_by.push(k);
    }
    let mut summary_at: Vec<usize> = vec![0; all.collapses.len()];
    for (n, item) in items.iter().enumerate() {
        let mut entry = entry(item);
        if removed(item) {
            entry.hidden = Some(Hidden::Snipped);
        } else if let Some(k) = collapsed_by[n] {
            // Filled in once the summary's place is known.
            entry.hidden = Some(Hidden::Collapsed { summary_entry: k });
        }
        for (b, block) in item.blocks.iter().enumerate() {
            let Some(r) = block.result() else { continue };
            let id = r.tool_use_id.to_string();
            let mut mark = |change| entry.results.push(ResultMark { tool_use_id: id.clone(), block: b, change });
            if all.cleared.contains(&id) {
                mark(ResultChange::Cleared);
            } else if let Some(rep) = all.replacements.get(&id) {
                mark(ResultChange::Replaced { path: rep.path.clone(), original_bytes: rep.original_bytes });
            }
            if deleted.contains(id.as_str()) {
                mark(ResultChange::DeletedFromCache);
            }
        }
        out.entries.push(entry);
        for (k, last) in last_covered.iter().enumerate() {
            if *last == Some(n) {
                summary_at[k] = out.entries.len();
                let collapse = &all.collapses[k];
                let mut summary = entry_of(&summary_item(collapse), EntryKind::CollapseSummary);
                summary.span = Some(Span { from: collapse.from.clone(), to: collapse.to.clone() });
                out.entries.push(summary);
            }
        }
    }
    for entry in &mut out.entries[first..] {
        if let Some(Hidden::Collapsed { summary_entry }) = &mut entry.hidden {
            *summary_entry = summary_at[*summary_entry];
        }
    }
    out
}

fn entry(item: &Item) -> ScrollbackEntry {
    let kind = match &item.origin {
        Origin::Prompt => EntryKind::Prompt,
        Origin::ToolResults => EntryKind::ToolResults,
        Origin::Meta => EntryKind::Meta,
        Origin::CompactSummary => EntryKind::CompactSummary,
        Origin::Attachment(_) => EntryKind::Attachment,
        Origin::Response => EntryKind::Response,
        Origin::Collapse => EntryKind::CollapseSummary,
        // Not made from records: never in a view's items.
        Origin::Context | Origin::Extra | Origin::ForkInstruction => EntryKind::Meta,
    };
    entry_of(item, kind)
}

fn entry_of(item: &Item, kind: EntryKind) -> ScrollbackEntry {
    ScrollbackEntry {
        uuid: item.uuid.as_deref().map(String::from),
        parent_uuid: item.parent_uuid.as_deref().map(String::from),
        role: match item.role {
            Role::User => EntryRole::User,
            Role::Assistant => EntryRole::Assistant,
        },
        kind,
        attachment_type: match &item.origin {
            Origin::Attachment(t) => Some(t.to_string()),
            _ => None,
        },
        timestamp_ms: item.timestamp_ms,
        content: item.blocks.iter().map(|b| serde_json::from_str(b.json()).unwrap_or(Value::Null)).collect(),
        tokens: item.tokens(),
        hidden: None,
        results: Vec::new(),
        span: None,
    }
}
