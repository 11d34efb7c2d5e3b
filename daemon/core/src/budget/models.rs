//! What each model can hold: its context window and its output limit.
//!
//! The window bounds everything else in the budget, and the output limit decides how
//! much of the window is kept free for the reply. Model ids come in many spellings
//! (dated snapshots, `-latest` aliases, cloud-provider prefixes and `@date` suffixes), so
//! ids are matched by family: the longest table key that starts the id and ends at a
//! word boundary. A later point release of a family (say `claude-sonnet-4-7`) therefore
//! inherits its family's numbers instead of falling back to the unknown-model guess.

use super::env::EnvConfig;

/// Window assumed for a model the table does not list (and the standard window of most
/// listed models).
pub const DEFAULT_CONTEXT_WINDOW: u64 = 200_000;
/// Window selected by the `[1m]` suffix on a model that offers it.
pub const ONE_MILLION_WINDOW: u64 = 1_000_000;
/// Output limit assumed for a model the table does not list. Only its cap at 20,000
/// reaches the thresholds, so this errs on the side of reserving the full cap.
pub const UNKNOWN_MODEL_MAX_OUTPUT: u64 = 32_000;

/// Suffix on a model id that asks for the 1M window.
const ONE_MILLION_SUFFIX: &str = "[1m]";

/// A model's limits as far as the budget is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// Tokens the model accepts in one request (prompt plus output).
    pub context_window: u64,
    /// Most tokens the model writes in one response.
    pub max_output_tokens: u64,
    /// The id matched the table; `false` means the numbers are a guess, come from
    /// `CLAUDE_CODE_MAX_CONTEXT_TOKENS` or from the host.
    pub known: bool,
    /// Whether Claude Code, run with this model, decides on automatic compaction at all
    /// (as its `--debug` log showed on the version in `MODELS.md`).
    pub host_auto_compact: HostAutoCompact,
}

/// What the real Claude Code program was seen to do about automatic compaction with a
/// model. ctxd only shows a "to compact" figure the host would act on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HostAutoCompact {
    /// Not observed: ctxd assumes the host compacts at ctxd's threshold.
    #[default]
    Unobserved,
    /// The program logged auto-compact decisions against a threshold.
    Decides,
    /// The program logged no auto-compact decision for the model.
    NoDecision,
}

impl Default for ModelSpec {
    /// The unknown-model guess.
    fn default() -> Self {
        ModelSpec {
            context_window: DEFAULT_CONTEXT_WINDOW,
            max_output_tokens: UNKNOWN_MODEL_MAX_OUTPUT,
            known: false,
            host_auto_compact: HostAutoCompact::Unobserved,
        }
    }
}

/// One family in the table.
struct Family {
    /// Lowercase id prefix, without date.
    key: &'static str,
    /// Standard window, without the `[1m]` suffix.
    window: u64,
    max_output_tokens: u64,
    /// The family offers a 1M window when asked for with `[1m]`.
    offers_1m: bool,
    host_auto_compact: HostAutoCompact,
    /// Claude Code version the window and the auto-compact behaviour were observed on
    /// (read by the test that keeps `MODELS.md` equal to the table).
    #[cfg_attr(not(test), allow(dead_code))]
    observed_on: Option<&'static str>,
}

/// Version of Claude Code whose `--debug` `autocompact:` lines the observed rows come
/// from.
pub const OBSERVED_CLAUDE_CODE: &str = "2.1.332";

const fn family(key: &'static str, max_output_tokens: u64, offers_1m: bool) -> Family {
    Family {
        key,
        window: DEFAULT_CONTEXT_WINDOW,
        max_output_tokens,
        offers_1m,
        host_auto_compact: HostAutoCompact::Unobserved,
        observed_on: None,
    }
}

const fn observed(
    key: &'static str,
    window: u64,
    max_output_tokens: u64,
    offers_1m: bool,
    host: HostAutoCompact,
) -> Family {
    Family {
        key,
        window,
        max_output_tokens,
        offers_1m,
        host_auto_compact: host,
        observed_on: Some(OBSERVED_CLAUDE_CODE),
    }
}

/// Claude 3.x, 4.x and 5.x families. Output limits are the provider's published maxima
/// for the synchronous API (or the `max_tokens` Claude Code sends); anything at or above
/// 20,000 has the same effect here, so only the 3.x figures change a threshold. The
/// observed rows are mirrored in `MODELS.md` (a test keeps the two equal).
const FAMILIES: &[Family] = &[
    family("claude-3-haiku", 4_096, false),
    family("claude-3-sonnet", 4_096, false),
    family("claude-3-opus", 4_096, false),
    family("claude-3-5-haiku", 8_192, false),
    family("claude-3-5-sonnet", 8_192, false),
    family("claude-3-7-sonnet", 64_000, false),
    family("claude-sonnet-4", 64_000, true),
    observed("claude-sonnet-4-5", DEFAULT_CONTEXT_WINDOW, 64_000, true, HostAutoCompact::NoDecision),
    family("claude-sonnet-4-6", 64_000, true),
    family("claude-opus-4", 32_000, false),
    family("claude-opus-4-1", 32_000, false),
    family("claude-opus-4-5", 64_000, false),
    observed("claude-opus-4-6", DEFAULT_CONTEXT_WINDOW, 128_000, true, HostAutoCompact::Decides),
    observed("claude-opus-5-5", ONE_MILLION_WINDOW, 128_000, false, HostAutoCompact::Decides),
    observed("claude-haiku-4-5", DEFAULT_CONTEXT_WINDOW, 64_000, false, HostAutoCompact::NoDecision),
];

/// Limits of `model_id`.
///
/// - A listed model gets its family's numbers; with the `[1m]` suffix (any case) and a
///   family that offers it, the window is 1,000,000 unless
///   `CLAUDE_CODE_DISABLE_1M_CONTEXT` is set. The suffix on a family without a 1M
///   window is ignored (`resolve_window` warns about it).
/// - Any other id gets `known: false`, the window from `CLAUDE_CODE_MAX_CONTEXT_TOKENS`
///   or 200,000, and an output limit of 32,000. The suffix does not apply: a 1M window
///   the table cannot vouch for would let the context grow past what the model takes.
pub fn model_spec(model_id: &str, env: &EnvConfig) -> ModelSpec {
    let parsed = ParsedId::new(model_id);
    match parsed.family {
        Some(family) => ModelSpec {
            context_window: if parsed.wants_1m && family.offers_1m && !env.disable_1m_context {
                ONE_MILLION_WINDOW
            } else {
                family.window
            },
            max_output_tokens: family.max_output_tokens,
            known: true,
            host_auto_compact: family.host_auto_compact,
        },
        None => ModelSpec {
            context_window: env.max_context_tokens.unwrap_or(DEFAULT_CONTEXT_WINDOW),
            ..ModelSpec::default()
        },
    }
}

/// `true` when the id asks for the 1M window but will not get it because its family has
/// none (or the model is unknown). `CLAUDE_CODE_DISABLE_1M_CONTEXT` is a deliberate
/// choice, so it does not count.
pub(super) fn unsupported_1m_request(model_id: &str) -> bool {
    let parsed = ParsedId::new(model_id);
    parsed.wants_1m && !parsed.family.is_some_and(|family| family.offers_1m)
}

/// A model id taken apart.
struct ParsedId {
    wants_1m: bool,
    family: Option<&'static Family>,
}

impl ParsedId {
    fn new(model_id: &str) -> Self {
        let mut id = model_id.trim().to_ascii_lowercase();
        let wants_1m = id.ends_with(ONE_MILLION_SUFFIX);
        if wants_1m {
            id.truncate(id.len() - ONE_MILLION_SUFFIX.len());
        }
        // Cloud providers wrap the id: `us.anthropic.claude-…-v1:0`, `anthropic/claude-…`.
        let family = id.find("claude-").and_then(|start| family_of(&id[start..]));
        ParsedId { wants_1m, family }
    }
}

/// Longest key that starts `id` and is followed by the end of the id or a separator,
/// so `claude-opus-4-1-…` picks `claude-opus-4-1`, and `claude-opus-45` matches nothing.
fn family_of(id: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .filter(|family| {
            id.strip_prefix(family.key)
                .is_some_and(|rest| rest.chars().next().is_none_or(|c| !c.is_ascii_alphanumeric()))
        })
        .max_by_key(|family| family.key.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str) -> ModelSpec {
        model_spec(id, &EnvConfig::default())
    }

    #[test]
    fn family_matching() {
        // (id, window, max output)
        let cases: &[(&str, u64, u64)] = &[
            ("claude-3-haiku-20240307", 200_000, 4_096),
            ("claude-3-opus-20240229", 200_000, 4_096),
            ("claude-3-sonnet-20240229", 200_000, 4_096),
            ("claude-3-5-haiku-20241022", 200_000, 8_192),
            ("claude-3-5-sonnet-20241022", 200_000, 8_192),
            ("claude-3-5-sonnet-latest", 200_000, 8_192),
            ("claude-3-7-sonnet-20250219", 200_000, 64_000),
            ("claude-sonnet-4-20250514", 200_000, 64_000),
            ("claude-sonnet-4-0", 200_000, 64_000),
            ("claude-sonnet-4-5-20250929", 200_000, 64_000),
            ("claude-sonnet-4-5", 200_000, 64_000),
            ("claude-opus-4-20250514", 200_000, 32_000),
            ("claude-opus-4-1-20250805", 200_000, 32_000),
            ("claude-opus-4-5-20251101", 200_000, 64_000),
            ("claude-opus-4-6", 200_000, 128_000),
            ("claude-haiku-4-5-20251001", 200_000, 64_000),
            // Provider spellings.
            ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", 200_000, 64_000),
            ("anthropic.claude-3-5-haiku-20241022-v1:0", 200_000, 8_192),
            ("claude-opus-4-1@20250805", 200_000, 32_000),
            ("anthropic/claude-opus-4-5", 200_000, 64_000),
            ("  Claude-Sonnet-4-5-20250929  ", 200_000, 64_000),
            // A newer point release falls back to its family.
            ("claude-opus-4-9-20270101", 200_000, 32_000),
            // Claude Code 2.1.332's default model: a 1M window without any suffix.
            ("claude-opus-5-5", 1_000_000, 128_000),
            ("claude-opus-5-5-20261001", 1_000_000, 128_000),
        ];
        for (id, window, output) in cases {
            let got = spec(id);
            assert!(got.known, "{id} should be known");
            assert_eq!(got.context_window, *window, "{id}");
            assert_eq!(got.max_output_tokens, *output, "{id}");
        }
    }

    #[test]
    fn ids_outside_the_table_are_unknown() {
        for id in [
            "",
            "gpt-4o",
            "claude-2.1",
            "claude-instant-1.2",
            "claude-opus-45",
            "claude-sonnet-5",
            "claude-sonnet",
            "sonnet",
        ] {
            assert_eq!(spec(id), ModelSpec::default(), "{id}");
        }
    }

    #[test]
    fn wrapped_ids_resolve_from_the_claude_part() {
        // Gateways prepend their own names; the family is found after them.
        let got = spec("my-gateway-claude-3-opus");
        assert!(got.known);
        assert_eq!(got.max_output_tokens, 4_096);
    }

    #[test]
    fn unknown_model_window_from_max_context_tokens() {
        let env = EnvConfig { max_context_tokens: Some(128_000), ..EnvConfig::default() };
        let got = model_spec("local-llama", &env);
        assert_eq!(got, ModelSpec { context_window: 128_000, max_output_tokens: 32_000, ..ModelSpec::default() });
        // A listed model ignores it.
        let known = model_spec("claude-opus-4-5", &env);
        assert_eq!(known.context_window, 200_000);
    }

    #[test]
    fn one_million_suffix() {
        let off = EnvConfig { disable_1m_context: true, ..EnvConfig::default() };
        // (id, window normally, window with DISABLE_1M)
        let cases: &[(&str, u64, u64)] = &[
            ("claude-sonnet-4-5-20250929[1m]", 1_000_000, 200_000),
            ("claude-sonnet-4-5-20250929[1M]", 1_000_000, 200_000),
            ("claude-sonnet-4-20250514[1m]", 1_000_000, 200_000),
            ("claude-opus-4-6[1m]", 1_000_000, 200_000),
            ("claude-sonnet-4-5-20250929", 200_000, 200_000),
            // The family has no 1M window: the suffix changes nothing.
            ("claude-opus-4-1-20250805[1m]", 200_000, 200_000),
            ("claude-3-5-sonnet-20241022[1m]", 200_000, 200_000),
            // Unknown model: no 1M on a guess.
            ("mystery-model[1m]", 200_000, 200_000),
        ];
        for (id, normal, disabled) in cases {
            assert_eq!(spec(id).context_window, *normal, "{id}");
            assert_eq!(model_spec(id, &off).context_window, *disabled, "{id} with DISABLE_1M");
        }
        assert!(spec("claude-sonnet-4-5-20250929[1m]").known);
        assert!(!spec("mystery-model[1m]").known);
    }

    #[test]
    fn unsupported_1m_requests() {
        assert!(!unsupported_1m_request("claude-sonnet-4-5[1m]"));
        assert!(!unsupported_1m_request("claude-opus-4-1"));
        assert!(unsupported_1m_request("claude-opus-4-1[1m]"));
        assert!(unsupported_1m_request("mystery[1m]"));
    }

    #[test]
    fn host_auto_compaction_as_observed() {
        assert_eq!(spec("claude-opus-5-5").host_auto_compact, HostAutoCompact::Decides);
        assert_eq!(spec("claude-opus-4-6").host_auto_compact, HostAutoCompact::Decides);
        assert_eq!(spec("claude-sonnet-4-5-20250929").host_auto_compact, HostAutoCompact::NoDecision);
        assert_eq!(spec("claude-haiku-4-5").host_auto_compact, HostAutoCompact::NoDecision);
        assert_eq!(spec("claude-opus-4-1").host_auto_compact, HostAutoCompact::Unobserved);
        assert_eq!(spec("mystery").host_auto_compact, HostAutoCompact::Unobserved);
    }

    /// `MODELS.md` lists every observed row of the table with the same numbers, so the
    /// document a user reads is the table ctxd runs.
    #[test]
    fn models_md_matches_the_table() {
        let doc = include_str!("MODELS.md");
        let rows: Vec<Vec<String>> = doc
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().trim_matches('`').replace(',', "")).collect())
            .collect();
        let observed: Vec<&Family> = FAMILIES.iter().filter(|f| f.observed_on.is_some()).collect();
        assert_eq!(rows.len(), observed.len(), "{rows:?}");
        for family in observed {
            let row =
                rows.iter().find(|r| r[0] == family.key).unwrap_or_else(|| panic!("{} not in MODELS.md", family.key));
            let effective = family.window - family.max_output_tokens.min(20_000);
            let decides = match family.host_auto_compact {
                HostAutoCompact::Decides => "yes",
                HostAutoCompact::NoDecision => "no",
                HostAutoCompact::Unobserved => "?",
            };
            let want = [
                family.key.to_owned(),
                family.window.to_string(),
                family.max_output_tokens.to_string(),
                effective.to_string(),
                decides.to_owned(),
                family.observed_on.unwrap_or_default().to_owned(),
            ];
            assert_eq!(row[..6], want, "{}", family.key);
        }
    }
}
