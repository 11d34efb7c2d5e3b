//! The protocol surface: a table of contents of the methods ctxd answers.
//!
//! Each `ctx/` handler decodes its params, queues one command on a session actor
//! (synchronously, before any `.await`), awaits the answer and encodes it. Errors are
//! mapped to JSON-RPC errors in one function, [`rpc_error`].

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use ctxd_core::budget::EnvConfig;
use ctxd_core::compact::{Trigger, UndoError};
use ctxd_core::ledger::ReadOutcome;
use ctxd_core::record::Record;
use ctxd_proto::{self as proto, error_codes, methods};
use serde_json::Value;
use tokio::sync::oneshot;
use tower_lsp_server::jsonrpc::{Error, ErrorCode, Result};
use tower_lsp_server::ls_types::{
    DidChangeConfigurationParams, InitializeParams, InitializeResult, InitializedParams, ServerCapabilities, ServerInfo,
};
use tower_lsp_server::{LanguageServer, LspService};

use crate::session::{Environment, Notifier, SessionError, Sessions};
use crate::settings::SettingsSources;
use crate::store::{Store, StoreError};

/// Options the daemon was started with.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// State directory unless `initializationOptions.stateDir` says otherwise.
    pub state_dir: PathBuf,
}

/// The language server.
#[derive(Debug)]
pub struct Backend {
    outbound: crate::transport::Outbound,
    options: ServeOptions,
    sessions: Arc<OnceLock<Arc<Sessions>>>,
}

/// The daemon's parts for the transport to serve.
pub struct Daemon {
    pub service: LspService<Backend>,
    pub socket: tower_lsp_server::ClientSocket,
    /// `ctx/append` and `ctx/assemble` before the service, on the same sessions.
    pub fast: Arc<dyn crate::transport::FastPath>,
    /// Where the sessions' notifications and every answer leave, in one order.
    pub outflow: crate::transport::Outflow,
}

/// Builds the LSP service with every `ctx/` method registered, and the fast paths for
/// `ctx/append` and `ctx/assemble` that share its sessions.
pub fn service(options: ServeOptions) -> Daemon {
    let shared: Arc<OnceLock<Arc<Sessions>>> = Arc::default();
    let fast: Arc<dyn crate::transport::FastPath> = Arc::new(FastPaths { sessions: shared.clone() });
    let (outbound, outflow) = crate::transport::Outbound::channel();
    // Notifications leave through `outbound`, not tower-lsp's `Client`, so that they share
    // one queue with the answers (see `transport::Outbound`).
    let (service, socket) = LspService::build(|_client| Backend { outbound, options, sessions: shared })
        .custom_method(methods::OPEN_SESSION, Backend::open_session)
        .custom_method(methods::APPEND, Backend::append)
        .custom_method(methods::USAGE, Backend::usage)
        .custom_method(methods::CLOSE_SESSION, Backend::close_session)
        .custom_method(methods::SET_AUTO_COMPACT_WINDOW, Backend::set_auto_compact_window)
        .custom_method(methods::FILE_READ, Backend::file_read)
        .custom_method(methods::CONTEXT, Backend::context)
        .custom_method(methods::COMPACT, Backend::compact)
        .custom_method(methods::UNDO_COMPACT, Backend::undo_compact)
        .custom_method(methods::CLAUDE_COMPACT, Backend::claude_compact)
        .custom_method(methods::CLAUDE_UNDO, Backend::claude_undo)
        .custom_method(methods::REPORT_PROVIDER_ERROR, Backend::report_provider_error)
        .custom_method(methods::CLEAR, Backend::clear)
        .custom_method(methods::ASSEMBLE, Backend::assemble)
        .custom_method(methods::SNIP, Backend::snip)
        .custom_method(methods::COLLAPSE, Backend::collapse)
        .custom_method(methods::OBSERVE, Backend::observe)
        .custom_method(methods::SKILL_INVOKED, Backend::skill_invoked)
        .custom_method(methods::SET_PLAN, Backend::set_plan)
        .finish();
    Daemon { service, socket, fast, outflow }
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

/// The two per-turn methods without the service's JSON passes.
///
/// `ctx/append`: each record's text is borrowed from the frame as it was sent (no value
/// tree, no re-serialization). `ctx/assemble`: params decoded straight into their type,
/// and the answer encoded in one pass around the request text the actor produced.
/// Anything unusual (a record spread over lines, an invalid record or params, a session
/// that is not open, no store yet) is declined and takes the service's path, which
/// answers with the right error.
struct FastPaths {
    sessions: Arc<OnceLock<Arc<Sessions>>>,
}

/// A JSON-RPC request frame with typed params, borrowed from the frame where it can be.
#[derive(serde::Deserialize)]
struct Frame<'a, P> {
    #[serde(borrow)]
    jsonrpc: &'a str,
    id: Option<tower_lsp_server::jsonrpc::Id>,
    #[serde(borrow)]
    method: &'a str,
    params: P,
}

impl<'a, P: serde::Deserialize<'a>> Frame<'a, P> {
    /// The frame, if it is a request for `method` with params of type `P`.
    fn parse(body: &'a str, method: &str) -> Option<(tower_lsp_server::jsonrpc::Id, P)> {
        let frame: Frame<'a, P> = serde_json::from_str(body).ok()?;
        (frame.jsonrpc == "2.0" && frame.method == method).then_some(())?;
        Some((frame.id?, frame.params))
    }
}

impl crate::transport::FastPath for FastPaths {
    fn take(&self, body: &str) -> Option<crate::transport::FastReply> {
        if body.contains("\"ctx/append\"")
            && let Some(reply) = self.append(body)
        {
            return Some(reply);
        }
        if body.contains("\"ctx/assemble\"") {
            return self.assemble(body);
        }
        None
    }
}

impl FastPaths {
    fn append(&self, body: &str) -> Option<crate::transport::FastReply> {
        use futures::FutureExt;
        use serde_json::value::RawValue;

        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Params<'a> {
            session_id: String,
            #[serde(borrow)]
            records: Vec<&'a RawValue>,
        }
        let read = std::time::Instant::now();
        if nested_deeper_than(body, MAX_NESTING) {
            return None;
        }
        let (id, params) = Frame::<Params<'_>>::parse(body, methods::APPEND)?;
        let sessions = self.sessions.get()?.clone();
        let mut records = Vec::with_capacity(params.records.len());
        for raw in params.records {
            let text = raw.get();
            if text.contains('\n') {
                return None;
            }
            // A record ctxd refuses takes the service's path, which names the reason.
            records.push(ctxd_core::admit::from_client(Record::parse(text).ok()?).ok()?);
        }
        let session_id = params.session_id;
        // Not open and not in the store: the service's path gives the error.
        if sessions.is_unknown(&session_id) {
            return None;
        }
        let answer_id = id.clone();
        let reply = async move {
            // Stamped before the command is queued: the actor may start on it before
            // this thread runs again.
            let queued = std::time::Instant::now();
            let result = match sessions.append(&session_id, records) {
                Ok(rx) => {
                    let result = answer(rx, &session_id).await;
                    if let Ok(appended) = &result {
                        log_append_steps(&session_id, read, queued, &appended.steps);
                    }
                    result
                }
                Err(e) => Err(rpc_error(e)),
            };
            let result = result.map(|a| proto::AppendResult {
                appended: a.appended,
                duplicates: a.duplicates,
                records: a.records,
                usage: a.usage.to_proto(),
            });
            // An append's answer (counts and usage) is well under 1 KB.
            Some(encoded(answer_id, result, 1024))
        }
        .boxed();
        Some(crate::transport::FastReply { id, method: methods::APPEND, reply, cancellable: false })
    }

    fn assemble(&self, body: &str) -> Option<crate::transport::FastReply> {
        use futures::FutureExt;
        let read = std::time::Instant::now();

        // Params nested past serde_json's recursion limit fail here and are declined.
        let (id, params) = Frame::<proto::AssembleParams>::parse(body, methods::ASSEMBLE)?;
        let sessions = self.sessions.get()?.clone();
        if sessions.is_unknown(&params.session_id) {
            return None;
        }
        let answer_id = id.clone();
        let reply = async move {
            let (session_id, request) = assemble_request(params);
            let queued = std::time::Instant::now();
            let mut steps = None;
            let result = match sessions.assemble(&session_id, request) {
                Ok(rx) => answer(rx, &session_id).await.map(|done| {
                    steps = Some((done.steps, std::time::Instant::now()));
                    AssembleResultText::from(done)
                }),
                Err(e) => Err(rpc_error(e)),
            };
            // The request and a margin for the rest (usage, stages, the envelope).
            let capacity = result.as_ref().map_or(0, |r| r.request_len_hint) + 4096;
            let answer = encoded(answer_id, result, capacity);
            if let (Some((steps, received)), crate::transport::Answer::Encoded(body)) = (steps, &answer) {
                log_assemble_steps(&session_id, [read, queued, steps.started, steps.built, received], body.len());
            }
            Some(answer)
        }
        .boxed();
        // An assemble waits for a compaction at the blocked level; a host may give up.
        Some(crate::transport::FastReply { id, method: methods::ASSEMBLE, reply, cancellable: true })
    }
}

/// Where a fast-path append's time went inside the daemon, at debug level on target
/// `ctxd::latency` (`CTXD_LOG=info,ctxd::latency=debug`), in µs: from the frame read to
/// just before the command is queued (`parse`), to the actor (`to_actor`), to a
/// blocking thread (`to_write`), the write and `sync_data` (`write_sync`), back to the
/// actor (`to_resume`), into the view (`apply`), to this task (`to_reply`), and all of
/// it (`in_daemon`). `read_unix_us` is when the frame was read, for a client to line up
/// with its own clock (the load benchmark does).
fn log_append_steps(
    session: &str,
    read: std::time::Instant,
    queued: std::time::Instant,
    steps: &crate::session::actor::AppendSteps,
) {
    if !tracing::enabled!(target: "ctxd::latency", tracing::Level::DEBUG) {
        return;
    }
    let done = std::time::Instant::now();
    tracing::debug!(
        target: "ctxd::latency",
        session,
        read_unix_us = unix_us(read, done),
        parse = micros(read, queued),
        to_actor = micros(queued, steps.commit_started),
        to_write = micros(steps.commit_started, steps.write_started),
        write_sync = micros(steps.write_started, steps.synced),
        to_resume = micros(steps.synced, steps.resumed),
        apply = micros(steps.resumed, steps.answered),
        to_reply = micros(steps.answered, done),
        in_daemon = micros(read, done),
        "append steps"
    );
}

/// Where a fast-path assemble's time went inside the daemon, as [`log_append_steps`]
/// for an append, in µs: from the frame read to the command queued (`parse`), to the
/// actor building the request (`to_actor`: a wait for a compaction at the blocked level
/// counts here), building it (`build`), to this task (`to_reply`), the answer's
/// encoding, the request's JSON included (`encode`), all of it (`in_daemon`), and the
/// answer's `bytes`.
/// `instants`: read, queued, started, built, received.
fn log_assemble_steps(session: &str, instants: [std::time::Instant; 5], bytes: usize) {
    if !tracing::enabled!(target: "ctxd::latency", tracing::Level::DEBUG) {
        return;
    }
    let done = std::time::Instant::now();
    let [read, queued, started, built, received] = instants;
    tracing::debug!(
        target: "ctxd::latency",
        session,
        read_unix_us = unix_us(read, done),
        parse = micros(read, queued),
        to_actor = micros(queued, started),
        build = micros(started, built),
        to_reply = micros(built, received),
        encode = micros(received, done),
        in_daemon = micros(read, done),
        bytes,
        "assemble steps"
    );
}

/// Microseconds from `from` to `to` (0 if `to` is earlier).
fn micros(from: std::time::Instant, to: std::time::Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_micros()).unwrap_or(u64::MAX)
}

/// The Unix time of `then`, in µs, given that `now` is the present instant.
fn unix_us(then: std::time::Instant, now: std::time::Instant) -> u64 {
    let now_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(now_unix.saturating_sub(now.saturating_duration_since(then)).as_micros()).unwrap_or(0)
}

/// A fast path's answer: the result encoded in one pass into a buffer of `capacity`
/// bytes to start with, or the error as the service would send it.
fn encoded<T: serde::Serialize>(
    id: tower_lsp_server::jsonrpc::Id,
    result: Result<T>,
    capacity: usize,
) -> crate::transport::Answer {
    use crate::transport::Answer;
    use tower_lsp_server::jsonrpc::Response;
    match result.and_then(|r| crate::transport::encode_result(&id, &r, capacity).map_err(|e| internal(e.to_string()))) {
        Ok(body) => Answer::Encoded(body),
        Err(e) => Answer::Response(Response::from_error(id, e)),
    }
}

/// What the actor needs from `ctx/assemble` params, and the session they name.
fn assemble_request(params: proto::AssembleParams) -> (String, crate::session::actor::AssembleRequest) {
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
    (params.session_id, request)
}

/// [`proto::AssembleResult`] with the request as the pipeline built it, encoded straight
/// into the answer rather than through a value tree.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct AssembleResultText {
    request: ctxd_core::view::Request,
    /// About how long `request` is as JSON (see [`crate::session::actor::AssembleAnswer`]).
    #[serde(skip)]
    request_len_hint: usize,
    revision: String,
    messages_from: u64,
    request_tokens: u64,
    usage: proto::Usage,
    applied: Vec<proto::AppliedStage>,
    decision: proto::Decision,
    #[serde(skip_serializing_if = "Option::is_none")]
    scrollback: Option<proto::scrollback::Scrollback>,
}

impl From<crate::session::actor::AssembleAnswer> for AssembleResultText {
    fn from(done: crate::session::actor::AssembleAnswer) -> AssembleResultText {
        AssembleResultText {
            request: done.request,
            request_len_hint: done.request_len_hint,
            revision: done.revision,
            messages_from: done.messages_from as u64,
            request_tokens: done.request_tokens,
            usage: done.usage.to_proto(),
            applied: done
                .applied
                .into_iter()
                .map(|a| proto::AppliedStage {
                    stage: crate::wire::stage(a.stage),
                    acted: a.acted,
                    tokens_freed: a.tokens_freed,
                    detail: a.detail,
                })
                .collect(),
            decision: if done.compact { proto::Decision::Compact } else { proto::Decision::Continue },
            scrollback: done.scrollback.map(wire_scrollback),
        }
    }
}

/// The scrollback as the protocol has it (the core's type, field for field).
fn wire_scrollback(core: ctxd_core::view::Scrollback) -> proto::scrollback::Scrollback {
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

impl AssembleResultText {
    /// The protocol type, for the service's path (the request as a value tree).
    fn into_proto(self) -> proto::AssembleResult {
        proto::AssembleResult {
            request: self.request.to_value(),
            revision: self.revision,
            messages_from: self.messages_from,
            request_tokens: self.request_tokens,
            usage: self.usage,
            applied: self.applied,
            decision: self.decision,
            scrollback: self.scrollback,
        }
    }
}

/// Deepest nesting serde_json reads into a value tree (its recursion limit is 128).
/// Borrowed records skip that limit, so the fast path declines deeper frames to the
/// service, which refuses them as invalid JSON.
const MAX_NESTING: usize = 127;

/// Whether the JSON `text` nests arrays and objects deeper than `limit` (brackets inside
/// strings do not count).
fn nested_deeper_than(text: &str, limit: usize) -> bool {
    let bytes = text.as_bytes();
    // Fewer opening brackets than the limit cannot nest deeper than it.
    if bytes.iter().filter(|b| matches!(b, b'{' | b'[')).count() <= limit {
        return false;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

impl LanguageServer for Backend {
    async fn initialize(&self, params: InitializeParams) -> Result<InitializeResult> {
        let options: proto::InitializationOptions = match params.initialization_options {
            None | Some(Value::Null) => proto::InitializationOptions::default(),
            Some(value) => serde_json::from_value(value)
                .map_err(|e| Error::invalid_params(format!("initializationOptions: {e}")))?,
        };
        let state_dir = options.state_dir.as_ref().map_or_else(|| self.options.state_dir.clone(), PathBuf::from);
        let dir = state_dir.clone();
        let store = tokio::task::spawn_blocking(move || Store::open(&dir))
            .await
            .map_err(|e| internal(format!("opening the store: {e}")))?
            .map_err(store_error)?;
        let degraded = store.index().degraded.as_ref().map(|reason| {
            format!("the store's index cannot be written ({reason}); a temporary one is used, and appends fail until the disk has room")
        });
        if store.index().fresh && !store.session_ids().unwrap_or_default().is_empty() {
            tracing::info!("index is new; session entries will be rebuilt from the transcripts as sessions open");
        }
        let (env, warnings) = EnvConfig::from_vars(std::env::vars());
        for warning in warnings {
            tracing::warn!(%warning, "ignoring an invalid environment variable");
        }
        let client = crate::settings::client_layer("initializationOptions.settings", options.settings.as_ref());
        for problem in &client.problems {
            tracing::warn!(%problem, "settings");
        }
        let environment = Environment {
            env,
            client_window: options.auto_compact_window,
            client_settings: client.settings,
            sources: SettingsSources::standard(&state_dir),
            services: crate::session::Services::start(),
        };
        let sessions = Arc::new(Sessions::new(Arc::new(store), environment, Notifier::new(self.outbound.clone())));
        if self.sessions.set(sessions.clone()).is_err() {
            return Err(Error::invalid_request());
        }
        // Notifications reach the client from a successful `initialize` on (as with
        // tower-lsp's `Client`); no session exists before it to send one.
        self.outbound.start_notifications();

        tracing::info!(state_dir = %state_dir.display(), "initialized");
        let capabilities = proto::CtxdCapabilities {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            protocol: 1,
            methods: methods::REQUESTS.iter().map(|m| (*m).to_owned()).collect(),
            notifications: methods::NOTIFICATIONS.iter().map(|m| (*m).to_owned()).collect(),
            state_dir: state_dir.display().to_string(),
            process_id: std::process::id(),
            degraded: degraded.clone(),
        };
        let experimental = serde_json::json!({ "ctxd": capabilities });
        Ok(InitializeResult {
            capabilities: ServerCapabilities { experimental: Some(experimental), ..ServerCapabilities::default() },
            server_info: Some(ServerInfo {
                name: "ctxd".to_owned(),
                version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            }),
            ..InitializeResult::default()
        })
    }

    async fn initialized(&self, _: InitializedParams) {
        tracing::debug!("client initialized");
        if let Ok(sessions) = self.sessions()
            && sessions.daemon_settings().observe_claude_projects == Some(true)
            && let Some(root) = sessions.claude_projects_dir()
        {
            tracing::info!(root = %root.display(), "observing Claude Code projects");
            sessions.follow_claude_projects(root);
        }
    }

    async fn did_change_configuration(&self, params: DidChangeConfigurationParams) {
        let Ok(sessions) = self.sessions() else { return };
        let object = match &params.settings {
            Value::Object(map) => Some(map.clone()),
            Value::Null => None,
            Value::Array(items) if items.is_empty() => None,
            other => {
                tracing::warn!(settings = %other, "didChangeConfiguration: settings must be an object; ignored");
                return;
            }
        };
        let layer = crate::settings::client_layer("workspace/didChangeConfiguration", object.as_ref());
        for problem in &layer.problems {
            tracing::warn!(%problem, "settings");
        }
        sessions.settings_changed(layer.settings);
    }

    async fn shutdown(&self) -> Result<()> {
        if let Some(sessions) = self.sessions.get() {
            sessions.close_all().await;
        }
        tracing::info!("shutdown");
        Ok(())
    }
}

impl Backend {
    fn sessions(&self) -> Result<&Arc<Sessions>> {
        // The service refuses requests before `initialize`; this covers a failed one.
        self.sessions.get().ok_or_else(|| {
            let mut e = Error::new(ErrorCode::ServerError(error_codes::STORE));
            e.message = "the store is not open: initialize failed or has not run".into();
            e
        })
    }

    pub async fn open_session(&self, params: Value) -> Result<proto::OpenSessionResult> {
        let params: proto::OpenSessionParams = params_of(params)?;
        let sessions = self.sessions()?;
        let (id, rx) = sessions.open(&params).map_err(rpc_error)?;
        let opened = match answer(rx, &id).await {
            Ok(opened) => opened,
            Err(e) => {
                sessions.forget(&id);
                return Err(e);
            }
        };
        Ok(proto::OpenSessionResult {
            session_id: id,
            resumed: opened.resumed,
            records: opened.records,
            diagnostics: opened.diagnostics,
            usage: opened.usage.to_proto(),
        })
    }

    pub async fn append(&self, params: Value) -> Result<proto::AppendResult> {
        let params: proto::AppendParams = params_of(params)?;
        let sessions = self.sessions()?;
        let mut records = Vec::with_capacity(params.records.len());
        for (i, object) in params.records.iter().enumerate() {
            let refused = |why: String| {
                let mut err = Error::new(ErrorCode::ServerError(error_codes::INVALID_RECORD));
                err.message = format!("records[{i}]: {why}; nothing was appended").into();
                err
            };
            let record = Record::from_object(object).map_err(|e| refused(e.to_string()))?;
            let record = ctxd_core::admit::from_client(record).map_err(|e| refused(e.to_string()))?;
            records.push(record);
        }
        let rx = sessions.append(&params.session_id, records).map_err(rpc_error)?;
        let appended = answer(rx, &params.session_id).await?;
        Ok(proto::AppendResult {
            appended: appended.appended,
            duplicates: appended.duplicates,
            records: appended.records,
            usage: appended.usage.to_proto(),
        })
    }

    pub async fn file_read(&self, params: Value) -> Result<proto::FileReadResult> {
        let params: proto::FileReadParams = params_of(params)?;
        let rx = self
            .sessions()?
            .file_read(&params.session_id, params.path, params.start_line, params.num_lines)
            .map_err(rpc_error)?;
        let answer = answer(rx, &params.session_id).await?;
        let (already_read, unchanged) = match answer.outcome {
            ReadOutcome::New => (false, false),
            ReadOutcome::Reread { unchanged } => (true, unchanged),
        };
        let e = answer.entry;
        Ok(proto::FileReadResult {
            path: e.path,
            already_read,
            unchanged,
            reads: e.reads,
            start_line: e.start_line,
            num_lines: e.num_lines,
            total_lines: e.total_lines,
            tokens: e.tokens,
        })
    }

    pub async fn compact(&self, params: Value) -> Result<proto::CompactResult> {
        let params: proto::CompactParams = params_of(params)?;
        use ctxd_core::compact::SplitDirection;
        let (partial, trigger) = match (params.from, params.up_to) {
            (None, None) => (None, Trigger::Manual),
            (Some(uuid), None) => (Some((SplitDirection::From, uuid)), Trigger::Partial),
            (None, Some(uuid)) => (Some((SplitDirection::UpTo, uuid)), Trigger::Partial),
            (Some(_), Some(_)) => return Err(Error::invalid_params("give `from` or `upTo`, not both")),
        };
        let rx = self
            .sessions()?
            .compact(&params.session_id, trigger, params.instructions, params.work_done_token.as_ref(), partial)
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
        Ok(proto::CompactResult {
            boundary: done.boundary,
            trigger: crate::wire::trigger(done.trigger),
            pre_tokens: done.pre_tokens,
            post_tokens: done.post_tokens,
            summary: done.summary,
            summarizer: crate::wire::summarizer(&done.summarizer).map_err(internal)?,
            summary_path: done.summarizer.path.map(crate::wire::summary_path),
            fidelity_appended: done.fidelity_appended as u64,
            problems: done.problems,
            usage: usage.to_proto(),
        })
    }

    pub async fn undo_compact(&self, params: Value) -> Result<proto::UndoCompactResult> {
        let params: proto::UndoCompactParams = params_of(params)?;
        let rx = self.sessions()?.undo_compact(&params.session_id).map_err(rpc_error)?;
        let done = answer(rx, &params.session_id).await?;
        Ok(proto::UndoCompactResult {
            boundary: done.boundary,
            undo_record: done.undo_record,
            pre_tokens: done.pre_tokens,
            post_tokens: done.post_tokens,
            usage: done.usage.to_proto(),
        })
    }

    pub async fn report_provider_error(&self, params: Value) -> Result<proto::ReportProviderErrorResult> {
        let params: proto::ReportProviderErrorParams = params_of(params)?;
        let sessions = self.sessions()?;
        let Some(refusal) = crate::provider::refusal_of(params.error.status, &params.error.message) else {
            // Validate the session all the same: an unknown id is an error, not "none".
            let rx = sessions.usage(&params.session_id).map_err(rpc_error)?;
            let _ = rx.await;
            return Ok(proto::ReportProviderErrorResult {
                action: proto::ProviderErrorAction::None,
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
                action: proto::ProviderErrorAction::Compacted,
                reason,
                compact: Some(result),
            }),
            Err(e) if e.code == ErrorCode::ServerError(error_codes::COMPACT_FAILED) => {
                Ok(proto::ReportProviderErrorResult {
                    action: proto::ProviderErrorAction::None,
                    reason: format!("{reason}; {}", e.message),
                    compact: None,
                })
            }
            Err(e) => Err(e),
        }
    }

    pub async fn assemble(&self, params: Value) -> Result<proto::AssembleResult> {
        let params: proto::AssembleParams = params_of(params)?;
        let (session_id, request) = assemble_request(params);
        let rx = self.sessions()?.assemble(&session_id, request).map_err(rpc_error)?;
        Ok(AssembleResultText::from(answer(rx, &session_id).await?).into_proto())
    }

    pub async fn snip(&self, params: Value) -> Result<proto::SnipResult> {
        let params: proto::SnipParams = params_of(params)?;
        let reduction = crate::session::actor::Reduction::Snip { uuids: params.uuids };
        let rx = self.sessions()?.reduce(&params.session_id, reduction).map_err(rpc_error)?;
        let done = answer(rx, &params.session_id).await?;
        Ok(proto::SnipResult { tokens_freed: done.tokens_freed, unknown: done.unknown, usage: done.usage.to_proto() })
    }

    pub async fn collapse(&self, params: Value) -> Result<proto::CollapseResult> {
        let params: proto::CollapseParams = params_of(params)?;
        let reduction =
            crate::session::actor::Reduction::Collapse { from: params.from, to: params.to, summary: params.summary };
        let rx = self.sessions()?.reduce(&params.session_id, reduction).map_err(rpc_error)?;
        let done = answer(rx, &params.session_id).await?;
        Ok(proto::CollapseResult {
            collapse_id: done.record_uuid,
            tokens_freed: done.tokens_freed,
            usage: done.usage.to_proto(),
        })
    }

    /// `ctx/claudeCompact`: compacts a Claude Code session in its own transcript (see
    /// `claude.rs`); a refusal is a `COMPACT_FAILED` error that says why, with nothing
    /// written.
    pub async fn claude_compact(&self, params: Value) -> Result<proto::ClaudeCompactResult> {
        let params: proto::ClaudeSessionParams = params_of(params)?;
        let path = crate::claude::resolve(params.transcript.as_deref(), params.session_id.as_deref())
            .map_err(Error::invalid_params)?;
        let instructions = params.instructions.clone();
        let done = tokio::task::spawn_blocking(move || crate::claude::compact(&path, instructions.as_deref()))
            .await
            .map_err(|e| internal(format!("claude compact task failed: {e}")))?
            .map_err(|why| with_code(error_codes::COMPACT_FAILED, why))?;
        Ok(proto::ClaudeCompactResult {
            transcript: done.transcript.display().to_string(),
            session_id: done.plan.session_id,
            boundary: done.plan.boundary_uuid,
            offset: done.offset,
            lines: done.plan.lines.len() as u64,
            pre_tokens: done.plan.pre_tokens,
            post_tokens: done.plan.post_tokens,
            kept: done.plan.kept as u64,
        })
    }

    /// `ctx/claudeUndo`: takes ctxd's compaction of a Claude Code session back; a
    /// refusal is a `CANNOT_UNDO` error that says why.
    pub async fn claude_undo(&self, params: Value) -> Result<proto::ClaudeUndoResult> {
        let params: proto::ClaudeSessionParams = params_of(params)?;
        let path = crate::claude::resolve(params.transcript.as_deref(), params.session_id.as_deref())
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

    pub async fn observe(&self, params: Value) -> Result<proto::ObserveResult> {
        let params: proto::ObserveParams = params_of(params)?;
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
        Ok(proto::ObserveResult { session_id, usage: usage.to_proto() })
    }

    pub async fn skill_invoked(&self, params: Value) -> Result<proto::UsageResult> {
        let params: proto::SkillInvokedParams = params_of(params)?;
        if params.name.trim().is_empty() {
            return Err(Error::invalid_params("name must not be empty"));
        }
        let marker = serde_json::json!({"name": params.name, "content": params.content});
        self.append_marker(params.session_id, ctxd_core::invoked::SKILL_MARKER, marker).await
    }

    pub async fn set_plan(&self, params: Value) -> Result<proto::UsageResult> {
        let params: proto::SetPlanParams = params_of(params)?;
        if let Some(path) = &params.path
            && !std::path::Path::new(path).is_absolute()
        {
            return Err(Error::invalid_params(format!("path must be absolute: {path:?}")));
        }
        let marker = serde_json::json!({"path": params.path});
        self.append_marker(params.session_id, ctxd_core::invoked::PLAN_MARKER, marker).await
    }

    /// Appends one of ctxd's own state records (never sent to a model) to a session.
    async fn append_marker(
        &self,
        session_id: String,
        kind: &str,
        fields: serde_json::Value,
    ) -> Result<proto::UsageResult> {
        let mut object = serde_json::Map::new();
        object.insert("type".into(), kind.into());
        object.insert("uuid".into(), uuid::Uuid::new_v4().to_string().into());
        object.insert("timestamp".into(), crate::session::actor::now_rfc3339().into());
        if let serde_json::Value::Object(fields) = fields {
            object.extend(fields);
        }
        let record = Record::from_object(&object).map_err(|e| rpc_error(SessionError::Internal(e.to_string())))?;
        let rx = self.sessions()?.append(&session_id, vec![record]).map_err(rpc_error)?;
        let appended = answer(rx, &session_id).await?;
        Ok(proto::UsageResult { session_id, usage: appended.usage.to_proto() })
    }

    pub async fn clear(&self, params: Value) -> Result<proto::ClearResult> {
        let params: proto::SessionParams = params_of(params)?;
        let sessions = self.sessions()?;
        let (id, rx) = sessions.clear(&params.session_id).map_err(rpc_error)?;
        let opened = answer(rx, &id).await?;
        Ok(proto::ClearResult { session_id: id, usage: opened.usage.to_proto() })
    }

    pub async fn context(&self, params: Value) -> Result<proto::ContextResult> {
        let params: proto::SessionParams = params_of(params)?;
        let rx = self.sessions()?.context(&params.session_id).map_err(rpc_error)?;
        let view = rx.await.map_err(|_| rpc_error(SessionError::Closed(params.session_id.clone())))?;
        let usage = view.usage.to_proto();
        let pending_rules = view
            .memory_files
            .iter()
            .filter(|f| f.status == ctxd_core::memory::Status::Pending && !f.rule_paths.is_empty())
            .map(|f| proto::PendingRule { path: f.path.display().to_string(), paths: f.rule_paths.clone() })
            .collect();
        Ok(proto::ContextResult {
            session_id: params.session_id,
            usage,
            memory_files: view
                .memory_files
                .into_iter()
                .map(|f| proto::MemoryFile {
                    path: f.path.display().to_string(),
                    kind: crate::wire::memory_kind(f.kind),
                    tokens: f.tokens,
                    status: crate::wire::memory_status(f.status),
                })
                .collect(),
            pending_rules,
            diagnostics: view.diagnostics,
            files_read: view.files_read as u64,
            stale_files: view.stale_files,
            git: view.git,
            prepared_ahead: view.prepared_ahead,
        })
    }

    pub async fn usage(&self, params: Value) -> Result<proto::UsageResult> {
        let params: proto::SessionParams = params_of(params)?;
        let rx = self.sessions()?.usage(&params.session_id).map_err(rpc_error)?;
        let usage = rx.await.map_err(|_| rpc_error(SessionError::Closed(params.session_id.clone())))?;
        Ok(proto::UsageResult { session_id: params.session_id, usage: usage.to_proto() })
    }

    pub async fn set_auto_compact_window(&self, params: Value) -> Result<proto::SetAutoCompactWindowResult> {
        let params: proto::SetAutoCompactWindowParams = params_of(params)?;
        let window = match params.window {
            proto::WindowChoice::Tokens(n) => Some(n),
            proto::WindowChoice::Auto(_) => None,
        };
        let (resolved, source) = self.sessions()?.set_auto_compact_window(&params.model, window).map_err(rpc_error)?;
        let source = crate::wire::window_source(source);
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

    pub async fn close_session(&self, params: Value) -> Result<Value> {
        let params: proto::SessionParams = params_of(params)?;
        let rx = self.sessions()?.close(&params.session_id).map_err(rpc_error)?;
        rx.await.map_err(|_| rpc_error(SessionError::Closed(params.session_id)))?;
        Ok(Value::Null)
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

/// Awaits an actor's answer to a command that can fail.
/// Typed params from a request's JSON, or an invalid-params error that says where they
/// went wrong (`records[2].message: missing field \`role\``): serde alone names the
/// problem but not the field, which leaves a client guessing. Handlers take `Value` and
/// call this, so every `ctx/` method explains its params the same way.
fn params_of<P: serde::de::DeserializeOwned>(params: Value) -> Result<P> {
    serde_path_to_error::deserialize(params).map_err(|e| {
        let path = e.path().to_string();
        let mut error =
            Error::invalid_params(if path == "." { e.inner().to_string() } else { format!("{path}: {}", e.inner()) });
        error.data = None;
        error
    })
}

async fn answer<T>(rx: oneshot::Receiver<std::result::Result<T, SessionError>>, id: &str) -> Result<T> {
    match rx.await {
        Ok(result) => result.map_err(rpc_error),
        Err(_) => Err(rpc_error(SessionError::Closed(id.to_owned()))),
    }
}

fn with_code(code: i64, message: String) -> Error {
    let mut e = Error::new(ErrorCode::ServerError(code));
    e.message = message.into();
    e
}

fn internal(message: String) -> Error {
    with_code(error_codes::INTERNAL, message)
}

/// The one place session errors become JSON-RPC errors.
pub fn rpc_error(e: SessionError) -> Error {
    let message = e.to_string();
    match e {
        SessionError::NotOpen(_) | SessionError::UnknownSession(_) => with_code(error_codes::UNKNOWN_SESSION, message),
        SessionError::InvalidSessionId(_) | SessionError::InvalidParams(_) => Error::invalid_params(message),
        SessionError::Store(_) => with_code(error_codes::STORE, message),
        SessionError::Closed(_) => with_code(error_codes::SESSION_CLOSED, message),
        SessionError::Internal(_) => internal(message),
        SessionError::Busy(_) => with_code(error_codes::BUSY, message),
        SessionError::Cancelled(_) => Error::request_cancelled(),
        SessionError::CompactFailed(_) => with_code(error_codes::COMPACT_FAILED, message),
        SessionError::CannotUndo(why) => {
            let reason = match why {
                UndoError::NothingToUndo => "nothingToUndo",
                UndoError::NewTurnSince => "newTurnSince",
            };
            let mut e = with_code(error_codes::CANNOT_UNDO, message);
            e.data = Some(serde_json::json!({ "reason": reason }));
            e
        }
    }
}

fn store_error(e: StoreError) -> Error {
    let code = match e {
        StoreError::Locked { .. } => error_codes::STORE_LOCKED,
        _ => error_codes::STORE,
    };
    with_code(code, e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use ctxd_core::view::scrollback::{
        EntryKind, EntryRole, Hidden, ResultChange, ResultMark, Scrollback, ScrollbackEntry, Span,
    };

    #[test]
    fn the_wire_scrollback_writes_the_same_json_as_the_cores_for_every_variant() {
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
        assert_eq!(serde_json::to_value(super::wire_scrollback(core)).unwrap(), expected);
    }
}
