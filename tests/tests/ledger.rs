//! The file-read ledger over real pipes: reads from Read tool results and explicit
//! `ctx/fileRead`, re-reads told apart, and the ledger surviving restarts and index loss.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::{Daemon, user_record};
use serde_json::{Value, json};

fn read_result(uuid: &str, path: &str, content: &str) -> Value {
    let lines = content.lines().count();
    json!({
        "type": "user", "uuid": uuid, "parentUuid": null, "timestamp": "2026-11-29T10:00:00.000Z",
        "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{uuid}"), "content": content}]},
        "toolUseResult": {"type": "text", "file": {"filePath": path, "content": content, "numLines": lines, "startLine": 1, "totalLines": lines}}
    })
}

fn file_read(daemon: &mut Daemon, session: &str, path: &std::path::Path) -> Value {
    daemon.request("ctx/fileRead", json!({"sessionId": session, "path": path})).unwrap()
}

#[test]
fn read_results_and_explicit_reads_share_one_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("main.rs");
    std::fs::write(&file, "fn main() {}\n").unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon
        .request("ctx/openSession", json!({"cwd": dir.path(), "model": "claude-sonnet-4-5", "sessionId": "s"}))
        .unwrap();
    let records = json!([read_result("r1", file.to_str().unwrap(), "fn main() {}\n")]);
    daemon.request("ctx/append", json!({"sessionId": "s", "records": records})).unwrap();

    let again = file_read(&mut daemon, "s", &file);
    assert_eq!(again["alreadyRead"], true);
    assert_eq!(again["unchanged"], true, "{again}");
    assert_eq!(again["reads"], 2);

    std::fs::write(&file, "fn main() { println!(\"hi\"); }\n").unwrap();
    let changed = file_read(&mut daemon, "s", &file);
    assert_eq!(changed["alreadyRead"], true);
    assert_eq!(changed["unchanged"], false);

    let other = dir.path().join("lib.rs");
    std::fs::write(&other, "a\nb\nc\nd\n").unwrap();
    let range = daemon
        .request("ctx/fileRead", json!({"sessionId": "s", "path": other, "startLine": 2, "numLines": 2}))
        .unwrap();
    assert_eq!(range["alreadyRead"], false);
    assert_eq!(
        (range["startLine"].as_u64(), range["numLines"].as_u64(), range["totalLines"].as_u64()),
        (Some(2), Some(2), Some(4))
    );

    let error = daemon.request_error("ctx/fileRead", json!({"sessionId": "s", "path": "relative.rs"})).unwrap();
    assert_eq!(error["code"], -32602);
    let error =
        daemon.request_error("ctx/fileRead", json!({"sessionId": "s", "path": dir.path().join("missing.rs")})).unwrap();
    assert_eq!(error["code"], -32602);
    assert!(error["message"].as_str().unwrap().contains("missing.rs"), "{error}");
}

#[test]
fn the_ledger_survives_a_crash_and_a_lost_index() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let file = dir.path().join("notes.md");
    std::fs::write(&file, "# notes\n").unwrap();
    let mut daemon = Daemon::started(&state).unwrap();
    daemon
        .request("ctx/openSession", json!({"cwd": dir.path(), "model": "claude-sonnet-4-5", "sessionId": "s"}))
        .unwrap();
    file_read(&mut daemon, "s", &file);
    // A compaction boundary puts the read before what resume loads.
    let boundary = json!({"type": "system", "subtype": "compact_boundary", "uuid": "b1", "parentUuid": null,
                          "compactMetadata": {"trigger": "manual", "preTokens": 1000}});
    let records = json!([boundary, user_record("u1", Some("b1"), "after")]);
    daemon.request("ctx/append", json!({"sessionId": "s", "records": records})).unwrap();
    daemon.kill9().unwrap();
    // Two copies of the store as the crash left it: one keeps its index, one loses it
    // (so the read, before the boundary, must be found by scanning the transcript).
    let copy = dir.path().join("copy");
    ctxd_e2e::copy_dir(&state, &copy).unwrap();
    std::fs::remove_dir_all(copy.join("index")).unwrap();

    for (store, lose_index) in [(&state, false), (&copy, true)] {
        let mut daemon = Daemon::started(store).unwrap();
        daemon
            .request("ctx/openSession", json!({"cwd": dir.path(), "model": "claude-sonnet-4-5", "sessionId": "s"}))
            .unwrap();
        let again = file_read(&mut daemon, "s", &file);
        assert_eq!(again["alreadyRead"], true, "lose_index={lose_index}: {again}");
        assert_eq!(again["unchanged"], true, "lose_index={lose_index}: {again}");
        daemon.stop().unwrap();
    }
}

#[test]
fn reads_before_a_compaction_survive_a_restart_after_it() {
    // The index learns of reads only when a boundary puts them out of the view, so this
    // checks that an installed compaction wrote them, and that a second compaction adds
    // the reads since. (A clean stop: after a crash the index may not have been written
    // at all, and a scan of the transcript finds the reads, as the test above shows.)
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let files: Vec<std::path::PathBuf> = (0..4).map(|i| dir.path().join(format!("f{i}.rs"))).collect();
    for (i, file) in files.iter().enumerate() {
        std::fs::write(file, format!("fn f{i}() {{}}\n")).unwrap();
    }
    let mut daemon = Daemon::started(&state).unwrap();
    daemon
        .request("ctx/openSession", json!({"cwd": dir.path(), "model": "claude-sonnet-4-5", "sessionId": "s"}))
        .unwrap();
    let conversation = |n: usize, read: &std::path::Path| {
        let path = read.to_str().unwrap();
        let content = std::fs::read_to_string(read).unwrap();
        json!([
            user_record(&format!("u{n}"), None, &format!("please look at {path}")),
            read_result(&format!("r{n}"), path, &content)
        ])
    };
    for (n, file) in files[..2].iter().enumerate() {
        daemon.request("ctx/append", json!({"sessionId": "s", "records": conversation(n, file)})).unwrap();
    }
    daemon.request("ctx/compact", json!({"sessionId": "s"})).unwrap();
    daemon.request("ctx/append", json!({"sessionId": "s", "records": conversation(2, &files[2])})).unwrap();
    daemon.request("ctx/compact", json!({"sessionId": "s"})).unwrap();
    daemon.request("ctx/append", json!({"sessionId": "s", "records": [user_record("u9", None, "and now?")]})).unwrap();
    daemon.stop().unwrap();

    let mut daemon = Daemon::started(&state).unwrap();
    daemon
        .request("ctx/openSession", json!({"cwd": dir.path(), "model": "claude-sonnet-4-5", "sessionId": "s"}))
        .unwrap();
    for file in &files[..3] {
        let again = file_read(&mut daemon, "s", file);
        assert_eq!(again["alreadyRead"], true, "{}: {again}", file.display());
    }
    let never = file_read(&mut daemon, "s", &files[3]);
    assert_eq!(never["alreadyRead"], false, "{never}");
    daemon.stop().unwrap();
}
