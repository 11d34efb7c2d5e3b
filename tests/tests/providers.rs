//! Compaction through a provider over real HTTP: a local server speaking the Anthropic
//! Messages streaming format writes the summary; when the provider keeps failing, the
//! offline summarizer does, and the compaction still succeeds. Once the host has
//! assembled, the summary is asked of the cache-sharing fork of its request first
//! (path 1), and of the summary-specific fallback request (path 2) when the fork cannot
//! share the cache or gives no usable summary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::io::Read;
use std::net::TcpListener;

use ctxd_e2e::stub::{Seen, serve, sse_events, sse_text};
use ctxd_e2e::{Daemon, assistant_record, repo_root, user_record};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5-20250929";

const SUMMARY: &str =
    "<analysis>draft</analysis><summary>1. Primary Request and Intent:\n   REMOTE-SUMMARY of the work.\n</summary>";

fn sse_summary(_: &str) -> (u16, String) {
    sse_text(SUMMARY)
}

fn always_400(_: &str) -> (u16, String) {
    (
        400,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "the request was malformed"}})
            .to_string(),
    )
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
    opened_records(provider_port, dir, extra, &[], 30)
}

/// A daemon with session `p` open on the provider at `provider_port`, with settings
/// `extra`, environment `env` and the first `count` records of the example session.
fn opened_records(
    provider_port: u16,
    dir: &std::path::Path,
    extra: Value,
    env: &[(&str, &str)],
    count: usize,
) -> Daemon {
    let project = dir.join("project");
    std::fs::create_dir_all(project.join(".ctxd")).unwrap();
    let mut settings = json!({"provider": "anthropic", "baseUrl": format!("http://127.0.0.1:{provider_port}"), "apiKeyEnv": "CTXD_TEST_API_KEY"});
    settings.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    std::fs::write(project.join(".ctxd/settings.json"), settings.to_string()).unwrap();
    let mut env = env.to_vec();
    env.push(("CTXD_TEST_API_KEY", "sk-test-secret-key-123"));
    ctxd_e2e::trust_folder(&dir.join("state"), &project).unwrap();
    let mut daemon = Daemon::start_with(&dir.join("state"), &[], &env).unwrap();
    daemon.initialize().unwrap();
    daemon.request("ctx/openSession", json!({"cwd": project, "model": MODEL, "sessionId": "p"})).unwrap();
    let text = std::fs::read_to_string(repo_root().join("examples/session.jsonl")).unwrap();
    let records: Vec<Value> = text.lines().take(count).map(|l| serde_json::from_str(l).unwrap()).collect();
    daemon.request("ctx/append", json!({"sessionId": "p", "records": records})).unwrap();
    daemon
}

#[test]
fn a_provider_writes_the_summary_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let (port, seen) = serve(sse_summary);
    let (_daemon, result) = session(port, dir.path());
    assert_eq!(result["summarizer"], "anthropic", "{result}");
    assert_eq!(result["summaryPath"], "fallback", "no host request to fork: {result}");
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

/// A provider that takes one request and never answers: its port, then word when the
/// request came and when the daemon hung up on it.
fn silent_provider() -> (u16, std::sync::mpsc::Receiver<()>, std::sync::mpsc::Receiver<()>) {
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
        while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
        let _ = hung_up.send(());
    });
    (port, request_seen, connection_closed)
}

#[test]
fn cancel_request_stops_a_compaction_and_its_provider_call() {
    let (port, request_seen, connection_closed) = silent_provider();
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

#[test]
fn cancel_request_stops_an_assemble_waiting_for_a_compaction_and_not_the_compaction() {
    let (port, request_seen, _hung_up) = silent_provider();
    // A window the example session is far past: the append starts an automatic
    // compaction, and a request at the blocked level waits for it.
    let dir = tempfile::tempdir().unwrap();
    let mut daemon =
        opened_records(port, dir.path(), json!({}), &[("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "60000")], usize::MAX);
    request_seen.recv_timeout(std::time::Duration::from_secs(30)).expect("the provider got the summary request");
    let usage = daemon.request("ctx/usage", json!({"sessionId": "p"})).unwrap();
    assert_eq!(usage["usage"]["level"], "compacting", "{usage}");

    let id = daemon.send_request("ctx/assemble", json!({"sessionId": "p", "maxTokens": 8000})).unwrap();
    daemon.notify("$/cancelRequest", json!({"id": id})).unwrap();
    let response = daemon.response(id).unwrap();
    assert_eq!(response["error"]["code"], -32800, "the waiting assemble answers cancelled: {response}");
    // The compaction it waited for goes on, and the session answers.
    let usage = daemon.request("ctx/usage", json!({"sessionId": "p"})).unwrap();
    assert_eq!(usage["usage"]["level"], "compacting", "{usage}");
    // An append is never answered "cancelled": it is stored either way.
    let more = json!({"type": "user", "uuid": "after-cancel", "parentUuid": null, "message": {"role": "user", "content": "go on"}});
    let id = daemon.send_request("ctx/append", json!({"sessionId": "p", "records": [more]})).unwrap();
    daemon.notify("$/cancelRequest", json!({"id": id})).unwrap();
    let response = daemon.response(id).unwrap();
    assert_eq!(response["result"]["appended"], 1, "{response}");
}

#[test]
fn an_assemble_waiting_for_a_compaction_its_client_cancelled_is_answered() {
    let (port, request_seen, connection_closed) = silent_provider();
    // No automatic compaction and a blocked level every request passes: with a manual
    // compaction running, an assemble waits for it.
    let env = [("DISABLE_AUTO_COMPACT", "1"), ("CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE", "1000")];
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = opened_records(port, dir.path(), json!({}), &env, 30);
    let compact = daemon.send_request("ctx/compact", json!({"sessionId": "p"})).unwrap();
    request_seen.recv_timeout(std::time::Duration::from_secs(30)).expect("the provider got the summary request");
    let assemble = daemon.send_request("ctx/assemble", json!({"sessionId": "p", "maxTokens": 8000})).unwrap();
    daemon.wait_log("the assemble held for the compaction", |l| l.contains("waits for the compaction")).unwrap();

    daemon.notify("$/cancelRequest", json!({"id": compact})).unwrap();
    assert_eq!(daemon.response(compact).unwrap()["error"]["code"], -32800);
    connection_closed.recv_timeout(std::time::Duration::from_secs(30)).expect("the HTTP request was aborted");
    // The compaction it waited for will not come: it is answered from the view as it is
    // (it used to wait until the next compaction ended, maybe never).
    let answer = daemon.response(assemble).unwrap();
    assert!(answer.get("result").is_some() || answer["error"]["code"] != -32800, "{answer}");
    let usage = daemon.request("ctx/usage", json!({"sessionId": "p"})).unwrap();
    assert_ne!(usage["usage"]["level"], "compacting", "{usage}");
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
    let mut daemon =
        opened_with(port, dir.path(), json!({"compactModel": "claude-small", "largerModelRetry": "claude-large[1m]"}));
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

// ---------------------------------------------------------------------------------
// Path 1, the cache-sharing fork.

/// Records of the example session that end with a reply (no tool call left open), so the
/// host's request ends with an assistant message.
const ENDS_WITH_REPLY: usize = 22;

/// The host's own blocks: a marker of its own on the last system block, two tools, and
/// extended thinking on.
fn host_blocks() -> Value {
    json!({
        "system": [
            {"type": "text", "text": "You are a coding agent in a terminal."},
            {"type": "text", "text": "Follow the project's conventions.", "cache_control": {"type": "ephemeral"}}
        ],
        "tools": [
            {"name": "Read", "description": "Read a file", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}},
            {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
        ],
        "maxTokens": 32000,
        "thinking": {"type": "enabled", "budget_tokens": 8000}
    })
}

/// The request the host gets from `ctx/assemble` for session `p`.
fn host_assembles(daemon: &mut Daemon) -> Value {
    let mut params = host_blocks();
    params["sessionId"] = json!("p");
    daemon.request("ctx/assemble", params).unwrap()["request"].clone()
}

fn bodies(seen: &Seen) -> Vec<Value> {
    seen.lock().unwrap().iter().map(|(_, body)| serde_json::from_str(body).unwrap()).collect()
}

fn is_fork(body: &Value) -> bool {
    body["tools"].as_array().is_some_and(|t| !t.is_empty())
}

/// Path 2's shape: its own system prompt (not the host's), no tools, thinking off.
fn assert_fallback(body: &Value) {
    assert_ne!(body["system"], host_blocks()["system"], "{body}");
    assert!(body["system"][0]["text"].as_str().unwrap().len() > 20, "a summary system prompt: {body}");
    assert!(body.get("tools").is_none() && body.get("tool_choice").is_none(), "{body}");
    assert_eq!(body["thinking"], json!({"type": "disabled"}), "{body}");
}

#[test]
fn the_fork_sends_the_hosts_request_with_the_instruction_appended() {
    let dir = tempfile::tempdir().unwrap();
    let (port, seen) = serve(sse_summary);
    let mut daemon = opened_records(port, dir.path(), json!({}), &[], ENDS_WITH_REPLY);
    let assembled = host_assembles(&mut daemon);
    let result = daemon.request("ctx/compact", json!({"sessionId": "p"})).unwrap();
    assert_eq!(result["summarizer"], "anthropic", "{result}");
    assert_eq!(result["summaryPath"], "fork", "{result}");
    assert!(result["summary"].as_str().unwrap().contains("REMOTE-SUMMARY"), "{result}");
    assert!(result.get("problems").is_none(), "{result}");

    let bodies = bodies(&seen);
    assert_eq!(bodies.len(), 1, "one request: the fork answered");
    let fork = &bodies[0];
    // Everything in front of the instruction is the host's request as it was assembled.
    for key in ["model", "system", "tools", "max_tokens"] {
        assert_eq!(fork[key], assembled[key], "{key}");
    }
    assert_eq!(assembled["thinking"], host_blocks()["thinking"], "the host's thinking settings, as sent");
    assert_eq!(
        fork["thinking"], assembled["thinking"],
        "the fork keeps them: the cached prefix is read only under the same settings"
    );
    let shared = assembled["messages"].as_array().unwrap();
    let messages = fork["messages"].as_array().unwrap();
    assert_eq!(shared.last().unwrap()["role"], "assistant", "the view ends with a reply");
    assert_eq!(messages.len(), shared.len() + 1, "the prefix, then the instruction as its own message");
    assert_eq!(&messages[..shared.len()], shared.as_slice(), "the message prefix is byte-equal");
    // The breakpoint sits at the end of the shared prefix; the instruction has none.
    let last_shared = shared.last().unwrap()["content"].as_array().unwrap().last().unwrap();
    assert!(last_shared.get("cache_control").is_some(), "{last_shared}");
    let instruction = messages.last().unwrap();
    assert_eq!(instruction["role"], "user");
    assert!(instruction.to_string().contains("Primary Request and Intent"), "{instruction}");
    assert!(!instruction.to_string().contains("cache_control"), "the fork writes no cache of its own: {instruction}");
    // The parent's tool settings, unchanged (a changed `tool_choice` would cost the
    // cached messages; tool use is refused on ctxd's side); within the breakpoint limit.
    assert_eq!(fork.get("tool_choice"), assembled.get("tool_choice"));
    let markers = fork.to_string().matches("\"cache_control\"").count();
    assert!((1..=4).contains(&markers), "{markers} breakpoints");
}

/// A session at 75 % of a 100k window after a turn: the request the host was handed
/// for the next turn carries a budget notice, a note given once, at its end (where its
/// cache breakpoint goes). Returns the daemon and that request.
fn a_turn_sent_with_a_note(port: u16, dir: &std::path::Path) -> (Daemon, Value) {
    let env = [("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "100000")];
    let mut daemon = opened_records(port, dir, json!({}), &env, ENDS_WITH_REPLY);
    let records = json!([user_record("n1", None, "Go on."), assistant_record("n2", Some("n1"), "msg_n2", 50_000, 200)]);
    daemon.request("ctx/append", json!({"sessionId": "p", "records": records})).unwrap();
    let sent = host_assembles(&mut daemon);
    assert!(sent.to_string().contains("Context budget"), "a note given once ends the request: {sent}");
    (daemon, sent)
}

/// The model's reply to that request, reporting `tokens` of context.
fn append_the_reply(daemon: &mut Daemon, tokens: u64) {
    let mut reply = assistant_record("n3", Some("n2"), "msg_n3", tokens, 300);
    reply["message"]["content"] = json!([{"type": "text", "text": "REPLY-AFTER-THE-REQUEST"}]);
    daemon.request("ctx/append", json!({"sessionId": "p", "records": [reply]})).unwrap();
}

#[test]
fn an_automatic_fork_is_the_request_the_model_answered_last_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let (port, seen) = serve(sse_summary);
    let (mut daemon, sent) = a_turn_sent_with_a_note(port, dir.path());
    // Its reply crosses the threshold: ctxd compacts on its own, forking that request.
    append_the_reply(&mut daemon, 101_000);
    let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == "p").unwrap();
    assert_eq!(compacted["trigger"], "auto", "{compacted}");

    let bodies = bodies(&seen);
    let fork = bodies.iter().find(|b| is_fork(b)).expect("a fork was sent");
    for key in ["model", "system", "tools", "max_tokens", "thinking"] {
        assert_eq!(fork[key], sent[key], "{key}");
    }
    // The request as sent, markers and notice included, the instruction joined to its
    // last user message; the reply that came after it is not in the fork (it is kept
    // after the summary), so every block of the fork but the instruction was cached.
    let shared = sent["messages"].as_array().unwrap();
    let messages = fork["messages"].as_array().unwrap();
    assert_eq!(messages.len(), shared.len(), "{fork}");
    let last = shared.len() - 1;
    assert_eq!(&messages[..last], &shared[..last], "the message prefix is byte-equal");
    let sent_last = shared[last]["content"].as_array().unwrap();
    let fork_last = messages[last]["content"].as_array().unwrap();
    assert_eq!(&fork_last[..sent_last.len()], sent_last.as_slice(), "the notice and its breakpoint, as sent");
    assert_eq!(fork_last.len(), sent_last.len() + 1, "then the instruction");
    assert!(fork_last[sent_last.len()].to_string().contains("Primary Request and Intent"));
    assert!(!fork.to_string().contains("REPLY-AFTER-THE-REQUEST"), "{fork}");
    // Nothing was lost: the reply after it is in the compacted session's next request.
    let after = host_assembles(&mut daemon);
    assert!(after.to_string().contains("REMOTE-SUMMARY"), "{after}");
    assert!(after.to_string().contains("REPLY-AFTER-THE-REQUEST"), "the reply is kept: {after}");
}

/// The user's `/compact` right after a turn forks the request that turn sent, as an
/// automatic compaction does: a request built anew would lack the note given once at
/// its end, and the provider would read its cache only up to the note.
#[test]
fn a_manual_compaction_after_a_turn_forks_the_request_the_model_answered() {
    let dir = tempfile::tempdir().unwrap();
    let (port, seen) = serve(sse_summary);
    let (mut daemon, sent) = a_turn_sent_with_a_note(port, dir.path());
    // The turn's reply, below the threshold; then the user compacts.
    append_the_reply(&mut daemon, 60_000);
    let result = daemon.request("ctx/compact", json!({"sessionId": "p"})).unwrap();
    assert_eq!(result["summaryPath"], "fork", "{result}");

    let bodies = bodies(&seen);
    let fork = bodies.iter().find(|b| is_fork(b)).expect("a fork was sent");
    let shared = sent["messages"].as_array().unwrap();
    let messages = fork["messages"].as_array().unwrap();
    let last = shared.len() - 1;
    assert_eq!(messages.len(), shared.len(), "the instruction joins the last user message: {fork}");
    assert_eq!(&messages[..last], &shared[..last], "the message prefix is byte-equal");
    let sent_last = shared[last]["content"].as_array().unwrap();
    assert_eq!(&messages[last]["content"].as_array().unwrap()[..sent_last.len()], sent_last.as_slice());
    // Priced by the cache simulation: all but the instruction is read.
    let share = ctxd_e2e::cache::fork_read_share(&sent, fork);
    assert!(share >= 0.99, "the fork read {:.1} % of the turn's request from cache", share * 100.0);
    // The reply is kept after the summary.
    let after = host_assembles(&mut daemon);
    assert!(after.to_string().contains("REMOTE-SUMMARY"), "{after}");
    assert!(after.to_string().contains("REPLY-AFTER-THE-REQUEST"), "the reply is kept: {after}");
}

fn tool_use_to_the_fork(body: &str) -> (u16, String) {
    if is_fork(&serde_json::from_str(body).unwrap()) {
        let blocks = vec![
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"file_path\": \"/a.rs\"}"}}),
            json!({"type": "content_block_stop", "index": 0}),
        ];
        sse_events(blocks, "tool_use")
    } else {
        sse_summary(body)
    }
}

/// A tool call to the first fork, the summary once the fork is told tools are refused.
fn tool_use_until_refused(body: &str) -> (u16, String) {
    if body.contains("Tool use is refused for this request") { sse_summary(body) } else { tool_use_to_the_fork(body) }
}

#[test]
fn a_fork_that_calls_a_tool_is_refused_and_asked_once_more() {
    let dir = tempfile::tempdir().unwrap();
    let (port, seen) = serve(tool_use_until_refused);
    let mut daemon = opened_records(port, dir.path(), json!({}), &[], ENDS_WITH_REPLY);
    host_assembles(&mut daemon);
    let result = daemon.request("ctx/compact", json!({"sessionId": "p"})).unwrap();
    assert_eq!(result["summaryPath"], "fork", "{result}");
    assert!(result["summary"].as_str().unwrap().contains("REMOTE-SUMMARY"), "{result}");
    let bodies = bodies(&seen);
    assert_eq!(bodies.len(), 2, "the fork, then the fork asked again");
    assert!(is_fork(&bodies[0]) && is_fork(&bodies[1]));
    // The re-ask changes only the instruction: the prefix, tools and tool settings stay.
    for key in ["model", "system", "tools", "thinking", "max_tokens", "tool_choice"] {
        assert_eq!(bodies[1].get(key), bodies[0].get(key), "{key}");
    }
    let (first, again) = (bodies[0]["messages"].as_array().unwrap(), bodies[1]["messages"].as_array().unwrap());
    assert_eq!(first.len(), again.len());
    assert_eq!(first[..first.len() - 1], again[..again.len() - 1]);
}

fn empty_text_to_the_fork(body: &str) -> (u16, String) {
    if is_fork(&serde_json::from_str(body).unwrap()) { sse_text("") } else { sse_summary(body) }
}

#[test]
fn a_fork_reply_with_a_tool_call_or_no_text_gives_way_to_the_fallback() {
    for (name, respond) in
        [("tool call", tool_use_to_the_fork as fn(&str) -> (u16, String)), ("no text", empty_text_to_the_fork)]
    {
        let dir = tempfile::tempdir().unwrap();
        let (port, seen) = serve(respond);
        let mut daemon = opened_records(port, dir.path(), json!({}), &[], ENDS_WITH_REPLY);
        host_assembles(&mut daemon);
        let result = daemon.request("ctx/compact", json!({"sessionId": "p"})).unwrap();
        assert_eq!(result["summarizer"], "anthropic", "{name}: {result}");
        assert_eq!(result["summaryPath"], "fallback", "{name}: {result}");
        assert!(result["summary"].as_str().unwrap().contains("REMOTE-SUMMARY"), "{name}: {result}");
        assert!(result["problems"].to_string().contains("cache-sharing fork"), "{name}: {result}");
        let bodies = bodies(&seen);
        // A tool call is refused and asked once more before the fallback.
        let forks = if name == "tool call" { 2 } else { 1 };
        assert_eq!(bodies.len(), forks + 1, "{name}: the fork, then the fallback");
        assert!(bodies[..forks].iter().all(is_fork), "{name}");
        assert_fallback(&bodies[forks]);
        // The summary installed is the fallback's.
        let usage = daemon.request("ctx/usage", json!({"sessionId": "p"})).unwrap();
        assert_ne!(usage["usage"]["level"], "compacting", "{name}");
    }
}

fn summary_only_when_reasked(body: &str) -> (u16, String) {
    if body.contains("Your previous reply had no <summary> block") {
        sse_summary(body)
    } else {
        sse_text("Here is what happened: a lot.")
    }
}

#[test]
fn a_fork_reply_without_a_summary_is_asked_again_as_a_fork() {
    let dir = tempfile::tempdir().unwrap();
    let (port, seen) = serve(summary_only_when_reasked);
    let mut daemon = opened_records(port, dir.path(), json!({}), &[], ENDS_WITH_REPLY);
    let assembled = host_assembles(&mut daemon);
    let result = daemon.request("ctx/compact", json!({"sessionId": "p"})).unwrap();
    assert_eq!(result["summaryPath"], "fork", "{result}");
    assert!(result["summary"].as_str().unwrap().contains("REMOTE-SUMMARY"), "{result}");
    let bodies = bodies(&seen);
    assert_eq!(bodies.len(), 2, "asked, then asked again");
    let shared = assembled["messages"].as_array().unwrap().len();
    for body in &bodies {
        assert!(is_fork(body), "both are forks: {body}");
        assert_eq!(body["system"], assembled["system"]);
        assert_eq!(body["messages"].as_array().unwrap()[..shared], assembled["messages"].as_array().unwrap()[..]);
    }
    let again = bodies[1]["messages"].as_array().unwrap().last().unwrap().to_string();
    assert!(
        again.contains("Primary Request and Intent") && again.contains("Your previous reply had no <summary> block"),
        "{again}"
    );
}

#[test]
fn a_different_compact_model_or_the_opt_out_goes_straight_to_the_fallback() {
    type Env = &'static [(&'static str, &'static str)];
    let cases: [(&str, Value, Env, &str); 3] = [
        ("compactModel", json!({"compactModel": "claude-small"}), &[], "claude-small"),
        ("compactFork: false", json!({"compactFork": false}), &[], MODEL),
        ("CTXD_DISABLE_COMPACT_FORK=1", json!({}), &[("CTXD_DISABLE_COMPACT_FORK", "1")], MODEL),
    ];
    for (name, settings, env, model) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (port, seen) = serve(sse_summary);
        let mut daemon = opened_records(port, dir.path(), settings, env, ENDS_WITH_REPLY);
        host_assembles(&mut daemon);
        let result = daemon.request("ctx/compact", json!({"sessionId": "p"})).unwrap();
        assert_eq!(result["summaryPath"], "fallback", "{name}: {result}");
        assert!(result.get("problems").is_none(), "{name}: skipping the fork is no problem: {result}");
        let bodies = bodies(&seen);
        assert_eq!(bodies.len(), 1, "{name}: no fork was sent");
        assert_fallback(&bodies[0]);
        assert_eq!(bodies[0]["model"], model, "{name}");
    }
}

fn too_long_for_the_fork(body: &str) -> (u16, String) {
    if is_fork(&serde_json::from_str(body).unwrap()) {
        (400, json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 250000 tokens > 200000 maximum"}}).to_string())
    } else {
        sse_summary(body)
    }
}

#[test]
fn a_fork_refused_goes_to_the_fallback_once_then_offline() {
    // Too long for the fork: the fallback (which can cut its own input) writes it.
    let dir = tempfile::tempdir().unwrap();
    let (port, seen) = serve(too_long_for_the_fork);
    let mut daemon = opened_records(port, dir.path(), json!({}), &[], ENDS_WITH_REPLY);
    host_assembles(&mut daemon);
    let result = daemon.request("ctx/compact", json!({"sessionId": "p"})).unwrap();
    assert_eq!(result["summaryPath"], "fallback", "{result}");
    assert!(result["problems"].to_string().contains("too long"), "{result}");
    let sent = bodies(&seen);
    assert_eq!(sent.len(), 2);
    assert!(is_fork(&sent[0]));
    assert_fallback(&sent[1]);

    // Any other error: the fallback once, then the offline summarizer.
    let dir = tempfile::tempdir().unwrap();
    let (port, seen) = serve(always_400);
    let mut daemon = opened_records(port, dir.path(), json!({}), &[], ENDS_WITH_REPLY);
    host_assembles(&mut daemon);
    let result = daemon.request("ctx/compact", json!({"sessionId": "p"})).unwrap();
    assert_eq!(result["summarizer"], "offline", "{result}");
    assert!(result.get("summaryPath").is_none(), "{result}");
    let sent = bodies(&seen);
    assert_eq!(sent.len(), 2, "the fork, the fallback, no more");
    assert!(is_fork(&sent[0]));
    assert_fallback(&sent[1]);
}
