//! The protocol surface: a table of contents of the methods ctxd answers.
//!
//! [`Server::route`] takes every message the transport reads: the LSP lifecycle
//! (`initialize`, `initialized`, `shutdown`, `exit`, `workspace/didChangeConfiguration`,
//! `$/cancelRequest`), and each `ctx/` request through one table ([`table`]) that pairs
//! the request's type (`ctxd_proto::request`) with its handler. A request's params are
//! decoded once, from the frame's text (borrowed where that
//! matters: an append's records), its handler queues one command on a session actor
//! before its first `.await`, and the answer is encoded once (see [`dispatch`]).
//!
//! - [`dispatch`]: params in, answers out, and the one mapping of errors.
//! - [`handlers`]: one function per `ctx/` method.
//! - [`lifecycle`]: `initialize` and the rest of the LSP lifecycle.
//! - [`latency`]: where a per-turn request's time went, for the `ctxd::latency` log.
//! - `crate::wire`: domain values to protocol types.

mod dispatch;
mod handlers;
mod history;
mod latency;
mod lifecycle;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use ctxd_proto::request as ctx;
use tower_lsp_server::jsonrpc::{Error, ErrorCode, Id};

use crate::process_env::ProcessEnv;
use crate::session::Sessions;
use crate::transport::{Message, Outbound, Outflow, Routed, Router};

use self::dispatch::Table;
pub use self::dispatch::rpc_error;

/// Options the daemon was started with.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// State directory unless `initializationOptions.stateDir` says otherwise.
    pub state_dir: PathBuf,
    /// The environment `main` read; the sessions get it at `initialize`.
    pub env: Arc<ProcessEnv>,
    /// For the daemon on stdio: the store's lock taken at start, and other editors
    /// served once initialized (see `crate::shared`). `None` in process (`ctxd replay`).
    pub sharing: Option<Arc<Sharing>>,
}

/// See [`ServeOptions::sharing`].
#[derive(Debug, Default)]
pub struct Sharing {
    /// The lock of `state_dir`'s store, taken at start; `initialize` opens the store
    /// with it (or drops it for another `stateDir`).
    pub lock: std::sync::Mutex<Option<crate::store::StoreLock>>,
    /// The socket other editors reach this daemon by (from the start, for the lock's
    /// store), removed when it ends.
    pub listener: std::sync::Mutex<Option<crate::shared::Listener>>,
}

/// A client that reached the daemon through its socket (another editor): the sessions
/// are the daemon's, and its `shutdown` closes none of them.
#[derive(Debug, Clone, Copy)]
struct Guest {
    /// The relay process its editor started (what `processId` names to that editor).
    peer_pid: Option<u32>,
}

/// The daemon's state behind the table: what every handler reaches.
#[derive(Debug)]
pub struct Backend {
    outbound: Outbound,
    options: ServeOptions,
    /// Set by a successful `initialize` (a guest's from the start).
    sessions: OnceLock<Arc<Sessions>>,
    lifecycle: AtomicU8,
    guest: Option<Guest>,
}

/// Where the LSP lifecycle is (what `initialize`, `shutdown` and `exit` move between).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Lifecycle {
    Uninitialized = 0,
    Initializing = 1,
    Initialized = 2,
    ShutDown = 3,
}

impl Backend {
    fn lifecycle(&self) -> Lifecycle {
        match self.lifecycle.load(Ordering::Acquire) {
            0 => Lifecycle::Uninitialized,
            1 => Lifecycle::Initializing,
            2 => Lifecycle::Initialized,
            _ => Lifecycle::ShutDown,
        }
    }

    fn set_lifecycle(&self, to: Lifecycle) {
        self.lifecycle.store(to as u8, Ordering::Release);
    }
}

/// The router the transport hands every message to.
#[derive(Debug, Clone)]
pub struct Server {
    backend: Arc<Backend>,
}

impl Server {
    /// The server, and the queue its answers and notifications leave by (for the
    /// transport's writer).
    pub fn new(options: ServeOptions) -> (Server, Outflow) {
        let (outbound, outflow) = Outbound::channel();
        let backend = Backend {
            outbound,
            options,
            sessions: OnceLock::new(),
            lifecycle: AtomicU8::new(Lifecycle::Uninitialized as u8),
            guest: None,
        };
        (Server { backend: Arc::new(backend) }, outflow)
    }

    /// A server for another editor on the daemon's `sessions` (see `crate::shared`), its
    /// answers' queue, and the handle its notifications go out by.
    pub fn guest(options: ServeOptions, sessions: Arc<Sessions>, peer_pid: Option<u32>) -> (Server, Outflow, Outbound) {
        let (outbound, outflow) = Outbound::channel();
        let backend = Backend {
            outbound: outbound.clone(),
            options,
            sessions: OnceLock::from(sessions),
            lifecycle: AtomicU8::new(Lifecycle::Uninitialized as u8),
            guest: Some(Guest { peer_pid }),
        };
        (Server { backend: Arc::new(backend) }, outflow, outbound)
    }

    /// A `ctx/` request, once initialized.
    fn ctx_request(&self, id: Id, method: &str, params: Option<&serde_json::value::RawValue>) -> Routed {
        table(Table::new(&self.backend, id, method, params), Instant::now()).finish()
    }
}

/// The table: one row per `ctx/` request, its type and its handler, whose params and
/// result must be the type's. `received` is when the request was read.
fn table(t: Table<'_>, received: Instant) -> Table<'_> {
    t.on::<ctx::OpenSession>(Backend::open_session)
        .on_append(|b: Arc<Backend>, p| b.append(p, received))
        .on_sized::<ctx::Assemble, _>(|b: Arc<Backend>, p| b.assemble(p, received), handlers::Assembled::capacity)
        .on::<ctx::Usage>(Backend::usage)
        .on::<ctx::Context>(Backend::context)
        .on::<ctx::CloseSession>(Backend::close_session)
        .on::<ctx::SetAutoCompactWindow>(Backend::set_auto_compact_window)
        .on::<ctx::FileRead>(Backend::file_read)
        .on::<ctx::Compact>(Backend::compact)
        .on::<ctx::UndoCompact>(Backend::undo_compact)
        .on::<ctx::ReportProviderError>(Backend::report_provider_error)
        .on::<ctx::Clear>(Backend::clear)
        .on::<ctx::Snip>(Backend::snip)
        .on::<ctx::Collapse>(Backend::collapse)
        .on::<ctx::Observe>(Backend::observe)
        .on::<ctx::SkillInvoked>(Backend::skill_invoked)
        .on::<ctx::SetPlan>(Backend::set_plan)
        .on::<ctx::ClaudeCompact>(Backend::claude_compact)
        .on::<ctx::ClaudeUndo>(Backend::claude_undo)
        .on::<ctx::SearchHistory>(Backend::search_history)
        .on::<ctx::ReadHistory>(Backend::read_history)
}

impl Router for Server {
    fn route(&self, message: Message<'_>) -> Routed {
        let Message { id, method, params } = message;
        let lifecycle = self.backend.lifecycle();
        if method == "exit" {
            return Routed::Exit(if lifecycle == Lifecycle::ShutDown {
                crate::transport::Ending::ExitAfterShutdown
            } else {
                crate::transport::Ending::ExitWithoutShutdown
            });
        }
        let Some(id) = id else {
            // Notifications count only between `initialize` and `shutdown`.
            if lifecycle == Lifecycle::Initialized {
                return self.backend.notification(method, params);
            }
            return Routed::Nothing;
        };
        if method == "initialize" {
            return self.backend.initialize_request(id, params);
        }
        match lifecycle {
            Lifecycle::Uninitialized | Lifecycle::Initializing => {
                let mut error = Error::new(ErrorCode::ServerError(-32002));
                error.message = "Server not initialized".into();
                Routed::Reply { reply: dispatch::refuse(id, error), cancellable: false, exclusive: false }
            }
            Lifecycle::ShutDown => Routed::Reply {
                reply: dispatch::refuse(id, Error::invalid_request()),
                cancellable: false,
                exclusive: false,
            },
            Lifecycle::Initialized if method == "shutdown" => self.backend.shutdown_request(id),
            Lifecycle::Initialized => self.ctx_request(id, method, params),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::{Table, table};

    /// The table answers exactly the methods `initialize` announces, each once: a row
    /// without an entry in the proto crate's list, or an entry without a row, fails.
    #[test]
    fn the_table_answers_exactly_the_announced_methods() {
        let rows = table(Table::listing(), Instant::now()).listed();
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), rows.len(), "a method has two rows: {rows:?}");
        let mut announced = ctxd_proto::methods::REQUESTS.to_vec();
        announced.sort_unstable();
        assert_eq!(sorted, announced);
    }
}
