//! The store: where sessions live on disk.
//!
//! ```text
//! <state dir>/            owner-only (0700)
//!   ctxd.lock             held (flock) by the one daemon using this store
//!   sessions/<id>.jsonl   one transcript per session: the source of truth
//!   index/                sled: what can be rebuilt from the transcripts
//!   logs/ctxd.log         the daemon's log, unless told otherwise
//! ```
//!
//! **Invariant:** nothing in `index/` is trusted over a transcript. Every index entry is
//! checked against the file it describes and rebuilt from it when stale, damaged or
//! missing.

pub mod index;
pub mod lock;
pub mod transcript;

use std::fs::DirBuilder;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use self::index::{Index, SessionEntry};
pub use self::lock::{StateDir, StoreLock};

/// Store failures. Each names the path involved.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    // The cause first: editors show the text before the first ':' as the short reason.
    #[error(
        "store in use by another ctxd{}: {path}; one daemon serves a store, so close the other (another editor window?) or give this one its own state directory (--state-dir, or the editor's stateDir setting)",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Locked { path: PathBuf, pid: Option<u32> },
    #[error("index {path}: {message}")]
    Index { path: PathBuf, message: String },
    #[error("invalid session id {0:?}: use 1 to 128 letters, digits, '-' or '_'")]
    InvalidSessionId(String),
    /// The state directory or the lock in it is not this user's alone (see
    /// [`lock::StateDir`]); nothing in it was used or changed.
    #[error("{cause}: {path}: {detail}")]
    NotOurs { cause: &'static str, path: PathBuf, detail: String },
}

impl StoreError {
    pub fn io(path: &Path, source: std::io::Error) -> StoreError {
        StoreError::Io { path: path.to_owned(), source }
    }
}

/// An open store, locked for this process.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    sessions: PathBuf,
    index: Index,
    _lock: StoreLock,
}

impl Store {
    /// Opens (creating) the store at `root`. Fails if another daemon holds it. A damaged
    /// index is moved aside and rebuilt from the transcripts.
    pub fn open(root: &Path) -> Result<Store, StoreError> {
        Store::open_with(root, None)
    }

    /// [`Store::open`] with the store's lock when the caller took it already.
    pub fn open_with(root: &Path, lock: Option<StoreLock>) -> Result<Store, StoreError> {
        // The lock first: it checks that the directory is this user's before anything
        // in it is made or changed.
        let lock = match lock {
            Some(lock) => lock,
            None => StoreLock::acquire(root)?,
        };
        create_private_dir(root)?;
        let sessions = root.join("sessions");
        create_private_dir(&sessions)?;
        let index = Index::open_or_rebuild(&root.join("index"))?;
        let store = Store { root: root.to_owned(), sessions, index, _lock: lock };
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The transcript path of a session. Session ids are checked so that no id can name
    /// a path outside the store.
    pub fn transcript_path(&self, session_id: &str) -> Result<PathBuf, StoreError> {
        validate_session_id(session_id)?;
        Ok(self.sessions.join(format!("{session_id}.jsonl")))
    }

    /// Ids of every session with a transcript in the store.
    pub fn session_ids(&self) -> Result<Vec<String>, StoreError> {
        let entries = std::fs::read_dir(&self.sessions).map_err(|e| StoreError::io(&self.sessions, e))?;
        let mut ids: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".jsonl")).map(str::to_owned))
            .filter(|id| validate_session_id(id).is_ok())
            .collect();
        ids.sort();
        Ok(ids)
    }
}

/// Session ids are file names: 1 to 128 of `[A-Za-z0-9_-]`.
pub fn validate_session_id(id: &str) -> Result<(), StoreError> {
    let ok =
        !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok { Ok(()) } else { Err(StoreError::InvalidSessionId(id.chars().take(160).collect())) }
}

/// Creates `dir` (and parents) readable by the owner only; tightens an existing one.
pub fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| StoreError::io(dir, e))?;
    let meta = std::fs::metadata(dir).map_err(|e| StoreError::io(dir, e))?;
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| StoreError::io(dir, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_cannot_escape_the_store() {
        for bad in ["", "../x", "a/b", "..", "a b", "x.jsonl", &"a".repeat(129), "é"] {
            assert!(validate_session_id(bad).is_err(), "{bad:?}");
        }
        for good in ["a", "4d5611e5-241a-462a-8d15-5122611a9569", "agent_1"] {
            assert!(validate_session_id(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn store_dirs_are_owner_only_and_a_second_open_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        let store = Store::open(&root).unwrap();
        for d in [&root, &root.join("sessions")] {
            assert_eq!(std::fs::metadata(d).unwrap().permissions().mode() & 0o777, 0o700);
        }
        let second = Store::open(&root).unwrap_err();
        assert!(matches!(second, StoreError::Locked { .. }), "{second}");
        assert!(second.to_string().contains(&root.display().to_string()));
        drop(store);
        Store::open(&root).unwrap();
    }
}
