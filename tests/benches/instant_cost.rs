//! What instant compaction costs: the gateway's preparations per compaction they
//! answered, against the compaction call Claude Code would have made itself, and the
//! share of each preparation's input read from the prompt cache.
//!
//! Long sessions run through release `ctxd gateway` to the `priced` upstream of
//! `ctxd_e2e::gateway`, which bills every request in one simulated prompt cache
//! (`ctxd_e2e::cache`, the provider's documented rules) and reports that bill as the
//! request's usage, as the API does. The host sends what Claude Code sends: its system
//! prompt and tools marked, one breakpoint on the last message, a turn of tool output
//! (1k to 9k tokens) and a short reply at a time; at the threshold (the gateway's own
//! figure for the model) it asks for the compaction the way 2.1.332 does (the
//! instruction as a message of its own), then goes on from the summary.
//!
//! The clock is compressed: the gateway prepares after one idle second (its default is
//! 120 s, well inside the cache's five minutes either way); the user is away every few
//! turns past 60 % of the threshold, and past 90 % each turn leaves the gap a model's
//! answer would. Both summaries (a preparation's, the program's own) are priced at the
//! same output, [`SUMMARY_TOKENS`] (the continuity harness's median summary), at five
//! times an input token (Sonnet's and Opus's ratio); inputs at the cache's prices.
//!
//! `cargo build --release -p ctxd && cargo bench -p ctxd-e2e --bench instant_cost`
//! (`-- --quick`: two sessions).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use ctxd_e2e::cache::Bill;
use ctxd_e2e::gateway::{self, CLAUDE_INSTRUCTION, CallKind, Gateway, Upstream};
use serde_json::{Value, json};

const MODEL: &str = "claude-sonnet-4-5";
/// Compactions per session.
const COMPACTIONS: usize = 3;
/// Output tokens of one summary, and an output token's price in input tokens.
const SUMMARY_TOKENS: f64 = 3_968.0;
const OUTPUT_PRICE: f64 = 5.0;
/// Past 60 % of the threshold the user steps away after every this many turns.
const AWAY_EVERY: usize = 6;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let sessions = if quick { 2 } else { 4 };
    let threshold = ctxd_core::gateway::prepare::threshold(MODEL).expect("the model table knows the model");
    let dir = tempfile::tempdir().unwrap();
    let rt = gateway::runtime();
    let upstream = gateway::upstream(&rt);
    let gw = Gateway::start(dir.path(), &upstream.url(), &["--precompute-idle", "1"], &[]).unwrap();
    let client = gateway::client();
    println!(
        "instant compaction cost: ctxd {} · {sessions} sessions × {COMPACTIONS} compactions · {MODEL}, threshold {threshold}",
        ctxd_e2e::ctxd_bin().display()
    );
    let mut totals = Totals::default();
    for s in 0..sessions {
        let mut host = Host::new(s, &gw, &client, &rt, &upstream);
        while host.compactions < COMPACTIONS {
            let context = host.turn();
            let percent = context * 100 / threshold;
            if context >= threshold {
                totals.add(host.compact());
            } else if percent >= 90 || (percent >= 60 && host.turns.is_multiple_of(AWAY_EVERY)) {
                host.pause();
            }
        }
        println!("session {s}: {} turns", host.turns);
    }
    totals.print();
}

/// One Claude Code session as the gateway sees it.
struct Host<'a> {
    session: String,
    messages: Vec<Value>,
    turns: usize,
    compactions: usize,
    seed: u64,
    /// Preparations billed before this compaction's (they belong to earlier ones).
    forks_seen: usize,
    gw: &'a Gateway,
    client: &'a reqwest::Client,
    rt: &'a tokio::runtime::Runtime,
    upstream: &'a Upstream,
}

/// One compaction's figures.
struct Compaction {
    instant: bool,
    forks: Vec<Bill>,
    /// What Claude Code's own call would have been billed (the cache as it stood).
    own: Bill,
}

impl<'a> Host<'a> {
    fn new(
        s: usize,
        gw: &'a Gateway,
        client: &'a reqwest::Client,
        rt: &'a tokio::runtime::Runtime,
        upstream: &'a Upstream,
    ) -> Self {
        let session = format!("c0570000-0000-4000-8000-{s:012}");
        let forks_seen = upstream.pricing.calls.lock().unwrap().iter().filter(|c| c.kind == CallKind::Fork).count();
        Host {
            session,
            messages: Vec::new(),
            turns: 0,
            compactions: 0,
            seed: s as u64 + 1,
            forks_seen,
            gw,
            client,
            rt,
            upstream,
        }
    }

    fn next(&mut self) -> u64 {
        self.seed = self.seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.seed >> 33
    }

    fn words(&mut self, tokens: u64) -> String {
        (0..tokens).map(|_| format!("w{:03}", self.next() % 1000)).collect::<Vec<_>>().join(" ")
    }

    /// The request Claude Code sends: system and tools marked, the last message too.
    fn body(&self, messages: &[Value]) -> String {
        let mut messages = messages.to_vec();
        if let Some(block) = messages.last_mut().and_then(|m| m["content"].as_array_mut()).and_then(|c| c.last_mut()) {
            block["cache_control"] = json!({"type": "ephemeral"});
        }
        let user_id = json!({"device_id": "d", "account_uuid": "", "session_id": self.session}).to_string();
        let system = format!("You are Claude Code. {}", "Follow the project's rules. ".repeat(400));
        json!({"model": MODEL, "stream": true, "max_tokens": 32000,
            "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "Read", "description": "read a file", "input_schema": {"type": "object"}},
                      {"name": "Bash", "description": "run a command ".repeat(200), "input_schema": {"type": "object"},
                       "cache_control": {"type": "ephemeral"}}],
            "messages": messages, "metadata": {"user_id": user_id}})
        .to_string()
    }

    fn send(&self, body: String) -> (reqwest::header::HeaderMap, String) {
        self.rt.block_on(async {
            let answer = self
                .client
                .post(self.gw.url("/v1/messages"))
                .header("content-type", "application/json")
                .header("x-stub", "priced")
                .body(body)
                .send()
                .await
                .unwrap();
            assert!(answer.status().is_success(), "{}", answer.status());
            (answer.headers().clone(), answer.text().await.unwrap())
        })
    }

    /// One turn: tool output in, a short reply back. Returns the context the answer's
    /// usage reports.
    fn turn(&mut self) -> u64 {
        self.turns += 1;
        let tokens = 1_000 + self.next() % 8_000;
        let words = self.words(tokens);
        let output = format!("MARK-{}-{} {words}", self.session, self.turns);
        self.messages.push(json!({"role": "user", "content": [{"type": "text", "text": output}]}));
        let (_, answer) = self.send(self.body(&self.messages));
        let reply = self.words(300);
        self.messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": reply}]}));
        let usage = first_usage(&answer);
        ["input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"]
            .iter()
            .map(|k| usage[k].as_u64().unwrap_or(0))
            .sum()
    }

    /// A gap between turns: lets a preparation the gateway starts in it finish.
    fn pause(&self) {
        let count = |needle: &str| std::fs::read_to_string(&self.gw.log).unwrap_or_default().matches(needle).count();
        let (started, ended) = (count("preparing the session's summary"), count("summary prepared"));
        // The gateway looks once a second: a gap of 1.3 s sees its decision.
        let look = Instant::now() + Duration::from_millis(1_300);
        while Instant::now() < look && count("preparing the session's summary") == started {
            std::thread::sleep(Duration::from_millis(20));
        }
        if count("preparing the session's summary") > started {
            let deadline = Instant::now() + Duration::from_secs(30);
            while count("summary prepared") + count("preparation failed") <= ended && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Claude Code's automatic compaction, then the session goes on from the summary.
    fn compact(&mut self) -> Compaction {
        let mut messages = self.messages.clone();
        messages.push(json!({"role": "user", "content": [{"type": "text",
            "text": format!("{CLAUDE_INSTRUCTION}. Write an <analysis>, then a <summary>.")}]}));
        let body = self.body(&messages);
        let pricing = &self.upstream.pricing;
        let own = pricing.cache.lock().unwrap().clone().send(&serde_json::from_str(&body).unwrap(), pricing.now_ms());
        let (headers, answer) = self.send(body);
        let instant = headers.contains_key("x-ctxd-instant-compaction");
        let forks: Vec<Bill> =
            pricing.calls.lock().unwrap().iter().filter(|c| c.kind == CallKind::Fork).map(|c| c.bill).collect();
        let mine = forks[self.forks_seen.min(forks.len())..].to_vec();
        self.forks_seen = forks.len();
        self.compactions += 1;
        let summary = answer.split("<summary>").nth(1).unwrap_or("summary").to_owned();
        let words = self.words(SUMMARY_TOKENS as u64);
        self.messages = vec![json!({"role": "user", "content": [{"type": "text",
            "text": format!("This session is being continued. Summary: {summary} {words}")}]})];
        Compaction { instant, forks: mine, own }
    }
}

/// The `usage` of an answer's `message_start`.
fn first_usage(answer: &str) -> Value {
    answer
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|e| e["type"] == "message_start")
        .map(|e| e["message"]["usage"].clone())
        .unwrap_or(Value::Null)
}

#[derive(Default)]
struct Totals {
    compactions: usize,
    instant: usize,
    forks: usize,
    fork_input: u64,
    fork_read: u64,
    fork_cost: f64,
    own_input: u64,
    own_read: u64,
    own_cost: f64,
    /// Each instant compaction's preparation cost over its own call's.
    ratios: Vec<f64>,
}

impl Totals {
    fn add(&mut self, c: Compaction) {
        let summary = SUMMARY_TOKENS * OUTPUT_PRICE;
        self.compactions += 1;
        let own = c.own.cost + summary;
        self.own_input += c.own.input;
        self.own_read += c.own.read;
        self.own_cost += own;
        let mut prepared = 0.0;
        for fork in &c.forks {
            self.forks += 1;
            self.fork_input += fork.input;
            self.fork_read += fork.read;
            prepared += fork.cost + summary;
        }
        self.fork_cost += prepared;
        if c.instant {
            self.instant += 1;
            self.ratios.push(prepared / own);
        }
        println!(
            "  compaction: {} · {} preparation(s), their input {:.1} % from cache · cost {prepared:.0} against {own:.0} for the program's own call",
            if c.instant { "instant" } else { "forwarded" },
            c.forks.len(),
            100.0 * c.forks.iter().map(|f| f.read).sum::<u64>() as f64
                / c.forks.iter().map(|f| f.input).sum::<u64>().max(1) as f64,
        );
    }

    fn print(&self) {
        let mut ratios = self.ratios.clone();
        ratios.sort_by(f64::total_cmp);
        let median = ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN);
        println!(
            "{} compactions, {} answered instantly, {} preparations ({:.2} per compaction)",
            self.compactions,
            self.instant,
            self.forks,
            self.forks as f64 / self.compactions.max(1) as f64
        );
        println!(
            "preparations' input read from cache: {:.1} % ({} of {} tokens); the program's own calls would have read {:.1} %",
            100.0 * self.fork_read as f64 / self.fork_input.max(1) as f64,
            self.fork_read,
            self.fork_input,
            100.0 * self.own_read as f64 / self.own_input.max(1) as f64,
        );
        println!(
            "cost (input-token units, summaries at {SUMMARY_TOKENS} output tokens × {OUTPUT_PRICE}): preparations {:.0}, the program's own calls {:.0}, ratio {:.2}; per instant compaction median {median:.2} (min {:.2}, max {:.2})",
            self.fork_cost,
            self.own_cost,
            self.fork_cost / self.own_cost.max(1.0),
            ratios.first().copied().unwrap_or(f64::NAN),
            ratios.last().copied().unwrap_or(f64::NAN),
        );
    }
}
