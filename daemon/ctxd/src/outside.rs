//! The one way ctxd opens a file it did not write: memory files, rules and imports,
//! settings, paths the agent read, the plan, transcripts to import or follow.
//!
//! Such a path can name anything: a FIFO that blocks an open or a read forever, a
//! device that never ends (`/dev/zero`), a sparse file of a gigabyte. So every open is
//! non-blocking, the opened file must be a regular file (checked on the descriptor, not
//! the path, so a swap between a stat and the open changes nothing), and each use reads
//! at most its own cap, refusing a larger file before reading a byte of it.
//!
//! A file put back into a transcript (restored after a compaction, or named in a
//! changed-file note) goes further: the transcript holds its text, and the model and
//! anyone who reads the transcript see it, so it is read under the rules of memory
//! imports ([`Restorable`]): never from `/proc`, `/sys` or `/dev`, and only from the
//! session's project, Claude Code's folder and the user's `importFolders`.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// How much one use reads at most, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    pub bytes: u64,
    /// What the file is to ctxd, for the error ("a memory file").
    pub what: &'static str,
}

/// A memory file, rule or imported file (Claude Code warns past 40k characters).
pub const MEMORY_FILE: Cap = Cap { bytes: 1 << 20, what: "a memory file" };
/// A settings file.
pub const SETTINGS_FILE: Cap = Cap { bytes: 1 << 20, what: "a settings file" };
/// A file the agent read (`ctx/fileRead`, restored after a compaction).
pub const READ_FILE: Cap = Cap { bytes: 16 << 20, what: "a file to restore" };
/// The session's plan.
pub const PLAN_FILE: Cap = Cap { bytes: 1 << 20, what: "a plan" };

/// Why a file was not read.
#[derive(Debug)]
pub enum OutsideError {
    /// Nothing at the path (or a folder on the way is a file).
    Missing,
    /// Something that is not a regular file: a FIFO, device, socket or directory.
    NotRegular(&'static str),
    /// Larger than the use's cap.
    TooLarge {
        size: u64,
        cap: Cap,
    },
    /// Not a file ctxd puts into a transcript: the reason.
    NotAllowed(&'static str),
    Io(io::Error),
}

impl fmt::Display for OutsideError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutsideError::Missing => f.write_str("no such file"),
            OutsideError::NotRegular(kind) => write!(f, "is {kind}, not a regular file; ctxd reads only regular files"),
            OutsideError::TooLarge { size, cap } => write!(
                f,
                "is {}, more than the {} ctxd reads for {}",
                human_bytes(*size),
                human_bytes(cap.bytes),
                cap.what
            ),
            OutsideError::NotAllowed(why) => f.write_str(why),
            OutsideError::Io(err) => match err.raw_os_error() {
                Some(code) => write!(f, "{} (os error {code})", err.kind()),
                None => write!(f, "{}: {err}", err.kind()),
            },
        }
    }
}

impl std::error::Error for OutsideError {}

impl From<OutsideError> for io::Error {
    fn from(err: OutsideError) -> io::Error {
        match err {
            OutsideError::Missing => io::Error::new(io::ErrorKind::NotFound, err.to_string()),
            OutsideError::Io(err) => err,
            other => io::Error::new(io::ErrorKind::InvalidInput, other.to_string()),
        }
    }
}

/// Opens `path` for reading if it is a regular file, without ever blocking on the open.
/// The file's length comes back with it.
pub fn open_regular(path: &Path) -> Result<(File, u64), OutsideError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32 | rustix::fs::OFlags::NOCTTY.bits() as i32)
        .open(path)
        .map_err(|err| match err.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => OutsideError::Missing,
            _ => OutsideError::Io(err),
        })?;
    let meta = file.metadata().map_err(OutsideError::Io)?;
    let kind = meta.file_type();
    let not_regular = if kind.is_dir() {
        Some("a directory")
    } else if kind.is_fifo() {
        Some("a FIFO")
    } else if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_socket() {
        Some("a socket")
    } else if !kind.is_file() {
        Some("an unknown kind of file")
    } else {
        None
    };
    match not_regular {
        Some(kind) => Err(OutsideError::NotRegular(kind)),
        None => Ok((file, meta.len())),
    }
}

/// The whole of a regular file at `path`, refused when it is larger than `cap`.
pub fn read(path: &Path, cap: Cap) -> Result<Vec<u8>, OutsideError> {
    let (file, size) = open_regular(path)?;
    read_open(file, size, cap)
}

/// The whole of an opened regular file of `size` bytes, within `cap`.
fn read_open(file: File, size: u64, cap: Cap) -> Result<Vec<u8>, OutsideError> {
    if size > cap.bytes {
        return Err(OutsideError::TooLarge { size, cap });
    }
    // The file may grow between the stat and the read: never read past the cap.
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(cap.bytes + 1).read_to_end(&mut bytes).map_err(OutsideError::Io)?;
    if bytes.len() as u64 > cap.bytes {
        return Err(OutsideError::TooLarge { size: bytes.len() as u64, cap });
    }
    Ok(bytes)
}

/// [`read`] as text; bytes that are not UTF-8 are replaced.
pub fn read_text(path: &Path, cap: Cap) -> Result<String, OutsideError> {
    read(path, cap).map(into_text)
}

fn into_text(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
    }
}

/// The folders files put back into a transcript may come from: the session's project,
/// Claude Code's folder and the user's `importFolders`, each where it really leads
/// (symlinks resolved), as memory imports are allowed.
#[derive(Debug, Clone, Default)]
pub struct Restorable {
    roots: Vec<PathBuf>,
}

/// Where the system's own pseudo files live: their "contents" are the state of a
/// process (ctxd's environment, with its keys) or of the machine, never a user's file.
const SYSTEM_FOLDERS: [&str; 3] = ["/proc", "/sys", "/dev"];

impl Restorable {
    /// From the project directory, Claude Code's folder and the `importFolders` setting
    /// (absolute, or starting with `~/`, which is `home`; others are ignored, as the
    /// settings' diagnostics say). A folder that does not exist allows nothing.
    pub fn new(project: Option<&Path>, claude_config: Option<&Path>, home: Option<&Path>, imports: &[String]) -> Self {
        let imported = imports.iter().filter_map(|folder| match folder.strip_prefix('~') {
            Some("") => home.map(Path::to_path_buf),
            Some(rest) if rest.starts_with('/') => home.map(|h| h.join(rest.trim_start_matches('/'))),
            _ if folder.starts_with('/') => Some(PathBuf::from(folder)),
            _ => None,
        });
        let roots = project
            .map(Path::to_path_buf)
            .into_iter()
            .chain(claude_config.map(Path::to_path_buf))
            .chain(imported)
            .filter_map(|root| std::fs::canonicalize(root).ok())
            .collect();
        Restorable { roots }
    }

    /// Why the file at its real path `real` may not go into a transcript, if it may not.
    /// The system folders stay closed whatever the roots (a project at `/`).
    fn refusal(&self, real: &Path) -> Option<&'static str> {
        if SYSTEM_FOLDERS.iter().any(|system| real.starts_with(system)) {
            return Some("is a system file (/proc, /sys or /dev); ctxd never puts one into a transcript");
        }
        if !self.roots.iter().any(|root| real.starts_with(root)) {
            return Some(
                "lies outside the project, Claude Code's folder and importFolders; ctxd names it instead of restoring it",
            );
        }
        None
    }
}

/// A file's text to put back into a transcript ([`Restorable`]), read as [`read_text`]
/// reads. The rules hold for where the path really leads and, on Linux, for the file
/// system of the opened descriptor: `/proc/self/environ` mounted or linked elsewhere is
/// still a file of `proc`.
pub fn read_restorable(path: &Path, allowed: &Restorable, cap: Cap) -> Result<String, OutsideError> {
    let real = std::fs::canonicalize(path).map_err(|err| match err.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => OutsideError::Missing,
        _ => OutsideError::Io(err),
    })?;
    if let Some(why) = allowed.refusal(&real) {
        return Err(OutsideError::NotAllowed(why));
    }
    let (file, size) = open_regular(&real)?;
    if pseudo_file_system(&file) {
        return Err(OutsideError::NotAllowed(
            "is on a system file system (proc, sysfs, …); ctxd never puts one into a transcript",
        ));
    }
    read_open(file, size, cap).map(into_text)
}

/// Whether the open file lies on a file system of the kernel's own state: proc, sysfs
/// and their kin, whose files stat as regular files.
#[cfg(target_os = "linux")]
fn pseudo_file_system(file: &File) -> bool {
    const PSEUDO: [u64; 12] = [
        0x9fa0,      // proc
        0x6265_6572, // sysfs
        0x6462_6720, // debugfs
        0x7472_6163, // tracefs
        0x7363_6673, // securityfs
        0x0027_e0eb, // cgroup
        0x6367_7270, // cgroup2
        0xde5e_81e4, // efivarfs
        0xcafe_4a11, // bpf
        0x6165_676c, // pstore
        0x6265_6570, // configfs
        0x1cd1,      // devpts
    ];
    // A file system that cannot be asked is not trusted either.
    rustix::fs::fstatfs(file).map_or(true, |fs| PSEUDO.contains(&(fs.f_type as u64 & 0xffff_ffff)))
}

/// Elsewhere the real path is the rule.
#[cfg(not(target_os = "linux"))]
fn pseudo_file_system(_file: &File) -> bool {
    false
}

/// Reads a stream another program writes (a status line's stdin) until it ends, until
/// what was read is `complete`, or until `timeout` passes, whichever is first, keeping at
/// most `cap` bytes. A writer that never closes its end costs `timeout`, not forever:
/// the reading thread is left blocked, and the process exits soon after.
pub fn read_stream(
    mut stream: impl Read + Send + 'static,
    cap: usize,
    timeout: std::time::Duration,
    complete: fn(&[u8]) -> bool,
) -> Vec<u8> {
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.send(chunk[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let deadline = std::time::Instant::now() + timeout;
    let mut out = Vec::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(chunk) => {
                out.extend_from_slice(&chunk[..chunk.len().min(cap.saturating_sub(out.len()))]);
                if out.len() >= cap || complete(&out) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    out
}

/// `1.5 MiB`, `1.0 GiB`, `512 bytes`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 { format!("{value:.0} {}", UNITS[unit]) } else { format!("{value:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: Cap = Cap { bytes: 10, what: "a test file" };

    #[test]
    fn regular_files_are_read_up_to_their_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "0123456789").unwrap();
        assert_eq!(read(&path, SMALL).unwrap(), b"0123456789");
        std::fs::write(&path, "0123456789A").unwrap();
        let err = read(&path, SMALL).unwrap_err().to_string();
        assert_eq!(err, "is 11 bytes, more than the 10 bytes ctxd reads for a test file");
        assert!(matches!(read(&dir.path().join("none"), SMALL), Err(OutsideError::Missing)));
        assert!(matches!(read(&path.join("below-a-file"), SMALL), Err(OutsideError::Missing)));
    }

    #[test]
    fn a_stream_is_read_until_complete_or_the_timeout_never_forever() {
        let (reader, mut writer) = std::io::pipe().unwrap();
        std::io::Write::write_all(&mut writer, b"{\"a\":1}").unwrap();
        // The writer stays open: the object is complete, so reading stops there.
        let whole = |b: &[u8]| serde_json::from_slice::<serde::de::IgnoredAny>(b).is_ok();
        let read = read_stream(reader, 1024, std::time::Duration::from_secs(30), whole);
        assert_eq!(read, b"{\"a\":1}");
        // Nothing ever comes: the timeout ends it with what was read.
        let (reader, _writer) = std::io::pipe().unwrap();
        assert!(read_stream(reader, 1024, std::time::Duration::from_millis(50), whole).is_empty());
        // More than the cap: cut at the cap.
        let read = read_stream(&b"0123456789"[..], 4, std::time::Duration::from_secs(30), |_| false);
        assert_eq!(read, b"0123");
    }

    #[test]
    fn a_sparse_giant_is_refused_without_reading_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("CLAUDE.md");
        File::create(&path).unwrap().set_len(1 << 30).unwrap();
        let err = read(&path, MEMORY_FILE).unwrap_err().to_string();
        assert_eq!(err, "is 1 GiB, more than the 1 MiB ctxd reads for a memory file");
    }

    #[test]
    fn a_file_to_restore_comes_only_from_the_allowed_folders_and_never_from_proc() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("proj");
        let home = dir.path().join("home");
        let shared = home.join("shared");
        for folder in [&project, &shared, &home.join(".claude")] {
            std::fs::create_dir_all(folder).unwrap();
        }
        let allowed = Restorable::new(Some(&project), Some(&home.join(".claude")), Some(&home), &["~/shared".into()]);
        for (path, text) in [(project.join("a.rs"), "a"), (shared.join("b.md"), "b"), (home.join(".claude/c"), "c")] {
            std::fs::write(&path, text).unwrap();
            assert_eq!(read_restorable(&path, &allowed, SMALL).unwrap(), text);
        }
        // Outside the folders: named, not read.
        let secret = home.join("secret");
        std::fs::write(&secret, "key").unwrap();
        assert!(matches!(read_restorable(&secret, &allowed, SMALL), Err(OutsideError::NotAllowed(_))));
        // The system's files, by their path or by a link from inside the project.
        assert!(matches!(
            read_restorable(Path::new("/proc/self/environ"), &allowed, READ_FILE),
            Err(OutsideError::NotAllowed(_))
        ));
        std::os::unix::fs::symlink("/proc/self/environ", project.join("env")).unwrap();
        std::os::unix::fs::symlink(&secret, project.join("key")).unwrap();
        for link in ["env", "key"] {
            assert!(matches!(
                read_restorable(&project.join(link), &allowed, READ_FILE),
                Err(OutsideError::NotAllowed(_))
            ));
        }
        // Even a project at `/` never opens them.
        let everything = Restorable::new(Some(Path::new("/")), None, None, &[]);
        assert!(read_restorable(&secret, &everything, SMALL).is_ok());
        let environ = read_restorable(Path::new("/proc/self/environ"), &everything, READ_FILE);
        assert!(matches!(environ, Err(OutsideError::NotAllowed(_))));
        assert!(matches!(read_restorable(&project.join("none"), &allowed, SMALL), Err(OutsideError::Missing)));
    }

    /// `/proc` mounted or linked where the path rule would not see it is still `proc`.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_descriptors_file_system_tells_a_pseudo_file() {
        let (environ, _) = open_regular(Path::new("/proc/self/environ")).unwrap();
        assert!(pseudo_file_system(&environ));
        let (status, _) = open_regular(Path::new("/sys/kernel/mm/transparent_hugepage/enabled"))
            .or_else(|_| open_regular(Path::new("/proc/self/status")))
            .unwrap();
        assert!(pseudo_file_system(&status));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        assert!(!pseudo_file_system(&File::open(dir.path().join("f")).unwrap()));
    }

    // `mknodat` is not in macOS's libc as rustix binds it.
    #[cfg(target_os = "linux")]
    #[test]
    fn fifos_devices_and_directories_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        // No writer: a blocking open would never return.
        assert_eq!(
            read(&fifo, SMALL).unwrap_err().to_string(),
            "is a FIFO, not a regular file; ctxd reads only regular files"
        );
        assert!(read(Path::new("/dev/zero"), READ_FILE).unwrap_err().to_string().starts_with("is a character device"));
        assert!(read(dir.path(), SMALL).unwrap_err().to_string().starts_with("is a directory"));
    }
}
