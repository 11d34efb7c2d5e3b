//! Token budget of a session: which context window applies, and at which token counts
//! ctxd warns, compacts and refuses.
//!
//! Deciding when to compact needs three answers that depend on each other: what the
//! model can hold ([`model_spec`]), which window the user or the host asked for
//! ([`resolve_window`]), and the levels derived from that window ([`thresholds`]). They
//! live together so every caller (status line, compaction planner, request gate) reads
//! the same numbers.
//!
//! Everything here is pure. The environment arrives as `(name, value)` pairs
//! ([`EnvConfig::from_vars`]) and settings arrive as plain numbers, so the daemon decides
//! where they come from and tests need no process environment. Bad input never panics:
//! it is skipped (or clamped) and described in a warning string for the caller to log.
//!
//! - [`env`](EnvConfig): the environment variables that steer the budget.
//! - [`models`](model_spec): known models, their windows and output limits.
//! - [`window`](resolve_window): which window wins, and how far it may go.
//! - [`levels`](thresholds): effective window, compact threshold, warning and blocked
//!   levels, and the questions asked of them.
//! - [`notice`](BudgetNotice): the note the model gets as the context nears the threshold.

mod env;
mod levels;
mod models;
mod notice;
mod window;

#[cfg(test)]
mod tests;

pub use env::{ENV_VARS, EnvConfig, parse_token_count};
pub use levels::{
    AUTOCOMPACT_BUFFER_TOKENS, BLOCKING_BUFFER_TOKENS, Level, OUTPUT_RESERVE_CAP, Thresholds, WARNING_BUFFER_TOKENS,
    thresholds,
};
pub use models::{
    DEFAULT_CONTEXT_WINDOW, HostAutoCompact, ModelSpec, OBSERVED_CLAUDE_CODE, ONE_MILLION_WINDOW,
    UNKNOWN_MODEL_MAX_OUTPUT, model_spec,
};
pub use notice::{BudgetNotice, NOTICE_PERCENTS, notice_text};
pub use window::{
    MAX_CONFIGURED_WINDOW, MIN_CONFIGURED_WINDOW, ResolvedWindow, WindowInputs, WindowSource, resolve_window,
};
