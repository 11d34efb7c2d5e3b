//! What an observed session's context holds besides its messages: the memory files and
//! rules of its working directory and the git facts there, found by the same discovery
//! a session of ctxd's own uses ([`BaseContext`]), so `ctx/context` answers for an
//! observed session as for one of ctxd's own.
//!
//! The working directory is the one the transcript's records name. Discovery and git
//! run on the blocking pool once it is known, in the background (git may take a while
//! and the figures must not wait for it); the usage pushed until then counts no memory
//! files. Rules with `paths:` activate on the files the transcript says were read.
//! `ctx/context` reads the memory files again (an edit since shows) and replays the
//! reads on them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ctxd_core::ledger::Ledger;
use ctxd_core::memory::MemoryConfig;
use tokio::task::JoinHandle;

use crate::context::base::BaseContext;
use crate::session::Services;
use crate::session::actor::{ContextView, now_rfc3339};
use crate::session::usage::UsageSnapshot;

/// Where memory files are looked for by a session working in a directory.
pub type MemoryFor = Arc<dyn Fn(&Path) -> MemoryConfig + Send + Sync>;

/// An observed session's base context, as far as it is loaded.
pub struct ObservedBase {
    state: State,
    services: Services,
    memory_for: MemoryFor,
}

enum State {
    /// The records named no working directory yet.
    Unknown,
    Loading(JoinHandle<BaseContext>),
    /// Boxed: a base is large beside the other states.
    Loaded(Box<BaseContext>),
    /// It could not be loaded (the task failed); the session has none.
    Failed,
}

impl ObservedBase {
    pub fn new(services: Services, memory_for: MemoryFor) -> ObservedBase {
        ObservedBase { state: State::Unknown, services, memory_for }
    }

    /// Starts loading the base of `cwd` when none is loaded or loading yet.
    pub fn start(&mut self, cwd: Option<&str>, ledger: &Ledger) {
        let (State::Unknown, Some(cwd)) = (&self.state, cwd) else { return };
        let cwd = PathBuf::from(cwd);
        let config = (self.memory_for)(&cwd);
        let services = self.services.clone();
        let reads = reads_in(ledger);
        self.state = State::Loading(tokio::task::spawn_blocking(move || {
            let today = now_rfc3339()[..10].to_owned();
            let mut base = BaseContext::load(&cwd, config, &services.memory_cache, &services.fs, today);
            for path in &reads {
                base.on_file_read(path, &services.fs);
            }
            base
        }));
    }

    /// Waits for the base being loaded, if one is; `true` once it is there (the
    /// figures change: memory files count).
    pub async fn loaded(&mut self) -> bool {
        let State::Loading(handle) = &mut self.state else { return false };
        self.state = match handle.await {
            Ok(base) => State::Loaded(Box::new(base)),
            Err(e) => {
                tracing::warn!(error = %e, "the base context of an observed session could not be loaded");
                State::Failed
            }
        };
        matches!(self.state, State::Loaded(_))
    }

    pub fn is_loading(&self) -> bool {
        matches!(self.state, State::Loading(_))
    }

    /// Tokens of the memory files and bytes of the system context (git facts): what the
    /// request carries besides the program's own prefix.
    pub fn fixed(&self) -> (u64, u64) {
        match &self.state {
            State::Loaded(base) => (base.memory_tokens(), base.system_context().map_or(0, |s| s.len() as u64)),
            _ => (0, 0),
        }
    }

    /// The memory files read again (an edit since shows) with what the transcript's
    /// reads activate, then the view `ctx/context` answers with; `usage` is made with
    /// the base as it is then.
    pub async fn view(&mut self, ledger: &Ledger, usage: impl FnOnce(&Self) -> UsageSnapshot) -> ContextView {
        self.loaded().await;
        self.state = match std::mem::replace(&mut self.state, State::Unknown) {
            State::Loaded(mut base) => {
                let services = self.services.clone();
                let reads = reads_in(ledger);
                let refreshed = tokio::task::spawn_blocking(move || {
                    base.reload(&services.memory_cache, &services.fs);
                    for path in &reads {
                        base.on_file_read(path, &services.fs);
                    }
                    base
                })
                .await;
                refreshed.map_or(State::Failed, State::Loaded)
            }
            other => other,
        };
        let usage = usage(self);
        let base = match &self.state {
            State::Loaded(base) => Some(&**base),
            _ => None,
        };
        ContextView {
            usage,
            memory_files: base.map(BaseContext::files).unwrap_or_default(),
            memory_tokens: base.map_or(0, BaseContext::memory_tokens),
            diagnostics: base.map(BaseContext::diagnostics).unwrap_or_default(),
            files_read: ledger.len(),
            stale_files: Vec::new(),
            git: base.is_some_and(|b| b.system_context().is_some()),
            prepared_ahead: None,
            instant_compaction: None,
        }
    }
}

/// The paths read, oldest read first.
fn reads_in(ledger: &Ledger) -> Vec<PathBuf> {
    let mut entries: Vec<_> = ledger.read_after(0).collect();
    entries.sort_by_key(|e| e.sequence);
    entries.into_iter().map(|e| PathBuf::from(&e.path)).collect()
}
