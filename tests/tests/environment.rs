//! What the daemon takes from its environment when no flag says otherwise: the state
//! directory (`CTXD_STATE_DIR`, the XDG state directory, `~/.local/state`, the temporary
//! directory), the log filter (`CTXD_LOG`) and the budget overrides, whose bad values are
//! reported once. Each daemon runs with a cleared environment holding only the variables
//! the test gives it, so the outcome cannot depend on the machine's.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::path::Path;
use std::process::Stdio;

/// Runs `ctxd serve` with no flags and only `env`, its input closed at once (it stops
/// with nothing to read), and returns the log it wrote where it chose its state
/// directory to be: `<state dir>/logs/ctxd.log`, checked at `expected`.
fn serve_and_read_log(env: &[(&str, &Path)], expected: &Path) -> String {
    let status = ctxd_e2e::ctxd_command()
        .arg("serve")
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v.as_os_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .unwrap();
    assert!(status.success(), "{status:?}");
    let log = expected.join("logs/ctxd.log");
    std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("no log at {}: {e}", log.display()))
}

#[test]
fn the_state_directory_comes_from_the_environment_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();

    let override_dir = dir.path().join("override");
    let xdg = dir.path().join("xdg");
    let log = serve_and_read_log(
        &[("HOME", &home), ("XDG_STATE_HOME", &xdg), ("CTXD_STATE_DIR", &override_dir)],
        &override_dir,
    );
    assert!(log.contains("ctxd starting"), "{log}");

    serve_and_read_log(&[("HOME", &home), ("XDG_STATE_HOME", &xdg)], &xdg.join("ctxd"));
    // A relative XDG directory is not one (the specification says to ignore it).
    serve_and_read_log(&[("HOME", &home), ("XDG_STATE_HOME", Path::new("relative"))], &home.join(".local/state/ctxd"));
    serve_and_read_log(&[("TMPDIR", &tmp)], &tmp.join("ctxd-state"));
    assert!(!dir.path().join("relative").exists() && !Path::new("relative").exists());
}

#[test]
fn the_log_filter_and_budget_warnings_come_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");

    let quiet = serve_and_read_log(&[("CTXD_STATE_DIR", &state), ("CTXD_LOG", Path::new("error"))], &state);
    assert!(!quiet.contains("ctxd starting"), "CTXD_LOG=error still logged info: {quiet}");

    let bad = Path::new("a lot");
    let log = serve_and_read_log(&[("CTXD_STATE_DIR", &state), ("CLAUDE_CODE_AUTO_COMPACT_WINDOW", bad)], &state);
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("ignoring an invalid environment variable")).collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(warnings[0].contains("CLAUDE_CODE_AUTO_COMPACT_WINDOW"), "{}", warnings[0]);
}
