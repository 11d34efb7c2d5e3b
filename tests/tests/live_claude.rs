//! A Claude Code session whose program is running is left alone: `ctxd claude compact`
//! and `ctx/claudeCompact` refuse, and idle compaction waits, while a `claude` process
//! works in the session's project directory or names the session in its arguments;
//! once it exits, the session compacts. The program holds no descriptor on its
//! transcript between writes, so the open-file check alone never saw it.
//!
//! The stand-in for the program is `/bin/sh` under the name `claude` (its process name,
//! as `/proc` shows the real one), waiting on its input.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use ctxd_e2e::{Daemon, claude_home, ctxd_claude, eventually};
use serde_json::json;

/// The session's project: HOME, the project directory and the transcript
/// ([`claude_home`]).
fn project(dir: &Path) -> (PathBuf, PathBuf, PathBuf, String) {
    let (home, path, id) = claude_home(dir).unwrap();
    (home, dir.join("proj"), path, id)
}

/// A `claude` process in `cwd` with `args`, once `/proc` shows it under that name (it
/// is forked under the test's name and takes `claude` when it executes).
struct Program(Child);

impl Program {
    fn start(dir: &Path, cwd: &Path, args: &[&str]) -> Program {
        let program = dir.join("bin/claude");
        if !program.exists() {
            std::fs::create_dir_all(program.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink("/bin/sh", &program).unwrap();
        }
        let child = Command::new(&program)
            .args(["-c", "read line", "claude"])
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let comm = format!("/proc/{}/comm", child.id());
        eventually(10, "the stand-in never showed as claude", || {
            std::fs::read_to_string(&comm).is_ok_and(|c| c.trim() == "claude")
        });
        Program(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Ends it (its input closes) and waits for it.
    fn exit(mut self) {
        drop(self.0.stdin.take());
        self.0.wait().unwrap();
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn claude_compact_refuses_while_the_program_runs_for_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let (home, proj, path, id) = project(dir.path());
    let original = std::fs::read(&path).unwrap();
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();

    // In the project directory, and elsewhere naming the session (as `--resume` and
    // `--session-id` do): refused, with the process named, and nothing written.
    for (cwd, args) in
        [(&proj, &[][..]), (&elsewhere, &["--resume", &id][..]), (&elsewhere, &["--session-id", &id][..])]
    {
        let program = Program::start(dir.path(), cwd, args);
        let out = ctxd_claude(dir.path(), &home, &["compact", &id]).unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "compacted under {args:?}: {said}");
        let want = format!("Claude Code (pid {}) is running for this session", program.pid());
        assert!(said.contains(&want), "{args:?}: {said}");
        assert_eq!(said.matches("claude compact refused").count(), 1, "one log line: {said}");
        assert_eq!(std::fs::read(&path).unwrap(), original);
        program.exit();
    }

    // A program for another session, elsewhere, does not hold this one up.
    let other = Program::start(dir.path(), &elsewhere, &["--resume", "11111111-2222-3333-4444-555555555555"]);
    let out = ctxd_claude(dir.path(), &home, &["compact", &id]).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let after = std::fs::read(&path).unwrap();
    assert_eq!(&after[..original.len()], &original[..], "appended only");
    assert!(after.len() > original.len());
    other.exit();
}

#[test]
fn idle_compaction_waits_until_the_program_has_exited() {
    let dir = tempfile::tempdir().unwrap();
    let (_home, proj, path, _id) = project(dir.path());
    let original = std::fs::read(&path).unwrap();
    let program = Program::start(dir.path(), &proj, &[]);
    let running = format!("Claude Code (pid {}) is running for this session", program.pid());

    let state = dir.path().join("state");
    let mut daemon = Daemon::start_with(&state, &[], &[]).unwrap();
    // Idle after one second, worth it from 1 % of the threshold.
    let settings =
        json!({"claudeIdleCompaction": true, "claudeIdleCompactAfterSeconds": 1, "claudeIdleCompactPercent": 1});
    daemon.request("initialize", json!({"capabilities": {}, "initializationOptions": {"settings": settings}})).unwrap();
    daemon.notify("initialized", json!({})).unwrap();

    // The daemon's method refuses as the command does.
    let error = daemon.request_error("ctx/claudeCompact", json!({"transcript": path})).unwrap();
    assert!(error["message"].as_str().unwrap().contains(&running), "{error}");

    daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    // Four idle periods pass with the program running, each said in the log: more than
    // the three refusals an idle spell allows, so these are not counted as refusals.
    // Over those four seconds nothing was written.
    let log = state.with_extension("log");
    let skipped = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("observed Claude Code session idle, but") && l.contains(&running))
            .count()
    };
    eventually(60, "no idle skip logged while the program runs", || skipped() >= 4);
    assert_eq!(std::fs::read(&path).unwrap(), original);

    // Once it has exited, the next idle period compacts the session.
    program.exit();
    eventually(30, "the idle session was not compacted after the program exited", || {
        std::fs::metadata(&path).unwrap().len() > original.len() as u64
    });
    let after = std::fs::read(&path).unwrap();
    assert_eq!(&after[..original.len()], &original[..], "appended only");
    assert!(String::from_utf8_lossy(&after[original.len()..]).contains("\"compact_boundary\""));
    daemon.stop().unwrap();
}
