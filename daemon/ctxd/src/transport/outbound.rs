//! The way out: one queue for every answer and notification, in the order they were put
//! on it, and the back-pressure that keeps it bounded in bytes.
//!
//! Why one queue: a session that notifies and then answers must be heard in that order
//! whichever task sends each, and a client that stops reading must slow the reader down
//! rather than grow the daemon's heap. The writer that empties the queue is in `write`;
//! an answer with nothing queued before it may skip the queue (`through`).

use tokio::sync::mpsc;
use tower_lsp_server::jsonrpc::{Request, Response};

use super::Answer;
use super::framing;
use super::through::{Through, WriteThrough};

/// The daemon's way out to the client, for answers and notifications alike: one queue
/// that the writer empties in the order messages were put on it. A session actor that
/// sends a notification and then answers a request puts both here in that order, so a
/// notification a request caused goes out before its answer, whichever task sends it.
#[derive(Clone)]
pub struct Outbound {
    tx: mpsc::Sender<Outgoing>,
    notifying: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub(super) through: std::sync::Arc<WriteThrough>,
    pub(super) queued: std::sync::Arc<QueuedBytes>,
}

/// Bytes queued for the client and not written yet, and the size answers have had
/// lately. The reader starts a request only while the queue plus the answers of the
/// requests in flight (at that size each) stay under [`MAX_QUEUED_BYTES`]: a client
/// that pipelines requests and does not read its answers holds the daemon's memory to
/// about this bound, instead of one answer per request it sent.
#[derive(Debug)]
pub(super) struct QueuedBytes {
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
    pub(super) fn add(&self, bytes: usize) {
        self.bytes.fetch_add(bytes, std::sync::atomic::Ordering::AcqRel);
    }

    /// Notes the size of an answer: a new maximum at once, a smaller one slowly.
    fn note_answer(&self, size: usize) {
        use std::sync::atomic::Ordering;
        let _ = self.typical_answer.fetch_update(Ordering::AcqRel, Ordering::Acquire, |typical| {
            Some(size.max(typical - typical / 8).max(1024))
        });
    }

    /// The writer wrote `bytes` of what was queued.
    pub(super) fn release(&self, bytes: usize) {
        let before = self.bytes.fetch_sub(bytes, std::sync::atomic::Ordering::AcqRel);
        if before.saturating_sub(bytes) <= MAX_QUEUED_BYTES {
            self.drained.notify_waiters();
        }
    }

    /// Returns once the queue and the answers of the `in_flight()` requests fit in
    /// [`MAX_QUEUED_BYTES`] (with nothing in flight, once the queue does).
    pub(super) async fn room(&self, in_flight: impl Fn() -> usize) {
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

impl QueuedBytes {
    /// A request in flight was answered: the reader may have room again.
    pub(super) fn answered(&self) {
        self.drained.notify_waiters();
    }
}

/// What a message counts for in [`QueuedBytes`]: its bytes when known before encoding,
/// a nominal size for the small messages encoded by the writer.
pub(super) fn queued_cost(message: &Outgoing) -> usize {
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
    pub(super) rx: mpsc::Receiver<Outgoing>,
    pub(super) outbound: Outbound,
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
    pub(super) async fn send(&self, message: Outgoing) {
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

/// A message on its way out, encoded by the writer (not by the serve loop).
pub(super) enum Outgoing {
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Back-pressure: the reader waits while the unread answers, with those of the
    /// requests in flight at the size answers have had lately, are over the bound, and
    /// goes on once the writer wrote enough or a request was answered.
    #[tokio::test]
    async fn the_reader_waits_while_unread_answers_are_over_the_bound() {
        let queued = QueuedBytes::default();
        assert!(futures::poll!(std::pin::pin!(queued.room(|| 0))).is_ready(), "an empty queue has room");
        queued.add(MAX_QUEUED_BYTES + 1);
        let mut room = std::pin::pin!(queued.room(|| 0));
        assert!(futures::poll!(room.as_mut()).is_pending());
        queued.release(MAX_QUEUED_BYTES + 1);
        room.await;
        queued.note_answer(1024 * 1024);
        let in_flight = AtomicUsize::new(65);
        let mut room = std::pin::pin!(queued.room(|| in_flight.load(Ordering::Acquire)));
        assert!(futures::poll!(room.as_mut()).is_pending(), "65 answers of 1 MiB would not fit");
        in_flight.store(64, Ordering::Release);
        queued.answered();
        room.await;
    }
}
