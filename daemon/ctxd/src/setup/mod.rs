//! `ctxd claude setup`: Claude Code through ctxd in one command, and back with `--undo`.
//!
//! Three changes, each printed as it is made:
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
//! - the history tools: `ctxd mcp` as the user's MCP server named `ctxd`, added with the
//!   program's own `claude mcp add -s user` (when `claude` is on `PATH` and the user has
//!   no `ctxd` server of their own), so the model can search and read the history in
//!   every project.
//!
//! Every file setup writes is backed up under `<state dir>/claude-setup/` before it
//! changes, with the bytes setup wrote beside it. `--undo` puts each file back byte for
//! byte (its mode too) when it still holds what setup wrote; when the user (or Claude
//! Code) changed it since, only ctxd's part is taken out and the rest kept, and the
//! output says so. Claude Code's own `~/.claude.json`, where the MCP server is kept, is
//! not a file setup writes: the program changes it as it runs, so no byte-for-byte
//! promise can hold for it. There `--undo` runs `claude mcp remove -s user ctxd` when
//! setup added the server and it is still what setup added: the entry is gone, and
//! everything else in that file is as the program left it (`mcp.rs`).
//!
//! `ctxd claude run [args…]` is the same path without a shell function: it makes sure
//! the gateway runs, then replaces itself with the real `claude`.
//!
//! This module holds the plan, the record and the undo; the parts are in
//! `statusline.rs` (the settings member), `shell.rs` (the shell function), `mcp.rs`
//! (the MCP server) and `run.rs` (`ctxd claude env` and `run`).

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::gateway::client;
use crate::process_env::ProcessEnv;

mod mcp;
mod run;
mod shell;
mod statusline;

pub use self::run::{exec_claude, find_claude, gateway_env};
use self::shell::{add_block, default_shell_rc, remove_block};
pub use self::shell::{shell_block, shell_exports, shell_quote};
use self::statusline::{
    STATUS_REFRESH_SECS, settings_env_base_url, status_line_of, status_line_value, undo_status_line,
};
pub use self::statusline::{remove_member, set_member, status_line_command};

/// Folder of the state directory that holds the backups and the record of what changed.
const RECORD_DIR: &str = "claude-setup";
const MANIFEST: &str = "manifest.json";

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
    /// `claude` and its own file, for the MCP server.
    mcp: mcp::Place,
    /// The state directory `ctxd mcp` is given: `None` when it is the one ctxd finds by
    /// itself in this environment.
    mcp_state_dir: Option<PathBuf>,
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
        let mcp_state_dir = (absolute(&env.default_state_dir())? != state_dir).then(|| state_dir.clone());
        Ok(Targets {
            settings: claude_dir.join("settings.json"),
            shell_rc,
            shell_note,
            record_dir: state_dir.join(RECORD_DIR),
            state_dir,
            gateway: client::listen_address(env).0,
            mcp: mcp::Place { claude: find_claude(env), config: env.claude_global_config() },
            mcp_state_dir,
        })
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
    /// The user MCP server setup added through `claude mcp add` (none: it added none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mcp_server: Option<mcp::Server>,
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
    let server = mcp::Server::ctxd_mcp(ctxd, targets.mcp_state_dir.as_deref());
    let (added, line) = mcp::add(&targets.mcp, manifest.mcp_server.take(), &server);
    manifest.mcp_server = added;
    said.push(line);
    if let Some(set) = settings_env_base_url(&new_settings) {
        said.push(format!(
            "note: {} sets env.ANTHROPIC_BASE_URL ({set}), which Claude Code puts before the shell's: its requests \
             go there, not through the gateway (setup leaves that setting to you)",
            targets.settings.display()
        ));
    }
    write_manifest(&targets.record_dir, &manifest)?;
    let server = if manifest.mcp_server.is_some() { " and removes the MCP server it added" } else { "" };
    said.push(format!(
        "backups in {}; `ctxd claude setup --undo` puts every changed file back{server}",
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
pub fn undo(targets: &Targets) -> anyhow::Result<Vec<String>> {
    let record_dir = targets.record_dir.as_path();
    let Some(manifest) = read_manifest(record_dir)? else {
        return Ok(vec![format!("nothing to undo: no record of a setup in {}", record_dir.display())]);
    };
    let mut said = Vec::new();
    // The server first: setup added it last.
    let mut server_left = None;
    if let Some(server) = &manifest.mcp_server {
        match mcp::remove(&targets.mcp, server) {
            Ok(line) => said.push(line),
            Err(why) => {
                said.push(why);
                server_left = Some(server.clone());
            }
        }
    }
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
    if left.is_empty() && server_left.is_none() {
        std::fs::remove_dir_all(record_dir).with_context(|| format!("cannot remove {}", record_dir.display()))?;
    } else {
        write_manifest(record_dir, &Manifest { changes: left, created_dirs: Vec::new(), mcp_server: server_left })?;
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
