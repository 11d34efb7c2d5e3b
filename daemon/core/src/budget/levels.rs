//! Token levels derived from a window: when to warn, when to compact, when to refuse.
//!
//! The levels are fixed offsets below the window, kept in one place so the status line,
//! the compaction trigger and the request gate can never disagree about them. Part of
//! the window is held back for the model's reply (at most 20,000 tokens); the compact
//! threshold leaves room for the summary request itself; the warning comes early enough
//! for the user to act; the blocked level is the last point at which a request can still
//! fit. All arithmetic saturates, so a tiny window yields zero levels, never a panic.

use super::env::EnvConfig;
use super::models::HostAutoCompact;
use super::window::ResolvedWindow;

/// Most of the window ever held back for the reply.
pub const OUTPUT_RESERVE_CAP: u64 = 20_000;
/// Compact threshold: this far below the effective window.
pub const AUTOCOMPACT_BUFFER_TOKENS: u64 = 13_000;
/// Warning level: this far below the compact threshold.
pub const WARNING_BUFFER_TOKENS: u64 = 20_000;
/// Blocked level: this far below the effective window.
pub const BLOCKING_BUFFER_TOKENS: u64 = 3_000;

/// How full the context is. Ordered: `Ok < Warning < Blocked`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    #[default]
    Ok,
    Warning,
    Blocked,
}

/// The levels of one session with one model, all in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// The resolved window.
    pub window: u64,
    /// `window` minus the reply reserve.
    pub effective_window: u64,
    /// Automatic compaction starts here.
    pub threshold: u64,
    /// The user is warned from here.
    pub warning: u64,
    /// Requests are refused from here (unless compaction can bring the context down).
    pub blocked: u64,
    /// Automatic compaction may run: the setting is on and neither
    /// `DISABLE_AUTO_COMPACT` nor `DISABLE_COMPACT` is set.
    pub auto_compact_enabled: bool,
    /// Any compaction (manual included) may run: `DISABLE_COMPACT` is not set.
    pub compact_enabled: bool,
    /// The host program is known to compact this model automatically (or was not
    /// observed, and ctxd's threshold stands): a "to compact" figure means something.
    /// `false` when automatic compaction is off or when Claude Code was seen to make no
    /// auto-compact decision for the model.
    pub shows_compact_figure: bool,
    /// The levels may be acted on. `false` only for a model missing from the table whose
    /// window is a guess, with `CLAUDE_CODE_DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT`
    /// set: then only the provider's "prompt too long" answer triggers compaction.
    pub enforce_window: bool,
}

/// Computes the levels for a resolved window.
///
/// `auto_compact_setting` is the `autoCompactEnabled` setting (the caller passes `true`
/// when it is absent). A percent override only ever moves the threshold earlier: the
/// smaller of that share of the effective window and the normal threshold wins, and the
/// warning follows the threshold it ends up with. `CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE`
/// is taken as given, even above the window, because it is an explicit instruction.
///
/// An unknown model with `CLAUDE_CODE_MAX_CONTEXT_TOKENS` set is enforced even when
/// `CLAUDE_CODE_DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT` is set: its window is then the
/// user's statement, not a guess.
pub fn thresholds(resolved: &ResolvedWindow, env: &EnvConfig, auto_compact_setting: bool) -> Thresholds {
    let window = resolved.window;
    let reserve = resolved.model.max_output_tokens.min(OUTPUT_RESERVE_CAP);
    let effective_window = window.saturating_sub(reserve);
    let normal = effective_window.saturating_sub(AUTOCOMPACT_BUFFER_TOKENS);
    // EnvConfig can be built by hand, so a percent outside 1..=100 is ignored here too.
    let threshold = match env.autocompact_pct_override.filter(|pct| (1..=100).contains(pct)) {
        Some(pct) => share(effective_window, pct).min(normal),
        None => normal,
    };
    let guessed_window = !resolved.model.known && env.max_context_tokens.is_none();
    let auto_compact_enabled = auto_compact_setting && !env.disable_auto_compact && !env.disable_compact;
    Thresholds {
        window,
        effective_window,
        threshold,
        warning: threshold.saturating_sub(WARNING_BUFFER_TOKENS),
        blocked: env.blocking_limit_override.unwrap_or_else(|| effective_window.saturating_sub(BLOCKING_BUFFER_TOKENS)),
        auto_compact_enabled,
        compact_enabled: !env.disable_compact,
        shows_compact_figure: auto_compact_enabled && resolved.model.host_auto_compact != HostAutoCompact::NoDecision,
        enforce_window: !(guessed_window && env.disable_unknown_model_window_enforcement),
    }
}

/// `pct` percent of `tokens`, rounded down; cannot overflow.
fn share(tokens: u64, pct: u8) -> u64 {
    let part = u128::from(tokens) * u128::from(pct) / 100;
    // `part <= tokens` because `pct <= 100`, so the conversion always succeeds.
    u64::try_from(part).unwrap_or(tokens)
}

/// Rounds to one decimal place (halves away from zero).
fn one_decimal(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

impl Thresholds {
    /// `Blocked` at or above `blocked`, else `Warning` at or above `warning`, else `Ok`.
    /// A plain reading of the numbers: whether anything acts on it depends on
    /// `enforce_window` and the enabled flags (see [`Thresholds::rejects_request`] and
    /// [`Thresholds::should_auto_compact`]).
    pub fn level(&self, tokens: u64) -> Level {
        if tokens >= self.blocked {
            Level::Blocked
        } else if tokens >= self.warning {
            Level::Warning
        } else {
            Level::Ok
        }
    }

    /// Tokens left before the compact threshold; zero once it is reached.
    pub fn tokens_until_compact(&self, tokens: u64) -> u64 {
        self.threshold.saturating_sub(tokens)
    }

    /// `tokens` as a percent of the whole window, to one decimal: Claude Code's rule (its
    /// status-line `used_percentage` and `/context` divide by the window, so 700,000 of
    /// 1,000,000 is 70 there and here; a share of the effective window said 71.4).
    ///
    /// Not capped (the program stops at 100): the context can pass the window while the
    /// reported usage lags behind, and showing 104.2 tells the user more than a flat 100.
    /// A window of zero counts as full (100.0).
    pub fn percent_used(&self, tokens: u64) -> f64 {
        if self.window == 0 {
            return 100.0;
        }
        one_decimal(tokens as f64 / self.window as f64 * 100.0)
    }

    /// Share of the compact threshold still free, as a percent to one decimal, within
    /// 0.0..=100.0. A threshold of zero leaves nothing free (0.0).
    pub fn percent_until_compact(&self, tokens: u64) -> f64 {
        if self.threshold == 0 {
            return 0.0;
        }
        let free = self.tokens_until_compact(tokens) as f64 / self.threshold as f64 * 100.0;
        one_decimal(free).clamp(0.0, 100.0)
    }

    /// Automatic compaction is due: at or past the threshold, enabled, and enforced.
    pub fn should_auto_compact(&self, tokens: u64) -> bool {
        tokens >= self.threshold && self.auto_compact_enabled && self.enforce_window
    }

    /// The request must be refused with "prompt is too long" without trying to compact:
    /// at or past the blocked level, enforced, and automatic compaction unavailable
    /// (disabled outright, or only manual compaction left). With automatic compaction
    /// on, the caller compacts first and refuses only if that fails.
    pub fn rejects_request(&self, tokens: u64) -> bool {
        tokens >= self.blocked && self.enforce_window && !self.auto_compact_enabled
    }

    /// Token count at which a summary may be prepared ahead of time: four fifths of the
    /// window, or the threshold if that comes first.
    pub fn precompute_start(&self) -> u64 {
        (self.window - self.window / 5).min(self.threshold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::models::ModelSpec;
    use crate::budget::window::WindowSource;

    fn resolved(window: u64, max_output_tokens: u64, known: bool) -> ResolvedWindow {
        ResolvedWindow {
            window,
            source: WindowSource::ModelDefault,
            model: ModelSpec { context_window: window, max_output_tokens, known, ..ModelSpec::default() },
            warnings: Vec::new(),
            unknown_model: None,
        }
    }

    fn levels(window: u64, max_output: u64) -> Thresholds {
        thresholds(&resolved(window, max_output, true), &EnvConfig::default(), true)
    }

    #[test]
    fn formulas() {
        // (window, model max output, effective, threshold, warning, blocked)
        let cases: &[(u64, u64, u64, u64, u64, u64)] = &[
            // The reference example.
            (1_000_000, 64_000, 980_000, 967_000, 947_000, 977_000),
            (1_000_000, 20_000, 980_000, 967_000, 947_000, 977_000),
            (200_000, 64_000, 180_000, 167_000, 147_000, 177_000),
            (500_000, 32_000, 480_000, 467_000, 447_000, 477_000),
            (100_000, 64_000, 80_000, 67_000, 47_000, 77_000),
            // Output limits below the cap reserve only what they need.
            (200_000, 4_096, 195_904, 182_904, 162_904, 192_904),
            (200_000, 8_192, 191_808, 178_808, 158_808, 188_808),
            (200_000, 19_999, 180_001, 167_001, 147_001, 177_001),
            // Tiny windows saturate at zero.
            (30_000, 20_000, 10_000, 0, 0, 7_000),
            (10_000, 20_000, 0, 0, 0, 0),
            (0, 0, 0, 0, 0, 0),
        ];
        for &(window, out, effective, threshold, warning, blocked) in cases {
            let got = levels(window, out);
            assert_eq!(
                (got.window, got.effective_window, got.threshold, got.warning, got.blocked),
                (window, effective, threshold, warning, blocked),
                "window {window}, max output {out}"
            );
        }
    }

    #[test]
    fn percent_override() {
        // (pct, threshold, warning) on a 1M window: effective 980,000, normal 967,000.
        let cases: &[(u8, u64, u64)] = &[
            (1, 9_800, 0),
            (2, 19_600, 0),
            (3, 29_400, 9_400),
            (50, 490_000, 470_000),
            (98, 960_400, 940_400),
            (99, 967_000, 947_000),
            (100, 967_000, 947_000),
        ];
        for &(pct, threshold, warning) in cases {
            let env = EnvConfig { autocompact_pct_override: Some(pct), ..EnvConfig::default() };
            let got = thresholds(&resolved(1_000_000, 64_000, true), &env, true);
            assert_eq!((got.threshold, got.warning), (threshold, warning), "pct {pct}");
            // The blocked level and effective window do not move.
            assert_eq!((got.effective_window, got.blocked), (980_000, 977_000), "pct {pct}");
        }
        // Out-of-range values set by hand are ignored.
        for pct in [0u8, 101, 255] {
            let env = EnvConfig { autocompact_pct_override: Some(pct), ..EnvConfig::default() };
            let got = thresholds(&resolved(1_000_000, 64_000, true), &env, true);
            assert_eq!(got.threshold, 967_000, "pct {pct}");
        }
    }

    #[test]
    fn percent_override_does_not_overflow() {
        let env = EnvConfig { autocompact_pct_override: Some(100), ..EnvConfig::default() };
        let got = thresholds(&resolved(u64::MAX, 64_000, false), &env, true);
        assert_eq!(got.threshold, u64::MAX - 20_000 - 13_000);
    }

    #[test]
    fn blocking_override_replaces_only_the_blocked_level() {
        for override_at in [500_000u64, 990_000, 5_000_000] {
            let env = EnvConfig { blocking_limit_override: Some(override_at), ..EnvConfig::default() };
            let got = thresholds(&resolved(1_000_000, 64_000, true), &env, true);
            assert_eq!(got.blocked, override_at);
            assert_eq!((got.threshold, got.warning), (967_000, 947_000));
        }
    }

    #[test]
    fn level_boundaries() {
        let t = levels(1_000_000, 64_000);
        let cases: &[(u64, Level)] = &[
            (0, Level::Ok),
            (946_999, Level::Ok),
            (947_000, Level::Warning),
            (967_000, Level::Warning),
            (976_999, Level::Warning),
            (977_000, Level::Blocked),
            (2_000_000, Level::Blocked),
        ];
        for &(tokens, level) in cases {
            assert_eq!(t.level(tokens), level, "{tokens}");
        }
        assert!(Level::Ok < Level::Warning && Level::Warning < Level::Blocked);
    }

    #[test]
    fn tokens_until_compact_saturates() {
        let t = levels(1_000_000, 64_000);
        let cases: &[(u64, u64)] = &[(0, 967_000), (900_000, 67_000), (966_999, 1), (967_000, 0), (2_000_000, 0)];
        for &(tokens, left) in cases {
            assert_eq!(t.tokens_until_compact(tokens), left, "{tokens}");
        }
    }

    #[test]
    fn percents_round_to_one_decimal() {
        let t = levels(1_000_000, 64_000);
        // (tokens, used of the 1,000,000 window, free of 967,000)
        let cases: &[(u64, f64, f64)] = &[
            (0, 0.0, 100.0),
            (490_000, 49.0, 49.3),
            // The program's figure at 700k of 1M is 70 (a share of the effective
            // window, 980k, would be 71.4).
            (700_000, 70.0, 27.6),
            (49, 0.0, 100.0),
            (1_000, 0.1, 99.9),
            (967_000, 96.7, 0.0),
            (1_000_000, 100.0, 0.0),
            (1_042_000, 104.2, 0.0),
        ];
        for &(tokens, used, free) in cases {
            assert_eq!(t.percent_used(tokens), used, "used at {tokens}");
            assert_eq!(t.percent_until_compact(tokens), free, "free at {tokens}");
        }
        let empty = levels(0, 0);
        assert_eq!(empty.percent_used(0), 100.0);
        assert_eq!(empty.percent_until_compact(0), 0.0);
    }

    #[test]
    fn switches() {
        // (DISABLE_AUTO_COMPACT, DISABLE_COMPACT, setting) -> (auto, any)
        let cases: &[(bool, bool, bool, bool, bool)] = &[
            (false, false, true, true, true),
            (false, false, false, false, true),
            (true, false, true, false, true),
            (false, true, true, false, false),
            (true, true, true, false, false),
            (true, true, false, false, false),
        ];
        for &(no_auto, no_compact, setting, auto, any) in cases {
            let env = EnvConfig { disable_auto_compact: no_auto, disable_compact: no_compact, ..EnvConfig::default() };
            let got = thresholds(&resolved(200_000, 64_000, true), &env, setting);
            assert_eq!(
                (got.auto_compact_enabled, got.compact_enabled),
                (auto, any),
                "{no_auto} {no_compact} {setting}"
            );
            assert_eq!(got.should_auto_compact(170_000), auto);
            // Without automatic compaction the blocked level refuses.
            assert_eq!(got.rejects_request(177_000), !auto);
            assert!(!got.rejects_request(176_999));
        }
    }

    #[test]
    fn enforcement_of_unknown_windows() {
        let off = EnvConfig { disable_unknown_model_window_enforcement: true, ..EnvConfig::default() };
        let with_max = EnvConfig { max_context_tokens: Some(128_000), ..off };
        // (model known, env, enforced)
        let cases: &[(bool, EnvConfig, bool)] =
            &[(false, EnvConfig::default(), true), (false, off, false), (false, with_max, true), (true, off, true)];
        for &(known, env, enforced) in cases {
            let got = thresholds(&resolved(200_000, 32_000, known), &env, true);
            assert_eq!(got.enforce_window, enforced, "known {known}, {env:?}");
            assert_eq!(got.should_auto_compact(500_000), enforced);
        }
        let env = EnvConfig { disable_auto_compact: true, ..off };
        let got = thresholds(&resolved(200_000, 32_000, false), &env, true);
        assert!(!got.rejects_request(500_000), "an unenforced guess never refuses");
        assert_eq!(got.level(500_000), Level::Blocked, "the reading itself is unchanged");
    }

    #[test]
    fn should_auto_compact_at_the_threshold() {
        let t = levels(1_000_000, 64_000);
        assert!(!t.should_auto_compact(966_999));
        assert!(t.should_auto_compact(967_000));
        assert!(t.should_auto_compact(999_999));
    }

    #[test]
    fn precompute_start() {
        // (window, start): four fifths of the window, or the threshold if earlier.
        let cases: &[(u64, u64)] = &[(1_000_000, 800_000), (200_000, 160_000), (100_000, 67_000)];
        for &(window, start) in cases {
            assert_eq!(levels(window, 64_000).precompute_start(), start, "{window}");
        }
    }
}
