//! Claude Code transcripts in and out: `ctxd import` / `ctxd export` round-trip the real
//! transcripts line for line, malformed lines are reported by number, and
//! `ctx/openSession` with `import` resumes an imported session from its last boundary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::{Daemon, transcript};
use serde_json::json;

fn ctxd(state: &std::path::Path, args: &[&str]) -> std::process::Output {
    ctxd_e2e::ctxd_command().arg("--state-dir").arg(state).args(args).output().unwrap()
}

#[test]
fn real_transcripts_round_trip_line_for_line() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    for (n, name) in [
        "claude-code-2.1.332/manual-compact.jsonl",
        "spotter/4d5611e5-241a-462a-8d15-5122611a9569.jsonl",
        "spotter/subagent.jsonl",
        "spotter/tool_heavy.jsonl",
        "claude-code-log/representative_messages.jsonl",
        "ccusage/test-transcript.jsonl",
    ]
    .iter()
    .enumerate()
    {
        let source = transcript(name);
        let original = std::fs::read_to_string(&source).unwrap();
        let id = format!("s{n}");
        let out = ctxd(&state, &["import", source.to_str().unwrap(), "--session-id", &id]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("(0 lines skipped, 0 repaired)"), "{name}: {said}");
        let exported = ctxd(&state, &["export", &id]);
        assert!(exported.status.success());
        let want: String = original.lines().filter(|l| !l.trim().is_empty()).map(|l| format!("{l}\n")).collect();
        assert_eq!(String::from_utf8(exported.stdout).unwrap(), want, "{name}");
    }
}

#[test]
fn malformed_lines_are_reported_with_their_numbers_and_the_rest_imports() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let source = transcript("claude-code-log/edge_cases.jsonl");
    let out = ctxd(&state, &["import", source.to_str().unwrap(), "--session-id", "edge"]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Lines 13–16 of the fixture are a bare string, an object ctxd can read, a number and
    // an array; the three that are not objects are refused, by number.
    for n in [13, 15, 16] {
        assert!(stderr.contains(&format!("line {n}:")), "{stderr}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("imported 15 records"), "{stdout}");
}

#[test]
fn open_session_with_import_resumes_from_the_last_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let source = transcript("claude-code-2.1.332/manual-compact.jsonl");
    let opened = daemon
        .request(
            "ctx/openSession",
            json!({"cwd": "/home/dev/proj", "model": "claude-opus-5-5", "sessionId": "imported", "import": source}),
        )
        .unwrap();
    assert_eq!(opened["records"], 105);
    assert_eq!(opened["resumed"], true);
    // The response after the compaction reported 13,900 input + 50 output tokens.
    assert_eq!(opened["usage"]["reportedTokens"], 13_950);
    // Importing over an existing session is refused.
    let error = daemon
        .request_error("ctx/openSession", json!({"cwd": "/", "model": "m", "sessionId": "imported", "import": source}))
        .unwrap();
    assert_eq!(error["code"], -32602, "{error}");
}

#[test]
fn observe_follows_a_transcript_another_program_appends_to() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let text = std::fs::read_to_string(ctxd_e2e::repo_root().join("examples/session.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let path = dir.path().join("claude-session.jsonl");
    std::fs::write(&path, format!("{}\n", lines[..100].join("\n"))).unwrap();
    let observed = daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    let id = observed["sessionId"].as_str().unwrap().to_owned();
    let before = observed["usage"]["tokens"].as_u64().unwrap();
    assert!(before > 10_000, "{observed}");
    // Claude Code 2.1.332 makes no auto-compact decision for claude-sonnet-4-5: an
    // observed session of it shows none.
    assert_eq!(observed["usage"]["autoCompactEnabled"], false, "{observed}");
    // The example's own usage after its first `n` records: its last reply's report.
    let reported_after = |n: usize| -> u64 {
        lines[..n]
            .iter()
            .rev()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|r| r["type"] == "assistant")
            .map(|r| {
                ["input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"]
                    .iter()
                    .map(|k| r["message"]["usage"][k].as_u64().unwrap())
                    .sum()
            })
            .unwrap()
    };
    // Another program appends a turn, in two writes, the first ending in the middle of
    // the turn's last reply: the figure the daemon reaches needs that line put together.
    let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    let last_reply = (100..150).rfind(|&i| lines[i].contains(r#""type":"assistant""#)).unwrap();
    let more = format!("{}\n", lines[100..150].join("\n"));
    let cut = lines[100..last_reply].iter().map(|l| l.len() + 1).sum::<usize>() + lines[last_reply].len() / 2;
    let (head, tail) = more.split_at(cut);
    let whole_in_head = 100 + head.matches('\n').count();
    assert_eq!(whole_in_head, last_reply);
    assert_ne!(reported_after(whole_in_head), reported_after(100), "the first write holds a report of its own");
    file.write_all(head.as_bytes()).unwrap();
    file.flush().unwrap();
    // The daemon has read the first write, the cut line with it, once it shows the
    // report among its whole lines.
    daemon
        .wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == id.as_str() && p["usage"]["reportedTokens"] == reported_after(whole_in_head)
        })
        .unwrap();
    file.write_all(tail.as_bytes()).unwrap();
    // The figure the daemon reaches is the example's own usage after 150 records.
    let want = reported_after(150);
    assert_ne!(want, reported_after(whole_in_head), "the line cut in two holds the last report");
    let pushed = daemon
        .wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == id.as_str() && p["usage"]["reportedTokens"] == want
        })
        .unwrap();
    assert!(pushed["usage"]["tokens"].as_u64().unwrap() >= want);
    let error = daemon.request_error("ctx/observe", json!({"transcript": "relative.jsonl"})).unwrap();
    assert_eq!(error["code"], -32602);
}

#[test]
fn a_session_imported_over_its_window_is_compacted_before_its_next_request() {
    let dir = tempfile::tempdir().unwrap();
    // A generated session of about 260,000 tokens for a 200,000-token model.
    let source = dir.path().join("big.jsonl");
    std::fs::write(&source, ctxd_gen::jsonl(&ctxd_gen::Options { seed: 11, ..ctxd_gen::Options::tokens(260_000) }))
        .unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let model = "claude-sonnet-4-5-20250929";
    let opened = daemon
        .request("ctx/openSession", json!({"cwd": "/tmp", "model": model, "sessionId": "big", "import": source}))
        .unwrap();
    let before = opened["usage"]["tokens"].as_u64().unwrap();
    assert!(
        before > opened["usage"]["blocked"].as_u64().unwrap(),
        "the import is over its window: {}",
        opened["usage"]
    );

    // The next request waits for the automatic compaction and comes back under the threshold.
    let assembled = daemon
        .request(
            "ctx/assemble",
            json!({"sessionId": "big", "system": [{"type": "text", "text": "agent"}], "tools": [], "maxTokens": 8000}),
        )
        .unwrap();
    // The notification the assemble caused came before its answer.
    assert!(
        daemon.backlog().iter().any(|m| m["method"] == "ctx/compacted" && m["params"]["sessionId"] == "big"),
        "ctx/compacted did not precede the answer to the assemble that compacted"
    );
    let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "big").unwrap();
    assert_eq!(compacted["trigger"], "auto");
    let threshold = assembled["usage"]["threshold"].as_u64().unwrap();
    let request_tokens = assembled["requestTokens"].as_u64().unwrap();
    assert!(
        request_tokens < threshold,
        "the request sent is the compacted one: {request_tokens} vs threshold {threshold}"
    );
    assert!(
        assembled["request"].to_string().contains("Primary Request and Intent"),
        "the request starts from the summary"
    );
    assert!(assembled["request"].to_string().len() < 600_000, "never the whole history");
}

/// A transcript of one exchange whose response reported `input` input tokens.
fn exchange(input: u64) -> String {
    let user = json!({"type": "user", "uuid": format!("u-{input}"), "parentUuid": null, "message": {"role": "user", "content": "hi"}});
    let assistant = json!({"type": "assistant", "uuid": format!("a-{input}"), "parentUuid": format!("u-{input}"),
        "message": {"id": format!("msg-{input}"), "role": "assistant", "model": "claude-sonnet-4-5-20250929",
                    "content": [{"type": "text", "text": "hello"}], "usage": {"input_tokens": input, "output_tokens": 10}}});
    format!("{user}\n{assistant}\n")
}

#[test]
fn observe_claude_projects_follows_every_project_and_new_transcripts() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let projects = state.with_extension("home").join(".claude/projects");
    std::fs::create_dir_all(projects.join("-work-alpha")).unwrap();
    std::fs::write(projects.join("-work-alpha/older.jsonl"), exchange(1_000)).unwrap();
    std::fs::write(projects.join("-work-alpha/newest.jsonl"), exchange(2_000)).unwrap();
    // Which is newer is set, not left to the clock's resolution.
    let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3_600);
    std::fs::File::options()
        .write(true)
        .open(projects.join("-work-alpha/older.jsonl"))
        .unwrap()
        .set_modified(an_hour_ago)
        .unwrap();
    let mut daemon = Daemon::start_with(&state, &[], &[("CTXD_LOG", "ctxd=debug")]).unwrap();
    daemon
        .request(
            "initialize",
            json!({"capabilities": {}, "initializationOptions": {"settings": {"observeClaudeProjects": true}}}),
        )
        .unwrap();
    daemon.notify("initialized", json!({})).unwrap();
    // The running (newest) transcript of the existing project is followed at once.
    let log = state.with_extension("log");
    daemon
        .wait_notification("ctx/usageChanged", |p| p["usage"]["reportedTokens"] == 2_010)
        .unwrap_or_else(|e| panic!("{e}: {}", std::fs::read_to_string(&log).unwrap_or_default()));
    // A project that appears later, and a transcript started in it once the daemon
    // watches the project for new transcripts.
    std::fs::create_dir_all(projects.join("-work-beta")).unwrap();
    let watched = format!("dir={}", projects.join("-work-beta").display());
    daemon
        .wait_log("a watch on the new project", |line| line.contains("watching") && line.ends_with(&watched))
        .unwrap();
    let beta = projects.join("-work-beta/session.jsonl");
    std::fs::write(&beta, exchange(3_000)).unwrap();
    let first = daemon.wait_notification("ctx/usageChanged", |p| p["usage"]["reportedTokens"] == 3_010).unwrap();
    // It is followed as it grows.
    let mut text = std::fs::read_to_string(&beta).unwrap();
    text.push_str(&exchange(4_000));
    std::fs::write(&beta, text).unwrap();
    let grown = daemon.wait_notification("ctx/usageChanged", |p| p["usage"]["reportedTokens"] == 4_010).unwrap();
    assert_eq!(grown["sessionId"], first["sessionId"]);
    // And through ctx/observe with the project directory.
    let observed = daemon.request("ctx/observe", json!({"projectDir": projects.join("-work-alpha")})).unwrap();
    assert_eq!(observed["usage"]["reportedTokens"], 2_010);
    let empty = projects.join("-work-empty");
    std::fs::create_dir_all(&empty).unwrap();
    let error = daemon.request_error("ctx/observe", json!({"projectDir": empty})).unwrap();
    assert_eq!(error["code"], -32602);
    let both = daemon.request_error("ctx/observe", json!({"projectDir": empty, "transcript": beta})).unwrap();
    assert_eq!(both["code"], -32602);
}

#[test]
fn a_transcript_with_two_compactions_and_a_snip_resumes_after_the_second() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut lines = Vec::new();
    let mut parent: Option<String> = None;
    fn message(lines: &mut Vec<serde_json::Value>, parent: &mut Option<String>, uuid: &str, text: &str) {
        let mut r = ctxd_e2e::user_record(uuid, parent.as_deref(), text);
        r["parentUuid"] = json!(parent);
        lines.push(r);
        *parent = Some(uuid.to_owned());
    }
    for i in 0..4 {
        message(&mut lines, &mut parent, &format!("first-{i}"), &format!("FIRST-ERA message {i}"));
    }
    for (n, tag) in [(1, "SUMMARY-ONE"), (2, "SUMMARY-TWO")] {
        lines.push(json!({"type": "system", "subtype": "compact_boundary", "uuid": format!("boundary-{n}"), "parentUuid": null,
            "logicalParentUuid": parent, "content": "Conversation compacted", "compactMetadata": {"trigger": "auto", "preTokens": 150000}}));
        lines.push(json!({"type": "user", "uuid": format!("summary-{n}"), "parentUuid": format!("boundary-{n}"), "isCompactSummary": true,
            "message": {"role": "user", "content": format!("{tag}: what happened so far")}}));
        parent = Some(format!("summary-{n}"));
        for i in 0..4 {
            message(&mut lines, &mut parent, &format!("era{n}-{i}"), &format!("ERA-{n} message {i}"));
        }
    }
    let source = dir.path().join("two-compactions.jsonl");
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&source, &text).unwrap();

    let mut daemon = Daemon::started(&state).unwrap();
    let opened = daemon
        .request(
            "ctx/openSession",
            json!({"cwd": "/tmp", "model": "claude-sonnet-4-5-20250929", "sessionId": "two", "import": source}),
        )
        .unwrap();
    assert_eq!(opened["records"], lines.len() as u64);
    // A snip is ctxd's own record (an import would leave one out): made here, and
    // re-applied when the session resumes after a restart.
    daemon.request("ctx/snip", json!({"sessionId": "two", "uuids": ["era2-1", "era2-2"]})).unwrap();
    daemon.stop().unwrap();
    let mut daemon = Daemon::started(&state).unwrap();
    let assembled = daemon
        .request("ctx/assemble", json!({"sessionId": "two", "system": [], "tools": [], "maxTokens": 1000}))
        .unwrap();
    let request = assembled["request"].to_string();
    assert!(
        request.contains("SUMMARY-TWO") && request.contains("ERA-2 message 0") && request.contains("ERA-2 message 3"),
        "{request}"
    );
    assert!(
        !request.contains("SUMMARY-ONE") && !request.contains("ERA-1") && !request.contains("FIRST-ERA"),
        "only after the latest boundary"
    );
    assert!(!request.contains("ERA-2 message 1") && !request.contains("ERA-2 message 2"), "the snip is re-applied");
    daemon.stop().unwrap();
    // Export gives the transcript back line for line, less ctxd's own state records
    // (Claude Code would not know them).
    let exported = ctxd(&state, &["export", "two"]);
    assert_eq!(String::from_utf8(exported.stdout).unwrap(), text);
}
