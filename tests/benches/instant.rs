//! Instant compaction on the gateway: the time from the last byte of Claude Code's
//! compaction request to the last byte of ctxd's answer, when a summary prepared
//! earlier covers the whole conversation (the instruction appended to the last user
//! message) and when the conversation has grown past it by a fifth of the threshold
//! (folded in offline). Release `ctxd gateway` in front of the local upstream of
//! `ctxd_e2e::gateway`; the conversation is ~600k tokens (2.4 MB) of generated turns.
//!
//! `cargo build --release -p ctxd && cargo bench -p ctxd-e2e --bench instant`
//! (`-- --quick`: fewer rounds).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use ctxd_e2e::gateway::{self, CLAUDE_INSTRUCTION, Gateway};
use serde_json::{Value, json};

const SESSION: &str = "be0c0000-0000-4000-8000-00000000be0c";
/// Bytes per generated message, and tokens per byte as the budget counts them.
const MESSAGE_BYTES: usize = 8_000;
const BYTES_PER_TOKEN: usize = 4;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// `count` alternating turns of about [`MESSAGE_BYTES`] each, numbered from `from`,
/// starting with a user message.
fn turns(from: usize, count: usize) -> Vec<Value> {
    (from..from + count)
        .map(|i| {
            let words: String = (0..MESSAGE_BYTES / 8).map(|w| format!("w{:05} ", (i * 131 + w) % 99_991)).collect();
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": [{"type": "text", "text": format!("message {i}: {words}")}]})
        })
        .collect()
}

fn body(messages: &[Value]) -> String {
    let user_id = json!({"device_id": "d", "account_uuid": "", "session_id": SESSION}).to_string();
    json!({"model": "claude-opus-5-5", "stream": true, "max_tokens": 32000,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Read", "description": "read a file", "input_schema": {"type": "object"}}],
        "messages": messages, "metadata": {"user_id": user_id}})
    .to_string()
}

/// Milliseconds from the request's last byte written to the answer's last byte read,
/// and the answer.
fn time_one(gw: &Gateway, body: &str) -> (f64, String) {
    let mut stream = std::net::TcpStream::connect(gw.addr).unwrap();
    stream.set_nodelay(true).unwrap();
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nx-stub: fast\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        gw.addr,
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let sent = Instant::now();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    (sent.elapsed().as_secs_f64() * 1000.0, String::from_utf8_lossy(&answer).into_owned())
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 7 } else { 31 };
    let dir = tempfile::tempdir().unwrap();
    let rt = gateway::runtime();
    let upstream = gateway::upstream(&rt);
    let gw =
        Gateway::start(dir.path(), &upstream.url(), &["--precompute-idle", "1", "--precompute-at", "10"], &[]).unwrap();
    println!("instant compaction bench: ctxd {}", ctxd_e2e::ctxd_bin().display());

    // ~600k tokens of conversation, ending with a user message: the session's turn.
    let prefix_messages = (600_000 * BYTES_PER_TOKEN / MESSAGE_BYTES) | 1;
    let prefix = turns(0, prefix_messages);
    let (_, answer) = time_one(&gw, &body(&prefix));
    assert!(answer.contains("FAST"), "{answer}");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !std::fs::read_to_string(&gw.log).unwrap_or_default().contains("gateway: summary prepared") {
        assert!(Instant::now() < deadline, "no preparation");
        std::thread::sleep(Duration::from_millis(50));
    }
    let instruction =
        json!({"type": "text", "text": format!("{CLAUDE_INSTRUCTION}. Write an <analysis>, then a <summary>.")});

    // Full cover: the instruction appended to the last user message.
    let mut full = prefix.clone();
    full.last_mut().unwrap()["content"].as_array_mut().unwrap().push(instruction.clone());
    // A fifth of the threshold (967k) past the prefix, then `/compact`.
    let delta_messages = 967_000 / 5 * BYTES_PER_TOKEN / MESSAGE_BYTES;
    let mut grown = prefix.clone();
    grown.extend(turns(prefix_messages, delta_messages | 1));
    grown.push(json!({"role": "user", "content": [instruction]}));

    for (label, messages) in [("full cover", &full), ("20 % delta", &grown)] {
        let request = body(messages);
        let mut times = Vec::new();
        for _ in 0..rounds {
            let (ms, answer) = time_one(&gw, &request);
            assert!(
                answer.contains("x-ctxd-instant-compaction"),
                "not answered by the gateway: {}",
                &answer[..answer.len().min(400)]
            );
            times.push(ms);
        }
        println!(
            "{label}: request {:.1} MB ({} messages), last byte to last byte median {:.1} ms (min {:.1}, max {:.1}, {rounds} rounds)",
            request.len() as f64 / 1e6,
            messages.len(),
            median(times.clone()),
            times.iter().copied().fold(f64::INFINITY, f64::min),
            times.iter().copied().fold(0.0, f64::max),
        );
    }
    let forwarded =
        upstream.received().iter().filter(|r| String::from_utf8_lossy(&r.body).contains(CLAUDE_INSTRUCTION)).count();
    println!("compaction requests that reached the upstream: {forwarded}");
}
