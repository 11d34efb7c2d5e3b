//! The LSP lifecycle: `initialize` opens the store and starts the sessions,
//! `initialized` and `workspace/didChangeConfiguration` reach them, `shutdown` closes
//! them (then every request is refused until `exit`), and `$/cancelRequest` names a
//! request to stop.

use std::path::PathBuf;
use std::sync::Arc;

use ctxd_proto::{self as proto, methods};
use futures::FutureExt;
use serde_json::Value;
use serde_json::value::RawValue;
use tower_lsp_server::jsonrpc::{Error, Id};
use tower_lsp_server::ls_types::{
    DidChangeConfigurationParams, InitializeParams, InitializeResult, ServerCapabilities, ServerInfo,
};

use super::dispatch::{self, Result, internal, store_error};
use super::{Backend, Lifecycle};
use crate::session::{Environment, Notifier, Sessions};
use crate::settings::SettingsSources;
use crate::store::Store;
use crate::transport::Routed;

impl Backend {
    /// `initialize`: once, and nothing else is read until it has answered (a client
    /// may pipeline its first requests behind it). A failed one may be tried again.
    pub(super) fn initialize_request(self: &Arc<Self>, id: Id, params: Option<&RawValue>) -> Routed {
        if self.lifecycle() != Lifecycle::Uninitialized {
            tracing::warn!("a second `initialize`; refused");
            return Routed::Reply {
                reply: dispatch::refuse(id, Error::invalid_request()),
                cancellable: false,
                exclusive: false,
            };
        }
        let params = match dispatch::decode::<InitializeParams>(params) {
            Ok(params) => params,
            Err(e) => return Routed::Reply { reply: dispatch::refuse(id, e), cancellable: false, exclusive: false },
        };
        self.set_lifecycle(Lifecycle::Initializing);
        let backend = self.clone();
        let reply = async move {
            let result = backend.initialize(params).await;
            backend.set_lifecycle(if result.is_ok() { Lifecycle::Initialized } else { Lifecycle::Uninitialized });
            Some(dispatch::answer(id, result, dispatch::small))
        };
        Routed::Reply { reply: reply.boxed(), cancellable: false, exclusive: true }
    }

    /// `shutdown`: every session closed; from now on every request is refused.
    pub(super) fn shutdown_request(self: &Arc<Self>, id: Id) -> Routed {
        self.set_lifecycle(Lifecycle::ShutDown);
        let backend = self.clone();
        let reply = async move {
            // Another editor's shutdown ends its connection only: the sessions stay open
            // for the editor that started the daemon.
            if let Some(sessions) = backend.sessions.get().filter(|_| backend.guest.is_none()) {
                sessions.close_all().await;
            }
            tracing::info!("shutdown");
            Some(dispatch::answer(id, Ok(Value::Null), dispatch::small))
        };
        Routed::Reply { reply: reply.boxed(), cancellable: true, exclusive: false }
    }

    /// A notification between `initialize` and `shutdown`. Params that do not read are
    /// ignored (a notification has no answer to carry the error).
    pub(super) fn notification(&self, method: &str, params: Option<&RawValue>) -> Routed {
        match method {
            "initialized" => self.initialized(),
            "workspace/didChangeConfiguration" => match dispatch::decode::<DidChangeConfigurationParams>(params) {
                Ok(params) => self.did_change_configuration(params),
                Err(e) => tracing::warn!(error = %e.message, "didChangeConfiguration: params ignored"),
            },
            "$/cancelRequest" => {
                #[derive(serde::Deserialize)]
                struct Cancel {
                    id: Id,
                }
                if let Ok(Cancel { id }) = dispatch::decode::<Cancel>(params) {
                    return Routed::Cancel(id);
                }
            }
            _ => tracing::debug!(method, "a notification ctxd does not handle; ignored"),
        }
        Routed::Nothing
    }

    async fn initialize(&self, params: InitializeParams) -> Result<InitializeResult> {
        let options: proto::InitializationOptions = match params.initialization_options {
            None | Some(Value::Null) => proto::InitializationOptions::default(),
            Some(value) => serde_json::from_value(value)
                .map_err(|e| Error::invalid_params(format!("initializationOptions: {e}")))?,
        };
        if let Some(guest) = self.guest {
            return self.initialize_guest(options, guest);
        }
        let state_dir = options.state_dir.as_ref().map_or_else(|| self.options.state_dir.clone(), PathBuf::from);
        let dir = state_dir.clone();
        // The lock taken at start is for the command line's store; another one is taken
        // here, and the command line's store is let go (its socket first).
        let claimed = self.options.sharing.as_ref().and_then(|s| s.lock.lock().ok()?.take());
        let same_store = state_dir == self.options.state_dir;
        if !same_store && let Some(sharing) = &self.options.sharing {
            crate::shared::stop_listening(sharing);
        }
        let claimed = claimed.filter(|_| same_store);
        let store = tokio::task::spawn_blocking(move || Store::open_with(&dir, claimed))
            .await
            .map_err(|e| internal(format!("opening the store: {e}")))?
            .map_err(store_error)?;
        let degraded = store.index().degraded.as_ref().map(|reason| {
            format!("the store's index cannot be written ({reason}); a temporary one is used, and appends fail until the disk has room")
        });
        if store.index().fresh && !store.session_ids().unwrap_or_default().is_empty() {
            tracing::info!("index is new; session entries will be rebuilt from the transcripts as sessions open");
        }
        let client = crate::settings::client_layer("initializationOptions.settings", options.settings.as_ref());
        for problem in &client.problems {
            tracing::warn!(%problem, "settings");
        }
        let process = &self.options.env;
        let environment = Environment {
            process: process.clone(),
            client_window: options.auto_compact_window,
            client_settings: client.settings,
            sources: SettingsSources::standard(&state_dir, process),
            services: crate::session::Services::start(process, &state_dir),
        };
        let sessions = Arc::new(Sessions::new(Arc::new(store), environment, Notifier::new(self.outbound.clone())));
        if self.sessions.set(sessions.clone()).is_err() {
            return Err(Error::invalid_request());
        }
        // Notifications reach the client from a successful `initialize` on; no session
        // exists before it to send one.
        self.outbound.start_notifications();
        if let Some(sharing) = &self.options.sharing {
            crate::shared::serve_others(sharing, &state_dir, sessions, self.options.clone());
        }

        tracing::info!(state_dir = %state_dir.display(), "initialized");
        Ok(initialize_result(&state_dir, std::process::id(), degraded))
    }

    /// `initialize` from another editor (see `crate::shared`): the daemon's sessions and
    /// store; its settings, if it sends any, apply as a `didChangeConfiguration` would.
    fn initialize_guest(&self, options: proto::InitializationOptions, guest: super::Guest) -> Result<InitializeResult> {
        let sessions = self.sessions()?;
        let served = sessions.store().root().to_owned();
        // The same directory spelled another way (a trailing slash, a symlink) is the same store.
        let same = |a: &std::path::Path, b: &std::path::Path| {
            a == b || matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(a), Ok(b)) if a == b)
        };
        if let Some(asked) = options.state_dir.as_deref().map(PathBuf::from)
            && !same(&asked, &served)
        {
            return Err(Error::invalid_params(format!(
                "this ctxd serves the store at {} (another editor's daemon); initializationOptions.stateDir asks for {}: start ctxd with --state-dir {} for that store",
                served.display(),
                asked.display(),
                asked.display()
            )));
        }
        if options.settings.is_some() {
            let client = crate::settings::client_layer("initializationOptions.settings", options.settings.as_ref());
            for problem in &client.problems {
                tracing::warn!(%problem, "settings");
            }
            tracing::info!("settings from another editor: they apply to every editor this daemon serves");
            sessions.settings_changed(client.settings);
        }
        if options.auto_compact_window.is_some() {
            tracing::info!(
                "initializationOptions.autoCompactWindow of another editor ignored: the first editor's holds"
            );
        }
        self.outbound.start_notifications();
        tracing::info!(pid = ?guest.peer_pid, "another editor initialized");
        let degraded = sessions
            .store()
            .index()
            .degraded
            .as_ref()
            .map(|reason| format!("the store's index cannot be written ({reason})"));
        Ok(initialize_result(&served, guest.peer_pid.unwrap_or_else(std::process::id), degraded))
    }

    fn initialized(&self) {
        tracing::debug!("client initialized");
        // `gateway.enabled`: this daemon serves the gateway too (the editor's, not a guest's).
        if self.guest.is_none()
            && let Ok(sessions) = self.sessions()
            && let Some(gateway) = sessions.daemon_settings().gateway.filter(|g| g.enabled == Some(true))
        {
            crate::gateway::start_in_daemon(
                &gateway,
                sessions.live_figures(),
                sessions.store().root().to_path_buf(),
                self.options.env.clone(),
            );
        }
        // The daemon's own editor started what its settings ask for; another's adds nothing.
        if self.guest.is_none()
            && let Ok(sessions) = self.sessions()
            && sessions.daemon_settings().observe_claude_projects == Some(true)
            && let Some(root) = sessions.claude_projects_dir()
        {
            tracing::info!(root = %root.display(), "observing Claude Code projects");
            sessions.follow_claude_projects(root);
        }
    }

    fn did_change_configuration(&self, params: DidChangeConfigurationParams) {
        let Ok(sessions) = self.sessions() else { return };
        let object = match &params.settings {
            Value::Object(map) => Some(map.clone()),
            Value::Null => None,
            Value::Array(items) if items.is_empty() => None,
            other => {
                tracing::warn!(settings = %other, "didChangeConfiguration: settings must be an object; ignored");
                return;
            }
        };
        let layer = crate::settings::client_layer("workspace/didChangeConfiguration", object.as_ref());
        for problem in &layer.problems {
            tracing::warn!(%problem, "settings");
        }
        sessions.settings_changed(layer.settings);
    }
}

/// The answer to `initialize`: ctxd's capabilities under `experimental.ctxd`.
fn initialize_result(state_dir: &std::path::Path, process_id: u32, degraded: Option<String>) -> InitializeResult {
    let capabilities = proto::CtxdCapabilities {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        protocol: 1,
        methods: methods::REQUESTS.iter().map(|m| (*m).to_owned()).collect(),
        notifications: methods::NOTIFICATIONS.iter().map(|m| (*m).to_owned()).collect(),
        state_dir: state_dir.display().to_string(),
        process_id,
        degraded,
    };
    let experimental = serde_json::json!({ "ctxd": capabilities });
    InitializeResult {
        capabilities: ServerCapabilities { experimental: Some(experimental), ..ServerCapabilities::default() },
        server_info: Some(ServerInfo { name: "ctxd".to_owned(), version: Some(env!("CARGO_PKG_VERSION").to_owned()) }),
        ..InitializeResult::default()
    }
}
