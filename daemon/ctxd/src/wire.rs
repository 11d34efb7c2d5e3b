//! Conversion of domain values to the protocol's types (`ctxd_proto`): the one place
//! where the core's and the daemon's types become what travels on the wire, so the wire
//! can stay stable while they move. Every match here is exhaustive: a new domain value
//! fails to compile until it has a wire name.

use ctxd_core::budget::{Level as CoreLevel, WindowSource};
use ctxd_core::compact::Trigger;
use ctxd_core::ledger::ReadOutcome;
use ctxd_core::memory::{MemoryKind, Status};
use ctxd_core::view::Stage;
use ctxd_proto as proto;

use crate::session::actor::{
    Appended, AssembleAnswer, CompactAnswer, ContextView, FileReadAnswer, Opened, Reduced, UndoAnswer,
};
use crate::session::compaction::{Summarizer, SummaryPath};
use crate::session::usage::UsageSnapshot;

/// A session's usage, with every level a status bar needs.
pub fn usage(snapshot: &UsageSnapshot) -> proto::Usage {
    let t = &snapshot.thresholds;
    let tokens = snapshot.tokens;
    let buffer = (t.window.saturating_sub(t.threshold)).min(t.window.saturating_sub(tokens));
    let free = t.window.saturating_sub(tokens).saturating_sub(buffer);
    let p = &snapshot.parts;
    proto::Usage {
        tokens,
        reported_tokens: snapshot.reported,
        estimated_tokens: tokens - snapshot.reported,
        window: t.window,
        effective_window: t.effective_window,
        threshold: t.threshold,
        warning: t.warning,
        blocked: t.blocked,
        percent_used: t.percent_used(tokens),
        percent_until_compact: t.percent_until_compact(tokens),
        tokens_until_compact: t.tokens_until_compact(tokens),
        level: level(snapshot),
        auto_compact_enabled: t.auto_compact_enabled,
        breakdown: proto::Breakdown {
            system_prompt: p.system_prompt,
            tools: p.tools,
            memory_files: p.memory_files,
            skills: p.skills,
            messages: proto::MessageBreakdown {
                tool_results: p.tool_results,
                summaries: p.summaries,
                other: p.other_messages,
            },
            free_space: free,
            autocompact_buffer: buffer,
        },
        cache: None,
    }
}

/// A session's prompt cache (`core::cache_state`) on the wire; `source` says whose
/// figures they were.
pub fn prompt_cache(
    state: &ctxd_core::cache_state::CacheState,
    source: proto::PromptCacheSource,
) -> proto::PromptCache {
    proto::PromptCache {
        warm: state.warm,
        seconds_left: state.seconds_left,
        expires_at: ctxd_core::view::format_rfc3339_ms(state.expires_at_ms),
        ttl_seconds: state.ttl_seconds,
        recache_tokens: state.recache_tokens,
        recache_cost_usd: state.recache_cost_usd,
        prices_date: state.recache_cost_usd.map(|_| ctxd_core::cache_state::price_table().date.clone()),
        source,
    }
}

/// The level for a status bar's colour: compacting while a compaction runs.
pub fn level(snapshot: &UsageSnapshot) -> proto::Level {
    if snapshot.compacting {
        return proto::Level::Compacting;
    }
    match snapshot.thresholds.level(snapshot.tokens) {
        CoreLevel::Ok => proto::Level::Ok,
        CoreLevel::Warning => proto::Level::Warning,
        CoreLevel::Blocked => proto::Level::Blocked,
    }
}

pub fn opened(session_id: String, opened: Opened) -> proto::OpenSessionResult {
    proto::OpenSessionResult {
        session_id,
        resumed: opened.resumed,
        records: opened.records,
        diagnostics: opened.diagnostics,
        usage: usage(&opened.usage),
    }
}

pub fn appended(appended: &Appended) -> proto::AppendResult {
    proto::AppendResult {
        appended: appended.appended,
        duplicates: appended.duplicates,
        records: appended.records,
        usage: usage(&appended.usage),
    }
}

pub fn file_read(answer: FileReadAnswer) -> proto::FileReadResult {
    let (already_read, unchanged) = match answer.outcome {
        ReadOutcome::New => (false, false),
        ReadOutcome::Reread { unchanged } => (true, unchanged),
    };
    let e = answer.entry;
    proto::FileReadResult {
        path: e.path,
        already_read,
        unchanged,
        reads: e.reads,
        start_line: e.start_line,
        num_lines: e.num_lines,
        total_lines: e.total_lines,
        tokens: e.tokens,
    }
}

/// A compaction installed, with the session's usage after it.
pub fn compacted(done: CompactAnswer, after: &UsageSnapshot) -> Result<proto::CompactResult, String> {
    Ok(proto::CompactResult {
        boundary: done.boundary,
        trigger: trigger(done.trigger),
        pre_tokens: done.pre_tokens,
        post_tokens: done.post_tokens,
        summary: done.summary,
        summarizer: summarizer(&done.summarizer)?,
        summary_path: done.summarizer.path.map(summary_path),
        fidelity_appended: done.fidelity_appended as u64,
        problems: done.problems,
        origin: compact_origin(done.origin),
        usage: usage(after),
    })
}

fn compact_origin(origin: ctxd_core::compact::lifecycle::Origin) -> proto::CompactOrigin {
    use ctxd_core::compact::lifecycle::Origin;
    match origin {
        Origin::Requested => proto::CompactOrigin::Requested,
        Origin::Joined => proto::CompactOrigin::Joined,
        Origin::Queued => proto::CompactOrigin::Queued,
    }
}

pub fn undone(done: UndoAnswer) -> proto::UndoCompactResult {
    proto::UndoCompactResult {
        boundary: done.boundary,
        undo_record: done.undo_record,
        pre_tokens: done.pre_tokens,
        post_tokens: done.post_tokens,
        usage: usage(&done.usage),
    }
}

pub fn snipped(done: Reduced) -> proto::SnipResult {
    proto::SnipResult { tokens_freed: done.tokens_freed, unknown: done.unknown, usage: usage(&done.usage) }
}

pub fn collapsed(done: Reduced) -> proto::CollapseResult {
    proto::CollapseResult { collapse_id: done.record_uuid, tokens_freed: done.tokens_freed, usage: usage(&done.usage) }
}

/// What the model sees, by source.
pub fn context(session_id: String, view: ContextView) -> proto::ContextResult {
    let pending_rules = view
        .memory_files
        .iter()
        .filter(|f| f.status == Status::Pending && !f.rule_paths.is_empty())
        .map(|f| proto::PendingRule { path: f.path.display().to_string(), paths: f.rule_paths.clone() })
        .collect();
    proto::ContextResult {
        session_id,
        usage: usage(&view.usage),
        memory_files: view
            .memory_files
            .into_iter()
            .map(|f| proto::MemoryFile {
                path: f.path.display().to_string(),
                kind: memory_kind(f.kind),
                tokens: f.tokens,
                status: memory_status(f.status),
            })
            .collect(),
        pending_rules,
        diagnostics: view.diagnostics,
        files_read: view.files_read as u64,
        stale_files: view.stale_files,
        git: view.git,
        prepared_ahead: view.prepared_ahead,
        instant_compaction: view.instant_compaction.as_ref().map(crate::gateway::costs::stats),
    }
}

/// [`proto::AssembleResult`] with the request as the pipeline built it, encoded straight
/// into the answer rather than through a value tree (the same JSON).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AssembleResultText {
    request: ctxd_core::view::Request,
    /// About how long `request` is as JSON (see [`AssembleAnswer`]).
    #[serde(skip)]
    pub request_len_hint: usize,
    revision: String,
    messages_from: u64,
    request_tokens: u64,
    usage: proto::Usage,
    applied: Vec<proto::AppliedStage>,
    decision: proto::Decision,
    #[serde(skip_serializing_if = "Option::is_none")]
    scrollback: Option<proto::scrollback::Scrollback>,
}

pub fn assembled(done: AssembleAnswer) -> AssembleResultText {
    AssembleResultText {
        request: done.request,
        request_len_hint: done.request_len_hint,
        revision: done.revision,
        messages_from: done.messages_from as u64,
        request_tokens: done.request_tokens,
        usage: usage(&done.usage),
        applied: done
            .applied
            .into_iter()
            .map(|a| proto::AppliedStage {
                stage: stage(a.stage),
                acted: a.acted,
                tokens_freed: a.tokens_freed,
                detail: a.detail,
            })
            .collect(),
        decision: if done.compact { proto::Decision::Compact } else { proto::Decision::Continue },
        scrollback: done.scrollback.map(scrollback),
    }
}

/// The scrollback as the protocol has it (the core's type, field for field).
pub fn scrollback(core: ctxd_core::view::Scrollback) -> proto::scrollback::Scrollback {
    use ctxd_core::view::scrollback as domain;
    use proto::scrollback as wire;
    let entry = |e: domain::ScrollbackEntry| wire::ScrollbackEntry {
        uuid: e.uuid,
        parent_uuid: e.parent_uuid,
        role: match e.role {
            domain::EntryRole::User => wire::EntryRole::User,
            domain::EntryRole::Assistant => wire::EntryRole::Assistant,
        },
        kind: match e.kind {
            domain::EntryKind::Prompt => wire::EntryKind::Prompt,
            domain::EntryKind::ToolResults => wire::EntryKind::ToolResults,
            domain::EntryKind::Meta => wire::EntryKind::Meta,
            domain::EntryKind::CompactSummary => wire::EntryKind::CompactSummary,
            domain::EntryKind::Attachment => wire::EntryKind::Attachment,
            domain::EntryKind::Response => wire::EntryKind::Response,
            domain::EntryKind::CollapseSummary => wire::EntryKind::CollapseSummary,
        },
        attachment_type: e.attachment_type,
        timestamp_ms: e.timestamp_ms,
        content: e.content,
        tokens: e.tokens,
        hidden: e.hidden.map(|h| match h {
            domain::Hidden::Compacted { boundary_uuid } => wire::Hidden::Compacted { boundary_uuid },
            domain::Hidden::Snipped => wire::Hidden::Snipped,
            domain::Hidden::Collapsed { summary_entry } => {
                wire::Hidden::Collapsed { summary_entry: summary_entry as u64 }
            }
        }),
        results: e
            .results
            .into_iter()
            .map(|r| wire::ResultMark {
                tool_use_id: r.tool_use_id,
                block: r.block as u64,
                change: match r.change {
                    domain::ResultChange::Cleared => wire::ResultChange::Cleared,
                    domain::ResultChange::DeletedFromCache => wire::ResultChange::DeletedFromCache,
                    domain::ResultChange::Replaced { path, original_bytes } => {
                        wire::ResultChange::Replaced { path, original_bytes }
                    }
                },
            })
            .collect(),
        span: e.span.map(|s| wire::Span { from: s.from, to: s.to }),
    };
    wire::Scrollback {
        entries: core.entries.into_iter().map(entry).collect(),
        boundary_uuid: core.boundary_uuid,
        off_chain: core.off_chain as u64,
    }
}

pub fn trigger(trigger: Trigger) -> proto::Trigger {
    match trigger {
        Trigger::Manual => proto::Trigger::Manual,
        Trigger::Auto => proto::Trigger::Auto,
        Trigger::Reactive => proto::Trigger::Reactive,
        Trigger::Idle => proto::Trigger::Idle,
        Trigger::Partial => proto::Trigger::Partial,
        Trigger::Precomputed => proto::Trigger::Precomputed,
    }
}

/// Who wrote a summary. The daemon names its summarizers with the provider's name
/// (`RemoteProvider::name`) or `offline`; a name without a wire value is a bug, reported
/// as an internal error rather than sent under another name.
pub fn summarizer(summarizer: &Summarizer) -> Result<proto::Summarizer, String> {
    match summarizer.name {
        "offline" => Ok(proto::Summarizer::Offline),
        "anthropic" => Ok(proto::Summarizer::Anthropic),
        "openai" => Ok(proto::Summarizer::Openai),
        other => Err(format!("summarizer {other:?} has no protocol name")),
    }
}

pub fn summary_path(path: SummaryPath) -> proto::SummaryPath {
    match path {
        SummaryPath::Fork => proto::SummaryPath::Fork,
        SummaryPath::Fallback => proto::SummaryPath::Fallback,
    }
}

pub fn stage(stage: Stage) -> proto::Stage {
    match stage {
        Stage::Normalize => proto::Stage::Normalize,
        Stage::Slice => proto::Stage::Slice,
        Stage::Place => proto::Stage::Place,
        Stage::Snip => proto::Stage::Snip,
        Stage::Collapse => proto::Stage::Collapse,
        Stage::ToolResultBudget => proto::Stage::ToolResultBudget,
        Stage::Microcompact => proto::Stage::Microcompact,
        Stage::CacheBreakpoints => proto::Stage::CacheBreakpoints,
        Stage::CompactCheck => proto::Stage::CompactCheck,
    }
}

pub fn memory_kind(kind: MemoryKind) -> proto::MemoryKind {
    match kind {
        MemoryKind::Managed => proto::MemoryKind::Managed,
        MemoryKind::User => proto::MemoryKind::User,
        MemoryKind::Project => proto::MemoryKind::Project,
        MemoryKind::Local => proto::MemoryKind::Local,
        MemoryKind::Rule => proto::MemoryKind::Rule,
        MemoryKind::Nested => proto::MemoryKind::Nested,
        MemoryKind::AutoMemory => proto::MemoryKind::AutoMemory,
        MemoryKind::Import => proto::MemoryKind::Import,
    }
}

pub fn memory_status(status: Status) -> proto::MemoryStatus {
    match status {
        Status::Active => proto::MemoryStatus::Loaded,
        Status::Pending => proto::MemoryStatus::Waiting,
        Status::Duplicate => proto::MemoryStatus::Duplicate,
    }
}

pub fn window_source(source: WindowSource) -> proto::WindowSource {
    match source {
        WindowSource::Env => proto::WindowSource::Env,
        WindowSource::Setting => proto::WindowSource::Setting,
        WindowSource::Client => proto::WindowSource::Client,
        WindowSource::Experiment => proto::WindowSource::Experiment,
        WindowSource::ModelDefault => proto::WindowSource::ModelDefault,
        WindowSource::SubagentCeiling => proto::WindowSource::SubagentCeiling,
    }
}

/// A history record's role.
pub fn history_role(role: ctxd_core::recall::Role) -> proto::HistoryRole {
    use ctxd_core::recall::Role;
    match role {
        Role::User => proto::HistoryRole::User,
        Role::Assistant => proto::HistoryRole::Assistant,
        Role::ToolResult => proto::HistoryRole::ToolResult,
        Role::Attachment => proto::HistoryRole::Attachment,
        Role::Summary => proto::HistoryRole::Summary,
        Role::Meta => proto::HistoryRole::Meta,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The wire's name of a value, as serde writes it.
    fn name<T: serde::Serialize>(value: T) -> String {
        serde_json::to_value(value).unwrap().as_str().unwrap().to_owned()
    }

    #[test]
    fn wire_names_are_the_domains_own() {
        use Trigger::*;
        for t in [Manual, Auto, Reactive, Idle, Partial, Precomputed] {
            assert_eq!(name(trigger(t)), t.as_str());
        }
        use Stage::*;
        for s in
            [Normalize, Slice, Place, Snip, Collapse, ToolResultBudget, Microcompact, CacheBreakpoints, CompactCheck]
        {
            assert_eq!(name(stage(s)), s.as_str());
            assert_eq!(name(stage(s)), name(s), "the core's serde name is the wire's");
        }
        use MemoryKind::*;
        for k in [Managed, User, Project, Local, Rule, Nested, AutoMemory, Import] {
            assert_eq!(name(memory_kind(k)), k.label());
        }
        for p in [SummaryPath::Fork, SummaryPath::Fallback] {
            assert_eq!(name(summary_path(p)), p.as_str());
        }
    }

    #[test]
    fn the_wire_scrollback_writes_the_same_json_as_the_cores_for_every_variant() {
        use ctxd_core::view::scrollback::{
            EntryKind, EntryRole, Hidden, ResultChange, ResultMark, Scrollback, ScrollbackEntry, Span,
        };
        let entry = |kind, hidden| ScrollbackEntry {
            uuid: Some("u".into()),
            parent_uuid: None,
            role: EntryRole::User,
            kind,
            attachment_type: None,
            timestamp_ms: Some(1),
            content: vec![serde_json::json!({"type": "text", "text": "hi"})],
            tokens: 3,
            hidden,
            results: Vec::new(),
            span: None,
        };
        let mut results = entry(EntryKind::ToolResults, None);
        results.results = [
            ResultChange::Cleared,
            ResultChange::DeletedFromCache,
            ResultChange::Replaced { path: "/p".into(), original_bytes: 9 },
        ]
        .into_iter()
        .enumerate()
        .map(|(block, change)| ResultMark { tool_use_id: format!("t{block}"), block, change })
        .collect();
        let mut summary = entry(EntryKind::CollapseSummary, None);
        summary.role = EntryRole::Assistant;
        summary.span = Some(Span { from: "a".into(), to: "b".into() });
        let core = Scrollback {
            entries: vec![
                entry(EntryKind::Prompt, Some(Hidden::Compacted { boundary_uuid: Some("b".into()) })),
                entry(EntryKind::Meta, Some(Hidden::Snipped)),
                entry(EntryKind::Response, Some(Hidden::Collapsed { summary_entry: 4 })),
                entry(EntryKind::CompactSummary, None),
                entry(EntryKind::Attachment, None),
                results,
                summary,
            ],
            boundary_uuid: Some("b".into()),
            off_chain: 2,
        };
        let expected = serde_json::to_value(&core).unwrap();
        assert_eq!(serde_json::to_value(scrollback(core)).unwrap(), expected);
    }

    #[test]
    fn every_summarizer_the_daemon_names_has_a_wire_name() {
        for provider in ["anthropic", "openai", "offline"] {
            let s = Summarizer { name: provider, path: None };
            assert_eq!(name(summarizer(&s).unwrap()), provider);
        }
        assert!(summarizer(&Summarizer { name: "someone else", path: None }).is_err());
    }

    #[test]
    fn the_prompt_cache_on_the_wire() {
        let opus = ctxd_core::cache_state::prices_for("claude-opus-5-5");
        let cold = ctxd_core::cache_state::cache_state(600_000, 0, 300, Some(612_000), opus);
        let wire = serde_json::to_value(prompt_cache(&cold, proto::PromptCacheSource::Gateway)).unwrap();
        assert_eq!(
            wire,
            serde_json::json!({"warm": false, "secondsLeft": 0, "expiresAt": "1970-01-01T00:05:00.000Z", "ttlSeconds": 300,
                "recacheTokens": 612_000, "recacheCostUsd": 3.06, "pricesDate": "2026-11-24", "source": "gateway"})
        );
        // Nothing known, nothing said.
        let warm = ctxd_core::cache_state::cache_state(0, 0, 300, None, None);
        let wire = serde_json::to_value(prompt_cache(&warm, proto::PromptCacheSource::Program)).unwrap();
        assert_eq!(
            wire.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["warm", "secondsLeft", "expiresAt", "ttlSeconds", "source"]
        );
    }
}
