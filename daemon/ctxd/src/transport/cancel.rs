//! Cancellation: the replies in flight that `$/cancelRequest` may stop.
//!
//! The router says which requests may be cancelled (only those for which "cancelled" is
//! true to the client); their replies are wrapped here, stopped by id, and answered with
//! the LSP error for a cancelled request. `exit` stops all of them.

use futures::FutureExt;
use tower_lsp_server::jsonrpc::{Error, Id, Response};

use super::{Answer, Reply};

/// The replies in flight that `$/cancelRequest` may stop, by id. Each removes itself
/// when it finishes.
#[derive(Clone, Default)]
pub(super) struct Cancellable(
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<Id, futures::future::AbortHandle>>>,
);

impl Cancellable {
    /// `reply`, stoppable by [`Cancellable::cancel`] with its id until it finishes;
    /// stopped, it answers the LSP error for a cancelled request.
    pub(super) fn wrap(&self, id: Id, reply: Reply) -> Reply {
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
    pub(super) fn cancel(&self, id: &Id) {
        if let Some(handle) = self.0.lock().ok().and_then(|mut map| map.remove(id)) {
            handle.abort();
        }
    }

    /// Stops every reply still in flight (`exit`).
    pub(super) fn cancel_all(&self) {
        if let Ok(mut map) = self.0.lock() {
            map.drain().for_each(|(_, handle)| handle.abort());
        }
    }
}
