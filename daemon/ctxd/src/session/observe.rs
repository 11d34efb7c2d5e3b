//! `ctx/observe`: follow a transcript another program (Claude Code) is appending to and
//! publish `ctx/usageChanged` for it with ctxd's accounting.
//!
//! The follower reads the transcript from the compact boundary in force on and folds
//! every record into the same count a session of ctxd's own keeps
//! ([`ctxd_core::observed::Observed`]: tally, message kinds, skills, files read); after
//! that only the bytes appended since are read, on each watcher delivery. A compact
//! boundary in the new bytes restarts the count with the messages it keeps; until the
//! next response reports usage, the boundary's `postTokens` (the program's own count of
//! what it kept) is the floor of the figure, as in `ctxd statusline`. A file that got
//! shorter (`ctxd claude undo`) or was rewritten is read again from its boundary and its
//! figure pushed at once ([`reading`]).
//!
//! Memory stays bounded whatever the program appends: the new bytes are read a chunk
//! at a time ([`CHUNK`]) and split into lines as they come, and a line longer than the
//! status line's cap (`statusline::MAX_LINE`) is not kept but counted by its size, by
//! the status line's own rule. A writer faster than the follower makes it fall behind,
//! never grow.
//!
//! One follower per transcript ([`Followers`], keyed by the file, not by how its path
//! is spelled): observing it again answers from the follower that runs, under the id of
//! the path asked with, so a client that observes a file a thousand times still has one
//! follower and one idle clock. `ctx/context` and `ctx/usage` for one of its ids are
//! answered by it: memory files, rules and git facts of the working directory its
//! records name ([`context`]), the files they read. A project folder is followed as a
//! whole ([`folder`]): every transcript in it that appears or changes gets a follower.
//!
//! With [`IdlePolicy`] (the `claudeIdleCompaction` setting), a transcript that has not
//! changed for the set time while standing above the set share of its compact
//! threshold is compacted in place by [`crate::claude::compact`] (the summary by the
//! provider the settings for its project directory choose, else offline), which
//! refuses (and logs why) while a process has the file open or when it changed
//! meanwhile, the slow summary included. The idle clock starts at the file's last
//! write (its modification time), so a daemon started late does not wait the whole
//! time again. One try per idle spell: the next is after the program writes again. At
//! most one idle compaction runs in the daemon at a time (each reads and summarizes a
//! whole transcript); one that finds another running waits a moment and tries again.
//! Each one installed is announced with `ctx/compacted`.
//!
//! When the session's requests pass through ctxd's gateway, the follower also watches
//! the gateway's figures for it ([`crate::gateway::live`]): an answer's exact usage is
//! published as soon as its last byte passed, and the transcript's own lines of the
//! same answer do not override it.

mod context;
mod folder;
mod reading;

pub use context::MemoryFor;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ctxd_core::budget::Thresholds;
use ctxd_core::observed::Observed;
use tokio::sync::{OnceCell, Semaphore, mpsc, oneshot, watch};
use tokio::time::Instant;

use self::context::ObservedBase;
use self::reading::{Caught, Reading};
use super::actor::ContextView;
use super::usage::{Shape, UsageSnapshot};
use super::{Notifier, Services};
use crate::context::watcher::Target;

/// The id an observed transcript is published under.
pub fn observe_id(path: &Path) -> String {
    let hash = ctxd_core::ledger::fnv1a(path.as_os_str().as_encoded_bytes());
    format!("observe-{hash:016x}")
}

/// Bytes read from an observed transcript at a time.
pub const CHUNK: usize = 1 << 20;

/// Paths one followed file may be observed by (each is an id its figures go out under).
const MAX_NAMES: usize = 8;

/// How long an idle compaction that found another one running waits before it looks
/// again.
const IDLE_GATE_RETRY: Duration = Duration::from_secs(1);

/// When an observed Claude Code session is compacted while its user is away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdlePolicy {
    pub after: std::time::Duration,
    /// Percent of the compact threshold the session must have reached.
    pub percent: u8,
}

impl IdlePolicy {
    /// From the settings: `None` unless `claudeIdleCompaction` is on. Defaults: 10
    /// minutes, 60 %.
    pub fn from_settings(settings: &ctxd_proto::Settings) -> Option<IdlePolicy> {
        settings.claude_idle_compaction.unwrap_or(false).then(|| IdlePolicy {
            after: std::time::Duration::from_secs(settings.claude_idle_compact_after_seconds.unwrap_or(600).max(1)),
            percent: settings.claude_idle_compact_percent.unwrap_or(60).clamp(1, 100),
        })
    }

    /// The session is worth compacting at `tokens`.
    pub fn worth(&self, tokens: u64, thresholds: &Thresholds) -> bool {
        u128::from(tokens) * 100 >= u128::from(thresholds.threshold) * u128::from(self.percent)
    }
}

/// Idle compactions tried per idle spell when they are refused (the spell ends when the
/// program writes again).
const IDLE_ATTEMPTS: u32 = 3;

/// What an observed transcript is followed with, made from the settings in force and
/// made again whenever they change (`workspace/didChangeConfiguration`, a saved window):
/// the editor's switch for idle compaction reaches sessions observed before it was
/// flipped.
pub struct Policy {
    pub idle: Option<IdlePolicy>,
    /// The levels for a model.
    pub thresholds: Box<dyn Fn(&str) -> Thresholds + Send + Sync>,
}

/// The ids a follower publishes under: one per path its file was observed by.
pub type Names = Arc<Mutex<Vec<String>>>;

fn names_now(names: &Names) -> Vec<String> {
    names.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// A `ctx/context` asked of a follower: where its answer goes.
pub type Ask = oneshot::Sender<ContextView>;

/// Every transcript the daemon follows, one follower per file, the project folders
/// followed, and the daemon's one idle compaction at a time.
#[derive(Debug)]
pub struct Followers {
    /// By device and inode: the same file under two spellings is one follower.
    by_file: Mutex<HashMap<FileId, Arc<OnceCell<Follower>>>>,
    idle_gate: Arc<Semaphore>,
    /// Project folders followed, each by one task, however often it is asked for.
    folders: Mutex<HashSet<PathBuf>>,
}

impl Default for Followers {
    fn default() -> Followers {
        Followers { by_file: Mutex::default(), idle_gate: Arc::new(Semaphore::new(1)), folders: Mutex::default() }
    }
}

/// A file's device and inode.
type FileId = (u64, u64);

/// A running follower as [`Followers`] knows it.
#[derive(Debug)]
struct Follower {
    names: Names,
    /// Its latest figure; closed once it stopped.
    usage: watch::Receiver<UsageSnapshot>,
    /// Where `ctx/context` is asked of it.
    asks: mpsc::UnboundedSender<Ask>,
}

impl Follower {
    fn running(&self) -> bool {
        self.usage.has_changed().is_ok()
    }
}

/// A follower just started: its figures (the first one now) and where it is asked for
/// its context.
#[derive(Debug)]
pub struct Started {
    pub usage: watch::Receiver<UsageSnapshot>,
    pub asks: mpsc::UnboundedSender<Ask>,
}

impl Followers {
    /// Follows the transcript at `path`: `start` starts a follower (given its names and
    /// the idle gate) when none runs for the file; returns the id for `path` and the
    /// figure now.
    pub async fn follow<Start, Starting>(&self, path: &Path, start: Start) -> Result<(String, UsageSnapshot), String>
    where
        Start: FnOnce(Names, Arc<Semaphore>) -> Starting,
        Starting: Future<Output = std::io::Result<Started>>,
    {
        use std::os::unix::fs::MetadataExt;
        let cannot = |e: &dyn std::fmt::Display| format!("cannot observe {}: {e}", path.display());
        let stat_path = path.to_owned();
        let meta = tokio::task::spawn_blocking(move || std::fs::metadata(stat_path))
            .await
            .map_err(|e| cannot(&e))?
            .map_err(|e| cannot(&e))?;
        let cell = {
            let mut by_file = self.by_file.lock().unwrap_or_else(PoisonError::into_inner);
            // A follower that stopped (its file gone) makes way for a new one.
            by_file.retain(|_, cell| cell.get().is_none_or(Follower::running));
            by_file.entry((meta.dev(), meta.ino())).or_default().clone()
        };
        let id = observe_id(path);
        let names: Names = Arc::new(Mutex::new(vec![id.clone()]));
        let follower = cell
            .get_or_try_init(|| async {
                let Started { usage, asks } = start(names.clone(), self.idle_gate.clone()).await?;
                Ok::<_, std::io::Error>(Follower { names, usage, asks })
            })
            .await
            .map_err(|e| cannot(&e))?;
        {
            let mut names = follower.names.lock().unwrap_or_else(PoisonError::into_inner);
            if !names.contains(&id) {
                if names.len() >= MAX_NAMES {
                    return Err(format!(
                        "cannot observe {}: this file is observed by {MAX_NAMES} other paths to it already; observe it by one of those",
                        path.display()
                    ));
                }
                names.push(id.clone());
            }
        }
        let usage = follower.usage.borrow().clone();
        Ok((id, usage))
    }

    /// Calls `with` on the running follower that publishes under `id`, if any.
    fn named<T>(&self, id: &str, with: impl FnOnce(&Follower) -> T) -> Option<T> {
        let by_file = self.by_file.lock().unwrap_or_else(PoisonError::into_inner);
        let follower = by_file
            .values()
            .filter_map(|cell| cell.get())
            .find(|f| f.running() && f.names.lock().unwrap_or_else(PoisonError::into_inner).iter().any(|n| n == id))?;
        Some(with(follower))
    }

    /// Whether a follower publishing under `id` runs.
    pub fn running(&self, id: &str) -> bool {
        self.named(id, |_| ()).is_some()
    }

    /// `ctx/context` of the observed session `id`, queued on its follower; `None` when
    /// no follower publishes under that id.
    pub fn context(&self, id: &str) -> Option<oneshot::Receiver<ContextView>> {
        let (reply, answer) = oneshot::channel();
        self.named(id, |f| f.asks.send(reply).is_ok()).filter(|sent| *sent)?;
        Some(answer)
    }

    /// The latest figure of the observed session `id`.
    pub fn usage(&self, id: &str) -> Option<UsageSnapshot> {
        self.named(id, |f| f.usage.borrow().clone())
    }
}

/// What a follower is started with besides its file.
pub struct Deps {
    /// Makes the [`Policy`] from the latest `workspace/didChangeConfiguration` settings,
    /// which `settings` carries (and says when they change).
    pub policy_of: Box<dyn Fn(&ctxd_proto::Settings) -> Policy + Send>,
    pub settings: watch::Receiver<ctxd_proto::Settings>,
    /// Claude Code's directory (where an idle compaction finds the session's plan) and
    /// the provider's key.
    pub env: Arc<crate::process_env::ProcessEnv>,
    /// The settings of the session's project (for an idle compaction's provider).
    pub settings_for: crate::claude::SettingsFor,
    /// The watcher, and the memory discovery shared with ctxd's own sessions.
    pub services: Services,
    pub memory_for: MemoryFor,
    pub notifier: Notifier,
}

/// What woke the follower.
enum Event {
    /// The watcher delivered (`false`: it is gone).
    Delivered(bool),
    /// The idle time passed.
    Idle,
    /// The settings changed (`false`: their sender is gone).
    Settings(bool),
    /// The gateway passed an answer of this session (its exact figures).
    Live(Arc<crate::gateway::live::Live>),
    /// `ctx/context` was asked (`None`: nobody can ask any more).
    Asked(Option<Ask>),
    /// The base context finished loading (or failed to).
    BaseLoaded,
    /// The prompt cache of the gateway's last answer went cold just now.
    CacheCold,
}

/// Starts following `path`, publishing under `names`; returns its figures (the first
/// one now). The follower stops when the file can no longer be read. `idle_gate` is the
/// daemon's one idle compaction at a time.
pub async fn start(path: PathBuf, names: Names, idle_gate: Arc<Semaphore>, deps: Deps) -> std::io::Result<Started> {
    let Deps { policy_of, mut settings, env, settings_for, services, memory_for, notifier } = deps;
    // The gateway's figures for the session, when its requests pass through ctxd's
    // gateway (the transcript's file stem is Claude Code's session id, as it reads it).
    let claude_id = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned);
    let mut live = claude_id.as_deref().map(|id| services.live.watch(id));
    // Its instant-compaction figures, from the gateway's ledger, for `ctx/context`.
    let costs = services.costs.clone();
    // Subscribed before the first read: a write in between is delivered, not lost.
    let mut subscription = services.watcher.subscribe([Target::file(path.clone())]);
    let load_path = path.clone();
    let (mut reading, modified) = tokio::task::spawn_blocking(move || -> std::io::Result<_> {
        let modified = std::fs::metadata(&load_path)?.modified().ok();
        Ok((Reading::load_when_free(&load_path)?, modified))
    })
    .await
    .map_err(std::io::Error::other)??;
    let mut policy = policy_of(&settings.borrow_and_update());
    let mut base = ObservedBase::new(services, memory_for);
    base.start(reading.observed.cwd.as_deref(), &reading.observed.ledger);
    let first = usage_of(&reading.observed, &base, &policy);
    let (figures, usage) = watch::channel(first.clone());
    let (asks_tx, mut asks) = mpsc::unbounded_channel::<Ask>();
    tracing::info!(path = %path.display(), ids = ?names_now(&names), "following an observed transcript");
    // What was last published; `None` until the first delivery, which always publishes
    // (a client may wait for it).
    let mut last: Option<UsageSnapshot> = None;
    let shown_first = first;
    tokio::spawn(async move {
        let publish = |usage: UsageSnapshot| {
            figures.send_replace(usage.clone());
            let (names, notifier) = (names_now(&names), notifier.clone());
            async move {
                for name in names {
                    notifier.usage_changed(&name, usage.clone()).await;
                }
            }
        };
        // The idle clock: the last change the program made (before the follower
        // started: the file's modification time), and whether this idle spell was tried
        // already. Bytes ctxd appended itself (up to `ours`) are no activity.
        let mut changed = instant_ago(modified.and_then(|m| m.elapsed().ok()).unwrap_or_default());
        // Not before then: another transcript's idle compaction was running.
        let mut not_before = Instant::now();
        let mut tried = false;
        let mut attempts = 0u32;
        let mut ours = 0u64;
        let (mut settings_live, mut asks_live) = (true, true);
        // When to read again a file that was under a write lease.
        let mut leased: Option<Instant> = None;
        // The gateway's latest figures for this session, which the transcript's own
        // lines of the same answer do not override.
        let mut latest_live: Option<Arc<crate::gateway::live::Live>> = None;
        loop {
            let deadline =
                policy.idle.filter(|_| !tried).and_then(|p| changed.checked_add(p.after)).map(|d| d.max(not_before));
            // The moment the cache goes cold: the editors are told then, not at the
            // user's next keystroke.
            let cold_at =
                latest_live.as_deref().and_then(|live| cache_of(live, &reading.observed)).and_then(cold_instant);
            let event = tokio::select! {
                got = subscription.recv() => Event::Delivered(got.is_some()),
                () = tokio::time::sleep_until(deadline.unwrap_or(changed)), if deadline.is_some() => Event::Idle,
                live = settings.changed(), if settings_live => Event::Settings(live.is_ok()),
                figures = crate::gateway::live::next(&mut live) => Event::Live(figures),
                ask = asks.recv(), if asks_live => Event::Asked(ask),
                _ = base.loaded(), if base.is_loading() => Event::BaseLoaded,
                () = tokio::time::sleep_until(leased.unwrap_or(changed)), if leased.is_some() => Event::Delivered(true),
                () = tokio::time::sleep_until(cold_at.unwrap_or(changed)), if cold_at.is_some() => Event::CacheCold,
            };
            // Whether to publish even an unchanged figure.
            let mut always = false;
            match event {
                Event::Delivered(true) => {
                    leased = None;
                    let read = tokio::task::spawn_blocking(move || {
                        let caught = reading.catch_up();
                        (reading, caught)
                    })
                    .await;
                    let Ok((back, caught)) = read else {
                        tracing::warn!(path = %path.display(), "reading an observed transcript failed; stopping");
                        break;
                    };
                    reading = back;
                    if let Some(figures) = &latest_live {
                        figures.reconcile(&mut reading.observed.tally);
                    }
                    let caught = match caught {
                        Ok(caught) => caught,
                        // ctxd compacting or undoing it: read once the lease is let go.
                        Err(e) if reading::is_leased(&e) => {
                            leased = Some(Instant::now() + reading::LEASED_PAUSE);
                            continue;
                        }
                        Err(e) => {
                            tracing::info!(path = %path.display(), error = %e, "observed transcript is gone; stopping");
                            break;
                        }
                    };
                    let program_wrote = match caught {
                        Caught::Nothing => false,
                        Caught::Appended => reading.offset > ours,
                        Caught::Reread => {
                            tracing::info!(path = %path.display(), "observed transcript got shorter or was rewritten; read again from its boundary");
                            ours = 0;
                            always = true;
                            true
                        }
                    };
                    if program_wrote {
                        changed = Instant::now();
                        tried = false;
                        attempts = 0;
                    }
                    base.start(reading.observed.cwd.as_deref(), &reading.observed.ledger);
                    // The first delivery always publishes.
                    always |= last.is_none();
                }
                Event::Delivered(false) => break,
                Event::Settings(false) => {
                    settings_live = false;
                    continue;
                }
                Event::Live(figures) => {
                    // The same answer again (its summary became ready, or not): its
                    // figure is in the tally already, with what came after it.
                    let same_answer = latest_live.as_ref().is_some_and(|l| {
                        l.message_id.is_some()
                            && l.message_id == figures.message_id
                            && l.figures.answered_at == figures.figures.answered_at
                    });
                    if !same_answer {
                        figures.apply(&mut reading.observed.tally);
                        reading.observed.reported_outside();
                    }
                    latest_live = Some(figures);
                }
                Event::CacheCold => {
                    tracing::info!(path = %path.display(), "observed Claude Code session's prompt cache went cold");
                    always = true;
                }
                Event::Settings(true) => policy = policy_of(&settings.borrow_and_update()),
                Event::Asked(None) => {
                    asks_live = false;
                    continue;
                }
                Event::Asked(Some(reply)) => {
                    let mut view =
                        base.view(&reading.observed.ledger, |base| usage_of(&reading.observed, base, &policy)).await;
                    if let Some(id) = claude_id.clone() {
                        let costs = costs.clone();
                        view.instant_compaction =
                            tokio::task::spawn_blocking(move || costs.session(&id)).await.ok().flatten();
                    }
                    let _ = reply.send(view);
                }
                Event::BaseLoaded => {}
                Event::Idle => {
                    let tokens = usage_of(&reading.observed, &base, &policy).tokens();
                    let model = reading.observed.model.as_deref().unwrap_or(UNKNOWN_MODEL);
                    if !policy.idle.is_some_and(|p| p.worth(tokens, &(policy.thresholds)(model))) {
                        tried = true;
                        continue;
                    }
                    let Ok(_one_at_a_time) = idle_gate.clone().try_acquire_owned() else {
                        not_before = Instant::now() + IDLE_GATE_RETRY;
                        continue;
                    };
                    attempts += 1;
                    tried = true;
                    // Claude Code running for it keeps the session in memory: looked at
                    // again after another idle period, and not counted as a refusal.
                    if let Some(live) = crate::live::check(path.clone()).await {
                        tracing::info!(path = %path.display(), "observed Claude Code session idle, but {live}; left alone");
                        (tried, changed, attempts) = (false, Instant::now(), attempts - 1);
                        continue;
                    }
                    tracing::info!(path = %path.display(), tokens, "observed Claude Code session idle; compacting it");
                    // Prepared here, in the follower's own task: the summary (a
                    // provider's may take minutes) holds up only this session's
                    // figures, and the bytes it appends are read after it.
                    let source = crate::claude::SummarySource::Configured(settings_for.clone());
                    match crate::claude::compact(env.clone(), path.clone(), None, source).await {
                        Ok(done) => {
                            ours = done.offset + done.plan.lines.iter().map(|l| l.len() as u64 + 1).sum::<u64>();
                            let (pre, post) = (done.plan.pre_tokens, done.plan.post_tokens);
                            tracing::info!(path = %path.display(), pre, post, "idle compaction installed");
                            for name in names_now(&names) {
                                notifier.compacted(&name, ctxd_core::compact::Trigger::Idle, pre, post).await;
                            }
                        }
                        // A refusal is often passing (a status line or an editor
                        // reading the file at that moment): tried again after
                        // another idle period, a few times per idle spell.
                        Err(_) if attempts < IDLE_ATTEMPTS => {
                            tried = false;
                            changed = Instant::now();
                        }
                        Err(_) => {}
                    }
                    continue;
                }
            }
            let mut usage = usage_of(&reading.observed, &base, &policy);
            usage.cache = latest_live.as_deref().and_then(|live| cache_of(live, &reading.observed));
            if always || !same_but_clock(last.as_ref().unwrap_or(&shown_first), &usage) {
                publish(usage.clone()).await;
                last = Some(usage);
            }
        }
    });
    Ok(Started { usage, asks: asks_tx })
}

/// The model an observed session is counted for before its records name one.
const UNKNOWN_MODEL: &str = "unknown";

/// The figure of an observed session: its count, with the fixed parts its transcript
/// and its working directory say, at the levels of its model.
fn usage_of(observed: &Observed, base: &ObservedBase, policy: &Policy) -> UsageSnapshot {
    let (memory_tokens, system_context_bytes) = base.fixed();
    let shape = Shape {
        prefix: observed.prefix(memory_tokens, system_context_bytes),
        pending: 0,
        composition: observed.composition,
    };
    let model = observed.model.as_deref().unwrap_or(UNKNOWN_MODEL);
    let mut usage = UsageSnapshot::compute(&observed.shown_tally(), &shape, &(policy.thresholds)(model), false);
    usage.parts = observed.split(usage.tokens, &shape.prefix);
    usage
}

/// The prompt cache after the gateway's last answer `live`, now, on the wire.
fn cache_of(live: &crate::gateway::live::Live, observed: &Observed) -> Option<ctxd_proto::PromptCache> {
    let model = observed.model.as_deref().unwrap_or(UNKNOWN_MODEL);
    let state = crate::gateway::client::cache_state(&live.figures, now_ms(), model)?;
    let source = ctxd_proto::PromptCacheSource::Gateway;
    Some(crate::wire::prompt_cache(&state, source, live.figures.summary_ready))
}

/// When a warm cache goes cold, on the runtime's clock.
fn cold_instant(cache: ctxd_proto::PromptCache) -> Option<Instant> {
    cache.warm.then(|| Instant::now() + Duration::from_secs(cache.seconds_left))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Whether two figures say the same but for the seconds a warm cache has left (which
/// the clock changes: no reason to tell anyone).
fn same_but_clock(a: &UsageSnapshot, b: &UsageSnapshot) -> bool {
    let calm = |u: &UsageSnapshot| {
        let mut u = u.clone();
        if let Some(cache) = &mut u.cache {
            cache.seconds_left = 0;
        }
        u
    };
    calm(a) == calm(b)
}

/// The moment `ago` before now (the earliest the clock can tell when that is too far).
fn instant_ago(mut ago: Duration) -> Instant {
    let now = Instant::now();
    loop {
        match now.checked_sub(ago) {
            Some(then) => return then,
            None => ago /= 2,
        }
    }
}

/// The transcripts (`*.jsonl`) directly in `dir`, newest first.
pub fn transcripts_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl") && p.is_file())
        .map(|p| (std::fs::metadata(&p).and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH), p))
        .collect();
    found.sort_by_key(|entry| std::cmp::Reverse(entry.0));
    found.into_iter().map(|(_, p)| p).collect()
}

/// The folders directly in `dir`.
pub fn folders_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_dir()).collect();
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_clock_can_start_before_the_process() {
        let before = Instant::now();
        let ago = instant_ago(Duration::from_secs(30));
        assert!(ago <= Instant::now() - Duration::from_secs(30) && ago >= before - Duration::from_secs(30));
        // Further back than the clock can tell: its earliest moment, no panic.
        assert!(instant_ago(Duration::from_secs(u64::MAX / 4)) < before);
    }
}
