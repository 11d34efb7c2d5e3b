//! Protocol abuse interleaved with real work: malformed frames, messages over the size
//! cap, deep nesting, invalid UTF-8, unknown methods and wrong parameter types, each
//! followed by valid appends, usage and assemble requests. Every valid request gets
//! its right answer, every bad one its error, and the daemon's memory stays bounded
//! after hundreds of megabytes of abuse.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::{Daemon, frame, stored_uuids, user_record};
use serde_json::{Value, json};

/// The daemon's default message size cap (`transport::Limits`, `--max-message-bytes`).
const CAP: usize = 64 * 1024 * 1024;
const ROUNDS: usize = 6;

/// A bad input, and the error it must earn.
enum Expect {
    /// An error with `id: null` and this code (the frame or its JSON was unreadable).
    NullId(i64),
    /// An error response to request `id` with this code.
    Reply(i64, i64),
    /// No answer at all (an unknown notification; a frame swallowed whole by design).
    Nothing,
}

struct Client {
    daemon: Daemon,
    /// Our records, in append order.
    appended: Vec<String>,
    last_tokens: u64,
    abuse_bytes: usize,
}

impl Client {
    fn abuse(&mut self, what: &str, bytes: &[u8], expect: Expect) {
        // Bytes that are not a frame at all may be reported once per piece the reader
        // happened to get them in.
        let garbage_may_echo = what.contains("header");
        self.abuse_bytes += bytes.len();
        self.daemon.send_raw(bytes).unwrap();
        match expect {
            Expect::NullId(code) => {
                let error = self.daemon.null_id_error().unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(error["code"], code, "{what}: {error}");
            }
            Expect::Reply(id, code) => {
                let response = self.daemon.response(id).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(response["error"]["code"], code, "{what}: {response}");
            }
            Expect::Nothing => {}
        }
        self.valid();
        // Errors for a frame are written before the answers to the requests after it,
        // so any null-id error still unread belongs to this abuse: one frame, one error.
        let _ = self.daemon.drain_notifications("(none)");
        let extra = self.daemon.backlog.iter().filter(|m| m["id"].is_null() && m.get("error").is_some()).count();
        self.daemon.backlog.retain(|m| !(m["id"].is_null() && m.get("error").is_some()));
        assert!(extra == 0 || garbage_may_echo, "{what}: {extra} more errors than frames");
    }

    /// A request with an id chosen far from the harness's own ids.
    fn bad_request(&mut self, id: i64, method: &str, params: Value, code: i64) {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        self.abuse(method, &frame(body.as_bytes()), Expect::Reply(id, code));
    }

    /// Append, usage and assemble, each checked.
    fn valid(&mut self) {
        let n = self.appended.len();
        let uuid = format!("ok-{n:05}");
        let text = format!("valid record {uuid} between bad frames");
        let parent = self.appended.last().cloned();
        let records = json!([user_record(&uuid, parent.as_deref(), &text)]);
        let appended = self.daemon.request("ctx/append", json!({"sessionId": "s", "records": records})).unwrap();
        assert_eq!(appended["appended"], 1, "{appended}");
        assert_eq!(appended["records"], n as u64 + 1, "{appended}");
        self.appended.push(uuid);
        let tokens = appended["usage"]["tokens"].as_u64().unwrap();
        assert!(tokens > self.last_tokens, "{tokens} after {}", self.last_tokens);
        self.last_tokens = tokens;

        let usage = self.daemon.request("ctx/usage", json!({"sessionId": "s"})).unwrap();
        assert_eq!(usage["usage"]["tokens"], tokens, "{usage}");

        let assembled = self
            .daemon
            .request(
                "ctx/assemble",
                json!({"sessionId": "s", "system": [{"type": "text", "text": "sys"}], "tools": [], "maxTokens": 4000}),
            )
            .unwrap();
        let messages = assembled["request"]["messages"].as_array().unwrap();
        assert_eq!(messages[0]["role"], "user");
        assert!(assembled["request"]["messages"].to_string().contains(&text), "the last record is in the request");
    }
}

#[test]
fn abuse_between_valid_requests_gets_errors_while_valid_work_is_answered_and_memory_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // Info logging: the debug log would record every bad frame's first bytes.
    let mut daemon = Daemon::start_with(&state, &[], &[("CTXD_LOG", "info")]).unwrap();
    daemon.initialize().unwrap();
    daemon.request("ctx/openSession", json!({"cwd": "/p", "model": "claude-sonnet-4-5", "sessionId": "s"})).unwrap();
    let pid = daemon.pid();
    let (rss_before, _) = ctxd_e2e::memory_kb(pid).unwrap();
    let mut client = Client { daemon, appended: Vec::new(), last_tokens: 0, abuse_bytes: 0 };

    // Built once: a body one byte over the cap (valid JSON, an append that must never be
    // stored), and 1 MB bodies under it.
    let mut over_cap = br#"{"jsonrpc":"2.0","id":777,"method":"ctx/append","params":{"sessionId":"s","records":[{"type":"user","uuid":"never-stored","message":{"role":"user","content":""#.to_vec();
    over_cap.resize(CAP + 1 - 6, b'x');
    over_cap.extend_from_slice(br#""}}]}}"#);
    assert_eq!(over_cap.len(), CAP + 1);
    let over_cap = frame(&over_cap);
    const MB: usize = 1024 * 1024;
    let deep = frame(format!("{}{}", "[".repeat(MB / 2), "]".repeat(MB / 2)).as_bytes());
    let deep_in_params = frame(
        format!(
            r#"{{"jsonrpc":"2.0","id":5,"method":"ctx/append","params":{{"sessionId":"s","records":[{}{}]}}}}"#,
            "{\"a\":".repeat(MB / 8),
            "1".to_owned() + &"}".repeat(MB / 8)
        )
        .as_bytes(),
    );
    let mut bad_utf8 = br#"{"jsonrpc":"2.0","id":6,"method":"ctx/usage","params":{"sessionId":""#.to_vec();
    bad_utf8.extend(std::iter::repeat_n([0xff_u8, 0xfe, b'a'], MB / 3).flatten());
    bad_utf8.extend_from_slice(br#""}}"#);
    let bad_utf8 = frame(&bad_utf8);
    let truncated_json = frame(
        &br#"{"jsonrpc":"2.0","id":7,"method":"ctx/append","params":{"sessionId":"s","records":["#.repeat(MB / 80),
    );
    let wrong_type_big = json!({"jsonrpc": "2.0", "id": 990_001, "method": "ctx/append", "params": {"sessionId": "s", "records": "r".repeat(MB)}}).to_string();
    let unknown_big =
        json!({"jsonrpc": "2.0", "id": 990_002, "method": "ctx/nothingHere", "params": {"blob": "b".repeat(MB)}})
            .to_string();

    let mut rss_after_warmup = 0;
    for round in 0..ROUNDS {
        // Malformed frames.
        client.abuse("no content-length", b"Content-Type: application/json\r\n\r\n{}", Expect::NullId(-32700));
        client.abuse("bad content-length", b"Content-Length: twelve\r\n\r\n{}", Expect::NullId(-32700));
        client.abuse(
            "content-length overflow",
            b"Content-Length: 99999999999999999999999999\r\n\r\n",
            Expect::NullId(-32700),
        );
        let mut long_header = b"X-Padding: ".to_vec();
        long_header.resize(20_000, b'p');
        long_header.extend_from_slice(b"\r\n\r\n");
        client.abuse("20 KB header", &long_header, Expect::NullId(-32700));
        // A body shorter than its header says swallows exactly the filler frame after it.
        let filler = frame(br#"{"jsonrpc":"2.0","method":"$/noop"}"#);
        let partial = br#"{"jsonrpc":"2.0","id":8,"method":"ctx/usage""#;
        let mut swallowing = format!("Content-Length: {}\r\n\r\n", partial.len() + filler.len()).into_bytes();
        swallowing.extend_from_slice(partial);
        swallowing.extend_from_slice(&filler);
        client.abuse("short body swallowing a filler", &swallowing, Expect::NullId(-32700));
        client.abuse("truncated json", &frame(b"{\"jsonrpc\":\"2.0\",\"id\":"), Expect::NullId(-32700));
        client.abuse("batch", &frame(b"[1,2,3]"), Expect::NullId(-32600));
        client.abuse("string message", &frame(b"\"just a string\""), Expect::NullId(-32600));

        // Huge: one byte over the cap, skipped without being buffered.
        client.abuse("over the cap", &over_cap, Expect::NullId(ctxd_proto::error_codes::MESSAGE_TOO_LARGE));
        // Large under the cap, each unreadable in its own way.
        client.abuse("deep nesting 1 MB", &deep, Expect::NullId(-32700));
        // The message around the nesting is readable: the error goes to its id.
        client.abuse("deep nesting in params", &deep_in_params, Expect::Reply(5, -32700));
        client.abuse("invalid utf-8 1 MB", &bad_utf8, Expect::NullId(-32700));
        client.abuse("truncated json 1 MB", &truncated_json, Expect::NullId(-32700));
        client.abuse("wrong type 1 MB", &frame(wrong_type_big.as_bytes()), Expect::Reply(990_001, -32602));
        client.abuse("unknown method 1 MB", &frame(unknown_big.as_bytes()), Expect::Reply(990_002, -32601));

        // Unknown methods and wrong parameter types.
        client.bad_request(990_010, "ctx/doesNotExist", json!({}), -32601);
        client.abuse(
            "unknown notification",
            &frame(br#"{"jsonrpc":"2.0","method":"ctx/unknownNotification","params":{}}"#),
            Expect::Nothing,
        );
        client.bad_request(990_011, "ctx/append", json!({"sessionId": "s", "records": "nope"}), -32602);
        client.bad_request(990_012, "ctx/append", json!({"sessionId": 5, "records": []}), -32602);
        client.bad_request(990_013, "ctx/usage", json!({"sessionId": ["s"]}), -32602);
        client.bad_request(990_014, "ctx/assemble", json!({"sessionId": "s", "maxTokens": "lots"}), -32602);
        client.bad_request(990_015, "ctx/compact", json!({"sessionId": {"id": "s"}}), -32602);
        client.bad_request(990_016, "ctx/openSession", json!({"cwd": 5, "model": "m"}), -32602);
        client.bad_request(
            990_017,
            "ctx/append",
            json!({"sessionId": "s", "records": [{"type": "user", "isMeta": "not a bool"}]}),
            ctxd_proto::error_codes::INVALID_RECORD,
        );
        client.bad_request(
            990_018,
            "ctx/append",
            json!({"sessionId": "nobody", "records": []}),
            ctxd_proto::error_codes::UNKNOWN_SESSION,
        );
        let params_string = br#"{"jsonrpc":"2.0","id":990019,"method":"ctx/usage","params":"s"}"#;
        client.abuse("params a string", &frame(params_string), Expect::Reply(990_019, -32600));

        let (rss, hwm) = ctxd_e2e::memory_kb(pid).unwrap();
        println!(
            "round {round}: VmRSS {:.1} MB, VmHWM {:.1} MB, abuse so far {:.0} MB",
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0,
            client.abuse_bytes as f64 / 1e6
        );
        if round == 0 {
            rss_after_warmup = rss;
        }
    }

    let (rss, hwm) = ctxd_e2e::memory_kb(pid).unwrap();
    let growth_mb = (rss as f64 - rss_after_warmup as f64) / 1024.0;
    println!(
        "abuse: {:.0} MB sent in {ROUNDS} rounds; VmRSS before {:.1} MB, after the first round {:.1} MB, at the end {:.1} MB (growth {growth_mb:.1} MB), VmHWM {:.1} MB",
        client.abuse_bytes as f64 / 1e6,
        rss_before as f64 / 1024.0,
        rss_after_warmup as f64 / 1024.0,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    assert!(client.abuse_bytes > 200_000_000);
    assert!(growth_mb < 64.0, "memory grew by {growth_mb:.1} MB over the abuse rounds");

    // Everything valid was stored, in order, and nothing from a bad frame.
    assert_eq!(stored_uuids(&state, "s").unwrap(), client.appended);
    assert!(client.daemon.stop().unwrap().success());
}
