//! `ctxd claude setup` and `ctxd mcp` as Claude Code's user MCP server: setup adds it
//! through the program's own `claude mcp add -s user ctxd -- <ctxd> mcp`, `--undo`
//! takes it out with `claude mcp remove -s user ctxd` only when setup added it, a user
//! server named `ctxd` that setup did not add is left alone, and a missing or failing
//! `claude` is said, not fatal: the other changes still happen.
//!
//! The `claude` here is a fake on PATH that records each call and keeps its file
//! (`~/.claude.json`) the way Claude Code 2.1.332 does for these commands (checked
//! against the real program by tests/claude-code/mcp_setup.py).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Value, json};

/// Stands in for `claude mcp add|remove -s user`: each call's arguments go, one JSON
/// array a line, to `$FAKE_CLAUDE_CALLS`; the servers live in `$HOME/.claude.json`
/// (`$CLAUDE_CONFIG_DIR/.claude.json` when set), every other member kept, as the program
/// keeps them. `FAKE_CLAUDE_FAIL` makes every call fail, as a broken install would.
const FAKE_CLAUDE: &str = r#"
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_CLAUDE_CALLS"], "a") as f:
    f.write(json.dumps(args) + "\n")
if os.environ.get("FAKE_CLAUDE_FAIL"):
    print("fake claude: broken install", file=sys.stderr)
    sys.exit(3)
path = os.path.join(os.environ.get("CLAUDE_CONFIG_DIR") or os.environ["HOME"], ".claude.json")
config = json.load(open(path)) if os.path.exists(path) else {}
servers = config.setdefault("mcpServers", {})
if args[:4] == ["mcp", "add", "-s", "user"] and args[5] == "--":
    name = args[4]
    if name in servers:
        print(f"MCP server {name} already exists in user config", file=sys.stderr)
        sys.exit(1)
    servers[name] = {"type": "stdio", "command": args[6], "args": args[7:], "env": {}}
elif args[:4] == ["mcp", "remove", "-s", "user"]:
    name = args[4]
    if name not in servers:
        print(f'No MCP server named "{name}" in user scope', file=sys.stderr)
        sys.exit(1)
    del servers[name]
else:
    sys.exit(0)
with open(path, "w") as f:
    json.dump(config, f, indent=2)
"#;

struct World {
    root: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        let world = World { root: tempfile::tempdir().unwrap() };
        std::fs::create_dir_all(world.home()).unwrap();
        std::fs::create_dir_all(world.bin()).unwrap();
        world
    }

    fn home(&self) -> PathBuf {
        self.root.path().join("home")
    }

    /// The only folder on PATH: the fake `claude`, when there is one, and nothing else.
    fn bin(&self) -> PathBuf {
        self.root.path().join("bin")
    }

    fn calls_file(&self) -> PathBuf {
        self.root.path().join("claude.calls")
    }

    fn claude_json(&self) -> PathBuf {
        self.home().join(".claude.json")
    }

    fn fake_claude(&self) {
        let python = ["/usr/bin/python3", "/usr/local/bin/python3"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("python3 runs the fake claude");
        let path = self.bin().join("claude");
        std::fs::write(&path, format!("#!{python}\n{FAKE_CLAUDE}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// `ctxd [--state-dir STATE] ARGS` with this home, bash as the shell and only the
    /// world's `bin` on PATH; it must succeed.
    fn ctxd(&self, state: Option<&Path>, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.ctxd_at(&ctxd_e2e::ctxd_bin(), state, args, env)
    }

    /// The same with the ctxd binary at `bin`.
    fn ctxd_at(&self, bin: &Path, state: Option<&Path>, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut command = std::process::Command::new(bin);
        command
            .env_clear()
            .env("HOME", self.home())
            .env("SHELL", "/bin/bash")
            .env("PATH", self.bin())
            .env("FAKE_CLAUDE_CALLS", self.calls_file());
        if let Some(state) = state {
            command.arg("--state-dir").arg(state);
        }
        let out = command.args(args).envs(env.iter().copied()).output().unwrap();
        assert!(out.status.success(), "ctxd {args:?}: {}", text(&out));
        out
    }

    /// Each call of the fake `claude`, its arguments.
    fn calls(&self) -> Vec<Vec<String>> {
        match std::fs::read_to_string(self.calls_file()) {
            Ok(text) => text.lines().map(|l| serde_json::from_str(l).unwrap()).collect(),
            Err(_) => Vec::new(),
        }
    }

    fn config(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.claude_json()).unwrap()).unwrap()
    }

    fn write_config(&self, config: &Value) {
        std::fs::write(self.claude_json(), serde_json::to_string_pretty(config).unwrap()).unwrap();
    }

    fn manifest_path(&self) -> PathBuf {
        self.home().join(".local/state/ctxd/claude-setup/manifest.json")
    }
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

fn ctxd_path() -> String {
    std::fs::canonicalize(ctxd_e2e::ctxd_bin()).unwrap().to_string_lossy().into_owned()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// What Claude Code keeps of a user's: a server of their own, counters, a project.
fn users_config() -> Value {
    json!({
        "numStartups": 12,
        "theme": "dark",
        "mcpServers": {"notes": {"type": "stdio", "command": "/usr/local/bin/notes-mcp", "args": [], "env": {}}},
        "projects": {"/home/u/work": {"hasTrustDialogAccepted": true}}
    })
}

#[test]
fn setup_adds_the_server_through_claude_and_undo_removes_it() {
    let world = World::new();
    world.fake_claude();
    world.write_config(&users_config());

    let out = world.ctxd(None, &["claude", "setup"], &[]);
    let ctxd = ctxd_path();
    assert_eq!(world.calls(), [strings(&["mcp", "add", "-s", "user", "ctxd", "--", &ctxd, "mcp"])]);
    assert!(text(&out).contains("added `ctxd` for you in every project"), "{}", text(&out));
    assert!(text(&out).contains("removes the MCP server it added"), "{}", text(&out));
    let mut want = users_config();
    want["mcpServers"]["ctxd"] = json!({"type": "stdio", "command": ctxd, "args": ["mcp"], "env": {}});
    assert_eq!(world.config(), want);
    // The manifest records that setup added it, and with what.
    let manifest: Value = serde_json::from_slice(&std::fs::read(world.manifest_path()).unwrap()).unwrap();
    assert_eq!(manifest["mcpServer"], json!({"command": ctxd, "args": ["mcp"]}));

    // Setup again: the server is setup's own and as wanted, so `claude` is not run.
    let out = world.ctxd(None, &["claude", "setup"], &[]);
    assert!(text(&out).contains("already runs") && text(&out).contains("(unchanged)"), "{}", text(&out));
    assert_eq!(world.calls().len(), 1);

    // The program changes its own file meanwhile.
    let mut config = world.config();
    config["numStartups"] = json!(13);
    config["tipsHistory"] = json!({"mcp": 1});
    world.write_config(&config);

    let out = world.ctxd(None, &["claude", "setup", "--undo"], &[]);
    assert_eq!(world.calls().last().unwrap(), &strings(&["mcp", "remove", "-s", "user", "ctxd"]));
    assert_eq!(world.calls().len(), 2);
    assert!(text(&out).contains("removed (`claude mcp remove -s user`)"), "{}", text(&out));
    // The entry is gone; what the program changed stays; the rest is as before setup.
    let mut want = users_config();
    want["numStartups"] = json!(13);
    want["tipsHistory"] = json!({"mcp": 1});
    assert_eq!(world.config(), want);
    assert!(!world.manifest_path().exists(), "the record stays after a whole undo");
    // Undo again: nothing recorded, nothing run.
    world.ctxd(None, &["claude", "setup", "--undo"], &[]);
    assert_eq!(world.calls().len(), 2);
}

#[test]
fn a_state_directory_of_its_own_is_passed_to_ctxd_mcp() {
    let world = World::new();
    world.fake_claude();
    let state = world.root.path().join("state");
    let config_dir = world.root.path().join("claude-config");
    let config_env = [("CLAUDE_CONFIG_DIR", config_dir.to_str().unwrap())];
    world.ctxd(Some(&state), &["claude", "setup", "--no-shell"], &config_env);
    let (ctxd, state_arg) = (ctxd_path(), state.to_str().unwrap().to_owned());
    assert_eq!(
        world.calls(),
        [strings(&["mcp", "add", "-s", "user", "ctxd", "--", &ctxd, "--state-dir", &state_arg, "mcp"])]
    );
    // Setup reads the program's file where the program keeps it: it knows its server.
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(config_dir.join(".claude.json")).unwrap()).unwrap();
    assert_eq!(config["mcpServers"]["ctxd"]["args"], json!(["--state-dir", state_arg, "mcp"]));
    world.ctxd(Some(&state), &["claude", "setup", "--no-shell"], &config_env);
    assert_eq!(world.calls().len(), 1, "setup again re-added its own server");
    world.ctxd(Some(&state), &["claude", "setup", "--undo"], &config_env);
    assert_eq!(world.calls().last().unwrap(), &strings(&["mcp", "remove", "-s", "user", "ctxd"]));
}

#[test]
fn a_users_own_ctxd_server_is_left_alone() {
    let own = json!({"type": "stdio", "command": "/usr/local/bin/ctxd", "args": ["mcp"], "env": {}});
    let other = json!({"type": "stdio", "command": "node", "args": ["/srv/ctxd-wiki.js"], "env": {}});
    for (server, tools) in [(own, "so the history tools are there"), (other, "the history tools were not added")] {
        let world = World::new();
        world.fake_claude();
        let mut config = users_config();
        config["mcpServers"]["ctxd"] = server;
        world.write_config(&config);
        let before = std::fs::read(world.claude_json()).unwrap();

        let out = world.ctxd(None, &["claude", "setup"], &[]);
        let said = text(&out);
        assert!(said.contains("that setup did not add") && said.contains(tools), "{said}");
        // The status line and the shell function still went in.
        assert!(said.contains("statusLine runs") && said.contains("added a `claude` function"), "{said}");
        assert_eq!(world.calls(), Vec::<Vec<String>>::new());

        let out = world.ctxd(None, &["claude", "setup", "--undo"], &[]);
        assert_eq!(world.calls(), Vec::<Vec<String>>::new(), "{}", text(&out));
        assert_eq!(std::fs::read(world.claude_json()).unwrap(), before);
        assert!(!world.home().join(".claude/settings.json").exists(), "{}", text(&out));
    }
}

#[test]
fn setup_from_a_ctxd_elsewhere_replaces_its_own_server() {
    let world = World::new();
    world.fake_claude();
    // Set up from a ctxd installed elsewhere, then from this one.
    let installed = world.root.path().join("opt/ctxd");
    std::fs::create_dir_all(installed.parent().unwrap()).unwrap();
    std::fs::copy(ctxd_e2e::ctxd_bin(), &installed).unwrap();
    let old = installed.to_str().unwrap();
    world.ctxd_at(&installed, None, &["claude", "setup", "--no-shell"], &[]);
    let out = world.ctxd(None, &["claude", "setup", "--no-shell"], &[]);
    let ctxd = ctxd_path();
    assert_eq!(
        world.calls(),
        [
            strings(&["mcp", "add", "-s", "user", "ctxd", "--", old, "mcp"]),
            strings(&["mcp", "remove", "-s", "user", "ctxd"]),
            strings(&["mcp", "add", "-s", "user", "ctxd", "--", &ctxd, "mcp"]),
        ],
        "{}",
        text(&out)
    );
    assert_eq!(world.config()["mcpServers"]["ctxd"]["command"], json!(ctxd));
    // Undo removes the one setup added last.
    world.ctxd(None, &["claude", "setup", "--undo"], &[]);
    assert_eq!(world.calls().len(), 4);
    assert!(world.config()["mcpServers"].get("ctxd").is_none());
}

#[test]
fn a_server_changed_since_setup_is_not_removed() {
    let world = World::new();
    world.fake_claude();
    world.ctxd(None, &["claude", "setup", "--no-shell"], &[]);
    assert_eq!(world.calls().len(), 1);
    // The user pointed the server elsewhere since: it is theirs now.
    let mut config = world.config();
    config["mcpServers"]["ctxd"]["args"] = json!(["--state-dir", "/srv/other", "mcp"]);
    world.write_config(&config);
    let out = world.ctxd(None, &["claude", "setup", "--undo"], &[]);
    assert!(text(&out).contains("changed since setup; left as it is"), "{}", text(&out));
    assert_eq!(world.calls().len(), 1);
    assert_eq!(world.config(), config);
}

#[test]
fn a_missing_or_failing_claude_is_said_and_the_rest_is_set_up() {
    // No `claude` on PATH.
    let world = World::new();
    let out = world.ctxd(None, &["claude", "setup"], &[]);
    let said = text(&out);
    let ctxd = ctxd_path();
    assert!(
        said.contains("`claude` is not on PATH")
            && said.contains(&format!("claude mcp add -s user ctxd -- {ctxd} mcp")),
        "{said}"
    );
    assert!(said.contains("statusLine runs") && said.contains("added a `claude` function"), "{said}");
    assert!(!said.contains("removes the MCP server"), "{said}");
    assert!(!world.claude_json().exists());
    let out = world.ctxd(None, &["claude", "setup", "--undo"], &[]);
    assert!(!world.home().join(".claude/settings.json").exists(), "{}", text(&out));

    // A `claude` that fails: said with its own words; nothing recorded, so undo runs
    // nothing.
    let world = World::new();
    world.fake_claude();
    let fail = [("FAKE_CLAUDE_FAIL", "1")];
    let out = world.ctxd(None, &["claude", "setup"], &fail);
    let said = text(&out);
    assert!(said.contains("was not added") && said.contains("fake claude: broken install"), "{said}");
    assert!(said.contains("statusLine runs"), "{said}");
    assert_eq!(world.calls().len(), 1);
    world.ctxd(None, &["claude", "setup", "--undo"], &fail);
    assert_eq!(world.calls().len(), 1, "undo ran claude for a server setup never added");
    assert!(!world.home().join(".claude/settings.json").exists());
}

#[test]
fn an_undo_without_claude_keeps_the_record_for_later() {
    let world = World::new();
    world.fake_claude();
    world.ctxd(None, &["claude", "setup", "--no-shell"], &[]);
    std::fs::remove_file(world.bin().join("claude")).unwrap();
    let out = world.ctxd(None, &["claude", "setup", "--undo"], &[]);
    assert!(text(&out).contains("`claude` is not on PATH, so it was not removed"), "{}", text(&out));
    assert!(world.config()["mcpServers"]["ctxd"].is_object());
    // The settings were put back; the server waits in the record.
    assert!(!world.home().join(".claude/settings.json").exists());
    let manifest: Value = serde_json::from_slice(&std::fs::read(world.manifest_path()).unwrap()).unwrap();
    assert_eq!(manifest["changes"], json!([]));
    assert!(manifest["mcpServer"].is_object(), "{manifest}");
    // With claude back, the next undo removes it.
    world.fake_claude();
    world.ctxd(None, &["claude", "setup", "--undo"], &[]);
    assert_eq!(world.calls().last().unwrap(), &strings(&["mcp", "remove", "-s", "user", "ctxd"]));
    assert!(world.config()["mcpServers"].get("ctxd").is_none());
    assert!(!world.manifest_path().exists());
}
