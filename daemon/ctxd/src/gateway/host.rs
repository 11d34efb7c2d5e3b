//! `ctxd gateway`: the gateway in the foreground, for scripts and service managers,
//! and the daemon for people who use Claude Code in a terminal with no editor.
//!
//! Besides serving the gateway it takes the store, as the first `ctxd serve` would, and
//! hosts what an editor's daemon hosts: it follows every Claude Code project under
//! `~/.claude/projects` (or `$CLAUDE_CONFIG_DIR/projects`), compacts idle sessions as
//! `~/.config/ctxd/settings.json` says (`claudeIdleCompaction`), and listens on the
//! store's socket, so editors started later share it (their `ctxd serve` relays to it)
//! and get `ctx/usageChanged` with the gateway's live figures. When an editor's daemon
//! already holds the store, the gateway runs alone and says so: its figures are then on
//! `/ctxd/sessions` only (that daemon can run the gateway itself, `gateway.enabled`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{Config, Limits, LiveFigures};
use crate::process_env::ProcessEnv;
use crate::server::{ServeOptions, Sharing};
use crate::session::{Environment, Notifier, Services, Sessions};
use crate::settings::SettingsSources;

/// The command line of `ctxd gateway`; a flag not given falls back to the settings.
#[derive(Debug, Clone)]
pub struct Options {
    pub state_dir: PathBuf,
    pub env: Arc<ProcessEnv>,
    pub listen: Option<String>,
    pub upstream: Option<String>,
    pub allow_remote: bool,
    /// Overrides [`Limits::idle`] (tests).
    pub idle: Option<Duration>,
    /// `--precompute-idle`, `--precompute-at`: over `gateway.precomputeIdleSeconds`
    /// and `gateway.precomputeAtPercent`.
    pub precompute_idle: Option<u64>,
    pub precompute_at: Option<u64>,
}

/// Runs until SIGINT or SIGTERM. `announce` is told the bound address once the
/// gateway accepts connections.
pub async fn run(options: Options, announce: impl FnOnce(SocketAddr)) -> anyhow::Result<()> {
    let sources = SettingsSources::standard(&options.state_dir, &options.env);
    let home = sources.home.clone().unwrap_or_else(|| PathBuf::from("/"));
    let none = ctxd_proto::Settings::default();
    let layered = crate::settings::resolve(&sources, &home, &none, &none);
    for problem in &layered.problems {
        tracing::warn!(%problem, "settings");
    }
    let settings = layered.settings.gateway.clone().unwrap_or_default();
    let listen_text = options.listen.clone().unwrap_or_else(|| settings.listen_or_default().to_owned());
    let listen = super::listen_address(&listen_text, options.allow_remote).map_err(anyhow::Error::msg)?;
    let upstream = options.upstream.clone().unwrap_or_else(|| settings.upstream_or_default().to_owned());
    let mut limits = Limits::default();
    if let Some(idle) = options.idle {
        limits.idle = idle;
    }
    let prepare = super::prepare_settings(&settings, options.precompute_idle, options.precompute_at);
    let config = Config {
        listen,
        upstream,
        allow_remote: options.allow_remote,
        limits,
        prepare,
        state_dir: Some(options.state_dir.clone()),
        env: Some(options.env.clone()),
    };

    let hosted = host_services(&options).await;
    let live = hosted.as_ref().map_or_else(LiveFigures::default, |(sessions, _)| sessions.live_figures());
    let bound = super::bind(config, live).await.map_err(anyhow::Error::msg)?;
    let at = bound.local_addr()?;
    tracing::info!(listen = %at, upstream = %bound.gateway().upstream.origin().ascii_serialization(), "gateway started");
    announce(at);

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        () = bound.serve() => {}
        _ = tokio::signal::ctrl_c() => tracing::info!("gateway: interrupted; stopping"),
        _ = terminate.recv() => tracing::info!("gateway: terminated; stopping"),
    }
    if let Some((sessions, sharing)) = hosted {
        crate::shared::stop_listening(&sharing);
        sessions.close_all().await;
    }
    Ok(())
}

/// Takes the store and starts the daemon's services on it; `None` (with the reason in
/// the log) when another daemon holds it or it cannot be opened.
async fn host_services(options: &Options) -> Option<(Arc<Sessions>, Arc<Sharing>)> {
    let dir = options.state_dir.clone();
    let claim = tokio::task::spawn_blocking(move || crate::shared::claim(&dir)).await.ok()?;
    let lock = match claim {
        crate::shared::Claim::Daemon(lock) => lock,
        crate::shared::Claim::Relay(_) => {
            tracing::warn!(
                "another ctxd (an editor's daemon) holds the store: the gateway runs alone, its figures on /ctxd/sessions only; set `gateway.enabled` for that daemon to have its editors see them"
            );
            return None;
        }
    };
    let dir = options.state_dir.clone();
    let store = match tokio::task::spawn_blocking(move || crate::store::Store::open_with(&dir, lock)).await {
        Ok(Ok(store)) => store,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the store cannot be opened: the gateway runs without observing sessions");
            return None;
        }
        Err(_) => return None,
    };
    let process = options.env.clone();
    let environment = Environment {
        process: process.clone(),
        client_window: None,
        client_settings: ctxd_proto::Settings::default(),
        sources: SettingsSources::standard(&options.state_dir, &process),
        services: Services::start(&process, &options.state_dir),
    };
    // No editor of its own: notifications go to the editors that connect to the socket.
    let sessions = Arc::new(Sessions::new(Arc::new(store), environment, Notifier::default()));
    let sharing = Arc::new(Sharing::default());
    let serve =
        ServeOptions { state_dir: options.state_dir.clone(), env: process.clone(), sharing: Some(sharing.clone()) };
    crate::shared::serve_others(&sharing, &options.state_dir, sessions.clone(), serve);
    match sessions.claude_projects_dir() {
        Some(root) => {
            tracing::info!(root = %root.display(), "observing Claude Code projects");
            sessions.follow_claude_projects(root);
        }
        None => tracing::warn!("no home and no CLAUDE_CONFIG_DIR: Claude Code's projects are not observed"),
    }
    Some((sessions, sharing))
}
