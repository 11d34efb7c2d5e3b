//! The compaction driver: the async half of compaction. The actor takes a snapshot of
//! the session and hands it here; [`prepare`] runs hooks, writes the summary, checks its
//! fidelity and chooses what to restore, all off the actor, so appends and usage keep
//! being answered. The actor then installs the result ([`super::actor`]), adding the
//! records appended in the meantime after the summary.
//!
//! Every decision is the pure planner's (`ctxd_core::compact`); this file only does the
//! I/O around it: hook commands, reading restored files from disk, the summarizer. The
//! CPU-heavy steps (offline summary, fidelity, restoration) run on
//! [`crate::background`]'s low-priority threads, not on the runtime's workers.

use std::path::Path;

use ctxd_core::compact::{
    DEFAULT_RECENT_TURNS, FidelityFacts, FidelityReport, FileReadEntry, KeptMessages, PostCompactSizes, RestoreBudget,
    RestoreInput, RestoredAttachment, SummaryMessage, Trigger, appended_budget, check_fidelity, kept_tail_start,
    merge_instructions, plan_restoration, summary_message_text, tools_used,
};
use ctxd_core::ledger::{LedgerEntry, has_changed};
use ctxd_core::record::Record;
use ctxd_core::summary::{OfflineOptions, estimate_tokens, offline_cap_tokens, parse_summary_reply, summarize_offline};
use serde_json::json;

/// What the actor hands the driver: a snapshot, never a live reference.
#[derive(Debug, Clone)]
pub struct Job {
    pub session_id: String,
    pub trigger: Trigger,
    pub focus: Option<String>,
    /// The records of the view when the compaction started.
    pub records: Vec<Record>,
    pub ledger: Vec<LedgerEntry>,
    pub pre_tokens: u64,
    pub threshold: u64,
    /// Tokens compaction cannot remove (system, tools, memory files).
    pub fixed_prefix: u64,
    pub settings: ctxd_proto::Settings,
    pub transcript_path: String,
    pub cwd: String,
    /// The session's model (summaries use `compactModel`, else `model`, else this).
    pub model: String,
    /// The view as a request body (for a provider's summary request).
    pub parent: Option<serde_json::Value>,
    /// `parent` is the request the host would be sent now, with its own system blocks
    /// and tools: a fork of it can read the provider's prompt cache. Otherwise it is the
    /// summarized records alone, for the fallback request only.
    pub host_parent: bool,
    /// Skills the agent invoked, restored within their budget.
    pub skills: Vec<ctxd_core::compact::SkillEntry>,
    /// The plan file, read again from disk at restoration.
    pub plan_path: Option<String>,
    /// `$/progress` for the client that asked (its end is sent by the session).
    pub progress: Option<super::Progress>,
    /// A partial compaction: which side of `split` (an index into `records`) is
    /// summarized; the other side is kept verbatim.
    pub partial: Option<(ctxd_core::compact::SplitDirection, usize)>,
    /// The environment `main` read: provider keys and fallbacks, the fork switch.
    pub env: std::sync::Arc<crate::process_env::ProcessEnv>,
}

/// A summary ready to install.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The installed summary message's text.
    pub summary_text: String,
    /// The summary body (what `ctx/compact` returns).
    pub summary: String,
    /// Index into the snapshot where the messages kept verbatim start (after the summary).
    pub kept_from: usize,
    /// A partial compaction from a message: the snapshot's first `n` records are kept
    /// before the summary instead (and nothing after it).
    pub kept_before: Option<usize>,
    pub attachments: Vec<RestoredAttachment>,
    pub hook_outputs: Vec<String>,
    pub fidelity: FidelityReport,
    /// Hook failures and other things worth telling the client.
    pub problems: Vec<String>,
    /// Which summarizer wrote it.
    pub summarizer: Summarizer,
    /// Tokens the session would hold right after installing it (fixed prefix, summary,
    /// kept tail, restored attachments, hook output), before anything appended since.
    pub estimated_post_tokens: u64,
}

/// Who wrote a summary, and for which request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summarizer {
    /// `offline`, or the provider's name (`anthropic`, `openai`).
    pub name: &'static str,
    /// The request a provider answered; `None` for the offline summarizer.
    pub path: Option<SummaryPath>,
}

impl Summarizer {
    const OFFLINE: Summarizer = Summarizer { name: "offline", path: None };
}

/// The two requests a provider can be asked: the cache-sharing fork of the session's
/// request, or the summary-specific streaming fallback. One closed set, the wire's.
pub use ctxd_proto::SummaryPath;

/// Why a compaction failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CompactFailure {
    #[error("nothing to compact: the session has no messages after its last compaction")]
    NothingToCompact,
    #[error("the summary could not be read: {0}")]
    Summary(String),
}

/// Runs everything of a compaction that does not touch the session's state.
pub async fn prepare(mut job: Job) -> Result<Prepared, CompactFailure> {
    let conversation = job
        .records
        .iter()
        .filter(|r| r.head().message_id.is_some() || matches!(r.head().kind, ctxd_core::record::Kind::User))
        .count();
    if conversation == 0 {
        return Err(CompactFailure::NothingToCompact);
    }
    if let Some(progress) = &job.progress {
        progress.begin("Compacting", format!("{} compaction of {} tokens", job.trigger.as_str(), job.pre_tokens)).await;
    }
    let mut problems = Vec::new();
    let hooks = job.settings.hooks.as_ref();
    let hook_input = json!({
        "session_id": job.session_id,
        "transcript_path": job.transcript_path,
        "cwd": job.cwd,
        "hook_event_name": "PreCompact",
        "trigger": job.trigger.hook_trigger(),
        "custom_instructions": job.focus.clone().unwrap_or_default(),
    });
    let pre = crate::hooks::run(hooks, "PreCompact", job.trigger.hook_trigger(), &hook_input).await;
    let hook_instructions: Vec<String> = pre.iter().filter_map(|r| r.output.clone()).collect();
    problems
        .extend(pre.iter().filter_map(|r| r.problem.as_ref().map(|p| format!("PreCompact hook `{}`: {p}", r.command))));
    let instructions = merge_instructions(job.focus.as_deref(), &hook_instructions);
    if let Some(progress) = &job.progress {
        progress.report("writing the summary", 10).await;
    }

    // The newest exchange stays verbatim after the summary and the rest is summarized;
    // a partial compaction chooses the split itself, and which side is kept.
    use ctxd_core::compact::SplitDirection;
    let (kept_from, kept_before) = match job.partial {
        None => {
            let from = kept_tail_start(&job.records).unwrap_or(job.records.len());
            let kept_tokens: u64 = job.records[from..].iter().map(ctxd_core::compact::carried_tokens).sum();
            if ctxd_core::compact::keep_tail(kept_tokens, job.threshold) {
                (from, None)
            } else {
                tracing::info!(
                    kept_tokens,
                    threshold = job.threshold,
                    "the newest exchange is too large to keep verbatim; it is summarized"
                );
                (job.records.len(), None)
            }
        }
        Some((SplitDirection::UpTo, split)) => (split.min(job.records.len()), None),
        Some((SplitDirection::From, split)) => (job.records.len(), Some(split.min(job.records.len()))),
    };
    let (summarized, kept) = match kept_before {
        Some(split) => (job.records[split..].to_vec(), job.records[..split].to_vec()),
        None => (job.records[..kept_from].to_vec(), job.records[kept_from..].to_vec()),
    };
    if !summarized
        .iter()
        .any(|r| r.head().message_id.is_some() || matches!(r.head().kind, ctxd_core::record::Kind::User))
    {
        return Err(CompactFailure::NothingToCompact);
    }
    // The CPU-heavy steps run on the low-priority pool, never on the runtime's workers,
    // so the session actors (this one's included) keep answering at full priority.
    let (summarized, facts) = crate::background::run(move || {
        let facts = FidelityFacts::from_records(&summarized, DEFAULT_RECENT_TURNS);
        (summarized, facts)
    })
    .await
    .map_err(|e| CompactFailure::Summary(format!("summarizer task failed: {e}")))?;
    // A configured provider writes the summary; if it keeps failing, the offline
    // summarizer (no network) is the next rung down. It is written only when it is the
    // one installed: with a model it would be CPU spent for nothing on every compaction.
    let focus = instructions.clone();
    let (body, summarizer) = match remote_provider(&job) {
        Ok(None) => (write_offline(summarized, focus, job.threshold).await?, Summarizer::OFFLINE),
        Ok(Some(provider)) => {
            let name = provider.name();
            match summarize_remote(&provider, &job, instructions.as_deref(), !kept.is_empty(), &mut problems).await {
                Ok((body, path)) => (body, Summarizer { name, path: Some(path) }),
                Err(e) => {
                    problems.push(format!("{name} could not write the summary ({e}); the offline summarizer wrote it"));
                    (write_offline(summarized, focus, job.threshold).await?, Summarizer::OFFLINE)
                }
            }
        }
        Err(e) => {
            problems.push(format!("provider settings: {e}; the offline summarizer wrote the summary"));
            (write_offline(summarized, focus, job.threshold).await?, Summarizer::OFFLINE)
        }
    };
    // The snapshot is not needed after this step: moved, not copied.
    let (transcript_path, records, kept_any) =
        (job.transcript_path.clone(), std::mem::take(&mut job.records), !kept.is_empty());
    let (cwd, env) = (job.cwd.clone(), job.env.clone());
    // What the check appends stays within what the summary cap of this window leaves
    // beside the body (at least half of it).
    let appended = appended_budget(offline_cap_tokens(job.threshold), body.len());
    let (checked, summary_text) = crate::background::run(move || {
        let checked = check_fidelity(&body, &facts, appended);
        // Read here, off the async threads: the closing line names the history tools
        // when the session's project has `ctxd mcp` configured.
        let project = Some(Path::new(&cwd)).filter(|dir| !dir.as_os_str().is_empty());
        let summary_text = summary_message_text(&SummaryMessage {
            body: checked.summary.clone(),
            transcript_path: Some(transcript_path),
            history_tools: crate::mcp_config::history_tools(project, &env),
            tools_used: tools_used(&records),
            kept: if kept_any { KeptMessages::After } else { KeptMessages::None },
        });
        (checked, summary_text)
    })
    .await
    .map_err(|e| CompactFailure::Summary(format!("fidelity task failed: {e}")))?;
    let summary = checked.summary;

    let start_input = json!({
        "session_id": job.session_id,
        "transcript_path": job.transcript_path,
        "cwd": job.cwd,
        "hook_event_name": "SessionStart",
        "source": "compact",
    });
    let start = crate::hooks::run(hooks, "SessionStart", "compact", &start_input).await;
    let hook_outputs: Vec<String> = start.iter().filter_map(|r| r.output.clone()).collect();
    problems.extend(
        start.iter().filter_map(|r| r.problem.as_ref().map(|p| format!("SessionStart hook `{}`: {p}", r.command))),
    );

    if let Some(progress) = &job.progress {
        progress.report("restoring recent files and skills", 80).await;
    }
    // Restoration: bounded, newest first, sized so the session ends well below its
    // threshold after compaction.
    let ledger = job.ledger.clone();
    let cwd = job.cwd.clone();
    let skills = job.skills.clone();
    let plan_path = job.plan_path.clone();
    let (env, imports) = (job.env.clone(), job.settings.import_folders.clone());
    let (fixed_prefix, threshold, summary_tokens) = (job.fixed_prefix, job.threshold, estimate_tokens(&summary_text));
    let hook_tokens = hook_outputs.iter().map(|h| estimate_tokens(h)).sum();
    let plan = crate::background::run(move || {
        let kept_uuids: Vec<String> = kept.iter().filter_map(|r| r.uuid().map(str::to_owned)).collect();
        let kept_tokens: u64 = kept.iter().map(ctxd_core::compact::carried_tokens).sum();
        let sizes =
            PostCompactSizes { fixed_prefix, summary: summary_tokens, kept: kept_tokens, hook_output: hook_tokens };
        let budget = RestoreBudget::fitted(threshold, &sizes);
        let allowed = restorable(&cwd, &env, imports.as_deref());
        let files = restoration_candidates(&ledger, &kept_uuids, budget.max_tokens_per_file, &allowed);
        // The plan as it is on disk now; a plan file that is gone, or not one that may
        // be put back into a transcript, is not restored.
        let plan = plan_path.and_then(|path| {
            let content =
                crate::outside::read_restorable(Path::new(&path), &allowed, crate::outside::PLAN_FILE).ok()?;
            Some(ctxd_core::compact::PlanFile { path, content })
        });
        let plan = plan_restoration(&RestoreInput { files, skills, plan, budget, cwd: Some(cwd) });
        let before_attachments = sizes.fixed_prefix + sizes.summary + sizes.kept + sizes.hook_output;
        (plan, before_attachments)
    })
    .await
    .map_err(|e| CompactFailure::Summary(format!("restoration task failed: {e}")))?;

    let (plan, before_attachments) = plan;
    let estimated_post_tokens = before_attachments + plan.attachments.iter().map(|a| a.tokens).sum::<u64>();
    Ok(Prepared {
        summary_text,
        summary,
        kept_from,
        kept_before,
        estimated_post_tokens,
        attachments: plan.attachments,
        hook_outputs,
        fidelity: checked.report,
        problems,
        summarizer,
    })
}

/// The provider the settings (and `ANTHROPIC_API_KEY`) choose, or `None` for offline.
fn remote_provider(job: &Job) -> Result<Option<crate::provider::RemoteProvider>, crate::provider::ProviderError> {
    use crate::provider::{ApiKey, ProviderChoice, ProviderConfig, ProviderSettings};
    let s = &job.settings;
    let api_key = s.api_key_env.as_deref().and_then(|var| job.env.var(var)).filter(|k| !k.is_empty()).map(ApiKey::new);
    let provider = s.provider.map(|p| match p {
        ctxd_proto::settings::ProviderKind::Anthropic => "anthropic".to_owned(),
        ctxd_proto::settings::ProviderKind::Openai => "openai".to_owned(),
        ctxd_proto::settings::ProviderKind::Offline => "offline".to_owned(),
    });
    let settings = ProviderSettings {
        provider,
        model: s.model.clone(),
        base_url: s.base_url.clone(),
        api_key,
        compact_model: s.compact_model.clone(),
        larger_model_retry: s.larger_model_retry.clone(),
    };
    match ProviderConfig::from_env(&settings, &job.env)?.connect()? {
        ProviderChoice::Offline => Ok(None),
        ProviderChoice::Remote(remote) => Ok(Some(remote)),
    }
}

/// The offline summary of `summarized`, on the low-priority pool, capped in proportion
/// to the session's threshold.
async fn write_offline(
    summarized: Vec<Record>,
    focus: Option<String>,
    threshold: u64,
) -> Result<String, CompactFailure> {
    let max_output_tokens = offline_cap_tokens(threshold);
    let offline = crate::background::run(move || {
        summarize_offline(&summarized, &OfflineOptions { focus, max_output_tokens, ..OfflineOptions::default() })
    })
    .await
    .map_err(|e| CompactFailure::Summary(format!("summarizer task failed: {e}")))?;
    parse_summary_reply(&offline.text).map_err(|e| CompactFailure::Summary(e.to_string()))
}

/// Asks a provider for the summary: first with the cache-sharing fork of the host's
/// request when [`choose_fork`](ctxd_core::compact::choose_fork) allows it, then, if the
/// fork is skipped or gives no usable summary, with the streaming fallback request
/// (summary system prompt, thinking off, output capped, reinjected reminders stripped,
/// media as markers): once, once more if the reply has no `<summary>`, and again with
/// the oldest rounds dropped if the request is too long. Why a fork gave way goes to
/// `problems`.
async fn summarize_remote(
    provider: &crate::provider::RemoteProvider,
    job: &Job,
    instructions: Option<&str>,
    kept: bool,
    problems: &mut Vec<String>,
) -> Result<(String, SummaryPath), String> {
    use ctxd_core::compact::{ForkChoice, PromptForm, PromptSpec, choose_fork, summary_instruction};
    let parent = job.parent.as_ref().ok_or("no request body for the session")?;
    let form = match job.partial {
        Some((ctxd_core::compact::SplitDirection::From, _)) => PromptForm::RecentOnly { start_hint: None },
        _ => PromptForm::Full,
    };
    let instruction = summary_instruction(&PromptSpec {
        form,
        additional: instructions.map(str::to_owned),
        newer_messages_kept: kept,
    });
    let model =
        job.settings.compact_model.clone().or_else(|| job.settings.model.clone()).unwrap_or_else(|| job.model.clone());
    let choice = ForkChoice {
        trigger: job.trigger,
        enabled: fork_enabled(&job.settings, &job.env),
        host_parent: job.host_parent,
        summary_model: &model,
        parent_model: parent.get("model").and_then(serde_json::Value::as_str).unwrap_or(""),
    };
    match choose_fork(&choice) {
        Ok(style) => match summarize_with_fork(provider, parent, &instruction, style).await {
            Ok(summary) => return Ok((summary, SummaryPath::Fork)),
            Err(why) => {
                tracing::info!(%why, "the cache-sharing fork gave no summary; asking with the fallback request");
                problems.push(format!("the cache-sharing fork gave no summary ({why}); the fallback request wrote it"));
            }
        },
        Err(skip) => tracing::debug!(%skip, "summary without the cache-sharing fork"),
    }
    summarize_with_fallback(provider, job, parent.clone(), &instruction, model)
        .await
        .map(|s| (s, SummaryPath::Fallback))
}

/// Whether settings and environment allow the fork (`compactFork`,
/// [`DISABLE_FORK_ENV`](crate::process_env::DISABLE_FORK_ENV)).
fn fork_enabled(settings: &ctxd_proto::Settings, env: &crate::process_env::ProcessEnv) -> bool {
    settings.compact_fork != Some(false) && !env.compact_fork_disabled()
}

/// Path 1: the parent request with the instruction appended, sent as it is (same model,
/// system, tools, `tool_choice`, thinking, prefix) so it reads the parent's cache. Tool
/// use is refused here rather than by a changed `tool_choice` (which would cost the
/// cached messages): a reply that calls a tool, or has no `<summary>`, is asked once
/// more, still as a fork, with the refusal said; a second such reply is "no usable
/// text". Every failure is the caller's cue to use the fallback, which has its own
/// prompt-too-long handling.
async fn summarize_with_fork(
    provider: &crate::provider::RemoteProvider,
    parent: &serde_json::Value,
    instruction: &str,
    style: ctxd_core::compact::ForkStyle,
) -> Result<String, String> {
    use crate::provider::Provider;
    use ctxd_core::compact::{ForkOptions, ReplyAttempt, ReplyVerdict, ToolRefusal, fork_request, read_summary_reply};
    let options = ForkOptions { style, tool_refusal: ToolRefusal::default() };
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut attempt = ReplyAttempt::First;
    let mut ask = instruction.to_owned();
    loop {
        let built = fork_request(parent, &ask, options).map_err(|e| e.to_string())?;
        tracing::debug!(report = ?built.report, "cache-sharing fork request");
        let request = summary_request(built.body);
        let reply = provider.send(&request, &cancel, &mut |_| {}).await.map_err(|e| e.to_string())?;
        if reply.tool_calls > 0 || reply.stop_reason == Some(crate::provider::StopReason::ToolUse) {
            match refuse_tool_call(attempt, instruction) {
                Some(again) => {
                    tracing::debug!("the fork's reply called a tool; asking once more for text");
                    attempt = ReplyAttempt::Reasked;
                    ask = again;
                    continue;
                }
                None => return Err("the reply called a tool again after it was refused".to_owned()),
            }
        }
        match read_summary_reply(&reply.text, attempt, instruction).map_err(|e| e.to_string())? {
            ReplyVerdict::Summary(summary) => return Ok(summary),
            ReplyVerdict::AskAgain { instruction: again } => {
                attempt = ReplyAttempt::Reasked;
                ask = again;
            }
        }
    }
}

/// The fork's instruction again, saying tool use is refused, after a first reply that
/// called a tool; `None` after the one re-ask (the fallback's turn).
fn refuse_tool_call(attempt: ctxd_core::compact::ReplyAttempt, instruction: &str) -> Option<String> {
    (attempt == ctxd_core::compact::ReplyAttempt::First).then(|| format!("{instruction}\n\n{TOOL_REFUSAL_NOTE}"))
}

/// Said to a fork whose reply called a tool. Its tools stay offered (the cache reads
/// them), so the refusal is in words.
const TOOL_REFUSAL_NOTE: &str = "Tool use is refused for this request: the call was not run. \
Reply with text only: the summary, in the format asked for above.";

/// A request body as the provider's request: the fields it knows by name, everything
/// else (`tool_choice`, …) passed through as it is.
fn summary_request(body: serde_json::Value) -> crate::provider::SummaryRequest {
    use serde_json::Value;
    let mut body = match body {
        Value::Object(object) => object,
        _ => serde_json::Map::new(),
    };
    let mut list = |key: &str| match body.remove(key) {
        Some(Value::Array(items)) => items,
        _ => Vec::new(),
    };
    let (system, messages, tools) = (list("system"), list("messages"), list("tools"));
    let model = body.remove("model").and_then(|m| m.as_str().map(str::to_owned)).unwrap_or_default();
    let max_tokens =
        body.remove("max_tokens").and_then(|m| m.as_u64()).unwrap_or(ctxd_core::compact::FALLBACK_MAX_TOKENS);
    let thinking = body.remove("thinking");
    crate::provider::SummaryRequest {
        model,
        system,
        messages,
        tools,
        max_tokens: u32::try_from(max_tokens).unwrap_or(u32::MAX),
        thinking,
        betas: Vec::new(),
        extra: body,
    }
}

/// Path 2: the streaming fallback request, asked of `model` (`compactModel`, else
/// `model`, else the session's), with the larger-model retry and prompt-too-long cuts.
async fn summarize_with_fallback(
    provider: &crate::provider::RemoteProvider,
    job: &Job,
    parent: serde_json::Value,
    instruction: &str,
    mut model: String,
) -> Result<String, String> {
    use crate::provider::{Provider, ProviderError};
    use ctxd_core::compact::{
        FallbackOptions, MAX_PTL_RETRIES, Overflow, ReplyAttempt, ReplyVerdict, fallback_request, read_summary_reply,
        truncate_for_retry,
    };
    // A summary request too long for the model goes once to the larger model, if one is
    // configured, before anything is dropped from it.
    let mut larger = job.settings.larger_model_retry.clone().filter(|m| *m != model);
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut body_source = parent;
    let mut attempt = ReplyAttempt::First;
    let mut ask = instruction.to_owned();
    let mut ptl_retries = 0;
    loop {
        let built = fallback_request(&body_source, &ask, &FallbackOptions::default()).map_err(|e| e.to_string())?;
        let mut request = summary_request(built.body);
        request.model = model.clone();
        match provider.send(&request, &cancel, &mut |_| {}).await {
            Ok(reply) => match read_summary_reply(&reply.text, attempt, instruction) {
                Ok(ReplyVerdict::Summary(summary)) => return Ok(summary),
                Ok(ReplyVerdict::AskAgain { instruction: again }) => {
                    attempt = ReplyAttempt::Reasked;
                    ask = again;
                }
                Err(e) => return Err(e.to_string()),
            },
            Err(ProviderError::PromptTooLong { tokens, max }) if larger.is_some() => {
                tracing::info!(tokens, max, from = %model, "summary request too long; retrying with the larger model");
                model = larger.take().unwrap_or_default();
            }
            Err(ProviderError::PromptTooLong { tokens, max }) if ptl_retries < MAX_PTL_RETRIES => {
                let cut = truncate_for_retry(&body_source, Some(Overflow { tokens, max }), ptl_retries)
                    .ok_or("the summary request is too long and nothing more can be dropped")?;
                body_source = cut.body;
                ptl_retries += 1;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// A provider's summary body for a compaction outside a session's actor (a Claude Code
/// transcript compacted in place, [`crate::claude`]), through the same requests as a
/// session's: `Ok(None)` when the settings choose no provider, an error (provider
/// settings, HTTP, a cut stream, a reply without a summary) for the caller to fall back
/// on the offline summarizer. `job.parent` is the summarized records as a request body;
/// with `host_parent` false the fork is skipped and the fallback request is asked.
pub(crate) async fn provider_summary(
    job: &Job,
    instructions: Option<&str>,
    kept: bool,
    problems: &mut Vec<String>,
) -> Result<Option<(String, Summarizer)>, String> {
    let provider = match remote_provider(job) {
        Ok(None) => return Ok(None),
        Ok(Some(provider)) => provider,
        Err(e) => return Err(format!("provider settings: {e}")),
    };
    let name = provider.name();
    let (body, path) = summarize_remote(&provider, job, instructions, kept, problems)
        .await
        .map_err(|e| format!("{name} could not write the summary ({e})"))?;
    Ok(Some((body, Summarizer { name, path: Some(path) })))
}

/// The folders a session's files may be put back into its transcript from: its
/// project `cwd`, Claude Code's folder and the `importFolders` its settings allow.
pub(crate) fn restorable(
    cwd: &str,
    env: &crate::process_env::ProcessEnv,
    import_folders: Option<&[String]>,
) -> crate::outside::Restorable {
    crate::outside::Restorable::new(
        Some(Path::new(cwd)),
        env.claude_config_dir().as_deref(),
        env.home().as_deref(),
        import_folders.unwrap_or_default(),
    )
}

/// The ledger as restoration sees it: the newest reads, with their current content when
/// small enough to restore and allowed to be (`allowed`; any other file comes back as its
/// path). Reads at most a few files from disk.
fn restoration_candidates(
    ledger: &[LedgerEntry],
    kept_uuids: &[String],
    max_tokens_per_file: u64,
    allowed: &crate::outside::Restorable,
) -> Vec<FileReadEntry> {
    let mut newest: Vec<&LedgerEntry> = ledger.iter().collect();
    newest.sort_by_key(|e| std::cmp::Reverse(e.sequence));
    newest
        .into_iter()
        .take(20)
        .map(|entry| {
            let path = Path::new(&entry.path);
            // Only a regular file is measured or read: a FIFO or a device named by a
            // Read path is left alone.
            let size = crate::outside::open_regular(path).map(|(_, len)| len).ok();
            let tokens = size.map_or(entry.tokens, |s| s.div_ceil(4));
            let content = match size {
                Some(s) if s.div_ceil(4) <= max_tokens_per_file.max(1) => {
                    crate::outside::read_restorable(path, allowed, crate::outside::READ_FILE).ok()
                }
                _ => None,
            };
            let changed = content.as_deref().is_some_and(|c| has_changed(entry, c));
            FileReadEntry {
                path: entry.path.clone(),
                read_order: entry.sequence,
                tokens,
                exists: size.is_some(),
                content,
                changed_since_read: changed || entry.stale,
                in_kept_tail: entry.source_uuid.as_ref().is_some_and(|u| kept_uuids.contains(u)),
            }
        })
        .collect()
}

/// PostCompact hooks get the summary once it is installed; their output is logged only.
pub async fn after_install(
    settings: ctxd_proto::Settings,
    session_id: String,
    transcript_path: String,
    trigger: Trigger,
    summary: String,
) {
    let input = json!({
        "session_id": session_id,
        "transcript_path": transcript_path,
        "hook_event_name": "PostCompact",
        "trigger": trigger.hook_trigger(),
        "summary": summary,
    });
    for run in crate::hooks::run(settings.hooks.as_ref(), "PostCompact", trigger.hook_trigger(), &input).await {
        match (&run.output, &run.problem) {
            (_, Some(problem)) => tracing::warn!(command = %run.command, %problem, "PostCompact hook failed"),
            (Some(output), None) => tracing::info!(command = %run.command, %output, "PostCompact hook"),
            (None, None) => {}
        }
    }
}
