//! Compaction over real pipes with the built-in offline summarizer: manual with focus,
//! automatic at the threshold while appends go on, resume after it, hooks, and a torn
//! install cut on resume.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::path::Path;

use ctxd_e2e::{Daemon, example, records_of, stored_uuids};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5-20250929";

#[test]
fn manual_compaction_with_focus_installs_a_recovery_point() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": "/home/dev/project", "model": MODEL, "sessionId": "m"})).unwrap();
    let records: Vec<Value> = example(usize::MAX).into_iter().take(120).collect();
    let appended = daemon.request("ctx/append", json!({"sessionId": "m", "records": records})).unwrap();
    let before = appended["usage"]["tokens"].as_u64().unwrap();

    let result =
        daemon.request("ctx/compact", json!({"sessionId": "m", "instructions": "keep the budget work"})).unwrap();
    assert_eq!(result["trigger"], "manual");
    assert_eq!(result["summarizer"], "offline");
    assert_eq!(result["preTokens"].as_u64().unwrap(), before);
    let after = result["usage"]["tokens"].as_u64().unwrap();
    assert!(after < before / 2, "compaction should cut the context: {before} → {after}");
    assert_eq!(result["postTokens"].as_u64().unwrap(), after);
    let summary = result["summary"].as_str().unwrap();
    for section in ["1. Primary Request and Intent:", "6. All User Messages:", "9. Optional Next Step:"] {
        assert!(summary.contains(section), "{section} missing");
    }
    assert!(summary.contains("keep the budget work"), "focus instructions are part of the summary");
    let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "m").unwrap();
    assert_eq!(compacted["trigger"], "manual");

    // The transcript keeps everything and gained a boundary and a summary after it.
    let stored = records_of(&state, "m");
    assert!(stored.len() > 120);
    let boundary = stored.iter().position(|r| r["subtype"] == "compact_boundary").unwrap();
    assert_eq!(boundary, 120, "the install follows every record appended before it");
    assert_eq!(stored[boundary]["uuid"], result["boundary"]);
    assert_eq!(stored[boundary]["compactMetadata"]["trigger"], "manual");
    assert_eq!(stored[boundary]["compactMetadata"]["preTokens"].as_u64().unwrap(), before);
    assert_eq!(stored[boundary + 1]["isCompactSummary"], true);

    // Resume: the usage starts from the recovery point at once.
    assert!(daemon.stop().unwrap().success());
    let mut daemon = Daemon::started(&state).unwrap();
    let opened = daemon
        .request("ctx/openSession", json!({"cwd": "/home/dev/project", "model": MODEL, "sessionId": "m"}))
        .unwrap();
    assert_eq!(opened["usage"]["tokens"].as_u64().unwrap(), after);
    assert_eq!(opened["records"].as_u64().unwrap(), stored.len() as u64);
}

#[test]
fn automatic_compaction_at_the_threshold_while_appends_continue() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::start_with(&state, &[], &[("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "100000")]).unwrap();
    daemon.initialize().unwrap();
    let opened = daemon
        .request("ctx/openSession", json!({"cwd": "/home/dev/project", "model": MODEL, "sessionId": "a"}))
        .unwrap();
    let threshold = opened["usage"]["threshold"].as_u64().unwrap();
    assert_eq!(threshold, 67_000);
    // A recorded session's usage figures describe its original, never-compacted
    // context; a live host would report smaller ones after a compaction. Without them
    // ctxd counts by estimate, as it does between two responses.
    let all: Vec<Value> = example(usize::MAX)
        .into_iter()
        .map(|mut r| {
            if let Some(message) = r["message"].as_object_mut() {
                message.remove("usage");
            }
            r
        })
        .collect();
    // One record at a time, as a host appends, never waiting for a compaction.
    for record in &all {
        daemon.request("ctx/append", json!({"sessionId": "a", "records": [record]})).unwrap();
    }
    let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "a").unwrap();
    assert_eq!(compacted["trigger"], "auto");
    assert!(compacted["preTokens"].as_u64().unwrap() >= threshold, "{compacted}");
    // Records appended while it ran are installed after the summary, so on a slow
    // machine the install itself can end above the threshold; then a follow-up
    // compaction runs at once (at most two), and the last one ends under it.
    let mut last = compacted;
    for _ in 0..2 {
        if last["postTokens"].as_u64().unwrap() < threshold {
            break;
        }
        last = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "a").unwrap();
        assert_eq!(last["trigger"], "auto", "{last}");
    }
    assert!(last["postTokens"].as_u64().unwrap() < threshold, "the compactions end under the threshold: {last}");
    // Every record the host sent is stored, in order, boundaries or not.
    let sent: Vec<String> = all.iter().filter_map(|r| r["uuid"].as_str().map(str::to_owned)).collect();
    let stored = stored_uuids(&state, "a").unwrap();
    let originals: Vec<&String> = stored.iter().filter(|u| sent.contains(u)).collect();
    assert_eq!(originals.len(), sent.len());
    assert!(originals.iter().zip(&sent).all(|(a, b)| *a == b), "host records stay in order");
    // The session ends inside its window, though the records sent add up to about
    // 185,000 tokens.
    let usage = loop {
        let usage = daemon.request("ctx/usage", json!({"sessionId": "a"})).unwrap()["usage"].clone();
        if usage["level"] != "compacting" {
            break usage;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(usage["tokens"].as_u64().unwrap() < 100_000, "{usage}");
}

#[test]
fn hooks_run_around_compaction_and_a_hanging_hook_does_not_stop_it() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join(".ctxd")).unwrap();
    let marker = dir.path().join("post-compact.txt");
    let settings = json!({"hooks": {
        "PreCompact": [{"matcher": "manual", "hooks": [
            {"type": "command", "command": "echo mention the HOOK-FOCUS marker"},
            {"type": "command", "command": "sleep 30", "timeout": 1}
        ]}],
        "SessionStart": [{"matcher": "compact", "hooks": [{"type": "command", "command": "echo RELOADED-BY-HOOK"}]}],
        "PostCompact": [{"hooks": [{"type": "command", "command": format!("cat > {}", marker.display())}]}]
    }});
    std::fs::write(project.join(".ctxd/settings.json"), settings.to_string()).unwrap();
    let state = dir.path().join("state");
    ctxd_e2e::trust_folder(&state, &project).unwrap();
    let mut daemon = Daemon::started(&state).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "h"})).unwrap();
    let records: Vec<Value> = example(usize::MAX).into_iter().take(40).collect();
    daemon.request("ctx/append", json!({"sessionId": "h", "records": records})).unwrap();
    let result = daemon.request("ctx/compact", json!({"sessionId": "h"})).unwrap();
    assert!(result["summary"].as_str().unwrap().contains("HOOK-FOCUS"), "PreCompact output joins the focus");
    let problems = result["problems"].to_string();
    assert!(problems.contains("timed out"), "{problems}");
    let stored = std::fs::read_to_string(state.join("sessions/h.jsonl")).unwrap();
    assert!(stored.contains("RELOADED-BY-HOOK"), "SessionStart(compact) output is installed");
    // PostCompact gets the summary (after install, in the background).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut post = String::new();
    while !post.contains("Primary Request") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        post = std::fs::read_to_string(&marker).unwrap_or_default();
    }
    assert!(post.contains("\"hook_event_name\":\"PostCompact\""), "{post}");
    assert!(post.contains("Primary Request"), "{post}");
}

#[test]
fn an_install_cut_by_a_crash_is_not_half_applied() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": "/home/dev/project", "model": MODEL, "sessionId": "t"})).unwrap();
    let records: Vec<Value> = example(usize::MAX).into_iter().take(60).collect();
    let appended = daemon.request("ctx/append", json!({"sessionId": "t", "records": records})).unwrap();
    let before = appended["usage"].clone();
    daemon.request("ctx/compact", json!({"sessionId": "t"})).unwrap();
    daemon.kill9().unwrap();
    // Make it look as if the crash came in the middle of writing the install: keep the
    // boundary and one more line of it.
    let path = state.join("sessions/t.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let boundary = lines.iter().position(|l| l.contains("compact_boundary")).unwrap();
    std::fs::write(&path, format!("{}\n", lines[..boundary + 2].join("\n"))).unwrap();

    let mut daemon = Daemon::started(&state).unwrap();
    let opened = daemon
        .request("ctx/openSession", json!({"cwd": "/home/dev/project", "model": MODEL, "sessionId": "t"}))
        .unwrap();
    assert_eq!(opened["usage"]["tokens"], before["tokens"], "the old view, not a half-installed one");
    assert!(opened["diagnostics"].to_string().contains("interrupted compaction"), "{opened}");
    assert_eq!(stored_uuids(&state, "t").unwrap().len(), 60);
    // And compacting again works.
    let again = daemon.request("ctx/compact", json!({"sessionId": "t"})).unwrap();
    let (post, pre) = (again["postTokens"].as_u64().unwrap(), before["tokens"].as_u64().unwrap());
    assert!(post < pre, "{post} after compacting again, {pre} before: {again}");
}

#[test]
fn a_prompt_too_long_refusal_compacts_and_other_errors_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": "/home/dev/project", "model": MODEL, "sessionId": "r"})).unwrap();
    let records: Vec<Value> = example(usize::MAX).into_iter().take(80).collect();
    daemon.request("ctx/append", json!({"sessionId": "r", "records": records})).unwrap();
    let overloaded = daemon
        .request(
            "ctx/reportProviderError",
            json!({"sessionId": "r", "error": {"status": 529, "type": "overloaded_error", "message": "Overloaded"}}),
        )
        .unwrap();
    assert_eq!(overloaded["action"], "none");
    let too_long = daemon
        .request(
            "ctx/reportProviderError",
            json!({"sessionId": "r", "error": {"status": 400, "type": "invalid_request_error", "message": "prompt is too long: 212345 tokens > 200000 maximum"}}),
        )
        .unwrap();
    assert_eq!(too_long["action"], "compacted", "{too_long}");
    assert_eq!(too_long["compact"]["trigger"], "reactive");
    assert!(too_long["reason"].as_str().unwrap().contains("212345"));
    let error = daemon
        .request_error("ctx/reportProviderError", json!({"sessionId": "nobody", "error": {"message": "Overloaded"}}))
        .unwrap();
    assert_eq!(error["code"], -33001);
}

#[test]
fn clear_starts_an_empty_session_and_keeps_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": "/home/dev/project", "model": MODEL, "sessionId": "old"})).unwrap();
    let records: Vec<Value> = example(usize::MAX).into_iter().take(10).collect();
    daemon.request("ctx/append", json!({"sessionId": "old", "records": records})).unwrap();
    let cleared = daemon.request("ctx/clear", json!({"sessionId": "old"})).unwrap();
    let new_id = cleared["sessionId"].as_str().unwrap();
    assert_ne!(new_id, "old");
    assert_eq!(cleared["usage"]["tokens"], 0);
    assert_eq!(cleared["usage"]["window"], 200_000);
    assert_eq!(stored_uuids(&state, "old").unwrap().len(), 10, "the old transcript stays");
}

#[test]
fn an_idle_session_compacts_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join(".ctxd")).unwrap();
    std::fs::write(project.join(".ctxd/settings.json"), r#"{"idleCompactAfterSeconds": 1}"#).unwrap();
    // The idle floor is max(100,000, this variable or 200,000).
    let mut daemon =
        Daemon::start_with(&dir.path().join("state"), &[], &[("CLAUDE_CODE_IDLE_COMPACT_MIN_TOKENS", "100000")])
            .unwrap();
    daemon.initialize().unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "i"})).unwrap();
    // About 107,000 tokens by the session's own reported usage: over the idle floor,
    // under the threshold (167,000).
    let records: Vec<Value> = example(usize::MAX).into_iter().take(275).collect();
    let appended = daemon.request("ctx/append", json!({"sessionId": "i", "records": records})).unwrap();
    let tokens = appended["usage"]["tokens"].as_u64().unwrap();
    assert!((100_000..167_000).contains(&tokens), "{tokens}");
    let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "i").unwrap();
    assert_eq!(compacted["trigger"], "idle");
    assert!(compacted["postTokens"].as_u64().unwrap() < tokens / 2, "{compacted}");
}

#[test]
fn a_work_done_token_gets_the_compaction_phases_as_progress() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": "/tmp", "model": MODEL, "sessionId": "g"})).unwrap();
    daemon
        .request(
            "ctx/append",
            json!({"sessionId": "g", "records": example(usize::MAX).into_iter().take(60).collect::<Vec<_>>()}),
        )
        .unwrap();
    let result = daemon.request("ctx/compact", json!({"sessionId": "g", "workDoneToken": "compact-1"})).unwrap();
    let progress = daemon.drain_notifications("$/progress");
    let kinds: Vec<&str> = progress.iter().map(|p| p["value"]["kind"].as_str().unwrap()).collect();
    assert!(progress.iter().all(|p| p["token"] == "compact-1"), "{progress:?}");
    assert_eq!(kinds.first(), Some(&"begin"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"end"), "{kinds:?}");
    assert!(kinds.iter().filter(|k| **k == "report").count() >= 2, "{kinds:?}");
    let percentages: Vec<u64> = progress.iter().filter_map(|p| p["value"]["percentage"].as_u64()).collect();
    assert!(percentages.windows(2).all(|w| w[0] <= w[1]), "progress only goes forward: {percentages:?}");
    let end = progress.last().unwrap()["value"]["message"].as_str().unwrap().to_owned();
    assert!(end.contains(&result["postTokens"].to_string()), "{end}");
    // Without a token there is no progress.
    daemon
        .request(
            "ctx/append",
            json!({"sessionId": "g", "records": example(usize::MAX).into_iter().skip(60).take(40).collect::<Vec<_>>()}),
        )
        .unwrap();
    daemon.request("ctx/compact", json!({"sessionId": "g"})).unwrap();
    assert!(daemon.drain_notifications("$/progress").is_empty());
}

#[test]
fn a_context_that_refills_at_once_stops_auto_compaction_as_thrashing() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join(".ctxd")).unwrap();
    // A 100,000-token window: auto compaction at 67,000.
    std::fs::write(project.join(".ctxd/settings.json"), r#"{"autoCompactWindow": 100000}"#).unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "t"})).unwrap();
    // Every turn reports 70,000 tokens: each compaction is refilled by the next turn.
    let turn = |i: usize| {
        let user = ctxd_e2e::user_record(&format!("u{i}"), None, &format!("step {i}: read the whole build log again"));
        let answer =
            ctxd_e2e::assistant_record(&format!("a{i}"), Some(&format!("u{i}")), &format!("msg_{i}"), 70_000, 500);
        json!([user, answer])
    };
    for i in 0..3 {
        daemon.request("ctx/append", json!({"sessionId": "t", "records": turn(i)})).unwrap();
        let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "t").unwrap();
        assert_eq!(compacted["trigger"], "auto", "compaction {i}");
    }
    daemon.request("ctx/append", json!({"sessionId": "t", "records": turn(3)})).unwrap();
    let failed = daemon.wait_notification("ctx/compactFailed", |p| p["sessionId"] == "t").unwrap();
    assert!(failed["reason"].as_str().unwrap().starts_with("Autocompact is thrashing"), "{failed}");
    // Automatic compaction stays off, and appends go on.
    daemon.request("ctx/append", json!({"sessionId": "t", "records": turn(4)})).unwrap();
    assert!(daemon.drain_notifications("ctx/compacted").is_empty());
    // A manual compaction lifts the stop.
    daemon.request("ctx/compact", json!({"sessionId": "t"})).unwrap();
}

#[test]
fn partial_compaction_keeps_one_side_verbatim() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    let records: Vec<Value> = example(usize::MAX).into_iter().take(80).collect();
    // A plain user prompt in the middle to split at.
    let at = records
        .iter()
        .enumerate()
        .skip(30)
        .find(|(_, r)| r["type"] == "user" && r["message"]["content"].is_string())
        .unwrap()
        .0;
    let uuid = records[at]["uuid"].as_str().unwrap().to_owned();
    let kept_of = |state: &Path, id: &str| -> (usize, Vec<String>) {
        let stored = records_of(state, id);
        let boundary = stored.iter().rposition(|r| r["subtype"] == "compact_boundary").unwrap();
        let after = &stored[boundary + 1..];
        let summary = after.iter().position(|r| r["isCompactSummary"] == true).unwrap();
        let copied: Vec<String> = after.iter().filter_map(|r| r["ctxdKeptFrom"].as_str().map(str::to_owned)).collect();
        // Kept after the summary: referenced where they stand, never also copied.
        let referenced: Vec<String> = stored[boundary]["compactMetadata"]["preservedMessages"]["uuids"]
            .as_array()
            .map(|u| u.iter().filter_map(|u| u.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        assert!(copied.is_empty() || referenced.is_empty(), "both copied and referenced");
        (summary, if referenced.is_empty() { copied } else { referenced })
    };
    for (id, key) in [("up", "upTo"), ("from", "from")] {
        daemon.request("ctx/openSession", json!({"cwd": "/tmp", "model": MODEL, "sessionId": id})).unwrap();
        daemon.request("ctx/append", json!({"sessionId": id, "records": records})).unwrap();
        let result = daemon.request("ctx/compact", json!({"sessionId": id, key: uuid})).unwrap();
        assert_eq!(result["trigger"], "partial");
        let (summary_at, kept) = kept_of(&state, id);
        let originals: Vec<&str> = records.iter().filter_map(|r| r["uuid"].as_str()).collect();
        let split = originals.iter().position(|u| *u == uuid).unwrap();
        if key == "upTo" {
            // Everything after the chosen message stays, after the summary.
            assert_eq!(summary_at, 0, "the summary comes first");
            assert!(!kept.is_empty() && kept.iter().all(|u| originals[split + 1..].contains(&u.as_str())), "{kept:?}");
        } else {
            // Everything before it stays, before the summary.
            assert_eq!(summary_at, kept.len(), "the kept messages come first");
            assert!(!kept.is_empty() && kept.iter().all(|u| originals[..split].contains(&u.as_str())), "{kept:?}");
        }
        let after = daemon.request("ctx/usage", json!({"sessionId": id})).unwrap();
        assert!(after["usage"]["tokens"].as_u64().unwrap() < result["preTokens"].as_u64().unwrap());
    }
    let error = daemon.request_error("ctx/compact", json!({"sessionId": "up", "upTo": "no-such-record"})).unwrap();
    assert_eq!(error["code"], -32602, "{error}");
    let both = daemon.request_error("ctx/compact", json!({"sessionId": "up", "upTo": uuid, "from": uuid})).unwrap();
    assert_eq!(both["code"], -32602);
}

#[test]
fn the_compacted_notification_arrives_before_the_answer_of_the_request_that_installed_it() {
    let dir = tempfile::tempdir().unwrap();
    // Only the manual compactions asked for here.
    let mut daemon = Daemon::start_with(&dir.path().join("state"), &[], &[("DISABLE_AUTO_COMPACT", "1")]).unwrap();
    daemon.initialize().unwrap();
    daemon.request("ctx/openSession", json!({"cwd": "/home/dev/project", "model": MODEL, "sessionId": "n"})).unwrap();
    let records = example(usize::MAX);
    for (round, chunk) in records.chunks(30).take(12).enumerate() {
        daemon.request("ctx/append", json!({"sessionId": "n", "records": chunk})).unwrap();
        let id = daemon.send_request("ctx/compact", json!({"sessionId": "n"})).unwrap();
        let mut notified = false;
        loop {
            let message = daemon.next_message().unwrap();
            if message["id"] == id && message.get("method").is_none() {
                assert!(message.get("result").is_some(), "round {round}: {message}");
                break;
            }
            notified |= message["method"] == "ctx/compacted" && message["params"]["sessionId"] == "n";
        }
        assert!(notified, "round {round}: ctx/compacted came after the answer to ctx/compact");
    }
}
