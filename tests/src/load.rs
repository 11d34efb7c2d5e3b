//! Many sessions at once over one connection: the client side of the load benchmark
//! (`benches/load.rs`) and of its correctness-only short form (`tests/load.rs`).
//!
//! [`Mux`] shares one daemon's stdio between client threads: requests are written under
//! a lock and each answer is routed back to its sender by id. [`Background`] runs one
//! thread per session that appends (and now and then assembles, or compacts) until it is
//! stopped, checking every answer and remembering what it appended, so that
//! [`check_stored`] can say afterwards that nothing acknowledged is missing or out of
//! order. It can be paused between operations and resumed ([`Background::pause`]), so
//! that a benchmark can measure an idle daemon and a loaded one in alternating windows.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, anyhow, ensure};
use serde_json::{Value, json};

use crate::{ctxd_bin, frame, read_frame, stored_uuids, user_record};

/// How long a client waits for one answer (compactions under load included).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(300);

/// A daemon whose connection many threads share.
pub struct Mux {
    child: Mutex<Child>,
    stdin: Mutex<ChildStdin>,
    waiters: Arc<Mutex<HashMap<i64, Sender<Vec<u8>>>>>,
    /// For the requests sent by [`Mux::request_body_timed`]: when the reader had read
    /// each one's answer (Unix µs), before handing it to its thread.
    read_at: Arc<Mutex<HashMap<i64, Option<f64>>>>,
    next_id: AtomicI64,
    pub state_dir: PathBuf,
}

/// The id of an answer as ctxd encodes it (`{"jsonrpc":"2.0","result"|"error":…,"id":N}`),
/// read from its two ends; `None` for anything else, which is then parsed. Finding the
/// id with a parser means scanning the whole result: for a whole assembled request of
/// 360 KB, about 0.2 ms of the one thread that reads every answer, which every answer
/// behind it (the probe's among them) would wait for.
pub fn answer_id(body: &[u8]) -> Option<i64> {
    let is_answer =
        body.starts_with(br#"{"jsonrpc":"2.0","result":"#) || body.starts_with(br#"{"jsonrpc":"2.0","error":"#);
    // The last member of the top-level object: nothing nested closes after it.
    let head = body.strip_suffix(b"}")?;
    let digits = head.iter().rev().take_while(|b| b.is_ascii_digit()).count();
    let (head, number) = head.split_at(head.len() - digits);
    (is_answer && digits > 0 && head.ends_with(br#","id":"#)).then_some(())?;
    std::str::from_utf8(number).ok()?.parse().ok()
}

impl Mux {
    /// Starts `ctxd serve` on `state_dir` (HOME isolated, automatic compaction off so
    /// that only the sessions told to compact do) and initializes it.
    pub fn start(state_dir: &Path, env: &[(&str, &str)]) -> anyhow::Result<Arc<Mux>> {
        let bin = ctxd_bin();
        let mut all = vec![("DISABLE_AUTO_COMPACT", "1")];
        all.extend_from_slice(env);
        let mut command = crate::serve_command(state_dir, "info", &all)?;
        let mut child = command.spawn().with_context(|| format!("spawning {}", bin.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let stdin = child.stdin.take().context("no stdin")?;
        let waiters: Arc<Mutex<HashMap<i64, Sender<Vec<u8>>>>> = Arc::default();
        let routing = waiters.clone();
        let read_at: Arc<Mutex<HashMap<i64, Option<f64>>>> = Arc::default();
        let stamping = read_at.clone();
        std::thread::spawn(move || {
            // Only the id is read here; each client thread parses its own answer, so
            // that one thread parsing every (large) assemble answer is not what a
            // benchmark measures.
            #[derive(serde::Deserialize)]
            struct Route {
                id: Option<i64>,
                method: Option<serde::de::IgnoredAny>,
            }
            let mut reader = BufReader::new(stdout);
            while let Ok(Some(body)) = read_frame(&mut reader) {
                let id = match answer_id(&body) {
                    Some(id) => id,
                    None => {
                        let Ok(Route { id: Some(id), method: None }) = serde_json::from_slice::<Route>(&body) else {
                            continue;
                        };
                        id
                    }
                };
                if let Some(slot) = stamping.lock().ok().as_mut().and_then(|t| t.get_mut(&id)) {
                    *slot = Some(unix_us());
                }
                if let Some(tx) = routing.lock().map_err(|_| ()).ok().and_then(|mut w| w.remove(&id)) {
                    let _ = tx.send(body);
                }
            }
        });
        let mux = Arc::new(Mux {
            child: Mutex::new(child),
            stdin: Mutex::new(stdin),
            waiters,
            read_at,
            next_id: AtomicI64::new(1),
            state_dir: state_dir.to_owned(),
        });
        mux.request("initialize", json!({"processId": null, "capabilities": {}}))?;
        Ok(mux)
    }

    /// Sends a request; its answer (the frame's body) arrives on the receiver.
    pub fn send(&self, method: &str, params: Value) -> anyhow::Result<Receiver<Vec<u8>>> {
        self.send_as(self.next_id.fetch_add(1, Ordering::Relaxed), method, params)
    }

    fn send_as(&self, id: i64, method: &str, params: Value) -> anyhow::Result<Receiver<Vec<u8>>> {
        let (tx, rx) = channel();
        self.waiters.lock().map_err(|_| anyhow!("poisoned"))?.insert(id, tx);
        let body = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        let mut stdin = self.stdin.lock().map_err(|_| anyhow!("poisoned"))?;
        stdin.write_all(&frame(&body))?;
        stdin.flush()?;
        Ok(rx)
    }

    /// Sends a request and returns its `result`, or `Err` with the JSON-RPC error.
    pub fn request(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        let body = self.request_body(method, params)?;
        let response: Value = serde_json::from_slice(&body)?;
        match response {
            Value::Object(mut fields) => match fields.remove("error") {
                Some(error) => Err(anyhow!("{method}: {error}")),
                None => Ok(fields.remove("result").unwrap_or_default()),
            },
            other => Err(anyhow!("{method}: answered {other}")),
        }
    }

    /// Sends a request and waits for its answer, left as the frame's body: a client
    /// that checks a few fields of a large answer reads only those (the clients share
    /// the cores with the daemon they measure).
    pub fn request_body(&self, method: &str, params: Value) -> anyhow::Result<Vec<u8>> {
        self.send(method, params)?.recv_timeout(ANSWER_TIMEOUT).map_err(|e| anyhow!("{method}: no answer: {e}"))
    }

    /// As [`Mux::request_body`], and when the reader had read the answer (Unix µs): the
    /// rest of the wait was the hand-over to this thread.
    pub fn request_body_timed(&self, method: &str, params: Value) -> anyhow::Result<(Vec<u8>, f64)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.read_at.lock().map_err(|_| anyhow!("poisoned"))?.insert(id, None);
        let body = self
            .send_as(id, method, params)?
            .recv_timeout(ANSWER_TIMEOUT)
            .map_err(|e| anyhow!("{method}: no answer: {e}"));
        let read_at = self.read_at.lock().map_err(|_| anyhow!("poisoned"))?.remove(&id).flatten();
        Ok((body?, read_at.context("the reader did not stamp the answer")?))
    }

    pub fn pid(&self) -> u32 {
        self.child.lock().map(|c| c.id()).unwrap_or(0)
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        if let Ok(child) = self.child.get_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Now, in µs since the Unix epoch (the daemon's latency log uses the same clock).
pub fn unix_us() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64() * 1e6
}

pub const MODEL: &str = "claude-sonnet-4-5-20250929";

/// The `index`-th record of a session: a user message, then an assistant reply, and
/// so on, as turns go; about 1 KB of text that names its uuid.
pub fn filler(uuid: &str, parent: Option<&str>, index: usize) -> Value {
    let text = format!("{uuid}: {}", "the quick brown fox jumps over the lazy dog ".repeat(22));
    if index.is_multiple_of(2) {
        return user_record(uuid, parent, &text);
    }
    json!({
        "parentUuid": parent,
        "isSidechain": false,
        "type": "assistant",
        "message": {
            "id": format!("msg_{uuid}"), "type": "message", "role": "assistant", "model": MODEL,
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
        },
        "uuid": uuid,
        "timestamp": "2026-11-29T10:00:01.000Z",
    })
}

/// Opens `id` and appends `count` filler records in batches; returns their uuids.
pub fn open_and_seed(mux: &Mux, id: &str, count: usize) -> anyhow::Result<Vec<String>> {
    mux.request("ctx/openSession", json!({"cwd": "/tmp", "model": MODEL, "sessionId": id}))?;
    let mut uuids: Vec<String> = Vec::with_capacity(count);
    for chunk in (0..count).collect::<Vec<_>>().chunks(100) {
        let mut records = Vec::new();
        for i in chunk {
            let uuid = format!("{id}-seed-{i:05}");
            records.push(filler(&uuid, uuids.last().map(String::as_str), uuids.len()));
            uuids.push(uuid);
        }
        mux.request("ctx/append", json!({"sessionId": id, "records": records}))?;
    }
    Ok(uuids)
}

/// The assemble request every client sends.
pub fn assemble_params(id: &str) -> Value {
    json!({"sessionId": id, "system": [{"type": "text", "text": "You are a coding agent."}], "tools": [], "maxTokens": 32000})
}

/// What the background sessions do.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Prefix of the session ids.
    pub name: String,
    /// Sessions with their own client thread.
    pub sessions: usize,
    /// Of those, how many compact.
    pub compacting: usize,
    /// How they compact.
    pub compactions: Compactions,
    /// Every `assemble_every`-th operation is an assemble.
    pub assemble_every: usize,
    /// Pause between two operations of a client (its think time).
    pub pause: Duration,
    /// Operations per client, or until stopped when `None`.
    pub operations: Option<usize>,
    /// Clients keep the request they were sent and assemble `since` it (sent only what
    /// changed), as a host that holds its last request does; otherwise every answer is
    /// the whole request.
    pub keep_requests: bool,
}

/// How the compacting sessions compact.
#[derive(Debug, Clone, Copy)]
pub enum Compactions {
    /// Their own client compacts after every n-th append and otherwise goes back to
    /// back, never pausing: the load they make grows with the daemon's speed.
    EveryAppends(usize),
    /// A second client per session runs `ctx/compact` back to back, so that these
    /// sessions are always compacting, while their first client appends and assembles
    /// at the same pace as every other: a fixed offered load.
    Continuous,
}

/// What one background session did; every answer it got was checked.
#[derive(Debug, Default, Clone)]
pub struct SessionLog {
    pub id: String,
    pub appended: Vec<String>,
    pub appends: u64,
    pub assembles: u64,
    pub compactions: u64,
    /// The `summarizer` of each compaction's answer, counted.
    pub summarizers: BTreeMap<String, u64>,
}

/// The background client threads.
pub struct Background {
    stop: Arc<AtomicBool>,
    gate: Arc<Gate>,
    threads: Vec<JoinHandle<anyhow::Result<SessionLog>>>,
    /// Threads that pass the gate: one client per session, and a compacting thread per
    /// session that compacts continuously.
    gated: usize,
}

/// Where the client threads wait while the background is paused, and how many of them
/// are in an operation (a request sent, its answer not yet read). A paused client
/// blocks on the condition variable: 55 threads polling a flag every millisecond would
/// be a load of their own on the idle daemon's cores.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    paused: bool,
    busy: usize,
    /// Threads waiting at the gate for the pause to end.
    parked: usize,
}

/// One client's operation under way; leaving it (by any path) lets a pause complete.
struct Busy<'a>(&'a Gate);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.busy -= 1;
        if state.busy == 0 {
            self.0.changed.notify_all();
        }
    }
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits while paused, then counts the caller in an operation; `None` once `stop`
    /// is set (checked whenever the gate changes: [`Background::stop`] resumes). A
    /// client that waited sleeps `after_pause` more before going on, so that the
    /// clients do not all send at the same instant on resuming.
    fn enter(&self, stop: &AtomicBool, after_pause: Duration) -> Option<Busy<'_>> {
        let mut state = self.lock();
        loop {
            if stop.load(Ordering::SeqCst) {
                return None;
            }
            if !state.paused {
                // Counted under the lock that `pause` reads `busy` under: a pause that
                // sees no one busy knows no one is about to send.
                state.busy += 1;
                return Some(Busy(self));
            }
            state.parked += 1;
            self.changed.notify_all();
            state = self
                .changed
                .wait_while(state, |s| s.paused && !stop.load(Ordering::SeqCst))
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            state.parked -= 1;
            drop(state);
            std::thread::sleep(after_pause);
            state = self.lock();
        }
    }

    fn pause(&self) {
        let mut state = self.lock();
        state.paused = true;
        drop(self.changed.wait_while(state, |s| s.busy > 0).unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    fn resume(&self) {
        self.lock().paused = false;
        self.changed.notify_all();
    }

    /// Waits until `threads` threads wait at the gate; false after `timeout`.
    fn wait_parked(&self, threads: usize, timeout: Duration) -> bool {
        let (_state, waited) = self
            .changed
            .wait_timeout_while(self.lock(), timeout, |s| s.parked < threads)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        !waited.timed_out()
    }
}

/// Session ids of the background workload (the first `compacting` compact).
pub fn session_id(i: usize, workload: &Workload) -> String {
    let name = &workload.name;
    if i < workload.compacting { format!("{name}-compacting-{i:02}") } else { format!("{name}-{i:02}") }
}

impl Background {
    /// Starts one thread per session; the sessions must be open (and seeded) already,
    /// with `seeded[i]` their records so far.
    pub fn start(mux: &Arc<Mux>, workload: &Workload, seeded: Vec<Vec<String>>) -> Background {
        let stop = Arc::new(AtomicBool::new(false));
        let gate = Arc::new(Gate::default());
        let sessions = seeded.len().max(1) as u32;
        let compacting = match workload.compactions {
            Compactions::Continuous => workload.compacting.min(seeded.len()),
            Compactions::EveryAppends(_) => 0,
        };
        let gated = seeded.len() + compacting;
        let threads = seeded
            .into_iter()
            .enumerate()
            .map(|(i, appended)| {
                let (mux, stop, gate, workload) = (mux.clone(), stop.clone(), gate.clone(), workload.clone());
                // On resuming, the clients spread over one pause, as they were.
                let after_pause = workload.pause * i as u32 / sessions;
                std::thread::spawn(move || {
                    let continuous = i < workload.compacting && matches!(workload.compactions, Compactions::Continuous);
                    let compactor = continuous.then(|| {
                        let (mux, id, gate, done) =
                            (mux.clone(), session_id(i, &workload), gate.clone(), Arc::new(AtomicBool::new(false)));
                        let stop_compacting = done.clone();
                        // Spread over one pause too: a pause ends every compaction, and
                        // resumed in step they would all install at the same moment, a
                        // burst the load never has once under way.
                        let after_pause = workload.pause * i as u32 / workload.compacting.max(1) as u32;
                        (
                            std::thread::spawn(move || compact_until(&mux, &id, &gate, &stop_compacting, after_pause)),
                            done,
                        )
                    });
                    let log = client(&mux, &workload, i, appended, &gate, &stop, after_pause);
                    let Some((compactor, done)) = compactor else { return log };
                    done.store(true, Ordering::Relaxed);
                    let summarizers = compactor.join().map_err(|_| anyhow!("a compacting thread panicked"))??;
                    log.map(|log| SessionLog { compactions: summarizers.values().sum(), summarizers, ..log })
                })
            })
            .collect();
        Background { stop, gate, threads, gated }
    }

    /// Holds every client before its next operation and returns once none is in one:
    /// every request the background sent has its answer (a compaction is installed).
    pub fn pause(&self) {
        self.gate.pause();
    }

    /// After [`Background::pause`]: waits until every thread of the background waits at
    /// the gate (none is between passing it and sending), failing after `timeout`.
    pub fn wait_parked(&self, timeout: Duration) -> anyhow::Result<()> {
        ensure!(self.gate.wait_parked(self.gated, timeout), "not every client waits at the gate after {timeout:?}");
        Ok(())
    }

    /// Lets the clients go on after [`Background::pause`].
    pub fn resume(&self) {
        self.gate.resume();
    }

    /// Stops the clients (each finishes the operation it is in) and returns their logs.
    pub fn stop(self) -> anyhow::Result<Vec<SessionLog>> {
        self.stop.store(true, Ordering::SeqCst);
        self.resume();
        self.join()
    }

    /// Waits for the clients to finish their operations and returns their logs.
    pub fn join(self) -> anyhow::Result<Vec<SessionLog>> {
        self.threads.into_iter().map(|t| t.join().map_err(|_| anyhow!("a client thread panicked"))?).collect()
    }
}

/// `ctx/compact` on session `id` back to back until `done`; their summarizers, counted.
fn compact_until(
    mux: &Mux,
    id: &str,
    gate: &Gate,
    done: &AtomicBool,
    after_pause: Duration,
) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut summarizers = BTreeMap::new();
    while let Some(_busy) = gate.enter(done, after_pause) {
        compact(mux, id, &mut summarizers)?;
    }
    Ok(summarizers)
}

fn compact(mux: &Mux, id: &str, summarizers: &mut BTreeMap<String, u64>) -> anyhow::Result<()> {
    let result = mux.request("ctx/compact", json!({"sessionId": id})).with_context(|| format!("{id}: compact"))?;
    ensure!(result["boundary"].is_string(), "{id}: compact gave {result}");
    *summarizers.entry(result["summarizer"].as_str().unwrap_or("?").to_owned()).or_default() += 1;
    Ok(())
}

fn client(
    mux: &Mux,
    workload: &Workload,
    i: usize,
    appended: Vec<String>,
    gate: &Gate,
    stop: &AtomicBool,
    after_pause: Duration,
) -> anyhow::Result<SessionLog> {
    let id = session_id(i, workload);
    let compact_every = match workload.compactions {
        Compactions::EveryAppends(n) if i < workload.compacting => Some(n.max(1) as u64),
        _ => None,
    };
    let mut log = SessionLog { id: id.clone(), appended, ..SessionLog::default() };
    let mut held = HeldRequest::default();
    let mut op = 0usize;
    while workload.operations.is_none_or(|n| op < n) {
        let Some(busy) = gate.enter(stop, after_pause) else { break };
        op += 1;
        if op.is_multiple_of(workload.assemble_every.max(1)) {
            let last = log.appended.last().map(String::as_str);
            if workload.keep_requests {
                let body =
                    mux.request_body("ctx/assemble", held.params(&id)).with_context(|| format!("{id}: assemble"))?;
                held.take(&body, last).with_context(|| format!("{id}: assemble"))?;
            } else {
                let body = mux
                    .request_body("ctx/assemble", assemble_params(&id))
                    .with_context(|| format!("{id}: assemble"))?;
                check_assembled(&body, last).with_context(|| format!("{id}: assemble"))?;
            }
            log.assembles += 1;
        } else {
            let uuid = format!("{id}-{:06}", log.appended.len());
            let record = filler(&uuid, log.appended.last().map(String::as_str), log.appended.len());
            let result = mux
                .request("ctx/append", json!({"sessionId": id, "records": [record]}))
                .with_context(|| format!("{id}: append"))?;
            ensure!(result["appended"] == 1, "{id}: append gave {result}");
            log.appended.push(uuid);
            log.appends += 1;
            if compact_every.is_some_and(|n| log.appends.is_multiple_of(n)) {
                compact(mux, &id, &mut log.summarizers)?;
                log.compactions += 1;
            }
        }
        drop(busy);
        if compact_every.is_none() && !workload.pause.is_zero() {
            std::thread::sleep(workload.pause);
        }
    }
    Ok(log)
}

/// An assemble answer is a request whose messages start with a user message and which
/// carries the record appended last. Read without building the answer's value tree: a
/// whole answer is what a client holding nothing splices in.
pub fn check_assembled(body: &[u8], last_appended: Option<&str>) -> anyhow::Result<()> {
    HeldRequest::default().take(body, last_appended)
}

/// The request a client was sent last, kept so that the next assemble asks only for
/// what changed since (`since`) and splices the answer in.
#[derive(Default)]
pub struct HeldRequest {
    revision: Option<String>,
    messages: Vec<Box<serde_json::value::RawValue>>,
}

impl HeldRequest {
    /// Assemble params for session `id`, `since` the held request when there is one.
    pub fn params(&self, id: &str) -> Value {
        let mut params = assemble_params(id);
        if let Some(revision) = &self.revision {
            params["since"] = revision.clone().into();
        }
        params
    }

    /// Splices an answer into the held request and checks the result as
    /// [`check_assembled`] does: the first message the user's, the record appended last
    /// in what was sent. Reads only the answer's (small) messages.
    pub fn take(&mut self, body: &[u8], last_appended: Option<&str>) -> anyhow::Result<()> {
        use serde::de::IgnoredAny;
        use serde_json::value::RawValue;
        #[derive(serde::Deserialize)]
        struct Answer {
            result: Option<Assembled>,
        }
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Assembled {
            request: Request,
            revision: String,
            messages_from: usize,
        }
        #[derive(serde::Deserialize)]
        struct Request {
            messages: Vec<Box<RawValue>>,
        }
        #[derive(serde::Deserialize)]
        struct Message {
            role: String,
            #[serde(rename = "content")]
            _content: IgnoredAny,
        }
        let shown = || String::from_utf8_lossy(&body[..body.len().min(500)]).into_owned();
        let answer: Answer =
            serde_json::from_slice(body).with_context(|| format!("not an assemble answer: {}", shown()))?;
        let assembled = answer.result.with_context(|| format!("an error: {}", shown()))?;
        ensure!(
            assembled.messages_from <= self.messages.len(),
            "messagesFrom {} past the {} messages held",
            assembled.messages_from,
            self.messages.len()
        );
        ensure!(assembled.messages_from == 0 || self.revision.is_some(), "a partial answer to a request without since");
        self.messages.truncate(assembled.messages_from);
        self.messages.extend(assembled.request.messages);
        self.revision = Some(assembled.revision);
        let first: Message = serde_json::from_str(self.messages.first().context("no messages")?.get())?;
        ensure!(first.role == "user", "the first message is not the user's: {}", shown());
        if let Some(uuid) = last_appended {
            // The record appended last is in the answer, or a compaction that started
            // after it summarized it: the answer is then a new request that opens with
            // the summary (a compaction summarizes everything it saw; only what arrives
            // while it runs is kept after the summary).
            let text = std::str::from_utf8(body)?;
            let summarized = assembled.messages_from == 0 && self.messages[0].get().contains("\\n\\nSummary:\\n");
            ensure!(text.contains(uuid) || summarized, "the answer lacks the record appended last ({uuid})");
        }
        Ok(())
    }
}

/// Every record a session's client appended is stored, in the order appended, and no
/// record of it is stored twice.
pub fn check_stored(state_dir: &Path, logs: &[SessionLog]) -> anyhow::Result<()> {
    for log in logs {
        let prefix = format!("{}-", log.id);
        let stored: Vec<String> =
            stored_uuids(state_dir, &log.id)?.into_iter().filter(|u| u.starts_with(&prefix)).collect();
        ensure!(
            stored == log.appended,
            "{}: {} stored, {} appended (or out of order)",
            log.id,
            stored.len(),
            log.appended.len()
        );
        // Whole compactions keep the newest messages (and whatever arrives while they
        // run) by reference: a record is never written a second time as a copy.
        let text = std::fs::read_to_string(state_dir.join("sessions").join(format!("{}.jsonl", log.id)))?;
        let copies = text.lines().filter(|l| l.contains("\"ctxdKeptFrom\"")).count();
        ensure!(copies == 0, "{}: {copies} records copied after a boundary", log.id);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::answer_id;

    #[test]
    fn an_answer_id_is_read_from_the_ends_only_when_it_is_the_top_level_one() {
        // ctxd's own encoding of a result and the service's of an error.
        assert_eq!(answer_id(br#"{"jsonrpc":"2.0","result":{"id":3,"messages":[]},"id":42}"#), Some(42));
        assert_eq!(answer_id(br#"{"jsonrpc":"2.0","error":{"code":-32602,"message":"no"},"id":7}"#), Some(7));
        // An "id" inside the result, last in it, is not the answer's.
        assert_eq!(answer_id(br#"{"jsonrpc":"2.0","result":{"id":3}}"#), None);
        // Notifications and the daemon's own requests are left to the parser.
        assert_eq!(answer_id(br#"{"jsonrpc":"2.0","method":"ctx/usageChanged","params":{"id":1}}"#), None);
        assert_eq!(
            answer_id(br#"{"jsonrpc":"2.0","method":"window/workDoneProgress/create","params":{},"id":1}"#),
            None
        );
        // A string id, or none.
        assert_eq!(answer_id(br#"{"jsonrpc":"2.0","result":null,"id":"a1"}"#), None);
        assert_eq!(answer_id(br#"{"jsonrpc":"2.0","result":null,"id":}"#), None);
        assert_eq!(answer_id(b""), None);
    }
}
