//! Base context and file-read ledger over real pipes, with the release daemon:
//!
//! - memory-file edit → `ctx/contextChanged`: the distribution over many edits (plain
//!   writes and atomic-rename saves alternating), against the watcher's debounce;
//! - the ledger at 10,000 entries: the daemon's resident memory before and after, and
//!   the cost of an append carrying a read with an empty ledger against one with 10,000
//!   entries, in the same run.
//!
//! ```text
//! cargo build --release -p ctxd && cargo bench -p ctxd-e2e --bench base_context
//! cargo bench -p ctxd-e2e --bench base_context -- --quick    # 30 edits, 3,000 entries
//! cargo bench -p ctxd-e2e --bench base_context -- observe    # one part (edits, ledger, observe)
//! ```
//!
//! The `observe` part: a record another program appends to an observed transcript
//! (`ctx/observe`) → the `ctx/usageChanged` that carries it (target: within 100 ms).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // a bench binary: it reports on stdout and stops on a broken step

use std::path::Path;
use std::time::{Duration, Instant};

use ctxd_e2e::{Daemon, user_record};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5-20250929";
/// The daemon's default quiet period (`context::watcher::DEFAULT_DEBOUNCE`).
const DEBOUNCE: Duration = Duration::from_millis(50);

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let bin = ctxd_e2e::ctxd_bin();
    anyhow::ensure!(bin.exists(), "{} missing: cargo build --release -p ctxd", bin.display());
    println!(
        "base context benchmarks · binary {} · {} cores",
        bin.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wanted = |part: &str| only.is_empty() || only.iter().any(|o| o == part);
    if wanted("edits") {
        edit_latency(if quick { 30 } else { 100 })?;
    }
    if wanted("ledger") {
        ledger(if quick { 3_000 } else { 10_000 }, 1_000)?;
    }
    if wanted("observe") {
        observe_latency(if quick { 30 } else { 100 })?;
    }
    Ok(())
}

fn start(state: &Path) -> anyhow::Result<Daemon> {
    // Info logging: debug lines per request would be part of what is measured.
    let mut daemon = Daemon::start_with(state, &[], &[("CTXD_LOG", "info"), ("DISABLE_AUTO_COMPACT", "1")])?;
    daemon.initialize()?;
    Ok(daemon)
}

fn open(daemon: &mut Daemon, session: &str, cwd: &Path) -> anyhow::Result<()> {
    daemon.request("ctx/openSession", json!({"cwd": cwd, "model": MODEL, "sessionId": session}))?;
    daemon.request(
        "ctx/append",
        json!({"sessionId": session, "records": [user_record(&format!("{session}-u0"), None, "Start.")]}),
    )?;
    Ok(())
}

fn quantiles(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    format!(
        "min {:.1} ms · median {:.1} ms · p90 {:.1} ms · max {:.1} ms",
        ms(samples[0]),
        ms(at(0.5)),
        ms(at(0.9)),
        ms(samples[samples.len() - 1])
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// From the moment an edit is on disk to the moment its `ctx/contextChanged` is read
/// from the daemon's stdout.
fn edit_latency(edits: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let project = dir.path().join("project");
    std::fs::create_dir_all(&project)?;
    let file = project.join("CLAUDE.md");
    std::fs::write(&file, "# Rules\n")?;
    let mut daemon = start(&dir.path().join("state"))?;
    open(&mut daemon, "s", &project)?;
    let want = json!(file.display().to_string());
    let mut samples = Vec::new();
    let mut extra = 0;
    for n in 0..edits {
        let text = format!("# Rules\nedit {n}\n");
        let started = Instant::now();
        if n % 2 == 0 {
            std::fs::write(&file, text)?;
        } else {
            let tmp = project.join(".CLAUDE.md.tmp");
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, &file)?;
        }
        daemon.wait_notification("ctx/contextChanged", |p| p["paths"].as_array().is_some_and(|a| a.contains(&want)))?;
        samples.push(started.elapsed());
        // Past the quiet period, so edits do not merge; a second delivery for one edit
        // would show here.
        std::thread::sleep(DEBOUNCE * 3);
        extra += daemon.drain_notifications("ctx/contextChanged").len();
        // The next request rebuilds the memo, as an agent's would.
        daemon.request("ctx/context", json!({"sessionId": "s"}))?;
    }
    println!(
        "\nmemory-file edit → ctx/contextChanged, {edits} edits (half atomic saves), debounce {} ms:",
        DEBOUNCE.as_millis()
    );
    println!("  {}", quantiles(samples));
    println!(
        "  extra deliveries: {extra}; target: within debounce + 20 ms = {} ms",
        (DEBOUNCE + Duration::from_millis(20)).as_millis()
    );
    Ok(())
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).ok_or_else(|| anyhow::anyhow!("no VmRSS"))?;
    Ok(line.split_whitespace().nth(1).unwrap_or("0").parse()?)
}

/// A Read tool result as Claude Code appends it.
fn read_record(n: usize, path: &str) -> Value {
    let content = format!("pub fn f{n}() {{}}\n");
    json!({
        "type": "user", "uuid": format!("r{n}"), "parentUuid": null, "timestamp": "2026-11-29T10:00:00.000Z",
        "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{n}"), "content": content}]},
        "toolUseResult": {"type": "text", "file": {"filePath": path, "content": content, "numLines": 1, "startLine": 1, "totalLines": 1}}
    })
}

/// `count` reads into one session (one `ctx/append` per read, each acknowledged before
/// the next), timing each chunk of `chunk`; then explicit `ctx/fileRead`s into the full
/// session and into a fresh one.
fn ledger(count: usize, chunk: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let project = dir.path().join("project");
    // Files spread over 100 folders, as a repository's would be.
    let path_of = |n: usize| project.join(format!("src/m{:02}/f{n}.rs", n % 100));
    for n in 0..count + 2 * chunk {
        let path = path_of(n);
        std::fs::create_dir_all(path.parent().unwrap())?;
        std::fs::write(&path, format!("pub fn f{n}() {{}}\n"))?;
    }
    let mut daemon = start(&dir.path().join("state"))?;
    open(&mut daemon, "full", &project)?;
    open(&mut daemon, "fresh", &project)?;
    daemon.request("ctx/context", json!({"sessionId": "full"}))?;
    let rss_before = rss_kib(daemon.pid())?;

    let mut per_append = Vec::new();
    let mut n = 0;
    while n < count {
        let started = Instant::now();
        for _ in 0..chunk.min(count - n) {
            let path = path_of(n).display().to_string();
            daemon.request("ctx/append", json!({"sessionId": "full", "records": [read_record(n, &path)]}))?;
            n += 1;
        }
        per_append.push((n, started.elapsed() / chunk as u32));
    }
    let files = daemon.request("ctx/context", json!({"sessionId": "full"}))?["filesRead"].as_u64().unwrap_or(0);
    anyhow::ensure!(files == count as u64, "ledger has {files} entries, wanted {count}");
    // Let sled's background flush and the allocator settle before reading RSS.
    std::thread::sleep(Duration::from_secs(1));
    let rss_after = rss_kib(daemon.pid())?;

    let time_reads = |daemon: &mut Daemon, session: &str, from: usize| -> anyhow::Result<Duration> {
        let started = Instant::now();
        for k in from..from + chunk {
            daemon.request("ctx/fileRead", json!({"sessionId": session, "path": path_of(k)}))?;
        }
        Ok(started.elapsed() / chunk as u32)
    };
    let fresh = time_reads(&mut daemon, "fresh", count)?;
    let full = time_reads(&mut daemon, "full", count + chunk)?;
    // A compaction puts every read before the boundary: the index gets them all then.
    let started = Instant::now();
    daemon.request("ctx/compact", json!({"sessionId": "full"}))?;
    let compact_ms = started.elapsed().as_secs_f64() * 1e3;
    std::thread::sleep(Duration::from_secs(1));
    let rss_compacted = rss_kib(daemon.pid())?;
    drop(daemon);

    // The same number of records of the same size that read nothing, in a daemon of its
    // own: what holding the records costs, to tell the ledger's share apart.
    let mut daemon = start(&dir.path().join("plain"))?;
    open(&mut daemon, "plain", &project)?;
    daemon.request("ctx/context", json!({"sessionId": "plain"}))?;
    let plain_before = rss_kib(daemon.pid())?;
    for n in 0..count {
        let mut record = read_record(n, &path_of(n).display().to_string());
        record.as_object_mut().unwrap().remove("toolUseResult");
        let filler =
            "x".repeat(read_record(n, &path_of(n).display().to_string()).to_string().len() - record.to_string().len());
        record["message"]["content"][0]["content"] = json!(format!("pub fn f{n}() {{}}\n{filler}"));
        daemon.request("ctx/append", json!({"sessionId": "plain", "records": [record]}))?;
    }
    std::thread::sleep(Duration::from_secs(1));
    let plain_after = rss_kib(daemon.pid())?;

    println!("\nfile-read ledger, {count} entries (one ctx/append with one Read result per request, acknowledged):");
    let first = per_append[0].1;
    for (upto, each) in &per_append {
        println!(
            "  appends up to {upto:>6} entries: {:>7.1} µs each ({:.2}x the first {chunk})",
            each.as_secs_f64() * 1e6,
            each.as_secs_f64() / first.as_secs_f64()
        );
    }
    println!(
        "  daemon RSS: {:.1} MB before, {:.1} MB after {count} reads: +{:.1} MB (ledger, index, watched paths and the {count} records in view)",
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0,
        (rss_after as f64 - rss_before as f64) / 1024.0
    );
    println!(
        "  the same number of records of the same size without reads: +{:.1} MB, so the reads' own share is {:.1} MB",
        (plain_after as f64 - plain_before as f64) / 1024.0,
        ((rss_after as f64 - rss_before as f64) - (plain_after as f64 - plain_before as f64)) / 1024.0
    );
    println!(
        "  after a compaction (every entry written to the index in one batch; ctx/compact took {compact_ms:.0} ms): {:.1} MB, +{:.1} MB over the figure above",
        rss_compacted as f64 / 1024.0,
        (rss_compacted as f64 - rss_after as f64) / 1024.0
    );
    println!(
        "  ctx/fileRead of a new file: {:.1} µs each into an empty ledger, {:.1} µs into {count} entries ({:.2}x)",
        fresh.as_secs_f64() * 1e6,
        full.as_secs_f64() * 1e6,
        full.as_secs_f64() / fresh.as_secs_f64()
    );
    Ok(())
}

/// Another program appends a response to an observed transcript; the time until the
/// `ctx/usageChanged` that carries its usage.
fn observe_latency(appends: usize) -> anyhow::Result<()> {
    use std::io::Write;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("claude.jsonl");
    std::fs::write(&path, format!("{}\n", user_record("u0", None, "start")))?;
    let mut daemon = start(&dir.path().join("state"))?;
    let observed = daemon.request("ctx/observe", json!({"transcript": path}))?;
    let id = observed["sessionId"].clone();
    let mut samples = Vec::new();
    for n in 1..=appends {
        let input = 10_000 + n as u64;
        let record = json!({"type": "assistant", "uuid": format!("a{n}"), "parentUuid": null,
            "message": {"id": format!("msg_{n}"), "role": "assistant", "model": MODEL, "content": [{"type": "text", "text": "ok"}],
                        "usage": {"input_tokens": input, "output_tokens": 0}}});
        let started = Instant::now();
        let mut file = std::fs::OpenOptions::new().append(true).open(&path)?;
        file.write_all(format!("{record}\n").as_bytes())?;
        drop(file);
        daemon
            .wait_notification("ctx/usageChanged", |p| p["sessionId"] == id && p["usage"]["reportedTokens"] == input)?;
        samples.push(started.elapsed());
        std::thread::sleep(DEBOUNCE * 3);
    }
    println!("\nobserved transcript: appended record → ctx/usageChanged, {appends} appends:");
    println!("  {}", quantiles(samples));
    println!("  target: within 100 ms");
    Ok(())
}
