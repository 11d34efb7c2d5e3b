//! Automatic compaction as a host sees it (issue #24): generated sessions replayed the way
//! a host drives them, every model request assembled first (with `since`) and every reply
//! carrying the usage the provider would report for it, on a 100,000-token window.
//!
//! What must hold: an oversized tool result counts as the preview the request carries,
//! so it starts no compaction of its own; the usage shown right after a compaction is
//! the next request's size; a stopped automatic compaction stays stopped on every path.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::{Daemon, assistant_record, user_record};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5-20250929";
const WINDOW: &str = "100000";

fn daemon(dir: &std::path::Path) -> Daemon {
    let mut daemon =
        Daemon::start_with(&dir.join("state"), &[], &[("CLAUDE_CODE_AUTO_COMPACT_WINDOW", WINDOW)]).unwrap();
    daemon.initialize().unwrap();
    daemon
}

fn open(daemon: &mut Daemon, id: &str) -> Value {
    daemon.request("ctx/openSession", json!({"cwd": "/home/dev/project", "model": MODEL, "sessionId": id})).unwrap()
}

/// The host's own part of every request: a system prompt and a tool, a few KB.
fn host_blocks() -> (Value, Value) {
    let system = json!([{"type": "text", "text": "You are a coding agent. Follow the project's rules. ".repeat(60)}]);
    let tools = json!([{
        "name": "Read",
        "description": "Reads a file from the local filesystem. ".repeat(20),
        "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]},
    }]);
    (system, tools)
}

fn usage(daemon: &mut Daemon, id: &str) -> Value {
    daemon.request("ctx/usage", json!({"sessionId": id})).unwrap()["usage"].clone()
}

/// A tool round whose result is `bytes` long, after a reply that reported `reported`.
fn oversized_round(reported: u64, bytes: usize) -> Vec<Value> {
    let prompt = user_record("u1", None, "Read the build log and tell me what failed.");
    let answer = assistant_record("a1", Some("u1"), "msg_1", reported, 200);
    let mut call = assistant_record("a2", Some("a1"), "msg_2", reported + 250, 50);
    call["message"]["content"] =
        json!([{"type": "tool_use", "id": "toolu_big", "name": "Bash", "input": {"command": "cat build.log"}}]);
    call["message"]["stop_reason"] = json!("tool_use");
    let mut result = user_record("r1", Some("a2"), "");
    result["message"]["content"] =
        json!([{"type": "tool_result", "tool_use_id": "toolu_big", "content": "e".repeat(bytes)}]);
    vec![prompt, answer, call, result]
}

#[test]
fn an_oversized_tool_result_counts_as_its_preview_and_starts_no_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = daemon(dir.path());
    let threshold = open(&mut daemon, "big")["usage"]["threshold"].as_u64().unwrap();
    assert_eq!(threshold, 67_000);
    // 40,000 tokens reported, then a 200 KB result: about 50,000 tokens at full size,
    // about a thousand as the preview the request carries.
    let records = oversized_round(40_000, 200_000);
    let appended = daemon.request("ctx/append", json!({"sessionId": "big", "records": records})).unwrap();
    let tokens = appended["usage"]["tokens"].as_u64().unwrap();
    assert!(tokens < 45_000, "the result counted at full size: {tokens}");
    // Queued after the append's own threshold check: a compaction it started shows here.
    let after = usage(&mut daemon, "big");
    assert_ne!(after["level"], "compacting", "{after}");
    let (system, tools) = host_blocks();
    let assembled = daemon
        .request("ctx/assemble", json!({"sessionId": "big", "system": system, "tools": tools, "maxTokens": 8000}))
        .unwrap();
    assert_ne!(assembled["compact"], true, "{}", assembled["applied"]);
    let text = serde_json::to_string(&assembled["request"]).unwrap();
    assert!(text.contains("This output was too large for the context"), "the request carries the preview");
    assert!(daemon.drain_notifications("ctx/compacted").is_empty());
}

/// One host's replay of a generated session. Returns, for every compaction, the figure
/// shown right after it and the size of the request assembled next.
struct Replay {
    /// (trigger, preTokens, postTokens, usage right after, next requestTokens)
    compactions: Vec<(String, u64, u64, u64, u64)>,
    failures: Vec<String>,
    requests: usize,
}

fn replay(daemon: &mut Daemon, id: &str, records: &[Value]) -> Replay {
    let (system, tools) = host_blocks();
    let mut since: Option<String> = None;
    let mut out = Replay { compactions: Vec::new(), failures: Vec::new(), requests: 0 };
    let assemble = |daemon: &mut Daemon, since: &mut Option<String>| -> Value {
        let mut params = json!({"sessionId": id, "system": system, "tools": tools, "maxTokens": 8000});
        if let Some(revision) = since.as_ref() {
            params["since"] = json!(revision);
        }
        let answer = daemon.request("ctx/assemble", params).unwrap();
        *since = answer["revision"].as_str().map(str::to_owned);
        answer
    };
    for record in records {
        let mut record = record.clone();
        if record["type"] == "assistant" && record["isSidechain"] != true {
            // The model request this reply answers, as the host sends it.
            let mut answer = assemble(daemon, &mut since);
            out.requests += 1;
            while answer["compact"] == true {
                // The host waits for the compacted view, then asks again.
                wait_compaction(daemon, id, &mut out, &mut |d| assemble(d, &mut since));
                answer = assemble(daemon, &mut since);
                out.requests += 1;
            }
            let request_tokens = answer["requestTokens"].as_u64().unwrap();
            let output = record["message"]["usage"]["output_tokens"].as_u64().unwrap_or(100);
            record["message"]["usage"] = json!({
                "input_tokens": request_tokens, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0, "output_tokens": output,
            });
        }
        daemon.request("ctx/append", json!({"sessionId": id, "records": [record]})).unwrap();
        if usage(daemon, id)["level"] == "compacting" {
            wait_compaction(daemon, id, &mut out, &mut |d| assemble(d, &mut since));
        }
    }
    out.failures.extend(daemon.drain_notifications("ctx/compactFailed").into_iter().map(|f| f["reason"].to_string()));
    out
}

/// Waits for the running compaction to be installed; notes the usage then and the size
/// of the request assembled at once after it (nothing appended in between).
fn wait_compaction(daemon: &mut Daemon, id: &str, out: &mut Replay, assemble: &mut dyn FnMut(&mut Daemon) -> Value) {
    let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == id).unwrap();
    let mut now = usage(daemon, id);
    while now["level"] == "compacting" {
        // A further step down the ladder is running: its result is the one to compare.
        daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == id).unwrap();
        now = usage(daemon, id);
    }
    let shown = now["tokens"].as_u64().unwrap();
    let next = assemble(daemon);
    out.requests += 1;
    out.compactions.push((
        compacted["trigger"].as_str().unwrap().to_owned(),
        compacted["preTokens"].as_u64().unwrap(),
        compacted["postTokens"].as_u64().unwrap(),
        shown,
        next["requestTokens"].as_u64().unwrap(),
    ));
}

#[test]
fn the_usage_after_a_compaction_is_the_next_request_within_one_percent() {
    // Seeds whose sessions hold tool results over the 25,000-token budget (a 100 KB
    // result and more), one of them kept in the tail of a compaction.
    for seed in [2u64, 4] {
        let records = ctxd_gen::records(&ctxd_gen::Options { seed, ..ctxd_gen::Options::turns(80) });
        let oversized = records
            .iter()
            .filter(|r| r["type"] == "user" && r["message"]["content"].to_string().len() > 100_000)
            .count();
        assert!(oversized > 0, "seed {seed} has no oversized result");
        let dir = tempfile::tempdir().unwrap();
        let mut daemon = daemon(dir.path());
        open(&mut daemon, "g");
        let replay = replay(&mut daemon, "g", &records);
        println!("seed {seed}: {} requests, compactions {:?}", replay.requests, replay.compactions);
        assert!(!replay.compactions.is_empty(), "seed {seed}: the session never compacted");
        for (trigger, pre, post, shown, next) in &replay.compactions {
            assert!(*pre >= 67_000, "seed {seed}: a {trigger} compaction below the threshold: {pre}");
            assert_eq!(post, shown, "seed {seed}: postTokens is the usage after the install");
            let off = shown.abs_diff(*next);
            assert!(
                off as f64 <= 0.01 * *next as f64,
                "seed {seed}: shown {shown}, next request {next} ({:.1} % off)",
                off as f64 * 100.0 / *next as f64
            );
        }
        assert!(replay.failures.is_empty(), "seed {seed}: {:?}", replay.failures);
    }
}

/// A turn: a prompt and a reply that reports `reported` tokens.
fn turn(i: usize, reported: u64) -> Value {
    let user = user_record(&format!("u{i}"), None, &format!("step {i}: read the whole build log again"));
    let answer = assistant_record(&format!("a{i}"), Some(&format!("u{i}")), &format!("msg_{i}"), reported, 500);
    json!([user, answer])
}

/// Turns 0 to 2 of session `id`, each over the threshold: each is compacted
/// automatically and refilled by the next (the third refill in a row stops it).
fn three_refills(daemon: &mut Daemon, id: &str) {
    for i in 0..3 {
        daemon.request("ctx/append", json!({"sessionId": id, "records": turn(i, 101_000)})).unwrap();
        let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == id).unwrap();
        assert_eq!(compacted["trigger"], "auto", "compaction {i}");
    }
}

#[test]
fn a_thrashing_stop_holds_for_appends_requests_and_idle_until_a_manual_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join(".ctxd")).unwrap();
    std::fs::write(project.join(".ctxd/settings.json"), r#"{"idleCompactAfterSeconds": 1}"#).unwrap();
    let state = dir.path().join("state");
    let env = [("CLAUDE_CODE_AUTO_COMPACT_WINDOW", WINDOW), ("CLAUDE_CODE_IDLE_COMPACT_MIN_TOKENS", "100000")];
    let mut daemon = Daemon::start_with(&state, &[], &env).unwrap();
    daemon.initialize().unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "t"})).unwrap();
    // Every turn reports 101,000 tokens (over the idle floor): each compaction is
    // refilled by the next turn; the third refill in a row stops automatic compaction.
    for i in 0..3 {
        daemon.request("ctx/append", json!({"sessionId": "t", "records": turn(i, 101_000)})).unwrap();
        let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "t").unwrap();
        assert_eq!(compacted["trigger"], "auto", "compaction {i}");
    }
    daemon.request("ctx/append", json!({"sessionId": "t", "records": turn(3, 101_000)})).unwrap();
    let failed = daemon.wait_notification("ctx/compactFailed", |p| p["sessionId"] == "t").unwrap();
    assert!(failed["reason"].as_str().unwrap().starts_with("Autocompact is thrashing"), "{failed}");
    // An append over the threshold starts nothing.
    daemon.request("ctx/append", json!({"sessionId": "t", "records": turn(4, 101_000)})).unwrap();
    assert_ne!(usage(&mut daemon, "t")["level"], "compacting");
    // Nor does a request whose check says "compact".
    let (system, tools) = host_blocks();
    let assembled = daemon
        .request("ctx/assemble", json!({"sessionId": "t", "system": system, "tools": tools, "maxTokens": 8000}))
        .unwrap();
    assert_ne!(assembled["compact"], true, "{}", assembled["applied"]);
    assert_ne!(usage(&mut daemon, "t")["level"], "compacting");
    // Nor does the idle timer, a second after the last activity: once the session says
    // it went idle, a later request's answer shows no compaction running or reported.
    let idle = daemon
        .wait_log("the idle timer of session t", |line| {
            line.contains("session{id=t}") && line.contains("session idle;")
        })
        .unwrap();
    assert!(idle.contains("automatic compaction is stopped, so no idle compaction"), "{idle}");
    daemon.assert_no_compaction("t").expect("a stopped session compacted on its own");
    // A manual compaction lifts the stop: the next refill compacts automatically again.
    daemon.request("ctx/compact", json!({"sessionId": "t"})).unwrap();
    daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "t" && p["trigger"] == "manual").unwrap();
    daemon.request("ctx/append", json!({"sessionId": "t", "records": turn(5, 101_000)})).unwrap();
    let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "t").unwrap();
    assert_eq!(compacted["trigger"], "auto");
}

#[test]
fn a_compaction_left_above_the_threshold_is_followed_at_once_then_reported() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join(".ctxd")).unwrap();
    // SessionStart(compact) output of five hooks, 60 KB each: about 75,000 tokens come
    // back with every install, over the 67,000-token threshold by themselves.
    let hook = json!({"type": "command", "command": "head -c 60000 /dev/zero | tr '\\0' x"});
    let settings =
        json!({"hooks": {"SessionStart": [{"matcher": "compact", "hooks": [hook, hook, hook, hook, hook]}]}});
    std::fs::write(project.join(".ctxd/settings.json"), settings.to_string()).unwrap();
    let state = dir.path().join("state");
    ctxd_e2e::trust_folder(&state, &project).unwrap();
    let mut daemon = Daemon::start_with(&state, &[], &[("CLAUDE_CODE_AUTO_COMPACT_WINDOW", WINDOW)]).unwrap();
    daemon.initialize().unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "f"})).unwrap();
    daemon.request("ctx/append", json!({"sessionId": "f", "records": turn(0, 70_000)})).unwrap();
    // The compaction, then two more at once, then a report; no further turn came.
    let failed = daemon.wait_notification("ctx/compactFailed", |p| p["sessionId"] == "f").unwrap();
    let reason = failed["reason"].as_str().unwrap();
    assert!(reason.contains("at or above its compact threshold (67000 tokens)"), "{reason}");
    assert!(reason.contains("after 2 further compactions"), "{reason}");
    let compacted = daemon.drain_notifications("ctx/compacted");
    assert_eq!(compacted.len(), 3, "{compacted:?}");
    for c in &compacted {
        assert_eq!(c["trigger"], "auto", "{c}");
        assert!(c["postTokens"].as_u64().unwrap() >= 67_000, "{c}");
    }
    // Follow-ups are no refills: automatic compaction was not stopped as thrashing.
    daemon.request("ctx/append", json!({"sessionId": "f", "records": turn(1, 90_000)})).unwrap();
    let next = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "f").unwrap();
    assert_eq!(next["trigger"], "auto");
}

#[test]
fn a_manual_compaction_sent_while_one_runs_waits_for_it_or_runs_next() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join(".ctxd")).unwrap();
    // Automatic compactions take two seconds (their PreCompact hook sleeps).
    let settings = json!({"hooks": {"PreCompact": [{"matcher": "auto", "hooks": [
        {"type": "command", "command": "sleep 2"}
    ]}]}});
    std::fs::write(project.join(".ctxd/settings.json"), settings.to_string()).unwrap();
    let state = dir.path().join("state");
    ctxd_e2e::trust_folder(&state, &project).unwrap();
    let mut daemon = Daemon::start_with(&state, &[], &[("CLAUDE_CODE_AUTO_COMPACT_WINDOW", WINDOW)]).unwrap();
    daemon.initialize().unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "w"})).unwrap();

    // Without instructions: the answer is the running compaction's.
    daemon.request("ctx/append", json!({"sessionId": "w", "records": turn(0, 70_000)})).unwrap();
    assert_eq!(usage(&mut daemon, "w")["level"], "compacting");
    let joined = daemon.request("ctx/compact", json!({"sessionId": "w"})).unwrap();
    assert_eq!(joined["origin"], "joined", "{joined}");
    assert_eq!(joined["trigger"], "auto");
    let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "w").unwrap();
    assert_eq!(compacted["trigger"], "auto");
    assert_eq!(compacted["postTokens"], joined["postTokens"]);
    assert!(daemon.drain_notifications("ctx/compacted").is_empty(), "one compaction answered both");

    // With focus instructions of its own: it runs next, with them.
    daemon.request("ctx/append", json!({"sessionId": "w", "records": turn(1, 70_000)})).unwrap();
    assert_eq!(usage(&mut daemon, "w")["level"], "compacting");
    let queued =
        daemon.request("ctx/compact", json!({"sessionId": "w", "instructions": "keep the release checklist"})).unwrap();
    assert_eq!(queued["origin"], "queued", "{queued}");
    assert_eq!(queued["trigger"], "manual");
    assert!(queued["summary"].as_str().unwrap().contains("keep the release checklist"));
    let first = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "w").unwrap();
    let second = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "w").unwrap();
    assert_eq!((first["trigger"].as_str(), second["trigger"].as_str()), (Some("auto"), Some("manual")));

    // With nothing running, the answer is the request's own.
    let own = daemon.request("ctx/compact", json!({"sessionId": "w"})).unwrap();
    assert_eq!(own["origin"], "requested", "{own}");
}

#[test]
fn a_thrashing_stop_survives_a_restart_until_a_manual_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let env = [("CLAUDE_CODE_AUTO_COMPACT_WINDOW", WINDOW)];
    let mut daemon = Daemon::start_with(&state, &[], &env).unwrap();
    daemon.initialize().unwrap();
    open(&mut daemon, "r");
    // Three quick refills, then the fourth turn stops automatic compaction.
    three_refills(&mut daemon, "r");
    daemon.request("ctx/append", json!({"sessionId": "r", "records": turn(3, 101_000)})).unwrap();
    let failed = daemon.wait_notification("ctx/compactFailed", |p| p["sessionId"] == "r").unwrap();
    assert!(failed["reason"].as_str().unwrap().starts_with("Autocompact is thrashing"), "{failed}");
    daemon.stop().unwrap();

    // A new daemon on the same state: the stop holds for appends and requests, and is
    // not announced again.
    let mut daemon = Daemon::start_with(&state, &[], &env).unwrap();
    daemon.initialize().unwrap();
    open(&mut daemon, "r");
    daemon.request("ctx/append", json!({"sessionId": "r", "records": turn(4, 101_000)})).unwrap();
    assert_ne!(usage(&mut daemon, "r")["level"], "compacting");
    let (system, tools) = host_blocks();
    let assembled = daemon
        .request("ctx/assemble", json!({"sessionId": "r", "system": system, "tools": tools, "maxTokens": 8000}))
        .unwrap();
    assert_ne!(assembled["compact"], true, "{}", assembled["applied"]);
    daemon.request("ctx/append", json!({"sessionId": "r", "records": turn(5, 101_000)})).unwrap();
    assert_ne!(usage(&mut daemon, "r")["level"], "compacting");
    assert!(daemon.drain_notifications("ctx/compacted").is_empty(), "a stopped session compacted after a restart");
    assert!(daemon.drain_notifications("ctx/compactFailed").is_empty(), "the stop was announced twice");

    // A manual compaction lifts the stop, and that too survives a restart: the next
    // refill compacts automatically.
    let answer = daemon.request("ctx/compact", json!({"sessionId": "r"})).unwrap();
    assert_eq!(answer["trigger"], "manual", "{answer}");
    daemon.stop().unwrap();
    let mut daemon = Daemon::start_with(&state, &[], &env).unwrap();
    daemon.initialize().unwrap();
    open(&mut daemon, "r");
    daemon.request("ctx/append", json!({"sessionId": "r", "records": turn(6, 101_000)})).unwrap();
    let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "r").unwrap();
    assert_eq!(compacted["trigger"], "auto");
}

#[test]
fn undoing_an_automatic_compaction_takes_back_its_refill_before_and_after_a_restart() {
    // Three quick refills in a row stop automatic compaction (see above). Undoing the third
    // compaction takes its refill back: the next turn compacts again instead of stopping,
    // in this daemon and in one started on the same state.
    for restart in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let env = [("CLAUDE_CODE_AUTO_COMPACT_WINDOW", WINDOW)];
        let mut daemon = Daemon::start_with(&state, &[], &env).unwrap();
        daemon.initialize().unwrap();
        open(&mut daemon, "u");
        three_refills(&mut daemon, "u");
        daemon.request("ctx/undoCompact", json!({"sessionId": "u"})).unwrap();
        if restart {
            daemon.stop().unwrap();
            daemon = Daemon::start_with(&state, &[], &env).unwrap();
            daemon.initialize().unwrap();
            open(&mut daemon, "u");
        }
        daemon.request("ctx/append", json!({"sessionId": "u", "records": turn(3, 101_000)})).unwrap();
        let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "u").unwrap();
        assert_eq!(compacted["trigger"], "auto", "restart {restart}: {compacted}");
        assert!(daemon.drain_notifications("ctx/compactFailed").is_empty(), "restart {restart}: stopped as thrashing");
    }
}

#[test]
fn a_prompt_appended_while_a_compaction_runs_reaches_the_model_and_the_hook_output_stays() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join(".ctxd")).unwrap();
    // The automatic compaction takes two seconds (its PreCompact hook sleeps); its
    // SessionStart(compact) hook output is installed with the summary.
    let settings = json!({"hooks": {
        "PreCompact": [{"matcher": "auto", "hooks": [{"type": "command", "command": "sleep 2"}]}],
        "SessionStart": [{"matcher": "compact", "hooks": [{"type": "command", "command": "echo HOOK-SAYS-RUN-PYTEST"}]}],
    }});
    std::fs::write(project.join(".ctxd/settings.json"), settings.to_string()).unwrap();
    let state = dir.path().join("state");
    ctxd_e2e::trust_folder(&state, &project).unwrap();
    let mut daemon = Daemon::start_with(&state, &[], &[("CLAUDE_CODE_AUTO_COMPACT_WINDOW", WINDOW)]).unwrap();
    daemon.initialize().unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "p"})).unwrap();
    // The reply reports 70,000 tokens: the compaction starts; the next prompt follows
    // the reply while it runs.
    daemon.request("ctx/append", json!({"sessionId": "p", "records": turn(0, 70_000)})).unwrap();
    assert_eq!(usage(&mut daemon, "p")["level"], "compacting");
    let prompt = "PROMPT-DURING-COMPACTION: now run the whole test suite";
    let record = user_record("u1", Some("a0"), prompt);
    daemon.request("ctx/append", json!({"sessionId": "p", "records": [record]})).unwrap();
    daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "p").unwrap();
    let (system, tools) = host_blocks();
    let params = json!({"sessionId": "p", "system": system, "tools": tools, "maxTokens": 8000});
    let first = daemon.request("ctx/assemble", params.clone()).unwrap();
    let text = serde_json::to_string(&first["request"]).unwrap();
    assert!(text.contains(prompt), "the prompt is missing from the first request after the compaction: {text}");
    assert!(text.contains("HOOK-SAYS-RUN-PYTEST"), "{text}");
    // The host's reply names the prompt as its parent: the hook output stays in view.
    let reply = assistant_record("a1", Some("u1"), "msg_a1", 9_000, 100);
    daemon.request("ctx/append", json!({"sessionId": "p", "records": [reply]})).unwrap();
    let next = daemon.request("ctx/assemble", params).unwrap();
    let text = serde_json::to_string(&next["request"]).unwrap();
    assert!(text.contains(prompt) && text.contains("HOOK-SAYS-RUN-PYTEST"), "{text}");
}

/// A Read round: the call, in a reply that reported `reported`, and its `bytes`-long
/// result.
fn read_round(i: usize, parent: &str, reported: u64, bytes: usize) -> Vec<Value> {
    let mut call = assistant_record(&format!("a{i}"), Some(parent), &format!("msg_{i}"), reported, 50);
    call["message"]["content"] = json!([{"type": "tool_use", "id": format!("toolu_{i}"), "name": "Read",
        "input": {"file_path": format!("/home/dev/project/src/m{i}.rs")}}]);
    call["message"]["stop_reason"] = json!("tool_use");
    // Long before any clock this runs on: the prompt cache is cold.
    call["timestamp"] = json!("2020-01-01T00:00:00.000Z");
    let mut result = user_record(&format!("r{i}"), Some(&format!("a{i}")), "");
    result["message"]["content"] =
        json!([{"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": "x".repeat(bytes)}]);
    vec![call, result]
}

#[test]
fn a_result_that_crosses_the_threshold_after_a_cold_cache_gap_starts_no_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = daemon(dir.path());
    open(&mut daemon, "cold");
    // Twenty Read rounds of about 1,500 tokens each; the replies are years old (the
    // records' timestamps), so the prompt cache is cold and the next request clears
    // every old result but the newest five: 16 of 21, about 24,000 tokens.
    let (system, tools) = host_blocks();
    let params = json!({"sessionId": "cold", "system": system, "tools": tools, "maxTokens": 8000});
    let prompt = user_record("u0", None, "Read every module and summarize it.");
    daemon.request("ctx/append", json!({"sessionId": "cold", "records": [prompt]})).unwrap();
    // The host's first request: the daemon learns its tools.
    daemon.request("ctx/assemble", params.clone()).unwrap();
    let mut records = Vec::new();
    for i in 1..=20 {
        let parent = if i == 1 { "u0".to_owned() } else { format!("r{}", i - 1) };
        records.extend(read_round(i, &parent, 35_000 + 1_500 * i as u64, 6_000));
    }
    daemon.request("ctx/append", json!({"sessionId": "cold", "records": records})).unwrap();
    let before = usage(&mut daemon, "cold")["tokens"].as_u64().unwrap();
    assert!(before < 67_000, "{before}");
    // The last reply reported 66,000 tokens; its 1,500-token result takes the tally
    // over the 67,000-token threshold.
    let last = read_round(21, "r20", 66_000, 6_000);
    let appended = daemon.request("ctx/append", json!({"sessionId": "cold", "records": last})).unwrap();
    assert!(appended["usage"]["tokens"].as_u64().unwrap() >= 67_000, "{}", appended["usage"]);
    assert_ne!(usage(&mut daemon, "cold")["level"], "compacting", "a compaction started on the tally's figure");
    let assembled = daemon.request("ctx/assemble", params).unwrap();
    assert_ne!(assembled["compact"], true, "{}", assembled["applied"]);
    let cleared = assembled["applied"].as_array().unwrap().iter().find(|a| a["stage"] == "microcompact").unwrap();
    assert!(cleared["tokensFreed"].as_u64().unwrap() > 20_000, "{cleared}");
    // Once the clearing is recorded, the usage counts it too, until the next reply.
    let after = usage(&mut daemon, "cold");
    assert!(after["tokens"].as_u64().unwrap() < 50_000, "{after}");
    assert_ne!(after["level"], "compacting");
    assert!(daemon.drain_notifications("ctx/compacted").is_empty());
}
