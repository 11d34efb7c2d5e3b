//! End-to-end harness: the real `ctxd` binary, spawned over real pipes.
//!
//! [`Daemon`] starts the binary with a state directory of the test's choosing, writes
//! LSP frames to its stdin and reads frames from its stdout on a background thread.
//! Tests talk to it with [`Daemon::request`] (waits for the matching response) or raw
//! bytes ([`Daemon::send_raw`]) for the malformed-input cases.

pub mod cache;
pub mod gateway;
pub mod load;
pub mod stub;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail, ensure};
use serde_json::{Value, json};

/// How long a test waits for one answer before failing.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Path of the `ctxd` binary built for this test run (`CTXD_BIN` overrides it).
pub fn ctxd_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("CTXD_BIN") {
        return PathBuf::from(bin);
    }
    // Test executables live in target/<profile>/deps; the binary one level up.
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
    dir.join("ctxd")
}

/// Variables that would send a test's summaries to a real provider: the daemon falls back
/// on them when settings name no key or address. Tests point ctxd only at their local
/// stubs, so every ctxd they start runs without these, whatever the developer's shell has.
pub const PROVIDER_VARS: [&str; 4] = ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL"];

/// A command for the `ctxd` binary ([`ctxd_bin`]) without the [`PROVIDER_VARS`].
pub fn ctxd_command() -> Command {
    let mut command = Command::new(ctxd_bin());
    for var in PROVIDER_VARS {
        command.env_remove(var);
    }
    command
}

/// Keeps the machine's and the user's files out of a `ctxd` command: HOME is `home`
/// (so ~/.claude and ~/.config/ctxd are the test's), Claude Code's directory is
/// ~/.claude, and the managed policy memory file is `home`/managed-policy/CLAUDE.md
/// rather than /etc/claude-code/CLAUDE.md.
pub fn hermetic<'a>(command: &'a mut Command, home: &Path) -> &'a mut Command {
    command
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("CTXD_MANAGED_MEMORY", managed_memory(home))
        .env_remove("CLAUDE_CONFIG_DIR")
}

/// The managed policy memory file of a [`hermetic`] command with HOME `home`.
pub fn managed_memory(home: &Path) -> PathBuf {
    home.join("managed-policy/CLAUDE.md")
}

/// `ctxd serve` on `state_dir` with piped stdio, logging at `log_level` to
/// `<state_dir>.log`, and the machine's and the user's own files kept out
/// ([`hermetic`]): HOME is `<state_dir>.home`. `env` is set last.
pub fn serve_command(state_dir: &Path, log_level: &str, env: &[(&str, &str)]) -> anyhow::Result<Command> {
    let bin = ctxd_bin();
    if !bin.exists() {
        bail!("{} does not exist: build it first (cargo build --bins)", bin.display());
    }
    let home = state_dir.with_extension("home");
    let mut command = ctxd_command();
    hermetic(&mut command, &home)
        .arg("--state-dir")
        .arg(state_dir)
        .arg("--log-file")
        .arg(state_dir.with_extension("log"))
        .arg("serve")
        .env("CTXD_LOG", log_level)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        command.env(k, v);
    }
    Ok(command)
}

/// [`serve_command`] under an address-space limit (`prlimit --as`), for tests of inputs
/// that would make an unbounded daemon take the machine's memory.
pub fn bounded_serve_command(state_dir: &Path, address_space: u64, env: &[(&str, &str)]) -> anyhow::Result<Command> {
    limited_serve_command(state_dir, &[&format!("--as={address_space}")], env)
}

/// [`serve_command`] under `prlimit` with `limits` (`--as=…`, `--nofile=soft:hard`).
pub fn limited_serve_command(state_dir: &Path, limits: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Command> {
    let wrapper: Vec<&str> = std::iter::once("prlimit").chain(limits.iter().copied()).chain(["--"]).collect();
    wrapped_serve_command(state_dir, &wrapper, env)
}

/// [`serve_command`] run by `wrapper` (a program and its arguments, `--` last if it
/// takes one), with the same environment: what it sets, and what it removes (the
/// [`PROVIDER_VARS`] among them) removed from the wrapper's too.
fn wrapped_serve_command(state_dir: &Path, wrapper: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Command> {
    let inner = serve_command(state_dir, "debug", env)?;
    let (program, args) = wrapper.split_first().context("an empty wrapper")?;
    let mut command = Command::new(program);
    command.args(args).arg(inner.get_program()).args(inner.get_args());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    Ok(command)
}

/// Resident and peak memory of process `pid` in kB (`VmRSS`, `VmHWM`).
pub fn memory_kb(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Writes the user's settings for a daemon on `state_dir`, trusting `folder`: its own
/// settings files may then choose the provider, its URL and key variable, and hooks.
pub fn trust_folder(state_dir: &Path, folder: &Path) -> anyhow::Result<()> {
    let folder_of_file = state_dir.with_extension("home").join(".config/ctxd");
    std::fs::create_dir_all(&folder_of_file)?;
    std::fs::write(folder_of_file.join("settings.json"), serde_json::json!({"trustedFolders": [folder]}).to_string())?;
    Ok(())
}

/// The repository root (for fixtures such as `examples/`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The vendored transcripts: `tests/fixtures/transcripts` (see `tests/fixtures/SOURCES.md`).
pub fn transcripts_dir() -> PathBuf {
    repo_root().join("tests/fixtures/transcripts")
}

/// The vendored transcript `name` (a path under `tests/fixtures/transcripts`). Panics when
/// it is not there: a test never passes without its data.
pub fn transcript(name: &str) -> PathBuf {
    let path = transcripts_dir().join(name);
    if !path.is_file() {
        panic!("fixture {} is missing: the checkout is incomplete (see tests/fixtures/SOURCES.md)", path.display());
    }
    path
}

/// A transcript the real Claude Code 2.1.332 wrote (`tests/fixtures/transcripts/
/// claude-code-2.1.332/`). Panics when it is not there.
pub fn claude_code_fixture(name: &str) -> PathBuf {
    transcript(&format!("claude-code-2.1.332/{name}"))
}

/// A Claude Code home under `dir` with one project, `dir/proj`: the real program's
/// transcript (`manual-compact.jsonl`) up to the reply before its own `/compact`, as
/// `<home>/.claude/projects/-proj/<its session id>.jsonl`, each line passed through
/// `edit` and its `cwd` moved to the project. Returns (home, transcript, project).
#[allow(clippy::expect_used)] // test harness: a folder it cannot make or a broken fixture fails the test
pub fn claude_code_home(dir: &Path, edit: impl Fn(&str) -> String) -> (PathBuf, PathBuf, PathBuf) {
    let home = dir.join("home");
    let project = dir.join("proj");
    let folder = home.join(".claude/projects/-proj");
    for made in [&project, &folder] {
        std::fs::create_dir_all(made).expect("a folder of the test's Claude Code home");
    }
    let fixture = std::fs::read_to_string(claude_code_fixture("manual-compact.jsonl")).expect("the fixture");
    let text: String = fixture
        .lines()
        .take(57)
        .map(|line| {
            let mut record: Value = serde_json::from_str(&edit(line)).expect("a fixture line");
            if record.get("cwd").is_some() {
                record["cwd"] = json!(project);
            }
            format!("{record}\n")
        })
        .collect();
    let path = folder.join("b7d55388-c9ad-4169-a8d1-459fc6bdb46f.jsonl");
    std::fs::write(&path, text).expect("the test's transcript");
    (home, path, project)
}

/// `ctxd claude ARGS` against a test's Claude Code home: HOME is `home` (no
/// `CLAUDE_CONFIG_DIR`), the state in `<dir>/cli-state`, the log on stderr.
pub fn claude_command(dir: &Path, home: &Path, args: &[&str]) -> Command {
    let mut command = ctxd_command();
    command
        .arg("--state-dir")
        .arg(dir.join("cli-state"))
        .arg("--log-stderr")
        .arg("claude")
        .args(args)
        .env("HOME", home)
        .env_remove("CLAUDE_CONFIG_DIR");
    command
}

/// A running daemon.
pub struct Daemon {
    child: Child,
    stdin: Option<ChildStdin>,
    messages: Receiver<Value>,
    /// Messages read while waiting for something else (notifications, other replies).
    pub backlog: Vec<Value>,
    next_id: i64,
    pub state_dir: PathBuf,
}

impl Daemon {
    /// Starts `ctxd serve` on `state_dir`, logging to `<state_dir>/test.log`.
    pub fn start(state_dir: &Path) -> anyhow::Result<Daemon> {
        Daemon::start_with(state_dir, &[], &[])
    }

    pub fn start_with(state_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Daemon> {
        let mut command = serve_command(state_dir, "debug", env)?;
        command.args(args);
        Daemon::spawned(state_dir, command)
    }

    fn spawned(state_dir: &Path, mut command: Command) -> anyhow::Result<Daemon> {
        let mut child = command.spawn().with_context(|| format!("spawning {:?}", command.get_program()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let stdin = child.stdin.take();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            while let Ok(Some(body)) = read_frame(&mut reader) {
                let value = serde_json::from_slice(&body).unwrap_or_else(|e| json!({"unparseable": e.to_string()}));
                if tx.send(value).is_err() {
                    break;
                }
            }
        });
        Ok(Daemon { child, stdin, messages: rx, backlog: Vec::new(), next_id: 1, state_dir: state_dir.to_owned() })
    }

    /// Starts `ctxd serve` under an address-space limit (`prlimit --as`), for tests of
    /// inputs that would make an unbounded daemon take the machine's memory.
    pub fn start_bounded(state_dir: &Path, address_space: u64, env: &[(&str, &str)]) -> anyhow::Result<Daemon> {
        Daemon::spawned(state_dir, bounded_serve_command(state_dir, address_space, env)?)
    }

    /// Starts `ctxd serve` under `prlimit` with `limits` (see [`limited_serve_command`]).
    pub fn start_limited(state_dir: &Path, limits: &[&str]) -> anyhow::Result<Daemon> {
        Daemon::spawned(state_dir, limited_serve_command(state_dir, limits, &[])?)
    }

    /// Starts `ctxd serve` in a user namespace of its own where it is root for the files
    /// root owns and nobody for the rest (`unshare --user --map-root-user`): a file of
    /// another owner with mode 000 is then unreadable to it even when the tests run as
    /// root.
    pub fn start_in_user_namespace(state_dir: &Path) -> anyhow::Result<Daemon> {
        Daemon::spawned(
            state_dir,
            wrapped_serve_command(state_dir, &["unshare", "--user", "--map-root-user", "--"], &[])?,
        )
    }

    /// Starts and initializes a daemon.
    pub fn started(state_dir: &Path) -> anyhow::Result<Daemon> {
        let mut daemon = Daemon::start(state_dir)?;
        daemon.initialize()?;
        Ok(daemon)
    }

    pub fn initialize(&mut self) -> anyhow::Result<Value> {
        let result = self.request("initialize", json!({"processId": null, "capabilities": {}}))?;
        self.notify("initialized", json!({}))?;
        Ok(result)
    }

    /// Writes raw bytes to the daemon's stdin.
    pub fn send_raw(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("stdin closed")?;
        stdin.write_all(bytes)?;
        stdin.flush()?;
        Ok(())
    }

    /// Writes one framed message.
    pub fn send(&mut self, message: &Value) -> anyhow::Result<()> {
        self.send_raw(&frame(&serde_json::to_vec(message)?))
    }

    /// Sends a request without waiting; returns its id.
    pub fn send_request(&mut self, method: &str, params: Value) -> anyhow::Result<i64> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        Ok(id)
    }

    pub fn notify(&mut self, method: &str, params: Value) -> anyhow::Result<()> {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    /// The next message from the daemon (backlog first).
    pub fn next_message(&mut self) -> anyhow::Result<Value> {
        if !self.backlog.is_empty() {
            return Ok(self.backlog.remove(0));
        }
        self.messages.recv_timeout(TIMEOUT).map_err(|e| match e {
            RecvTimeoutError::Timeout => anyhow!("no message from ctxd within {TIMEOUT:?}"),
            RecvTimeoutError::Disconnected => anyhow!("ctxd closed its stdout"),
        })
    }

    /// Waits for the response with `id`, keeping everything else in the backlog.
    pub fn response(&mut self, id: i64) -> anyhow::Result<Value> {
        if let Some(i) = self.backlog.iter().position(|m| m["id"] == id && m.get("method").is_none()) {
            return Ok(self.backlog.remove(i));
        }
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let message = self.messages.recv_timeout(left).map_err(|e| anyhow!("waiting for response {id}: {e}"))?;
            if message["id"] == id && message.get("method").is_none() {
                return Ok(message);
            }
            self.backlog.push(message);
        }
    }

    /// Sends a request and returns its `result`, or `Err` with the JSON-RPC error.
    pub fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.send_request(method, params)?;
        let response = self.response(id)?;
        match response.get("error") {
            Some(error) => Err(anyhow!("{method}: {error}")),
            None => Ok(response["result"].clone()),
        }
    }

    /// Sends a request that must fail; returns the error object.
    pub fn request_error(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.send_request(method, params)?;
        let response = self.response(id)?;
        response.get("error").cloned().ok_or_else(|| anyhow!("{method} succeeded: {response}"))
    }

    /// Waits for the next message with `id: null` (an error for a frame the daemon
    /// could not read).
    pub fn null_id_error(&mut self) -> anyhow::Result<Value> {
        if let Some(i) = self.backlog.iter().position(|m| m["id"].is_null() && m.get("error").is_some()) {
            return Ok(self.backlog.remove(i)["error"].clone());
        }
        loop {
            let message = self.messages.recv_timeout(TIMEOUT)?;
            if message["id"].is_null() && message.get("error").is_some() {
                return Ok(message["error"].clone());
            }
            self.backlog.push(message);
        }
    }

    /// Messages read while waiting for an answer and kept: what the daemon sent before
    /// that answer (and has not been taken since).
    pub fn backlog(&self) -> &[Value] {
        &self.backlog
    }

    /// Notifications with `method` received so far (from the backlog and the pipe).
    pub fn drain_notifications(&mut self, method: &str) -> Vec<Value> {
        while let Ok(message) = self.messages.try_recv() {
            self.backlog.push(message);
        }
        let (matching, rest): (Vec<Value>, Vec<Value>) = self.backlog.drain(..).partition(|m| m["method"] == method);
        self.backlog = rest;
        matching.into_iter().map(|m| m["params"].clone()).collect()
    }

    /// Waits for a notification with `method` whose params satisfy `pred`.
    pub fn wait_notification(&mut self, method: &str, pred: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(i) = self.backlog.iter().position(|m| m["method"] == method && pred(&m["params"])) {
                return Ok(self.backlog.remove(i)["params"].clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let message = self.messages.recv_timeout(left).map_err(|e| anyhow!("waiting for {method}: {e}"))?;
            self.backlog.push(message);
        }
    }

    /// The daemon's log file (`<state_dir>.log`, where [`serve_command`] sends it).
    pub fn log_path(&self) -> PathBuf {
        self.state_dir.with_extension("log")
    }

    /// Waits until a whole line of the daemon's log satisfies `pred` and returns it. One
    /// thread writes the log, in the order the lines were logged: once a line is in the
    /// file, so is every line logged before it.
    pub fn wait_log(&self, what: &str, pred: impl Fn(&str) -> bool) -> anyhow::Result<String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
            // A line being written is not read until its end is there.
            let whole = text.rfind('\n').map_or("", |end| &text[..end]);
            if let Some(line) = whole.lines().find(|line| pred(line)) {
                return Ok(line.to_owned());
            }
            if Instant::now() > deadline {
                bail!("no log line for {what} within {TIMEOUT:?}:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Checks that session `id` runs no compaction and that no `ctx/compacted` of it is
    /// among the messages not taken yet; returns its usage. The proof is an answer:
    /// `ctx/usage` is answered by the session's actor after everything the earlier
    /// commands started there, and a session sends its notifications before the answers
    /// that follow them. So a compaction those commands started shows here, as
    /// `level: compacting` while it runs or as a `ctx/compacted` read before this answer.
    pub fn assert_no_compaction(&mut self, id: &str) -> anyhow::Result<Value> {
        let usage = self.request("ctx/usage", json!({"sessionId": id}))?["usage"].clone();
        ensure!(usage["level"].is_string(), "no level in the usage of {id}: {usage}");
        ensure!(usage["level"] != "compacting", "{id} is compacting: {usage}");
        let compacted: Vec<&Value> =
            self.backlog.iter().filter(|m| m["method"] == "ctx/compacted" && m["params"]["sessionId"] == id).collect();
        ensure!(compacted.is_empty(), "{id} compacted: {compacted:?}");
        Ok(usage)
    }

    /// Waits until session `session` has heard of every change made to its files before
    /// the call: writes `marker` (a memory file of the session, which it watches and no
    /// read of the agent's names) and waits for the `ctx/contextChanged` naming it. The
    /// watcher tells a session of its paths once they have all been quiet, in the order
    /// they changed, so an earlier change is in that notification or in one before it.
    /// Returns the session's `ctx/contextChanged` params taken meanwhile, the marker's last.
    pub fn settle_watcher(&mut self, session: &str, marker: &Path) -> anyhow::Result<Vec<Value>> {
        std::fs::write(marker, "Written by the test to know that the watcher caught up.\n")?;
        let want = json!(marker.display().to_string());
        let last = self.wait_notification("ctx/contextChanged", |p| {
            p["sessionId"] == session && p["paths"].as_array().is_some_and(|paths| paths.contains(&want))
        })?;
        let (taken, rest): (Vec<Value>, Vec<Value>) = std::mem::take(&mut self.backlog)
            .into_iter()
            .partition(|m| m["method"] == "ctx/contextChanged" && m["params"]["sessionId"] == session);
        self.backlog = rest;
        Ok(taken.into_iter().map(|m| m["params"].clone()).chain([last]).collect())
    }

    /// `shutdown`, `exit`, and the exit status.
    pub fn stop(mut self) -> anyhow::Result<ExitStatus> {
        self.request("shutdown", Value::Null)?;
        self.notify("exit", Value::Null)?;
        self.stdin.take();
        self.wait()
    }

    /// Waits for the process to end (bounded).
    pub fn wait(&mut self) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                bail!("ctxd did not exit within {TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Closes stdin (the editor went away).
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// SIGKILL, as a crash or an OOM killer would.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Frames a body with a Content-Length header.
pub fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out
}

/// The value of field `name` in a line of the daemon's log (`… name=value …`), quotes
/// left on; `None` if the line has no such field.
pub fn log_field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    line[start..].split_whitespace().next()
}

/// Reads one frame; `None` at the end of the stream.
pub fn read_frame(reader: &mut impl BufRead) -> std::io::Result<Option<Vec<u8>>> {
    let mut length = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let line = line.trim_end();
        if line.is_empty() {
            if length.is_some() {
                break;
            }
            continue;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse::<usize>().ok();
        }
    }
    let mut body = vec![0; length.unwrap_or(0)];
    reader.read_exact(&mut body)?;
    Ok(Some(body))
}

/// What `ctxd statusline` prints for `stdin`, run with `env` set and without the budget
/// overrides of the developer's shell; the test fails if it exits with an error.
pub fn statusline_output(env: &[(&str, &std::ffi::OsStr)], stdin: &str) -> String {
    let mut child = ctxd_command()
        .arg("statusline")
        .env_remove("CLAUDE_CODE_AUTO_COMPACT_WINDOW")
        .env_remove("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", ctxd_bin().display()));
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).unwrap_or_else(|e| panic!("cannot write the input: {e}"));
    }
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("ctxd statusline: {e}"));
    assert!(out.status.success(), "ctxd statusline failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
}

/// One HTTP/1.1 request read from a local mock server's connection: its header lines
/// (request line included, as sent) and its body (by `Content-Length`). A closed or cut
/// connection gives what was read, with the body short.
pub fn read_http_request(reader: &mut impl BufRead) -> (String, Vec<u8>) {
    let mut headers = String::new();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        headers.push_str(&line);
    }
    let mut body = vec![0; length];
    let read = reader.read_exact(&mut body);
    if read.is_err() {
        body.clear();
    }
    (headers, body)
}

/// The first `n` records of the bundled example session (`examples/session.jsonl`).
#[allow(clippy::expect_used)] // a fixture of the repository: unreadable means a broken checkout
pub fn example(n: usize) -> Vec<Value> {
    let text = std::fs::read_to_string(repo_root().join("examples/session.jsonl")).expect("examples/session.jsonl");
    text.lines().take(n).map(|l| serde_json::from_str(l).expect("an example record")).collect()
}

/// Every line of session `id`'s transcript in `state`, parsed.
#[allow(clippy::expect_used)] // test harness: a missing or corrupt transcript fails the test
pub fn records_of(state: &Path, id: &str) -> Vec<Value> {
    let text =
        std::fs::read_to_string(state.join("sessions").join(format!("{id}.jsonl"))).expect("the session's transcript");
    text.lines().map(|l| serde_json::from_str(l).expect("a transcript line")).collect()
}

/// A user record shaped like a Claude Code transcript line.
pub fn user_record(uuid: &str, parent: Option<&str>, text: &str) -> Value {
    json!({
        "parentUuid": parent,
        "isSidechain": false,
        "userType": "external",
        "cwd": "/home/dev/project",
        "sessionId": "test",
        "version": "2.1.0",
        "type": "user",
        "message": {"role": "user", "content": text},
        "uuid": uuid,
        "timestamp": "2026-11-29T10:00:00.000Z",
    })
}

/// An assistant record with usage.
pub fn assistant_record(
    uuid: &str,
    parent: Option<&str>,
    message_id: &str,
    input_tokens: u64,
    output_tokens: u64,
) -> Value {
    json!({
        "parentUuid": parent,
        "isSidechain": false,
        "type": "assistant",
        "message": {
            "id": message_id, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": input_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": output_tokens}
        },
        "uuid": uuid,
        "timestamp": "2026-11-29T10:00:01.000Z",
    })
}

/// The uuids stored in a session's transcript file, in file order.
pub fn stored_uuids(state_dir: &Path, session_id: &str) -> anyhow::Result<Vec<String>> {
    let path = state_dir.join("sessions").join(format!("{session_id}.jsonl"));
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|v| v["uuid"].as_str().map(str::to_owned))
        .collect())
}

/// Copies the directory tree `from` to `to` as a backup would: directories and regular
/// files (a daemon's socket, `ctxd.sock`, is no file to copy).
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (kind, target) = (entry.file_type()?, to.join(entry.file_name()));
        if kind.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// [`claude_code_home`] with the fixture unchanged, and the session's id.
pub fn claude_home(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf, String)> {
    let (home, path, _project) = claude_code_home(dir, str::to_owned);
    Ok((home, path, "b7d55388-c9ad-4169-a8d1-459fc6bdb46f".to_owned()))
}

/// `ctxd claude ARGS` run to its end ([`claude_command`]).
pub fn ctxd_claude(dir: &Path, home: &Path, args: &[&str]) -> std::io::Result<std::process::Output> {
    claude_command(dir, home, args).output()
}

/// Polls `check` every 50 ms until it holds; fails after `secs` (a guard against a hang,
/// not a measurement).
pub fn eventually(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !check() {
        assert!(Instant::now() < end, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
