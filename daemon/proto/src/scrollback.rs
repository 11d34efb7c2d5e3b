//! `scrollback` of `ctx/assemble` (with `includeSnipped`): the whole conversation for a
//! client to draw, each message marked with why the model no longer sees it. The wire
//! form of `ctxd_core::view::Scrollback`; the daemon converts one into the other.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Every message of the active chain since the latest compact boundary, in view order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Scrollback {
    pub entries: Vec<ScrollbackEntry>,
    /// The latest compact boundary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundary_uuid: Option<String>,
    /// Message records on branches the host rewound away from: counted, not listed.
    pub off_chain: u64,
}

/// One message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    /// Content blocks as the transcript has them (Messages API blocks; those the API
    /// would refuse left out).
    pub content: Vec<serde_json::Value>,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum EntryRole {
    User,
    Assistant,
}

/// Where a message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "reason", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Hidden {
    /// Before a compact boundary: the model sees the compaction summary instead.
    Compacted { boundary_uuid: Option<String> },
    /// Removed by a snip.
    Snipped,
    /// Replaced by the collapse summary in entry `summaryEntry`.
    Collapsed { summary_entry: u64 },
}

/// A tool result whose content the model sees changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResultMark {
    pub tool_use_id: String,
    /// Index of the `tool_result` block in `content`.
    pub block: u64,
    pub change: ResultChange,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Span {
    pub from: String,
    pub to: String,
}
