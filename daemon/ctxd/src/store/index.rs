//! The rebuildable index (sled): per session, where the compact boundary its view starts
//! at begins (the latest one not undone) and how many records come before it, so resume
//! reads only what follows that boundary.
//!
//! **Invariant:** the index is a cache of facts about transcripts. Entries are written
//! after the transcript is synced and are checked against the file before use; a
//! missing, stale or damaged index costs a scan of the transcript, never a record. sled
//! is kept off the durability path (it is beta and has open reports of damage after
//! kills), so its writes are not flushed before acknowledging anything.
//!
//! The file reads a session made before its view's boundary (the ledger resume cannot
//! replay from the view) are kept beside it, in `reads/<session id>.jsonl` inside the
//! index directory: appended in batches when a boundary passes them, read back whole on
//! resume. Plain files rather than a sled tree: sled held tens of megabytes for a batch
//! of 10,000 entries, and these are only ever appended and read in full.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::StoreError;

/// What the index knows about one session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionEntry {
    /// Byte offset of the boundary line the view starts at (the latest not undone), if any.
    pub boundary_offset: Option<u64>,
    /// Records before that boundary.
    pub records_before_boundary: u64,
    pub cwd: String,
    pub model: String,
    /// A subagent's window ceiling, kept so a resumed subagent session keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_window: Option<u64>,
}

/// The sled-backed index.
#[derive(Debug)]
pub struct Index {
    path: PathBuf,
    sessions: sled::Tree,
    /// `reads/` inside the index directory: one JSONL file of ledger entries per session.
    reads: PathBuf,
    /// True when this open created the index from nothing (first use, deleted, or moved
    /// aside after damage): its entries must be rebuilt from the transcripts.
    pub fresh: bool,
    /// Why the index lives in a temporary folder for this run (the store's own could not
    /// be written: a full disk, a read-only mount); `None` normally.
    pub degraded: Option<String>,
    _db: sled::Db,
    /// The temporary folder of a degraded index, removed when the index is dropped.
    _temporary: Option<tempfile::TempDir>,
}

/// Whether opening failed because nothing can be written there (no space, over quota,
/// a read-only mount, no permission) rather than because the index is damaged.
fn cannot_write(error: &StoreError) -> bool {
    const ENOSPC: i32 = 28;
    const EROFS: i32 = 30;
    const EDQUOT: i32 = 122;
    const EACCES: i32 = 13;
    let code = |c: i32| [ENOSPC, EROFS, EDQUOT, EACCES].contains(&c);
    match error {
        StoreError::Io { source, .. } => source.raw_os_error().is_some_and(code),
        StoreError::Index { message, .. } => {
            [ENOSPC, EROFS, EDQUOT, EACCES].iter().any(|c| message.contains(&format!("(os error {c})")))
        }
        _ => false,
    }
}

impl Index {
    /// Opens the index at `path`. If sled cannot open it, the directory is moved aside
    /// (never deleted) and a fresh index is created.
    pub fn open_or_rebuild(path: &Path) -> Result<Index, StoreError> {
        let existed = path.join("conf").exists() || path.join("db").exists();
        match Index::open(path) {
            Ok(mut index) => {
                index.fresh = !existed;
                Ok(index)
            }
            // Nothing is damaged: the disk is full or read-only. The index is a cache, so
            // this run keeps one in a temporary folder, rebuilt from the transcripts,
            // and leaves the store's own as it is.
            Err(first) if cannot_write(&first) => {
                let reason = first.to_string();
                tracing::warn!(
                    index = %path.display(),
                    error = %reason,
                    "the index cannot be written here; running with a temporary index rebuilt from the transcripts (appends fail until the disk has room)"
                );
                let temporary =
                    tempfile::Builder::new().prefix("ctxd-index-").tempdir().map_err(|e| StoreError::io(path, e))?;
                let mut index = Index::open(temporary.path())?;
                index.fresh = true;
                index.degraded = Some(reason);
                index._temporary = Some(temporary);
                Ok(index)
            }
            Err(first) => {
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or_default();
                let aside = path.with_file_name(format!("index.damaged-{stamp}"));
                tracing::warn!(
                    index = %path.display(),
                    error = %first,
                    moved_to = %aside.display(),
                    "index could not be opened; moving it aside and rebuilding it from the transcripts"
                );
                std::fs::rename(path, &aside).map_err(|e| StoreError::io(path, e))?;
                let mut index = Index::open(path)?;
                index.fresh = true;
                Ok(index)
            }
        }
    }

    fn open(path: &Path) -> Result<Index, StoreError> {
        let err = |e: sled::Error| StoreError::Index { path: path.to_owned(), message: e.to_string() };
        // sled may panic on some kinds of damage instead of returning an error.
        let opened = std::panic::catch_unwind(|| {
            sled::Config::new().path(path).cache_capacity(4 * 1024 * 1024).flush_every_ms(Some(1000)).open()
        })
        .map_err(|_| StoreError::Index { path: path.to_owned(), message: "sled panicked while opening".into() })?;
        let db = opened.map_err(err)?;
        let sessions = db.open_tree("sessions").map_err(err)?;
        let reads = path.join("reads");
        super::create_private_dir(&reads)?;
        Ok(Index { path: path.to_owned(), sessions, reads, fresh: false, degraded: None, _db: db, _temporary: None })
    }

    /// The entry of a session, if the index has a readable one.
    pub fn get(&self, session_id: &str) -> Option<SessionEntry> {
        match self.sessions.get(session_id) {
            Ok(Some(bytes)) => serde_json::from_slice(&bytes).ok(),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(index = %self.path.display(), error = %e, "index read failed; will scan the transcript");
                None
            }
        }
    }

    /// Records an entry. Failures are logged: the index is a cache.
    pub fn put(&self, session_id: &str, entry: &SessionEntry) {
        let bytes = match serde_json::to_vec(entry) {
            Ok(b) => b,
            Err(_) => return,
        };
        if let Err(e) = self.sessions.insert(session_id, bytes) {
            tracing::warn!(index = %self.path.display(), error = %e, "index write failed; the transcript is unaffected");
        }
    }

    /// Appends ledger entries of a session (one write; a later entry for a path replaces
    /// an earlier one on reading). Failures are logged: the index is a cache, and a
    /// session whose entries are missing rescans its transcript.
    pub fn put_ledger_batch(&self, session_id: &str, entries: &[ctxd_core::ledger::LedgerEntry]) {
        use std::io::Write;
        if entries.is_empty() || super::validate_session_id(session_id).is_err() {
            return;
        }
        let mut text = Vec::with_capacity(entries.len() * 200);
        for entry in entries {
            if serde_json::to_writer(&mut text, entry).is_ok() {
                text.push(b'\n');
            }
        }
        let path = self.reads.join(format!("{session_id}.jsonl"));
        let written =
            std::fs::OpenOptions::new().create(true).append(true).open(&path).and_then(|mut f| f.write_all(&text));
        if let Err(e) = written {
            tracing::warn!(file = %path.display(), error = %e, "ledger write failed; it will be rebuilt from the transcript");
        }
    }

    /// Every ledger entry the index has for a session, in the order written (a torn or
    /// damaged line is skipped).
    pub fn ledger_entries(&self, session_id: &str) -> Vec<ctxd_core::ledger::LedgerEntry> {
        if super::validate_session_id(session_id).is_err() {
            return Vec::new();
        }
        let path = self.reads.join(format!("{session_id}.jsonl"));
        let Ok(text) = std::fs::read(&path) else { return Vec::new() };
        text.split(|b| *b == b'\n').filter_map(|line| serde_json::from_slice(line).ok()).collect()
    }

    /// Flushes to disk (on clean shutdown).
    pub fn flush(&self) {
        if let Err(e) = self.sessions.flush() {
            tracing::warn!(index = %self.path.display(), error = %e, "index flush failed");
        }
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxd_core::ledger::LedgerEntry;

    fn entry(path: &str, sequence: u64, hash: u64) -> LedgerEntry {
        LedgerEntry {
            path: path.into(),
            start_line: 1,
            num_lines: 10,
            total_lines: Some(10),
            hash,
            bytes: 100,
            tokens: 25,
            reads: 1,
            sequence,
            source_uuid: None,
            read_at: None,
            stale: false,
        }
    }

    #[test]
    fn ledger_batches_append_and_a_later_entry_for_a_path_comes_last() {
        let dir = tempfile::tempdir().unwrap();
        let index = Index::open_or_rebuild(&dir.path().join("index")).unwrap();
        index.put_ledger_batch("s", &[entry("/a", 1, 7), entry("/b", 2, 8)]);
        index.put_ledger_batch("s", &[entry("/a", 3, 9)]);
        index.put_ledger_batch("other", &[entry("/c", 1, 1)]);
        // A line torn by a crash is skipped, the rest is read.
        let file = dir.path().join("index/reads/s.jsonl");
        std::fs::OpenOptions::new().append(true).open(&file).unwrap().write_all(b"{\"path\":\"/d\",\"sta").unwrap();
        let got: Vec<(String, u64)> = index.ledger_entries("s").into_iter().map(|e| (e.path, e.hash)).collect();
        assert_eq!(got, [("/a".to_owned(), 7), ("/b".to_owned(), 8), ("/a".to_owned(), 9)]);
        assert_eq!(index.ledger_entries("other").len(), 1);
        assert!(index.ledger_entries("missing").is_empty());
        // Ids are file names: one that could name another path is neither written nor read.
        index.put_ledger_batch("../escape", &[entry("/x", 1, 1)]);
        assert!(index.ledger_entries("../escape").is_empty());
        assert!(!dir.path().join("index/escape.jsonl").exists());
    }

    use std::io::Write;
}
