//! One daemon per store: an exclusive `flock` on `<state dir>/ctxd.lock`, taken only in
//! a state directory that is this user's alone.
//!
//! The kernel drops the lock when the process dies, `kill -9` included, so a crashed
//! daemon never leaves a stale lock behind. The holder's pid is written into the file
//! so the refusal can name it.
//!
//! One window remains: a child the holder forked (git, a hook) shares the lock's open
//! file until it execs (the descriptor is close-on-exec). If the holder is killed right
//! then, the lock outlives it by that moment, so a lock whose named holder is dead is
//! tried again for a short while before the store is called in use.
//!
//! A state directory can lie under a folder anyone may write to (`/tmp`, a shared
//! mount), where another user could have made it first, with a socket of theirs or a
//! `ctxd.lock` that is a link to someone's file. So before anything in it is used, the
//! directory must belong to the user ctxd runs as and be writable by no one else, and
//! the lock is opened without following a link and written only when it is a regular
//! file of that user's with one name ([`StateDir`]).

use std::fs::{DirBuilder, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, Mode, OFlags, flock};

use super::StoreError;

/// A state directory, open, checked to be this user's alone.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    fd: OwnedFd,
}

impl StateDir {
    /// Opens `path`, creating it owner-only when it is missing, and refuses it unless it
    /// belongs to the user ctxd runs as and neither its group nor others may write to
    /// it. Read access for others is taken away (it is this user's; nobody else could
    /// have put anything in it).
    pub fn open(path: &Path) -> Result<StateDir, StoreError> {
        DirBuilder::new().recursive(true).mode(0o700).create(path).map_err(|e| StoreError::io(path, e))?;
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(path, flags, Mode::empty()).map_err(|e| StoreError::io(path, e.into()))?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| StoreError::io(path, e.into()))?;
        let (owner, mode, me) = (stat.st_uid, stat.st_mode & 0o7777, rustix::process::geteuid().as_raw());
        let refuse = |cause, detail| Err(StoreError::NotOurs { cause, path: path.to_owned(), detail });
        let elsewhere = "use a directory of your own (--state-dir, or the editor's stateDir setting)";
        if owner != me {
            return refuse(
                "state directory of another user",
                format!(
                    "owned by uid {owner} (mode {mode:04o}), and ctxd runs as uid {me}: whoever owns it could read or replace what ctxd keeps there; {elsewhere}, and remove this one if you did not make it"
                ),
            );
        }
        if mode & 0o022 != 0 {
            return refuse(
                "state directory writable by others",
                format!(
                    "mode {mode:04o} (owner uid {owner}): another user could have put files in it; check what it holds and `chmod 700` it, or {elsewhere}"
                ),
            );
        }
        if mode & 0o077 != 0 {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700)).map_err(|e| StoreError::io(path, e.into()))?;
        }
        Ok(StateDir { path: path.to_owned(), fd })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path to `name` in this directory short enough for a Unix socket's address
    /// (107 bytes) however deep the directory lies: through `/proc/self/fd` and this
    /// open directory, so it names the directory that was checked. The plain path where
    /// there is no `/proc`.
    pub fn short_path(&self, name: &str) -> PathBuf {
        let through_fd = PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()));
        if through_fd.is_dir() { through_fd.join(name) } else { self.path.join(name) }
    }
}

/// The held lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
    dir: StateDir,
}

impl StoreLock {
    /// Takes the lock of the store at `root` (see [`StateDir::open`] for the checks).
    pub fn acquire(root: &Path) -> Result<StoreLock, StoreError> {
        StoreLock::acquire_in(StateDir::open(root)?)
    }

    /// Takes the lock in an opened state directory.
    pub fn acquire_in(dir: StateDir) -> Result<StoreLock, StoreError> {
        let root = dir.path.clone();
        let path = root.join("ctxd.lock");
        let mut file = open_lock(&dir, &path)?;
        let deadline = Instant::now() + DEAD_HOLDER_GRACE;
        while let Err(errno) = flock(&file, FlockOperation::NonBlockingLockExclusive) {
            if errno != rustix::io::Errno::WOULDBLOCK {
                return Err(StoreError::io(&path, errno.into()));
            }
            let mut text = String::new();
            let _ = file.seek(SeekFrom::Start(0)).and_then(|_| file.read_to_string(&mut text));
            let pid: Option<u32> = text.trim().parse().ok();
            if pid.is_none_or(alive) || Instant::now() >= deadline {
                return Err(StoreError::Locked { path: root, pid });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = std::process::id();
        let write = file
            .set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(format!("{pid}\n").as_bytes()));
        write.map_err(|e| StoreError::io(&path, e))?;
        Ok(StoreLock { _file: file, dir })
    }

    /// The state directory this lock is in.
    pub fn dir(&self) -> &StateDir {
        &self.dir
    }
}

/// Opens `ctxd.lock` in `dir` (creating it) without following a link, and only when it
/// is a regular file of this user's with no other name: it is truncated and written
/// once the lock is held.
fn open_lock(dir: &StateDir, path: &Path) -> Result<File, StoreError> {
    let refuse = |detail: String| StoreError::NotOurs {
        cause: "store lock that is not ctxd's",
        path: path.to_owned(),
        detail: format!(
            "{detail}; ctxd writes its lock only as a regular file of its own: remove it if you did not make it, or use another state directory"
        ),
    };
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(&dir.fd, "ctxd.lock", flags, Mode::from_raw_mode(0o600)) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::LOOP) => return Err(refuse("it is a symbolic link".to_owned())),
        Err(e) => return Err(StoreError::io(path, e.into())),
    };
    let file = File::from(fd);
    let meta = file.metadata().map_err(|e| StoreError::io(path, e))?;
    let me = rustix::process::geteuid().as_raw();
    if !meta.file_type().is_file() {
        return Err(refuse("it is not a regular file".to_owned()));
    }
    if meta.uid() != me {
        return Err(refuse(format!("it is owned by uid {}, and ctxd runs as uid {me}", meta.uid())));
    }
    if meta.nlink() != 1 {
        return Err(refuse(format!("it has {} names (hard links)", meta.nlink())));
    }
    Ok(file)
}

/// How long a lock whose holder is dead may take to be released.
const DEAD_HOLDER_GRACE: Duration = Duration::from_secs(2);

/// Whether a process with this pid exists (one we may not signal exists too).
fn alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else { return false };
    !matches!(rustix::process::test_kill_process(pid), Err(rustix::io::Errno::SRCH))
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;

    use super::*;

    /// Holds the lock through a second open of the file, with `pid` written as holder.
    fn hold(root: &Path, pid: u32) -> File {
        let mut file =
            OpenOptions::new().read(true).write(true).create(true).truncate(true).open(root.join("ctxd.lock")).unwrap();
        flock(&file, FlockOperation::NonBlockingLockExclusive).unwrap();
        file.write_all(format!("{pid}\n").as_bytes()).unwrap();
        file
    }

    #[test]
    fn a_lock_that_is_a_link_is_not_followed_and_its_target_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "keep\n").unwrap();
        let root = dir.path().join("state");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink(&target, root.join("ctxd.lock")).unwrap();
        let refused = StoreLock::acquire(&root).unwrap_err().to_string();
        assert!(refused.starts_with("store lock that is not ctxd's:"), "{refused}");
        assert!(refused.contains("symbolic link"), "{refused}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep\n");
    }

    #[test]
    fn a_state_directory_others_may_write_to_is_refused_as_it_is() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o770)).unwrap();
        let refused = StoreLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(refused.starts_with("state directory writable by others:"), "{refused}");
        assert!(refused.contains("mode 0770"), "{refused}");
        assert!(!dir.path().join("ctxd.lock").exists());
        // Readable by others but writable by none: this user's, made private.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let lock = StoreLock::acquire(dir.path()).unwrap();
        assert_eq!(std::fs::metadata(dir.path()).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(lock.dir().short_path("ctxd.sock").as_os_str().len() < 40);
    }

    #[test]
    fn a_live_holder_is_named_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let _held = hold(dir.path(), std::process::id());
        match StoreLock::acquire(dir.path()) {
            Err(StoreError::Locked { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_lock_left_by_a_dead_holder_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let held = hold(dir.path(), dead);
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            drop(held);
        });
        let lock = StoreLock::acquire(dir.path());
        release.join().unwrap();
        assert!(lock.is_ok(), "{lock:?}");
        let text = std::fs::read_to_string(dir.path().join("ctxd.lock")).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
    }
}
