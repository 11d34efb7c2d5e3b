//! `ctx/assemble` over real pipes: the base context placed (memory files first, git in
//! the system blocks), a provider-valid body, a changed file told once, the same request
//! after a restart, and a fork's cache marker.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::path::Path;

use ctxd_e2e::{Daemon, example};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5-20250929";

fn project(dir: &Path) -> std::path::PathBuf {
    let project = dir.join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("CLAUDE.md"), "# Rules\nAlways run the tests. MEMORY-MARKER\n").unwrap();
    let git = |args: &[&str]| {
        let ok =
            std::process::Command::new("git").args(args).current_dir(&project).output().map(|o| o.status.success());
        assert!(matches!(ok, Ok(true)), "git {args:?}");
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["config", "user.name", "Tester"]);
    git(&["config", "user.email", "t@example.invalid"]);
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "first commit"]);
    project
}

fn assemble(daemon: &mut Daemon, extra: Value) -> Value {
    daemon.request("ctx/assemble", assemble_params(extra)).unwrap()
}

/// Params of session `s`'s assemble, with `extra` fields added.
fn assemble_params(extra: Value) -> Value {
    let mut params = json!({
        "sessionId": "s",
        "system": [{"type": "text", "text": "You are a coding agent."}],
        "tools": [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}},
                  {"name": "Bash", "description": "Run", "input_schema": {"type": "object"}},
                  {"name": "Grep", "description": "Search", "input_schema": {"type": "object"}},
                  {"name": "Edit", "description": "Edit", "input_schema": {"type": "object"}},
                  {"name": "Glob", "description": "Find", "input_schema": {"type": "object"}}],
        "maxTokens": 32000,
    });
    if let Value::Object(extra) = extra {
        params.as_object_mut().unwrap().extend(extra);
    }
    params
}

/// The Messages API's shape rules.
fn check_valid(request: &Value) {
    let messages = request["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "user");
    for pair in messages.windows(2) {
        assert_ne!(pair[0]["role"], pair[1]["role"], "roles alternate");
    }
    for (i, m) in messages.iter().enumerate() {
        if m["role"] != "assistant" {
            continue;
        }
        let uses: Vec<&str> = m["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["type"] == "tool_use")
            .filter_map(|b| b["id"].as_str())
            .collect();
        if uses.is_empty() {
            continue;
        }
        let next = &messages[i + 1]["content"];
        let results: Vec<&str> = next
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["type"] == "tool_result")
            .filter_map(|b| b["tool_use_id"].as_str())
            .collect();
        for id in uses {
            assert!(results.contains(&id), "tool_use {id} has its result in the next message");
        }
    }
    let text = request.to_string();
    assert!(text.matches("\"cache_control\"").count() <= 4);
    assert!(!text.contains("\"text\":\"\""), "no empty text blocks");
}

#[test]
fn base_context_is_placed_and_the_request_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(dir.path());
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "s"})).unwrap();
    daemon.request("ctx/append", json!({"sessionId": "s", "records": example(40)})).unwrap();
    let result = assemble(&mut daemon, json!({}));
    let request = &result["request"];
    check_valid(request);
    assert_eq!(request["model"], MODEL);
    assert_eq!(request["max_tokens"], 32000);
    // The host's system block first, the git snapshot after it.
    let system = request["system"].as_array().unwrap();
    assert_eq!(system[0]["text"], "You are a coding agent.");
    assert!(system.iter().any(|b| b["text"].as_str().is_some_and(|t| t.contains("first commit"))), "{system:?}");
    // Memory files: the first message, a meta user message in a system-reminder.
    let first = request["messages"][0].to_string();
    assert!(first.contains("<system-reminder>") && first.contains("MEMORY-MARKER"), "{first}");
    assert!(result["requestTokens"].as_u64().unwrap() > 1_000);
    let stages: Vec<&str> = result["applied"].as_array().unwrap().iter().filter_map(|a| a["stage"].as_str()).collect();
    assert!(stages.len() >= 6, "{stages:?}");
}

/// The fast path answers `ctx/assemble` from the request text the actor encoded; the
/// service's path (taken here by escaping the method name, which the fast path does not
/// recognise) parses it back. Both answers are the same, and so are their errors.
#[test]
fn the_fast_path_and_the_service_answer_assemble_alike() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(dir.path());
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "s"})).unwrap();
    daemon.request("ctx/append", json!({"sessionId": "s", "records": example(40)})).unwrap();
    let fast = assemble(&mut daemon, json!({"includeSnipped": true}));
    let params = assemble_params(json!({"includeSnipped": true}));
    let service = |daemon: &mut Daemon, id: i64, params: &Value| {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "ctx/assemble", "params": params}).to_string();
        let escaped = body.replace("\"ctx/assemble\"", "\"ctx\\/assemble\"");
        assert_ne!(body, escaped);
        daemon.send_raw(&ctxd_e2e::frame(escaped.as_bytes())).unwrap();
        daemon.response(id).unwrap()
    };
    let mut slow = service(&mut daemon, 9001, &params);
    // Each answer names its own request.
    let mut fast = fast;
    let (fast_revision, slow_revision) =
        (fast.as_object_mut().unwrap().remove("revision"), slow["result"].as_object_mut().unwrap().remove("revision"));
    assert!(
        fast_revision.as_ref().is_some_and(Value::is_string) && fast_revision != slow_revision,
        "{fast_revision:?} {slow_revision:?}"
    );
    assert_eq!(slow["result"], fast, "the service's answer differs from the fast path's");
    assert!(fast["request"]["messages"].as_array().is_some_and(|m| m.len() > 10), "{fast}");
    assert!(fast["scrollback"]["entries"].is_array(), "{fast}");
    // The same errors either way: an unknown session, a wrong type.
    for (id, bad) in [
        (9002, json!({"sessionId": "nope", "maxTokens": 1000})),
        (9004, json!({"sessionId": "s", "maxTokens": "many"})),
    ] {
        let slow = service(&mut daemon, id, &bad);
        let fast = daemon.request_error("ctx/assemble", bad).unwrap();
        assert_eq!(slow["error"]["code"], fast["code"], "{slow} / {fast}");
        assert!(slow["error"]["code"].as_i64().is_some(), "{slow}");
    }
}

/// The messages of `kept` up to `answer`'s `messagesFrom`, then `answer`'s.
fn splice(kept: &Value, answer: &Value) -> Vec<Value> {
    let from = answer["messagesFrom"].as_u64().unwrap() as usize;
    let kept = kept["messages"].as_array().unwrap();
    assert!(from <= kept.len(), "messagesFrom {from} past the {} messages kept", kept.len());
    kept[..from].iter().chain(answer["request"]["messages"].as_array().unwrap()).cloned().collect()
}

#[test]
fn an_assemble_since_the_last_answer_carries_only_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(dir.path());
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "s"})).unwrap();
    let records = example(40);
    daemon.request("ctx/append", json!({"sessionId": "s", "records": records[..30]})).unwrap();
    let first = assemble(&mut daemon, json!({}));
    assert_eq!(first["messagesFrom"], 0, "without since the answer is whole");
    let mut kept = first["request"].clone();
    let mut revision = first["revision"].clone();
    for record in &records[30..] {
        daemon.request("ctx/append", json!({"sessionId": "s", "records": [record]})).unwrap();
        let delta = assemble(&mut daemon, json!({"since": revision}));
        let whole_len =
            delta["request"]["messages"].as_array().unwrap().len() + delta["messagesFrom"].as_u64().unwrap() as usize;
        let spliced = splice(&kept, &delta);
        assert_eq!(spliced.len(), whole_len);
        // The same state assembled whole: the host's splice is exactly that request.
        let whole = assemble(&mut daemon, json!({}));
        assert_eq!(whole["messagesFrom"], 0);
        assert_eq!(Value::Array(spliced.clone()), whole["request"]["messages"], "after {}", record["uuid"]);
        for field in ["model", "system", "tools", "max_tokens"] {
            assert_eq!(delta["request"][field], whole["request"][field], "{field}");
        }
        assert!(delta["messagesFrom"].as_u64().unwrap() > 0, "{delta}");
        // The turn's messages and the one whose cache marker moved: a few, of dozens.
        assert!(delta["request"]["messages"].as_array().unwrap().len() <= 3, "{delta}");
        assert_eq!(delta["usage"], whole["usage"]);
        // The whole answer is now the latest: the host keeps it.
        kept = whole["request"].clone();
        revision = whole["revision"].clone();
    }
    let delta = assemble(&mut daemon, json!({"since": revision}));
    assert!(
        delta["request"]["messages"].as_array().unwrap().len() <= 2,
        "nothing appended: at most the cache-marked tail is resent: {delta}"
    );
    let mut rebuilt = kept.clone();
    rebuilt["messages"] = Value::Array(splice(&kept, &delta));
    check_valid(&rebuilt);
    assert_eq!(rebuilt, kept);

    // A compaction replaces the view: what the host kept no longer starts the request.
    daemon.request("ctx/compact", json!({"sessionId": "s"})).unwrap();
    let after = assemble(&mut daemon, json!({"since": delta["revision"]}));
    let whole = assemble(&mut daemon, json!({}));
    assert_eq!(Value::Array(splice(&kept, &after)), whole["request"]["messages"]);
    assert_eq!(after["messagesFrom"], 0, "a compaction starts the request afresh");
    let (kept, revision) = (whole["request"].clone(), whole["revision"].clone());
    let delta = assemble(&mut daemon, json!({"since": revision}));
    assert!(delta["messagesFrom"].as_u64().unwrap() > 0);

    // Only the latest answer counts: an older revision, or one never given, gets the whole request.
    let latest = delta["revision"].clone();
    for stale in [revision.clone(), json!("no-such-revision")] {
        let answer = assemble(&mut daemon, json!({"since": stale}));
        assert_eq!(answer["messagesFrom"], 0, "{stale}");
        assert_eq!(answer["request"]["messages"], kept["messages"]);
    }
    assert_ne!(latest, revision);

    // A revision from before a restart names nothing in the new daemon.
    let before = assemble(&mut daemon, json!({}))["revision"].clone();
    assert!(daemon.stop().unwrap().success());
    let mut daemon = Daemon::started(&state).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "s"})).unwrap();
    let answer = assemble(&mut daemon, json!({"since": before}));
    assert_eq!(answer["messagesFrom"], 0);
    assert_ne!(answer["revision"], before);
    assert_eq!(answer["request"]["messages"], kept["messages"]);
}

#[test]
fn a_changed_read_file_is_told_once_and_resume_gives_the_same_request() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(dir.path());
    let source = project.join("lib.rs");
    std::fs::write(&source, "pub fn one() {}\n").unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "s"})).unwrap();
    daemon.request("ctx/append", json!({"sessionId": "s", "records": example(20)})).unwrap();
    daemon.request("ctx/fileRead", json!({"sessionId": "s", "path": source})).unwrap();
    std::fs::write(&source, "pub fn one() {}\npub fn two() {}\n").unwrap();
    let want = source.display().to_string();
    daemon
        .wait_notification("ctx/contextChanged", |p| {
            p["paths"].as_array().is_some_and(|a| a.iter().any(|x| x == &json!(want)))
        })
        .unwrap();
    let first = assemble(&mut daemon, json!({}))["request"].clone();
    let text = first.to_string();
    assert_eq!(text.matches("changed on disk after you read it").count(), 1, "one changed-file note");
    assert!(text.contains("pub fn two() {}"), "with its new content");
    let second = assemble(&mut daemon, json!({}))["request"].clone();
    assert_eq!(second.to_string().matches("changed on disk after you read it").count(), 1, "told once, not again");
    assert_eq!(second, first, "nothing appended: the same request");
    assert!(daemon.stop().unwrap().success());

    let mut daemon = Daemon::started(&state).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "s"})).unwrap();
    let resumed = assemble(&mut daemon, json!({}))["request"].clone();
    assert_eq!(resumed.to_string(), first.to_string(), "resume reproduces the request byte for byte");
}

#[test]
fn a_fork_that_skips_the_cache_write_marks_the_shared_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(dir.path());
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "s"})).unwrap();
    daemon.request("ctx/append", json!({"sessionId": "s", "records": example(30)})).unwrap();
    let normal = assemble(&mut daemon, json!({}))["request"].clone();
    let fork = assemble(
        &mut daemon,
        json!({"fork": {"instruction": "Summarize the session.", "skipCacheWrite": true}}),
    )["request"]
        .clone();
    check_valid(&fork);
    let messages = fork["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    let blocks = last["content"].as_array().unwrap();
    let instruction = blocks.iter().find(|b| b["text"] == "Summarize the session.").unwrap();
    assert!(instruction.get("cache_control").is_none(), "the fork's own instruction is not cached: {last}");
    // The marker sits at the end of the shared prefix: the block before the instruction.
    let at = blocks.iter().position(|b| b["text"] == "Summarize the session.").unwrap();
    let before = if at > 0 {
        blocks[at - 1].clone()
    } else {
        messages[messages.len() - 2]["content"].as_array().unwrap().last().unwrap().clone()
    };
    assert!(before.get("cache_control").is_some(), "{last}");
    assert!(fork.to_string().contains("cache_control"));
    // The shared prefix is the normal request's messages.
    let n = normal["messages"].as_array().unwrap().len();
    assert!(messages.len() >= n);
}

/// A daemon on `dir` with session `s` open in a project, holding the first `count`
/// records of the example session; the records are returned.
fn example_session(dir: &Path, count: usize) -> (Daemon, Vec<Value>) {
    let project = project(dir);
    let mut daemon = Daemon::started(&dir.join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "s"})).unwrap();
    let records = example(count);
    daemon.request("ctx/append", json!({"sessionId": "s", "records": records})).unwrap();
    (daemon, records)
}

#[test]
fn snips_and_collapses_leave_the_request_and_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let (mut daemon, records) = example_session(dir.path(), 60);
    let before = assemble(&mut daemon, json!({}));
    // A plain user prompt in the middle of the session.
    let target = records[20..40].iter().find(|r| r["type"] == "user" && r["message"]["content"].is_string()).unwrap();
    let uuid = target["uuid"].as_str().unwrap();
    let text = target["message"]["content"].as_str().unwrap();
    assert!(before["request"].to_string().contains(text));
    let snipped = daemon.request("ctx/snip", json!({"sessionId": "s", "uuids": [uuid, "no-such-uuid"]})).unwrap();
    assert!(snipped["tokensFreed"].as_u64().unwrap() > 0);
    assert_eq!(snipped["unknown"], json!(["no-such-uuid"]));
    let after = assemble(&mut daemon, json!({}));
    assert!(!after["request"].to_string().contains(text), "the snipped prompt is gone from the request");
    check_valid(&after["request"]);
    // A collapse of an early span, summarized by the offline summarizer.
    let from = records[2]["uuid"].as_str().unwrap();
    let to = records[12]["uuid"].as_str().unwrap();
    let collapsed = daemon.request("ctx/collapse", json!({"sessionId": "s", "from": from, "to": to})).unwrap();
    assert!(collapsed["tokensFreed"].as_u64().unwrap() > 0, "{collapsed}");
    let last = assemble(&mut daemon, json!({}));
    check_valid(&last["request"]);
    let (collapsed_tokens, snipped_tokens) =
        (last["requestTokens"].as_u64().unwrap(), after["requestTokens"].as_u64().unwrap());
    assert!(collapsed_tokens < snipped_tokens, "{collapsed_tokens} after the collapse, {snipped_tokens} before");
    let error = daemon.request_error("ctx/snip", json!({"sessionId": "s", "uuids": ["nope"]})).unwrap();
    assert_eq!(error["code"], -32602);
}

#[test]
fn after_a_restart_the_usage_still_counts_the_snips_and_collapses_since_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let (mut daemon, records) = example_session(dir.path(), 60);
    let usage = |daemon: &mut Daemon| {
        daemon.request("ctx/usage", json!({"sessionId": "s"})).unwrap()["usage"]["tokens"].as_u64().unwrap()
    };
    let before = usage(&mut daemon);
    let uuids: Vec<&str> = records[20..40]
        .iter()
        .filter(|r| r["message"]["content"].is_string())
        .filter_map(|r| r["uuid"].as_str())
        .collect();
    daemon.request("ctx/snip", json!({"sessionId": "s", "uuids": uuids})).unwrap();
    let (from, to) = (records[2]["uuid"].as_str().unwrap(), records[12]["uuid"].as_str().unwrap());
    daemon.request("ctx/collapse", json!({"sessionId": "s", "from": from, "to": to})).unwrap();
    let reduced = usage(&mut daemon);
    assert!(reduced < before, "{reduced} < {before}");
    // No response reports usage before the daemon dies: the records alone say what left.
    daemon.kill9().unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    assert_eq!(usage(&mut daemon), reduced);
}

#[test]
fn a_snip_is_taken_off_the_compaction_check_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut daemon, records) = example_session(dir.path(), 60);
    assemble(&mut daemon, json!({}));
    // Every plain prompt and text reply of the middle of the session.
    let uuids: Vec<&str> = records[5..50]
        .iter()
        .filter(|r| r["message"]["content"].is_string() || r["type"] == "assistant")
        .filter(|r| !r.to_string().contains("tool_use"))
        .filter_map(|r| r["uuid"].as_str())
        .collect();
    let snipped = daemon.request("ctx/snip", json!({"sessionId": "s", "uuids": uuids})).unwrap();
    let freed = snipped["tokensFreed"].as_u64().unwrap();
    let usage = snipped["usage"]["tokens"].as_u64().unwrap();
    assert!(freed * 50 > usage, "the snip frees enough to see: {freed} of {usage}");
    // The check before the next request counts the session as the usage does: the
    // snip taken off once, not a second time.
    let after = assemble(&mut daemon, json!({}));
    let check = after["applied"].as_array().unwrap().iter().find(|a| a["stage"] == "compact_check").unwrap();
    let counted: u64 = check["detail"].as_str().unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(
        counted.abs_diff(usage) * 100 <= usage,
        "the check counted {counted}, the usage is {usage}, the snip freed {freed}"
    );
}

#[test]
fn budget_notices_come_once_per_crossing() {
    let dir = tempfile::tempdir().unwrap();
    let project = project(dir.path());
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "s"})).unwrap();
    let notice = "of the room before automatic compaction is used";
    let count = |daemon: &mut Daemon| assemble(daemon, json!({}))["request"].to_string().matches(notice).count();
    // The example's own usage: ~107,000 tokens after 275 records is 64 % of 167,000.
    daemon.request("ctx/append", json!({"sessionId": "s", "records": example(275)})).unwrap();
    assert_eq!(count(&mut daemon), 0);
    // Past 70 %: one notice, and not again on the next request.
    let all = example(362);
    daemon.request("ctx/append", json!({"sessionId": "s", "records": &all[275..300]})).unwrap();
    assert_eq!(count(&mut daemon), 1);
    assert_eq!(count(&mut daemon), 1, "the notice stays where it was given, once");
}

#[test]
fn include_snipped_returns_the_scrollback_with_what_the_model_no_longer_sees() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": "/tmp", "model": MODEL, "sessionId": "s"})).unwrap();
    let records = example(40);
    daemon.request("ctx/append", json!({"sessionId": "s", "records": records})).unwrap();
    // Snip the first prompt (a plain user message).
    let victim = records.iter().find(|r| r["type"] == "user" && r["message"]["content"].is_string()).unwrap()["uuid"]
        .as_str()
        .unwrap()
        .to_owned();
    daemon.request("ctx/snip", json!({"sessionId": "s", "uuids": [victim]})).unwrap();

    let plain = assemble(&mut daemon, json!({}));
    assert!(plain.get("scrollback").is_none(), "only on request");
    let full = assemble(&mut daemon, json!({"includeSnipped": true}));
    let entries = full["scrollback"]["entries"].as_array().unwrap();
    let snipped =
        entries.iter().find(|e| e["uuid"] == victim.as_str()).expect("the snipped message is in the scrollback");
    assert_eq!(snipped["hidden"]["reason"], "snipped", "{snipped}");
    assert!(!full["request"].to_string().contains(&victim), "the model does not see it");
    let visible = entries.iter().filter(|e| e.get("hidden").is_none()).count();
    assert!(visible > 10 && visible < entries.len(), "{visible} of {}", entries.len());
    // The request itself is the same with or without the scrollback.
    assert_eq!(full["request"], plain["request"]);
    // The answer reads back as the protocol's types say, scrollback included.
    let typed: ctxd_proto::AssembleResult = serde_json::from_value(full.clone()).unwrap();
    let scrollback = typed.scrollback.clone().unwrap();
    assert_eq!(scrollback.entries.len(), entries.len());
    let hidden = scrollback.entries.iter().find(|e| e.uuid.as_deref() == Some(victim.as_str())).unwrap().hidden.clone();
    assert_eq!(hidden, Some(ctxd_proto::scrollback::Hidden::Snipped));
    assert_eq!(serde_json::to_value(&typed).unwrap(), full, "the typed answer writes back the same JSON");
}
