//! `ctx/searchHistory` and `ctx/readHistory`: the history of sessions, before and after
//! their compactions, for hosts and editors (the same search `ctxd mcp` gives agents).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What kind of record a hit is: the core's closed set, carried as it is.
pub use ctxd_core::recall::Role as HistoryRole;

/// `ctx/searchHistory` params: a full-text search over session transcripts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchHistoryParams {
    /// Words to find (a phrase in double quotes; `role:user` narrows to a role). Text
    /// the query syntax cannot read is searched as plain words.
    pub query: String,
    /// The session to search: a session of the store, an `observe-…` id from
    /// `ctx/usageChanged`, or a Claude Code session id. With `projectDir` and no
    /// `sessionId` (or `"all"`), every session of that project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The project's directory (a working directory, as the host runs in it), for
    /// `sessionId: "all"` or none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_dir: Option<String>,
    /// Most hits returned (default 10, at most 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Only records that stand before their session's latest compaction (what the
    /// model no longer sees).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_compaction_only: Option<bool>,
}

/// `ctx/searchHistory` result: hits, best first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchHistoryResult {
    pub hits: Vec<HistoryHit>,
    /// Sessions searched.
    pub sessions: u32,
    /// What the search could not do as asked (a query read as plain words, a
    /// transcript left out), one sentence each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One record that matched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryHit {
    /// The session (as `ctx/readHistory` takes it).
    pub session_id: String,
    /// The record's uuid.
    pub uuid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    pub role: HistoryRole,
    /// Up to about 300 characters of the record's text around the match.
    pub snippet: String,
    /// The record stands before the session's latest compaction.
    pub before_compaction: bool,
    /// The transcript file the record is in.
    pub transcript: String,
}

/// `ctx/readHistory` params: one record in full, with its neighbours on the chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadHistoryParams {
    /// As a hit names it.
    pub session_id: String,
    pub uuid: String,
    /// Records with text before it on its chain (default 2, at most 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<u32>,
    /// Records with text after it on its chain (default 2, at most 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u32>,
    /// Most characters of text returned in all (default 20,000, at most 200,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_chars: Option<u32>,
}

/// `ctx/readHistory` result: the records in chain order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadHistoryResult {
    pub session_id: String,
    pub transcript: String,
    pub records: Vec<HistoryRecord>,
    /// Set when text was cut to stay within `maxChars`: says what was left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<String>,
}

/// A record's text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryRecord {
    pub uuid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    pub role: HistoryRole,
    pub text: String,
    /// The record asked for (the others are its neighbours).
    pub target: bool,
    pub before_compaction: bool,
}
