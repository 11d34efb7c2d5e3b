//! Claude Code's own compaction records read faithfully, on the transcript the real
//! program 2.1.332 wrote (`tests/fixtures/claude-code/manual-compact.jsonl`): the
//! message its `/compact` kept before the boundary (`preservedSegment`) comes back right
//! after the summary, once, whether the session was imported, resumed after a restart,
//! or appended record by record as a live host would.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::{Daemon, claude_code_fixture};
use serde_json::{Value, json};

const MODEL: &str = "claude-opus-5-5";
const CWD: &str = "/home/dev/proj";
/// The reply `/compact` kept (the boundary's preservedSegment head and tail).
const KEPT: &str = "STUB reply #7 (messages=12). Done.";
const SUMMARY_START: &str = "This session is being continued from a previous conversation";

fn fixture_lines() -> Vec<Value> {
    let text = std::fs::read_to_string(claude_code_fixture("manual-compact.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn messages(daemon: &mut Daemon, id: &str) -> Vec<Value> {
    let tools = json!([{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}]);
    let answer = daemon.request("ctx/assemble", json!({"sessionId": id, "maxTokens": 8000, "tools": tools})).unwrap();
    answer["request"]["messages"].as_array().unwrap().clone()
}

/// Every text of a message, in order.
fn texts(message: &Value) -> Vec<String> {
    match &message["content"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str().map(str::to_owned)).collect(),
        _ => Vec::new(),
    }
}

/// Where the summary and the kept reply stand in the request; each must be there once.
fn positions(messages: &[Value]) -> (usize, usize) {
    let with = |needle: &str| -> Vec<usize> {
        messages
            .iter()
            .enumerate()
            .filter(|(_, m)| texts(m).iter().any(|t| t.contains(needle)))
            .map(|(i, _)| i)
            .collect()
    };
    let summary = with(SUMMARY_START);
    let kept = with(KEPT);
    assert_eq!(summary.len(), 1, "the summary once: {messages:#?}");
    assert_eq!(kept.len(), 1, "the kept reply once: {messages:#?}");
    (summary[0], kept[0])
}

fn check(messages: &[Value]) {
    let (summary, kept) = positions(messages);
    // As the program sent it: the kept reply is the next message after the summary.
    assert_eq!(kept, summary + 1, "{messages:#?}");
    assert_eq!(messages[kept]["role"], "assistant");
    // Nothing else from before the boundary.
    let all: String = messages.iter().flat_map(texts).collect();
    assert!(!all.contains("STUB reply #3"), "a summarized reply came back");
    assert!(all.contains("STUB reply #11"), "the turn after the compaction is there");
}

#[test]
fn imported_resumed_and_live_sessions_keep_the_preserved_reply() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let source = claude_code_fixture("manual-compact.jsonl");
    let imported = {
        let mut daemon = Daemon::started(&state).unwrap();
        let opened = daemon
            .request("ctx/openSession", json!({"cwd": CWD, "model": MODEL, "sessionId": "imp", "import": source}))
            .unwrap();
        assert_eq!(opened["records"], 105);
        let imported = messages(&mut daemon, "imp");
        check(&imported);
        imported
    };
    // A new daemon resumes from the boundary the index names: the reply lies before it.
    let mut daemon = Daemon::started(&state).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": CWD, "model": MODEL, "sessionId": "imp"})).unwrap();
    let resumed = messages(&mut daemon, "imp");
    assert_eq!(resumed, imported);

    // The same records appended one request at a time, the boundary among them.
    daemon.request("ctx/openSession", json!({"cwd": CWD, "model": MODEL, "sessionId": "live"})).unwrap();
    for chunk in fixture_lines().chunks(7) {
        daemon.request("ctx/append", json!({"sessionId": "live", "records": chunk})).unwrap();
    }
    let live = messages(&mut daemon, "live");
    assert_eq!(live, imported);
}

#[test]
fn a_compaction_between_a_tool_call_and_its_result_keeps_the_round() {
    // Built from the captured records: the boundary now keeps the whole last tool round
    // of the first turn (the tool_use reply and its result), as an automatic compaction
    // that runs mid-turn does, and the session goes on from that result.
    let lines = fixture_lines();
    let uuid = |i: usize| lines[i]["uuid"].as_str().unwrap().to_owned();
    // Lines 27..=29 (1-based): "step 2" text, its Read tool_use, the tool_result.
    let (head, tail) = (uuid(26), uuid(28));
    let mut records: Vec<Value> = lines[..29].to_vec();
    let boundary = json!({
        "parentUuid": null, "logicalParentUuid": tail, "isSidechain": false, "type": "system",
        "subtype": "compact_boundary", "content": "Conversation compacted", "isMeta": false,
        "timestamp": "2026-11-29T21:19:52.000Z", "uuid": "mid-boundary", "level": "info",
        "compactMetadata": {"trigger": "auto", "preTokens": 170_000, "postTokens": 9_000,
            "preservedSegment": {"headUuid": head, "anchorUuid": "mid-summary", "tailUuid": tail},
            "preservedMessages": {"anchorUuid": "mid-summary", "uuids": [head, uuid(27), tail], "allUuids": [head, uuid(27), tail]}},
        "sessionId": "b7d55388-c9ad-4169-a8d1-459fc6bdb46f", "cwd": CWD, "version": "2.1.332",
    });
    let summary = json!({
        "parentUuid": "mid-boundary", "isSidechain": false, "type": "user", "isCompactSummary": true,
        "isVisibleInTranscriptOnly": true, "uuid": "mid-summary", "timestamp": "2026-11-29T21:19:52.001Z",
        "message": {"role": "user", "content": format!("{SUMMARY_START}. The user asked to read two files.")},
    });
    records.push(boundary);
    records.push(summary);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mid.jsonl");
    let text: String = records.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(&path, text).unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": CWD, "model": MODEL, "sessionId": "mid", "import": path})).unwrap();
    let messages = messages(&mut daemon, "mid");
    // Summary, then the kept round: the reply that called Read, and the Read's result.
    let at = messages.iter().position(|m| texts(m).iter().any(|t| t.contains(SUMMARY_START))).unwrap();
    let round = &messages[at + 1..];
    assert_eq!(round.len(), 2, "{messages:#?}");
    assert_eq!(round[0]["role"], "assistant");
    let call = round[0]["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_use").unwrap();
    assert!(texts(&round[0]).iter().any(|t| t.contains("step 2")), "{round:#?}");
    let result = round[1]["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_result").unwrap();
    assert_eq!(result["tool_use_id"], call["id"]);
    // The first Read round was summarized.
    let all: String = messages.iter().flat_map(texts).collect();
    assert!(!all.contains("step 1"), "{messages:#?}");
}

/// ctxd's own compaction, exported for Claude Code and imported back: the kept messages
/// are referenced from the boundary where they stand (as the program's own boundaries
/// do), never also copied, so each message is in the file once and in the request once.
#[test]
fn ctxds_own_compaction_keeps_each_message_once_through_export_and_import() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": CWD, "model": MODEL, "sessionId": "own"})).unwrap();
    let lines = fixture_lines();
    // The captured session up to the turn before its own /compact: it ends with a reply.
    daemon.request("ctx/append", json!({"sessionId": "own", "records": &lines[..57]})).unwrap();
    daemon.request("ctx/compact", json!({"sessionId": "own"})).unwrap();
    let live = messages(&mut daemon, "own");
    let all: String = live.iter().flat_map(texts).collect();
    assert_eq!(all.matches(KEPT).count(), 1, "{live:#?}");
    daemon.stop().unwrap();

    let exported = std::process::Command::new(ctxd_e2e::ctxd_bin())
        .arg("--state-dir")
        .arg(&state)
        .args(["export", "own"])
        .output()
        .unwrap();
    assert!(exported.status.success());
    let text = String::from_utf8(exported.stdout).unwrap();
    let records: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let boundary = records.iter().rposition(|r| r["subtype"] == "compact_boundary").unwrap();
    let metadata = &records[boundary]["compactMetadata"];
    // Claude Code's shape: the segment and the list, anchored to the summary after it.
    let summary = &records[boundary + 1];
    assert_eq!(summary["isCompactSummary"], true);
    assert_eq!(metadata["preservedSegment"]["anchorUuid"], summary["uuid"]);
    let kept: Vec<&str> =
        metadata["preservedMessages"]["uuids"].as_array().unwrap().iter().map(|u| u.as_str().unwrap()).collect();
    assert!(!kept.is_empty());
    for uuid in &kept {
        let at: Vec<usize> = records.iter().enumerate().filter(|(_, r)| r["uuid"] == *uuid).map(|(i, _)| i).collect();
        assert_eq!(at.len(), 1, "{uuid} once in the export");
        assert!(at[0] < boundary, "{uuid} stands before the boundary");
    }
    assert!(!text.contains("ctxdKeptFrom"), "nothing copied");
    // Every uuid once.
    let mut uuids: Vec<&str> = records.iter().filter_map(|r| r["uuid"].as_str()).collect();
    let n = uuids.len();
    uuids.sort_unstable();
    uuids.dedup();
    assert_eq!(uuids.len(), n, "a uuid written twice");

    // Imported back (as a Claude Code transcript now): the same request.
    let path = dir.path().join("exported.jsonl");
    std::fs::write(&path, &text).unwrap();
    let mut daemon = Daemon::started(&state).unwrap();
    daemon
        .request("ctx/openSession", json!({"cwd": CWD, "model": MODEL, "sessionId": "back", "import": path}))
        .unwrap();
    let back = messages(&mut daemon, "back");
    assert_eq!(back.len(), live.len());
    let all: String = back.iter().flat_map(texts).collect();
    assert_eq!(all.matches(KEPT).count(), 1, "{back:#?}");
}
