//! `ctxd statusline` with what a live session adds: the real program's input right after
//! `/compact` and before the first turn, its `prompt_cache`, and ctxd's gateway asked
//! over real HTTP for what the input lacks (a local server standing in for it, speaking
//! `GET /ctxd/sessions` as the gateway does). Bad input is said to be bad.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc;

use ctxd_e2e::claude_code_fixture;
use serde_json::{Value, json};

/// A home of its own: no gateway setting of the developer's, no settings at all unless
/// the test writes them.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        Home { dir: tempfile::tempdir().unwrap() }
    }

    /// Points `gateway.listen` at `addr`.
    fn gateway_at(&self, addr: SocketAddr) {
        let config = self.dir.path().join(".config/ctxd");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(config.join("settings.json"), json!({"gateway": {"listen": addr.to_string()}}).to_string())
            .unwrap();
    }

    fn statusline(&self, stdin: &str) -> String {
        let config = self.dir.path().join(".config");
        ctxd_e2e::statusline_output(
            &[("HOME", self.dir.path().as_os_str()), ("XDG_CONFIG_HOME", config.as_os_str())],
            stdin,
        )
    }
}

/// Line `n` of the real program's status-line inputs: 0 a new session, 1 and 2 after
/// turns, 3 right after `/compact`, 4 the turn after.
fn captured(n: usize) -> Value {
    let text = std::fs::read_to_string(claude_code_fixture("statusline-inputs.jsonl")).unwrap();
    serde_json::from_str(text.lines().nth(n).unwrap()).unwrap()
}

fn without(mut input: Value, keys: &[&str]) -> Value {
    for key in keys {
        input.as_object_mut().unwrap().remove(*key);
    }
    input
}

/// What the stand-in gateway does with each connection.
#[derive(Clone, Copy)]
enum Gateway {
    /// Answers `GET /ctxd/sessions` with this body.
    Answers(&'static str),
    /// Reads the request and never answers (until the test ends).
    Hangs,
}

/// A gateway stand-in on an ephemeral loopback port. Each request line it reads is sent
/// on the returned channel.
fn gateway(behaviour: Gateway, sessions: Value) -> (SocketAddr, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let (head, _) = ctxd_e2e::read_http_request(&mut BufReader::new(stream.try_clone().unwrap()));
            let request_line = head.lines().next().unwrap_or_default().to_owned();
            let _ = tx.send(request_line.trim_end().to_owned());
            match behaviour {
                Gateway::Hangs => held.push(stream),
                Gateway::Answers(kind) => {
                    let body = match kind {
                        "sessions" => sessions.to_string(),
                        other => other.to_owned(),
                    };
                    let mut stream = stream;
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
            }
        }
    });
    (addr, rx)
}

/// The gateway's figures for a session whose last request wrote 599,999 tokens to the
/// cache and read 12,000, answered six minutes before now (its 5-minute cache is cold).
fn cold_session(session_id: &str) -> Value {
    let answered = std::time::SystemTime::now() - std::time::Duration::from_secs(360);
    let ms = answered.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    json!({"sessions": [
        {"sessionId": "someone-else", "model": "claude-opus-5-5", "inputTokens": 5, "cacheReadInputTokens": 0,
         "cacheCreationInputTokens": 9, "outputTokens": 1, "sentAt": rfc3339(ms), "answeredAt": rfc3339(ms),
         "cacheTtlSeconds": 300, "requests": 1},
        {"sessionId": session_id, "model": "claude-opus-5-5", "inputTokens": 1, "cacheReadInputTokens": 12_000,
         "cacheCreationInputTokens": 599_999, "outputTokens": 8, "sentAt": rfc3339(ms - 2_000), "answeredAt": rfc3339(ms),
         "cacheTtlSeconds": 300, "requests": 7},
    ]})
}

fn rfc3339(ms: i64) -> String {
    ctxd_core::view::format_rfc3339_ms(ms)
}

#[test]
fn right_after_compact_the_line_shows_the_boundary_not_the_programs_zeros() {
    // Claude Code 2.1.332 sends `current_usage` as zeros right after `/compact`; its
    // transcript's boundary says what was kept. The real transcript, cut right after
    // its `/compact`, and the real program's input of that moment.
    let text = std::fs::read_to_string(claude_code_fixture("manual-compact.jsonl")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.jsonl");
    let lines: Vec<&str> = text.lines().take(79).collect();
    std::fs::write(&cut, lines.join("\n") + "\n").unwrap();
    let mut input = without(captured(3), &["prompt_cache"]);
    assert_eq!(input["context_window"]["current_usage"]["cache_read_input_tokens"], 0);
    input["transcript_path"] = json!(cut);
    let line = Home::new().statusline(&input.to_string());
    assert_eq!(line, "Opus 5.5 · ctx 3.0k / 1.00M (0.3%) · 964.0k to compact · ok · just compacted");
}

#[test]
fn a_new_session_shows_the_baseline_of_the_projects_last_session() {
    let project = tempfile::tempdir().unwrap();
    std::fs::copy(claude_code_fixture("manual-compact.jsonl"), project.path().join("earlier.jsonl")).unwrap();
    let mut input = captured(0);
    input["transcript_path"] = json!(project.path().join("new.jsonl"));
    let line = Home::new().statusline(&input.to_string());
    assert_eq!(line, "Opus 5.5 · ctx 12.9k / 1.00M (1.3%) · 954.1k to compact · ok · new session");
}

#[test]
fn the_percent_is_of_the_window_printed() {
    // 600,000 tokens reported on the 1M model: 60.0 %, as the program counts (a share
    // of the effective window, 980k, would say 61.2 beside "/ 1.00M").
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    let assistant = json!({"type": "assistant", "message": {"id": "m1", "model": "claude-opus-5-5", "content": [],
        "usage": {"input_tokens": 599_990, "output_tokens": 10}}});
    std::fs::write(&path, format!("{assistant}\n")).unwrap();
    let input = json!({"transcript_path": path, "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"}});
    assert_eq!(
        Home::new().statusline(&input.to_string()),
        "Opus 5.5 · ctx 600.0k / 1.00M (60.0%) · 367.0k to compact · ok"
    );
}

#[test]
fn empty_or_garbage_input_says_it_could_not_be_read() {
    let home = Home::new();
    for (stdin, says) in [
        ("", "ctx: no status line input"),
        ("not json at all", "ctx: cannot read the status line input"),
        ("{\"transcript_path\": \"/x.jsonl\"", "ctx: cannot read the status line input"),
        ("\"a string\"", "ctx: cannot read the status line input"),
    ] {
        let line = home.statusline(stdin);
        assert!(line.starts_with(says), "{stdin:?}: {line}");
        assert!(!line.contains("ctx 0"), "{stdin:?}: {line}");
    }
}

#[test]
fn the_programs_own_cache_state() {
    // The program's `prompt_cache` after turn two; its 5-minute lifetime ended long
    // before this test ran, so the cache is cold now: the next turn writes the whole
    // prefix again, priced at claude-opus-5-5's $5 per million.
    let input = without(captured(2), &["transcript_path"]);
    let line = Home::new().statusline(&input.to_string());
    assert_eq!(
        line,
        "Opus 5.5 · ctx 14.3k / 1.00M (1.4%) · 952.7k to compact · ok · cache cold: next turn re-writes 14.3k tokens (~$0.07)"
    );
    // Warm: expiring in ten minutes (the program re-runs the line when it expires).
    let mut warm = input.clone();
    let soon = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 250;
    warm["prompt_cache"]["expires_at"] = json!(soon);
    let line = Home::new().statusline(&warm.to_string());
    assert!(line.ends_with(" · cache warm (cold in 4m)"), "{line}");
}

#[test]
fn the_gateway_fills_in_the_cache_when_the_program_gives_none() {
    let input = without(captured(1), &["prompt_cache", "transcript_path"]);
    let sid = input["session_id"].as_str().unwrap().to_owned();
    let (addr, asked) = gateway(Gateway::Answers("sessions"), cold_session(&sid));
    let home = Home::new();
    home.gateway_at(addr);
    let line = home.statusline(&input.to_string());
    assert_eq!(asked.try_recv().unwrap(), "GET /ctxd/sessions HTTP/1.0");
    assert_eq!(
        line,
        "Opus 5.5 · ctx 14.2k / 1.00M (1.4%) · 952.8k to compact · ok · cache cold: next turn re-writes 612.0k tokens (~$3.06)"
    );
    // With the program's own `prompt_cache` warm, the gateway is not asked at all.
    let mut with_program = without(captured(2), &["transcript_path"]);
    let soon = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 250;
    with_program["prompt_cache"]["expires_at"] = json!(soon);
    let line = home.statusline(&with_program.to_string());
    assert!(line.ends_with("cache warm (cold in 4m)"), "{line}");
    assert!(asked.try_recv().is_err(), "the gateway was asked for what the input had");
    // Cold, it is asked whether a summary is ready (this one says nothing of one): the
    // program's figures stand.
    let cold = without(captured(2), &["transcript_path"]);
    let line = home.statusline(&cold.to_string());
    assert_eq!(asked.try_recv().unwrap(), "GET /ctxd/sessions HTTP/1.0");
    assert!(line.ends_with("cache cold: next turn re-writes 14.3k tokens (~$0.07)"), "{line}");
}

#[test]
fn a_gateway_that_hangs_or_answers_nonsense_leaves_the_line_as_it_was() {
    let input = without(captured(1), &["prompt_cache", "transcript_path"]);
    let plain = "Opus 5.5 · ctx 14.2k / 1.00M (1.4%) · 952.8k to compact · ok";
    // Nothing listening.
    let home = Home::new();
    let free = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    home.gateway_at(free);
    assert_eq!(home.statusline(&input.to_string()), plain);
    // A listener that takes the request and never answers: asked, given up on.
    let (addr, asked) = gateway(Gateway::Hangs, Value::Null);
    home.gateway_at(addr);
    assert_eq!(home.statusline(&input.to_string()), plain);
    assert_eq!(asked.try_recv().unwrap(), "GET /ctxd/sessions HTTP/1.0");
    // Answers that are not the gateway's.
    for nonsense in ["not json", "{\"sessions\": 7}", "{}"] {
        let (addr, asked) = gateway(Gateway::Answers(nonsense), Value::Null);
        home.gateway_at(addr);
        assert_eq!(home.statusline(&input.to_string()), plain, "{nonsense}");
        assert!(asked.try_recv().is_ok());
    }
}
