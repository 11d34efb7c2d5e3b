//! Compaction hooks: commands from settings files (never from transcript content or a
//! client) run around a compaction, with JSON on stdin and their stdout read back.
//!
//! - `PreCompact` (matcher `manual` or `auto`): stdout is more focus instructions.
//! - `SessionStart` with matcher `compact`: stdout is installed after the summary.
//! - `PostCompact`: gets the summary on stdin; its output is only logged.
//!
//! Claude Code's JSON output is understood (`hookSpecificOutput.additionalContext`,
//! `additionalContext`); anything else is taken as plain text. A hook that hangs is
//! killed at its timeout, one that fails or prints garbage is reported, and neither
//! stops the compaction.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use ctxd_proto::settings::HookMatcher;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Default timeout of a hook command.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Most stdout kept from one hook.
const MAX_OUTPUT: usize = 64 * 1024;

/// What one hook command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookRun {
    pub command: String,
    /// Text it contributed (instructions or context), if any.
    pub output: Option<String>,
    /// Why it did not count, if it failed.
    pub problem: Option<String>,
}

/// Runs every hook of `event` whose matcher matches `matcher` (or has none), one after
/// another, each with `input` as JSON on stdin.
pub async fn run(
    hooks: Option<&BTreeMap<String, Vec<HookMatcher>>>,
    event: &str,
    matcher: &str,
    input: &Value,
) -> Vec<HookRun> {
    let Some(matchers) = hooks.and_then(|h| h.get(event)) else {
        return Vec::new();
    };
    let mut runs = Vec::new();
    for group in matchers {
        let applies =
            group.matcher.as_deref().is_none_or(|m| m.is_empty() || m == "*" || m.split('|').any(|p| p == matcher));
        if !applies {
            continue;
        }
        for hook in &group.hooks {
            if hook.kind != "command" {
                continue;
            }
            let timeout = hook.timeout.map_or(DEFAULT_TIMEOUT, Duration::from_secs);
            let run = run_one(&hook.command, input, timeout).await;
            if let Some(problem) = &run.problem {
                tracing::warn!(event, command = %hook.command, %problem, "hook failed; compaction goes on");
            }
            runs.push(run);
        }
    }
    runs
}

async fn run_one(command: &str, input: &Value, timeout: Duration) -> HookRun {
    let failed = |problem: String| HookRun { command: command.to_owned(), output: None, problem: Some(problem) };
    let mut child = match tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => return failed(format!("could not start: {e}")),
    };
    let stdin = child.stdin.take();
    let payload = input.to_string();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let work = async {
        if let Some(mut stdin) = stdin {
            // A hook that does not read its stdin must not block us.
            let _ = stdin.write_all(payload.as_bytes()).await;
        }
        let mut out = Vec::new();
        let mut err = Vec::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.take(MAX_OUTPUT as u64).read_to_end(&mut out).await;
        }
        if let Some(s) = stderr.as_mut() {
            let _ = s.take(MAX_OUTPUT as u64).read_to_end(&mut err).await;
        }
        let status = child.wait().await;
        (status, out, err)
    };
    match tokio::time::timeout(timeout, work).await {
        Err(_) => failed(format!("timed out after {} s and was killed", timeout.as_secs())),
        Ok((Err(e), _, _)) => failed(format!("could not be waited for: {e}")),
        Ok((Ok(status), out, err)) => {
            if !status.success() {
                let err = String::from_utf8_lossy(&err);
                return failed(format!("exited with {status}: {}", err.trim().chars().take(300).collect::<String>()));
            }
            let Ok(text) = String::from_utf8(out) else {
                return failed("printed bytes that are not UTF-8".to_owned());
            };
            HookRun { command: command.to_owned(), output: contribution(&text), problem: None }
        }
    }
}

/// The text a hook's stdout contributes: Claude Code's JSON forms, or the plain text.
fn contribution(stdout: &str) -> Option<String> {
    let trimmed = stdout.trim();
    if trimmed.is_empty() {
        return None;
    }
    if trimmed.starts_with('{')
        && let Ok(value) = serde_json::from_str::<Value>(trimmed)
    {
        let found = value
            .pointer("/hookSpecificOutput/additionalContext")
            .or_else(|| value.get("additionalContext"))
            .or_else(|| value.get("instructions"))
            .and_then(Value::as_str);
        return found.map(str::to_owned).filter(|s| !s.trim().is_empty());
    }
    Some(trimmed.to_owned())
}

#[cfg(test)]
mod tests {
    use ctxd_proto::settings::HookCommand;
    use serde_json::json;

    use super::*;

    fn hooks(
        event: &str,
        matcher: Option<&str>,
        commands: &[(&str, Option<u64>)],
    ) -> BTreeMap<String, Vec<HookMatcher>> {
        let hooks = commands
            .iter()
            .map(|(c, t)| HookCommand { kind: "command".into(), command: (*c).into(), timeout: *t })
            .collect();
        BTreeMap::from([(event.to_owned(), vec![HookMatcher { matcher: matcher.map(str::to_owned), hooks }])])
    }

    #[tokio::test]
    async fn output_stdin_json_failures_and_timeouts() {
        let h = hooks(
            "PreCompact",
            Some("manual"),
            &[
                ("echo focus on the parser", None),
                (r#"read input; echo "{\"additionalContext\": \"from json\"}""#, None),
                (r#"grep -o '"trigger":"manual"'"#, None),
                ("exit 3", None),
                ("sleep 5", Some(1)),
                ("printf '\\377\\376'", None),
            ],
        );
        let input = json!({"hook_event_name": "PreCompact", "trigger": "manual"});
        let runs = run(Some(&h), "PreCompact", "manual", &input).await;
        assert_eq!(runs.len(), 6);
        assert_eq!(runs[0].output.as_deref(), Some("focus on the parser"));
        assert_eq!(runs[1].output.as_deref(), Some("from json"));
        assert!(runs[2].output.as_deref().is_some_and(|o| o.contains("\"trigger\":\"manual\"")), "{:?}", runs[2]);
        assert!(runs[3].problem.as_deref().is_some_and(|p| p.contains("exit")), "{:?}", runs[3]);
        assert!(runs[4].problem.as_deref().is_some_and(|p| p.contains("timed out")), "{:?}", runs[4]);
        assert!(runs[5].problem.as_deref().is_some_and(|p| p.contains("UTF-8")), "{:?}", runs[5]);
        // The matcher selects: an automatic compaction runs none of these.
        assert!(run(Some(&h), "PreCompact", "auto", &input).await.is_empty());
        assert!(run(None, "PreCompact", "manual", &input).await.is_empty());
    }
}
