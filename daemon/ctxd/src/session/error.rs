//! The one error type of session commands, apart from the registry so the actor, the
//! server and the compaction driver name it without reaching into the registry.

use crate::store::StoreError;

/// Why a session command failed. Cloneable so one failure can answer many waiters.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SessionError {
    #[error("unknown session {0:?}: it is not open and not in the store; open it with ctx/openSession")]
    NotOpen(String),
    #[error("unknown session {0:?}: no transcript with this id in the store")]
    UnknownSession(String),
    #[error("{0}")]
    InvalidSessionId(String),
    #[error("{0}")]
    InvalidParams(String),
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    Cancelled(String),
    #[error("compaction failed: {0}")]
    CompactFailed(String),
    /// `ctx/undoCompact` was refused; nothing was appended.
    #[error("cannot undo: {0}")]
    CannotUndo(ctxd_core::compact::UndoError),
    #[error("store error: {0}")]
    Store(String),
    #[error("session {0:?} closed before answering")]
    Closed(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StoreError> for SessionError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InvalidSessionId(_) => SessionError::InvalidSessionId(e.to_string()),
            other => SessionError::Store(other.to_string()),
        }
    }
}
