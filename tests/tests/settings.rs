//! Settings over real pipes: files on disk, the client's layer, live changes, saved
//! windows, and bad values reported by file and key.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::{Daemon, assistant_record};
use serde_json::json;

const MODEL: &str = "claude-sonnet-4-5-20250929";

#[test]
fn project_settings_set_the_window_and_bad_keys_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join(".ctxd")).unwrap();
    std::fs::write(
        project.join(".ctxd/settings.json"),
        r#"{"autoCompactWindow": 120000, "idleCompaction": "sometimes"}"#,
    )
    .unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let opened = daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL})).unwrap();
    assert_eq!(opened["usage"]["window"], 120_000);
    assert_eq!(opened["usage"]["threshold"], 120_000 - 20_000 - 13_000);
    let diagnostics = opened["diagnostics"].to_string();
    assert!(diagnostics.contains(".ctxd/settings.json: key `idleCompaction`"), "{diagnostics}");
}

#[test]
fn claude_code_settings_are_a_lower_layer() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let home = state.with_extension("home");
    std::fs::create_dir_all(home.join(".claude")).unwrap();
    std::fs::write(
        home.join(".claude/settings.json"),
        r#"{"autoCompactWindow": 150000, "autoCompactEnabled": false, "theme": "dark"}"#,
    )
    .unwrap();
    let mut daemon = Daemon::started(&state).unwrap();
    let opened = daemon.request("ctx/openSession", json!({"cwd": "/tmp", "model": MODEL})).unwrap();
    assert_eq!(opened["usage"]["window"], 150_000);
    assert_eq!(opened["usage"]["autoCompactEnabled"], false);
    assert!(opened.get("diagnostics").is_none(), "{opened}");
}

#[test]
fn did_change_configuration_moves_open_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start(&dir.path().join("state")).unwrap();
    daemon
        .request(
            "initialize",
            json!({"capabilities": {}, "initializationOptions": {"settings": {"autoCompactWindow": 300000}}}),
        )
        .unwrap();
    let opened =
        daemon.request("ctx/openSession", json!({"cwd": "/tmp", "model": MODEL, "sessionId": "live"})).unwrap();
    assert_eq!(opened["usage"]["window"], 200_000, "the model's own window caps the setting");
    daemon.notify("workspace/didChangeConfiguration", json!({"settings": {"autoCompactWindow": 100000}})).unwrap();
    let pushed = daemon.wait_notification("ctx/usageChanged", |p| p["usage"]["window"] == 100_000).unwrap();
    assert_eq!(pushed["sessionId"], "live");
    assert_eq!(pushed["usage"]["threshold"], 67_000);
}

#[test]
fn set_auto_compact_window_saves_per_model_and_auto_clears() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": "/tmp", "model": MODEL, "sessionId": "s"})).unwrap();
    let set = daemon.request("ctx/setAutoCompactWindow", json!({"model": MODEL, "window": 110000})).unwrap();
    assert_eq!(set["window"], 110_000);
    assert_eq!(set["source"], "setting");
    daemon.wait_notification("ctx/usageChanged", |p| p["usage"]["window"] == 110_000).unwrap();
    // Saved: a new daemon on the same store uses it.
    assert!(daemon.stop().unwrap().success());
    let mut daemon = Daemon::started(&state).unwrap();
    let opened = daemon.request("ctx/openSession", json!({"cwd": "/tmp", "model": MODEL, "sessionId": "s"})).unwrap();
    assert_eq!(opened["usage"]["window"], 110_000);
    let cleared = daemon.request("ctx/setAutoCompactWindow", json!({"model": MODEL, "window": "auto"})).unwrap();
    assert_eq!(cleared["window"], 200_000);
    assert_eq!(cleared["source"], "modelDefault");
    // Out of range values are clamped and say so.
    let low = daemon.request("ctx/setAutoCompactWindow", json!({"model": MODEL, "window": 5000})).unwrap();
    assert_eq!(low["window"], 100_000);
    assert!(!low["warnings"].as_array().unwrap().is_empty(), "{low}");
    assert_eq!(low["requested"], 5000);
    assert_eq!(low["adjustment"], "raisedToFloor");
    assert!(low["reason"].as_str().unwrap().contains("100000"), "{low}");
    // Above the model's window: capped, and the answer says why.
    let high = daemon.request("ctx/setAutoCompactWindow", json!({"model": MODEL, "window": 500000})).unwrap();
    assert_eq!((high["window"].as_u64(), high["modelWindow"].as_u64()), (Some(200_000), Some(200_000)));
    assert_eq!(high["adjustment"], "cappedToModel");
    assert!(high["reason"].as_str().unwrap().contains("at most 200000"), "{high}");
    // In range: nothing to explain.
    let fine = daemon.request("ctx/setAutoCompactWindow", json!({"model": MODEL, "window": 150000})).unwrap();
    assert!(fine.get("adjustment").is_none() && fine.get("reason").is_none(), "{fine}");
    let error = daemon.request_error("ctx/setAutoCompactWindow", json!({"model": MODEL, "window": "huge"})).unwrap();
    assert_eq!(error["code"], -32602);
}

#[test]
fn lowering_the_window_below_the_usage_compacts_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    daemon.request("ctx/openSession", json!({"cwd": "/tmp", "model": MODEL, "sessionId": "low"})).unwrap();
    let records = json!([
        ctxd_e2e::user_record("u1", None, "read the whole repository"),
        assistant_record("a1", Some("u1"), "msg_1", 120_000, 100),
    ]);
    let appended = daemon.request("ctx/append", json!({"sessionId": "low", "records": records})).unwrap();
    assert_eq!(appended["usage"]["level"], "ok", "120k of 200k is below the warning level: {appended}");
    daemon.request("ctx/setAutoCompactWindow", json!({"model": MODEL, "window": 100000})).unwrap();
    // No append follows: the lowered window alone starts the compaction.
    let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "low").unwrap();
    assert_eq!(compacted["trigger"], "auto");
    assert!(compacted["postTokens"].as_u64().unwrap() < 67_000, "{compacted}");
}

#[test]
fn environment_overrides_win_and_bad_values_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::start_with(
        &state,
        &[],
        &[("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "150k"), ("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE", "150")],
    )
    .unwrap();
    daemon.initialize().unwrap();
    let opened = daemon.request("ctx/openSession", json!({"cwd": "/tmp", "model": MODEL, "sessionId": "e"})).unwrap();
    assert_eq!(opened["usage"]["window"], 150_000);
    assert_eq!(opened["usage"]["threshold"], 150_000 - 20_000 - 13_000, "the bad percentage is ignored");
    let records = json!([assistant_record("a1", None, "m1", 120_000, 0)]);
    let appended = daemon.request("ctx/append", json!({"sessionId": "e", "records": records})).unwrap();
    assert_eq!(appended["usage"]["level"], "warning");
    let log = std::fs::read_to_string(state.with_extension("log")).unwrap();
    assert!(log.contains("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"), "the warning is logged");
}

#[test]
fn a_subagent_window_is_a_ceiling_that_survives_restart_and_clear() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let env = [("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "500k")];
    let mut daemon = Daemon::start_with(&state, &[], &env).unwrap();
    daemon.initialize().unwrap();
    let big = "claude-sonnet-4-5-20250929[1m]";
    let plain = daemon.request("ctx/openSession", json!({"cwd": "/tmp", "model": big})).unwrap();
    assert_eq!(plain["usage"]["window"], 500_000, "the environment sets the parent's window");
    let lowered = daemon
        .request("ctx/openSession", json!({"cwd": "/tmp", "model": big, "sessionId": "sub", "agent": {"name": "explore", "autoCompactWindow": 300000}}))
        .unwrap();
    assert_eq!(lowered["usage"]["window"], 300_000, "a lower ceiling wins over the environment");
    let raised = daemon
        .request("ctx/openSession", json!({"cwd": "/tmp", "model": big, "agent": {"autoCompactWindow": 900000}}))
        .unwrap();
    assert_eq!(raised["usage"]["window"], 500_000, "a ceiling never raises the window");
    let cleared = daemon.request("ctx/clear", json!({"sessionId": "sub"})).unwrap();
    assert_eq!(cleared["usage"]["window"], 300_000, "ctx/clear keeps the subagent's ceiling");
    daemon.stop().unwrap();

    // After a restart the session resumes on first use with its ceiling.
    let mut daemon = Daemon::start_with(&state, &[], &env).unwrap();
    daemon.initialize().unwrap();
    let usage = daemon.request("ctx/usage", json!({"sessionId": "sub"})).unwrap();
    assert_eq!(usage["usage"]["window"], 300_000);
}
