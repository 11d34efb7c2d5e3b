//! A session's usage at one moment.
//!
//! The numbers come from the core (`breakdown` for tokens and their parts, `Thresholds`
//! for levels); this file only packages them, so every client draws from the same
//! figures as the auto-compact trigger (`crate::wire::usage` writes the wire object).

use ctxd_core::breakdown::{self, Breakdown, Composition, Prefix};
use ctxd_core::budget::Thresholds;
use ctxd_core::tally::Tally;

/// Usage of one session, as computed by its actor.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageSnapshot {
    /// Tokens the next request is expected to carry.
    pub tokens: u64,
    pub reported: u64,
    pub parts: Breakdown,
    pub thresholds: Thresholds,
    pub compacting: bool,
    /// The prompt cache, for a live Claude Code session whose requests pass through
    /// ctxd's gateway (its follower fills it in).
    pub cache: Option<ctxd_proto::PromptCache>,
}

/// What a session knows beyond its tally: the request's fixed parts, what the next
/// request adds, and the kinds of its messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct Shape {
    pub prefix: Prefix,
    pub pending: u64,
    pub composition: Composition,
}

impl UsageSnapshot {
    pub fn compute(tally: &Tally, shape: &Shape, thresholds: &Thresholds, compacting: bool) -> UsageSnapshot {
        let tokens = breakdown::next_request_tokens(tally, &shape.prefix, shape.pending);
        UsageSnapshot {
            tokens,
            reported: tally.reported.min(tokens),
            parts: breakdown::split(tokens, &shape.prefix, &shape.composition),
            thresholds: *thresholds,
            compacting,
            cache: None,
        }
    }

    pub fn tokens(&self) -> u64 {
        self.tokens
    }
}
