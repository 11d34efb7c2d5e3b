//! The history-tools part of `ctxd claude setup`: `ctxd mcp` as the user's MCP server
//! for Claude Code, so the model has `mcp__ctxd__search_history` and `read_history` in
//! every project.
//!
//! The server is added and removed by the program's own commands, `claude mcp add -s
//! user ctxd -- <ctxd> mcp` and `claude mcp remove -s user ctxd`, never by editing
//! Claude Code's file (`~/.claude.json`, or `.claude.json` in `$CLAUDE_CONFIG_DIR`):
//! that file is the program's, which rewrites it as it runs (start-up counters, tips,
//! per-project state), so a copy setup kept of it would be stale by the time of an
//! undo, and a write of ours could lose one of the program's own. Setup only reads it
//! (bounded), to see whether a user server named `ctxd` is there already.
//!
//! What `--undo` promises for this part is therefore not a byte-for-byte file: the
//! `mcpServers` entry setup added is gone, through the program, and everything else in
//! that file is as the program left it (its other servers included). The program keeps
//! an empty `mcpServers` object where there was none before. A `ctxd` server setup did
//! not add (the user's own, or one the user changed since) is never removed: the
//! manifest records whether setup added the server and with which command, and undo
//! takes it out only while it is still that.
//!
//! Without `claude` on `PATH`, or with a user server named `ctxd` already there, setup
//! says so and leaves this part out; the other changes still happen.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::mcp_config;

/// The server's name in Claude Code: its tools are `mcp__ctxd__…`.
const SERVER_NAME: &str = "ctxd";
/// How long one `claude mcp …` may take (it reads and writes one file).
const CLAUDE_WAIT: Duration = Duration::from_secs(60);
/// Bytes of the program's output kept for a message.
const OUTPUT_CAP: u64 = 64 << 10;

/// A stdio server as setup gives it to `claude mcp add`, and as the manifest records
/// what setup added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Server {
    pub command: String,
    pub args: Vec<String>,
}

impl Server {
    /// `ctxd mcp` for the ctxd at `ctxd`; `--state-dir` only when setup runs with a state
    /// directory other than the one `ctxd` finds by itself.
    pub(super) fn ctxd_mcp(ctxd: &Path, state_dir: Option<&Path>) -> Server {
        let mut args = Vec::new();
        if let Some(dir) = state_dir {
            args.extend(["--state-dir".to_owned(), dir.to_string_lossy().into_owned()]);
        }
        args.push("mcp".to_owned());
        Server { command: ctxd.to_string_lossy().into_owned(), args }
    }

    /// The entry the program keeps is this server (`type` stdio or absent, the same
    /// command and arguments).
    fn is(&self, entry: &Value) -> bool {
        let stdio = entry["type"].as_str().is_none_or(|kind| kind == "stdio");
        let args: Option<Vec<&str>> = match &entry["args"] {
            Value::Null => Some(Vec::new()),
            Value::Array(args) => args.iter().map(Value::as_str).collect(),
            _ => None,
        };
        stdio && entry["command"].as_str() == Some(&self.command) && args.is_some_and(|a| a == self.args)
    }

    fn shown(&self) -> String {
        std::iter::once(self.command.as_str()).chain(self.args.iter().map(String::as_str)).collect::<Vec<_>>().join(" ")
    }
}

/// What setup does about the user's `ctxd` server.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// None there: add it.
    Add,
    /// Setup's own, as wanted already.
    Unchanged,
    /// Setup's own, from a ctxd elsewhere (or another state directory): replace it.
    Replace,
    /// Not setup's (the user's, or changed since setup added it): leave it alone.
    LeaveUsers,
}

/// The step for the user's server `existing`, given what setup added before (`added`).
fn step(existing: Option<&Value>, added: Option<&Server>, wanted: &Server) -> Step {
    match (existing, added) {
        (None, _) => Step::Add,
        (Some(entry), Some(_)) if wanted.is(entry) => Step::Unchanged,
        (Some(entry), Some(added)) if added.is(entry) => Step::Replace,
        (Some(_), _) => Step::LeaveUsers,
    }
}

/// Where the program and its file are, for this part.
#[derive(Debug, Clone)]
pub(super) struct Place {
    /// `claude` on `PATH`.
    pub claude: Option<PathBuf>,
    /// Claude Code's own file (read only).
    pub config: Option<PathBuf>,
}

impl Place {
    fn user_server(&self) -> Result<Option<Value>, String> {
        match &self.config {
            Some(config) => mcp_config::user_server(config, SERVER_NAME),
            None => Ok(None),
        }
    }
}

/// Adds `wanted` as the user's `ctxd` server unless one setup did not add is there;
/// returns what setup has added now (for the manifest) and the line that says what
/// happened. Never fails: what cannot be done is said, and the rest of setup goes on.
pub(super) fn add(place: &Place, added: Option<Server>, wanted: &Server) -> (Option<Server>, String) {
    let what = "Claude Code's MCP servers";
    let Some(claude) = &place.claude else {
        return (
            added,
            format!(
                "{what}: `claude` is not on PATH, so `ctxd mcp` was not added (the history tools): add it with \
                 `claude mcp add -s user {SERVER_NAME} -- {}`",
                wanted.shown()
            ),
        );
    };
    let existing = match place.user_server() {
        Ok(existing) => existing,
        Err(why) => return (added, format!("{what}: {why}; `ctxd mcp` was not added")),
    };
    match step(existing.as_ref(), added.as_ref(), wanted) {
        Step::Unchanged => (added, format!("{what}: `{SERVER_NAME}` already runs `{}` (unchanged)", wanted.shown())),
        Step::LeaveUsers => {
            let entry = existing.unwrap_or_default();
            let runs = match entry["command"].as_str() {
                Some(command) => format!("runs `{command}`"),
                None => "is not a command".to_owned(),
            };
            let tools = if mcp_config::is_ctxd_mcp(&entry) {
                "it runs ctxd mcp, so the history tools are there"
            } else {
                "the history tools were not added"
            };
            (
                None,
                format!(
                    "{what}: you have a user server named `{SERVER_NAME}` that setup did not add ({runs}): left as \
                     it is, and --undo leaves it ({tools})"
                ),
            )
        }
        step @ (Step::Add | Step::Replace) => {
            if step == Step::Replace
                && let Err(why) = run_claude(claude, &["mcp", "remove", "-s", "user", SERVER_NAME])
            {
                return (added, format!("{what}: could not replace setup's `{SERVER_NAME}` server: {why}"));
            }
            let mut args = vec!["mcp", "add", "-s", "user", SERVER_NAME, "--", wanted.command.as_str()];
            args.extend(wanted.args.iter().map(String::as_str));
            match run_claude(claude, &args) {
                Ok(()) => (
                    Some(wanted.clone()),
                    format!(
                        "{what}: added `{SERVER_NAME}` for you in every project (`claude mcp add -s user`), running \
                         `{}`: the model can call mcp__{SERVER_NAME}__search_history and read_history",
                        wanted.shown()
                    ),
                ),
                // A replaced server is gone: nothing of setup's is left to undo.
                Err(why) => {
                    ((step == Step::Add).then_some(added).flatten(), format!("{what}: `ctxd mcp` was not added: {why}"))
                }
            }
        }
    }
}

/// Takes out the server setup added, through the program, while it is still what setup
/// added. `Err`: it could not be taken out now (the record keeps it for another undo).
pub(super) fn remove(place: &Place, added: &Server) -> Result<String, String> {
    let what = format!("Claude Code's MCP server `{SERVER_NAME}`");
    match place.user_server()? {
        None => Ok(format!("{what}: gone since setup; left so")),
        Some(entry) if !added.is(&entry) => Ok(format!("{what}: changed since setup; left as it is")),
        Some(_) => {
            let claude = place.claude.as_ref().ok_or_else(|| {
                format!(
                    "{what}: `claude` is not on PATH, so it was not removed: run `ctxd claude setup --undo` again \
                     where it is, or `claude mcp remove -s user {SERVER_NAME}`"
                )
            })?;
            run_claude(claude, &["mcp", "remove", "-s", "user", SERVER_NAME])
                .map_err(|why| format!("{what}: {why}"))?;
            Ok(format!(
                "{what}: removed (`claude mcp remove -s user`); the rest of Claude Code's file is as the program left \
                 it"
            ))
        }
    }
}

/// Runs `claude ARGS`, bounded in time and output; `Err` says how it failed.
fn run_claude(claude: &Path, args: &[&str]) -> Result<(), String> {
    let shown = format!("`claude {}`", args.join(" "));
    let mut child = Command::new(claude)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", claude.display()))?;
    // Read on a thread so a chatty program cannot block on a full pipe.
    let stderr = child.stderr.take().map(|pipe| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.take(OUTPUT_CAP).read_to_end(&mut text);
            String::from_utf8_lossy(&text).trim().to_owned()
        })
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < CLAUDE_WAIT => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{shown} did not finish within {} s", CLAUDE_WAIT.as_secs()));
            }
            Err(e) => return Err(format!("{shown}: {e}")),
        }
    };
    let said = stderr.and_then(|reader| reader.join().ok()).unwrap_or_default();
    if status.success() {
        return Ok(());
    }
    let said = if said.is_empty() { String::new() } else { format!(": {said}") };
    Err(format!("{shown} failed ({status}){said}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wanted() -> Server {
        Server::ctxd_mcp(Path::new("/opt/ctxd/bin/ctxd"), None)
    }

    #[test]
    fn the_server_named_with_the_state_directory_only_when_it_is_not_the_default() {
        assert_eq!(wanted(), Server { command: "/opt/ctxd/bin/ctxd".into(), args: vec!["mcp".into()] });
        let other = Server::ctxd_mcp(Path::new("/c"), Some(Path::new("/s t")));
        assert_eq!(other.args, ["--state-dir", "/s t", "mcp"]);
        assert_eq!(other.shown(), "/c --state-dir /s t mcp");
    }

    #[test]
    fn an_entry_is_the_server_when_command_and_arguments_match() {
        let server = wanted();
        assert!(server.is(&json!({"type": "stdio", "command": "/opt/ctxd/bin/ctxd", "args": ["mcp"], "env": {}})));
        assert!(server.is(&json!({"command": "/opt/ctxd/bin/ctxd", "args": ["mcp"]})));
        assert!(!server.is(&json!({"command": "/opt/ctxd/bin/ctxd", "args": ["mcp", "x"]})));
        assert!(!server.is(&json!({"command": "ctxd", "args": ["mcp"]})));
        assert!(!server.is(&json!({"type": "http", "command": "/opt/ctxd/bin/ctxd", "args": ["mcp"]})));
        assert!(!server.is(&json!({"command": "/opt/ctxd/bin/ctxd", "args": "mcp"})));
        assert!(!server.is(&Value::Null));
    }

    #[test]
    fn setup_adds_replaces_its_own_and_leaves_the_users() {
        let ours = json!({"type": "stdio", "command": "/opt/ctxd/bin/ctxd", "args": ["mcp"], "env": {}});
        let moved = Server::ctxd_mcp(Path::new("/old/ctxd"), None);
        let old = json!({"type": "stdio", "command": "/old/ctxd", "args": ["mcp"]});
        let w = wanted();
        assert_eq!(step(None, None, &w), Step::Add);
        // Added by setup, removed by the user since: added again.
        assert_eq!(step(None, Some(&w), &w), Step::Add);
        assert_eq!(step(Some(&ours), Some(&w), &w), Step::Unchanged);
        assert_eq!(step(Some(&old), Some(&moved), &w), Step::Replace);
        // The same server, but the user added it: still theirs.
        assert_eq!(step(Some(&ours), None, &w), Step::LeaveUsers);
        // Setup's once, changed by the user since: theirs now.
        let theirs = json!({"command": "/old/ctxd", "args": ["--state-dir", "/mine", "mcp"]});
        assert_eq!(step(Some(&theirs), Some(&moved), &w), Step::LeaveUsers);
    }

    #[test]
    fn without_claude_nothing_is_run_and_the_record_is_kept() {
        let place = Place { claude: None, config: None };
        let (added, said) = add(&place, Some(wanted()), &wanted());
        assert_eq!(added, Some(wanted()));
        assert!(said.contains("not on PATH") && said.contains("claude mcp add -s user ctxd -- /opt/ctxd/bin/ctxd mcp"));
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join(".claude.json");
        std::fs::write(
            &config,
            json!({"mcpServers": {"ctxd": {"command": "/opt/ctxd/bin/ctxd", "args": ["mcp"]}}}).to_string(),
        )
        .unwrap();
        let place = Place { claude: None, config: Some(config.clone()) };
        assert!(remove(&place, &wanted()).unwrap_err().contains("not on PATH"));
        // Not there any more: nothing to remove, nothing kept.
        std::fs::write(&config, "{\"mcpServers\": {}}").unwrap();
        assert!(remove(&place, &wanted()).unwrap().contains("gone since setup"));
        std::fs::write(&config, "{\"mcpServers\": ").unwrap();
        assert!(remove(&place, &wanted()).unwrap_err().contains("not JSON"));
    }
}
