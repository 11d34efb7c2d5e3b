//! `ctxd claude setup` on a home of its own: what it changes, that `--undo` puts every
//! byte back (modes and symlinks too), that a user's later edits survive the undo, and
//! that the `claude` it sets up never breaks: with ctxd gone, or its gateway not to be
//! had, the user's own `claude` runs as before. `ctxd claude run` starts the gateway
//! when none runs, and the program it runs sees the gateway's address.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

/// What a tree holds: for each path, its kind and bytes (a link's target) and mode.
type Snapshot = BTreeMap<PathBuf, (char, Vec<u8>, u32)>;

fn snapshot(root: &Path) -> Snapshot {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            if meta.file_type().is_symlink() {
                out.insert(rel, ('l', std::fs::read_link(&path).unwrap().into_os_string().into_encoded_bytes(), 0));
            } else if meta.is_dir() {
                out.insert(rel, ('d', Vec::new(), mode));
                stack.push(path);
            } else {
                out.insert(rel, ('f', std::fs::read(&path).unwrap(), mode));
            }
        }
    }
    out
}

/// A user's home with nothing of the developer's in it.
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

    /// A folder on PATH for the fake `claude`.
    fn bin(&self) -> PathBuf {
        self.root.path().join("bin")
    }

    fn path_var(&self) -> String {
        format!("{}:/usr/bin:/bin", self.bin().display())
    }

    /// `ctxd` (the binary at `ctxd`) with this home and bash as the shell; `state` is
    /// the state directory (`None`: the default, inside the home).
    fn run(&self, ctxd: &Path, state: Option<&Path>, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut command = std::process::Command::new(ctxd);
        command.env_clear().env("HOME", self.home()).env("SHELL", "/bin/bash").env("PATH", self.path_var());
        if let Some(state) = state {
            command.arg("--state-dir").arg(state);
        }
        command.args(args).envs(env.iter().copied());
        command.output().unwrap()
    }

    fn ctxd(&self, args: &[&str]) -> Output {
        self.run(&ctxd_e2e::ctxd_bin(), None, args, &[])
    }

    /// A fake `claude` on PATH: writes its arguments and the variables that matter to
    /// `<root>/claude.out` and exits 7. When given a base URL it sends one Messages
    /// request there (bash's /dev/tcp) and keeps the answer in `claude.out.answer`.
    fn fake_claude(&self) -> PathBuf {
        let out = self.root.path().join("claude.out");
        let script = format!(
            r#"#!/bin/bash
{{ printf 'ARGS:'; printf '[%s]' "$@"; echo; echo "BASE:${{ANTHROPIC_BASE_URL-unset}}"; echo "FIRST:${{_CLAUDE_CODE_ASSUME_FIRST_PARTY_BASE_URL-unset}}"; }} > '{out}'
if [ -n "${{ANTHROPIC_BASE_URL-}}" ]; then
    hostport=${{ANTHROPIC_BASE_URL#http://}}
    exec 3<>"/dev/tcp/${{hostport%:*}}/${{hostport##*:}}"
    body='{{"model":"claude-opus-5-5","max_tokens":8,"messages":[{{"role":"user","content":"hi"}}]}}'
    printf 'POST /v1/messages HTTP/1.1\r\nHost: %s\r\nx-api-key: sk-ant-test-setup\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s' "$hostport" "${{#body}}" "$body" >&3
    cat <&3 > '{out}.answer'
fi
exit 7
"#,
            out = out.display()
        );
        let path = self.bin().join("claude");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        out
    }

    /// Runs `claude ARGS` in an interactive-like bash that read the home's `.bashrc`.
    fn claude_in_bash(&self, args: &str) -> Output {
        std::process::Command::new("/bin/bash")
            .env_clear()
            .env("HOME", self.home())
            .env("PATH", self.path_var())
            .arg("-c")
            .arg(format!("source ~/.bashrc; claude {args}"))
            .output()
            .unwrap()
    }

    fn settings(&self) -> PathBuf {
        self.home().join(".claude/settings.json")
    }
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

fn status_command(ctxd: &Path) -> String {
    format!("'{}' statusline", ctxd.display())
}

#[test]
fn setup_then_undo_on_a_bare_home_is_byte_identical() {
    let world = World::new();
    let before = snapshot(world.root.path());
    let out = world.ctxd(&["claude", "setup"]);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains(".claude/settings.json: statusLine runs") && said.contains(".bashrc: added a `claude` function"),
        "{said}"
    );
    let settings: Value = serde_json::from_str(&std::fs::read_to_string(world.settings()).unwrap()).unwrap();
    let ctxd = std::fs::canonicalize(ctxd_e2e::ctxd_bin()).unwrap();
    assert_eq!(
        settings,
        json!({"statusLine": {"type": "command", "command": status_command(&ctxd), "refreshInterval": 30}})
    );
    let rc = std::fs::read_to_string(world.home().join(".bashrc")).unwrap();
    assert!(rc.contains("claude() {") && rc.contains("command claude \"$@\""), "{rc}");
    // Nothing for Claude Code to obey without ctxd: no `env` in its settings.
    assert!(settings.get("env").is_none());

    let out = world.ctxd(&["claude", "setup", "--undo"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(snapshot(world.root.path()), before, "{}", text(&out));
}

#[test]
fn setup_then_undo_with_existing_settings_keeps_every_other_byte() {
    let world = World::new();
    let home = world.home();
    std::fs::create_dir_all(home.join(".claude/agents")).unwrap();
    let original = "{\n    \"model\": \"opus\",\n    \"statusLine\": {\"type\": \"command\", \"command\": \"~/bin/mine.sh\"},\n    \
                    \"permissions\": {\"allow\": [\"Bash(ls:*)\"]},\n    \"note\": \"caf\\u00e9 ☕ \\\"quoted\\\"\"\n}";
    std::fs::write(world.settings(), original).unwrap();
    std::fs::set_permissions(world.settings(), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::write(home.join(".claude/agents/a.md"), "an agent\n").unwrap();
    // The shell file is a dotfiles link, without a final line break.
    std::fs::create_dir_all(home.join("dotfiles")).unwrap();
    std::fs::write(home.join("dotfiles/bashrc"), "export EDITOR=vi\nalias ll='ls -l'").unwrap();
    symlink("dotfiles/bashrc", home.join(".bashrc")).unwrap();
    let state = world.root.path().join("state");
    let before = snapshot(world.root.path());

    let out = world.run(&ctxd_e2e::ctxd_bin(), Some(&state), &["claude", "setup"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("was `~/bin/mine.sh`"), "{}", text(&out));
    let after = std::fs::read_to_string(world.settings()).unwrap();
    // Only the statusLine value changed: the bytes before and after it are the same.
    let (head, rest) = original.split_once("{\"type\": \"command\", \"command\": \"~/bin/mine.sh\"}").unwrap();
    assert!(after.starts_with(head) && after.ends_with(rest), "{after}");
    let mut want: Value = serde_json::from_str(original).unwrap();
    let ctxd = std::fs::canonicalize(ctxd_e2e::ctxd_bin()).unwrap();
    want["statusLine"] = json!({"type": "command", "command": status_command(&ctxd), "refreshInterval": 30});
    assert_eq!(serde_json::from_str::<Value>(&after).unwrap(), want);
    assert_eq!(std::fs::metadata(world.settings()).unwrap().permissions().mode() & 0o777, 0o640);
    // The link is still a link; its target holds the function.
    assert!(std::fs::symlink_metadata(home.join(".bashrc")).unwrap().file_type().is_symlink());
    let rc = std::fs::read_to_string(home.join("dotfiles/bashrc")).unwrap();
    assert!(rc.starts_with("export EDITOR=vi\nalias ll='ls -l'\n\n# >>> ctxd claude setup >>>"), "{rc}");

    // Setup again changes nothing.
    let changed = snapshot(world.root.path());
    let out = world.run(&ctxd_e2e::ctxd_bin(), Some(&state), &["claude", "setup"], &[]);
    assert!(out.status.success() && text(&out).contains("unchanged"), "{}", text(&out));
    assert_eq!(snapshot(world.root.path()), changed);

    let out = world.run(&ctxd_e2e::ctxd_bin(), Some(&state), &["claude", "setup", "--undo"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    // The state folder setup made goes too (it stayed empty).
    assert_eq!(snapshot(world.root.path()), before, "{}", text(&out));
}

#[test]
fn claude_config_dir_is_where_the_settings_are() {
    let world = World::new();
    let config = world.root.path().join("claude-config");
    let out = world.run(
        &ctxd_e2e::ctxd_bin(),
        None,
        &["claude", "setup", "--no-shell"],
        &[("CLAUDE_CONFIG_DIR", config.to_str().unwrap())],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(config.join("settings.json").is_file());
    assert!(!world.home().join(".claude").exists());
    assert!(!world.home().join(".bashrc").exists(), "--no-shell touched the shell");
    assert!(text(&out).contains("ctxd claude run"), "{}", text(&out));
}

#[test]
fn undo_after_later_edits_takes_out_only_ctxds_part() {
    let world = World::new();
    std::fs::create_dir_all(world.home().join(".claude")).unwrap();
    std::fs::write(world.settings(), "{\n  \"theme\": \"dark\"\n}\n").unwrap();
    std::fs::write(world.home().join(".bashrc"), "alias ll='ls -l'\n").unwrap();
    assert!(world.ctxd(&["claude", "setup"]).status.success());
    // Claude Code (or the user) writes the settings; the user adds to the shell file.
    let edited =
        std::fs::read_to_string(world.settings()).unwrap().replace("\"theme\": \"dark\"", "\"theme\": \"light\"");
    std::fs::write(world.settings(), &edited).unwrap();
    let mut rc = std::fs::read_to_string(world.home().join(".bashrc")).unwrap();
    rc.push_str("export MINE=1\n");
    std::fs::write(world.home().join(".bashrc"), &rc).unwrap();

    let out = world.ctxd(&["claude", "setup", "--undo"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("changed since setup, so only ctxd's part was taken out"), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(world.settings()).unwrap(), "{\n  \"theme\": \"light\"\n}\n");
    assert_eq!(std::fs::read_to_string(world.home().join(".bashrc")).unwrap(), "alias ll='ls -l'\nexport MINE=1\n");
}

#[test]
fn a_settings_file_setup_cannot_edit_safely_is_left_alone() {
    let world = World::new();
    std::fs::create_dir_all(world.home().join(".claude")).unwrap();
    for bad in ["{\n  // my settings\n  \"theme\": \"dark\"\n}\n", "[1, 2]", "{\"a\": "] {
        std::fs::write(world.settings(), bad).unwrap();
        let before = snapshot(world.root.path());
        let out = world.ctxd(&["claude", "setup"]);
        assert!(!out.status.success(), "{bad}: {}", text(&out));
        assert!(text(&out).contains("settings.json") && text(&out).contains("left as it is"), "{}", text(&out));
        assert_eq!(snapshot(world.root.path()), before, "{bad}");
        assert!(!world.home().join(".bashrc").exists(), "the shell file changed though the settings could not");
    }
}

#[test]
fn with_ctxd_gone_the_users_claude_runs_as_before() {
    let world = World::new();
    let out_file = world.fake_claude();
    // A ctxd installed somewhere, set up from there, then uninstalled.
    let installed = world.root.path().join("opt/ctxd");
    std::fs::create_dir_all(installed.parent().unwrap()).unwrap();
    std::fs::copy(ctxd_e2e::ctxd_bin(), &installed).unwrap();
    let out = world.run(&installed, None, &["claude", "setup"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::remove_file(&installed).unwrap();

    let out = world.claude_in_bash("-p 'two words' --resume x");
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(&out_file).unwrap(),
        "ARGS:[-p][two words][--resume][x]\nBASE:unset\nFIRST:unset\n"
    );
    assert!(out.stderr.is_empty(), "{}", text(&out));
    // Claude Code's own settings send nothing anywhere: a `claude` run without the
    // shell function (an IDE's) gets no base URL from them.
    let settings: Value = serde_json::from_str(&std::fs::read_to_string(world.settings()).unwrap()).unwrap();
    assert!(settings.get("env").is_none(), "{settings}");
}

#[test]
fn a_gateway_address_held_by_something_else_runs_claude_without_it() {
    let world = World::new();
    let out_file = world.fake_claude();
    // Something that is not ctxd's gateway listens on the gateway's address.
    let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = squatter.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in squatter.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
        }
    });
    write_ctxd_settings(&world, json!({"gateway": {"listen": addr.to_string()}}));
    assert!(world.ctxd(&["claude", "setup"]).status.success());
    let out = world.claude_in_bash("--version");
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&out_file).unwrap(), "ARGS:[--version]\nBASE:unset\nFIRST:unset\n");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("does not answer as ctxd's gateway") && said.contains("runs without the gateway"), "{said}");
}

fn write_ctxd_settings(world: &World, settings: Value) {
    let dir = world.home().join(".config/ctxd");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("settings.json"), settings.to_string()).unwrap();
}

/// A stand-in for the Messages API: answers every request with a short JSON message
/// and sends each request (head and body) on the channel.
fn stub_upstream() -> (SocketAddr, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let (head, body) = ctxd_e2e::read_http_request(&mut BufReader::new(stream.try_clone().unwrap()));
            let _ = tx.send(format!("{head}\r\n{}", String::from_utf8_lossy(&body)));
            let answer = r#"{"id":"msg_stub","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"text","text":"STUB"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}"#;
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (addr, rx)
}

/// Pids of the processes whose command line names `needle` (the test's own state
/// folder: only what this test started).
fn processes_naming(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).split('\0').any(|arg| arg == needle))
        })
        .collect()
}

#[test]
fn the_wrapper_starts_the_gateway_and_the_program_goes_through_it() {
    let world = World::new();
    let out_file = world.fake_claude();
    let (upstream, requests) = stub_upstream();
    let listen = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    write_ctxd_settings(
        &world,
        json!({"gateway": {"listen": listen.to_string(), "upstream": format!("http://{upstream}")}}),
    );
    let state = world.root.path().join("state");
    let state_arg = state.to_str().unwrap().to_owned();
    assert!(TcpStream::connect(listen).is_err(), "no gateway runs before");

    let out = world.run(&ctxd_e2e::ctxd_bin(), Some(&state), &["claude", "run", "-p", "hello there"], &[]);
    let gateways = processes_naming(&state_arg);
    let result = std::panic::catch_unwind(|| {
        assert_eq!(out.status.code(), Some(7), "{}", text(&out));
        // The program saw the gateway's address, for itself alone; the upstream is a
        // stub, not the Anthropic API, so no first-party claim.
        assert_eq!(
            std::fs::read_to_string(&out_file).unwrap(),
            format!("ARGS:[-p][hello there]\nBASE:http://{listen}\nFIRST:unset\n")
        );
        // Its request went through the gateway to the upstream, key and body unchanged.
        let seen = requests.recv_timeout(Duration::from_secs(60)).unwrap();
        assert!(seen.starts_with("POST /v1/messages HTTP/1.1\r\n"), "{seen}");
        assert!(seen.to_ascii_lowercase().contains("x-api-key: sk-ant-test-setup"), "{seen}");
        assert!(
            seen.ends_with(r#"{"model":"claude-opus-5-5","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#)
        );
        let answer = std::fs::read_to_string(format!("{}.answer", out_file.display())).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200") && answer.contains("STUB"), "{answer}");
        // The gateway keeps running, once, for the next `claude`.
        assert_eq!(gateways.len(), 1, "{gateways:?}");
        let out = world.run(&ctxd_e2e::ctxd_bin(), Some(&state), &["claude", "run", "--version"], &[]);
        assert_eq!(out.status.code(), Some(7), "{}", text(&out));
        assert_eq!(processes_naming(&state_arg), gateways);
        let mut stream = TcpStream::connect(listen).unwrap();
        write!(stream, "GET /ctxd/sessions HTTP/1.0\r\nHost: {listen}\r\n\r\n").unwrap();
        let mut sessions = String::new();
        stream.read_to_string(&mut sessions).unwrap();
        assert!(sessions.starts_with("HTTP/1.1 200") || sessions.starts_with("HTTP/1.0 200"), "{sessions}");
    });
    for pid in processes_naming(&state_arg) {
        let _ = std::process::Command::new("kill").arg(pid.to_string()).status();
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
