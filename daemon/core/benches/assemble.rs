//! Per-turn cost of the request pipeline against its floor: assembling the next request
//! after one appended record, next to `serde_json` serializing that same request. The
//! workloads come from the project's session generator (`ctxd_gen`, `tests/gen`),
//! generated at bench time.
//!
//! ```text
//! cargo bench -p ctxd-core --bench assemble            # 1,000 records and 1M tokens
//! cargo bench -p ctxd-core --bench assemble -- --large # also 100,000 records (slow to generate)
//! ```

#![allow(clippy::expect_used, clippy::print_stdout)] // a bench binary: it reports on stdout and stops on a broken workload

use std::time::{Duration, Instant};

use ctxd_core::record::Record;
use ctxd_core::view::{
    AssembleInput, BaseContext, CompactCheck, PipelineConfig, PipelineState, ViewCache, parse_rfc3339_ms,
};
use ctxd_gen::{Options, Until};
use serde_json::{Value, json};

/// A generated session with `seed`, ending as `until` says.
fn generate(until: Until, seed: u64) -> String {
    ctxd_gen::jsonl(&Options { seed, until, ..Options::default() })
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn bench(label: &str, text: &str) {
    let records: Vec<Record> =
        text.lines().filter(|l| !l.is_empty()).map(|l| Record::parse(l).expect("record")).collect();
    let tools: Vec<Value> = ["Read", "Bash", "Grep", "Glob", "Edit", "Write"]
        .iter()
        .map(|t| json!({"name": t, "description": "tool", "input_schema": {"type": "object"}}))
        .collect();
    let system = vec![json!({"type": "text", "text": "You are a coding agent."})];
    let base = BaseContext {
        user_context: Some("project rules ".repeat(200)),
        system_context: Some("git status".into()),
        attachments: vec![],
    };
    let state = PipelineState::default();
    let config = PipelineConfig::default();
    let steps = 50.min(records.len() / 2);
    let start = records.len() - steps;
    // The clock follows the session: a second after the newest record so far, so a time
    // gap fires where the session had one and not because the run replays old turns.
    let time_of = |r: &Record| r.head().timestamp.as_deref().and_then(parse_rfc3339_ms);
    let mut now = records[..start].iter().rev().find_map(time_of).unwrap_or(0) + 1_000;
    let mut cache = ViewCache::new();
    let mut view: Vec<Record> = records[..start].to_vec();
    macro_rules! input {
        ($view:expr) => {
            AssembleInput {
                records: $view,
                system: &system,
                tools: &tools,
                model: "claude-sonnet-4-5",
                max_tokens: 32_000,
                thinking: None,
                fork: None,
                base: &base,
                now_ms: now,
                state: &state,
                config: &config,
                tool_results_dir: "/tmp/ctxd-bench-tool-results",
                compact: CompactCheck::default(),
            }
        };
    }
    let first = Instant::now();
    let out = cache.assemble(&input!(&view));
    let first = first.elapsed();
    for object in out.new_state.records() {
        view.push(Record::from_object(&object).expect("state record"));
    }
    let (mut turn, mut serialize) = (Vec::new(), Vec::new());
    let before = cache.counters();
    let mut bytes = 0;
    for record in &records[start..] {
        view.push(record.clone());
        now = time_of(record).map_or(now, |t| t.max(now - 1_000) + 1_000);
        let t = Instant::now();
        let out = cache.assemble(&input!(&view));
        turn.push(t.elapsed());
        let t = Instant::now();
        let body = serde_json::to_vec(&out.request).expect("serialize");
        serialize.push(t.elapsed());
        bytes = body.len();
        for object in out.new_state.records() {
            view.push(Record::from_object(&object).expect("state record"));
        }
    }
    let (t, s) = (median(turn), median(serialize));
    // Turns that re-ran the plans (a time gap, a cleared result in a sealed message).
    let rebuilds = cache.counters().rebuilds - before.rebuilds;
    println!(
        "{label:<28} {:>7} records, request {:>6.2} MB: first build {:>8.2?}; per turn {:>9.2?} vs serde_json {:>9.2?} → {:.2}x ({rebuilds} of {steps} turns rebuilt)",
        records.len(),
        bytes as f64 / 1e6,
        first,
        t,
        s,
        t.as_secs_f64() / s.as_secs_f64()
    );
}

fn main() {
    let large = std::env::args().any(|a| a == "--large");
    println!("assemble after one appended record vs serializing the same request (medians of 50 turns)");
    bench("1,000 records", &generate(Until::Turns(100), 5));
    bench("1M tokens", &generate(Until::Tokens(1_000_000), 7));
    if large {
        bench("100,000 records", &generate(Until::Turns(10_000), 9));
    }
}
