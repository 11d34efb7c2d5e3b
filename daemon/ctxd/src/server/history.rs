//! `ctx/searchHistory` and `ctx/readHistory`: the history index (`crate::history`) for
//! hosts and editors, over the daemon's store and Claude Code's projects folder.
//!
//! One index per store, opened on first use and shared by every client of the daemon
//! (guests included); its work (reading transcripts, indexing, searching) runs on the
//! blocking pool, so a search never holds a runtime worker a session needs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ctxd_proto::{self as proto, error_codes};
use tower_lsp_server::jsonrpc::Error;

use super::Backend;
use super::dispatch::{Outgoing, Result, internal, invalid_params, with_code};
use crate::history::{self, History, HistoryError, Origin, Roots, SearchRequest};
use crate::session::Sessions;

impl Outgoing for proto::SearchHistoryResult {}
impl Outgoing for proto::ReadHistoryResult {}

/// The index of each store this process serves (one, but `initialize` may name another).
static OPEN: Mutex<Vec<(PathBuf, Arc<History>)>> = Mutex::new(Vec::new());

fn history_of(sessions: &Sessions) -> std::result::Result<Arc<History>, HistoryError> {
    let root = sessions.store().root().to_owned();
    let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, history)) = open.iter().find(|(r, _)| *r == root) {
        return Ok(history.clone());
    }
    let roots = Roots { store: Some(root.join("sessions")), claude: sessions.claude_projects_dir() };
    let history = Arc::new(History::open(&root, roots)?);
    open.push((root, history.clone()));
    Ok(history)
}

fn history_error(e: HistoryError) -> Error {
    match e {
        HistoryError::NotFound(m) | HistoryError::Invalid(m) => invalid_params(m),
        other @ (HistoryError::Index { .. } | HistoryError::Io { .. }) => {
            with_code(error_codes::STORE, other.to_string())
        }
    }
}

/// Runs `work` with the store's index on the blocking pool.
async fn with_history<T: Send + 'static>(
    sessions: &Arc<Sessions>,
    work: impl FnOnce(&History) -> std::result::Result<T, HistoryError> + Send + 'static,
) -> Result<T> {
    let sessions = sessions.clone();
    tokio::task::spawn_blocking(move || work(&*history_of(&sessions)?))
        .await
        .map_err(|e| internal(format!("history task failed: {e}")))?
        .map_err(history_error)
}

fn absolute(dir: Option<&str>) -> Result<Option<PathBuf>> {
    match dir {
        Some(d) if !Path::new(d).is_absolute() => Err(invalid_params(format!("projectDir must be absolute: {d:?}"))),
        other => Ok(other.map(PathBuf::from)),
    }
}

impl Backend {
    pub(super) async fn search_history(
        self: Arc<Self>,
        params: proto::SearchHistoryParams,
    ) -> Result<proto::SearchHistoryResult> {
        let project = absolute(params.project_dir.as_deref())?;
        let limit = params.limit.map_or(history::DEFAULT_LIMIT, |l| (l as usize).clamp(1, history::MAX_LIMIT));
        with_history(self.sessions()?, move |history| {
            let scope = history.scope(params.session_id.as_deref(), project.as_deref(), Origin::Store)?;
            let found = history.search(&SearchRequest {
                query: &params.query,
                sources: &scope.sources,
                preferred: scope.preferred.as_deref(),
                limit,
                before_compaction_only: params.before_compaction_only.unwrap_or(false),
            })?;
            Ok(proto::SearchHistoryResult {
                hits: found
                    .hits
                    .into_iter()
                    .map(|h| proto::HistoryHit {
                        session_id: h.source.session,
                        uuid: h.uuid,
                        timestamp: h.timestamp,
                        role: h.role,
                        snippet: h.snippet,
                        before_compaction: h.before_compaction,
                        transcript: h.source.path.display().to_string(),
                    })
                    .collect(),
                sessions: scope.sources.len() as u32,
                notes: found.notes,
            })
        })
        .await
    }

    pub(super) async fn read_history(
        self: Arc<Self>,
        params: proto::ReadHistoryParams,
    ) -> Result<proto::ReadHistoryResult> {
        let count = |n: Option<u32>| n.map_or(history::DEFAULT_NEIGHBOURS, |n| n as usize);
        let (before, after) = (count(params.before), count(params.after));
        let max_chars = params.max_chars.map_or(history::DEFAULT_READ_CHARS, |n| n as usize);
        with_history(self.sessions()?, move |history| {
            let source = history.session(&params.session_id, Origin::Store)?;
            let read = history.read(&source, &params.uuid, before, after, max_chars)?;
            Ok(proto::ReadHistoryResult {
                session_id: source.session,
                transcript: source.path.display().to_string(),
                records: read
                    .records
                    .into_iter()
                    .map(|r| proto::HistoryRecord {
                        uuid: r.uuid,
                        timestamp: r.timestamp,
                        role: r.role,
                        text: r.text,
                        target: r.target,
                        before_compaction: r.before_compaction,
                    })
                    .collect(),
                truncated: read.truncated,
            })
        })
        .await
    }
}
