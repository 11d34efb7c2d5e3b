//! Conversion of domain values to the protocol's types (`ctxd_proto`): the one place
//! where the core's and the daemon's types become what travels on the wire, so the wire
//! can stay stable while they move. The closed sets the core decides on (trigger,
//! stage, memory kind, window source, history role) travel as the core's own types;
//! those the wire names otherwise convert by `From` in the proto crate; every match
//! here is exhaustive: a new domain value fails to compile until it has a wire name.

use ctxd_core::budget::Level as CoreLevel;
use ctxd_core::ledger::ReadOutcome;
use ctxd_core::memory::Status;
use ctxd_proto as proto;

use crate::session::actor::{
    Appended, AssembleAnswer, CompactAnswer, ContextView, FileReadAnswer, Opened, Reduced, UndoAnswer,
};
use crate::session::compaction::Summarizer;
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
        cache: snapshot.cache.clone(),
    }
}

/// A session's prompt cache (`core::cache_state`) on the wire; `source` says whose
/// figures they were, `summary_ready` whether the gateway holds a summary for it.
pub fn prompt_cache(
    state: &ctxd_core::cache_state::CacheState,
    source: proto::PromptCacheSource,
    summary_ready: bool,
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
        summary_ready,
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
        trigger: done.trigger,
        pre_tokens: done.pre_tokens,
        post_tokens: done.post_tokens,
        summary: done.summary,
        summarizer: summarizer(&done.summarizer)?,
        summary_path: done.summarizer.path,
        fidelity_appended: done.fidelity_appended as u64,
        problems: done.problems,
        origin: done.origin.into(),
        usage: usage(after),
    })
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
                kind: f.kind,
                tokens: f.tokens,
                status: f.status.into(),
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
                stage: a.stage,
                acted: a.acted,
                tokens_freed: a.tokens_freed,
                detail: a.detail,
            })
            .collect(),
        decision: if done.compact { proto::Decision::Compact } else { proto::Decision::Continue },
        scrollback: done.scrollback,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use ctxd_core::budget::WindowSource;
    use ctxd_core::compact::Trigger;
    use ctxd_core::memory::MemoryKind;
    use ctxd_core::view::Stage;

    use super::*;

    /// The wire's name of a value, as serde writes it.
    fn name<T: serde::Serialize>(value: T) -> String {
        serde_json::to_value(value).unwrap().as_str().unwrap().to_owned()
    }

    /// The closed sets the wire carries as the core defines them: the names the core
    /// writes in logs, transcripts and messages are the wire's.
    #[test]
    fn wire_names_are_the_domains_own() {
        use Trigger::*;
        for t in [Manual, Auto, Reactive, Idle, Partial, Precomputed] {
            assert_eq!(name(t), t.as_str());
        }
        use Stage::*;
        for s in
            [Normalize, Slice, Place, Snip, Collapse, ToolResultBudget, Microcompact, CacheBreakpoints, CompactCheck]
        {
            assert_eq!(name(s), s.as_str());
        }
        use MemoryKind::*;
        for k in [Managed, User, Project, Local, Rule, Nested, AutoMemory, Import] {
            assert_eq!(name(k), k.label());
        }
        use WindowSource::*;
        for w in [Env, Setting, Client, Experiment, ModelDefault, SubagentCeiling] {
            assert_eq!(name(w), w.as_str());
        }
        use ctxd_core::recall::Role;
        for r in [Role::User, Role::Assistant, Role::ToolResult, Role::Attachment, Role::Summary, Role::Meta] {
            assert_eq!(name(r), r.as_str());
        }
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
        let wire = serde_json::to_value(prompt_cache(&cold, proto::PromptCacheSource::Gateway, true)).unwrap();
        assert_eq!(
            wire,
            serde_json::json!({"warm": false, "secondsLeft": 0, "expiresAt": "1970-01-01T00:05:00.000Z", "ttlSeconds": 300,
                "recacheTokens": 612_000, "recacheCostUsd": 3.06, "pricesDate": "2026-11-24", "source": "gateway",
                "summaryReady": true})
        );
        // Nothing known, nothing said.
        let warm = ctxd_core::cache_state::cache_state(0, 0, 300, None, None);
        let wire = serde_json::to_value(prompt_cache(&warm, proto::PromptCacheSource::Program, false)).unwrap();
        assert_eq!(
            wire.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["warm", "secondsLeft", "expiresAt", "ttlSeconds", "source"]
        );
    }
}
