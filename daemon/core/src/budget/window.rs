//! Which context window the budget is computed against.
//!
//! Several places can name a window (environment, settings, the client, an experiment)
//! and the model has its own. They are tried in a fixed order and the first one present
//! wins; the winner is then held to the accepted range and to what the model can
//! actually take. A subagent's own setting comes last and may only shrink the result,
//! so a subagent can be made to compact early but never to outgrow its parent's limits.

use super::env::EnvConfig;
use super::models::{ModelSpec, model_spec, unsupported_1m_request};

/// Smallest window a configured value may ask for; smaller values are raised to it.
pub const MIN_CONFIGURED_WINDOW: u64 = 100_000;
/// Largest window a configured value may ask for; larger values are lowered to it.
pub const MAX_CONFIGURED_WINDOW: u64 = 1_000_000;

/// Window values that do not come from the environment. The caller picks the right one
/// of each (for `setting`, the per-model `modelSettings` value if there is one, else the
/// global `autoCompactWindow`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowInputs {
    /// `autoCompactWindow` from settings (or `/autocompact`, `--autocompact`).
    pub setting: Option<u64>,
    /// The window the client sent in `initializationOptions`.
    pub client: Option<u64>,
    /// A window chosen by an experiment.
    pub experiment: Option<u64>,
    /// A subagent's `autoCompactWindow`: may lower the window, never raise it.
    pub subagent_ceiling: Option<u64>,
    /// The model's window as the host program states it (Claude Code's status line
    /// `context_window.context_window_size`). It replaces the table's window: the host
    /// knows what it sends the model with, the table only what was observed.
    pub host_model_window: Option<u64>,
}

/// Where a context window came from (also `ctx/setAutoCompactWindow`'s `source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum WindowSource {
    /// `CLAUDE_CODE_AUTO_COMPACT_WINDOW`.
    Env,
    /// A settings file (`WindowInputs::setting`).
    Setting,
    /// The client's `initializationOptions.autoCompactWindow` (`WindowInputs::client`).
    Client,
    /// An experiment's window (`WindowInputs::experiment`).
    Experiment,
    /// The model's own window; nothing else was set.
    ModelDefault,
    /// A subagent's ceiling (`WindowInputs::subagent_ceiling`) was below the window
    /// found otherwise.
    SubagentCeiling,
}

impl WindowSource {
    /// The name the protocol gives the source, for messages that name it.
    pub fn as_str(self) -> &'static str {
        match self {
            WindowSource::Env => "env",
            WindowSource::Setting => "setting",
            WindowSource::Client => "client",
            WindowSource::Experiment => "experiment",
            WindowSource::ModelDefault => "modelDefault",
            WindowSource::SubagentCeiling => "subagentCeiling",
        }
    }
}

/// The window to budget against, with where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedWindow {
    /// Tokens. Never above `model.context_window`.
    pub window: u64,
    /// The input that decided `window`. The model's own window may still have lowered
    /// it (a 1M setting on a 200K model gives 200K with source `Setting`).
    pub source: WindowSource,
    /// The model's limits, used by the thresholds.
    pub model: ModelSpec,
    /// Inputs that were adjusted or ignored, for the caller to show or log.
    pub warnings: Vec<String>,
    /// For a model outside the table: where its window came from, in a sentence for the
    /// caller to log (once per model; it would repeat on every session otherwise).
    pub unknown_model: Option<String>,
}

/// Resolves the window for `model_id`.
///
/// Order: `CLAUDE_CODE_AUTO_COMPACT_WINDOW`, `inputs.setting`, `inputs.client`,
/// `inputs.experiment`, the model's window. A value of zero is skipped with a warning
/// (zero is how a settings file leaves a number blank, and as a window it would mean
/// compacting on every turn), so the search moves on. Any other configured value outside
/// 100,000..=1,000,000 is clamped into that range with a warning rather than skipped:
/// the user asked for "small" or "large", and the nearest accepted window honours that
/// better than falling back to something else. Then the value is capped at the model's
/// window. The model's own window is not clamped to the range: a model smaller than
/// 100,000 tokens (possible via `CLAUDE_CODE_MAX_CONTEXT_TOKENS`) cannot be budgeted
/// beyond what it accepts.
///
/// Finally `inputs.subagent_ceiling`, clamped into the same range, replaces the window
/// if it is smaller, whichever source found the window (the environment included).
pub fn resolve_window(model_id: &str, inputs: &WindowInputs, env: &EnvConfig) -> ResolvedWindow {
    let mut model = model_spec(model_id, env);
    let mut warnings = Vec::new();
    let host = inputs.host_model_window.filter(|&w| w > 0);
    let unknown_model = (!model.known).then(|| {
        let from = match (host, env.max_context_tokens) {
            (Some(w), _) => format!("the host's window {w}"),
            (None, Some(w)) => format!("CLAUDE_CODE_MAX_CONTEXT_TOKENS {w}"),
            (None, None) => format!("the default window {}", model.context_window),
        };
        format!("model {model_id:?} is not in ctxd's model table; using {from}")
    });
    if let Some(w) = host {
        model.context_window = w;
    }
    if unsupported_1m_request(model_id) {
        warnings.push(format!(
            "model {model_id:?} asks for a 1M window its model does not offer; using {}",
            model.context_window
        ));
    }

    let candidates = [
        (WindowSource::Env, env.auto_compact_window, "CLAUDE_CODE_AUTO_COMPACT_WINDOW"),
        (WindowSource::Setting, inputs.setting, "autoCompactWindow setting"),
        (WindowSource::Client, inputs.client, "client autoCompactWindow"),
        (WindowSource::Experiment, inputs.experiment, "experiment window"),
    ];
    let chosen = candidates.into_iter().find_map(|(source, value, label)| {
        let value = configured(label, value?, &mut warnings)?;
        Some((source, value))
    });
    let (mut window, mut source) = match chosen {
        Some((source, value)) => (value.min(model.context_window), source),
        None => (model.context_window, WindowSource::ModelDefault),
    };

    if let Some(ceiling) = inputs.subagent_ceiling
        && let Some(ceiling) = configured("subagent autoCompactWindow", ceiling, &mut warnings)
        && ceiling < window
    {
        window = ceiling;
        source = WindowSource::SubagentCeiling;
    }

    ResolvedWindow { window, source, model, warnings, unknown_model }
}

/// A configured window held to the accepted range; `None` for zero.
fn configured(label: &str, value: u64, warnings: &mut Vec<String>) -> Option<u64> {
    if value == 0 {
        warnings.push(format!("{label} 0 is not a window; ignored"));
        return None;
    }
    let clamped = value.clamp(MIN_CONFIGURED_WINDOW, MAX_CONFIGURED_WINDOW);
    if clamped != value {
        warnings.push(format!(
            "{label} {value} is outside {MIN_CONFIGURED_WINDOW}..={MAX_CONFIGURED_WINDOW}; using {clamped}"
        ));
    }
    Some(clamped)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SONNET_1M: &str = "claude-sonnet-4-5-20250929[1m]";
    const SONNET: &str = "claude-sonnet-4-5-20250929";

    fn env_window(value: &str) -> EnvConfig {
        let (env, warnings) = EnvConfig::from_vars([("CLAUDE_CODE_AUTO_COMPACT_WINDOW", value)]);
        assert!(warnings.is_empty(), "{warnings:?}");
        env
    }

    #[test]
    fn first_present_source_wins() {
        let all = WindowInputs {
            setting: Some(600_000),
            client: Some(500_000),
            experiment: Some(400_000),
            subagent_ceiling: None,
            host_model_window: None,
        };
        let env = env_window("700k");
        // (env, inputs, expected window, expected source)
        let cases: &[(EnvConfig, WindowInputs, u64, WindowSource)] = &[
            (env, all, 700_000, WindowSource::Env),
            (EnvConfig::default(), all, 600_000, WindowSource::Setting),
            (EnvConfig::default(), WindowInputs { setting: None, ..all }, 500_000, WindowSource::Client),
            (
                EnvConfig::default(),
                WindowInputs { setting: None, client: None, ..all },
                400_000,
                WindowSource::Experiment,
            ),
            (EnvConfig::default(), WindowInputs::default(), 1_000_000, WindowSource::ModelDefault),
        ];
        for (env, inputs, window, source) in cases {
            let got = resolve_window(SONNET_1M, inputs, env);
            assert_eq!((got.window, got.source), (*window, *source), "{inputs:?} {env:?}");
            assert!(got.warnings.is_empty(), "{:?}", got.warnings);
        }
    }

    #[test]
    fn env_suffixes_reach_the_window() {
        let cases: &[(&str, u64)] = &[
            ("500k", 500_000),
            ("500K", 500_000),
            ("1M", 1_000_000),
            ("0.75m", 750_000),
            ("1.5M", 1_000_000),
            ("250000", 250_000),
        ];
        for (value, expected) in cases {
            let got = resolve_window(SONNET_1M, &WindowInputs::default(), &env_window(value));
            assert_eq!(got.window, *expected, "{value}");
            assert_eq!(got.source, WindowSource::Env, "{value}");
        }
    }

    #[test]
    fn range_boundaries_clamp_with_a_warning() {
        // (configured value, expected window, warns)
        let cases: &[(u64, u64, bool)] = &[
            (1, 100_000, true),
            (99_999, 100_000, true),
            (100_000, 100_000, false),
            (1_000_000, 1_000_000, false),
            (1_000_001, 1_000_000, true),
            (5_000_000, 1_000_000, true),
        ];
        for (value, expected, warns) in cases {
            let inputs = WindowInputs { setting: Some(*value), ..WindowInputs::default() };
            let got = resolve_window(SONNET_1M, &inputs, &EnvConfig::default());
            assert_eq!(got.window, *expected, "{value}");
            assert_eq!(got.source, WindowSource::Setting);
            assert_eq!(got.warnings.len(), usize::from(*warns), "{value}: {:?}", got.warnings);
            if *warns {
                assert!(got.warnings[0].contains(&value.to_string()), "{:?}", got.warnings);
            }
        }
        // The environment value is held to the same range.
        let low = resolve_window(SONNET_1M, &WindowInputs::default(), &env_window("99999"));
        assert_eq!(low.window, 100_000);
        assert!(low.warnings[0].contains("CLAUDE_CODE_AUTO_COMPACT_WINDOW"));
        let high = resolve_window(SONNET_1M, &WindowInputs::default(), &env_window("1000001"));
        assert_eq!(high.window, 1_000_000);
        assert_eq!(high.warnings.len(), 1);
    }

    #[test]
    fn zero_is_skipped_and_the_search_goes_on() {
        let inputs = WindowInputs { setting: Some(0), client: Some(300_000), ..WindowInputs::default() };
        let got = resolve_window(SONNET_1M, &inputs, &EnvConfig::default());
        assert_eq!((got.window, got.source), (300_000, WindowSource::Client));
        assert_eq!(got.warnings.len(), 1);
        assert!(got.warnings[0].contains("autoCompactWindow"));
    }

    #[test]
    fn never_above_the_model_window() {
        let inputs = WindowInputs { setting: Some(800_000), ..WindowInputs::default() };
        let got = resolve_window(SONNET, &inputs, &EnvConfig::default());
        assert_eq!((got.window, got.source), (200_000, WindowSource::Setting));
        let got = resolve_window(SONNET, &WindowInputs::default(), &env_window("1M"));
        assert_eq!((got.window, got.source), (200_000, WindowSource::Env));
        // DISABLE_1M takes the 1M window away even from an explicit 1M setting.
        let (env, _) =
            EnvConfig::from_vars([("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "1M"), ("CLAUDE_CODE_DISABLE_1M_CONTEXT", "1")]);
        let got = resolve_window(SONNET_1M, &WindowInputs::default(), &env);
        assert_eq!(got.window, 200_000);
        assert_eq!(got.model.context_window, 200_000);
    }

    #[test]
    fn subagent_ceiling_lowers_an_env_window() {
        let inputs = WindowInputs { subagent_ceiling: Some(300_000), ..WindowInputs::default() };
        let got = resolve_window(SONNET_1M, &inputs, &env_window("800k"));
        assert_eq!((got.window, got.source), (300_000, WindowSource::SubagentCeiling));
    }

    #[test]
    fn subagent_ceiling_never_raises() {
        // Above the window found from a setting.
        let inputs =
            WindowInputs { setting: Some(400_000), subagent_ceiling: Some(900_000), ..WindowInputs::default() };
        let got = resolve_window(SONNET_1M, &inputs, &EnvConfig::default());
        assert_eq!((got.window, got.source), (400_000, WindowSource::Setting));
        // Above the model window.
        let inputs = WindowInputs { subagent_ceiling: Some(1_000_000), ..WindowInputs::default() };
        let got = resolve_window(SONNET, &inputs, &EnvConfig::default());
        assert_eq!((got.window, got.source), (200_000, WindowSource::ModelDefault));
        // Equal to the window: the original source stands.
        let inputs = WindowInputs { client: Some(500_000), subagent_ceiling: Some(500_000), ..WindowInputs::default() };
        let got = resolve_window(SONNET_1M, &inputs, &EnvConfig::default());
        assert_eq!((got.window, got.source), (500_000, WindowSource::Client));
    }

    #[test]
    fn subagent_ceiling_is_held_to_the_range() {
        let inputs = WindowInputs { subagent_ceiling: Some(50_000), ..WindowInputs::default() };
        let got = resolve_window(SONNET_1M, &inputs, &EnvConfig::default());
        assert_eq!((got.window, got.source), (100_000, WindowSource::SubagentCeiling));
        assert_eq!(got.warnings.len(), 1);
        assert!(got.warnings[0].contains("subagent"));
        let inputs = WindowInputs { subagent_ceiling: Some(0), ..WindowInputs::default() };
        let got = resolve_window(SONNET_1M, &inputs, &EnvConfig::default());
        assert_eq!((got.window, got.source), (1_000_000, WindowSource::ModelDefault));
        assert_eq!(got.warnings.len(), 1);
    }

    #[test]
    fn unknown_models() {
        let plain = resolve_window("local-llama", &WindowInputs::default(), &EnvConfig::default());
        assert_eq!((plain.window, plain.source), (200_000, WindowSource::ModelDefault));
        assert!(!plain.model.known);

        let (env, _) = EnvConfig::from_vars([("CLAUDE_CODE_MAX_CONTEXT_TOKENS", "64k")]);
        let small = resolve_window("local-llama", &WindowInputs::default(), &env);
        // The model's own window is not raised to the configured minimum.
        assert_eq!((small.window, small.source), (64_000, WindowSource::ModelDefault));
        // A configured window is raised to 100K, then capped by the model again.
        let inputs = WindowInputs { setting: Some(50_000), ..WindowInputs::default() };
        let capped = resolve_window("local-llama", &inputs, &env);
        assert_eq!(capped.window, 64_000);

        let (env, _) = EnvConfig::from_vars([("CLAUDE_CODE_MAX_CONTEXT_TOKENS", "2M")]);
        let big = resolve_window("local-llama", &WindowInputs::default(), &env);
        assert_eq!(big.window, 2_000_000);
        let inputs = WindowInputs { setting: Some(1_500_000), ..WindowInputs::default() };
        let big_set = resolve_window("local-llama", &inputs, &env);
        assert_eq!(big_set.window, 1_000_000);
    }

    #[test]
    fn one_million_suffix_on_a_model_without_it_warns() {
        let got = resolve_window("claude-opus-4-1-20250805[1m]", &WindowInputs::default(), &EnvConfig::default());
        assert_eq!(got.window, 200_000);
        assert_eq!(got.warnings.len(), 1);
        assert!(got.warnings[0].contains("claude-opus-4-1-20250805[1m]"));
        // Turned off on purpose: no warning.
        let (env, _) = EnvConfig::from_vars([("CLAUDE_CODE_DISABLE_1M_CONTEXT", "true")]);
        let got = resolve_window(SONNET_1M, &WindowInputs::default(), &env);
        assert_eq!(got.window, 200_000);
        assert!(got.warnings.is_empty());
    }

    #[test]
    fn the_host_window_replaces_the_table() {
        let host = WindowInputs { host_model_window: Some(1_000_000), ..WindowInputs::default() };
        // An unknown model takes the host's figure, and says so.
        let got = resolve_window("claude-opus-7", &host, &EnvConfig::default());
        assert_eq!((got.window, got.source), (1_000_000, WindowSource::ModelDefault));
        assert!(got.unknown_model.as_deref().is_some_and(|m| m.contains("host's window 1000000")), "{got:?}");
        // Without it, the documented default.
        let got = resolve_window("claude-opus-7", &WindowInputs::default(), &EnvConfig::default());
        assert_eq!(got.window, 200_000);
        assert!(got.unknown_model.as_deref().is_some_and(|m| m.contains("default window 200000")), "{got:?}");
        // A known model: the host's statement wins over the table, silently.
        let got = resolve_window(SONNET, &host, &EnvConfig::default());
        assert_eq!(got.window, 1_000_000);
        assert_eq!(got.unknown_model, None);
        // A configured window still caps it.
        let capped = WindowInputs { setting: Some(400_000), ..host };
        assert_eq!(resolve_window(SONNET, &capped, &EnvConfig::default()).window, 400_000);
        // Zero is no statement.
        let zero = WindowInputs { host_model_window: Some(0), ..WindowInputs::default() };
        assert_eq!(resolve_window(SONNET, &zero, &EnvConfig::default()).window, 200_000);
    }
}
