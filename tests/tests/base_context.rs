//! Base context over real pipes, real files and the real watcher: memory files in the
//! context view, files created after start and atomic-rename saves reported with
//! `ctx/contextChanged`, and read files edited behind the agent's back marked stale.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::path::Path;

use ctxd_e2e::Daemon;
use serde_json::{Value, json};

fn open(daemon: &mut Daemon, cwd: &Path) -> Value {
    daemon.request("ctx/openSession", json!({"cwd": cwd, "model": "claude-sonnet-4-5", "sessionId": "s"})).unwrap()
}

fn context(daemon: &mut Daemon) -> Value {
    daemon.request("ctx/context", json!({"sessionId": "s"})).unwrap()
}

fn wait_changed(daemon: &mut Daemon, path: &Path) -> Value {
    let want = path.display().to_string();
    daemon
        .wait_notification("ctx/contextChanged", |p| {
            p["paths"].as_array().is_some_and(|a| a.iter().any(|x| x == &json!(want)))
        })
        .unwrap()
}

#[test]
fn memory_files_created_and_saved_later_are_seen() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join(".claude/rules")).unwrap();
    std::fs::write(project.join(".claude/rules/tests.md"), "---\npaths: \"tests/**\"\n---\nRun tests with nextest.\n")
        .unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    open(&mut daemon, &project);
    let view = context(&mut daemon);
    assert_eq!(view["pendingRules"][0]["paths"], json!(["tests/**"]), "{view}");
    assert!(
        view["memoryFiles"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["path"] != project.join("CLAUDE.md").display().to_string())
    );

    // A CLAUDE.md that did not exist when the session opened.
    let claude_md = project.join("CLAUDE.md");
    std::fs::write(&claude_md, "# Project\nUse four spaces.\n").unwrap();
    wait_changed(&mut daemon, &claude_md);
    let view = context(&mut daemon);
    let file =
        view["memoryFiles"].as_array().unwrap().iter().find(|f| f["path"] == claude_md.display().to_string()).cloned();
    let file = file.unwrap_or_else(|| panic!("CLAUDE.md not loaded: {view}"));
    assert_eq!(file["status"], "loaded");
    assert_eq!(file["kind"], "project");
    let before = file["tokens"].as_u64().unwrap();

    // An editor's save: write a temporary file, rename it over the original.
    let tmp = project.join(".CLAUDE.md.swp");
    std::fs::write(&tmp, format!("# Project\nUse four spaces.\n{}\n", "More rules. ".repeat(50))).unwrap();
    std::fs::rename(&tmp, &claude_md).unwrap();
    wait_changed(&mut daemon, &claude_md);
    let view = context(&mut daemon);
    let file = view["memoryFiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == claude_md.display().to_string())
        .unwrap()
        .clone();
    assert!(file["tokens"].as_u64().unwrap() > before + 100, "{file}");
}

#[test]
fn a_read_file_edited_externally_is_reported_once_and_marked_stale() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    let source = project.join("lib.rs");
    std::fs::write(&source, "pub fn one() {}\n").unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    open(&mut daemon, &project);
    daemon.request("ctx/fileRead", json!({"sessionId": "s", "path": source})).unwrap();
    assert_eq!(context(&mut daemon)["staleFiles"], Value::Null);

    std::fs::write(&source, "pub fn one() {}\npub fn two() {}\n").unwrap();
    let changed = wait_changed(&mut daemon, &source);
    assert_eq!(changed["sessionId"], "s");
    let view = context(&mut daemon);
    assert_eq!(view["staleFiles"], json!([source.display().to_string()]), "{view}");
    assert_eq!(view["filesRead"], 1);
    // Exactly one report for one save: none of those that follow, up to the one for a
    // later change, names the file again.
    let later = daemon.settle_watcher("s", &project.join("CLAUDE.md")).unwrap();
    let want = json!(source.display().to_string());
    let again: Vec<&Value> = later.iter().filter(|p| p["paths"].as_array().unwrap().contains(&want)).collect();
    assert!(again.is_empty(), "{again:?}");
}

#[test]
fn a_git_repository_is_part_of_the_context_and_a_plain_directory_is_fine() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git").args(args).current_dir(&repo).output().map(|o| o.status.success());
        assert!(matches!(ok, Ok(true)), "git {args:?}");
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["config", "user.name", "Tester"]);
    git(&["config", "user.email", "t@example.invalid"]);
    std::fs::write(repo.join("README.md"), "hi\n").unwrap();
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "first"]);
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    open(&mut daemon, &repo);
    assert_eq!(context(&mut daemon)["git"], true);
    let mut daemon = Daemon::started(&dir.path().join("state2")).unwrap();
    open(&mut daemon, dir.path());
    assert_eq!(context(&mut daemon)["git"], false);
}
