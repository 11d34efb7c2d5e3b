//! An observed transcript (`ctx/observe`) cannot take the shared daemon down or make it
//! compact without end: whatever another program appends is read with bounded memory,
//! a file observed any number of times has one follower and one idle clock, at most
//! one idle compaction runs at a time, the idle clock starts at the file's last write,
//! and every idle compaction is announced to every editor.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ctxd_e2e::{Daemon, assistant_record, claude_code_fixture, user_record};
use serde_json::{Value, json};

/// Peak resident memory the daemon may reach while a transcript it observes grows by a
/// gibibyte. The follower holds one 1 MiB chunk and at most 16 MiB of one line; the
/// rest is the daemon's own (a debug build idles at about 30 MB).
const PEAK_KB: u64 = 160 * 1024;

fn log_of(state: &Path) -> String {
    std::fs::read_to_string(state.with_extension("log")).unwrap_or_default()
}

/// Polls `check` every 50 ms until it holds; fails after `secs` (a guard against a hang,
/// not a measurement).
fn eventually(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !check() {
        assert!(Instant::now() < end, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A daemon whose client settings are `settings`.
fn daemon_with(state: &Path, settings: Value, env: &[(&str, &str)]) -> Daemon {
    let mut daemon = Daemon::start_with(state, &[], env).unwrap();
    daemon.request("initialize", json!({"capabilities": {}, "initializationOptions": {"settings": settings}})).unwrap();
    daemon.notify("initialized", json!({})).unwrap();
    daemon
}

/// Idle compaction on, after `seconds`, worth it from 1 % of the threshold.
fn idle_after(seconds: u64) -> Value {
    json!({"claudeIdleCompaction": true, "claudeIdleCompactAfterSeconds": seconds, "claudeIdleCompactPercent": 1})
}

/// The session the real Claude Code 2.1.332 wrote, up to the reply before its own
/// `/compact`, as transcript `name` of a project `<dir>/proj` (made real) under
/// `<dir>/home/.claude/projects/-proj`.
fn claude_transcript(dir: &Path, name: &str) -> PathBuf {
    let project = dir.join("proj");
    std::fs::create_dir_all(&project).unwrap();
    let folder = dir.join("home/.claude/projects/-proj");
    std::fs::create_dir_all(&folder).unwrap();
    let text = std::fs::read_to_string(claude_code_fixture("manual-compact.jsonl")).unwrap();
    let lines: String = text
        .lines()
        .take(57)
        .map(|line| {
            let mut record: Value = serde_json::from_str(line).unwrap();
            if record.get("cwd").is_some() {
                record["cwd"] = json!(project);
            }
            format!("{record}\n")
        })
        .collect();
    let path = folder.join(name);
    std::fs::write(&path, lines).unwrap();
    path
}

/// The file's length, by its metadata: reading it would hold it open, and an idle
/// compaction leaves alone a transcript another process has open when it looks.
fn length(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

fn boundaries(path: &Path) -> usize {
    std::fs::read_to_string(path).unwrap().lines().filter(|l| l.contains("\"compact_boundary\"")).count()
}

/// A transcript another program writes fast, observed: the writer appends `total`
/// bytes made by `piece`, then a response whose usage is 777,777 tokens. Meanwhile a
/// session of the daemon's own must keep being answered; the follower must reach the
/// response; the daemon's peak memory must stay under `PEAK_KB`.
fn observe_a_fast_writer(total: usize, piece: impl Fn(usize) -> Vec<u8> + Send + 'static) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let path = dir.path().join("claude.jsonl");
    std::fs::write(&path, format!("{}\n", user_record("u0", None, "start"))).unwrap();
    let mut daemon = Daemon::started(&state).unwrap();
    let observed = daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    let id = observed["sessionId"].as_str().unwrap().to_owned();
    daemon
        .request("ctx/openSession", json!({"cwd": "/tmp", "model": "claude-sonnet-4-5", "sessionId": "own"}))
        .unwrap();

    let target = path.clone();
    let writer = std::thread::spawn(move || {
        let mut file = std::fs::OpenOptions::new().append(true).open(&target).unwrap();
        let mut written = 0;
        let mut n = 0;
        while written < total {
            let bytes = piece(n);
            file.write_all(&bytes).unwrap();
            written += bytes.len();
            n += 1;
        }
        let done = assistant_record("a-end", None, "msg_end", 777_000, 777);
        file.write_all(format!("\n{done}\n").as_bytes()).unwrap();
    });
    // The daemon answers its own session all along.
    let mut answered = 0;
    let mut parent: Option<String> = None;
    while !writer.is_finished() {
        let uuid = format!("own-{answered}");
        let record = user_record(&uuid, parent.as_deref(), "still here?");
        daemon.request("ctx/append", json!({"sessionId": "own", "records": [record]})).unwrap();
        parent = Some(uuid);
        answered += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    writer.join().unwrap();
    let reached = daemon.wait_notification("ctx/usageChanged", |p| {
        p["sessionId"] == id.as_str() && p["usage"]["reportedTokens"] == 777_777
    });
    let (rss, peak) = ctxd_e2e::memory_kb(daemon.pid()).unwrap();
    println!("appended {total} bytes; {answered} appends answered meanwhile; daemon RSS {rss} kB, peak {peak} kB");
    assert!(peak < PEAK_KB, "the daemon's peak memory {peak} kB is over {PEAK_KB} kB");
    reached.unwrap();
    assert!(answered > 0);
    let usage = daemon.request("ctx/usage", json!({"sessionId": "own"})).unwrap();
    assert!(usage["usage"]["tokens"].as_u64().unwrap() > 0, "{usage}");
}

#[test]
fn an_observed_transcript_growing_by_one_endless_line_costs_bounded_memory() {
    // One line that never ends (until the response after it), a gibibyte of it, a
    // mebibyte at a time.
    observe_a_fast_writer(1 << 30, |_| vec![b'x'; 1 << 20]);
}

#[test]
fn an_observed_transcript_growing_by_64_kib_lines_costs_bounded_memory() {
    // Whole records of 64 KiB each, 256 MiB of them (each is parsed: a debug build
    // reads them at about 15 MB/s), as fast as they can be written.
    let record = user_record("big", None, &"y".repeat(64 * 1024 - 300));
    let mut line = record.to_string().into_bytes();
    line.push(b'\n');
    observe_a_fast_writer(256 << 20, move |_| line.repeat(16));
}

#[test]
fn a_file_observed_a_thousand_times_has_one_follower_and_is_compacted_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = claude_transcript(dir.path(), "s.jsonl");
    let original = length(&path);
    let state = dir.path().join("state");
    let mut daemon = daemon_with(&state, idle_after(1), &[]);
    let ids: Vec<i64> =
        (0..1_000).map(|_| daemon.send_request("ctx/observe", json!({"transcript": path})).unwrap()).collect();
    let answers: Vec<Value> = ids.into_iter().map(|id| daemon.response(id).unwrap()).collect();
    let first = answers[0]["result"]["sessionId"].clone();
    assert!(first.is_string(), "{}", answers[0]);
    assert!(answers.iter().all(|a| a["result"]["sessionId"] == first), "one id for one path");
    let threads = std::fs::read_dir(format!("/proc/{}/task", daemon.pid())).unwrap().count();
    println!("threads after 1,000 observes: {threads}");

    // The compaction (the file holds a boundary), then three idle times more, in which
    // no other follower may try to compact it again.
    eventually(60, "the idle session was not compacted", || length(&path) > original);
    std::thread::sleep(Duration::from_secs(3));
    let log = log_of(&state);
    assert_eq!(log.matches("observed Claude Code session idle; compacting it").count(), 1, "one idle compaction tried");
    assert_eq!(log.matches("following an observed transcript").count(), 1, "one follower");
    assert_eq!(boundaries(&path), 1, "compacted once");
    // Announced once, and followed back by the one follower (its figure drops).
    let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == first).unwrap();
    let post = compacted["postTokens"].as_u64().unwrap();
    daemon
        .wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == first && p["usage"]["tokens"].as_u64().is_some_and(|t| t <= post + 1_000)
        })
        .unwrap();
    assert!(daemon.drain_notifications("ctx/compacted").is_empty(), "announced once");
}

#[test]
fn the_same_file_by_another_path_is_the_same_follower_under_that_paths_id() {
    let dir = tempfile::tempdir().unwrap();
    let path = claude_transcript(dir.path(), "s.jsonl");
    let state = dir.path().join("state");
    let mut daemon = daemon_with(&state, json!({}), &[]);
    let spelled = path.parent().unwrap().join(".").join("s.jsonl");
    let a = daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    let b = daemon.request("ctx/observe", json!({"transcript": spelled})).unwrap();
    assert_ne!(a["sessionId"], b["sessionId"], "each path keeps the id its client computes");
    assert_eq!(a["usage"], b["usage"]);
    // One follower, publishing under both ids.
    let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    writeln!(file, "{}", assistant_record("a-more", None, "msg_more", 123_000, 456)).unwrap();
    for id in [&a["sessionId"], &b["sessionId"]] {
        daemon
            .wait_notification("ctx/usageChanged", |p| &p["sessionId"] == id && p["usage"]["reportedTokens"] == 123_456)
            .unwrap();
    }
    assert_eq!(log_of(&state).matches("following an observed transcript").count(), 1, "one follower");
    // Eight paths to one file at most: each is an id every figure is sent under.
    let folder = path.parent().unwrap();
    let spelled = |dots: usize| folder.join("./".repeat(dots)).join("s.jsonl");
    for dots in 2..=7 {
        daemon.request("ctx/observe", json!({"transcript": spelled(dots)})).unwrap();
    }
    let error = daemon.request_error("ctx/observe", json!({"transcript": spelled(8)})).unwrap();
    assert!(error["message"].as_str().unwrap().contains("observed by 8 other paths"), "{error}");
    daemon.request("ctx/observe", json!({"transcript": spelled(7)})).unwrap();
}

#[test]
fn the_idle_clock_starts_at_the_last_write_and_each_idle_compaction_is_announced_to_every_editor() {
    let dir = tempfile::tempdir().unwrap();
    let stale = claude_transcript(dir.path(), "stale.jsonl");
    let fresh = claude_transcript(dir.path(), "fresh.jsonl");
    // Last written an hour ago: idle for longer than the idle time (five minutes).
    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3_600);
    std::fs::File::options().write(true).open(&stale).unwrap().set_modified(an_hour_ago).unwrap();
    let state = dir.path().join("state");
    let mut first = daemon_with(&state, idle_after(300), &[]);
    // Another editor sharing the daemon.
    let mut second = Daemon::started(&state).unwrap();
    let fresh_id = first.request("ctx/observe", json!({"transcript": fresh})).unwrap()["sessionId"].clone();
    let stale_id = first.request("ctx/observe", json!({"transcript": stale})).unwrap()["sessionId"].clone();
    let (before, stale_length) = (std::fs::read(&fresh).unwrap(), length(&stale));

    // Compacted at once (an idle time already passed), not five minutes after observing.
    eventually(60, "the session idle for an hour was not compacted", || length(&stale) > stale_length);
    let announced = first.wait_notification("ctx/compacted", |p| p["sessionId"] == stale_id).unwrap();
    assert_eq!(announced["trigger"], "idle", "{announced}");
    assert!(announced["postTokens"].as_u64().unwrap() < announced["preTokens"].as_u64().unwrap(), "{announced}");
    assert_eq!(boundaries(&stale), 1);
    let to_other = second.wait_notification("ctx/compacted", |p| p["sessionId"] == stale_id).unwrap();
    assert_eq!(to_other, announced);
    // The one written just now waits its idle time.
    assert_eq!(std::fs::read(&fresh).unwrap(), before);
    assert!(first.drain_notifications("ctx/compacted").iter().all(|p| p["sessionId"] != fresh_id));
}

/// Concurrent summary requests a [`held_provider`] has seen at most.
static MOST_AT_ONCE: AtomicUsize = AtomicUsize::new(0);

/// A provider stand-in that holds each summary request 700 ms before it answers, serving
/// connections in parallel; returns its port and the number of requests answered.
fn held_provider() -> (u16, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (answered, at_once) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let counted = answered.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let (answered, at_once) = (counted.clone(), at_once.clone());
            std::thread::spawn(move || {
                let _ = ctxd_e2e::read_http_request(&mut BufReader::new(stream.try_clone().unwrap()));
                let now = at_once.fetch_add(1, Ordering::SeqCst) + 1;
                MOST_AT_ONCE.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(700));
                at_once.fetch_sub(1, Ordering::SeqCst);
                let (_, body) =
                    ctxd_e2e::stub::sse_text("<summary>1. Primary Request and Intent:\n   HELD.\n</summary>");
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                answered.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (port, answered)
}

#[test]
fn at_most_one_idle_compaction_runs_at_a_time() {
    const FILES: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = (0..FILES).map(|i| claude_transcript(dir.path(), &format!("s{i}.jsonl"))).collect();
    let original = length(&paths[0]);
    let (port, answered) = held_provider();
    let project = dir.path().join("proj");
    std::fs::create_dir_all(project.join(".ctxd")).unwrap();
    let settings =
        json!({"provider": "anthropic", "baseUrl": format!("http://127.0.0.1:{port}"), "apiKeyEnv": "HELD_KEY"});
    std::fs::write(project.join(".ctxd/settings.json"), settings.to_string()).unwrap();
    let state = dir.path().join("state");
    ctxd_e2e::trust_folder(&state, &project).unwrap();
    let mut daemon = daemon_with(&state, idle_after(1), &[("HELD_KEY", "sk-held")]);
    for path in &paths {
        daemon.request("ctx/observe", json!({"transcript": path})).unwrap();
    }
    eventually(120, "not every idle session was compacted", || paths.iter().all(|p| length(p) > original));
    assert_eq!(MOST_AT_ONCE.load(Ordering::SeqCst), 1, "idle compactions ran side by side");
    // One summary each at least (a compaction refused after its summary, because a
    // reader had the file open, is tried again).
    assert!(answered.load(Ordering::SeqCst) >= FILES);
    assert!(paths.iter().all(|p| boundaries(p) == 1));
}
