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
//! One `impl Session` spread over a file per concern:
//! - this file: the commands and answers, the session's state, the loop that batches;
//! - `load`: the transcript from the boundary in force, the ledger, the base context,
//!   and folding records into the view (each counted as the next request carries it);
//! - `commit`: group commit for the host's appends and ctxd's own records alike
//!   (`commit_own`, `own_record`), undo, explicit reads, snips and collapses;
//! - `assemble`: the request pipeline and the answer cut to what changed;
//! - `context`: changed files, activated memory files, the budget notice, the context view;
//! - `lifecycle`: when a compaction starts, joins or queues behind another, and how it is
//!   installed and followed up (the driver in `session::compaction` does the slow part);
//! - `push`: the usage and its rate-limited `ctx/usageChanged`.

mod assemble;
mod commit;
mod context;
mod lifecycle;
mod load;
mod push;

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxd_core::breakdown::Composition;
use ctxd_core::budget::{BudgetNotice, Thresholds};
use ctxd_core::invoked::Invoked;
use ctxd_core::ledger::{Ledger, LedgerEntry, ReadOutcome};
use ctxd_core::record::Record;
use ctxd_core::tally::Tally;
use futures::FutureExt;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use self::assemble::SentRequest;
use super::compaction::{self, CompactFailure, Prepared};
use super::usage::UsageSnapshot;
use super::{Notifier, SessionError, SessionSetup};
use crate::context::base::{BaseContext, MemoryFileInfo};
use crate::context::watcher::Subscription;
use crate::store::Store;
use crate::store::transcript::Transcript;
use ctxd_core::compact::{CompactGuards, Trigger};

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
    pub origin: ctxd_proto::CompactOrigin,
}

/// Where a `ctx/compact` answer goes.
type CompactReply = oneshot::Sender<Result<CompactAnswer, SessionError>>;

/// A `ctx/compact` request: manual, reactive or partial.
struct CompactRequest {
    trigger: Trigger,
    instructions: Option<String>,
    partial: Option<(ctxd_core::compact::SplitDirection, String)>,
    progress: Option<crate::session::Progress>,
    reply: oneshot::Sender<Result<CompactAnswer, SessionError>>,
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

/// A compaction under way.
struct Running {
    generation: u64,
    trigger: Trigger,
    started: Instant,
    pre_tokens: u64,
    /// The view's boundary generation when it started: a new boundary makes it stale.
    view_generation: u64,
    reply: Option<oneshot::Sender<Result<CompactAnswer, SessionError>>>,
    /// The focus instructions it summarizes with.
    focus: Option<String>,
    /// What its answer reports ([`CompactAnswer::origin`]).
    origin: ctxd_proto::CompactOrigin,
    /// `ctx/compact` requests that came while it ran and wait for its result.
    joiners: Vec<(CompactReply, Option<crate::session::Progress>)>,
    /// The background task; aborting it drops the provider's HTTP request.
    task: Option<tokio::task::AbortHandle>,
    progress: Option<crate::session::Progress>,
    /// Records in the view when the compaction started.
    snapshot_len: usize,
    /// Writing the ledger entries the index lacked at the start; done before installing.
    ledger_saved: Option<tokio::task::JoinHandle<()>>,
    /// Preparing a summary ahead of the threshold: kept when done, installed when the
    /// threshold comes (see `ctxd_core::compact::ahead`). Not shown as compacting.
    ahead: bool,
}

/// A summary prepared ahead of the threshold, waiting for it.
struct Ahead {
    prepared: Prepared,
    /// The view it was prepared on; a boundary or an undo since makes it stale.
    view_generation: u64,
    /// Records of the view it covers; those appended since are kept after it.
    snapshot_len: usize,
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
}

/// The state of one session, owned by its actor.
struct Session {
    id: String,
    setup: SessionSetup,
    store: Arc<Store>,
    transcript: Option<Transcript>,
    /// Records from the boundary in force (the latest one not undone) on, without the
    /// compactions undone after it (everything else is only on disk).
    view: Vec<Record>,
    /// Uuids in `view`, to drop records a host re-sends after a lost acknowledgement.
    uuids: HashSet<Arc<str>>,
    /// Records in the transcript, before the boundary included.
    total_records: u64,
    records_before_view: u64,
    view_offset: Option<u64>,
    tally: Tally,
    /// Bytes of the view's messages by kind, for the breakdown.
    composition: Composition,
    /// Skills and plan file of the view, restored after a compaction.
    invoked: Invoked,
    /// Token estimates of the host's own system blocks and tool definitions, from its
    /// latest `ctx/assemble` (the host sends them with every request).
    host_prefix: HostPrefix,
    /// The host's own part of its latest `ctx/assemble` (not a fork's), so a compaction
    /// can rebuild the request the host would be sent and fork it to share its cache.
    /// `None` until the host assembles in this daemon's lifetime.
    host_request: Option<Arc<HostRequest>>,
    /// Every file the agent read in this session (before the boundary too).
    ledger: Ledger,
    /// The index has the ledger's reads up to this sequence number. Resume reads the
    /// index only for reads before the boundary (the view's own reads are replayed), so
    /// newer reads are written in one batch when a compaction starts and at a boundary,
    /// not per read.
    ledger_saved_through: u64,
    /// Read files marked stale since the ledger was last persisted (rare).
    ledger_stale_unsaved: Vec<String>,
    /// Reads after this sequence number came after the last post-compact reload: a
    /// rebuilt base context replays them so what they activated stays.
    base_reads_from: u64,
    thresholds: Thresholds,
    resumed: bool,
    diagnostics: Vec<String>,
    notifier: Notifier,
    push: PushState,
    /// Memory files and git snapshot, memoized.
    base: Option<BaseContext>,
    /// The watcher's deliveries for this session's memory sources and read files.
    subscription: Option<Subscription>,
    /// Memory-file text activated by reads, for the next request.
    pending_notes: Vec<String>,
    /// The actor's own queue, for its background tasks to report back.
    self_tx: mpsc::UnboundedSender<Command>,
    compaction: Option<Running>,
    /// `ctx/compact` requests with other focus instructions than the running compaction's
    /// (or partial ones): each runs once the one before it is done.
    queued_compacts: std::collections::VecDeque<CompactRequest>,
    compaction_generation: u64,
    /// A summary prepared ahead of the threshold.
    ahead: Option<Ahead>,
    /// The view generation on which preparing ahead failed: not tried again on it.
    ahead_failed: Option<u64>,
    /// Bumped at every boundary, so a compaction prepared on an older view is not installed.
    view_generation: u64,
    guards: CompactGuards,
    /// A compaction's records are being appended: the threshold is checked once they
    /// are all in (a follow-up), not in the middle of the install.
    installing: bool,
    /// `message.id` of the latest model response stored: a new one is a new turn for
    /// the guards (a response split over several lines, or appended a line at a time,
    /// is one).
    last_response_id: Option<Box<str>>,
    /// The request pipeline's memo: extended with what was appended, rebuilt when a
    /// stage's inputs changed.
    view_cache: ctxd_core::view::ViewCache,
    /// The budget notices the model was given (70, 85, 95 % of the threshold).
    notice: BudgetNotice,
    /// Last append or request, for idle compaction.
    last_activity: tokio::time::Instant,
    /// An idle compaction already ran since the last activity.
    idle_done: bool,
    /// Stamps of every watched path when it was last seen, for when the OS watch limit
    /// is hit and changes are found by comparing stamps before each request instead.
    stamps: Vec<(std::path::PathBuf, Option<crate::context::watcher::FileStamp>)>,
    /// Assemble requests waiting for a compaction (the session was at the blocked level).
    waiting_assembles: Vec<(AssembleRequest, oneshot::Sender<Result<AssembleAnswer, SessionError>>)>,
    /// The last request handed out, for an assemble `since` it.
    last_sent: Option<SentRequest>,
    /// The latest requests the host was handed to send, whole: an automatic compaction
    /// forks the newest one already answered, whose prefix the provider has cached.
    fork_parents: assemble::ForkParents,
    /// `ctx/closeSession` requests, answered once the actor is gone (its file closed, its
    /// queue dropped), so that a request sent after the answer opens the session anew
    /// instead of reaching the actor on its way out.
    close_replies: Vec<oneshot::Sender<()>>,
}

/// What the host sends with every request besides the view: its system blocks, tools,
/// reply cap and thinking settings. Moved out of the assemble request, never copied.
#[derive(Debug)]
struct HostRequest {
    system: Vec<serde_json::Value>,
    tools: Vec<serde_json::Value>,
    max_tokens: u64,
    thinking: Option<serde_json::Value>,
}

impl HostRequest {
    fn blocks(&self) -> HostBlocks<'_> {
        HostBlocks {
            system: &self.system,
            tools: &self.tools,
            max_tokens: self.max_tokens,
            thinking: self.thinking.as_ref(),
        }
    }
}

/// The host's part of a request, borrowed: from `ctx/assemble`'s params or from the
/// latest [`HostRequest`].
#[derive(Debug, Clone, Copy)]
struct HostBlocks<'a> {
    system: &'a [serde_json::Value],
    tools: &'a [serde_json::Value],
    max_tokens: u64,
    thinking: Option<&'a serde_json::Value>,
}

#[derive(Debug, Clone, Copy, Default)]
struct HostPrefix {
    system: u64,
    tools: u64,
}

#[derive(Default)]
struct PushState {
    last_sent: Option<Instant>,
    last_usage: Option<UsageSnapshot>,
    due: Option<tokio::time::Instant>,
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
    let thresholds = setup.thresholds;
    let mut session = Session {
        id,
        setup,
        store,
        transcript: None,
        view: Vec::new(),
        uuids: HashSet::new(),
        total_records: 0,
        records_before_view: 0,
        view_offset: None,
        tally: Tally::default(),
        composition: Composition::default(),
        invoked: Invoked::default(),
        host_prefix: HostPrefix::default(),
        host_request: None,
        ledger: Ledger::default(),
        ledger_saved_through: 0,
        ledger_stale_unsaved: Vec::new(),
        base_reads_from: 0,
        thresholds,
        resumed: false,
        diagnostics: Vec::new(),
        notifier,
        push: PushState::default(),
        base: None,
        subscription: None,
        pending_notes: Vec::new(),
        self_tx,
        compaction: None,
        queued_compacts: std::collections::VecDeque::new(),
        compaction_generation: 0,
        ahead: None,
        ahead_failed: None,
        view_generation: 0,
        guards: CompactGuards::default(),
        installing: false,
        last_response_id: None,
        view_cache: ctxd_core::view::ViewCache::new(),
        stamps: Vec::new(),
        last_activity: tokio::time::Instant::now(),
        idle_done: false,
        notice: BudgetNotice::default(),
        waiting_assembles: Vec::new(),
        last_sent: None,
        fork_parents: assemble::ForkParents::default(),
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
            Some(paths) = next_change(&mut session.subscription) => {
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
            session.last_activity = tokio::time::Instant::now();
            session.idle_done = false;
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
                    records: self.total_records,
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
                let request = CompactRequest { trigger, instructions, partial, progress, reply };
                self.compact_requested(request, ctxd_proto::CompactOrigin::Requested).await;
            }
            Command::UndoCompact { reply } => {
                let answer = self.undo_compact().await;
                let _ = reply.send(answer);
            }
            Command::CancelCompaction => {
                // Only a compaction whose requesters are all gone; an automatic one has none.
                let abandoned = self.compaction.as_ref().is_some_and(|r| {
                    r.reply.as_ref().is_some_and(oneshot::Sender::is_closed)
                        && r.joiners.iter().all(|(reply, _)| reply.is_closed())
                });
                if abandoned && let Some(running) = self.compaction.take() {
                    if let Some(task) = running.task {
                        task.abort();
                    }
                    tracing::info!(trigger = ?running.trigger, "compaction cancelled by the client; nothing installed");
                    if let Some(progress) = &running.progress {
                        progress.end("cancelled; nothing was installed".to_owned()).await;
                    }
                    self.push_usage_now().await;
                }
            }
            Command::CompactionDone { generation, result } => {
                self.compaction_done(generation, result).await;
                // Requests held at the blocked level go now, from the new view (unless a
                // follow-up compaction must bring it under that level first).
                let still_blocked = self.compaction.is_some() && self.next_tokens() >= self.thresholds.blocked;
                let waiting = if still_blocked { Vec::new() } else { std::mem::take(&mut self.waiting_assembles) };
                for (request, reply) in waiting {
                    let answer = self.assemble(request, false).await;
                    let _ = reply.send(answer);
                }
            }
            Command::Reduce { reduction, reply } => {
                let answer = self.reduce(reduction).await;
                let _ = reply.send(answer);
            }
            Command::Assemble { request, reply } => {
                // A request at the blocked level would be refused (an imported session,
                // a burst of appends): compact first, then answer from the new view.
                if self.thresholds.enforce_window && self.next_tokens() >= self.thresholds.blocked {
                    self.maybe_auto_compact().await;
                }
                let at_blocked = self.compaction.is_some() && self.thresholds.rejects_request(self.tally.total());
                let blocked = self.compaction.is_some() && self.next_tokens() >= self.thresholds.blocked;
                if blocked || at_blocked {
                    // Over the blocked level with a compaction running: answer from the
                    // compacted view, not with a request the provider would refuse.
                    self.waiting_assembles.push((request, reply));
                } else {
                    let answer = self.assemble(request, true).await;
                    let _ = reply.send(answer);
                }
            }
            Command::Context { reply } => {
                let view = self.context_view().await;
                let _ = reply.send(view);
            }
            Command::FileRead { path, start_line, num_lines, reply } => {
                let answer = self.file_read(path, start_line, num_lines).await;
                let _ = reply.send(answer);
            }
            Command::Reconfigure { setup } => {
                self.thresholds = setup.thresholds;
                self.setup = setup;
                let usage = self.usage();
                self.usage_changed(usage).await;
                // A window lowered below what the session already holds compacts now, not
                // at the next append (which may never come while the user waits).
                self.maybe_auto_compact().await;
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
