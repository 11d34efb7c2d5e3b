//! One daemon for every editor on a store.
//!
//! Each editor starts `ctxd serve` on stdio, as it would any language server, and two
//! windows (or VS Code and Neovim) would otherwise start two daemons on one store, of
//! which only one may hold it. So the first `ctxd serve` to take the store's lock is the
//! daemon: once initialized it also listens on `<state dir>/ctxd.sock`, and serves every
//! connection there as one more client of the same sessions. A later `ctxd serve` for
//! that store finds the lock held and relays its stdio to the socket byte for byte:
//! every editor sees one set of sessions, and every notification.
//!
//! When the editor that started the daemon leaves, the daemon ends and the relays with
//! it; their editors restart them (as after any crash), the first becomes the daemon,
//! and the sessions resume from the store.
//!
//! The socket is the owner's only: it lives in the private state directory, is created
//! under the daemon's `0o077` umask, and a peer of another user is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::server::{ServeOptions, Server};
use crate::session::Sessions;
use crate::store::{StoreError, StoreLock, create_private_dir};
use crate::transport::{self, Limits};

/// The socket of the daemon that holds the store at `state_dir`.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join("ctxd.sock")
}

/// How long a `ctxd serve` that finds the store locked waits for the holder's socket
/// (a daemon that started a moment earlier listens once its editor has initialized it).
const SOCKET_WAIT: Duration = Duration::from_secs(5);

/// What a starting `ctxd serve` is for its store.
#[derive(Debug)]
pub enum Claim {
    /// The daemon: it holds the store's lock (or could not take it for another reason,
    /// which `initialize` reports).
    Daemon(Option<StoreLock>),
    /// Another daemon holds the store and listens: relay to it.
    Relay(std::os::unix::net::UnixStream),
}

/// Takes the store at `state_dir` for this process, or finds the daemon holding it.
pub fn claim(state_dir: &Path) -> Claim {
    if create_private_dir(state_dir).is_err() {
        return Claim::Daemon(None);
    }
    match StoreLock::acquire(state_dir) {
        Ok(lock) => Claim::Daemon(Some(lock)),
        Err(StoreError::Locked { pid, .. }) => {
            let socket = socket_path(state_dir);
            let deadline = Instant::now() + SOCKET_WAIT;
            loop {
                match std::os::unix::net::UnixStream::connect(&socket) {
                    Ok(stream) => {
                        tracing::info!(holder = ?pid, socket = %socket.display(), "the store is served by another ctxd; relaying to it");
                        return Claim::Relay(stream);
                    }
                    Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                    Err(e) => {
                        tracing::warn!(holder = ?pid, socket = %socket.display(), error = %e, "the store is locked and its daemon does not listen");
                        return Claim::Daemon(None);
                    }
                }
            }
        }
        Err(_) => Claim::Daemon(None),
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

/// Listens on the store's socket and serves each editor that connects as one more
/// client of `sessions`, for as long as this process runs. A socket that cannot be
/// made is logged: the daemon serves its own editor all the same.
pub fn listen(state_dir: &Path, sessions: Arc<Sessions>, options: ServeOptions) {
    let path = socket_path(state_dir);
    // This process holds the store's lock: a socket file there is a dead daemon's.
    let _ = std::fs::remove_file(&path);
    let listener = match tokio::net::UnixListener::bind(&path) {
        Ok(listener) => listener,
        Err(e) => {
            tracing::warn!(socket = %path.display(), error = %e, "cannot listen for other editors; each needs a store of its own");
            return;
        }
    };
    tracing::info!(socket = %path.display(), "other editors on this store connect here");
    if let Some(sharing) = &options.sharing
        && let Ok(mut listening) = sharing.listening.lock()
    {
        *listening = Some(path.clone());
    }
    let owner = rustix::process::getuid();
    tokio::spawn(async move {
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
            let (server, outflow, outbound) = Server::guest(options.clone(), sessions.clone(), peer_pid);
            sessions.notifier().attach(outbound.clone());
            let sessions = sessions.clone();
            tokio::spawn(async move {
                tracing::info!(pid = ?peer_pid, "an editor shares this daemon");
                let (read, write) = stream.into_split();
                let ending = transport::serve(read, write, Arc::new(server), Limits::default(), outflow).await;
                sessions.notifier().detach(&outbound);
                tracing::info!(pid = ?peer_pid, ?ending, "an editor sharing this daemon left");
            });
        }
    });
}

/// Removes the socket this daemon listened on, if any (when it ends; a daemon killed
/// leaves it, and the next one replaces it).
pub fn stop_listening(sharing: &crate::server::Sharing) {
    if let Some(path) = sharing.listening.lock().ok().and_then(|mut l| l.take()) {
        let _ = std::fs::remove_file(path);
    }
}
