//! `ctxd claude setup`: Claude Code through ctxd in one command, and back with `--undo`.
//!
//! Two changes, each printed as it is made:
//!
//! - the status line: `statusLine` in Claude Code's user settings (`settings.json` in
//!   `$CLAUDE_CONFIG_DIR`, else `~/.claude`) runs `ctxd statusline`. Only that member's
//!   text changes; every other byte of the file stays as the user wrote it.
//! - the gateway: a `claude` shell function in the user's shell start-up file
//!   (`~/.bashrc`, `~/.zshrc`) that asks `ctxd claude env` for the gateway's address
//!   (starting the gateway when nothing answers there) and runs the real `claude` with
//!   `ANTHROPIC_BASE_URL` set for that one process. When ctxd is gone, or says nothing
//!   (the gateway cannot be had), the function runs the plain program: `claude` is never
//!   left pointing at a gateway that is not there. Nothing is written to Claude Code's
//!   `env` settings, which every `claude` (an IDE's too) would obey with or without ctxd.
//!
//! Every file is backed up under `<state dir>/claude-setup/` before it changes, with the
//! bytes setup wrote beside it. `--undo` puts each file back byte for byte (its mode
//! too) when it still holds what setup wrote; when the user (or Claude Code) changed it
//! since, only ctxd's part is taken out and the rest kept, and the output says so.
//!
//! `ctxd claude run [args…]` is the same path without a shell function: it makes sure
//! the gateway runs, then replaces itself with the real `claude`.

use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::gateway::client;
use crate::process_env::ProcessEnv;

/// Folder of the state directory that holds the backups and the record of what changed.
const RECORD_DIR: &str = "claude-setup";
const MANIFEST: &str = "manifest.json";
/// The status line's refresh, in seconds: the cache's "cold in 4m" counts down between
/// turns (Claude Code also re-runs the line when its cache expires).
const STATUS_REFRESH_SECS: u64 = 30;
/// Marks the shell function's block.
const BLOCK_START: &str = "# >>> ctxd claude setup >>>";
const BLOCK_END: &str = "# <<< ctxd claude setup <<<";
/// How long `ctxd claude env` waits for a gateway it started to answer.
const GATEWAY_START_WAIT: Duration = Duration::from_secs(5);
/// One probe of the gateway.
const PROBE: Duration = Duration::from_millis(300);

/// The files setup changes.
#[derive(Debug, Clone)]
pub struct Targets {
    /// Claude Code's user settings.
    pub settings: PathBuf,
    /// The shell start-up file for the `claude` function; `None` when none is changed.
    pub shell_rc: Option<PathBuf>,
    /// Why no shell file is changed, to say so.
    pub shell_note: Option<String>,
    /// `<state dir>/claude-setup`.
    pub record_dir: PathBuf,
    /// The state directory the function passes on to `ctxd claude env`.
    pub state_dir: PathBuf,
    /// Where the gateway listens (for the message).
    pub gateway: SocketAddr,
}

impl Targets {
    /// The usual places: Claude Code's directory (`CLAUDE_CONFIG_DIR` honoured), the
    /// start-up file of the user's `$SHELL` (bash, zsh) unless `shell_rc` names one or
    /// `no_shell` asks for none.
    pub fn standard(
        env: &ProcessEnv,
        state_dir: &Path,
        shell_rc: Option<PathBuf>,
        no_shell: bool,
    ) -> anyhow::Result<Targets> {
        let claude_dir = env.claude_config_dir().context("no home directory: set HOME or CLAUDE_CONFIG_DIR")?;
        let state_dir = absolute(state_dir)?;
        let (shell_rc, shell_note) = if no_shell {
            (None, Some("--no-shell: no shell function; run Claude Code as `ctxd claude run`".to_owned()))
        } else if let Some(file) = shell_rc {
            (Some(absolute(&file)?), None)
        } else {
            default_shell_rc(env)
        };
        Ok(Targets {
            settings: claude_dir.join("settings.json"),
            shell_rc,
            shell_note,
            record_dir: state_dir.join(RECORD_DIR),
            state_dir,
            gateway: client::listen_address(env).0,
        })
    }
}

/// The start-up file of the user's shell, or why there is none.
fn default_shell_rc(env: &ProcessEnv) -> (Option<PathBuf>, Option<String>) {
    let shell = env.var("SHELL").unwrap_or_default();
    let name = Path::new(shell).file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let home = env.home();
    match (name, home) {
        ("bash", Some(home)) => (Some(home.join(".bashrc")), None),
        ("zsh", Some(home)) => {
            let dir = env.var("ZDOTDIR").filter(|d| !d.is_empty()).map_or(home, PathBuf::from);
            (Some(dir.join(".zshrc")), None)
        }
        _ => (
            None,
            Some(format!(
                "no shell function for the shell {shell:?} (bash and zsh are set up; --shell-rc FILE names a \
                 file of another POSIX shell): run Claude Code as `ctxd claude run` to go through the gateway"
            )),
        ),
    }
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    Ok(std::env::current_dir().context("the current directory")?.join(path))
}

/// What setup did to one file, kept in the manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Change {
    /// The file as named (`~/.bashrc`, possibly a symlink).
    path: PathBuf,
    /// The file written (the symlink's target).
    real_path: PathBuf,
    /// Whether the file was there before.
    existed: bool,
    /// Its permission bits before.
    mode: u32,
    /// The backup of its bytes before, and of what setup wrote (file names in the
    /// record folder).
    before: String,
    after: String,
    /// Which part is ctxd's: `statusLine` or `shellFunction`.
    part: Part,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Part {
    StatusLine,
    ShellFunction,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    changes: Vec<Change>,
    /// Folders setup created (deepest last), removed by `--undo` when empty.
    created_dirs: Vec<PathBuf>,
}

/// The status-line command for `ctxd` at `ctxd`.
pub fn status_line_command(ctxd: &Path) -> String {
    format!("{} statusline", shell_quote(&ctxd.to_string_lossy()))
}

/// The `statusLine` setting setup writes.
fn status_line_value(ctxd: &Path) -> Value {
    serde_json::json!({"type": "command", "command": status_line_command(ctxd), "refreshInterval": STATUS_REFRESH_SECS})
}

/// The shell function's block, with the line break that ends it.
pub fn shell_block(ctxd: &Path, state_dir: &Path) -> String {
    let ctxd = shell_quote(&ctxd.to_string_lossy());
    let state = shell_quote(&state_dir.to_string_lossy());
    format!(
        "{BLOCK_START}\n\
         # Claude Code through ctxd's gateway while ctxd is installed and the gateway can run;\n\
         # the plain program otherwise. Taken out by `ctxd claude setup --undo`.\n\
         claude() {{\n\
         \x20   local ctxd_env=\n\
         \x20   if [ -x {ctxd} ]; then ctxd_env=\"$({ctxd} --state-dir {state} claude env)\" || ctxd_env=; fi\n\
         \x20   if [ -n \"$ctxd_env\" ]; then\n\
         \x20       (eval \"$ctxd_env\"; exec claude \"$@\")\n\
         \x20   else\n\
         \x20       command claude \"$@\"\n\
         \x20   fi\n\
         }}\n\
         {BLOCK_END}\n"
    )
}

/// `text` in single quotes for a POSIX shell.
pub fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Configures Claude Code for ctxd; returns the lines that say what changed.
pub fn setup(targets: &Targets, ctxd: &Path) -> anyhow::Result<Vec<String>> {
    // Decide both edits before writing anything: a file setup cannot edit safely leaves
    // everything as it is.
    let settings_now = current(&targets.settings)?;
    let wanted = status_line_value(ctxd);
    let settings_text = settings_now.as_deref().unwrap_or("");
    let old_status = status_line_of(settings_text, &targets.settings)?;
    let new_settings = set_member(settings_text, "statusLine", &wanted)
        .with_context(|| format!("{}: cannot add statusLine; left as it is", targets.settings.display()))?;
    let rc_edit = match &targets.shell_rc {
        Some(rc) => {
            let now = current(rc)?;
            let text = now.as_deref().unwrap_or("");
            let block = shell_block(ctxd, &targets.state_dir);
            Some((rc.clone(), now.is_some(), add_block(text, &block)))
        }
        None => None,
    };

    // The state folders this creates go again with `--undo` (when still empty).
    let new_state_dirs = missing_dirs(&targets.record_dir);
    std::fs::create_dir_all(&targets.record_dir)
        .with_context(|| format!("cannot create {}", targets.record_dir.display()))?;
    let mut manifest = read_manifest(&targets.record_dir)?.unwrap_or_default();
    manifest.created_dirs.extend(new_state_dirs.into_iter().filter(|d| *d != targets.record_dir));
    let mut said = Vec::new();

    let unchanged_settings = settings_now.as_deref() == Some(new_settings.as_str());
    if unchanged_settings {
        said.push(format!("{}: statusLine already runs ctxd (unchanged)", targets.settings.display()));
    } else {
        record_and_write(
            targets,
            &mut manifest,
            &targets.settings,
            settings_now.is_some(),
            &new_settings,
            Part::StatusLine,
        )?;
        let was = match old_status {
            Some(old) => format!("was `{old}`, kept in the backup"),
            None => "there was none".to_owned(),
        };
        said.push(format!(
            "{}: statusLine runs `{}` every {STATUS_REFRESH_SECS} s and after each turn ({was})",
            targets.settings.display(),
            status_line_command(ctxd)
        ));
    }
    match rc_edit {
        Some((rc, _, None)) => {
            said.push(format!("{}: the `claude` function is already there (unchanged)", rc.display()))
        }
        Some((rc, existed, Some(text))) => {
            record_and_write(targets, &mut manifest, &rc, existed, &text, Part::ShellFunction)?;
            let addr = targets.gateway;
            said.push(format!(
                "{}: added a `claude` function: Claude Code goes through ctxd's gateway (at {addr}, started when \
                 it is not running) while ctxd is installed, and runs as before when it is not",
                rc.display()
            ));
        }
        None => {}
    }
    if let Some(note) = &targets.shell_note {
        said.push(note.clone());
    }
    if let Some(set) = settings_env_base_url(&new_settings) {
        said.push(format!(
            "note: {} sets env.ANTHROPIC_BASE_URL ({set}), which Claude Code puts before the shell's: its requests \
             go there, not through the gateway (setup leaves that setting to you)",
            targets.settings.display()
        ));
    }
    write_manifest(&targets.record_dir, &manifest)?;
    said.push(format!(
        "backups in {}; `ctxd claude setup --undo` puts every changed file back",
        targets.record_dir.display()
    ));
    Ok(said)
}

/// Most bytes of a file setup edits (settings, a shell start-up file).
const EDITED_FILE: crate::outside::Cap = crate::outside::Cap { bytes: 4 << 20, what: "a file ctxd claude setup edits" };

/// The text of a file setup is about to change (`None`: no file). Read as any file ctxd
/// did not write: a FIFO or a device there is refused, not waited on.
fn current(path: &Path) -> anyhow::Result<Option<String>> {
    match crate::outside::read(path, EDITED_FILE) {
        Ok(bytes) => Ok(Some(
            String::from_utf8(bytes)
                .map_err(|_| anyhow::anyhow!("{} is not UTF-8 text: left as it is", path.display()))?,
        )),
        Err(crate::outside::OutsideError::Missing) => Ok(None),
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    }
}

/// The `statusLine` command there is now (for the message), checking that the file is
/// a JSON object setup can edit.
fn status_line_of(text: &str, path: &Path) -> anyhow::Result<Option<String>> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    let value: Value = serde_json::from_str(text)
        .with_context(|| format!("{} is not plain JSON (comments?): left as it is", path.display()))?;
    let Some(object) = value.as_object() else {
        bail!("{} is not a JSON object: left as it is", path.display());
    };
    Ok(object.get("statusLine").map(|s| match s.get("command").and_then(Value::as_str) {
        Some(command) => command.to_owned(),
        None => s.to_string(),
    }))
}

/// `env.ANTHROPIC_BASE_URL` of Claude Code's settings, if set.
fn settings_env_base_url(text: &str) -> Option<String> {
    let value: Value = serde_json::from_str(text).ok()?;
    value.pointer("/env/ANTHROPIC_BASE_URL").and_then(Value::as_str).map(str::to_owned)
}

/// Backs `path` up (first change only: the bytes before ctxd touched it), writes `text`
/// and records both.
fn record_and_write(
    targets: &Targets,
    manifest: &mut Manifest,
    path: &Path,
    existed: bool,
    text: &str,
    part: Part,
) -> anyhow::Result<()> {
    let real_path = if existed { std::fs::canonicalize(path)? } else { path.to_path_buf() };
    let index = manifest.changes.iter().position(|c| c.path == path);
    let n = index.unwrap_or(manifest.changes.len());
    let (before, after) = (format!("{n}.before"), format!("{n}.after"));
    let mode = if existed { std::fs::metadata(&real_path)?.permissions().mode() & 0o7777 } else { 0o600 };
    // Setup run again over its own change keeps the first backup: `--undo` goes back
    // to before ctxd.
    if index.is_none() {
        let bytes = if existed { std::fs::read(&real_path)? } else { Vec::new() };
        write_private(&targets.record_dir.join(&before), &bytes)?;
    }
    write_private(&targets.record_dir.join(&after), text.as_bytes())?;
    if let Some(parent) = real_path.parent() {
        for dir in missing_dirs(parent) {
            std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            manifest.created_dirs.push(dir);
        }
    }
    write_atomically(&real_path, text.as_bytes(), mode)?;
    let change = Change { path: path.to_path_buf(), real_path, existed, mode, before, after, part };
    match index {
        Some(i) => {
            let first = &manifest.changes[i];
            manifest.changes[i] = Change { existed: first.existed, mode: first.mode, ..change };
        }
        None => manifest.changes.push(change),
    }
    Ok(())
}

/// The folders above `dir` (and `dir`) that do not exist yet, outermost first.
fn missing_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut missing: Vec<PathBuf> = dir.ancestors().take_while(|d| !d.exists()).map(Path::to_path_buf).collect();
    missing.reverse();
    missing
}

/// Writes a file through a temporary one in the same folder, synced, then renamed over
/// it, with `mode`: a crash leaves the old file or the new one, never half of one.
fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let dir = path.parent().context("a file without a folder")?;
    let mut temp =
        tempfile::NamedTempFile::new_in(dir).with_context(|| format!("cannot write in {}", dir.display()))?;
    temp.write_all(bytes)?;
    temp.as_file().sync_all()?;
    temp.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
    temp.persist(path).with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(())
}

/// A file of the record: owner-only.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    write_atomically(path, bytes, 0o600)
}

fn read_manifest(dir: &Path) -> anyhow::Result<Option<Manifest>> {
    match std::fs::read(dir.join(MANIFEST)) {
        Ok(bytes) => Ok(Some(
            serde_json::from_slice(&bytes).with_context(|| format!("{} is damaged", dir.join(MANIFEST).display()))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", dir.join(MANIFEST).display())),
    }
}

fn write_manifest(dir: &Path, manifest: &Manifest) -> anyhow::Result<()> {
    write_private(&dir.join(MANIFEST), &serde_json::to_vec_pretty(manifest)?)
}

/// Puts back what [`setup`] changed; returns the lines that say how.
pub fn undo(record_dir: &Path) -> anyhow::Result<Vec<String>> {
    let Some(manifest) = read_manifest(record_dir)? else {
        return Ok(vec![format!("nothing to undo: no record of a setup in {}", record_dir.display())]);
    };
    let mut said = Vec::new();
    let mut left = Vec::new();
    for change in manifest.changes.iter().rev() {
        match undo_one(record_dir, change) {
            Ok(line) => said.push(line),
            Err(e) => {
                said.push(format!("{}: {e:#}", change.path.display()));
                left.push(change.clone());
            }
        }
    }
    if left.is_empty() {
        std::fs::remove_dir_all(record_dir).with_context(|| format!("cannot remove {}", record_dir.display()))?;
    } else {
        write_manifest(record_dir, &Manifest { changes: left, created_dirs: Vec::new() })?;
        said.push(format!("the record of what is left to undo stays in {}", record_dir.display()));
    }
    // Deepest first, and only while empty: anything put there since is the user's (or
    // the store's).
    let mut created = manifest.created_dirs.clone();
    created.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for dir in created {
        if std::fs::remove_dir(&dir).is_ok() {
            said.push(format!("{}: removed (setup created it)", dir.display()));
        }
    }
    Ok(said)
}

fn undo_one(record_dir: &Path, change: &Change) -> anyhow::Result<String> {
    let before = std::fs::read(record_dir.join(&change.before)).context("the backup is missing")?;
    let after = std::fs::read(record_dir.join(&change.after)).context("the record of the change is missing")?;
    let now = match std::fs::read(&change.real_path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).context("cannot read it"),
    };
    let name = change.path.display();
    match now {
        Some(now) if now == after => {
            if change.existed {
                write_atomically(&change.real_path, &before, change.mode)?;
                Ok(format!("{name}: restored byte for byte"))
            } else {
                std::fs::remove_file(&change.real_path)?;
                Ok(format!("{name}: removed (setup created it)"))
            }
        }
        None => Ok(format!("{name}: gone since setup; left so")),
        Some(now) => {
            // Changed since: take out ctxd's part only.
            let text = String::from_utf8(now).map_err(|_| anyhow::anyhow!("no longer UTF-8 text; left as it is"))?;
            let before_text = String::from_utf8(before).unwrap_or_default();
            let mode = std::fs::metadata(&change.real_path)?.permissions().mode() & 0o7777;
            let restored = match change.part {
                Part::StatusLine => undo_status_line(&text, &before_text)?,
                Part::ShellFunction => remove_block(&text),
            };
            match restored {
                Some(restored) => {
                    write_atomically(&change.real_path, restored.as_bytes(), mode)?;
                    Ok(format!("{name}: changed since setup, so only ctxd's part was taken out and the rest kept"))
                }
                None => Ok(format!("{name}: changed since setup and ctxd's part is no longer in it; left as it is")),
            }
        }
    }
}

/// `text` with `statusLine` as it was in `before` (or without it), if it still runs
/// ctxd; `None` when the user set another since.
fn undo_status_line(text: &str, before: &str) -> anyhow::Result<Option<String>> {
    let value: Value = serde_json::from_str(text).context("no longer plain JSON; left as it is")?;
    let ours = value
        .get("statusLine")
        .and_then(|s| s.get("command"))
        .and_then(Value::as_str)
        .is_some_and(|c| c.ends_with(" statusline") && c.contains("ctxd"));
    if !ours {
        return Ok(None);
    }
    let old = if before.trim().is_empty() {
        None
    } else {
        serde_json::from_str::<Value>(before).ok().and_then(|v| v.get("statusLine").cloned())
    };
    Ok(Some(match old {
        Some(old) => set_member(text, "statusLine", &old)?,
        None => remove_member(text, "statusLine")?,
    }))
}

/// `text` with the shell block in it: appended, or in place of an older one (setup run
/// again from a ctxd installed elsewhere); `None` when it is there already.
fn add_block(text: &str, block: &str) -> Option<String> {
    if text.contains(block) {
        return None;
    }
    if let Some((start, end)) = block_span(text) {
        return Some(format!("{}{block}{}", &text[..start], &text[end..]));
    }
    let mut out = text.to_owned();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(block);
    Some(out)
}

/// Where the one shell block between the markers is (its final line break included);
/// `None` when there is not exactly one.
fn block_span(text: &str) -> Option<(usize, usize)> {
    let start = text.find(BLOCK_START)?;
    if text[start + 1..].contains(BLOCK_START) {
        return None;
    }
    let mut end = start + text[start..].find(BLOCK_END)? + BLOCK_END.len();
    if text[end..].starts_with('\n') {
        end += 1;
    }
    Some((start, end))
}

/// `text` without the one shell block (and the blank line setup put before it); `None`
/// when there is not exactly one.
fn remove_block(text: &str) -> Option<String> {
    let (mut begin, end) = block_span(text)?;
    if text[..begin].ends_with("\n\n") {
        begin -= 1;
    }
    Some(format!("{}{}", &text[..begin], &text[end..]))
}

// --- JSON members, edited in place --------------------------------------------------

/// A member of the top-level object: where its key starts and its value ends.
#[derive(Debug, Clone)]
struct Member {
    key: String,
    key_start: usize,
    value_start: usize,
    value_end: usize,
}

/// The top-level object of a JSON text: its braces and members. The text has been
/// checked to be JSON.
fn object_members(text: &str) -> anyhow::Result<(usize, usize, Vec<Member>)> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        bail!("not a JSON object");
    }
    let open = i;
    i += 1;
    let mut members = Vec::new();
    loop {
        i = skip_ws(b, i);
        match b.get(i) {
            Some(b'}') => return Ok((open, i, members)),
            Some(b',') => i += 1,
            Some(b'"') => {
                let key_start = i;
                let key_end = value_end(b, i)?;
                let key: String = serde_json::from_str(&text[key_start..key_end])?;
                i = skip_ws(b, key_end);
                if b.get(i) != Some(&b':') {
                    bail!("no ':' after a key");
                }
                let value_start = skip_ws(b, i + 1);
                let end = value_end(b, value_start)?;
                members.push(Member { key, key_start, value_start, value_end: end });
                i = end;
            }
            _ => bail!("unexpected text in the object"),
        }
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Where the value starting at `i` ends.
fn value_end(b: &[u8], i: usize) -> anyhow::Result<usize> {
    match b.get(i) {
        Some(b'"') => {
            let mut j = i + 1;
            while let Some(&c) = b.get(j) {
                match c {
                    b'\\' => j += 2,
                    b'"' => return Ok(j + 1),
                    _ => j += 1,
                }
            }
            bail!("a string without its end")
        }
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while let Some(&c) = b.get(j) {
                match c {
                    b'"' => {
                        j = value_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            bail!("an object or array without its end")
        }
        Some(_) => {
            let mut j = i;
            while b.get(j).is_some_and(|c| !matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')) {
                j += 1;
            }
            Ok(j)
        }
        None => bail!("a value is missing"),
    }
}

/// The indentation of the line `at` is on (its leading spaces and tabs).
fn line_indent(text: &str, at: usize) -> &str {
    let line_start = text[..at].rfind('\n').map_or(0, |n| n + 1);
    let line = &text[line_start..at];
    &line[..line.len() - line.trim_start_matches([' ', '\t']).len()]
}

/// `value` as pretty JSON indented by `unit` per level, its later lines shifted by
/// `base`.
fn render(value: &Value, unit: &str, base: &str) -> anyhow::Result<String> {
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(unit.as_bytes());
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
    value.serialize(&mut serializer)?;
    let text = String::from_utf8(out)?;
    Ok(text.replace('\n', &format!("\n{base}")))
}

/// `text` (a JSON object, or empty) with member `key` set to `value`: an existing
/// member's value is replaced where it stands; a new member goes last, laid out like
/// the members before it. Everything else keeps its bytes. The result is checked to be
/// the same JSON with only that member changed.
pub fn set_member(text: &str, key: &str, value: &Value) -> anyhow::Result<String> {
    if text.trim().is_empty() {
        let body = render(&serde_json::json!({ key: value }), "  ", "")?;
        return Ok(format!("{body}\n"));
    }
    let (open, close, members) = object_members(text)?;
    let key_json = serde_json::to_string(key)?;
    let out = if let Some(m) = members.iter().find(|m| m.key == key) {
        let indent = line_indent(text, m.key_start);
        let unit = indent_unit(text, &members);
        let rendered = if text[m.key_start..m.value_end].contains('\n') || text[open..close].contains('\n') {
            render(value, &unit, indent)?
        } else {
            serde_json::to_string(value)?
        };
        format!("{}{rendered}{}", &text[..m.value_start], &text[m.value_end..])
    } else if let Some(last) = members.last() {
        let multiline = text[open..members[0].key_start].contains('\n');
        if multiline {
            let indent = line_indent(text, last.key_start);
            let unit = indent_unit(text, &members);
            let rendered = render(value, &unit, indent)?;
            format!("{},\n{indent}{key_json}: {rendered}{}", &text[..last.value_end], &text[last.value_end..])
        } else {
            let rendered = serde_json::to_string(value)?;
            format!("{}, {key_json}: {rendered}{}", &text[..last.value_end], &text[last.value_end..])
        }
    } else {
        // `{}`, `{ }`, `{\n}`: the object is rewritten, what surrounds it kept.
        let body = render(&serde_json::json!({ key: value }), "  ", line_indent(text, open))?;
        format!("{}{body}{}", &text[..open], &text[close + 1..])
    };
    check_edit(text, &out, key, Some(value))?;
    Ok(out)
}

/// `text` without member `key` (its comma and the layout before it go too).
pub fn remove_member(text: &str, key: &str) -> anyhow::Result<String> {
    let (open, _, members) = object_members(text)?;
    let Some(at) = members.iter().position(|m| m.key == key) else {
        return Ok(text.to_owned());
    };
    let m = &members[at];
    let out = if at > 0 {
        // From the end of the member before it.
        format!("{}{}", &text[..members[at - 1].value_end], &text[m.value_end..])
    } else if let Some(next) = members.get(1) {
        // The first of several: up to the next member's key.
        format!("{}{}", &text[..m.key_start], &text[next.key_start..])
    } else {
        // The only member: the object's inside is emptied (only layout follows it).
        let close = skip_ws(text.as_bytes(), m.value_end);
        format!("{}{}", &text[..open + 1], &text[close..])
    };
    check_edit(text, &out, key, None)?;
    Ok(out)
}

/// The indentation unit of a pretty-printed object: the first member's indentation (a
/// top-level member is one level deep), else two spaces.
fn indent_unit(text: &str, members: &[Member]) -> String {
    members
        .first()
        .map(|m| line_indent(text, m.key_start))
        .filter(|indent| !indent.is_empty())
        .unwrap_or("  ")
        .to_owned()
}

/// The edit changed member `key` (to `value`, or removed it) and nothing else.
fn check_edit(before: &str, after: &str, key: &str, value: Option<&Value>) -> anyhow::Result<()> {
    let mut want: Value = serde_json::from_str(before)?;
    let object = want.as_object_mut().context("not a JSON object")?;
    match value {
        Some(value) => {
            object.insert(key.to_owned(), value.clone());
        }
        None => {
            object.shift_remove(key);
        }
    }
    let got: Value = serde_json::from_str(after).context("the edit did not give JSON")?;
    if got != want {
        bail!("the edit changed more than {key}");
    }
    Ok(())
}

// --- The gateway for one `claude` ----------------------------------------------------

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

/// `export NAME='value'` lines for `eval` in a shell.
pub fn shell_exports(vars: &[(String, String)]) -> String {
    vars.iter().map(|(name, value)| format!("export {name}={}\n", shell_quote(value))).collect()
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

    fn status() -> Value {
        status_line_value(Path::new("/opt/ctxd/bin/ctxd"))
    }

    #[test]
    fn a_member_added_last_in_the_files_own_layout() {
        let text = "{\n    \"model\": \"opus\",\n    \"env\": {\n        \"A\": \"é\\u00e9\"\n    }\n}\n";
        let out = set_member(text, "statusLine", &status()).unwrap();
        assert_eq!(
            out,
            "{\n    \"model\": \"opus\",\n    \"env\": {\n        \"A\": \"é\\u00e9\"\n    },\n    \"statusLine\": {\n        \
             \"type\": \"command\",\n        \"command\": \"'/opt/ctxd/bin/ctxd' statusline\",\n        \"refreshInterval\": 30\n    }\n}\n"
        );
        // One line stays one line.
        let out = set_member("{\"a\": 1}", "statusLine", &serde_json::json!({"x": 1})).unwrap();
        assert_eq!(out, "{\"a\": 1, \"statusLine\": {\"x\":1}}");
    }

    #[test]
    fn a_member_replaced_where_it_stands() {
        let text =
            "{\n  \"statusLine\": {\"type\": \"command\", \"command\": \"~/bin/line.sh\"},\n  \"theme\": \"dark\"\n}";
        let out = set_member(text, "statusLine", &serde_json::json!({"type": "command", "command": "x"})).unwrap();
        assert_eq!(
            out,
            "{\n  \"statusLine\": {\n    \"type\": \"command\",\n    \"command\": \"x\"\n  },\n  \"theme\": \"dark\"\n}"
        );
    }

    #[test]
    fn empty_files_and_objects() {
        assert_eq!(set_member("", "k", &serde_json::json!(1)).unwrap(), "{\n  \"k\": 1\n}\n");
        assert_eq!(set_member("{}\n", "k", &serde_json::json!(1)).unwrap(), "{\n  \"k\": 1\n}\n");
        assert_eq!(set_member("  { \n }", "k", &serde_json::json!(1)).unwrap(), "  {\n    \"k\": 1\n  }");
    }

    #[test]
    fn members_removed_with_their_commas() {
        let three = "{\n  \"a\": 1,\n  \"statusLine\": {\"x\": [1, \"}\"]},\n  \"b\": 2\n}";
        assert_eq!(remove_member(three, "statusLine").unwrap(), "{\n  \"a\": 1,\n  \"b\": 2\n}");
        let first = "{\"statusLine\": 1, \"b\": 2}";
        assert_eq!(remove_member(first, "statusLine").unwrap(), "{\"b\": 2}");
        let last = "{\"a\": 1,\n\"statusLine\": 1\n}";
        assert_eq!(remove_member(last, "statusLine").unwrap(), "{\"a\": 1\n}");
        let only = "{\n  \"statusLine\": 1\n}\n";
        assert_eq!(remove_member(only, "statusLine").unwrap(), "{}\n");
        assert_eq!(remove_member("{\"a\": 1}", "statusLine").unwrap(), "{\"a\": 1}");
    }

    #[test]
    fn strings_with_braces_quotes_and_escapes_do_not_confuse_the_scan() {
        let text = r#"{"a": "}\"{,", "b": [{"c": "]"}], "d": -1.5e3, "e": null}"#;
        let out = set_member(text, "statusLine", &serde_json::json!(true)).unwrap();
        assert_eq!(out, r#"{"a": "}\"{,", "b": [{"c": "]"}], "d": -1.5e3, "e": null, "statusLine": true}"#);
        let (_, _, members) = object_members(text).unwrap();
        assert_eq!(members.iter().map(|m| m.key.as_str()).collect::<Vec<_>>(), ["a", "b", "d", "e"]);
    }

    #[test]
    fn the_shell_block_goes_in_once_and_comes_out_whole() {
        let block = shell_block(Path::new("/u/bin/ctxd"), Path::new("/u/state"));
        let rc = "export PATH=$HOME/bin:$PATH\nalias ll='ls -l'";
        let with = add_block(rc, &block).unwrap();
        assert!(with.starts_with("export PATH=$HOME/bin:$PATH\nalias ll='ls -l'\n\n# >>> ctxd"), "{with}");
        assert_eq!(add_block(&with, &block), None);
        // Set up again from a ctxd installed elsewhere: the block is replaced, not doubled.
        let moved = shell_block(Path::new("/opt/ctxd"), Path::new("/u/state"));
        let again = add_block(&format!("{with}export AFTER=1\n"), &moved).unwrap();
        assert_eq!(again.matches(BLOCK_START).count(), 1);
        assert!(
            again.contains("'/opt/ctxd' --state-dir")
                && again.ends_with("# <<< ctxd claude setup <<<\nexport AFTER=1\n"),
            "{again}"
        );
        // The user added a line after it: the block comes out, their line stays.
        let edited = format!("{with}echo hi\n");
        assert_eq!(remove_block(&edited).unwrap(), "export PATH=$HOME/bin:$PATH\nalias ll='ls -l'\necho hi\n");
        assert_eq!(remove_block(rc), None);
    }

    #[test]
    fn quoting_for_the_shell() {
        assert_eq!(shell_quote("/a b/c"), "'/a b/c'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        let exports = shell_exports(&[("ANTHROPIC_BASE_URL".to_owned(), "http://127.0.0.1:8417".to_owned())]);
        assert_eq!(exports, "export ANTHROPIC_BASE_URL='http://127.0.0.1:8417'\n");
    }

    #[test]
    fn undoing_a_status_line_put_back_or_taken_out() {
        let ours = set_member("{\"a\": 1}", "statusLine", &status()).unwrap();
        // There was none: it goes.
        assert_eq!(undo_status_line(&ours, "{\"a\": 1}").unwrap().unwrap(), "{\"a\": 1}");
        // There was one: it comes back.
        let before = "{\"a\": 1, \"statusLine\": {\"type\": \"command\", \"command\": \"mine\"}}";
        let back = undo_status_line(&ours, before).unwrap().unwrap();
        assert_eq!(serde_json::from_str::<Value>(&back).unwrap(), serde_json::from_str::<Value>(before).unwrap());
        // The user set another since: left alone.
        let theirs = set_member(&ours, "statusLine", &serde_json::json!({"type": "command", "command": "x"})).unwrap();
        assert_eq!(undo_status_line(&theirs, before).unwrap(), None);
    }

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
