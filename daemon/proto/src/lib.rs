//! Wire types of the ctxd protocol.
//!
//! ctxd speaks the LSP base protocol (Content-Length framing, JSON-RPC 2.0) on stdio.
//! Everything ctxd-specific lives under the `ctx/` prefix. This crate holds only the
//! serde shapes of those messages: `*Params` for requests and notifications from the
//! client, `*Result` for replies, `*Notification` params for what ctxd pushes. Field
//! names are camelCase on the wire. JSON Schemas in `schemas/` are generated from these
//! types (see `schema.rs`) and a test fails when the committed files drift.
//!
//! The core (`ctxd-core`) does not depend on this crate: the daemon converts between
//! domain and wire types in one place, so the wire can stay stable while the core moves.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod gateway;
pub mod history;
pub mod methods;
pub mod schema;
pub mod scrollback;
pub mod settings;

pub use gateway::{GatewaySession, GatewaySessions, GatewaySettings};
pub use history::*;
pub use methods::{Methods, Notification, Request, each_method, notification, request};
pub use settings::Settings;

/// A transcript record: one line of a Claude Code style JSONL transcript, as a JSON
/// object. ctxd reads the fields it knows (`uuid`, `parentUuid`, `type`, `message`, …)
/// and keeps every other field verbatim.
pub type Record = serde_json::Map<String, serde_json::Value>;

/// Error codes ctxd uses beyond the JSON-RPC standard ones. They sit in the range the
/// JSON-RPC spec leaves to applications (-32000 to -32099 is reserved for servers; LSP
/// uses -32800 and up), so ctxd takes -33000 and below.
pub mod error_codes {
    /// The session id names no session in the store.
    pub const UNKNOWN_SESSION: i64 = -33001;
    /// The store could not be opened, read or written; the message names the path.
    pub const STORE: i64 = -33002;
    /// Another ctxd process holds the store.
    pub const STORE_LOCKED: i64 = -33003;
    /// A record in `ctx/append` is not a valid transcript record.
    pub const INVALID_RECORD: i64 = -33004;
    /// A handler panicked; the daemon is still serving.
    pub const INTERNAL: i64 = -33005;
    /// The message exceeded the size ctxd accepts.
    pub const MESSAGE_TOO_LARGE: i64 = -33006;
    /// The session's actor stopped (for instance it was closed while the request waited).
    pub const SESSION_CLOSED: i64 = -33007;
    /// The session is busy with something that excludes this request (a compaction).
    pub const BUSY: i64 = -33008;
    /// A compaction failed; the message says why. Nothing was installed.
    pub const COMPACT_FAILED: i64 = -33009;
    /// `ctx/undoCompact` has nothing to undo, or a new turn followed the compaction (the
    /// error's `data` is a [`CannotUndoData`](crate::CannotUndoData)); or `ctx/claudeUndo`
    /// found nothing of ctxd's to take back. Nothing was appended.
    pub const CANNOT_UNDO: i64 = -33010;
}

/// The `data` of a `ctx/undoCompact` refusal (error -33010).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CannotUndoData {
    pub reason: CannotUndoReason,
}

/// Why `ctx/undoCompact` was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum CannotUndoReason {
    /// The session has no compaction left to undo.
    NothingToUndo,
    /// A new turn followed the compaction: undoing it would lose that turn.
    NewTurnSince,
}

/// `initializationOptions` of the `initialize` request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InitializationOptions {
    /// Where ctxd keeps its store; overrides the flag, `CTXD_STATE_DIR` and the XDG default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<String>,
    /// Client data: the context window the client wants (below the environment and the
    /// settings files in the resolution order, above the model default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_compact_window: Option<u64>,
    /// Settings with the same keys as a settings file (`schemas/settings.json`). An empty
    /// array is accepted as an empty map (Lua encodes an empty table as `[]`).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "map_or_empty_list")]
    #[schemars(with = "Option<Settings>")]
    pub settings: Option<serde_json::Map<String, serde_json::Value>>,
}

fn map_or_empty_list<'de, D>(deserializer: D) -> Result<Option<serde_json::Map<String, serde_json::Value>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::Error;
    match serde_json::Value::deserialize(deserializer)? {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::Object(map) => Ok(Some(map)),
        serde_json::Value::Array(items) if items.is_empty() => Ok(Some(serde_json::Map::new())),
        other => Err(D::Error::custom(format!("settings must be an object, not {other}"))),
    }
}

/// What ctxd announces under `capabilities.experimental.ctxd` in `initialize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CtxdCapabilities {
    /// ctxd's version (the crate version).
    pub version: String,
    /// Protocol revision; bumped only when a method or field is renamed or removed.
    pub protocol: u32,
    /// `ctx/` request methods this build answers.
    pub methods: Vec<String>,
    /// `ctx/` notifications this build sends.
    pub notifications: Vec<String>,
    /// The store directory in use.
    pub state_dir: String,
    /// The daemon's process id (for health checks and logs).
    pub process_id: u32,
    /// Set when the daemon runs with less than it should, and why (the store's index
    /// could not be written at start: a full disk or a read-only mount).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
}

/// `ctx/openSession` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpenSessionParams {
    /// Working directory of the agent; memory files and git facts come from here.
    pub cwd: String,
    /// Model id the session talks to (e.g. `claude-sonnet-4-5-20250929`).
    pub model: String,
    /// Resume this session when it exists in the store; create it with this id otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Path of a Claude Code transcript to import as this new session (its lines are
    /// copied verbatim; malformed lines are reported in `diagnostics` and skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<String>,
    /// Set when the session is a subagent's: its own settings, which may only tighten
    /// the parent's limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSettings>,
}

/// A subagent's own settings (`ctx/openSession` `agent`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSettings {
    /// The subagent's name, for logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A ceiling on the window: lowers the one resolved for the model, never raises it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_compact_window: Option<u64>,
}

/// `ctx/openSession` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpenSessionResult {
    pub session_id: String,
    /// True when the session existed in the store and was loaded from it.
    pub resumed: bool,
    /// Records in the session's transcript (all of them, including before the latest
    /// compact boundary).
    pub records: u64,
    /// Lines of the transcript that could not be read (reported, skipped, never deleted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diagnostics: Vec<String>,
    pub usage: Usage,
}

/// `ctx/append` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppendParams {
    pub session_id: String,
    /// Records in order; stored in this order after every record already acknowledged.
    pub records: Vec<Record>,
}

/// `ctx/append` result, sent only once the records are synced to disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppendResult {
    /// Records written by this call.
    pub appended: u64,
    /// Records skipped because a record with the same `uuid` is already in the session
    /// (a host retrying an append it did not see acknowledged).
    pub duplicates: u64,
    /// Records in the transcript after this call.
    pub records: u64,
    pub usage: Usage,
}

/// Params naming one session (`ctx/usage`, `ctx/closeSession`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionParams {
    pub session_id: String,
}

/// `ctx/usage` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageResult {
    pub session_id: String,
    pub usage: Usage,
}

/// `ctx/usageChanged` notification params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageChangedNotification {
    pub session_id: String,
    pub usage: Usage,
}

/// How full a session's context is, with every level a status bar needs, so clients
/// draw without arithmetic of their own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Tokens the next request is expected to carry.
    pub tokens: u64,
    /// Of `tokens`, the part the provider reported (the last assistant usage).
    pub reported_tokens: u64,
    /// Of `tokens`, the part ctxd estimated (records after the last assistant usage).
    pub estimated_tokens: u64,
    /// The context window in force.
    pub window: u64,
    /// `window` minus the room kept for the model's output.
    pub effective_window: u64,
    /// Auto compaction starts at this many tokens.
    pub threshold: u64,
    /// The warning level starts here.
    pub warning: u64,
    /// Requests are refused from here unless compaction recovers.
    pub blocked: u64,
    /// `tokens` as a percentage of `window`, one decimal (Claude Code's rule: 700,000 of
    /// 1,000,000 is 70.0).
    pub percent_used: f64,
    /// Percentage of the threshold still free before auto compaction, one decimal.
    pub percent_until_compact: f64,
    /// Tokens left before auto compaction starts.
    pub tokens_until_compact: u64,
    pub level: Level,
    /// Whether automatic compaction will run at the threshold.
    pub auto_compact_enabled: bool,
    pub breakdown: Breakdown,
    /// The session's prompt cache, when ctxd knows it (a live Claude Code session: the
    /// program's own figures or the gateway's). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<PromptCache>,
}

/// Whether a session's prompt cache is warm and for how long, and what the next turn
/// writes to it again once it is cold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PromptCache {
    /// The cached prefix is still there: the next turn reads it.
    pub warm: bool,
    /// Whole seconds until it goes cold; 0 once cold.
    pub seconds_left: u64,
    /// When it goes (or went) cold, RFC 3339.
    pub expires_at: String,
    /// Its lifetime, in seconds (300, or 3,600 when the requests ask for an hour).
    pub ttl_seconds: u64,
    /// Tokens the next turn writes to the cache again if it is cold; absent when not
    /// known (right after a compaction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recache_tokens: Option<u64>,
    /// The estimated price of that, in US dollars, at the model's cache-write price;
    /// absent for a model the price table does not list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recache_cost_usd: Option<f64>,
    /// The date of the price table (YYYY-MM-DD), beside a price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices_date: Option<String>,
    /// Whose figures these are.
    pub source: PromptCacheSource,
    /// ctxd's gateway holds a summary prepared for the session's newest request: a
    /// `/compact` now is answered at once instead of re-writing the cold cache.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub summary_ready: bool,
}

/// Who saw the traffic the cache state comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PromptCacheSource {
    /// Claude Code's own account (its status-line `prompt_cache`).
    Program,
    /// ctxd's gateway, from the requests and answers it forwarded.
    Gateway,
}

/// Usage level, for colouring a status bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Level {
    Ok,
    Warning,
    Compacting,
    Blocked,
}

/// Where the tokens go. The parts add up to `window`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Breakdown {
    pub system_prompt: u64,
    pub tools: u64,
    pub memory_files: u64,
    pub skills: u64,
    pub messages: MessageBreakdown,
    pub free_space: u64,
    pub autocompact_buffer: u64,
}

/// Message tokens by kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageBreakdown {
    pub tool_results: u64,
    pub summaries: u64,
    pub other: u64,
}

/// `ctx/setAutoCompactWindow` params: save the window for a model (like Claude Code's
/// `/autocompact`), or clear the saved one with `"auto"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetAutoCompactWindowParams {
    pub model: String,
    pub window: WindowChoice,
}

/// A window in tokens, or `"auto"` for the model's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum WindowChoice {
    Tokens(u64),
    Auto(AutoWord),
}

/// The word `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AutoWord {
    Auto,
}

/// `ctx/setAutoCompactWindow` result: the window now in force for the model (before any
/// environment variable or project setting of a particular session).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetAutoCompactWindowResult {
    pub model: String,
    pub window: u64,
    /// Where the window came from.
    pub source: WindowSource,
    /// Problems with the value (clamped into range, above the model's window, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The window asked for (absent for `"auto"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<u64>,
    /// The model's own context window: no window can be larger.
    pub model_window: u64,
    /// How the window in force differs from the one asked for; absent when it is the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adjustment: Option<WindowAdjustment>,
    /// Why, in words a client shows as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `ctx/fileRead` params: the agent read a file (or a line range of it) by some means
/// ctxd does not see in the transcript. Read tool results in appended records are
/// recorded without this call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileReadParams {
    pub session_id: String,
    /// Absolute path.
    pub path: String,
    /// First line read, 1-based (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_line: Option<u64>,
    /// Lines read (default: to the end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_lines: Option<u64>,
}

/// `ctx/fileRead` result: the ledger entry, and whether the agent already had this text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileReadResult {
    pub path: String,
    /// The path was read before in this session.
    pub already_read: bool,
    /// Read before, and the same lines had the same content then.
    pub unchanged: bool,
    /// Times the path was read in this session.
    pub reads: u32,
    pub start_line: u64,
    pub num_lines: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_lines: Option<u64>,
    /// Estimated tokens of the text read.
    pub tokens: u64,
}

/// `ctx/contextChanged` notification params: memory files or read files changed on disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextChangedNotification {
    pub session_id: String,
    pub paths: Vec<String>,
}

/// `ctx/context` result: what the model sees, by source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextResult {
    pub session_id: String,
    pub usage: Usage,
    /// Memory files in the order the model sees them, with their state.
    pub memory_files: Vec<MemoryFile>,
    /// Rules with `paths:` that wait for a matching read.
    pub pending_rules: Vec<PendingRule>,
    /// Problems with memory files (unreadable, not UTF-8, import cycles, …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub diagnostics: Vec<String>,
    /// Files the agent read in this session.
    pub files_read: u64,
    /// Read files that changed on disk since they were read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stale_files: Vec<String>,
    /// Whether a git snapshot is part of the system context.
    pub git: bool,
    /// A summary prepared ahead of the threshold is ready: the tokens the session would
    /// hold right after installing it (before what was appended since).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepared_ahead: Option<u64>,
    /// A Claude Code session on ctxd's gateway: what preparing its summaries cost and
    /// what answering its compactions at once saved (absent when there is nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instant_compaction: Option<InstantCompactionStats>,
}

/// A Claude Code session's instant compaction in dollars: the preparations ctxd's
/// gateway made (their usage and cost at the price table's rates) and the compactions
/// it answered at once (the estimated model calls avoided). `ctxd claude stats --json`
/// prints the same object per session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstantCompactionStats {
    pub session_id: String,
    /// The model of the newest preparation or answer.
    pub model: String,
    /// Preparations made (forks answered).
    pub preparations: u64,
    pub preparation_input_tokens: u64,
    pub preparation_cache_read_tokens: u64,
    pub preparation_cache_write_tokens: u64,
    pub preparation_output_tokens: u64,
    /// What the preparations cost, in US dollars.
    pub preparation_usd: f64,
    /// Compactions answered from a prepared summary.
    pub instant_compactions: u64,
    /// The compaction calls avoided, estimated at the warm cache's prices.
    pub saved_call_usd: f64,
    /// What a cold cache would have added to them (the prefix written again).
    pub saved_cold_rewrite_usd: f64,
    /// `savedCallUsd + savedColdRewriteUsd`.
    pub saved_usd: f64,
    /// `savedUsd - preparationUsd`.
    pub net_usd: f64,
}

/// One memory file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryFile {
    pub path: String,
    pub kind: MemoryKind,
    pub tokens: u64,
    pub status: MemoryStatus,
}

/// A rule waiting for a read that matches its `paths:` globs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingRule {
    pub path: String,
    pub paths: Vec<String>,
}

/// `ctx/compact` params: compact now, optionally with focus instructions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompactParams {
    pub session_id: String,
    /// What the summary must keep (like `/compact focus on the auth bug`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Partial compaction: summarize from this record (uuid) on, keeping what precedes
    /// it verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Partial compaction: summarize up to and including this record (uuid), keeping
    /// what follows it verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to: Option<String>,
    /// LSP work-done token: the compaction's phases are reported with `$/progress`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_done_token: Option<serde_json::Value>,
}

/// `ctx/compact` result, once the compaction is installed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompactResult {
    /// Uuid of the compact boundary record.
    pub boundary: String,
    pub trigger: Trigger,
    pub pre_tokens: u64,
    pub post_tokens: u64,
    /// The summary the model continues from.
    pub summary: String,
    /// Who wrote it.
    pub summarizer: Summarizer,
    /// Which request a provider wrote it for. Absent when the offline summarizer wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_path: Option<SummaryPath>,
    /// Items the summary missed (user messages, files, todos) that ctxd appended.
    pub fidelity_appended: u64,
    /// Hook failures and other problems that did not stop the compaction.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// Which compaction this answers: the one the request started, one already running
    /// that it waited for, or its own, run after the one that was running.
    #[serde(default)]
    pub origin: CompactOrigin,
    pub usage: Usage,
}

/// Which compaction a `ctx/compact` answer reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum CompactOrigin {
    /// The compaction this request started.
    #[default]
    Requested,
    /// A compaction already running (automatic, or another request's with the same focus
    /// instructions): the request waited for it and answers with its result.
    Joined,
    /// A compaction was running with other focus instructions (or the request is a
    /// partial one): the request's own ran after it.
    Queued,
}

impl From<ctxd_core::compact::lifecycle::Origin> for CompactOrigin {
    fn from(origin: ctxd_core::compact::lifecycle::Origin) -> Self {
        use ctxd_core::compact::lifecycle::Origin;
        match origin {
            Origin::Requested => CompactOrigin::Requested,
            Origin::Joined => CompactOrigin::Joined,
            Origin::Queued => CompactOrigin::Queued,
        }
    }
}

/// `ctx/undoCompact` params: take back the session's latest compaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UndoCompactParams {
    pub session_id: String,
}

/// `ctx/undoCompact` result: the view is the one the compaction replaced. The transcript
/// keeps the compaction and gains a record that undoes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UndoCompactResult {
    /// Uuid of the compact boundary that was undone.
    pub boundary: String,
    /// Uuid of the undo record appended to the transcript.
    pub undo_record: String,
    /// Tokens the next request carried before the undo (the compacted view).
    pub pre_tokens: u64,
    /// Tokens it carries now (the restored view).
    pub post_tokens: u64,
    pub usage: Usage,
}

/// `ctx/claudeCompact` and `ctx/claudeUndo` params: a Claude Code session, by its
/// transcript's path or by its id (looked up under `~/.claude/projects`, or
/// `$CLAUDE_CONFIG_DIR/projects`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaudeSessionParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcript: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Focus of the summary (`/compact <instructions>`); compaction only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

/// `ctx/claudeCompact` result: records appended to the Claude Code transcript, in the
/// program's own shapes, so `claude --resume` starts from the summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaudeCompactResult {
    pub transcript: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Uuid of the compact boundary appended.
    pub boundary: String,
    /// Byte length of the transcript before the compaction: `ctx/claudeUndo` cuts it
    /// back to this.
    pub offset: u64,
    /// Lines appended.
    pub lines: u64,
    pub pre_tokens: u64,
    pub post_tokens: u64,
    /// Messages kept in view by reference (`preservedSegment`).
    pub kept: u64,
    /// Who wrote the summary: the provider the settings choose, or `offline` (none
    /// chosen, or it failed: `problems` says why).
    pub summarizer: Summarizer,
    /// Why the configured provider did not write the summary, when it did not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// `ctx/claudeUndo` result: the transcript is byte for byte what it was before ctxd's
/// compaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaudeUndoResult {
    pub transcript: String,
    /// The length the transcript has again.
    pub offset: u64,
    /// Bytes of ctxd's install taken away.
    pub removed_bytes: u64,
}

/// `ctx/compacted` notification params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompactedNotification {
    pub session_id: String,
    pub trigger: Trigger,
    pub pre_tokens: u64,
    pub post_tokens: u64,
}

/// `ctx/compactFailed` notification params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompactFailedNotification {
    pub session_id: String,
    /// Why; begins `Autocompact is thrashing` when automatic compaction stopped for that.
    pub reason: String,
}

/// `ctx/reportProviderError` params: the host's model request failed; ctxd compacts when
/// the refusal is one compaction answers (prompt too long, long-context credits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReportProviderErrorParams {
    pub session_id: String,
    pub error: ProviderErrorReport,
}

/// The provider's error as the host received it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderErrorReport {
    /// HTTP status, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The provider's error type (e.g. `invalid_request_error`), when known.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub message: String,
}

/// `ctx/reportProviderError` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReportProviderErrorResult {
    pub action: ProviderErrorAction,
    /// Why, in a sentence.
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact: Option<CompactResult>,
}

/// `ctx/skillInvoked` params: the agent ran a skill and the model was given `content`.
/// Skills are restored after a compaction (5,000 tokens each, 25,000 in all, the oldest
/// dropped first). `Skill` tool calls in appended records are recorded without this call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkillInvokedParams {
    pub session_id: String,
    pub name: String,
    pub content: String,
}

/// `ctx/setPlan` params: the session's plan file (read again from disk after a
/// compaction), or `null` to forget it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetPlanParams {
    pub session_id: String,
    /// Absolute path, or null.
    pub path: Option<String>,
}

/// `ctx/clear` result: a new, empty session with the same working directory and model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClearResult {
    pub session_id: String,
    pub usage: Usage,
}

/// `ctx/assemble` params: build the next model request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AssembleParams {
    pub session_id: String,
    /// The host's own system blocks (Messages API text blocks).
    #[serde(default)]
    pub system: Vec<serde_json::Value>,
    /// The tools offered (Messages API tool objects).
    #[serde(default)]
    pub tools: Vec<serde_json::Value>,
    pub max_tokens: u64,
    /// The host's extended-thinking settings (the Messages API `thinking` object), put
    /// in `request` as sent. Compaction's cache-sharing fork keeps them: the provider
    /// reads a cached prefix only under the same thinking settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<serde_json::Map<String, serde_json::Value>>,
    /// A side request that shares the session's prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkParams>,
    /// Also return `scrollback`: the whole conversation since the latest boundary, with
    /// a marker on every message or tool result the model no longer sees as it was.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_snipped: bool,
    /// The `revision` of an earlier answer for this session whose request the host kept.
    /// When it is the session's latest answer, `request.messages` holds only the
    /// messages from `messagesFrom` on (the host keeps the first `messagesFrom` of its
    /// copy); otherwise the answer is whole, as without `since`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

/// A fork of the session's request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForkParams {
    pub instruction: String,
    /// Mark the end of the shared prefix instead of the final message.
    #[serde(default)]
    pub skip_cache_write: bool,
}

/// `ctx/assemble` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AssembleResult {
    /// A body for the Anthropic Messages API: model, system, messages, tools, max_tokens.
    /// With `messagesFrom` above 0, `messages` holds only the messages from that index
    /// on; the ones before are those of the request answered with `since`.
    #[schemars(with = "serde_json::Map<String, serde_json::Value>")]
    pub request: serde_json::Value,
    /// Names this answer's request: pass it as `since` on the next `ctx/assemble` to be
    /// sent only what changed. Unique across daemon restarts.
    pub revision: String,
    /// How many leading messages of the `since` request this one shares (0: the answer
    /// is whole).
    pub messages_from: u64,
    /// Estimated input tokens of exactly this request.
    pub request_tokens: u64,
    /// The session's usage.
    pub usage: Usage,
    /// One entry per pipeline stage, in order.
    pub applied: Vec<AppliedStage>,
    pub decision: Decision,
    /// With `includeSnipped`: the whole conversation since the latest boundary, each
    /// message marked with why the model does not see it (if it does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrollback: Option<scrollback::Scrollback>,
}

/// What one stage of the request pipeline did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedStage {
    pub stage: Stage,
    pub acted: bool,
    pub tokens_freed: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// `ctx/snip` params: remove these records from what the model sees (the transcript keeps
/// them). Tool pairs and records carrying tool references are protected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnipParams {
    pub session_id: String,
    pub uuids: Vec<String>,
}

/// `ctx/snip` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnipResult {
    /// Estimated tokens the next request no longer carries.
    pub tokens_freed: u64,
    /// Uuids that name no record in the current view (ignored).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown: Vec<String>,
    pub usage: Usage,
}

/// `ctx/collapse` params: replace the span `from`..=`to` with a summary at read time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CollapseParams {
    pub session_id: String,
    pub from: String,
    pub to: String,
    /// The span's summary; written by the offline summarizer when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// `ctx/collapse` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CollapseResult {
    /// Uuid of the collapse record.
    pub collapse_id: String,
    pub tokens_freed: u64,
    pub usage: Usage,
}

/// `ctx/observe` params: follow a transcript another program (Claude Code) writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObserveParams {
    /// Absolute path of the transcript (JSONL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcript: Option<String>,
    /// Or a Claude Code project directory (`~/.claude/projects/<project>`): its newest
    /// transcript is observed, and every transcript that appears in it later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_dir: Option<String>,
}

/// `ctx/observe` result: the id its `ctx/usageChanged` notifications carry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObserveResult {
    pub session_id: String,
    pub usage: Usage,
}

// Closed sets of values. Each travels as the string its serde name gives, so a client
// compares strings as before; the schemas list the values. Those the core decides on
// are the core's own types, carried as they are (one definition: a renamed value
// changes the committed schemas, which a test catches); the others are defined here.
pub use ctxd_core::budget::WindowSource;
pub use ctxd_core::compact::Trigger;
pub use ctxd_core::memory::MemoryKind;
pub use ctxd_core::view::Stage;

/// How the window in force differs from the one a client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum WindowAdjustment {
    /// Lowered to the model's own window.
    CappedToModel,
    /// Raised to the smallest window ctxd plans with.
    RaisedToFloor,
    /// Lowered to the largest window ctxd plans with.
    LoweredToCeiling,
    /// Another source of the window takes precedence.
    Overridden,
}

/// Whether a memory file is in the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum MemoryStatus {
    /// In the context.
    Loaded,
    /// A rule or nested file not activated yet.
    Waiting,
    /// Already in the context through another entry.
    Duplicate,
}

/// The core's states of a memory entry under the names clients show.
impl From<ctxd_core::memory::Status> for MemoryStatus {
    fn from(status: ctxd_core::memory::Status) -> Self {
        use ctxd_core::memory::Status;
        match status {
            Status::Active => MemoryStatus::Loaded,
            Status::Pending => MemoryStatus::Waiting,
            Status::Duplicate => MemoryStatus::Duplicate,
        }
    }
}

/// Who wrote a compaction summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Summarizer {
    /// ctxd's own summarizer (no model, no network).
    Offline,
    Anthropic,
    Openai,
}

/// Which request a provider wrote a summary for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SummaryPath {
    /// The cache-sharing fork of the session's request.
    Fork,
    /// The summary-specific request.
    Fallback,
}

/// What ctxd did about a provider error (`ctx/reportProviderError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ProviderErrorAction {
    /// Compacted: retry the request now.
    Compacted,
    /// Nothing: the error is not one compaction answers, or compaction is off.
    None,
}

/// What the host does after `ctx/assemble`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Decision {
    /// Send the request.
    Continue,
    /// The threshold is reached: an automatic compaction was started in the background.
    Compact,
}
