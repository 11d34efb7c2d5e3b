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
//! With [`IdlePolicy`] (the `claudeIdleCompaction` setting), a transcript that has not
//! changed for the set time while standing above the set share of its compact
//! threshold is compacted in place by [`crate::claude::compact`] (the summary by the
//! provider the settings for its project directory choose, else offline), which
//! refuses (and logs why) while a process has the file open or when it changed
//! meanwhile, the slow summary included. One try per idle spell: the next is after the
//! program writes again.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use ctxd_core::budget::Thresholds;
use ctxd_core::record::Record;
use ctxd_core::tally::Tally;

use super::Notifier;
use super::usage::{Shape, UsageSnapshot};
use crate::context::watcher::{Target, Watcher};
use ctxd_core::breakdown::Composition;

/// The id an observed transcript is published under.
pub fn observe_id(path: &Path) -> String {
    let hash = ctxd_core::ledger::fnv1a(path.as_os_str().as_encoded_bytes());
    format!("observe-{hash:016x}")
}

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

/// What woke the follower.
enum Event {
    /// The watcher delivered (`false`: it is gone).
    Delivered(bool),
    /// The idle time passed.
    Idle,
    /// The settings changed (`false`: their sender is gone).
    Settings(bool),
    /// The gateway passed an answer of this session (its exact figures).
    Live(std::sync::Arc<crate::gateway::live::Live>),
}

/// Starts following `path`; returns the id and the first usage. The follower stops when
/// the file can no longer be read. `policy_of` makes the [`Policy`] from the latest
/// `workspace/didChangeConfiguration` settings, which `settings` carries (and says
/// when they change). `env` gives Claude Code's directory (where an idle compaction
/// finds the session's plan) and the provider's key; `settings_for` the settings of the
/// session's project. `live` follows the gateway's figures for the session: an
/// answer's exact usage is published at once, before the program writes it down.
#[allow(clippy::too_many_arguments)]
pub async fn start(
    path: PathBuf,
    mut live: Option<tokio::sync::watch::Receiver<Option<std::sync::Arc<crate::gateway::live::Live>>>>,
    policy_of: impl Fn(&ctxd_proto::Settings) -> Policy + Send + 'static,
    mut settings: tokio::sync::watch::Receiver<ctxd_proto::Settings>,
    env: std::sync::Arc<crate::process_env::ProcessEnv>,
    settings_for: crate::claude::SettingsFor,
    watcher: Watcher,
    notifier: Notifier,
) -> std::io::Result<(String, UsageSnapshot)> {
    let id = observe_id(&path);
    let tail_path = path.clone();
    let (tail, len) = tokio::task::spawn_blocking(move || -> std::io::Result<_> {
        let len = std::fs::metadata(&tail_path)?.len();
        Ok((crate::statusline::tail_usage(&tail_path)?, len))
    })
    .await
    .map_err(std::io::Error::other)??;
    let mut policy = policy_of(&settings.borrow_and_update());
    let mut tally = tail.tally;
    let mut floor = if tail.after_compaction { tail.post_tokens } else { None };
    let mut model = tail.model.unwrap_or_else(|| "unknown".to_owned());
    // The observed program's own prefix is unknown: its report holds it.
    let mut shape = Shape::default();
    let first = UsageSnapshot::compute(&floored(&tally, floor), &shape, &(policy.thresholds)(&model), false);
    let mut subscription = watcher.subscribe([Target::file(path.clone())]);
    let task_id = id.clone();
    // What was last published; `None` until the first delivery, which always publishes
    // (a client may wait for it).
    let mut last: Option<UsageSnapshot> = None;
    let shown_first = first.clone();
    tokio::spawn(async move {
        let mut offset = len;
        let mut carry = Vec::new();
        // The idle clock: the last change the program made, and whether this idle spell
        // was tried already. Bytes ctxd appended itself (up to `ours`) are no activity.
        let mut changed = tokio::time::Instant::now();
        let mut tried = false;
        let mut attempts = 0u32;
        let mut ours = 0u64;
        let mut settings_live = true;
        // The gateway's latest figures for this session, which the transcript's own
        // lines of the same answer do not override.
        let mut latest_live: Option<std::sync::Arc<crate::gateway::live::Live>> = None;
        loop {
            let deadline = policy.idle.filter(|_| !tried).map(|p| changed + p.after);
            let event = tokio::select! {
                got = subscription.recv() => Event::Delivered(got.is_some()),
                () = tokio::time::sleep_until(deadline.unwrap_or(changed)), if deadline.is_some() => Event::Idle,
                live = settings.changed(), if settings_live => Event::Settings(live.is_ok()),
                figures = crate::gateway::live::next(&mut live) => Event::Live(figures),
            };
            match event {
                Event::Delivered(true) => {}
                Event::Delivered(false) => break,
                Event::Settings(false) => {
                    settings_live = false;
                    continue;
                }
                Event::Live(figures) => {
                    figures.apply(&mut tally);
                    floor = None;
                    latest_live = Some(figures);
                    let usage =
                        UsageSnapshot::compute(&floored(&tally, floor), &shape, &(policy.thresholds)(&model), false);
                    if last.as_ref() != Some(&usage) {
                        notifier.usage_changed(&task_id, usage.clone()).await;
                        last = Some(usage);
                    }
                    continue;
                }
                Event::Settings(true) => {
                    policy = policy_of(&settings.borrow_and_update());
                    let usage =
                        UsageSnapshot::compute(&floored(&tally, floor), &shape, &(policy.thresholds)(&model), false);
                    if last.as_ref().unwrap_or(&shown_first) != &usage {
                        notifier.usage_changed(&task_id, usage.clone()).await;
                        last = Some(usage);
                    }
                    continue;
                }
                Event::Idle => {
                    attempts += 1;
                    tried = true;
                    let tokens = tally.total();
                    if policy.idle.is_some_and(|p| p.worth(tokens, &(policy.thresholds)(&model))) {
                        tracing::info!(path = %path.display(), tokens, "observed Claude Code session idle; compacting it");
                        // Prepared here, in the follower's own task: the summary (a
                        // provider's may take minutes) holds up only this session's
                        // figures, and the bytes it appends are read after it.
                        let source = crate::claude::SummarySource::Configured(settings_for.clone());
                        match crate::claude::compact(env.clone(), path.clone(), None, source).await {
                            Ok(done) => {
                                ours = done.offset + done.plan.lines.iter().map(|l| l.len() as u64 + 1).sum::<u64>();
                            }
                            // A refusal is often passing (a status line or an editor
                            // reading the file at that moment): tried again after
                            // another idle period, a few times per idle spell.
                            Err(_) if attempts < IDLE_ATTEMPTS => {
                                tried = false;
                                changed = tokio::time::Instant::now();
                            }
                            Err(_) => {}
                        }
                    }
                    continue;
                }
            }
            let read_path = path.clone();
            let from = offset;
            let read = tokio::task::spawn_blocking(move || read_from(&read_path, from)).await;
            let Ok(Ok(bytes)) = read else {
                tracing::info!(path = %path.display(), "observed transcript is gone; stopping");
                break;
            };
            offset += bytes.len() as u64;
            if offset > ours {
                changed = tokio::time::Instant::now();
                tried = false;
                attempts = 0;
            }
            carry.extend_from_slice(&bytes);
            // Whole lines only; a line still being written waits for the next delivery.
            let Some(end) = memchr::memrchr(b'\n', &carry) else { continue };
            let lines: Vec<u8> = carry.drain(..=end).collect();
            for line in lines.split(|b| *b == b'\n') {
                let Some(record) = std::str::from_utf8(line).ok().and_then(|t| Record::parse(t).ok()) else { continue };
                if record.is_compact_boundary() {
                    tally.restart();
                    shape.composition = Composition::default();
                    floor = crate::statusline::post_tokens(record.line());
                }
                if let Some(m) = record.head().model.as_deref().filter(|m| !m.starts_with('<')) {
                    model = m.to_owned();
                }
                tally.observe(&record);
                shape.composition.observe(&record);
            }
            if let Some(figures) = &latest_live {
                figures.reconcile(&mut tally);
            }
            if tally.reported > 0 {
                floor = None;
            }
            let usage = UsageSnapshot::compute(&floored(&tally, floor), &shape, &(policy.thresholds)(&model), false);
            if last.as_ref() != Some(&usage) {
                notifier.usage_changed(&task_id, usage.clone()).await;
                last = Some(usage);
            }
        }
    });
    Ok((id, first))
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

fn read_from(path: &Path, offset: u64) -> std::io::Result<Vec<u8>> {
    let (mut file, len) = crate::outside::open_regular(path)?;
    if len < offset {
        // Truncated or replaced: nothing sensible to add.
        return Ok(Vec::new());
    }
    file.seek(SeekFrom::Start(offset))?;
    let mut bytes = Vec::with_capacity((len - offset) as usize);
    file.take(len - offset).read_to_end(&mut bytes)?;
    Ok(bytes)
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
