//! `ctxd claude env` and `ctxd claude run`: one `claude` process through ctxd's
//! gateway. The gateway is started (detached, in a process group of its own) when
//! nothing answers at its address; when it cannot be had, the reason goes to stderr and
//! the plain program runs, so `claude` never points at a gateway that is not there.
//! Also where the real `claude` on `PATH` is found.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::gateway::client;
use crate::process_env::ProcessEnv;

/// How long `ctxd claude env` waits for a gateway it started to answer.
const GATEWAY_START_WAIT: Duration = Duration::from_secs(5);
/// One probe of the gateway.
const PROBE: Duration = Duration::from_millis(300);

/// Providers that never use `ANTHROPIC_BASE_URL`: Claude Code on them is left as it is.
const OTHER_PROVIDERS: [&str; 3] = ["CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY"];
/// Tells Claude Code to behave as it does against the first-party API, which the
/// gateway forwards to unchanged (a loopback base URL would otherwise turn off what the
/// program keeps for `api.anthropic.com`).
const FIRST_PARTY_ENV: &str = "_CLAUDE_CODE_ASSUME_FIRST_PARTY_BASE_URL";
const BASE_URL_ENV: &str = "ANTHROPIC_BASE_URL";
const FIRST_PARTY_HOST: &str = "api.anthropic.com";

/// The variables one `claude` process gets to go through the gateway, once the gateway
/// answers (started if nothing listens on its address); `None`, with the reason on
/// stderr (`warn`), when it should run as it would without ctxd.
pub fn gateway_env(
    env: &ProcessEnv,
    state_dir: &Path,
    ctxd: &Path,
    warn: &mut dyn FnMut(&str),
) -> Option<Vec<(String, String)>> {
    if OTHER_PROVIDERS.iter().any(|name| env.var(name).is_some_and(|v| !v.is_empty() && v != "0" && v != "false")) {
        return None;
    }
    let (addr, problem) = client::listen_address(env);
    if let Some(problem) = problem {
        warn(&problem);
    }
    let ours = client::base_url(addr);
    if let Some(set) = env.var(BASE_URL_ENV).filter(|v| !v.is_empty() && v.trim_end_matches('/') != ours) {
        warn(&format!(
            "ANTHROPIC_BASE_URL is already {set}: Claude Code runs without ctxd's gateway (to route it through ctxd, \
             set gateway.upstream to that address in ~/.config/ctxd/settings.json and unset the variable)"
        ));
        return None;
    }
    if !addr.ip().is_loopback() {
        warn(&format!("gateway.listen {addr} is not a loopback address: Claude Code runs without the gateway"));
        return None;
    }
    if let Err(why) = ensure_gateway(addr, state_dir, ctxd) {
        warn(&format!("{why}: Claude Code runs without the gateway"));
        return None;
    }
    let mut vars = vec![(BASE_URL_ENV.to_owned(), ours)];
    if env.var(FIRST_PARTY_ENV).is_none() && upstream_is_first_party(env) {
        vars.push((FIRST_PARTY_ENV.to_owned(), "1".to_owned()));
    }
    Some(vars)
}

/// The gateway forwards to the Anthropic API itself: `gateway.upstream` is unset or
/// names `api.anthropic.com`.
fn upstream_is_first_party(env: &ProcessEnv) -> bool {
    match client::user_settings(env).0.upstream {
        None => true,
        Some(url) => reqwest::Url::parse(&url).is_ok_and(|u| u.host_str() == Some(FIRST_PARTY_HOST)),
    }
}

/// Makes sure the user's own gateway answers at `addr`, starting `ctxd gateway` when
/// nothing listens there.
fn ensure_gateway(addr: SocketAddr, state_dir: &Path, ctxd: &Path) -> Result<(), String> {
    let listening = std::net::TcpStream::connect_timeout(&addr, PROBE).is_ok();
    if listening {
        if !client::listener_is_ours(addr) {
            return Err(format!("{addr} is taken by another user's process"));
        }
        if client::answers(addr, PROBE) {
            return Ok(());
        }
        return Err(format!("the process listening on {addr} does not answer as ctxd's gateway"));
    }
    let log = gateway_log(state_dir);
    let mut child = start_gateway(addr, state_dir, ctxd, &log)?;
    let started = Instant::now();
    while started.elapsed() < GATEWAY_START_WAIT {
        if client::answers(addr, PROBE) && client::listener_is_ours(addr) {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Another one may have won the address meanwhile (two `claude` started at
            // once): then it answers.
            if client::answers(addr, PROBE) && client::listener_is_ours(addr) {
                return Ok(());
            }
            return Err(format!("ctxd's gateway stopped at once ({status}; its log: {})", log.display()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "ctxd's gateway did not answer on {addr} within {} s (its log: {})",
        GATEWAY_START_WAIT.as_secs(),
        log.display()
    ))
}

fn gateway_log(state_dir: &Path) -> PathBuf {
    state_dir.join("logs").join("gateway.log")
}

/// Starts `ctxd gateway` in a process group of its own, so the terminal's Ctrl-C and
/// hang-up reach `claude`, not the gateway, which keeps serving the user's other
/// sessions. Its output (an error before its log is set up included) goes to its log.
/// It is not waited for: it outlives this process, whose parent then becomes init.
fn start_gateway(addr: SocketAddr, state_dir: &Path, ctxd: &Path, log: &Path) -> Result<std::process::Child, String> {
    use std::os::unix::process::CommandExt;
    let cannot = |e: std::io::Error| format!("cannot start ctxd's gateway: {e}");
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).map_err(cannot)?;
    }
    let output = std::fs::OpenOptions::new().create(true).append(true).open(log).map_err(cannot)?;
    std::process::Command::new(ctxd)
        .arg("--state-dir")
        .arg(state_dir)
        .arg("--log-file")
        .arg(log)
        .arg("gateway")
        .arg("--listen")
        .arg(addr.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(output)
        .process_group(0)
        .spawn()
        .map_err(cannot)
}

/// The real `claude` on `PATH`.
pub fn find_claude(env: &ProcessEnv) -> Option<PathBuf> {
    let path = env.var("PATH")?;
    path.split(':').filter(|dir| !dir.is_empty()).map(|dir| Path::new(dir).join("claude")).find(|candidate| {
        std::fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// Replaces this process with the real `claude`, given `args` and `vars`. Returns only
/// when that fails.
pub fn exec_claude(env: &ProcessEnv, args: &[OsString], vars: &[(String, String)]) -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let Some(claude) = find_claude(env) else {
        return anyhow::anyhow!("`claude` is not on PATH: install Claude Code first");
    };
    let mut command = std::process::Command::new(&claude);
    command.args(args);
    for (name, value) in vars {
        command.env(name, value);
    }
    anyhow::anyhow!("cannot run {}: {}", claude.display(), command.exec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_party_upstream_and_other_providers() {
        let dir = tempfile::tempdir().unwrap();
        let env = ProcessEnv::from_pairs([("HOME", dir.path().as_os_str())]);
        assert!(upstream_is_first_party(&env));
        std::fs::create_dir_all(dir.path().join(".config/ctxd")).unwrap();
        let settings = dir.path().join(".config/ctxd/settings.json");
        std::fs::write(&settings, r#"{"gateway": {"upstream": "https://api.anthropic.com"}}"#).unwrap();
        assert!(upstream_is_first_party(&env));
        std::fs::write(&settings, r#"{"gateway": {"upstream": "https://llm.corp.example"}}"#).unwrap();
        assert!(!upstream_is_first_party(&env));
        // Bedrock: left as it is, nothing said.
        let bedrock =
            ProcessEnv::from_pairs([("HOME", dir.path().as_os_str()), ("CLAUDE_CODE_USE_BEDROCK", "1".as_ref())]);
        let mut said = Vec::new();
        assert_eq!(
            gateway_env(&bedrock, dir.path(), Path::new("/nonexistent/ctxd"), &mut |s| said.push(s.to_owned())),
            None
        );
        assert!(said.is_empty(), "{said:?}");
        // A base URL of the user's own: left as it is, and said why.
        let own = ProcessEnv::from_pairs([
            ("HOME", dir.path().as_os_str()),
            ("ANTHROPIC_BASE_URL", "https://llm.corp.example".as_ref()),
        ]);
        assert_eq!(
            gateway_env(&own, dir.path(), Path::new("/nonexistent/ctxd"), &mut |s| said.push(s.to_owned())),
            None
        );
        assert!(said[0].contains("gateway.upstream"), "{said:?}");
    }
}
