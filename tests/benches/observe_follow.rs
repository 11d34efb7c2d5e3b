//! Throughput of the follower of an observed transcript (`ctx/observe`): another program
//! appends N MB of Claude Code records in one go, then a response with a known usage;
//! the time from the start of that write to the `ctx/usageChanged` carrying the usage.
//! A measurement printed, never asserted.
//!
//! ```text
//! cargo build --release -p ctxd
//! cargo bench -p ctxd-e2e --bench observe_follow                      # 64 MB, 7 rounds
//! cargo bench -p ctxd-e2e --bench observe_follow -- --mb 16 --rounds 3
//! CTXD_BASE_BIN=/path/to/other/ctxd cargo bench -p ctxd-e2e --bench observe_follow  # both, interleaved
//! ```
//!
//! With `CTXD_BASE_BIN`, each round measures that binary and then this build's, and the
//! medians and their ratio are printed: one run on the same machine, so its noise falls
//! on both.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // bench code: a failed step is a failed run

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ctxd_e2e::{Daemon, assistant_record, user_record};
use serde_json::json;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() -> anyhow::Result<()> {
    let mb: usize = arg("--mb").map_or(Ok(64), |v| v.parse())?;
    if std::env::args().any(|a| a == "--one") {
        // A child run: one measurement with the binary CTXD_BIN names, in milliseconds.
        println!("{:.3}", one(mb)?.as_secs_f64() * 1e3);
        return Ok(());
    }
    let rounds: usize = arg("--rounds").map_or(Ok(7), |v| v.parse())?;
    let this = ctxd_e2e::ctxd_bin();
    anyhow::ensure!(this.exists(), "{} missing: cargo build --release -p ctxd", this.display());
    let base = std::env::var_os("CTXD_BASE_BIN").map(PathBuf::from);
    let mut bins = Vec::new();
    if let Some(base) = &base {
        bins.push(("base", base.clone()));
    }
    bins.push(("this", this));
    println!(
        "observe follower: {mb} MB appended at once · {rounds} rounds · {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); bins.len()];
    for _ in 0..rounds {
        for (i, (_, bin)) in bins.iter().enumerate() {
            let out = std::process::Command::new(std::env::current_exe()?)
                .args(["--one", "--mb", &mb.to_string()])
                .env("CTXD_BIN", bin)
                .output()?;
            anyhow::ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            samples[i].push(String::from_utf8(out.stdout)?.trim().parse()?);
        }
    }
    let mut medians = Vec::new();
    for ((name, bin), mut times) in bins.iter().zip(samples) {
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "{name}: median {median:.1} ms ({:.0} MB/s) · min {:.1} · max {:.1} · {}",
            mb as f64 / (median / 1e3),
            times[0],
            times[times.len() - 1],
            bin.display()
        );
        medians.push(median);
    }
    if let [base, this] = medians[..] {
        println!("this / base: {:.3}x the time", this / base);
    }
    Ok(())
}

/// One daemon observing a transcript; `mb` MB of the example session's records appended
/// in one write, then a response reporting 654,321 tokens: the time until its figure.
fn one(mb: usize) -> anyhow::Result<Duration> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("claude.jsonl");
    std::fs::write(&path, format!("{}\n", user_record("u0", None, "start")))?;
    let example = std::fs::read_to_string(ctxd_e2e::repo_root().join("examples/session.jsonl"))?;
    let mut payload = Vec::with_capacity(mb << 20);
    while payload.len() < mb << 20 {
        payload.extend_from_slice(example.as_bytes());
    }
    payload.extend_from_slice(format!("{}\n", assistant_record("a-end", None, "msg_end", 654_000, 321)).as_bytes());
    // Info logging: debug lines would be part of what is measured.
    let mut daemon = Daemon::start_with(&dir.path().join("state"), &[], &[("CTXD_LOG", "info")])?;
    daemon.initialize()?;
    let id = daemon.request("ctx/observe", json!({"transcript": path}))?["sessionId"].clone();
    let mut file = std::fs::OpenOptions::new().append(true).open(&path)?;
    let started = Instant::now();
    file.write_all(&payload)?;
    daemon
        .wait_notification("ctx/usageChanged", |p| p["sessionId"] == id && p["usage"]["reportedTokens"] == 654_321)?;
    Ok(started.elapsed())
}
