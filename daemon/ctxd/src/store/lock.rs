//! One daemon per store: an exclusive `flock` on `<state dir>/ctxd.lock`.
//!
//! The kernel drops the lock when the process dies, `kill -9` included, so a crashed
//! daemon never leaves a stale lock behind. The holder's pid is written into the file
//! so the refusal can name it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

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
        if let Err(errno) = flock(&file, FlockOperation::NonBlockingLockExclusive) {
            if errno == rustix::io::Errno::WOULDBLOCK {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(StoreError::Locked { path: root.to_owned(), pid: text.trim().parse().ok() });
            }
            return Err(StoreError::io(&path, errno.into()));
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
