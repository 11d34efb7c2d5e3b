//! History search end to end: `ctx/searchHistory` and `ctx/readHistory` on the real
//! daemon over pipes, and `ctxd mcp` spoken to as an MCP client would, over a real
//! Claude Code 2.1.332 transcript with a compaction in it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{Receiver, channel};

use ctxd_e2e::{Daemon, TIMEOUT, claude_code_fixture, ctxd_command, memory_kb, user_record};
use serde_json::{Value, json};

/// The session of the fixture (`manual-compact.jsonl`: reads, then `/compact`, then more).
const SESSION: &str = "b7d55388-c9ad-4169-a8d1-459fc6bdb46f";

/// Claude Code's folder name for a working directory.
fn folder_of(dir: &Path) -> String {
    dir.to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect()
}

/// A state directory whose HOME (`<state>.home`, as the daemon's tests set it) has the
/// fixture as a Claude Code session of `project`.
fn world(root: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let state = root.join("state");
    let project = root.join("proj");
    std::fs::create_dir_all(&project).unwrap();
    let folder = state.with_extension("home").join(".claude/projects").join(folder_of(&project));
    std::fs::create_dir_all(&folder).unwrap();
    let transcript = folder.join(format!("{SESSION}.jsonl"));
    std::fs::copy(claude_code_fixture("manual-compact.jsonl"), &transcript).unwrap();
    (state, project, transcript)
}

#[test]
fn hosts_search_before_the_compaction_and_read_the_record_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (state, project, _) = world(dir.path());
    let mut daemon = Daemon::start_with(&state, &[], &[("RECALL_SECRET_VALUE", "zq-secret-314")]).unwrap();
    daemon.initialize().unwrap();
    // MARKER-BIG stands only in a Read result before the boundary.
    let found = daemon
        .request(
            "ctx/searchHistory",
            json!({"query": "MARKER-BIG", "sessionId": SESSION, "beforeCompactionOnly": true}),
        )
        .unwrap();
    let hits = found["hits"].as_array().unwrap();
    assert_eq!(hits.len(), 1, "{found}");
    let hit = &hits[0];
    assert_eq!((hit["role"].as_str(), hit["beforeCompaction"].as_bool()), (Some("tool_result"), Some(true)), "{hit}");
    assert_eq!(hit["sessionId"], SESSION);
    let snippet = hit["snippet"].as_str().unwrap();
    assert!(snippet.contains("MARKER-BIG") && snippet.chars().count() <= 302, "{snippet}");
    // The whole record: far more than the snippet.
    let read = daemon
        .request("ctx/readHistory", json!({"sessionId": SESSION, "uuid": hit["uuid"], "before": 1, "after": 1}))
        .unwrap();
    let records = read["records"].as_array().unwrap();
    let target: Vec<&Value> = records.iter().filter(|r| r["target"] == true).collect();
    let shown = &read.to_string()[..read.to_string().len().min(600)];
    assert_eq!(target.len(), 1, "{shown}");
    let text = target[0]["text"].as_str().unwrap();
    assert!(text.contains("def f0(x)") && text.len() > 2_000, "{}", &text[..text.len().min(400)]);
    assert_eq!(records.len(), 3, "one neighbour each side: {shown}");
    assert_eq!(records[0]["role"], "assistant", "the Read call before the result: {shown}");
    assert!(records[0]["text"].as_str().unwrap().contains("[tool_use Read]"), "{shown}");
    let note = read["truncated"].as_str().unwrap();
    assert!(note.contains("of 45492 characters shown"), "the cut is said: {note}");
    let total: usize = records.iter().map(|r| r["text"].as_str().unwrap().chars().count()).sum();
    assert!(total <= 20_000, "{total}");

    // A file read before the compaction and attached again after it: both, flagged.
    let found = daemon
        .request(
            "ctx/searchHistory",
            json!({"query": "MARKER-APP-PY", "sessionId": "all", "projectDir": project.display().to_string()}),
        )
        .unwrap();
    let flags: Vec<(String, bool)> = found["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["role"].as_str().unwrap().to_owned(), h["beforeCompaction"].as_bool().unwrap()))
        .collect();
    assert!(flags.contains(&("tool_result".into(), true)), "{found}");
    assert!(flags.contains(&("attachment".into(), false)), "{found}");

    // The store's own sessions are searched too.
    let opened = daemon
        .request("ctx/openSession", json!({"cwd": project.display().to_string(), "model": "claude-opus-5-5"}))
        .unwrap();
    let id = opened["sessionId"].as_str().unwrap().to_owned();
    daemon
        .request(
            "ctx/append",
            json!({"sessionId": id, "records": [user_record("s-1", None, "the ctxd session's own phrase")]}),
        )
        .unwrap();
    let found = daemon.request("ctx/searchHistory", json!({"query": "own phrase", "sessionId": id})).unwrap();
    assert_eq!(found["hits"][0]["uuid"], "s-1", "{found}");

    // Bad input: plain words for a broken query, clear errors for the rest, and the
    // daemon serves on.
    let found =
        daemon.request("ctx/searchHistory", json!({"query": "MARKER-BIG AND (", "sessionId": SESSION})).unwrap();
    assert_eq!(found["hits"].as_array().unwrap().len(), 1, "{found}");
    assert!(found["notes"].to_string().contains("plain text"), "{found}");
    for (params, why) in [
        (json!({"query": "x", "sessionId": "../../etc/passwd"}), "no session"),
        (json!({"query": "x", "sessionId": "all", "projectDir": "relative/dir"}), "absolute"),
        (json!({"query": "x"}), "name a session"),
        (json!({"query": "   ", "sessionId": SESSION}), "empty"),
    ] {
        let error = daemon.request_error("ctx/searchHistory", params.clone()).unwrap();
        assert_eq!(error["code"], -32602, "{params}: {error}");
        assert!(error["message"].as_str().unwrap().contains(why), "{params}: {error}");
    }
    let error = daemon.request_error("ctx/readHistory", json!({"sessionId": SESSION, "uuid": "nope"})).unwrap();
    assert!(error["message"].as_str().unwrap().contains("no record"), "{error}");
    // What ctxd never wrote into a transcript is never found (search reads transcripts).
    let found = daemon.request("ctx/searchHistory", json!({"query": "zq-secret-314", "sessionId": SESSION})).unwrap();
    assert!(found["hits"].as_array().unwrap().is_empty() && !found.to_string().contains("zq-secret-314"));
    assert_eq!(daemon.request("ctx/usage", json!({"sessionId": id})).unwrap()["sessionId"], id.as_str());
    daemon.stop().unwrap();
}

/// `ctxd mcp` as an MCP client (Claude Code) drives it: newline-delimited JSON-RPC.
struct Mcp {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
    next: i64,
}

impl Mcp {
    fn start(state: &Path, cwd: &Path) -> Mcp {
        let mut child = ctxd_command()
            .arg("--state-dir")
            .arg(state)
            .arg("mcp")
            .current_dir(cwd)
            .env("HOME", state.with_extension("home"))
            .env_remove("CLAUDE_CONFIG_DIR")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let stdin = child.stdin.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value = serde_json::from_str(&line).unwrap_or_else(|_| json!({"unparseable": line}));
                if tx.send(value).is_err() {
                    break;
                }
            }
        });
        let mut mcp = Mcp { child, stdin, lines: rx, next: 1 };
        let init = mcp.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}),
        );
        assert_eq!(init["result"]["serverInfo"]["name"], "ctxd", "{init}");
        mcp.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        mcp
    }

    fn send(&mut self, message: Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let message = self.lines.recv_timeout(TIMEOUT).expect("an answer from ctxd mcp");
            if message["id"] == id {
                return message;
            }
        }
    }

    /// A tool call's text and whether it is an error.
    fn call(&mut self, tool: &str, arguments: Value) -> (String, bool) {
        let answer = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        let result = &answer["result"];
        let text = result["content"][0]["text"].as_str().unwrap_or_else(|| panic!("{answer}")).to_owned();
        (text, result["isError"] == true)
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_agent_finds_a_phrase_from_before_the_compaction_and_reads_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let (state, project, _) = world(dir.path());
    let mut mcp = Mcp::start(&state, &project);
    let tools = mcp.request("tools/list", json!({}));
    let names: Vec<&str> =
        tools["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["search_history", "read_history"], "{tools}");
    let description = tools["result"]["tools"][0]["description"].as_str().unwrap();
    assert!(description.contains("after a compaction"), "{description}");

    // The default session: the newest Claude Code session of the server's directory.
    let (text, error) =
        mcp.call("search_history", json!({"query": "\"STUB reply #3\"", "before_compaction_only": true}));
    assert!(!error, "{text}");
    let found: Value = serde_json::from_str(&text).unwrap();
    let hit = &found["hits"][0];
    assert_eq!((hit["session"].as_str(), hit["role"].as_str()), (Some(SESSION), Some("assistant")), "{text}");
    assert_eq!(hit["before_compaction"], true);
    let (text, error) = mcp.call("read_history", json!({"session": SESSION, "uuid": hit["uuid"], "after": 0}));
    assert!(!error, "{text}");
    assert!(text.contains("STUB reply #3 (messages=6). Done.") && text.contains("[the record asked for]"), "{text}");
    assert!(text.contains("[before compaction]"), "{text}");

    // Bad input is an error the model reads, and the server goes on.
    let (text, error) = mcp.call("search_history", json!({"limit": 3}));
    assert!(error && text.contains("invalid arguments"), "{text}");
    let (text, error) = mcp.call("search_history", json!({"query": "x", "session": "no-such-session"}));
    assert!(error && text.contains("no session"), "{text}");
    let unknown = mcp.request("tools/call", json!({"name": "rm_rf", "arguments": {}}));
    assert!(unknown["error"].is_object(), "{unknown}");
    let (text, error) = mcp.call("search_history", json!({"query": "MARKER-README", "session": "all"}));
    assert!(!error && text.contains("MARKER-README"), "{text}");
}

#[test]
fn a_transcript_with_a_huge_line_costs_the_server_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (state, project, transcript) = world(dir.path());
    // 256 MiB in one line, between two ordinary records.
    let mut file = std::fs::OpenOptions::new().append(true).open(&transcript).unwrap();
    let chunk = "huge ".repeat(1 << 20);
    write!(file, r#"{{"type":"user","uuid":"giant","message":{{"content":""#).unwrap();
    for _ in 0..(256 / 5) {
        file.write_all(chunk.as_bytes()).unwrap();
    }
    writeln!(file, r#""}}}}"#).unwrap();
    writeln!(file, "{}", user_record("after-giant", None, "the line after the huge one")).unwrap();
    drop(file);
    let mut mcp = Mcp::start(&state, &project);
    let (text, error) = mcp.call("search_history", json!({"query": "huge"}));
    assert!(!error, "{text}");
    let found: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(found["hits"][0]["uuid"], "after-giant", "{text}");
    let (_, peak_kb) = memory_kb(mcp.child.id()).unwrap();
    // About 60 MB measured: the 16 MiB line cap, the index writer, the runtime.
    assert!(peak_kb < 128 * 1024, "peak RSS {peak_kb} kB for a 256 MiB line");
    // Reading around it skips it too.
    let (text, error) = mcp.call("read_history", json!({"uuid": "after-giant", "before": 5}));
    assert!(!error && !text.contains("huge huge"), "{}", &text[..text.len().min(500)]);
}
