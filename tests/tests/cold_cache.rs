//! Away and cold (issue 35 item 3), end to end on the real binary: once a live Claude
//! Code session's prompt cache has gone cold, `ctxd statusline` and the editors say what
//! the next turn re-writes and, when the gateway holds a summary prepared for the
//! session's newest request, that `/compact` is instant. The real `ctxd gateway` sits
//! between a real HTTP client and the local upstream (`ctxd_e2e::gateway`), which
//! answers the preparation fork at once.
//!
//! The editors are told at the moment the cache goes cold, with no turn and no
//! question: the gateway is started with `CTXD_CACHE_TTL_SECONDS` so that moment comes
//! within seconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ctxd_e2e::Daemon;
use ctxd_e2e::gateway::{self, Gateway};
use serde_json::{Value, json};

const MODEL: &str = "claude-opus-5-5";
/// Preparation after one idle second from 10 % of the threshold (the stub reports about
/// 115k tokens; claude-opus-5-5's threshold is 967k).
const FLAGS: [&str; 4] = ["--precompute-idle", "1", "--precompute-at", "10"];
const SUMMARY_READY: &str = "; /compact is instant (summary ready)";

/// A Messages body in Claude Code's shape with `turns` user messages (answers between
/// them), cache markers on the system and the newest message.
fn body(session: &str, turns: usize) -> String {
    let mut messages = Vec::new();
    for n in 1..=turns {
        if n > 1 {
            messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": "FAST"}]}));
        }
        messages.push(json!({"role": "user", "content": [{"type": "text", "text": format!("Step {n} of the tokenizer. MARK-{n}")}]}));
    }
    if let Some(last) = messages.last_mut() {
        last["content"][0]["cache_control"] = json!({"type": "ephemeral"});
    }
    let user_id = json!({"device_id": "d", "account_uuid": "", "session_id": session}).to_string();
    json!({"model": MODEL, "stream": true, "max_tokens": 32000,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Read", "description": "read a file", "input_schema": {"type": "object"}}],
        "messages": messages, "metadata": {"user_id": user_id}})
    .to_string()
}

/// One turn of `session` through the gateway, its answer read whole.
fn turn(rt: &tokio::runtime::Runtime, gw: &Gateway, session: &str, turns: usize) {
    rt.block_on(async {
        let answer = gateway::client()
            .post(gw.url("/v1/messages?beta=true"))
            .header("x-claude-code-session-id", session)
            .header("x-stub", "fast")
            .header("x-api-key", "sk-ant-test")
            .body(body(session, turns))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        answer.bytes().await.unwrap();
    });
}

/// `ctxd statusline` as Claude Code runs it for `session`, its own `prompt_cache` saying
/// the cache went cold a minute ago; the user's settings point at the gateway.
fn statusline(gw: &Gateway, session: &str) -> String {
    let config = gw.home.join(".config");
    std::fs::create_dir_all(config.join("ctxd")).unwrap();
    std::fs::write(config.join("ctxd/settings.json"), json!({"gateway": {"listen": gw.addr.to_string()}}).to_string())
        .unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let input = json!({
        "session_id": session,
        "model": {"id": MODEL, "display_name": "Opus 5.5"},
        "context_window": {"context_window_size": 1_000_000,
            "current_usage": {"input_tokens": 12_305, "cache_creation_input_tokens": 4_096, "cache_read_input_tokens": 98_304, "output_tokens": 321}},
        "prompt_cache": {"warm": false, "caching_observed": true, "ttl": "5m", "expires_at": now - 60, "recache_tokens_if_cold": 114_705},
    });
    ctxd_e2e::statusline_output(
        &[("HOME", gw.home.as_os_str()), ("XDG_CONFIG_HOME", config.as_os_str())],
        &input.to_string(),
    )
}

#[test]
fn the_status_line_says_summary_ready_once_prepared_and_only_for_the_newest_request() {
    let dir = tempfile::tempdir().unwrap();
    let rt = gateway::runtime();
    let upstream = gateway::upstream(&rt);
    let cold = "cache cold: next turn re-writes 114.7k tokens (~$0.57)";

    // A gateway that prepares nothing within the test (an hour's idle): cold, no fix.
    let idle =
        Gateway::start(&dir.path().join("unprepared"), &upstream.url(), &["--precompute-idle", "3600"], &[]).unwrap();
    let session = "0c0c0c0c-0000-4000-8000-0000000000b1";
    turn(&rt, &idle, session, 1);
    let line = statusline(&idle, session);
    assert!(line.ends_with(cold), "{line}");
    drop(idle);

    // Idle one second: the summary is prepared for the newest request, and said.
    let gw = Gateway::start(&dir.path().join("prepared"), &upstream.url(), &FLAGS, &[]).unwrap();
    turn(&rt, &gw, session, 1);
    gw.wait_log("gateway: summary prepared", 1);
    let line = statusline(&gw, session);
    assert!(line.ends_with(&format!("{cold}{SUMMARY_READY}")), "{line}");
    // Another session of the same gateway has nothing prepared.
    let line = statusline(&gw, "0c0c0c0c-0000-4000-8000-0000000000b2");
    assert!(line.ends_with(cold), "{line}");

    // A turn later the summary no longer covers the newest request (and is not made
    // again: the context did not grow by 10 % of the threshold).
    turn(&rt, &gw, session, 2);
    let line = statusline(&gw, session);
    assert!(line.ends_with(cold), "{line}");
    assert!(!line.contains("summary ready"), "{line}");
}

/// A Claude Code transcript of `session` under `home`, the captured real one.
fn claude_transcript(home: &std::path::Path, session: &str) -> std::path::PathBuf {
    let folder = home.join(".claude/projects/-work-proj");
    std::fs::create_dir_all(&folder).unwrap();
    let path = folder.join(format!("{session}.jsonl"));
    let text = std::fs::read_to_string(ctxd_e2e::claude_code_fixture("manual-compact.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().take(60).collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

#[test]
fn the_editor_is_told_the_moment_the_cache_goes_cold_with_the_summary_ready() {
    let dir = tempfile::tempdir().unwrap();
    let rt = gateway::runtime();
    let upstream = gateway::upstream(&rt);
    let session = "1d1d1d1d-1111-4222-8333-444455556666";
    // Six seconds of cache: time for the preparation (after one idle second) first.
    let gw = Gateway::start(dir.path(), &upstream.url(), &FLAGS, &[("CTXD_CACHE_TTL_SECONDS", "6")]).unwrap();
    let path = claude_transcript(&gw.home, session);
    // An editor's `ctxd serve` on the same store relays to the gateway's daemon.
    let home = gw.home.to_str().unwrap().to_owned();
    let mut editor = Daemon::start_with(&gw.state_dir, &[], &[("HOME", home.as_str())]).unwrap();
    editor.initialize().unwrap();
    let observed = editor.request("ctx/observe", json!({"transcript": path})).unwrap();
    let id = observed["sessionId"].as_str().unwrap().to_owned();
    assert!(observed["usage"].get("cache").is_none(), "no gateway figures yet: {observed}");

    turn(&rt, &gw, session, 1);
    let of = |p: &Value| p["sessionId"] == id.as_str();
    let warm = editor.wait_notification("ctx/usageChanged", |p| of(p) && p["usage"]["cache"]["warm"] == true).unwrap();
    let cache = &warm["usage"]["cache"];
    assert_eq!((cache["ttlSeconds"].as_u64(), cache["source"].as_str()), (Some(6), Some("gateway")), "{warm}");
    let expires_at = cache["expiresAt"].as_str().unwrap().to_owned();

    // Prepared while idle, still warm: the editor learns a summary is ready.
    let ready =
        editor.wait_notification("ctx/usageChanged", |p| of(p) && p["usage"]["cache"]["summaryReady"] == true).unwrap();
    assert_eq!(ready["usage"]["cache"]["warm"], true, "prepared before the cache went cold: {ready}");

    // Nobody types, nobody asks: at the expiry the daemon says it went cold.
    let requests = upstream.received().len();
    let cold = editor.wait_notification("ctx/usageChanged", |p| of(p) && p["usage"]["cache"]["warm"] == false).unwrap();
    let cache = &cold["usage"]["cache"];
    assert_eq!(cache["expiresAt"], expires_at.as_str(), "the expiry the warm figure named: {cold}");
    assert_eq!(cache["summaryReady"], true, "{cold}");
    assert_eq!(cache["recacheTokens"], 114_705, "{cold}");
    assert!(cache["recacheCostUsd"].as_f64().unwrap() > 0.0, "{cold}");
    assert_eq!(upstream.received().len(), requests, "no request woke it");
    gw.wait_log("prompt cache went cold", 1);
    editor.stop().unwrap();
}
