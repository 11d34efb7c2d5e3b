//! `ctxd gateway` end to end: the real binary between a real HTTP client (reqwest) and a
//! local upstream (`ctxd_e2e::gateway`): transparency both ways, streaming, errors,
//! refusals, live figures (`/ctxd/sessions`, `ctx/usageChanged`), and that no key or
//! body is written anywhere.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::time::Duration;

use ctxd_e2e::Daemon;
use ctxd_e2e::gateway::{self, Gateway, OUTPUT_TOKENS, USAGE};
use serde_json::{Value, json};

const CANARY_KEY: &str = "sk-ant-canary-7f3e9b1c2d4a";
const CANARY_TEXT: &str = "CANARY-BODY-5d1e8a";

fn usage(name: &str) -> u64 {
    USAGE.iter().find(|(k, _)| *k == name).map(|(_, v)| *v).unwrap()
}

/// A Messages body as Claude Code sends it (session in `metadata.user_id`).
fn messages_body(session: &str, ttl: Option<&str>) -> String {
    let marker = match ttl {
        Some(ttl) => json!({"type": "ephemeral", "ttl": ttl}),
        None => json!({"type": "ephemeral"}),
    };
    let user_id = json!({"device_id": "d", "account_uuid": "", "session_id": session}).to_string();
    json!({"model": "claude-opus-5-5", "stream": true, "max_tokens": 100,
        "system": [{"type": "text", "text": "sys", "cache_control": marker}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": CANARY_TEXT, "cache_control": marker}]}],
        "metadata": {"user_id": user_id}})
    .to_string()
}

/// A gateway in front of a fresh upstream, in a fresh directory.
fn started() -> (tempfile::TempDir, tokio::runtime::Runtime, gateway::Upstream, Gateway) {
    let dir = tempfile::tempdir().unwrap();
    let rt = gateway::runtime();
    let upstream = gateway::upstream(&rt);
    let gw = Gateway::start(dir.path(), &upstream.url(), &[], &[]).unwrap();
    (dir, rt, upstream, gw)
}

/// Raw bytes to the gateway, and everything it answers until it closes or 5 s pass.
fn raw(gateway: &Gateway, request: &[u8]) -> String {
    let mut stream = std::net::TcpStream::connect(gateway.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn bodies_and_headers_pass_byte_for_byte_both_ways() {
    let (dir, rt, upstream, gw) = started();
    let client = gateway::client();
    // Every byte value, not JSON at all: the gateway passes what it does not understand.
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let answer = rt.block_on(async {
        client
            .post(gw.url("/v1/messages?beta=true"))
            .header("x-stub", "echo")
            .header("x-api-key", CANARY_KEY)
            .header("anthropic-version", "2023-06-01")
            .header("x-custom", "Mixed Case value; with=stuff")
            .header("connection", "keep-alive, x-hop")
            .header("x-hop", "dropped: named by Connection")
            .body(body.clone())
            .send()
            .await
            .unwrap()
    });
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["request-id"], "req_stub_1", "the upstream's headers reach the client");
    let back = rt.block_on(answer.bytes()).unwrap();
    assert!(back[..] == body[..], "the answer body differs ({} bytes back of {})", back.len(), body.len());
    let seen = upstream.received();
    assert_eq!(seen.len(), 1);
    let got = &seen[0];
    assert!(got.body == body, "the request body differs upstream");
    assert_eq!(got.target, "/v1/messages?beta=true");
    assert_eq!(got.header("x-api-key"), Some(CANARY_KEY.as_bytes()));
    assert_eq!(got.header("x-custom"), Some(&b"Mixed Case value; with=stuff"[..]));
    assert_eq!(got.header("anthropic-version"), Some(&b"2023-06-01"[..]));
    assert_eq!(got.header("content-length"), Some(body.len().to_string().as_bytes()));
    assert_eq!(got.header("host"), Some(upstream.addr.to_string().as_bytes()), "Host is the upstream's");
    assert_eq!(got.header("x-hop"), None, "a header Connection names is hop-by-hop");
    drop(gw);
    assert_no_canary(dir.path());
}

#[test]
fn a_stream_reaches_the_client_event_by_event_and_its_figures_are_exact() {
    let (_dir, rt, upstream, gw) = started();
    let client = gateway::client();
    let sessions = rt.block_on(async {
        let mut answer = client
            .post(gw.url("/v1/messages"))
            .header("x-claude-code-session-id", "9d6a4f7e-0000-4000-8000-00000000c0de")
            .header("x-api-key", CANARY_KEY)
            .body(messages_body("ignored-the-header-wins", Some("1h")))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        // The first event arrives while the upstream still holds the rest: nothing is
        // buffered whole.
        let first = tokio::time::timeout(Duration::from_secs(20), answer.chunk())
            .await
            .expect("the first event did not arrive while the upstream held the rest")
            .unwrap()
            .unwrap();
        assert!(String::from_utf8_lossy(&first).contains("message_start"), "{first:?}");
        let before = json_of(client.get(gw.url("/ctxd/sessions")).send().await.unwrap()).await;
        assert_eq!(before["sessions"], json!([]), "no figures before the answer's last byte");
        upstream.release.notify_one();
        let mut rest = Vec::new();
        while let Some(chunk) = answer.chunk().await.unwrap() {
            rest.extend_from_slice(&chunk);
        }
        let mut whole = first.to_vec();
        whole.extend_from_slice(&rest);
        assert_eq!(String::from_utf8(whole).unwrap(), gateway::message_start() + &gateway::stream_tail("STREAMED"));
        json_of(client.get(gw.url("/ctxd/sessions")).send().await.unwrap()).await
    });
    let listed = sessions["sessions"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{sessions}");
    let s = &listed[0];
    assert_eq!(s["sessionId"], "9d6a4f7e-0000-4000-8000-00000000c0de");
    assert_eq!(s["model"], "claude-opus-5-5");
    assert_eq!(s["inputTokens"], usage("input_tokens"));
    assert_eq!(s["cacheReadInputTokens"], usage("cache_read_input_tokens"));
    assert_eq!(s["cacheCreationInputTokens"], usage("cache_creation_input_tokens"));
    assert_eq!(s["outputTokens"], OUTPUT_TOKENS, "message_delta's count replaces message_start's");
    assert_eq!(s["cacheTtlSeconds"], 3600);
    assert_eq!(s["requests"], 1);
    assert!(s["sentAt"].as_str().unwrap() <= s["answeredAt"].as_str().unwrap(), "{s}");
    // The output as the schema says (the proto type reads it back).
    serde_json::from_value::<ctxd_proto::GatewaySessions>(sessions.clone()).unwrap();
}

#[test]
fn a_gzip_answer_passes_as_sent_and_its_figures_are_read() {
    let (_dir, rt, _upstream, gw) = started();
    let (bytes, listed) = rt.block_on(async {
        let answer = gateway::client()
            .post(gw.url("/v1/messages"))
            .header("x-stub", "gzip")
            .header("accept-encoding", "gzip")
            .body(messages_body("zipped-session", None))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.headers()["content-encoding"], "gzip");
        let bytes = answer.bytes().await.unwrap();
        (bytes, json_of(gateway::client().get(gw.url("/ctxd/sessions")).send().await.unwrap()).await)
    });
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "the client gets the compressed bytes, as sent");
    let s = &listed["sessions"][0];
    assert_eq!(s["sessionId"], "zipped-session", "{listed}");
    assert_eq!(
        (s["inputTokens"].as_u64(), s["outputTokens"].as_u64()),
        (Some(usage("input_tokens")), Some(OUTPUT_TOKENS))
    );
}

#[test]
fn json_answers_and_the_body_session_id_count_too() {
    let (_dir, rt, _upstream, gw) = started();
    let client = gateway::client();
    let listed = rt.block_on(async {
        for _ in 0..2 {
            let answer = client
                .post(gw.url("/v1/messages"))
                .header("x-stub", "json")
                .body(messages_body("from-the-body", None))
                .send()
                .await
                .unwrap();
            assert_eq!(json_of(answer).await, gateway::json_answer());
        }
        // count_tokens is forwarded but is no turn.
        let counted = client
            .post(gw.url("/v1/messages/count_tokens"))
            .header("x-stub", "count")
            .body(messages_body("from-the-body", None))
            .send()
            .await
            .unwrap();
        assert_eq!(counted.text().await.unwrap(), r#"{"input_tokens":42}"#);
        json_of(client.get(gw.url("/ctxd/sessions")).send().await.unwrap()).await
    });
    let s = &listed["sessions"][0];
    assert_eq!(s["sessionId"], "from-the-body", "{listed}");
    assert_eq!(
        (s["inputTokens"].as_u64(), s["outputTokens"].as_u64()),
        (Some(usage("input_tokens")), Some(OUTPUT_TOKENS))
    );
    assert_eq!(s["cacheTtlSeconds"], 300);
    assert_eq!(s["requests"], 2, "two Messages requests; count_tokens is not one");
}

#[test]
fn upstream_errors_redirects_and_cut_streams_pass_as_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let rt = gateway::runtime();
    let upstream = gateway::upstream(&rt);
    let elsewhere = gateway::upstream(&rt);
    let gw = Gateway::start(dir.path(), &upstream.url(), &[], &[]).unwrap();
    let client = gateway::client();
    rt.block_on(async {
        let error = client.post(gw.url("/v1/messages")).header("x-stub", "error").body("{}").send().await.unwrap();
        assert_eq!(error.status(), 529);
        assert_eq!(error.headers()["request-id"], "req_stub_1");
        assert_eq!(
            error.text().await.unwrap(),
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
        );
        let target = format!("{}/v1/messages", elsewhere.url());
        let redirect = client
            .post(gw.url("/v1/messages"))
            .header("x-stub", format!("redirect:{target}"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(redirect.status(), 307, "a redirect reaches the client as it was sent");
        assert_eq!(redirect.headers()["location"], target.as_str());
        // Broken off after its first event: the client's answer is broken off too (before
        // or after its head arrives), never a clean end.
        let cut = client.post(gw.url("/v1/messages")).header("x-stub", "cut").body("{}").send().await;
        let whole = match cut {
            Ok(answer) => answer.bytes().await.map(|b| b.len()),
            Err(e) => Err(e),
        };
        assert!(whole.is_err(), "a stream the upstream broke off ended cleanly for the client: {whole:?}");
    });
    assert!(elsewhere.received().is_empty(), "the gateway followed a redirect to another origin");
}

#[test]
fn an_unreachable_upstream_is_a_502_in_the_apis_shape() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let gw = Gateway::start(dir.path(), &format!("http://{closed}"), &[], &[]).unwrap();
    let rt = gateway::runtime();
    let answer = rt.block_on(async {
        let answer = gateway::client().post(gw.url("/v1/messages")).body("{}").send().await.unwrap();
        (answer.status(), json_of(answer).await)
    });
    assert_eq!(answer.0, 502);
    assert_eq!(answer.1["type"], "error");
    assert_eq!(answer.1["error"]["type"], "api_error");
    let message = answer.1["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("ctxd gateway: the upstream http://127.0.0.1:"), "{message}");
    assert!(message.contains("cannot be reached") && message.to_lowercase().contains("refused"), "{message}");
}

#[test]
fn requests_that_could_go_elsewhere_or_are_malformed_get_400() {
    let (_dir, _rt, upstream, gw) = started();
    let host = format!("Host: {}\r\n", gw.addr);
    let cases: Vec<(&str, String)> = vec![
        (
            "absolute-form target",
            format!("POST http://evil.example/v1/messages HTTP/1.1\r\n{host}Content-Length: 0\r\n\r\n"),
        ),
        ("CONNECT", "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n".to_owned()),
        ("a foreign Host", "POST /v1/messages HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 0\r\n\r\n".to_owned()),
        ("two Hosts", format!("POST /v1/messages HTTP/1.1\r\n{host}{host}Content-Length: 0\r\n\r\n")),
        ("no Host", "POST /v1/messages HTTP/1.1\r\nContent-Length: 0\r\n\r\n".to_owned()),
        ("a // path", format!("GET //evil.example/x HTTP/1.1\r\n{host}\r\n")),
        ("asterisk", format!("OPTIONS * HTTP/1.1\r\n{host}\r\n")),
        ("garbage", "\u{1}\u{2}GARBAGE\r\n\r\n".to_owned()),
        ("a broken header", format!("GET /v1/models HTTP/1.1\r\n{host}Bad Header\r\n\r\n")),
        (
            "two lengths",
            format!("POST /v1/messages HTTP/1.1\r\n{host}Content-Length: 1\r\nContent-Length: 2\r\n\r\nab"),
        ),
    ];
    for (what, request) in &cases {
        let answer = raw(&gw, request.as_bytes());
        assert!(answer.starts_with("HTTP/1.1 400"), "{what}: {answer:?}");
    }
    let huge = format!("GET /v1/models HTTP/1.1\r\n{host}X-Big: {}\r\n\r\n", "a".repeat(200_000));
    let answer = raw(&gw, huge.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431"), "an oversized head: {:?}", &answer[..answer.len().min(200)]);
    let over = format!("POST /v1/messages HTTP/1.1\r\n{host}Content-Length: {}\r\n\r\n", 32 * 1024 * 1024 + 1);
    let answer = raw(&gw, over.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 413") && answer.contains("request_too_large"), "{answer:?}");
    assert!(upstream.received().is_empty(), "a refused request reached the upstream: {:?}", upstream.received());
    // And the gateway serves on.
    let fine = raw(&gw, format!("GET /ctxd/sessions HTTP/1.1\r\n{host}Connection: close\r\n\r\n").as_bytes());
    assert!(fine.starts_with("HTTP/1.1 200"), "{fine:?}");
}

#[test]
fn a_chunked_body_past_32_mb_is_stopped_with_413() {
    let (_dir, rt, upstream, gw) = started();
    let status = rt.block_on(async {
        // No length declared: the gateway counts as it streams.
        let chunks =
            futures::stream::iter((0..40).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'x'; 1 << 20]))));
        let body =
            http_body_util::StreamBody::new(futures::StreamExt::map(chunks, |c| c.map(hyper::body::Frame::data)));
        let answer = gateway::client()
            .post(gw.url("/v1/messages"))
            .header("x-stub", "echo")
            .body(reqwest::Body::wrap(body))
            .send()
            .await;
        answer.map(|a| a.status().as_u16())
    });
    // Either the 413 arrives, or the gateway closed the connection on the body it stopped.
    if let Ok(status) = status {
        assert_eq!(status, 413);
    }
    assert!(
        upstream.received().iter().all(|r| r.body.len() <= 32 * 1024 * 1024),
        "more than 32 MB reached the upstream"
    );
}

#[test]
fn a_client_that_goes_away_cancels_the_upstream_request() {
    let (_dir, rt, upstream, gw) = started();
    for trial in 0..5 {
        let request =
            format!("POST /v1/messages HTTP/1.1\r\nHost: {}\r\nx-stub: hang\r\nContent-Length: 2\r\n\r\n{{}}", gw.addr);
        let mut stream = std::net::TcpStream::connect(gw.addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), upstream.arrived.notified()).await })
            .unwrap_or_else(|_| panic!("trial {trial}: the request did not reach the upstream"));
        drop(stream);
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), upstream.dropped.notified()).await })
            .unwrap_or_else(|_| panic!("trial {trial}: the upstream request outlived its client"));
    }
}

#[test]
fn a_connection_that_sends_nothing_is_closed_after_the_idle_time() {
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(dir.path(), "http://127.0.0.1:9", &["--idle-seconds", "0.5"], &[]).unwrap();
    let host = format!("Host: {}\r\n", gw.addr);
    for first in ["", "GET /ctxd/sessions HTTP/1.1\r\n"] {
        // Silent from the start, and kept alive after one answer.
        let mut stream = std::net::TcpStream::connect(gw.addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        if !first.is_empty() {
            stream.write_all(format!("{first}{host}\r\n").as_bytes()).unwrap();
        }
        let mut out = Vec::new();
        let read = stream.read_to_end(&mut out);
        assert!(read.is_ok(), "the gateway kept an idle connection open for 20 s ({first:?}): {read:?}");
    }
}

#[test]
fn a_listen_address_beyond_loopback_needs_allow_remote() {
    let dir = tempfile::tempdir().unwrap();
    let out = ctxd_e2e::ctxd_command()
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--log-stderr", "gateway", "--listen", "0.0.0.0:0", "--upstream", "http://127.0.0.1:9"])
        .env("HOME", dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("not a loopback address") && said.contains("--allow-remote"), "{said}");
    let gw = Gateway::start(
        &dir.path().join("remote"),
        "http://127.0.0.1:9",
        &["--allow-remote", "--listen", "0.0.0.0:0"],
        &[],
    );
    assert!(gw.is_ok(), "--allow-remote starts it");
}

/// A Claude Code transcript (the captured fixture) under the gateway's home, as
/// `~/.claude/projects/<project>/<session>.jsonl`.
fn claude_transcript(home: &std::path::Path, session: &str) -> std::path::PathBuf {
    let folder = home.join(".claude/projects/-work-proj");
    std::fs::create_dir_all(&folder).unwrap();
    let path = folder.join(format!("{session}.jsonl"));
    let lines: Vec<String> = std::fs::read_to_string(ctxd_e2e::claude_code_fixture("manual-compact.jsonl"))
        .unwrap()
        .lines()
        // The project directory the program worked in must exist (compaction checks it).
        .map(|line| line.replace("/home/dev/proj", home.to_str().unwrap()))
        .collect();
    std::fs::write(&path, lines[..60].join("\n") + "\n").unwrap();
    path
}

/// One streamed Messages request of `session` through the gateway, read whole.
fn turn(rt: &tokio::runtime::Runtime, upstream: &gateway::Upstream, url: &str, session: &str) {
    rt.block_on(async {
        let answer = gateway::client()
            .post(url)
            .header("x-claude-code-session-id", session)
            .header("x-api-key", CANARY_KEY)
            .body(messages_body(session, None))
            .send()
            .await
            .unwrap();
        upstream.release.notify_one();
        answer.bytes().await.unwrap();
    });
}

fn exact_tokens() -> u64 {
    usage("input_tokens") + usage("cache_read_input_tokens") + usage("cache_creation_input_tokens") + OUTPUT_TOKENS
}

#[test]
fn an_editor_sharing_the_gateways_daemon_gets_the_exact_figures_of_an_observed_session() {
    let dir = tempfile::tempdir().unwrap();
    let rt = gateway::runtime();
    let upstream = gateway::upstream(&rt);
    let session = "5f0c6a2e-1111-4222-8333-444455556666";
    let home = dir.path().join("home");
    let path = claude_transcript(&home, session);
    let gw = Gateway::start(dir.path(), &upstream.url(), &[], &[]).unwrap();
    // An editor's `ctxd serve` on the same store relays to the gateway's daemon.
    let home_text = home.to_str().unwrap();
    let mut editor = Daemon::start_with(&gw.state_dir, &[], &[("HOME", home_text)]).unwrap();
    editor.initialize().unwrap();
    let observed = editor.request("ctx/observe", json!({"transcript": path})).unwrap();
    let id = observed["sessionId"].as_str().unwrap().to_owned();
    assert_ne!(observed["usage"]["reportedTokens"], exact_tokens(), "{observed}");
    turn(&rt, &upstream, &gw.url("/v1/messages"), session);
    let pushed = editor
        .wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == id.as_str() && p["usage"]["reportedTokens"] == exact_tokens()
        })
        .unwrap();
    assert_eq!(pushed["usage"]["tokens"], exact_tokens(), "{pushed}");
    editor.stop().unwrap();
    drop(gw);
    assert_no_canary(dir.path());
}

#[test]
fn ctxd_serve_runs_the_gateway_when_the_settings_enable_it() {
    let dir = tempfile::tempdir().unwrap();
    let rt = gateway::runtime();
    let upstream = gateway::upstream(&rt);
    let session = "7a7a7a7a-1111-4222-8333-444455556666";
    let state = dir.path().join("state");
    let home = state.with_extension("home");
    let path = claude_transcript(&home, session);
    // A free port for the setting: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let settings =
        json!({"gateway": {"enabled": true, "listen": format!("127.0.0.1:{port}"), "upstream": upstream.url()}});
    std::fs::create_dir_all(home.join(".config/ctxd")).unwrap();
    std::fs::write(home.join(".config/ctxd/settings.json"), settings.to_string()).unwrap();
    let mut daemon = Daemon::started(&state).unwrap();
    daemon.notify("initialized", json!({})).unwrap();
    let observed = daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    let id = observed["sessionId"].as_str().unwrap().to_owned();
    let url = format!("http://127.0.0.1:{port}/v1/messages");
    // The gateway starts as the daemon is initialized: wait until it answers.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "the daemon's gateway never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    turn(&rt, &upstream, &url, session);
    daemon
        .wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == id.as_str() && p["usage"]["reportedTokens"] == exact_tokens()
        })
        .unwrap();
    daemon.stop().unwrap();
}

#[test]
fn the_gateway_process_compacts_idle_claude_code_sessions_per_the_users_settings() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let path = claude_transcript(&home, "3c3c3c3c-1111-4222-8333-444455556666");
    let before = std::fs::metadata(&path).unwrap().len();
    std::fs::create_dir_all(home.join(".config/ctxd")).unwrap();
    let settings = json!({"claudeIdleCompaction": true, "claudeIdleCompactAfterSeconds": 1,
        "claudeIdleCompactPercent": 1, "provider": "offline"});
    std::fs::write(home.join(".config/ctxd/settings.json"), settings.to_string()).unwrap();
    let gw = Gateway::start(dir.path(), "http://127.0.0.1:9", &[], &[]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(&path).unwrap().len() == before {
        let log = || std::fs::read_to_string(&gw.log).unwrap_or_default();
        assert!(std::time::Instant::now() < deadline, "no idle compaction by the gateway process in 60 s:\n{}", log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text[before as usize..].contains("compact_boundary"), "what was appended is a compaction");
}

async fn json_of(answer: reqwest::Response) -> Value {
    serde_json::from_slice(&answer.bytes().await.unwrap()).unwrap()
}

/// Neither the key nor the body's text is in any file under `dir` (state, log, home).
fn assert_no_canary(dir: &std::path::Path) {
    let mut stack = vec![dir.to_owned()];
    let mut files = 0;
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap().flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                files += 1;
                let bytes = std::fs::read(&path).unwrap();
                for canary in [CANARY_KEY, CANARY_TEXT] {
                    assert!(memchr_find(&bytes, canary.as_bytes()).is_none(), "{canary} is in {}", path.display());
                }
            }
        }
    }
    assert!(files > 0, "no files looked at");
    assert!(dir.join("gateway.log").is_file(), "the log is among them");
}

fn memchr_find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
