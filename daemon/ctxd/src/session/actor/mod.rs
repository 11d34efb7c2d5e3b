//! The session actor: one tokio task per open session that owns its transcript file and
//! its in-memory state, and answers commands in the order they were queued.
//!
//! **Group commit.** When the actor wakes it takes every command already queued (up to a
//! bound). Consecutive appends in that batch are written with one `write` and one
//! `sync_data`, then each is acknowledged. A burst of appends thus costs one sync, and no
//! append is acknowledged before its bytes are on disk.
//!
//! **Isolation.** A panic while handling a batch is caught: the commands of that batch
//! get an error, the state is reloaded from disk, and the actor serves on. A slow disk
//! stalls only this session.
//!
//! One `impl Session` spread over a file per concern, each owning one part of the state:
//! - this file: the commands and answers, [`Session`], the loop that batches;
//! - `load`: the [`View`](load::View) (the transcript from the boundary in force, each
//!   record counted as the next request carries it) and folding records into it;
//! - `commit`: group commit for the host's appends and ctxd's own records alike
//!   (`commit_own`, `own_record`), undo, explicit reads, snips and collapses;
//! - `assemble`: the request pipeline, its memo and the requests handed out
//!   ([`Requests`](assemble::Requests)), and the answer cut to what changed;
//! - `context`: what the model sees besides the transcript ([`Context`](context::Context):
//!   the ledger of reads and what of it the index has, memory files, changed files, the
//!   budget notice);
//! - `lifecycle`: carries out what `ctxd_core::compact::lifecycle` decides about
//!   compaction ([`Compaction`](lifecycle::Compaction)); the driver in
//!   `session::compaction` does the slow part;
//! - `push`: the usage and its rate-limited `ctx/usageChanged` ([`PushState`](push::PushState)).

mod assemble;
mod commit;
mod context;
mod lifecycle;
mod load;
mod push;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxd_core::compact::Trigger;
use ctxd_core::compact::lifecycle::Origin;
use ctxd_core::ledger::{LedgerEntry, ReadOutcome};
use ctxd_core::record::Record;
use futures::FutureExt;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use self::assemble::Requests;
use self::context::Context;
use self::lifecycle::Compaction;
use self::load::View;
use self::push::PushState;
use super::compaction::{self, CompactFailure, Prepared};
use super::usage::UsageSnapshot;
use super::{Notifier, SessionError, SessionSetup};
use crate::context::base::MemoryFileInfo;
use crate::context::watcher::Subscription;
use crate::store::Store;
use crate::store::transcript::Transcript;

/// Most commands taken from the queue in one batch.
const MAX_BATCH: usize = 1024;
/// Fastest rate at which `ctx/usageChanged` is pushed for one session.
pub const USAGE_PUSH_INTERVAL: Duration = Duration::from_millis(100);

/// Records waiting to be written, with the channel their acknowledgement goes to.
type PendingAppend = (Vec<Record>, oneshot::Sender<Result<Appended, SessionError>>);

/// A command for a session actor. Each carries the channel its answer goes back on.
/// (Sizes differ between variants; commands are few and short-lived, so no boxing.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Report the session as loaded (sent first by whoever opens it).
    Open {
        reply: oneshot::Sender<Result<Opened, SessionError>>,
    },
    Append {
        records: Vec<Record>,
        reply: oneshot::Sender<Result<Appended, SessionError>>,
    },
    Usage {
        reply: oneshot::Sender<UsageSnapshot>,
    },
    /// Compact now (manual, or reactive after a refusal); answered once installed or failed.
    Compact {
        trigger: Trigger,
        instructions: Option<String>,
        /// A partial compaction around the record with this uuid.
        partial: Option<(ctxd_core::compact::SplitDirection, String)>,
        /// `$/progress` for the client's work-done token, if it sent one.
        progress: Option<crate::session::Progress>,
        reply: oneshot::Sender<Result<CompactAnswer, SessionError>>,
    },
    /// Take back the latest compaction (`ctx/undoCompact`).
    UndoCompact {
        reply: oneshot::Sender<Result<UndoAnswer, SessionError>>,
    },
    /// The client gave up on a compaction it asked for (`$/cancelRequest`, or it went
    /// away): stop it, provider call included, with nothing installed.
    CancelCompaction,
    /// The background part of a compaction finished (sent by the actor's own task).
    CompactionDone {
        generation: u64,
        result: Result<Prepared, CompactFailure>,
    },
    /// Take records out of the model's view (`uuids`), or replace a span with a summary.
    Reduce {
        reduction: Reduction,
        reply: oneshot::Sender<Result<Reduced, SessionError>>,
    },
    /// Build the next model request.
    Assemble {
        request: AssembleRequest,
        reply: oneshot::Sender<Result<AssembleAnswer, SessionError>>,
    },
    /// What the model sees: usage, memory files, read files that changed.
    Context {
        reply: oneshot::Sender<ContextView>,
    },
    /// The agent read a file outside the transcript's Read results.
    FileRead {
        path: String,
        start_line: Option<u64>,
        num_lines: Option<u64>,
        reply: oneshot::Sender<Result<FileReadAnswer, SessionError>>,
    },
    /// Settings changed: new levels (and settings) for the session.
    Reconfigure {
        setup: SessionSetup,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

/// Answer to [`Command::Open`].
#[derive(Debug, Clone)]
pub struct Opened {
    pub resumed: bool,
    pub records: u64,
    pub diagnostics: Vec<String>,
    pub usage: UsageSnapshot,
}

/// Answer to [`Command::Append`].
#[derive(Debug, Clone)]
pub struct Appended {
    pub appended: u64,
    pub duplicates: u64,
    pub records: u64,
    pub usage: UsageSnapshot,
    pub steps: AppendSteps,
}

/// When an append's group passed each step inside its session: what the `ctxd::latency`
/// log reports (see `server::FastPaths::append`), to tell the daemon's share of a slow
/// append from the host's. Taking the stamps costs a few clock reads per group.
#[derive(Debug, Clone, Copy)]
pub struct AppendSteps {
    /// The actor started committing the group.
    pub commit_started: Instant,
    /// A blocking thread started the write.
    pub write_started: Instant,
    /// `sync_data` returned.
    pub synced: Instant,
    /// The actor ran again after the write.
    pub resumed: Instant,
    /// The records were in the view and the answer was sent.
    pub answered: Instant,
}

/// Answer to [`Command::FileRead`].
#[derive(Debug, Clone)]
pub struct FileReadAnswer {
    pub outcome: ReadOutcome,
    pub entry: LedgerEntry,
}

/// A snip or a collapse.
#[derive(Debug, Clone)]
pub enum Reduction {
    Snip { uuids: Vec<String> },
    Collapse { from: String, to: String, summary: Option<String> },
}

/// Answer to [`Command::Reduce`].
#[derive(Debug, Clone)]
pub struct Reduced {
    pub record_uuid: String,
    pub tokens_freed: u64,
    pub unknown: Vec<String>,
    pub usage: UsageSnapshot,
}

/// What `ctx/assemble` asks for.
#[derive(Debug, Clone)]
pub struct AssembleRequest {
    pub system: Vec<serde_json::Value>,
    pub tools: Vec<serde_json::Value>,
    pub max_tokens: u64,
    /// The host's extended-thinking settings (a Messages API `thinking` object).
    pub thinking: Option<serde_json::Value>,
    pub fork: Option<ctxd_core::view::Fork>,
    /// Also build the UI's scrollback.
    pub include_snipped: bool,
    /// The revision of the answer whose request the host kept.
    pub since: Option<String>,
}

/// Answer to [`Command::Assemble`].
#[derive(Debug, Clone)]
pub struct AssembleAnswer {
    /// The request body, its messages shared with the view cache: the server encodes
    /// it once, straight into the answer (a value tree of it cost a fifth of the
    /// daemon's CPU under load; encoding it here as well copied it twice more).
    pub request: ctxd_core::view::Request,
    /// About how many bytes `request` takes as JSON, to size the answer's buffer.
    pub request_len_hint: usize,
    /// Names this request for the host's next `since`.
    pub revision: String,
    /// `request` holds the messages from this index on (0: all of them).
    pub messages_from: usize,
    pub request_tokens: u64,
    pub usage: UsageSnapshot,
    pub applied: Vec<ctxd_core::view::Applied>,
    pub compact: bool,
    pub scrollback: Option<ctxd_core::view::Scrollback>,
    pub steps: AssembleSteps,
}

/// When an assemble passed each step inside its session, for the `ctxd::latency` log
/// (see `server::FastPaths::assemble`), as [`AppendSteps`] for an append.
#[derive(Debug, Clone, Copy)]
pub struct AssembleSteps {
    /// The actor started building the request (after any compaction it waited for).
    pub started: Instant,
    /// The request was built (the server encodes it), the answer about to be sent.
    pub built: Instant,
}

/// Answer to [`Command::Compact`].
#[derive(Debug, Clone)]
pub struct CompactAnswer {
    pub boundary: String,
    pub trigger: Trigger,
    pub pre_tokens: u64,
    pub post_tokens: u64,
    pub summary: String,
    pub summarizer: compaction::Summarizer,
    /// Items the summary missed that were appended deterministically.
    pub fidelity_appended: usize,
    pub problems: Vec<String>,
    /// Which compaction this answers (the request's own, or one it waited for).
    pub origin: Origin,
}

/// Answer to [`Command::UndoCompact`].
#[derive(Debug, Clone)]
pub struct UndoAnswer {
    /// Uuid of the boundary undone.
    pub boundary: String,
    pub undo_record: String,
    pub pre_tokens: u64,
    pub post_tokens: u64,
    pub usage: UsageSnapshot,
}

/// Answer to [`Command::Context`].
#[derive(Debug, Clone)]
pub struct ContextView {
    pub usage: UsageSnapshot,
    pub memory_files: Vec<MemoryFileInfo>,
    pub memory_tokens: u64,
    pub diagnostics: Vec<String>,
    pub files_read: usize,
    /// Read files that changed on disk since the agent read them.
    pub stale_files: Vec<String>,
    pub git: bool,
    /// Estimated tokens after installing the summary prepared ahead, if one is ready.
    pub prepared_ahead: Option<u64>,
    /// An observed Claude Code session's instant-compaction costs and savings.
    pub instant_compaction: Option<ctxd_core::gateway::costs::CostSummary>,
}

/// The state of one session, owned by its actor: a few handles, and one part per file.
struct Session {
    id: String,
    /// Where the agent works, its model and settings, and the levels they give.
    setup: SessionSetup,
    store: Arc<Store>,
    transcript: Option<Transcript>,
    resumed: bool,
    diagnostics: Vec<String>,
    notifier: Notifier,
    /// The actor's own queue, for its background tasks to report back.
    self_tx: mpsc::UnboundedSender<Command>,
    /// The records the model sees and their counts (`load`).
    view: View,
    /// Reads, memory files and what changed on disk (`context`).
    context: Context,
    /// The request pipeline's memo and the requests handed out (`assemble`).
    requests: Requests,
    /// Compaction: the core's lifecycle, the job running, who waits (`lifecycle`).
    compaction: Compaction,
    push: PushState,
    /// `ctx/closeSession` requests, answered once the actor is gone (its file closed, its
    /// queue dropped), so that a request sent after the answer opens the session anew
    /// instead of reaching the actor on its way out.
    close_replies: Vec<oneshot::Sender<()>>,
}

/// Spawns the actor for a session; it loads (or creates) the transcript first.
pub fn spawn(
    id: String,
    setup: SessionSetup,
    store: Arc<Store>,
    notifier: Notifier,
    create: bool,
    first: Option<Command>,
) -> mpsc::UnboundedSender<Command> {
    let (tx, rx) = mpsc::unbounded_channel();
    // Queued before the actor runs: a load that fails at once still answers it with
    // the reason, rather than closing its queue before the command arrives.
    if let Some(first) = first {
        let _ = tx.send(first);
    }
    let span = tracing::info_span!("session", id = %id);
    tokio::spawn(run(id, setup, store, notifier, create, tx.clone(), rx).instrument(span));
    tx
}

async fn run(
    id: String,
    setup: SessionSetup,
    store: Arc<Store>,
    notifier: Notifier,
    create: bool,
    self_tx: mpsc::UnboundedSender<Command>,
    mut rx: mpsc::UnboundedReceiver<Command>,
) {
    let mut session = Session {
        id,
        setup,
        store,
        transcript: None,
        resumed: false,
        diagnostics: Vec::new(),
        notifier,
        self_tx,
        view: View::default(),
        context: Context::default(),
        requests: Requests::default(),
        compaction: Compaction::new(),
        push: PushState::default(),
        close_replies: Vec::new(),
    };
    if let Err(e) = session.load(create).await {
        tracing::error!(error = %e, "could not load the session");
        // Everyone waiting learns why; the registry drops this actor.
        while let Ok(cmd) = rx.try_recv() {
            fail(cmd, &e);
        }
        rx.close();
        while let Some(cmd) = rx.recv().await {
            fail(cmd, &e);
        }
        return;
    }
    loop {
        let due = session.push.due;
        let idle_at = session.idle_deadline();
        let first = tokio::select! {
            () = sleep_until(idle_at), if idle_at.is_some() => {
                session.idle().await;
                continue;
            }
            cmd = rx.recv() => cmd,
            () = sleep_until(due), if due.is_some() => {
                session.push_usage_now().await;
                continue;
            }
            Some(paths) = next_change(&mut session.context.subscription) => {
                session.files_changed(paths).await;
                continue;
            }
        };
        let Some(first) = first else { break };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(cmd) => batch.push(cmd),
                Err(_) => break,
            }
        }
        let closing = batch.iter().any(|c| matches!(c, Command::Close { .. }));
        if batch.iter().any(|c| matches!(c, Command::Append { .. } | Command::Assemble { .. })) {
            session.compaction.active();
        }
        let outcome = AssertUnwindSafe(session.handle_batch(batch)).catch_unwind().await;
        if outcome.is_err() {
            tracing::error!("a command panicked; its batch was answered with errors; reloading the session from disk");
            if let Err(e) = session.load(false).await {
                tracing::error!(error = %e, "reload after a panic failed; closing the session");
                break;
            }
        }
        if closing {
            break;
        }
    }
    session.flush_index();
    // Commands that raced with the close are answered, not left waiting.
    rx.close();
    let closed = SessionError::Closed(session.id.clone());
    while let Ok(cmd) = rx.try_recv() {
        fail(cmd, &closed);
    }
    // The transcript file is closed before the receiver is dropped, so a new actor for
    // this session (spawned once the registry sees this one closed) never overlaps it.
    let close_replies = std::mem::take(&mut session.close_replies);
    drop(session);
    drop(rx);
    for reply in close_replies {
        let _ = reply.send(());
    }
}

async fn next_change(subscription: &mut Option<Subscription>) -> Option<Vec<std::path::PathBuf>> {
    match subscription {
        Some(sub) => sub.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(due: Option<tokio::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn fail(cmd: Command, e: &SessionError) {
    match cmd {
        Command::Open { reply } => drop(reply.send(Err(e.clone()))),
        Command::Append { reply, .. } => drop(reply.send(Err(e.clone()))),
        Command::FileRead { reply, .. } => drop(reply.send(Err(e.clone()))),
        Command::Compact { reply, .. } => drop(reply.send(Err(e.clone()))),
        Command::UndoCompact { reply } => drop(reply.send(Err(e.clone()))),
        Command::Assemble { reply, .. } => drop(reply.send(Err(e.clone()))),
        Command::Reduce { reply, .. } => drop(reply.send(Err(e.clone()))),
        Command::CompactionDone { .. } | Command::CancelCompaction => {}
        Command::Usage { .. } | Command::Context { .. } | Command::Reconfigure { .. } | Command::Close { .. } => {}
    }
}

impl Session {
    async fn handle_batch(&mut self, batch: Vec<Command>) {
        let mut appends = Vec::new();
        for cmd in batch {
            match cmd {
                Command::Append { records, reply } => appends.push((records, reply)),
                other => {
                    self.commit(std::mem::take(&mut appends)).await;
                    self.handle_one(other).await;
                }
            }
        }
        self.commit(appends).await;
    }

    async fn handle_one(&mut self, cmd: Command) {
        match cmd {
            Command::Open { reply } => {
                let opened = Opened {
                    resumed: self.resumed,
                    records: self.view.total_records,
                    diagnostics: self.diagnostics.clone(),
                    usage: self.usage(),
                };
                let _ = reply.send(Ok(opened));
                // Status bars start from the opened state without asking.
                let usage = self.usage();
                self.usage_changed(usage).await;
            }
            Command::Usage { reply } => {
                let _ = reply.send(self.usage());
            }
            Command::Compact { trigger, instructions, partial, progress, reply } => {
                let requester = lifecycle::Requester { reply, progress };
                self.compact_requested(trigger, instructions, partial, requester).await;
            }
            Command::UndoCompact { reply } => {
                let answer = self.undo_compact().await;
                let _ = reply.send(answer);
            }
            Command::CancelCompaction => self.cancel_compaction().await,
            Command::CompactionDone { generation, result } => self.compaction_done(generation, result).await,
            Command::Reduce { reduction, reply } => {
                let answer = self.reduce(reduction).await;
                let _ = reply.send(answer);
            }
            Command::Assemble { request, reply } => self.assemble_or_wait(request, reply).await,
            Command::Context { reply } => {
                let view = self.context_view().await;
                let _ = reply.send(view);
            }
            Command::FileRead { path, start_line, num_lines, reply } => {
                let answer = self.file_read(path, start_line, num_lines).await;
                let _ = reply.send(answer);
            }
            Command::Reconfigure { setup } => {
                self.setup = setup;
                let usage = self.usage();
                self.usage_changed(usage).await;
                // A window lowered below what the session already holds compacts now, not
                // at the next append (which may never come while the user waits).
                self.check_threshold().await;
            }
            Command::Close { reply } => {
                self.flush_index();
                self.close_replies.push(reply);
            }
            Command::Append { .. } => {}
        }
    }
}

/// Now as RFC 3339 UTC with milliseconds, like transcript timestamps.
pub fn now_rfc3339() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    ctxd_core::view::format_rfc3339_ms(i64::try_from(now.as_millis()).unwrap_or(i64::MAX))
}
