//! Usage over real pipes: one figure for status bars, `ctx/context` and the trigger,
//! with a breakdown whose parts add up.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::{Daemon, assistant_record, user_record};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5-20250929";

fn parts(usage: &Value) -> u64 {
    let b = &usage["breakdown"];
    let m = &b["messages"];
    ["systemPrompt", "tools", "memoryFiles", "skills"].iter().map(|k| b[k].as_u64().unwrap()).sum::<u64>()
        + ["toolResults", "summaries", "other"].iter().map(|k| m[k].as_u64().unwrap()).sum::<u64>()
}

fn check_sums(usage: &Value) {
    let tokens = usage["tokens"].as_u64().unwrap();
    assert_eq!(parts(usage), tokens, "the parts add up to the total: {usage}");
    let b = &usage["breakdown"];
    let window = usage["window"].as_u64().unwrap();
    assert_eq!(tokens + b["freeSpace"].as_u64().unwrap() + b["autocompactBuffer"].as_u64().unwrap(), window);
}

fn tool_result_record(uuid: &str, parent: &str, text: &str) -> Value {
    json!({
        "type": "user", "uuid": uuid, "parentUuid": parent, "timestamp": "2026-11-29T10:00:00Z",
        "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": text}]}
    })
}

#[test]
fn the_breakdown_names_every_part_and_they_add_up() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("CLAUDE.md"),
        format!("# Rules\n{}\n", "Always run the tests before a commit. ".repeat(40)),
    )
    .unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "s"})).unwrap();
    let tool_use = json!({
        "type": "assistant", "uuid": "a1", "parentUuid": "u1", "timestamp": "2026-11-29T10:00:00Z",
        "message": {"id": "msg_0", "role": "assistant", "model": MODEL,
                    "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]}
    });
    let records = vec![
        user_record("u1", None, "list the files please"),
        tool_use,
        tool_result_record("r1", "a1", &"file.rs\n".repeat(400)),
    ];
    daemon.request("ctx/append", json!({"sessionId": "s", "records": records})).unwrap();
    let system = json!([{"type": "text", "text": "You are a coding agent. ".repeat(100)}]);
    let tools =
        json!([{"name": "Bash", "description": "Run a command. ".repeat(200), "input_schema": {"type": "object"}}]);
    let assembled = daemon
        .request("ctx/assemble", json!({"sessionId": "s", "system": system, "tools": tools, "maxTokens": 8000}))
        .unwrap();

    // Before any report: the records' estimate plus the fixed prefix.
    let usage = daemon.request("ctx/usage", json!({"sessionId": "s"})).unwrap()["usage"].clone();
    check_sums(&usage);
    let b = &usage["breakdown"];
    assert!(b["systemPrompt"].as_u64().unwrap() >= 500, "{usage}");
    assert!(b["tools"].as_u64().unwrap() >= 700, "{usage}");
    assert!(b["memoryFiles"].as_u64().unwrap() >= 300, "{usage}");
    let tool_results = b["messages"]["toolResults"].as_u64().unwrap();
    assert!(tool_results >= 700 && tool_results > b["messages"]["other"].as_u64().unwrap(), "{usage}");
    assert_eq!(usage["reportedTokens"], 0);
    // The request's own estimate and the usage agree within the estimators' slack.
    let request_tokens = assembled["usage"]["tokens"].as_u64().unwrap();
    let tokens = usage["tokens"].as_u64().unwrap();
    assert!(tokens.abs_diff(request_tokens) * 10 < tokens, "usage {tokens} vs request {request_tokens}");
    // ctx/context shows the same numbers.
    let context = daemon.request("ctx/context", json!({"sessionId": "s"})).unwrap();
    assert_eq!(context["usage"], usage);

    // After a report the figure is the report (it holds the prefix) plus what follows.
    let mut answer = assistant_record("a2", Some("r1"), "msg_1", 9_000, 200);
    answer["message"]["usage"]["cache_read_input_tokens"] = json!(1_000);
    daemon
        .request("ctx/append", json!({"sessionId": "s", "records": [answer, user_record("u2", Some("a2"), "thanks")]}))
        .unwrap();
    let usage = daemon.request("ctx/usage", json!({"sessionId": "s"})).unwrap()["usage"].clone();
    check_sums(&usage);
    assert_eq!(usage["reportedTokens"], 10_200);
    assert_eq!(usage["tokens"].as_u64().unwrap(), 10_200 + usage["estimatedTokens"].as_u64().unwrap());
    assert!(usage["estimatedTokens"].as_u64().unwrap() < 10);
}
