//! Load: 50 sessions appending and assembling at once over one connection while 5 of
//! them compact back to back, and the latency that costs a session that does not
//! compact, at two paces of the other 45: about what busy agents send, and as fast as
//! the clients go.
//! A probe session appends and assembles one request at a time; its p50 and p99 are
//! measured on the same daemon when it is otherwise idle and while the load runs,
//! alternating, in the same run. Every answer the background clients get is checked,
//! and at the end every record they appended is stored, in order.
//!
//! ```text
//! cargo build --release -p ctxd && cargo bench -p ctxd-e2e --bench load
//! cargo bench -p ctxd-e2e --bench load -- --quick      # fewer samples and rounds
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::time::{Duration, Instant};

use ctxd_e2e::load::{Background, Mux, SessionLog, Workload, assemble_params, check_stored, filler, open_and_seed, session_id};
use serde_json::json;

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rounds, samples) = if quick { (2, 150) } else { (3, 400) };
    let bin = ctxd_e2e::ctxd_bin();
    anyhow::ensure!(bin.exists(), "{} missing: cargo build --release -p ctxd", bin.display());
    println!(
        "load · binary {} · {} cores · {rounds} rounds of {samples} probe appends and assembles, idle and loaded alternating",
        bin.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    // Two paces: about what 50 busy agents send, and as fast as the clients can go
    // (the daemon and the 51 client threads then share the two cores).
    for (pace, pause) in [("agent pace", Duration::from_millis(200)), ("saturating", Duration::from_millis(10))] {
        let workload = Workload {
            sessions: 50,
            compacting: 5,
            compact_every: 50,
            assemble_every: 4,
            pause,
            operations: None,
        };
        load(pace, &workload, rounds, samples)?;
    }
    Ok(())
}

/// One daemon: the probe alone, then with the background load, `rounds` times.
fn load(pace: &str, workload: &Workload, rounds: usize, samples: usize) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("ctxd-load-").tempdir()?;
    let state = dir.path().join("state");
    let mux = Mux::start(&state, &[])?;
    let mut seeded: Vec<Vec<String>> = (0..workload.sessions)
        .map(|i| open_and_seed(&mux, &session_id(i, workload), if i < workload.compacting { 600 } else { 100 }))
        .collect::<anyhow::Result<_>>()?;
    let mut probe = Probe { appended: open_and_seed(&mux, "probe", 300)? };

    let mut idle = Latencies::default();
    let mut loaded = Latencies::default();
    let mut logs: Vec<SessionLog> = Vec::new();
    let (mut ops, mut compactions, mut loaded_secs) = (0u64, 0u64, 0.0);
    for _ in 0..rounds {
        probe.measure(&mux, samples, &mut idle)?;
        let background = Background::start(&mux, workload, seeded.clone());
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(500)); // every client under way
        probe.measure(&mux, samples, &mut loaded)?;
        let done = background.stop()?;
        loaded_secs += started.elapsed().as_secs_f64();
        // Each round goes on from the previous round's records.
        ops += done.iter().map(|l| l.appends + l.assembles).sum::<u64>();
        compactions += done.iter().map(|l| l.compactions).sum::<u64>();
        seeded = done.iter().map(|l| l.appended.clone()).collect();
        logs = merge(logs, done);
    }
    check_stored(&state, &logs)?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", mux.pid()))?;
    let field = |name: &str| status.lines().find(|l| l.starts_with(name)).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()).unwrap_or(0.0) / 1024.0;

    let appended: usize = logs.iter().map(|l| l.appended.len()).sum();
    println!(
        "{pace}: {} sessions, {} of them compacting back to back (every {} appends), the others pausing {:?} between operations, one assemble in {}: {:.0} operations/s, {compactions} compactions",
        workload.sessions,
        workload.compacting,
        workload.compact_every,
        workload.pause,
        workload.assemble_every,
        ops as f64 / loaded_secs.max(1e-9),
    );
    println!("  {:<22} {:>10} {:>10} {:>11} {:>11} {:>8} {:>8}", "probe session", "idle p50", "idle p99", "loaded p50", "loaded p99", "x p50", "x p99");
    for (label, a, b) in [("ctx/append (durable)", &idle.append, &loaded.append), ("ctx/assemble", &idle.assemble, &loaded.assemble)] {
        let (a50, a99, b50, b99) = (pct(a, 50.0), pct(a, 99.0), pct(b, 50.0), pct(b, 99.0));
        println!("  {label:<22} {a50:>8.2}ms {a99:>8.2}ms {b50:>9.2}ms {b99:>9.2}ms {:>7.1}x {:>7.1}x", b50 / a50, b99 / a99);
    }
    println!(
        "  {appended} background records stored, none lost or out of order; daemon VmRSS {:.1} MB, VmHWM {:.1} MB",
        field("VmRSS:"),
        field("VmHWM:")
    );
    Ok(())
}

/// Per-session logs of consecutive rounds, folded into one per session.
fn merge(previous: Vec<SessionLog>, next: Vec<SessionLog>) -> Vec<SessionLog> {
    if previous.is_empty() {
        return next;
    }
    previous
        .into_iter()
        .zip(next)
        .map(|(p, n)| SessionLog {
            id: n.id,
            appended: n.appended,
            appends: p.appends + n.appends,
            assembles: p.assembles + n.assembles,
            compactions: p.compactions + n.compactions,
        })
        .collect()
}

#[derive(Default)]
struct Latencies {
    append: Vec<f64>,
    assemble: Vec<f64>,
}

#[derive(Default)]
struct Probe {
    appended: Vec<String>,
}

impl Probe {
    /// `samples` appends and assembles, alternating, one request at a time.
    fn measure(&mut self, mux: &Mux, samples: usize, into: &mut Latencies) -> anyhow::Result<()> {
        for _ in 0..samples {
            let uuid = format!("probe-{:06}", self.appended.len());
            let record = filler(&uuid, self.appended.last().map(String::as_str));
            let started = Instant::now();
            let result = mux.request("ctx/append", json!({"sessionId": "probe", "records": [record]}))?;
            into.append.push(started.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(result["appended"] == 1, "probe append: {result}");
            self.appended.push(uuid.clone());
            let started = Instant::now();
            let result = mux.request("ctx/assemble", assemble_params("probe"))?;
            into.assemble.push(started.elapsed().as_secs_f64() * 1e3);
            let last = result["request"]["messages"].as_array().and_then(|m| m.last()).map(ToString::to_string).unwrap_or_default();
            anyhow::ensure!(last.contains(&uuid), "probe assemble lacks the record just appended");
        }
        Ok(())
    }
}

fn pct(xs: &[f64], p: f64) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(|a, b| a.total_cmp(b));
    let i = ((p / 100.0) * (xs.len() - 1) as f64).round() as usize;
    xs[i.min(xs.len() - 1)]
}
