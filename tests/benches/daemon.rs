//! Whole-daemon benchmarks over real pipes: durable append throughput, resume, idle
//! memory and start-up. Each figure is printed next to a baseline measured in the same
//! run, as medians over several repetitions, because these machines are shared and
//! noisy.
//!
//! ```text
//! cargo build --release -p ctxd && cargo bench -p ctxd-e2e --bench daemon
//! cargo bench -p ctxd-e2e --bench daemon -- --quick     # fewer repetitions
//! cargo bench -p ctxd-e2e --bench daemon -- usage       # one part (startup, appends, resume, usage)
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctxd_e2e::{frame, read_frame};
use serde_json::{Value, json};

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let reps = if quick { 3 } else { 7 };
    let bin = ctxd_e2e::ctxd_bin();
    anyhow::ensure!(bin.exists(), "{} missing: cargo build --release -p ctxd", bin.display());
    println!(
        "ctxd benchmarks · binary {} · {} cores · medians of {reps} runs",
        bin.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    // `-- usage` (or `startup`, `appends`, `resume`) runs one part only.
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wanted = |part: &str| only.is_empty() || only.iter().any(|o| o == part);
    if wanted("startup") {
        startup_and_idle_memory(reps)?;
    }
    if wanted("appends") {
        append_throughput(reps, quick)?;
    }
    if wanted("resume") {
        resume(reps, quick)?;
    }
    if wanted("usage") {
        usage_after_append(quick)?;
    }
    Ok(())
}

/// A connection to a daemon, shared by several client threads through [`Handle`]s.
struct Conn {
    child: Child,
    handle: Handle,
}

impl Conn {
    fn start(state: &Path) -> anyhow::Result<Conn> {
        let mut child = ctxd_e2e::ctxd_command()
            .arg("--state-dir")
            .arg(state)
            .arg("--log-file")
            .arg(state.with_extension("log"))
            .arg("serve")
            // These benchmarks measure storage and transport; 1 KB filler records past
            // the window would otherwise start automatic compactions.
            .env("DISABLE_AUTO_COMPACT", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let stdin = Arc::new(Mutex::new(child.stdin.take().ok_or_else(|| anyhow::anyhow!("no stdin"))?));
        let waiters: Arc<Mutex<HashMap<i64, Sender<Value>>>> = Arc::default();
        let routing = waiters.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            while let Ok(Some(body)) = read_frame(&mut reader) {
                let Ok(message) = serde_json::from_slice::<Value>(&body) else { continue };
                if let Some(id) = message["id"].as_i64()
                    && let Some(tx) = routing.lock().unwrap().remove(&id)
                {
                    let _ = tx.send(message);
                }
            }
        });
        Ok(Conn { child, handle: Handle { stdin, waiters, next_id: Arc::new(Mutex::new(1)) } })
    }

    fn request(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.handle.request(method, params)
    }

    fn clone_handle(&self) -> Handle {
        self.handle.clone()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One thread's way to send requests on a shared connection.
#[derive(Clone)]
struct Handle {
    stdin: Arc<Mutex<ChildStdin>>,
    waiters: Arc<Mutex<HashMap<i64, Sender<Value>>>>,
    next_id: Arc<Mutex<i64>>,
}

impl Handle {
    /// Sends a request; the receiver gets its response.
    fn send(&self, method: &str, params: Value) -> anyhow::Result<std::sync::mpsc::Receiver<Value>> {
        let id = {
            let mut n = self.next_id.lock().unwrap();
            *n += 1;
            *n
        };
        let (tx, rx) = channel();
        self.waiters.lock().unwrap().insert(id, tx);
        let body = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        let mut stdin = self.stdin.lock().unwrap();
        stdin.write_all(&frame(&body))?;
        stdin.flush()?;
        Ok(rx)
    }

    fn request(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        let rx = self.send(method, params)?;
        let response = rx.recv_timeout(Duration::from_secs(120))?;
        anyhow::ensure!(response.get("error").is_none(), "{method}: {}", response["error"]);
        Ok(response["result"].clone())
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

fn temp_state() -> anyhow::Result<(tempfile::TempDir, PathBuf)> {
    let dir = tempfile::Builder::new().prefix("ctxd-bench-").tempdir_in(std::env::temp_dir())?;
    let state = dir.path().join("state");
    Ok((dir, state))
}

fn initialize(conn: &Conn) -> anyhow::Result<()> {
    conn.request("initialize", json!({"capabilities": {}}))?;
    Ok(())
}

/// A user record of about `size` bytes.
fn record(i: usize, size: usize) -> Value {
    let text = "lorem ipsum dolor sit amet ".repeat(size / 27 + 1);
    json!({"parentUuid": null, "isSidechain": false, "type": "user", "uuid": format!("rec-{i:08}"),
           "timestamp": "2026-11-29T10:00:00.000Z", "message": {"role": "user", "content": &text[..size.saturating_sub(160)]}})
}

fn startup_and_idle_memory(reps: usize) -> anyhow::Result<()> {
    let mut init_ms = Vec::new();
    let mut rss_kb = Vec::new();
    for _ in 0..reps {
        let (_dir, state) = temp_state()?;
        let started = Instant::now();
        let conn = Conn::start(&state)?;
        initialize(&conn)?;
        init_ms.push(started.elapsed().as_secs_f64() * 1e3);
        conn.request("ctx/openSession", json!({"cwd": "/tmp", "model": "claude-sonnet-4-5", "sessionId": "idle"}))?;
        std::thread::sleep(Duration::from_millis(1500));
        let status = std::fs::read_to_string(format!("/proc/{}/status", conn.child.id()))?;
        let rss = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .unwrap_or(0.0);
        rss_kb.push(rss);
    }
    println!(
        "start-up: spawn → initialize answered: median {:.1} ms (max {:.1})",
        median(init_ms.clone()),
        init_ms.iter().cloned().fold(0.0, f64::max)
    );
    println!("idle daemon with one open session: median RSS {:.1} MB", median(rss_kb) / 1024.0);
    Ok(())
}

/// Sends `count` appends from one client thread with up to `window` unanswered at a time.
fn client_appends(handle: &Handle, session: &str, base: usize, count: usize, window: usize) -> anyhow::Result<()> {
    let mut pending = std::collections::VecDeque::new();
    for i in 0..count {
        if pending.len() == window {
            let rx: std::sync::mpsc::Receiver<Value> =
                pending.pop_front().ok_or_else(|| anyhow::anyhow!("empty window"))?;
            let response = rx.recv_timeout(Duration::from_secs(120))?;
            anyhow::ensure!(response.get("error").is_none(), "append: {}", response["error"]);
        }
        pending
            .push_back(handle.send("ctx/append", json!({"sessionId": session, "records": [record(base + i, 1024)]}))?);
    }
    for rx in pending {
        let response = rx.recv_timeout(Duration::from_secs(120))?;
        anyhow::ensure!(response.get("error").is_none(), "append: {}", response["error"]);
    }
    Ok(())
}

fn append_throughput(reps: usize, quick: bool) -> anyhow::Result<()> {
    let per_client = if quick { 500 } else { 2_000 };
    let clients = 8;
    // (label, one session per client?, requests in flight per client)
    let modes: [(&str, bool, usize); 4] = [
        ("one shared session, each client waits for every ack", false, 1),
        ("one session per client, each client waits for every ack", true, 1),
        ("one shared session, up to 32 in flight per client", false, 32),
        ("one session per client, up to 32 in flight per client", true, 32),
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut sync_baseline = Vec::new();
    for _ in 0..reps {
        for (m, (_, separate, window)) in modes.iter().enumerate() {
            let (separate, window) = (*separate, *window);
            let (_dir, state) = temp_state()?;
            let conn = Conn::start(&state)?;
            initialize(&conn)?;
            for c in 0..clients {
                let id = if separate { format!("s{c}") } else { "shared".to_owned() };
                conn.request("ctx/openSession", json!({"cwd": "/tmp", "model": "claude-sonnet-4-5", "sessionId": id}))?;
            }
            let started = Instant::now();
            let threads: Vec<_> = (0..clients)
                .map(|c| {
                    let handle = conn.clone_handle();
                    std::thread::spawn(move || -> anyhow::Result<()> {
                        let session = if separate { format!("s{c}") } else { "shared".to_owned() };
                        client_appends(&handle, &session, c * 1_000_000, per_client, window)
                    })
                })
                .collect();
            for t in threads {
                t.join().map_err(|_| anyhow::anyhow!("client thread panicked"))??;
            }
            rates[m].push((clients * per_client) as f64 / started.elapsed().as_secs_f64());
        }
        // Baseline: one 1 KB write + sync_data per record, one writer, no daemon.
        let (_dir, state) = temp_state()?;
        std::fs::create_dir_all(&state)?;
        let mut f = std::fs::File::create(state.join("raw.jsonl"))?;
        let line = format!("{}\n", record(0, 1024));
        let n = if quick { 300 } else { 1_000 };
        let started = Instant::now();
        for _ in 0..n {
            f.write_all(line.as_bytes())?;
            f.sync_data()?;
        }
        sync_baseline.push(n as f64 / started.elapsed().as_secs_f64());
    }
    let baseline = median(sync_baseline);
    println!(
        "durable appends, {clients} concurrent clients, 1 KB records, one record per request, acknowledged after sync:"
    );
    for ((label, _, _), r) in modes.iter().zip(rates) {
        let rate = median(r);
        println!("  {label:<58} {rate:>8.0} records/s  ({:.1}x baseline)", rate / baseline);
    }
    println!("  baseline: write + sync_data per 1 KB record, one writer, no daemon: {baseline:.0} records/s");
    Ok(())
}

fn resume(reps: usize, quick: bool) -> anyhow::Result<()> {
    let n = if quick { 20_000 } else { 100_000 };
    let (_dir, state) = temp_state()?;
    // Build the transcripts through a daemon once (so they are exactly what ctxd writes).
    {
        let conn = Conn::start(&state)?;
        initialize(&conn)?;
        for (id, boundary_at) in [("plain", None), ("compacted", Some(n - n / 100))] {
            conn.request("ctx/openSession", json!({"cwd": "/tmp", "model": "claude-sonnet-4-5", "sessionId": id}))?;
            let mut batch = Vec::new();
            for i in 0..n {
                if Some(i) == boundary_at {
                    batch.push(json!({"type": "system", "subtype": "compact_boundary", "uuid": format!("b-{i}"), "parentUuid": null,
                                      "compactMetadata": {"trigger": "auto", "preTokens": 900000}}));
                } else {
                    batch.push(record(i, 1024));
                }
                if batch.len() == 1000 {
                    conn.request("ctx/append", json!({"sessionId": id, "records": batch}))?;
                    batch = Vec::new();
                }
            }
            if !batch.is_empty() {
                conn.request("ctx/append", json!({"sessionId": id, "records": batch}))?;
            }
            conn.request("ctx/closeSession", json!({"sessionId": id}))?;
        }
        conn.request("shutdown", Value::Null)?;
    }
    let bytes = std::fs::metadata(state.join("sessions/plain.jsonl"))?.len();
    let mut plain = Vec::new();
    let mut compacted = Vec::new();
    let mut read_baseline = Vec::new();
    for _ in 0..reps {
        for (id, out) in [("plain", &mut plain), ("compacted", &mut compacted)] {
            let conn = Conn::start(&state)?;
            initialize(&conn)?;
            let started = Instant::now();
            let opened =
                conn.request("ctx/openSession", json!({"cwd": "/tmp", "model": "claude-sonnet-4-5", "sessionId": id}))?;
            out.push(started.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(opened["records"] == n as u64, "{id}: {}", opened["records"]);
        }
        let started = Instant::now();
        let data = std::fs::read(state.join("sessions/plain.jsonl"))?;
        read_baseline.push(started.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(data.len() as u64 == bytes);
    }
    let (p, c, r) = (median(plain), median(compacted), median(read_baseline));
    println!("resume (ctx/openSession on a fresh daemon), {n} records of 1 KB ({:.0} MB):", bytes as f64 / 1e6);
    println!(
        "  no boundary:                 {p:>8.1} ms  ({:.1}x reading the same bytes with fs::read: {r:.1} ms)",
        p / r
    );
    println!("  boundary before the last 1%: {c:>8.1} ms  ({:.3}x the no-boundary resume)", c / p);
    Ok(())
}

/// Usage after an append must cost O(appended records): one record appended (and its
/// usage returned, synced) to a session of 100 records and to one of 100,000, then
/// `ctx/usage` on each, medians of many sequential requests.
fn usage_after_append(quick: bool) -> anyhow::Result<()> {
    let big = if quick { 20_000 } else { 100_000 };
    let samples = if quick { 100 } else { 300 };
    let (_dir, state) = temp_state()?;
    let conn = Conn::start(&state)?;
    initialize(&conn)?;
    let mut figures = Vec::new();
    for (id, n) in [("small", 100), ("large", big)] {
        conn.request("ctx/openSession", json!({"cwd": "/tmp", "model": "claude-sonnet-4-5", "sessionId": id}))?;
        for start in (0..n).step_by(1000) {
            let batch: Vec<Value> = (start..n.min(start + 1000)).map(|i| record(i, 1024)).collect();
            conn.request("ctx/append", json!({"sessionId": id, "records": batch}))?;
        }
        let (mut append_ms, mut usage_ms) = (Vec::new(), Vec::new());
        for i in 0..samples {
            let started = Instant::now();
            let answer = conn.request("ctx/append", json!({"sessionId": id, "records": [record(n + i, 1024)]}))?;
            append_ms.push(started.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(answer["usage"]["tokens"].as_u64().is_some(), "append: {answer}");
            let started = Instant::now();
            conn.request("ctx/usage", json!({"sessionId": id}))?;
            usage_ms.push(started.elapsed().as_secs_f64() * 1e3);
        }
        figures.push((n, median(append_ms), median(usage_ms)));
    }
    conn.request("shutdown", Value::Null)?;
    let (small, large) = (figures[0], figures[1]);
    println!("usage after one append (sequential, synced), medians of {samples}:");
    for (n, append, usage) in &figures {
        println!("  {n:>7} records: append+usage {append:>7.3} ms, ctx/usage {usage:>7.3} ms");
    }
    println!(
        "  ratio {} / 100 records: append {:.2}x, ctx/usage {:.2}x",
        large.0,
        large.1 / small.1,
        large.2 / small.2
    );
    Ok(())
}
