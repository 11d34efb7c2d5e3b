//! Base context and the file-read ledger against real files: memory files written to
//! temporary directories (and to the daemon's own `HOME`), git repositories made by the
//! test, and the daemon's real watcher, all seen through `ctx/context`, `ctx/assemble`,
//! `ctx/fileRead` and `ctx/contextChanged`.
//!
//! The harness gives each daemon `HOME=<state>.home`, so user memory is
//! `<state>.home/.claude/CLAUDE.md` and auto memory is
//! `<state>.home/.claude/projects/<cwd, every non-alphanumeric as ->/memory/MEMORY.md`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::path::{Path, PathBuf};

use ctxd_e2e::{Daemon, user_record};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5-20250929";

fn write(path: &Path, text: impl AsRef<[u8]>) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The daemon's home for a state directory (as the harness sets it).
fn home_of(state: &Path) -> PathBuf {
    state.with_extension("home")
}

fn auto_memory(home: &Path, cwd: &Path) -> PathBuf {
    let folder = claude_folder(cwd);
    home.join(".claude/projects").join(folder).join("memory/MEMORY.md")
}

/// Claude Code's name for a project folder: every character that is not an ASCII letter
/// or digit becomes `-` (stated here on its own, not taken from the code under test).
fn claude_folder(cwd: &Path) -> String {
    cwd.display().to_string().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect()
}

fn open(daemon: &mut Daemon, session: &str, cwd: &Path) {
    daemon.request("ctx/openSession", json!({"cwd": cwd, "model": MODEL, "sessionId": session})).unwrap();
    let records = json!([user_record(&format!("{session}-u1"), None, "Hello.")]);
    daemon.request("ctx/append", json!({"sessionId": session, "records": records})).unwrap();
}

fn context(daemon: &mut Daemon, session: &str) -> Value {
    daemon.request("ctx/context", json!({"sessionId": session})).unwrap()
}

/// The assembled request, as JSON.
fn assemble(daemon: &mut Daemon, session: &str) -> Value {
    let params = json!({"sessionId": session, "system": [{"type": "text", "text": "You are a coding agent."}], "tools": [], "maxTokens": 4000});
    daemon.request("ctx/assemble", params).unwrap()["request"].clone()
}

/// The text of the request's first message (the user context).
fn first_message(request: &Value) -> String {
    let content = &request["messages"][0]["content"];
    match content {
        Value::String(s) => s.clone(),
        _ => content.as_array().unwrap().iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join("\n"),
    }
}

/// Memory files listed by `ctx/context` below `under`, as (path relative to `under`,
/// kind, status).
fn memory_files(view: &Value, under: &Path) -> Vec<(String, String, String)> {
    view["memoryFiles"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| {
            let path = Path::new(f["path"].as_str()?);
            let rel = path.strip_prefix(under).ok()?;
            Some((rel.display().to_string(), f["kind"].as_str()?.to_owned(), f["status"].as_str()?.to_owned()))
        })
        .collect()
}

fn diagnostics(view: &Value) -> Vec<String> {
    // Left out of the answer when there are none.
    view["diagnostics"].as_array().into_iter().flatten().map(|d| d.as_str().unwrap().to_owned()).collect()
}

fn wait_changed(daemon: &mut Daemon, path: &Path) -> Value {
    let want = json!(path.display().to_string());
    daemon
        .wait_notification("ctx/contextChanged", |p| p["paths"].as_array().is_some_and(|a| a.contains(&want)))
        .unwrap()
}

/// Positions of `markers` in `text`, failing on any that is missing.
fn positions(text: &str, markers: &[&str]) -> Vec<usize> {
    markers.iter().map(|m| text.find(m).unwrap_or_else(|| panic!("{m} missing from:\n{text}"))).collect()
}

/// Attachment records ctxd stored in the session's transcript, by attachment type.
fn stored_attachments(state: &Path, session: &str, kind: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(state.join("sessions").join(format!("{session}.jsonl"))).unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["type"] == "attachment" && r["attachment"]["type"] == kind)
        .collect()
}

#[test]
fn sources_are_placed_lowest_precedence_first() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let state = root.join("state");
    let home = home_of(&state);
    let cwd = root.join("top/project");
    // The managed policy file where the harness points the daemon, not the machine's.
    write(&ctxd_e2e::managed_memory(&home), "MANAGED-POLICY\n");
    write(&home.join(".claude/CLAUDE.md"), "USER-MEMORY\n");
    // Project files from the outermost folder down to the working directory.
    write(&root.join("CLAUDE.md"), "OUTER-CLAUDE\n");
    write(&root.join("top/.claude/CLAUDE.md"), "TOP-DOT-CLAUDE\n");
    write(&cwd.join("CLAUDE.md"), "CWD-CLAUDE\n");
    write(&cwd.join("AGENTS.md"), "CWD-AGENTS\n");
    write(&cwd.join(".claude/CLAUDE.md"), "CWD-DOT-CLAUDE\n");
    write(&cwd.join("CLAUDE.local.md"), "CWD-LOCAL\n");
    write(&cwd.join(".claude/rules/b-style.md"), "RULE-B\n");
    write(&cwd.join(".claude/rules/a-tests.md"), "RULE-A\n");
    write(&auto_memory(&home, &cwd), "AUTO-MEMORY\n");

    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "s", &cwd);
    let view = context(&mut daemon, "s");
    let files = memory_files(&view, root);
    assert_eq!(files.len(), view["memoryFiles"].as_array().unwrap().len(), "a memory file of the machine's: {view}");
    let listed: Vec<(&str, &str)> = files.iter().map(|(p, k, _)| (p.as_str(), k.as_str())).collect();
    let memory = format!("state.home/.claude/projects/{}/memory/MEMORY.md", claude_folder(&cwd));
    assert_eq!(
        listed,
        [
            ("state.home/managed-policy/CLAUDE.md", "managed"),
            ("state.home/.claude/CLAUDE.md", "user"),
            ("CLAUDE.md", "project"),
            ("top/.claude/CLAUDE.md", "project"),
            ("top/project/CLAUDE.md", "project"),
            ("top/project/AGENTS.md", "project"),
            ("top/project/.claude/CLAUDE.md", "project"),
            ("top/project/CLAUDE.local.md", "local"),
            ("top/project/.claude/rules/a-tests.md", "rule"),
            ("top/project/.claude/rules/b-style.md", "rule"),
            (memory.as_str(), "auto-memory"),
        ],
        "{view}"
    );
    assert!(files.iter().all(|(_, _, status)| status == "loaded"), "{files:?}");
    assert!(diagnostics(&view).is_empty(), "{view}");

    // The request carries them in the same order, in one meta user message.
    let request = assemble(&mut daemon, "s");
    let text = first_message(&request);
    assert!(text.contains("<system-reminder>"), "{text}");
    let order = [
        "MANAGED-POLICY",
        "USER-MEMORY",
        "OUTER-CLAUDE",
        "TOP-DOT-CLAUDE",
        "CWD-CLAUDE",
        "CWD-AGENTS",
        "CWD-DOT-CLAUDE",
        "CWD-LOCAL",
        "RULE-A",
        "RULE-B",
        "AUTO-MEMORY",
    ];
    let at = positions(&text, &order);
    assert!(at.windows(2).all(|w| w[0] < w[1]), "out of order: {at:?}\n{text}");
}

#[test]
fn imports_follow_relative_and_home_paths_stop_at_five_hops_and_report_a_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let home = home_of(&state);
    let cwd = dir.path().join("project");
    write(&cwd.join("CLAUDE.md"), "PROJECT\n@docs/style.md\n@~/.claude/personal.md\n@chain/h1.md\n@cycle/a.md\n");
    write(&cwd.join("docs/style.md"), "STYLE-IMPORT\n@../common/common.md\n");
    write(&cwd.join("common/common.md"), "COMMON-IMPORT\n");
    write(&home.join(".claude/personal.md"), "HOME-IMPORT\n");
    for hop in 1..=6 {
        write(&cwd.join(format!("chain/h{hop}.md")), format!("HOP-{hop}\n@h{}.md\n", hop + 1));
    }
    write(&cwd.join("cycle/a.md"), "CYCLE-A\n@b.md\n");
    write(&cwd.join("cycle/b.md"), "CYCLE-B\n@./a.md\n");

    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "s", &cwd);
    let view = context(&mut daemon, "s");
    let files = memory_files(&view, dir.path());
    let listed: Vec<(&str, &str)> = files.iter().map(|(p, k, _)| (p.as_str(), k.as_str())).collect();
    assert_eq!(
        listed,
        [
            ("project/CLAUDE.md", "project"),
            ("project/docs/style.md", "import"),
            ("project/common/common.md", "import"),
            ("state.home/.claude/personal.md", "import"),
            ("project/chain/h1.md", "import"),
            ("project/chain/h2.md", "import"),
            ("project/chain/h3.md", "import"),
            ("project/chain/h4.md", "import"),
            ("project/chain/h5.md", "import"),
            ("project/cycle/a.md", "import"),
            ("project/cycle/b.md", "import"),
        ],
        "{view}"
    );
    let problems = diagnostics(&view);
    let h6 = cwd.join("chain/h6.md").display().to_string();
    let too_deep: Vec<&String> = problems.iter().filter(|d| d.contains("more than 5 hops")).collect();
    assert_eq!(too_deep.len(), 1, "{problems:?}");
    assert!(too_deep[0].starts_with(&h6), "{problems:?}");
    let cycles: Vec<&String> = problems.iter().filter(|d| d.contains("import cycle")).collect();
    assert_eq!(cycles.len(), 1, "{problems:?}");
    assert!(cycles[0].starts_with(&cwd.join("cycle/a.md").display().to_string()), "{problems:?}");
    // h7 is named only by h6, which was never read: nothing about it.
    assert!(!problems.iter().any(|d| d.contains("h7.md")), "{problems:?}");

    let text = first_message(&assemble(&mut daemon, "s"));
    let at = positions(
        &text,
        &["PROJECT", "STYLE-IMPORT", "COMMON-IMPORT", "HOME-IMPORT", "HOP-1", "HOP-5", "CYCLE-A", "CYCLE-B"],
    );
    assert!(at.windows(2).all(|w| w[0] < w[1]), "imports follow their importer, depth first: {at:?}\n{text}");
    assert!(!text.contains("HOP-6"), "{text}");
    assert_eq!(text.matches("CYCLE-A").count(), 1, "a file in a cycle is placed once");
}

#[test]
fn a_paths_rule_loads_on_a_matching_read_and_is_told_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cwd = dir.path().join("project");
    write(&cwd.join(".claude/rules/rust.md"), "---\npaths:\n  - \"src/**/*.rs\"\n---\nRUST-RULE: no unwrap.\n");
    write(&cwd.join("README.md"), "# readme\n");
    write(&cwd.join("src/net/tcp.rs"), "pub fn connect() {}\n");

    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "s", &cwd);
    let view = context(&mut daemon, "s");
    assert_eq!(
        view["pendingRules"],
        json!([{"path": cwd.join(".claude/rules/rust.md"), "paths": ["src/**/*.rs"]}]),
        "{view}"
    );
    assert!(!assemble(&mut daemon, "s").to_string().contains("RUST-RULE"));

    // A read that does not match leaves it waiting.
    daemon.request("ctx/fileRead", json!({"sessionId": "s", "path": cwd.join("README.md")})).unwrap();
    assert_eq!(
        memory_files(&context(&mut daemon, "s"), &cwd),
        [(".claude/rules/rust.md".into(), "rule".into(), "waiting".into())]
    );
    assert!(!assemble(&mut daemon, "s").to_string().contains("RUST-RULE"));

    // A Read tool result for a matching file, as Claude Code appends it.
    let path = cwd.join("src/net/tcp.rs").display().to_string();
    let content = "pub fn connect() {}\n";
    let read = json!({
        "type": "user", "uuid": "r1", "parentUuid": "s-u1", "timestamp": "2026-11-29T10:00:02.000Z",
        "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_r1", "content": content}]},
        "toolUseResult": {"type": "text", "file": {"filePath": path, "content": content, "numLines": 1, "startLine": 1, "totalLines": 1}}
    });
    daemon.request("ctx/append", json!({"sessionId": "s", "records": [read]})).unwrap();
    let view = context(&mut daemon, "s");
    assert_eq!(memory_files(&view, &cwd), [(".claude/rules/rust.md".into(), "rule".into(), "loaded".into())]);
    assert_eq!(view["pendingRules"], json!([]));
    let first = assemble(&mut daemon, "s").to_string();
    assert_eq!(first.matches("RUST-RULE").count(), 1, "{first}");
    let second = assemble(&mut daemon, "s").to_string();
    assert_eq!(second.matches("RUST-RULE").count(), 1, "told once, where the read happened");
    assert_eq!(stored_attachments(&state, "s", "nested_memory").len(), 1);
}

#[test]
fn a_nested_claude_md_loads_when_a_file_below_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cwd = dir.path().join("project");
    write(&cwd.join("CLAUDE.md"), "TOP-LEVEL\n");
    write(&cwd.join("pkg/CLAUDE.md"), "NESTED-PKG\n");
    write(&cwd.join("pkg/deep/mod.rs"), "mod x;\n");
    write(&cwd.join("other/CLAUDE.md"), "NESTED-OTHER\n");

    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "s", &cwd);
    assert_eq!(
        memory_files(&context(&mut daemon, "s"), &cwd),
        [("CLAUDE.md".into(), "project".into(), "loaded".into())]
    );
    assert!(!assemble(&mut daemon, "s").to_string().contains("NESTED-PKG"));

    daemon.request("ctx/fileRead", json!({"sessionId": "s", "path": cwd.join("pkg/deep/mod.rs")})).unwrap();
    let files = memory_files(&context(&mut daemon, "s"), &cwd);
    assert_eq!(
        files,
        [
            ("CLAUDE.md".into(), "project".into(), "loaded".into()),
            ("pkg/CLAUDE.md".into(), "nested".into(), "loaded".into())
        ]
    );
    let request = assemble(&mut daemon, "s").to_string();
    assert_eq!(request.matches("NESTED-PKG").count(), 1, "{request}");
    assert!(!request.contains("NESTED-OTHER"), "a folder nothing was read in stays out");
    assert_eq!(assemble(&mut daemon, "s").to_string().matches("NESTED-PKG").count(), 1);

    // An edit to the nested file is a memory change too.
    let nested = cwd.join("pkg/CLAUDE.md");
    write(&nested, "NESTED-PKG v2\n");
    wait_changed(&mut daemon, &nested);
    let view = context(&mut daemon, "s");
    assert!(memory_files(&view, &cwd).contains(&("pkg/CLAUDE.md".into(), "nested".into(), "loaded".into())), "{view}");
}

#[test]
fn auto_memory_is_cut_at_200_lines_and_at_25_kb_with_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let home = home_of(&state);
    // 300 short lines: the line limit cuts first.
    let by_lines = dir.path().join("by-lines");
    std::fs::create_dir_all(&by_lines).unwrap();
    let text: String = (1..=300).map(|n| format!("memory line {n:03}\n")).collect();
    write(&auto_memory(&home, &by_lines), &text);
    // 150 lines of 300 bytes (45,000 bytes): the 25 KB limit cuts first.
    let by_bytes = dir.path().join("by-bytes");
    std::fs::create_dir_all(&by_bytes).unwrap();
    let text: String = (1..=150).map(|n| format!("wide {n:03} {}\n", "x".repeat(290))).collect();
    assert_eq!(text.len(), 45_000);
    write(&auto_memory(&home, &by_bytes), &text);

    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "lines", &by_lines);
    let memory = first_message(&assemble(&mut daemon, "lines"));
    assert!(memory.contains("memory line 200"), "{memory}");
    assert!(!memory.contains("memory line 201"), "line 201 is past the cut");
    assert!(memory.contains("[Cut: only lines 1-200 (3200 bytes) of 300 lines (4800 bytes) are shown."), "{memory}");

    open(&mut daemon, "bytes", &by_bytes);
    let memory = first_message(&assemble(&mut daemon, "bytes"));
    // 85 whole lines of 300 bytes fit in 25,600 bytes; the 86th does not.
    assert!(memory.contains("wide 085 "), "{memory}");
    assert!(!memory.contains("wide 086 "), "past 25 KB");
    assert!(memory.contains("[Cut: only lines 1-85 (25500 bytes) of 150 lines (45000 bytes) are shown."), "{memory}");
    let view = context(&mut daemon, "bytes");
    let tokens = view["memoryFiles"].as_array().unwrap().iter().find(|f| f["kind"] == "auto-memory").unwrap()["tokens"]
        .as_u64()
        .unwrap();
    assert!((6_400..7_000).contains(&tokens), "about 25 KB counted, not 45: {tokens}");
}

#[test]
fn a_claude_md_created_later_and_an_atomic_save_reach_the_next_request() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cwd = dir.path().join("project");
    std::fs::create_dir_all(&cwd).unwrap();
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "s", &cwd);
    assert!(!assemble(&mut daemon, "s").to_string().contains("CREATED-LATER"));

    // Created after the session started, in a .claude folder that did not exist either.
    let file = cwd.join(".claude/CLAUDE.md");
    write(&file, "CREATED-LATER v1\n");
    wait_changed(&mut daemon, &file);
    let text = first_message(&assemble(&mut daemon, "s"));
    assert!(text.contains("CREATED-LATER v1"), "{text}");

    // An editor's save: the new text goes to a temporary file renamed over the old one.
    let tmp = cwd.join(".claude/.CLAUDE.md.tmp");
    std::fs::write(&tmp, "CREATED-LATER v2\n").unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    wait_changed(&mut daemon, &file);
    let text = first_message(&assemble(&mut daemon, "s"));
    assert!(text.contains("CREATED-LATER v2") && !text.contains("CREATED-LATER v1"), "{text}");

    // The watch survived the rename: a second atomic save is seen too.
    std::fs::write(&tmp, "CREATED-LATER v3\n").unwrap();
    std::fs::rename(&tmp, &file).unwrap();
    wait_changed(&mut daemon, &file);
    let text = first_message(&assemble(&mut daemon, "s"));
    assert!(text.contains("CREATED-LATER v3") && !text.contains("CREATED-LATER v2"), "{text}");
}

#[test]
fn one_external_edit_of_a_read_file_is_exactly_one_changed_file_attachment() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cwd = dir.path().join("project");
    let source = cwd.join("lib.rs");
    write(&source, "pub fn one() {}\n");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "s", &cwd);
    daemon.request("ctx/fileRead", json!({"sessionId": "s", "path": source})).unwrap();

    // One save that is several writes on disk: truncate, two writes, a permission change.
    // (How many notifications that makes depends on how the writes fall against the
    // debounce on a loaded machine; what the model is told must not.)
    {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        let mut file = std::fs::File::create(&source).unwrap();
        file.write_all(b"pub fn one() {}\n").unwrap();
        file.flush().unwrap();
        file.write_all(b"pub fn two() {}\n").unwrap();
        drop(file);
        std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o640)).unwrap();
    }
    wait_changed(&mut daemon, &source);
    // Every notification of the save is in before the requests.
    daemon.settle_watcher("s", &cwd.join("CLAUDE.md")).unwrap();

    let first = assemble(&mut daemon, "s").to_string();
    assert_eq!(first.matches("changed on disk after you read it").count(), 1, "{first}");
    assert!(first.contains("pub fn two() {}"));
    let second = assemble(&mut daemon, "s").to_string();
    assert_eq!(second.matches("changed on disk after you read it").count(), 1);
    assert_eq!(stored_attachments(&state, "s", "edited_text_file").len(), 1, "exactly one attachment");
    assert_eq!(context(&mut daemon, "s")["staleFiles"], Value::Null, "told, so no longer stale");

    // A later edit is a new change: one more.
    std::fs::write(&source, "pub fn three() {}\n").unwrap();
    wait_changed(&mut daemon, &source);
    let third = assemble(&mut daemon, "s").to_string();
    assert_eq!(third.matches("changed on disk after you read it").count(), 2);
    assert_eq!(stored_attachments(&state, "s", "edited_text_file").len(), 2);
}

#[test]
fn unreadable_and_non_utf8_memory_files_are_diagnostics_not_a_failed_session() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cwd = dir.path().join("project");
    write(&cwd.join("CLAUDE.md"), b"caf\xe9 latin-1\n");
    write(&cwd.join("AGENTS.md"), "GOOD-AGENTS\n");
    // A folder where a memory file should be: unreadable for root as well.
    std::fs::create_dir_all(cwd.join("CLAUDE.local.md")).unwrap();
    let locked = cwd.join(".claude/CLAUDE.md");
    write(&locked, "LOCKED\n");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    // Mode 000 keeps an ordinary user out. Root reads it all the same, so as root the
    // file goes to another owner and the daemon runs where root's power stops at the
    // files root owns: either way the daemon cannot read it.
    let mut daemon = if std::fs::read(&locked).is_err() {
        Daemon::start(&state).unwrap()
    } else {
        std::os::unix::fs::chown(&locked, Some(65_534), Some(65_534)).unwrap();
        Daemon::start_in_user_namespace(&state).unwrap()
    };
    daemon.initialize().unwrap();
    open(&mut daemon, "s", &cwd);
    let view = context(&mut daemon, "s");
    let problems = diagnostics(&view);
    let about = |path: &Path| {
        problems.iter().filter(|d| d.starts_with(&path.display().to_string())).cloned().collect::<Vec<_>>()
    };
    assert_eq!(
        about(&cwd.join("CLAUDE.md")),
        [format!("{}: not loaded, not UTF-8 text (bad byte at offset 3)", cwd.join("CLAUDE.md").display())]
    );
    assert_eq!(
        about(&cwd.join("CLAUDE.local.md")),
        [format!(
            "{}: not loaded, cannot read: is a directory, not a regular file; ctxd reads only regular files",
            cwd.join("CLAUDE.local.md").display()
        )]
    );
    let files = memory_files(&view, &cwd);
    let locked_problems = about(&locked);
    assert_eq!(locked_problems.len(), 1, "{problems:?}");
    assert!(locked_problems[0].contains("cannot read: permission denied"), "{problems:?}");
    assert_eq!(files, [("AGENTS.md".into(), "project".into(), "loaded".into())]);
    // The rest of the session goes on.
    let request = first_message(&assemble(&mut daemon, "s"));
    assert!(request.contains("GOOD-AGENTS"), "{request}");
    assert!(!request.contains("latin-1"));
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o644)).unwrap();
}

#[test]
fn the_git_section_is_there_for_a_repository_and_absent_for_a_plain_folder() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git").args(args).current_dir(&repo).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    git(&["init", "-q", "-b", "trunk"]);
    git(&["config", "user.name", "Test Person"]);
    git(&["config", "user.email", "t@example.invalid"]);
    write(&repo.join("README.md"), "hi\n");
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "the first commit"]);
    write(&repo.join("new.txt"), "untracked\n");
    let plain = dir.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();

    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    open(&mut daemon, "repo", &repo);
    assert_eq!(context(&mut daemon, "repo")["git"], true);
    let request = assemble(&mut daemon, "repo");
    let system: Vec<&str> = request["system"].as_array().unwrap().iter().filter_map(|b| b["text"].as_str()).collect();
    assert_eq!(system[0], "You are a coding agent.");
    let git_block = system.iter().find(|t| t.contains("Git repository state")).unwrap_or_else(|| panic!("{system:?}"));
    for fact in ["Current branch: trunk", "Git user: Test Person", "the first commit", "?? new.txt"] {
        assert!(git_block.contains(fact), "{fact} missing: {git_block}");
    }

    open(&mut daemon, "plain", &plain);
    assert_eq!(context(&mut daemon, "plain")["git"], false);
    let request = assemble(&mut daemon, "plain");
    let system = request["system"].to_string();
    assert!(!system.contains("Git repository state") && !system.contains("Current branch"), "{system}");
}

#[test]
fn without_os_notifications_changes_are_found_before_each_request() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let cwd = dir.path().join("project");
    let memory = cwd.join("CLAUDE.md");
    let source = cwd.join("lib.rs");
    write(&memory, "RULES v1\n");
    write(&source, "pub fn one() {}\n");
    let mut daemon = Daemon::start_with(&state, &[], &[("CTXD_NO_WATCH", "1")]).unwrap();
    daemon.initialize().unwrap();
    open(&mut daemon, "s", &cwd);
    daemon.request("ctx/fileRead", json!({"sessionId": "s", "path": source})).unwrap();
    assert!(first_message(&assemble(&mut daemon, "s")).contains("RULES v1"));

    // Read before the last request, edited after it; and a memory file saved atomically.
    std::fs::write(&source, "pub fn one() {}\npub fn two() {}\n").unwrap();
    let tmp = cwd.join(".CLAUDE.md.tmp");
    std::fs::write(&tmp, "RULES v2\n").unwrap();
    std::fs::rename(&tmp, &memory).unwrap();
    let request = assemble(&mut daemon, "s");
    let text = request.to_string();
    assert_eq!(text.matches("changed on disk after you read it").count(), 1, "{text}");
    assert!(first_message(&request).contains("RULES v2"), "{request}");
    let told = daemon.drain_notifications("ctx/contextChanged");
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0]["paths"], json!([memory.display().to_string(), source.display().to_string()]));
    // Nothing new: nothing more.
    assert_eq!(assemble(&mut daemon, "s").to_string().matches("changed on disk after you read it").count(), 1);

    // Read after the last request and edited before the next one.
    let other = cwd.join("other.rs");
    write(&other, "pub fn a() {}\n");
    daemon.request("ctx/fileRead", json!({"sessionId": "s", "path": other})).unwrap();
    std::fs::write(&other, "pub fn b() {}\n").unwrap();
    let text = assemble(&mut daemon, "s").to_string();
    assert_eq!(text.matches("changed on disk after you read it").count(), 2, "{text}");
    assert!(text.contains("pub fn b() {}"));
}
