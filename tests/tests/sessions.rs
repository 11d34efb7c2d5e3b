//! Sessions over real pipes: open, append, usage, close, resume, ordering, duplicates,
//! and the live usage notification.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::{Daemon, assistant_record, stored_uuids, user_record};
use serde_json::{Value, json};

fn open(daemon: &mut Daemon, id: Option<&str>) -> Value {
    let mut params = json!({"cwd": "/home/dev/project", "model": "claude-sonnet-4-5-20250929"});
    if let Some(id) = id {
        params["sessionId"] = json!(id);
    }
    daemon.request("ctx/openSession", params).unwrap()
}

#[test]
fn open_append_usage_close_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    let opened = open(&mut daemon, None);
    let id = opened["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(opened["resumed"], false);
    assert_eq!(opened["records"], 0);
    assert_eq!(opened["usage"]["tokens"], 0);
    assert_eq!(opened["usage"]["window"], 200_000);

    let records = json!([
        user_record("u1", None, "fix the bug"),
        assistant_record("a1", Some("u1"), "msg_1", 12_000, 500),
        user_record("u2", Some("a1"), &"x".repeat(4_000)),
    ]);
    let appended = daemon.request("ctx/append", json!({"sessionId": id, "records": records})).unwrap();
    assert_eq!(appended["appended"], 3);
    assert_eq!(appended["records"], 3);
    let usage = &appended["usage"];
    assert_eq!(usage["reportedTokens"], 12_500);
    // 4,000 characters plus the JSON quotes, at 4 bytes a token.
    assert_eq!(usage["estimatedTokens"], 1_001);
    assert_eq!(usage["tokens"], 13_501);
    assert_eq!(usage["level"], "ok");

    let again = daemon.request("ctx/usage", json!({"sessionId": id})).unwrap();
    assert_eq!(again["usage"], *usage);
    daemon.request("ctx/closeSession", json!({"sessionId": id})).unwrap();
    // A closed session that is in the store comes back on first use.
    let reopened = daemon.request("ctx/usage", json!({"sessionId": id})).unwrap();
    assert_eq!(reopened["usage"], *usage);
    assert!(daemon.stop().unwrap().success());

    // A new daemon resumes it with everything, in order.
    let mut daemon = Daemon::started(&state).unwrap();
    let resumed = open(&mut daemon, Some(&id));
    assert_eq!(resumed["resumed"], true);
    assert_eq!(resumed["records"], 3);
    assert_eq!(resumed["usage"]["tokens"], 13_501);
    assert_eq!(stored_uuids(&state, &id).unwrap(), ["u1", "a1", "u2"]);
}

#[test]
fn after_a_daemon_restart_sessions_resume_on_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, Some("again"));
    let records = json!([user_record("u1", None, "hello")]);
    daemon.request("ctx/append", json!({"sessionId": "again", "records": records})).unwrap();
    daemon.kill9().unwrap();
    // The editor's client restarts the daemon and carries on without reopening.
    let mut daemon = Daemon::started(&state).unwrap();
    let records = json!([user_record("u2", Some("u1"), "world")]);
    let appended = daemon.request("ctx/append", json!({"sessionId": "again", "records": records})).unwrap();
    assert_eq!(appended["records"], 2);
    assert_eq!(stored_uuids(&state, "again").unwrap(), ["u1", "u2"]);
    // A session that never existed is still unknown.
    let error = daemon.request_error("ctx/usage", json!({"sessionId": "never"})).unwrap();
    assert_eq!(error["code"], -33001);
}

#[test]
fn usage_is_pushed_when_a_session_opens() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let opened = open(&mut daemon, Some("pushed"));
    let pushed = daemon.wait_notification("ctx/usageChanged", |p| p["sessionId"] == "pushed").unwrap();
    assert_eq!(pushed["usage"], opened["usage"]);
}

#[test]
fn unknown_fields_are_stored_verbatim() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    let id = open(&mut daemon, Some("verbatim"))["sessionId"].as_str().unwrap().to_owned();
    let mut record = user_record("u1", None, "héllo \u{1f916}");
    record["someFutureField"] = json!({"nested": [1, 2.5, null, true], "z": "last"});
    record["promptId"] = json!("p-1");
    daemon.request("ctx/append", json!({"sessionId": id, "records": [record.clone()]})).unwrap();
    let line = std::fs::read_to_string(state.join("sessions/verbatim.jsonl")).unwrap();
    assert_eq!(line, format!("{}\n", serde_json::to_string(&record).unwrap()));
}

#[test]
fn five_hundred_pipelined_appends_are_stored_in_send_order() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    let id = open(&mut daemon, Some("pipelined"))["sessionId"].as_str().unwrap().to_owned();
    // All 500 requests in one write, without waiting for any reply.
    let mut bytes = Vec::new();
    let mut ids = Vec::new();
    let mut expected = Vec::new();
    for i in 0..500 {
        let uuid = format!("rec-{i:04}");
        let request = json!({"jsonrpc": "2.0", "id": 10_000 + i, "method": "ctx/append",
            "params": {"sessionId": id, "records": [user_record(&uuid, None, &format!("message {i}"))]}});
        bytes.extend(ctxd_e2e::frame(&serde_json::to_vec(&request).unwrap()));
        ids.push(10_000 + i);
        expected.push(uuid);
    }
    daemon.send_raw(&bytes).unwrap();
    let mut counts = Vec::new();
    for id in ids {
        let response = daemon.response(id).unwrap();
        assert!(response.get("error").is_none(), "{response}");
        counts.push(response["result"]["records"].as_u64().unwrap());
    }
    // Each reply reports the records stored once its own append was durable.
    for (i, count) in counts.iter().enumerate() {
        assert!(*count > i as u64, "reply {i} reports {count} records");
    }
    assert_eq!(stored_uuids(&state, &id).unwrap(), expected);
}

#[test]
fn a_resent_record_is_not_stored_twice() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    let id = open(&mut daemon, Some("dups"))["sessionId"].as_str().unwrap().to_owned();
    let records = json!([user_record("u1", None, "a"), user_record("u2", Some("u1"), "b")]);
    daemon.request("ctx/append", json!({"sessionId": id, "records": records})).unwrap();
    let again = json!([user_record("u2", Some("u1"), "b"), user_record("u3", Some("u2"), "c")]);
    let result = daemon.request("ctx/append", json!({"sessionId": id, "records": again})).unwrap();
    assert_eq!(result["appended"], 1);
    assert_eq!(result["duplicates"], 1);
    assert_eq!(stored_uuids(&state, &id).unwrap(), ["u1", "u2", "u3"]);
}

#[test]
fn usage_changed_is_pushed_after_appends_with_the_latest_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let id = open(&mut daemon, Some("live"))["sessionId"].as_str().unwrap().to_owned();
    for i in 0..20u64 {
        let records = json!([assistant_record(&format!("a{i}"), None, &format!("msg_{i}"), 1_000 * (i + 1), 10)]);
        daemon.request("ctx/append", json!({"sessionId": id, "records": records})).unwrap();
    }
    // Coalesced, but the last state always arrives.
    let last = daemon.wait_notification("ctx/usageChanged", |p| p["usage"]["tokens"] == 20_010).unwrap();
    assert_eq!(last["sessionId"], "live");
    assert_eq!(last["usage"]["reportedTokens"], 20_010);
    let pushed = daemon.drain_notifications("ctx/usageChanged");
    let tokens: Vec<u64> = pushed.iter().map(|p| p["usage"]["tokens"].as_u64().unwrap()).collect();
    assert!(tokens.iter().all(|&t| t <= 20_010), "a push after the last state went past it: {tokens:?}");
}

#[test]
fn one_session_waiting_on_nothing_does_not_hold_up_another() {
    // Two sessions interleaved on one connection: each keeps its own order.
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, Some("left"));
    open(&mut daemon, Some("right"));
    let mut ids = Vec::new();
    for i in 0..50 {
        for side in ["left", "right"] {
            let records = json!([user_record(&format!("{side}-{i}"), None, "x")]);
            ids.push(daemon.send_request("ctx/append", json!({"sessionId": side, "records": records})).unwrap());
        }
    }
    for id in ids {
        assert!(daemon.response(id).unwrap().get("error").is_none());
    }
    for side in ["left", "right"] {
        let want: Vec<String> = (0..50).map(|i| format!("{side}-{i}")).collect();
        assert_eq!(stored_uuids(&state, side).unwrap(), want);
    }
}

#[test]
fn records_sent_pretty_printed_or_compact_are_both_stored_as_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, Some("shapes"));
    let compact = json!({"jsonrpc": "2.0", "id": 900, "method": "ctx/append",
        "params": {"sessionId": "shapes", "records": [user_record("c1", None, "compact")]}});
    daemon.send(&compact).unwrap();
    // Pretty-printed: the record spans lines in the frame (the fast path declines it).
    let pretty = json!({"jsonrpc": "2.0", "id": 901, "method": "ctx/append",
        "params": {"sessionId": "shapes", "records": [user_record("p1", Some("c1"), "pretty")]}});
    daemon.send_raw(&ctxd_e2e::frame(serde_json::to_string_pretty(&pretty).unwrap().as_bytes())).unwrap();
    for id in [900, 901] {
        let response = daemon.response(id).unwrap();
        assert_eq!(response["result"]["appended"], 1, "{response}");
    }
    let text = std::fs::read_to_string(state.join("sessions/shapes.jsonl")).unwrap();
    assert_eq!(text.lines().count(), 2);
    assert_eq!(stored_uuids(&state, "shapes").unwrap(), ["c1", "p1"]);
}

#[test]
fn a_request_right_after_close_is_answered_by_the_session_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::started(&dir.path().join("state")).unwrap();
    let id = open(&mut daemon, None)["sessionId"].as_str().unwrap().to_owned();
    let mut parent: Option<String> = None;
    for round in 0..40 {
        let uuid = format!("r{round}");
        let record = user_record(&uuid, parent.as_deref(), "next");
        let appended = daemon.request("ctx/append", json!({"sessionId": id, "records": [record]})).unwrap();
        assert_eq!(appended["records"], round + 1);
        parent = Some(uuid);
        daemon.request("ctx/closeSession", json!({"sessionId": id})).unwrap();
        // Once the close is answered the actor is gone: this opens the session again
        // rather than reaching the one on its way out.
        let usage = daemon.request("ctx/usage", json!({"sessionId": id})).unwrap();
        assert!(usage["usage"]["tokens"].as_u64().unwrap() > 0, "round {round}: {usage}");
    }
}
