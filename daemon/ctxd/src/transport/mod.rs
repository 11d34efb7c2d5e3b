//! The stdio transport: frames in, messages to the daemon's router, answers and
//! notifications out.
//!
//! A bad frame, bad JSON or a panicking handler costs one error reply and the daemon
//! goes on; frames have a size limit.
//!
//! **One way in.** Every frame is read, parsed and routed by one loop (on a thread of
//! its own for stdio): the message is read borrowed from its frame, the router
//! ([`Router`], ctxd's `server`) decides what it means and returns the answer to come,
//! and that future is polled once at once. Every `ctx/` handler hands its command to
//! the session actor before its first `.await`, so the actor sees commands in the order
//! the client sent them.
//!
//! **One way out.** Everything leaving goes through one queue ([`Outbound`]) that the
//! writer empties in order; a session notifies on it before it answers, so a
//! notification a request caused (`ctx/compacted` while an assemble compacts first)
//! reaches the client first.

pub mod framing;
mod through;

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tower_lsp_server::jsonrpc::{Error, ErrorCode, Id, Request, Response};
use tracing::Instrument as _;

use self::framing::{FrameError, FrameReader};
use self::through::{Through, WriteThrough};

/// Limits of the transport.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest message body accepted, in bytes.
    pub max_message_bytes: usize,
    /// Requests in flight before the reader stops reading (back-pressure). It also
    /// bounds the answers the byte bound cannot foresee: until the first answers are
    /// out, [`QueuedBytes`] can only guess their size, and a client that sends a burst
    /// of large requests faster than the first is answered would otherwise get every one
    /// read and answered in memory.
    pub max_in_flight: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_message_bytes: 64 * 1024 * 1024, max_in_flight: 256 }
    }
}

/// How the stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The client sent `exit` after `shutdown`.
    ExitAfterShutdown,
    /// The client sent `exit` without `shutdown` first.
    ExitWithoutShutdown,
    /// The input stream closed.
    InputClosed,
}

/// The eventual answer to one message (`None` for a notification).
pub type Reply = BoxFuture<'static, Option<Answer>>;

/// An answer on its way to the writer.
pub enum Answer {
    Response(Response),
    /// A whole JSON-RPC response body, already encoded straight from typed data (see
    /// [`encode_result`]): no value tree in between.
    Encoded(Vec<u8>),
}

/// The body of a successful response to request `id`, encoded in one pass into a buffer
/// of `capacity` bytes to start with (an assembled request is hundreds of KB: grown
/// from nothing, the buffer would copy it about twice over on the way).
pub fn encode_result<T: serde::Serialize>(id: &Id, result: &T, capacity: usize) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(serde::Serialize)]
    struct Success<'a, T> {
        jsonrpc: &'static str,
        result: &'a T,
        id: &'a Id,
    }
    let mut body = Vec::with_capacity(capacity);
    serde_json::to_writer(&mut body, &Success { jsonrpc: "2.0", result, id })?;
    Ok(body)
}

/// The daemon's way out to the client, for answers and notifications alike: one queue
/// that the writer empties in the order messages were put on it. A session actor that
/// sends a notification and then answers a request puts both here in that order, so a
/// notification a request caused goes out before its answer, whichever task sends it.
#[derive(Clone)]
pub struct Outbound {
    tx: mpsc::Sender<Outgoing>,
    notifying: std::sync::Arc<std::sync::atomic::AtomicBool>,
    through: std::sync::Arc<WriteThrough>,
    queued: std::sync::Arc<QueuedBytes>,
}

/// Bytes queued for the client and not written yet, and the size answers have had
/// lately. The reader starts a request only while the queue plus the answers of the
/// requests in flight (at that size each) stay under [`MAX_QUEUED_BYTES`]: a client
/// that pipelines requests and does not read its answers holds the daemon's memory to
/// about this bound, instead of one answer per request it sent.
#[derive(Debug)]
struct QueuedBytes {
    bytes: std::sync::atomic::AtomicUsize,
    /// A decaying maximum of the encoded answers' sizes.
    typical_answer: std::sync::atomic::AtomicUsize,
    /// Woken when the queue shrinks or a request in flight is answered.
    drained: tokio::sync::Notify,
}

impl Default for QueuedBytes {
    fn default() -> Self {
        QueuedBytes {
            bytes: Default::default(),
            typical_answer: std::sync::atomic::AtomicUsize::new(4 * 1024),
            drained: tokio::sync::Notify::new(),
        }
    }
}

/// See [`QueuedBytes`].
const MAX_QUEUED_BYTES: usize = 64 * 1024 * 1024;

impl QueuedBytes {
    fn add(&self, bytes: usize) {
        self.bytes.fetch_add(bytes, std::sync::atomic::Ordering::AcqRel);
    }

    /// Notes the size of an answer: a new maximum at once, a smaller one slowly.
    fn note_answer(&self, size: usize) {
        use std::sync::atomic::Ordering;
        let _ = self.typical_answer.fetch_update(Ordering::AcqRel, Ordering::Acquire, |typical| {
            Some(size.max(typical - typical / 8).max(1024))
        });
    }

    fn release(&self, bytes: usize) {
        let before = self.bytes.fetch_sub(bytes, std::sync::atomic::Ordering::AcqRel);
        if before.saturating_sub(bytes) <= MAX_QUEUED_BYTES {
            self.drained.notify_waiters();
        }
    }

    /// Returns once the queue and the answers of the `in_flight()` requests fit in
    /// [`MAX_QUEUED_BYTES`] (with nothing in flight, once the queue does).
    async fn room(&self, in_flight: impl Fn() -> usize) {
        use std::sync::atomic::Ordering;
        let fits = |queued: usize, coming: usize| {
            queued <= MAX_QUEUED_BYTES && (coming == 0 || queued.saturating_add(coming) <= MAX_QUEUED_BYTES)
        };
        let coming = || in_flight().saturating_mul(self.typical_answer.load(Ordering::Acquire));
        // The usual case, per frame: two loads, no waiter registered.
        if fits(self.bytes.load(Ordering::Acquire), coming()) {
            return;
        }
        let mut paused = false;
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            let (queued, coming) = (self.bytes.load(Ordering::Acquire), coming());
            if fits(queued, coming) {
                if paused {
                    tracing::info!(queued, "the client reads its answers again; reading requests again");
                }
                return;
            }
            if !paused {
                tracing::warn!(queued, coming, "the client is not reading its answers; reading requests paused");
                paused = true;
            }
            drained.await;
        }
    }
}

/// What a message counts for in [`QueuedBytes`]: its bytes when known before encoding,
/// a nominal size for the small messages encoded by the writer.
fn queued_cost(message: &Outgoing) -> usize {
    match message {
        Outgoing::Encoded(body) => body.len() + 32,
        Outgoing::Framed(bytes) => bytes.len(),
        Outgoing::End => 0,
        Outgoing::Response(_) | Outgoing::Request(_) => 256,
    }
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound").field("notifying", &self.notifying).finish_non_exhaustive()
    }
}

/// The other end of an [`Outbound`]: what the writer reads.
pub struct Outflow {
    rx: mpsc::Receiver<Outgoing>,
    outbound: Outbound,
}

impl Outbound {
    /// A queue out (the handle to send on, and what the writer reads).
    pub fn channel() -> (Outbound, Outflow) {
        let (tx, rx) = mpsc::channel(1024);
        let outbound = Outbound {
            tx,
            notifying: std::sync::Arc::default(),
            through: std::sync::Arc::default(),
            queued: std::sync::Arc::default(),
        };
        (outbound.clone(), Outflow { rx, outbound })
    }

    /// Whether `other` sends to the same client.
    pub fn same(&self, other: &Outbound) -> bool {
        self.tx.same_channel(&other.tx)
    }

    /// Notifications go out from now on (the daemon calls it when `initialize`
    /// succeeds); earlier ones are dropped.
    pub fn start_notifications(&self) {
        self.notifying.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Queues notification `N` (dropped before [`Outbound::start_notifications`], or
    /// when the writer is gone).
    pub async fn notify<N: tower_lsp_server::ls_types::notification::Notification>(&self, params: N::Params) {
        if let Some(message) = self.notification::<N>(params) {
            self.send(message).await;
        }
    }

    /// Queues notification `N` unless this client's queue is full, and says whether it
    /// did: for a client that must not hold up the others (another editor sharing the
    /// daemon that stopped reading), where waiting for room would stall every session.
    pub fn try_notify<N: tower_lsp_server::ls_types::notification::Notification>(&self, params: N::Params) -> bool {
        let Ok(permit) = self.tx.try_reserve() else { return false };
        if let Some(message) = self.notification::<N>(params) {
            self.through.note_queued();
            self.queued.add(queued_cost(&message));
            permit.send(message);
        }
        true
    }

    /// Notification `N` as it goes out, or `None` before [`Outbound::start_notifications`]
    /// (or when its params do not serialize, which is logged).
    fn notification<N: tower_lsp_server::ls_types::notification::Notification>(
        &self,
        params: N::Params,
    ) -> Option<Outgoing> {
        if !self.notifying.load(std::sync::atomic::Ordering::Acquire) {
            tracing::trace!(method = N::METHOD, "client not initialized; notification dropped");
            return None;
        }
        match serde_json::to_value(params) {
            Ok(params) => Some(Outgoing::Request(Request::build(N::METHOD).params(params).finish())),
            Err(e) => {
                tracing::error!(error = %e, method = N::METHOD, "could not serialize a notification");
                None
            }
        }
    }

    /// Queues `message`; an encoded answer with nothing queued before it is written
    /// straight to stdout instead (see [`through`]).
    async fn send(&self, message: Outgoing) {
        if let Outgoing::Encoded(body) = &message {
            self.queued.note_answer(body.len());
            let header = framing::header(body.len());
            let (tx, queued) = (&self.tx, &self.queued);
            let queue_front = |rest: Vec<u8>| {
                queued.add(rest.len());
                // The queue is empty (nothing was queued), so this cannot find it full.
                if tx.try_send(Outgoing::Framed(rest)).is_err() {
                    tracing::error!("the rest of an answer could not be queued; the writer is gone");
                }
            };
            if let Through::Written = self.through.try_write(header.as_bytes(), body, queue_front) {
                return;
            }
        } else {
            self.through.note_queued();
        }
        self.queued.add(queued_cost(&message));
        let _ = self.tx.send(message).await;
    }
}

/// A message from the client, as the transport read it: borrowed from its frame.
pub struct Message<'a> {
    /// `None` for a notification.
    pub id: Option<Id>,
    pub method: &'a str,
    /// The params' JSON text as sent, decoded once by the handler that takes them.
    pub params: Option<&'a RawValue>,
}

/// What the daemon does with one message, decided synchronously while its frame is at
/// hand (see [`Router`]).
pub enum Routed {
    /// A request: its answer to come. The future queues its command when first polled.
    Reply {
        reply: Reply,
        /// Whether `$/cancelRequest` may drop the reply and answer "cancelled": only when
        /// that answer is true to the client (an append is stored whether or not its
        /// answer is awaited, so "cancelled" would be false).
        cancellable: bool,
        /// Read nothing more until this is answered (`initialize`: the requests a client
        /// pipelines behind it must not find the daemon uninitialized).
        exclusive: bool,
    },
    /// Nothing to answer (a notification handled or ignored).
    Nothing,
    /// `$/cancelRequest` for the request with this id.
    Cancel(Id),
    /// `exit`: stop serving.
    Exit(Ending),
}

/// The daemon's side of the protocol: one table from method to handler. The transport
/// reads, frames and writes; everything a method means is decided here.
pub trait Router: Send + Sync + 'static {
    fn route(&self, message: Message<'_>) -> Routed;
}

/// The replies in flight that `$/cancelRequest` may stop, by id. Each removes itself
/// when it finishes.
#[derive(Clone, Default)]
struct Cancellable(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<Id, futures::future::AbortHandle>>>);

impl Cancellable {
    /// `reply`, stoppable by [`Cancellable::cancel`] with its id until it finishes;
    /// stopped, it answers the LSP error for a cancelled request.
    fn wrap(&self, id: Id, reply: Reply) -> Reply {
        let (reply, handle) = futures::future::abortable(reply);
        if let Ok(mut map) = self.0.lock() {
            map.insert(id.clone(), handle);
        }
        let registry = self.clone();
        async move {
            let outcome = reply.await;
            if let Ok(mut map) = registry.0.lock() {
                map.remove(&id);
            }
            match outcome {
                Ok(answer) => answer,
                Err(futures::future::Aborted) => {
                    Some(Answer::Response(Response::from_error(id, Error::request_cancelled())))
                }
            }
        }
        .boxed()
    }

    /// Stops the reply to request `id`, if it is one of these.
    fn cancel(&self, id: &Id) {
        if let Some(handle) = self.0.lock().ok().and_then(|mut map| map.remove(id)) {
            handle.abort();
        }
    }

    /// Stops every reply still in flight (`exit`).
    fn cancel_all(&self) {
        if let Ok(mut map) = self.0.lock() {
            map.drain().for_each(|(_, handle)| handle.abort());
        }
    }
}

/// Serves one client on `input`/`output` until `exit` or the end of the input; the
/// output is written by a task on the runtime.
pub async fn serve<I, O>(
    input: I,
    output: O,
    router: std::sync::Arc<dyn Router>,
    limits: Limits,
    outflow: Outflow,
) -> Ending
where
    I: AsyncRead + Unpin + Send + 'static,
    O: AsyncWrite + Unpin + Send + 'static,
{
    let outbound = outflow.outbound.clone();
    let writer = Writer::task(output, outflow);
    let ending = read_and_dispatch(input, router, limits, &outbound).await;
    finish(outbound, writer).await;
    ending
}

/// The daemon's stdio: stdin is read and stdout written by threads of their own.
///
/// Why: every byte the serving task encodes or parses delays the next frame it reads.
/// tokio's `Stdin` and `Stdout` hand each read and write to the blocking pool, which
/// then wakes the task: one more hand-off each way, and on a busy machine every
/// hand-off may wait for a CPU. The reader thread blocks in `read` and dispatches each
/// frame itself (its command reaches the session actor with no hand-off); the writer
/// thread encodes and writes.
pub async fn serve_stdio(router: std::sync::Arc<dyn Router>, limits: Limits, outflow: Outflow) -> Ending {
    let outbound = outflow.outbound.clone();
    let writer = Writer::stdout_thread(outflow);
    let runtime = tokio::runtime::Handle::current();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let (thread_router, thread_outbound) = (router.clone(), outbound.clone());
    let spawned = std::thread::Builder::new().name("ctxd-reader".into()).spawn(move || {
        // The runtime's context: handlers spawn tasks (a session's actor, an answer).
        let ending = runtime.block_on(read_and_dispatch(
            BlockingRead(std::io::stdin()),
            thread_router,
            limits,
            &thread_outbound,
        ));
        let _ = done_tx.send(ending);
    });
    let ending = match spawned {
        Ok(_) => done_rx.await.unwrap_or(Ending::InputClosed),
        Err(e) => {
            tracing::warn!(error = %e, "could not start the reader thread; reading from the runtime");
            read_and_dispatch(tokio::io::stdin(), router, limits, &outbound).await
        }
    };
    finish(outbound, writer).await;
    ending
}

/// After the last message: the writer writes everything queued before the end mark
/// (sessions hold senders too, so it stops at the mark, not when they are gone).
async fn finish(outbound: Outbound, writer: Writer) {
    outbound.send(Outgoing::End).await;
    drop(outbound);
    writer.done.await;
}

/// The one way in: reads frames, and for each message asks the router what to do and
/// starts it at once. A request's future is polled once before the next frame is read,
/// so its command reaches the session actor in the order the client sent it; it then
/// finishes on a task of its own, which queues the answer straight for the writer.
/// Returns once every request started has its answer queued.
async fn read_and_dispatch<I: AsyncRead + Unpin>(
    input: I,
    router: std::sync::Arc<dyn Router>,
    limits: Limits,
    outbound: &Outbound,
) -> Ending {
    let mut reader = FrameReader::new(input, limits.max_message_bytes);
    // Requests in flight, each holding one permit until its answer is queued
    // (back-pressure: the reader waits for one before reading on).
    let max = u32::try_from(limits.max_in_flight.clamp(1, 1 << 20)).unwrap_or(1 << 20);
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(max as usize));
    let cancellable = Cancellable::default();
    let mut ending = Ending::InputClosed;
    loop {
        // Back-pressure in bytes: no new request while the client's unread answers are
        // over the bound.
        outbound.queued.room(|| max as usize - in_flight.available_permits()).await;
        let permit = match in_flight.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(tokio::sync::TryAcquireError::Closed) => break,
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                tracing::info!(max, "requests in flight at the limit; reading requests paused until one is answered");
                let Ok(permit) = in_flight.clone().acquire_owned().await else { break };
                permit
            }
        };
        let Some(frame) = reader.next_frame().await else { break };
        let received = std::time::Instant::now();
        let routed = match read_message(frame) {
            Read::Message(body) => {
                let Some(message) = body.message() else {
                    // `read_message` has checked that it reads; stay safe all the same.
                    let error = rpc_error(ErrorCode::ParseError, "unreadable message".to_owned());
                    outbound.send(Outgoing::Response(Response::from_error(Id::Null, error))).await;
                    continue;
                };
                let (id, method) = (message.id.clone(), message.method.to_owned());
                let routed = router.route(message);
                (id, method, routed)
            }
            Read::Ignored => continue,
            Read::Invalid(response) => {
                outbound.send(Outgoing::Response(response)).await;
                continue;
            }
        };
        match routed {
            (Some(id), method, Routed::Reply { reply, cancellable: may_cancel, exclusive }) => {
                let span = tracing::debug_span!("request", %method, %id);
                let reply = if may_cancel { cancellable.wrap(id.clone(), reply) } else { reply };
                let reply = guard(reply, id, method).instrument(span).boxed();
                match start(reply) {
                    Started::Answered(answer) => {
                        if let Some(answer) = answer {
                            outbound.send(answer.into()).await;
                        }
                    }
                    Started::Pending(reply) if exclusive => {
                        if let Some(answer) = reply.await {
                            outbound.send(answer.into()).await;
                        }
                    }
                    Started::Pending(reply) => {
                        let outbound = outbound.clone();
                        tokio::spawn(async move {
                            if let Some(answer) = reply.await {
                                outbound.send(answer.into()).await;
                            }
                            drop(permit);
                            outbound.queued.drained.notify_waiters();
                        });
                    }
                }
                tracing::trace!(elapsed_us = received.elapsed().as_micros() as u64, "dispatched");
            }
            (None, _, Routed::Reply { .. }) | (_, _, Routed::Nothing) => {}
            (_, _, Routed::Cancel(id)) => cancellable.cancel(&id),
            (_, _, Routed::Exit(how)) => {
                ending = how;
                break;
            }
        }
    }
    // Requests still in flight are answered before the output closes: after `exit`,
    // the cancellable ones with "cancelled"; when the input just ends, all of them with
    // their answers.
    if ending != Ending::InputClosed {
        cancellable.cancel_all();
    }
    let _ = in_flight.acquire_many(max).await;
    ending
}

/// A blocking reader as an `AsyncRead`, for a thread of its own that does nothing but
/// wait for input: each poll blocks in `read` until bytes come.
struct BlockingRead<R>(R);

impl<R: std::io::Read + Unpin> AsyncRead for BlockingRead<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let read = loop {
            match self.0.read(buf.initialize_unfilled()) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        std::task::Poll::Ready(read.map(|n| buf.advance(n)))
    }
}

/// A frame as the reader hands it on.
type FromReader = Result<String, FrameError>;

/// A reply polled once: answered at once, or still to come.
enum Started {
    Answered(Option<Answer>),
    Pending(Reply),
}

/// Polls a request's future once, now, so that its command is queued before the next
/// frame is read.
fn start(mut reply: Reply) -> Started {
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match reply.as_mut().poll(&mut context) {
        std::task::Poll::Ready(answer) => Started::Answered(answer),
        std::task::Poll::Pending => Started::Pending(reply),
    }
}

/// Runs a request's future, turning a panic into an error reply for that request alone.
fn guard(reply: Reply, id: Id, method: String) -> Reply {
    async move {
        match AssertUnwindSafe(reply).catch_unwind().await {
            Ok(answer) => answer,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_owned());
                tracing::error!(%method, panic = %what, "handler panicked; answering an error and serving on");
                let mut error = Error::new(ErrorCode::ServerError(ctxd_proto::error_codes::INTERNAL));
                error.message = format!("internal error in {method}: {what}").into();
                Some(Answer::Response(Response::from_error(id, error)))
            }
        }
    }
    .boxed()
}

/// A frame, read: a message to route, nothing to do (an empty body, or a response from
/// the client: ctxd sends no requests, so there is nothing to match it with), or the
/// error reply the client should get.
enum Read {
    Message(Body),
    Ignored,
    Invalid(Response),
}

/// A frame's body that reads as one JSON-RPC message.
struct Body {
    text: String,
    /// Set when the borrowed reading could not be used and [`decode`] read the message
    /// as a value tree instead: its params re-encoded.
    decoded: Option<(Option<Id>, String, Option<Box<RawValue>>)>,
}

/// The message's fields as a borrowed reading finds them: what every well-formed
/// request looks like. Anything else (escapes in `method`, a duplicate key, an id of
/// another type, a response, deep nesting) fails here and is read by [`decode`],
/// which answers exactly what is wrong.
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: &'a str,
    #[serde(default)]
    id: Option<Id>,
    #[serde(borrow)]
    method: &'a str,
    #[serde(default, borrow)]
    params: Option<&'a RawValue>,
}

impl Body {
    fn message(&self) -> Option<Message<'_>> {
        if let Some((id, method, params)) = &self.decoded {
            return Some(Message { id: id.clone(), method, params: params.as_deref() });
        }
        let envelope: Envelope<'_> = serde_json::from_str(&self.text).ok()?;
        Some(Message { id: envelope.id, method: envelope.method, params: envelope.params })
    }
}

/// Deepest nesting serde_json reads into a value tree (its recursion limit is 128).
/// The borrowed reading skips params without that limit, so a deeper frame is read by
/// [`decode`], which refuses it as invalid JSON.
const MAX_NESTING: usize = 127;

/// Reads a frame: a message (borrowed where it can be), a response to drop, or the
/// error reply the client should get.
fn read_message(frame: FromReader) -> Read {
    if let Ok(body) = &frame
        && !nested_deeper_than(body, MAX_NESTING)
        && let Ok(envelope) = serde_json::from_str::<Envelope<'_>>(body)
        && envelope.jsonrpc == "2.0"
        && !matches!(envelope.id, Some(Id::Null))
        && envelope.params.is_none_or(|p| p.get().starts_with(['{', '[']) || p.get() == "null")
    {
        drop(envelope);
        let text = frame.unwrap_or_default();
        return Read::Message(Body { text, decoded: None });
    }
    match decode(frame) {
        Incoming::Request(request) => {
            let (method, id, params) = request.into_parts();
            let params = params.and_then(|p| serde_json::value::to_raw_value(&p).ok());
            Read::Message(Body { text: String::new(), decoded: Some((id, method.into_owned(), params)) })
        }
        Incoming::Response(_) => {
            tracing::debug!("a response from the client, to no request of ctxd's; dropped");
            Read::Ignored
        }
        Incoming::Invalid(response) => Read::Invalid(response),
        Incoming::Nothing => Read::Ignored,
    }
}

/// Whether the JSON `text` nests arrays and objects deeper than `limit` (brackets inside
/// strings do not count).
fn nested_deeper_than(text: &str, limit: usize) -> bool {
    let bytes = text.as_bytes();
    // Fewer opening brackets than the limit cannot nest deeper than it.
    if bytes.iter().filter(|b| matches!(b, b'{' | b'[')).count() <= limit {
        return false;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// A frame read as a JSON-RPC message. Public, hidden, for the fuzz targets in `fuzz/`.
#[doc(hidden)]
pub enum Incoming {
    Request(Request),
    Response(Response),
    /// An error to send back: the frame or message could not be understood.
    Invalid(Response),
    /// Nothing to do (an empty body).
    Nothing,
}

fn rpc_error(code: ErrorCode, message: String) -> Error {
    let mut error = Error::new(code);
    error.message = message.into();
    error
}

/// Turns a frame into a message, or into the error reply the client should get.
#[doc(hidden)]
pub fn decode(frame: Result<String, FrameError>) -> Incoming {
    let body = match frame {
        Ok(body) => body,
        Err(e) => {
            tracing::warn!(error = %e, "malformed frame");
            let code = match e {
                FrameError::TooLarge { .. } => ErrorCode::ServerError(ctxd_proto::error_codes::MESSAGE_TOO_LARGE),
                _ => ErrorCode::ParseError,
            };
            return Incoming::Invalid(Response::from_error(Id::Null, rpc_error(code, e.to_string())));
        }
    };
    if body.trim().is_empty() {
        return Incoming::Nothing;
    }
    let value: Value = match serde_json::from_str(&body) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "invalid JSON");
            // A well-formed message whose only fault is strict JSON (a lone surrogate
            // escape, a number out of range) is answered under its own id.
            let (id, message) = match (id_of(&body), ctxd_core::admit::strict_json(&body)) {
                (Some(id), Err(reason)) => {
                    (id, format!("invalid JSON: {reason}; ctxd accepts strict JSON only; nothing was done"))
                }
                _ => (Id::Null, format!("invalid JSON: {e}")),
            };
            return Incoming::Invalid(Response::from_error(id, rpc_error(ErrorCode::ParseError, message)));
        }
    };
    classify(value)
}

/// The id of a message that is well-formed JSON but not strict JSON: the values it
/// holds are skipped unchecked, only `id` is read.
fn id_of(body: &str) -> Option<Id> {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(default)]
        id: Option<Id>,
    }
    serde_json::from_str::<Head>(body).ok()?.id
}

fn classify(value: Value) -> Incoming {
    let invalid =
        |id: Id, why: String| Incoming::Invalid(Response::from_error(id, rpc_error(ErrorCode::InvalidRequest, why)));
    let Value::Object(object) = &value else {
        let why = if value.is_array() {
            "batch requests are not supported; send one JSON-RPC message per frame".to_owned()
        } else {
            "a JSON-RPC message must be a JSON object".to_owned()
        };
        return invalid(Id::Null, why);
    };
    let id = match object.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_i64() {
            Some(n) => Some(Id::Number(n)),
            None => return invalid(Id::Null, format!("request id {n} is not an integer")),
        },
        Some(Value::String(s)) => Some(Id::String(s.clone())),
        Some(other) => return invalid(Id::Null, format!("request id must be a number or a string, not {other}")),
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid(id.unwrap_or(Id::Null), "missing or wrong \"jsonrpc\": \"2.0\"".to_owned());
    }
    match object.get("method") {
        Some(Value::String(_)) => {
            if let Some(params) = object.get("params")
                && !(params.is_object() || params.is_array() || params.is_null())
            {
                return invalid(id.unwrap_or(Id::Null), "\"params\" must be an object or an array".to_owned());
            }
            match serde_json::from_value::<Request>(value) {
                Ok(request) => Incoming::Request(request),
                Err(e) => invalid(id.unwrap_or(Id::Null), format!("not a JSON-RPC request: {e}")),
            }
        }
        Some(_) => invalid(id.unwrap_or(Id::Null), "\"method\" must be a string".to_owned()),
        None if object.contains_key("result") || object.contains_key("error") => {
            match serde_json::from_value::<Response>(value) {
                Ok(response) => Incoming::Response(response),
                Err(e) => {
                    tracing::warn!(error = %e, "malformed response from the client; dropped");
                    Incoming::Nothing
                }
            }
        }
        None => invalid(id.unwrap_or(Id::Null), "a request needs a \"method\"".to_owned()),
    }
}

fn encode_into<T: serde::Serialize>(message: &T, buf: &mut Vec<u8>) {
    let body = serde_json::to_vec(message).unwrap_or_else(|e| {
        // Responses are built from serializable types; this is a bug, not input.
        tracing::error!(error = %e, "could not serialize an outgoing message");
        br#"{"jsonrpc":"2.0","error":{"code":-32603,"message":"could not serialize the response"},"id":null}"#.to_vec()
    });
    framing::encode_into(&body, buf);
}

/// A message on its way out, encoded by the writer (not by the serve loop).
enum Outgoing {
    Response(Response),
    /// A response body a handler already encoded; only framed here.
    Encoded(Vec<u8>),
    /// A request or notification from the server.
    Request(Request),
    /// The rest of a frame a write-through began: bytes as they go out, before anything
    /// else.
    Framed(Vec<u8>),
    /// The serve loop is done: the writer writes what came before and stops.
    End,
}

impl From<Answer> for Outgoing {
    fn from(answer: Answer) -> Outgoing {
        match answer {
            Answer::Response(response) => Outgoing::Response(response),
            Answer::Encoded(body) => Outgoing::Encoded(body),
        }
    }
}

impl Outgoing {
    fn encode_into(&self, buf: &mut Vec<u8>) {
        match self {
            Outgoing::Response(response) => encode_into(response, buf),
            Outgoing::Encoded(body) => framing::encode_into(body, buf),
            Outgoing::Request(request) => encode_into(request, buf),
            Outgoing::Framed(bytes) => buf.extend_from_slice(bytes),
            Outgoing::End => {}
        }
    }
}

/// Everything queued goes out in one batch, up to this many bytes.
const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Frames this large go after the smaller ones queued with them.
const LARGE_FRAME: usize = 16 * 1024;

/// What is queued for one write, small frames first.
///
/// One stream carries every session's answers and the client reads it in order, so a
/// short answer queued behind a large `ctx/assemble` answer (hundreds of KB) would wait
/// until the client has read all of that. JSON-RPC lets answers go out in any order:
/// within a batch, frames under [`LARGE_FRAME`] go first, and each group keeps its order.
/// Small frames are copied into one buffer; a large body already encoded stays where it
/// is, behind a header of its own, and the batch leaves in one vectored write.
#[derive(Default)]
struct Batch {
    /// The rest of a frame begun by a write-through (it was queued first).
    front: Vec<u8>,
    small: Vec<u8>,
    /// Each large frame as its header and its body.
    large: Vec<(Vec<u8>, Vec<u8>)>,
    bytes: usize,
    /// Messages in the batch (the end mark too).
    messages: usize,
    /// What the batch's messages count for in [`QueuedBytes`].
    accounted: usize,
}

impl Batch {
    fn push(&mut self, message: Outgoing) {
        self.messages += 1;
        self.accounted += queued_cost(&message);
        let large = match message {
            Outgoing::Framed(bytes) => {
                self.bytes += bytes.len();
                self.front.extend_from_slice(&bytes);
                return;
            }
            Outgoing::Encoded(body) if body.len() >= LARGE_FRAME => body,
            other => {
                let start = self.small.len();
                other.encode_into(&mut self.small);
                let length = self.small.len() - start;
                self.bytes += length;
                if length < LARGE_FRAME {
                    return;
                }
                // A large frame encoded here (rare: the service's answers are small).
                let frame = self.small.split_off(start);
                self.large.push((Vec::new(), frame));
                return;
            }
        };
        let header = framing::header(large.len()).into_bytes();
        self.bytes += header.len() + large.len();
        self.large.push((header, large));
    }

    /// The first message and whatever else is queued, up to [`MAX_BATCH_BYTES`] or the
    /// end mark; whether the end mark was reached.
    fn fill(&mut self, first: Outgoing, rx: &mut mpsc::Receiver<Outgoing>) -> bool {
        self.front.clear();
        self.small.clear();
        self.large.clear();
        self.bytes = 0;
        self.messages = 0;
        self.accounted = 0;
        if matches!(first, Outgoing::End) {
            self.messages = 1;
            return true;
        }
        self.push(first);
        while self.bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(Outgoing::End) => {
                    self.messages += 1;
                    return true;
                }
                Ok(more) => self.push(more),
                Err(_) => break,
            }
        }
        false
    }

    /// The batch's bytes in the order they go out.
    fn parts(&self) -> Vec<&[u8]> {
        let large = self.large.iter().flat_map(|(header, body)| [header.as_slice(), body.as_slice()]);
        [self.front.as_slice(), self.small.as_slice()]
            .into_iter()
            .chain(large)
            .filter(|part| !part.is_empty())
            .collect()
    }
}

/// Writes every part, in as few `write` calls as the output takes (one, when it takes
/// them all).
fn write_all_vectored(output: &mut impl std::io::Write, parts: &[&[u8]]) -> std::io::Result<()> {
    use std::io::IoSlice;
    let mut slices: Vec<IoSlice<'_>> = parts.iter().map(|part| IoSlice::new(part)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        // Linux takes at most 1,024 slices a call (IOV_MAX).
        let at_once = rest.len().min(1024);
        match output.write_vectored(&rest[..at_once]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Where the serve loop's messages go, in the order sent, and when the writer is done.
struct Writer {
    done: BoxFuture<'static, ()>,
}

impl Writer {
    /// A task on the runtime writes to an async output (an in-process pipe, tests).
    fn task<O: AsyncWrite + Unpin + Send + 'static>(output: O, outflow: Outflow) -> Writer {
        let task = tokio::spawn(write_loop(output, outflow.rx, outflow.outbound.through, outflow.outbound.queued));
        Writer { done: async move { drop(task.await) }.boxed() }
    }

    /// A thread of its own encodes and writes to stdout with blocking writes.
    fn stdout_thread(outflow: Outflow) -> Writer {
        let Outflow { rx, outbound } = outflow;
        // Handed over through a slot, so that it is still here if no thread starts.
        let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(rx)));
        let (theirs, (finished, done)) = (slot.clone(), tokio::sync::oneshot::channel::<()>());
        let (through, queued) = (outbound.through.clone(), outbound.queued.clone());
        let spawned = std::thread::Builder::new().name("ctxd-writer".into()).spawn(move || {
            let Some(mut rx) = theirs.lock().ok().and_then(|mut slot| slot.take()) else { return };
            let mut stdout = RawStdout::new();
            through.enable_for_stdout();
            write_blocking(&mut rx, &mut stdout, &through, &queued);
            let _ = finished.send(());
        });
        match spawned {
            Ok(_) => Writer { done: async move { drop(done.await) }.boxed() },
            Err(e) => {
                // No thread to be had: write from the runtime instead.
                tracing::warn!(error = %e, "could not start the writer thread; writing from the runtime");
                match slot.lock().ok().and_then(|mut slot| slot.take()) {
                    Some(rx) => Writer::task(tokio::io::stdout(), Outflow { rx, outbound }),
                    None => Writer { done: async {}.boxed() },
                }
            }
        }
    }
}

/// The writer thread's loop: everything queued goes out as one vectored `write`, until
/// the end mark or a failed write.
fn write_blocking(
    rx: &mut mpsc::Receiver<Outgoing>,
    output: &mut impl std::io::Write,
    through: &WriteThrough,
    queued: &QueuedBytes,
) {
    let mut batch = Batch::default();
    while let Some(first) = rx.blocking_recv() {
        let end = batch.fill(first, rx);
        let written = write_all_vectored(output, &batch.parts());
        through.note_written(batch.messages);
        queued.release(batch.accounted);
        if end || written.is_err() || output.flush().is_err() {
            break;
        }
    }
    let _ = output.flush();
}

/// The daemon's stdout without the standard library's line buffering. `Stdout` is a
/// `LineWriter`: a frame `Content-Length: n\r\n\r\n{…}` left it as two writes, the
/// header at once and the body on flush, so a client blocked in `read` woke for the
/// header alone and had to wait for the body again. Here each part of a batch is one
/// `write` on a duplicate of descriptor 1 (the lock on `Stdout` is held all along, so
/// nothing else can write between); if the descriptor cannot be duplicated, the locked
/// `Stdout` is used as before.
struct RawStdout {
    lock: std::io::StdoutLock<'static>,
    file: Option<std::fs::File>,
}

impl RawStdout {
    fn new() -> RawStdout {
        use std::os::fd::AsFd;
        let lock = std::io::stdout().lock();
        let file = match lock.as_fd().try_clone_to_owned() {
            Ok(fd) => {
                widen_pipe(&fd);
                Some(std::fs::File::from(fd))
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not duplicate stdout; writing through its line buffer");
                None
            }
        };
        RawStdout { lock, file }
    }
}

/// The pipe capacity asked for when stdout is a pipe (Linux's default is 64 KiB, and
/// 1 MiB is the default `/proc/sys/fs/pipe-max-size`, the most an unprivileged process
/// may set).
#[cfg(target_os = "linux")]
const PIPE_CAPACITY: usize = 1 << 20;

/// Raises a pipe's capacity to [`PIPE_CAPACITY`]. A whole assembled request can be
/// hundreds of KB: through a 64 KiB pipe the writer thread blocks until the client has
/// read all but the last 64 KiB, and every answer queued behind it (a short append's
/// among them) waits for those round trips. Not a pipe, or a limit set lower: left as is.
/// Linux only (`F_SETPIPE_SZ`); elsewhere pipes keep their size.
#[cfg(not(target_os = "linux"))]
fn widen_pipe(_fd: &std::os::fd::OwnedFd) {}

/// See the other `widen_pipe`.
#[cfg(target_os = "linux")]
fn widen_pipe(fd: &std::os::fd::OwnedFd) {
    let Ok(before) = rustix::pipe::fcntl_getpipe_size(fd) else { return };
    if before >= PIPE_CAPACITY {
        return;
    }
    match rustix::pipe::fcntl_setpipe_size(fd, PIPE_CAPACITY) {
        Ok(after) => tracing::debug!(before, after, "stdout pipe widened"),
        Err(e) => tracing::debug!(before, error = %e, "stdout pipe left at its size"),
    }
}

impl std::io::Write for RawStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut self.file {
            Some(file) => file.write(buf),
            None => self.lock.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match &mut self.file {
            Some(file) => file.write_vectored(bufs),
            None => self.lock.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.file {
            Some(file) => file.flush(),
            None => self.lock.flush(),
        }
    }
}

async fn write_loop<O: AsyncWrite + Unpin>(
    mut output: O,
    mut rx: mpsc::Receiver<Outgoing>,
    through: std::sync::Arc<WriteThrough>,
    queued: std::sync::Arc<QueuedBytes>,
) {
    // Everything queued goes out in one write: tokio's stdout hands each write to a
    // blocking thread, so one write per message would cost one hand-off per message.
    let mut batch = Batch::default();
    'write: while let Some(first) = rx.recv().await {
        let end = batch.fill(first, &mut rx);
        for part in batch.parts() {
            if output.write_all(part).await.is_err() {
                break 'write;
            }
        }
        through.note_written(batch.messages);
        queued.release(batch.accounted);
        if end || output.flush().await.is_err() {
            break;
        }
    }
    let _ = output.flush().await;
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::client::RpcClient;

    /// A router for the transport's own tests: `test/boom` panics (at once, or after a
    /// yield with `"later": true`), `test/log` notes its `n` when first polled and
    /// answers it, `exit` stops. Everything else answers its params.
    struct TestRouter {
        log: std::sync::Arc<std::sync::Mutex<Vec<i64>>>,
    }

    impl Router for TestRouter {
        fn route(&self, message: Message<'_>) -> Routed {
            if message.method == "exit" {
                return Routed::Exit(Ending::ExitWithoutShutdown);
            }
            let Some(id) = message.id else { return Routed::Nothing };
            let params: Value = message.params.map_or(Value::Null, |p| serde_json::from_str(p.get()).unwrap());
            let (method, log) = (message.method.to_owned(), self.log.clone());
            let reply = async move {
                match method.as_str() {
                    "test/boom" => {
                        if params["later"] == true {
                            tokio::task::yield_now().await;
                        }
                        panic!("deliberate panic for the test");
                    }
                    "test/log" => {
                        log.lock().unwrap().push(params["n"].as_i64().unwrap());
                        tokio::task::yield_now().await;
                    }
                    _ => {}
                }
                encode_result(&id, &params, 64).ok().map(Answer::Encoded)
            };
            Routed::Reply { reply: reply.boxed(), cancellable: true, exclusive: false }
        }
    }

    #[test]
    fn a_batch_puts_small_frames_first_each_group_in_its_order() {
        let (tx, mut rx) = mpsc::channel::<Outgoing>(16);
        let large = |n: u8| Outgoing::Encoded(vec![b'0' + n; LARGE_FRAME + 10]);
        let small = |n: u8| Outgoing::Encoded(vec![b'0' + n; 10]);
        let notification = Outgoing::Request(Request::build("ctx/usageChanged").params(json!({"n": 1})).finish());
        // Large, but encoded by the writer itself rather than by a fast path.
        let large_notification = Outgoing::Request(
            Request::build("ctx/contextChanged").params(json!({"text": "6".repeat(LARGE_FRAME)})).finish(),
        );
        for message in [small(2), large(3), notification, small(4), large_notification, large(5)] {
            tx.try_send(message).ok().unwrap();
        }
        let mut batch = Batch::default();
        batch.fill(large(1), &mut rx);
        let text = String::from_utf8(batch.parts().concat()).unwrap();
        let frames: Vec<&str> = text.split("Content-Length: ").skip(1).collect();
        let order: Vec<char> =
            frames.iter().filter_map(|frame| frame.split("\r\n\r\n").nth(1)?.chars().next()).collect();
        assert_eq!(order, ['2', '{', '4', '1', '3', '{', '5'], "{}", &text[..200]);
        assert!(frames[1].contains("ctx/usageChanged") && frames[5].contains("ctx/contextChanged"));
        // Every frame's length header is its body's.
        for frame in frames {
            let (length, body) = frame.split_once("\r\n\r\n").unwrap();
            assert_eq!(length.parse::<usize>().unwrap(), body.len());
        }
        assert_eq!(batch.bytes, text.len());
    }

    #[test]
    fn a_vectored_write_finishes_whatever_each_call_takes() {
        /// Takes at most 7 bytes a call, across slices.
        struct Trickle(Vec<u8>, usize);
        impl std::io::Write for Trickle {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                let n = buf.len().min(7);
                self.0.extend_from_slice(&buf[..n]);
                self.1 += 1;
                Ok(n)
            }
            fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
                let joined: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).take(7).collect();
                self.0.extend_from_slice(&joined);
                self.1 += 1;
                Ok(joined.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let parts: [&[u8]; 4] = [b"abc", b"defghijkl", b"m", b"nopqrstuvwxyz"];
        let mut out = Trickle(Vec::new(), 0);
        write_all_vectored(&mut out, &parts).unwrap();
        assert_eq!(out.0, b"abcdefghijklmnopqrstuvwxyz");
        assert_eq!(out.1, 4, "26 bytes, 7 a call");
    }

    #[test]
    fn the_rest_of_a_frame_begun_by_a_write_through_goes_out_before_any_other() {
        let (tx, mut rx) = mpsc::channel::<Outgoing>(16);
        tx.try_send(Outgoing::Framed(b"the rest}".to_vec())).ok().unwrap();
        tx.try_send(Outgoing::Encoded(vec![b'x'; LARGE_FRAME])).ok().unwrap();
        tx.try_send(Outgoing::Encoded(b"{}".to_vec())).ok().unwrap();
        tx.try_send(Outgoing::End).ok().unwrap();
        let (mut out, through) = (Vec::new(), WriteThrough::default());
        (0..4).for_each(|_| through.note_queued());
        write_blocking(&mut rx, &mut out, &through, &QueuedBytes::default());
        assert!(
            out.starts_with(b"the rest}Content-Length: 2\r\n\r\n{}Content-Length: 16384"),
            "{}",
            String::from_utf8_lossy(&out[..60])
        );
        assert_eq!(through.queued(), 0);
    }

    #[test]
    fn the_writer_sends_each_batch_in_one_write() {
        /// Records each `write` call; a line buffer in between would split a frame.
        #[derive(Default)]
        struct Calls(Vec<Vec<u8>>);
        impl std::io::Write for Calls {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.push(buf.to_vec());
                Ok(buf.len())
            }
            fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
                self.0.push(bufs.iter().flat_map(|b| b.iter().copied()).collect());
                Ok(self.0.last().map_or(0, Vec::len))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (tx, mut rx) = mpsc::channel::<Outgoing>(16);
        // A large frame first: the small ones overtake it, and all leave in one call.
        tx.try_send(Outgoing::Encoded(vec![b'x'; LARGE_FRAME])).ok().unwrap();
        for n in 0..3u8 {
            tx.try_send(Outgoing::Encoded(format!("{{\"n\":{n}}}").into_bytes())).ok().unwrap();
        }
        tx.try_send(Outgoing::End).ok().unwrap();
        let mut calls = Calls::default();
        let through = WriteThrough::default();
        (0..5).for_each(|_| through.note_queued());
        write_blocking(&mut rx, &mut calls, &through, &QueuedBytes::default());
        assert_eq!(through.queued(), 0, "each message written is counted off");
        assert_eq!(
            calls.0.len(),
            1,
            "{:?}",
            calls.0.iter().map(|c| String::from_utf8_lossy(&c[..c.len().min(80)]).into_owned()).collect::<Vec<_>>()
        );
        let text = String::from_utf8(calls.0.concat()).unwrap();
        assert_eq!(text.matches("Content-Length: 7\r\n\r\n").count(), 3, "{}", &text[..100]);
        let large = format!("{{\"n\":2}}Content-Length: {LARGE_FRAME}\r\n\r\n{}", "x".repeat(LARGE_FRAME));
        assert!(text.ends_with(&large), "{}", &text[..100]);
        // The real stdout is written through a duplicate of its descriptor, not its line buffer.
        assert!(RawStdout::new().file.is_some());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_pipe_on_stdout_is_widened_up_to_the_limit() {
        let (_read, write) = rustix::pipe::pipe().unwrap();
        let before = rustix::pipe::fcntl_getpipe_size(&write).unwrap();
        widen_pipe(&write);
        let after = rustix::pipe::fcntl_getpipe_size(&write).unwrap();
        let limit: usize = std::fs::read_to_string("/proc/sys/fs/pipe-max-size").unwrap().trim().parse().unwrap();
        if limit >= PIPE_CAPACITY {
            assert_eq!(after, PIPE_CAPACITY, "raised from {before}");
        } else {
            assert_eq!(after, before, "a limit below the capacity leaves the pipe alone");
        }
        // Not a pipe: nothing to do, and nothing fails.
        let file = tempfile::tempfile().unwrap();
        widen_pipe(&std::os::fd::OwnedFd::from(file));
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_an_error_and_the_server_lives_on() {
        let router = std::sync::Arc::new(TestRouter { log: Default::default() });
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let (server_read, server_write) = tokio::io::split(server_io);
        let (_, outflow) = Outbound::channel();
        let server = tokio::spawn(serve(server_read, server_write, router, Limits::default(), outflow));
        let (client_read, client_write) = tokio::io::split(client_io);
        let client = RpcClient::new(client_read, client_write);
        for later in [false, true] {
            let error = client.request("test/boom", json!({"later": later})).await.unwrap_err().to_string();
            assert!(error.contains("deliberate panic") && error.contains("test/boom"), "{error}");
        }
        let fine = client.request("test/echo", json!({"n": 1})).await.unwrap();
        assert_eq!(fine["n"], 1);
        client.notify("exit", Value::Null).await.unwrap();
        assert_eq!(server.await.unwrap(), Ending::ExitWithoutShutdown);
    }

    /// Requests pipelined, some answered at once and some later, reach their handlers in
    /// the order sent (what keeps a session's commands in order).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_pipelined_start_in_the_order_sent() {
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let router = std::sync::Arc::new(TestRouter { log: log.clone() });
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let (server_read, server_write) = tokio::io::split(server_io);
        let (_, outflow) = Outbound::channel();
        let server = tokio::spawn(serve(server_read, server_write, router, Limits::default(), outflow));
        let (client_read, mut client_write) = tokio::io::split(client_io);
        let mut answers = FrameReader::new(client_read, 1 << 20);
        let frame = |message: Value| {
            let mut out = Vec::new();
            framing::encode_into(&serde_json::to_vec(&message).unwrap(), &mut out);
            out
        };
        let total = 400i64;
        let mut bytes = Vec::new();
        for n in 0..total {
            // Some requests on another method between the logged ones.
            if n % 7 == 0 {
                bytes.extend(frame(json!({"jsonrpc": "2.0", "id": -n - 1, "method": "test/echo", "params": {}})));
            }
            bytes.extend(frame(json!({"jsonrpc": "2.0", "id": n + 1, "method": "test/log", "params": {"n": n}})));
        }
        for piece in bytes.chunks(4096) {
            client_write.write_all(piece).await.unwrap();
            tokio::task::yield_now().await;
        }
        for _ in 0..total + (total + 6) / 7 {
            let body = answers.next_frame().await.unwrap().unwrap();
            assert!(!body.contains("\"error\""), "{body}");
        }
        assert_eq!(*log.lock().unwrap(), (0..total).collect::<Vec<_>>());
        client_write.write_all(&frame(json!({"jsonrpc": "2.0", "method": "exit"}))).await.unwrap();
        assert_eq!(server.await.unwrap(), Ending::ExitWithoutShutdown);
    }

    #[test]
    fn a_well_formed_request_is_read_borrowed_and_anything_else_as_decode_reads_it() {
        let message = |body: &str| match read_message(Ok(body.to_owned())) {
            Read::Message(body) => {
                let m = body.message().unwrap();
                Some((m.id.clone(), m.method.to_owned(), m.params.map(|p| p.get().to_owned()), body.decoded.is_some()))
            }
            _ => None,
        };
        let borrowed = message(r#"{"jsonrpc":"2.0","id":3,"method":"ctx/usage","params":{"sessionId":"s"}}"#);
        assert_eq!(
            borrowed,
            Some((Some(Id::Number(3)), "ctx/usage".into(), Some(r#"{"sessionId":"s"}"#.into()), false))
        );
        // An escape in the method: read as a value tree, the same message.
        let decoded = message(r#"{"jsonrpc":"2.0","id":"a","method":"ctx\/usage","params":{"sessionId":"s"}}"#);
        assert_eq!(
            decoded,
            Some((Some(Id::String("a".into())), "ctx/usage".into(), Some(r#"{"sessionId":"s"}"#.into()), true))
        );
        // Wrong version, params a string, a float id: the errors decode gives.
        for bad in [
            r#"{"jsonrpc":"1.0","id":1,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":"x"}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"m"}"#,
        ] {
            match read_message(Ok(bad.to_owned())) {
                Read::Invalid(response) => {
                    assert!(serde_json::to_string(&response).unwrap().contains("-32600"), "{bad}")
                }
                _ => panic!("{bad} was read as a message"),
            }
        }
    }
}
