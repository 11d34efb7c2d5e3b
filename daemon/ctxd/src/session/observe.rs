//! `ctx/observe`: follow a transcript another program (Claude Code) is appending to and
//! publish `ctx/usageChanged` for it with ctxd's accounting.
//!
//! The first figure comes from the transcript's tail (as `ctxd statusline` reads it);
//! after that only the bytes appended since are read, on each watcher delivery, and fed
//! to the same `Tally`. A compact boundary in the new bytes restarts the count, as it does
//! for a session of ctxd's own; until the next response reports usage, the boundary's
//! `postTokens` (the program's own count of what it kept) is the floor of the figure,
//! as in `ctxd statusline`.
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
//! follower and one idle clock.
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

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ctxd_core::budget::Thresholds;
use ctxd_core::record::Record;
use ctxd_core::tally::Tally;
use tokio::sync::{OnceCell, Semaphore, watch};
use tokio::time::Instant;

use super::Notifier;
use super::usage::{Shape, UsageSnapshot};
use crate::context::watcher::{Target, Watcher};
use crate::statusline::MAX_LINE;
use ctxd_core::breakdown::Composition;

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

/// Every transcript the daemon follows, one follower per file, and the daemon's one
/// idle compaction at a time.
#[derive(Debug)]
pub struct Followers {
    /// By device and inode: the same file under two spellings is one follower.
    by_file: Mutex<HashMap<FileId, Arc<OnceCell<Follower>>>>,
    idle_gate: Arc<Semaphore>,
}

impl Default for Followers {
    fn default() -> Followers {
        Followers { by_file: Mutex::default(), idle_gate: Arc::new(Semaphore::new(1)) }
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
}

impl Followers {
    /// Follows the transcript at `path`: `start` starts a follower (given its names and
    /// the idle gate) when none runs for the file; returns the id for `path` and the
    /// figure now.
    pub async fn follow<Start, Started>(&self, path: &Path, start: Start) -> Result<(String, UsageSnapshot), String>
    where
        Start: FnOnce(Names, Arc<Semaphore>) -> Started,
        Started: Future<Output = std::io::Result<watch::Receiver<UsageSnapshot>>>,
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
            by_file.retain(|_, cell| cell.get().is_none_or(|f| f.usage.has_changed().is_ok()));
            by_file.entry((meta.dev(), meta.ino())).or_default().clone()
        };
        let id = observe_id(path);
        let names: Names = Arc::new(Mutex::new(vec![id.clone()]));
        let follower = cell
            .get_or_try_init(|| async {
                let usage = start(names.clone(), self.idle_gate.clone()).await?;
                Ok::<_, std::io::Error>(Follower { names, usage })
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
}

/// What woke the follower.
enum Event {
    /// The watcher delivered (`false`: it is gone).
    Delivered(bool),
    /// The idle time passed.
    Idle,
    /// The settings changed (`false`: their sender is gone).
    Settings(bool),
}

/// Starts following `path`, publishing under `names`; returns its figures (the first
/// one now). The follower stops when the file can no longer be read. `policy_of` makes
/// the [`Policy`] from the latest `workspace/didChangeConfiguration` settings, which
/// `settings` carries (and says when they change). `env` gives Claude Code's directory
/// (where an idle compaction finds the session's plan) and the provider's key;
/// `settings_for` the settings of the session's project; `idle_gate` is the daemon's
/// one idle compaction at a time.
#[allow(clippy::too_many_arguments)]
pub async fn start(
    path: PathBuf,
    names: Names,
    idle_gate: Arc<Semaphore>,
    policy_of: impl Fn(&ctxd_proto::Settings) -> Policy + Send + 'static,
    mut settings: tokio::sync::watch::Receiver<ctxd_proto::Settings>,
    env: std::sync::Arc<crate::process_env::ProcessEnv>,
    settings_for: crate::claude::SettingsFor,
    watcher: Watcher,
    notifier: Notifier,
) -> std::io::Result<watch::Receiver<UsageSnapshot>> {
    let tail_path = path.clone();
    let (tail, len, modified) = tokio::task::spawn_blocking(move || -> std::io::Result<_> {
        let meta = std::fs::metadata(&tail_path)?;
        Ok((crate::statusline::tail_usage(&tail_path)?, meta.len(), meta.modified().ok()))
    })
    .await
    .map_err(std::io::Error::other)??;
    let mut policy = policy_of(&settings.borrow_and_update());
    let mut reading = Reading {
        offset: len,
        lines: Lines::default(),
        tally: tail.tally,
        shape: Shape::default(),
        floor: if tail.after_compaction { tail.post_tokens } else { None },
        model: tail.model.unwrap_or_else(|| "unknown".to_owned()),
    };
    let first = reading.usage(&policy);
    let (figures, usage) = watch::channel(first.clone());
    let mut subscription = watcher.subscribe([Target::file(path.clone())]);
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
        let mut settings_live = true;
        loop {
            let deadline =
                policy.idle.filter(|_| !tried).and_then(|p| changed.checked_add(p.after)).map(|d| d.max(not_before));
            let event = tokio::select! {
                got = subscription.recv() => Event::Delivered(got.is_some()),
                () = tokio::time::sleep_until(deadline.unwrap_or(changed)), if deadline.is_some() => Event::Idle,
                live = settings.changed(), if settings_live => Event::Settings(live.is_ok()),
            };
            match event {
                Event::Delivered(true) => {}
                Event::Delivered(false) => break,
                Event::Settings(false) => {
                    settings_live = false;
                    continue;
                }
                Event::Settings(true) => {
                    policy = policy_of(&settings.borrow_and_update());
                    let usage = reading.usage(&policy);
                    if last.as_ref().unwrap_or(&shown_first) != &usage {
                        publish(usage.clone()).await;
                        last = Some(usage);
                    }
                    continue;
                }
                Event::Idle => {
                    let tokens = reading.tally.total();
                    if !policy.idle.is_some_and(|p| p.worth(tokens, &(policy.thresholds)(&reading.model))) {
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
            let read_path = path.clone();
            let before = reading.offset;
            let read = tokio::task::spawn_blocking(move || {
                let read = reading.read_appended(&read_path);
                (reading, read)
            })
            .await;
            let Ok((back, Ok(()))) = read else {
                tracing::info!(path = %path.display(), "observed transcript is gone; stopping");
                break;
            };
            reading = back;
            if reading.offset > before && reading.offset > ours {
                changed = Instant::now();
                tried = false;
                attempts = 0;
            }
            let usage = reading.usage(&policy);
            if last.as_ref() != Some(&usage) {
                publish(usage.clone()).await;
                last = Some(usage);
            }
        }
    });
    Ok(usage)
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

/// What the follower knows from the bytes read so far.
struct Reading {
    /// Where the next read starts.
    offset: u64,
    lines: Lines,
    tally: Tally,
    shape: Shape,
    /// The last boundary's `postTokens`, until a response reports usage.
    floor: Option<u64>,
    model: String,
}

impl Reading {
    /// Reads what was appended since `offset`, a chunk at a time, up to the length the
    /// file had when opened.
    fn read_appended(&mut self, path: &Path) -> std::io::Result<()> {
        let (mut file, len) = crate::outside::open_regular(path)?;
        if len <= self.offset {
            // Nothing new, or truncated or replaced: nothing sensible to add.
            return Ok(());
        }
        file.seek(SeekFrom::Start(self.offset))?;
        let mut left = len - self.offset;
        let mut chunk = vec![0u8; usize::try_from(left).unwrap_or(CHUNK).min(CHUNK)];
        while left > 0 {
            let want = usize::try_from(left).unwrap_or(CHUNK).min(CHUNK);
            let n = match file.read(&mut chunk[..want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.offset += n as u64;
            left -= n as u64;
            self.feed(&chunk[..n]);
        }
        if self.tally.reported > 0 {
            self.floor = None;
        }
        Ok(())
    }

    fn feed(&mut self, bytes: &[u8]) {
        let Reading { lines, tally, shape, floor, model, .. } = self;
        lines.split(bytes, |piece| match piece {
            Piece::TooLong(size) => crate::statusline::count_unparsed(tally, size),
            Piece::Line(line) => {
                let Some(record) = std::str::from_utf8(line).ok().and_then(|t| Record::parse(t).ok()) else { return };
                if record.is_compact_boundary() {
                    tally.restart();
                    shape.composition = Composition::default();
                    *floor = crate::statusline::post_tokens(record.line());
                }
                if let Some(m) = record.head().model.as_deref().filter(|m| !m.starts_with('<')) {
                    m.clone_into(model);
                }
                tally.observe(&record);
                shape.composition.observe(&record);
            }
        });
    }

    fn usage(&self, policy: &Policy) -> UsageSnapshot {
        UsageSnapshot::compute(&floored(&self.tally, self.floor), &self.shape, &(policy.thresholds)(&self.model), false)
    }
}

/// A piece of the appended bytes: a whole line (without its line break), or the size
/// of one too long to keep.
enum Piece<'a> {
    Line(&'a [u8]),
    TooLong(u64),
}

/// Splits appended bytes into lines as they come, keeping at most [`MAX_LINE`] bytes of
/// a line not finished yet: past that the line is only measured.
#[derive(Debug, Default)]
struct Lines {
    /// The start of the line not finished yet.
    unfinished: Vec<u8>,
    /// Bytes so far of a line too long to keep (its start was let go).
    too_long: Option<u64>,
}

impl Lines {
    fn split(&mut self, mut bytes: &[u8], mut each: impl FnMut(Piece<'_>)) {
        while let Some(nl) = memchr::memchr(b'\n', bytes) {
            let end = &bytes[..nl];
            bytes = &bytes[nl + 1..];
            let size = self.unfinished.len() + end.len();
            if let Some(so_far) = self.too_long.take() {
                each(Piece::TooLong(so_far + end.len() as u64));
            } else if size > MAX_LINE {
                each(Piece::TooLong(size as u64));
                self.let_go();
            } else if self.unfinished.is_empty() {
                each(Piece::Line(end));
            } else {
                self.unfinished.extend_from_slice(end);
                each(Piece::Line(&self.unfinished));
                self.let_go();
            }
        }
        let size = self.unfinished.len() + bytes.len();
        if let Some(so_far) = &mut self.too_long {
            *so_far += bytes.len() as u64;
        } else if size > MAX_LINE {
            self.too_long = Some(size as u64);
            self.let_go();
        } else {
            self.unfinished.extend_from_slice(bytes);
        }
    }

    /// Empties the unfinished line, giving back a large buffer.
    fn let_go(&mut self) {
        self.unfinished.clear();
        if self.unfinished.capacity() > CHUNK {
            self.unfinished = Vec::new();
        }
    }
}

/// The tally as shown: right after a boundary, no less than its `postTokens`.
fn floored(tally: &Tally, floor: Option<u64>) -> Tally {
    match floor {
        Some(post) if tally.reported == 0 && post > tally.total() => {
            Tally { reported: post, bytes_after: 0, ..tally.clone() }
        }
        _ => tally.clone(),
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

    /// The pieces `bytes` gives when fed in `pieces` parts.
    fn split_in(bytes: &[u8], pieces: usize) -> (Vec<String>, Vec<u64>, Lines) {
        let mut lines = Lines::default();
        let (mut whole, mut too_long) = (Vec::new(), Vec::new());
        for part in bytes.chunks(bytes.len().div_ceil(pieces).max(1)) {
            lines.split(part, |piece| match piece {
                Piece::Line(l) => whole.push(String::from_utf8_lossy(l).into_owned()),
                Piece::TooLong(n) => too_long.push(n),
            });
        }
        (whole, too_long, lines)
    }

    #[test]
    fn lines_come_whole_however_the_bytes_are_cut() {
        let text = b"one\ntwo\n\nthree\nunfinished";
        for pieces in [1, 2, 3, 7, text.len()] {
            let (whole, too_long, lines) = split_in(text, pieces);
            assert_eq!(whole, ["one", "two", "", "three"], "{pieces} pieces");
            assert!(too_long.is_empty());
            assert_eq!(lines.unfinished, b"unfinished");
        }
    }

    #[test]
    fn a_line_over_the_cap_is_counted_by_its_size_not_kept() {
        let mut text = vec![b'x'; MAX_LINE + 10];
        text.extend_from_slice(b"\nafter\n");
        text.extend(std::iter::repeat_n(b'y', MAX_LINE + 1));
        for pieces in [1, 5, 64] {
            let (whole, too_long, lines) = split_in(&text, pieces);
            assert_eq!(whole, ["after"], "{pieces} pieces");
            assert_eq!(too_long, [(MAX_LINE + 10) as u64]);
            // The endless last line: measured, nothing of it kept.
            assert_eq!(lines.too_long, Some(MAX_LINE as u64 + 1));
            assert!(lines.unfinished.capacity() <= CHUNK, "{}", lines.unfinished.capacity());
        }
        // At the cap exactly, a line is still read.
        let mut text = vec![b'z'; MAX_LINE];
        text.push(b'\n');
        let (whole, too_long, _) = split_in(&text, 3);
        assert_eq!((whole.len(), too_long.len()), (1, 0));
    }

    #[test]
    fn the_idle_clock_can_start_before_the_process() {
        let before = Instant::now();
        let ago = instant_ago(Duration::from_secs(30));
        assert!(ago <= Instant::now() - Duration::from_secs(30) && ago >= before - Duration::from_secs(30));
        // Further back than the clock can tell: its earliest moment, no panic.
        assert!(instant_ago(Duration::from_secs(u64::MAX / 4)) < before);
    }
}
