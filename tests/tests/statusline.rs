//! `ctxd statusline` as Claude Code runs it: JSON on stdin, one line on stdout, on the
//! real transcripts vendored in `tests/fixtures/transcripts/`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::io::Write;
use std::process::{Command, Stdio};

use ctxd_e2e::{ctxd_bin, transcript};
use serde_json::json;

fn statusline(input: &serde_json::Value) -> String {
    let mut child = Command::new(ctxd_bin())
        .arg("statusline")
        .env_remove("CLAUDE_CODE_AUTO_COMPACT_WINDOW")
        .env_remove("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim_end().to_owned()
}

#[test]
fn real_claude_code_transcript_after_a_manual_compaction() {
    // The last response (after the compaction) reported 13,900 input + 50 output tokens.
    let path = transcript("claude-code-2.1.332/manual-compact.jsonl");
    let line =
        statusline(&json!({"transcript_path": path, "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"}}));
    assert_eq!(line, "Opus 5.5 · ctx 13.9k / 200.0k (7.8%) · 153.1k to compact · ok");
}

#[test]
fn ccusage_fixture_with_its_status_line_payload() {
    let payload: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(transcript("ccusage/statusline-test.json")).unwrap()).unwrap();
    let mut input = payload.clone();
    input["transcript_path"] = json!(transcript("ccusage/test-transcript.jsonl"));
    // Last usage: 2,000 input + 200 cache creation + 800 cache read + 100 output.
    let line = statusline(&input);
    assert_eq!(line, "Sonnet 4 · ctx 3.1k / 200.0k (1.7%) · 163.9k to compact · ok");
}

#[test]
fn bad_input_still_prints_a_line() {
    let line = statusline(&json!({"transcript_path": "/nonexistent/session.jsonl"}));
    assert!(line.starts_with("ctx: cannot read transcript"), "{line}");
}
