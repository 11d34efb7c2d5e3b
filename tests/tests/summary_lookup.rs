//! Where a summary ctxd writes tells the model to look up the earlier conversation
//! (issue 36 item 4): the history tools of `ctxd mcp` when that server is configured
//! for the project, the transcript's path alone otherwise. Through the real binary:
//! `ctxd claude compact` on a Claude Code home whose project has, or has not, a
//! `.mcp.json` naming `ctxd mcp`, and `ctx/compact` of ctxd's own sessions in two such
//! projects.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::path::Path;

use ctxd_e2e::{Daemon, claude_code_home, ctxd_claude, example};
use serde_json::{Value, json};

const SESSION: &str = "b7d55388-c9ad-4169-a8d1-459fc6bdb46f";

/// The text of the summary message `ctxd claude compact --offline` appended.
fn compacted_summary(dir: &Path, home: &Path, transcript: &Path) -> String {
    let before = std::fs::metadata(transcript).unwrap().len() as usize;
    let out = ctxd_claude(dir, home, &["compact", SESSION, "--offline"]).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(transcript).unwrap();
    let summaries: Vec<String> = text[before..]
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["isCompactSummary"] == true)
        .map(|r| r["message"]["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(summaries.len(), 1, "one summary appended");
    summaries.into_iter().next().unwrap()
}

/// The paragraph of the summary message that names where to look things up.
fn lookup_paragraph(summary: &str) -> &str {
    summary
        .split("\n\n")
        .find(|p| p.starts_with("The complete record of the earlier conversation"))
        .unwrap_or_else(|| panic!("no paragraph says where the earlier conversation is:\n{summary}"))
}

#[test]
fn a_project_with_ctxd_mcp_gets_the_tool_named() {
    let dir = tempfile::tempdir().unwrap();
    let (home, transcript, project) = claude_code_home(dir.path(), str::to_owned);
    let server = json!({"type": "stdio", "command": "/opt/bin/ctxd", "args": ["--state-dir", "/s", "mcp"], "env": {}});
    std::fs::write(project.join(".mcp.json"), json!({"mcpServers": {"ctxd": server}}).to_string()).unwrap();
    let summary = compacted_summary(dir.path(), &home, &transcript);
    let lookup = lookup_paragraph(&summary);
    assert!(lookup.contains("mcp__ctxd__search_history"), "{lookup}");
    assert!(lookup.contains("mcp__ctxd__read_history"), "{lookup}");
    assert!(lookup.contains(transcript.to_str().unwrap()), "{lookup}");
}

#[test]
fn without_it_the_summary_names_the_path_only() {
    let dir = tempfile::tempdir().unwrap();
    let (home, transcript, project) = claude_code_home(dir.path(), str::to_owned);
    // Another MCP server of the project, and one named ctxd that runs something else.
    let servers = json!({"mcpServers": {"other": {"command": "node", "args": ["server.js"]},
        "ctxd": {"command": "ctxd", "args": ["serve"]}}});
    std::fs::write(project.join(".mcp.json"), servers.to_string()).unwrap();
    let summary = compacted_summary(dir.path(), &home, &transcript);
    let lookup = lookup_paragraph(&summary);
    assert!(lookup.contains(transcript.to_str().unwrap()), "{lookup}");
    assert!(!summary.contains("mcp__"), "{summary}");
}

#[test]
fn ctxds_own_sessions_name_the_tool_where_their_project_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let (with, without) = (dir.path().join("with"), dir.path().join("without"));
    for project in [&with, &without] {
        std::fs::create_dir(project).unwrap();
    }
    let server = json!({"command": "ctxd", "args": ["mcp"]});
    std::fs::write(with.join(".mcp.json"), json!({"mcpServers": {"recall": server}}).to_string()).unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    let records: Vec<Value> = example(usize::MAX).into_iter().take(40).collect();
    for (id, project) in [("w", &with), ("o", &without)] {
        let model = "claude-sonnet-4-5-20250929";
        daemon.request("ctx/openSession", json!({"cwd": project, "model": model, "sessionId": id})).unwrap();
        daemon.request("ctx/append", json!({"sessionId": id, "records": records})).unwrap();
        daemon.request("ctx/compact", json!({"sessionId": id})).unwrap();
    }
    let summary_of = |id: &str| -> String {
        let path = state.join(format!("sessions/{id}.jsonl"));
        let text = std::fs::read_to_string(&path).unwrap();
        let summary = text
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .rfind(|r| r["isCompactSummary"] == true)
            .unwrap_or_else(|| panic!("no summary in {}", path.display()));
        let content = &summary["message"]["content"];
        content.as_str().map(str::to_owned).unwrap_or_else(|| content[0]["text"].as_str().unwrap().to_owned())
    };
    let named = summary_of("w");
    let lookup = lookup_paragraph(&named);
    assert!(lookup.contains("mcp__recall__search_history") && lookup.contains("mcp__recall__read_history"), "{lookup}");
    assert!(lookup.contains("sessions/w.jsonl"), "{lookup}");
    let plain = summary_of("o");
    assert!(lookup_paragraph(&plain).contains("sessions/o.jsonl"), "{plain}");
    assert!(!plain.contains("mcp__"), "{plain}");
    daemon.stop().unwrap();
}
