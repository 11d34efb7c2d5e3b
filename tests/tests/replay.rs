//! `ctxd replay`, the README's first command: the bundled example goes through a real
//! daemon as a host would drive it (each model request assembled before its reply is
//! appended), one line per turn, with the compaction it reaches.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::repo_root;

#[test]
fn the_bundled_example_shows_levels_and_a_compaction() {
    let home = tempfile::tempdir().unwrap();
    let out = ctxd_e2e::hermetic(&mut ctxd_e2e::ctxd_command(), home.path())
        .arg("replay")
        .arg(repo_root().join("examples/session.jsonl"))
        .env_remove("CLAUDE_CODE_AUTO_COMPACT_WINDOW")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("replaying session.jsonl (362 records) · model claude-sonnet-4-5-20250929 · window 200,000"),
        "{text}"
    );
    let turns = text.lines().filter(|l| l.starts_with("turn ")).count();
    assert!(turns >= 37, "{text}");
    for level in ["  ok", "  warning"] {
        assert!(text.lines().any(|l| l.starts_with("turn ") && l.ends_with(level)), "no turn at {level}: {text}");
    }
    // Automatic, or the summary prepared ahead if it was ready when the threshold came.
    assert!(text.contains("compacted (auto): ") || text.contains("compacted (precomputed): "), "{text}");
    let last_turn = text.lines().rfind(|l| l.starts_with("turn ")).unwrap();
    assert!(last_turn.ends_with("  ok"), "the session ends below its threshold after compacting: {text}");
    // Every model request is assembled first, so the compaction lands before a request
    // would go over the window: no turn ends past it, none at the blocked level.
    assert!(text.contains("window 200,000 (180,000 usable"), "{text}");
    for line in text.lines().filter(|l| l.starts_with("turn ")) {
        let percent: f64 = line.split_whitespace().find_map(|w| w.strip_suffix('%')).unwrap().parse().unwrap();
        assert!(percent <= 100.0 && !line.ends_with("blocked"), "{line}\n{text}");
    }
    let requests = text.lines().find_map(|l| {
        l.strip_suffix(" model requests assembled")
            .or_else(|| l.split_once(" model requests assembled,").map(|(n, _)| n))
    });
    assert!(requests.unwrap().parse::<usize>().unwrap() > 100, "{text}");
    assert!(text.contains("1 compaction(s)"), "one compaction, not a second on stale usage: {text}");
}
