//! What a compaction brings back over real pipes: skills the agent ran (reported with
//! `ctx/skillInvoked` or seen as `Skill` tool calls) within their budgets, oldest dropped
//! first, and the plan file as it is on disk at that moment; both carried across a
//! second compaction and a restart.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::path::Path;

use ctxd_e2e::{Daemon, example, records_of};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5-20250929";

/// The attachments installed after the latest boundary, by attachment type.
fn restored(state: &Path, id: &str, kind: &str) -> Vec<Value> {
    let records = records_of(state, id);
    let boundary = records.iter().rposition(|r| r["subtype"] == "compact_boundary").unwrap();
    records[boundary..].iter().filter(|r| r["attachment"]["type"] == kind).map(|r| r["attachment"].clone()).collect()
}

fn skill_names(attachment: &Value) -> Vec<String> {
    attachment["skills"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn skills_and_the_plan_come_back_after_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let plan = dir.path().join("plan.md");
    std::fs::write(&plan, "1. write the parser\n").unwrap();
    let mut daemon = Daemon::started(&state).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": dir.path(), "model": MODEL, "sessionId": "s"})).unwrap();
    daemon.request("ctx/append", json!({"sessionId": "s", "records": example(100)})).unwrap();
    daemon.request("ctx/setPlan", json!({"sessionId": "s", "path": plan})).unwrap();
    // Six skills of about 6,000 tokens each: each is cut to 5,000 and the oldest go
    // first to stay within 25,000.
    for i in 0..6 {
        let body = format!("Skill {i} step. ").repeat(2_000);
        daemon
            .request("ctx/skillInvoked", json!({"sessionId": "s", "name": format!("skill-{i}"), "content": body}))
            .unwrap();
    }
    // A Skill tool call and its result count too.
    let call = json!({"type": "assistant", "uuid": "sk-a", "parentUuid": null, "timestamp": "2026-11-29T10:00:00Z",
        "message": {"id": "msg_sk", "role": "assistant", "model": MODEL,
                    "content": [{"type": "tool_use", "id": "toolu_sk", "name": "Skill", "input": {"skill": "review"}}]}});
    let result = json!({"type": "user", "uuid": "sk-u", "parentUuid": "sk-a", "timestamp": "2026-11-29T10:00:01Z",
        "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_sk", "content": "Check every hunk of the diff."}]}});
    let appended = daemon.request("ctx/append", json!({"sessionId": "s", "records": [call, result]})).unwrap();
    assert!(appended["usage"]["breakdown"]["skills"].as_u64().unwrap() > 20_000, "{}", appended["usage"]["breakdown"]);
    // The plan changes on disk before the compaction: the new text is what comes back.
    std::fs::write(&plan, "1. write the parser\n2. PLAN-STEP-TWO\n").unwrap();

    daemon.request("ctx/compact", json!({"sessionId": "s"})).unwrap();
    let skills = restored(&state, "s", "invoked_skills");
    assert_eq!(skills.len(), 1);
    let names = skill_names(&skills[0]);
    assert_eq!(names.last().map(String::as_str), Some("review"), "oldest first, the newest last: {names:?}");
    assert!(!names.contains(&"skill-0".to_owned()), "the oldest is dropped: {names:?}");
    assert!(names.contains(&"skill-5".to_owned()) && names.contains(&"skill-2".to_owned()));
    let mut total = 0;
    for skill in skills[0]["skills"].as_array().unwrap() {
        let tokens = skill["content"].as_str().unwrap().len().div_ceil(4);
        assert!(tokens <= 5_050, "each skill is cut to 5,000 tokens: {tokens}");
        total += tokens;
    }
    assert!(total <= 25_100, "25,000 tokens of skills in all: {total}");
    let plans = restored(&state, "s", "plan_file_reference");
    assert_eq!(plans.len(), 1);
    assert!(plans[0]["planContent"].as_str().unwrap().contains("PLAN-STEP-TWO"));

    // A second compaction (after a restart) still knows both, from what the first installed.
    daemon.stop().unwrap();
    let mut daemon = Daemon::started(&state).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": dir.path(), "model": MODEL, "sessionId": "s"})).unwrap();
    daemon.request("ctx/append", json!({"sessionId": "s", "records": example(140)[100..].to_vec()})).unwrap();
    daemon.request("ctx/setPlan", json!({"sessionId": "s", "path": null})).unwrap();
    daemon.request("ctx/compact", json!({"sessionId": "s"})).unwrap();
    let again = restored(&state, "s", "invoked_skills");
    assert_eq!(skill_names(&again[0]), names, "the same skills, in the same order");
    assert!(restored(&state, "s", "plan_file_reference").is_empty(), "a plan set to null is forgotten");
}

#[test]
fn bad_skill_and_plan_params_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": "/tmp", "model": MODEL, "sessionId": "s"})).unwrap();
    let empty =
        daemon.request_error("ctx/skillInvoked", json!({"sessionId": "s", "name": " ", "content": "x"})).unwrap();
    assert_eq!(empty["code"], -32602);
    let relative = daemon.request_error("ctx/setPlan", json!({"sessionId": "s", "path": "plan.md"})).unwrap();
    assert_eq!(relative["code"], -32602);
    let unknown =
        daemon.request_error("ctx/skillInvoked", json!({"sessionId": "nope", "name": "a", "content": "x"})).unwrap();
    assert_eq!(unknown["code"], -33001);
}
