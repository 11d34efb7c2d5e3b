//! Provider faults through whole compactions: `ctx/compact` against an Anthropic
//! provider (a local HTTP server) that answers with rate limits, overloads, server
//! errors, silence, streams cut or stalled mid-way, replies without `<summary>`,
//! prompt-too-long refusals and garbage. One row per fault. Every row ends in an
//! installed compaction (by the provider after a retry, or by the offline summarizer
//! the daemon falls back to, with the provider's failure named in `problems`); the
//! transcript gains exactly one whole install and nothing else, and the session goes on
//! answering appends and assemble requests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ctxd_e2e::{Daemon, example, stored_uuids, user_record};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5-20250929";
const KEY: &str = "sk-test-fault-key-456";
/// The read timeout the daemon runs with here; the silent server waits much longer.
const READ_TIMEOUT_MS: &str = "700";
const SILENCE: Duration = Duration::from_secs(5);

/// What the server does with one request.
#[derive(Debug, Clone, Copy)]
enum Reply {
    /// A complete stream whose text has a `<summary>`.
    Summary,
    /// A complete stream whose text has none.
    NoSummary,
    /// An error status with extra header lines and an Anthropic error body.
    Status { status: u16, headers: &'static str, kind: &'static str, message: &'static str },
    /// Reads the request and says nothing for longer than the read timeout.
    Silent,
    /// Sends the headers and the first event, then nothing.
    StallMidStream,
    /// Sends the headers and half the events, then closes the connection.
    CutMidStream,
    /// Bytes that are not HTTP.
    Garbage,
    /// A 200 event stream whose body is bytes that are not events.
    GarbageStream,
}

const REMOTE: &str = "REMOTE-SUMMARY";

fn events(text: &str) -> Vec<u8> {
    let events = [
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL, "content": [], "usage": {"input_tokens": 100, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 40}}),
        json!({"type": "message_stop"}),
    ];
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect::<String>()
        .into_bytes()
}

fn stream_head(length: usize) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
    )
    .into_bytes()
}

fn answer(stream: &mut TcpStream, reply: Reply) {
    let summary = format!(
        "<analysis>draft</analysis><summary>1. Primary Request and Intent:\n   {REMOTE} of the work.\n</summary>"
    );
    match reply {
        Reply::Summary | Reply::NoSummary => {
            let text =
                if matches!(reply, Reply::Summary) { summary } else { "I would rather not summarize this.".to_owned() };
            let body = events(&text);
            let _ = stream.write_all(&stream_head(body.len()));
            let _ = stream.write_all(&body);
        }
        Reply::Status { status, headers, kind, message } => {
            let body = json!({"type": "error", "error": {"type": kind, "message": message}}).to_string();
            let _ = write!(
                stream,
                "HTTP/1.1 {status} Fault\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
        Reply::Silent => std::thread::sleep(SILENCE),
        Reply::StallMidStream => {
            let body = events(&summary);
            let _ = stream.write_all(&stream_head(body.len()));
            let first_event = body.iter().position(|b| *b == b'\n').unwrap() + 1;
            let _ = stream.write_all(&body[..first_event]);
            let _ = stream.flush();
            std::thread::sleep(SILENCE);
        }
        Reply::CutMidStream => {
            let body = events(&summary);
            let _ = stream.write_all(&stream_head(body.len()));
            let _ = stream.write_all(&body[..body.len() / 2]);
        }
        Reply::Garbage => {
            let _ = stream.write_all(b"\x00\xff\xfegarbage \x1b[31m not http at all\r\n\r\n\xc3\x28");
        }
        Reply::GarbageStream => {
            let body: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
            let _ = stream.write_all(&stream_head(body.len()));
            let _ = stream.write_all(&body);
        }
    }
    let _ = stream.flush();
}

/// The request bodies a server saw, in order.
type Seen = Arc<Mutex<Vec<Value>>>;

/// Serves `replies[n]` to the n-th request (the last one repeats), each connection on its
/// own thread.
fn serve(replies: &'static [Reply]) -> (u16, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let count = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let (log, count) = (log.clone(), count.clone());
            std::thread::spawn(move || {
                let (_, body) = ctxd_e2e::read_http_request(&mut BufReader::new(stream.try_clone().unwrap()));
                if body.is_empty() {
                    return;
                }
                let n = count.fetch_add(1, Ordering::SeqCst);
                log.lock().unwrap().push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                answer(&mut stream, replies[n.min(replies.len() - 1)]);
            });
        }
    });
    (port, seen)
}

struct Row {
    name: &'static str,
    replies: &'static [Reply],
    /// Who wrote the installed summary: `anthropic`, or `offline` after the provider failed.
    summarizer: &'static str,
    /// Requests the provider gets.
    requests: usize,
    /// Words the compaction's `problems` must contain (offline rows).
    problem: &'static str,
}

const fn status(status: u16, headers: &'static str, kind: &'static str, message: &'static str) -> Reply {
    Reply::Status { status, headers, kind, message }
}

const RATE_LIMITED: Reply = status(
    429,
    "retry-after: 1\r\n",
    "rate_limit_error",
    "Number of request tokens has exceeded your per-minute rate limit",
);
const RATE_LIMITED_NOW: Reply = status(429, "retry-after: 0\r\n", "rate_limit_error", "rate limited");
const OVERLOADED: Reply = status(529, "", "overloaded_error", "Overloaded");
const INTERNAL: Reply = status(500, "", "api_error", "Internal server error");
const UNAVAILABLE: Reply = status(503, "", "api_error", "Service unavailable");
const TOO_LONG: Reply = status(400, "", "invalid_request_error", "prompt is too long: 250000 tokens > 200000 maximum");

const ROWS: &[Row] = &[
    Row {
        name: "429 with retry-after, then a summary",
        replies: &[RATE_LIMITED, Reply::Summary],
        summarizer: "anthropic",
        requests: 2,
        problem: "",
    },
    Row {
        name: "429 every time",
        replies: &[RATE_LIMITED_NOW],
        summarizer: "offline",
        requests: 4,
        problem: "HTTP 429",
    },
    Row {
        name: "529 overloaded every time",
        replies: &[OVERLOADED],
        summarizer: "offline",
        requests: 4,
        problem: "HTTP 529",
    },
    Row {
        name: "500, then 503, then a summary",
        replies: &[INTERNAL, UNAVAILABLE, Reply::Summary],
        summarizer: "anthropic",
        requests: 3,
        problem: "",
    },
    Row { name: "503 every time", replies: &[UNAVAILABLE], summarizer: "offline", requests: 4, problem: "HTTP 503" },
    Row {
        name: "silent past the read timeout",
        replies: &[Reply::Silent],
        summarizer: "offline",
        requests: 1,
        problem: "timed out waiting for data",
    },
    Row {
        name: "stalls in the middle of the stream",
        replies: &[Reply::StallMidStream],
        summarizer: "offline",
        requests: 1,
        problem: "timed out waiting for data",
    },
    Row {
        name: "stream cut in the middle",
        replies: &[Reply::CutMidStream],
        summarizer: "offline",
        requests: 1,
        problem: "stream ended before its end marker",
    },
    Row {
        name: "no <summary>, twice",
        replies: &[Reply::NoSummary],
        summarizer: "offline",
        requests: 2,
        problem: "summary",
    },
    Row {
        name: "no <summary>, then one",
        replies: &[Reply::NoSummary, Reply::Summary],
        summarizer: "anthropic",
        requests: 2,
        problem: "",
    },
    Row {
        name: "400 prompt too long every time",
        replies: &[TOO_LONG],
        summarizer: "offline",
        requests: 2,
        problem: "too long",
    },
    Row {
        name: "400 prompt too long, then a summary",
        replies: &[TOO_LONG, Reply::Summary],
        summarizer: "anthropic",
        requests: 2,
        problem: "",
    },
    Row {
        name: "garbage instead of HTTP",
        replies: &[Reply::Garbage],
        summarizer: "offline",
        requests: 4,
        problem: "connection failed",
    },
    Row {
        name: "garbage event stream",
        replies: &[Reply::GarbageStream],
        summarizer: "offline",
        requests: 1,
        problem: "HTTP 200",
    },
];

fn lines_of(state: &std::path::Path, id: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(state.join("sessions").join(format!("{id}.jsonl"))).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn every_provider_fault_ends_in_a_whole_compaction_and_the_session_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let env = [("CTXD_TEST_API_KEY", KEY), ("CTXD_PROVIDER_READ_TIMEOUT_MS", READ_TIMEOUT_MS)];
    ctxd_e2e::trust_folder(&state, dir.path()).unwrap();
    let mut daemon = Daemon::start_with(&state, &[], &env).unwrap();
    daemon.initialize().unwrap();

    // One session per row, each with a project whose settings name its own server; all
    // compactions run at once, so the slow rows (back-off, timeouts) overlap.
    let mut pending = Vec::new();
    for (i, row) in ROWS.iter().enumerate() {
        let (port, seen) = serve(row.replies);
        let project = dir.path().join(format!("project-{i}"));
        std::fs::create_dir_all(project.join(".ctxd")).unwrap();
        let settings = json!({"provider": "anthropic", "baseUrl": format!("http://127.0.0.1:{port}"), "apiKeyEnv": "CTXD_TEST_API_KEY"});
        std::fs::write(project.join(".ctxd/settings.json"), settings.to_string()).unwrap();
        let id = format!("fault-{i}");
        daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": id})).unwrap();
        daemon.request("ctx/append", json!({"sessionId": id, "records": example(30)})).unwrap();
        let before = stored_uuids(&state, &id).unwrap();
        let request = daemon.send_request("ctx/compact", json!({"sessionId": id})).unwrap();
        pending.push((row, id, seen, before, request));
    }

    let mut table = Vec::new();
    for (row, id, seen, before, request) in pending {
        let at = format!("row {:?}", row.name);
        let response = daemon.response(request).unwrap();
        assert!(response.get("error").is_none(), "{at}: the compaction failed: {response}");
        let result = &response["result"];
        let problems = result["problems"].to_string();
        assert_eq!(result["summarizer"], row.summarizer, "{at}: {result}");
        let requests = seen.lock().unwrap().clone();
        assert_eq!(requests.len(), row.requests, "{at}: requests the provider got");
        if row.summarizer == "anthropic" {
            assert!(result["summary"].as_str().unwrap().contains(REMOTE), "{at}: {result}");
            assert!(result.get("problems").is_none_or(|p| p == &json!([])), "{at}: {problems}");
        } else {
            assert!(problems.contains("anthropic could not write the summary"), "{at}: {problems}");
            assert!(problems.contains(row.problem), "{at}: {problems} should mention {:?}", row.problem);
        }
        assert!(!problems.contains(KEY), "{at}: the key leaked into problems");
        match row.replies {
            [Reply::NoSummary, ..] => {
                let again = requests[1]["messages"].to_string();
                assert!(again.contains("<summary>"), "{at}: the second request asks for <summary> tags");
            }
            [Reply::Status { status: 400, .. }, ..] => {
                let size = |r: &Value| r["messages"].as_array().unwrap().len();
                assert!(size(&requests[1]) < size(&requests[0]), "{at}: the retry drops the oldest rounds");
            }
            _ => {}
        }

        // The transcript: what was there, then one whole install, nothing else.
        let lines = lines_of(&state, &id);
        assert_eq!(stored_uuids(&state, &id).unwrap()[..before.len()], before[..], "{at}");
        let install = &lines[before.len()..];
        assert_eq!(install[0]["uuid"], result["boundary"], "{at}");
        assert_eq!(install[0]["compactMetadata"]["ctxdBatch"], install.len() as u64, "{at}");
        assert_eq!(install[1]["isCompactSummary"], true, "{at}");

        // And the session goes on.
        let marker = format!("after the fault in {id}");
        let appended = daemon
            .request(
                "ctx/append",
                json!({"sessionId": id, "records": [user_record(&format!("{id}-after"), None, &marker)]}),
            )
            .unwrap();
        assert_eq!(appended["appended"], 1, "{at}");
        let assembled = daemon
            .request("ctx/assemble", json!({"sessionId": id, "system": [], "tools": [], "maxTokens": 8000}))
            .unwrap();
        let messages = assembled["request"]["messages"].to_string();
        assert!(messages.contains(&marker), "{at}");
        let summary_probe = if row.summarizer == "anthropic" { REMOTE } else { "Primary Request and Intent" };
        assert!(messages.contains(summary_probe), "{at}: the request starts from the installed summary");
        table.push(format!(
            "{:<40} {:<9} {} request(s)  {}",
            row.name,
            row.summarizer,
            requests.len(),
            if problems == "null" { "" } else { &problems[..problems.len().min(150)] }
        ));
    }
    println!("{}", table.join("\n"));
    assert!(daemon.drain_notifications("ctx/compactFailed").is_empty(), "a failure was reported as well");
    assert!(daemon.stop().unwrap().success());
    let log = std::fs::read_to_string(dir.path().join("state.log")).unwrap();
    assert!(!log.contains(KEY), "the key never appears in logs");
}
