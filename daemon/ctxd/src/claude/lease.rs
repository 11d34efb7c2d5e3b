//! A write lease on a Claude Code transcript: the one moment in which ctxd may change
//! the file, with the program kept out.
//!
//! Claude Code appends to its transcript by opening it, writing one line and closing it,
//! and takes no lock, so an advisory lock would keep nothing out. A Linux write lease
//! does: it can be taken only while no other descriptor of the file is open anywhere
//! (so taking it is also the check that no process has the file open, at the moment it
//! matters), and while it is held any other process's `open` of the file waits until it
//! is released. Everything ctxd does under the lease goes through the leased descriptor
//! itself: another `open` by ctxd would wait on its own lease.
//!
//! A lease's holder is told that someone wants the file by a signal, `SIGIO` unless
//! another is chosen; `SIGIO` ends a process that does not handle it. The lease asks for
//! `SIGURG` instead, whose default action is to ignore it: ctxd holds a lease for a few
//! writes and releases it without being told.
//!
//! `fcntl(F_SETSIG)` and `fcntl(F_SETLEASE)` have no safe wrapper (rustix has none for
//! leases), so this module holds the crate's only `unsafe` code: two `libc::fcntl` calls
//! on a descriptor the `File` owns, with integer arguments.

#![allow(unsafe_code)]

use std::fs::File;
use std::time::Duration;

/// Why no lease was taken.
#[derive(Debug)]
pub enum LeaseError {
    /// Another descriptor of the file stayed open through every try: a process has it
    /// open.
    Open,
    /// Leases cannot be taken on this file here (another system, a file system without
    /// leases, a file of another user): the reason.
    Unavailable(String),
}

/// A file under ctxd's write lease; dropping it releases the lease and closes the file.
#[derive(Debug)]
pub struct Leased {
    file: File,
}

impl Leased {
    /// The leased descriptor: the only one through which the file may be read or
    /// written while the lease is held.
    pub fn file(&self) -> &File {
        &self.file
    }
}

/// Tries to take the lease for about a second (a reader such as ctxd's own follower
/// may have the file open for a moment) before giving up with [`LeaseError::Open`].
pub fn take(file: File) -> Result<Leased, LeaseError> {
    const TRIES: u32 = 10;
    const PAUSE: Duration = Duration::from_millis(100);
    let mut file = file;
    for attempt in 1..=TRIES {
        match try_take(file) {
            Ok(leased) => return Ok(leased),
            Err((back, Attempt::Busy)) if attempt < TRIES => {
                file = back;
                std::thread::sleep(PAUSE);
            }
            Err((_, Attempt::Busy)) => return Err(LeaseError::Open),
            Err((_, Attempt::Unavailable(why))) => return Err(LeaseError::Unavailable(why)),
        }
    }
    Err(LeaseError::Open)
}

// Elsewhere than Linux every attempt is `Unavailable`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
enum Attempt {
    Busy,
    Unavailable(String),
}

/// `F_SETSIG` from the kernel's `asm-generic/fcntl.h` (the value on every architecture
/// ctxd is built for); the `libc` crate exports it only for some targets.
#[cfg(target_os = "linux")]
const F_SETSIG: libc::c_int = 10;

#[cfg(target_os = "linux")]
fn try_take(file: File) -> Result<Leased, (File, Attempt)> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is open (owned by `file`, alive for the call); F_SETSIG takes an int.
    if unsafe { libc::fcntl(fd, F_SETSIG, libc::SIGURG) } == -1 {
        let why = std::io::Error::last_os_error();
        return Err((file, Attempt::Unavailable(format!("cannot choose the lease's signal ({why})"))));
    }
    // SAFETY: as above; F_SETLEASE takes an int (the lease type).
    if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) } == -1 {
        let err = std::io::Error::last_os_error();
        let attempt = match err.raw_os_error() {
            Some(libc::EAGAIN) => Attempt::Busy,
            Some(libc::EACCES | libc::EPERM) => Attempt::Unavailable(format!(
                "ctxd may not take a lease on it ({err}): only its owner may, and ctxd runs as another user"
            )),
            _ => Attempt::Unavailable(format!("its file system gives no leases ({err})")),
        };
        return Err((file, attempt));
    }
    Ok(Leased { file })
}

#[cfg(not(target_os = "linux"))]
fn try_take(file: File) -> Result<Leased, (File, Attempt)> {
    Err((file, Attempt::Unavailable("file leases are a Linux feature".to_owned())))
}

impl Drop for Leased {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: the descriptor is still open (closed after this, with `file`).
            // Closing it would release the lease too; this says so explicitly first.
            let _ = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
        }
    }
}

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::os::unix::fs::OpenOptionsExt;

    fn writable(path: &std::path::Path) -> File {
        OpenOptions::new().read(true).write(true).open(path).unwrap()
    }

    #[test]
    fn a_lease_is_refused_while_another_descriptor_is_open_and_keeps_others_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        std::fs::write(&path, "line\n").unwrap();
        // Another descriptor open: no lease, after about a second of tries.
        let other = File::open(&path).unwrap();
        let started = std::time::Instant::now();
        assert!(matches!(take(writable(&path)), Err(LeaseError::Open)));
        assert!(started.elapsed() >= Duration::from_millis(800));
        drop(other);
        let leased = take(writable(&path)).unwrap();
        // Another open waits for the release (non-blocking, it says it would block).
        let blocked =
            OpenOptions::new().append(true).custom_flags(libc::O_NONBLOCK).open(&path).map(|_| ()).unwrap_err();
        assert_eq!(blocked.raw_os_error(), Some(libc::EWOULDBLOCK));
        // The lease-break signal did not end this process; the lease holder's own
        // descriptor still writes.
        use std::os::unix::fs::FileExt;
        leased.file().write_all_at(b"more\n", 5).unwrap();
        drop(leased);
        assert_eq!(std::fs::read(&path).unwrap(), b"line\nmore\n");
        OpenOptions::new().append(true).open(&path).unwrap();
    }
}
