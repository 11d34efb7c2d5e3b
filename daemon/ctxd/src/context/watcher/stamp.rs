//! The fallback for a [`Watcher::degraded`](super::Watcher::degraded) watcher: what a
//! file looked like when last seen ([`FileStamp`]), and one look at every watched path
//! before a request ([`look_again`]) in place of the changes the OS did not deliver.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What a file (or folder) looked like when it was last seen, to tell later whether it
/// changed without a watch. Compares modification time, size, identity (a rename over
/// the file makes a new inode) and, on Unix, the status-change time (which tools that
/// restore an old modification time cannot set back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    identity: (u64, u64),
    status_changed: (i64, i64),
}

impl FileStamp {
    /// The stamp of what is at `path` now, following symlinks; `None` when nothing is
    /// there (or it cannot be looked at).
    pub fn of(path: &Path) -> Option<FileStamp> {
        let meta = std::fs::metadata(path).ok()?;
        #[cfg(unix)]
        let (identity, status_changed) = {
            use std::os::unix::fs::MetadataExt;
            ((meta.dev(), meta.ino()), (meta.ctime(), meta.ctime_nsec()))
        };
        #[cfg(not(unix))]
        let (identity, status_changed) = ((0, 0), (0, 0));
        Some(FileStamp { modified: meta.modified().ok(), len: meta.len(), identity, status_changed })
    }

    pub fn modified(&self) -> Option<SystemTime> {
        self.modified
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The paths whose stamp now differs from the one seen (`None`: it did not exist), in
/// the order given. The fallback for a [`Watcher::degraded`] watcher: one `stat` per
/// path, cheap enough to run before each request.
pub fn changed_since(seen: &[(PathBuf, Option<FileStamp>)]) -> Vec<PathBuf> {
    seen.iter().filter(|(path, stamp)| FileStamp::of(path) != *stamp).map(|(path, _)| path.clone()).collect()
}

/// One look at every watched path for a [`Watcher::degraded`] watcher: returns the paths
/// that changed since `seen` (the stamps kept from the previous look) and the stamps to
/// keep for the next one.
///
/// `memory` are memory sources: one seen before is reported when its stamp differs; one
/// not seen before (found by the last rebuild, which just read it) gets its first stamp.
/// `reads` are the read files with what was read: one not seen before was read since the
/// previous look, so it is compared by content with what the agent read, and reported if
/// that differs (or is gone); a change between the read and this look is not lost.
/// Blocking: a `stat` per path, and a read per file read since the previous look.
pub fn look_again(
    seen: &[(PathBuf, Option<FileStamp>)],
    memory: Vec<PathBuf>,
    reads: &[ctxd_core::ledger::LedgerEntry],
) -> (Vec<PathBuf>, Vec<(PathBuf, Option<FileStamp>)>) {
    let before: HashMap<&Path, Option<FileStamp>> = seen.iter().map(|(path, stamp)| (path.as_path(), *stamp)).collect();
    let mut now: BTreeMap<PathBuf, Option<FileStamp>> = BTreeMap::new();
    let mut changed = BTreeSet::new();
    for path in memory {
        let stamp = FileStamp::of(&path);
        if before.get(path.as_path()).is_some_and(|old| *old != stamp) {
            changed.insert(path.clone());
        }
        now.insert(path, stamp);
    }
    for entry in reads {
        let path = PathBuf::from(&entry.path);
        if now.contains_key(&path) && !before.contains_key(path.as_path()) {
            continue;
        }
        let stamp = FileStamp::of(&path);
        let differs = match before.get(path.as_path()) {
            Some(old) => *old != stamp,
            None => match std::fs::read(&path) {
                Ok(bytes) => ctxd_core::ledger::has_changed(entry, &String::from_utf8_lossy(&bytes)),
                Err(_) => true,
            },
        };
        if differs {
            changed.insert(path.clone());
        }
        now.insert(path, stamp);
    }
    (changed.into_iter().collect(), now.into_iter().collect())
}
