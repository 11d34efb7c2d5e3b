//! Precomputed compaction: when to prepare a summary ahead of the threshold, and whether
//! a prepared one may still be installed when the threshold comes.
//!
//! A session that passes [`Thresholds::precompute_start`] will soon need compacting, so
//! the daemon writes the summary in the background while the session still works. At the
//! threshold it installs that summary with every record appended since it was prepared
//! kept verbatim after it: no model call on the critical path. A summary prepared on a
//! view that has since changed underneath (a boundary, an undo), or one that would leave
//! the session too full because much was appended since, is dropped for a normal
//! compaction.

use crate::budget::Thresholds;

/// Whether to start preparing a summary at `tokens`. Only between the precompute start
/// and the threshold (from the threshold on, the compaction itself runs), only when the
/// levels are enforced and automatic compaction may run.
pub fn should_prepare(tokens: u64, thresholds: &Thresholds) -> bool {
    thresholds.auto_compact_enabled
        && thresholds.enforce_window
        && tokens >= thresholds.precompute_start()
        && tokens < thresholds.threshold
}

/// Why a prepared summary is not installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// The view it was prepared on was replaced (a compaction or an undo since).
    ViewReplaced,
    /// So much was appended since that the session would end more than half way to the
    /// threshold: a fresh summary that covers those records does better.
    TooMuchSince { estimated_after: u64, limit: u64 },
}

/// Checks a prepared summary at install time. `estimated_post` is what the compacted
/// session would hold as prepared (fixed prefix, summary, kept tail, restored files and
/// skills); `appended_since` the tokens appended after it was prepared, which are kept
/// verbatim too.
pub fn check_prepared(
    estimated_post: u64,
    appended_since: u64,
    same_view: bool,
    thresholds: &Thresholds,
) -> Result<u64, Stale> {
    if !same_view {
        return Err(Stale::ViewReplaced);
    }
    let estimated_after = estimated_post.saturating_add(appended_since);
    let limit = thresholds.threshold / 2;
    if estimated_after > limit {
        return Err(Stale::TooMuchSince { estimated_after, limit });
    }
    Ok(estimated_after)
}
