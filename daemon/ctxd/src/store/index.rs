//! The rebuildable index (sled): per session, where the compact boundary its view starts
//! at begins (the latest one not undone) and how many records come before it, so resume
//! reads only what follows that boundary.
//!
//! **Invariant:** the index is a cache of facts about transcripts. Entries are written
//! after the transcript is synced and are checked against the file before use; a
//! missing, stale or damaged index costs a scan of the transcript, never a record. sled
//! is kept off the durability path (it is beta and has open reports of damage after
//! kills), so its writes are not flushed before acknowledging anything.

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
    /// File-read ledger entries, keyed `<session id>\0<path>`.
    ledger: sled::Tree,
    /// True when this open created the index from nothing (first use, deleted, or moved
    /// aside after damage): its entries must be rebuilt from the transcripts.
    pub fresh: bool,
    _db: sled::Db,
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
        let ledger = db.open_tree("ledger").map_err(err)?;
        Ok(Index { path: path.to_owned(), sessions, ledger, fresh: false, _db: db })
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

    /// Records ledger entries of a session in one atomic batch. Failures are logged: the
    /// index is a cache, and a session whose entries are missing rescans its transcript.
    pub fn put_ledger_batch(&self, session_id: &str, entries: &[ctxd_core::ledger::LedgerEntry]) {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let Ok(bytes) = serde_json::to_vec(entry) else { continue };
            batch.insert(format!("{session_id}\0{}", entry.path).as_bytes(), bytes);
        }
        if let Err(e) = self.ledger.apply_batch(batch) {
            tracing::warn!(index = %self.path.display(), error = %e, "ledger write failed; it will be rebuilt from the transcript");
        }
    }

    /// Every ledger entry the index has for a session.
    pub fn ledger_entries(&self, session_id: &str) -> Vec<ctxd_core::ledger::LedgerEntry> {
        let prefix = format!("{session_id}\0");
        self.ledger
            .scan_prefix(prefix.as_bytes())
            .filter_map(Result::ok)
            .filter_map(|(_, v)| serde_json::from_slice(&v).ok())
            .collect()
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
