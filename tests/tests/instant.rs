//! Instant compaction on the gateway, end to end: the real `ctxd gateway` between a
//! real HTTP client and the local upstream (`ctxd_e2e::gateway`), which answers ctxd's
//! preparation fork at once and Claude Code's own compaction request only after
//! `SLOW_SUMMARY`. Nothing is timed: each test asserts on what the upstream saw (did the
//! compaction request reach it?) and on what the client got.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ctxd_e2e::gateway::{self, CLAUDE_INSTRUCTION, CTXD_INSTRUCTION, Gateway, Upstream};
use serde_json::{Value, json};

const SESSION: &str = "6f1d2c3b-0000-4000-8000-0000000000a1";
const MODEL: &str = "claude-opus-5-5";
/// The session's preparation starts after one idle second, from 10 % of the threshold
/// (the stub reports about 115k tokens; the threshold of claude-opus-5-5 is 967k).
const FLAGS: [&str; 4] = ["--precompute-idle", "1", "--precompute-at", "10"];

fn user(text: &str) -> Value {
    json!({"role": "user", "content": [{"type": "text", "text": text}]})
}

fn assistant(text: &str) -> Value {
    json!({"role": "assistant", "content": [{"type": "text", "text": text}]})
}

/// A Messages body in Claude Code's shape (cache markers on the system and the newest
/// message, the session in `metadata.user_id`).
fn body(session: &str, model: &str, messages: &[Value]) -> String {
    let mut messages = messages.to_vec();
    if let Some(last) = messages.last_mut().and_then(|m| m["content"].as_array_mut()).and_then(|c| c.last_mut()) {
        last["cache_control"] = json!({"type": "ephemeral"});
    }
    let user_id = json!({"device_id": "d", "account_uuid": "", "session_id": session}).to_string();
    json!({"model": model, "stream": true, "max_tokens": 32000,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Read", "description": "read a file", "input_schema": {"type": "object"}}],
        "messages": messages, "metadata": {"user_id": user_id}})
    .to_string()
}

/// Claude Code's instruction, as its `/compact` appends it (a stand-in text with its
/// recognisable opening).
fn instruction() -> String {
    format!("{CLAUDE_INSTRUCTION}. Do not call tools. Write an <analysis> draft, then a <summary> block.")
}

/// The conversation of the session's one turn: what its request carried.
fn first_turn() -> Vec<Value> {
    vec![user("Build the tokenizer for the quill language. MARK-1")]
}

/// POSTs a body; the status, the `x-ctxd-instant-compaction` header and the text of the
/// stream's text deltas.
fn post(rt: &tokio::runtime::Runtime, gw: &Gateway, body: String) -> (u16, Option<String>, String) {
    post_as(rt, gw, body, "fast")
}

/// [`post`] with the upstream's mode (`x-stub`) named.
fn post_as(rt: &tokio::runtime::Runtime, gw: &Gateway, body: String, mode: &str) -> (u16, Option<String>, String) {
    let client = gateway::client();
    rt.block_on(async {
        let answer = client
            .post(gw.url("/v1/messages?beta=true"))
            .header("x-stub", mode)
            .header("x-api-key", "sk-ant-test")
            .header("anthropic-version", "2023-06-01")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        let instant = answer.headers().get("x-ctxd-instant-compaction").map(|v| v.to_str().unwrap().to_owned());
        let bytes = answer.bytes().await.unwrap();
        (status, instant, stream_text(&bytes))
    })
}

/// The text of an SSE answer's text deltas; every event must parse.
fn stream_text(bytes: &[u8]) -> String {
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let mut out = String::new();
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut name = "";
        for line in block.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = n;
            } else if let Some(data) = line.strip_prefix("data: ") {
                let data: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
                assert_eq!(data["type"], name, "the event name is its data's type");
                if let Some(piece) = data["delta"]["text"].as_str() {
                    out.push_str(piece);
                }
            }
        }
        events.push(name.to_owned());
    }
    assert_eq!(events.first().map(String::as_str), Some("message_start"), "{text}");
    assert_eq!(events.last().map(String::as_str), Some("message_stop"), "{text}");
    out
}

/// Requests the upstream received that carry `needle`.
fn seen_with(upstream: &Upstream, needle: &str) -> Vec<String> {
    upstream
        .received()
        .into_iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .filter(|b| b.contains(needle))
        .collect()
}

/// A gateway whose session has had one turn and then idled until its summary was
/// prepared.
fn prepared() -> (tempfile::TempDir, tokio::runtime::Runtime, Upstream, Gateway) {
    let dir = tempfile::tempdir().unwrap();
    let rt = gateway::runtime();
    let upstream = gateway::upstream(&rt);
    let gw = Gateway::start(dir.path(), &upstream.url(), &FLAGS, &[]).unwrap();
    let (status, _, text) = post(&rt, &gw, body(SESSION, MODEL, &first_turn()));
    assert_eq!((status, text.as_str()), (200, "FAST"));
    gw.wait_log("gateway: summary prepared", 1);
    (dir, rt, upstream, gw)
}

/// The session's `/compact` after its turn: the turn, its answer, the instruction.
fn compact_request(session: &str, model: &str, extra: &[Value]) -> String {
    let mut messages = first_turn();
    messages.push(assistant("FAST"));
    messages.extend_from_slice(extra);
    messages.push(user(&instruction()));
    body(session, model, &messages)
}

#[test]
fn a_summary_prepared_while_idle_answers_compact_at_once_and_the_fork_shares_the_prefix() {
    let (_dir, rt, upstream, gw) = prepared();
    // The fork: the session's request byte for byte up to its last message, with
    // ctxd's instruction after it.
    let forks = seen_with(&upstream, CTXD_INSTRUCTION);
    assert_eq!(forks.len(), 1, "one preparation");
    let turn = body(SESSION, MODEL, &first_turn());
    let messages_end = turn.find("}]}]").unwrap() + 3;
    assert_eq!(&forks[0][..messages_end], &turn[..messages_end], "the fork's prefix is the request's");
    assert!(forks[0][messages_end..].starts_with(",{\"role\":\"user\""));

    let (status, instant, text) = post(&rt, &gw, compact_request(SESSION, MODEL, &[]));
    assert_eq!(status, 200);
    assert!(instant.is_some(), "answered by the gateway: {}", gw.log_text());
    assert!(text.contains("<summary>") && text.contains("STUB-SUMMARY of MARK-1"), "{text}");
    assert!(text.contains("<analysis>"), "{text}");
    assert!(seen_with(&upstream, CLAUDE_INSTRUCTION).is_empty(), "the compaction request never reached the upstream");
}

#[test]
fn a_delta_past_the_prepared_prefix_is_folded_in_without_a_model_call() {
    let (_dir, rt, upstream, gw) = prepared();
    let later = [user("Now add golden tests for the tokenizer. MARK-2"), assistant("Added tests/golden.rs.")];
    let before = upstream.received().len();
    let (status, instant, text) = post(&rt, &gw, compact_request(SESSION, MODEL, &later));
    assert_eq!(status, 200);
    assert!(instant.is_some(), "{}", gw.log_text());
    assert!(text.contains("STUB-SUMMARY of MARK-1"), "the prepared part: {text}");
    assert!(text.contains("golden tests for the tokenizer"), "the delta's user message is named: {text}");
    assert_eq!(upstream.received().len(), before, "no model call for the delta");
    // The answer and the two later messages (the log is written behind the answer).
    gw.wait_log("delta=3", 1);
}

#[test]
fn a_compaction_that_matches_nothing_prepared_is_forwarded_unchanged() {
    let (_dir, rt, upstream, gw) = prepared();
    let mut changed_start = first_turn();
    changed_start[0] = user("Build the parser instead. MARK-9");
    changed_start.push(assistant("FAST"));
    changed_start.push(user(&instruction()));
    let cases = [
        ("another session", compact_request("77777777-0000-4000-8000-000000000002", MODEL, &[]), "nothing prepared"),
        ("another model", compact_request(SESSION, "claude-sonnet-4-5", &[]), "prepared for claude-opus-5-5"),
        ("another prefix", body(SESSION, MODEL, &changed_start), "differ from those the summary was prepared for"),
        (
            "another system",
            compact_request(SESSION, MODEL, &[]).replace("You are Claude Code.", "You are someone else."),
            "system blocks or tools differ",
        ),
        (
            "a /compact with a focus",
            compact_request(SESSION, MODEL, &[]).replace(
                "then a <summary> block.",
                "then a <summary> block.\\n\\nAdditional Instructions:\\nkeep only the parser decisions\\n\\nREMINDER: text only.",
            ),
            "asks for a focus (30 characters)",
        ),
    ];
    for (n, (what, request, why)) in cases.into_iter().enumerate() {
        let (status, instant, text) = post(&rt, &gw, request.clone());
        assert_eq!(status, 200, "{what}");
        assert_eq!(instant, None, "{what}: never answered with another conversation's summary");
        assert!(text.contains("STUB-SUMMARY"), "{what}: the upstream's own summary: {text}");
        let reached = seen_with(&upstream, CLAUDE_INSTRUCTION);
        assert_eq!(reached.len(), n + 1, "{what}: forwarded");
        assert_eq!(reached[n], request, "{what}: byte for byte");
        gw.wait_log(why, 1);
    }
}

#[test]
fn a_restarted_gateway_answers_from_the_record_and_ignores_a_damaged_one() {
    let (dir, rt, upstream, gw) = prepared();
    drop(gw);
    let gw = Gateway::start(dir.path(), &upstream.url(), &FLAGS, &[]).unwrap();
    let (_, instant, text) = post(&rt, &gw, compact_request(SESSION, MODEL, &[]));
    assert!(instant.is_some(), "answered from the record on disk: {}", gw.log_text());
    assert!(text.contains("STUB-SUMMARY of MARK-1"), "{text}");
    drop(gw);

    let records = dir.path().join("state/gateway/prepared");
    let files: Vec<_> = std::fs::read_dir(&records).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let record = std::fs::read_to_string(&files[0]).unwrap();
    assert!(!record.contains("sk-ant-test"), "no key in the record");
    std::fs::write(&files[0], record.replace("STUB-SUMMARY", "EDITED-SUMMARY")).unwrap();
    let gw = Gateway::start(dir.path(), &upstream.url(), &FLAGS, &[]).unwrap();
    let (_, instant, text) = post(&rt, &gw, compact_request(SESSION, MODEL, &[]));
    assert_eq!(instant, None, "a damaged record answers nothing");
    assert!(!text.contains("EDITED-SUMMARY"), "{text}");
    gw.wait_log("record is damaged; ignored", 1);
    gw.wait_log("nothing prepared for the session", 1);
}

#[test]
fn two_compaction_requests_of_one_session_at_once_are_both_answered() {
    let (_dir, rt, upstream, gw) = prepared();
    // 20 trials of two at once: 0 of 20 may fail.
    for trial in 0..20 {
        let client = gateway::client();
        let url = gw.url("/v1/messages");
        let texts: Vec<(Option<String>, String)> = rt.block_on(async {
            let send = || {
                let request = client.post(&url).header("x-stub", "fast").body(compact_request(SESSION, MODEL, &[]));
                async move {
                    let answer = request.send().await.unwrap();
                    let instant =
                        answer.headers().get("x-ctxd-instant-compaction").map(|v| v.to_str().unwrap().to_owned());
                    (instant, stream_text(&answer.bytes().await.unwrap()))
                }
            };
            let (a, b) = tokio::join!(send(), send());
            vec![a, b]
        });
        for (instant, text) in texts {
            assert!(instant.is_some(), "trial {trial}: {}", gw.log_text());
            assert!(text.contains("STUB-SUMMARY of MARK-1"), "trial {trial}: {text}");
        }
    }
    assert!(seen_with(&upstream, CLAUDE_INSTRUCTION).is_empty());
}

#[test]
fn preparation_turned_off_forwards_every_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let rt = gateway::runtime();
    let upstream = gateway::upstream(&rt);
    let config = dir.path().join("home/.config/ctxd");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("settings.json"), r#"{"gateway": {"precompute": false}}"#).unwrap();
    let gw = Gateway::start(dir.path(), &upstream.url(), &FLAGS, &[]).unwrap();
    post(&rt, &gw, body(SESSION, MODEL, &first_turn()));
    // Wait for a later request's answer, then look: no fork was sent meanwhile.
    std::thread::sleep(Duration::from_secs(3));
    let (_, instant, _) = post(&rt, &gw, compact_request(SESSION, MODEL, &[]));
    assert_eq!(instant, None);
    assert!(seen_with(&upstream, CTXD_INSTRUCTION).is_empty(), "no preparation over the 3 s and the compaction");
    assert_eq!(seen_with(&upstream, CLAUDE_INSTRUCTION).len(), 1);
}

/// A Messages body whose system prompt names `project` as the working directory, as
/// Claude Code's environment section does.
fn body_in(project: &std::path::Path, messages: &[Value]) -> String {
    let mut value: Value = serde_json::from_str(&body(SESSION, MODEL, messages)).unwrap();
    value["system"][0]["text"] = json!(format!(
        "You are Claude Code.\nPrimary working directory: {}\n - Is a git repository",
        project.display()
    ));
    value.to_string()
}

#[test]
fn an_instant_answer_names_the_history_tools_when_ctxd_mcp_is_configured_for_the_project() {
    for configured in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("proj");
        std::fs::create_dir_all(&project).unwrap();
        if configured {
            let servers = json!({"mcpServers": {"ctxd": {"type": "stdio", "command": "ctxd", "args": ["mcp"]}}});
            std::fs::write(project.join(".mcp.json"), servers.to_string()).unwrap();
        }
        let rt = gateway::runtime();
        let upstream = gateway::upstream(&rt);
        let gw = Gateway::start(dir.path(), &upstream.url(), &FLAGS, &[]).unwrap();
        let (status, _, text) = post(&rt, &gw, body_in(&project, &first_turn()));
        assert_eq!((status, text.as_str()), (200, "FAST"));
        gw.wait_log("gateway: summary prepared", 1);
        let mut messages = first_turn();
        messages.push(assistant("FAST"));
        messages.push(user(&instruction()));
        let (status, instant, text) = post(&rt, &gw, body_in(&project, &messages));
        assert_eq!(status, 200);
        assert!(instant.is_some(), "answered by the gateway: {}", gw.log_text());
        assert!(text.contains("STUB-SUMMARY of MARK-1"), "{text}");
        assert_eq!(text.contains("mcp__ctxd__search_history"), configured, "configured: {configured}: {text}");
    }
}

/// `ctxd claude stats ARGS` on the gateway's state dir: exit success, stdout, stderr.
fn stats(gw: &Gateway, args: &[&str]) -> (bool, String, String) {
    let mut command = ctxd_e2e::ctxd_command();
    ctxd_e2e::hermetic(&mut command, &gw.home);
    let out = command.arg("--state-dir").arg(&gw.state_dir).args(["claude", "stats"]).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn stats_report_the_preparation_at_the_upstreams_usage_and_the_instant_compaction_and_skip_a_damaged_line() {
    let (_dir, rt, _upstream, gw) = prepared();
    let (_, instant, _) = post(&rt, &gw, compact_request(SESSION, MODEL, &[]));
    assert!(instant.is_some(), "{}", gw.log_text());
    // The preparation's line, then the answer's (written behind the answer).
    gw.wait_log("gateway: cost recorded", 2);

    let (ok, out, err) = stats(&gw, &["--json"]);
    assert!(ok, "{err}");
    let json: Value = serde_json::from_str(&out).unwrap();
    let sessions = json["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{out}");
    let s = &sessions[0];
    assert_eq!((s["sessionId"].as_str(), s["model"].as_str()), (Some(SESSION), Some(MODEL)));
    // The fork's usage is the upstream's: every figure it reported.
    let reported = |key: &str| gateway::USAGE.iter().find(|(k, _)| *k == key).unwrap().1;
    assert_eq!(s["preparations"], 1);
    assert_eq!(s["preparationInputTokens"], reported("input_tokens"));
    assert_eq!(s["preparationCacheReadTokens"], reported("cache_read_input_tokens"));
    assert_eq!(s["preparationCacheWriteTokens"], reported("cache_creation_input_tokens"));
    assert_eq!(s["preparationOutputTokens"], gateway::OUTPUT_TOKENS);
    // claude-opus-5-5 per million: $4 input, $0.20 cache read, $5 5-minute write, $20 output.
    let want = (12_305.0 * 4.0 + 98_304.0 * 0.2 + 4_096.0 * 5.0 + 321.0 * 20.0) / 1e6;
    let usd = |key: &str| s[key].as_f64().unwrap_or_else(|| panic!("{key}: {out}"));
    assert!((usd("preparationUsd") - want).abs() < 1e-9, "{out}");
    assert_eq!(s["instantCompactions"], 1);
    // The avoided call read at least the turn's cached prefix (114,705 tokens at $0.20);
    // the cache was warm, so no cold re-write is claimed.
    assert!(usd("savedCallUsd") >= 114_705.0 * 0.2 / 1e6, "{out}");
    assert_eq!(usd("savedColdRewriteUsd"), 0.0, "{out}");
    assert!((usd("netUsd") - (usd("savedUsd") - usd("preparationUsd"))).abs() < 1e-9, "{out}");

    // Text, by a prefix of the id.
    let (ok, text, err) = stats(&gw, &["6f1d2c3b"]);
    assert!(ok, "{err}");
    assert!(text.starts_with(&format!("session {SESSION} ({MODEL})")), "{text}");
    assert!(
        text.contains(
            "preparations         1 (12,305 input, 98,304 cache read, 4,096 cache write, 321 output tokens) $0.10"
        ),
        "{text}"
    );
    assert!(text.contains("instant compactions  1"), "{text}");
    // An unknown session: a clear error and a failing exit.
    let (ok, out, err) = stats(&gw, &["0000dead"]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains("no instant-compaction figures for a session \"0000dead\""), "{err}");

    // A damaged line is skipped with one log line; the others still count.
    let ledgers: Vec<_> =
        std::fs::read_dir(gw.state_dir.join("gateway/costs")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(ledgers.len(), 1, "{ledgers:?}");
    let ledger = std::fs::read_to_string(&ledgers[0]).unwrap();
    assert!(!ledger.contains("sk-ant-test") && !ledger.contains("STUB-SUMMARY"), "no key or body: {ledger}");
    let first = ledger.lines().next().unwrap();
    let damaged = format!("{ledger}{}\n{{\"v\":1,\"entry\":\n", first.replace("12305", "99999"));
    std::fs::write(&ledgers[0], damaged).unwrap();
    let (ok, out, err) = stats(&gw, &["--json"]);
    assert!(ok, "{err}");
    let json: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["sessions"][0]["preparations"], 1, "{out}");
    assert_eq!(json["sessions"][0]["instantCompactions"], 1, "{out}");
    assert_eq!(err.matches("a damaged cost ledger line skipped").count(), 2, "one log line per damaged line: {err}");
}

#[test]
fn a_model_the_price_table_does_not_know_is_never_prepared() {
    // Known to the model table (the claude-opus-4 family: its threshold is known), with
    // no price: what a preparation would cost cannot be told.
    const UNPRICED: &str = "claude-opus-4-9";
    let dir = tempfile::tempdir().unwrap();
    let rt = gateway::runtime();
    let upstream = gateway::upstream(&rt);
    let gw = Gateway::start(dir.path(), &upstream.url(), &FLAGS, &[]).unwrap();
    let (status, _, _) = post(&rt, &gw, body(SESSION, UNPRICED, &first_turn()));
    assert_eq!(status, 200);
    gw.wait_log("not preparing: the price table does not know the model", 1);
    // From the refusal through the compaction's forwarded answer (the upstream's slow
    // summary, 3 s): no fork.
    let (_, instant, text) = post(&rt, &gw, compact_request(SESSION, UNPRICED, &[]));
    assert_eq!(instant, None);
    assert!(text.contains("STUB-SUMMARY"), "{text}");
    gw.wait_log("nothing prepared for the session", 1);
    assert!(seen_with(&upstream, CTXD_INSTRUCTION).is_empty(), "no preparation fork was sent");
    assert_eq!(gw.log_text().matches("the price table does not know").count(), 1, "said once");
    let (ok, out, _) = stats(&gw, &["--json"]);
    assert!(ok);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["sessions"], json!([]), "nothing spent, nothing claimed");
}

#[test]
fn ctx_context_of_the_observed_session_shows_what_its_instant_compaction_cost_and_saved() {
    let (dir, rt, _upstream, gw) = prepared();
    let (_, instant, _) = post(&rt, &gw, compact_request(SESSION, MODEL, &[]));
    assert!(instant.is_some(), "{}", gw.log_text());
    gw.wait_log("gateway: cost recorded", 2);
    let state = gw.state_dir.clone();
    // The gateway holds the store; an editor's daemon takes it once it is gone.
    drop(gw);
    // The session's transcript, named by its id as Claude Code names it, and another one.
    let (_home, other, _) = ctxd_e2e::claude_home(&dir.path().join("cc")).unwrap();
    let transcript = other.with_file_name(format!("{SESSION}.jsonl"));
    std::fs::copy(&other, &transcript).unwrap();
    let mut daemon = ctxd_e2e::Daemon::started(&state).unwrap();
    let view_of = |daemon: &mut ctxd_e2e::Daemon, path: &std::path::Path| {
        let observed = daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
        daemon.request("ctx/context", json!({"sessionId": observed["sessionId"]})).unwrap()
    };
    let view = view_of(&mut daemon, &transcript);
    let figures = &view["instantCompaction"];
    assert_eq!(figures["sessionId"], SESSION, "{view}");
    assert_eq!((figures["preparations"].as_u64(), figures["instantCompactions"].as_u64()), (Some(1), Some(1)));
    assert_eq!(figures["preparationInputTokens"], 12_305);
    assert!(figures["savedUsd"].as_f64().unwrap() > 0.0, "{figures}");
    let net = figures["savedUsd"].as_f64().unwrap() - figures["preparationUsd"].as_f64().unwrap();
    assert!((figures["netUsd"].as_f64().unwrap() - net).abs() < 1e-9, "{figures}");
    // A session the gateway never prepared has no such figures.
    let view = view_of(&mut daemon, &other);
    assert!(view.get("instantCompaction").is_none(), "{view}");
}

/// Bad compaction requests: each is forwarded unchanged or refused, with one log line
/// saying which and why, and the session's prepared summary still answers afterwards.
#[test]
fn bad_compaction_requests_are_forwarded_or_refused_with_one_line_and_the_summary_survives() {
    use std::io::{Read, Write};
    let (_dir, rt, upstream, gw) = prepared();
    let forwarded = |n: usize| gw.wait_log("compaction request forwarded", n);

    // No session id anywhere: nothing to match it against.
    let mut anonymous: Value = serde_json::from_str(&compact_request(SESSION, MODEL, &[])).unwrap();
    anonymous.as_object_mut().unwrap().remove("metadata");
    let anonymous = anonymous.to_string();
    let (status, instant, text) = post(&rt, &gw, anonymous.clone());
    assert_eq!((status, instant), (200, None));
    assert!(text.contains("STUB-SUMMARY"), "{text}");
    assert_eq!(seen_with(&upstream, CLAUDE_INSTRUCTION), vec![anonymous], "forwarded byte for byte");
    forwarded(1);
    assert!(gw.log_text().contains("compaction request forwarded: it names no session"), "{}", gw.log_text());

    // Complete as HTTP, cut as JSON (just past the instruction's opening).
    let whole = compact_request(SESSION, MODEL, &[]);
    let cut = whole[..whole.find(CLAUDE_INSTRUCTION).unwrap() + CLAUDE_INSTRUCTION.len() + 10].to_owned();
    let mut stream = std::net::TcpStream::connect(gw.addr).unwrap();
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nx-stub: fast\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        gw.addr,
        cut.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(cut.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(!answer.contains("x-ctxd-instant-compaction"), "never answered from a summary: {answer}");
    forwarded(2);
    let reached = seen_with(&upstream, CLAUDE_INSTRUCTION);
    assert_eq!(reached.len(), 2, "forwarded");
    assert_eq!(reached[1], cut, "byte for byte");

    // Cut as HTTP: the client sends half of what it announced, then stops writing.
    let mut stream = std::net::TcpStream::connect(gw.addr).unwrap();
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nx-stub: fast\r\nContent-Length: {}\r\n\r\n",
        gw.addr,
        whole.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&whole.as_bytes()[..whole.len() / 2]).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    gw.wait_log("a request body broke off; nothing forwarded", 1);
    assert_eq!(upstream.received().len(), 4, "the turn, its fork and the two forwarded: nothing of the cut one");

    // The session's summary still answers its real compaction at once.
    let (status, instant, text) = post(&rt, &gw, whole);
    assert_eq!(status, 200);
    assert!(instant.is_some(), "answered by the gateway: {}", gw.log_text());
    assert!(text.contains("MARK-1"), "{text}");
    assert_eq!(seen_with(&upstream, CLAUDE_INSTRUCTION).len(), 2, "the real one never reached the upstream");
}

/// A compaction request that comes while its session's preparation is running waits for
/// it and is answered from it: the model is not asked for the same summary twice.
#[test]
fn a_compaction_request_during_the_preparation_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let rt = gateway::runtime();
    let upstream = gateway::upstream(&rt);
    let gw = Gateway::start(dir.path(), &upstream.url(), &FLAGS, &[]).unwrap();
    // The session's headers go with its fork: the upstream answers the fork in 3 s.
    let (status, _, text) = post_as(&rt, &gw, body(SESSION, MODEL, &first_turn()), "slowfork:3000");
    assert_eq!((status, text.as_str()), (200, "FAST"));
    gw.wait_log("gateway: preparing the session's summary", 1);
    assert!(!gw.log_text().contains("gateway: summary prepared"), "the fork is still on its way");
    let (status, instant, text) = post(&rt, &gw, compact_request(SESSION, MODEL, &[]));
    assert_eq!(status, 200);
    assert!(instant.is_some(), "answered from the preparation it waited for: {}", gw.log_text());
    assert!(text.contains("MARK-1"), "{text}");
    // The log is written behind the answers.
    gw.wait_log("gateway: summary prepared", 1);
    gw.wait_log("compaction answered from the prepared summary", 1);
    let held = gw.log_text();
    let (hold, ready) = (held.find("held until its preparation ends").unwrap(), held.find("summary prepared").unwrap());
    assert!(hold < ready, "held, then prepared, then answered: {held}");
    assert!(seen_with(&upstream, CLAUDE_INSTRUCTION).is_empty(), "the compaction request never reached the upstream");
    assert_eq!(seen_with(&upstream, CTXD_INSTRUCTION).len(), 1, "one summary asked of the model");
}
