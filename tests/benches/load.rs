//! Load: 50 sessions appending and assembling at once over one connection while 5 of
//! them compact back to back, and the latency that costs a session that does not
//! compact, at two paces of the other 45: about what busy agents send, and as fast as
//! the clients go.
//! A probe session appends and assembles one request at a time. Each round starts from
//! fresh sessions of fixed sizes: one probe measured while the daemon is otherwise
//! idle, then a second probe of the same size while the load runs; p50 and p99 pool the
//! rounds. Every answer the background clients get is checked, and at the end every
//! record they appended is stored, in order.
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
    let (rounds, samples) = if quick { (2, 150) } else { (4, 250) };
    let bin = ctxd_e2e::ctxd_bin();
    anyhow::ensure!(bin.exists(), "{} missing: cargo build --release -p ctxd", bin.display());
    println!(
        "load · binary {} · {} cores · {rounds} rounds of {samples} probe appends and assembles, idle then loaded",
        bin.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    // Two paces: about what 50 busy agents send, and as fast as the clients can go
    // (the daemon and the 51 client threads then share the two cores).
    for (pace, pause) in [("agent pace", Duration::from_millis(200)), ("saturating", Duration::from_millis(10))] {
        let workload = Workload {
            name: String::new(),
            sessions: 50,
            compacting: 5,
            compact_every: 50,
            assemble_every: 4,
            pause,
            operations: None,
        };
        load(pace, workload, rounds, samples)?;
    }
    Ok(())
}

/// Sizes at the start of each round: every round starts from fresh sessions of these
/// sizes, so that rounds measure the same load (sessions that never compact would
/// otherwise grow, and their assemble answers with them).
const PROBE_RECORDS: usize = 300;
const COMPACTING_RECORDS: usize = 600;
const OTHER_RECORDS: usize = 100;

/// One daemon, `rounds` times: a probe session alone, then a second probe session of
/// the same size while the background load runs.
fn load(pace: &str, mut workload: Workload, rounds: usize, samples: usize) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("ctxd-load-").tempdir()?;
    let state = dir.path().join("state");
    let mux = Mux::start(&state, &[])?;
    let mut idle = Latencies::default();
    let mut loaded = Latencies::default();
    let mut logs: Vec<SessionLog> = Vec::new();
    let (mut ops, mut compactions, mut loaded_secs, mut peak_rss) = (0u64, 0u64, 0.0, 0.0_f64);
    for round in 0..rounds {
        workload.name = format!("r{round}");
        let seeded: Vec<Vec<String>> = (0..workload.sessions)
            .map(|i| open_and_seed(&mux, &session_id(i, &workload), if i < workload.compacting { COMPACTING_RECORDS } else { OTHER_RECORDS }))
            .collect::<anyhow::Result<_>>()?;
        let mut alone = Probe::open(&mux, &format!("probe-idle-{round}"))?;
        let mut busy = Probe::open(&mux, &format!("probe-loaded-{round}"))?;
        alone.measure(&mux, samples, &mut idle)?;

        let background = Background::start(&mux, &workload, seeded);
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(500)); // every client under way
        busy.measure(&mux, samples, &mut loaded)?;
        peak_rss = peak_rss.max(memory_mb(mux.pid(), "VmRSS:"));
        let done = background.stop()?;
        loaded_secs += started.elapsed().as_secs_f64();
        ops += done.iter().map(|l| l.appends + l.assembles).sum::<u64>();
        compactions += done.iter().map(|l| l.compactions).sum::<u64>();
        for id in done.iter().map(|l| l.id.clone()).chain([alone.id, busy.id]) {
            mux.request("ctx/closeSession", json!({"sessionId": id}))?;
        }
        logs.extend(done);
    }
    check_stored(&state, &logs)?;

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
        "  {appended} background records stored, none lost or out of order; daemon VmRSS under load up to {peak_rss:.1} MB, VmHWM {:.1} MB",
        memory_mb(mux.pid(), "VmHWM:")
    );
    Ok(())
}

fn memory_mb(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()).unwrap_or(0.0) / 1024.0
}

#[derive(Default)]
struct Latencies {
    append: Vec<f64>,
    assemble: Vec<f64>,
}

struct Probe {
    id: String,
    appended: Vec<String>,
}

impl Probe {
    fn open(mux: &Mux, id: &str) -> anyhow::Result<Probe> {
        Ok(Probe { id: id.to_owned(), appended: open_and_seed(mux, id, PROBE_RECORDS)? })
    }

    /// `samples` appends and assembles, alternating, one request at a time.
    fn measure(&mut self, mux: &Mux, samples: usize, into: &mut Latencies) -> anyhow::Result<()> {
        for _ in 0..samples {
            let uuid = format!("{}-{:06}", self.id, self.appended.len());
            let record = filler(&uuid, self.appended.last().map(String::as_str));
            let started = Instant::now();
            let result = mux.request("ctx/append", json!({"sessionId": self.id, "records": [record]}))?;
            into.append.push(started.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(result["appended"] == 1, "probe append: {result}");
            self.appended.push(uuid.clone());
            let started = Instant::now();
            let result = mux.request("ctx/assemble", assemble_params(&self.id))?;
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
