//! Compaction through a provider over real HTTP: a local server speaking the Anthropic
//! Messages streaming format writes the summary; when the provider keeps failing, the
//! offline summarizer does, and the compaction still succeeds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use ctxd_e2e::{Daemon, repo_root};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5-20250929";

/// Serves every request with `respond(request_body) -> (status, body)`; returns the port
/// and the requests seen (headers and body).
type Seen = Arc<Mutex<Vec<(String, String)>>>;

fn serve(respond: fn(&str) -> (u16, String)) -> (u16, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(20) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut headers = String::new();
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                headers.push_str(&line);
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let body = String::from_utf8_lossy(&body).into_owned();
            let (status, reply) = respond(&body);
            log.lock().unwrap().push((headers, body));
            let kind = if status == 200 { "text/event-stream" } else { "application/json" };
            let _ = write!(stream, "HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}", reply.len());
        }
    });
    (port, seen)
}

fn sse_summary(_: &str) -> (u16, String) {
    let text = "<analysis>draft</analysis><summary>1. Primary Request and Intent:\n   REMOTE-SUMMARY of the work.\n</summary>";
    let events = [
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [], "usage": {"input_tokens": 100, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 40}}),
        json!({"type": "message_stop"}),
    ];
    let body = events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect();
    (200, body)
}

fn always_400(_: &str) -> (u16, String) {
    (400, json!({"type": "error", "error": {"type": "invalid_request_error", "message": "the request was malformed"}}).to_string())
}

fn session(provider_port: u16, dir: &std::path::Path) -> (Daemon, Value) {
    let mut daemon = opened(provider_port, dir);
    let result = daemon.request("ctx/compact", json!({"sessionId": "p"})).unwrap();
    (daemon, result)
}

/// A daemon with session `p` open (30 records) on the provider at `provider_port`.
fn opened(provider_port: u16, dir: &std::path::Path) -> Daemon {
    opened_with(provider_port, dir, json!({}))
}

fn opened_with(provider_port: u16, dir: &std::path::Path, extra: Value) -> Daemon {
    let project = dir.join("project");
    std::fs::create_dir_all(project.join(".ctxd")).unwrap();
    let mut settings = json!({"provider": "anthropic", "baseUrl": format!("http://127.0.0.1:{provider_port}"), "apiKeyEnv": "CTXD_TEST_API_KEY"});
    settings.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    std::fs::write(project.join(".ctxd/settings.json"), settings.to_string()).unwrap();
    let mut daemon = Daemon::start_with(&dir.join("state"), &[], &[("CTXD_TEST_API_KEY", "sk-test-secret-key-123")]).unwrap();
    daemon.initialize().unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "p"})).unwrap();
    let text = std::fs::read_to_string(repo_root().join("examples/session.jsonl")).unwrap();
    let records: Vec<Value> = text.lines().take(30).map(|l| serde_json::from_str(l).unwrap()).collect();
    daemon.request("ctx/append", json!({"sessionId": "p", "records": records})).unwrap();
    daemon
}

#[test]
fn a_provider_writes_the_summary_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let (port, seen) = serve(sse_summary);
    let (_daemon, result) = session(port, dir.path());
    assert_eq!(result["summarizer"], "anthropic", "{result}");
    assert!(result["summary"].as_str().unwrap().contains("REMOTE-SUMMARY"), "{result}");
    assert!(!result["summary"].as_str().unwrap().contains("draft"), "the analysis draft is removed");
    let requests = seen.lock().unwrap();
    let (headers, body) = &requests[0];
    assert!(headers.starts_with("POST /v1/messages"), "{headers}");
    assert!(headers.to_ascii_lowercase().contains("x-api-key: sk-test-secret-key-123"));
    assert!(headers.to_ascii_lowercase().contains("anthropic-version: 2023-06-01"));
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["stream"], true);
    assert_eq!(body["model"], MODEL);
    assert!(body["messages"].as_array().unwrap().last().unwrap().to_string().contains("Primary Request and Intent"));
}

#[test]
fn a_failing_provider_falls_back_to_the_offline_summarizer() {
    let dir = tempfile::tempdir().unwrap();
    let (port, _) = serve(always_400);
    let (_daemon, result) = session(port, dir.path());
    assert_eq!(result["summarizer"], "offline", "{result}");
    let problems = result["problems"].to_string();
    assert!(problems.contains("anthropic could not write the summary"), "{problems}");
    assert!(!problems.contains("sk-test-secret-key-123"), "the key never appears in errors");
    let log = std::fs::read_to_string(dir.path().join("state.log")).unwrap();
    assert!(!log.contains("sk-test-secret-key-123"), "the key never appears in logs");
}

#[test]
fn cancel_request_stops_a_compaction_and_its_provider_call() {
    // A provider that takes the request and never answers; it reports when the daemon
    // hangs up on it.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (got_request, request_seen) = std::sync::mpsc::channel();
    let (hung_up, connection_closed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else { return };
        let mut buf = [0u8; 65536];
        let _ = stream.read(&mut buf);
        let _ = got_request.send(());
        // Nothing is ever written back; a read of 0 bytes means the daemon closed it.
        loop {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = hung_up.send(());
    });
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = opened(port, dir.path());
    let state = dir.path().join("state");
    let before = ctxd_e2e::stored_uuids(&state, "p").unwrap();

    let id = daemon.send_request("ctx/compact", json!({"sessionId": "p"})).unwrap();
    request_seen.recv_timeout(std::time::Duration::from_secs(30)).expect("the provider got the summary request");
    daemon.notify("$/cancelRequest", json!({"id": id})).unwrap();
    let response = daemon.response(id).unwrap();
    assert_eq!(response["error"]["code"], -32800, "{response}");
    connection_closed.recv_timeout(std::time::Duration::from_secs(30)).expect("the HTTP request was aborted");

    // Nothing was installed and the session goes on.
    assert_eq!(ctxd_e2e::stored_uuids(&state, "p").unwrap(), before);
    let usage = daemon.request("ctx/usage", json!({"sessionId": "p"})).unwrap();
    assert_ne!(usage["usage"]["level"], "compacting");
    let more = json!({"type": "user", "uuid": "after-cancel", "parentUuid": null, "message": {"role": "user", "content": "go on"}});
    daemon.request("ctx/append", json!({"sessionId": "p", "records": [more]})).unwrap();
}

fn too_long_unless_large(body: &str) -> (u16, String) {
    let body: Value = serde_json::from_str(body).unwrap();
    if body["model"] == "claude-large[1m]" {
        sse_summary("")
    } else {
        (400, json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 250000 tokens > 200000 maximum"}}).to_string())
    }
}

#[test]
fn a_summary_too_long_for_the_model_goes_to_the_larger_model_once() {
    let dir = tempfile::tempdir().unwrap();
    let (port, seen) = serve(too_long_unless_large);
    let mut daemon = opened_with(port, dir.path(), json!({"compactModel": "claude-small", "largerModelRetry": "claude-large[1m]"}));
    let result = daemon.request("ctx/compact", json!({"sessionId": "p"})).unwrap();
    assert_eq!(result["summarizer"], "anthropic", "{result}");
    assert!(result["summary"].as_str().unwrap().contains("REMOTE-SUMMARY"));
    let models: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, body)| serde_json::from_str::<Value>(body).unwrap()["model"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(models, ["claude-small", "claude-large[1m]"], "one try on the configured model, then the larger one");
}
