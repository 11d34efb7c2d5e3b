//! An observed Claude Code session stays true when its transcript does more than grow
//! (issue #37): a compaction undone (the file cut back) shows the figure from before
//! it and the turns after it; a transcript rewritten in place is read again; an older
//! transcript of a followed project folder that the program resumes is followed; and
//! `ctx/context` answers for an observed session with its memory files, the rules its
//! reads activate, the files it read, and a summary counted by its size.
//!
//! Real daemon binary over pipes, real files, the real program's transcript
//! (`claude-code-2.1.332/manual-compact.jsonl`). Waits are for the notification that
//! says so (a guard of [`ctxd_e2e::TIMEOUT`] against a hang, not a measurement).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use ctxd_e2e::{Daemon, assistant_record, claude_code_home, claude_home, user_record};
use serde_json::{Value, json};

/// The id a client computes for an observed transcript (as `ctx/observe` answers it).
fn observe_id(path: &Path) -> String {
    format!("observe-{:016x}", ctxd_core::ledger::fnv1a(path.as_os_str().as_encoded_bytes()))
}

fn append(path: &Path, records: &[Value]) {
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    for record in records {
        writeln!(file, "{record}").unwrap();
    }
}

/// Waits for the figure of `id` whose `field` is `value`.
fn wait_figure(daemon: &mut Daemon, id: &str, field: &str, value: u64) -> Value {
    daemon
        .wait_notification("ctx/usageChanged", |p| p["sessionId"] == id && p["usage"][field] == value)
        .unwrap_or_else(|e| panic!("no figure of {id} with {field} = {value}: {e}"))
}

#[test]
fn an_undone_compaction_shows_the_figure_before_it_and_the_turns_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_home, path, _id) = claude_home(dir.path()).unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let observed = daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    let id = observed["sessionId"].as_str().unwrap().to_owned();
    let before = observed["usage"]["tokens"].as_u64().unwrap();

    // ctxd compacts the session in place: the follower reads the boundary it appended.
    let done = daemon.request("ctx/claudeCompact", json!({"transcript": path})).unwrap();
    let post = done["postTokens"].as_u64().unwrap();
    assert!(post < before, "{done}");
    daemon
        .wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == id.as_str() && p["usage"]["tokens"].as_u64().is_some_and(|t| t < before)
        })
        .unwrap();
    // Every figure so far is read: what comes next is the undo's.
    daemon.drain_notifications("ctx/usageChanged");

    // Undo cuts the file back to what it was: the figure from before the compaction,
    // pushed without the program writing anything.
    daemon.request("ctx/claudeUndo", json!({"transcript": path})).unwrap();
    wait_figure(&mut daemon, &id, "tokens", before);

    // The program goes on from there: a turn shorter than what was cut away is shown.
    append(
        &path,
        &[
            user_record("after-undo", None, "and now?"),
            assistant_record("a-after-undo", None, "msg_after", 123_000, 456),
        ],
    );
    wait_figure(&mut daemon, &id, "reportedTokens", 123_456);
    // And the next one.
    append(&path, &[assistant_record("a-next", None, "msg_next", 124_000, 4)]);
    wait_figure(&mut daemon, &id, "reportedTokens", 124_004);
}

#[test]
fn a_transcript_rewritten_in_place_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rewritten.jsonl");
    let turn = |input: u64| {
        format!("{}\n{}\n", user_record("u1", None, "hello"), assistant_record("a1", Some("u1"), "msg_1", input, 500))
    };
    std::fs::write(&path, turn(40_000)).unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let observed = daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    let id = observed["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(observed["usage"]["reportedTokens"], 40_500, "{observed}");
    // The same length, other bytes (an editor's save, a tool rewriting the session).
    let rewritten = turn(70_000);
    assert_eq!(rewritten.len(), turn(40_000).len());
    std::fs::write(&path, rewritten).unwrap();
    wait_figure(&mut daemon, &id, "reportedTokens", 70_500);
}

/// A second transcript `newer.jsonl` beside `older` in its folder, written after it,
/// with `older` dated an hour back so the folder's newest is not in doubt.
fn newer_beside(older: &Path) -> PathBuf {
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options().append(true).open(older).unwrap().set_modified(an_hour_ago).unwrap();
    let newer = older.with_file_name("newer.jsonl");
    std::fs::write(
        &newer,
        format!("{}\n{}\n", user_record("n1", None, "hi"), assistant_record("na1", Some("n1"), "msg_n", 20_000, 20)),
    )
    .unwrap();
    newer
}

#[test]
fn an_older_transcript_the_program_resumes_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let (_home, older, _id) = claude_home(dir.path()).unwrap();
    let newer = newer_beside(&older);
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let observed = daemon.request("ctx/observe", json!({"projectDir": older.parent().unwrap()})).unwrap();
    assert_eq!(observed["sessionId"], observe_id(&newer), "the newest is answered with: {observed}");

    // `claude --resume` appends to the older session.
    append(&older, &[user_record("resumed", None, "back again"), assistant_record("ra", None, "msg_r", 222_000, 222)]);
    wait_figure(&mut daemon, &observe_id(&older), "reportedTokens", 222_222);
    // And it stays followed.
    append(&older, &[assistant_record("ra2", None, "msg_r2", 223_000, 3)]);
    wait_figure(&mut daemon, &observe_id(&older), "reportedTokens", 223_003);
}

#[test]
fn with_observe_claude_projects_an_older_transcript_resumed_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let (home, older, _id) = claude_home(dir.path()).unwrap();
    let newer = newer_beside(&older);
    let claude_dir = home.join(".claude");
    let mut daemon =
        Daemon::start_with(&dir.path().join("state"), &[], &[("CLAUDE_CONFIG_DIR", claude_dir.to_str().unwrap())])
            .unwrap();
    let settings = json!({"observeClaudeProjects": true});
    daemon.request("initialize", json!({"capabilities": {}, "initializationOptions": {"settings": settings}})).unwrap();
    daemon.notify("initialized", json!({})).unwrap();
    // The folder's newest is announced with its first figure; then the folder is followed.
    daemon.wait_notification("ctx/usageChanged", |p| p["sessionId"] == observe_id(&newer).as_str()).unwrap();

    append(&older, &[user_record("resumed", None, "back again"), assistant_record("ra", None, "msg_r", 222_000, 222)]);
    wait_figure(&mut daemon, &observe_id(&older), "reportedTokens", 222_222);
}

/// The real program's session whose reads name files of `<dir>/proj`, which exist,
/// with a CLAUDE.md and a rule for `src/**/*.py` there; returns (transcript, project).
fn project_with_memory(dir: &Path) -> (PathBuf, PathBuf) {
    let project = dir.join("proj");
    let real = project.display().to_string();
    let (_home, path, project) = claude_code_home(dir, |line| line.replace("/home/dev/proj", &real));
    std::fs::create_dir_all(project.join("src")).unwrap();
    std::fs::create_dir_all(project.join(".claude/rules")).unwrap();
    for file in ["README.md", "src/app.py", "src/util.py", "src/big.py"] {
        std::fs::write(project.join(file), "x = 1\n").unwrap();
    }
    std::fs::write(project.join("CLAUDE.md"), "# Project\nUse four spaces.\n").unwrap();
    std::fs::write(project.join(".claude/rules/python.md"), "---\npaths: \"src/**/*.py\"\n---\nType-annotate.\n")
        .unwrap();
    (path, project)
}

fn memory_file<'a>(view: &'a Value, path: &Path) -> Option<&'a Value> {
    view["memoryFiles"].as_array()?.iter().find(|f| f["path"] == path.display().to_string())
}

#[test]
fn ctx_context_of_an_observed_session_lists_memory_files_rules_and_files_read() {
    let dir = tempfile::tempdir().unwrap();
    let (path, project) = project_with_memory(dir.path());
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let observed = daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    let id = observed["sessionId"].as_str().unwrap().to_owned();

    let view = daemon.request("ctx/context", json!({"sessionId": id})).unwrap();
    println!("{view:#}");
    let claude_md = memory_file(&view, &project.join("CLAUDE.md")).unwrap_or_else(|| panic!("no CLAUDE.md: {view}"));
    assert_eq!(claude_md["status"], "loaded", "{view}");
    assert!(claude_md["tokens"].as_u64().unwrap() > 0);
    // The rule is active: the transcript read files it applies to.
    let rule = memory_file(&view, &project.join(".claude/rules/python.md"))
        .unwrap_or_else(|| panic!("the rule is not active: {view}"));
    assert_eq!(rule["status"], "loaded", "{view}");
    assert!(view["pendingRules"].as_array().unwrap().is_empty(), "{view}");
    assert_eq!(view["filesRead"], 4, "README.md, app.py, util.py, big.py: {view}");
    // The parts the program's requests carry are known, not lumped with the messages.
    let parts = &view["usage"]["breakdown"];
    assert!(parts["systemPrompt"].as_u64().unwrap() > 1_000, "{parts}");
    assert!(parts["tools"].as_u64().unwrap() > 1_000, "{parts}");
    assert!(parts["memoryFiles"].as_u64().unwrap() > 0, "{parts}");
    assert_eq!(view["usage"]["tokens"], observed["usage"]["tokens"], "the same figure as the status item's");
    // `ctx/usage` answers for it too.
    let usage = daemon.request("ctx/usage", json!({"sessionId": id})).unwrap();
    assert_eq!(usage["usage"]["tokens"], observed["usage"]["tokens"], "{usage}");
    // An id nobody observes is still refused.
    let error = daemon.request_error("ctx/context", json!({"sessionId": "observe-0000000000000000"})).unwrap();
    assert!(error["code"].is_i64(), "{error}");
}

#[test]
fn an_observed_compaction_counts_its_summary_by_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _project) = project_with_memory(dir.path());
    let original = std::fs::read(&path).unwrap().len();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let observed = daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    let id = observed["sessionId"].as_str().unwrap().to_owned();
    let before = observed["usage"]["tokens"].as_u64().unwrap();

    daemon.request("ctx/claudeCompact", json!({"transcript": path})).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let summary: Value = text[original..]
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["isCompactSummary"] == true)
        .unwrap();
    let summary_bytes = summary["message"]["content"].to_string().len() as u64;
    let pushed = daemon
        .wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == id.as_str() && p["usage"]["tokens"].as_u64().is_some_and(|t| t < before)
        })
        .unwrap();
    let parts = &pushed["usage"]["breakdown"];
    println!("summary of {summary_bytes} bytes; after the compaction: {parts:#}");
    let summaries = parts["messages"]["summaries"].as_u64().unwrap();
    // About a token per four bytes; at most one per two, whatever the calibration.
    assert!(
        summaries > 0 && summaries <= summary_bytes / 2,
        "summaries {summaries} for {summary_bytes} bytes: {parts}"
    );
    assert!(parts["systemPrompt"].as_u64().unwrap() > 1_000, "{parts}");
    assert!(parts["tools"].as_u64().unwrap() > 1_000, "{parts}");
    // The context view says the same.
    let view = daemon.request("ctx/context", json!({"sessionId": id})).unwrap();
    assert_eq!(view["usage"]["breakdown"]["messages"]["summaries"], summaries, "{view}");
}

/// Compactions and undos in a row, each read by the follower while ctxd may still hold
/// its write lease on the file (a read then is refused at the open): the follower waits
/// the lease out and shows every figure. 20 trials, none may fail.
#[test]
fn compactions_and_undos_in_a_row_are_all_followed() {
    const TRIALS: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let (_home, path, _id) = claude_home(dir.path()).unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    let observed = daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    let id = observed["sessionId"].as_str().unwrap().to_owned();
    let before = observed["usage"]["tokens"].as_u64().unwrap();
    let mut failed = Vec::new();
    for trial in 0..TRIALS {
        daemon.drain_notifications("ctx/usageChanged");
        daemon.request("ctx/claudeCompact", json!({"transcript": path})).unwrap();
        let compacted = daemon.wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == id.as_str() && p["usage"]["tokens"].as_u64().is_some_and(|t| t < before)
        });
        daemon.drain_notifications("ctx/usageChanged");
        daemon.request("ctx/claudeUndo", json!({"transcript": path})).unwrap();
        let undone = daemon
            .wait_notification("ctx/usageChanged", |p| p["sessionId"] == id.as_str() && p["usage"]["tokens"] == before);
        if compacted.is_err() || undone.is_err() {
            failed.push(trial);
        }
    }
    let log = std::fs::read_to_string(state.with_extension("log")).unwrap();
    assert!(!log.contains("observed transcript is gone"), "the follower stopped");
    assert!(failed.is_empty(), "{} of {TRIALS} trials failed: {failed:?}", failed.len());
}
