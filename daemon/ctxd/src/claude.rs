//! Compacting a Claude Code session in its own transcript (`ctxd claude compact`,
//! `ctx/claudeCompact`) and taking that back (`ctxd claude undo`, `ctx/claudeUndo`).
//!
//! The planning is `ctxd_core::claude`; this file does the checks and the I/O. Every
//! step that could go wrong for the user's session refuses and writes nothing, with the
//! reason in the answer and in one log line:
//!
//! - the file is not a Claude Code transcript, has a damaged line, or ends in a line
//!   still being written;
//! - the session's project directory is gone;
//! - the file or its folder is read-only (by its mode bits, so also when ctxd runs as
//!   root, which the system would let write anyway);
//! - a running process has the file open (`/proc/*/fd`; `lsof` where there is no
//!   `/proc`, and nothing is written when it cannot answer): the program is writing to it;
//! - the file changed between reading it and writing (its length or modification time
//!   moved, or a process opened it meanwhile);
//! - the program appended a line in the moment between those checks and ctxd's write
//!   (read back after the write): ctxd's lines are cut off again when they are still the
//!   file's end, so no line of the program's stands before the boundary unsummarized.
//!
//! Records are appended in one write and synced; no existing line is rewritten or
//! removed. Undo cuts the file back to the length it had before ctxd's install, only
//! when the last lines are exactly that install (the boundary's `ctxdBatch` counts
//! them) and nothing came after it.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use ctxd_core::budget::EnvConfig;
use ctxd_core::claude::{
    ClaudeCompaction, FileNow, Prepared, files_read, offline_summary, plan_compaction_with, plan_slug, plan_undo,
    prepare,
};
use ctxd_core::compact::{PlanFile, Trigger};
use ctxd_core::record::Record;

use crate::process_env::ProcessEnv;
use crate::session::compaction::{Job, Summarizer};

/// A compaction installed in a Claude Code transcript.
#[derive(Debug, Clone, PartialEq)]
pub struct Compacted {
    pub transcript: PathBuf,
    pub plan: ClaudeCompaction,
    /// Length of the file before the install.
    pub offset: u64,
    /// Who wrote the summary.
    pub summarizer: Summarizer,
    /// Why the configured provider did not write it, when it did not.
    pub problems: Vec<String>,
}

/// A compaction taken back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undone {
    pub transcript: PathBuf,
    pub offset: u64,
    pub removed_bytes: u64,
}

/// The session's plan as it is on disk now (`<config>/plans/<slug>.md`, `config` being
/// Claude Code's directory), when it has one. A plan that cannot be read is left out,
/// with the reason in the log.
fn plan_now(config: Option<&Path>, records: &[Record]) -> Option<PlanFile> {
    let path = config?.join("plans").join(format!("{}.md", plan_slug(records)?));
    match crate::outside::read_text(&path, crate::outside::PLAN_FILE) {
        Ok(content) => Some(PlanFile { path: path.display().to_string(), content }),
        Err(crate::outside::OutsideError::Missing) => None,
        Err(e) => {
            tracing::warn!(plan = %path.display(), "claude compact: the plan is not re-attached: {e}");
            None
        }
    }
}

/// The transcript a command names: a path to a file, or a session id found as
/// `<projects>/<any project>/<id>.jsonl`.
pub fn resolve(projects: Option<&Path>, transcript: Option<&str>, session_id: Option<&str>) -> Result<PathBuf, String> {
    if let Some(path) = transcript {
        return Ok(PathBuf::from(path));
    }
    let id = session_id.ok_or("name a transcript or a session id")?;
    if id.is_empty() || id.contains(['/', '\\']) || id.starts_with('.') {
        return Err(format!("{id:?} is not a session id"));
    }
    let projects = projects.ok_or("no home directory to find ~/.claude in")?;
    let name = format!("{id}.jsonl");
    let entries = std::fs::read_dir(projects).map_err(|e| format!("{}: {e}", projects.display()))?;
    for entry in entries.flatten() {
        let candidate = entry.path().join(&name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(format!("no transcript {name} under {}", projects.display()))
}

/// A process (other than this one) with `path` open, as `(pid, command)`.
pub fn opened_by(path: &Path) -> Option<(u32, String)> {
    let target = std::fs::canonicalize(path).ok()?;
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        if fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == target)) {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            return Some((pid, comm.trim().to_owned()));
        }
    }
    None
}

/// What identifies the file's content for "has it changed": length and modification
/// time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
}

fn stamp(path: &Path) -> Result<Stamp, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Stamp { len: meta.len(), modified: meta.modified().ok() })
}

/// The file's lines as records, with their offsets; refused when one is damaged or the
/// last has no line break (the program may be writing it).
fn read_records(path: &Path) -> Result<(Stamp, Vec<(u64, Record)>), String> {
    let before = stamp(path)?;
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.last().is_some_and(|b| *b != b'\n') {
        return Err("its last line is incomplete (the program may be writing it)".to_owned());
    }
    let mut loaded = crate::store::transcript::Loaded::default();
    crate::store::transcript::parse_lines(&bytes, 0, &mut loaded);
    if let Some(damaged) = loaded.damaged.first() {
        return Err(format!("it has a line that is not a record ({damaged})"));
    }
    if bytes.len() as u64 != before.len {
        return Err("it changed while being read".to_owned());
    }
    Ok((before, loaded.records))
}

/// Refuses a transcript its owner made read-only, or whose folder is.
fn writable(path: &Path) -> Result<(), String> {
    let read_only = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.permissions().readonly());
    if read_only(path) {
        return Err("it is read-only".to_owned());
    }
    match path.parent() {
        Some(folder) if read_only(folder) => Err(format!("its folder {} is read-only", folder.display())),
        _ => Ok(()),
    }
}

fn not_open(path: &Path) -> Result<(), String> {
    crate::live::not_running_for(path)?;
    match opened_by(path) {
        Some((pid, comm)) => Err(format!("process {pid} ({comm}) has it open")),
        None => not_open_elsewhere(path),
    }
}

/// Linux: `/proc` answered in full ([`opened_by`]).
#[cfg(target_os = "linux")]
fn not_open_elsewhere(_path: &Path) -> Result<(), String> {
    Ok(())
}

/// Without `/proc` (macOS): `lsof` says who has the file open. When it cannot answer,
/// whether the program is writing is uncertain, and nothing is written.
#[cfg(not(target_os = "linux"))]
fn not_open_elsewhere(path: &Path) -> Result<(), String> {
    let out = std::process::Command::new("lsof")
        .arg("-t")
        .arg("--")
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot tell whether a process has it open (lsof: {e})"))?;
    let me = std::process::id();
    let other = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .find(|&pid| pid != me);
    match other {
        Some(pid) => Err(format!("process {pid} has it open")),
        // lsof exits 1 when no process has the file open.
        None if out.status.success() || out.status.code() == Some(1) => Ok(()),
        None => Err(format!("cannot tell whether a process has it open (lsof exited with {})", out.status)),
    }
}

/// The working directory the session ran in, when its records name one.
fn project_dir(records: &[(u64, Record)]) -> Option<PathBuf> {
    records.iter().rev().find_map(|(_, r)| {
        if !r.line().contains("\"cwd\"") {
            return None;
        }
        r.to_value()["cwd"].as_str().map(PathBuf::from)
    })
}

/// Largest file re-attached after a compaction; a larger one is named instead.
const MAX_RESTORED_FILE_BYTES: u64 = 256 * 1024;

/// A file the session read, as it is on disk now.
fn file_now(path: &str) -> FileNow {
    let meta = std::fs::metadata(path);
    let exists = meta.as_ref().is_ok_and(|m| m.is_file());
    let content = meta
        .ok()
        .filter(|m| m.is_file() && m.len() <= MAX_RESTORED_FILE_BYTES)
        .and_then(|_| crate::outside::read_text(Path::new(path), crate::outside::READ_FILE).ok());
    FileNow { path: path.to_owned(), exists, content }
}

fn refused(path: &Path, what: &str, why: String) -> String {
    tracing::warn!(transcript = %path.display(), "claude {what} refused: {why}; the transcript is left as it was");
    format!("{}: {why}; nothing was written", path.display())
}

/// Who writes the summary of an in-place compaction.
#[derive(Clone)]
pub enum SummarySource {
    /// ctxd's own summarizer, no network (`ctxd claude compact --offline`).
    Offline,
    /// The provider chosen by the settings that apply to the session's project
    /// directory, which this function gives (`None`: the records name no directory);
    /// the offline summarizer when they choose none.
    Configured(SettingsFor),
}

/// The settings that apply to a session working in a directory.
pub type SettingsFor = Arc<dyn Fn(Option<&Path>) -> ctxd_proto::Settings + Send + Sync>;

impl std::fmt::Debug for SummarySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SummarySource::Offline => "Offline",
            SummarySource::Configured(_) => "Configured",
        })
    }
}

/// The transcript as read before the summary is written: what the install is checked
/// against afterwards.
struct Read {
    before: Stamp,
    records: Vec<Record>,
    prepared: Prepared,
    project: Option<PathBuf>,
}

/// The checks and the planning before the summary: refuses what cannot be compacted.
fn read_and_prepare(path: &Path, budget: &EnvConfig) -> Result<Read, String> {
    writable(path)?;
    not_open(path)?;
    let (before, records) = read_records(path)?;
    let project = project_dir(&records);
    if let Some(dir) = &project
        && !dir.is_dir()
    {
        return Err(format!("its project directory {} no longer exists", dir.display()));
    }
    let records: Vec<Record> = records.into_iter().map(|(_, r)| r).collect();
    let prepared = prepare(&records, budget).map_err(|e| e.to_string())?;
    Ok(Read { before, records, prepared, project })
}

/// Compacts the Claude Code session in `path`: appends a boundary and the summary.
///
/// Read → prepare → summary (a provider's may take minutes) → re-check → append: the
/// file's stamp and the `/proc` open check are taken again after the summary, so a
/// session the program wrote to, or opened, meanwhile is left as it is. A provider that
/// fails in any way gives way to the offline summarizer, said in the log and in
/// [`Compacted::problems`].
///
/// `env` is the environment `main` read: Claude Code's directory (for the session's
/// plan) and the provider's key.
pub async fn compact(
    env: Arc<ProcessEnv>,
    path: PathBuf,
    instructions: Option<String>,
    source: SummarySource,
) -> Result<Compacted, String> {
    let target = path.clone();
    let budget = *env.budget();
    let read = tokio::task::spawn_blocking(move || read_and_prepare(&target, &budget))
        .await
        .map_err(|e| format!("claude compact task failed: {e}"))?
        .map_err(|why| refused(&path, "compact", why))?;
    let mut problems = Vec::new();
    let asked = match &source {
        SummarySource::Offline => Ok(None),
        SummarySource::Configured(settings_for) => {
            let settings = settings_for(read.project.as_deref());
            ask_provider(&read, settings, env.clone(), instructions.as_deref(), &mut problems).await
        }
    };
    let written = match asked {
        Ok(written) => written,
        Err(why) => {
            tracing::warn!(transcript = %path.display(), "claude compact: {why}; the offline summarizer writes the summary");
            problems.push(format!("{why}; the offline summarizer wrote the summary"));
            None
        }
    };
    let target = path.clone();
    let config = env.claude_config_dir();
    tokio::task::spawn_blocking(move || {
        install(&target, config.as_deref(), read, written, instructions.as_deref(), problems)
    })
    .await
    .map_err(|e| format!("claude compact task failed: {e}"))?
}

/// The configured provider's summary body of what `read` summarizes; `Ok(None)` when
/// the settings choose no provider.
///
/// The cache-sharing fork needs the host's exact last request (its system prompt and
/// tools, byte for byte), which Claude Code builds itself and never writes to the
/// transcript: the summary is asked with the plain summary request over the summarized
/// records, with its retries, re-ask and prompt-too-long cuts.
async fn ask_provider(
    read: &Read,
    settings: ctxd_proto::Settings,
    env: Arc<ProcessEnv>,
    instructions: Option<&str>,
    problems: &mut Vec<String>,
) -> Result<Option<(String, Summarizer)>, String> {
    let summarized = read.prepared.summarized(&read.records);
    let from = newest_within(summarized, MAX_SUMMARY_SOURCE_BYTES);
    if from > 0 {
        tracing::info!(
            dropped = from,
            of = summarized.len(),
            "claude compact: the oldest records are left out of the summary request (its user messages are added back by the fidelity check)"
        );
    }
    let summarized = &summarized[from..];
    let model = ctxd_core::claude::session_model(summarized).unwrap_or_default().to_owned();
    let parent = ctxd_core::view::plain_request(summarized, &model);
    let job = Job {
        session_id: read.records.get(read.prepared.last_message).and_then(session_id_of).unwrap_or_default(),
        trigger: Trigger::Manual,
        focus: instructions.map(str::to_owned),
        records: Vec::new(),
        ledger: Vec::new(),
        pre_tokens: 0,
        threshold: 0,
        fixed_prefix: 0,
        settings,
        transcript_path: String::new(),
        cwd: read.project.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        model,
        parent: Some(parent),
        host_parent: false,
        skills: Vec::new(),
        plan_path: None,
        progress: None,
        partial: None,
        env,
    };
    let kept = read.prepared.keeps_messages(&read.records);
    crate::session::compaction::provider_summary(&job, instructions, kept, problems).await
}

/// Transcript bytes a summary request is built from, at most. A long session's
/// transcript runs to hundreds of megabytes, far past any model's window (a million
/// tokens is a few megabytes of text) and past the largest request the Messages API
/// takes (32 MB, refused with a 413 that no retry helps); the prompt-too-long cut then
/// takes it the rest of the way.
const MAX_SUMMARY_SOURCE_BYTES: usize = 16 << 20;

/// Where the newest records of `records` that fit in `budget` bytes of transcript start.
fn newest_within(records: &[Record], budget: usize) -> usize {
    let mut total = 0usize;
    for (i, record) in records.iter().enumerate().rev() {
        total += record.line().len() + 1;
        if total > budget {
            return i + 1;
        }
    }
    0
}

fn session_id_of(record: &Record) -> Option<String> {
    record.to_value()["sessionId"].as_str().map(str::to_owned)
}

/// Plans the records with the summary written (the offline one when `written` is
/// `None`), checks that nothing moved since [`read_and_prepare`], and appends them.
fn install(
    path: &Path,
    config: Option<&Path>,
    read: Read,
    written: Option<(String, Summarizer)>,
    instructions: Option<&str>,
    problems: Vec<String>,
) -> Result<Compacted, String> {
    let refuse = |why: String| refused(path, "compact", why);
    let Read { before, records, prepared, .. } = read;
    let (body, summarizer) = match written {
        Some(written) => written,
        None => (
            offline_summary(&records, &prepared, instructions).map_err(|e| refuse(e.to_string()))?,
            Summarizer { name: "offline", path: None },
        ),
    };
    let files: Vec<FileNow> = files_read(&records).into_iter().map(|p| file_now(&p)).collect();
    let timestamp = crate::session::actor::now_rfc3339();
    let plan =
        plan_compaction_with(&records, &prepared, &body, &files, plan_now(config, &records), &timestamp, &mut || {
            uuid::Uuid::new_v4().to_string()
        })
        .map_err(|e| refuse(e.to_string()))?;
    // Nothing may have moved since the file was read: the summary may have taken minutes.
    if stamp(path).map_err(refuse)? != before {
        return Err(refuse("it changed while the summary was being written".to_owned()));
    }
    not_open(path).map_err(refuse)?;
    let mut text = plan.lines.join("\n");
    text.push('\n');
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
        .map_err(|e| refuse(format!("cannot open it for appending: {e}")))?;
    let written = file.write_all(text.as_bytes()).and_then(|()| file.sync_data());
    if let Err(e) = written {
        // A short write is cut off, if nothing came after it: the file is as it was.
        let back = take_back(&file, before.len, text.as_bytes());
        return Err(refuse(format!("the write failed: {e}; {back}")));
    }
    // The checks above leave a moment before the write: a line the program appended in
    // it would stand before the boundary, in no summary. Then ctxd's lines are taken
    // back (when they are still the file's end) and the compaction is refused.
    match landed_at(&file, before.len, text.as_bytes()) {
        Ok(true) => {}
        Ok(false) => {
            let back = take_back(&file, before.len, text.as_bytes());
            return Err(refuse(format!("the program wrote to it at the moment of the install; {back}")));
        }
        Err(e) => tracing::warn!(transcript = %path.display(), "claude compact: cannot read back the install: {e}"),
    }
    tracing::info!(
        transcript = %path.display(),
        offset = before.len,
        lines = plan.lines.len(),
        pre_tokens = plan.pre_tokens,
        post_tokens = plan.post_tokens,
        kept = plan.kept,
        summarizer = summarizer.name,
        "claude compact: installed"
    );
    Ok(Compacted { transcript: path.to_owned(), plan, offset: before.len, summarizer, problems })
}

/// Whether the file holds `ours` at `offset`: nothing was appended between the checks
/// and ctxd's write.
fn landed_at(file: &std::fs::File, offset: u64, ours: &[u8]) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
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
fn take_back(file: &std::fs::File, offset: u64, ours: &[u8]) -> String {
    use std::os::unix::fs::FileExt;
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
    "a line came after ctxd's lines, so they were left in place".to_owned()
}

/// Takes back ctxd's compaction of the session in `path`.
pub fn undo(path: &Path) -> Result<Undone, String> {
    let refuse = |why: String| refused(path, "undo", why);
    writable(path).map_err(refuse)?;
    not_open(path).map_err(refuse)?;
    let (before, records) = read_records(path).map_err(refuse)?;
    let offset = plan_undo(&records).map_err(|e| refuse(e.to_string()))?;
    if stamp(path).map_err(refuse)? != before {
        return Err(refuse("it changed since it was read".to_owned()));
    }
    not_open(path).map_err(refuse)?;
    let file = OpenOptions::new().write(true).open(path).map_err(|e| refuse(format!("cannot open it: {e}")))?;
    file.set_len(offset).and_then(|()| file.sync_data()).map_err(|e| refuse(format!("cannot cut it back: {e}")))?;
    tracing::info!(transcript = %path.display(), offset, removed = before.len - offset, "claude undo: done");
    Ok(Undone { transcript: path.to_owned(), offset, removed_bytes: before.len - offset })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_request_is_built_from_the_newest_records_within_the_budget() {
        let records: Vec<Record> =
            (0..10).map(|i| Record::parse(&format!(r#"{{"type":"user","uuid":"u{i}"}}"#)).unwrap()).collect();
        let line = records[0].line().len() + 1;
        assert_eq!(newest_within(&records, usize::MAX), 0);
        assert_eq!(newest_within(&records, 10 * line), 0);
        assert_eq!(newest_within(&records, 3 * line), 7);
        assert_eq!(newest_within(&records, 3 * line + 1), 7);
        assert_eq!(newest_within(&records, 0), 10);
    }

    /// The file as a race would leave it, opened as the install opens it.
    fn raced(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf, std::fs::File) {
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
}
