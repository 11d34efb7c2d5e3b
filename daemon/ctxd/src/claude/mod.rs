//! Compacting a Claude Code session in its own transcript (`ctxd claude compact`,
//! `ctx/claudeCompact`) and taking that back (`ctxd claude undo`, `ctx/claudeUndo`).
//!
//! The transcript is the user's, and the program writes to it whenever it likes (it
//! opens the file, appends one line and closes it, and takes no lock). So the planning
//! is `ctxd_core::claude`, and this module does the checks and the I/O, in three parts:
//!
//! - [`window`] reads the transcript with bounded memory: the newest 128 MiB as records,
//!   and of the older part only the prompts and the last boundary the summary needs.
//!   Every path a client names is opened as [`crate::outside`] opens files: a FIFO, a
//!   device or a directory is refused at once, and nothing waits.
//! - [`write`] changes the file only under a write lease ([`lease`]): while ctxd holds
//!   it no other process can open the file, and it can be taken only when no process
//!   has the file open. Under it the file is checked once more, and ctxd's lines are
//!   appended, or cut off again by an undo only when the bytes after the cut are exactly
//!   the install ctxd wrote.
//! - Files the session read are re-attached after the summary only from the session's
//!   project, Claude Code's folder and the user's `importFolders`, never from `/proc`,
//!   `/sys` or `/dev` ([`crate::outside::Restorable`]); others are named.
//!
//! Every step that could go wrong for the user's session refuses and writes nothing,
//! with the reason in the answer and in one log line: the file is not a Claude Code
//! transcript, has a damaged line, or ends in a line still being written; the session's
//! project directory is gone; the file or its folder is read-only (by its mode bits, so
//! also when ctxd runs as root); a process has the file open; the file changed between
//! reading it and writing; no lease can be taken on it (another system's fallback is in
//! [`write`]).

mod lease;
mod window;
mod write;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ctxd_core::budget::EnvConfig;
use ctxd_core::claude::{
    ClaudeCompaction, FileNow, Prepared, files_read, offline_summary, plan_compaction_with, plan_slug, plan_undo,
    prepare,
};
use ctxd_core::compact::{PlanFile, Trigger};
use ctxd_core::record::Record;

use crate::outside::{self, OutsideError, Restorable};
use crate::process_env::ProcessEnv;
use crate::session::compaction::{Job, Summarizer};
use window::{Older, Stamp};

/// A compaction installed in a Claude Code transcript.
#[derive(Debug, Clone, PartialEq)]
pub struct Compacted {
    pub transcript: PathBuf,
    pub plan: ClaudeCompaction,
    /// Length of the file before the install.
    pub offset: u64,
    /// Who wrote the summary.
    pub summarizer: Summarizer,
    /// Why the configured provider did not write it, when it did not, and what of a
    /// very long transcript the summary could not see.
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
fn plan_now(config: Option<&Path>, records: &[Record], allowed: &Restorable) -> Option<PlanFile> {
    let path = config?.join("plans").join(format!("{}.md", plan_slug(records)?));
    match outside::read_restorable(&path, allowed, outside::PLAN_FILE) {
        Ok(content) => Some(PlanFile { path: path.display().to_string(), content }),
        Err(OutsideError::Missing) => None,
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

/// A process (other than this one) with `path` open, as `(pid, command)`, as far as
/// `/proc` tells.
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

/// Opens a transcript a client named for reading, as every file ctxd did not write is
/// opened: a FIFO, device, socket or directory is refused at once, nothing waits.
fn open_transcript(path: &Path) -> Result<(std::fs::File, Stamp), String> {
    let (file, _) = outside::open_regular(path).map_err(|e| match e {
        OutsideError::Missing => "no such file".to_owned(),
        other => format!("it {other}"),
    })?;
    let stamp = Stamp::of(&file)?;
    Ok((file, stamp))
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

/// Linux: `/proc` answered in full ([`opened_by`]); the lease is the check that counts.
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
fn project_dir(records: &[Record]) -> Option<PathBuf> {
    records.iter().rev().find_map(|r| {
        if !r.line().contains("\"cwd\"") {
            return None;
        }
        r.to_value()["cwd"].as_str().map(PathBuf::from)
    })
}

/// Largest file re-attached after a compaction; a larger one is named instead.
const RESTORED_FILE: outside::Cap = outside::Cap { bytes: 256 * 1024, what: "a file to re-attach" };

/// A file the session read, as it is on disk now: its text when it may be re-attached,
/// else only its name.
fn file_now(path: &str, allowed: &Restorable) -> FileNow {
    let (exists, content) = match outside::read_restorable(Path::new(path), allowed, RESTORED_FILE) {
        Ok(content) => (true, Some(content)),
        Err(OutsideError::Missing | OutsideError::NotRegular(_)) => (false, None),
        Err(why) => {
            tracing::debug!(path, "claude compact: named, not re-attached: {why}");
            (true, None)
        }
    };
    FileNow { path: path.to_owned(), exists, content }
}

fn refused(path: &Path, what: &str, why: String) -> String {
    tracing::warn!(transcript = %path.display(), "claude {what} refused: {why}; the transcript is left as it was");
    format!("{}: {why}; nothing was written", path.display())
}

/// Who writes the summary of an in-place compaction. Both carry the settings that
/// apply to the session's project directory: they also say which folders files may be
/// re-attached from (`importFolders`).
#[derive(Clone)]
pub enum SummarySource {
    /// ctxd's own summarizer, no network (`ctxd claude compact --offline`).
    Offline(SettingsFor),
    /// The provider chosen by the settings that apply to the session's project
    /// directory, which this function gives (`None`: the records name no directory);
    /// the offline summarizer when they choose none.
    Configured(SettingsFor),
}

/// The settings that apply to a session working in a directory.
pub type SettingsFor = Arc<dyn Fn(Option<&Path>) -> ctxd_proto::Settings + Send + Sync>;

impl SummarySource {
    fn settings_for(&self) -> &SettingsFor {
        match self {
            SummarySource::Offline(settings_for) | SummarySource::Configured(settings_for) => settings_for,
        }
    }
}

impl std::fmt::Debug for SummarySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SummarySource::Offline(_) => "Offline",
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
    /// What of a very long transcript the summary cannot see, for the answer.
    unseen: Option<String>,
}

/// The checks and the planning before the summary: refuses what cannot be compacted.
fn read_and_prepare(path: &Path, budget: &EnvConfig) -> Result<Read, String> {
    let (file, before) = open_transcript(path)?;
    writable(path)?;
    not_open(path)?;
    let read = window::read(&file, before.len, Older::Read)?;
    if Stamp::of(&file)? != before {
        return Err("it changed while being read".to_owned());
    }
    drop(file);
    let unseen = (read.window_from > 0).then(|| {
        tracing::info!(
            transcript = %path.display(),
            window_from = read.window_from,
            prompts_left_out = read.prompts_left_out,
            long_lines_skipped = read.lines_skipped,
            "claude compact: a long transcript; its older part gives the summary its prompts and last boundary only"
        );
        let mut unseen = format!(
            "the transcript is {} MB: the summary is written from its newest {} MiB and the prompts before them",
            before.len / 1_000_000,
            window::WINDOW_BYTES >> 20
        );
        if read.prompts_left_out > 0 {
            unseen.push_str(&format!(" ({} of the oldest prompts left out)", read.prompts_left_out));
        }
        unseen
    });
    let records = read.records();
    let project = project_dir(&records);
    if let Some(dir) = &project
        && !dir.is_dir()
    {
        return Err(format!("its project directory {} no longer exists", dir.display()));
    }
    let prepared = prepare(&records, budget).map_err(|e| e.to_string())?;
    Ok(Read { before, records, prepared, project, unseen })
}

/// Compacts the Claude Code session in `path`: appends a boundary and the summary.
///
/// Read → prepare → summary (a provider's may take minutes) → under the lease: re-check
/// → append: a session the program wrote to meanwhile is left as it is. A provider that
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
    let mut read = tokio::task::spawn_blocking(move || read_and_prepare(&target, &budget))
        .await
        .map_err(|e| format!("claude compact task failed: {e}"))?
        .map_err(|why| refused(&path, "compact", why))?;
    let settings = source.settings_for()(read.project.as_deref());
    let imports = settings.import_folders.clone().unwrap_or_default();
    let mut problems: Vec<String> = read.unseen.take().into_iter().collect();
    let asked = match &source {
        SummarySource::Offline(_) => Ok(None),
        SummarySource::Configured(_) => {
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
    tokio::task::spawn_blocking(move || {
        let config = env.claude_config_dir();
        let home = env.home();
        let allowed = Restorable::new(read.project.as_deref(), config.as_deref(), home.as_deref(), &imports);
        let found = Found { config: config.as_deref(), allowed: &allowed };
        install(&target, found, read, written, instructions.as_deref(), problems)
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

/// Where the files re-attached after the summary are looked up.
#[derive(Clone, Copy)]
struct Found<'a> {
    /// Claude Code's directory (the session's plan).
    config: Option<&'a Path>,
    /// The folders files may be re-attached from.
    allowed: &'a Restorable,
}

/// Plans the records with the summary written (the offline one when `written` is
/// `None`), and appends them, under the lease, if nothing moved since
/// [`read_and_prepare`].
fn install(
    path: &Path,
    found: Found<'_>,
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
    let files: Vec<FileNow> = files_read(&records).into_iter().map(|p| file_now(&p, found.allowed)).collect();
    let timestamp = crate::session::actor::now_rfc3339();
    let plan_file = plan_now(found.config, &records, found.allowed);
    let plan = plan_compaction_with(&records, &prepared, &body, &files, plan_file, &timestamp, &mut || {
        uuid::Uuid::new_v4().to_string()
    })
    .map_err(|e| refuse(e.to_string()))?;
    let mut text = plan.lines.join("\n");
    text.push('\n');
    write::append(path, before, text.as_bytes()).map_err(refuse)?;
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

/// Takes back ctxd's compaction of the session in `path`: cuts the file back to the
/// length it had before, under the lease, only when everything after that length is
/// exactly the install ctxd wrote (its lines, each with its line break).
pub fn undo(path: &Path) -> Result<Undone, String> {
    let refuse = |why: String| refused(path, "undo", why);
    let (file, before) = open_transcript(path).map_err(refuse)?;
    writable(path).map_err(refuse)?;
    let read = window::read(&file, before.len, Older::Skip).map_err(refuse)?;
    drop(file);
    let offset = plan_undo(&read.window).map_err(|e| refuse(e.to_string()))?;
    let mut ours: Vec<u8> = Vec::new();
    for (_, record) in read.window.iter().filter(|(at, _)| *at >= offset) {
        ours.extend_from_slice(record.line().as_bytes());
        ours.push(b'\n');
    }
    write::cut_back(path, before, offset, &ours).map_err(refuse)?;
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
}
