//! What sessions tell clients without being asked: the notifications every connected
//! editor gets (`Notifier`), the `$/progress` of one request (`Progress`), and the
//! `ctx/*` notifications as LSP notification types.

use std::sync::Arc;

use ctxd_proto::{self as proto, notification};

use super::usage::UsageSnapshot;
use crate::transport::Outbound;

/// Where a session's notifications go: every connected client (the editor that started
/// the daemon, and those sharing it through its socket, see `crate::shared`). A
/// client's id filter is its own: it shows the sessions it knows.
///
/// The daemon's own editor gets back-pressure as before (a notification waits for room
/// in its queue); another editor's that is full misses the notification instead, so
/// one that stopped reading cannot stall the sessions of all the others.
#[derive(Debug, Clone, Default)]
pub struct Notifier {
    clients: Arc<std::sync::RwLock<Clients>>,
}

#[derive(Debug, Default)]
struct Clients {
    own: Option<Outbound>,
    guests: Vec<Outbound>,
}

impl Notifier {
    /// The notifier of the daemon's own editor.
    pub fn new(outbound: Outbound) -> Notifier {
        let notifier = Notifier::default();
        notifier.write().own = Some(outbound);
        notifier
    }

    /// Another editor that connected: it gets every notification from now on.
    pub fn attach(&self, outbound: Outbound) {
        self.write().guests.push(outbound);
    }

    /// Another editor that left.
    pub fn detach(&self, outbound: &Outbound) {
        self.write().guests.retain(|c| !c.same(outbound));
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Clients> {
        self.clients.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn notify<N>(&self, params: N::Params)
    where
        N: tower_lsp_server::ls_types::notification::Notification,
        N::Params: Clone,
    {
        let (own, guests) = {
            let clients = self.clients.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            (clients.own.clone(), clients.guests.clone())
        };
        for guest in &guests {
            if !guest.try_notify::<N>(params.clone()) {
                tracing::debug!(method = N::METHOD, "another editor is not reading; a notification to it dropped");
            }
        }
        if let Some(own) = own {
            own.notify::<N>(params).await;
        }
    }

    pub async fn context_changed(&self, session_id: &str, paths: Vec<String>) {
        let params = proto::ContextChangedNotification { session_id: session_id.to_owned(), paths };
        self.notify::<Lsp<notification::ContextChanged>>(params).await;
    }

    pub async fn compacted(
        &self,
        session_id: &str,
        trigger: ctxd_core::compact::Trigger,
        pre_tokens: u64,
        post_tokens: u64,
    ) {
        let params =
            proto::CompactedNotification { session_id: session_id.to_owned(), trigger, pre_tokens, post_tokens };
        self.notify::<Lsp<notification::Compacted>>(params).await;
    }

    pub async fn compact_failed(&self, session_id: &str, reason: &str) {
        let params = proto::CompactFailedNotification { session_id: session_id.to_owned(), reason: reason.to_owned() };
        self.notify::<Lsp<notification::CompactFailed>>(params).await;
    }

    pub async fn usage_changed(&self, session_id: &str, usage: UsageSnapshot) {
        let params =
            proto::UsageChangedNotification { session_id: session_id.to_owned(), usage: crate::wire::usage(&usage) };
        self.notify::<Lsp<notification::UsageChanged>>(params).await;
    }
}

/// `$/progress` for one work-done token the client passed with a request: a begin, any
/// number of reports, one end, to that client only (the token is its own).
#[derive(Debug, Clone)]
pub struct Progress {
    client: Outbound,
    token: tower_lsp_server::ls_types::NumberOrString,
}

impl Progress {
    /// `None` when the client sent no token, or one that is neither a number nor a string.
    pub fn new(client: &Outbound, token: Option<&serde_json::Value>) -> Option<Progress> {
        let token = match token? {
            serde_json::Value::Number(n) => {
                tower_lsp_server::ls_types::NumberOrString::Number(i32::try_from(n.as_i64()?).ok()?)
            }
            serde_json::Value::String(s) => tower_lsp_server::ls_types::NumberOrString::String(s.clone()),
            _ => return None,
        };
        Some(Progress { client: client.clone(), token })
    }

    pub async fn begin(&self, title: &str, message: String) {
        use tower_lsp_server::ls_types::{WorkDoneProgress, WorkDoneProgressBegin};
        let begin = WorkDoneProgressBegin {
            title: title.to_owned(),
            cancellable: Some(true),
            message: Some(message),
            percentage: Some(0),
        };
        self.send(WorkDoneProgress::Begin(begin)).await;
    }

    pub async fn report(&self, message: &str, percentage: u32) {
        use tower_lsp_server::ls_types::{WorkDoneProgress, WorkDoneProgressReport};
        let report = WorkDoneProgressReport {
            cancellable: Some(true),
            message: Some(message.to_owned()),
            percentage: Some(percentage),
        };
        self.send(WorkDoneProgress::Report(report)).await;
    }

    pub async fn end(&self, message: String) {
        use tower_lsp_server::ls_types::{WorkDoneProgress, WorkDoneProgressEnd};
        self.send(WorkDoneProgress::End(WorkDoneProgressEnd { message: Some(message) })).await;
    }

    async fn send(&self, value: tower_lsp_server::ls_types::WorkDoneProgress) {
        use tower_lsp_server::ls_types::{
            ProgressParams, ProgressParamsValue, notification::Progress as ProgressNotification,
        };
        let params = ProgressParams { token: self.token.clone(), value: ProgressParamsValue::WorkDone(value) };
        self.client.notify::<ProgressNotification>(params).await;
    }
}

/// A `ctx/` notification of the proto crate as an LSP notification type, for the
/// transport's queue.
#[derive(Debug)]
pub struct Lsp<N>(std::marker::PhantomData<N>);

impl<N: proto::Notification> tower_lsp_server::ls_types::notification::Notification for Lsp<N>
where
    N::Params: Send + Sync + 'static,
{
    type Params = N::Params;
    const METHOD: &'static str = N::METHOD;
}
