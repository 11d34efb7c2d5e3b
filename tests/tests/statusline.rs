//! `ctxd statusline` as Claude Code runs it: JSON on stdin, one line on stdout, on the
//! real transcripts vendored in `tests/fixtures/transcripts/`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::{claude_code_fixture, transcript};
use serde_json::json;

fn statusline(input: &serde_json::Value) -> String {
    ctxd_e2e::statusline_output(&[], &input.to_string())
}

#[test]
fn real_claude_code_transcript_after_a_manual_compaction() {
    // The last response (after the compaction) reported 13,900 input + 50 output tokens.
    // Claude Code 2.1.332's default model has a 1,000,000-token window (effective 980,000).
    let path = claude_code_fixture("manual-compact.jsonl");
    let line =
        statusline(&json!({"transcript_path": path, "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"}}));
    assert_eq!(line, "Opus 5.5 · ctx 13.9k / 1.00M (1.4%) · 953.0k to compact · ok");
    // With the program's own figures on stdin, they are the line; the percent is of the
    // window printed, to a tenth (the program rounds its own to a whole percent: 1).
    let line = statusline(&json!({
        "transcript_path": path,
        "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"},
        "context_window": {
            "context_window_size": 1_000_000,
            "current_usage": {"input_tokens": 13_900, "output_tokens": 50, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
            "used_percentage": 1,
        },
    }));
    assert_eq!(line, "Opus 5.5 · ctx 13.9k / 1.00M (1.4%) · 953.1k to compact · ok");
}

#[test]
fn ccusage_fixture_with_its_status_line_payload() {
    let payload: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(transcript("ccusage/statusline-test.json")).unwrap()).unwrap();
    let mut input = payload.clone();
    input["transcript_path"] = json!(transcript("ccusage/test-transcript.jsonl"));
    // Last usage: 2,000 input + 200 cache creation + 800 cache read + 100 output. The
    // payload states the window, so the percent is of it, as the program counts.
    let line = statusline(&input);
    assert_eq!(line, "Sonnet 4 · ctx 3.1k / 200.0k (1.6%) · 163.9k to compact · ok");
}

#[test]
fn before_the_first_turn_and_bad_input_still_print_a_line() {
    // Claude Code names the transcript before it writes its first line.
    let line = statusline(&json!({"transcript_path": "/nonexistent/session.jsonl"}));
    assert_eq!(line, "unknown · ctx 0 / 200.0k (0.0%) · 167.0k to compact · ok");
    let dir = tempfile::tempdir().unwrap();
    let line = statusline(&json!({"transcript_path": dir.path()}));
    assert!(line.starts_with("ctx: cannot read transcript"), "{line}");
}
