//! Which transcripts the history may read, and how a session's name finds one.
//!
//! Two roots only: the store's `sessions/` (ctxd's own sessions) and Claude Code's
//! `projects/` folder (`$CLAUDE_CONFIG_DIR/projects`, else `~/.claude/projects`),
//! one level of project folders, `*.jsonl` directly in each. Every candidate's real path
//! (symlinks resolved) must lie under its root's real path, so a link that leads out of
//! a root is refused; names are checked before they touch a path (a session id or a
//! folder is letters, digits, `-` and `_`), so a query or a session name can never name
//! a file. Nothing here is read from the index: its paths are not trusted.

use std::path::{Path, PathBuf};

use crate::process_env::ProcessEnv;

/// Where transcripts are looked for.
#[derive(Debug, Clone, Default)]
pub struct Roots {
    /// `<state dir>/sessions`.
    pub store: Option<PathBuf>,
    /// Claude Code's `projects` folder.
    pub claude: Option<PathBuf>,
}

impl Roots {
    /// The store under `state_dir` and Claude Code's folder as `env` names it.
    pub fn new(state_dir: &Path, env: &ProcessEnv) -> Roots {
        Roots { store: Some(state_dir.join("sessions")), claude: env.claude_projects_dir() }
    }
}

/// Which program wrote a transcript.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A session of ctxd's store.
    Store,
    /// A Claude Code session.
    Claude,
}

/// A transcript the history may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// Names it in the index: `store/<id>` or `claude/<folder>/<id>`.
    pub key: String,
    /// Its real path.
    pub path: PathBuf,
    pub session: String,
    pub origin: Origin,
    /// The Claude Code project folder (for a store session: none until its records
    /// name a working directory; see `History::project_sources`).
    pub project: Option<String>,
}

/// A session id or project folder name: 1 to 255 of `[A-Za-z0-9_-]`, so it is one path
/// component and nothing else.
pub fn plain_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 255 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The real path of a root, when it exists.
fn real_root(root: Option<&Path>) -> Option<PathBuf> {
    std::fs::canonicalize(root?).ok()
}

/// `path`'s real path when it is a regular file under `root` (already real).
fn inside(root: &Path, path: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(path).ok()?;
    (real.starts_with(root) && real.is_file()).then_some(real)
}

impl Roots {
    /// Every transcript in the store.
    pub fn store_sources(&self) -> Vec<Source> {
        let Some(root) = real_root(self.store.as_deref()) else { return Vec::new() };
        let mut found: Vec<Source> =
            jsonl_names(&root).into_iter().filter_map(|id| self.store_source_in(&root, &id)).collect();
        found.sort_by(|a, b| a.key.cmp(&b.key));
        found
    }

    /// The store's session `id`.
    pub fn store_source(&self, id: &str) -> Option<Source> {
        let root = real_root(self.store.as_deref())?;
        self.store_source_in(&root, id)
    }

    fn store_source_in(&self, root: &Path, id: &str) -> Option<Source> {
        if !plain_name(id) {
            return None;
        }
        let path = inside(root, &root.join(format!("{id}.jsonl")))?;
        Some(Source { key: format!("store/{id}"), path, session: id.to_owned(), origin: Origin::Store, project: None })
    }

    /// The Claude Code transcripts of one project folder, newest first.
    pub fn claude_project(&self, folder: &str) -> Vec<Source> {
        let Some(root) = real_root(self.claude.as_deref()) else { return Vec::new() };
        if !plain_name(folder) {
            return Vec::new();
        }
        let mut found: Vec<(std::time::SystemTime, Source)> = jsonl_names(&root.join(folder))
            .into_iter()
            .filter_map(|id| {
                let source = claude_source_in(&root, folder, &id)?;
                let modified = std::fs::metadata(&source.path).and_then(|m| m.modified()).ok()?;
                Some((modified, source))
            })
            .collect();
        found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.key.cmp(&b.1.key)));
        found.into_iter().map(|(_, s)| s).collect()
    }

    /// The Claude Code session `id`, in whichever project folder holds it.
    pub fn claude_session(&self, id: &str) -> Option<Source> {
        let root = real_root(self.claude.as_deref())?;
        if !plain_name(id) {
            return None;
        }
        let mut folders: Vec<String> = std::fs::read_dir(&root)
            .ok()?
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|name| plain_name(name))
            .collect();
        folders.sort();
        folders.iter().find_map(|folder| claude_source_in(&root, folder, id))
    }

    /// Every Claude Code transcript (the benchmark's and a rebuild's whole set).
    pub fn claude_sources(&self) -> Vec<Source> {
        let Some(root) = real_root(self.claude.as_deref()) else { return Vec::new() };
        let Ok(entries) = std::fs::read_dir(&root) else { return Vec::new() };
        let mut folders: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|name| plain_name(name))
            .collect();
        folders.sort();
        folders
            .iter()
            .flat_map(|folder| {
                jsonl_names(&root.join(folder)).into_iter().filter_map(|id| claude_source_in(&root, folder, &id))
            })
            .collect()
    }

    /// The transcript an `observe-…` id names (the daemon's ids for observed files).
    pub fn observed(&self, id: &str) -> Option<Source> {
        self.claude_sources()
            .into_iter()
            .find(|s| crate::session::observe::observe_id(&s.path) == id || self.observed_as_given(s, id))
    }

    /// The id may hash the path as the client gave it (not resolved); the store keeps
    /// the given path too.
    fn observed_as_given(&self, source: &Source, id: &str) -> bool {
        let Some(root) = &self.claude else { return false };
        let Some(folder) = &source.project else { return false };
        let given = root.join(folder).join(format!("{}.jsonl", source.session));
        crate::session::observe::observe_id(&given) == id
    }
}

fn claude_source_in(root: &Path, folder: &str, id: &str) -> Option<Source> {
    if !plain_name(folder) || !plain_name(id) {
        return None;
    }
    let path = inside(root, &root.join(folder).join(format!("{id}.jsonl")))?;
    Some(Source {
        key: format!("claude/{folder}/{id}"),
        path,
        session: id.to_owned(),
        origin: Origin::Claude,
        project: Some(folder.to_owned()),
    })
}

/// Stems of the `*.jsonl` names directly in `dir` that are plain names.
fn jsonl_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".jsonl")).map(str::to_owned))
        .filter(|stem| plain_name(stem))
        .collect();
    names.sort();
    names
}

/// Claude Code's folder name for a working directory.
pub fn project_folder(cwd: &Path) -> String {
    ctxd_core::memory::claude_project_folder(cwd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots(dir: &Path) -> Roots {
        let store = dir.join("state/sessions");
        let claude = dir.join("claude/projects");
        std::fs::create_dir_all(&store).unwrap();
        std::fs::create_dir_all(claude.join("-p")).unwrap();
        Roots { store: Some(store), claude: Some(claude) }
    }

    #[test]
    fn sessions_are_found_by_name_and_never_by_path() {
        let dir = tempfile::tempdir().unwrap();
        let r = roots(dir.path());
        std::fs::write(dir.path().join("state/sessions/s1.jsonl"), "").unwrap();
        std::fs::write(dir.path().join("claude/projects/-p/c1.jsonl"), "").unwrap();
        assert_eq!(r.store_source("s1").unwrap().key, "store/s1");
        let c = r.claude_session("c1").unwrap();
        assert_eq!((c.key.as_str(), c.project.as_deref()), ("claude/-p/c1", Some("-p")));
        assert_eq!(r.claude_project("-p").len(), 1);
        for bad in ["../s1", "s1/../s1", "/etc/passwd", "", ".", "..", "s1.jsonl"] {
            assert!(r.store_source(bad).is_none(), "{bad}");
            assert!(r.claude_session(bad).is_none(), "{bad}");
            assert!(r.claude_project(bad).is_empty(), "{bad}");
        }
    }

    #[test]
    fn links_that_lead_out_of_a_root_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let r = roots(dir.path());
        let outside = dir.path().join("secret.jsonl");
        std::fs::write(&outside, "{}\n").unwrap();
        std::os::unix::fs::symlink(&outside, dir.path().join("claude/projects/-p/leak.jsonl")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.path().join("state/sessions/leak.jsonl")).unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("claude/projects/-out")).unwrap();
        assert!(r.claude_session("leak").is_none());
        assert!(r.store_source("leak").is_none());
        assert!(r.claude_project("-out").is_empty(), "a project folder that leads out");
        assert!(r.claude_sources().is_empty());
        // A link inside the root is followed.
        std::fs::write(dir.path().join("claude/projects/-p/real.jsonl"), "").unwrap();
        std::os::unix::fs::symlink("real.jsonl", dir.path().join("claude/projects/-p/alias.jsonl")).unwrap();
        assert!(r.claude_session("alias").is_some());
    }
}
