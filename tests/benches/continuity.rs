//! Continuity and cost: generated sessions replayed through the release daemon as a
//! host drives it, with a small window, so they compact many times.
//!
//! Each session (`ctxd_gen`, 80 turns) is replayed with a 100,000-token window: every
//! model call is a `ctx/assemble` with `since` (the host keeps its copy of the
//! messages), and every reply is appended as the assistant record with the usage a
//! provider would report for the request just assembled: its size, and what the
//! prompt-cache simulation ([`ctxd_e2e::cache`]) says was read from the cache and
//! written to it. The project's `CLAUDE.md` gets a second instruction a third of the
//! way through; half-way, the user compacts by hand with a focus. The offline
//! summarizer writes every summary.
//!
//! Printed per session and in total:
//! - **user messages**: after every compaction, of the prompts so far, how many the
//!   next request shows (whole or cut with its own marker) and how many it counts in
//!   a "[… N more user messages cut …]" marker; any other is lost;
//! - **instructions**: compactions after which every `CLAUDE.md` instruction written so
//!   far is still in the request;
//! - **files**: of the files read or changed before a compaction, how many the next
//!   request names, and how many come back with their content; of those touched in the
//!   10 turns before it, and of those touched since the previous compaction, how many
//!   the next request names and how many its summary names;
//! - **summary sizes** and **tokens after each compaction ÷ threshold** (median, p95,
//!   max);
//! - **needless compactions**: started while the request the host would really send
//!   (the last assembled request plus what was appended since) was under the threshold;
//! - **cache bill** of every request, in units of one uncached input token: as ctxd
//!   marks it, a naive client's (the same requests with only the host's system-prompt
//!   breakpoint), and no caching;
//! - **fork cache reads**: for each automatic compaction, the share of the parent
//!   request (the last one the host sent) that the cache-sharing fork built from it by
//!   ctxd's own `fork_request` reads from the cache, with the default (parent's
//!   `tool_choice` kept) and with `tool_choice: none`;
//! - **forks sent over HTTP**: the same sessions again with a local stand-in for the
//!   Anthropic API writing the summaries (its canned summary makes this pass useless
//!   for continuity, so only the forks are measured): each fork body as the daemon sent
//!   it, priced right after the host's requests, and the share of the request it forks
//!   (the fork without its instruction) it read from the cache. A fork prepared ahead
//!   goes out before the host's next request; priced after it here, it can only find
//!   entries that request wrote past the newest answered one, which a fork of exactly
//!   an answered request never reaches, so the figure is the one it met when sent.
//!
//! ```text
//! cargo build --release -p ctxd && cargo bench -p ctxd-e2e --bench continuity
//! cargo bench -p ctxd-e2e --bench continuity -- --quick
//! CONTINUITY_DEBUG=1 cargo bench -p ctxd-e2e --bench continuity -- --quick   # each compaction, each message not shown
//! CONTINUITY_SEEDS=1,8 cargo bench -p ctxd-e2e --bench continuity               # only these sessions
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::collections::BTreeSet;
use std::path::Path;

use ctxd_core::compact::{ForkOptions, ForkStyle, PromptSpec, ToolRefusal, fork_request, summary_instruction};
use ctxd_e2e::Daemon;
use ctxd_e2e::cache::{PromptCache, fork_read_share};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5-20250929";
const WINDOW: u64 = 100_000;
/// Turns per session (`CONTINUITY_TURNS` for longer ones).
const TURNS: usize = 80;
/// Turns before a compaction whose files the recent-files figure counts.
const RECENT_TURNS: usize = 10;
const MARKER_OPEN: &str = "[… ";
/// The first heading of an installed summary.
const SUMMARY_START: &str = "1. Primary Request and Intent:";

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let mut seeds: Vec<u64> = if quick { vec![1, 2] } else { (1..=8).collect() };
    // CONTINUITY_TURNS=400 replays longer sessions, which compact many times.
    let turns: usize = std::env::var("CONTINUITY_TURNS").ok().and_then(|t| t.parse().ok()).unwrap_or(TURNS);
    // CONTINUITY_SEEDS=1,8 replays only those sessions (to trace one compaction).
    if let Ok(only) = std::env::var("CONTINUITY_SEEDS") {
        seeds = only.split(',').filter_map(|s| s.trim().parse().ok()).collect();
    }
    let bin = ctxd_e2e::ctxd_bin();
    anyhow::ensure!(bin.exists(), "{} missing: cargo build --release -p ctxd", bin.display());
    println!(
        "continuity and cost · binary {} · {} sessions of {turns} turns · window {WINDOW} · offline summarizer",
        bin.display(),
        seeds.len()
    );
    let mut total = Report::default();
    for &seed in &seeds {
        let report = replay(seed, turns, false)?;
        report.print(&format!("session seed {seed}"));
        total.merge(report);
    }
    total.print("all sessions");
    // The forks the daemon really sends, to a local stand-in for the provider, priced
    // against the requests the host sent before them.
    let mut forks = Report::default();
    for &seed in &seeds {
        forks.merge(replay(seed, turns, true)?);
    }
    println!(
        "\nforks sent over HTTP (provider stand-in, same sessions): {} automatic after a model call, share of the request each forks read from cache: min {:.3}, median {:.3}; {} compactions with no model call since the previous one",
        forks.sent_fork_share.len(),
        percentile(&forks.sent_fork_share, 0.0),
        percentile(&forks.sent_fork_share, 0.5),
        forks.back_to_back
    );
    Ok(())
}

/// What one replay measured.
#[derive(Debug, Default)]
struct Report {
    compactions: usize,
    auto: usize,
    /// Over all compactions: prompts so far, shown, counted in a marker.
    prompts: usize,
    shown: usize,
    counted: usize,
    instructions_ok: usize,
    files: usize,
    named: usize,
    restored: usize,
    /// Files touched in the last [`RECENT_TURNS`] turns before a compaction: how many,
    /// named in the next request, named in its summary.
    recent: usize,
    recent_named: usize,
    recent_in_summary: usize,
    /// Files touched since the previous compaction: how many, named in the summary.
    since: usize,
    since_in_summary: usize,
    summary_tokens: Vec<u64>,
    after_ratio: Vec<f64>,
    needless: usize,
    /// Compactions with no model call since the previous one.
    back_to_back: usize,
    requests: usize,
    cost_ctxd: f64,
    cost_naive: f64,
    cost_none: f64,
    /// Model calls whose assemble answered `compact`: the host waited for the
    /// compaction and sent the request assembled after it.
    compact_decisions: usize,
    fork_share: Vec<f64>,
    fork_share_none: Vec<f64>,
    /// Forks the daemon sent (provider mode): share of the request it forks read from cache.
    sent_fork_share: Vec<f64>,
}

fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    let at = ((xs.len() as f64 - 1.0) * p).round() as usize;
    xs[at]
}

impl Report {
    fn merge(&mut self, o: Report) {
        self.compactions += o.compactions;
        self.auto += o.auto;
        self.prompts += o.prompts;
        self.shown += o.shown;
        self.counted += o.counted;
        self.instructions_ok += o.instructions_ok;
        self.files += o.files;
        self.named += o.named;
        self.restored += o.restored;
        self.recent += o.recent;
        self.recent_named += o.recent_named;
        self.recent_in_summary += o.recent_in_summary;
        self.since += o.since;
        self.since_in_summary += o.since_in_summary;
        self.summary_tokens.extend(o.summary_tokens);
        self.after_ratio.extend(o.after_ratio);
        self.needless += o.needless;
        self.back_to_back += o.back_to_back;
        self.requests += o.requests;
        self.cost_ctxd += o.cost_ctxd;
        self.cost_naive += o.cost_naive;
        self.cost_none += o.cost_none;
        self.compact_decisions += o.compact_decisions;
        self.fork_share.extend(o.fork_share);
        self.fork_share_none.extend(o.fork_share_none);
        self.sent_fork_share.extend(o.sent_fork_share);
    }

    fn print(&self, name: &str) {
        let sizes: Vec<f64> = self.summary_tokens.iter().map(|&t| t as f64).collect();
        println!("\n{name}: {} compactions ({} automatic), {} requests", self.compactions, self.auto, self.requests);
        println!(
            "  user messages after each compaction: {} of {} shown, {} counted in a marker, {} lost",
            self.shown,
            self.prompts,
            self.counted,
            self.prompts - self.shown - self.counted
        );
        println!(
            "  CLAUDE.md instructions all present after {} of {} compactions",
            self.instructions_ok, self.compactions
        );
        println!(
            "  files read or changed before a compaction: {} — named after it {}, content restored {}",
            self.files, self.named, self.restored
        );
        println!(
            "  files touched in the {RECENT_TURNS} turns before a compaction: {} — named after it {} ({:.1} %), in the summary {}",
            self.recent,
            self.recent_named,
            100.0 * self.recent_named as f64 / self.recent.max(1) as f64,
            self.recent_in_summary
        );
        println!(
            "  files touched since the previous compaction: {} — in the summary {} ({:.1} %)",
            self.since,
            self.since_in_summary,
            100.0 * self.since_in_summary as f64 / self.since.max(1) as f64
        );
        println!(
            "  summary tokens: median {:.0}, p95 {:.0}, max {:.0}",
            percentile(&sizes, 0.5),
            percentile(&sizes, 0.95),
            percentile(&sizes, 1.0)
        );
        println!(
            "  request after a compaction ÷ threshold: median {:.2}, p95 {:.2}, max {:.2}",
            percentile(&self.after_ratio, 0.5),
            percentile(&self.after_ratio, 0.95),
            percentile(&self.after_ratio, 1.0)
        );
        println!(
            "  needless compactions (the real request was under the threshold): {}; with no model call since the previous one: {}",
            self.needless, self.back_to_back
        );
        println!(
            "  cache bill (uncached-input-token units): ctxd {:.0}, naive client {:.0} ({:.2}x), no caching {:.0} ({:.2}x); requests held back for the compaction their assemble started: {}",
            self.cost_ctxd,
            self.cost_naive,
            self.cost_naive / self.cost_ctxd.max(1.0),
            self.cost_none,
            self.cost_none / self.cost_ctxd.max(1.0),
            self.compact_decisions
        );
        println!(
            "  automatic forks reading their parent from cache: min {:.3}, median {:.3} (with tool_choice none: median {:.3}) over {}",
            percentile(&self.fork_share, 0.0),
            percentile(&self.fork_share, 0.5),
            percentile(&self.fork_share_none, 0.5),
            self.fork_share.len()
        );
    }
}

/// The host's own system prompt and tools (about 9,000 tokens), its breakpoint on the
/// last system block, as a coding agent sends them.
fn host_blocks() -> Value {
    let words = "Follow the conventions of the repository, keep changes small and tested. ";
    let tools: Vec<Value> = ["Read", "Edit", "Write", "Bash", "Grep", "Glob"]
        .iter()
        .map(|name| {
            json!({"name": name, "description": words.repeat(60), "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}})
        })
        .collect();
    json!({
        "system": [
            {"type": "text", "text": "You are a coding agent working in a terminal."},
            {"type": "text", "text": words.repeat(160), "cache_control": {"type": "ephemeral"}}
        ],
        "tools": tools,
        "maxTokens": 32000
    })
}

/// The request as the provider gets it: the answer's, with the host's kept messages
/// in front of those sent.
fn full_request(answer: &Value, kept: &mut Vec<Value>) -> Value {
    let mut request = answer["request"].clone();
    let from = answer["messagesFrom"].as_u64().unwrap_or(0) as usize;
    let sent = request["messages"].as_array().cloned().unwrap_or_default();
    kept.truncate(from);
    kept.extend(sent);
    request["messages"] = Value::Array(kept.clone());
    request
}

fn tokens_of(value: &Value) -> u64 {
    (value.to_string().len() as u64).div_ceil(4)
}

/// Every string in a value, one per line (the text a reader of the request sees).
fn texts(value: &Value, out: &mut String) {
    match value {
        Value::String(s) => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|v| texts(v, out)),
        Value::Object(map) => map.values().for_each(|v| texts(v, out)),
        _ => {}
    }
}

/// The request with only the host's system breakpoint: a client that caches its static
/// prefix and nothing of the conversation.
fn naive(request: &Value) -> Value {
    let mut copy = request.clone();
    fn strip(v: &mut Value) {
        match v {
            Value::Object(map) => {
                map.remove("cache_control");
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    if let Some(messages) = copy.get_mut("messages") {
        strip(messages);
    }
    if let Some(tools) = copy.get_mut("tools") {
        strip(tools);
    }
    copy
}

/// A prompt is shown when its first 60 characters (or all of it) are in the text; a
/// cut one keeps at least that much of its head.
fn shown(text: &str, prompt: &str) -> bool {
    let head: String = prompt.chars().take(60).collect();
    text.contains(&head)
}

/// Counts of "[… N more user messages cut …]" markers in a text.
fn counted(text: &str) -> usize {
    text.match_indices(MARKER_OPEN)
        .filter_map(|(i, _)| {
            let rest = &text[i + MARKER_OPEN.len()..];
            let (number, rest) = rest.split_once(' ')?;
            rest.starts_with("more user message").then(|| number.replace(',', "").parse::<usize>().ok())?
        })
        .sum()
}

fn is_prompt(record: &Value) -> bool {
    record["type"] == "user" && record["message"]["content"].is_string()
}

struct Host {
    daemon: Daemon,
    id: String,
    revision: Option<Value>,
    kept: Vec<Value>,
    threshold: u64,
    /// The last request sent, and what was appended after it (estimated tokens).
    last_request: Option<Value>,
    appended_since: u64,
    cache: PromptCache,
    naive_cache: PromptCache,
    /// Clock of the last request sent.
    last_now: u64,
    /// Model calls since the latest compaction.
    requests_since_compaction: usize,
}

impl Host {
    /// The request to send, and the answer's `decision` and `usage`.
    fn assemble(&mut self) -> anyhow::Result<(Value, Value)> {
        let mut params = host_blocks();
        params["sessionId"] = json!(self.id);
        if let Some(revision) = &self.revision {
            params["since"] = revision.clone();
        }
        let answer = self.daemon.request("ctx/assemble", params)?;
        self.revision = Some(answer["revision"].clone());
        let request = full_request(&answer, &mut self.kept);
        Ok((request, json!({"decision": answer["decision"], "usage": answer["usage"]})))
    }

    fn append(&mut self, records: &[Value]) -> anyhow::Result<Value> {
        let usage =
            self.daemon.request("ctx/append", json!({"sessionId": self.id, "records": records}))?["usage"].clone();
        self.appended_since += records.iter().map(tokens_of).sum::<u64>();
        Ok(usage)
    }
}

/// A summary in the nine-section shape, the provider stand-in's only answer.
fn stub_summary(_: &str) -> (u16, String) {
    let sections: String = [
        "Primary Request and Intent",
        "Key Technical Concepts",
        "Files and Code Sections",
        "Errors and fixes",
        "Problem Solving",
        "All user messages",
        "Pending Tasks",
        "Current Work",
        "Optional Next Step",
    ]
    .iter()
    .enumerate()
    .map(|(i, title)| format!("{}. {title}:\n   - (written by the stand-in)\n", i + 1))
    .collect();
    ctxd_e2e::stub::sse_text(&format!("<summary>\n{sections}</summary>"))
}

/// Replays one session; with `provider`, a local stand-in for the Anthropic API writes
/// the summaries (through the cache-sharing fork), and only the forks are measured.
fn replay(seed: u64, turns: usize, provider: bool) -> anyhow::Result<Report> {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let cwd = dir.path().join("project");
    std::fs::create_dir_all(&cwd)?;
    let cwd_text = cwd.display().to_string();
    let opts = ctxd_gen::Options {
        seed,
        cwd: cwd_text.clone(),
        files_dir: Some(cwd.clone()),
        model: MODEL.to_owned(),
        ..ctxd_gen::Options::turns(turns)
    };
    let records: Vec<Value> = ctxd_gen::jsonl(&opts).lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let mut instructions = vec!["INSTRUCTION-ALPHA: run the formatter before every commit."];
    std::fs::write(cwd.join("CLAUDE.md"), format!("# Project\n\n- {}\n", instructions[0]))?;
    ctxd_e2e::trust_folder(&state, &cwd)?;
    let mut env = vec![("CTXD_LOG", "warn")];
    let seen = if provider {
        let (port, seen) = ctxd_e2e::stub::serve(stub_summary);
        std::fs::create_dir_all(cwd.join(".ctxd"))?;
        let settings = json!({"provider": "anthropic", "baseUrl": format!("http://127.0.0.1:{port}"), "apiKeyEnv": "CTXD_BENCH_API_KEY"});
        std::fs::write(cwd.join(".ctxd/settings.json"), settings.to_string())?;
        env.push(("CTXD_BENCH_API_KEY", "sk-bench-not-a-key"));
        Some(seen)
    } else {
        None
    };
    let mut daemon = Daemon::start_with(&state, &[], &env)?;
    daemon.initialize()?;
    daemon.request("ctx/setAutoCompactWindow", json!({"model": MODEL, "window": WINDOW}))?;
    let id = format!("continuity-{seed}");
    let opened = daemon.request("ctx/openSession", json!({"cwd": cwd_text, "model": MODEL, "sessionId": id}))?;
    let threshold = opened["usage"]["threshold"].as_u64().unwrap_or(67_000);
    let mut host = Host {
        daemon,
        id,
        revision: None,
        kept: Vec::new(),
        threshold,
        last_request: None,
        appended_since: 0,
        cache: PromptCache::default(),
        naive_cache: PromptCache::default(),
        last_now: 0,
        requests_since_compaction: 0,
    };
    let mut report = Report::default();
    let mut prompts: Vec<String> = Vec::new();
    let mut files = Touched::default();
    let mut turn = 0usize;
    let mut message_seen: BTreeSet<String> = BTreeSet::new();
    for record in &records {
        if is_prompt(record) {
            turn += 1;
            if turn == turns / 3 {
                instructions.push("INSTRUCTION-BETA: never push to main directly.");
                let text: String = instructions.iter().map(|i| format!("- {i}\n")).collect();
                std::fs::write(cwd.join("CLAUDE.md"), format!("# Project\n\n{text}"))?;
            }
            if turn == turns / 2 {
                let answer = host.daemon.request(
                    "ctx/compact",
                    json!({"sessionId": host.id, "instructions": "focus on the parser and the ledger"}),
                )?;
                let summarizer = if provider { "anthropic" } else { "offline" };
                anyhow::ensure!(answer["summarizer"] == summarizer, "{answer}");
                host.daemon.drain_notifications("ctx/compacted");
                if let Some(seen) = &seen {
                    seen.lock().unwrap().clear();
                }
                let context = Context { prompts: &prompts, files: &files, instructions: &instructions, turn };
                after_compaction(&mut host, &mut report, &context, false)?;
                files.compacted();
            }
            prompts.push(record["message"]["content"].as_str().unwrap_or("").to_owned());
        }
        let mut record = record.clone();
        if record["type"] == "assistant" {
            // A model call: the host assembles, sends, and appends the reply with the
            // usage the provider reports for that request.
            let message_id = record["message"]["id"].as_str().unwrap_or("").to_owned();
            if message_seen.insert(message_id) {
                let (mut request, decision) = host.assemble()?;
                if decision["decision"] == "compact" {
                    report.compact_decisions += 1;
                    // The answer started a compaction: a host sends nothing yet, waits for
                    // it, and assembles again.
                    let compacted =
                        host.daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == json!(host.id))?;
                    let real = tokens_of(&request);
                    let estimated = decision["usage"]["tokens"].as_u64().unwrap_or(0);
                    let context = Context { prompts: &prompts, files: &files, instructions: &instructions, turn };
                    let compaction = Compaction { compacted: &compacted, real, estimated, turn };
                    on_compacted(&mut host, &mut report, seen.as_ref(), &context, compaction)?;
                    files.compacted();
                    request = host.assemble()?.0;
                }
                let now = record["timestamp"].as_str().and_then(ctxd_gen::time::parse_ms).unwrap_or(0).max(0) as u64;
                let bill = host.cache.send(&request, now);
                host.last_now = now;
                host.requests_since_compaction += 1;
                report.cost_ctxd += bill.cost;
                report.cost_none += bill.uncached_cost();
                report.cost_naive += host.naive_cache.send(&naive(&request), now).cost;
                report.requests += 1;
                let written = bill.written_5m + bill.written_1h;
                record["message"]["usage"] = json!({
                    "input_tokens": bill.input - bill.read - written,
                    "cache_read_input_tokens": bill.read,
                    "cache_creation_input_tokens": written,
                    "output_tokens": tokens_of(&record["message"]["content"]),
                });
                host.last_request = Some(request);
                host.appended_since = 0;
            }
            for block in record["message"]["content"].as_array().into_iter().flatten() {
                if let Some(path) = block["input"]["file_path"].as_str() {
                    files.touch(turn, path);
                }
            }
        }
        let real_before = host.last_request.as_ref().map_or(0, tokens_of) + host.appended_since;
        let usage = host.append(std::slice::from_ref(&record))?;
        let real = real_before + tokens_of(&record);
        let mut done = host.daemon.drain_notifications("ctx/compacted");
        if usage["level"] == "compacting" && done.is_empty() {
            done.push(host.daemon.wait_notification("ctx/compacted", |p| p["sessionId"] == json!(host.id))?);
        }
        if let Some(compacted) = done.first() {
            let estimated = usage["tokens"].as_u64().unwrap_or(0);
            let context = Context { prompts: &prompts, files: &files, instructions: &instructions, turn };
            on_compacted(
                &mut host,
                &mut report,
                seen.as_ref(),
                &context,
                Compaction { compacted, real, estimated, turn },
            )?;
            files.compacted();
        }
    }
    host.daemon.stop()?;
    Ok(report)
}

/// What the checks after a compaction read: the prompts, files and CLAUDE.md
/// instructions so far, and the turn.
struct Context<'a> {
    prompts: &'a [String],
    files: &'a Touched,
    instructions: &'a [&'a str],
    turn: usize,
}

/// The files the session's tool calls named (`file_path`), in order, with their turn.
#[derive(Default)]
struct Touched {
    calls: Vec<(usize, String)>,
    /// Calls before the latest compaction.
    compacted_at: usize,
}

impl Touched {
    fn touch(&mut self, turn: usize, path: &str) {
        self.calls.push((turn, path.to_owned()));
    }

    fn compacted(&mut self) {
        self.compacted_at = self.calls.len();
    }

    fn all(&self) -> BTreeSet<String> {
        self.calls.iter().map(|(_, p)| p.clone()).collect()
    }

    /// Touched in the `n` turns up to `turn`.
    fn recent(&self, turn: usize, n: usize) -> BTreeSet<String> {
        self.calls.iter().filter(|(t, _)| t + n > turn).map(|(_, p)| p.clone()).collect()
    }

    fn since_compaction(&self) -> BTreeSet<String> {
        self.calls[self.compacted_at..].iter().map(|(_, p)| p.clone()).collect()
    }
}

/// One automatic compaction as the host saw it: the notification, the real size of the
/// request it would have sent, the daemon's estimate of it, and the turn.
struct Compaction<'a> {
    compacted: &'a Value,
    real: u64,
    estimated: u64,
    turn: usize,
}

/// Checks and prices an automatic compaction: whether it was needed, the fork it sent
/// (provider mode) or would send, then the request right after it.
fn on_compacted(
    host: &mut Host,
    report: &mut Report,
    seen: Option<&ctxd_e2e::stub::Seen>,
    context: &Context<'_>,
    Compaction { compacted, real, estimated, turn }: Compaction<'_>,
) -> anyhow::Result<()> {
    if std::env::var_os("CONTINUITY_DEBUG").is_some() {
        println!("  turn {turn}: {compacted}");
    }
    if real < host.threshold {
        report.needless += 1;
    }
    if host.requests_since_compaction == 0 {
        report.back_to_back += 1;
    }
    if std::env::var_os("CONTINUITY_DEBUG").is_some() {
        println!("  real request {real}, estimated {estimated}, threshold {}", host.threshold);
    }
    // The fork ctxd would send for this compaction, from the request the host
    // just sent.
    if let Some(seen) = seen {
        // The fork as sent, after the requests the host sent before it.
        let bodies: Vec<Value> =
            seen.lock().unwrap().drain(..).filter_map(|(_, body)| serde_json::from_str::<Value>(&body).ok()).collect();
        let fork = bodies.iter().find(|b| b["tools"].as_array().is_some_and(|t| !t.is_empty()));
        // Only a fork made after a model call since the previous compaction.
        let last = host.last_request.as_ref().filter(|_| host.requests_since_compaction > 0);
        if let (Some(fork), Some(last)) = (fork, last) {
            let bill = host.cache.send(fork, host.last_now + 1_000);
            // Of the request it forks: the fork without its instruction (its last
            // block), as the cache counts blocks.
            let instruction = fork["messages"]
                .as_array()
                .and_then(|m| m.last())
                .and_then(|m| m["content"].as_array())
                .and_then(|c| c.last())
                .map_or(0, |block| (block.to_string().len() as u64).div_ceil(4));
            let parent_input = bill.input - instruction;
            report.sent_fork_share.push(bill.read as f64 / parent_input.max(1) as f64);
            if std::env::var_os("CONTINUITY_DEBUG").is_some() {
                println!(
                    "  fork sent: read {:.3} of the request it forks ({parent_input} tokens; the host's last {}); against the host's last: {}",
                    bill.read as f64 / parent_input.max(1) as f64,
                    PromptCache::default().send(last, 0).input,
                    divergence(last, fork)
                );
            }
        }
    } else if let Some(parent) = host.last_request.clone() {
        let instruction = summary_instruction(&PromptSpec::full());
        for (refusal, shares) in [
            (ToolRefusal::KeepParentToolChoice, &mut report.fork_share),
            (ToolRefusal::ToolChoiceNone, &mut report.fork_share_none),
        ] {
            let options = ForkOptions { style: ForkStyle::AppendToLastUser, tool_refusal: refusal };
            let fork = fork_request(&parent, &instruction, options)?;
            shares.push(fork_read_share(&parent, &fork.body));
        }
    }
    after_compaction(host, report, context, true)?;
    host.requests_since_compaction = 0;
    Ok(())
}

/// Where `fork` stops repeating `parent` block for block (markers aside): for the
/// per-compaction detail.
fn divergence(parent: &Value, fork: &Value) -> String {
    fn blocks(body: &Value) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for (m, message) in body["messages"].as_array().into_iter().flatten().enumerate() {
            for block in message["content"].as_array().into_iter().flatten() {
                let mut block = block.clone();
                if let Some(object) = block.as_object_mut() {
                    object.remove("cache_control");
                }
                out.push((m, format!("{}:{block}", message["role"])));
            }
        }
        out
    }
    let (p, f) = (blocks(parent), blocks(fork));
    let same = p.iter().zip(&f).take_while(|(a, b)| a == b).count();
    let show = |b: Option<&(usize, String)>| {
        b.map_or("none".to_owned(), |(m, t)| format!("message {m}: {}", t.chars().take(160).collect::<String>()))
    };
    format!(
        "parent {} blocks, fork {} blocks, the same for {same}; parent then {}; fork then {}",
        p.len(),
        f.len(),
        show(p.get(same)),
        show(f.get(same))
    )
}

/// Checks the request right after a compaction.
fn after_compaction(host: &mut Host, report: &mut Report, context: &Context<'_>, auto: bool) -> anyhow::Result<()> {
    let (prompts, instructions) = (context.prompts, context.instructions);
    let files = context.files.all();
    report.compactions += 1;
    report.auto += usize::from(auto);
    let (request, _) = host.assemble()?;
    let mut text = String::new();
    texts(&request, &mut text);
    report.after_ratio.push(tokens_of(&request) as f64 / host.threshold as f64);
    let summary = request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let mut t = String::new();
            texts(&m["content"], &mut t);
            t
        })
        .find(|t| t.contains(SUMMARY_START))
        .unwrap_or_default();
    report.summary_tokens.push((summary.len() as u64).div_ceil(4));
    let shown_now = prompts.iter().filter(|p| shown(&text, p)).count();
    if std::env::var_os("CONTINUITY_DEBUG").is_some() {
        for p in prompts.iter().filter(|p| !shown(&text, p)) {
            println!("  not shown: {p}");
        }
    }
    report.prompts += prompts.len();
    report.shown += shown_now;
    report.counted += counted(&summary).min(prompts.len() - shown_now);
    if instructions.iter().all(|i| text.contains(i)) {
        report.instructions_ok += 1;
    }
    report.files += files.len();
    report.named += files.iter().filter(|f| text.contains(f.as_str())).count();
    // Restored: the file's current first line is in the request (an attachment or a
    // kept read).
    let recent = context.files.recent(context.turn, RECENT_TURNS);
    report.recent += recent.len();
    report.recent_named += recent.iter().filter(|f| text.contains(f.as_str())).count();
    report.recent_in_summary += recent.iter().filter(|f| summary.contains(f.as_str())).count();
    let since = context.files.since_compaction();
    report.since += since.len();
    report.since_in_summary += since.iter().filter(|f| summary.contains(f.as_str())).count();
    if std::env::var_os("CONTINUITY_DEBUG").is_some() {
        let missing: Vec<&String> = since.iter().filter(|f| !summary.contains(f.as_str())).collect();
        let elsewhere = missing.iter().filter(|f| text.contains(f.as_str())).count();
        println!(
            "  summary: {} tokens; files since the previous compaction not in it: {missing:?} ({elsewhere} of them named elsewhere in the request, e.g. a kept tool round)",
            summary.len().div_ceil(4)
        );
    }
    report.restored += files
        .iter()
        .filter(|f| {
            std::fs::read_to_string(Path::new(f))
                .ok()
                .and_then(|c| c.lines().find(|l| l.trim().len() > 20).map(str::to_owned))
                .is_some_and(|line| text.contains(&line))
        })
        .count();
    Ok(())
}
