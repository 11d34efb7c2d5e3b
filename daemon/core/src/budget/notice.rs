//! The budget notice: a note the model is given once each time the context crosses 70,
//! 85 or 95 % of the room before automatic compaction, so it can put what it must not
//! lose in a file or a reply before the summary replaces the conversation.
//!
//! The caller keeps the highest step already given ([`BudgetNotice::given`]); falling
//! back under the lowest step starts the count again.

use super::Thresholds;

/// The steps, in percent of the compact threshold, at which the model is told.
pub const NOTICE_PERCENTS: [u8; 3] = [70, 85, 95];

/// What a session remembers of the notices it gave.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetNotice {
    /// The highest step given since the context last fell below the lowest (0: none).
    pub given: u8,
}

impl BudgetNotice {
    /// The notice for a request carrying `tokens`, when it crossed a step not given yet.
    pub fn check(&mut self, tokens: u64, thresholds: &Thresholds) -> Option<String> {
        let threshold = thresholds.threshold;
        if threshold == 0 || !thresholds.compact_enabled {
            return None;
        }
        let percent = tokens.saturating_mul(100) / threshold;
        match NOTICE_PERCENTS.into_iter().rev().find(|p| percent >= u64::from(*p)) {
            None => {
                self.given = 0;
                None
            }
            Some(p) if p > self.given => {
                self.given = p;
                Some(notice_text(p, threshold.saturating_sub(tokens)))
            }
            Some(_) => None,
        }
    }
}

/// The notice for step `percent` with `left` tokens before automatic compaction.
pub fn notice_text(percent: u8, left: u64) -> String {
    format!(
        "Context budget: {percent}% of the room before automatic compaction is used; about {left} tokens are left. \
         When it compacts, the conversation becomes a summary: project instructions are reloaded from disk and \
         up to five recently read files come back, but details of earlier tool output do not. Keep track of open \
         tasks and decisions in files or in your replies."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{EnvConfig, WindowInputs, resolve_window, thresholds};

    fn levels(window: u64) -> Thresholds {
        let inputs = WindowInputs { setting: Some(window), ..WindowInputs::default() };
        let env = EnvConfig::default();
        thresholds(&resolve_window("claude-sonnet-4-5-20250929", &inputs, &env), &env, true)
    }

    #[test]
    fn each_step_is_given_once_and_the_highest_crossed_wins() {
        let t = levels(100_000);
        let mut notice = BudgetNotice::default();
        let at = |p: u64| t.threshold * p / 100;
        assert_eq!(notice.check(at(69), &t), None);
        let first = notice.check(at(71), &t).unwrap();
        assert!(first.starts_with("Context budget: 70% "), "{first}");
        assert!(first.contains(&format!("about {} tokens are left", t.threshold - at(71))), "{first}");
        assert_eq!(notice.check(at(72), &t), None, "the same step twice");
        // A jump over two steps gives the higher one only.
        assert!(notice.check(at(96), &t).unwrap().starts_with("Context budget: 95% "));
        assert_eq!(notice.check(at(86), &t), None, "a lower step after a higher one");
        assert_eq!(notice.given, 95);
    }

    #[test]
    fn falling_below_the_lowest_step_starts_again() {
        let t = levels(100_000);
        let mut notice = BudgetNotice::default();
        assert!(notice.check(t.threshold * 90 / 100, &t).is_some());
        assert_eq!(notice.check(t.threshold / 2, &t), None);
        assert_eq!(notice.given, 0);
        assert!(notice.check(t.threshold * 75 / 100, &t).unwrap().starts_with("Context budget: 70% "));
    }

    #[test]
    fn nothing_without_compaction() {
        let mut t = levels(100_000);
        t.compact_enabled = false;
        let mut notice = BudgetNotice::default();
        assert_eq!(notice.check(t.threshold, &t), None);
    }
}
