//! One handler per `ctx/` method. Each takes its decoded params, queues its command on
//! a session actor before its first `.await` (so the actor sees commands in the order
//! the client sent them), awaits the answer and returns the protocol's result type,
//! written by `crate::wire`.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ctxd_core::compact::Trigger;
use ctxd_core::record::Record;
use ctxd_proto::{self as proto, error_codes};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::oneshot;
use tower_lsp_server::jsonrpc::{Error, ErrorCode};

use super::Backend;
use super::dispatch::{Outgoing, Result, answer_of, internal, invalid_params, rpc_error, with_code};
use super::latency;
use crate::session::{SessionError, Sessions};
use crate::wire;

/// `ctx/append` params, each record's text borrowed from the frame as it was sent: no
/// value tree of it, and the stored line is the text itself.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppendParams<'a> {
    session_id: String,
    #[serde(borrow)]
    records: Vec<&'a RawValue>,
}

/// The same JSON as `proto::AppendParams`, its records left as text.
impl super::dispatch::Wire<proto::AppendParams> for AppendParams<'_> {}

/// An assemble's answer with when its steps happened, logged once it is encoded.
pub struct Assembled {
    result: wire::AssembleResultText,
    /// read, queued, started, built, received.
    instants: [Instant; 5],
    session_id: String,
}

impl Assembled {
    /// The request and a margin for the rest (usage, stages, the envelope).
    pub fn capacity(&self) -> usize {
        self.result.request_len_hint + 4096
    }
}

impl serde::Serialize for Assembled {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        self.result.serialize(serializer)
    }
}

/// Encoded from the assembled request's text; the e2e test
/// `include_snipped_returns_the_scrollback_with_what_the_model_no_longer_sees` reads it
/// back as a `proto::AssembleResult` that writes the same JSON.
impl super::dispatch::Wire<proto::AssembleResult> for Assembled {}

impl Outgoing for Assembled {
    fn encoded(&self, bytes: usize) {
        latency::assemble_steps(&self.session_id, self.instants, bytes);
    }
}

/// The records of an append, admitted one by one; the first one refused refuses them
/// all, with its index and the reason, and nothing is appended.
fn admitted(records: &[&RawValue]) -> Result<Vec<Record>> {
    let mut admitted = Vec::with_capacity(records.len());
    for (i, raw) in records.iter().enumerate() {
        let text = raw.get();
        let refused =
            |why: String| with_code(error_codes::INVALID_RECORD, format!("records[{i}]: {why}; nothing was appended"));
        // Strict JSON is the same rule on every method: a record that breaks it is
        // invalid params. Checked on the way to a refusal only (admitting checks it).
        let not_strict = || ctxd_core::admit::strict_json(text).err();
        let record = if !text.starts_with('{') {
            let e = serde_json::from_str::<serde_json::Map<String, Value>>(text).err();
            let why = e.map_or_else(|| "not an object".to_owned(), |e| super::dispatch::without_position(&e));
            return Err(invalid_params(format!("records[{i}]: {why}")));
        } else if text.contains('\n') {
            // Spread over lines: stored as its compact text, one line.
            let object: serde_json::Map<String, Value> = serde_json::from_str(text)
                .map_err(|e| invalid_params(format!("records[{i}]: {}", super::dispatch::without_position(&e))))?;
            Record::from_object(&object)
        } else {
            Record::parse(text)
        };
        let record = match record {
            Ok(record) => record,
            Err(e) => {
                return Err(match not_strict() {
                    Some(reason) => invalid_params(format!("records[{i}]: {reason}; nothing was appended")),
                    None => refused(e.to_string()),
                });
            }
        };
        let record = ctxd_core::admit::from_client(record).map_err(|e| match e {
            ctxd_core::admit::Refusal::NotStrictJson(reason) => {
                invalid_params(format!("records[{i}]: {reason}; nothing was appended"))
            }
            other => refused(other.to_string()),
        })?;
        admitted.push(record);
    }
    Ok(admitted)
}

/// Cancels a session's compaction when the request waiting for it is dropped unanswered.
struct CancelOnDrop<'a, T> {
    sessions: Option<Arc<Sessions>>,
    session_id: &'a str,
    rx: Option<oneshot::Receiver<T>>,
}

impl<T> Drop for CancelOnDrop<'_, T> {
    fn drop(&mut self) {
        // The receiver goes first, so the session sees the request closed.
        drop(self.rx.take());
        if let Some(sessions) = self.sessions.take() {
            sessions.cancel_compaction(self.session_id);
        }
    }
}

impl Backend {
    /// `$/progress` for a work-done token of this client's request.
    fn progress(&self, token: Option<&serde_json::Value>) -> Option<crate::session::Progress> {
        crate::session::Progress::new(&self.outbound, token)
    }

    pub(super) fn sessions(&self) -> Result<&Arc<Sessions>> {
        // Requests before `initialize` are refused; this covers a failed one.
        self.sessions.get().ok_or_else(|| {
            with_code(error_codes::STORE, "the store is not open: initialize failed or has not run".into())
        })
    }

    pub(super) async fn open_session(
        self: Arc<Self>,
        params: proto::OpenSessionParams,
    ) -> Result<proto::OpenSessionResult> {
        let sessions = self.sessions()?;
        let (id, rx) = sessions.open(&params).map_err(rpc_error)?;
        match answer_of(rx, &id).await {
            Ok(opened) => Ok(wire::opened(id, opened)),
            Err(e) => {
                sessions.forget(&id);
                Err(e)
            }
        }
    }

    /// `ctx/append`: the records are admitted before the future is made (they borrow
    /// from the frame); the command is queued when it is first polled.
    pub(super) fn append(
        self: Arc<Self>,
        params: AppendParams<'_>,
        read: Instant,
    ) -> impl Future<Output = Result<proto::AppendResult>> + Send + use<> {
        let records = admitted(&params.records);
        let session_id = params.session_id;
        async move {
            let records = records?;
            // Stamped before the command is queued: the actor may start on it at once.
            let queued = Instant::now();
            let rx = self.sessions()?.append(&session_id, records).map_err(rpc_error)?;
            let appended = answer_of(rx, &session_id).await?;
            latency::append_steps(&session_id, read, queued, &appended.steps);
            Ok(wire::appended(&appended))
        }
    }

    pub(super) async fn assemble(self: Arc<Self>, params: proto::AssembleParams, read: Instant) -> Result<Assembled> {
        let request = crate::session::actor::AssembleRequest {
            system: params.system,
            tools: params.tools,
            max_tokens: params.max_tokens,
            thinking: params.thinking.map(Value::Object),
            fork: params
                .fork
                .map(|f| ctxd_core::view::Fork { instruction: f.instruction, skip_cache_write: f.skip_cache_write }),
            include_snipped: params.include_snipped,
            since: params.since,
        };
        let session_id = params.session_id;
        let queued = Instant::now();
        let rx = self.sessions()?.assemble(&session_id, request).map_err(rpc_error)?;
        let done = answer_of(rx, &session_id).await?;
        let instants = [read, queued, done.steps.started, done.steps.built, Instant::now()];
        Ok(Assembled { result: wire::assembled(done), instants, session_id })
    }

    pub(super) async fn file_read(self: Arc<Self>, params: proto::FileReadParams) -> Result<proto::FileReadResult> {
        let rx = self
            .sessions()?
            .file_read(&params.session_id, params.path, params.start_line, params.num_lines)
            .map_err(rpc_error)?;
        Ok(wire::file_read(answer_of(rx, &params.session_id).await?))
    }

    pub(super) async fn compact(self: Arc<Self>, params: proto::CompactParams) -> Result<proto::CompactResult> {
        use ctxd_core::compact::SplitDirection;
        let (partial, trigger) = match (params.from, params.up_to) {
            (None, None) => (None, Trigger::Manual),
            (Some(uuid), None) => (Some((SplitDirection::From, uuid)), Trigger::Partial),
            (None, Some(uuid)) => (Some((SplitDirection::UpTo, uuid)), Trigger::Partial),
            (Some(_), Some(_)) => return Err(Error::invalid_params("give `from` or `upTo`, not both")),
        };
        let rx = self
            .sessions()?
            .compact(
                &params.session_id,
                trigger,
                params.instructions,
                self.progress(params.work_done_token.as_ref()),
                partial,
            )
            .map_err(rpc_error)?;
        self.compact_result(&params.session_id, rx).await
    }

    async fn compact_result(
        &self,
        session_id: &str,
        rx: oneshot::Receiver<std::result::Result<crate::session::actor::CompactAnswer, SessionError>>,
    ) -> Result<proto::CompactResult> {
        let sessions = self.sessions()?;
        // `$/cancelRequest` drops this future: the guard tells the session, which stops
        // the compaction (and its provider call) with nothing installed.
        let mut guard = CancelOnDrop { sessions: Some(sessions.clone()), session_id, rx: Some(rx) };
        let outcome = match &mut guard.rx {
            Some(rx) => rx.await.ok(),
            None => None,
        };
        guard.sessions = None;
        let done = match outcome {
            Some(result) => result.map_err(rpc_error)?,
            None => return Err(rpc_error(SessionError::Closed(session_id.to_owned()))),
        };
        let usage_rx = sessions.usage(session_id).map_err(rpc_error)?;
        let usage = usage_rx.await.map_err(|_| rpc_error(SessionError::Closed(session_id.to_owned())))?;
        wire::compacted(done, &usage).map_err(internal)
    }

    pub(super) async fn undo_compact(
        self: Arc<Self>,
        params: proto::UndoCompactParams,
    ) -> Result<proto::UndoCompactResult> {
        let rx = self.sessions()?.undo_compact(&params.session_id).map_err(rpc_error)?;
        Ok(wire::undone(answer_of(rx, &params.session_id).await?))
    }

    pub(super) async fn report_provider_error(
        self: Arc<Self>,
        params: proto::ReportProviderErrorParams,
    ) -> Result<proto::ReportProviderErrorResult> {
        use proto::ProviderErrorAction;
        let sessions = self.sessions()?;
        let Some(refusal) = crate::provider::refusal_of(params.error.status, &params.error.message) else {
            // Validate the session all the same: an unknown id is an error, not "none".
            let rx = sessions.usage(&params.session_id).map_err(rpc_error)?;
            let _ = rx.await;
            return Ok(proto::ReportProviderErrorResult {
                action: ProviderErrorAction::None,
                reason: "not a refusal compaction answers (prompt too long, long-context credits)".to_owned(),
                compact: None,
            });
        };
        let reason = match refusal {
            crate::provider::Refusal::PromptTooLong { tokens, max } => {
                format!("the prompt was {tokens} tokens, over the {max} maximum")
            }
            crate::provider::Refusal::CreditsRequired => "the provider asked for long-context credits".to_owned(),
        };
        let rx = sessions.compact(&params.session_id, Trigger::Reactive, None, None, None).map_err(rpc_error)?;
        match self.compact_result(&params.session_id, rx).await {
            Ok(result) => Ok(proto::ReportProviderErrorResult {
                action: ProviderErrorAction::Compacted,
                reason,
                compact: Some(result),
            }),
            Err(e) if e.code == ErrorCode::ServerError(error_codes::COMPACT_FAILED) => {
                Ok(proto::ReportProviderErrorResult {
                    action: ProviderErrorAction::None,
                    reason: format!("{reason}; {}", e.message),
                    compact: None,
                })
            }
            Err(e) => Err(e),
        }
    }

    pub(super) async fn snip(self: Arc<Self>, params: proto::SnipParams) -> Result<proto::SnipResult> {
        let reduction = crate::session::actor::Reduction::Snip { uuids: params.uuids };
        let rx = self.sessions()?.reduce(&params.session_id, reduction).map_err(rpc_error)?;
        Ok(wire::snipped(answer_of(rx, &params.session_id).await?))
    }

    pub(super) async fn collapse(self: Arc<Self>, params: proto::CollapseParams) -> Result<proto::CollapseResult> {
        let reduction =
            crate::session::actor::Reduction::Collapse { from: params.from, to: params.to, summary: params.summary };
        let rx = self.sessions()?.reduce(&params.session_id, reduction).map_err(rpc_error)?;
        Ok(wire::collapsed(answer_of(rx, &params.session_id).await?))
    }

    /// `ctx/claudeCompact`: compacts a Claude Code session in its own transcript (see
    /// `claude.rs`), the summary by the provider the settings for its project choose;
    /// a refusal is a `COMPACT_FAILED` error that says why, with nothing written.
    pub(super) async fn claude_compact(
        self: Arc<Self>,
        params: proto::ClaudeSessionParams,
    ) -> Result<proto::ClaudeCompactResult> {
        let env = self.options.env.clone();
        let projects = env.claude_projects_dir();
        let path =
            crate::claude::resolve(projects.as_deref(), params.transcript.as_deref(), params.session_id.as_deref())
                .map_err(Error::invalid_params)?;
        let source = crate::claude::SummarySource::Configured(self.sessions()?.claude_settings_for());
        let done = crate::claude::compact(env, path, params.instructions.clone(), source)
            .await
            .map_err(|why| with_code(error_codes::COMPACT_FAILED, why))?;
        let summarizer = crate::wire::summarizer(&done.summarizer).map_err(internal)?;
        Ok(proto::ClaudeCompactResult {
            transcript: done.transcript.display().to_string(),
            session_id: done.plan.session_id,
            boundary: done.plan.boundary_uuid,
            offset: done.offset,
            lines: done.plan.lines.len() as u64,
            pre_tokens: done.plan.pre_tokens,
            post_tokens: done.plan.post_tokens,
            kept: done.plan.kept as u64,
            summarizer,
            problems: done.problems,
        })
    }

    /// `ctx/claudeUndo`: takes ctxd's compaction of a Claude Code session back; a
    /// refusal is a `CANNOT_UNDO` error that says why.
    pub(super) async fn claude_undo(
        self: Arc<Self>,
        params: proto::ClaudeSessionParams,
    ) -> Result<proto::ClaudeUndoResult> {
        let projects = self.options.env.claude_projects_dir();
        let path =
            crate::claude::resolve(projects.as_deref(), params.transcript.as_deref(), params.session_id.as_deref())
                .map_err(Error::invalid_params)?;
        let done = tokio::task::spawn_blocking(move || crate::claude::undo(&path))
            .await
            .map_err(|e| internal(format!("claude undo task failed: {e}")))?
            .map_err(|why| with_code(error_codes::CANNOT_UNDO, why))?;
        Ok(proto::ClaudeUndoResult {
            transcript: done.transcript.display().to_string(),
            offset: done.offset,
            removed_bytes: done.removed_bytes,
        })
    }

    pub(super) async fn observe(self: Arc<Self>, params: proto::ObserveParams) -> Result<proto::ObserveResult> {
        let (path, project) = match (&params.transcript, &params.project_dir) {
            (Some(t), None) => (PathBuf::from(t), false),
            (None, Some(d)) => (PathBuf::from(d), true),
            _ => return Err(Error::invalid_params("give exactly one of `transcript` and `projectDir`")),
        };
        if !path.is_absolute() {
            return Err(Error::invalid_params(format!("the path must be absolute: {:?}", path.display().to_string())));
        }
        let sessions = self.sessions()?;
        let observed = if project { sessions.observe_project(path).await } else { sessions.observe(path).await };
        let (session_id, usage) = observed.map_err(rpc_error)?;
        Ok(proto::ObserveResult { session_id, usage: wire::usage(&usage) })
    }

    pub(super) async fn skill_invoked(
        self: Arc<Self>,
        params: proto::SkillInvokedParams,
    ) -> Result<proto::UsageResult> {
        if params.name.trim().is_empty() {
            return Err(Error::invalid_params("name must not be empty"));
        }
        let marker = serde_json::json!({"name": params.name, "content": params.content});
        self.append_marker(params.session_id, ctxd_core::invoked::SKILL_MARKER, marker).await
    }

    pub(super) async fn set_plan(self: Arc<Self>, params: proto::SetPlanParams) -> Result<proto::UsageResult> {
        if let Some(path) = &params.path
            && !std::path::Path::new(path).is_absolute()
        {
            return Err(Error::invalid_params(format!("path must be absolute: {path:?}")));
        }
        let marker = serde_json::json!({"path": params.path});
        self.append_marker(params.session_id, ctxd_core::invoked::PLAN_MARKER, marker).await
    }

    /// Appends one of ctxd's own state records (never sent to a model) to a session.
    async fn append_marker(&self, session_id: String, kind: &str, fields: Value) -> Result<proto::UsageResult> {
        let mut object = serde_json::Map::new();
        object.insert("type".into(), kind.into());
        object.insert("uuid".into(), uuid::Uuid::new_v4().to_string().into());
        object.insert("timestamp".into(), crate::session::actor::now_rfc3339().into());
        if let Value::Object(fields) = fields {
            object.extend(fields);
        }
        let record = Record::from_object(&object).map_err(|e| rpc_error(SessionError::Internal(e.to_string())))?;
        let rx = self.sessions()?.append(&session_id, vec![record]).map_err(rpc_error)?;
        let appended = answer_of(rx, &session_id).await?;
        Ok(proto::UsageResult { session_id, usage: wire::usage(&appended.usage) })
    }

    pub(super) async fn clear(self: Arc<Self>, params: proto::SessionParams) -> Result<proto::ClearResult> {
        let sessions = self.sessions()?;
        let (id, rx) = sessions.clear(&params.session_id).map_err(rpc_error)?;
        let opened = answer_of(rx, &id).await?;
        Ok(proto::ClearResult { session_id: id, usage: wire::usage(&opened.usage) })
    }

    pub(super) async fn context(self: Arc<Self>, params: proto::SessionParams) -> Result<proto::ContextResult> {
        let rx = self.sessions()?.context(&params.session_id).map_err(rpc_error)?;
        let view = rx.await.map_err(|_| rpc_error(SessionError::Closed(params.session_id.clone())))?;
        Ok(wire::context(params.session_id, view))
    }

    pub(super) async fn usage(self: Arc<Self>, params: proto::SessionParams) -> Result<proto::UsageResult> {
        let rx = self.sessions()?.usage(&params.session_id).map_err(rpc_error)?;
        let usage = rx.await.map_err(|_| rpc_error(SessionError::Closed(params.session_id.clone())))?;
        Ok(proto::UsageResult { session_id: params.session_id, usage: wire::usage(&usage) })
    }

    pub(super) async fn set_auto_compact_window(
        self: Arc<Self>,
        params: proto::SetAutoCompactWindowParams,
    ) -> Result<proto::SetAutoCompactWindowResult> {
        let window = match params.window {
            proto::WindowChoice::Tokens(n) => Some(n),
            proto::WindowChoice::Auto(_) => None,
        };
        let (resolved, source) = self.sessions()?.set_auto_compact_window(&params.model, window).map_err(rpc_error)?;
        let (adjustment, reason) = window_adjustment(window, resolved.window, resolved.model.context_window, source);
        Ok(proto::SetAutoCompactWindowResult {
            window: resolved.window,
            source,
            warnings: resolved.warnings,
            requested: window,
            model_window: resolved.model.context_window,
            adjustment,
            reason,
            model: params.model,
        })
    }

    pub(super) async fn close_session(self: Arc<Self>, params: proto::SessionParams) -> Result<()> {
        let rx = self.sessions()?.close(&params.session_id).map_err(rpc_error)?;
        rx.await.map_err(|_| rpc_error(SessionError::Closed(params.session_id)))?;
        Ok(())
    }
}

/// How a window in force differs from the one a client asked for, and why, for the
/// `ctx/setAutoCompactWindow` answer: `(None, None)` when it is the same, or for `"auto"`.
fn window_adjustment(
    requested: Option<u64>,
    window: u64,
    model_window: u64,
    source: proto::WindowSource,
) -> (Option<proto::WindowAdjustment>, Option<String>) {
    use ctxd_core::budget::{MAX_CONFIGURED_WINDOW, MIN_CONFIGURED_WINDOW};
    use proto::WindowAdjustment::{CappedToModel, LoweredToCeiling, Overridden, RaisedToFloor};
    let Some(requested) = requested else { return (None, None) };
    if requested == window {
        return (None, None);
    }
    if source != proto::WindowSource::Setting {
        let source = source.as_str();
        let why = format!("the {source} window ({window} tokens) takes precedence over the saved one");
        return (Some(Overridden), Some(why));
    }
    if requested < MIN_CONFIGURED_WINDOW {
        let why = format!("{requested} is below the smallest window ctxd plans with ({MIN_CONFIGURED_WINDOW} tokens)");
        return (Some(RaisedToFloor), Some(why));
    }
    if requested > model_window && window == model_window {
        let why = format!("the model accepts at most {model_window} tokens; {requested} is more than it can take");
        return (Some(CappedToModel), Some(why));
    }
    if requested > MAX_CONFIGURED_WINDOW {
        let why = format!("{requested} is above the largest window ctxd plans with ({MAX_CONFIGURED_WINDOW} tokens)");
        return (Some(LoweredToCeiling), Some(why));
    }
    (Some(Overridden), Some(format!("another setting decides the window ({window} tokens)")))
}
