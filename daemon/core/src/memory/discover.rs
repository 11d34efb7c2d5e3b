//! Finding the memory sources of a working directory, and activating the ones that
//! wait for a read.
//!
//! Discovery reads a fixed, small set of places (the managed file, the user's files,
//! each folder from the root down to the working directory, its rule folders and auto
//! memory), so its cost does not grow with the size of the repository. Folders below
//! the working directory are only looked at when the agent reads a file in them
//! ([`MemorySet::on_file_read`]).

use std::path::{Path, PathBuf};

use super::frontmatter;
use super::glob;
use super::{
    Cut, MemoryConfig, MemoryEntry, MemoryFs, MemoryKind, MemorySet, Problem, Status, WatchKind, normalize, slash_path,
};

/// Placement groups, lowest precedence first. Imports share their root's group.
const SLOT_MANAGED: u8 = 0;
const SLOT_USER: u8 = 1;
const SLOT_PROJECT: u8 = 2;
const SLOT_LOCAL: u8 = 3;
const SLOT_RULE: u8 = 4;
const SLOT_NESTED: u8 = 5;
const SLOT_AUTO_MEMORY: u8 = 6;

/// How deep sub-folders of `.claude/rules` are followed; a symlink loop must end.
const MAX_RULE_DIR_DEPTH: usize = 8;
/// How many folders and rule files the walk of all rules folders visits at most: a
/// symlink to `/` or a fan of links costs a bounded walk, not the disk.
const MAX_RULE_DIRS: usize = 64;
const MAX_RULE_FILES: usize = 256;

/// Finds and loads the memory files for a session started in `cwd` (an absolute path).
/// Never fails: files that cannot be loaded become [`MemorySet::diagnostics`].
pub fn discover(cwd: &Path, config: &MemoryConfig, fs: &dyn MemoryFs) -> MemorySet {
    let mut set = MemorySet {
        cwd: normalize(cwd),
        config: config.clone(),
        entries: Vec::new(),
        diagnostics: Vec::new(),
        watched: Default::default(),
        watch_log: Vec::new(),
        loaded: Default::default(),
        checked_dirs: Default::default(),
        rule_walk: Default::default(),
        next_source: 0,
    };
    let names = config.file_names.clone();

    if let Some(managed) = &config.managed_path {
        set.load_top(fs, &normalize(managed), MemoryKind::Managed, SLOT_MANAGED);
    }
    let user_dir = normalize(&config.home.join(".claude"));
    for name in &names {
        set.load_top(fs, &user_dir.join(name), MemoryKind::User, SLOT_USER);
    }

    // Root first: a folder nearer the working directory is more specific and wins.
    let mut dirs: Vec<PathBuf> = set.cwd.ancestors().map(Path::to_path_buf).collect();
    dirs.retain(|dir| !dir.as_os_str().is_empty());
    dirs.reverse();
    for dir in &dirs {
        for name in &names {
            set.load_top(fs, &dir.join(name), MemoryKind::Project, SLOT_PROJECT);
        }
        for name in &names {
            set.load_top(fs, &dir.join(".claude").join(name), MemoryKind::Project, SLOT_PROJECT);
        }
    }
    for dir in &dirs {
        for name in &config.local_file_names {
            set.load_top(fs, &dir.join(name), MemoryKind::Local, SLOT_LOCAL);
        }
    }
    for dir in &dirs {
        set.load_rule_dir(fs, &dir.join(".claude").join("rules"), 0);
    }
    if config.auto_memory {
        set.load_auto_memory(fs);
    }
    set
}

/// Where auto memory lives for `cwd`: under the user's `.claude/projects`, in the
/// project's folder ([`claude_project_folder`]).
pub fn auto_memory_path(home: &Path, cwd: &Path) -> PathBuf {
    home.join(".claude").join("projects").join(claude_project_folder(cwd)).join("memory").join("MEMORY.md")
}

/// The name Claude Code gives a working directory's folder under `.claude/projects`:
/// the path with every character that is not an ASCII letter or digit turned into `-`.
pub fn claude_project_folder(cwd: &Path) -> String {
    cwd.to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect()
}

/// Outcome of reading one file.
pub(super) enum Read {
    Text(String),
    Missing,
    /// Unreadable or not UTF-8; already reported.
    Failed,
}

/// Cuts `text` to at most `max` characters.
pub(super) fn cap_chars(text: String, max: usize) -> (String, Option<Cut>) {
    match text.char_indices().nth(max) {
        None => (text, None),
        Some((end, _)) => {
            let total_chars = text.chars().count();
            let mut text = text;
            text.truncate(end);
            (text, Some(Cut::FileCap { kept_chars: max, total_chars }))
        }
    }
}

/// Keeps whole lines of auto memory while both the line and the byte limit hold. A
/// first line longer than the byte limit is cut inside, so something always loads.
fn cut_auto_memory(text: String, max_lines: usize, max_bytes: usize) -> (String, Option<Cut>) {
    let total_bytes = text.len();
    let total_lines = text.split_inclusive('\n').count();
    let mut end = 0;
    let mut kept_lines = 0;
    for line in text.split_inclusive('\n') {
        if kept_lines == max_lines || end + line.len() > max_bytes {
            break;
        }
        end += line.len();
        kept_lines += 1;
    }
    if kept_lines == 0 && max_lines > 0 && total_bytes > 0 {
        end = text.floor_char_boundary(max_bytes);
        kept_lines = 1;
    }
    if end >= total_bytes {
        return (text, None);
    }
    let mut text = text;
    text.truncate(end);
    let cut = Cut::AutoMemory { kept_lines, total_lines, kept_bytes: end, total_bytes };
    (text, Some(cut))
}

impl MemorySet {
    /// Tells the set that the agent read `path` (absolute, or relative to the working
    /// directory). Activates conditional rules whose globs match it and loads memory
    /// files in the folders between the working directory and the file. Returns the ids
    /// of the entries that became active (imports included), in placement order.
    ///
    /// New paths may have been looked at: the daemon should refresh its watches from
    /// [`MemorySet::watch_paths`] afterwards.
    pub fn on_file_read(&mut self, path: &Path, fs: &dyn MemoryFs) -> Vec<usize> {
        let path = normalize(&self.cwd.join(path));
        let Ok(rel) = path.strip_prefix(&self.cwd).map(Path::to_path_buf) else {
            return Vec::new();
        };
        let rel_text = slash_path(&rel);
        let mut added = Vec::new();

        for id in 0..self.entries.len() {
            let entry = &self.entries[id];
            if entry.status != Status::Pending || !entry.rule_paths.iter().any(|g| glob::matches(g, &rel_text)) {
                continue;
            }
            if self.loaded.contains(&entry.path) {
                self.entries[id].status = Status::Duplicate;
                continue;
            }
            self.entries[id].status = Status::Active;
            self.loaded.insert(self.entries[id].path.clone());
            added.push(id);
            added.extend(self.load_imports(id, fs));
        }

        let names = self.config.file_names.clone();
        let mut dir = self.cwd.clone();
        for component in rel.parent().into_iter().flat_map(Path::components) {
            dir.push(component);
            // Each folder is looked at once; a later change there comes through the
            // watcher and a rebuild.
            if !self.checked_dirs.insert(dir.clone()) {
                continue;
            }
            for name in &names {
                added.extend(self.load_top(fs, &dir.join(name), MemoryKind::Nested, SLOT_NESTED));
            }
            for name in &names {
                let path = dir.join(".claude").join(name);
                added.extend(self.load_top(fs, &path, MemoryKind::Nested, SLOT_NESTED));
            }
        }

        added.sort_by_key(|&id| self.entries[id].order);
        added
    }

    /// Reads a file, recording the path for watching and any problem as a diagnostic.
    pub(super) fn read_text(&mut self, fs: &dyn MemoryFs, path: &Path) -> Read {
        self.watch(path, WatchKind::File);
        match fs.read(path) {
            Ok(None) => Read::Missing,
            Err(reason) => {
                self.diagnose(path.to_path_buf(), Problem::Unreadable { reason });
                Read::Failed
            }
            Ok(Some(bytes)) => match String::from_utf8(bytes) {
                Ok(text) => match text.strip_prefix('\u{feff}') {
                    Some(rest) => Read::Text(rest.to_owned()),
                    None => Read::Text(text),
                },
                Err(err) => {
                    let valid_up_to = err.utf8_error().valid_up_to();
                    self.diagnose(path.to_path_buf(), Problem::NotUtf8 { valid_up_to });
                    Read::Failed
                }
            },
        }
    }

    fn push_top(&mut self, path: &Path, kind: MemoryKind, slot: u8, content: String) -> usize {
        let (content, cut) = cap_chars(content, self.config.max_file_chars);
        let id = self.entries.len();
        self.entries.push(MemoryEntry {
            path: path.to_path_buf(),
            kind,
            content,
            status: Status::Active,
            cut,
            imported_by: Vec::new(),
            rule_paths: Vec::new(),
            order: (slot, self.next_source, 0),
        });
        self.next_source += 1;
        id
    }

    /// Loads one memory file and its imports if it exists and is not loaded yet.
    /// Returns the ids added.
    fn load_top(&mut self, fs: &dyn MemoryFs, path: &Path, kind: MemoryKind, slot: u8) -> Vec<usize> {
        let path = normalize(path);
        if self.loaded.contains(&path) {
            return Vec::new();
        }
        let Read::Text(text) = self.read_text(fs, &path) else {
            return Vec::new();
        };
        let id = self.push_top(&path, kind, slot, text);
        self.loaded.insert(path);
        let mut added = vec![id];
        added.extend(self.load_imports(id, fs));
        added
    }

    /// Loads the `.md` files of a rules folder and its sub-folders, sorted by path.
    fn load_rule_dir(&mut self, fs: &dyn MemoryFs, dir: &Path, depth: usize) {
        let dir = normalize(dir);
        // Each real folder is walked once: a link back to a folder on the way (`l -> .`)
        // is a loop, reported and skipped.
        let real = fs.real_path(&dir);
        if self.rule_walk.dirs.contains(&real) {
            if depth > 0 {
                self.diagnose(dir, Problem::RuleLoop { real });
            }
            return;
        }
        if !self.rule_walk_room(&dir, 1, 0) {
            return;
        }
        self.rule_walk.dirs.insert(real);
        self.watch(&dir, WatchKind::Dir);
        let mut listing = match fs.list_dir(&dir) {
            Ok(listing) => listing,
            Err(reason) => {
                self.diagnose(dir, Problem::Unlistable { reason });
                return;
            }
        };
        listing.sort_by(|a, b| a.path.cmp(&b.path));
        for entry in listing {
            if entry.is_dir {
                if depth < MAX_RULE_DIR_DEPTH {
                    self.load_rule_dir(fs, &entry.path, depth + 1);
                }
            } else if entry.path.extension().is_some_and(|ext| ext == "md") {
                let real = fs.real_path(&entry.path);
                if self.rule_walk.files.contains(&real) {
                    continue;
                }
                if !self.rule_walk_room(&dir, 0, 1) {
                    return;
                }
                self.rule_walk.files.insert(real);
                self.load_rule(fs, &normalize(&entry.path));
            }
        }
    }

    /// Whether the rules walk may visit `dirs` more folders and `files` more files; the
    /// first time it may not, that is reported at `dir`.
    fn rule_walk_room(&mut self, dir: &Path, dirs: usize, files: usize) -> bool {
        let walk = &self.rule_walk;
        if walk.dirs.len() + dirs <= MAX_RULE_DIRS && walk.files.len() + files <= MAX_RULE_FILES {
            return true;
        }
        if !self.rule_walk.capped {
            self.rule_walk.capped = true;
            self.diagnose(
                dir.to_path_buf(),
                Problem::RuleWalkCapped { max_dirs: MAX_RULE_DIRS, max_files: MAX_RULE_FILES },
            );
        }
        false
    }

    /// A rule without `paths:` is loaded now; one with globs waits, pending, for a read.
    fn load_rule(&mut self, fs: &dyn MemoryFs, path: &Path) {
        if self.loaded.contains(path) {
            return;
        }
        let Read::Text(text) = self.read_text(fs, path) else {
            return;
        };
        let front = frontmatter::parse(&text);
        if front.unclosed {
            self.diagnose(path.to_path_buf(), Problem::UnclosedFrontMatter);
        }
        let globs = front.paths.unwrap_or_default();
        let body = front.body.to_owned();
        let id = self.push_top(path, MemoryKind::Rule, SLOT_RULE, body);
        if globs.is_empty() {
            self.loaded.insert(path.to_path_buf());
            self.load_imports(id, fs);
        } else {
            // Its imports are read when it activates, so a rule that never matches
            // costs one read.
            self.entries[id].status = Status::Pending;
            self.entries[id].rule_paths = globs;
        }
    }

    /// Auto memory is written by the model, so it is cut hard and its `@` text is not
    /// followed: an index file, not a way to pull in more.
    fn load_auto_memory(&mut self, fs: &dyn MemoryFs) {
        let path = normalize(&auto_memory_path(&self.config.home, &self.cwd));
        if self.loaded.contains(&path) {
            return;
        }
        let Read::Text(text) = self.read_text(fs, &path) else {
            return;
        };
        let (content, cut) =
            cut_auto_memory(text, self.config.auto_memory_max_lines, self.config.auto_memory_max_bytes);
        let id = self.push_top(&path, MemoryKind::AutoMemory, SLOT_AUTO_MEMORY, content);
        if let Some(cut) = cut {
            self.entries[id].cut = Some(cut);
        }
        self.loaded.insert(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_memory_path_flattens_the_working_directory() {
        assert_eq!(
            auto_memory_path(Path::new("/home/u"), Path::new("/work/my-app")),
            PathBuf::from("/home/u/.claude/projects/-work-my-app/memory/MEMORY.md")
        );
        // Every character that is not a letter or digit, as Claude Code names it.
        assert_eq!(claude_project_folder(Path::new("/home/u/my.app_1 (copy)")), "-home-u-my-app-1--copy-");
    }

    #[test]
    fn cap_chars_counts_characters_not_bytes() {
        let (text, cut) = cap_chars("ééééé".to_owned(), 3);
        assert_eq!(text, "ééé");
        assert_eq!(cut, Some(Cut::FileCap { kept_chars: 3, total_chars: 5 }));
        assert_eq!(cap_chars("abc".to_owned(), 3), ("abc".to_owned(), None));
    }

    #[test]
    fn auto_memory_cut_keeps_whole_lines_under_both_limits() {
        let text = "aa\nbb\ncc\n".to_owned();
        assert_eq!(cut_auto_memory(text.clone(), 3, 100), (text.clone(), None));
        let (kept, cut) = cut_auto_memory(text.clone(), 2, 100);
        assert_eq!(kept, "aa\nbb\n");
        assert_eq!(cut, Some(Cut::AutoMemory { kept_lines: 2, total_lines: 3, kept_bytes: 6, total_bytes: 9 }));
        // Byte limit falls inside line 2: only line 1 stays.
        let (kept, _) = cut_auto_memory(text, 10, 5);
        assert_eq!(kept, "aa\n");
    }

    #[test]
    fn auto_memory_first_line_over_the_byte_limit_is_cut_inside() {
        let (kept, cut) = cut_auto_memory("éééé".to_owned(), 200, 5);
        assert_eq!(kept, "éé");
        assert!(matches!(cut, Some(Cut::AutoMemory { kept_bytes: 4, total_bytes: 8, .. })));
    }
}
