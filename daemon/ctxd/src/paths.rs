//! Where ctxd keeps its state: flag, then `CTXD_STATE_DIR`, then the XDG state
//! directory (`$XDG_STATE_HOME/ctxd`, by default `~/.local/state/ctxd`).
//! `initializationOptions.stateDir` can still move the store when a client initializes.

use std::path::PathBuf;

use etcetera::BaseStrategy;

/// The state directory to use when nothing more specific is given.
pub fn default_state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CTXD_STATE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    match etcetera::choose_base_strategy() {
        Ok(strategy) => strategy.state_dir().unwrap_or_else(|| strategy.data_dir()).join("ctxd"),
        Err(_) => std::env::temp_dir().join("ctxd-state"),
    }
}
