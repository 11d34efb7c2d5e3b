//! A session's usage at one moment, and its conversion to the wire `Usage` object.
//!
//! The numbers come from the core (`Tally` for tokens, `Thresholds` for levels); this
//! file only packages them, so every client draws from the same figures.

use ctxd_core::budget::{Level as CoreLevel, Thresholds};
use ctxd_core::tally::Tally;
use ctxd_proto as proto;

/// Usage of one session, as computed by its actor.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageSnapshot {
    pub reported: u64,
    pub estimated: u64,
    pub thresholds: Thresholds,
    pub compacting: bool,
}

impl UsageSnapshot {
    pub fn compute(tally: &Tally, thresholds: &Thresholds, compacting: bool) -> UsageSnapshot {
        UsageSnapshot {
            reported: tally.reported,
            estimated: tally.estimated(),
            thresholds: *thresholds,
            compacting,
        }
    }

    pub fn tokens(&self) -> u64 {
        self.reported + self.estimated
    }

    pub fn level(&self) -> proto::Level {
        if self.compacting {
            return proto::Level::Compacting;
        }
        match self.thresholds.level(self.tokens()) {
            CoreLevel::Ok => proto::Level::Ok,
            CoreLevel::Warning => proto::Level::Warning,
            CoreLevel::Blocked => proto::Level::Blocked,
        }
    }

    pub fn to_proto(&self) -> proto::Usage {
        let t = &self.thresholds;
        let tokens = self.tokens();
        let buffer = (t.window.saturating_sub(t.threshold)).min(t.window.saturating_sub(tokens));
        let free = t.window.saturating_sub(tokens).saturating_sub(buffer);
        proto::Usage {
            tokens,
            reported_tokens: self.reported,
            estimated_tokens: self.estimated,
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
                messages: proto::MessageBreakdown { other: tokens, ..Default::default() },
                free_space: free,
                autocompact_buffer: buffer,
                ..Default::default()
            },
        }
    }
}
