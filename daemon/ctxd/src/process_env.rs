//! The process environment, read once.
//!
//! `main` captures it with [`ProcessEnv::from_process`], the only read of environment
//! variables in the daemon (the `disallowed-methods` list in this crate's `clippy.toml`
//! keeps it so), and passes the value down: to the server options, from there to every
//! session and compaction, and to the `statusline`, `claude` and `replay` commands. Tests
//! build one from pairs with [`ProcessEnv::from_pairs`] and never touch the real
//! environment.
//!
//! The typed fields are what ctxd itself reads; the variable named by `apiKeyEnv`, and
//! the provider fallbacks (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`, …), are looked up
//! with [`ProcessEnv::var`] when a compaction picks its provider, since settings may
//! name any variable. `Debug` prints no value of the captured variables: they hold keys.
//!
//! One read left to a library: reqwest builds its HTTP clients with the proxies named by
//! `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY`, as users of any HTTP tool expect.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::PathBuf;

use ctxd_core::budget::EnvConfig;

/// Moves the state directory (after `--state-dir`, before the XDG state directory).
pub const STATE_DIR_ENV: &str = "CTXD_STATE_DIR";
/// Log filter, in `RUST_LOG` syntax.
pub const LOG_ENV: &str = "CTXD_LOG";
/// Set (and not `0`): no OS file notifications; stamps are compared before each request.
pub const NO_WATCH_ENV: &str = "CTXD_NO_WATCH";
/// Set (and not `0`): no cache-sharing fork for summaries (as `compactFork: false`).
pub const DISABLE_FORK_ENV: &str = "CTXD_DISABLE_COMPACT_FORK";
/// Seconds the gateway takes a prompt cache to live, instead of what the requests' cache
/// markers say (5 minutes or an hour): tests drive a cache's expiry with a short one.
pub const CACHE_TTL_ENV: &str = "CTXD_CACHE_TTL_SECONDS";
/// Claude Code's own directory, instead of `~/.claude`.
pub const CLAUDE_CONFIG_DIR_ENV: &str = "CLAUDE_CONFIG_DIR";
/// The managed policy memory file, instead of [`MANAGED_MEMORY_PATH`] (tests point it
/// into their own directories; an unusual install can move it).
pub const MANAGED_MEMORY_ENV: &str = "CTXD_MANAGED_MEMORY";
/// Where Claude Code reads the organization's managed policy memory file on Linux.
pub const MANAGED_MEMORY_PATH: &str = "/etc/claude-code/CLAUDE.md";

/// The environment ctxd was started with: what it uses, typed, and the rest for lookups
/// by name. Built once; shared behind an `Arc`.
#[derive(Clone)]
pub struct ProcessEnv {
    /// Every variable, the last value of a repeated name kept (as an environment built
    /// by successive assignments would have it).
    vars: BTreeMap<OsString, OsString>,
    budget: EnvConfig,
    budget_warnings: Vec<String>,
}

impl ProcessEnv {
    /// The one read of the process environment.
    #[allow(clippy::disallowed_methods)]
    pub fn from_process() -> ProcessEnv {
        ProcessEnv::from_pairs(std::env::vars_os())
    }

    /// From given pairs, for tests and for [`ProcessEnv::from_process`].
    pub fn from_pairs<K: Into<OsString>, V: Into<OsString>>(pairs: impl IntoIterator<Item = (K, V)>) -> ProcessEnv {
        let vars: BTreeMap<OsString, OsString> = pairs.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        // The budget variables are text; a name or value that is not UTF-8 is none of them.
        let text = vars.iter().filter_map(|(k, v)| Some((k.to_str()?, v.to_str()?)));
        let (budget, budget_warnings) = EnvConfig::from_vars(text);
        ProcessEnv { vars, budget, budget_warnings }
    }

    /// The value of `name` if it is set and UTF-8 (as `std::env::var` would give it).
    pub fn var(&self, name: &str) -> Option<&str> {
        self.vars.get(OsStr::new(name))?.to_str()
    }

    /// A set, non-empty value, as bytes the OS gave (paths need not be UTF-8).
    fn non_empty(&self, name: &str) -> Option<&OsStr> {
        self.vars.get(OsStr::new(name)).map(OsString::as_os_str).filter(|v| !v.is_empty())
    }

    /// A flag: set, non-empty and not `0`.
    fn flag(&self, name: &str) -> bool {
        self.non_empty(name).is_some_and(|v| v != "0")
    }

    /// The budget overrides (`CLAUDE_CODE_AUTO_COMPACT_WINDOW`, …), parsed by the core.
    pub fn budget(&self) -> &EnvConfig {
        &self.budget
    }

    /// One line per budget variable whose value was refused (and ignored).
    pub fn budget_warnings(&self) -> &[String] {
        &self.budget_warnings
    }

    /// `$HOME`, when set and not empty.
    pub fn home(&self) -> Option<PathBuf> {
        self.non_empty("HOME").map(PathBuf::from)
    }

    /// `$XDG_CONFIG_HOME`, else `~/.config`.
    pub fn config_home(&self) -> Option<PathBuf> {
        self.non_empty("XDG_CONFIG_HOME").map(PathBuf::from).or_else(|| Some(self.home()?.join(".config")))
    }

    /// Where temporary files go: `$TMPDIR`, else `/tmp` (what `std::env::temp_dir`
    /// gives on Unix).
    pub fn temp_dir(&self) -> PathBuf {
        self.non_empty("TMPDIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
    }

    /// The state directory when no flag names one: `$CTXD_STATE_DIR`, else
    /// `$XDG_STATE_HOME/ctxd` (an absolute one, as the XDG specification requires),
    /// else `~/.local/state/ctxd`; without a home, `<temp dir>/ctxd-state`.
    pub fn default_state_dir(&self) -> PathBuf {
        if let Some(dir) = self.non_empty(STATE_DIR_ENV) {
            return PathBuf::from(dir);
        }
        let state_home = self.non_empty("XDG_STATE_HOME").map(PathBuf::from).filter(|dir| dir.is_absolute());
        match state_home.or_else(|| Some(self.home()?.join(".local/state"))) {
            Some(base) => base.join("ctxd"),
            None => self.temp_dir().join("ctxd-state"),
        }
    }

    /// Claude Code's directory: `$CLAUDE_CONFIG_DIR`, else `~/.claude`.
    pub fn claude_config_dir(&self) -> Option<PathBuf> {
        self.non_empty(CLAUDE_CONFIG_DIR_ENV).map(PathBuf::from).or_else(|| Some(self.home()?.join(".claude")))
    }

    /// Claude Code's own configuration file (MCP servers, per-project state):
    /// `.claude.json` in `$CLAUDE_CONFIG_DIR`, else in the home folder.
    pub fn claude_global_config(&self) -> Option<PathBuf> {
        let dir = self.non_empty(CLAUDE_CONFIG_DIR_ENV).map(PathBuf::from).or_else(|| self.home())?;
        Some(dir.join(".claude.json"))
    }

    /// Claude Code's transcripts: `<its directory>/projects`.
    pub fn claude_projects_dir(&self) -> Option<PathBuf> {
        Some(self.claude_config_dir()?.join("projects"))
    }

    /// The managed policy memory file: `$CTXD_MANAGED_MEMORY`, else
    /// [`MANAGED_MEMORY_PATH`].
    pub fn managed_memory_path(&self) -> PathBuf {
        self.non_empty(MANAGED_MEMORY_ENV).map_or_else(|| PathBuf::from(MANAGED_MEMORY_PATH), PathBuf::from)
    }

    /// `$CTXD_LOG`, the log filter, when set.
    pub fn log_filter(&self) -> Option<&str> {
        self.var(LOG_ENV).filter(|v| !v.trim().is_empty())
    }

    /// `CTXD_NO_WATCH`: no OS file notifications.
    pub fn no_watch(&self) -> bool {
        self.flag(NO_WATCH_ENV)
    }

    /// `CTXD_DISABLE_COMPACT_FORK`: no cache-sharing fork.
    pub fn compact_fork_disabled(&self) -> bool {
        self.flag(DISABLE_FORK_ENV)
    }

    /// `CTXD_CACHE_TTL_SECONDS`, when a positive whole number.
    pub fn cache_ttl_override(&self) -> Option<u64> {
        self.var(CACHE_TTL_ENV).and_then(|v| v.trim().parse().ok()).filter(|&s: &u64| s > 0)
    }
}

/// Names only, never values: an API key is one of them.
impl fmt::Debug for ProcessEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessEnv")
            .field("names", &self.vars.keys().collect::<Vec<_>>())
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_from_given_pairs_alone() {
        let env = ProcessEnv::from_pairs([
            ("CTXD_STATE_DIR", "/srv/ctxd"),
            ("CTXD_NO_WATCH", "1"),
            ("MY_KEY", "sk-given"),
            ("HOME", "/home/u"),
            ("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "50000"),
        ]);
        assert_eq!(env.default_state_dir(), PathBuf::from("/srv/ctxd"));
        assert!(env.no_watch());
        assert!(!env.compact_fork_disabled());
        assert_eq!(env.cache_ttl_override(), None);
        assert_eq!(ProcessEnv::from_pairs([(CACHE_TTL_ENV, "3")]).cache_ttl_override(), Some(3));
        assert_eq!(ProcessEnv::from_pairs([(CACHE_TTL_ENV, "0")]).cache_ttl_override(), None);
        assert_eq!(ProcessEnv::from_pairs([(CACHE_TTL_ENV, "soon")]).cache_ttl_override(), None);
        assert_eq!(env.var("MY_KEY"), Some("sk-given"));
        assert_eq!(env.var("OTHER_KEY"), None);
        assert_eq!(env.budget().auto_compact_window, Some(50_000));
        assert_eq!(env.config_home(), Some(PathBuf::from("/home/u/.config")));
        assert_eq!(env.claude_projects_dir(), Some(PathBuf::from("/home/u/.claude/projects")));
        assert_eq!(env.managed_memory_path(), PathBuf::from("/etc/claude-code/CLAUDE.md"));
        let moved = ProcessEnv::from_pairs([(MANAGED_MEMORY_ENV, "/srv/policy/CLAUDE.md")]);
        assert_eq!(moved.managed_memory_path(), PathBuf::from("/srv/policy/CLAUDE.md"));
        // Nothing leaked in from the real environment of the test process.
        assert_eq!(env.var("PATH"), None);
        assert_eq!(env.temp_dir(), PathBuf::from("/tmp"));
    }

    #[test]
    fn state_dir_follows_the_xdg_rules() {
        let dir = |pairs: &[(&str, &str)]| ProcessEnv::from_pairs(pairs.iter().copied()).default_state_dir();
        assert_eq!(dir(&[("HOME", "/h")]), PathBuf::from("/h/.local/state/ctxd"));
        assert_eq!(dir(&[("HOME", "/h"), ("XDG_STATE_HOME", "/s")]), PathBuf::from("/s/ctxd"));
        // A relative XDG directory is invalid by the specification and ignored.
        assert_eq!(dir(&[("HOME", "/h"), ("XDG_STATE_HOME", "s")]), PathBuf::from("/h/.local/state/ctxd"));
        // An empty override is no override.
        assert_eq!(dir(&[("HOME", "/h"), ("CTXD_STATE_DIR", "")]), PathBuf::from("/h/.local/state/ctxd"));
        assert_eq!(dir(&[("TMPDIR", "/scratch")]), PathBuf::from("/scratch/ctxd-state"));
        assert_eq!(dir(&[]), PathBuf::from("/tmp/ctxd-state"));
    }

    #[test]
    fn flags_are_off_when_empty_or_zero() {
        let env = |value: &str| ProcessEnv::from_pairs([(NO_WATCH_ENV, value), (DISABLE_FORK_ENV, value)]);
        for off in ["", "0"] {
            assert!(!env(off).no_watch(), "{off:?}");
            assert!(!env(off).compact_fork_disabled(), "{off:?}");
        }
        assert!(env("yes").no_watch());
        assert!(env("yes").compact_fork_disabled());
    }

    #[test]
    fn claude_config_dir_overrides_home() {
        let env = ProcessEnv::from_pairs([("HOME", "/h"), (CLAUDE_CONFIG_DIR_ENV, "/c")]);
        assert_eq!(env.claude_config_dir(), Some(PathBuf::from("/c")));
        assert_eq!(ProcessEnv::from_pairs([("HOME", "")]).claude_config_dir(), None);
    }

    #[test]
    fn the_last_of_a_repeated_name_counts_and_bad_budget_values_warn() {
        let env = ProcessEnv::from_pairs([
            ("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "1000"),
            ("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "not a number"),
            ("K", "first"),
            ("K", "second"),
        ]);
        assert_eq!(env.var("K"), Some("second"));
        assert_eq!(env.budget().auto_compact_window, None);
        assert_eq!(env.budget_warnings().len(), 1, "{:?}", env.budget_warnings());
    }

    #[test]
    fn non_utf8_values_are_kept_for_paths_and_skipped_for_text() {
        use std::os::unix::ffi::OsStringExt;
        let home = OsString::from_vec(b"/home/\xff".to_vec());
        let env = ProcessEnv::from_pairs([(OsString::from("HOME"), home.clone())]);
        assert_eq!(env.home(), Some(PathBuf::from(home)));
        assert_eq!(env.var("HOME"), None);
    }

    #[test]
    fn debug_shows_no_value() {
        let env = ProcessEnv::from_pairs([("ANTHROPIC_API_KEY", "sk-ant-secret-1234"), ("MY_KEY", "hunter2")]);
        let shown = format!("{env:?} {env:#?}");
        assert!(shown.contains("ANTHROPIC_API_KEY"), "{shown}");
        assert!(!shown.contains("sk-ant-secret-1234") && !shown.contains("hunter2"), "{shown}");
    }
}
