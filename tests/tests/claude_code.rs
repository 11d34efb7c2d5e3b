//! Claude Code's own compaction records read faithfully, on the transcript the real
//! program 2.1.332 wrote (`tests/fixtures/transcripts/claude-code-2.1.332/manual-compact.jsonl`): the
//! message its `/compact` kept before the boundary (`preservedSegment`) comes back right
//! after the summary, once, whether the session was imported, resumed after a restart,
//! or appended record by record as a live host would.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::{Daemon, claude_code_fixture, eventually};
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
    positions_of(messages, SUMMARY_START)
}

/// The same, for a summary that starts with `summary_start`.
fn positions_of(messages: &[Value], summary_start: &str) -> (usize, usize) {
    let with = |needle: &str| -> Vec<usize> {
        messages
            .iter()
            .enumerate()
            .filter(|(_, m)| texts(m).iter().any(|t| t.contains(needle)))
            .map(|(i, _)| i)
            .collect()
    };
    let summary = with(summary_start);
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

    let exported = ctxd_e2e::ctxd_command().arg("--state-dir").arg(&state).args(["export", "own"]).output().unwrap();
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

fn claude_home(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    ctxd_e2e::claude_home(dir).unwrap()
}

fn ctxd_claude(dir: &std::path::Path, home: &std::path::Path, args: &[&str]) -> std::process::Output {
    ctxd_e2e::ctxd_claude(dir, home, args).unwrap()
}

#[test]
fn claude_compact_appends_in_the_programs_shapes_and_undo_restores_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (home, path, id) = claude_home(dir.path());
    let original = std::fs::read(&path).unwrap();

    let out = ctxd_claude(dir.path(), &home, &["compact", &id, "--instructions", "the files read"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let after = std::fs::read(&path).unwrap();
    // Appended only: every byte that was there is still there.
    assert_eq!(&after[..original.len()], &original[..]);
    let added: Vec<Value> = std::str::from_utf8(&after[original.len()..])
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(added.len(), 2);
    assert_eq!(added[0]["subtype"], "compact_boundary");
    assert_eq!(added[0]["sessionId"], id.as_str());
    assert_eq!(added[1]["isCompactSummary"], true);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(&format!("at byte {}", original.len())), "{said}");

    // ctxd reads it back as Claude Code would resume it: summary, then the kept reply.
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": CWD, "model": MODEL, "sessionId": "cc", "import": path})).unwrap();
    let request = messages(&mut daemon, "cc");
    let (summary, kept) = positions_of(&request, "This session picks up where an earlier conversation left off");
    assert_eq!(kept, summary + 1);
    daemon.stop().unwrap();

    // A second compaction has nothing new to summarize: refused, nothing written.
    let out = ctxd_claude(dir.path(), &home, &["compact", &id]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to summarize"), "{out:?}");
    assert_eq!(std::fs::read(&path).unwrap(), after);

    // Undo: the file is byte for byte what it was.
    let out = ctxd_claude(dir.path(), &home, &["undo", &id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&path).unwrap(), original);
    // Nothing of ctxd's left to undo.
    let out = ctxd_claude(dir.path(), &home, &["undo", &id]);
    assert!(!out.status.success());
    assert_eq!(std::fs::read(&path).unwrap(), original);
}

#[test]
fn claude_compact_re_attaches_the_sessions_plan() {
    let dir = tempfile::tempdir().unwrap();
    let (home, path, id) = claude_home(dir.path());
    // The program names a session's plan by the slug on its records.
    let text: String = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut r: Value = serde_json::from_str(l).unwrap();
            if r.get("sessionId").is_some() {
                r["slug"] = json!("quiet-proof-plan");
            }
            format!("{r}\n")
        })
        .collect();
    std::fs::write(&path, text).unwrap();
    let plans = home.join(".claude/plans");
    std::fs::create_dir_all(&plans).unwrap();
    std::fs::write(plans.join("quiet-proof-plan.md"), "# Plan\n1. MARKER-PLAN-STEP: split util.py\n").unwrap();

    let out = ctxd_claude(dir.path(), &home, &["compact", &id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let added: Vec<Value> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .rev()
        .take_while(|l| !l.contains("compact_boundary"))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let plan = added.iter().find(|r| r["attachment"]["type"] == "plan_file_reference").expect("a plan attachment");
    assert_eq!(plan["attachment"]["planFilePath"], json!(plans.join("quiet-proof-plan.md")));
    assert!(plan["attachment"]["planContent"].as_str().unwrap().contains("MARKER-PLAN-STEP"));

    // Resumed, the plan is in view once, after the summary.
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": CWD, "model": MODEL, "sessionId": "cc", "import": path})).unwrap();
    let all: String = messages(&mut daemon, "cc").iter().flat_map(texts).collect();
    assert_eq!(all.matches("MARKER-PLAN-STEP").count(), 1, "{all}");
    daemon.stop().unwrap();
}

#[test]
fn claude_compact_leaves_a_transcript_it_cannot_be_sure_of_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let (home, path, id) = claude_home(dir.path());
    let original = std::fs::read(&path).unwrap();
    let refused = |why: &str| {
        let out = ctxd_claude(dir.path(), &home, &["compact", &id]);
        assert!(!out.status.success(), "{why}");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(stderr.contains(why), "{stderr}");
        stderr
    };
    // The program has it open (here: this test process).
    {
        let _open = std::fs::File::open(&path).unwrap();
        refused("has it open");
        assert_eq!(std::fs::read(&path).unwrap(), original);
    }
    // Made read-only by its owner, the file or its folder (checked by mode, so this
    // holds when the test runs as root too).
    use std::os::unix::fs::PermissionsExt;
    let folder = path.parent().unwrap().to_owned();
    for (target, mode, restore) in [(&path, 0o444, 0o644), (&folder, 0o555, 0o755)] {
        std::fs::set_permissions(target, std::fs::Permissions::from_mode(mode)).unwrap();
        refused("read-only");
        std::fs::set_permissions(target, std::fs::Permissions::from_mode(restore)).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), original);
    }
    // A last line still being written.
    let mut torn = original.clone();
    torn.extend_from_slice(br#"{"type":"user","uuid":"x","mess"#);
    std::fs::write(&path, &torn).unwrap();
    refused("incomplete");
    assert_eq!(std::fs::read(&path).unwrap(), torn);
    // The project directory is gone.
    std::fs::write(&path, &original).unwrap();
    std::fs::remove_dir_all(dir.path().join("proj")).unwrap();
    refused("no longer exists");
    assert_eq!(std::fs::read(&path).unwrap(), original);
    // Not Claude Code's.
    std::fs::write(&path, "{\"type\":\"note\",\"text\":\"hello\"}\n").unwrap();
    refused("not a Claude Code transcript");
}

#[test]
fn the_daemon_methods_compact_and_undo_a_claude_code_session() {
    let dir = tempfile::tempdir().unwrap();
    let (_home, path, _id) = claude_home(dir.path());
    let original = std::fs::read(&path).unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let done = daemon.request("ctx/claudeCompact", json!({"transcript": path, "instructions": "files"})).unwrap();
    assert_eq!(done["offset"], original.len() as u64);
    assert_eq!(done["lines"], 2);
    assert_eq!(done["kept"], 1);
    assert_eq!(done["sessionId"], "b7d55388-c9ad-4169-a8d1-459fc6bdb46f");
    assert!(done["postTokens"].as_u64().unwrap() > 0);
    let undone = daemon.request("ctx/claudeUndo", json!({"transcript": path})).unwrap();
    assert_eq!(undone["offset"], original.len() as u64);
    assert_eq!(std::fs::read(&path).unwrap(), original);
    let error = daemon.request_error("ctx/claudeUndo", json!({"transcript": path})).unwrap();
    assert_eq!(error["code"], -33010, "{error}");
    let error = daemon.request_error("ctx/claudeCompact", json!({})).unwrap();
    assert_eq!(error["code"], -32602, "{error}");
}

#[test]
fn an_idle_observed_session_is_compacted_in_place_unless_it_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let (_home, path, _id) = claude_home(dir.path());
    let original = std::fs::read(&path).unwrap();
    let held = dir.path().join("held.jsonl");
    std::fs::write(&held, &original).unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::start_with(&state, &[], &[]).unwrap();
    // Idle after one second, worth it from 1 % of the threshold (the session holds ~13k
    // of claude-opus-5-5's 967k).
    let settings =
        json!({"claudeIdleCompaction": true, "claudeIdleCompactAfterSeconds": 1, "claudeIdleCompactPercent": 1});
    daemon.request("initialize", json!({"capabilities": {}, "initializationOptions": {"settings": settings}})).unwrap();
    daemon.notify("initialized", json!({})).unwrap();
    let _open = std::fs::File::open(&held).unwrap();
    daemon.request("ctx/observe", json!({"transcript": held})).unwrap();
    let observed = daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    let id = observed["sessionId"].as_str().unwrap().to_owned();
    let before = observed["usage"]["tokens"].as_u64().unwrap();

    // Watched by its length: reading it would hold it open, and the daemon leaves alone a
    // transcript another process has open at the moment it looks.
    eventually(30, "the idle session was not compacted", || {
        std::fs::metadata(&path).unwrap().len() > original.len() as u64
    });
    assert!(std::fs::read_to_string(&path).unwrap().lines().any(|l| l.contains("\"compact_boundary\"")));
    let after = std::fs::read(&path).unwrap();
    assert_eq!(&after[..original.len()], &original[..], "appended only");
    // The daemon follows its own records like the program's: the boundary restarts the count.
    let pushed = daemon
        .wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == id.as_str() && p["usage"]["tokens"].as_u64().unwrap() < before
        })
        .unwrap();
    assert!(pushed["usage"]["tokens"].as_u64().unwrap() < before);

    // The one a process holds open is left as it was, and the log says why.
    let log = state.with_extension("log");
    eventually(30, "no refusal logged", || {
        std::fs::read_to_string(&log).unwrap_or_default().contains("claude compact refused")
    });
    assert_eq!(std::fs::read(&held).unwrap(), original);
}

#[test]
fn idle_compaction_switched_on_later_reaches_a_session_observed_before() {
    let dir = tempfile::tempdir().unwrap();
    let (_home, path, _id) = claude_home(dir.path());
    let original = std::fs::read(&path).unwrap();
    let mut daemon = Daemon::start_with(&dir.path().join("state"), &[], &[]).unwrap();
    // Idle after one second and worth it from 1 %, with the switch left at its default.
    let timing = json!({"claudeIdleCompactAfterSeconds": 1, "claudeIdleCompactPercent": 1});
    daemon.request("initialize", json!({"capabilities": {}, "initializationOptions": {"settings": timing}})).unwrap();
    daemon.notify("initialized", json!({})).unwrap();
    // The answer comes once the follower holds its policy and its idle clock runs. Off
    // by default: over three idle periods after it, the session stays as it was and
    // the log says of no idle spell.
    daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(std::fs::read(&path).unwrap(), original);
    let log = std::fs::read_to_string(daemon.log_path()).unwrap();
    assert!(!log.contains("observed Claude Code session idle"), "{log}");
    // The editor's switch, flipped while the session is observed.
    let idle = json!({"claudeIdleCompaction": true, "claudeIdleCompactAfterSeconds": 1, "claudeIdleCompactPercent": 1});
    daemon.notify("workspace/didChangeConfiguration", json!({"settings": idle})).unwrap();
    eventually(30, "the idle session was not compacted after the switch", || {
        std::fs::metadata(&path).unwrap().len() > original.len() as u64
    });
    let after = std::fs::read(&path).unwrap();
    assert_eq!(&after[..original.len()], &original[..], "appended only");
}

#[test]
fn an_observed_session_right_after_the_programs_compact_shows_its_post_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("observed.jsonl");
    let lines: Vec<String> = fixture_lines().iter().map(|r| r.to_string()).collect();
    // Cut right after the program's /compact (boundary postTokens 3,011).
    std::fs::write(&path, format!("{}\n", lines[..79].join("\n"))).unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let observed = daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    assert_eq!(observed["usage"]["tokens"], 3_011, "{observed}");
    // Claude Code auto-compacts claude-opus-5-5: the figure stands.
    assert_eq!(observed["usage"]["autoCompactEnabled"], true, "{observed}");
    let id = observed["sessionId"].as_str().unwrap().to_owned();
    // The turn after it reports its own usage: that is the figure from then on.
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(format!("{}\n", lines[79..].join("\n")).as_bytes()).unwrap();
    daemon
        .wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == id.as_str() && p["usage"]["reportedTokens"] == 13_950
        })
        .unwrap();
}

// In-place compaction through the configured provider: the local stub (`ctxd_e2e::stub`)
// speaks the Messages API over real HTTP.

use ctxd_e2e::stub::{serve, sse_text};
use std::sync::atomic::{AtomicBool, Ordering};

const KEY_VAR: &str = "CTXD_TEST_API_KEY";
const REMOTE_SUMMARY: &str = "<analysis>draft</analysis><summary>1. Primary Request and Intent:\n   REMOTE-SUMMARY of the files read.\n</summary>";
/// The user messages of the captured session up to its `/compact`.
const USER_MESSAGES: [&str; 2] = ["Please read the app and util files", "What does util.py export?"];

fn remote_summary(_: &str) -> (u16, String) {
    sse_text(REMOTE_SUMMARY)
}

/// A daemon whose settings for the session's project (`<dir>/proj`, trusted) choose the
/// Anthropic provider at `port`.
fn daemon_with_provider(dir: &std::path::Path, port: u16) -> Daemon {
    daemon_with_provider_and(dir, port, json!({}))
}

/// The same, with `client` as the client's settings (`initializationOptions.settings`).
fn daemon_with_provider_and(dir: &std::path::Path, port: u16, client: Value) -> Daemon {
    let state = dir.join("state");
    let project = dir.join("proj");
    std::fs::create_dir_all(project.join(".ctxd")).unwrap();
    let settings =
        json!({"provider": "anthropic", "baseUrl": format!("http://127.0.0.1:{port}"), "apiKeyEnv": KEY_VAR});
    std::fs::write(project.join(".ctxd/settings.json"), settings.to_string()).unwrap();
    ctxd_e2e::trust_folder(&state, &project).unwrap();
    let mut daemon = Daemon::start_with(&state, &[], &[(KEY_VAR, "sk-test-key")]).unwrap();
    daemon.request("initialize", json!({"capabilities": {}, "initializationOptions": {"settings": client}})).unwrap();
    daemon.notify("initialized", json!({})).unwrap();
    daemon
}

/// The lines appended to the transcript since it was `original`.
fn appended(path: &std::path::Path, original: &[u8]) -> Vec<Value> {
    let after = std::fs::read(path).unwrap();
    assert_eq!(&after[..original.len()], original, "appended only");
    std::str::from_utf8(&after[original.len()..]).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn summary_text(added: &[Value]) -> String {
    assert_eq!(added[0]["subtype"], "compact_boundary", "{added:#?}");
    assert_eq!(added[1]["isCompactSummary"], true, "{added:#?}");
    added[1]["message"]["content"].as_str().unwrap().to_owned()
}

#[test]
fn claude_compact_through_the_provider_installs_its_summary_in_the_programs_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let (_home, path, id) = claude_home(dir.path());
    let original = std::fs::read(&path).unwrap();
    let (port, seen) = serve(remote_summary);
    let mut daemon = daemon_with_provider(dir.path(), port);
    let done = daemon.request("ctx/claudeCompact", json!({"transcript": path, "instructions": "the files"})).unwrap();
    assert_eq!(done["summarizer"], "anthropic", "{done}");
    assert!(done.get("problems").is_none(), "{done}");
    assert_eq!(done["offset"], original.len() as u64);
    assert_eq!(done["kept"], 1);

    let added = appended(&path, &original);
    assert_eq!(added.len() as u64, done["lines"].as_u64().unwrap());
    assert_eq!(added[0]["sessionId"], id.as_str());
    assert_eq!(added[0]["compactMetadata"]["preservedSegment"]["anchorUuid"], added[1]["uuid"]);
    let text = summary_text(&added);
    assert!(text.contains("REMOTE-SUMMARY of the files read"), "the provider's summary: {text}");
    assert!(!text.contains("<analysis>"), "the draft is not installed: {text}");

    // One summary request (the plain one: no host request to fork), with the key, the
    // session's user messages and the focus.
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let (headers, body) = &seen[0];
    assert!(headers.to_ascii_lowercase().contains("x-api-key: sk-test-key"), "{headers}");
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["stream"], true);
    assert_eq!(body["model"], MODEL, "the session's model");
    let asked = body["messages"].to_string();
    for prompt in USER_MESSAGES {
        assert!(asked.contains(prompt), "{prompt} is in the summary request: {asked}");
    }
    assert!(asked.contains("the files"), "the focus is asked for");
    assert!(!asked.contains(KEPT), "the kept reply is not summarized");
    drop(seen);

    // ctxd reads it back as Claude Code resumes it: the summary, then the kept reply.
    daemon.request("ctx/openSession", json!({"cwd": CWD, "model": MODEL, "sessionId": "cc", "import": path})).unwrap();
    let request = messages(&mut daemon, "cc");
    let (summary, kept) = positions_of(&request, "REMOTE-SUMMARY");
    assert_eq!(kept, summary + 1);
}

fn overloaded(_: &str) -> (u16, String) {
    (529, json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}).to_string())
}

fn server_error(_: &str) -> (u16, String) {
    (500, json!({"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}).to_string())
}

/// A stream that stops in the middle of the summary, without `message_stop`.
fn cut_stream(_: &str) -> (u16, String) {
    let (status, whole) = sse_text(REMOTE_SUMMARY);
    let cut = whole.find("content_block_stop").unwrap();
    (status, whole[..cut].to_owned())
}

#[test]
fn claude_compact_falls_back_to_the_offline_summary_when_the_provider_fails() {
    for (respond, why) in
        [(overloaded as fn(&str) -> (u16, String), "529"), (server_error, "500"), (cut_stream, "cut stream")]
    {
        let dir = tempfile::tempdir().unwrap();
        let (_home, path, _id) = claude_home(dir.path());
        let original = std::fs::read(&path).unwrap();
        let (port, seen) = serve(respond);
        let mut daemon = daemon_with_provider(dir.path(), port);
        let done = daemon.request("ctx/claudeCompact", json!({"transcript": path})).unwrap();
        assert!(!seen.lock().unwrap().is_empty(), "{why}: the provider was asked");
        assert_eq!(done["summarizer"], "offline", "{why}: {done}");
        let problems = done["problems"].to_string();
        assert!(problems.contains("anthropic could not write the summary"), "{why}: {problems}");
        assert!(problems.contains("offline summarizer"), "{why}: {problems}");
        // The offline summary is installed, holding every user message; nothing lost.
        let text = summary_text(&appended(&path, &original));
        assert!(!text.contains("REMOTE-SUMMARY"), "{why}: {text}");
        for prompt in USER_MESSAGES {
            assert!(text.contains(prompt), "{why}: {prompt} is in the offline summary: {text}");
        }
        let log = std::fs::read_to_string(dir.path().join("state.log")).unwrap();
        assert!(log.contains("the offline summarizer writes the summary"), "{why}: logged");
        daemon.stop().unwrap();
    }
}

/// Set by [`held_summary`] when the request arrives; the test sets [`RELEASE`] to let
/// the reply go. Used by one test only.
static ASKED: AtomicBool = AtomicBool::new(false);
static RELEASE: AtomicBool = AtomicBool::new(false);

fn held_summary(_: &str) -> (u16, String) {
    ASKED.store(true, Ordering::SeqCst);
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !RELEASE.load(Ordering::SeqCst) && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    sse_text(REMOTE_SUMMARY)
}

#[test]
fn a_transcript_written_to_while_the_provider_summarizes_is_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let (_home, path, _id) = claude_home(dir.path());
    let (port, seen) = serve(held_summary);
    let mut daemon = daemon_with_provider(dir.path(), port);
    let asked = daemon.send_request("ctx/claudeCompact", json!({"transcript": path})).unwrap();
    eventually(30, "the provider was never asked", || ASKED.load(Ordering::SeqCst));
    // The program writes a turn while the summary is being written (the file is closed
    // again at once, as the program's appends are between turns).
    let turn = fixture_lines()[57].to_string();
    {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        writeln!(file, "{turn}").unwrap();
    }
    let written = std::fs::read(&path).unwrap();
    // The daemon answers other requests while this one waits on the provider.
    let other = daemon.request_error("ctx/claudeCompact", json!({})).unwrap();
    assert_eq!(other["code"], -32602, "{other}");
    RELEASE.store(true, Ordering::SeqCst);
    let answer = daemon.response(asked).unwrap();
    let error = &answer["error"];
    assert_eq!(error["code"], -33009, "{answer}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("changed while the summary was being written"), "{message}");
    assert!(message.contains("nothing was written"), "{message}");
    assert_eq!(std::fs::read(&path).unwrap(), written, "the transcript is as the program left it");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[test]
fn the_command_uses_the_configured_provider_unless_told_offline() {
    let dir = tempfile::tempdir().unwrap();
    let (home, path, id) = claude_home(dir.path());
    let original = std::fs::read(&path).unwrap();
    let (port, seen) = serve(remote_summary);
    // The user's own ctxd settings choose the provider.
    let config = home.join(".config/ctxd");
    std::fs::create_dir_all(&config).unwrap();
    let settings =
        json!({"provider": "anthropic", "baseUrl": format!("http://127.0.0.1:{port}"), "apiKeyEnv": KEY_VAR});
    std::fs::write(config.join("settings.json"), settings.to_string()).unwrap();
    let run = |args: &[&str]| {
        ctxd_e2e::ctxd_command()
            .arg("--state-dir")
            .arg(dir.path().join("cli-state"))
            .arg("claude")
            .args(args)
            .env("HOME", &home)
            .env(KEY_VAR, "sk-test-key")
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CLAUDE_CONFIG_DIR")
            .env_remove("ANTHROPIC_API_KEY")
            .output()
            .unwrap()
    };

    // --offline: no HTTP call at all.
    let out = run(&["compact", &id, "--offline"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("summary by offline"), "{said}");
    assert!(!said.contains("note:"), "{said}");
    assert!(seen.lock().unwrap().is_empty(), "no request with --offline");
    assert!(!summary_text(&appended(&path, &original)).contains("REMOTE-SUMMARY"));
    let out = run(&["undo", &id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&path).unwrap(), original);

    // Without it: the provider writes the summary.
    let out = run(&["compact", &id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("summary by anthropic"), "{said}");
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert!(summary_text(&appended(&path, &original)).contains("REMOTE-SUMMARY"));
}

#[test]
fn an_idle_observed_session_is_compacted_through_the_provider() {
    let dir = tempfile::tempdir().unwrap();
    let (_home, path, _id) = claude_home(dir.path());
    let original = std::fs::read(&path).unwrap();
    let (port, seen) = serve(remote_summary);
    let idle = json!({"claudeIdleCompaction": true, "claudeIdleCompactAfterSeconds": 1, "claudeIdleCompactPercent": 1});
    let mut daemon = daemon_with_provider_and(dir.path(), port, idle);
    daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    // The whole install: it is one write, which a read may meet halfway; the boundary
    // counts its lines.
    eventually(30, "the idle session was not compacted", || {
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let Some(at) = lines.iter().rposition(|l| l.contains("\"compact_boundary\"")) else { return false };
        let boundary: Value = serde_json::from_str(lines[at]).unwrap();
        text.ends_with('\n') && boundary["compactMetadata"]["ctxdBatch"] == json!(lines.len() - at)
    });
    let text = summary_text(&appended(&path, &original));
    assert!(text.contains("REMOTE-SUMMARY"), "{text}");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

/// Too long while the session's first request is in it; the summary once the oldest
/// rounds are cut.
fn too_long_with_the_first_prompt(body: &str) -> (u16, String) {
    if body.contains(USER_MESSAGES[0]) {
        let error = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "prompt is too long: 1012345 tokens > 1000000 maximum"}});
        return (400, error.to_string());
    }
    sse_text(REMOTE_SUMMARY)
}

#[test]
fn a_summary_request_too_long_is_cut_and_the_dropped_prompt_still_reaches_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let (_home, path, _id) = claude_home(dir.path());
    let original = std::fs::read(&path).unwrap();
    let (port, seen) = serve(too_long_with_the_first_prompt);
    let mut daemon = daemon_with_provider(dir.path(), port);
    let done = daemon.request("ctx/claudeCompact", json!({"transcript": path})).unwrap();
    assert_eq!(done["summarizer"], "anthropic", "{done}");
    let seen = seen.lock().unwrap();
    assert!(seen.len() >= 2, "asked again after the cut: {}", seen.len());
    assert!(!seen.last().unwrap().1.contains(USER_MESSAGES[0]), "the oldest round was cut");
    // The fidelity check puts the cut prompt back into the provider's summary.
    let text = summary_text(&appended(&path, &original));
    assert!(text.contains("REMOTE-SUMMARY"), "{text}");
    for prompt in USER_MESSAGES {
        assert!(text.contains(prompt), "{prompt}: {text}");
    }
}
