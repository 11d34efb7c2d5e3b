//! The OS watches under the needs of [`State`]: each needed directory rests on a
//! non-recursive watch of its nearest existing ancestor, shared and reference-counted,
//! moved when folders appear or vanish on the way ([`State::reconcile`]); a watch the OS
//! refuses turns the watcher degraded, with one warning.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use notify::RecursiveMode;

use super::state::State;

fn nearest_existing_dir(path: &Path) -> Option<PathBuf> {
    path.ancestors().find(|dir| dir.is_dir()).map(Path::to_path_buf)
}

/// Whether a watch error means the OS ran out of watches (or of descriptors for them).
pub(super) fn is_limit(err: &notify::Error) -> bool {
    const EMFILE: i32 = 24;
    match &err.kind {
        notify::ErrorKind::MaxFilesWatch => true,
        notify::ErrorKind::Io(io) => io.kind() == std::io::ErrorKind::StorageFull || io.raw_os_error() == Some(EMFILE),
        _ => false,
    }
}

enum Armed {
    Yes,
    /// The directory vanished before the watch was added; try its parent.
    Gone,
    Failed,
}

impl State {
    /// Watches the nearest existing ancestor of `need` (or `need` itself).
    pub(super) fn arm_nearest(&mut self, need: &Path) -> Option<PathBuf> {
        let mut dir = nearest_existing_dir(need)?;
        loop {
            match self.arm(&dir) {
                Armed::Yes => return Some(dir),
                Armed::Gone => dir = nearest_existing_dir(dir.parent()?)?,
                Armed::Failed => return None,
            }
        }
    }

    fn arm(&mut self, dir: &Path) -> Armed {
        if let Some(count) = self.armed.get_mut(dir) {
            *count += 1;
            return Armed::Yes;
        }
        let Some(backend) = self.backend.as_mut() else {
            return Armed::Failed;
        };
        match backend.watch(dir, RecursiveMode::NonRecursive) {
            Ok(()) => {
                // From here on a change in `dir` is delivered: what a test waits for
                // before it makes one.
                tracing::debug!(dir = %dir.display(), "watching");
                self.armed.insert(dir.to_path_buf(), 1);
                Armed::Yes
            }
            Err(err) if matches!(err.kind, notify::ErrorKind::PathNotFound) => Armed::Gone,
            Err(err) => {
                self.watch_failed(dir, &err);
                Armed::Failed
            }
        }
    }

    pub(super) fn disarm(&mut self, dir: &Path) {
        let Some(count) = self.armed.get_mut(dir) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        self.armed.remove(dir);
        self.stale.remove(dir);
        if let Some(backend) = self.backend.as_mut()
            && let Err(err) = backend.unwatch(dir)
        {
            // Usually the watch died with its directory.
            tracing::debug!(dir = %dir.display(), "unwatch: {err}");
        }
    }

    pub(super) fn watch_failed(&mut self, dir: &Path, err: &notify::Error) {
        self.degraded.store(true, Ordering::Relaxed);
        if is_limit(err) {
            if !self.warned_limit {
                self.warned_limit = true;
                tracing::warn!(
                    dir = %dir.display(),
                    "the OS limit on file watches is reached ({err}); changed files will be \
                     found by comparing modification times before each request"
                );
            }
        } else if self.warned_dirs.insert(dir.to_path_buf()) {
            tracing::warn!(
                dir = %dir.display(),
                "cannot watch directory ({err}); changes in it will be found by comparing \
                 modification times before each request"
            );
        }
    }

    /// Moves each need's watch to its nearest existing ancestor as it is now, and renews
    /// watches that may have died.
    pub(super) fn reconcile(&mut self) {
        for dir in std::mem::take(&mut self.stale) {
            if self.armed.remove(&dir).is_none() {
                continue;
            }
            if let Some(backend) = self.backend.as_mut() {
                // Fails when the OS already dropped the watch with the directory.
                let _ = backend.unwatch(&dir);
            }
            for need in self.needs.values_mut() {
                if need.armed_at.as_deref() == Some(dir.as_path()) {
                    need.armed_at = None;
                }
            }
        }
        let paths: Vec<PathBuf> = self.needs.keys().cloned().collect();
        for path in paths {
            let have = self.needs.get(&path).and_then(|need| need.armed_at.clone());
            if nearest_existing_dir(&path) == have {
                continue;
            }
            let now = self.arm_nearest(&path);
            if let Some(old) = have {
                self.disarm(&old);
            }
            if let Some(need) = self.needs.get_mut(&path) {
                need.armed_at = now;
            }
        }
    }

    pub(super) fn backend_errors(&mut self, errors: Vec<notify::Error>) {
        for err in errors {
            if is_limit(&err) {
                let dir = err.paths.first().cloned().unwrap_or_default();
                self.watch_failed(&dir, &err);
            } else {
                tracing::debug!("file watcher error: {err}");
            }
        }
    }
}
