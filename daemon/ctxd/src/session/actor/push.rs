//! The session's usage, and `ctx/usageChanged` pushed at a bounded rate.

use std::time::Instant;

use super::{Session, USAGE_PUSH_INTERVAL};
use crate::session::usage::UsageSnapshot;

/// What was pushed last, and when the next push is due.
#[derive(Default)]
pub(super) struct PushState {
    last_sent: Option<Instant>,
    last_usage: Option<UsageSnapshot>,
    /// A change inside the interval goes out then.
    pub(super) due: Option<tokio::time::Instant>,
}

impl Session {
    pub(super) fn usage(&self) -> UsageSnapshot {
        let compacting = self.compaction.compacting();
        UsageSnapshot::compute(&self.view.tally, &self.shape(), &self.setup.thresholds, compacting)
    }

    /// Pushes `ctx/usageChanged` when the usage changed, at most once per
    /// [`USAGE_PUSH_INTERVAL`]; a change inside the interval is sent when it ends, so the
    /// last state always arrives.
    pub(super) async fn usage_changed(&mut self, usage: UsageSnapshot) {
        if self.push.last_usage.as_ref() == Some(&usage) {
            return;
        }
        let now = Instant::now();
        match self.push.last_sent {
            Some(at) if now.duration_since(at) < USAGE_PUSH_INTERVAL => {
                if self.push.due.is_none() {
                    self.push.due = Some(tokio::time::Instant::from_std(at + USAGE_PUSH_INTERVAL));
                }
            }
            _ => self.push_usage_now().await,
        }
    }

    pub(super) async fn push_usage_now(&mut self) {
        self.push.due = None;
        let usage = self.usage();
        if self.push.last_usage.as_ref() == Some(&usage) {
            return;
        }
        self.push.last_sent = Some(Instant::now());
        self.push.last_usage = Some(usage.clone());
        self.notifier.usage_changed(&self.id, usage).await;
    }
}
