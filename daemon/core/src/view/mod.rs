//! The request pipeline: from a session's records to a Messages API request body.
//!
//! The transcript keeps every record ever appended; the model sees a selection of it,
//! reshaped to be valid and cheap. This module makes that selection, as pure functions
//! over plain data. The stages, in order, each with its own module and report:
//!
//! 1. [`slice`](mod@slice): start after the latest compact boundary (and put back the
//!    segment the boundary preserved); keep the active [`chain`], so a branch the host
//!    rewound away from is left out.
//! 2. [`budget`]: store oversized new tool results on disk, show a preview.
//! 3. [`snip`]: drop the records the model chose to remove; tag user messages.
//! 4. [`microcompact`]: clear old tool results after a cache-cold gap, or delete them
//!    from the cache with cache edits.
//! 5. [`collapse`]: replace committed spans by their summaries.
//! 6. [`check`]: decide whether to compact first (a decision only).
//! 7. [`place`]: system context, user context first, per-request extras last.
//! 8. [`normalize`]: one message per turn, tool calls paired with their results, nothing
//!    the API refuses.
//! 9. [`cache`]: prompt-cache breakpoints.
//!
//! Decisions that later requests must repeat (a stored output, a cleared set, pinned
//! cache edits, a reminder) come back in [`Assembled::new_state`]; the daemon appends
//! them as records ([`state`] defines the shapes) and every later request, and a resumed
//! session, applies them the same way: the prompt prefix stays stable.
//!
//! Per-turn cost follows the change: [`ViewCache`] keeps the parsed records and the
//! normalized messages between requests and extends them with appended records
//! ([`incremental`] says when it rebuilds instead). [`assemble`] is the same code on an
//! empty cache. The core cannot fail: odd input is repaired or skipped and reported in
//! [`Assembled::applied`], never an error.
//!
//! ```
//! # use ctxd_core::view::*;
//! # fn demo(records: &[ctxd_core::record::Record]) {
//! let config = PipelineConfig::default();
//! let state = PipelineState::default();
//! let base = BaseContext { user_context: Some("# CLAUDE.md\nUse tabs.".into()), ..BaseContext::default() };
//! let tools = [serde_json::json!({"name": "Read", "input_schema": {"type": "object"}})];
//! let mut cache = ViewCache::new();
//! let out = cache.assemble(&AssembleInput {
//!     records,
//!     system: &[serde_json::json!({"type": "text", "text": "You are a coding agent."})],
//!     tools: &tools,
//!     model: "claude-sonnet-4-5",
//!     max_tokens: 32_000,
//!     thinking: None,
//!     fork: None,
//!     base: &base,
//!     now_ms: 1_795_987_191_104,
//!     state: &state,
//!     config: &config,
//!     tool_results_dir: "/state/tool-results/session-1",
//!     compact: CompactCheck::default(),
//! });
//! assert!(validate_request(&out.request.to_value()).is_ok());
//! # }
//! ```

pub mod budget;
pub mod cache;
pub mod chain;
pub mod check;
pub mod collapse;
pub mod config;
pub mod content;
pub mod incremental;
pub mod ingest;
pub mod item;
pub mod microcompact;
pub mod normalize;
pub mod place;
mod raw;
pub mod render;
pub mod request;
pub mod scrollback;
pub mod slice;
pub mod snip;
pub mod state;
pub mod time;
pub mod validate;

#[cfg(test)]
mod tests;

use serde::Serialize;
use serde_json::Value;

pub use check::{CompactCheck, CompactDecision};
pub use config::{BudgetConfig, CollapseConfig, MicrocompactConfig, PipelineConfig, SnipConfig};
pub use incremental::{CacheCounters, ViewCache};
pub use item::{Block, BlockKind, Item, Origin, Role};
pub use normalize::NormalizeStats;
pub use place::{BaseContext, Fork};
pub use render::{render_request, render_view};
pub use request::{ApiMessage, Request, shared_messages};
pub use scrollback::{Scrollback, ScrollbackEntry, scrollback};
pub use state::{
    COLLAPSE_RECORD, Collapse, MicrocompactRecord, Offload, PinnedEdits, PipelineState, Reminder, Replacement,
    SNIP_RECORD, Snip, StateChanges, StateRecord, Trigger,
};
pub use time::{format_rfc3339_ms, parse_rfc3339_ms};
pub use validate::validate_request;

use crate::record::Record;

/// A stage of the request pipeline, in `ctx/assemble`'s `applied`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Normalize,
    Slice,
    Place,
    Snip,
    Collapse,
    ToolResultBudget,
    Microcompact,
    CacheBreakpoints,
    CompactCheck,
}

impl Stage {
    /// The stage's name in logs and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Normalize => "normalize",
            Stage::Slice => "slice",
            Stage::Place => "place",
            Stage::Snip => "snip",
            Stage::Collapse => "collapse",
            Stage::ToolResultBudget => "tool_result_budget",
            Stage::Microcompact => "microcompact",
            Stage::CacheBreakpoints => "cache_breakpoints",
            Stage::CompactCheck => "compact_check",
        }
    }
}

/// What one stage did, for logs, `/context`-style reports and tests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Applied {
    pub stage: Stage,
    pub acted: bool,
    /// Estimated tokens the stage removed from the request.
    pub tokens_freed: u64,
    pub detail: String,
}

/// Everything a request is built from.
#[derive(Debug, Clone, Copy)]
pub struct AssembleInput<'a> {
    /// The session's records (all of them, or from the latest boundary; a preserved
    /// segment is put back only when its records are included).
    pub records: &'a [Record],
    /// The host's system blocks.
    pub system: &'a [Value],
    /// The tools offered (Messages API tool objects); calls to tools not here are sent
    /// as text.
    pub tools: &'a [Value],
    pub model: &'a str,
    pub max_tokens: u64,
    /// The host's `thinking` object, put in the request as it is.
    pub thinking: Option<&'a Value>,
    pub fork: Option<&'a Fork>,
    pub base: &'a BaseContext,
    /// Milliseconds since the Unix epoch (see [`parse_rfc3339_ms`]).
    pub now_ms: i64,
    /// State kept outside the transcript (a collapse store, say); merged with the state
    /// records found in `records`.
    pub state: &'a PipelineState,
    pub config: &'a PipelineConfig,
    /// Where offloaded tool results go: `<dir>/<tool_use_id>.txt`.
    pub tool_results_dir: &'a str,
    pub compact: CompactCheck,
}

/// The request and what was done to build it.
#[derive(Debug, Clone)]
pub struct Assembled {
    pub request: Request,
    /// One entry per stage, in pipeline order.
    pub applied: Vec<Applied>,
    /// Estimated input tokens of the request (system, tools, messages).
    pub estimate_tokens: u64,
    pub decision: CompactDecision,
    /// What the daemon must persist before sending (see [`StateChanges::records`]).
    pub new_state: StateChanges,
}

/// Builds the request from scratch (an empty [`ViewCache`]).
pub fn assemble(input: &AssembleInput<'_>) -> Assembled {
    incremental::assemble_fresh(input)
}

/// The conversation of `records` as a plain request body: no system, tools, base
/// context or pipeline state, `max_tokens` 20,000. What a provider summary is asked
/// over when the host's own request is not at hand.
pub fn plain_request(records: &[Record], model: &str) -> serde_json::Value {
    let base = BaseContext::default();
    let input = AssembleInput {
        records,
        system: &[],
        tools: &[],
        model,
        max_tokens: 20_000,
        thinking: None,
        fork: None,
        base: &base,
        now_ms: 0,
        state: &PipelineState::default(),
        config: &PipelineConfig::default(),
        tool_results_dir: "",
        compact: CompactCheck::default(),
    };
    assemble(&input).request.to_value()
}

/// The runtime view: stages 1–5 applied to items, stored previews and cleared
/// placeholders shown, snipped records kept and marked when `config.include_snipped`.
/// For a UI, [`scrollback()`] lists every message with why the model does not see it.
pub fn runtime_view(records: &[Record], state: &PipelineState, config: &PipelineConfig) -> Vec<Item> {
    let (slice, _) = slice::slice_after_boundary(records);
    let ingest = ingest::Ingest::from_records(records, &slice);
    let mut all = ingest.state.clone();
    all.merge(state);
    let items = budget::apply_tool_result_budget(ingest.items, &all.replacements);
    let rules =
        content::ContentRules { replacements: &all.replacements, cleared: &all.cleared, ..content::ContentRules::NONE };
    let (items, _) = snip::apply_snips(items, &all.snips, &config.snip, &rules, config.include_snipped);
    let plan = collapse::plan_collapses(&items, &all.collapses, &config.collapse, &rules);
    let survivors = plan.survivors(items.len());
    let present =
        microcompact::result_ids(items.iter().zip(&survivors).filter(|(i, s)| **s && !i.snipped).map(|(i, _)| i));
    let items = microcompact::microcompact(items, &all, &present, &config.microcompact);
    plan.apply(items, &all.collapses)
}

/// The normalization stage's report.
pub(crate) fn normalize_applied(stats: &NormalizeStats) -> Applied {
    Applied {
        stage: Stage::Normalize,
        acted: stats.total() > 0,
        tokens_freed: 0,
        detail: format!(
            "{} lines merged, {} responses merged, {} synthetic results, {} orphan results as text, {} calls to missing tools as text, {} duplicates dropped",
            stats.merged_lines,
            stats.merged_responses,
            stats.synthetic_results,
            stats.orphan_results,
            stats.converted_calls,
            stats.duplicates
        ),
    }
}
