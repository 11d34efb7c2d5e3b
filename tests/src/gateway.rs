//! The gateway's test bench: a local upstream (a small hyper server on a tokio runtime)
//! that records what reaches it and answers as a test asks, and `ctxd gateway` started
//! in front of it. Shared by `tests/gateway.rs` and `benches/gateway.rs`.
//!
//! The upstream's answer is chosen by the request's `x-stub` header (which the gateway
//! passes on like any other): `sse` (a Messages stream, its last events held until the
//! test releases them), `json`, `echo` (the request body back), `big:N` (N MB of
//! events), `fast` (a whole stream at once), `gzip` (the same, gzip-encoded), `count` (a `count_tokens` answer),
//! `error` (529 `overloaded_error`), `cut` (a stream that breaks off), `hang`
//! (never answers; says when the gateway drops the request), `redirect:URL` (307),
//! `slowfork:MS` (as `fast`, and ctxd's preparation fork is answered after MS
//! milliseconds), `priced` (a whole stream whose usage is what the request costs in a simulated prompt
//! cache, [`crate::cache::PromptCache`], shared by every request: see [`Pricing`]).
//!
//! Whatever the mode, a summary request gets a summary: ctxd's preparation fork (its
//! instruction) at once, Claude Code's own compaction request after [`SLOW_SUMMARY`], as
//! a model takes its time to write one (see [`summary_answer`]).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a failed step is a failed test

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

use crate::cache::{Bill, PromptCache};

/// The usage the stub reports in every answer.
pub const USAGE: [(&str, u64); 4] = [
    ("input_tokens", 12_305),
    ("cache_creation_input_tokens", 4_096),
    ("cache_read_input_tokens", 98_304),
    ("output_tokens", 1),
];
/// The final output count (`message_delta`).
pub const OUTPUT_TOKENS: u64 = 321;

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
    }
}

/// The local upstream.
pub struct Upstream {
    pub addr: SocketAddr,
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Lets a held `sse` answer go on.
    pub release: Arc<Notify>,
    /// Told when a `hang` request was dropped (its client went away).
    pub dropped: Arc<Notify>,
    /// Told when a `hang` request arrived.
    pub arrived: Arc<Notify>,
    /// The `priced` mode's cache and bills.
    pub pricing: Arc<Pricing>,
}

/// The `priced` mode's account: one prompt cache for every request, on the clock of
/// the upstream's start, and each request's bill.
#[derive(Debug)]
pub struct Pricing {
    pub cache: Mutex<PromptCache>,
    pub calls: Mutex<Vec<PricedCall>>,
    pub started: std::time::Instant,
}

impl Pricing {
    /// Milliseconds since the upstream started: the cache's clock.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

/// What a `priced` request was and what it cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PricedCall {
    pub kind: CallKind,
    pub bill: Bill,
    /// Tokens of the answer's text (bytes / 4).
    pub output_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    Turn,
    /// ctxd's preparation fork.
    Fork,
    /// Claude Code's own compaction request (one the gateway forwarded).
    Compaction,
}

impl Upstream {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

type StubBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

fn full(bytes: impl Into<Bytes>) -> StubBody {
    http_body_util::Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// A body fed by a channel: each item is one chunk as the stub writes it.
fn channel_body() -> (mpsc::Sender<Result<Bytes, std::io::Error>>, StubBody) {
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    (tx, StreamBody::new(futures::StreamExt::map(stream, |r| r.map(Frame::data))).boxed())
}

/// One SSE event.
pub fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

pub fn message_start() -> String {
    let usage: serde_json::Map<String, Value> = USAGE.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
    event(
        "message_start",
        &json!({"type": "message_start", "message": {"id": "msg_gw_1", "type": "message", "role": "assistant",
            "model": "claude-opus-5-5", "content": [], "stop_reason": null, "usage": usage}}),
    )
}

pub fn stream_tail(text: &str) -> String {
    [
        event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        ),
        event("content_block_stop", &json!({"type": "content_block_stop", "index": 0})),
        event(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": OUTPUT_TOKENS}}),
        ),
        event("message_stop", &json!({"type": "message_stop"})),
    ]
    .concat()
}

/// The JSON answer of `json` mode.
pub fn json_answer() -> Value {
    let mut usage: serde_json::Map<String, Value> = USAGE.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
    usage.insert("output_tokens".into(), json!(OUTPUT_TOKENS));
    json!({"id": "msg_gw_json", "type": "message", "role": "assistant", "model": "claude-opus-5-5",
        "content": [{"type": "text", "text": "JSON-ANSWER"}], "stop_reason": "end_turn", "usage": usage})
}

/// Starts the upstream on `runtime`.
pub fn upstream(runtime: &tokio::runtime::Runtime) -> Upstream {
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let state = Upstream {
        addr,
        received: Arc::default(),
        release: Arc::new(Notify::new()),
        dropped: Arc::new(Notify::new()),
        arrived: Arc::new(Notify::new()),
        pricing: Arc::new(Pricing {
            cache: Mutex::default(),
            calls: Mutex::default(),
            started: std::time::Instant::now(),
        }),
    };
    let shared = (
        state.received.clone(),
        state.release.clone(),
        state.dropped.clone(),
        state.arrived.clone(),
        state.pricing.clone(),
    );
    runtime.spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let shared = shared.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let shared = shared.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(request, shared).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    state
}

/// Signals when dropped (the gateway let go of a `hang` request).
struct OnDrop(Arc<Notify>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

type Shared = (Arc<Mutex<Vec<Received>>>, Arc<Notify>, Arc<Notify>, Arc<Notify>, Arc<Pricing>);

async fn answer(request: hyper::Request<hyper::body::Incoming>, shared: Shared) -> hyper::Response<StubBody> {
    let (received, release, dropped, arrived, pricing) = shared;
    let (parts, body) = request.into_parts();
    let mode = parts.headers.get("x-stub").and_then(|v| v.to_str().ok()).unwrap_or("sse").to_owned();
    let body = body.collect().await.map(|b| b.to_bytes().to_vec()).unwrap_or_default();
    received.lock().unwrap().push(Received {
        method: parts.method.to_string(),
        target: parts.uri.to_string(),
        headers: parts.headers.iter().map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())).collect(),
        body: body.clone(),
    });
    if let Some(delay) = summary_delay(&body) {
        let kind = if delay.is_zero() { CallKind::Fork } else { CallKind::Compaction };
        let delay = match mode.strip_prefix("slowfork:") {
            Some(ms) if kind == CallKind::Fork => Duration::from_millis(ms.parse().unwrap_or(0)),
            _ => delay,
        };
        tokio::time::sleep(delay).await;
        let text = summary_answer(&body);
        let start = if mode == "priced" { priced_start(&pricing, &body, kind, &text) } else { message_start() };
        let answer = start + &stream_tail(&text);
        return hyper::Response::builder()
            .status(200)
            .header("content-type", "text/event-stream")
            .body(full(answer))
            .unwrap();
    }
    let respond = |status: u16, kind: &str, body: StubBody| {
        hyper::Response::builder()
            .status(status)
            .header("content-type", kind)
            .header("request-id", "req_stub_1")
            .body(body)
            .unwrap()
    };
    match mode.as_str() {
        "json" => respond(200, "application/json", full(json_answer().to_string())),
        "echo" => respond(200, "application/octet-stream", full(body)),
        "error" => respond(
            529,
            "application/json",
            full(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#),
        ),
        "count" => respond(200, "application/json", full(r#"{"input_tokens":42}"#)),
        fast if fast == "fast" || fast.starts_with("slowfork:") => {
            respond(200, "text/event-stream", full(message_start() + &stream_tail("FAST")))
        }
        "priced" => {
            let start = priced_start(&pricing, &body, CallKind::Turn, "PRICED");
            respond(200, "text/event-stream", full(start + &stream_tail("PRICED")))
        }
        "gzip" => {
            use std::io::Write;
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all((message_start() + &stream_tail("ZIPPED")).as_bytes()).unwrap();
            let mut answer = respond(200, "text/event-stream", full(encoder.finish().unwrap()));
            answer.headers_mut().insert("content-encoding", hyper::header::HeaderValue::from_static("gzip"));
            answer
        }
        "hang" => {
            let _guard = OnDrop(dropped);
            arrived.notify_one();
            std::future::pending::<()>().await;
            unreachable!()
        }
        "cut" => {
            let (tx, body) = channel_body();
            tokio::spawn(async move {
                let _ = tx.send(Ok(Bytes::from(message_start()))).await;
                // Time for the head and first event to leave before the break.
                tokio::time::sleep(Duration::from_millis(200)).await;
                let _ = tx.send(Err(std::io::Error::other("the upstream broke off"))).await;
            });
            respond(200, "text/event-stream", body)
        }
        redirect if redirect.starts_with("redirect:") => hyper::Response::builder()
            .status(307)
            .header("location", &redirect["redirect:".len()..])
            .body(full(""))
            .unwrap(),
        big if big.starts_with("big:") => {
            let megabytes: usize = big[4..].parse().unwrap_or(1);
            let (tx, body) = channel_body();
            tokio::spawn(async move {
                let _ = tx.send(Ok(Bytes::from(message_start()))).await;
                let delta = event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x".repeat(16_000)}}),
                );
                let piece = Bytes::from(delta.repeat(4));
                let mut sent = 0;
                while sent < megabytes * 1_000_000 {
                    if tx.send(Ok(piece.clone())).await.is_err() {
                        return;
                    }
                    sent += piece.len();
                }
                let _ = tx.send(Ok(Bytes::from(stream_tail("end")))).await;
            });
            respond(200, "text/event-stream", body)
        }
        _ => {
            // `sse`: message_start at once, the rest once the test releases it.
            let (tx, body) = channel_body();
            tokio::spawn(async move {
                let _ = tx.send(Ok(Bytes::from(message_start()))).await;
                release.notified().await;
                let _ = tx.send(Ok(Bytes::from(stream_tail("STREAMED")))).await;
            });
            respond(200, "text/event-stream", body)
        }
    }
}

/// Prices `body` in the shared cache, records the bill, and returns a `message_start`
/// whose usage says it: uncached input, cache writes and reads, as the API splits them.
fn priced_start(pricing: &Pricing, body: &[u8], kind: CallKind, text: &str) -> String {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let bill = pricing.cache.lock().unwrap().send(&request, pricing.now_ms());
    let output_tokens = text.len() as u64 / 4;
    pricing.calls.lock().unwrap().push(PricedCall { kind, bill, output_tokens });
    let written = bill.written_5m + bill.written_1h;
    let usage = json!({"input_tokens": bill.input - bill.read - written, "cache_creation_input_tokens": written,
        "cache_read_input_tokens": bill.read, "output_tokens": output_tokens});
    event(
        "message_start",
        &json!({"type": "message_start", "message": {"id": "msg_gw_priced", "type": "message", "role": "assistant",
            "model": request["model"], "content": [], "stop_reason": null, "usage": usage}}),
    )
}

/// How ctxd's summary instruction (the preparation fork's) begins.
pub const CTXD_INSTRUCTION: &str = "This conversation is about to be replaced by a written summary";
/// How Claude Code's summary instruction begins (its compaction request).
pub const CLAUDE_INSTRUCTION: &str = "CRITICAL: Respond with TEXT ONLY";
/// How long the stub takes to write Claude Code's summary.
pub const SLOW_SUMMARY: Duration = Duration::from_secs(3);

/// `Some(delay)` for a summary request: none for ctxd's fork, [`SLOW_SUMMARY`] for
/// Claude Code's.
fn summary_delay(body: &[u8]) -> Option<Duration> {
    let has = |needle: &str| body.windows(needle.len()).any(|w| w == needle.as_bytes());
    if has(CTXD_INSTRUCTION) {
        Some(Duration::ZERO)
    } else if has(CLAUDE_INSTRUCTION) {
        Some(SLOW_SUMMARY)
    } else {
        None
    }
}

/// The stub's summary: an analysis and a `<summary>` that names every `MARK-…` word of
/// the request, as a model's summary names what the user asked.
pub fn summary_answer(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut marks: Vec<&str> = text
        .match_indices("MARK-")
        .map(|(at, _)| {
            let end = text[at + 5..].find(|c: char| !c.is_ascii_alphanumeric()).map_or(text.len(), |e| at + 5 + e);
            &text[at..end]
        })
        .collect();
    marks.sort_unstable();
    marks.dedup();
    format!(
        "<analysis>STUB-DRAFT</analysis>\n<summary>\n1. Primary Request and Intent:\n   STUB-SUMMARY of {}\n</summary>",
        marks.join(", ")
    )
}

/// `ctxd gateway` in front of an upstream.
pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    pub state_dir: PathBuf,
    pub home: PathBuf,
    pub log: PathBuf,
}

impl Gateway {
    /// Starts `ctxd gateway --listen 127.0.0.1:0 --upstream URL` on `dir` (state, home
    /// and log inside it), with `args` (which may name another `--listen`) and `env`
    /// added; waits for its address.
    pub fn start(dir: &Path, upstream: &str, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Gateway> {
        let state_dir = dir.join("state");
        let home = dir.join("home");
        let log = dir.join("gateway.log");
        std::fs::create_dir_all(&home)?;
        let mut command = crate::ctxd_command();
        command
            .arg("--state-dir")
            .arg(&state_dir)
            .arg("--log-file")
            .arg(&log)
            .args(["gateway", "--upstream", upstream])
            .args(if args.contains(&"--listen") { &[][..] } else { &["--listen", "127.0.0.1:0"][..] })
            .args(args)
            .env("CTXD_LOG", "debug")
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env_remove("CLAUDE_CONFIG_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?).read_line(&mut line)?;
        let Some(addr) = line.trim().strip_prefix("ctxd gateway listening on http://") else {
            let _ = child.kill();
            anyhow::bail!("the gateway did not start: {line:?}");
        };
        Ok(Gateway { addr: addr.parse()?, child, state_dir, home, log })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The gateway's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (up to a minute) until the log has `line` `count` times (it is written on a
    /// thread of its own, behind the answers).
    pub fn wait_log(&self, line: &str, count: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let log = self.log_text();
            if log.matches(line).count() >= count {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "no {line:?} ×{count} in the log:\n{log}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP client for the tests (plain HTTP; rustls needs its provider all the same).
pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A tokio runtime for a test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}
