//! One daemon for every editor on a store.
//!
//! Each editor starts `ctxd serve` on stdio, as it would any language server, and two
//! windows (or VS Code and Neovim) would otherwise start two daemons on one store, of
//! which only one may hold it. So the first `ctxd serve` to take the store's lock is the
//! daemon: from that moment it also listens on `<state dir>/ctxd.sock`, and serves every
//! connection there as one more client of the same sessions (a connection that comes
//! before the daemon's own editor has initialized it waits for that). A later
//! `ctxd serve` for that store finds the lock held and relays its stdio to the socket
//! byte for byte: every editor sees one set of sessions, and every notification.
//!
//! When the editor that started the daemon leaves, the daemon ends and the relays with
//! it; their editors restart them (as after any crash), the first becomes the daemon,
//! and the sessions resume from the store.
//!
//! The socket is the owner's only: it lives in the state directory, which must be this
//! user's and writable by no one else (`store::StateDir`), it is created under the
//! daemon's `0o077` umask, a peer of another user is refused, and a relay starts only
//! when the listening peer is of this user too. It is bound and reached through
//! `/proc/self/fd/<the opened state dir>/ctxd.sock`, so a state directory of any depth
//! shares (a socket's address holds 107 bytes), and the name leads to the directory that
//! was checked.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::server::{ServeOptions, Server, Sharing};
use crate::session::Sessions;
use crate::store::{StateDir, StoreError, StoreLock};
use crate::transport::{self, Limits};

/// The socket's name in the state directory.
const SOCKET: &str = "ctxd.sock";

/// The socket of the daemon that holds the store at `state_dir`.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SOCKET)
}

/// How long a `ctxd serve` that finds the store locked waits for the holder's socket
/// (a daemon listens as soon as it holds the lock; this covers the moment between).
const SOCKET_WAIT: Duration = Duration::from_secs(5);

/// What a starting `ctxd serve` is for its store.
#[derive(Debug)]
pub enum Claim {
    /// The daemon: it holds the store's lock (or could not take it for another reason,
    /// which `initialize` reports).
    Daemon(Option<StoreLock>),
    /// Another daemon of this user holds the store and listens: relay to it.
    Relay(std::os::unix::net::UnixStream),
}

/// Takes the store at `state_dir` for this process, or finds the daemon holding it.
pub fn claim(state_dir: &Path) -> Claim {
    // A state directory that is not this user's alone is refused here (the lock checks
    // it) and again, with the reason, by `initialize`.
    let pid = match StoreLock::acquire(state_dir) {
        Ok(lock) => return Claim::Daemon(Some(lock)),
        Err(StoreError::Locked { pid, .. }) => pid,
        Err(e) => {
            tracing::warn!(error = %e, "the store cannot be used");
            return Claim::Daemon(None);
        }
    };
    // Held open while connecting: the socket's short name goes through it.
    let dir = match StateDir::open(state_dir) {
        Ok(dir) => dir,
        Err(e) => {
            tracing::warn!(error = %e, "the store cannot be used");
            return Claim::Daemon(None);
        }
    };
    let socket = dir.short_path(SOCKET);
    let shown = socket_path(state_dir);
    let deadline = Instant::now() + SOCKET_WAIT;
    loop {
        match std::os::unix::net::UnixStream::connect(&socket) {
            Ok(stream) => {
                let peer = rustix::net::sockopt::socket_peercred(&stream).map(|c| c.uid.as_raw());
                let me = rustix::process::geteuid().as_raw();
                if peer != Ok(me) {
                    tracing::warn!(holder = ?pid, socket = %shown.display(), ?peer, me, "the store's socket is not served by this user; not relaying to it");
                    return Claim::Daemon(None);
                }
                tracing::info!(holder = ?pid, socket = %shown.display(), "the store is served by another ctxd; relaying to it");
                return Claim::Relay(stream);
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => {
                tracing::warn!(holder = ?pid, socket = %shown.display(), error = %e, "the store is locked and its daemon does not listen");
                return Claim::Daemon(None);
            }
        }
    }
}

/// How long a relay whose daemon closed the connection waits for its editor to close
/// stdin: an editor that sent `exit` closes it about then, and the relay then ends as a
/// daemon that exited.
const EDITOR_CLOSE_WAIT: Duration = Duration::from_millis(200);

/// Relays stdin to the daemon's socket and its answers to stdout, until the daemon's
/// side ends. Returns whether the daemon went away while the editor still had stdin
/// open (the editor then restarts this process, which takes the store over or finds
/// the next daemon).
///
/// Blocking, on threads of its own: stdin is read by a thread that may stay blocked
/// after the relay is done, and a plain thread does not hold the process open the way
/// a task of the runtime's blocking pool would.
pub fn relay(stream: std::os::unix::net::UnixStream) -> std::io::Result<bool> {
    use std::io::{Read, Write};
    let mut to_daemon = stream.try_clone()?;
    let (editor_closed, closed) = std::sync::mpsc::channel();
    std::thread::Builder::new().name("ctxd-relay".into()).spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut to_daemon);
        // The editor closed its end: the daemon sees the end of this client too.
        let _ = to_daemon.shutdown(std::net::Shutdown::Write);
        let _ = editor_closed.send(());
    })?;
    let mut from_daemon = stream;
    let mut stdout = std::io::stdout().lock();
    let mut buffer = vec![0u8; 64 * 1024];
    let copied = loop {
        match from_daemon.read(&mut buffer) {
            Ok(0) => break Ok(()),
            // Flushed at once: stdout buffers by line, and a frame ends with no newline.
            Ok(n) => {
                if let Err(e) = stdout.write_all(&buffer[..n]).and_then(|()| stdout.flush()) {
                    break Err(e);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    let editor_left = closed.recv_timeout(EDITOR_CLOSE_WAIT).is_ok();
    copied?;
    Ok(!editor_left)
}

/// The store's socket, listening while this process holds the store. Connections
/// accepted before the daemon's own editor has initialized it wait for its sessions.
#[derive(Debug)]
pub struct Listener {
    /// Where the socket is (removed when the listener stops).
    socket: PathBuf,
    /// The sessions, once the daemon's own editor has initialized it.
    ready: tokio::sync::watch::Sender<Option<Arc<Sessions>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Listener {
    /// Listens on `<dir>/ctxd.sock` for other editors; `options` are theirs. A socket
    /// that cannot be made is logged: the daemon serves its own editor all the same.
    pub fn start(dir: &StateDir, options: ServeOptions) -> Option<Listener> {
        let socket = socket_path(dir.path());
        let address = dir.short_path(SOCKET);
        // This process holds the store's lock: a socket file there is a dead daemon's.
        let _ = std::fs::remove_file(&address);
        let listener = match tokio::net::UnixListener::bind(&address) {
            Ok(listener) => listener,
            Err(e) => {
                tracing::warn!(socket = %socket.display(), error = %e, "cannot listen for other editors; each needs a store of its own");
                return None;
            }
        };
        tracing::info!(socket = %socket.display(), "other editors on this store connect here");
        let (ready, waiting) = tokio::sync::watch::channel(None);
        let owner = rustix::process::geteuid();
        let accept = tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting an editor failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let peer = stream.peer_cred().ok();
                if peer.is_none_or(|p| p.uid() != owner.as_raw()) {
                    tracing::warn!(peer = ?peer, "a connection from another user refused");
                    continue;
                }
                let peer_pid = peer.and_then(|p| p.pid()).and_then(|p| u32::try_from(p).ok());
                tokio::spawn(serve_guest(stream, peer_pid, waiting.clone(), options.clone()));
            }
        });
        Some(Listener { socket, ready, accept })
    }

    /// The daemon's own editor initialized it: connections are served from now on.
    pub fn serve(&self, sessions: Arc<Sessions>) {
        self.ready.send_replace(Some(sessions));
    }

    /// Stops listening and removes the socket; connections still waiting are closed
    /// (their relays exit, and their editors start them again).
    pub fn stop(self) {
        self.accept.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Serves another editor once the daemon's sessions exist.
async fn serve_guest(
    stream: tokio::net::UnixStream,
    peer_pid: Option<u32>,
    mut ready: tokio::sync::watch::Receiver<Option<Arc<Sessions>>>,
    options: ServeOptions,
) {
    if ready.borrow().is_none() {
        tracing::info!(pid = ?peer_pid, "an editor waits for this daemon's own editor to initialize it");
    }
    let Some(sessions) = ready.wait_for(Option::is_some).await.ok().and_then(|s| s.clone()) else { return };
    let (server, outflow, outbound) = Server::guest(options, sessions.clone(), peer_pid);
    sessions.notifier().attach(outbound.clone());
    tracing::info!(pid = ?peer_pid, "an editor shares this daemon");
    let (read, write) = stream.into_split();
    let ending = transport::serve(read, write, Arc::new(server), Limits::default(), outflow).await;
    sessions.notifier().detach(&outbound);
    tracing::info!(pid = ?peer_pid, ?ending, "an editor sharing this daemon left");
}

/// The daemon's own editor initialized it with `sessions` on the store at `state_dir`:
/// other editors of that store are served from now on (on the socket opened at start,
/// or on one opened now for a store the editor chose in `initialize`).
pub fn serve_others(sharing: &Sharing, state_dir: &Path, sessions: Arc<Sessions>, options: ServeOptions) {
    let Ok(mut listener) = sharing.listener.lock() else { return };
    if listener.is_none() {
        *listener = match StateDir::open(state_dir) {
            Ok(dir) => Listener::start(&dir, ServeOptions { sharing: None, ..options }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for other editors");
                None
            }
        };
    }
    if let Some(listener) = listener.as_ref() {
        listener.serve(sessions);
    }
}

/// Stops listening for other editors (when the daemon ends, or when its editor chose
/// another store than the one it started on).
pub fn stop_listening(sharing: &Sharing) {
    if let Some(listener) = sharing.listener.lock().ok().and_then(|mut l| l.take()) {
        listener.stop();
    }
}
