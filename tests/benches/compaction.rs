//! Compaction over real pipes with the release daemon and the offline summarizer, on
//! sessions from the project's generator (`ctxd_gen`, `tests/gen`):
//!
//! - **offline compaction end to end**: `ctx/compact` of a 900,000-token session, from
//!   the request to its answer (summary written, restoration planned, records installed
//!   durably);
//! - **precomputed install**: a 1M-window session past its precompute start has a summary
//!   prepared in the background; one append then takes it over the threshold, and the
//!   time from sending that append to `ctx/compacted` is measured, against the same
//!   crossing for a session that jumped straight past the threshold (nothing prepared:
//!   the summary is written after the crossing).
//!
//! ```text
//! cargo build --release -p ctxd && cargo bench -p ctxd-e2e --bench compaction
//! cargo bench -p ctxd-e2e --bench compaction -- --quick
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::path::Path;
use std::time::{Duration, Instant};

use ctxd_e2e::{Daemon, user_record};
use serde_json::{Value, json};

/// A 1,000,000-token window: threshold 967,000, precompute start 800,000.
const MODEL: &str = "claude-sonnet-4-5-20250929[1m]";

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let reps = if quick { 3 } else { 7 };
    let bin = ctxd_e2e::ctxd_bin();
    anyhow::ensure!(bin.exists(), "{} missing: cargo build --release -p ctxd", bin.display());
    println!(
        "compaction benchmarks · binary {} · {} cores · medians of {reps} runs",
        bin.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let session = generate(900_000, 7)?;
    offline_end_to_end(&session, reps)?;
    precomputed_install(&session, reps)?;
    Ok(())
}

/// A generated session of about `tokens` tokens (the last response's reported usage).
fn generate(tokens: u64, seed: u64) -> anyhow::Result<Vec<Value>> {
    let opts = ctxd_gen::Options { seed, model: MODEL.to_owned(), ..ctxd_gen::Options::tokens(tokens) };
    Ok(ctxd_gen::jsonl(&opts).lines().map(serde_json::from_str).collect::<Result<_, _>>()?)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn start(state: &Path) -> anyhow::Result<Daemon> {
    let mut daemon = Daemon::start_with(state, &[], &[("CTXD_LOG", "info")])?;
    daemon.initialize()?;
    Ok(daemon)
}

/// Opens a session in an empty directory and appends `records` (not timed).
fn load(daemon: &mut Daemon, id: &str, records: &[Value]) -> anyhow::Result<Value> {
    let cwd = tempfile::tempdir()?.keep();
    daemon.request("ctx/openSession", json!({"cwd": cwd, "model": MODEL, "sessionId": id}))?;
    let mut usage = Value::Null;
    for chunk in records.chunks(200) {
        usage = daemon.request("ctx/append", json!({"sessionId": id, "records": chunk}))?["usage"].clone();
    }
    Ok(usage)
}

fn offline_end_to_end(session: &[Value], reps: usize) -> anyhow::Result<()> {
    let mut times = Vec::new();
    let mut tokens = 0;
    let mut post = 0;
    for rep in 0..reps {
        let dir = tempfile::tempdir()?;
        let mut daemon = start(&dir.path().join("state"))?;
        let id = format!("c{rep}");
        tokens = load(&mut daemon, &id, session)?["tokens"].as_u64().unwrap_or(0);
        let started = Instant::now();
        let answer = daemon.request("ctx/compact", json!({"sessionId": id}))?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        post = answer["postTokens"].as_u64().unwrap_or(0);
        daemon.stop()?;
    }
    println!("\noffline compaction end to end (`ctx/compact` request → answer, installed and synced):");
    println!(
        "  {} records, {tokens} tokens → {post} tokens: median {:.1} ms (min {:.1}, max {:.1}; target < 500 ms)",
        session.len(),
        median(times.clone()),
        times.iter().copied().fold(f64::MAX, f64::min),
        times.iter().copied().fold(0.0, f64::max)
    );
    Ok(())
}

/// A user record of about `tokens` tokens, continuing from `parent`.
fn filler(uuid: &str, parent: Option<&str>, tokens: u64) -> Value {
    let words = ["parser ", "ledger ", "window ", "summary ", "boundary ", "watcher "];
    let mut text = String::with_capacity(tokens as usize * 4 + 16);
    let mut i = 0;
    while (text.len() as u64) < tokens * 4 {
        text.push_str(words[i % words.len()]);
        i += 1;
    }
    user_record(uuid, parent, &text)
}

/// Appends fillers of about `step` tokens until one takes the session over the
/// threshold; returns the time from sending that one to `ctx/compacted`.
fn cross(
    daemon: &mut Daemon,
    id: &str,
    parent: Option<String>,
    mut step: u64,
    threshold: u64,
) -> anyhow::Result<(f64, Value)> {
    let mut parent = parent;
    for n in 0..20 {
        let uuid = format!("cross-{n}");
        let started = Instant::now();
        let usage =
            daemon
                .request("ctx/append", json!({"sessionId": id, "records": [filler(&uuid, parent.as_deref(), step)]}))?
                ["usage"]
                .clone();
        let tokens = usage["tokens"].as_u64().unwrap_or(0);
        if tokens >= threshold || usage["level"] == "compacting" {
            let compacted = daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == id)?;
            return Ok((started.elapsed().as_secs_f64() * 1e3, compacted));
        }
        parent = Some(uuid);
        step = threshold - tokens + 2_000;
    }
    anyhow::bail!("the session never reached the threshold")
}

fn precomputed_install(session: &[Value], reps: usize) -> anyhow::Result<()> {
    let last_uuid = |records: &[Value]| records.iter().rev().find_map(|r| r["uuid"].as_str().map(str::to_owned));
    // The first 85 % of the generated session puts the context past the precompute
    // start (800,000) and below the threshold (967,000).
    let mut part = session.len() * 85 / 100;
    let threshold = 967_000;
    let (mut ahead, mut plain) = (Vec::new(), Vec::new());
    let (mut ahead_tokens, mut plain_tokens) = (0, 0);
    let (mut ahead_step, mut plain_step) = (0, 0);
    for rep in 0..reps {
        // Prepared: past the start, wait for the summary, then cross.
        let dir = tempfile::tempdir()?;
        let mut daemon = start(&dir.path().join("state"))?;
        let id = format!("a{rep}");
        let usage = load(&mut daemon, &id, &session[..part])?;
        let tokens = usage["tokens"].as_u64().unwrap_or(0);
        if tokens < 800_000 && part < session.len() {
            part = (part + session.len() / 20).min(session.len());
            daemon.stop()?;
            continue;
        }
        anyhow::ensure!(tokens < threshold, "the prefix is already past the threshold: {tokens}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while daemon.request("ctx/context", json!({"sessionId": id}))?["preparedAhead"].is_null() {
            anyhow::ensure!(Instant::now() < deadline, "no summary was prepared ahead at {tokens} tokens");
            std::thread::sleep(Duration::from_millis(20));
        }
        let step = threshold - tokens + 2_000;
        ahead_step = step;
        let (ms, compacted) = cross(&mut daemon, &id, last_uuid(&session[..part]), step, threshold)?;
        anyhow::ensure!(compacted["trigger"] == "precomputed", "not installed from the prepared summary: {compacted}");
        ahead.push(ms);
        ahead_tokens = compacted["preTokens"].as_u64().unwrap_or(0);
        daemon.stop()?;

        // Nothing prepared: the session jumps from below the precompute start straight
        // past the threshold with one append of the same kind.
        let dir = tempfile::tempdir()?;
        let mut daemon = start(&dir.path().join("state"))?;
        let id = format!("p{rep}");
        let below = (0..part).rev().find(|&n| n < part * 80 / 100).unwrap_or(0);
        let usage = load(&mut daemon, &id, &session[..below])?;
        let tokens = usage["tokens"].as_u64().unwrap_or(0);
        let step = threshold - tokens + 2_000;
        plain_step = step;
        let (ms, compacted) = cross(&mut daemon, &id, last_uuid(&session[..below]), step, threshold)?;
        anyhow::ensure!(compacted["trigger"] == "auto", "{compacted}");
        plain.push(ms);
        plain_tokens = compacted["preTokens"].as_u64().unwrap_or(0);
        daemon.stop()?;
    }
    anyhow::ensure!(!ahead.is_empty(), "no run reached the precompute start");
    let (a, p) = (median(ahead.clone()), median(plain.clone()));
    println!("\nthreshold crossing → ctx/compacted (sending the crossing append, synced, included):");
    println!(
        "  summary prepared ahead: median {a:.1} ms at {ahead_tokens} tokens, crossing record {} KB ({} runs; target < 50 ms)",
        ahead_step * 4 / 1024,
        ahead.len()
    );
    println!(
        "  nothing prepared:       median {p:.1} ms at {plain_tokens} tokens, crossing record {} KB ({} runs)",
        plain_step * 4 / 1024,
        plain.len()
    );
    println!("  ratio: {:.2}x", a / p);
    Ok(())
}
