//! The gateway: an HTTP/1.1 server on loopback that Claude Code (or any client of the
//! Messages API) is pointed at with `ANTHROPIC_BASE_URL`, and that forwards every
//! request to the upstream (`https://api.anthropic.com` unless configured otherwise),
//! transparently, while reading each answer's usage as it passes. Those live figures
//! reach `GET /ctxd/sessions` on the same port and, through [`live::LiveFigures`], the
//! followers of observed Claude Code transcripts, which push `ctx/usageChanged`.
//!
//! It runs in the foreground (`ctxd gateway`, see [`host`]) or inside the shared daemon
//! (`ctxd serve` with `gateway.enabled`). Decisions are the core's
//! (`ctxd_core::gateway`); this module moves bytes:
//!
//! - [`forward`]: one request: route, refuse, answer or forward.
//! - [`body`]: the request and answer bodies, streamed and read on the way.
//! - [`live`]: the per-session figures and who follows them.
//! - [`client`]: reading a running gateway's figures from another process (`ctxd
//!   statusline`).
//! - [`host`]: the foreground command, which also hosts the daemon's services.
//! - Instant compaction: [`prepare`] (summaries prepared in the background through a
//!   fork of each session's newest request), [`prepared`] (kept on disk), [`instant`]
//!   (a compaction request answered from one, or forwarded saying why), [`costs`]
//!   (what preparing cost and answering at once saved, per session, on disk).
//!
//! Bounds: header bytes, body bytes (the API's 32 MB), streams in flight, open
//! connections, and how long a connection may sit without sending a request head.

pub mod body;
pub mod client;
pub mod costs;
pub mod forward;
pub mod host;
pub mod instant;
pub mod live;
pub mod prepare;
pub mod prepared;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use self::live::LiveFigures;

/// The header Claude Code names its session in.
pub const SESSION_HEADER: &str = "x-claude-code-session-id";

/// What the gateway allows.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request body's largest size (the Messages API's own limit).
    pub max_body_bytes: u64,
    /// Forwarded requests in flight (their answers included); past it, 529.
    pub max_streams: usize,
    /// Open client connections; past it, new ones wait in the listen queue.
    pub max_connections: usize,
    /// A request head's largest size.
    pub max_header_bytes: usize,
    /// How long a connection may take to send a request head, idle keep-alive included.
    pub idle: Duration,
    /// How long connecting to the upstream may take before the client gets 504.
    pub connect_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_body_bytes: 32 * 1024 * 1024,
            max_streams: 256,
            max_connections: 512,
            max_header_bytes: 64 * 1024,
            idle: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Where the gateway listens and forwards to.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub upstream: String,
    /// Clients beyond loopback (`--allow-remote`).
    pub allow_remote: bool,
    pub limits: Limits,
    /// Instant compaction: when to prepare summaries (`enabled: false` turns preparation
    /// and instant answers off).
    pub prepare: ctxd_core::gateway::prepare::PrepareSettings,
    /// Where prepared summaries are kept across restarts (memory only without one).
    pub state_dir: Option<PathBuf>,
    /// Where an instant answer looks up whether `ctxd mcp` is configured for the
    /// session's project, to name the history tools (none: no tools named).
    pub env: Option<Arc<crate::process_env::ProcessEnv>>,
}

/// What a request handler reaches.
#[derive(Debug)]
pub struct Gateway {
    pub config: Config,
    pub upstream: reqwest::Url,
    pub client: reqwest::Client,
    pub live: LiveFigures,
    pub streams: Arc<Semaphore>,
    /// Instant compaction, when on.
    pub preparer: Option<Arc<prepare::Preparer>>,
    /// KiB of request bodies being read whole (see [`instant::MAX_READING_BYTES`]).
    pub reading: Arc<Semaphore>,
}

/// A listen address: `host:port` of an IP (a name would resolve to who knows what).
/// Loopback only, unless remote clients are allowed.
pub fn listen_address(text: &str, allow_remote: bool) -> Result<SocketAddr, String> {
    let addr: SocketAddr = text
        .trim()
        .parse()
        .map_err(|_| format!("gateway: listen address {text:?} is not an IP address and port (e.g. 127.0.0.1:8417)"))?;
    if !allow_remote && !addr.ip().is_loopback() {
        return Err(format!(
            "gateway: {addr} is not a loopback address; the gateway carries API keys and listens on loopback only unless started with --allow-remote"
        ));
    }
    Ok(addr)
}

/// The upstream: an `http` or `https` URL with a host, no credentials, query or
/// fragment; a path is kept as a prefix of every request's.
pub fn upstream_url(text: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(text.trim()).map_err(|e| format!("gateway: upstream {text:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!("gateway: upstream {text:?} must be an http or https URL with a host"));
    }
    if !url.username().is_empty() || url.password().is_some() || url.query().is_some() || url.fragment().is_some() {
        return Err(format!("gateway: upstream {text:?} may not carry credentials, a query or a fragment"));
    }
    Ok(url)
}

/// A gateway whose socket is bound; [`Bound::serve`] starts answering.
#[derive(Debug)]
pub struct Bound {
    listener: TcpListener,
    gateway: Arc<Gateway>,
}

impl Bound {
    /// The address actually bound (the port, when 0 was asked for).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// Accepts and serves connections until the task is dropped or the runtime ends.
    pub async fn serve(self) {
        let Bound { listener, gateway } = self;
        // Preparations run while the gateway serves, and stop with it.
        let _preparing =
            gateway.preparer.clone().map(|preparer| AbortOnDrop(tokio::spawn(preparer.run(gateway.clone()))));
        let connections = Arc::new(Semaphore::new(gateway.config.limits.max_connections));
        loop {
            let Ok(permit) = connections.clone().acquire_owned().await else { return };
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, mostly: wait instead of spinning.
                    tracing::warn!(error = %e, "gateway: accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if !gateway.config.allow_remote && !peer.ip().is_loopback() {
                tracing::warn!(%peer, "gateway: a connection from beyond loopback refused");
                continue;
            }
            let _ = stream.set_nodelay(true);
            let gateway = gateway.clone();
            tokio::spawn(async move {
                let limits = gateway.config.limits;
                let service = hyper::service::service_fn(move |request| {
                    let gateway = gateway.clone();
                    async move { Ok::<_, std::convert::Infallible>(forward::handle(gateway, request).await) }
                });
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(limits.idle)
                    .max_buf_size(limits.max_header_bytes.max(8192) * 4)
                    .max_header_size(limits.max_header_bytes)
                    .keep_alive(true);
                if let Err(e) = builder.serve_connection(TokioIo::new(stream), service).await {
                    tracing::debug!(%peer, error = %e, "gateway: connection ended with an error");
                }
                drop(permit);
            });
        }
    }
}

/// Ends a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Builds the gateway and binds its socket (so a port in use is an error here, before
/// anything is announced).
pub async fn bind(config: Config, live: LiveFigures) -> Result<Bound, String> {
    let upstream = upstream_url(&config.upstream)?;
    if !config.allow_remote && !config.listen.ip().is_loopback() {
        return Err(format!("gateway: {} is not a loopback address (see --allow-remote)", config.listen));
    }
    crate::provider::install_crypto_provider();
    let client = reqwest::Client::builder()
        .connect_timeout(config.limits.connect_timeout)
        // A redirect reaches the client as the upstream sent it; the gateway follows
        // none, so no request (and no key) goes anywhere but the upstream.
        .redirect(reqwest::redirect::Policy::none())
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| format!("gateway: cannot build the HTTP client: {e}"))?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("gateway: cannot listen on {}: {e}", config.listen))?;
    let streams = Arc::new(Semaphore::new(config.limits.max_streams));
    let preparer = config.prepare.enabled.then(|| {
        let store = config.state_dir.as_deref().map(prepared::PreparedStore::new);
        let costs = config.state_dir.as_deref().map(costs::CostLedger::new);
        Arc::new(prepare::Preparer::new(config.prepare, store, costs, live.clone()))
    });
    let reading = Arc::new(Semaphore::new(instant::MAX_READING_BYTES / 1024));
    Ok(Bound { listener, gateway: Arc::new(Gateway { config, upstream, client, live, streams, preparer, reading }) })
}

/// The gateway the settings ask for inside the shared daemon (`gateway.enabled`): bound
/// and serving in the background, or a warning in the log saying why not.
pub fn start_in_daemon(
    settings: &ctxd_proto::GatewaySettings,
    live: LiveFigures,
    state_dir: PathBuf,
    env: Arc<crate::process_env::ProcessEnv>,
) {
    let listen = match listen_address(settings.listen_or_default(), false) {
        Ok(addr) => addr,
        Err(e) => {
            tracing::warn!("{e}; the daemon runs without its gateway");
            return;
        }
    };
    let config = Config {
        listen,
        upstream: settings.upstream_or_default().to_owned(),
        allow_remote: false,
        limits: Limits::default(),
        prepare: prepare_settings(settings, None, None),
        state_dir: Some(state_dir),
        env: Some(env),
    };
    tokio::spawn(async move {
        match bind(config, live).await {
            Ok(bound) => {
                let at = bound.local_addr().map(|a| a.to_string()).unwrap_or_default();
                tracing::info!(listen = %at, upstream = %bound.gateway().upstream.origin().ascii_serialization(), "gateway started in the daemon");
                bound.serve().await;
            }
            Err(e) => tracing::warn!("{e}; the daemon runs without its gateway"),
        }
    });
}

/// The preparation settings: the flags of `ctxd gateway` over `gateway.precompute*`
/// over the defaults (120 s idle, 60 % of the threshold, on).
pub fn prepare_settings(
    settings: &ctxd_proto::GatewaySettings,
    idle_seconds: Option<u64>,
    at_percent: Option<u64>,
) -> ctxd_core::gateway::prepare::PrepareSettings {
    let defaults = ctxd_core::gateway::prepare::PrepareSettings::default();
    ctxd_core::gateway::prepare::PrepareSettings {
        enabled: settings.precompute.unwrap_or(defaults.enabled),
        idle_seconds: idle_seconds.or(settings.precompute_idle_seconds).unwrap_or(defaults.idle_seconds),
        at_percent: at_percent.or(settings.precompute_at_percent).unwrap_or(defaults.at_percent).min(100),
    }
}
