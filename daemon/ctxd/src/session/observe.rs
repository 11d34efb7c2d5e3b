//! `ctx/observe`: follow a transcript another program (Claude Code) is appending to and
//! publish `ctx/usageChanged` for it with ctxd's accounting.
//!
//! The first figure comes from the transcript's tail (as `ctxd statusline` reads it);
//! after that only the bytes appended since are read, on each watcher delivery, and fed
//! to the same `Tally`. A compact boundary in the new bytes restarts the count, as it does
//! for a session of ctxd's own.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use ctxd_core::budget::Thresholds;
use ctxd_core::record::Record;

use super::Notifier;
use super::usage::{Shape, UsageSnapshot};
use crate::context::watcher::{Target, Watcher};
use ctxd_core::breakdown::Composition;

/// The id an observed transcript is published under.
pub fn observe_id(path: &Path) -> String {
    let hash = ctxd_core::ledger::fnv1a(path.as_os_str().as_encoded_bytes());
    format!("observe-{hash:016x}")
}

/// Starts following `path`; returns the id and the first usage. The follower stops when
/// the file can no longer be read.
pub async fn start(
    path: PathBuf,
    thresholds_for: impl Fn(&str) -> Thresholds + Send + 'static,
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
    let mut tally = tail.tally;
    let mut model = tail.model.unwrap_or_else(|| "unknown".to_owned());
    // The observed program's own prefix is unknown: its report holds it.
    let mut shape = Shape::default();
    let first = UsageSnapshot::compute(&tally, &shape, &thresholds_for(&model), false);
    let mut subscription = watcher.subscribe([Target::file(path.clone())]);
    let task_id = id.clone();
    tokio::spawn(async move {
        let mut offset = len;
        let mut carry = Vec::new();
        let mut last = None;
        while subscription.recv().await.is_some() {
            let read_path = path.clone();
            let from = offset;
            let read = tokio::task::spawn_blocking(move || read_from(&read_path, from)).await;
            let Ok(Ok(bytes)) = read else {
                tracing::info!(path = %path.display(), "observed transcript is gone; stopping");
                break;
            };
            offset += bytes.len() as u64;
            carry.extend_from_slice(&bytes);
            // Whole lines only; a line still being written waits for the next delivery.
            let Some(end) = memchr::memrchr(b'\n', &carry) else { continue };
            let lines: Vec<u8> = carry.drain(..=end).collect();
            for line in lines.split(|b| *b == b'\n') {
                let Some(record) = std::str::from_utf8(line).ok().and_then(|t| Record::parse(t).ok()) else { continue };
                if record.is_compact_boundary() {
                    tally.restart();
                    shape.composition = Composition::default();
                }
                if let Some(m) = record.head().model.as_deref().filter(|m| !m.starts_with('<')) {
                    model = m.to_owned();
                }
                tally.observe(&record);
                shape.composition.observe(&record);
            }
            let usage = UsageSnapshot::compute(&tally, &shape, &thresholds_for(&model), false);
            if last.as_ref() != Some(&usage) {
                notifier.usage_changed(&task_id, usage.clone()).await;
                last = Some(usage);
            }
        }
    });
    Ok((id, first))
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
