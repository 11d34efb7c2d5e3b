//! The ladder: cheaper ways to make room before costlier ones.
//!
//! When the context must shrink, the least destructive step that does the job wins:
//! clearing old tool results loses nothing the model still needs, dropping media loses
//! little, a provider summary loses detail, and the offline summarizer (for when the
//! provider keeps failing) loses more. Each rung is tried in that order and must cut the
//! context by a minimum share (10 % by default) to count; a rung that cuts less is
//! discarded (its result is not worth what it lost) and the next is tried. The ladder
//! stops at the first rung that brings the context under the target (the compact
//! threshold). Only when every rung has been tried and the context is still at or above
//! the blocked level does it fail, with the attempts as evidence.
//!
//! The ladder decides; the driver acts. It asks [`Ladder::next_rung`], applies that
//! rung to a copy of the view, measures, and reports with [`Ladder::record`].

/// Default minimum cut of a rung, in percent of the tokens before it.
pub const DEFAULT_MIN_CUT_PERCENT: u64 = 10;

/// One way of making room, in the order they are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rung {
    /// Replace old tool results with a placeholder (microcompact).
    ClearToolResults,
    /// Replace images and documents with text markers.
    DropMedia,
    /// Summarize with the provider.
    ProviderSummary,
    /// Summarize with the offline summarizer.
    OfflineSummary,
}

impl Rung {
    /// All rungs, cheapest first.
    pub const ORDER: [Rung; 4] = [Rung::ClearToolResults, Rung::DropMedia, Rung::ProviderSummary, Rung::OfflineSummary];

    /// The rung replaces the conversation with a summary.
    pub fn summarizes(self) -> bool {
        matches!(self, Rung::ProviderSummary | Rung::OfflineSummary)
    }
}

/// The levels the ladder works against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LadderPolicy {
    /// A rung must cut at least this percent of the tokens before it.
    pub min_cut_percent: u64,
    /// Under this the ladder stops early (the compact threshold).
    pub target: u64,
    /// At or above this after every rung, the ladder fails (the blocked level).
    pub blocked: u64,
}

impl LadderPolicy {
    /// The default minimum cut with the session's levels.
    pub fn new(target: u64, blocked: u64) -> LadderPolicy {
        LadderPolicy { min_cut_percent: DEFAULT_MIN_CUT_PERCENT, target, blocked }
    }
}

/// What applying a rung gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RungOutcome {
    /// The rung ran; the context would be this large with its result.
    Measured { tokens_after: u64 },
    /// The rung failed (the provider refused, errored, or the summary was unusable).
    Failed { reason: String },
    /// Nothing for this rung to do (no old tool results, no media).
    NotApplicable,
}

/// How the ladder judged a rung.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RungVerdict {
    /// Cut at least the minimum: keep its result.
    Effective {
        cut: u64,
    },
    /// Cut less than the minimum: discard its result.
    TooSmall {
        cut: u64,
    },
    Failed,
    NotApplicable,
}

impl RungVerdict {
    /// The driver keeps this rung's result.
    pub fn keep(self) -> bool {
        matches!(self, RungVerdict::Effective { .. })
    }
}

/// One rung tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RungAttempt {
    pub rung: Rung,
    pub tokens_before: u64,
    pub outcome: RungOutcome,
    pub verdict: RungVerdict,
}

/// What to do after a rung.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LadderStep {
    /// Keep (`keep`) or discard the rung's result, then try `next`.
    Next { keep: bool, next: Rung },
    /// Stop climbing. `keep` says whether the last rung's result is kept; `worked` is
    /// the rung that brought the context down last (none when no rung was effective);
    /// `under_target` is false when the context is under the blocked level but not under
    /// the target.
    Done { keep: bool, worked: Option<Rung>, tokens: u64, under_target: bool },
}

/// Why the ladder could not make room.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LadderError {
    /// Every rung was tried and the context is still at or above the blocked level:
    /// refuse the request ("prompt is too long") and tell the user.
    #[error("no way found to bring the context under the blocked level ({tokens} tokens, blocked at {blocked})")]
    Exhausted { tokens: u64, blocked: u64, attempts: Vec<RungAttempt> },
    /// `record` was called after the ladder finished (a driver bug).
    #[error("the ladder has no rung left to record")]
    Finished,
}

/// The ladder of one compaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ladder {
    policy: LadderPolicy,
    tokens: u64,
    next: usize,
    attempts: Vec<RungAttempt>,
    finished: bool,
}

impl Ladder {
    /// A ladder starting from `tokens`.
    pub fn new(tokens: u64, policy: LadderPolicy) -> Ladder {
        Ladder { policy, tokens, next: 0, attempts: Vec::new(), finished: false }
    }

    /// The rung to try now, or `None` once finished.
    pub fn next_rung(&self) -> Option<Rung> {
        if self.finished { None } else { Rung::ORDER.get(self.next).copied() }
    }

    /// The context size with every kept rung applied.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    pub fn attempts(&self) -> &[RungAttempt] {
        &self.attempts
    }

    /// Records the outcome of the rung [`Ladder::next_rung`] named and says what next.
    pub fn record(&mut self, outcome: RungOutcome) -> Result<LadderStep, LadderError> {
        let rung = self.next_rung().ok_or(LadderError::Finished)?;
        self.next += 1;
        let before = self.tokens;
        let verdict = match &outcome {
            RungOutcome::Measured { tokens_after } => {
                let cut = before.saturating_sub(*tokens_after);
                let enough = u128::from(cut) * 100 >= u128::from(before) * u128::from(self.policy.min_cut_percent);
                if cut > 0 && enough { RungVerdict::Effective { cut } } else { RungVerdict::TooSmall { cut } }
            }
            RungOutcome::Failed { .. } => RungVerdict::Failed,
            RungOutcome::NotApplicable => RungVerdict::NotApplicable,
        };
        if let (RungVerdict::Effective { .. }, RungOutcome::Measured { tokens_after }) = (verdict, &outcome) {
            self.tokens = *tokens_after;
        }
        self.attempts.push(RungAttempt { rung, tokens_before: before, outcome, verdict });
        let keep = verdict.keep();
        let under_target = self.tokens < self.policy.target;
        // After an effective summary, a second summary would only summarize a summary.
        let more = self.next_rung().filter(|_| !(keep && rung.summarizes()));
        match more {
            Some(next) if !(keep && under_target) => Ok(LadderStep::Next { keep, next }),
            _ => {
                self.finished = true;
                if self.tokens < self.policy.blocked {
                    Ok(LadderStep::Done { keep, worked: self.last_effective(), tokens: self.tokens, under_target })
                } else {
                    Err(LadderError::Exhausted {
                        tokens: self.tokens,
                        blocked: self.policy.blocked,
                        attempts: self.attempts.clone(),
                    })
                }
            }
        }
    }

    fn last_effective(&self) -> Option<Rung> {
        self.attempts.iter().rev().find(|a| a.verdict.keep()).map(|a| a.rung)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> LadderPolicy {
        LadderPolicy::new(100_000, 130_000)
    }

    #[test]
    fn the_first_rung_that_gets_under_the_target_wins() {
        let mut ladder = Ladder::new(150_000, policy());
        assert_eq!(ladder.next_rung(), Some(Rung::ClearToolResults));
        assert_eq!(
            ladder.record(RungOutcome::Measured { tokens_after: 90_000 }),
            Ok(LadderStep::Done {
                keep: true,
                worked: Some(Rung::ClearToolResults),
                tokens: 90_000,
                under_target: true
            })
        );
        assert_eq!(ladder.next_rung(), None);
        assert_eq!(ladder.record(RungOutcome::NotApplicable), Err(LadderError::Finished));
    }

    #[test]
    fn a_rung_below_the_minimum_cut_is_discarded() {
        let mut ladder = Ladder::new(150_000, policy());
        // 9 % is not enough: discarded, the count stays.
        assert_eq!(
            ladder.record(RungOutcome::Measured { tokens_after: 136_500 }),
            Ok(LadderStep::Next { keep: false, next: Rung::DropMedia })
        );
        assert_eq!(ladder.tokens(), 150_000);
        assert_eq!(ladder.attempts()[0].verdict, RungVerdict::TooSmall { cut: 13_500 });
        // Exactly 10 % is enough, but not under the target: go on.
        assert_eq!(
            ladder.record(RungOutcome::Measured { tokens_after: 135_000 }),
            Ok(LadderStep::Next { keep: true, next: Rung::ProviderSummary })
        );
        assert_eq!(ladder.tokens(), 135_000);
    }

    #[test]
    fn a_failing_provider_falls_through_to_the_offline_summarizer() {
        let mut ladder = Ladder::new(150_000, policy());
        ladder.record(RungOutcome::NotApplicable).unwrap();
        ladder.record(RungOutcome::NotApplicable).unwrap();
        assert_eq!(
            ladder.record(RungOutcome::Failed { reason: "HTTP 529".to_owned() }),
            Ok(LadderStep::Next { keep: false, next: Rung::OfflineSummary })
        );
        assert_eq!(
            ladder.record(RungOutcome::Measured { tokens_after: 30_000 }),
            Ok(LadderStep::Done { keep: true, worked: Some(Rung::OfflineSummary), tokens: 30_000, under_target: true })
        );
    }

    #[test]
    fn an_effective_summary_ends_the_ladder_even_above_the_target() {
        let mut ladder = Ladder::new(150_000, policy());
        ladder.record(RungOutcome::NotApplicable).unwrap();
        ladder.record(RungOutcome::NotApplicable).unwrap();
        // Under blocked, over target: done, but say so.
        assert_eq!(
            ladder.record(RungOutcome::Measured { tokens_after: 120_000 }),
            Ok(LadderStep::Done {
                keep: true,
                worked: Some(Rung::ProviderSummary),
                tokens: 120_000,
                under_target: false
            })
        );
    }

    #[test]
    fn no_rung_under_the_blocked_level_is_a_typed_failure() {
        let mut ladder = Ladder::new(150_000, policy());
        ladder.record(RungOutcome::Measured { tokens_after: 149_000 }).unwrap();
        ladder.record(RungOutcome::NotApplicable).unwrap();
        ladder.record(RungOutcome::Failed { reason: "refused".to_owned() }).unwrap();
        let err = ladder.record(RungOutcome::Measured { tokens_after: 140_000 });
        let Err(LadderError::Exhausted { tokens, blocked, attempts }) = err else {
            panic!("expected Exhausted, got {err:?}");
        };
        assert_eq!((tokens, blocked), (150_000, 130_000));
        assert_eq!(
            attempts.iter().map(|a| (a.rung, a.verdict)).collect::<Vec<_>>(),
            vec![
                (Rung::ClearToolResults, RungVerdict::TooSmall { cut: 1_000 }),
                (Rung::DropMedia, RungVerdict::NotApplicable),
                (Rung::ProviderSummary, RungVerdict::Failed),
                (Rung::OfflineSummary, RungVerdict::TooSmall { cut: 10_000 }),
            ]
        );
    }

    #[test]
    fn cheap_rungs_alone_can_clear_the_blocked_level() {
        // Cheap rungs cut enough to get under blocked but not under target; both
        // summaries fail: done, not under target, worked = the last effective rung.
        let mut ladder = Ladder::new(150_000, policy());
        ladder.record(RungOutcome::Measured { tokens_after: 130_000 }).unwrap();
        ladder.record(RungOutcome::Measured { tokens_after: 115_000 }).unwrap();
        ladder.record(RungOutcome::Failed { reason: "a".to_owned() }).unwrap();
        assert_eq!(
            ladder.record(RungOutcome::Failed { reason: "b".to_owned() }),
            Ok(LadderStep::Done { keep: false, worked: Some(Rung::DropMedia), tokens: 115_000, under_target: false })
        );
    }
}
