//! `ctxd replay`, the README's first command: the bundled example goes through a real
//! daemon, one line per turn, with the automatic compaction it reaches.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::process::Command;

use ctxd_e2e::{ctxd_bin, repo_root};

#[test]
fn the_bundled_example_shows_levels_and_a_compaction() {
    let out = Command::new(ctxd_bin())
        .arg("replay")
        .arg(repo_root().join("examples/session.jsonl"))
        .env_remove("CLAUDE_CODE_AUTO_COMPACT_WINDOW")
        .env("HOME", std::env::temp_dir().join("ctxd-replay-test-home"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("replaying session.jsonl (362 records) · model claude-sonnet-4-5-20250929 · window 200,000"), "{text}");
    let turns = text.lines().filter(|l| l.starts_with("turn ")).count();
    assert!(turns >= 37, "{text}");
    for level in ["  ok", "  warning"] {
        assert!(text.lines().any(|l| l.starts_with("turn ") && l.ends_with(level)), "no turn at {level}: {text}");
    }
    assert!(text.contains("compacted (auto): "), "{text}");
    let last_turn = text.lines().rfind(|l| l.starts_with("turn ")).unwrap();
    assert!(last_turn.ends_with("  ok"), "the session ends below its threshold after compacting: {text}");
}
