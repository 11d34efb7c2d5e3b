//! Environment variables that steer the token budget, parsed from plain pairs.
//!
//! The parser never touches the process environment: the daemon hands over the pairs it
//! wants honoured (from its own environment, a session's launch environment, or a test),
//! so one daemon can serve sessions started with different settings. A value that cannot
//! be understood is left out of the result and reported as a warning naming the variable
//! and the value; one bad variable never stops the others from applying.

/// Names of every variable [`EnvConfig::from_vars`] reads, so a caller can pick exactly
/// these out of a larger environment.
pub const ENV_VARS: [&str; 9] = [
    DISABLE_AUTO_COMPACT,
    DISABLE_COMPACT,
    PCT_OVERRIDE,
    AUTO_COMPACT_WINDOW,
    MAX_CONTEXT_TOKENS,
    DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT,
    DISABLE_1M_CONTEXT,
    BLOCKING_LIMIT_OVERRIDE,
    IDLE_COMPACT_MIN_TOKENS,
];

const DISABLE_AUTO_COMPACT: &str = "DISABLE_AUTO_COMPACT";
const DISABLE_COMPACT: &str = "DISABLE_COMPACT";
const PCT_OVERRIDE: &str = "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE";
const AUTO_COMPACT_WINDOW: &str = "CLAUDE_CODE_AUTO_COMPACT_WINDOW";
const MAX_CONTEXT_TOKENS: &str = "CLAUDE_CODE_MAX_CONTEXT_TOKENS";
const DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT: &str = "CLAUDE_CODE_DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT";
const DISABLE_1M_CONTEXT: &str = "CLAUDE_CODE_DISABLE_1M_CONTEXT";
const BLOCKING_LIMIT_OVERRIDE: &str = "CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE";
const IDLE_COMPACT_MIN_TOKENS: &str = "CLAUDE_CODE_IDLE_COMPACT_MIN_TOKENS";

/// Idle compaction never runs below this many tokens, whatever the variable says.
const IDLE_COMPACT_FLOOR: u64 = 100_000;
/// Idle compaction minimum when the variable is not set.
const IDLE_COMPACT_DEFAULT: u64 = 200_000;

/// The budget-related environment, parsed. `None`/`false` means "not set" (or set to
/// something that was rejected with a warning).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnvConfig {
    /// `DISABLE_AUTO_COMPACT`: no automatic compaction; a manual one is still allowed.
    pub disable_auto_compact: bool,
    /// `DISABLE_COMPACT`: no compaction of any kind.
    pub disable_compact: bool,
    /// `CLAUDE_AUTOCOMPACT_PCT_OVERRIDE`: compact at this percent (1..=100) of the
    /// effective window, if that comes before the normal threshold.
    pub autocompact_pct_override: Option<u8>,
    /// `CLAUDE_CODE_AUTO_COMPACT_WINDOW`: the window to compact against, as written
    /// (range and model limits are applied by `resolve_window`, not here).
    pub auto_compact_window: Option<u64>,
    /// `CLAUDE_CODE_MAX_CONTEXT_TOKENS`: the window of a model missing from the table.
    pub max_context_tokens: Option<u64>,
    /// `CLAUDE_CODE_DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT`: for a model missing from
    /// the table, trust the provider's "prompt too long" rather than a guessed window.
    pub disable_unknown_model_window_enforcement: bool,
    /// `CLAUDE_CODE_DISABLE_1M_CONTEXT`: ignore the `[1m]` model suffix.
    pub disable_1m_context: bool,
    /// `CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE`: the token count at which requests are
    /// refused, replacing the computed blocked level.
    pub blocking_limit_override: Option<u64>,
    /// `CLAUDE_CODE_IDLE_COMPACT_MIN_TOKENS`: minimum context size for idle compaction.
    pub idle_compact_min_tokens: Option<u64>,
}

impl EnvConfig {
    /// Parses from (name, value) pairs; never reads the process environment itself.
    ///
    /// Names are matched exactly (environment names are case-sensitive) and names this
    /// module does not use are skipped. When a name appears more than once the last value
    /// counts, as it would in an environment built by successive assignments. Returns the
    /// config and one warning per rejected value.
    pub fn from_vars<I, K, V>(vars: I) -> (EnvConfig, Vec<String>)
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        // Last value per known name first, so a rejected early value cannot leave a
        // warning behind when a later assignment replaced it.
        let mut latest: [Option<String>; ENV_VARS.len()] = Default::default();
        for (name, value) in vars {
            if let Some(slot) = ENV_VARS.iter().position(|known| *known == name.as_ref()) {
                latest[slot] = Some(value.as_ref().to_owned());
            }
        }

        let mut config = EnvConfig::default();
        let mut warnings = Vec::new();
        for (name, value) in ENV_VARS.iter().zip(latest.iter()) {
            let Some(value) = value.as_deref() else {
                continue;
            };
            match *name {
                DISABLE_AUTO_COMPACT => {
                    config.disable_auto_compact = flag(name, value, &mut warnings);
                }
                DISABLE_COMPACT => config.disable_compact = flag(name, value, &mut warnings),
                PCT_OVERRIDE => {
                    config.autocompact_pct_override = percent(name, value, &mut warnings);
                }
                AUTO_COMPACT_WINDOW => {
                    config.auto_compact_window = positive_tokens(name, value, &mut warnings);
                }
                MAX_CONTEXT_TOKENS => {
                    config.max_context_tokens = positive_tokens(name, value, &mut warnings);
                }
                DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT => {
                    config.disable_unknown_model_window_enforcement = flag(name, value, &mut warnings);
                }
                DISABLE_1M_CONTEXT => {
                    config.disable_1m_context = flag(name, value, &mut warnings);
                }
                BLOCKING_LIMIT_OVERRIDE => {
                    config.blocking_limit_override = positive_tokens(name, value, &mut warnings);
                }
                IDLE_COMPACT_MIN_TOKENS => {
                    config.idle_compact_min_tokens = tokens(name, value, &mut warnings);
                }
                _ => {}
            }
        }
        (config, warnings)
    }

    /// Smallest context (in tokens) at which an idle session may be compacted: the
    /// variable's value or 200,000, but never below 100,000 so a tiny value cannot make
    /// every pause rewrite the conversation.
    pub fn idle_compact_floor(&self) -> u64 {
        self.idle_compact_min_tokens.unwrap_or(IDLE_COMPACT_DEFAULT).max(IDLE_COMPACT_FLOOR)
    }
}

/// Parses a token count: digits with an optional `k`/`K` (thousand) or `m`/`M`
/// (million) suffix. With a suffix a decimal fraction is allowed (`1.5M`, `0.5k`);
/// fractions of a single token are dropped. Surrounding whitespace is ignored. Signs,
/// separators, exponents and anything else give `None`, as does a value past `u64`.
///
/// ```text
/// "200000" -> 200000   "500k" -> 500000   "1M" -> 1000000   "1.5M" -> 1500000
/// ```
pub fn parse_token_count(text: &str) -> Option<u64> {
    let text = text.trim();
    let (number, scale_digits) = match text.char_indices().last()? {
        (at, 'k' | 'K') => (&text[..at], 3u32),
        (at, 'm' | 'M') => (&text[..at], 6u32),
        _ => (text, 0u32),
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (number, None),
    };
    if !all_digits(whole) {
        return None;
    }
    let scale = 10u64.pow(scale_digits);
    let mut count = whole.parse::<u64>().ok()?.checked_mul(scale)?;
    if let Some(fraction) = fraction {
        // A fraction only makes sense when a suffix scales it up to whole tokens.
        if scale_digits == 0 || !all_digits(fraction) {
            return None;
        }
        // Keep as many fraction digits as the suffix turns into whole tokens; the rest
        // would be parts of a token.
        let kept: String = fraction.chars().chain(std::iter::repeat('0')).take(scale_digits as usize).collect();
        count = count.checked_add(kept.parse::<u64>().ok()?)?;
    }
    Some(count)
}

fn all_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit())
}

/// A boolean variable. Unrecognised words count as "not set", with a warning, rather
/// than guessing which way the user meant.
fn flag(name: &str, value: &str, warnings: &mut Vec<String>) -> bool {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => true,
        "" | "0" | "false" | "no" | "off" => false,
        _ => {
            warnings.push(format!("{name}={value:?} is not a boolean (use 1/true/yes/on or 0/false/no/off); ignored"));
            false
        }
    }
}

/// A whole percent from 1 to 100; a trailing `%` is tolerated. An empty value means
/// "not set": shells often unset a variable by assigning nothing.
fn percent(name: &str, value: &str, warnings: &mut Vec<String>) -> Option<u8> {
    let text = value.trim();
    if text.is_empty() {
        return None;
    }
    let digits = text.strip_suffix('%').unwrap_or(text).trim_end();
    let parsed = if all_digits(digits) { digits.parse::<u64>().ok() } else { None };
    match parsed {
        Some(pct @ 1..=100) => u8::try_from(pct).ok(),
        _ => {
            warnings.push(format!("{name}={value:?} is not a whole percent from 1 to 100; ignored"));
            None
        }
    }
}

/// A token count; empty means "not set".
fn tokens(name: &str, value: &str, warnings: &mut Vec<String>) -> Option<u64> {
    if value.trim().is_empty() {
        return None;
    }
    let parsed = parse_token_count(value);
    if parsed.is_none() {
        warnings.push(format!("{name}={value:?} is not a token count (e.g. 200000, 500k, 1M); ignored"));
    }
    parsed
}

/// A token count that must be above zero: a zero window or limit would compact or refuse
/// every request, which nobody means.
fn positive_tokens(name: &str, value: &str, warnings: &mut Vec<String>) -> Option<u64> {
    match tokens(name, value, warnings) {
        Some(0) => {
            warnings.push(format!("{name}={value:?} must be above zero; ignored"));
            None
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_with_and_without_suffixes() {
        let cases: &[(&str, Option<u64>)] = &[
            ("200000", Some(200_000)),
            ("  200000 ", Some(200_000)),
            ("0", Some(0)),
            ("500k", Some(500_000)),
            ("500K", Some(500_000)),
            ("1M", Some(1_000_000)),
            ("1m", Some(1_000_000)),
            ("1.5M", Some(1_500_000)),
            ("0.5M", Some(500_000)),
            ("1.5k", Some(1_500)),
            ("2.25k", Some(2_250)),
            ("1.0005k", Some(1_000)),
            ("1.2345678M", Some(1_234_567)),
            ("", None),
            ("   ", None),
            ("k", None),
            ("M", None),
            ("lots", None),
            ("-5", None),
            ("+5", None),
            ("1e6", None),
            ("1,000,000", None),
            ("1_000_000", None),
            ("1.5", None),
            ("1.", None),
            (".5M", None),
            ("1.M", None),
            ("1.5.5M", None),
            ("500kk", None),
            ("500g", None),
            ("18446744073709551615", Some(u64::MAX)),
            ("18446744073709551616", None),
            ("18446744073709551615k", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_token_count(text), *expected, "input {text:?}");
        }
    }

    #[test]
    fn booleans_accept_the_usual_words_in_any_case() {
        for truthy in ["1", "true", "TRUE", "Yes", "on", " On "] {
            let (config, warnings) = EnvConfig::from_vars([(DISABLE_COMPACT, truthy)]);
            assert!(config.disable_compact, "{truthy:?} should be true");
            assert!(warnings.is_empty(), "{truthy:?}: {warnings:?}");
        }
        for falsy in ["0", "false", "FALSE", "No", "off", ""] {
            let (config, warnings) = EnvConfig::from_vars([(DISABLE_COMPACT, falsy)]);
            assert!(!config.disable_compact, "{falsy:?} should be false");
            assert!(warnings.is_empty(), "{falsy:?}: {warnings:?}");
        }
    }

    #[test]
    fn unknown_boolean_words_warn_and_count_as_unset() {
        let (config, warnings) = EnvConfig::from_vars([(DISABLE_AUTO_COMPACT, "maybe")]);
        assert!(!config.disable_auto_compact);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("DISABLE_AUTO_COMPACT"));
        assert!(warnings[0].contains("maybe"));
    }

    #[test]
    fn every_variable_alone() {
        type Check = fn(&EnvConfig) -> bool;
        let cases: &[(&str, &str, Check)] = &[
            (DISABLE_AUTO_COMPACT, "1", |c| c.disable_auto_compact),
            (DISABLE_COMPACT, "true", |c| c.disable_compact),
            (PCT_OVERRIDE, "80", |c| c.autocompact_pct_override == Some(80)),
            (AUTO_COMPACT_WINDOW, "500k", |c| c.auto_compact_window == Some(500_000)),
            (MAX_CONTEXT_TOKENS, "128000", |c| c.max_context_tokens == Some(128_000)),
            (DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT, "yes", |c| c.disable_unknown_model_window_enforcement),
            (DISABLE_1M_CONTEXT, "on", |c| c.disable_1m_context),
            (BLOCKING_LIMIT_OVERRIDE, "150000", |c| c.blocking_limit_override == Some(150_000)),
            (IDLE_COMPACT_MIN_TOKENS, "300k", |c| c.idle_compact_min_tokens == Some(300_000)),
        ];
        assert_eq!(cases.len(), ENV_VARS.len(), "a variable has no case here");
        for (name, value, check) in cases {
            let (config, warnings) = EnvConfig::from_vars([(*name, *value)]);
            assert!(warnings.is_empty(), "{name}: {warnings:?}");
            assert!(check(&config), "{name}={value} not applied: {config:?}");
            // Exactly one field moved away from the default.
            let mut reset = config;
            match *name {
                DISABLE_AUTO_COMPACT => reset.disable_auto_compact = false,
                DISABLE_COMPACT => reset.disable_compact = false,
                PCT_OVERRIDE => reset.autocompact_pct_override = None,
                AUTO_COMPACT_WINDOW => reset.auto_compact_window = None,
                MAX_CONTEXT_TOKENS => reset.max_context_tokens = None,
                DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT => {
                    reset.disable_unknown_model_window_enforcement = false;
                }
                DISABLE_1M_CONTEXT => reset.disable_1m_context = false,
                BLOCKING_LIMIT_OVERRIDE => reset.blocking_limit_override = None,
                IDLE_COMPACT_MIN_TOKENS => reset.idle_compact_min_tokens = None,
                _ => {}
            }
            assert_eq!(reset, EnvConfig::default(), "{name} touched another field");
        }
    }

    #[test]
    fn percent_bounds() {
        let cases: &[(&str, Option<u8>, bool)] = &[
            ("1", Some(1), false),
            ("100", Some(100), false),
            ("50%", Some(50), false),
            (" 75 ", Some(75), false),
            ("", None, false),
            ("0", None, true),
            ("101", None, true),
            ("150", None, true),
            ("-5", None, true),
            ("50.5", None, true),
            ("half", None, true),
            ("99999999999999999999999", None, true),
        ];
        for (value, expected, warns) in cases {
            let (config, warnings) = EnvConfig::from_vars([(PCT_OVERRIDE, *value)]);
            assert_eq!(config.autocompact_pct_override, *expected, "{value:?}");
            assert_eq!(!warnings.is_empty(), *warns, "{value:?}: {warnings:?}");
            if *warns {
                assert!(warnings[0].contains(PCT_OVERRIDE), "{warnings:?}");
                assert!(warnings[0].contains(value), "{warnings:?}");
            }
        }
    }

    #[test]
    fn invalid_numbers_warn_and_are_ignored() {
        let cases = [
            (AUTO_COMPACT_WINDOW, "lots"),
            (AUTO_COMPACT_WINDOW, "0"),
            (MAX_CONTEXT_TOKENS, "big"),
            (MAX_CONTEXT_TOKENS, "0k"),
            (BLOCKING_LIMIT_OVERRIDE, "-1"),
            (BLOCKING_LIMIT_OVERRIDE, "0"),
            (IDLE_COMPACT_MIN_TOKENS, "soon"),
        ];
        for (name, value) in cases {
            let (config, warnings) = EnvConfig::from_vars([(name, value)]);
            assert_eq!(config, EnvConfig::default(), "{name}={value}");
            assert_eq!(warnings.len(), 1, "{name}={value}: {warnings:?}");
            assert!(warnings[0].contains(name) && warnings[0].contains(value), "{warnings:?}");
        }
    }

    #[test]
    fn empty_numbers_mean_unset_without_warning() {
        let (config, warnings) = EnvConfig::from_vars([
            (AUTO_COMPACT_WINDOW, ""),
            (MAX_CONTEXT_TOKENS, " "),
            (BLOCKING_LIMIT_OVERRIDE, ""),
            (IDLE_COMPACT_MIN_TOKENS, ""),
        ]);
        assert_eq!(config, EnvConfig::default());
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn one_bad_variable_does_not_stop_the_others() {
        let (config, warnings) = EnvConfig::from_vars([
            (PCT_OVERRIDE, "150"),
            (AUTO_COMPACT_WINDOW, "lots"),
            (MAX_CONTEXT_TOKENS, "many"),
            (DISABLE_COMPACT, "1"),
            (BLOCKING_LIMIT_OVERRIDE, "900k"),
        ]);
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(config.disable_compact);
        assert_eq!(config.blocking_limit_override, Some(900_000));
        assert_eq!(config.autocompact_pct_override, None);
        assert_eq!(config.auto_compact_window, None);
        assert_eq!(config.max_context_tokens, None);
    }

    #[test]
    fn last_assignment_wins_and_unknown_names_are_skipped() {
        let (config, warnings) = EnvConfig::from_vars(vec![
            ("CLAUDE_CODE_AUTO_COMPACT_WINDOW".to_string(), "lots".to_string()),
            ("CLAUDE_CODE_AUTO_COMPACT_WINDOW".to_string(), "300k".to_string()),
            ("PATH".to_string(), "/usr/bin".to_string()),
            ("disable_compact".to_string(), "1".to_string()),
        ]);
        assert_eq!(config.auto_compact_window, Some(300_000));
        assert!(!config.disable_compact, "names are case-sensitive");
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn idle_floor() {
        let cases: &[(Option<u64>, u64)] = &[
            (None, 200_000),
            (Some(50_000), 100_000),
            (Some(100_000), 100_000),
            (Some(150_000), 150_000),
            (Some(400_000), 400_000),
        ];
        for (value, expected) in cases {
            let config = EnvConfig { idle_compact_min_tokens: *value, ..EnvConfig::default() };
            assert_eq!(config.idle_compact_floor(), *expected, "{value:?}");
        }
    }
}
