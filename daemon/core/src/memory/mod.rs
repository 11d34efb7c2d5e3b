//! Memory files: which instruction files (CLAUDE.md and friends) belong in a session's
//! user context, in what order, and with what text.
//!
//! This module exists so that the rules for finding and loading memory files are pure
//! and testable: it never touches the disk itself. The daemon hands in a [`MemoryFs`]
//! (the real filesystem); tests hand in a map. Everything the loader looked at is
//! returned in the [`MemorySet`], so the daemon can watch exactly those paths and
//! rebuild the user context when one of them changes.
//!
//! Flow:
//! - [`discover()`] finds the sources for a working directory, lowest precedence first:
//!   managed policy, user memory, project files from the filesystem root down to the
//!   working directory, local files, rules in `.claude/rules`, nested files (found later,
//!   on reads) and auto memory. `@path` imports are loaded right after their importer.
//! - [`MemorySet::on_file_read`] activates conditional rules whose `paths:` globs match a
//!   file the agent just read, and finds nested memory files between the working
//!   directory and that file.
//! - [`render_user_context`] turns the active entries into the text the model sees.
//!
//! Sub-modules: `discover` (walk and activation), `imports` (`@path` scanning and
//! loading), `frontmatter` (rule `paths:`), `glob` (matching those paths) and `render`
//! (text and token estimates).

mod discover;
// Public but hidden for the fuzz targets in `fuzz/`, which call the parsers directly.
#[doc(hidden)]
pub mod frontmatter;
#[doc(hidden)]
pub mod glob;
#[doc(hidden)]
pub mod imports;
mod render;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};

pub use discover::{auto_memory_path, claude_project_folder, discover};
pub use render::{
    BYTES_PER_TOKEN, entry_tokens, estimate_tokens, render_entries, render_entry, render_user_context, split_date_line,
};

/// The filesystem as the loader needs it. The daemon implements it over the real disk.
pub trait MemoryFs {
    /// Contents of a file: `Ok(None)` when nothing exists at `path`, `Err(reason)` when
    /// something exists but cannot be read (permissions, a directory, an I/O error).
    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, String>;

    /// Entries of a directory, in any order, each with its full path (`path` joined
    /// with the entry's name): `Ok(vec![])` when the directory does not exist,
    /// `Err(reason)` when it exists but cannot be listed.
    fn list_dir(&self, path: &Path) -> Result<Vec<DirEntry>, String>;

    /// The path with every symlink resolved (as far as it exists), to decide where an
    /// import really leads and to visit each real folder of rules once.
    fn real_path(&self, path: &Path) -> PathBuf {
        path.to_path_buf()
    }
}

/// One entry of a listed directory. The loader needs to know directories apart from
/// files to descend into sub-folders of `.claude/rules` without a second call per entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub path: PathBuf,
    pub is_dir: bool,
}

/// What the loader looks for and how much of it it keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryConfig {
    /// The user's home directory: user memory, `~` in imports and auto memory hang off it.
    pub home: PathBuf,
    /// The managed policy file (e.g. `/etc/claude-code/CLAUDE.md`); platform-specific,
    /// so the caller decides. `None` skips it.
    pub managed_path: Option<PathBuf>,
    /// Names of memory files, looked for in each directory in this order.
    pub file_names: Vec<String>,
    /// Names of private, not checked-in memory files; a separate source with its own
    /// place in the order.
    pub local_file_names: Vec<String>,
    /// How many `@path` hops an import chain may take from a memory file.
    pub max_import_depth: usize,
    /// A single file's text is cut past this many characters.
    pub max_file_chars: usize,
    /// Characters all the imports under one memory file may add together; imports past
    /// it are not loaded. Keeps a fan-out of imports from flooding the context.
    pub max_import_chars: usize,
    /// Folders imports may read from besides the project (the working directory), the
    /// user's `~/.claude` and the folder of the memory file a chain starts from.
    pub import_roots: Vec<PathBuf>,
    /// Whether auto memory (`MEMORY.md`) is loaded.
    pub auto_memory: bool,
    /// Auto memory keeps at most this many lines ...
    pub auto_memory_max_lines: usize,
    /// ... and at most this many bytes, whichever cut is smaller.
    pub auto_memory_max_bytes: usize,
}

impl MemoryConfig {
    /// The defaults: `CLAUDE.md` and `AGENTS.md`, `CLAUDE.local.md`, 5 import hops,
    /// 40,000 characters a file, 100,000 characters of imports per memory file, and auto
    /// memory cut at 200 lines or 25 KB.
    pub fn new(home: impl Into<PathBuf>) -> Self {
        Self {
            home: home.into(),
            managed_path: None,
            file_names: vec!["CLAUDE.md".to_owned(), "AGENTS.md".to_owned()],
            local_file_names: vec!["CLAUDE.local.md".to_owned()],
            max_import_depth: 5,
            max_file_chars: 40_000,
            max_import_chars: 100_000,
            import_roots: Vec::new(),
            auto_memory: true,
            auto_memory_max_lines: 200,
            auto_memory_max_bytes: 25_600,
        }
    }
}

/// Where a memory entry came from. Apart from `Import` (placed right after its importer),
/// the order of the variants is the order of placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum MemoryKind {
    Managed,
    User,
    Project,
    Local,
    Rule,
    Nested,
    AutoMemory,
    Import,
}

impl MemoryKind {
    /// Short lowercase name, used in headers and context views.
    pub fn label(self) -> &'static str {
        match self {
            Self::Managed => "managed",
            Self::User => "user",
            Self::Project => "project",
            Self::Local => "local",
            Self::Rule => "rule",
            Self::Nested => "nested",
            Self::AutoMemory => "auto-memory",
            Self::Import => "import",
        }
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Whether an entry is in the user context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// In the user context.
    Active,
    /// A rule with `paths:` waiting for a matching read.
    Pending,
    /// A rule that matched, but its file was already in the context through another
    /// entry (say, imported by a nested file), so it is not placed twice.
    Duplicate,
}

/// How an entry's text was shortened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cut {
    /// Longer than [`MemoryConfig::max_file_chars`].
    FileCap { kept_chars: usize, total_chars: usize },
    /// An import that ran past what [`MemoryConfig::max_import_chars`] had left.
    ImportBudget { kept_chars: usize, total_chars: usize },
    /// Auto memory past its line or byte limit.
    AutoMemory { kept_lines: usize, total_lines: usize, kept_bytes: usize, total_bytes: usize },
}

/// One loaded (or waiting) memory file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryEntry {
    /// Normalized absolute path.
    pub path: PathBuf,
    pub kind: MemoryKind,
    /// The text the model sees: front matter of rules removed, cut when too long (the
    /// note saying so is added by the renderer from [`MemoryEntry::cut`]).
    pub content: String,
    pub status: Status,
    pub cut: Option<Cut>,
    /// For imports: the chain of files that led here, the top-level memory file first
    /// and the direct importer last. Empty for every other kind.
    pub imported_by: Vec<PathBuf>,
    /// For rules: the `paths:` globs, relative to the working directory. Empty means the
    /// rule is unconditional.
    pub rule_paths: Vec<String>,
    /// Sort key of placement: (source group, top-level sequence, import sequence).
    /// Entries are stored in the order they were found; this puts them in context order.
    order: (u8, u32, u32),
}

/// Something that kept a file out of the context, or cut an import chain short. Never
/// fatal: the rest of the discovery goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub path: PathBuf,
    pub problem: Problem,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The file exists but could not be read.
    Unreadable { reason: String },
    /// The file is not UTF-8; `valid_up_to` is the byte offset of the first bad byte.
    NotUtf8 { valid_up_to: usize },
    /// A directory (of rules) exists but could not be listed.
    Unlistable { reason: String },
    /// An `@path` import names a file that does not exist (yet).
    ImportNotFound { importer: PathBuf },
    /// An import leads back to a file already in its own chain; `chain` runs from the
    /// top-level file to the importer.
    ImportCycle { chain: Vec<PathBuf> },
    /// An import beyond the hop limit; not read.
    ImportTooDeep { chain: Vec<PathBuf>, max_depth: usize },
    /// The imports under one memory file used up their character budget; not read.
    ImportBudgetSpent { importer: PathBuf, budget_chars: usize },
    /// An import leads outside the folders imports may read (or into `/proc`, `/sys` or
    /// `/dev`); not read.
    ImportOutside { importer: PathBuf },
    /// A folder of rules was reached again through a symlink; not walked twice.
    RuleLoop { real: PathBuf },
    /// The walk of a rules folder stopped at its cap of folders or files.
    RuleWalkCapped { max_dirs: usize, max_files: usize },
    /// A rule opens a front matter block and never closes it; the whole file is taken as
    /// text and the rule as unconditional.
    UnclosedFrontMatter,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        match &self.problem {
            Problem::Unreadable { reason } => {
                write!(f, "{path}: not loaded, cannot read: {reason}")
            }
            Problem::NotUtf8 { valid_up_to } => {
                write!(f, "{path}: not loaded, not UTF-8 text (bad byte at offset {valid_up_to})")
            }
            Problem::Unlistable { reason } => write!(f, "{path}: cannot list directory: {reason}"),
            Problem::ImportNotFound { importer } => {
                write!(f, "{path}: imported by {} but does not exist", importer.display())
            }
            Problem::ImportCycle { chain } => {
                write!(f, "{path}: import cycle skipped ({} -> {path})", join_chain(chain))
            }
            Problem::ImportTooDeep { chain, max_depth } => {
                write!(f, "{path}: not imported, more than {max_depth} hops ({} -> {path})", join_chain(chain))
            }
            Problem::ImportBudgetSpent { importer, budget_chars } => write!(
                f,
                "{path}: not imported by {}, imports under one file are limited to {budget_chars} characters",
                importer.display()
            ),
            Problem::ImportOutside { importer } => write!(
                f,
                "{path}: not imported by {}: imports read only from the project, ~/.claude, the importing file's folder and allowed folders, never system folders",
                importer.display()
            ),
            Problem::RuleLoop { real } => {
                write!(f, "{path}: symlink loop skipped (already read as {})", real.display())
            }
            Problem::RuleWalkCapped { max_dirs, max_files } => write!(
                f,
                "{path}: rules walk stopped at {max_dirs} folders or {max_files} files; the rest is not loaded"
            ),
            Problem::UnclosedFrontMatter => {
                write!(f, "{path}: front matter is never closed; read as plain text")
            }
        }
    }
}

fn join_chain(chain: &[PathBuf]) -> String {
    chain.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" -> ")
}

/// What the walk of the rules folders has visited (by real path) and how much.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct RuleWalk {
    dirs: BTreeSet<PathBuf>,
    files: BTreeSet<PathBuf>,
    capped: bool,
}

/// Whether a watched path is a file or a directory the loader listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum WatchKind {
    File,
    Dir,
}

/// The result of discovery: entries, diagnostics, and what to watch. It keeps the
/// working directory and config so later reads can activate rules and nested files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemorySet {
    cwd: PathBuf,
    config: MemoryConfig,
    /// In the order found; indices are stable, placement order comes from `order`.
    entries: Vec<MemoryEntry>,
    diagnostics: Vec<Diagnostic>,
    watched: BTreeMap<PathBuf, WatchKind>,
    /// The keys of `watched` in the order they were added, so a caller can follow only
    /// what a read added ([`MemorySet::watched_since`]).
    watch_log: Vec<PathBuf>,
    /// Paths whose text is already in the context, so no file is placed twice.
    loaded: BTreeSet<PathBuf>,
    /// Real folders of rules walked so far, real rule files read so far, and whether the
    /// walk stopped at its caps.
    rule_walk: RuleWalk,
    /// Folders below the working directory already checked for nested memory files.
    checked_dirs: BTreeSet<PathBuf>,
    /// Next top-level sequence number; nested files found later sort after earlier ones.
    next_source: u32,
}

impl MemorySet {
    /// The working directory the set was discovered for.
    pub fn cwd(&self) -> &Path {
        &self.cwd
    }

    /// Every entry, in the order found (not placement order). Indices into this slice are
    /// the ids that [`MemorySet::on_file_read`] returns; they never change.
    pub fn entries(&self) -> &[MemoryEntry] {
        &self.entries
    }

    /// One entry by id.
    pub fn entry(&self, id: usize) -> Option<&MemoryEntry> {
        self.entries.get(id)
    }

    /// Ids of all entries in placement order (lowest precedence first), whatever their
    /// status.
    pub fn ordered_ids(&self) -> Vec<usize> {
        let mut ids: Vec<usize> = (0..self.entries.len()).collect();
        ids.sort_by_key(|&id| self.entries[id].order);
        ids
    }

    /// Active entries in placement order: what goes into the user context.
    pub fn active(&self) -> impl Iterator<Item = &MemoryEntry> {
        self.ordered_ids().into_iter().map(|id| &self.entries[id]).filter(|entry| entry.status == Status::Active)
    }

    /// Problems met so far, in the order met.
    pub fn diagnostics(&self) -> &[Diagnostic] {
        &self.diagnostics
    }

    /// Every path the loader read, listed or looked for, sorted. Paths that do not exist
    /// yet are included: a memory file created there must trigger a rebuild. The set
    /// grows as [`MemorySet::on_file_read`] checks more folders.
    pub fn watch_paths(&self) -> Vec<PathBuf> {
        self.watched.keys().cloned().collect()
    }

    /// The same paths with whether each is a file or a listed directory.
    pub fn watched(&self) -> &BTreeMap<PathBuf, WatchKind> {
        &self.watched
    }

    /// How many paths [`MemorySet::watched`] has had added so far: a mark for
    /// [`MemorySet::watched_since`].
    pub fn watch_mark(&self) -> usize {
        self.watch_log.len()
    }

    /// The paths added to [`MemorySet::watched`] after `mark`, in the order added, with
    /// their kind. Lets a caller watching many other paths add only these after a read
    /// instead of handing over the whole set again.
    pub fn watched_since(&self, mark: usize) -> Vec<(PathBuf, WatchKind)> {
        self.watch_log
            .get(mark..)
            .unwrap_or_default()
            .iter()
            .filter_map(|path| Some((path.clone(), *self.watched.get(path)?)))
            .collect()
    }

    fn watch(&mut self, path: &Path, kind: WatchKind) {
        if let std::collections::btree_map::Entry::Vacant(slot) = self.watched.entry(path.to_path_buf()) {
            slot.insert(kind);
            self.watch_log.push(path.to_path_buf());
        }
    }
}

/// Resolves `.` and `..` without touching the disk, so the same file reached two ways
/// is recognised as one. `..` at the root stays at the root.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                let above_start = matches!(out.components().next_back(), None | Some(Component::ParentDir));
                if above_start && !out.has_root() {
                    // A relative path climbing past its start keeps its `..`.
                    out.push("..");
                } else {
                    out.pop();
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// A relative path as `/`-separated text, the form globs are written in.
fn slash_path(path: &Path) -> String {
    path.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/")
}
