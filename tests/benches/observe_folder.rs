//! Latency of a followed Claude Code project folder (`ctx/observe` with `projectDir`,
//! issue #37): with N transcripts in the folder, a turn appended to any of them (the
//! newest, or an older one the program resumes) until the `ctx/usageChanged` carrying
//! its usage; and a transcript cut back (an undo) or rewritten in place until the
//! figure it then holds. A measurement printed, never asserted.
//!
//! ```text
//! cargo build --release -p ctxd
//! cargo bench -p ctxd-e2e --bench observe_folder                       # 50 transcripts, 100 turns, 20 cuts
//! cargo bench -p ctxd-e2e --bench observe_folder -- --transcripts 50 --turns 100 --cuts 20
//! CTXD_BIN=target/debug/ctxd cargo bench -p ctxd-e2e --bench observe_folder   # another daemon binary
//! ```
//!
//! Each turn goes to the transcripts in turn (`i mod N`), so the first turns to the
//! older transcripts are also the first their follower sees (it is started then); their
//! times are printed apart from the later ones.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // bench code: a failed step is a failed run

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use ctxd_e2e::{Daemon, assistant_record, user_record};
use serde_json::{Value, json};

fn arg(name: &str, default: usize) -> anyhow::Result<usize> {
    let args: Vec<String> = std::env::args().collect();
    Ok(match args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)) {
        Some(v) => v.parse()?,
        None => default,
    })
}

fn observe_id(path: &Path) -> String {
    format!("observe-{:016x}", ctxd_core::ledger::fnv1a(path.as_os_str().as_encoded_bytes()))
}

fn append(path: &Path, records: &[Value]) -> anyhow::Result<()> {
    let mut text = String::new();
    for record in records {
        text.push_str(&format!("{record}\n"));
    }
    // One write, as the program appends a line.
    std::fs::OpenOptions::new().append(true).open(path)?.write_all(text.as_bytes())?;
    Ok(())
}

/// A transcript of `turns` turns, the last reporting `input` tokens.
fn transcript(turns: usize, input: u64) -> String {
    let mut text = String::new();
    for t in 0..turns {
        let (u, a) = (format!("u{t}"), format!("a{t}"));
        text.push_str(&format!("{}\n", user_record(&u, None, &"please look at this ".repeat(20))));
        let tokens = if t + 1 == turns { input } else { 10_000 + t as u64 };
        text.push_str(&format!("{}\n", assistant_record(&a, Some(&u), &format!("msg_{t}"), tokens, 100)));
    }
    text
}

fn summary(name: &str, times: &mut [f64]) {
    if times.is_empty() {
        return;
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name}: median {:.1} ms · p90 {:.1} · min {:.1} · max {:.1} · n {}",
        at(0.5),
        at(0.9),
        times[0],
        times[times.len() - 1],
        times.len()
    );
}

fn main() -> anyhow::Result<()> {
    let count = arg("--transcripts", 50)?;
    let turns = arg("--turns", 100)?;
    let cuts = arg("--cuts", 20)?;
    let bin = ctxd_e2e::ctxd_bin();
    anyhow::ensure!(bin.exists(), "{} missing: cargo build --release -p ctxd", bin.display());
    println!(
        "observe a project folder: {count} transcripts · {turns} turns · {cuts} cuts and rewrites · {} cores · {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        bin.display()
    );

    let dir = tempfile::tempdir()?;
    let folder = dir.path().join("-proj");
    std::fs::create_dir_all(&folder)?;
    // Oldest first: transcript 0 is dated furthest back, the last one is the newest.
    let paths: Vec<PathBuf> = (0..count).map(|i| folder.join(format!("session-{i:03}.jsonl"))).collect();
    for (i, path) in paths.iter().enumerate() {
        std::fs::write(path, transcript(20, 30_000))?;
        let age = Duration::from_secs(60 * (count - i) as u64);
        std::fs::File::options().append(true).open(path)?.set_modified(SystemTime::now() - age)?;
    }
    let mut daemon = Daemon::start_with(&dir.path().join("state"), &[], &[("CTXD_LOG", "info")])?;
    daemon.initialize()?;
    let observed = daemon.request("ctx/observe", json!({"projectDir": folder}))?;
    anyhow::ensure!(observed["sessionId"] == observe_id(&paths[count - 1]), "{observed}");

    // Turns, to each transcript in turn.
    let (mut first, mut later) = (Vec::new(), Vec::new());
    for t in 0..turns {
        let path = &paths[t % count];
        let id = observe_id(path);
        let input = 100_000 + t as u64 * 7;
        let started = Instant::now();
        append(
            path,
            &[
                user_record(&format!("t{t}"), None, "next"),
                assistant_record(&format!("ta{t}"), None, &format!("msg_t{t}"), input, 1),
            ],
        )?;
        daemon.wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == id.as_str() && p["usage"]["reportedTokens"] == input + 1
        })?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        if t < count {
            first.push(ms)
        } else {
            later.push(ms)
        }
        daemon.backlog.clear();
    }
    let mut all: Vec<f64> = first.iter().chain(&later).copied().collect();
    summary("turn appended, any transcript", &mut all);
    summary("  the first to a transcript (its follower starts)", &mut first);
    summary("  later turns", &mut later);

    // Cut back (as an undo does) and rewritten in place (same length, other figures).
    let (mut cut, mut rewritten) = (Vec::new(), Vec::new());
    for c in 0..cuts {
        let path = &paths[c % count];
        let id = observe_id(path);
        let before = std::fs::metadata(path)?.len();
        append(path, &[assistant_record(&format!("x{c}"), None, &format!("msg_x{c}"), 400_000 + c as u64, 0)])?;
        daemon.wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == id.as_str() && p["usage"]["reportedTokens"] == 400_000 + c as u64
        })?;
        // Back to what it was: the figure of its last turn before.
        let text = std::fs::read_to_string(path)?;
        let (input, output) = text[..before as usize]
            .lines()
            .rev()
            .find_map(|l| {
                let v: Value = serde_json::from_str(l).ok()?;
                let u = &v["message"]["usage"];
                Some((u["input_tokens"].as_u64()?, u["output_tokens"].as_u64()?))
            })
            .unwrap();
        let started = Instant::now();
        std::fs::OpenOptions::new().write(true).open(path)?.set_len(before)?;
        daemon.wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == id.as_str() && p["usage"]["reportedTokens"] == input + output
        })?;
        cut.push(started.elapsed().as_secs_f64() * 1e3);
        // The same length, the last figure changed (as many digits).
        let text = std::fs::read_to_string(path)?;
        let (old, new) = (format!("\"input_tokens\":{input}"), format!("\"input_tokens\":{}", input + 9));
        let at = text.rfind(&old).unwrap();
        let changed = format!("{}{}{}", &text[..at], new, &text[at + old.len()..]);
        anyhow::ensure!(changed.len() == text.len(), "the rewrite keeps the length");
        let started = Instant::now();
        std::fs::write(path, changed)?;
        daemon.wait_notification("ctx/usageChanged", |p| {
            p["sessionId"] == id.as_str() && p["usage"]["reportedTokens"] == input + output + 9
        })?;
        rewritten.push(started.elapsed().as_secs_f64() * 1e3);
        daemon.backlog.clear();
    }
    summary("cut back (undo) until the figure before", &mut cut);
    summary("rewritten in place until its new figure", &mut rewritten);
    Ok(())
}
