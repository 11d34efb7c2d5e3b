//! A session's base context: the memory files (user context) and the git snapshot
//! (system context), memoized and rebuilt only when a watched file changed.
//!
//! Discovery results are shared by every session working in the same directory
//! ([`MemoryCache`]): the first session pays for the reads, the others clone the result.
//! A session keeps its own copy because rules and nested files activate per session, on
//! that session's reads. When the watcher reports a change to a memory source, the
//! session marks its memo dirty and the shared entry is dropped; the next request
//! rebuilds. [`BaseContext::reload`] (after compaction) clears both levels together, so
//! instructions come back from disk, never from a stale outer memo.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use ctxd_core::memory::{self, MemoryConfig, MemorySet, Status};

use super::fs::RealFs;

/// Discovery results shared across sessions, per working directory and configuration.
#[derive(Debug, Default)]
pub struct MemoryCache {
    entries: Mutex<HashMap<(PathBuf, String), Arc<MemorySet>>>,
}

impl MemoryCache {
    fn key(cwd: &Path, config: &MemoryConfig) -> (PathBuf, String) {
        (cwd.to_owned(), format!("{config:?}"))
    }

    /// The discovery for `cwd`, from the cache or from disk.
    pub fn get_or_discover(&self, cwd: &Path, config: &MemoryConfig, fs: &RealFs) -> Arc<MemorySet> {
        let key = MemoryCache::key(cwd, config);
        if let Some(set) = self.entries.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
            return set.clone();
        }
        let set = Arc::new(memory::discover(cwd, config, fs));
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).insert(key, set.clone());
        set
    }

    /// Drops the shared discovery of `cwd` (a memory source changed).
    pub fn invalidate(&self, cwd: &Path) {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).retain(|(dir, _), _| dir != cwd);
    }
}

/// A memory file as a context view lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryFileInfo {
    pub path: PathBuf,
    pub kind: memory::MemoryKind,
    pub tokens: u64,
    pub status: Status,
    /// `paths:` globs of a rule still waiting for a matching read.
    pub rule_paths: Vec<String>,
}

/// One session's base context.
#[derive(Debug)]
pub struct BaseContext {
    cwd: PathBuf,
    config: MemoryConfig,
    memory: MemorySet,
    user_context: Option<Arc<str>>,
    system_context: Option<Arc<str>>,
    /// How much of the memory set's watched paths was handed out by
    /// [`BaseContext::new_watch_targets`].
    watch_mark: usize,
    dirty: bool,
    date: String,
}

impl BaseContext {
    /// Discovers the memory files (or takes them from the shared cache) and captures the
    /// git snapshot. Blocking: run it on a blocking thread.
    pub fn load(cwd: &Path, config: MemoryConfig, cache: &MemoryCache, fs: &RealFs, date: String) -> BaseContext {
        let memory = (*cache.get_or_discover(cwd, &config, fs)).clone();
        let system_context = super::git::capture(cwd).map(|facts| Arc::from(super::git::render(&facts)));
        let mut base = BaseContext {
            cwd: cwd.to_owned(),
            config,
            watch_mark: memory.watch_mark(),
            memory,
            user_context: None,
            system_context,
            dirty: false,
            date,
        };
        base.render();
        base
    }

    fn render(&mut self) {
        let text = memory::render_user_context(&self.memory, &self.date);
        self.user_context = (!text.trim().is_empty()).then(|| Arc::from(text));
    }

    /// The user context (memory files and date): the first message of every request.
    pub fn user_context(&self) -> Option<&Arc<str>> {
        self.user_context.as_ref()
    }

    /// The system context (git snapshot from the session's start).
    pub fn system_context(&self) -> Option<&Arc<str>> {
        self.system_context.as_ref()
    }

    /// Paths the watcher should follow for this session's memory sources.
    pub fn watch_targets(&self) -> Vec<(PathBuf, memory::WatchKind)> {
        self.memory.watched().iter().map(|(p, k)| (p.clone(), *k)).collect()
    }

    /// Paths the watcher should follow that reads added since the last call (or since
    /// the memory files were loaded): what to add to a subscription after a read, where
    /// [`BaseContext::watch_targets`] is the whole set.
    pub fn new_watch_targets(&mut self) -> Vec<(PathBuf, memory::WatchKind)> {
        let added = self.memory.watched_since(self.watch_mark);
        self.watch_mark = self.memory.watch_mark();
        added
    }

    /// Whether a changed path is one of this session's memory sources.
    pub fn is_memory_source(&self, path: &Path) -> bool {
        self.memory.watched().contains_key(path)
            || self.memory.watched().keys().any(|w| path.starts_with(w) && w != path)
    }

    /// A memory source changed: the next request rebuilds.
    pub fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Rebuilds from disk if marked dirty (clearing the shared memo for this directory
    /// too). Returns whether it rebuilt. Blocking.
    /// `reads` are the files the session read since its last compaction, oldest first,
    /// replayed into the fresh discovery so what they activated stays (the caller keeps
    /// them in its ledger; a copy here would cost a path per read for the session's life).
    pub fn rebuild_if_dirty(&mut self, cache: &MemoryCache, fs: &RealFs, reads: &[PathBuf]) -> bool {
        if !self.dirty {
            return false;
        }
        self.rediscover(cache, fs);
        for path in reads {
            self.memory.on_file_read(path, fs);
        }
        self.render();
        true
    }

    /// Post-compact reload: clears the session's memo and the shared one together and
    /// rediscovers from disk, so instructions come back as they are on disk now.
    /// Activations from earlier reads are not replayed: they load again on the next
    /// matching read. Blocking.
    pub fn reload(&mut self, cache: &MemoryCache, fs: &RealFs) {
        self.rediscover(cache, fs);
        self.render();
    }

    fn rediscover(&mut self, cache: &MemoryCache, fs: &RealFs) {
        cache.invalidate(&self.cwd);
        self.memory = (*cache.get_or_discover(&self.cwd, &self.config, fs)).clone();
        // Callers hand the whole new set to the watcher after a reload.
        self.watch_mark = self.memory.watch_mark();
        self.dirty = false;
    }

    /// The agent read `path`: returns the text of memory files that this activates
    /// (rules whose `paths:` match, nested CLAUDE.md below the working directory), to be
    /// given to the model once, where the read happened. Blocking (may read those files).
    pub fn on_file_read(&mut self, path: &Path, fs: &RealFs) -> Option<String> {
        let ids = self.memory.on_file_read(path, fs);
        (!ids.is_empty()).then(|| memory::render_entries(&self.memory, &ids))
    }

    /// The files of the memory set, for a context view.
    pub fn files(&self) -> Vec<MemoryFileInfo> {
        self.memory
            .ordered_ids()
            .into_iter()
            .filter_map(|id| self.memory.entry(id))
            .map(|e| MemoryFileInfo {
                path: e.path.clone(),
                kind: e.kind,
                tokens: memory::entry_tokens(e),
                status: e.status,
                rule_paths: e.rule_paths.clone(),
            })
            .collect()
    }

    /// Problems found while loading memory files.
    pub fn diagnostics(&self) -> Vec<String> {
        self.memory.diagnostics().iter().map(ToString::to_string).collect()
    }

    /// Tokens of the memory files loaded now.
    pub fn memory_tokens(&self) -> u64 {
        self.memory.active().map(memory::entry_tokens).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(home: &Path) -> MemoryConfig {
        MemoryConfig::new(home)
    }

    #[test]
    fn a_second_session_in_the_same_directory_reads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (home, project) = (dir.path().join("home"), dir.path().join("project"));
        std::fs::create_dir_all(&project).unwrap();
        std::fs::write(project.join("CLAUDE.md"), "Use tabs. MARKER-1\n").unwrap();
        let cache = MemoryCache::default();
        let fs = RealFs::new();
        let first = BaseContext::load(&project, config(&home), &cache, &fs, "2026-11-29".into());
        assert!(first.user_context().unwrap().contains("MARKER-1"));
        let reads = fs.reads();
        let lists = fs.lists();
        let second = BaseContext::load(&project, config(&home), &cache, &fs, "2026-11-29".into());
        assert_eq!((fs.reads(), fs.lists()), (reads, lists), "the shared discovery was reused");
        assert_eq!(second.user_context(), first.user_context());
    }

    #[test]
    fn nothing_is_read_until_a_change_and_reload_sees_an_edit() {
        let dir = tempfile::tempdir().unwrap();
        let (home, project) = (dir.path().join("home"), dir.path().join("project"));
        std::fs::create_dir_all(&project).unwrap();
        std::fs::write(project.join("CLAUDE.md"), "version one\n").unwrap();
        let cache = MemoryCache::default();
        let fs = RealFs::new();
        let mut base = BaseContext::load(&project, config(&home), &cache, &fs, "2026-11-29".into());
        let (reads, lists) = (fs.reads(), fs.lists());
        assert!(reads > 0 && lists > 0);
        // What each request does with the base context: rebuild if dirty, take both texts.
        for _ in 0..100 {
            assert!(!base.rebuild_if_dirty(&cache, &fs, &[]));
            assert!(base.user_context().is_some_and(|text| text.contains("version one")));
            assert_eq!(base.system_context(), None);
        }
        assert_eq!((fs.reads(), fs.lists()), (reads, lists), "a clean memo does no reads");
        // Edited before a post-compact reload: the reload sees the edit, through both
        // the session's memo and the shared one.
        std::fs::write(project.join("CLAUDE.md"), "version two\n").unwrap();
        base.reload(&cache, &fs);
        assert!(base.user_context().unwrap().contains("version two"));
        assert!(!base.user_context().unwrap().contains("version one"));
        let other = BaseContext::load(&project, config(&home), &cache, &fs, "2026-11-29".into());
        assert!(other.user_context().unwrap().contains("version two"));
    }

    /// Every kind of source on the real disk, the managed policy file included (the
    /// daemon's is a fixed system path, so this is where a test can place one).
    #[test]
    fn managed_policy_comes_first_and_every_source_follows_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (home, project) = (dir.path().join("home"), dir.path().join("repo/project"));
        let write = |path: &Path, text: &str| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        let managed = dir.path().join("etc/claude-code/CLAUDE.md");
        write(&managed, "MANAGED\n");
        write(&home.join(".claude/CLAUDE.md"), "USER\n");
        write(&dir.path().join("repo/CLAUDE.md"), "REPO\n");
        write(&project.join(".claude/CLAUDE.md"), "PROJECT-DOT\n");
        write(&project.join("AGENTS.md"), "PROJECT-AGENTS\n@notes.md\n");
        write(&project.join("notes.md"), "IMPORTED\n");
        write(&project.join("CLAUDE.local.md"), "LOCAL\n");
        write(&project.join(".claude/rules/style.md"), "RULE\n");
        write(&memory::auto_memory_path(&home, &project), "AUTO\n");
        let mut config = config(&home);
        config.managed_path = Some(managed.clone());
        let fs = RealFs::new();
        let base = BaseContext::load(&project, config, &MemoryCache::default(), &fs, "2026-11-29".into());

        let kinds: Vec<(&str, PathBuf)> = base.files().into_iter().map(|f| (f.kind.label(), f.path)).collect();
        assert_eq!(
            kinds,
            [
                ("managed", managed),
                ("user", home.join(".claude/CLAUDE.md")),
                ("project", dir.path().join("repo/CLAUDE.md")),
                ("project", project.join("AGENTS.md")),
                ("import", project.join("notes.md")),
                ("project", project.join(".claude/CLAUDE.md")),
                ("local", project.join("CLAUDE.local.md")),
                ("rule", project.join(".claude/rules/style.md")),
                ("auto-memory", memory::auto_memory_path(&home, &project)),
            ]
        );
        let text = base.user_context().unwrap();
        let at: Vec<usize> = [
            "MANAGED",
            "USER",
            "REPO",
            "PROJECT-AGENTS",
            "IMPORTED",
            "PROJECT-DOT",
            "LOCAL",
            "RULE",
            "AUTO",
            "Current date: 2026-11-29",
        ]
        .iter()
        .map(|marker| text.find(marker).unwrap_or_else(|| panic!("{marker} missing: {text}")))
        .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?}\n{text}");
        assert!(base.diagnostics().is_empty(), "{:?}", base.diagnostics());
    }

    #[test]
    fn a_read_hands_out_only_the_watch_targets_it_added() {
        let dir = tempfile::tempdir().unwrap();
        let (home, project) = (dir.path().join("home"), dir.path().join("project"));
        std::fs::create_dir_all(project.join("pkg")).unwrap();
        let cache = MemoryCache::default();
        let fs = RealFs::new();
        let mut base = BaseContext::load(&project, config(&home), &cache, &fs, "2026-11-29".into());
        let all = base.watch_targets().len();
        assert_eq!(base.new_watch_targets(), []);
        base.on_file_read(&project.join("pkg/lib.rs"), &fs);
        let added = base.new_watch_targets();
        assert!(added.iter().any(|(p, _)| p == &project.join("pkg/CLAUDE.md")), "{added:?}");
        assert_eq!(base.watch_targets().len(), all + added.len());
        assert_eq!(base.new_watch_targets(), [], "handed out once");
        base.on_file_read(&project.join("pkg/more.rs"), &fs);
        assert_eq!(base.new_watch_targets(), []);
        // After a reload the caller resubscribes the whole set: nothing is left over.
        base.on_file_read(&project.join("other/x.rs"), &fs);
        base.reload(&cache, &fs);
        assert_eq!(base.new_watch_targets(), []);
    }

    #[test]
    fn rules_activate_on_a_matching_read() {
        let dir = tempfile::tempdir().unwrap();
        let (home, project) = (dir.path().join("home"), dir.path().join("project"));
        std::fs::create_dir_all(project.join(".claude/rules")).unwrap();
        std::fs::write(project.join(".claude/rules/rust.md"), "---\npaths: \"**/*.rs\"\n---\nRUST-RULE\n").unwrap();
        let cache = MemoryCache::default();
        let fs = RealFs::new();
        let mut base = BaseContext::load(&project, config(&home), &cache, &fs, "2026-11-29".into());
        assert!(base.files().iter().any(|f| f.status == Status::Pending));
        assert_eq!(base.on_file_read(&project.join("README.md"), &fs), None);
        let activated = base.on_file_read(&project.join("src/main.rs"), &fs).unwrap();
        assert!(activated.contains("RUST-RULE"));
        assert!(base.files().iter().all(|f| f.status == Status::Active));
    }
}
