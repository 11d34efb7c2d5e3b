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

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxd_core::breakdown::{Composition, Prefix};
use ctxd_core::budget::Thresholds;
use ctxd_core::invoked::Invoked;
use ctxd_core::ledger::{Ledger, LedgerEntry, ReadMarker, ReadOutcome, file_read_in};
use ctxd_core::record::Record;
use ctxd_core::tally::Tally;
use futures::FutureExt;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::compaction::{self, CompactFailure, Job, Prepared};
use super::usage::{Shape, UsageSnapshot};
use super::{Notifier, SessionError, SessionSetup};
use crate::context::base::{BaseContext, MemoryFileInfo};
use crate::context::watcher::{Subscription, Target};
use crate::store::transcript::Transcript;
use crate::store::{SessionEntry, Store};
use ctxd_core::compact::{AutoDecision, CompactGuards, InstallInput, Trigger, build_post_compact, common_fields};
use ctxd_core::compact::{build_undo_record, compaction_view, is_undo_record, undo_target};

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
        progress: Option<super::Progress>,
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
    /// The background task; aborting it drops the provider's HTTP request.
    task: Option<tokio::task::AbortHandle>,
    progress: Option<super::Progress>,
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
    compaction_generation: u64,
    /// A summary prepared ahead of the threshold.
    ahead: Option<Ahead>,
    /// The view generation on which preparing ahead failed: not tried again on it.
    ahead_failed: Option<u64>,
    /// Bumped at every boundary, so a compaction prepared on an older view is not installed.
    view_generation: u64,
    guards: CompactGuards,
    /// The request pipeline's memo: extended with what was appended, rebuilt when a
    /// stage's inputs changed.
    view_cache: ctxd_core::view::ViewCache,
    /// The highest budget notice (70, 85, 95 % of the threshold) the model was given
    /// since the context last fell below 70 %.
    notified_percent: u8,
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
        compaction_generation: 0,
        ahead: None,
        ahead_failed: None,
        view_generation: 0,
        guards: CompactGuards::default(),
        view_cache: ctxd_core::view::ViewCache::new(),
        stamps: Vec::new(),
        last_activity: tokio::time::Instant::now(),
        idle_done: false,
        notified_percent: 0,
        waiting_assembles: Vec::new(),
        last_sent: None,
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
    /// Loads the transcript from the latest compact boundary on. The index says where
    /// that boundary is; it is checked against the file, and rebuilt by a scan when it is
    /// missing or wrong.
    async fn load(&mut self, create: bool) -> Result<(), SessionError> {
        if let Some(source) = self.setup.import.take() {
            let (store, id) = (self.store.clone(), self.id.clone());
            let imported = tokio::task::spawn_blocking(move || crate::interop::import(&store, &id, &source))
                .await
                .map_err(|e| SessionError::Internal(format!("import task failed: {e}")))??;
            tracing::info!(records = imported.records, skipped = imported.skipped.len(), "imported a transcript");
            const SHOWN: usize = 50;
            let more = imported.skipped.len().saturating_sub(SHOWN);
            self.diagnostics.extend(imported.skipped.into_iter().take(SHOWN).map(|l| format!("import: skipped {l}")));
            if more > 0 {
                self.diagnostics.push(format!("import: {more} more lines skipped (see the log)"));
            }
            if imported.repaired > 0 {
                self.diagnostics.push(format!(
                    "import: {} lines repaired (ctxd's own fields removed, unpaired surrogates replaced)",
                    imported.repaired
                ));
            }
        }
        let path = self.store.transcript_path(&self.id)?;
        let exists = path.exists();
        if !exists && !create {
            return Err(SessionError::UnknownSession(self.id.clone()));
        }
        let store = self.store.clone();
        let id = self.id.clone();
        let transcript = self.transcript.take();
        drop(transcript); // reopened below; the OS keeps appends ordered
        let loaded = tokio::task::spawn_blocking(move || load_from_disk(&store, &id, &path))
            .await
            .map_err(|e| SessionError::Internal(format!("loading task failed: {e}")))??;
        let LoadResult {
            transcript,
            records,
            records_before,
            view_offset,
            damaged,
            torn_bytes,
            rebuilt_index,
            earlier,
        } = loaded;
        if torn_bytes > 0 {
            self.diagnostics.push(format!("cut {torn_bytes} bytes of a torn last line (never acknowledged)"));
        }
        if rebuilt_index {
            tracing::info!("index entry rebuilt from the transcript");
        }
        self.diagnostics.extend(damaged);
        self.diagnostics.extend(self.setup.problems.iter().cloned());
        self.resumed = exists;
        self.transcript = Some(transcript);
        // The ledger: what the index kept of reads before the boundary (or, when the
        // index is new, what a scan of that part found), then the reads in the view.
        self.ledger = Ledger::default();
        self.ledger_stale_unsaved.clear();
        for entry in self.store.index().ledger_entries(&self.id) {
            self.ledger.restore(entry);
        }
        self.ledger_saved_through = self.ledger.last_sequence();
        for record in &earlier {
            self.note_read(record, true);
        }
        if !earlier.is_empty() {
            // Found by a scan: kept, so the next resume need not scan again.
            let _ = self.save_ledger().await;
        }
        self.fold_loaded(records, records_before, view_offset, true);
        let entry = self.index_entry();
        if self.store.index().get(&self.id).as_ref() != Some(&entry) {
            // New or rebuilt: flushed now, so a client can resume the session by id
            // after a crash without reopening it (the index remembers cwd and model).
            self.store.index().put(&self.id, &entry);
            self.store.index().flush();
        }
        self.load_base().await;
        tracing::info!(
            records = self.total_records,
            in_view = self.view.len(),
            resumed = self.resumed,
            "session loaded"
        );
        Ok(())
    }

    /// Loads the base context (shared discovery, git snapshot), replays this session's
    /// reads so their activations hold, and subscribes to changes of its sources.
    async fn load_base(&mut self) {
        let (cwd, config, services) = (self.setup.cwd.clone(), self.setup.memory.clone(), self.setup.services.clone());
        let reads: Vec<std::path::PathBuf> =
            self.ledger.newest_first().iter().rev().map(|e| std::path::PathBuf::from(&e.path)).collect();
        let today = now_rfc3339()[..10].to_owned();
        let loaded = tokio::task::spawn_blocking(move || {
            let mut base =
                BaseContext::load(std::path::Path::new(&cwd), config, &services.memory_cache, &services.fs, today);
            for path in &reads {
                base.on_file_read(path, &services.fs);
            }
            base
        })
        .await;
        match loaded {
            Ok(base) => {
                self.base = Some(base);
                self.resubscribe();
            }
            Err(e) => tracing::error!(error = %e, "base context could not be loaded"),
        }
    }

    /// Points the watcher at the memory sources and every read file.
    fn resubscribe(&mut self) {
        let mut targets: Vec<Target> = match &self.base {
            Some(base) => base.watch_targets().into_iter().map(Target::from).collect(),
            None => Vec::new(),
        };
        targets.extend(self.ledger.paths().map(Target::file));
        match &self.subscription {
            Some(sub) => sub.update(targets),
            None => self.subscription = Some(self.setup.services.watcher.subscribe(targets)),
        }
    }

    /// The watcher says these paths changed: memory sources mark the memo dirty (rebuilt
    /// on the next request), read files that really differ from what was read are marked
    /// stale (the next request tells the model), and the client hears which paths.
    async fn files_changed(&mut self, paths: Vec<std::path::PathBuf>) {
        let mut memory = false;
        let mut read_files = Vec::new();
        for path in &paths {
            if self.base.as_ref().is_some_and(|b| b.is_memory_source(path)) {
                memory = true;
            }
            if let Some(entry) = path.to_str().and_then(|p| self.ledger.get(p)) {
                read_files.push(entry.clone());
            }
        }
        if memory {
            if let Some(base) = &mut self.base {
                base.mark_dirty();
            }
            self.setup.services.memory_cache.invalidate(std::path::Path::new(&self.setup.cwd));
        }
        let checked = tokio::task::spawn_blocking(move || {
            read_files
                .into_iter()
                .filter(|e| match crate::outside::read(std::path::Path::new(&e.path), crate::outside::READ_FILE) {
                    Ok(bytes) => ctxd_core::ledger::has_changed(e, &String::from_utf8_lossy(&bytes)),
                    Err(_) => true,
                })
                .map(|e| e.path)
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for path in &checked {
            self.ledger.mark_stale(path);
            self.ledger_stale_unsaved.push(path.clone());
        }
        let reported: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        tracing::debug!(paths = ?reported, memory, stale = checked.len(), "files changed");
        self.notifier.context_changed(&self.id, reported).await;
    }

    /// The context view; a dirty memo is rebuilt first so the view is current.
    async fn context_view(&mut self) -> ContextView {
        if let Some(mut base) = self.base.take() {
            let services = self.setup.services.clone();
            let reads = self.reads_since_compaction();
            let rebuilt = tokio::task::spawn_blocking(move || {
                base.rebuild_if_dirty(&services.memory_cache, &services.fs, &reads);
                base
            })
            .await;
            if let Ok(base) = rebuilt {
                self.base = Some(base);
                self.resubscribe();
            }
        }
        let base = self.base.as_ref();
        ContextView {
            usage: self.usage(),
            memory_files: base.map(BaseContext::files).unwrap_or_default(),
            memory_tokens: base.map_or(0, BaseContext::memory_tokens),
            diagnostics: base.map(BaseContext::diagnostics).unwrap_or_default(),
            files_read: self.ledger.len(),
            stale_files: self.ledger.newest_first().iter().filter(|e| e.stale).map(|e| e.path.clone()).collect(),
            git: base.is_some_and(|b| b.system_context().is_some()),
            prepared_ahead: self.ahead.as_ref().map(|a| a.prepared.estimated_post_tokens),
        }
    }

    /// Writes the ledger entries the index lacks, in one batch off the actor.
    fn save_ledger(&mut self) -> tokio::task::JoinHandle<()> {
        let entries = self.unsaved_ledger_entries();
        let (store, id) = (self.store.clone(), self.id.clone());
        tokio::task::spawn_blocking(move || {
            if !entries.is_empty() {
                store.index().put_ledger_batch(&id, &entries);
            }
        })
    }

    /// Files read since the last post-compact reload, oldest first.
    fn reads_since_compaction(&self) -> Vec<std::path::PathBuf> {
        let mut reads: Vec<&LedgerEntry> = self.ledger.read_after(self.base_reads_from).collect();
        reads.sort_by_key(|e| e.sequence);
        reads.into_iter().map(|e| std::path::PathBuf::from(&e.path)).collect()
    }

    fn ledger_unsaved(&self) -> bool {
        self.ledger.last_sequence() > self.ledger_saved_through || !self.ledger_stale_unsaved.is_empty()
    }

    /// The ledger entries the index lacks; from then on it is taken to have them.
    fn unsaved_ledger_entries(&mut self) -> Vec<LedgerEntry> {
        let mut entries: Vec<LedgerEntry> = self.ledger.read_after(self.ledger_saved_through).cloned().collect();
        for path in self.ledger_stale_unsaved.drain(..) {
            if let Some(entry) = self.ledger.get(&path).filter(|e| e.sequence <= self.ledger_saved_through) {
                entries.push(entry.clone());
            }
        }
        self.ledger_saved_through = self.ledger.last_sequence();
        entries
    }

    fn index_entry(&self) -> SessionEntry {
        SessionEntry {
            boundary_offset: self.view_offset,
            records_before_boundary: self.records_before_view,
            cwd: self.setup.cwd.clone(),
            model: self.setup.model.clone(),
            agent_window: self.setup.agent_window,
        }
    }

    fn flush_index(&self) {
        self.store.index().put(&self.id, &self.index_entry());
    }

    /// Folds one record just appended into the in-memory state, `offset` its byte offset.
    fn apply(&mut self, record: Record, offset: Option<u64>) {
        self.note_read(&record, offset.is_some());
        self.fold(record, offset);
    }

    /// Builds the view from records read from disk, from the boundary the view starts at
    /// (or earlier) to the end: as [`compaction_view`] says, the view starts at the latest
    /// boundary not undone and leaves out each undone compaction, boundary through undo
    /// record; what it leaves out is only counted. `note_reads` replays their file reads
    /// into the ledger (on load; an undo keeps the ledger it has). A boundary newer than
    /// the indexed one (a crash lost the index's note of it) moves `view_offset`, so the
    /// entry written next pairs its offset with its count.
    fn fold_loaded(
        &mut self,
        records: Vec<(u64, Record)>,
        records_before: u64,
        view_offset: Option<u64>,
        note_reads: bool,
    ) {
        self.view.clear();
        self.uuids.clear();
        self.tally = Tally::default();
        self.composition = Composition::default();
        self.invoked = Invoked::default();
        self.view_cache = ctxd_core::view::ViewCache::new();
        self.last_sent = None;
        // A compaction prepared on the view this replaces is not installed.
        self.view_generation += 1;
        self.view_offset = view_offset;
        // Records before the boundary the view starts at are the messages it keeps
        // (read back by `with_preserved`): already counted, their reads already noted.
        let earlier = view_offset.map_or(0, |v| records.iter().take_while(|(o, _)| *o < v).count());
        self.records_before_view = records_before.saturating_sub(earlier as u64);
        self.total_records = self.records_before_view;
        let (offsets, records): (Vec<u64>, Vec<Record>) = records.into_iter().unzip();
        let spans = compaction_view(&records);
        for (i, (offset, record)) in offsets.into_iter().zip(records).enumerate() {
            if note_reads && i >= earlier {
                self.note_read(&record, false);
            }
            if spans.skipped.iter().any(|undone| undone.contains(&i)) {
                self.total_records += 1;
            } else {
                self.fold(record, Some(offset));
            }
        }
    }

    /// Adds one record to the view (a boundary starts it afresh). `offset`, when known,
    /// is where a boundary starts, for the index.
    fn fold(&mut self, record: Record, offset: Option<u64>) {
        if record.is_compact_boundary() {
            if offset.is_some() && self.ledger_unsaved() {
                // The reads before a new boundary are no longer replayed on resume: the
                // index must have them (before the session entry points past them).
                let entries = self.unsaved_ledger_entries();
                self.store.index().put_ledger_batch(&self.id, &entries);
            }
            // The model sees nothing before the latest boundary but the messages the
            // boundary keeps (Claude Code's `preservedSegment`): they stay in the view,
            // before the boundary, where the slice relinks them after its anchor.
            let found = ctxd_core::preserved::preserved(&record, &self.view);
            let kept: Vec<Record> = found.kept.iter().map(|&i| self.view[i].clone()).collect();
            if let Some(note) = found.note {
                tracing::warn!(boundary = ?record.uuid(), "a compact boundary {note}; its kept messages are left out");
            }
            self.records_before_view = self.total_records;
            self.view.clear();
            self.uuids.clear();
            self.tally.restart();
            self.composition = Composition::default();
            self.invoked = Invoked::default();
            for kept in kept {
                if let Some(uuid) = kept.uuid() {
                    self.uuids.insert(Arc::from(uuid));
                }
                // Counted as part of the new context; their usage measured the old one.
                let counted = ctxd_core::preserved::without_usage(&kept);
                self.tally.observe(&counted);
                self.composition.observe(&counted);
                self.view.push(kept);
            }
            // The request handed out last shows the old view: no later one shares with it
            // more than a message, and it would keep the old view's messages alive.
            self.last_sent = None;
            if let Some(rate) = boundary_rate(&record) {
                self.tally.calibration.tokens_per_kib = rate;
            }
            self.view_generation += 1;
            if offset.is_some() {
                self.view_offset = offset;
            }
        }
        self.total_records += 1;
        self.tally.observe(&record);
        self.composition.observe(&record);
        self.invoked.observe(&record);
        if let Some(uuid) = record.uuid() {
            self.uuids.insert(Arc::from(uuid));
        }
        self.view.push(record);
    }

    /// Records a file read carried by `record`, if any; `persist` writes the entry to the
    /// index (for records just appended, or found by a rebuild scan).
    fn note_read(&mut self, record: &Record, persist: bool) {
        let path = if let Some(read) = file_read_in(record) {
            self.ledger.record(&read);
            read.path
        } else if let Some(marker) = ReadMarker::from_record(record) {
            self.ledger.record_marker(&marker);
            marker.path
        } else {
            return;
        };
        // A new read (not a replay while loading): rules and nested memory files may
        // activate, and the file joins the watched set.
        if persist && let Some(base) = &mut self.base {
            if let Some(note) = base.on_file_read(std::path::Path::new(&path), &self.setup.services.fs) {
                self.pending_notes.push(note);
            }
            self.ledger.clear_stale(&path);
            // Only what this read added: handing over every read path again would make
            // each read cost O(reads so far).
            let added: Vec<Target> =
                base.new_watch_targets().into_iter().map(Target::from).chain([Target::file(path)]).collect();
            match &self.subscription {
                Some(sub) => sub.add(added),
                None => self.resubscribe(),
            }
        }
    }

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
                self.drop_precompute();
                // The provider refused the request as too long: a summary prepared ahead
                // answers at once, with no model call before the host can retry.
                if trigger == Trigger::Reactive
                    && self.compaction.is_none()
                    && self.thresholds.compact_enabled
                    && let Some(outcome) = self.install_ahead().await
                {
                    self.finish_compaction(Trigger::Precomputed, outcome, Some(reply), progress).await;
                    return;
                }
                if self.compaction.is_some() {
                    let _ =
                        reply.send(Err(SessionError::Busy("a compaction of this session is already running".into())));
                } else if !self.thresholds.compact_enabled {
                    let _ = reply
                        .send(Err(SessionError::CompactFailed("compaction is turned off (DISABLE_COMPACT)".into())));
                } else {
                    if trigger == Trigger::Manual {
                        // A manual compaction resets the circuit breaker and lifts a stop.
                        self.guards.note_manual_compact();
                    }
                    let split = match partial {
                        None => Ok(None),
                        Some((direction, uuid)) => match self.view.iter().position(|r| r.uuid() == Some(uuid.as_str()))
                        {
                            // The split moves so no tool use is parted from its result.
                            Some(at) => {
                                let plan = ctxd_core::compact::partial_plan(&self.view, at, direction);
                                let split = match direction {
                                    ctxd_core::compact::SplitDirection::From => plan.summarize.start,
                                    ctxd_core::compact::SplitDirection::UpTo => plan.keep.start,
                                };
                                Ok(Some((direction, split)))
                            }
                            None => Err(SessionError::InvalidParams(format!(
                                "no record {uuid:?} in the session's current view"
                            ))),
                        },
                    };
                    match split {
                        Ok(partial) => {
                            self.start_compaction_with(trigger, instructions, Some(reply), progress, partial)
                        }
                        Err(e) => drop(reply.send(Err(e))),
                    }
                }
            }
            Command::UndoCompact { reply } => {
                let answer = self.undo_compact().await;
                let _ = reply.send(answer);
            }
            Command::CancelCompaction => {
                // Only a compaction whose requester is gone; an automatic one has none.
                let abandoned =
                    self.compaction.as_ref().is_some_and(|r| r.reply.as_ref().is_some_and(oneshot::Sender::is_closed));
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
                // Requests held at the blocked level go now, from the new view.
                for (request, reply) in std::mem::take(&mut self.waiting_assembles) {
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

    /// Writes a group of appends with one sync, then acknowledges each.
    async fn commit(&mut self, group: Vec<PendingAppend>) {
        if group.is_empty() {
            return;
        }
        let commit_started = Instant::now();
        // Drop records already stored (same uuid) or repeated within the group.
        let mut seen: HashSet<Arc<str>> = HashSet::new();
        let mut plan = Vec::with_capacity(group.len());
        let mut lines: Vec<Record> = Vec::new();
        for (records, reply) in group {
            let mut fresh = Vec::with_capacity(records.len());
            let mut duplicates = 0u64;
            for record in records {
                let dup = record.uuid().is_some_and(|u| self.uuids.contains(u) || !seen.insert(Arc::from(u)));
                if dup {
                    duplicates += 1;
                } else {
                    fresh.push(record);
                }
            }
            plan.push((fresh.len(), duplicates, reply));
            lines.extend(fresh);
        }
        let Some(mut transcript) = self.transcript.take() else {
            for (_, _, reply) in plan {
                let _ = reply.send(Err(SessionError::Internal("transcript is not open".into())));
            }
            return;
        };
        let text: Vec<Arc<str>> = lines.iter().map(|r| r.line_arc().clone()).collect();
        let written = tokio::task::spawn_blocking(move || {
            let write_started = Instant::now();
            let refs: Vec<&str> = text.iter().map(|l| l.as_ref()).collect();
            let result = if refs.is_empty() { Ok(Vec::new()) } else { transcript.append(&refs) };
            (transcript, result, (write_started, Instant::now()))
        })
        .await;
        let resumed = Instant::now();
        let (transcript, result, (write_started, synced)) = match written {
            Ok(pair) => pair,
            Err(e) => {
                // The blocking task panicked: the file handle is gone with it.
                let error = SessionError::Internal(format!("write task failed: {e}"));
                for (_, _, reply) in plan {
                    let _ = reply.send(Err(error.clone()));
                }
                return;
            }
        };
        self.transcript = Some(transcript);
        let offsets = match result {
            Ok(offsets) => offsets,
            Err(e) => {
                tracing::error!(error = %e, "append failed; nothing acknowledged");
                let error = SessionError::Store(e.to_string());
                for (_, _, reply) in plan {
                    let _ = reply.send(Err(error.clone()));
                }
                return;
            }
        };
        let mut boundary_seen = false;
        let mut undo_seen = false;
        let mut records = lines.into_iter().zip(offsets);
        let mut acks = Vec::with_capacity(plan.len());
        for (count, duplicates, reply) in plan {
            for (record, offset) in records.by_ref().take(count) {
                boundary_seen |= record.is_compact_boundary();
                undo_seen |= is_undo_record(&record);
                self.apply(record, Some(offset));
            }
            acks.push((count as u64, duplicates, self.total_records, reply));
        }
        if boundary_seen {
            self.flush_index();
        }
        // An undo takes the view back to an earlier boundary: its records come from disk.
        let restored = if undo_seen { self.restore_view().await } else { Ok(()) };
        let usage = self.usage();
        let turns = acks.iter().filter(|a| a.0 > 0).count();
        let steps = AppendSteps { commit_started, write_started, synced, resumed, answered: Instant::now() };
        for (appended, duplicates, records, reply) in acks {
            let ack = match &restored {
                Ok(()) => Ok(Appended { appended, duplicates, records, usage: usage.clone(), steps }),
                Err(e) => Err(SessionError::Store(format!(
                    "the records are stored, but the view could not be rebuilt after the undo: {e}"
                ))),
            };
            let _ = reply.send(ack);
        }
        for _ in 0..turns {
            self.guards.record_turn();
        }
        // Compacting the view an undo brought back would take the undo back at once; the
        // next append or request decides.
        if !undo_seen {
            self.maybe_auto_compact().await;
        }
        let usage = self.usage();
        self.usage_changed(usage).await;
    }

    /// Rebuilds the view after an undo record was stored. The boundary now in force lies
    /// before the one the view started at, so the records come from disk, read as a
    /// resume reads them (one scan for the compaction records, one read from that
    /// boundary on), and the index learns where the view starts now.
    async fn restore_view(&mut self) -> Result<(), SessionError> {
        let path = self.store.transcript_path(&self.id)?;
        let read = tokio::task::spawn_blocking(move || read_view(&path))
            .await
            .map_err(|e| SessionError::Internal(format!("reading task failed: {e}")))??;
        let offset = read.view_offset;
        self.fold_loaded(read.records, read.records_before, offset, false);
        self.flush_index();
        tracing::info!(records = self.view.len(), boundary_offset = ?offset, "view restored after an undo");
        Ok(())
    }

    /// `ctx/undoCompact`: appends the record that undoes the latest compaction not undone
    /// yet, as long as no new turn followed it; [`Session::commit`] then brings back the
    /// view it replaced and pushes the usage.
    async fn undo_compact(&mut self) -> Result<UndoAnswer, SessionError> {
        self.drop_precompute();
        if self.compaction.is_some() {
            return Err(SessionError::Busy(
                "a compaction of this session is running; undo after it is installed".into(),
            ));
        }
        let boundary = undo_target(&self.view).map_err(SessionError::CannotUndo)?;
        let Some(undone) = boundary.uuid().map(str::to_owned) else {
            return Err(SessionError::InvalidParams(
                "the latest compact boundary has no uuid, so no record can name it".into(),
            ));
        };
        let common = self.view.iter().rev().find(|r| r.uuid().is_some()).map(common_fields).unwrap_or_default();
        let uuid = uuid::Uuid::new_v4().to_string();
        let record = build_undo_record(boundary, &common, &uuid, &now_rfc3339())
            .map_err(|e| SessionError::Internal(e.to_string()))?;
        let pre_tokens = self.next_tokens();
        let (tx, rx) = oneshot::channel();
        self.commit(vec![(vec![record], tx)]).await;
        rx.await.map_err(|_| SessionError::Closed(self.id.clone()))??;
        tracing::info!(boundary = %undone, pre_tokens, post_tokens = self.next_tokens(), "compaction undone");
        Ok(UndoAnswer {
            boundary: undone,
            undo_record: uuid,
            pre_tokens,
            post_tokens: self.next_tokens(),
            usage: self.usage(),
        })
    }

    /// An explicit read: measure the file now, store a marker record (so the ledger can be
    /// rebuilt from the transcript), record it in the ledger.
    async fn file_read(
        &mut self,
        path: String,
        start_line: Option<u64>,
        num_lines: Option<u64>,
    ) -> Result<FileReadAnswer, SessionError> {
        let reading = path.clone();
        let text = tokio::task::spawn_blocking(move || {
            crate::outside::read(std::path::Path::new(&reading), crate::outside::READ_FILE)
        })
        .await
        .map_err(|e| SessionError::Internal(format!("read task failed: {e}")))?
        .map_err(|e| SessionError::InvalidParams(format!("cannot read {path}: {e}")))?;
        let text = String::from_utf8_lossy(&text);
        let marker = ReadMarker::measure(&path, &text, start_line, num_lines, Some(now_rfc3339()));
        let before = self.ledger.get(&path).cloned();
        let record = Record::from_object(&marker.to_record(&uuid::Uuid::new_v4().to_string()))
            .map_err(|e| SessionError::Internal(format!("marker record: {e}")))?;
        let (tx, rx) = oneshot::channel();
        self.commit(vec![(vec![record], tx)]).await;
        rx.await.map_err(|_| SessionError::Closed(self.id.clone()))??;
        let entry =
            self.ledger.get(&path).cloned().ok_or_else(|| SessionError::Internal("ledger entry missing".into()))?;
        let outcome = match before {
            None => ReadOutcome::New,
            Some(old) => ReadOutcome::Reread {
                unchanged: old.hash == entry.hash
                    && old.start_line == entry.start_line
                    && old.num_lines == entry.num_lines,
            },
        };
        Ok(FileReadAnswer { outcome, entry })
    }

    fn usage(&self) -> UsageSnapshot {
        let compacting = self.compaction.as_ref().is_some_and(|r| !r.ahead);
        UsageSnapshot::compute(&self.tally, &self.shape(), &self.thresholds, compacting)
    }

    /// Builds the next request: base context rebuilt if a source changed, changed files
    /// and newly activated memory files appended as attachment records (so resume
    /// rebuilds the same request), the pipeline run on the view, its state changes
    /// persisted before the request is handed out.
    async fn assemble(
        &mut self,
        mut request: AssembleRequest,
        may_compact: bool,
    ) -> Result<AssembleAnswer, SessionError> {
        let started = Instant::now();
        // Without a working watcher (the OS limit was hit), compare stamps instead.
        if self.setup.services.watcher.degraded() {
            let seen = std::mem::take(&mut self.stamps);
            let memory: Vec<std::path::PathBuf> =
                self.base.as_ref().map(|b| b.watch_targets().into_iter().map(|(p, _)| p).collect()).unwrap_or_default();
            let reads: Vec<LedgerEntry> = self.ledger.newest_first().into_iter().cloned().collect();
            let (changed, stamps) =
                tokio::task::spawn_blocking(move || crate::context::watcher::look_again(&seen, memory, &reads))
                    .await
                    .unwrap_or_default();
            self.stamps = stamps;
            if !changed.is_empty() {
                self.files_changed(changed).await;
            }
            self.resubscribe();
        }
        if self.base.as_ref().is_some_and(BaseContext::is_dirty)
            && let Some(mut base) = self.base.take()
        {
            let services = self.setup.services.clone();
            let reads = self.reads_since_compaction();
            let rebuilt = tokio::task::spawn_blocking(move || {
                base.rebuild_if_dirty(&services.memory_cache, &services.fs, &reads);
                base
            })
            .await
            .map_err(|e| SessionError::Internal(format!("base context task failed: {e}")))?;
            self.base = Some(rebuilt);
            self.resubscribe();
        }
        let notes = self.take_context_notes().await;
        if !notes.is_empty() {
            let records =
                notes.into_iter().map(|(kind, text)| attachment_record(kind, &text)).collect::<Result<Vec<_>, _>>()?;
            let (tx, rx) = oneshot::channel();
            self.commit(vec![(records, tx)]).await;
            rx.await.map_err(|_| SessionError::Closed(self.id.clone()))??;
        }
        let host = HostBlocks {
            system: &request.system,
            tools: &request.tools,
            max_tokens: request.max_tokens,
            thinking: request.thinking.as_ref(),
        };
        let assembled = self.run_pipeline(host, request.fork.as_ref());
        let tool_results_dir = self.tool_results_dir();
        let (system_bytes, tools_bytes) = (json_len(&request.system), json_len(&request.tools));
        let rate = self.tally.calibration;
        self.host_prefix =
            HostPrefix { system: rate.tokens(system_bytes as u64), tools: rate.tokens(tools_bytes as u64) };
        if request.fork.is_none() {
            // Before a compaction can start below: its parent is this request.
            let system = std::mem::take(&mut request.system);
            let tools = std::mem::take(&mut request.tools);
            let thinking = request.thinking.take();
            self.host_request = Some(Arc::new(HostRequest { system, tools, max_tokens: request.max_tokens, thinking }));
        }
        // Persist what the pipeline decided (offloaded results, cleared results,
        // reminders) before anyone sees a request that depends on it.
        if !assembled.new_state.is_empty() {
            let offloads: Vec<(String, String)> =
                assembled.new_state.offloads.iter().map(|o| (o.replacement.path.clone(), o.content.clone())).collect();
            let dir = tool_results_dir.clone();
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                crate::store::create_private_dir(std::path::Path::new(&dir))
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                for (path, content) in offloads {
                    std::fs::write(path, content)?;
                }
                Ok(())
            })
            .await
            .map_err(|e| SessionError::Internal(format!("offload task failed: {e}")))?
            .map_err(|e| SessionError::Store(format!("writing offloaded tool results: {e}")))?;
            let records = assembled
                .new_state
                .records()
                .into_iter()
                .map(|mut object| {
                    object.insert("uuid".into(), uuid::Uuid::new_v4().to_string().into());
                    object.insert("timestamp".into(), now_rfc3339().into());
                    Record::from_object(&object).map_err(|e| SessionError::Internal(e.to_string()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let (tx, rx) = oneshot::channel();
            self.commit(vec![(records, tx)]).await;
            rx.await.map_err(|_| SessionError::Closed(self.id.clone()))??;
        }
        let mut compact = false;
        if let ctxd_core::view::CompactDecision::Compact { tokens, .. } = assembled.decision
            && may_compact
            && self.thresholds.auto_compact_enabled
        {
            // Through the same guards as after an append: a stopped session (thrashing,
            // circuit breaker) does not compact from here either, and says "continue".
            let view_before = self.view_generation;
            self.auto_compact_guarded(tokens.max(self.next_tokens()), false).await;
            // Running now, or a summary prepared ahead was installed just now: either
            // way the host waits for the compacted view.
            compact =
                self.compaction.as_ref().is_some_and(|running| !running.ahead) || self.view_generation != view_before;
        }
        // The UI's view: after the state records above, so it marks what this request
        // already left out.
        let scrollback = request.include_snipped.then(|| {
            let (state, config) =
                (ctxd_core::view::PipelineState::default(), ctxd_core::view::PipelineConfig::default());
            ctxd_core::view::scrollback(&self.view, &state, &config)
        });
        // A host that kept the request it was sent last is sent only what changed since:
        // the per-turn answer stays the size of the turn, not of the session.
        let messages_from = match (&request.since, &self.last_sent) {
            (Some(since), Some(last)) if *since == last.revision => {
                ctxd_core::view::shared_messages(&last.messages, &assembled.request.messages)
            }
            _ => 0,
        };
        let revision = next_revision();
        // The messages are kept for the next `since`: a whole request shares them with
        // the answer, a tail is cut from them.
        let (request, kept) = if messages_from == 0 {
            let kept = assembled.request.messages.clone();
            (assembled.request, kept)
        } else {
            (assembled.request.messages_from(messages_from), assembled.request.messages)
        };
        self.last_sent = Some(SentRequest { revision: revision.clone(), messages: kept });
        // The host's blocks, the model and the envelope's few fields on top of the
        // messages, whose length is exact.
        let request_len_hint = request.messages_json_len() + system_bytes + tools_bytes + request.model.len() + 256;
        Ok(AssembleAnswer {
            request,
            request_len_hint,
            revision,
            messages_from,
            request_tokens: assembled.estimate_tokens,
            usage: self.usage(),
            applied: assembled.applied,
            compact,
            scrollback,
            steps: AssembleSteps { started, built: Instant::now() },
        })
    }

    /// Appends a snip or collapse record; the pipeline applies it at read time and the
    /// tally stops counting what it removed.
    async fn reduce(&mut self, reduction: Reduction) -> Result<Reduced, SessionError> {
        let rate = self.tally.calibration;
        let tokens_of = |r: &Record| rate.tokens(u64::from(r.head().content_bytes));
        let position = |uuid: &str| self.view.iter().position(|r| r.uuid() == Some(uuid));
        let (object, freed, unknown) = match reduction {
            Reduction::Snip { uuids } => {
                let (known, unknown): (Vec<String>, Vec<String>) =
                    uuids.into_iter().partition(|u| position(u).is_some());
                if known.is_empty() {
                    return Err(SessionError::InvalidParams(format!(
                        "no record of the current view has these uuids: {unknown:?}"
                    )));
                }
                let freed = self
                    .view
                    .iter()
                    .filter(|r| r.uuid().is_some_and(|u| known.iter().any(|k| k == u)))
                    .map(tokens_of)
                    .sum();
                (serde_json::json!({"type": ctxd_core::view::SNIP_RECORD, "removedUuids": known}), freed, unknown)
            }
            Reduction::Collapse { from, to, summary } => {
                let (Some(a), Some(b)) = (position(&from), position(&to)) else {
                    return Err(SessionError::InvalidParams(format!(
                        "the span {from}..{to} is not in the current view"
                    )));
                };
                let (a, b) = (a.min(b), a.max(b));
                let span = self.view[a..=b].to_vec();
                let summary = match summary {
                    Some(s) => s,
                    None => {
                        let options =
                            ctxd_core::summary::OfflineOptions { max_output_tokens: 2_000, ..Default::default() };
                        let written = ctxd_core::summary::summarize_offline(&span, &options);
                        ctxd_core::summary::parse_summary_reply(&written.text).unwrap_or(written.text)
                    }
                };
                let freed = span.iter().map(tokens_of).sum::<u64>().saturating_sub(summary.len() as u64 / 4);
                (
                    serde_json::json!({"type": ctxd_core::view::COLLAPSE_RECORD, "from": from, "to": to, "summary": summary}),
                    freed,
                    Vec::new(),
                )
            }
        };
        let uuid = uuid::Uuid::new_v4().to_string();
        let mut object = object.as_object().cloned().unwrap_or_default();
        object.insert("uuid".into(), uuid.clone().into());
        object.insert("timestamp".into(), now_rfc3339().into());
        let record = Record::from_object(&object).map_err(|e| SessionError::Internal(e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        self.commit(vec![(vec![record], tx)]).await;
        rx.await.map_err(|_| SessionError::Closed(self.id.clone()))??;
        self.tally.freed(freed);
        let usage = self.usage();
        self.usage_changed(usage.clone()).await;
        Ok(Reduced { record_uuid: uuid, tokens_freed: freed, unknown, usage })
    }

    /// The request pipeline over the view with the host's blocks and the base context.
    /// `ctx/assemble` and a compaction's parent both come from here, so the fork's prefix
    /// is the bytes the host is sent (and the provider cached). Decisions it makes come
    /// back in `new_state`; `assemble` persists them, and the view cache makes them
    /// again until they are.
    fn run_pipeline(
        &mut self,
        host: HostBlocks<'_>,
        fork: Option<&ctxd_core::view::Fork>,
    ) -> ctxd_core::view::Assembled {
        let base = ctxd_core::view::BaseContext {
            system_context: self.base.as_ref().and_then(|b| b.system_context().map(|s| s.to_string())),
            user_context: self.base.as_ref().and_then(|b| b.user_context().map(|s| s.to_string())),
            attachments: Vec::new(),
        };
        let tool_results_dir = self.tool_results_dir();
        let state = ctxd_core::view::PipelineState::default();
        let config = ctxd_core::view::PipelineConfig::default();
        let now_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let threshold = (self.thresholds.auto_compact_enabled && self.thresholds.enforce_window)
            .then_some(self.thresholds.threshold);
        let anchored_tokens = Some(self.next_tokens());
        let input = ctxd_core::view::AssembleInput {
            records: &self.view,
            system: host.system,
            tools: host.tools,
            model: &self.setup.model,
            max_tokens: host.max_tokens,
            thinking: host.thinking,
            fork,
            base: &base,
            now_ms,
            state: &state,
            config: &config,
            tool_results_dir: &tool_results_dir,
            compact: ctxd_core::view::CompactCheck { threshold, anchored_tokens },
        };
        self.view_cache.assemble(&input)
    }

    /// Where the pipeline offloads this session's large tool results.
    fn tool_results_dir(&self) -> String {
        self.store.root().join("tool-results").join(&self.id).display().to_string()
    }

    /// The view as a plain request body (no host blocks): what a provider summarizes.
    fn parent_request(&self, records: &[Record]) -> serde_json::Value {
        let base = ctxd_core::view::BaseContext::default();
        let input = ctxd_core::view::AssembleInput {
            records,
            system: &[],
            tools: &[],
            model: &self.setup.model,
            max_tokens: 20_000,
            thinking: None,
            fork: None,
            base: &base,
            now_ms: 0,
            state: &ctxd_core::view::PipelineState::default(),
            config: &ctxd_core::view::PipelineConfig::default(),
            tool_results_dir: "",
            compact: ctxd_core::view::CompactCheck::default(),
        };
        ctxd_core::view::assemble(&input).request.to_value()
    }

    /// A budget notice when the context crossed 70, 85 or 95 % of the compaction
    /// threshold since the last one (once per crossing).
    fn budget_notice(&mut self) -> Option<String> {
        let threshold = self.thresholds.threshold;
        if threshold == 0 || !self.thresholds.compact_enabled {
            return None;
        }
        let tokens = self.next_tokens();
        let percent = tokens.saturating_mul(100) / threshold;
        let crossed = [95u8, 85, 70].into_iter().find(|p| percent >= u64::from(*p));
        match crossed {
            None => {
                self.notified_percent = 0;
                None
            }
            Some(p) if p > self.notified_percent => {
                self.notified_percent = p;
                let left = threshold.saturating_sub(tokens);
                Some(format!(
                    "Context budget: {p}% of the room before automatic compaction is used; about {left} tokens are left. \
                     When it compacts, the conversation becomes a summary: project instructions are reloaded from disk and \
                     up to five recently read files come back, but details of earlier tool output do not. Keep track of open \
                     tasks and decisions in files or in your replies."
                ))
            }
            Some(_) => None,
        }
    }

    /// Changed read files (once each), memory files activated by reads since the last
    /// request, and a budget notice on crossing, as (attachment type, text).
    async fn take_context_notes(&mut self) -> Vec<(&'static str, String)> {
        let mut notes: Vec<(&'static str, String)> =
            std::mem::take(&mut self.pending_notes).into_iter().map(|n| ("nested_memory", n)).collect();
        if let Some(notice) = self.budget_notice() {
            notes.push(("total_tokens_reminder", notice));
        }
        let stale: Vec<LedgerEntry> = self.ledger.newest_first().into_iter().filter(|e| e.stale).cloned().collect();
        if stale.is_empty() {
            return notes;
        }
        // The text as the agent read it, when its record is still in the view.
        let old_texts: Vec<Option<String>> = stale
            .iter()
            .map(|e| {
                let uuid = e.source_uuid.as_deref()?;
                let record = self.view.iter().rev().find(|r| r.uuid() == Some(uuid))?;
                file_read_in(record).map(|r| r.content)
            })
            .collect();
        let reads = stale.clone();
        let texts = tokio::task::spawn_blocking(move || {
            reads
                .iter()
                .map(|e| crate::outside::read_text(std::path::Path::new(&e.path), crate::outside::READ_FILE).ok())
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for ((entry, old), new) in stale.iter().zip(old_texts).zip(texts) {
            self.ledger.clear_stale(&entry.path);
            let text = match new {
                Some(new) => {
                    ctxd_core::ledger::changed_file_note(&entry.path, old.as_deref(), &new, CHANGED_FILE_BUDGET_TOKENS)
                }
                None => format!("The file {} was deleted or can no longer be read since you read it.", entry.path),
            };
            notes.push(("edited_text_file", text));
        }
        notes
    }

    /// Tokens compaction cannot remove: memory files now (system prompt and tools are the
    /// host's and counted once `ctx/assemble` sees them).
    /// The parts of the next request that no compaction can remove.
    fn fixed_prefix(&self) -> u64 {
        let prefix = self.shape().prefix;
        prefix.system_prompt + prefix.tools + prefix.memory_files
    }

    /// What the session knows of its next request beyond the tally.
    fn shape(&self) -> Shape {
        let base = self.base.as_ref();
        let rate = self.tally.calibration;
        let system_context = base.and_then(BaseContext::system_context).map_or(0, |s| rate.tokens(s.len() as u64));
        Shape {
            prefix: Prefix {
                system_prompt: self.host_prefix.system + system_context,
                tools: self.host_prefix.tools,
                memory_files: base.map_or(0, BaseContext::memory_tokens),
                skills: rate.tokens(self.invoked.skill_bytes()),
            },
            pending: self.pending_notes.iter().map(|n| rate.tokens(n.len() as u64)).sum(),
            composition: self.composition,
        }
    }

    /// Tokens the next request carries: the one figure for usage, levels and triggers.
    fn next_tokens(&self) -> u64 {
        let shape = self.shape();
        ctxd_core::breakdown::next_request_tokens(&self.tally, &shape.prefix, shape.pending)
    }

    /// Takes a snapshot and runs the slow part of a compaction in the background.
    fn start_compaction(
        &mut self,
        trigger: Trigger,
        focus: Option<String>,
        reply: Option<oneshot::Sender<Result<CompactAnswer, SessionError>>>,
        progress: Option<super::Progress>,
    ) {
        self.start_compaction_with(trigger, focus, reply, progress, None);
    }

    fn start_compaction_with(
        &mut self,
        trigger: Trigger,
        focus: Option<String>,
        reply: Option<oneshot::Sender<Result<CompactAnswer, SessionError>>>,
        progress: Option<super::Progress>,
        partial: Option<(ctxd_core::compact::SplitDirection, usize)>,
    ) {
        self.compaction_generation += 1;
        let generation = self.compaction_generation;
        let pre_tokens = self.next_tokens();
        // The request the host would be sent now, to fork; a partial compaction
        // summarizes only the side it replaces, which no host request ever was.
        let (parent, host_parent) = match (partial, self.host_request.clone()) {
            (None, Some(host)) => (self.run_pipeline(host.blocks(), None).request.to_value(), true),
            (None, None) => (self.parent_request(&self.view), false),
            (Some((ctxd_core::compact::SplitDirection::UpTo, split)), _) => {
                (self.parent_request(&self.view[..split]), false)
            }
            (Some((ctxd_core::compact::SplitDirection::From, split)), _) => {
                (self.parent_request(&self.view[split..]), false)
            }
        };
        let job = Job {
            session_id: self.id.clone(),
            trigger,
            focus,
            records: self.view.clone(),
            ledger: self.ledger.newest_first().into_iter().cloned().collect(),
            pre_tokens,
            threshold: self.thresholds.threshold,
            fixed_prefix: self.fixed_prefix(),
            settings: self.setup.settings.clone(),
            transcript_path: self.transcript.as_ref().map(|t| t.path().display().to_string()).unwrap_or_default(),
            cwd: self.setup.cwd.clone(),
            model: self.setup.model.clone(),
            parent: Some(parent),
            host_parent,
            partial,
            skills: self.invoked.skills.clone(),
            plan_path: self.invoked.plan_path.clone(),
            progress: progress.clone(),
        };
        tracing::info!(?trigger, pre_tokens, records = job.records.len(), "compaction started");
        self.compaction = Some(Running {
            generation,
            trigger,
            started: Instant::now(),
            pre_tokens,
            view_generation: self.view_generation,
            reply,
            task: None,
            progress,
            snapshot_len: self.view.len(),
            ledger_saved: Some(self.save_ledger()),
            ahead: false,
        });
        let tx = self.self_tx.clone();
        let task = tokio::spawn(async move {
            let result = compaction::prepare(job).await;
            let _ = tx.send(Command::CompactionDone { generation, result });
        });
        if let Some(running) = &mut self.compaction {
            running.task = Some(task.abort_handle());
        }
    }

    /// Installs a prepared compaction, or reports its failure.
    async fn compaction_done(&mut self, generation: u64, result: Result<Prepared, CompactFailure>) {
        let Some(running) = self.compaction.take_if(|r| r.generation == generation) else {
            return;
        };
        let Running {
            trigger,
            started,
            pre_tokens,
            view_generation,
            reply,
            progress,
            snapshot_len,
            ledger_saved,
            ahead,
            ..
        } = running;
        // The index must hold every read before the new boundary before the boundary is
        // written; the bulk went off the actor when the compaction started.
        if let Some(saved) = ledger_saved {
            let _ = saved.await;
        }
        if ahead {
            match result {
                Ok(prepared) if view_generation == self.view_generation => {
                    tracing::info!(
                        estimated_post = prepared.estimated_post_tokens,
                        "summary prepared ahead of the threshold"
                    );
                    self.ahead = Some(Ahead { prepared, view_generation, snapshot_len });
                }
                Ok(_) => tracing::info!("summary prepared ahead dropped: the view changed meanwhile"),
                Err(failure) => {
                    // Nothing is lost: at the threshold a normal compaction runs.
                    tracing::info!(%failure, "preparing a summary ahead failed; the threshold will compact normally");
                    self.ahead_failed = Some(view_generation);
                }
            }
            // The threshold may have come meanwhile.
            self.maybe_auto_compact().await;
            return;
        }
        let cancelled = reply.as_ref().is_some_and(oneshot::Sender::is_closed);
        let outcome = match result {
            _ if cancelled => {
                Err(SessionError::Cancelled("the compaction was cancelled; nothing was installed".into()))
            }
            _ if view_generation != self.view_generation => Err(SessionError::Busy(
                "the session was compacted by another path meanwhile; this compaction was dropped".into(),
            )),
            // Kept before the summary, the records appended meanwhile would have no place.
            Ok(prepared) if prepared.kept_before.is_some() && self.view.len() != snapshot_len => {
                Err(SessionError::Busy(
                    "records were appended during the partial compaction; nothing was installed, try again".into(),
                ))
            }
            Ok(prepared) => self.install(trigger, started, pre_tokens, prepared).await,
            Err(failure) => Err(SessionError::CompactFailed(failure.to_string())),
        };
        self.finish_compaction(trigger, outcome, reply, progress).await;
    }

    /// Tells everyone how a compaction ended: its `$/progress`, `ctx/compacted` or
    /// `ctx/compactFailed`, the requester, the guards, the status bars.
    async fn finish_compaction(
        &mut self,
        trigger: Trigger,
        outcome: Result<CompactAnswer, SessionError>,
        reply: Option<oneshot::Sender<Result<CompactAnswer, SessionError>>>,
        progress: Option<super::Progress>,
    ) {
        if let Some(progress) = &progress {
            let message = match &outcome {
                Ok(answer) => format!("compacted {} → {} tokens", answer.pre_tokens, answer.post_tokens),
                Err(e) => format!("not compacted: {e}"),
            };
            progress.end(message).await;
        }
        match &outcome {
            Ok(answer) => {
                tracing::info!(?trigger, pre = answer.pre_tokens, post = answer.post_tokens, "compaction installed");
                self.notifier.compacted(&self.id, trigger, answer.pre_tokens, answer.post_tokens).await;
            }
            Err(e) => {
                tracing::warn!(?trigger, error = %e, "compaction failed");
                if let Some(stop) = self.guards.record_failure(trigger, &e.to_string()) {
                    self.notifier.compact_failed(&self.id, &stop.message()).await;
                } else if reply.is_none() {
                    self.notifier.compact_failed(&self.id, &e.to_string()).await;
                }
            }
        }
        if let Some(reply) = reply {
            let _ = reply.send(outcome);
        }
        let usage = self.usage();
        self.usage_changed(usage).await;
    }

    /// Appends the post-compact records in one batch (one sync), keeping every record
    /// appended since the snapshot after the summary, then reloads the base context.
    async fn install(
        &mut self,
        trigger: Trigger,
        started: Instant,
        pre_tokens: u64,
        prepared: Prepared,
    ) -> Result<CompactAnswer, SessionError> {
        let kept: Vec<Record> = self.view.get(prepared.kept_from..).map(<[Record]>::to_vec).unwrap_or_default();
        let kept_before: Vec<Record> =
            prepared.kept_before.and_then(|n| self.view.get(..n)).map(<[Record]>::to_vec).unwrap_or_default();
        let last = self.view.iter().rev().find(|r| r.uuid().is_some());
        let common = last.map(common_fields).unwrap_or_default();
        let input = InstallInput {
            trigger,
            last_uuid: last.and_then(|r| r.uuid().map(str::to_owned)),
            pre_tokens,
            fixed_prefix_tokens: Some(self.fixed_prefix()),
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            summary_text: prepared.summary_text.clone(),
            kept_before: &kept_before,
            kept_after: &kept,
            attachments: &prepared.attachments,
            hook_outputs: &prepared.hook_outputs,
            common,
            timestamp: now_rfc3339(),
        };
        let post = build_post_compact(&input, &mut || uuid::Uuid::new_v4().to_string())
            .map_err(|e| SessionError::CompactFailed(e.to_string()))?;
        let count = post.records.len();
        let mut records = post.records;
        // The boundary says how many records its install has, to recognise a torn one.
        if let Some(first) = records.first_mut() {
            let mut value = first.to_value();
            value["compactMetadata"][BATCH_FIELD] = serde_json::json!(count);
            if !post.referenced.is_empty() {
                value["compactMetadata"][ctxd_core::preserved::REFERENCES_FIELD] = serde_json::json!(true);
            }
            value["compactMetadata"][RATE_FIELD] = serde_json::json!(self.tally.calibration.tokens_per_kib);
            if let Some(object) = value.as_object() {
                *first = Record::from_object(object).map_err(|e| SessionError::Internal(e.to_string()))?;
            }
        }
        let (tx, rx) = oneshot::channel();
        self.commit(vec![(records, tx)]).await;
        rx.await.map_err(|_| SessionError::Closed(self.id.clone()))??;
        // Instructions come back from disk, not from what the summary kept.
        self.base_reads_from = self.ledger.last_sequence();
        if let Some(mut base) = self.base.take() {
            let services = self.setup.services.clone();
            if let Ok(base) = tokio::task::spawn_blocking(move || {
                base.reload(&services.memory_cache, &services.fs);
                base
            })
            .await
            {
                self.base = Some(base);
                self.resubscribe();
            }
        }
        self.guards.record_success(trigger);
        let post_tokens = self.next_tokens();
        let transcript_path = self.transcript.as_ref().map(|t| t.path().display().to_string()).unwrap_or_default();
        tokio::spawn(compaction::after_install(
            self.setup.settings.clone(),
            self.id.clone(),
            transcript_path,
            trigger,
            prepared.summary.clone(),
        ));
        Ok(CompactAnswer {
            boundary: post.boundary_uuid,
            trigger,
            pre_tokens,
            post_tokens,
            summary: prepared.summary,
            summarizer: prepared.summarizer,
            fidelity_appended: prepared.fidelity.missing_before.len(),
            problems: prepared.problems,
        })
    }

    /// When an idle compaction would be due, if it could be.
    fn idle_deadline(&self) -> Option<tokio::time::Instant> {
        let after = self.setup.idle_after?;
        let worth = !self.idle_done && self.compaction.is_none() && self.thresholds.compact_enabled;
        worth.then(|| self.last_activity + after)
    }

    /// The user is away: compact in the background while the prompt cache is still
    /// warm, if the session is big enough to be worth it.
    async fn idle(&mut self) {
        self.idle_done = true;
        let tokens = self.next_tokens();
        if let Some(stopped) = &self.guards.stopped {
            tracing::info!(reason = %stopped.message(), "session idle; automatic compaction is stopped, so no idle compaction");
            return;
        }
        if tokens >= self.setup.idle_floor && self.compaction.is_none() {
            tracing::info!(tokens, "session idle; compacting in the background");
            self.start_compaction(Trigger::Idle, None, None, None);
        }
    }

    /// After appends: compact when the threshold is reached (installing a summary
    /// prepared ahead if there is a usable one), or start preparing one when the session
    /// is close to it.
    async fn maybe_auto_compact(&mut self) {
        let running_ahead = self.compaction.as_ref().map(|r| r.ahead);
        if running_ahead == Some(false) {
            return;
        }
        let tokens = self.next_tokens();
        self.auto_compact_guarded(tokens, running_ahead.is_none()).await;
    }

    /// Automatic compaction at `tokens`, if the guards allow it; below the threshold,
    /// starts preparing a summary ahead when `may_prepare`.
    async fn auto_compact_guarded(&mut self, tokens: u64, may_prepare: bool) {
        match self.guards.check_auto(tokens, &self.thresholds, self.fixed_prefix()) {
            AutoDecision::Compact => self.auto_compact_now().await,
            AutoDecision::Stopped { message, notify: true, .. }
            | AutoDecision::CannotHelp { message, notify: true, .. } => {
                self.notifier.compact_failed(&self.id, &message).await;
            }
            AutoDecision::NotDue if may_prepare => self.maybe_prepare_ahead(tokens),
            _ => {}
        }
    }

    /// The threshold is reached: a summary being prepared ahead becomes this compaction;
    /// one already prepared is installed with what was appended since, if it still
    /// leaves room; otherwise a compaction starts.
    async fn auto_compact_now(&mut self) {
        if let Some(running) = &mut self.compaction {
            if running.ahead {
                tracing::info!("threshold reached while a summary was being prepared ahead; installing it when ready");
                running.ahead = false;
                running.trigger = Trigger::Auto;
            }
            return;
        }
        if let Some(outcome) = self.install_ahead().await {
            self.finish_compaction(Trigger::Precomputed, outcome, None, None).await;
            return;
        }
        self.start_compaction(Trigger::Auto, None, None, None);
    }

    /// Installs the summary prepared ahead, if there is one and it still leaves room
    /// (`None` otherwise: the caller compacts normally).
    async fn install_ahead(&mut self) -> Option<Result<CompactAnswer, SessionError>> {
        let ahead = self.ahead.take()?;
        let rate = self.tally.calibration;
        let appended_since: u64 = self
            .view
            .get(ahead.snapshot_len..)
            .unwrap_or_default()
            .iter()
            .map(|r| rate.tokens(u64::from(r.head().content_bytes)))
            .sum();
        let same_view = ahead.view_generation == self.view_generation;
        match ctxd_core::compact::ahead::check_prepared(
            ahead.prepared.estimated_post_tokens,
            appended_since,
            same_view,
            &self.thresholds,
        ) {
            Ok(estimate) => {
                tracing::info!(estimate, appended_since, "installing the summary prepared ahead");
                let started = Instant::now();
                let pre_tokens = self.next_tokens();
                // Boxed: installing appends, and appending may compact.
                Some(Box::pin(self.install(Trigger::Precomputed, started, pre_tokens, ahead.prepared)).await)
            }
            Err(stale) => {
                tracing::info!(?stale, "summary prepared ahead not used; compacting now");
                None
            }
        }
    }

    /// Starts preparing a summary in the background once the session passes the
    /// precompute start, unless one is ready or failed on this view.
    fn maybe_prepare_ahead(&mut self, tokens: u64) {
        let ready = self.ahead.as_ref().is_some_and(|a| a.view_generation == self.view_generation);
        let failed = self.ahead_failed == Some(self.view_generation);
        if ready || failed || !self.thresholds.compact_enabled || self.guards.stopped.is_some() {
            return;
        }
        if !ctxd_core::compact::ahead::should_prepare(tokens, &self.thresholds) {
            return;
        }
        self.start_compaction(Trigger::Precomputed, None, None, None);
        if let Some(running) = &mut self.compaction {
            running.ahead = true;
        }
    }

    /// Stops preparing a summary ahead (another compaction or an undo replaces it).
    fn drop_precompute(&mut self) {
        if let Some(running) = self.compaction.take_if(|r| r.ahead) {
            if let Some(task) = running.task {
                task.abort();
            }
            tracing::info!("preparing a summary ahead stopped");
        }
    }

    /// Pushes `ctx/usageChanged` when the usage changed, at most once per
    /// [`USAGE_PUSH_INTERVAL`]; a change inside the interval is sent when it ends, so the
    /// last state always arrives.
    async fn usage_changed(&mut self, usage: UsageSnapshot) {
        if self.push.last_usage.as_ref() == Some(&usage) {
            return;
        }
        let now = Instant::now();
        match self.push.last_sent {
            Some(at) if now.duration_since(at) < USAGE_PUSH_INTERVAL => {
                if self.push.due.is_none() {
                    self.push.due = Some(tokio::time::Instant::from_std(at + USAGE_PUSH_INTERVAL));
                }
            }
            _ => self.push_usage_now().await,
        }
    }

    async fn push_usage_now(&mut self) {
        self.push.due = None;
        let usage = self.usage();
        if self.push.last_usage.as_ref() == Some(&usage) {
            return;
        }
        self.push.last_sent = Some(Instant::now());
        self.push.last_usage = Some(usage.clone());
        self.notifier.usage_changed(&self.id, usage).await;
    }
}

struct LoadResult {
    transcript: Transcript,
    /// Records of the view with their byte offsets.
    records: Vec<(u64, Record)>,
    records_before: u64,
    view_offset: Option<u64>,
    damaged: Vec<String>,
    torn_bytes: u64,
    rebuilt_index: bool,
    /// Records before the boundary that carry file reads (only when the index had to be
    /// rebuilt, so its ledger entries are missing).
    earlier: Vec<Record>,
}

/// Opens the transcript and reads it from the latest compact boundary. Runs on a
/// blocking thread.
/// Most tokens of a changed-file note (a diff or the new content).
const CHANGED_FILE_BUDGET_TOKENS: u64 = 4_000;

/// An attachment record ctxd adds to the session (a changed file, a memory file a read
/// activated): the model sees its rendered text once, where it was added.
/// The length of `values` as JSON text, counted as it is written (nothing is kept).
fn json_len(values: &[serde_json::Value]) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, values).map_or(0, |()| count.0)
}

fn attachment_record(kind: &str, text: &str) -> Result<Record, SessionError> {
    let value = serde_json::json!({
        "type": "attachment",
        "uuid": uuid::Uuid::new_v4().to_string(),
        "timestamp": now_rfc3339(),
        "isSidechain": false,
        "attachment": {"type": kind, "source": "ctxd"},
        "rendered": [{"content": format!("<system-reminder>\n{text}\n</system-reminder>")}],
        "renderedRole": "user",
    });
    let object = value.as_object().ok_or_else(|| SessionError::Internal("attachment is not an object".into()))?;
    Record::from_object(object).map_err(|e| SessionError::Internal(e.to_string()))
}

/// Number of records a compaction installs, written on its boundary so that a crash in
/// the middle of the install is recognised on resume.
pub const BATCH_FIELD: &str = "ctxdBatch";

/// The session's learned tokens-per-KiB rate when it compacted, written on the boundary
/// so a resumed session estimates what follows exactly as the live one did.
const RATE_FIELD: &str = "ctxdTokensPerKib";

fn boundary_rate(boundary: &Record) -> Option<u64> {
    if !boundary.line().contains(RATE_FIELD) {
        return None;
    }
    boundary.to_value()["compactMetadata"][RATE_FIELD].as_u64()
}

/// When the view starts at a boundary whose install batch is not all there (the daemon
/// died while writing it), the install never happened: the view is the one before it.
fn torn_install(records: &[(u64, Record)]) -> Option<u64> {
    let last = records.iter().rposition(|(_, r)| r.is_compact_boundary())?;
    let (offset, boundary) = &records[last];
    if !boundary.line().contains(BATCH_FIELD) {
        return None;
    }
    let batch = boundary.to_value()["compactMetadata"][BATCH_FIELD].as_u64().unwrap_or(0);
    ((records.len() - last) as u64 <= batch.saturating_sub(1)).then_some(*offset)
}

/// Puts the messages the first record (the boundary the view starts at) keeps from
/// before it in front of `records`, read back from the file; nothing when it keeps none
/// or they cannot be found (logged: the view then lacks them, as it did before).
fn with_preserved(path: &std::path::Path, records: &mut Vec<(u64, Record)>) -> Result<(), SessionError> {
    let Some((offset, boundary)) = records.first().filter(|(_, r)| r.is_compact_boundary()) else {
        return Ok(());
    };
    let Some(head) = ctxd_core::preserved::segment_head(boundary) else {
        return Ok(());
    };
    match crate::store::transcript::records_back_to(path, *offset, &head)? {
        Some(mut earlier) => {
            earlier.append(records);
            *records = earlier;
        }
        None => {
            tracing::warn!(head, offset, "the messages a compact boundary keeps are not within the look-back before it")
        }
    }
    Ok(())
}

fn load_from_disk(store: &Store, id: &str, path: &std::path::Path) -> Result<LoadResult, SessionError> {
    let mut loaded = load_with_torn_install(store, id, path)?;
    with_preserved(path, &mut loaded.records)?;
    Ok(loaded)
}

fn load_with_torn_install(store: &Store, id: &str, path: &std::path::Path) -> Result<LoadResult, SessionError> {
    let mut loaded = load_latest(store, id, path)?;
    if let Some(offset) = torn_install(&loaded.records) {
        tracing::warn!(offset, "a compaction was cut off while being installed; resuming the view from before it");
        // The install was never acknowledged: cut it (saved aside), as a torn line is.
        loaded.transcript.cut_unacknowledged(offset, "torn-compaction")?;
        // The file ends where the install began now.
        let (previous, before) = boundary_in_force(path)?;
        let (transcript, from) = Transcript::open(path, false, previous.unwrap_or(0))?;
        loaded.transcript = transcript;
        loaded.records = from.records;
        loaded.records_before = before;
        loaded.view_offset = previous;
        loaded.damaged.push(format!("byte {offset}: an interrupted compaction was not installed"));
    }
    Ok(loaded)
}

fn load_latest(store: &Store, id: &str, path: &std::path::Path) -> Result<LoadResult, SessionError> {
    let entry = store.index().get(id);
    // First try the indexed boundary; confirm the line there really is a boundary.
    if let Some(SessionEntry { boundary_offset: Some(offset), records_before_boundary, .. }) = entry {
        let (transcript, loaded) = Transcript::open(path, false, offset)?;
        let first_is_boundary = loaded.records.first().is_some_and(|(o, r)| *o == offset && r.is_compact_boundary());
        let undone = first_is_boundary && starts_undone(&loaded.records);
        if first_is_boundary && !undone {
            return Ok(LoadResult {
                transcript,
                records: loaded.records,
                records_before: records_before_boundary,
                view_offset: Some(offset),
                damaged: loaded.damaged,
                torn_bytes: loaded.torn_bytes,
                rebuilt_index: false,
                earlier: Vec::new(),
            });
        }
        if undone {
            tracing::info!(offset, "the indexed boundary was undone; scanning the transcript for the one in force");
        } else {
            tracing::warn!(offset, "index points at no compact boundary; scanning the transcript");
        }
    }
    // An entry that knows of no boundary: load from the start (a boundary written after
    // the entry was saved is still found, as loading applies boundaries as it goes).
    // No usable entry: a quick scan for the boundary in force (the latest not undone),
    // then load from it.
    let exists = path.exists();
    let trusted_no_boundary = matches!(entry, Some(SessionEntry { boundary_offset: None, .. }));
    let (offset, before) = if exists && !trusted_no_boundary { boundary_in_force(path)? } else { (None, 0) };
    let (transcript, loaded) = Transcript::open(path, true, offset.unwrap_or(0))?;
    // A rebuilt index has no ledger: find the reads before the boundary in the file.
    let earlier = match offset {
        Some(offset) if offset > 0 && store.index().ledger_entries(id).is_empty() => {
            crate::store::transcript::records_with_reads(path, offset)?
        }
        _ => Vec::new(),
    };
    Ok(LoadResult {
        transcript,
        records: loaded.records,
        records_before: before,
        view_offset: offset,
        damaged: loaded.damaged,
        torn_bytes: loaded.torn_bytes,
        rebuilt_index: exists && !trusted_no_boundary,
        earlier,
    })
}

/// Where the view starts by the whole transcript: (offset of the latest boundary not
/// undone, records before it), or the start of the file. Reads every line, parses only
/// compaction records.
fn boundary_in_force(path: &std::path::Path) -> Result<(Option<u64>, u64), SessionError> {
    let found = crate::store::transcript::scan_compactions(path)?;
    Ok(match compaction_view(&found.records).boundary {
        Some(i) => (Some(found.offsets[i]), found.before[i]),
        None => (None, 0),
    })
}

/// Whether the records read from a boundary on undo that boundary (and every later one):
/// then the view starts before them. Only compaction records are looked at.
fn starts_undone(records: &[(u64, Record)]) -> bool {
    if !records.iter().any(|(_, r)| is_undo_record(r)) {
        return false;
    }
    let marks: Vec<Record> =
        records.iter().map(|(_, r)| r).filter(|r| r.is_compact_boundary() || is_undo_record(r)).cloned().collect();
    compaction_view(&marks).boundary.is_none()
}

/// The view's records as the transcript has them now.
struct ViewOnDisk {
    /// From the boundary in force to the end, with their offsets.
    records: Vec<(u64, Record)>,
    records_before: u64,
    /// Where the boundary in force starts (none: the view starts at the file's start).
    view_offset: Option<u64>,
}

fn read_view(path: &std::path::Path) -> Result<ViewOnDisk, SessionError> {
    let (view_offset, records_before) = boundary_in_force(path)?;
    let mut loaded = crate::store::transcript::read_from(path, view_offset.unwrap_or(0))?;
    with_preserved(path, &mut loaded.records)?;
    Ok(ViewOnDisk { records: loaded.records, records_before, view_offset })
}

/// Now as RFC 3339 UTC with milliseconds, like transcript timestamps.
pub fn now_rfc3339() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = now.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60,
        now.subsec_millis()
    )
}

/// The request a session answered last, as the host holds it.
struct SentRequest {
    revision: String,
    /// Shared with the view cache: keeping them costs pointers.
    messages: Vec<Arc<ctxd_core::view::ApiMessage>>,
}

/// A new assemble revision: a counter behind a prefix drawn when the daemon starts, so a
/// revision a host kept from an earlier daemon never names a request of this one.
fn next_revision() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: OnceLock<String> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| uuid::Uuid::new_v4().simple().to_string()[..12].to_owned());
    format!("{prefix}-{}", COUNTER.fetch_add(1, Ordering::Relaxed) + 1)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[test]
    fn json_len_counts_the_bytes_serde_writes() {
        let values = vec![
            serde_json::json!({"type": "text", "text": "a \"quoted\" ünï\n"}),
            serde_json::json!([1, 2.5, {"k": null}]),
        ];
        assert_eq!(super::json_len(&values), serde_json::to_string(&values).unwrap().len());
        assert_eq!(super::json_len(&[]), 2);
    }
}
