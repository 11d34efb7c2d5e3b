//! Whether Claude Code is running for a session, so that ctxd leaves its transcript alone.
//!
//! The open-file check (`claude::opened_by`) cannot see a running Claude Code: version
//! 2.1.332 opens its transcript for each write and holds no descriptor in between. A
//! running program keeps the conversation in memory and sends all of it with its next
//! request whatever the file says, and its next prompt hangs off the last message it
//! wrote, around any boundary appended meanwhile: a compaction written under it saves
//! nothing and leaves a branch that a rewind can bring back. So `ctxd claude compact`,
//! `undo` and idle compaction refuse while the program runs for the session.
//!
//! A process is Claude Code by its name, as `/proc` shows it: the native binary runs as
//! `claude` (or `claude.exe`, the npm package's copy of it); a program renamed or
//! installed under a version number is known by its first argument, and the JavaScript
//! form by the script a runtime runs (`node …/@anthropic-ai/claude-code/cli.js`). It runs
//! for the session when its arguments name the session (`--resume <id>`, `-r <id>`,
//! `--session-id <id>`, `--resume=<id>`) or when its working directory is the session's
//! project directory: a `cwd` the transcript's records name, or the directory the
//! program named the transcript's folder after. One in the project counts whatever its
//! arguments, since `--continue` and `/resume` reach any session of the project. When a
//! process that could write the file cannot be read far enough to tell, it counts as
//! running; so does a machine whose processes cannot be listed.
//!
//! The scan reads one small file per process (`comm`) and more only for the few whose
//! name fits, and the transcript (its first and last 64 KiB, for the ids and
//! directories) only when such a process exists (`benches/live.rs`).

use std::fmt::{self, Write as _};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Names the native program runs under.
const PROGRAM_NAMES: [&str; 2] = ["claude", "claude.exe"];
/// Runtimes the JavaScript form runs in.
const RUNTIMES: [&str; 4] = ["node", "nodejs", "bun", "deno"];
/// Scripts of the JavaScript form, under its package folder.
const SCRIPTS: [&str; 3] = ["cli.js", "cli.mjs", "cli-wrapper.cjs"];
/// The part of a transcript read at each end for its ids and directories.
const EDGE_BYTES: u64 = 64 * 1024;
/// Distinct ids or directories kept from a transcript; a real one names one or a few.
const MAX_KEYS: usize = 16;
/// Claude Code shortens a project folder's name to this many characters and appends a
/// hash of the full path.
const FOLDER_NAME_MAX: usize = 200;

/// What identifies a session to a process: its ids and its project directories.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Session {
    /// The transcript's file name without `.jsonl` and the `sessionId`s its records name.
    pub ids: Vec<String>,
    /// The `cwd`s its records name, as written and with symlinks resolved.
    pub dirs: Vec<PathBuf>,
    /// The name of the transcript's folder (`~/.claude/projects/<folder>/`).
    pub folder: Option<String>,
    /// The transcript's owner and mode: who else could write it.
    pub owner: Option<(u32, u32)>,
}

/// One process as `/proc` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub pid: u32,
    /// Its name (`/proc/<pid>/comm`).
    pub comm: String,
    /// Its arguments (`/proc/<pid>/cmdline`); empty when they cannot be read.
    pub argv: Vec<String>,
    /// Its working directory, or why it cannot be read.
    pub cwd: Result<PathBuf, String>,
    /// The user it runs as, when known.
    pub uid: Option<u32>,
}

/// Why a process counts as Claude Code running for the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// Its arguments name the session.
    NamesSession,
    /// It works in the session's project directory.
    InProject(PathBuf),
    /// It could write the file, and where it works cannot be read.
    Unreadable(String),
}

/// The answer when the file must be left alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Live {
    Running {
        pid: u32,
        why: Why,
    },
    /// The processes cannot be listed at all.
    Unknown(String),
}

impl fmt::Display for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Live::Running { pid, why: Why::NamesSession } => {
                write!(f, "Claude Code (pid {pid}) is running for this session (its arguments name it)")
            }
            Live::Running { pid, why: Why::InProject(dir) } => write!(
                f,
                "Claude Code (pid {pid}) is running for this session (in its project directory {})",
                dir.display()
            ),
            Live::Running { pid, why: Why::Unreadable(e) } => write!(
                f,
                "Claude Code (pid {pid}) may be running for this session (its working directory cannot be read: {e})"
            ),
            Live::Unknown(e) => write!(f, "cannot tell whether Claude Code is running for this session ({e})"),
        }
    }
}

/// Whether a process named `comm` may be Claude Code: worth reading its arguments.
pub fn worth_a_look(comm: &str) -> bool {
    PROGRAM_NAMES.contains(&comm) || RUNTIMES.contains(&comm) || is_version(comm)
}

/// A name like `2.1.332`: the native installer keeps each version as a file so named.
fn is_version(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit() || b == b'.') && name.contains('.')
}

fn base_name(arg: &str) -> &str {
    arg.rsplit('/').next().unwrap_or(arg)
}

/// Whether the process named `comm` with arguments `argv` is Claude Code.
pub fn is_claude_code(comm: &str, argv: &[String]) -> bool {
    if PROGRAM_NAMES.contains(&comm) {
        return true;
    }
    let Some(first) = argv.first() else { return false };
    if PROGRAM_NAMES.contains(&base_name(first)) || (is_version(comm) && first.contains("/claude/versions/")) {
        return true;
    }
    if !RUNTIMES.contains(&comm) && !RUNTIMES.contains(&base_name(first)) {
        return false;
    }
    // The script the runtime runs: its first argument that is not an option.
    argv[1..].iter().find(|a| !a.starts_with('-')).is_some_and(|script| {
        let name = base_name(script);
        PROGRAM_NAMES.contains(&name) || (SCRIPTS.contains(&name) && script.contains("claude-code"))
    })
}

/// Whether `argv` names one of `ids`: as an argument of its own (`--resume <id>`), after
/// `=` (`--resume=<id>`), or as the transcript's file.
pub fn names_session(argv: &[String], ids: &[String]) -> bool {
    argv.iter().skip(1).any(|arg| {
        ids.iter().filter(|id| !id.is_empty()).any(|id| {
            arg == id
                || arg.strip_suffix(id.as_str()).is_some_and(|head| head.ends_with('='))
                || arg
                    .strip_suffix(".jsonl")
                    .and_then(|a| a.strip_suffix(id.as_str()))
                    .is_some_and(|head| head.is_empty() || head.ends_with('/') || head.ends_with('='))
        })
    })
}

/// The name Claude Code gives the folder of a project's transcripts: every character
/// other than an ASCII letter or digit becomes `-` (one per UTF-16 unit, as the
/// program's JavaScript counts).
pub fn project_folder_name(dir: &Path) -> String {
    dir.to_string_lossy()
        .chars()
        .flat_map(|c| {
            let keep = c.is_ascii_alphanumeric();
            std::iter::repeat_n(if keep { c } else { '-' }, if keep { 1 } else { c.len_utf16() })
        })
        .collect()
}

/// Whether the transcript folder `folder` is the one the program makes for `dir`.
/// A name past the program's limit is cut and given a hash, which is not checked.
fn folder_is_for(folder: &str, dir: &Path) -> bool {
    let name = project_folder_name(dir);
    if name.len() <= FOLDER_NAME_MAX {
        return folder == name;
    }
    folder.len() > FOLDER_NAME_MAX + 1
        && folder.as_bytes()[..FOLDER_NAME_MAX] == name.as_bytes()[..FOLDER_NAME_MAX]
        && folder.as_bytes()[FOLDER_NAME_MAX] == b'-'
}

/// Whether a process of `uid` could write the transcript.
fn could_write(uid: Option<u32>, owner: Option<(u32, u32)>) -> bool {
    match (uid, owner) {
        (Some(uid), Some((owner, mode))) => uid == 0 || uid == owner || mode & 0o022 != 0,
        _ => true,
    }
}

/// Whether the process `seen` is Claude Code running for `session`.
pub fn judge(seen: &Seen, session: &Session) -> Option<Live> {
    if !is_claude_code(&seen.comm, &seen.argv) {
        return None;
    }
    let running = |why| Some(Live::Running { pid: seen.pid, why });
    if names_session(&seen.argv, &session.ids) {
        return running(Why::NamesSession);
    }
    match &seen.cwd {
        Ok(cwd) => {
            let in_project = session.dirs.iter().any(|d| d == cwd)
                || session.folder.as_deref().is_some_and(|folder| folder_is_for(folder, cwd));
            if in_project { running(Why::InProject(cwd.clone())) } else { None }
        }
        Err(e) if could_write(seen.uid, session.owner) => running(Why::Unreadable(e.clone())),
        Err(_) => None,
    }
}

/// The values of `"<key>":"…"` in `text`, a window of JSON lines that may start and end
/// inside a line.
fn string_values(text: &[u8], key: &str, into: &mut Vec<String>) {
    let needle = format!("\"{key}\":");
    for at in memchr::memmem::find_iter(text, needle.as_bytes()) {
        if into.len() >= MAX_KEYS {
            return;
        }
        let rest = &text[at + needle.len()..];
        let rest = &rest[rest.iter().take_while(|b| b.is_ascii_whitespace()).count()..];
        let value = serde_json::Deserializer::from_slice(rest).into_iter::<String>().next();
        if let Some(Ok(value)) = value
            && !value.is_empty()
            && !into.contains(&value)
        {
            into.push(value);
        }
    }
}

/// The session a transcript holds: its ids and directories from the file's name, its
/// folder's name, and the records at each end of it.
pub fn session_of(transcript: &Path) -> Session {
    use std::os::unix::fs::MetadataExt;
    let mut session = Session {
        folder: transcript.parent().and_then(Path::file_name).map(|f| f.to_string_lossy().into_owned()),
        ..Session::default()
    };
    if let Some(stem) = transcript.file_stem() {
        session.ids.push(stem.to_string_lossy().into_owned());
    }
    let mut dirs = Vec::new();
    if let Ok((file, len)) = crate::outside::open_regular(transcript) {
        session.owner = file.metadata().ok().map(|m| (m.uid(), m.mode()));
        for (from, upto) in [(0, EDGE_BYTES.min(len)), (len.saturating_sub(EDGE_BYTES).max(EDGE_BYTES.min(len)), len)] {
            let mut edge = Vec::new();
            let read = std::io::Seek::seek(&mut &file, std::io::SeekFrom::Start(from))
                .and_then(|_| (&file).take(upto - from).read_to_end(&mut edge));
            if read.is_ok() {
                string_values(&edge, "sessionId", &mut session.ids);
                string_values(&edge, "cwd", &mut dirs);
            }
        }
    }
    for dir in dirs.into_iter().map(PathBuf::from) {
        if let Ok(real) = std::fs::canonicalize(&dir)
            && real != dir
        {
            session.dirs.push(real);
        }
        session.dirs.push(dir);
    }
    session
}

/// Whether an error reading `/proc/<pid>/…` says the process has gone.
fn gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(3 /* ESRCH */)
}

/// Scans the processes under `proc_root` (`/proc`) for Claude Code running for the
/// session. `session` is asked only when a process is Claude Code.
pub fn scan(proc_root: &Path, session: impl FnOnce() -> Session) -> Option<Live> {
    use std::os::unix::fs::MetadataExt;
    let listed = std::fs::read_dir(proc_root).and_then(|entries| Ok((entries, std::fs::File::open(proc_root)?)));
    let (entries, root) = match listed {
        Ok(listed) => listed,
        Err(e) => return Some(Live::Unknown(format!("{}: {e}", proc_root.display()))),
    };
    let me = std::process::id();
    let mut session = Some(session);
    let mut known: Option<Session> = None;
    let mut comm_path = String::with_capacity(16);
    let mut name = [0u8; 64];
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        // Opened relative to the listed folder, into a buffer on the stack: this runs for
        // every process. A process gone since the listing, or hidden from this user, is
        // not looked at.
        comm_path.clear();
        let _ = write!(comm_path, "{pid}/comm");
        let read = rustix::fs::openat(
            &root,
            comm_path.as_str(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .and_then(|fd| rustix::io::read(&fd, &mut name));
        let Ok(len) = read else { continue };
        let comm = String::from_utf8_lossy(&name[..len]);
        let comm = comm.trim_end_matches('\n');
        if !worth_a_look(comm) {
            continue;
        }
        let dir = entry.path();
        let argv = match std::fs::read(dir.join("cmdline")) {
            Ok(bytes) => bytes
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect(),
            Err(e) if gone(&e) => continue,
            Err(_) => Vec::new(),
        };
        if !is_claude_code(comm, &argv) {
            continue;
        }
        let cwd = match std::fs::read_link(dir.join("cwd")) {
            Ok(cwd) => Ok(cwd),
            Err(e) if gone(&e) => continue,
            Err(e) => Err(e.to_string()),
        };
        let uid = std::fs::metadata(&dir).ok().map(|m| m.uid());
        let seen = Seen { pid, comm: comm.to_owned(), argv, cwd, uid };
        let session = known.get_or_insert_with(|| session.take().map(|f| f()).unwrap_or_default());
        if let Some(live) = judge(&seen, session) {
            return Some(live);
        }
    }
    None
}

/// Whether Claude Code is running for the session in `transcript`.
#[cfg(target_os = "linux")]
pub fn running_for(transcript: &Path) -> Option<Live> {
    scan(Path::new("/proc"), || session_of(transcript))
}

/// Without `/proc` (macOS): `ps` lists the processes and `lsof` says where each Claude
/// Code works; when either cannot answer, the file is left alone.
#[cfg(not(target_os = "linux"))]
pub fn running_for(transcript: &Path) -> Option<Live> {
    let run = |cmd: &str, args: &[&str]| -> Result<String, String> {
        let out = std::process::Command::new(cmd)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("{cmd}: {e}"))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let listed = match run("ps", &["-axww", "-o", "pid=,uid=,ucomm=,args="]) {
        Ok(listed) if !listed.trim().is_empty() => listed,
        Ok(_) => return Some(Live::Unknown("ps listed no process".to_owned())),
        Err(e) => return Some(Live::Unknown(e)),
    };
    let me = std::process::id();
    let mut session: Option<Session> = None;
    for line in listed.lines() {
        let mut fields = line.split_whitespace();
        let (Some(pid), Some(uid), Some(comm)) = (fields.next(), fields.next(), fields.next()) else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        let comm = base_name(comm);
        // `args` split at spaces: enough for names and ids, which hold none.
        let argv: Vec<String> = fields.map(str::to_owned).collect();
        if pid == me || !worth_a_look(comm) && !argv.first().is_some_and(|a| PROGRAM_NAMES.contains(&base_name(a))) {
            continue;
        }
        if !is_claude_code(comm, &argv) {
            continue;
        }
        let cwd = run("lsof", &["-a", "-p", &pid.to_string(), "-d", "cwd", "-Fn"]).and_then(|out| {
            out.lines()
                .find_map(|l| l.strip_prefix('n'))
                .map(PathBuf::from)
                .ok_or_else(|| "lsof did not name it".to_owned())
        });
        let seen = Seen { pid, comm: comm.to_owned(), argv, cwd, uid: uid.parse().ok() };
        if let Some(live) = judge(&seen, session.get_or_insert_with(|| session_of(transcript))) {
            return Some(live);
        }
    }
    None
}

/// [`running_for`] as a refusal: the reason, when the file must be left alone.
pub fn not_running_for(transcript: &Path) -> Result<(), String> {
    running_for(transcript).map_or(Ok(()), |live| Err(live.to_string()))
}

/// [`running_for`] off the async runtime (it reads `/proc`).
pub async fn check(transcript: PathBuf) -> Option<Live> {
    tokio::task::spawn_blocking(move || running_for(&transcript))
        .await
        .unwrap_or_else(|e| Some(Live::Unknown(format!("the check failed: {e}"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split(' ').map(str::to_owned).collect()
    }

    const ID: &str = "b7d55388-c9ad-4169-a8d1-459fc6bdb46f";

    fn session() -> Session {
        Session {
            ids: vec![ID.to_owned()],
            dirs: vec![PathBuf::from("/home/dev/proj")],
            folder: Some("-home-dev-proj".to_owned()),
            owner: Some((1000, 0o100600)),
        }
    }

    fn seen(comm: &str, argv: &str, cwd: &str) -> Seen {
        Seen { pid: 42, comm: comm.to_owned(), argv: args(argv), cwd: Ok(PathBuf::from(cwd)), uid: Some(1000) }
    }

    #[test]
    fn the_program_is_known_in_each_form_it_runs_in() {
        let npm = "/usr/lib/node_modules/@anthropic-ai/claude-code";
        // As /proc showed the real 2.1.332: through npm's link, its copy, the platform binary.
        assert!(is_claude_code("claude", &args("/x/node_modules/.bin/claude --session-id 1")));
        assert!(is_claude_code("claude.exe", &args(&format!("{npm}/bin/claude.exe"))));
        assert!(is_claude_code("claude", &args("claude")));
        // The native installer's version file, run by its path or renamed.
        assert!(is_claude_code("2.1.332", &args("/home/u/.local/share/claude/versions/2.1.332 -c")));
        // The JavaScript form and the npm wrapper that starts the binary.
        assert!(is_claude_code("node", &args(&format!("node {npm}/cli.js --resume {ID}"))));
        assert!(is_claude_code("node", &args(&format!("/usr/bin/node --max-old-space-size=8192 {npm}/cli.mjs"))));
        assert!(is_claude_code("node", &args(&format!("node {npm}/cli-wrapper.cjs"))));
        assert!(is_claude_code("node", &args("node /usr/local/bin/claude")));
        // Others are not, whatever their arguments say.
        assert!(!is_claude_code("node", &args("node /srv/app/cli.js")));
        assert!(!is_claude_code("node", &args("node")));
        assert!(!is_claude_code("vim", &args(&format!("vim /home/u/.claude/projects/p/{ID}.jsonl"))));
        assert!(!is_claude_code("strings", &args("strings /x/claude-code-linux-x64/claude")));
        assert!(!is_claude_code("1.2.3", &args("/opt/tool/1.2.3")));
        // Only names that may be the program are read further.
        assert!(worth_a_look("claude") && worth_a_look("node") && worth_a_look("2.1.332"));
        assert!(!worth_a_look("bash") && !worth_a_look("claude-helper") && !worth_a_look("kworker/0:1"));
    }

    #[test]
    fn arguments_name_the_session_only_exactly() {
        let ids = vec![ID.to_owned()];
        for named in [
            format!("claude --resume {ID}"),
            format!("claude -r {ID}"),
            format!("claude --session-id {ID}"),
            format!("claude --resume={ID}"),
            format!("claude --resume /home/u/.claude/projects/p/{ID}.jsonl"),
        ] {
            assert!(names_session(&args(&named), &ids), "{named}");
        }
        for other in [
            "claude --resume 11111111-c9ad-4169-a8d1-459fc6bdb46f".to_owned(),
            format!("claude --resume x{ID}"),
            format!("{ID} -c"),
            "claude -p hello".to_owned(),
        ] {
            assert!(!names_session(&args(&other), &ids), "{other}");
        }
        // An empty id names nothing.
        assert!(!names_session(&args("claude --resume "), &[String::new()]));
    }

    #[test]
    fn the_program_counts_in_the_project_or_naming_the_session() {
        let s = session();
        let running = |comm: &str, argv: &str, cwd: &str| judge(&seen(comm, argv, cwd), &s);
        assert_eq!(
            running("claude", "claude", "/home/dev/proj"),
            Some(Live::Running { pid: 42, why: Why::InProject(PathBuf::from("/home/dev/proj")) })
        );
        assert_eq!(
            running("claude", &format!("claude -r {ID}"), "/tmp"),
            Some(Live::Running { pid: 42, why: Why::NamesSession })
        );
        // Elsewhere and naming another session, or not the program: not this session's.
        assert_eq!(running("claude", "claude --resume 11111111-2222", "/home/dev/other"), None);
        assert_eq!(running("claude", "claude", "/home/dev/proj/sub"), None);
        assert_eq!(running("bash", "bash", "/home/dev/proj"), None);
        // The folder the program named after its directory, when no record names it.
        let by_folder = Session { dirs: Vec::new(), ..session() };
        assert!(judge(&seen("claude", "claude", "/home/dev/proj"), &by_folder).is_some());
        assert!(judge(&seen("claude", "claude", "/home/dev.proj"), &by_folder).is_some(), "the same folder name");
        assert!(judge(&seen("claude", "claude", "/home/dev/projx"), &by_folder).is_none());
        let message = running("claude", "claude", "/home/dev/proj").unwrap().to_string();
        assert!(message.starts_with("Claude Code (pid 42) is running for this session"), "{message}");
    }

    #[test]
    fn a_process_that_cannot_be_read_counts_when_it_could_write_the_file() {
        let s = session();
        let unreadable = |uid| Seen { cwd: Err("permission denied".to_owned()), uid, ..seen("claude", "claude", "") };
        for uid in [Some(1000), Some(0), None] {
            assert!(
                matches!(judge(&unreadable(uid), &s), Some(Live::Running { why: Why::Unreadable(_), .. })),
                "{uid:?}"
            );
        }
        // Another user's program cannot write a file only its owner may write.
        assert_eq!(judge(&unreadable(Some(1001)), &s), None);
        let shared = Session { owner: Some((1000, 0o100664)), ..session() };
        assert!(judge(&unreadable(Some(1001)), &shared).is_some());
    }

    #[test]
    fn project_folders_are_named_as_the_program_names_them() {
        assert_eq!(project_folder_name(Path::new("/home/dev/my_proj.v2")), "-home-dev-my-proj-v2");
        // Each UTF-16 unit becomes one dash: two for a character outside the BMP.
        assert_eq!(project_folder_name(Path::new("/é/😀")), "-----");
        let long = PathBuf::from(format!("/{}", "a".repeat(250)));
        let name = project_folder_name(&long);
        assert!(folder_is_for(&format!("{}-1x2y3z", &name[..200]), &long));
        assert!(!folder_is_for(&name[..200], &long));
        assert!(!folder_is_for(&format!("{}-1x2y3z", &name[..199]), &long));
    }

    #[test]
    fn a_transcript_gives_its_ids_and_directories_from_both_ends() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("-home-dev-proj");
        std::fs::create_dir(&folder).unwrap();
        let path = folder.join(format!("{ID}.jsonl"));
        let line = |cwd: &str, id: &str| format!("{{\"type\":\"user\",\"cwd\":\"{cwd}\",\"sessionId\":\"{id}\"}}\n");
        // The first line, 200 KiB of a tool result, then a last line in another directory.
        let middle = format!("{{\"type\":\"user\",\"text\":\"{}\"}}\n", "x".repeat(200 * 1024));
        let text = format!("{}{middle}{}", line("/home/dev/proj", ID), line("/home/dev/proj/sub", "other-id"));
        std::fs::write(&path, text).unwrap();
        let s = session_of(&path);
        assert_eq!(s.folder.as_deref(), Some("-home-dev-proj"));
        assert_eq!(s.ids, vec![ID.to_owned(), "other-id".to_owned()]);
        assert_eq!(s.dirs, vec![PathBuf::from("/home/dev/proj"), PathBuf::from("/home/dev/proj/sub")]);
        // A quoted "cwd" inside a text is escaped, so it is not a record's.
        let mut values = Vec::new();
        string_values(br#"{"text":"\"cwd\":\"/etc\"","cwd":"/a\u0062"}"#, "cwd", &mut values);
        assert_eq!(values, vec!["/ab".to_owned()]);
        // A window cut inside a value keeps what it can read.
        string_values(br#""cwd":"/cut-of"#, "cwd", &mut values);
        assert_eq!(values, vec!["/ab".to_owned()]);
    }

    /// A `/proc` laid out in a folder: `comm`, `cmdline` and a `cwd` link per process.
    fn fake_proc(processes: &[(u32, &str, &str, &Path)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        for (pid, comm, argv, cwd) in processes {
            let dir = root.path().join(pid.to_string());
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
            std::fs::write(dir.join("cmdline"), format!("{}\0", argv.replace(' ', "\0"))).unwrap();
            std::os::unix::fs::symlink(cwd, dir.join("cwd")).unwrap();
        }
        std::fs::create_dir(root.path().join("self")).unwrap();
        root
    }

    #[test]
    fn the_scan_reads_proc_and_asks_for_the_session_only_for_the_program() {
        let proj = PathBuf::from("/home/dev/proj");
        let elsewhere = PathBuf::from("/srv");
        let asked = std::cell::Cell::new(0);
        let session_once = || {
            asked.set(asked.get() + 1);
            session()
        };
        let quiet = fake_proc(&[(10, "bash", "bash", &proj), (11, "node", "node /srv/app.js", &proj)]);
        assert_eq!(scan(quiet.path(), session_once), None);
        assert_eq!(asked.get(), 0, "no Claude Code: the transcript is not read");

        let busy = fake_proc(&[
            (20, "claude", "claude -p hi", &elsewhere),
            (21, "claude", &format!("/x/claude --resume {ID}"), &elsewhere),
        ]);
        assert_eq!(scan(busy.path(), session_once), Some(Live::Running { pid: 21, why: Why::NamesSession }));
        assert_eq!(asked.get(), 1);
        // The process left between the listing and reading its directory: not counted.
        let left = fake_proc(&[(30, "claude", "claude", &proj)]);
        std::fs::remove_file(left.path().join("30/cwd")).unwrap();
        assert_eq!(scan(left.path(), session), None);
        // No process list at all: uncertain, so the file is left alone.
        assert!(matches!(scan(Path::new("/nonexistent-proc"), session), Some(Live::Unknown(_))));
    }

    /// A stand-in for the program: a shell under the name `claude`, waiting on its
    /// input, in `cwd`, with `extra` arguments after its script.
    pub(crate) fn fake_claude(dir: &Path, cwd: &Path, extra: &[&str]) -> std::process::Child {
        let program = dir.join("claude");
        if !program.exists() {
            std::os::unix::fs::symlink("/bin/sh", &program).unwrap();
        }
        std::process::Command::new(&program)
            .args(["-c", "read line", "claude"])
            .args(extra)
            .current_dir(cwd)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    #[test]
    fn a_running_program_is_found_in_proc() {
        let dir = tempfile::tempdir().unwrap();
        let proj = dir.path().join("proj");
        std::fs::create_dir(&proj).unwrap();
        let path = dir.path().join("t.jsonl");
        std::fs::write(&path, format!("{{\"type\":\"user\",\"cwd\":\"{}\"}}\n", proj.display())).unwrap();
        let mut child = fake_claude(dir.path(), &proj, &[]);
        // Until the child has changed into its directory, /proc may show the old one.
        let want = Some(Live::Running { pid: child.id(), why: Why::InProject(proj.clone()) });
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while running_for(&path) != want && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(running_for(&path), want);
        drop(child.stdin.take());
        child.wait().unwrap();
        assert_eq!(running_for(&path), None);
    }
}
