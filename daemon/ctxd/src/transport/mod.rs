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
//!
//! The parts, as the `lsp-server` crate separates them: this file is the loop that reads
//! and dispatches (and the types the router sees); `read` turns a frame into a message
//! (one decoding path); `outbound` is the queue out and its back-pressure; `write` is
//! the writer that empties it; `cancel` stops the replies `$/cancelRequest` names;
//! `framing` and `through` are the byte-level halves of reading and writing.

mod cancel;
pub mod framing;
mod outbound;
mod read;
mod through;
mod write;

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};
use tower_lsp_server::jsonrpc::{Error, ErrorCode, Id, Response};
use tracing::Instrument as _;

pub use self::outbound::{Outbound, Outflow};
pub use self::read::{Incoming, Message, decode};

use self::cancel::Cancellable;
use self::framing::FrameReader;
use self::outbound::Outgoing;
use self::read::Read;
use self::write::Writer;

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
            read::BlockingRead(std::io::stdin()),
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
        // The message as read from its frame (the envelope parsed once), or, for anything
        // unusual, as `decode` read it into a value tree.
        let decoded;
        let message = match read::read(&frame) {
            Read::Message(message) => message,
            Read::Decoded(request) => {
                decoded = request;
                decoded.message()
            }
            Read::Ignored => continue,
            Read::Invalid(response) => {
                outbound.send(Outgoing::Response(response)).await;
                continue;
            }
        };
        let (id, method) = (message.id.clone(), message.method.to_owned());
        let routed = (id, method, router.route(message));
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
                            outbound.queued.answered();
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use tokio::io::AsyncWriteExt;

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
}
