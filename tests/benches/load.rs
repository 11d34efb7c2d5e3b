//! Load: 50 sessions appending and assembling at once over one connection while 5 of
//! them compact, and the latency that costs a session that does not compact, under two
//! loads: a fixed one (every client at a busy agent's pace, the 5 compacting back to
//! back through a provider) and a saturating one (clients as fast as they go).
//! A probe session appends and assembles one request at a time, pausing 10 ms before
//! each pair. Each round starts from fresh sessions of fixed sizes: one probe measured
//! while the daemon is otherwise idle (the background paused, every answer it waited
//! for received) and a second probe of the same size while the load runs, in windows
//! of 50 pairs that alternate, so that a slow spell of the host falls on either side
//! alike; p50 and p99 pool the windows and rounds. Every answer the background clients get is checked, and at the end every
//! record they appended is stored, in order.
//!
//! Then appends during a running compaction of the same session: a session compacts
//! back to back through a local HTTP provider that takes [`SLOW_SUMMARY`] to answer, so a
//! compaction is always in flight, while its client appends one record at a time; its
//! appends before the compactions are the idle figure. Only appends whose answer says
//! the session was compacting count as loaded.
//!
//! ```text
//! cargo build --release -p ctxd && cargo bench -p ctxd-e2e --bench load
//! cargo bench -p ctxd-e2e --bench load -- --quick      # fewer samples and rounds
//! cargo bench -p ctxd-e2e --bench load -- --same-session   # only appends during a compaction
//! cargo bench -p ctxd-e2e --bench load -- --agent-pace     # only the fixed load
//! cargo bench -p ctxd-e2e --bench load -- --probe-pause=0  # the probe back to back
//! cargo bench -p ctxd-e2e --bench load -- --samples=FILE   # every probe pair, to FILE
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use ctxd_e2e::load::{
    Background, Compactions, HeldRequest, Mux, SessionLog, Workload, assemble_params, check_assembled, check_stored,
    filler, open_and_seed, session_id,
};
use serde_json::json;

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rounds, samples) = if quick { (2, 150) } else { (4, 250) };
    let bin = ctxd_e2e::ctxd_bin();
    anyhow::ensure!(bin.exists(), "{} missing: cargo build --release -p ctxd", bin.display());
    println!(
        "load · binary {} · {} cores · {rounds} rounds of {samples} probe appends and assembles ({:?} before each pair), idle then loaded",
        bin.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        probe_pause(),
    );
    // Two loads. Agent pace: a fixed offered load, every client pausing 200 ms between
    // operations (a busy agent sends far less) while 5 sessions compact back to back
    // through a local provider that takes PROVIDER_DELAY per summary, as compactions
    // with a model do (several always in flight, and the daemon's own work for each:
    // the request, the stream, the checks, restoration, the install). Saturating: the 5
    // compacting clients never pause and compact with the offline summarizer (all the
    // work on the daemon's CPU) and the others pause 10 ms, so the load grows with the
    // daemon's speed (the daemon and the clients' threads then share the two cores).
    // Clients keep the request they were sent and assemble `since` it, as a host that
    // holds its last request does (answers the size of the turn); the agent pace also
    // runs with every answer whole (answers the size of the session), as before
    // 2026-11-30's `since`.
    let loads = [
        ("agent pace", Duration::from_millis(200), Compactions::Continuous, true),
        ("agent pace, whole requests", Duration::from_millis(200), Compactions::Continuous, false),
        ("saturating", Duration::from_millis(10), Compactions::EveryAppends(50), true),
    ];
    // `--same-session` runs only the part about appends during a compaction,
    // `--agent-pace` only the fixed loads.
    let flag = |name: &str| std::env::args().any(|a| a == name);
    let loads = if flag("--same-session") {
        &loads[..0]
    } else if flag("--agent-pace") {
        &loads[..2]
    } else {
        &loads[..]
    };
    for &(pace, pause, compactions, keep_requests) in loads {
        let workload = Workload {
            name: String::new(),
            sessions: 50,
            compacting: 5,
            compactions,
            assemble_every: 4,
            pause,
            operations: None,
            keep_requests,
        };
        let provider = matches!(compactions, Compactions::Continuous).then_some(PROVIDER_DELAY);
        load(pace, workload, provider, rounds, samples)?;
    }
    if !flag("--agent-pace") {
        during_compaction(rounds, samples)?;
    }
    Ok(())
}

/// Sizes at the start of each round: every round starts from fresh sessions of these
/// sizes, so that rounds measure the same load (sessions that never compact would
/// otherwise grow, and their assemble answers with them).
const PROBE_RECORDS: usize = 300;
const COMPACTING_RECORDS: usize = 600;
const OTHER_RECORDS: usize = 100;

/// The probe's pause between an assemble and its next append. An agent's turns come
/// seconds apart; the probe goes faster to gather samples, but not back to back: its
/// samples then spread over 2.5 s of each round (rather than a few hundred ms, which one
/// burst of the shared host's noise can fill), idle and loaded alike, and each request
/// finds the daemon as a host's next turn does, its threads parked.
const PROBE_PAUSE: Duration = Duration::from_millis(10);

/// [`PROBE_PAUSE`], or the milliseconds of `--probe-pause=N` (0: back to back, as
/// until 2026-11-30).
fn probe_pause() -> Duration {
    std::env::args()
        .find_map(|a| a.strip_prefix("--probe-pause=").and_then(|ms| ms.parse().ok()))
        .map_or(PROBE_PAUSE, Duration::from_millis)
}

/// `--samples=FILE`: every probe pair is also appended to FILE, one line each (tab
/// separated: the load, the probe session, the pair's position in its window, append
/// ms, assemble ms, when the append was sent), for a look at where the slow ones fall;
/// each load's daemon log is copied to `FILE.<load>.log`.
fn samples_path() -> Option<String> {
    std::env::args().find_map(|a| a.strip_prefix("--samples=").map(str::to_owned))
}

/// The file of [`samples_path`], opened to append.
fn sample_log() -> anyhow::Result<Option<std::fs::File>> {
    let Some(path) = samples_path() else { return Ok(None) };
    let file =
        std::fs::OpenOptions::new().append(true).create(true).open(&path).with_context(|| format!("opening {path}"))?;
    Ok(Some(file))
}

/// Probe pairs in one idle or one loaded window; the windows alternate.
const WINDOW: usize = 50;

/// Quiet before an idle window, after the background's last answers.
const SETTLE: Duration = Duration::from_millis(50);

/// How long the provider of the agent-pace load takes per summary: short enough that
/// compactions are installed (not only started) while the probe measures.
const PROVIDER_DELAY: Duration = Duration::from_millis(250);

/// One daemon, `rounds` times: a probe session alone, then a second probe session of
/// the same size while the background load runs. With `provider`, compactions go to a
/// local Anthropic endpoint that answers after that delay; without, to the offline
/// summarizer.
fn load(
    pace: &str,
    mut workload: Workload,
    provider: Option<Duration>,
    rounds: usize,
    samples: usize,
) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("ctxd-load-").tempdir()?;
    let state = dir.path().join("state");
    if let Some(delay) = provider {
        let port = slow_provider(delay)?;
        let settings = json!({"provider": "anthropic", "baseUrl": format!("http://127.0.0.1:{port}"), "apiKeyEnv": "CTXD_BENCH_API_KEY"});
        let user = state.with_extension("home").join(".config/ctxd");
        std::fs::create_dir_all(&user)?;
        std::fs::write(user.join("settings.json"), settings.to_string())?;
    }
    // The daemon logs each append's steps (`ctxd::latency`), for the table of where the
    // probe's time went.
    let mux = Mux::start(
        &state,
        &[("CTXD_BENCH_API_KEY", "sk-bench-not-a-secret"), ("CTXD_LOG", "info,ctxd::latency=debug")],
    )?;
    let mut sample_log = sample_log()?;
    let mut idle = Latencies::default();
    let mut loaded = Latencies::default();
    let mut logs: Vec<SessionLog> = Vec::new();
    let (mut idle_wakes, mut loaded_wakes) = (Vec::new(), Vec::new());
    let (mut idle_pings, mut loaded_pings) = (Vec::new(), Vec::new());
    let (mut idle_syncs, mut loaded_syncs) = (Vec::new(), Vec::new());
    let (mut ops, mut compactions, mut loaded_secs, mut peak_rss) = (0u64, 0u64, 0.0, 0.0_f64);
    let mut summarizers = std::collections::BTreeMap::<String, u64>::new();
    for round in 0..rounds {
        workload.name = format!("r{round}");
        let seeded: Vec<Vec<String>> = (0..workload.sessions)
            .map(|i| {
                open_and_seed(
                    &mux,
                    &session_id(i, &workload),
                    if i < workload.compacting { COMPACTING_RECORDS } else { OTHER_RECORDS },
                )
            })
            .collect::<anyhow::Result<_>>()?;
        let mut alone = Probe::open(&mux, &format!("probe-idle-{round}"), workload.keep_requests)?;
        let mut busy = Probe::open(&mux, &format!("probe-loaded-{round}"), workload.keep_requests)?;
        let background = Background::start(&mux, &workload, seeded);
        background.pause();
        // Idle and loaded windows alternate, so that both see the same stretch of the
        // host's weather (on a shared VM its slow spells last seconds).
        let mut left = samples;
        while left > 0 {
            let window = left.min(WINDOW);
            left -= window;
            std::thread::sleep(SETTLE); // the daemon's own work after the last answers
            let (sampler, pinger) = (WakeSampler::start(), PingPong::start()?);
            alone.measure(&mux, window, &mut idle, &mut sample_log, pace)?;
            idle_wakes.extend(sampler.stop());
            idle_pings.extend(pinger.stop());
            idle_syncs.extend(file_syncs(dir.path(), window)?);

            background.resume();
            let started = Instant::now();
            // Every client under way again, and the compactions in flight.
            std::thread::sleep(workload.pause.max(Duration::from_millis(100)));
            let (sampler, pinger) = (WakeSampler::start(), PingPong::start()?);
            busy.measure(&mux, window, &mut loaded, &mut sample_log, pace)?;
            loaded_wakes.extend(sampler.stop());
            loaded_pings.extend(pinger.stop());
            loaded_syncs.extend(file_syncs(dir.path(), window)?);
            peak_rss = peak_rss.max(memory_mb(mux.pid(), "VmRSS:"));
            background.pause();
            loaded_secs += started.elapsed().as_secs_f64();
        }
        let done = background.stop()?;
        ops += done.iter().map(|l| l.appends + l.assembles).sum::<u64>();
        compactions += done.iter().map(|l| l.compactions).sum::<u64>();
        for (name, n) in done.iter().flat_map(|l| &l.summarizers) {
            *summarizers.entry(name.clone()).or_default() += n;
        }
        for id in done.iter().map(|l| l.id.clone()).chain([alone.id, busy.id]) {
            mux.request("ctx/closeSession", json!({"sessionId": id}))?;
        }
        logs.extend(done);
    }
    check_stored(&state, &logs)?;
    if let Some(path) = samples_path() {
        // The daemon's log beside the samples: its compactions, timed, to line up with them.
        let copy = format!("{path}.{}.log", pace.replace([' ', ','], "-"));
        std::fs::copy(state.with_extension("log"), &copy)
            .with_context(|| format!("copying the daemon's log to {copy}"))?;
    }

    let appended: usize = logs.iter().map(|l| l.appended.len()).sum();
    let how = match workload.compactions {
        Compactions::EveryAppends(n) => format!(
            "each after every {n} of its appends, never pausing; the others pausing {:?} between operations",
            workload.pause
        ),
        Compactions::Continuous => format!(
            "back to back on a second client each; every client pausing {:?} between operations",
            workload.pause
        ),
    };
    println!(
        "{pace}: {} sessions, {} of them compacting ({how}), one assemble in {}: {:.0} operations/s, {compactions} compactions {summarizers:?}",
        workload.sessions,
        workload.compacting,
        workload.assemble_every,
        ops as f64 / loaded_secs.max(1e-9),
    );
    println!(
        "  {:<22} {:>10} {:>10} {:>11} {:>11} {:>8} {:>8}",
        "probe session", "idle p50", "idle p99", "loaded p50", "loaded p99", "x p50", "x p99"
    );
    for (label, a, b) in
        [("ctx/append (durable)", &idle.append, &loaded.append), ("ctx/assemble", &idle.assemble, &loaded.assemble)]
    {
        let (a50, a99, b50, b99) = (pct(a, 50.0), pct(a, 99.0), pct(b, 50.0), pct(b, 99.0));
        println!(
            "  {label:<22} {a50:>8.2}ms {a99:>8.2}ms {b50:>9.2}ms {b99:>9.2}ms {:>7.1}x {:>7.1}x",
            b50 / a50,
            b99 / a99
        );
    }
    println!(
        "  {:<22} {:>8.2}ms {:>8.2}ms {:>9.2}ms {:>9.2}ms   (a thread sleeping 1 ms beside the probe: how late it woke)",
        "host wake-up lateness",
        pct(&idle_wakes, 50.0),
        pct(&idle_wakes, 99.0),
        pct(&loaded_wakes, 50.0),
        pct(&loaded_wakes, 99.0),
    );
    let controls = [
        (
            "pipe ping-pong",
            &idle_pings,
            &loaded_pings,
            "two threads of the benchmark echoing a byte over pipes, paced as the probe: no ctxd in it",
        ),
        (
            "file append + sync",
            &idle_syncs,
            &loaded_syncs,
            "the benchmark appending 1.1 KB to a file beside the store and syncing it, paced as the probe, after each window",
        ),
    ];
    for (label, a, b, what) in controls {
        let (a50, a99, b50, b99) = (pct(a, 50.0), pct(a, 99.0), pct(b, 50.0), pct(b, 99.0));
        println!(
            "  {label:<22} {a50:>8.2}ms {a99:>8.2}ms {b50:>9.2}ms {b99:>9.2}ms {:>7.1}x {:>7.1}x   ({what})",
            b50 / a50,
            b99 / a99
        );
    }
    println!(
        "  {appended} background records stored, none lost or out of order; daemon VmRSS under load up to {peak_rss:.1} MB, VmHWM {:.1} MB",
        memory_mb(mux.pid(), "VmHWM:")
    );
    let log = std::fs::read_to_string(state.with_extension("log"))?;
    print_steps(&log, Operation::Append, &idle, &loaded);
    print_steps(&log, Operation::Assemble, &idle, &loaded);
    Ok(())
}

/// The probe's two requests, as the daemon's `ctxd::latency` log names them.
#[derive(Clone, Copy)]
enum Operation {
    Append,
    Assemble,
}

impl Operation {
    /// The log line's message, the field of the step shown apart, and its label.
    fn log_names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Operation::Append => ("append steps", "write_sync", "  of it, write + sync"),
            Operation::Assemble => ("assemble steps", "build", "  of it, the build"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Operation::Append => "append",
            Operation::Assemble => "assemble",
        }
    }

    /// Each request's session, when it was sent and when the client's reader had its
    /// answer (Unix µs), and its latency (ms).
    fn measured(self, latencies: &Latencies) -> (&[Sent], &[f64]) {
        match self {
            Operation::Append => (&latencies.sent, &latencies.append),
            Operation::Assemble => (&latencies.assemble_sent, &latencies.assemble),
        }
    }
}

/// Splits each probe request's time, from the daemon's `ctxd::latency` log lined up
/// with the client's clock: on its way to the daemon (the client's write, the pipe, the
/// reader thread's wake-up), in the daemon (frame read to answer in hand), one step
/// within that (an append's write and `sync_data`, an assemble's building of the
/// request), and on its way back (the writer thread, the pipe, the client's reading
/// thread and the probe's wake-up; of that, the last part: from the reader having read
/// the answer to the probe's thread holding it).
fn print_steps(log: &str, operation: Operation, idle: &Latencies, loaded: &Latencies) {
    let (message, inner, inner_label) = operation.log_names();
    let mut steps: std::collections::HashMap<&str, Vec<[f64; 3]>> = std::collections::HashMap::new();
    for line in log.lines().filter(|l| l.contains("ctxd::latency") && l.contains(message)) {
        let field = |name: &str| ctxd_e2e::log_field(line, name);
        let number = |name: &str| field(name).and_then(|v| v.parse::<f64>().ok());
        if let (Some(session), Some(read), Some(inside), Some(step)) =
            (field("session"), number("read_unix_us"), number("in_daemon"), number(inner))
        {
            steps.entry(session.trim_matches('"')).or_default().push([read, inside, step]);
        }
    }
    // [to the daemon, in it, the inner step, back, of that the reader to the probe], in
    // ms, for each probe request.
    let split = |latencies: &Latencies| -> Option<[Vec<f64>; 5]> {
        let mut parts: [Vec<f64>; 5] = Default::default();
        let mut by_session: std::collections::HashMap<&str, Vec<(&Sent, f64)>> = std::collections::HashMap::new();
        let (sent, took) = operation.measured(latencies);
        for (sent, ms) in sent.iter().zip(took) {
            by_session.entry(&sent.session).or_default().push((sent, *ms));
        }
        for (session, sends) in by_session {
            // The session's seeding appends came first; its measured requests are the last.
            let logged = steps.get(session)?;
            let logged = &logged[logged.len().checked_sub(sends.len())?..];
            for ((sent, ms), [read, inside, step]) in sends.into_iter().zip(logged) {
                let to = (read - sent.at) / 1e3;
                parts[0].push(to);
                parts[1].push(inside / 1e3);
                parts[2].push(step / 1e3);
                parts[3].push(ms - to - inside / 1e3);
                parts[4].push(sent.at / 1e3 + ms - sent.answer_read / 1e3);
            }
        }
        Some(parts)
    };
    let name = operation.name();
    let (Some(a), Some(b)) = (split(idle), split(loaded)) else {
        return println!("  (the daemon's log does not have every probe {name}'s steps; no split)");
    };
    println!("  where a probe {name}'s time went: its steps, each at its own p50 and p99 (they do not add up)");
    let labels = ["to the daemon", "in the daemon", inner_label, "back to the client", "  of it, to the probe"];
    for (label, (a, b)) in labels.iter().zip(a.iter().zip(&b)) {
        let (a50, a99, b50, b99) = (pct(a, 50.0), pct(a, 99.0), pct(b, 50.0), pct(b, 99.0));
        println!(
            "  {label:<22} {a50:>8.2}ms {a99:>8.2}ms {b50:>9.2}ms {b99:>9.2}ms {:>7.1}x {:>7.1}x",
            b50 / a50,
            b99 / a99
        );
    }
}

fn memory_mb(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

#[derive(Default)]
struct Latencies {
    append: Vec<f64>,
    assemble: Vec<f64>,
    /// For each append: when it was sent.
    sent: Vec<Sent>,
    /// The same for each assemble.
    assemble_sent: Vec<Sent>,
}

/// A probe request's session, when it was sent, and when the client's reader thread
/// had read its answer (Unix µs; the probe's thread got it after that).
struct Sent {
    session: String,
    at: f64,
    answer_read: f64,
}

struct Probe {
    id: String,
    appended: Vec<String>,
    /// The request kept between assembles, when the probe asks `since` it.
    held: Option<HeldRequest>,
}

impl Probe {
    fn open(mux: &Mux, id: &str, keep_requests: bool) -> anyhow::Result<Probe> {
        Ok(Probe {
            id: id.to_owned(),
            appended: open_and_seed(mux, id, PROBE_RECORDS)?,
            held: keep_requests.then(HeldRequest::default),
        })
    }

    /// One append; its latency in ms and whether the session was compacting.
    fn append(&mut self, mux: &Mux) -> anyhow::Result<(f64, bool)> {
        let uuid = format!("{}-{:06}", self.id, self.appended.len());
        let record = filler(&uuid, self.appended.last().map(String::as_str), self.appended.len());
        let started = Instant::now();
        let result = mux.request("ctx/append", json!({"sessionId": self.id, "records": [record]}))?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        anyhow::ensure!(result["appended"] == 1, "probe append: {result}");
        self.appended.push(uuid);
        Ok((ms, result["usage"]["level"] == "compacting"))
    }

    /// `samples` appends and assembles, alternating, one request at a time, each pair
    /// after a pause of [`probe_pause`].
    /// With `log`, each pair is also written there as a line: `label`, the probe, the
    /// pair's position in its window, both latencies in ms, and when the append was
    /// sent (Unix seconds, to line it up with the daemon's log).
    fn measure(
        &mut self,
        mux: &Mux,
        samples: usize,
        into: &mut Latencies,
        log: &mut Option<std::fs::File>,
        label: &str,
    ) -> anyhow::Result<()> {
        let pause = probe_pause();
        for position in 0..samples {
            std::thread::sleep(pause);
            let uuid = format!("{}-{:06}", self.id, self.appended.len());
            let record = filler(&uuid, self.appended.last().map(String::as_str), self.appended.len());
            let (started, sent) = (Instant::now(), ctxd_e2e::load::unix_us());
            let (body, answer_read) =
                mux.request_body_timed("ctx/append", json!({"sessionId": self.id, "records": [record]}))?;
            into.append.push(started.elapsed().as_secs_f64() * 1e3);
            into.sent.push(Sent { session: self.id.clone(), at: sent, answer_read });
            let result = serde_json::from_slice::<serde_json::Value>(&body)?["result"].take();
            anyhow::ensure!(result["appended"] == 1, "probe append: {result}");
            self.appended.push(uuid.clone());
            // The clock stops when the answer is here, before the client reads it.
            let params = self.held.as_ref().map_or_else(|| assemble_params(&self.id), |h| h.params(&self.id));
            let (started, assemble_sent) = (Instant::now(), ctxd_e2e::load::unix_us());
            let (body, answer_read) = mux.request_body_timed("ctx/assemble", params)?;
            into.assemble.push(started.elapsed().as_secs_f64() * 1e3);
            into.assemble_sent.push(Sent { session: self.id.clone(), at: assemble_sent, answer_read });
            if let (Some(out), Some(append), Some(assemble)) = (log.as_mut(), into.append.last(), into.assemble.last())
            {
                let sent = sent / 1e6;
                writeln!(out, "{label}\t{}\t{position}\t{append:.3}\t{assemble:.3}\t{sent:.6}", self.id)?;
            }
            match &mut self.held {
                Some(held) => held.take(&body, Some(&uuid)).context("probe assemble")?,
                None => check_assembled(&body, Some(&uuid)).context("probe assemble")?,
            }
        }
        Ok(())
    }
}

/// How late a thread that sleeps 1 ms at a time wakes, sampled while a probe measures:
/// the floor the machine itself puts under every latency. On a shared virtual machine
/// its p99 can be several ms with nothing else running (the host runs other guests), and
/// a probe's p99 can then say more about the host than about the daemon.
struct WakeSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<f64>>,
}

impl WakeSampler {
    fn start() -> WakeSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut late = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let asked = Duration::from_millis(1);
                let started = Instant::now();
                std::thread::sleep(asked);
                late.push(started.elapsed().saturating_sub(asked).as_secs_f64() * 1e3);
            }
            late
        });
        WakeSampler { stop, thread }
    }

    fn stop(self) -> Vec<f64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// A control for the probe: one byte echoed between two threads of the benchmark over
/// a pair of pipes, paced as the probe is, beside it. Its round trip crosses two
/// hand-offs and no ctxd, so how it changes from idle to loaded (and with the pace) is
/// the machine's part of the probe's figures.
struct PingPong {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<f64>>,
}

impl PingPong {
    fn start() -> anyhow::Result<PingPong> {
        use std::io::Read;
        let (mut to_echo_rx, mut to_echo_tx) = std::io::pipe()?;
        let (mut back_rx, mut back_tx) = std::io::pipe()?;
        // The echo thread ends when the driver drops its end.
        std::thread::spawn(move || {
            let mut byte = [0u8; 1];
            while to_echo_rx.read_exact(&mut byte).is_ok() && back_tx.write_all(&byte).is_ok() {}
        });
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let pause = probe_pause();
        let thread = std::thread::spawn(move || {
            let mut rtt = Vec::new();
            let mut byte = [0u8; 1];
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(pause.max(Duration::from_micros(500)));
                let started = Instant::now();
                if to_echo_tx.write_all(b"x").is_err() || back_rx.read_exact(&mut byte).is_err() {
                    break;
                }
                rtt.push(started.elapsed().as_secs_f64() * 1e3);
            }
            rtt
        });
        Ok(PingPong { stop, thread })
    }

    fn stop(self) -> Vec<f64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// The disk's part of a durable append, as a control: `n` probe-sized lines appended to
/// a file beside the store and synced, paced as the probe, in ms each. It runs right
/// after a probe window, in the same state (idle or loaded), not beside the probe: its
/// syncs would share the file system's journal with the probe's.
fn file_syncs(dir: &std::path::Path, n: usize) -> anyhow::Result<Vec<f64>> {
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("control-sync.jsonl"))?;
    let line = [b"x".repeat(1100), b"\n".to_vec()].concat();
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        std::thread::sleep(probe_pause());
        let started = Instant::now();
        file.write_all(&line)?;
        file.sync_data()?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok(times)
}

fn pct(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut xs = xs.to_vec();
    xs.sort_by(|a, b| a.total_cmp(b));
    let i = ((p / 100.0) * (xs.len() - 1) as f64).round() as usize;
    xs[i.min(xs.len() - 1)]
}

/// How long the local provider takes to write a summary.
const SLOW_SUMMARY: Duration = Duration::from_millis(1500);

/// The client's pause between two appends (idle and compacting alike), so that the
/// samples spread over several compactions, their starts and installs included.
const APPEND_PAUSE: Duration = Duration::from_millis(20);

/// Appends to a session while that same session compacts (issue #7): idle appends first,
/// then appends while `ctx/compact` runs back to back on another thread.
fn during_compaction(rounds: usize, samples: usize) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("ctxd-load-").tempdir()?;
    let port = slow_provider(SLOW_SUMMARY)?;
    let project = dir.path().join("project");
    std::fs::create_dir_all(project.join(".ctxd"))?;
    let settings = json!({"provider": "anthropic", "baseUrl": format!("http://127.0.0.1:{port}"), "apiKeyEnv": "CTXD_BENCH_API_KEY"});
    std::fs::write(project.join(".ctxd/settings.json"), settings.to_string())?;
    let state = dir.path().join("state");
    ctxd_e2e::trust_folder(&state, &project)?;
    let mux = Mux::start(&state, &[("CTXD_BENCH_API_KEY", "sk-bench-not-a-secret")])?;
    let (mut idle, mut loaded) = (Vec::new(), Vec::new());
    let (mut outside, mut compactions) = (0usize, 0u64);
    for round in 0..rounds {
        let id = format!("same-{round}");
        mux.request("ctx/openSession", json!({"cwd": project, "model": ctxd_e2e::load::MODEL, "sessionId": id}))?;
        let mut probe = Probe { id: id.clone(), appended: Vec::new(), held: None };
        // Seeded through the same session so the ids chain.
        for chunk in 0..PROBE_RECORDS / 100 {
            let records: Vec<_> = (0..100)
                .map(|i| {
                    let uuid = format!("{id}-seed-{:05}", chunk * 100 + i);
                    let record = filler(&uuid, probe.appended.last().map(String::as_str), probe.appended.len());
                    probe.appended.push(uuid);
                    record
                })
                .collect();
            mux.request("ctx/append", json!({"sessionId": id, "records": records}))?;
        }
        for _ in 0..samples {
            let (ms, compacting) = probe.append(&mux)?;
            anyhow::ensure!(!compacting, "no compaction was started yet");
            idle.push(ms);
            std::thread::sleep(APPEND_PAUSE);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let compactor = {
            let (mux, stop, done, id) = (mux.clone(), stop.clone(), done.clone(), id.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                while !stop.load(Ordering::Relaxed) {
                    let result = mux.request("ctx/compact", json!({"sessionId": id}))?;
                    anyhow::ensure!(result["summarizer"] == "anthropic", "the provider wrote no summary: {result}");
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        };
        let mut counted = 0;
        while counted < samples {
            let (ms, compacting) = probe.append(&mux)?;
            if compacting {
                loaded.push(ms);
                counted += 1;
            } else {
                outside += 1; // between two compactions, or before the first began
            }
            std::thread::sleep(APPEND_PAUSE);
        }
        stop.store(true, Ordering::Relaxed);
        compactor.join().map_err(|_| anyhow::anyhow!("the compacting thread panicked"))??;
        compactions += done.load(Ordering::Relaxed);
        // Everything appended is stored, in order, after the compactions' records.
        let prefix = format!("{id}-");
        let stored: Vec<String> =
            ctxd_e2e::stored_uuids(&state, &id)?.into_iter().filter(|u| u.starts_with(&prefix)).collect();
        anyhow::ensure!(
            stored == probe.appended,
            "{id}: {} stored, {} appended (or out of order)",
            stored.len(),
            probe.appended.len()
        );
        mux.request("ctx/closeSession", json!({"sessionId": id}))?;
    }
    println!(
        "same session compacting: {PROBE_RECORDS} records, a provider that answers in {SLOW_SUMMARY:?}, `ctx/compact` back to back ({compactions} compactions), one append every {APPEND_PAUSE:?} ({outside} answered between two compactions, not counted)"
    );
    println!(
        "  {:<22} {:>10} {:>10} {:>11} {:>11} {:>8} {:>8}",
        "same session", "idle p50", "idle p99", "compact p50", "compact p99", "x p50", "x p99"
    );
    let (a50, a99, b50, b99) = (pct(&idle, 50.0), pct(&idle, 99.0), pct(&loaded, 50.0), pct(&loaded, 99.0));
    println!(
        "  {:<22} {a50:>8.2}ms {a99:>8.2}ms {b50:>9.2}ms {b99:>9.2}ms {:>7.1}x {:>7.1}x",
        "ctx/append (durable)",
        b50 / a50,
        b99 / a99
    );
    Ok(())
}

/// A local Anthropic Messages endpoint that answers every request with a streamed
/// summary after `delay`, a thread per connection.
fn slow_provider(delay: Duration) -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let text =
        "<analysis>draft</analysis><summary>1. Primary Request and Intent:\n   The benchmark's session.\n</summary>";
    let events = [
        json!({"type": "message_start", "message": {"id": "msg_bench", "type": "message", "role": "assistant", "model": "m", "content": [], "usage": {"input_tokens": 100, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 40}}),
        json!({"type": "message_stop"}),
    ];
    let body: String =
        events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or_default())).collect();
    let body = Arc::new(body);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let body = body.clone();
            std::thread::spawn(move || answer_after(stream, delay, &body));
        }
    });
    Ok(port)
}

/// Reads one HTTP request from `stream` and answers it with `body` after `delay`.
fn answer_after(mut stream: std::net::TcpStream, delay: Duration, body: &str) {
    let Ok(clone) = stream.try_clone() else { return };
    ctxd_e2e::read_http_request(&mut BufReader::new(clone));
    std::thread::sleep(delay);
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}
