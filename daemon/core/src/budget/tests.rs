//! End-to-end checks of the budget: environment pairs in, levels out, through the same
//! three calls the daemon makes (`EnvConfig::from_vars`, `resolve_window`, `thresholds`).

use super::*;

const SONNET: &str = "claude-sonnet-4-5-20250929";
const SONNET_1M: &str = "claude-sonnet-4-5-20250929[1m]";

/// Runs the whole pipeline; panics (test only) on unexpected env warnings.
fn run(model: &str, vars: &[(&str, &str)], inputs: WindowInputs, setting: bool) -> Thresholds {
    let (env, warnings) = EnvConfig::from_vars(vars.iter().copied());
    assert!(warnings.is_empty(), "{warnings:?}");
    thresholds(&resolve_window(model, &inputs, &env), &env, setting)
}

fn run_default(model: &str, vars: &[(&str, &str)]) -> Thresholds {
    run(model, vars, WindowInputs::default(), true)
}

/// (window, effective, threshold, warning, blocked)
fn numbers(t: &Thresholds) -> (u64, u64, u64, u64, u64) {
    (t.window, t.effective_window, t.threshold, t.warning, t.blocked)
}

#[test]
fn reference_example_through_the_pipeline() {
    let t = run_default(SONNET_1M, &[]);
    assert_eq!(numbers(&t), (1_000_000, 980_000, 967_000, 947_000, 977_000));
    assert!(t.auto_compact_enabled && t.compact_enabled && t.enforce_window);
}

#[test]
fn each_variable_alone_changes_the_outcome() {
    // (vars, model, window, threshold, blocked, auto, any, enforce)
    type Case = (&'static [(&'static str, &'static str)], &'static str, u64, u64, u64, bool, bool, bool);
    let cases: &[Case] = &[
        (&[], SONNET_1M, 1_000_000, 967_000, 977_000, true, true, true),
        (&[("DISABLE_AUTO_COMPACT", "1")], SONNET_1M, 1_000_000, 967_000, 977_000, false, true, true),
        (&[("DISABLE_COMPACT", "1")], SONNET_1M, 1_000_000, 967_000, 977_000, false, false, true),
        (&[("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE", "50")], SONNET_1M, 1_000_000, 490_000, 977_000, true, true, true),
        (&[("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "500k")], SONNET_1M, 500_000, 467_000, 477_000, true, true, true),
        (&[("CLAUDE_CODE_MAX_CONTEXT_TOKENS", "150000")], "local-model", 150_000, 117_000, 127_000, true, true, true),
        (
            &[("CLAUDE_CODE_DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT", "1")],
            "local-model",
            200_000,
            167_000,
            177_000,
            true,
            true,
            false,
        ),
        (&[("CLAUDE_CODE_DISABLE_1M_CONTEXT", "1")], SONNET_1M, 200_000, 167_000, 177_000, true, true, true),
        (
            &[("CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE", "900000")],
            SONNET_1M,
            1_000_000,
            967_000,
            900_000,
            true,
            true,
            true,
        ),
    ];
    for &(vars, model, window, threshold, blocked, auto, any, enforce) in cases {
        let t = run_default(model, vars);
        assert_eq!(
            (t.window, t.threshold, t.blocked, t.auto_compact_enabled, t.compact_enabled, t.enforce_window),
            (window, threshold, blocked, auto, any, enforce),
            "{vars:?} on {model}"
        );
    }
}

#[test]
fn combinations() {
    // Smaller env window, then a percent of what is left.
    let t = run_default(
        SONNET_1M,
        &[("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "0.5M"), ("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE", "80")],
    );
    assert_eq!(numbers(&t), (500_000, 480_000, 384_000, 364_000, 477_000));

    // Env window with DISABLE_1M: the model is back to 200K and caps the request.
    let t = run_default(
        SONNET_1M,
        &[("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "800k"), ("CLAUDE_CODE_DISABLE_1M_CONTEXT", "yes")],
    );
    assert_eq!(numbers(&t), (200_000, 180_000, 167_000, 147_000, 177_000));

    // Both disables: nothing runs, and the blocked level (overridden) refuses.
    let t = run_default(
        SONNET,
        &[
            ("DISABLE_AUTO_COMPACT", "true"),
            ("DISABLE_COMPACT", "true"),
            ("CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE", "150k"),
        ],
    );
    assert!(!t.auto_compact_enabled && !t.compact_enabled);
    assert!(!t.should_auto_compact(199_000));
    assert!(!t.rejects_request(149_999));
    assert!(t.rejects_request(150_000));

    // Unknown model, its window given, enforcement off for guesses: still enforced.
    let t = run_default(
        "local-model",
        &[("CLAUDE_CODE_MAX_CONTEXT_TOKENS", "120k"), ("CLAUDE_CODE_DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT", "on")],
    );
    assert_eq!(numbers(&t), (120_000, 100_000, 87_000, 67_000, 97_000));
    assert!(t.enforce_window);
    assert!(t.should_auto_compact(87_000));

    // Env window and a subagent ceiling: the ceiling wins when lower.
    let t = run(
        SONNET_1M,
        &[("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "1M")],
        WindowInputs { subagent_ceiling: Some(250_000), ..WindowInputs::default() },
        true,
    );
    assert_eq!(numbers(&t), (250_000, 230_000, 217_000, 197_000, 227_000));
}

#[test]
fn disable_auto_compact_versus_disable_compact() {
    let tokens = 970_000; // past the threshold, before blocked
    let blocked = 977_000;

    let normal = run_default(SONNET_1M, &[]);
    assert!(normal.should_auto_compact(tokens));
    assert!(!normal.rejects_request(blocked), "auto compaction gets a chance first");

    let no_auto = run_default(SONNET_1M, &[("DISABLE_AUTO_COMPACT", "1")]);
    assert!(!no_auto.should_auto_compact(tokens));
    assert!(no_auto.compact_enabled, "manual compaction stays available");
    assert!(no_auto.rejects_request(blocked));

    let none = run_default(SONNET_1M, &[("DISABLE_COMPACT", "1")]);
    assert!(!none.should_auto_compact(tokens));
    assert!(!none.compact_enabled);
    assert!(none.rejects_request(blocked));
    assert!(!none.rejects_request(blocked - 1));

    let setting_off = run(SONNET_1M, &[], WindowInputs::default(), false);
    assert!(!setting_off.should_auto_compact(tokens));
    assert!(setting_off.compact_enabled);
}

#[test]
fn unknown_model_without_enforcement_waits_for_the_provider() {
    let t = run_default(
        "local-model",
        &[("CLAUDE_CODE_DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT", "1"), ("DISABLE_AUTO_COMPACT", "1")],
    );
    assert!(!t.enforce_window);
    assert!(!t.should_auto_compact(10_000_000));
    assert!(!t.rejects_request(10_000_000));
    // Same model without the variable: the guessed 200K window is enforced.
    let t = run_default("local-model", &[]);
    assert_eq!(numbers(&t), (200_000, 180_000, 167_000, 147_000, 177_000));
    assert!(t.should_auto_compact(167_000));
}

#[test]
fn invalid_values_warn_and_leave_defaults() {
    let (env, warnings) = EnvConfig::from_vars([
        ("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE", "150"),
        ("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "lots"),
        ("CLAUDE_CODE_MAX_CONTEXT_TOKENS", "plenty"),
        ("DISABLE_COMPACT", "perhaps"),
    ]);
    assert_eq!(warnings.len(), 4, "{warnings:?}");
    for (name, value) in [
        ("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE", "150"),
        ("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "lots"),
        ("CLAUDE_CODE_MAX_CONTEXT_TOKENS", "plenty"),
        ("DISABLE_COMPACT", "perhaps"),
    ] {
        assert!(
            warnings.iter().any(|w| w.contains(name) && w.contains(value)),
            "no warning for {name}={value}: {warnings:?}"
        );
    }
    let t = thresholds(&resolve_window(SONNET_1M, &WindowInputs::default(), &env), &env, true);
    assert_eq!(numbers(&t), (1_000_000, 980_000, 967_000, 947_000, 977_000));
    assert!(t.compact_enabled);
}

#[test]
fn older_models_reserve_their_smaller_output() {
    let t = run_default("claude-3-5-sonnet-20241022", &[]);
    assert_eq!(numbers(&t), (200_000, 191_808, 178_808, 158_808, 188_808));
}
