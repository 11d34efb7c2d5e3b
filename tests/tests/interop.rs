//! Claude Code transcripts in and out: `ctxd import` / `ctxd export` round-trip the real
//! transcripts line for line, malformed lines are reported by number, and
//! `ctx/openSession` with `import` resumes an imported session from its last boundary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::process::Command;

use ctxd_e2e::{Daemon, ctxd_bin, shared_transcripts};
use serde_json::json;

fn ctxd(state: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(ctxd_bin()).arg("--state-dir").arg(state).args(args).output().unwrap()
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
        let source = shared_transcripts().join(name);
        let original = std::fs::read_to_string(&source).unwrap();
        let id = format!("s{n}");
        let out = ctxd(&state, &["import", source.to_str().unwrap(), "--session-id", &id]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("(0 malformed lines skipped)"), "{name}: {said}");
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
    let source = shared_transcripts().join("claude-code-log/edge_cases.jsonl");
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
    let source = shared_transcripts().join("claude-code-2.1.332/manual-compact.jsonl");
    let opened = daemon
        .request("ctx/openSession", json!({"cwd": "/home/dev/proj", "model": "claude-opus-5-5", "sessionId": "imported", "import": source}))
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
