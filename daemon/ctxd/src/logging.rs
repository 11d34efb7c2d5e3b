//! Logging: `tracing` to a file (default `<state dir>/logs/ctxd.log`) or to stderr,
//! filtered by `CTXD_LOG` (same syntax as `RUST_LOG`; default `info` for the daemon and
//! `warn` for one-shot commands, whose stderr a person reads). `main` reads the variable
//! with the rest of the environment and passes its value here.
//!
//! **Invariant:** nothing but the protocol is written to stdout. The log file is opened
//! owner-only and in append mode, and written from a background thread so a slow disk
//! never stalls a request.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::EnvFilter;

/// Where logs go.
#[derive(Debug, Clone)]
pub enum LogTarget {
    File(std::path::PathBuf),
    Stderr,
}

/// Installs the global subscriber, filtered by `filter` (`CTXD_LOG`), else at
/// `default_level`; a filter that does not parse counts as none. Keep the returned guard
/// alive for the life of the process: dropping it flushes and stops the writer thread.
pub fn init(target: &LogTarget, filter: Option<&str>, default_level: &str) -> anyhow::Result<Option<WorkerGuard>> {
    let filter = filter.and_then(|f| EnvFilter::try_new(f).ok()).unwrap_or_else(|| EnvFilter::new(default_level));
    match target {
        LogTarget::Stderr => {
            tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).init();
            Ok(None)
        }
        LogTarget::File(path) => {
            if let Some(dir) = path.parent() {
                crate::store::create_private_dir(dir)?;
            }
            let file = open_log(path)?;
            let (writer, guard) = tracing_appender::non_blocking(file);
            tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_ansi(false).init();
            Ok(Some(guard))
        }
    }
}

fn open_log(path: &Path) -> anyhow::Result<std::fs::File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot open log file {}: {e}", path.display()))
}
