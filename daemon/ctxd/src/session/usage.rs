//! A session's usage at one moment, and its conversion to the wire `Usage` object.
//!
//! The numbers come from the core (`breakdown` for tokens and their parts, `Thresholds`
//! for levels); this file only packages them, so every client draws from the same
//! figures as the auto-compact trigger.

use ctxd_core::breakdown::{self, Breakdown, Composition, Prefix};
use ctxd_core::budget::{Level as CoreLevel, Thresholds};
use ctxd_core::tally::Tally;
use ctxd_proto as proto;

/// Usage of one session, as computed by its actor.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageSnapshot {
    /// Tokens the next request is expected to carry.
    pub tokens: u64,
    pub reported: u64,
    pub parts: Breakdown,
    pub thresholds: Thresholds,
    pub compacting: bool,
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
        }
    }

    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    pub fn level(&self) -> proto::Level {
        if self.compacting {
            return proto::Level::Compacting;
        }
        match self.thresholds.level(self.tokens) {
            CoreLevel::Ok => proto::Level::Ok,
            CoreLevel::Warning => proto::Level::Warning,
            CoreLevel::Blocked => proto::Level::Blocked,
        }
    }

    pub fn to_proto(&self) -> proto::Usage {
        let t = &self.thresholds;
        let tokens = self.tokens;
        let buffer = (t.window.saturating_sub(t.threshold)).min(t.window.saturating_sub(tokens));
        let free = t.window.saturating_sub(tokens).saturating_sub(buffer);
        let p = &self.parts;
        proto::Usage {
            tokens,
            reported_tokens: self.reported,
            estimated_tokens: tokens - self.reported,
            window: t.window,
            effective_window: t.effective_window,
            threshold: t.threshold,
            warning: t.warning,
            blocked: t.blocked,
            percent_used: t.percent_used(tokens),
            percent_until_compact: t.percent_until_compact(tokens),
            tokens_until_compact: t.tokens_until_compact(tokens),
            level: self.level(),
            auto_compact_enabled: t.auto_compact_enabled,
            breakdown: proto::Breakdown {
                system_prompt: p.system_prompt,
                tools: p.tools,
                memory_files: p.memory_files,
                skills: p.skills,
                messages: proto::MessageBreakdown {
                    tool_results: p.tool_results,
                    summaries: p.summaries,
                    other: p.other_messages,
                },
                free_space: free,
                autocompact_buffer: buffer,
            },
        }
    }
}
