//! The two changes ctxd makes to a Claude Code transcript: appending its install, and
//! cutting it off again (undo), each under a write lease ([`super::lease`]).
//!
//! Under the lease no other process can open the file, and none had it open when the
//! lease was taken, so what ctxd checks is what it changes: the file's length and time
//! are those it read before the summary, and for an undo the bytes after the cut are
//! exactly ctxd's install, with nothing after it (a line, or only whitespace). All I/O
//! goes through the leased descriptor.
//!
//! Without leases (another system than Linux) the checks are made without one: a
//! process with the file open (`lsof`) refuses, the length and time are compared, the
//! install is read back after it is written and cut off again while it is still the
//! file's end, and an undo compares the bytes after the cut. A line the program appends
//! between those checks and the change can then still meet ctxd's: on Linux a
//! transcript on which no lease can be taken (a file system without leases, a file of
//! another user) is refused instead.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::lease::{self, LeaseError};
use super::window::Stamp;

/// Appends `ours` (whole lines) to the transcript at `path`, whose length and time must
/// still be `before`. On an error nothing of ctxd's is left in the file.
pub fn append(path: &Path, before: Stamp, ours: &[u8]) -> Result<(), String> {
    let moved = "it changed while the summary was being written";
    match under_lease(path, before, moved, |file| write_at_end(file, before.len, ours))? {
        Leased::Done => Ok(()),
        Leased::Unavailable(why) => without_lease::append(path, before, ours, why),
    }
}

/// Cuts the transcript at `path` back to `offset`, when its length and time are still
/// `before` and the bytes from `offset` to its end are exactly `ours`.
pub fn cut_back(path: &Path, before: Stamp, offset: u64, ours: &[u8]) -> Result<(), String> {
    let moved = "it changed since it was read";
    match under_lease(path, before, moved, |file| cut_if_ours(file, before.len, offset, ours))? {
        Leased::Done => Ok(()),
        Leased::Unavailable(why) => without_lease::cut_back(path, before, offset, ours, why),
    }
}

/// What [`under_lease`] did: the change, or nothing because no lease can be had here.
enum Leased {
    Done,
    Unavailable(String),
}

/// Takes the lease on `path`, checks that its stamp is still `before` (else refuses
/// with `moved`) and makes `change` through the leased descriptor.
fn under_lease(
    path: &Path,
    before: Stamp,
    moved: &str,
    change: impl FnOnce(&File) -> Result<(), String>,
) -> Result<Leased, String> {
    let leased = match lease::take(open_for_change(path)?) {
        Ok(leased) => leased,
        Err(LeaseError::Open) => return Err(has_it_open(path)),
        Err(LeaseError::Unavailable(why)) => return Ok(Leased::Unavailable(why)),
    };
    if Stamp::of(leased.file())? != before {
        return Err(moved.to_owned());
    }
    change(leased.file()).map(|()| Leased::Done)
}

/// The transcript opened for reading and writing, without waiting (a FIFO put in its
/// place since it was read, or a lease someone else holds, answers at once).
fn open_for_change(path: &Path) -> Result<File, String> {
    let flags = rustix::fs::OFlags::NONBLOCK.bits() as i32 | rustix::fs::OFlags::NOCTTY.bits() as i32;
    let file =
        OpenOptions::new().read(true).write(true).custom_flags(flags).open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => has_it_open(path),
            _ => format!("cannot open it for writing: {e}"),
        })?;
    let meta = file.metadata().map_err(|e| format!("cannot read its kind: {e}"))?;
    if !meta.is_file() {
        return Err("it is no longer a regular file".to_owned());
    }
    Ok(file)
}

fn has_it_open(path: &Path) -> String {
    match super::opened_by(path) {
        Some((pid, comm)) => format!("process {pid} ({comm}) has it open"),
        None => "a process has it open".to_owned(),
    }
}

/// Writes `ours` at `end` (the file's length), syncs, and reads it back; a failure cuts
/// ctxd's bytes off again.
fn write_at_end(file: &File, end: u64, ours: &[u8]) -> Result<(), String> {
    if let Err(e) = file.write_all_at(ours, end).and_then(|()| file.sync_data()) {
        // A short write is cut off, if nothing came after it: the file is as it was.
        let back = take_back(file, end, ours);
        return Err(format!("the write failed: {e}; {back}"));
    }
    match landed_at(file, end, ours) {
        Ok(true) => Ok(()),
        Ok(false) => {
            let back = take_back(file, end, ours);
            Err(format!("the program wrote to it at the moment of the install; {back}"))
        }
        Err(e) => {
            let back = take_back(file, end, ours);
            Err(format!("cannot read back the install ({e}); {back}"))
        }
    }
}

/// Cuts `file` (of length `len`) back to `offset` when the bytes from there to its end
/// are exactly `ours`.
fn cut_if_ours(file: &File, len: u64, offset: u64, ours: &[u8]) -> Result<(), String> {
    let not_ours = "the bytes after ctxd's install are not all ctxd's (a line or whitespace came after it): undoing would take them away";
    if len.checked_sub(offset) != Some(ours.len() as u64) {
        return Err(not_ours.to_owned());
    }
    if !landed_at(file, offset, ours).map_err(|e| format!("cannot read it: {e}"))? {
        return Err(not_ours.to_owned());
    }
    file.set_len(offset).and_then(|()| file.sync_data()).map_err(|e| format!("cannot cut it back: {e}"))
}

/// Whether the file holds `ours` at `offset`.
fn landed_at(file: &File, offset: u64, ours: &[u8]) -> std::io::Result<bool> {
    let mut there = vec![0; ours.len()];
    match file.read_exact_at(&mut there, offset) {
        Ok(()) => Ok(there == ours),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// Cuts ctxd's bytes (`ours`, or the start of them after a short write) off the end of
/// the file, when they are still its end; says what was done. Never cuts a byte that
/// is not ctxd's.
fn take_back(file: &File, offset: u64, ours: &[u8]) -> String {
    let Ok(len) = file.metadata().map(|m| m.len()) else { return "its length cannot be read".to_owned() };
    // Where ctxd's bytes would start if they are the file's end: right after what was
    // there (a short write), or at the end minus all of them.
    let starts = [offset, len.saturating_sub(ours.len() as u64)];
    for start in starts.into_iter().filter(|&start| start >= offset && start <= len) {
        let tail_len = usize::try_from(len - start).unwrap_or(usize::MAX);
        if tail_len > ours.len() {
            continue;
        }
        let mut tail = vec![0; tail_len];
        if file.read_exact_at(&mut tail, start).is_ok() && ours.starts_with(&tail) {
            return match file.set_len(start).and_then(|()| file.sync_data()) {
                Ok(()) => "ctxd's lines were taken back; the file is as the program left it".to_owned(),
                Err(e) => format!("ctxd's lines could not be taken back ({e})"),
            };
        }
    }
    // Only without a lease: the program appended after ctxd's lines in the moment
    // between the checks and the write. Cutting would take its line; nothing else
    // is known to make the install inert for the program, so it is said loudly.
    tracing::error!(
        offset,
        "claude: the program wrote after ctxd's install at the moment it was checked; ctxd's lines stay among the program's"
    );
    "a line came after ctxd's lines, so they were left in place".to_owned()
}

/// Linux: no lease, no change.
#[cfg(target_os = "linux")]
mod without_lease {
    use super::{Path, Stamp};

    fn refusal(why: String) -> String {
        format!("{why}; without a lease ctxd cannot keep the program from writing while it changes the file")
    }

    pub fn append(_path: &Path, _before: Stamp, _ours: &[u8], why: String) -> Result<(), String> {
        Err(refusal(why))
    }

    pub fn cut_back(_path: &Path, _before: Stamp, _offset: u64, _ours: &[u8], why: String) -> Result<(), String> {
        Err(refusal(why))
    }
}

/// Elsewhere: the checks of the module's documentation, made without a lease.
#[cfg(not(target_os = "linux"))]
mod without_lease {
    use super::{OpenOptions, Path, Stamp, cut_if_ours, write_at_end};

    fn unchanged(path: &Path, before: Stamp) -> Result<std::fs::File, String> {
        super::super::not_open(path)?;
        let file = OpenOptions::new().read(true).write(true).open(path).map_err(|e| format!("cannot open it: {e}"))?;
        if Stamp::of(&file)? != before {
            return Err("it changed since it was read".to_owned());
        }
        Ok(file)
    }

    pub fn append(path: &Path, before: Stamp, ours: &[u8], why: String) -> Result<(), String> {
        tracing::debug!(transcript = %path.display(), "claude: no lease ({why}); checking without one");
        write_at_end(&unchanged(path, before)?, before.len, ours)
    }

    pub fn cut_back(path: &Path, before: Stamp, offset: u64, ours: &[u8], why: String) -> Result<(), String> {
        tracing::debug!(transcript = %path.display(), "claude: no lease ({why}); checking without one");
        cut_if_ours(&unchanged(path, before)?, before.len, offset, ours)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file as a race would leave it, opened as the install opens it.
    fn raced(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        std::fs::write(&path, bytes).unwrap();
        let file = OpenOptions::new().read(true).append(true).open(&path).unwrap();
        (dir, path, file)
    }

    #[test]
    fn an_install_raced_by_the_program_takes_back_only_its_own_bytes() {
        let ours = b"{\"boundary\":1}\n{\"summary\":2}\n";
        let before = b"{\"old\":0}\n".len() as u64;
        // The program's line slipped in before ctxd's: ctxd's lines go, the program's stays.
        let (_d, path, file) = raced(b"{\"old\":0}\n{\"program\":1}\n{\"boundary\":1}\n{\"summary\":2}\n");
        assert!(!landed_at(&file, before, ours).unwrap());
        assert!(take_back(&file, before, ours).contains("taken back"));
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"old\":0}\n{\"program\":1}\n");
        // The program's line came after ctxd's: the install stands.
        let (_d, _path, file) = raced(b"{\"old\":0}\n{\"boundary\":1}\n{\"summary\":2}\n{\"program\":1}\n");
        assert!(landed_at(&file, before, ours).unwrap());
        // Lines on both sides: nothing that is not ctxd's is ever cut, so nothing is.
        let both = b"{\"old\":0}\n{\"program\":1}\n{\"boundary\":1}\n{\"summary\":2}\n{\"program\":2}\n";
        let (_d, path, file) = raced(both);
        assert!(!landed_at(&file, before, ours).unwrap());
        assert!(take_back(&file, before, ours).contains("left in place"));
        assert_eq!(std::fs::read(&path).unwrap(), both);
        // A short write: its start is cut off, the file is as it was.
        let (_d, path, file) = raced(b"{\"old\":0}\n{\"bound");
        assert!(take_back(&file, before, ours).contains("taken back"));
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"old\":0}\n");
    }

    #[test]
    fn an_undo_cuts_only_when_the_end_is_exactly_ctxds_install() {
        let ours = b"{\"boundary\":1}\n{\"summary\":2}\n";
        let offset = b"{\"old\":0}\n".len() as u64;
        let exact = [&b"{\"old\":0}\n"[..], ours].concat();
        for extra in [&b"\n   \n\t\n"[..], b"\n", b"{\"program\":1}\n", b" "] {
            let file = [&exact[..], extra].concat();
            let (_d, path, opened) = raced(&file);
            let err = cut_if_ours(&opened, file.len() as u64, offset, ours).unwrap_err();
            assert!(err.contains("not all ctxd's"), "{err}");
            assert_eq!(std::fs::read(&path).unwrap(), file, "left byte for byte");
        }
        // The same length, other bytes.
        let other = [&b"{\"old\":0}\n"[..], b"{\"boundary\":1}\n{\"summary\":3}\n"].concat();
        let (_d, path, opened) = raced(&other);
        assert!(cut_if_ours(&opened, other.len() as u64, offset, ours).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), other);
        // Exactly ctxd's: cut.
        let (_d, path, _) = raced(&exact);
        let opened = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        cut_if_ours(&opened, exact.len() as u64, offset, ours).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"old\":0}\n");
    }
}
