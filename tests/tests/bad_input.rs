//! Bad input never takes the daemon down: each malformed frame or message gets the
//! right JSON-RPC error with a message that says what was wrong, and the next valid
//! request still succeeds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::{Daemon, frame, user_record};
use serde_json::{Value, json};

fn daemon() -> (tempfile::TempDir, Daemon) {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start_with(&dir.path().join("state"), &["--max-message-bytes", "100000"], &[]).unwrap();
    daemon.initialize().unwrap();
    daemon.request("ctx/openSession", json!({"cwd": "/p", "model": "claude-sonnet-4-5", "sessionId": "s"})).unwrap();
    (dir, daemon)
}

/// A valid request after the bad input: the daemon still serves, and nothing stored
/// was lost.
fn still_serving(daemon: &mut Daemon, marker: &str) {
    let records = json!([user_record(marker, None, "after bad input")]);
    let result = daemon.request("ctx/append", json!({"sessionId": "s", "records": records})).unwrap();
    assert!(result["appended"] == 1, "{result}");
    let stored = ctxd_e2e::stored_uuids(&daemon.state_dir, "s").unwrap();
    assert_eq!(stored.last().map(String::as_str), Some(marker));
}

fn expect_null_id_error(daemon: &mut Daemon, code: i64, words: &str) {
    let error = daemon.null_id_error().unwrap();
    assert_eq!(error["code"], code, "{error}");
    let message = error["message"].as_str().unwrap().to_lowercase();
    assert!(message.contains(words), "{message:?} should mention {words:?}");
}

#[test]
fn missing_content_length() {
    let (_dir, mut daemon) = daemon();
    daemon.send_raw(b"Content-Type: application/json\r\n\r\n{}").unwrap();
    expect_null_id_error(&mut daemon, -32700, "content-length");
    still_serving(&mut daemon, "m1");
}

#[test]
fn bad_content_length() {
    let (_dir, mut daemon) = daemon();
    daemon.send_raw(b"Content-Length: twelve\r\n\r\n{}").unwrap();
    expect_null_id_error(&mut daemon, -32700, "content-length");
    still_serving(&mut daemon, "m2");
}

#[test]
fn truncated_body_followed_by_a_valid_frame() {
    let (_dir, mut daemon) = daemon();
    // The header claims more bytes than the body has; the next frame's bytes are
    // swallowed into it, so the body is not JSON. The daemon resynchronises.
    let body = br#"{"jsonrpc":"2.0","id":99,"method":"ctx/usage","params":{"sessionId":"s"}}"#;
    let next = frame(br#"{"jsonrpc":"2.0","method":"$/noop"}"#);
    let next_header = next.len() - 36;
    let mut bytes = format!("Content-Length: {}\r\n\r\n", 40 + next_header).into_bytes();
    bytes.extend_from_slice(&body[..40]);
    bytes.extend(next);
    daemon.send_raw(&bytes).unwrap();
    expect_null_id_error(&mut daemon, -32700, "json");
    still_serving(&mut daemon, "m3");
}

#[test]
fn invalid_utf8() {
    let (_dir, mut daemon) = daemon();
    daemon
        .send_raw(&frame(
            b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ctx/usage\",\"params\":{\"sessionId\":\"\xff\xfe\"}}",
        ))
        .unwrap();
    expect_null_id_error(&mut daemon, -32700, "utf-8");
    still_serving(&mut daemon, "m4");
}

#[test]
fn invalid_json_and_deep_nesting() {
    let (_dir, mut daemon) = daemon();
    daemon.send_raw(&frame(b"{\"jsonrpc\":\"2.0\",\"id\":")).unwrap();
    expect_null_id_error(&mut daemon, -32700, "invalid json");
    let deep = format!("{}{}", "[".repeat(100_000 / 2), "]".repeat(100_000 / 2 - 10));
    daemon.send_raw(&frame(deep.as_bytes())).unwrap();
    expect_null_id_error(&mut daemon, -32700, "invalid json");
    still_serving(&mut daemon, "m5");
}

#[test]
fn not_a_request() {
    let (_dir, mut daemon) = daemon();
    daemon.send_raw(&frame(b"[1,2,3]")).unwrap();
    expect_null_id_error(&mut daemon, -32600, "batch");
    daemon.send_raw(&frame(b"\"hello\"")).unwrap();
    expect_null_id_error(&mut daemon, -32600, "object");
    daemon.send(&json!({"jsonrpc": "2.0", "id": 7, "params": {}})).unwrap();
    let response = daemon.response(7).unwrap();
    assert_eq!(response["error"]["code"], -32600, "{response}");
    assert!(response["error"]["message"].as_str().unwrap().contains("method"));
    daemon.send(&json!({"jsonrpc": "1.0", "id": 8, "method": "ctx/usage"})).unwrap();
    let response = daemon.response(8).unwrap();
    assert_eq!(response["error"]["code"], -32600, "{response}");
    still_serving(&mut daemon, "m6");
}

#[test]
fn unknown_method() {
    let (_dir, mut daemon) = daemon();
    let error = daemon.request_error("ctx/doesNotExist", json!({})).unwrap();
    assert_eq!(error["code"], -32601);
    assert!(error["message"].as_str().unwrap().contains("ctx/doesNotExist"), "{error}");
    // An unknown notification is ignored without a reply.
    daemon.notify("ctx/unknownNotification", json!({})).unwrap();
    still_serving(&mut daemon, "m7");
}

#[test]
fn invalid_params() {
    let (_dir, mut daemon) = daemon();
    let error = daemon.request_error("ctx/append", json!({"records": []})).unwrap();
    assert_eq!(error["code"], -32602);
    assert!(error["message"].as_str().unwrap().contains("sessionId"), "{error}");
    let error = daemon.request_error("ctx/append", json!({"sessionId": "s", "records": "nope"})).unwrap();
    assert_eq!(error["code"], -32602);
    assert!(error["message"].as_str().unwrap().starts_with("records: invalid type"), "{error}");
    // A field deep inside names its whole path.
    let error = daemon
        .request_error("ctx/assemble", json!({"sessionId": "s", "maxTokens": 100, "fork": {"instruction": 7}}))
        .unwrap();
    assert_eq!(error["code"], -32602);
    assert_eq!(error["message"], "fork.instruction: invalid type: integer `7`, expected a string");
    let error = daemon.request_error("ctx/openSession", json!({"cwd": 5, "model": "m"})).unwrap();
    assert_eq!(error["code"], -32602);
    // A session id that would name a path outside the store.
    let error =
        daemon.request_error("ctx/openSession", json!({"cwd": "/", "model": "m", "sessionId": "../../etc"})).unwrap();
    assert_eq!(error["code"], -32602);
    assert!(error["message"].as_str().unwrap().contains("invalid session id"), "{error}");
    // Thinking settings are an object, as the Messages API has them.
    let error =
        daemon.request_error("ctx/assemble", json!({"sessionId": "s", "maxTokens": 100, "thinking": "on"})).unwrap();
    assert_eq!(error["code"], -32602);
    assert_eq!(
        error["message"], "thinking: invalid type: string \"on\", expected a map",
        "the message names the field"
    );
    still_serving(&mut daemon, "m8");
}

#[test]
fn invalid_records_are_refused_whole() {
    let (_dir, mut daemon) = daemon();
    let records = json!([user_record("ok-1", None, "fine"), {"type": "user", "isMeta": "not a bool"}]);
    let error = daemon.request_error("ctx/append", json!({"sessionId": "s", "records": records})).unwrap();
    assert_eq!(error["code"], -33004);
    assert!(error["message"].as_str().unwrap().contains("records[1]"), "{error}");
    // Nothing from the refused request was stored.
    assert!(ctxd_e2e::stored_uuids(&daemon.state_dir, "s").unwrap().is_empty());
    still_serving(&mut daemon, "m9");
}

#[test]
fn unknown_session() {
    let (_dir, mut daemon) = daemon();
    let error = daemon.request_error("ctx/append", json!({"sessionId": "nobody", "records": []})).unwrap();
    assert_eq!(error["code"], -33001);
    assert!(error["message"].as_str().unwrap().contains("nobody"), "{error}");
    let error = daemon.request_error("ctx/closeSession", json!({"sessionId": "nobody"})).unwrap();
    assert_eq!(error["code"], -33001);
    still_serving(&mut daemon, "m10");
}

#[test]
fn oversized_message() {
    let (_dir, mut daemon) = daemon();
    let huge = json!({"jsonrpc": "2.0", "id": 3, "method": "ctx/append",
        "params": {"sessionId": "s", "records": [user_record("big", None, &"y".repeat(200_000))]}});
    daemon.send(&huge).unwrap();
    expect_null_id_error(&mut daemon, -33006, "exceeds");
    still_serving(&mut daemon, "m11");
    let stored = ctxd_e2e::stored_uuids(&daemon.state_dir, "s").unwrap();
    assert!(!stored.contains(&"big".to_owned()));
}

#[test]
fn everything_at_once_then_still_serving() {
    let (_dir, mut daemon) = daemon();
    let mut bytes = Vec::new();
    bytes.extend_from_slice(b"Content-Length: abc\r\n\r\n");
    bytes.extend(frame(b"{not json"));
    bytes.extend(frame(b"\xc3\x28"));
    bytes.extend(frame(br#"{"jsonrpc":"2.0","id":1000,"method":"nope"}"#));
    bytes.extend_from_slice(b"random garbage between frames\r\n\r\n");
    daemon.send_raw(&bytes).unwrap();
    let response = daemon.response(1000).unwrap();
    assert_eq!(response["error"]["code"], -32601);
    still_serving(&mut daemon, "m12");
    let errors: Vec<Value> = daemon.backlog.iter().filter(|m| m["id"].is_null()).cloned().collect();
    assert!(errors.len() >= 3, "{errors:?}");
}

/// serde_json reads at most 127 levels of nesting into a value tree; a frame nested
/// deeper is invalid JSON to the service. The append fast path, which borrows records
/// from the frame without building that tree, must give the same answer and store
/// nothing, and a frame just inside the limit is stored on either path.
#[test]
fn nesting_past_the_parser_limit_is_refused_on_every_path() {
    let (_dir, mut daemon) = daemon();
    let append = |uuid: &str, levels: usize| {
        // The frame, params, records and the record itself are four levels.
        let deep = format!("{}1{}", "[".repeat(levels - 4), "]".repeat(levels - 4));
        format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"ctx/append","params":{{"sessionId":"s","records":[{{"type":"user","uuid":"{uuid}","message":{{"role":"user","content":"x"}},"extra":{deep}}}]}}}}"#,
            levels, // the id, to tell the answers apart
        )
    };
    daemon.send_raw(&frame(append("too-deep", 128).as_bytes())).unwrap();
    // The message around the nesting is readable, so the error is sent to its id.
    let refused = daemon.response(128).unwrap();
    assert_eq!(refused["error"]["code"], -32700, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("recursion limit"), "{refused}");
    daemon.send_raw(&frame(append("deep-but-fine", 127).as_bytes())).unwrap();
    let response = daemon.response(127).unwrap();
    assert_eq!(response["result"]["appended"], 1, "{response}");
    let text = std::fs::read_to_string(daemon.state_dir.join("sessions/s.jsonl")).unwrap();
    assert!(!text.contains("too-deep"));
    assert!(text.contains("deep-but-fine"));
    still_serving(&mut daemon, "m13");
}
