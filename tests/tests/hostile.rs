//! What a hostile client, transcript or repository could do, each as a test over the
//! real binary: the cases of the hardening review, one test (or more) per case, in the
//! short form CI runs. `SECURITY.md` states the guarantees they check.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::{Daemon, stored_uuids, user_record};
use serde_json::{Value, json};

fn open(daemon: &mut Daemon, id: &str) -> Value {
    daemon.request("ctx/openSession", json!({"cwd": "/p", "model": "claude-sonnet-4-5", "sessionId": id})).unwrap()
}

fn append(daemon: &mut Daemon, id: &str, records: Value) -> Value {
    daemon.request("ctx/append", json!({"sessionId": id, "records": records})).unwrap()
}

/// Files beside a session's transcript (what a recovery moved aside).
fn set_aside(state: &std::path::Path, id: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(state.join("sessions"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(id) && n != &format!("{id}.jsonl"))
        .collect();
    names.sort();
    names
}

fn client_boundary(uuid: &str) -> Value {
    json!({"type": "system", "subtype": "compact_boundary", "uuid": uuid, "parentUuid": null,
           "compactMetadata": {"trigger": "manual", "preTokens": 1000, "ctxdBatch": 50}})
}

/// Case 1: a boundary a client sends that carries ctxd's install-batch field is not
/// taken for ctxd's own unfinished install: every acknowledged record is there after a
/// restart, in the view, and nothing is moved aside.
#[test]
fn a_client_boundary_with_ctxds_batch_field_cuts_nothing_at_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "s");
    let records = json!([
        user_record("u1", None, "one"),
        client_boundary("b1"),
        user_record("u2", Some("b1"), "two"),
        user_record("u3", Some("u2"), "three"),
    ]);
    let appended = append(&mut daemon, "s", records);
    assert_eq!(appended["appended"], 4, "{appended}");
    daemon.stop().unwrap();

    let mut daemon = Daemon::started(&state).unwrap();
    let reopened = open(&mut daemon, "s");
    assert_eq!(reopened["records"], 4, "{reopened}");
    assert_eq!(stored_uuids(&state, "s").unwrap(), ["u1", "b1", "u2", "u3"]);
    assert_eq!(set_aside(&state, "s"), Vec::<String>::new());
    // The field ctxd acts on was not stored; the rest of the boundary was.
    let stored = std::fs::read_to_string(state.join("sessions/s.jsonl")).unwrap();
    assert!(!stored.contains("ctxdBatch"), "{stored}");
    assert!(stored.contains(r#""preTokens":1000"#), "{stored}");
    // The view after the client's boundary holds the two records after it.
    let request = daemon
        .request("ctx/assemble", json!({"sessionId": "s", "system": [], "tools": [], "maxTokens": 1000}))
        .unwrap();
    let text = request["request"]["messages"].to_string();
    assert!(text.contains("two") && text.contains("three") && !text.contains("\"one\""), "{text}");
}

/// Case 1 through `ctxd import`: the same records in a file, imported, then opened.
#[test]
fn an_imported_boundary_with_ctxds_batch_field_cuts_nothing_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let source = dir.path().join("in.jsonl");
    let lines = [
        user_record("u1", None, "one"),
        client_boundary("b1"),
        user_record("u2", Some("b1"), "two"),
        user_record("u3", Some("u2"), "three"),
        json!({"type": "ctxd-snip", "uuid": "x1", "removedUuids": ["u2", "u3"]}),
    ];
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&source, text.join("\n") + "\n").unwrap();
    let out = std::process::Command::new(ctxd_e2e::ctxd_bin())
        .args(["--state-dir"])
        .arg(&state)
        .args(["import", "--session-id", "imp"])
        .arg(&source)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said} {}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("imported 4 records") && said.contains("1 lines skipped, 1 repaired"), "{said}");

    let mut daemon = Daemon::started(&state).unwrap();
    let opened = open(&mut daemon, "imp");
    assert_eq!(opened["records"], 4, "{opened}");
    assert_eq!(stored_uuids(&state, "imp").unwrap(), ["u1", "b1", "u2", "u3"]);
    assert_eq!(set_aside(&state, "imp"), Vec::<String>::new());
    // The snip a file carried was not imported, so it removes nothing from the view.
    let request = daemon
        .request("ctx/assemble", json!({"sessionId": "imp", "system": [], "tools": [], "maxTokens": 1000}))
        .unwrap();
    let text = request["request"]["messages"].to_string();
    assert!(text.contains("two") && text.contains("three"), "{text}");
}

/// Only ctxd writes its own records: a client's `ctxd-*` record or undo record is
/// refused with the reason, and nothing of that append is stored.
#[test]
fn a_client_cannot_append_ctxds_own_records() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "s");
    for own in [
        json!({"type": "ctxd-file-read", "uuid": "r1", "path": "/etc/passwd"}),
        json!({"type": "system", "subtype": "ctxd_undo_compact", "uuid": "r2", "boundaryUuid": "b"}),
    ] {
        let error = daemon
            .request_error("ctx/append", json!({"sessionId": "s", "records": [user_record("ok", None, "x"), own]}))
            .unwrap();
        assert_eq!(error["code"], -33004, "{error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.starts_with("records[1]: ") && message.contains("ctxd's own"), "{message}");
    }
    assert!(stored_uuids(&state, "s").unwrap().is_empty());
}

/// Strict JSON on every route in: an unpaired surrogate escape or a number no double
/// holds is refused whole, and a message record needs a uuid (a resend is then dropped
/// as a duplicate).
#[test]
fn appended_records_are_strict_json_with_a_uuid() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "s");
    let good = user_record("g1", None, "fine");
    for bad in [
        r#"{"type":"user","uuid":"a1","message":{"role":"user","content":"\ud800"}}"#,
        r#"{"type":"user","uuid":"a2","message":{"role":"user","content":"x"},"n":1e400}"#,
    ] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":77,"method":"ctx/append","params":{{"sessionId":"s","records":[{good},{bad}]}}}}"#
        );
        daemon.send_raw(&ctxd_e2e::frame(body.as_bytes())).unwrap();
        let response = loop {
            let message = daemon.next_message().unwrap();
            if message.get("method").is_none() {
                break message;
            }
        };
        let code = response["error"]["code"].as_i64();
        assert!(matches!(code, Some(-32700 | -32602 | -33004)), "{bad}: {response}");
    }
    let no_uuid = json!({"type": "user", "message": {"role": "user", "content": "who am I"}});
    let error = daemon.request_error("ctx/append", json!({"sessionId": "s", "records": [no_uuid]})).unwrap();
    assert!(error["message"].as_str().unwrap().contains("needs a \"uuid\""), "{error}");
    assert!(stored_uuids(&state, "s").unwrap().is_empty());
    // A resend after a lost acknowledgement is dropped by its uuid.
    assert_eq!(append(&mut daemon, "s", json!([good.clone()]))["appended"], 1);
    let again = append(&mut daemon, "s", json!([good]));
    assert_eq!((again["appended"].as_u64(), again["duplicates"].as_u64()), (Some(0), Some(1)), "{again}");
}
