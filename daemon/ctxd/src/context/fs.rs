//! The real disk behind the memory loader.
//!
//! `ctxd_core::memory` decides which instruction files belong in a session's user
//! context without touching the disk; it asks a [`MemoryFs`] for bytes and directory
//! listings. [`RealFs`] answers those questions with `std::fs` and counts how often it
//! was asked, so tests (and the context view) can show that a memoized base context is
//! served without going back to the disk.
//!
//! Decoding is not done here: bytes go back as they are and the core reports files that
//! are not UTF-8.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use ctxd_core::memory::{DirEntry, MemoryFs};

/// [`MemoryFs`] over `std::fs`, with counters of the calls made through it.
///
/// Every call counts, including probes of files that turn out not to exist: a probe is
/// still a trip to the disk, and "no trips when nothing changed" is what the counters
/// are there to prove.
#[derive(Debug, Default)]
pub struct RealFs {
    reads: AtomicU64,
    lists: AtomicU64,
}

impl RealFs {
    pub fn new() -> Self {
        Self::default()
    }

    /// How many times [`MemoryFs::read`] was called.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// How many times [`MemoryFs::list_dir`] was called.
    pub fn lists(&self) -> u64 {
        self.lists.load(Ordering::Relaxed)
    }
}

impl MemoryFs for RealFs {
    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, String> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        // A FIFO, a device or a giant is refused by the bounded reader, never waited on.
        match crate::outside::read(path, crate::outside::MEMORY_FILE) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(crate::outside::OutsideError::Missing) => Ok(None),
            Err(err) => Err(err.to_string()),
        }
    }

    fn real_path(&self, path: &Path) -> std::path::PathBuf {
        // A path that does not exist (yet) resolves as far as its existing folder does.
        match std::fs::canonicalize(path) {
            Ok(real) => real,
            Err(_) => match (path.parent(), path.file_name()) {
                (Some(parent), Some(name)) if parent != path => self.real_path(parent).join(name),
                _ => path.to_path_buf(),
            },
        }
    }

    fn list_dir(&self, path: &Path) -> Result<Vec<DirEntry>, String> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        let entries = match std::fs::read_dir(path) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotADirectory => {
                // Either `path` itself is a file (something is there and cannot be
                // listed) or a folder above it is a file (nothing is there).
                return match std::fs::metadata(path) {
                    Ok(_) => Err("not a directory".to_owned()),
                    Err(_) => Ok(Vec::new()),
                };
            }
            Err(err) if is_absent(&err) => return Ok(Vec::new()),
            Err(err) => return Err(reason(&err)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|err| reason(&err))?;
            let path = entry.path();
            let is_dir = match entry.file_type() {
                // A symlink counts as what it points to, as it would for the loader
                // reading through it; a dangling one is not a directory.
                Ok(kind) if kind.is_symlink() => std::fs::metadata(&path).map(|meta| meta.is_dir()).unwrap_or(false),
                Ok(kind) => kind.is_dir(),
                Err(err) => return Err(reason(&err)),
            };
            out.push(DirEntry { path, is_dir });
        }
        Ok(out)
    }
}

/// Errors that mean "nothing at this path": it is missing, or a folder on the way to it
/// is a file.
fn is_absent(err: &io::Error) -> bool {
    matches!(err.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory)
}

/// A short reason for the core's diagnostics, starting with the kind of error so a user
/// sees "permission denied" rather than an errno.
fn reason(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(code) => format!("{} (os error {code})", err.kind()),
        None => format!("{}: {err}", err.kind()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::PathBuf;

    fn sorted(mut entries: Vec<DirEntry>) -> Vec<(PathBuf, bool)> {
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        entries.into_iter().map(|e| (e.path, e.is_dir)).collect()
    }

    #[test]
    fn counts_reads_and_lists() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("CLAUDE.md");
        std::fs::write(&file, "hello").unwrap();
        std::fs::create_dir(dir.path().join("rules")).unwrap();

        let fs = RealFs::new();
        assert_eq!((fs.reads(), fs.lists()), (0, 0));

        assert_eq!(fs.read(&file).unwrap(), Some(b"hello".to_vec()));
        assert_eq!(fs.read(&dir.path().join("missing.md")).unwrap(), None);
        assert_eq!((fs.reads(), fs.lists()), (2, 0));

        let listed = sorted(fs.list_dir(dir.path()).unwrap());
        assert_eq!(listed, vec![(file.clone(), false), (dir.path().join("rules"), true)]);
        assert_eq!(fs.list_dir(&dir.path().join("nope")).unwrap(), Vec::new());
        assert_eq!((fs.reads(), fs.lists()), (2, 2));
    }

    #[test]
    fn returns_bytes_that_are_not_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("latin1.md");
        std::fs::write(&file, [0x63, 0x61, 0x66, 0xe9]).unwrap();
        assert_eq!(RealFs::new().read(&file).unwrap(), Some(vec![0x63, 0x61, 0x66, 0xe9]));
    }

    #[test]
    fn a_directory_where_a_file_is_expected_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = RealFs::new().read(dir.path()).unwrap_err();
        assert_eq!(err, "is a directory, not a regular file; ctxd reads only regular files");
    }

    #[test]
    fn a_file_on_the_way_means_nothing_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, "x").unwrap();
        let fs = RealFs::new();
        assert_eq!(fs.read(&file.join("CLAUDE.md")).unwrap(), None);
        assert_eq!(fs.list_dir(&file.join("rules")).unwrap(), Vec::new());
        // The file itself exists and cannot be listed.
        assert_eq!(fs.list_dir(&file).unwrap_err(), "not a directory");
    }

    #[test]
    fn symlinked_directories_list_as_directories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("gone"), dir.path().join("dangling")).unwrap();
        let listed = sorted(RealFs::new().list_dir(dir.path()).unwrap());
        assert_eq!(
            listed,
            vec![
                (dir.path().join("dangling"), false),
                (dir.path().join("link"), true),
                (dir.path().join("real"), true),
            ]
        );
        // A dangling link reads as absent.
        assert_eq!(RealFs::new().read(&dir.path().join("dangling")).unwrap(), None);
    }

    #[test]
    fn unreadable_file_and_directory_report_permission_denied() {
        use std::os::unix::fs::PermissionsExt;

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret.md");
        std::fs::write(&file, "x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o000)).unwrap();
        let locked = dir.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();

        // Root (or CAP_DAC_OVERRIDE) reads through mode 000; there is nothing to assert.
        if std::fs::read(&file).is_ok() {
            println!("skipping permission assertions: this process can read mode-000 files");
            return;
        }
        let fs = RealFs::new();
        let err = fs.read(&file).unwrap_err();
        assert!(err.starts_with("permission denied"), "{err}");
        let err = fs.list_dir(&locked).unwrap_err();
        assert!(err.starts_with("permission denied"), "{err}");

        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}
