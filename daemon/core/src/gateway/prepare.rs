//! When the gateway prepares a live session's summary ahead of its compaction.
//!
//! A preparation costs a model call, so it runs only when the summary is likely to be
//! wanted and cheap to make: the user is away (the session idle for
//! `gateway.precomputeIdleSeconds`) with the context at or above
//! `gateway.precomputeAtPercent` of Claude Code's auto-compact threshold, and still
//! within the cache's lifetime so the fork reads it; or the context has passed 90 % of
//! the threshold, between turns. Never while a request of the session is in flight (the
//! newest request is about to change), at most once per tenth of the threshold grown
//! since the last preparation, and not for a model the model table does not know (its
//! threshold would be a guess) nor one the price table does not (`prices.json`: what a
//! preparation costs could not be told, see [`super::costs`]).

use crate::budget::{EnvConfig, WindowInputs, model_spec, resolve_window, thresholds};
use crate::cache_state::prices_for;

/// The share of the threshold past which a session is prepared between turns, idle or
/// not.
pub const NEAR_THRESHOLD_PERCENT: u64 = 90;
/// The share of the threshold a session must grow by before it is prepared again.
pub const REPREPARE_GROWTH_PERCENT: u64 = 10;

/// The settings that shape preparation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareSettings {
    pub enabled: bool,
    pub idle_seconds: u64,
    pub at_percent: u64,
}

impl Default for PrepareSettings {
    fn default() -> PrepareSettings {
        PrepareSettings { enabled: true, idle_seconds: 120, at_percent: 60 }
    }
}

/// What the gateway knows of a session now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionNow<'a> {
    pub model: &'a str,
    /// The context of the newest answered request (its usage's input side plus output).
    pub tokens: u64,
    /// Seconds since the newest answer's last byte.
    pub idle_seconds: u64,
    /// How long the cache that request wrote stays warm.
    pub cache_ttl_seconds: u64,
    /// Requests of the session sent and not yet answered to their last byte.
    pub in_flight: u32,
    /// The tokens at the last preparation, if any.
    pub prepared_at_tokens: Option<u64>,
    /// The newest request is kept (a fork can be made of it).
    pub have_request: bool,
}

/// Why a preparation starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepareReason {
    Idle,
    NearThreshold,
}

/// What to do about a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepareDecision {
    Prepare(PrepareReason),
    /// Not now: ask again after this many seconds (a session that may become due by
    /// idling).
    Later(u64),
    /// Not until something changes (a new answer).
    No(NotPrepared),
}

/// Why a session is not prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotPrepared {
    Disabled,
    UnknownModel,
    /// The price table does not list the model.
    UnpricedModel,
    NoRequest,
    InFlight,
    /// Prepared within the last tenth of the threshold.
    RecentlyPrepared,
    /// Below the share of the threshold worth preparing.
    TooSmall,
    /// Idle past the cache's lifetime: the fork would re-write the whole context.
    CacheCold,
}

/// Claude Code's auto-compact threshold for `model`, if the model table knows it.
pub fn threshold(model: &str) -> Option<u64> {
    let env = EnvConfig::default();
    if !model_spec(model, &env).known {
        return None;
    }
    let levels = thresholds(&resolve_window(model, &WindowInputs::default(), &env), &env, true);
    (levels.threshold > 0).then_some(levels.threshold)
}

/// Decides about one session.
pub fn decide(settings: &PrepareSettings, now: &SessionNow<'_>) -> PrepareDecision {
    use PrepareDecision::{Later, No, Prepare};
    if !settings.enabled {
        return No(NotPrepared::Disabled);
    }
    let Some(threshold) = threshold(now.model) else { return No(NotPrepared::UnknownModel) };
    if prices_for(now.model).is_none() {
        return No(NotPrepared::UnpricedModel);
    }
    if !now.have_request {
        return No(NotPrepared::NoRequest);
    }
    if now.in_flight > 0 {
        return No(NotPrepared::InFlight);
    }
    let share = |percent: u64| u128::from(threshold) * u128::from(percent) / 100;
    let tokens = u128::from(now.tokens);
    // Growth counts from the last preparation, unless the context has shrunk below it
    // since: the conversation was compacted, and that preparation summarized the one
    // before.
    if let Some(before) = now.prepared_at_tokens
        && (u128::from(before)..u128::from(before) + share(REPREPARE_GROWTH_PERCENT)).contains(&tokens)
    {
        return No(NotPrepared::RecentlyPrepared);
    }
    if tokens >= share(NEAR_THRESHOLD_PERCENT) {
        return Prepare(PrepareReason::NearThreshold);
    }
    if tokens < share(settings.at_percent.min(100)) {
        return No(NotPrepared::TooSmall);
    }
    if now.idle_seconds >= now.cache_ttl_seconds {
        return No(NotPrepared::CacheCold);
    }
    if now.idle_seconds >= settings.idle_seconds {
        return Prepare(PrepareReason::Idle);
    }
    Later(settings.idle_seconds - now.idle_seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = "claude-opus-5-5";

    fn now(tokens: u64) -> SessionNow<'static> {
        SessionNow {
            model: MODEL,
            tokens,
            idle_seconds: 0,
            cache_ttl_seconds: 300,
            in_flight: 0,
            prepared_at_tokens: None,
            have_request: true,
        }
    }

    fn t() -> u64 {
        threshold(MODEL).unwrap()
    }

    #[test]
    fn the_threshold_is_claude_codes_for_known_models_only() {
        assert_eq!(t(), 1_000_000 - 20_000 - 13_000);
        assert_eq!(threshold("gpt-9-unknown"), None);
    }

    #[test]
    fn idle_and_above_the_share_prepares_before_the_cache_goes_cold() {
        let settings = PrepareSettings::default();
        let at = t() * 60 / 100;
        assert_eq!(decide(&settings, &now(at)), PrepareDecision::Later(120));
        assert_eq!(decide(&settings, &SessionNow { idle_seconds: 100, ..now(at) }), PrepareDecision::Later(20));
        assert_eq!(
            decide(&settings, &SessionNow { idle_seconds: 120, ..now(at) }),
            PrepareDecision::Prepare(PrepareReason::Idle)
        );
        assert_eq!(
            decide(&settings, &SessionNow { idle_seconds: 300, ..now(at) }),
            PrepareDecision::No(NotPrepared::CacheCold)
        );
        assert_eq!(
            decide(&settings, &SessionNow { idle_seconds: 500, ..now(at - 1) }),
            PrepareDecision::No(NotPrepared::TooSmall)
        );
        let custom = PrepareSettings { idle_seconds: 5, at_percent: 10, ..settings };
        assert_eq!(
            decide(&custom, &SessionNow { idle_seconds: 5, ..now(t() / 10) }),
            PrepareDecision::Prepare(PrepareReason::Idle)
        );
    }

    #[test]
    fn near_the_threshold_prepares_between_turns_without_waiting() {
        let settings = PrepareSettings::default();
        let near = t() * 90 / 100 + 1;
        assert_eq!(decide(&settings, &now(near)), PrepareDecision::Prepare(PrepareReason::NearThreshold));
        assert_eq!(
            decide(&settings, &SessionNow { in_flight: 1, ..now(near) }),
            PrepareDecision::No(NotPrepared::InFlight)
        );
    }

    #[test]
    fn once_per_tenth_of_the_threshold_grown() {
        let settings = PrepareSettings::default();
        let first = t() * 91 / 100;
        let again = SessionNow { prepared_at_tokens: Some(first), ..now(first + t() / 10 - 1) };
        assert_eq!(decide(&settings, &again), PrepareDecision::No(NotPrepared::RecentlyPrepared));
        let grown = SessionNow { prepared_at_tokens: Some(first), ..now(first + t() / 10 + 1) };
        assert_eq!(decide(&settings, &grown), PrepareDecision::Prepare(PrepareReason::NearThreshold));
    }

    #[test]
    fn after_a_compaction_the_new_conversation_is_prepared_again() {
        // Prepared at 95 %; the program compacted, and the new conversation has grown
        // back to 92 %, below the old mark: it is due, not "recently prepared".
        let settings = PrepareSettings::default();
        let compacted = SessionNow { prepared_at_tokens: Some(t() * 95 / 100), ..now(t() * 92 / 100) };
        assert_eq!(decide(&settings, &compacted), PrepareDecision::Prepare(PrepareReason::NearThreshold));
    }

    #[test]
    fn off_unknown_or_without_a_request_never_prepares() {
        let near = now(t());
        let off = PrepareSettings { enabled: false, ..PrepareSettings::default() };
        assert_eq!(decide(&off, &near), PrepareDecision::No(NotPrepared::Disabled));
        let unknown = SessionNow { model: "mystery-model", ..near };
        assert_eq!(decide(&PrepareSettings::default(), &unknown), PrepareDecision::No(NotPrepared::UnknownModel));
        // Known to the model table (its family), absent from the price table.
        let unpriced = SessionNow { model: "claude-opus-4-9-20270101", ..near };
        assert!(threshold(unpriced.model).is_some());
        assert_eq!(decide(&PrepareSettings::default(), &unpriced), PrepareDecision::No(NotPrepared::UnpricedModel));
        let none = SessionNow { have_request: false, ..near };
        assert_eq!(decide(&PrepareSettings::default(), &none), PrepareDecision::No(NotPrepared::NoRequest));
    }
}
