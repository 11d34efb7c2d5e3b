//! One daemon per store: an exclusive `flock` on `<state dir>/ctxd.lock`.
//!
//! The kernel drops the lock when the process dies, `kill -9` included, so a crashed
//! daemon never leaves a stale lock behind. The holder's pid is written into the file
//! so the refusal can name it.
//!
//! One window remains: a child the holder forked (git, a hook) shares the lock's open
//! file until it execs (the descriptor is close-on-exec). If the holder is killed right
//! then, the lock outlives it by that moment, so a lock whose named holder is dead is
//! tried again for a short while before the store is called in use.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, flock};

use super::StoreError;

/// The held lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
}

impl StoreLock {
    pub fn acquire(root: &Path) -> Result<StoreLock, StoreError> {
        let path = root.join("ctxd.lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| StoreError::io(&path, e))?;
        let deadline = Instant::now() + DEAD_HOLDER_GRACE;
        while let Err(errno) = flock(&file, FlockOperation::NonBlockingLockExclusive) {
            if errno != rustix::io::Errno::WOULDBLOCK {
                return Err(StoreError::io(&path, errno.into()));
            }
            let mut text = String::new();
            let _ = file.seek(SeekFrom::Start(0)).and_then(|_| file.read_to_string(&mut text));
            let pid: Option<u32> = text.trim().parse().ok();
            if pid.is_none_or(alive) || Instant::now() >= deadline {
                return Err(StoreError::Locked { path: root.to_owned(), pid });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = std::process::id();
        let write = file
            .set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(format!("{pid}\n").as_bytes()));
        write.map_err(|e| StoreError::io(&path, e))?;
        Ok(StoreLock { _file: file })
    }
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
