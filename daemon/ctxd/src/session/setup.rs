//! What a session is opened with and what every session shares: its setup (folder,
//! model, settings, levels), the daemon-wide services and the environment `main` read.

use std::sync::Arc;

use ctxd_core::budget::Thresholds;

use crate::process_env::ProcessEnv;
use crate::settings::SettingsSources;

/// What a session is opened with: where the agent works, which model, its stacked
/// settings, and the levels that follow from them.
#[derive(Debug, Clone)]
pub struct SessionSetup {
    pub cwd: String,
    pub model: String,
    /// A subagent's window ceiling (`ctx/openSession` `agent.autoCompactWindow`).
    pub agent_window: Option<u64>,
    pub settings: ctxd_proto::Settings,
    pub thresholds: Thresholds,
    /// Settings and window problems, reported when the session opens.
    pub problems: Vec<String>,
    /// A Claude Code transcript to import before loading (new sessions only).
    pub import: Option<std::path::PathBuf>,
    /// Where memory files are looked for.
    pub memory: ctxd_core::memory::MemoryConfig,
    /// Compact in the background after this long without activity (None: off).
    pub idle_after: Option<std::time::Duration>,
    /// Fewest tokens worth an idle compaction.
    pub idle_floor: u64,
    pub services: Services,
    /// The environment `main` read (a compaction's provider keys, the fork switch).
    pub process: Arc<ProcessEnv>,
}

/// Daemon-wide services every session uses: the file watcher, the shared memory-file
/// discovery, the counted filesystem, the gateway's live figures.
#[derive(Debug, Clone)]
pub struct Services {
    pub watcher: crate::context::watcher::Watcher,
    pub memory_cache: Arc<crate::context::base::MemoryCache>,
    pub fs: Arc<crate::context::fs::RealFs>,
    /// The gateway's live figures per Claude Code session (observed transcripts follow them).
    pub live: crate::gateway::LiveFigures,
    /// The gateway's cost ledger in the store's state dir (`ctx/context` of an observed
    /// Claude Code session shows its figures).
    pub costs: crate::gateway::costs::CostLedger,
}

impl Services {
    pub fn start(env: &ProcessEnv, state_dir: &std::path::Path) -> Services {
        Services {
            // CTXD_NO_WATCH=1: no OS notifications; stamps are compared before each request.
            watcher: if env.no_watch() {
                crate::context::watcher::Watcher::disabled()
            } else {
                crate::context::watcher::Watcher::start(crate::context::watcher::DEFAULT_DEBOUNCE)
            },
            memory_cache: Arc::default(),
            fs: Arc::default(),
            live: crate::gateway::LiveFigures::default(),
            costs: crate::gateway::costs::CostLedger::new(state_dir),
        }
    }
}

/// Daemon-wide inputs every session needs.
#[derive(Debug, Clone)]
pub struct Environment {
    /// The environment `main` read, with its budget overrides.
    pub process: Arc<ProcessEnv>,
    /// Client data: `initializationOptions.autoCompactWindow`.
    pub client_window: Option<u64>,
    /// `initializationOptions.settings`.
    pub client_settings: ctxd_proto::Settings,
    pub sources: SettingsSources,
    pub services: Services,
}
