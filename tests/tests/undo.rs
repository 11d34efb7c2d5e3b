//! `ctx/undoCompact` over real pipes: the view the compaction replaced comes back (usage
//! and the assembled messages), the refusals, two undos in a row, appends after an undo,
//! and resume after `kill -9` with a current, deleted or stale index.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::path::Path;

use ctxd_e2e::{Daemon, example, records_of, stored_uuids, user_record};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5-20250929";
const CWD: &str = "/home/dev/project";

fn open(daemon: &mut Daemon, id: &str) -> Value {
    daemon.request("ctx/openSession", json!({"cwd": CWD, "model": MODEL, "sessionId": id})).unwrap()
}

fn usage(daemon: &mut Daemon, id: &str) -> Value {
    daemon.request("ctx/usage", json!({"sessionId": id})).unwrap()["usage"].clone()
}

/// The messages of the session's next request (no host blocks).
fn messages(daemon: &mut Daemon, id: &str) -> Value {
    daemon.request("ctx/assemble", json!({"sessionId": id, "maxTokens": 8000})).unwrap()["request"]["messages"].clone()
}

/// The next request's messages, then the usage (which counts the host's blocks of the
/// request just built, so two views compare alike however they were reached).
fn view(daemon: &mut Daemon, id: &str) -> (Value, Value) {
    let messages = messages(daemon, id);
    (messages, usage(daemon, id))
}

fn undo(daemon: &mut Daemon, id: &str) -> Value {
    daemon.request("ctx/undoCompact", json!({"sessionId": id})).unwrap()
}

/// The refusal's `data.reason`, after checking its code.
fn refusal(daemon: &mut Daemon, id: &str) -> (String, String) {
    let error = daemon.request_error("ctx/undoCompact", json!({"sessionId": id})).unwrap();
    assert_eq!(error["code"], -33010, "{error}");
    (error["data"]["reason"].as_str().unwrap().to_owned(), error["message"].as_str().unwrap().to_owned())
}

#[test]
fn undo_brings_back_the_view_the_compaction_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "u");
    daemon.request("ctx/append", json!({"sessionId": "u", "records": example(usize::MAX)[..120]})).unwrap();
    let (before_messages, before) = view(&mut daemon, "u");

    let compacted = daemon.request("ctx/compact", json!({"sessionId": "u"})).unwrap();
    let compacted_tokens = compacted["usage"]["tokens"].as_u64().unwrap();
    assert!(compacted_tokens < before["tokens"].as_u64().unwrap() / 2, "{compacted}");
    assert_ne!(messages(&mut daemon, "u"), before_messages);
    let stored_before_undo = records_of(&state, "u").len();

    let undone = undo(&mut daemon, "u");
    assert_eq!(undone["boundary"], compacted["boundary"]);
    assert_eq!(undone["preTokens"].as_u64().unwrap(), compacted_tokens);
    assert_eq!(undone["postTokens"], before["tokens"], "{undone}");
    assert_eq!(undone["usage"]["tokens"], before["tokens"]);
    daemon
        .wait_notification("ctx/usageChanged", |p| p["sessionId"] == "u" && p["usage"]["tokens"] == before["tokens"])
        .unwrap();
    assert_eq!(
        view(&mut daemon, "u"),
        (before_messages, before.clone()),
        "the model sees the conversation as before the compaction"
    );

    // The transcript keeps the compaction and gained one record that undoes it.
    let stored = records_of(&state, "u");
    assert_eq!(stored.len(), stored_before_undo + 1);
    let boundary = stored.iter().find(|r| r["subtype"] == "compact_boundary").unwrap();
    assert_eq!(boundary["uuid"], compacted["boundary"]);
    assert!(stored.iter().any(|r| r["isCompactSummary"] == true));
    let record = stored.last().unwrap();
    assert_eq!(record["type"], "system");
    assert_eq!(record["subtype"], "ctxd_undo_compact");
    assert_eq!(record["uuid"], undone["undoRecord"]);
    assert_eq!(record["undoes"], compacted["boundary"]);
    assert_eq!(
        record["parentUuid"], boundary["logicalParentUuid"],
        "the chain goes on from the last record before the compaction"
    );
    assert_eq!(record["cwd"], CWD);

    // `ctxd replay` of this transcript goes through the undo as the live session did.
    let out = ctxd_e2e::hermetic(&mut ctxd_e2e::ctxd_command(), &dir.path().join("replay-home"))
        .arg("replay")
        .arg(state.join("sessions/u.jsonl"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let tokens = before["tokens"].as_u64().unwrap();
    let shown = format!("compaction undone: back to {},{:03} tokens", tokens / 1000, tokens % 1000);
    assert!(text.contains(&shown), "{shown} in {text}");
}

#[test]
fn undo_is_refused_without_a_compaction_and_after_a_new_turn() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "r");
    daemon.request("ctx/append", json!({"sessionId": "r", "records": example(usize::MAX)[..60]})).unwrap();
    let (reason, message) = refusal(&mut daemon, "r");
    assert_eq!(reason, "nothingToUndo");
    assert!(message.contains("no compaction to undo"), "{message}");
    assert_eq!(stored_uuids(&state, "r").unwrap().len(), 60, "nothing appended");

    // ctxd's own records after the compaction (a file-read marker) are not a turn.
    let compacted = daemon.request("ctx/compact", json!({"sessionId": "r"})).unwrap();
    let file = dir.path().join("notes.md");
    std::fs::write(&file, "# notes\n").unwrap();
    daemon.request("ctx/fileRead", json!({"sessionId": "r", "path": file})).unwrap();
    assert_eq!(undo(&mut daemon, "r")["boundary"], compacted["boundary"]);

    // A new prompt after the compaction: too late.
    daemon.request("ctx/compact", json!({"sessionId": "r"})).unwrap();
    let last = stored_uuids(&state, "r").unwrap().last().cloned().unwrap();
    daemon
        .request(
            "ctx/append",
            json!({"sessionId": "r", "records": [user_record("next-prompt", Some(&last), "and now the tests")]}),
        )
        .unwrap();
    let stored = stored_uuids(&state, "r").unwrap();
    let usage_before = usage(&mut daemon, "r");
    let (reason, message) = refusal(&mut daemon, "r");
    assert_eq!(reason, "newTurnSince");
    assert!(message.contains("new turn"), "{message}");
    assert_eq!(stored_uuids(&state, "r").unwrap(), stored, "nothing appended");
    assert_eq!(usage(&mut daemon, "r"), usage_before);

    let unknown = daemon.request_error("ctx/undoCompact", json!({"sessionId": "nobody"})).unwrap();
    assert_eq!(unknown["code"], -33001);
}

/// Kills the daemon, runs `between` on the state directory, restarts it and checks that
/// the session resumes with the `expected` [`view`].
fn resumes_the_same(
    daemon: Daemon,
    state: &Path,
    id: &str,
    expected: &(Value, Value),
    between: impl FnOnce(&Path),
) -> Daemon {
    let mut daemon = daemon;
    daemon.kill9().unwrap();
    between(state);
    let mut daemon = Daemon::started(state).unwrap();
    let opened = open(&mut daemon, id);
    assert_eq!(opened["records"].as_u64().unwrap(), stored_uuids(state, id).unwrap().len() as u64);
    assert_eq!(&view(&mut daemon, id), expected, "resumed view");
    daemon
}

#[test]
fn an_undo_survives_kill_9_with_the_index_current_deleted_or_stale() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "k");
    daemon.request("ctx/append", json!({"sessionId": "k", "records": example(usize::MAX)[..120]})).unwrap();
    daemon.request("ctx/compact", json!({"sessionId": "k"})).unwrap();
    // A clean stop writes the index: it names the compaction's boundary. Kept aside, it
    // is an index that missed the undo.
    assert!(daemon.stop().unwrap().success());
    let stale = dir.path().join("index-before-undo");
    ctxd_e2e::copy_dir(&state.join("index"), &stale).unwrap();

    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "k");
    let undone = undo(&mut daemon, "k");
    let expected = view(&mut daemon, "k");
    assert_eq!(undone["usage"]["tokens"], expected.1["tokens"]);

    let daemon = resumes_the_same(daemon, &state, "k", &expected, |_| {});
    let daemon = resumes_the_same(daemon, &state, "k", &expected, |state| {
        std::fs::remove_dir_all(state.join("index")).unwrap();
    });
    let mut daemon = resumes_the_same(daemon, &state, "k", &expected, |state| {
        std::fs::remove_dir_all(state.join("index")).unwrap();
        ctxd_e2e::copy_dir(&stale, &state.join("index")).unwrap();
    });
    // Resumed, the session is as undoable as live: nothing left to undo.
    assert_eq!(refusal(&mut daemon, "k").0, "nothingToUndo");
}

#[test]
fn two_undos_go_back_two_compactions_and_a_third_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "t");
    daemon.request("ctx/append", json!({"sessionId": "t", "records": example(usize::MAX)[..120]})).unwrap();
    let original = view(&mut daemon, "t");
    let first = daemon.request("ctx/compact", json!({"sessionId": "t"})).unwrap();
    let after_first = view(&mut daemon, "t");
    let second = daemon.request("ctx/compact", json!({"sessionId": "t"})).unwrap();
    assert_ne!(first["boundary"], second["boundary"]);

    let undone = undo(&mut daemon, "t");
    assert_eq!(undone["boundary"], second["boundary"]);
    assert_eq!(undone["usage"]["tokens"], after_first.1["tokens"]);
    assert_eq!(view(&mut daemon, "t"), after_first, "back to the first compaction's view");
    let undone = undo(&mut daemon, "t");
    assert_eq!(undone["boundary"], first["boundary"]);
    assert_eq!(undone["usage"]["tokens"], original.1["tokens"]);
    assert_eq!(view(&mut daemon, "t"), original, "back to the original view");
    assert_eq!(refusal(&mut daemon, "t").0, "nothingToUndo");

    // Resume finds the same view through both undone spans, index or not.
    let daemon = resumes_the_same(daemon, &state, "t", &original, |_| {});
    let mut daemon = resumes_the_same(daemon, &state, "t", &original, |state| {
        std::fs::remove_dir_all(state.join("index")).unwrap();
    });
    assert_eq!(refusal(&mut daemon, "t").0, "nothingToUndo");
}

#[test]
fn appends_after_an_undo_continue_the_restored_view_and_compaction_works_again() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    let records = example(usize::MAX);
    // The same 120 records, once straight and once with a compaction undone after 100.
    open(&mut daemon, "plain");
    daemon.request("ctx/append", json!({"sessionId": "plain", "records": records[..120]})).unwrap();
    open(&mut daemon, "a");
    daemon.request("ctx/append", json!({"sessionId": "a", "records": records[..100]})).unwrap();
    daemon.request("ctx/compact", json!({"sessionId": "a"})).unwrap();
    undo(&mut daemon, "a");
    let appended = daemon.request("ctx/append", json!({"sessionId": "a", "records": records[100..120]})).unwrap();
    assert_eq!(appended["appended"], 20);
    assert_eq!(appended["duplicates"], 0);
    let plain_usage = usage(&mut daemon, "plain");
    assert_eq!(appended["usage"], plain_usage);
    assert_eq!(messages(&mut daemon, "a"), messages(&mut daemon, "plain"));
    // Re-sent records of the restored view are still recognised as duplicates.
    let again = daemon.request("ctx/append", json!({"sessionId": "a", "records": records[90..100]})).unwrap();
    assert_eq!(again["duplicates"], 10);

    let compacted = daemon.request("ctx/compact", json!({"sessionId": "a"})).unwrap();
    assert_eq!(compacted["preTokens"], plain_usage["tokens"]);
    assert!(compacted["postTokens"].as_u64().unwrap() < plain_usage["tokens"].as_u64().unwrap() / 2, "{compacted}");
    let stored = records_of(&state, "a");
    assert_eq!(stored.iter().filter(|r| r["subtype"] == "compact_boundary").count(), 2);
    assert_eq!(stored.iter().filter(|r| r["subtype"] == "ctxd_undo_compact").count(), 1);
    // The new compaction's summary covers the conversation as restored, the records
    // appended after the undo included.
    let last_prompt =
        records[..120].iter().rev().find(|r| r["type"] == "user" && r["message"]["content"].is_string()).unwrap();
    let text = last_prompt["message"]["content"].as_str().unwrap();
    assert!(compacted["summary"].as_str().unwrap().contains(&text[..text.len().min(40)]), "{}", compacted["summary"]);
    let now = view(&mut daemon, "a");
    let mut daemon = resumes_the_same(daemon, &state, "a", &now, |_| {});
    // And that compaction can be undone in turn.
    assert_eq!(undo(&mut daemon, "a")["boundary"], compacted["boundary"]);
    assert_eq!(view(&mut daemon, "a"), view(&mut daemon, "plain"));
}
