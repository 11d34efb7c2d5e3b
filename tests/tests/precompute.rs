//! Precomputed compaction over real pipes, with the offline summarizer: a session that
//! passes the precompute start (four fifths of the window, or the threshold if that comes
//! first) gets a summary prepared in the background; at the threshold that summary is
//! installed with every record appended since kept after it, with no summary written on
//! the critical path. A prepared summary that would leave too little room is dropped for
//! a normal compaction. Every message such an install keeps (a tool round, a parentless
//! note, replies and prompts appended after the preparation) reaches the next assembled
//! request exactly once, in order; a prompt the user took back meanwhile is not kept.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::time::{Duration, Instant};

use ctxd_e2e::{Daemon, stored_uuids, user_record};
use serde_json::{Value, json};

/// A 200,000-token model: threshold 167,000, precompute start 160,000.
const MODEL: &str = "claude-sonnet-4-5-20250929";
const PRECOMPUTE_START: u64 = 160_000;

/// About `tokens` tokens of varied prose (the estimate counts bytes).
fn text(n: usize, tokens: usize) -> String {
    let words = ["parser", "ledger", "window", "summary", "boundary", "watcher", "request", "session"];
    let mut out = format!("Step {n}: ");
    while out.len() < tokens * 4 {
        out.push_str(words[out.len() % words.len()]);
        out.push(' ');
    }
    out
}

struct Session {
    daemon: Daemon,
    next: usize,
    last: Option<String>,
    sent: Vec<String>,
}

impl Session {
    fn open(state: &std::path::Path) -> (Session, u64) {
        let mut daemon = Daemon::started(state).unwrap();
        let cwd = tempfile::tempdir().unwrap().keep();
        let opened = daemon.request("ctx/openSession", json!({"cwd": cwd, "model": MODEL, "sessionId": "p"})).unwrap();
        let threshold = opened["usage"]["threshold"].as_u64().unwrap();
        (Session { daemon, next: 0, last: None, sent: Vec::new() }, threshold)
    }

    /// Appends one user record of about `tokens` tokens; returns the usage after it.
    fn append(&mut self, tokens: usize) -> Value {
        let uuid = format!("u{}", self.next);
        let record = user_record(&uuid, self.last.as_deref(), &text(self.next, tokens));
        self.next += 1;
        self.last = Some(uuid.clone());
        self.sent.push(uuid);
        self.daemon.request("ctx/append", json!({"sessionId": "p", "records": [record]})).unwrap()["usage"].clone()
    }

    fn prepared_ahead(&mut self) -> Option<u64> {
        self.daemon.request("ctx/context", json!({"sessionId": "p"})).unwrap()["preparedAhead"].as_u64()
    }

    fn wait_prepared(&mut self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(tokens) = self.prepared_ahead() {
                return tokens;
            }
            assert!(Instant::now() < deadline, "no summary was prepared ahead");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Appends records of `step` tokens until the usage reaches `tokens`.
    fn fill_to(&mut self, tokens: u64, step: usize) -> u64 {
        loop {
            let now = self.append(step)["tokens"].as_u64().unwrap();
            if now >= tokens {
                return now;
            }
        }
    }
}

#[test]
fn a_summary_prepared_ahead_is_installed_at_the_threshold_with_what_came_since() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (mut s, threshold) = Session::open(&state);
    assert_eq!(threshold, 167_000);
    // Below the precompute start nothing is prepared.
    s.fill_to(150_000, 4_000);
    assert_eq!(s.prepared_ahead(), None, "prepared before the precompute start");
    // Past it, a summary is prepared in the background; the session is not shown as
    // compacting meanwhile and nothing is written to the transcript.
    let stored_before = stored_uuids(&state, "p").unwrap().len();
    let at = s.fill_to(PRECOMPUTE_START, 1_000);
    assert!(at < threshold, "{at}");
    let estimated = s.wait_prepared();
    // The first preparation began at the precompute start, not below it: the log says
    // at how many tokens each began, in order, so an earlier one would come first.
    let began = s.daemon.wait_log("a preparation ahead", |line| line.contains("preparing a summary ahead")).unwrap();
    let began_at: u64 = ctxd_e2e::log_field(&began, "tokens").unwrap().parse().unwrap();
    assert!((PRECOMPUTE_START..threshold).contains(&began_at), "{began}");
    assert!(estimated < threshold / 2, "the prepared summary leaves room: {estimated}");
    let usage = s.daemon.request("ctx/usage", json!({"sessionId": "p"})).unwrap()["usage"].clone();
    assert_ne!(usage["level"], "compacting", "{usage}");
    assert_eq!(stored_uuids(&state, "p").unwrap().len(), stored_before + (s.sent.len() - stored_before));
    // More turns, then the threshold: the prepared summary is installed at once, and
    // the records appended after it was prepared are kept verbatim after it.
    let since_prepared: Vec<String> = {
        let first = s.sent.len();
        s.fill_to(threshold, 1_000);
        s.sent[first..].to_vec()
    };
    assert!(since_prepared.len() >= 2, "{since_prepared:?}");
    let compacted = s.daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "p").unwrap();
    assert_eq!(compacted["trigger"], "precomputed", "{compacted}");
    assert!(compacted["preTokens"].as_u64().unwrap() >= threshold, "{compacted}");
    let post = compacted["postTokens"].as_u64().unwrap();
    assert!(post < threshold / 2, "{compacted}");
    let stored = stored_uuids(&state, "p").unwrap();
    let text = std::fs::read_to_string(state.join("sessions/p.jsonl")).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let boundary = lines.iter().position(|r| r["subtype"] == "compact_boundary").unwrap();
    assert_eq!(lines[boundary]["compactMetadata"]["trigger"], "precomputed");
    for uuid in &since_prepared {
        // Kept where they stand: the boundary references them, and nothing copies them.
        assert!(kept_by(&lines[boundary], uuid), "record {uuid} is kept: {}", lines[boundary]);
        let original = lines.iter().find(|r| r["uuid"] == uuid.as_str()).unwrap();
        let content = &original["message"]["content"];
        assert_eq!(lines.iter().filter(|r| r["message"]["content"] == *content).count(), 1, "{uuid} once");
    }
    assert!(stored.len() > s.sent.len(), "every sent record is stored, with the install after them");
    // The prepared summary is used once.
    assert_eq!(s.prepared_ahead(), None);
    // The session goes on from the compacted view.
    let usage = s.append(1_000);
    assert!(usage["tokens"].as_u64().unwrap() < threshold / 2, "{usage}");
    s.daemon.stop().unwrap();
}

#[test]
fn a_prepared_summary_that_would_leave_too_little_room_gives_way_to_a_normal_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (mut s, threshold) = Session::open(&state);
    s.fill_to(161_000, 4_000);
    s.wait_prepared();
    // One huge tool output after it was prepared: kept verbatim, it alone would fill
    // more than half the threshold.
    s.append(95_000);
    let compacted = s.daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "p").unwrap();
    assert_eq!(compacted["trigger"], "auto", "{compacted}");
    assert!(compacted["postTokens"].as_u64().unwrap() < threshold, "{compacted}");
    s.daemon.stop().unwrap();
}

#[test]
fn a_prompt_too_long_refusal_installs_the_prepared_summary_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (mut s, threshold) = Session::open(&state);
    s.fill_to(161_000, 4_000);
    s.wait_prepared();
    s.append(1_000);
    // The estimate was below the threshold, the provider counted more: the refusal is
    // answered from the prepared summary, with what came since kept.
    let refusal = json!({"status": 400, "type": "invalid_request_error", "message": "prompt is too long: 201234 tokens > 200000 maximum"});
    let answer = s.daemon.request("ctx/reportProviderError", json!({"sessionId": "p", "error": refusal})).unwrap();
    assert_eq!(answer["action"], "compacted", "{answer}");
    assert_eq!(answer["compact"]["trigger"], "precomputed", "{answer}");
    assert!(answer["compact"]["postTokens"].as_u64().unwrap() < threshold / 2, "{answer}");
    assert_eq!(s.prepared_ahead(), None, "used once");
    let last = s.sent.last().unwrap().clone();
    let text = std::fs::read_to_string(state.join("sessions/p.jsonl")).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let boundary = lines.iter().rposition(|r| r["subtype"] == "compact_boundary").unwrap();
    assert!(kept_by(&lines[boundary], &last), "the record after the preparation is kept: {}", lines[boundary]);
    s.daemon.stop().unwrap();
}

#[test]
fn every_message_kept_by_a_prepared_install_reaches_the_next_request_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (mut s, threshold) = Session::open(&state);
    s.fill_to(161_000, 4_000);
    s.wait_prepared();
    // After the preparation the host goes on with a tool round, a parentless note (as
    // ctxd writes its own), a reply, then prompts up to the threshold: the summary
    // prepared on the older view is installed with all of it kept after it.
    let mut markers: Vec<(String, String)> = Vec::new();
    let prompt_parent = s.last.clone();
    let call = host_line(
        "call",
        prompt_parent.as_deref(),
        "assistant",
        json!([{"type": "tool_use", "id": "toolu_k1", "name": "Read", "input": {"file_path": "/p/[[call]]"}}]),
    );
    let result = host_line(
        "result",
        Some("call"),
        "user",
        json!([{"type": "tool_result", "tool_use_id": "toolu_k1", "content": "[[result]] 1\tfn main() {}"}]),
    );
    let note = json!({"parentUuid": null, "isSidechain": false, "type": "attachment", "uuid": "note",
        "timestamp": "2026-11-29T10:00:00.000Z", "attachment": {"type": "ctxd_note"},
        "rendered": [{"content": "<system-reminder>\n[[note]]\n</system-reminder>"}], "renderedRole": "user"});
    let answer = host_line("answer", Some("result"), "assistant", json!([{"type": "text", "text": "[[answer]] done"}]));
    for (uuid, record) in [("call", call), ("result", result), ("note", note), ("answer", answer)] {
        s.daemon.request("ctx/append", json!({"sessionId": "p", "records": [record]})).unwrap();
        markers.push((uuid.to_owned(), format!("[[{uuid}]]")));
    }
    s.last = Some("answer".to_owned());
    let first = s.sent.len();
    s.fill_to(threshold, 1_000);
    for (n, uuid) in s.sent.iter().enumerate().skip(first) {
        markers.push((uuid.clone(), format!("Step {n}: ")));
    }
    let compacted = s.daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "p").unwrap();
    assert_eq!(compacted["trigger"], "precomputed", "{compacted}");
    // The prompt the preparation's kept tail started at (the newest one before it) is
    // kept too, before everything appended since.
    let text = std::fs::read_to_string(state.join("sessions/p.jsonl")).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let boundary = lines.iter().rposition(|r| r["subtype"] == "compact_boundary").unwrap();
    let before: Vec<(String, String)> = s.sent[..first]
        .iter()
        .enumerate()
        .filter(|(_, u)| kept_by(&lines[boundary], u))
        .map(|(n, u)| (u.clone(), format!("Step {n}: ")))
        .collect();
    assert!(!before.is_empty(), "the preparation kept its newest prompt: {}", lines[boundary]);
    assert!(markers.len() >= 6, "prompts came after the preparation: {markers:?}");
    markers.splice(0..0, before);
    for (uuid, _) in &markers {
        assert!(kept_by(&lines[boundary], uuid), "{uuid} is kept: {}", lines[boundary]);
    }
    assert_reaches_request_once_in_order(&mut s, &markers);
    // The host's reply to the newest prompt: still everything, then the reply.
    let reply = host_line("reply", s.last.as_deref(), "assistant", json!([{"type": "text", "text": "[[reply]] ok"}]));
    s.daemon.request("ctx/append", json!({"sessionId": "p", "records": [reply]})).unwrap();
    markers.push(("reply".to_owned(), "[[reply]]".to_owned()));
    assert_reaches_request_once_in_order(&mut s, &markers);
    s.daemon.stop().unwrap();
}

#[test]
fn prompts_the_user_took_back_after_the_preparation_stay_out_after_the_install() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (mut s, threshold) = Session::open(&state);
    s.fill_to(161_000, 4_000);
    s.wait_prepared();
    // The prepared summary keeps the newest prompt (the last of those below, or the one
    // before: the preparation starts at 160,000). The user rewinds to a prompt before
    // those three, which is summarized, and goes on from there: the view leaves the
    // three out.
    let taken_back = s.sent.len() - 3..s.sent.len();
    s.last = Some(s.sent[taken_back.start - 1].clone());
    let first = s.sent.len();
    s.fill_to(threshold, 1_000);
    let compacted = s.daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "p").unwrap();
    assert_eq!(compacted["trigger"], "precomputed", "{compacted}");
    let markers: Vec<(String, String)> =
        (first..s.sent.len()).map(|n| (s.sent[n].clone(), format!("Step {n}: "))).collect();
    assert!(markers.len() >= 2, "{markers:?}");
    assert_reaches_request_once_in_order(&mut s, &markers);
    // After the summary the rewind can no longer be seen (the prompt it went back to
    // is summarized): the prompts taken back must not have been kept.
    let file = std::fs::read_to_string(state.join("sessions/p.jsonl")).unwrap();
    let lines: Vec<Value> = file.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let boundary = lines.iter().rposition(|r| r["subtype"] == "compact_boundary").unwrap();
    for n in taken_back.clone() {
        assert!(!kept_by(&lines[boundary], &s.sent[n]), "prompt {n}, taken back, is kept: {}", lines[boundary]);
    }
    // The newest was never summarized (the summary may quote the older ones, which the
    // preparation saw before the rewind): it is nowhere in the request.
    let system = json!([{"type": "text", "text": "You are a coding agent."}]);
    let assembled =
        s.daemon.request("ctx/assemble", json!({"sessionId": "p", "system": system, "maxTokens": 8000})).unwrap();
    let text = serde_json::to_string(&assembled["request"]["messages"]).unwrap();
    let newest = taken_back.end - 1;
    assert!(!text.contains(&format!("Step {newest}: ")), "prompt {newest}, taken back, is in the request again");
    s.daemon.stop().unwrap();
}

/// A host record of `kind` (`user` or `assistant`) with these content blocks.
fn host_line(uuid: &str, parent: Option<&str>, kind: &str, content: Value) -> Value {
    let mut message = json!({"role": kind, "content": content});
    if kind == "assistant" {
        message["id"] = json!(format!("msg_{uuid}"));
        message["model"] = json!(MODEL);
    }
    json!({"parentUuid": parent, "isSidechain": false, "type": kind, "uuid": uuid,
        "timestamp": "2026-11-29T10:00:00.000Z", "message": message})
}

/// Every marker is in the request the daemon assembles now exactly once, the messages
/// in order (a note may go after the tool result it came before: results lead their
/// message).
fn assert_reaches_request_once_in_order(s: &mut Session, markers: &[(String, String)]) {
    let system = json!([{"type": "text", "text": "You are a coding agent."}]);
    let tools = json!([{"name": "Read", "description": "Reads a file.", "input_schema": {"type": "object"}}]);
    let assembled = s
        .daemon
        .request("ctx/assemble", json!({"sessionId": "p", "system": system, "tools": tools, "maxTokens": 8000}))
        .unwrap();
    let text = serde_json::to_string(&assembled["request"]["messages"]).unwrap();
    let mut last = 0;
    for (uuid, marker) in markers {
        assert_eq!(text.matches(marker.as_str()).count(), 1, "{uuid} ({marker}) once in the request");
        let at = text.find(marker.as_str()).unwrap();
        if uuid != "note" {
            assert!(at >= last, "{uuid} ({marker}) in order in the request");
            last = at;
        }
    }
}

/// The boundary keeps `uuid` in view by reference (`preservedMessages`), as Claude
/// Code's own boundaries do.
fn kept_by(boundary: &Value, uuid: &str) -> bool {
    let listed = boundary["compactMetadata"]["preservedMessages"]["uuids"].as_array().cloned().unwrap_or_default();
    listed.iter().any(|u| u == uuid) && boundary["compactMetadata"]["preservedSegment"]["tailUuid"].is_string()
}
