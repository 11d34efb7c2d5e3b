//! Git facts for the system context, captured once when a session starts.
//!
//! The model works better when it knows which branch it is on, what is uncommitted and
//! what happened recently. Asking git on every turn would cost time and would change
//! the system prompt (and so break the prompt cache), so the facts are taken once and
//! rendered as a snapshot that says it does not update.
//!
//! Git is run as a read-only guest: every command has a timeout after which it is
//! killed, never prompts, and never takes the optional index lock (`git status` would
//! otherwise refresh the index and could collide with the user's own git commands).
//! A directory outside any repository, or a machine without git, simply has no facts.
//!
//! These functions block; callers run them on a blocking thread.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long one git command may run before it is killed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

/// `git status --short` output is cut past this many characters.
pub const STATUS_MAX_CHARS: usize = 2_000;

/// How many recent commits are listed.
pub const RECENT_COMMITS: usize = 5;

/// What [`capture`] found out about the repository around a working directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitFacts {
    /// The checked-out branch; for a detached HEAD, `detached at <short hash>`. `None`
    /// when even that could not be read.
    pub branch: Option<String>,
    /// The branch work is usually merged into: what `origin/HEAD` points at, else
    /// `main`, else `master` when such a branch exists.
    pub main_branch: Option<String>,
    /// `git status --short`, cut past [`STATUS_MAX_CHARS`] with a note saying so. Empty
    /// when the tree is clean; `None` when git status failed or timed out.
    pub status: Option<String>,
    /// `git log --oneline` of the last few commits, newest first; empty before the
    /// first commit.
    pub recent_commits: Vec<String>,
    /// `git config user.name`, when set.
    pub user_name: Option<String>,
}

/// How to run git. [`GitOptions::default`] is what [`capture`] uses; tests point
/// `program` elsewhere to play a machine without git.
#[derive(Debug, Clone)]
pub struct GitOptions {
    /// The git executable: a name looked up in `PATH`, or a path.
    pub program: OsString,
    /// Per-command limit; a command still running then is killed.
    pub timeout: Duration,
    /// Where `git status --short` is cut.
    pub status_max_chars: usize,
}

impl Default for GitOptions {
    fn default() -> Self {
        Self { program: OsString::from("git"), timeout: DEFAULT_TIMEOUT, status_max_chars: STATUS_MAX_CHARS }
    }
}

impl GitOptions {
    /// The defaults with another git program, named or by path.
    pub fn with_program(program: impl AsRef<OsStr>) -> Self {
        Self { program: program.as_ref().to_owned(), ..Self::default() }
    }
}

/// Git facts for `cwd`, or `None` when it is not inside a work tree or git cannot be
/// run. Blocks for as long as the slowest git command (bounded by the timeout).
pub fn capture(cwd: &Path) -> Option<GitFacts> {
    capture_with(cwd, &GitOptions::default())
}

/// [`capture`] with a chosen git program, timeout and status size.
pub fn capture_with(cwd: &Path, options: &GitOptions) -> Option<GitFacts> {
    let git = Git { cwd, options };
    match git.run(&["rev-parse", "--is-inside-work-tree"]) {
        Ok(out) if out.success && out.text().trim() == "true" => {}
        Ok(_) => {
            tracing::debug!(cwd = %cwd.display(), "not inside a git work tree; no git facts");
            return None;
        }
        // Spawning in a missing directory fails the same way as a missing program.
        Err(RunError::NotFound) if !cwd.is_dir() => {
            tracing::debug!(cwd = %cwd.display(), "working directory does not exist; no git facts");
            return None;
        }
        Err(RunError::NotFound) => {
            tracing::debug!(program = ?options.program, "git not found; no git facts");
            return None;
        }
        Err(err) => {
            tracing::warn!(cwd = %cwd.display(), "cannot run git: {err}; no git facts");
            return None;
        }
    }

    // The remaining questions are independent and read-only; asking them at once keeps
    // a slow `git status` from adding to the others.
    std::thread::scope(|scope| {
        let branch = scope.spawn(|| git.branch());
        let main_branch = scope.spawn(|| git.main_branch());
        let status = scope.spawn(|| git.status());
        let commits = scope.spawn(|| git.recent_commits());
        let user_name = git.line(&["config", "user.name"]);
        Some(GitFacts {
            branch: branch.join().ok().flatten(),
            main_branch: main_branch.join().ok().flatten(),
            status: status.join().ok().flatten(),
            recent_commits: commits.join().unwrap_or_default(),
            user_name,
        })
    })
}

/// The system-context text for `facts`.
pub fn render(facts: &GitFacts) -> String {
    let mut out = String::from(
        "Git repository state as of the start of this session. This is a snapshot: it is \
         not refreshed as the conversation goes on, so run git yourself for the current state.\n",
    );
    let unknown = "(unknown)";
    out.push_str(&format!("\nCurrent branch: {}\n", facts.branch.as_deref().unwrap_or(unknown)));
    out.push_str(&format!(
        "Main branch (the usual target for pull requests): {}\n",
        facts.main_branch.as_deref().unwrap_or(unknown)
    ));
    if let Some(user) = &facts.user_name {
        out.push_str(&format!("Git user: {user}\n"));
    }
    out.push_str("\nStatus:\n");
    match facts.status.as_deref() {
        None => out.push_str("(git status could not be read)\n"),
        Some("") => out.push_str("(clean)\n"),
        Some(status) => {
            out.push_str(status);
            if !status.ends_with('\n') {
                out.push('\n');
            }
        }
    }
    out.push_str("\nRecent commits:\n");
    if facts.recent_commits.is_empty() {
        out.push_str("(none yet)\n");
    }
    for commit in &facts.recent_commits {
        out.push_str(commit);
        out.push('\n');
    }
    out
}

struct Git<'a> {
    cwd: &'a Path,
    options: &'a GitOptions,
}

impl Git<'_> {
    fn branch(&self) -> Option<String> {
        // `symbolic-ref` also names a branch with no commits yet, unlike `rev-parse`.
        if let Some(name) = self.line(&["symbolic-ref", "--quiet", "--short", "HEAD"]) {
            return Some(name);
        }
        self.line(&["rev-parse", "--short", "HEAD"]).map(|hash| format!("detached at {hash}"))
    }

    fn main_branch(&self) -> Option<String> {
        if let Some(remote_head) = self.line(&["symbolic-ref", "--quiet", "refs/remotes/origin/HEAD"]) {
            let name = remote_head.strip_prefix("refs/remotes/origin/").unwrap_or(&remote_head);
            return Some(name.to_owned());
        }
        ["main", "master"].into_iter().find_map(|name| {
            let exists = self
                .run(&["show-ref", "--verify", "--quiet", &format!("refs/heads/{name}")])
                .is_ok_and(|out| out.success);
            exists.then(|| name.to_owned())
        })
    }

    fn status(&self) -> Option<String> {
        match self.run(&["status", "--short"]) {
            Ok(out) if out.success => Some(cut_status(&out.text(), self.options.status_max_chars)),
            Ok(out) => {
                tracing::debug!(stderr = %out.stderr_text(), "git status failed");
                None
            }
            Err(err) => {
                tracing::warn!(cwd = %self.cwd.display(), "git status: {err}");
                None
            }
        }
    }

    fn recent_commits(&self) -> Vec<String> {
        let count = RECENT_COMMITS.to_string();
        match self.run(&["log", "--oneline", "--no-decorate", "--no-show-signature", "-n", &count]) {
            // Fails on a branch with no commits yet; that is simply no history.
            Ok(out) if out.success => out.text().lines().map(str::to_owned).collect(),
            Ok(_) => Vec::new(),
            Err(err) => {
                tracing::warn!(cwd = %self.cwd.display(), "git log: {err}");
                Vec::new()
            }
        }
    }

    /// The first line of a successful command's output, when it is not empty.
    fn line(&self, args: &[&str]) -> Option<String> {
        let out = self.run(args).ok().filter(|out| out.success)?;
        let text = out.text();
        let line = text.lines().next()?.trim();
        (!line.is_empty()).then(|| line.to_owned())
    }

    fn run(&self, args: &[&str]) -> Result<Output, RunError> {
        let mut command = Command::new(&self.options.program);
        // Colour settings such as `color.ui=always` would put escape codes in the text.
        command
            .args(["-c", "color.ui=false"])
            .args(args)
            .current_dir(self.cwd)
            .env("GIT_OPTIONAL_LOCKS", "0")
            .env("GIT_TERMINAL_PROMPT", "0")
            // Inherited from a git hook or a wrapper, these would point git at another
            // repository than the session's.
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env_remove("GIT_INDEX_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        run_with_timeout(command, self.options.timeout)
    }
}

/// Cuts `status` at a line boundary within `max_chars` characters and says what was left
/// out.
fn cut_status(status: &str, max_chars: usize) -> String {
    let status = status.trim_end_matches('\n');
    let Some((byte_limit, _)) = status.char_indices().nth(max_chars) else {
        return status.to_owned();
    };
    // Whole lines only: a half path would be misleading.
    let kept_len = status[..byte_limit].rfind('\n').unwrap_or(0);
    let kept = &status[..kept_len];
    let rest = status[kept_len..].trim_start_matches('\n');
    let more_lines = rest.lines().count();
    let more_chars = rest.chars().count();
    let mut out = kept.to_owned();
    if !out.is_empty() {
        out.push('\n');
    }
    let lines = if more_lines == 1 { "line" } else { "lines" };
    out.push_str(&format!(
        "... ({more_lines} more {lines}, {more_chars} characters, not shown; run `git status` to see the rest)"
    ));
    out
}

struct Output {
    success: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Output {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).trim().to_owned()
    }
}

#[derive(Debug)]
enum RunError {
    /// The program does not exist: no git on this machine.
    NotFound,
    Spawn(io::Error),
    Timeout(Duration),
    Wait(io::Error),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotFound => f.write_str("git not found"),
            Self::Spawn(err) => write!(f, "cannot start git: {err}"),
            Self::Timeout(limit) => write!(f, "git did not finish within {limit:?} and was killed"),
            Self::Wait(err) => write!(f, "waiting for git failed: {err}"),
        }
    }
}

/// Runs `command` to completion or kills it after `timeout`. The pipes are drained on
/// their own threads so a large output cannot fill a pipe and stall the child.
fn run_with_timeout(mut command: Command, timeout: Duration) -> Result<Output, RunError> {
    let deadline = Instant::now() + timeout;
    let mut child = command.spawn().map_err(|err| match err.kind() {
        io::ErrorKind::NotFound => RunError::NotFound,
        _ => RunError::Spawn(err),
    })?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());

    let status: ExitStatus = {
        let mut pause = Duration::from_millis(1);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    // Kill errors mean it exited in the meantime; either way it is gone
                    // after the wait.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(RunError::Timeout(timeout));
                }
                Ok(None) => {
                    std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Err(err) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(RunError::Wait(err));
                }
            }
        }
    };
    // A grandchild that inherited the pipe could keep it open after git exits; do not
    // wait past the deadline for it.
    let collect = |rx: mpsc::Receiver<Vec<u8>>| -> Result<Vec<u8>, RunError> {
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).map_err(|_| RunError::Timeout(timeout))
    };
    Ok(Output { success: status.success(), stdout: collect(stdout)?, stderr: collect(stderr)? })
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    match pipe {
        Some(mut pipe) => {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                // A read error leaves what was read so far; git's exit status decides.
                let _ = pipe.read_to_end(&mut buf);
                let _ = tx.send(buf);
            });
        }
        None => {
            let _ = tx.send(Vec::new());
        }
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::PathBuf;

    /// Runs git in `dir` for test setup; panics on failure.
    fn git(dir: &Path, args: &[&str]) {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env_remove("GIT_INDEX_FILE")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn commit_file(dir: &Path, name: &str, text: &str, message: &str) {
        std::fs::write(dir.join(name), text).unwrap();
        git(dir, &["add", name]);
        git(dir, &["commit", "-q", "-m", message]);
    }

    fn repo() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        git(dir.path(), &["init", "-q", "-b", "main"]);
        git(dir.path(), &["config", "user.name", "Ada Tester"]);
        git(dir.path(), &["config", "user.email", "ada@example.invalid"]);
        git(dir.path(), &["config", "commit.gpgsign", "false"]);
        dir
    }

    #[test]
    fn facts_of_a_repository_with_history_and_changes() {
        let dir = repo();
        for n in 1..=6 {
            commit_file(dir.path(), "a.txt", &format!("v{n}\n"), &format!("commit number {n}"));
        }
        git(dir.path(), &["checkout", "-q", "-b", "feature/x"]);
        std::fs::write(dir.path().join("a.txt"), "dirty\n").unwrap();
        std::fs::write(dir.path().join("new.txt"), "untracked\n").unwrap();

        let facts = capture(dir.path()).unwrap();
        assert_eq!(facts.branch.as_deref(), Some("feature/x"));
        assert_eq!(facts.main_branch.as_deref(), Some("main"));
        assert_eq!(facts.user_name.as_deref(), Some("Ada Tester"));
        assert_eq!(facts.status.as_deref(), Some(" M a.txt\n?? new.txt"));
        let subjects: Vec<&str> = facts.recent_commits.iter().map(|line| line.split_once(' ').unwrap().1).collect();
        assert_eq!(
            subjects,
            ["commit number 6", "commit number 5", "commit number 4", "commit number 3", "commit number 2"]
        );

        let text = render(&facts);
        assert!(text.starts_with("Git repository state as of the start of this session."));
        assert!(text.contains("not refreshed"));
        assert!(text.contains("\nCurrent branch: feature/x\n"));
        assert!(text.contains("\nMain branch (the usual target for pull requests): main\n"));
        assert!(text.contains("\nGit user: Ada Tester\n"));
        assert!(text.contains("\nStatus:\n M a.txt\n?? new.txt\n"));
        assert!(text.contains(&format!("\nRecent commits:\n{}\n", facts.recent_commits.join("\n"))));

        // Nothing was locked or left behind by the capture.
        assert!(!dir.path().join(".git/index.lock").exists());
    }

    #[test]
    fn render_of_a_fresh_repository() {
        let dir = repo();
        let facts = capture(dir.path()).unwrap();
        assert_eq!(
            facts,
            GitFacts {
                branch: Some("main".to_owned()),
                main_branch: None,
                status: Some(String::new()),
                recent_commits: Vec::new(),
                user_name: Some("Ada Tester".to_owned()),
            }
        );
        let text = render(&facts);
        assert!(text.contains("\nCurrent branch: main\n"));
        assert!(text.contains(": (unknown)\n"));
        assert!(text.contains("\nStatus:\n(clean)\n"));
        assert!(text.ends_with("\nRecent commits:\n(none yet)\n"));
    }

    #[test]
    fn main_branch_comes_from_origin_head_then_main_then_master() {
        let dir = repo();
        commit_file(dir.path(), "a.txt", "a", "first");
        git(dir.path(), &["branch", "-m", "main", "master"]);
        assert_eq!(capture(dir.path()).unwrap().main_branch.as_deref(), Some("master"));

        git(dir.path(), &["branch", "main"]);
        assert_eq!(capture(dir.path()).unwrap().main_branch.as_deref(), Some("main"));

        git(dir.path(), &["update-ref", "refs/remotes/origin/trunk", "HEAD"]);
        git(dir.path(), &["symbolic-ref", "refs/remotes/origin/HEAD", "refs/remotes/origin/trunk"]);
        assert_eq!(capture(dir.path()).unwrap().main_branch.as_deref(), Some("trunk"));
    }

    #[test]
    fn detached_head_names_the_commit() {
        let dir = repo();
        commit_file(dir.path(), "a.txt", "a", "first");
        git(dir.path(), &["checkout", "-q", "--detach"]);
        let branch = capture(dir.path()).unwrap().branch.unwrap();
        assert!(branch.starts_with("detached at "), "{branch}");
    }

    #[test]
    fn long_status_is_cut_with_a_note() {
        let dir = repo();
        commit_file(dir.path(), "a.txt", "a", "first");
        for n in 0..300 {
            std::fs::write(dir.path().join(format!("untracked-file-{n:04}.txt")), "x").unwrap();
        }
        let facts = capture(dir.path()).unwrap();
        let status = facts.status.unwrap();
        let (kept, note) = status.rsplit_once('\n').unwrap();
        assert!(kept.chars().count() <= STATUS_MAX_CHARS, "{}", kept.len());
        // Every kept line is whole.
        assert!(kept.lines().all(|line| line.starts_with("?? untracked-file-") && line.ends_with(".txt")));
        let kept_lines = kept.lines().count();
        // Each line is "?? untracked-file-NNNN.txt": 26 characters and a newline.
        assert_eq!(kept_lines, (STATUS_MAX_CHARS + 1) / 27);
        let more = 300 - kept_lines;
        assert_eq!(
            note,
            format!(
                "... ({more} more lines, {} characters, not shown; run `git status` to see the rest)",
                more * 27 - 1
            )
        );
    }

    #[test]
    fn cut_status_keeps_short_output_and_cuts_on_lines() {
        assert_eq!(cut_status("", 10), "");
        assert_eq!(cut_status("?? a\n", 10), "?? a");
        assert_eq!(cut_status("?? a\n?? b", 9), "?? a\n?? b");
        assert_eq!(
            cut_status("?? a\n?? b\n?? c\n", 12),
            "?? a\n?? b\n... (1 more line, 4 characters, not shown; run `git status` to see the rest)"
        );
        // A first line longer than the limit leaves only the note.
        assert_eq!(
            cut_status("?? a-very-long-name\n", 5),
            "... (1 more line, 19 characters, not shown; run `git status` to see the rest)"
        );
        // Multi-byte characters are counted as characters and never split.
        assert_eq!(
            cut_status("?? é\n?? ü\n", 6),
            "?? é\n... (1 more line, 4 characters, not shown; run `git status` to see the rest)"
        );
    }

    #[test]
    fn a_directory_outside_any_repository_has_no_facts() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(capture(dir.path()), None);
        // Inside `.git` is not a work tree either.
        let repo = repo();
        assert_eq!(capture(&repo.path().join(".git")), None);
    }

    #[test]
    fn a_missing_directory_has_no_facts() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(capture(&dir.path().join("gone")), None);
    }

    #[test]
    fn without_git_there_are_no_facts() {
        let dir = repo();
        let missing = PathBuf::from("/nonexistent/bin/git");
        assert_eq!(capture_with(dir.path(), &GitOptions::with_program(&missing)), None);
        // A bare name that is on no PATH behaves the same.
        assert_eq!(capture_with(dir.path(), &GitOptions::with_program("git-that-is-not-installed")), None);
    }

    #[test]
    fn a_hanging_git_is_killed_at_the_timeout() {
        use std::os::unix::fs::PermissionsExt;

        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("slow-git");
        // Answers nothing for far longer than the timeout.
        std::fs::write(&fake, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let options = GitOptions { timeout: Duration::from_millis(200), ..GitOptions::with_program(&fake) };
        let started = Instant::now();
        assert_eq!(capture_with(dir.path(), &options), None);
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    }
}
