//! Memory discovery over an in-memory filesystem (`ctxd_core::memory::discover`,
//! `MemorySet::on_file_read`): imports, cycles, depth and budget limits, rules with
//! front matter, nested files, auto memory.
//!
//! Input: the contents of files at a fixed set of places (memory files at each level,
//! rules, plain files that imports may name), small limits, and a list of files the agent
//! reads afterwards.
//!
//! Properties, after discovery and after each read:
//! - no file is in the context twice, and every entry was read from the disk;
//! - an import's chain starts at a memory file that is not an import, never contains the
//!   import itself, and is no longer than the hop limit;
//! - the imports under one memory file add no more than the import budget, and no text
//!   is longer than the per-file cap; an uncut import has the file's text;
//! - a rule waits for a read exactly when its front matter names globs;
//! - discovery is a function of the files (same input, same set) and rendering works.

#![no_main]

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ctxd_core::memory::{self, DirEntry, MemoryConfig, MemoryFs, MemoryKind, MemorySet, Status, frontmatter};
use libfuzzer_sys::fuzz_target;

const CWD: &str = "/w/p";
const HOME: &str = "/home/u";

/// Where the input's files go. Memory files at every level, rules (one in a sub-folder),
/// and plain files for imports to name, some reachable only by `..` or `~`.
const PLACES: &[&str] = &[
    "/home/u/.claude/CLAUDE.md",
    "/CLAUDE.md",
    "/w/CLAUDE.md",
    "/w/p/CLAUDE.md",
    "/w/p/AGENTS.md",
    "/w/p/.claude/CLAUDE.md",
    "/w/p/CLAUDE.local.md",
    "/w/p/.claude/rules/a.md",
    "/w/p/.claude/rules/sub/b.md",
    "/w/.claude/rules/c.md",
    "/w/p/src/CLAUDE.md",
    "/w/p/src/deep/AGENTS.md",
    "/home/u/.claude/projects/-w-p/memory/MEMORY.md",
    "/w/p/a.md",
    "/w/p/b.md",
    "/w/p/docs/c.md",
    "/w/x.md",
    "/home/u/n.md",
    "/etc/m.md",
];

/// Files the agent may read afterwards.
const READS: &[&str] =
    &["src/lib.rs", "src/deep/x.ts", "docs/c.md", "/w/p/a.md", "../x.md", "b.md", "src/api/h.ts", "/etc/m.md"];

#[derive(Default)]
struct MemFs {
    files: BTreeMap<PathBuf, Vec<u8>>,
    unreadable: Option<PathBuf>,
    reads: RefCell<BTreeSet<PathBuf>>,
}

impl MemoryFs for MemFs {
    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, String> {
        self.reads.borrow_mut().insert(path.to_path_buf());
        if self.unreadable.as_deref() == Some(path) {
            return Err("permission denied".to_owned());
        }
        Ok(self.files.get(path).cloned())
    }

    fn list_dir(&self, path: &Path) -> Result<Vec<DirEntry>, String> {
        let mut out = BTreeSet::new();
        for file in self.files.keys() {
            let Ok(rest) = file.strip_prefix(path) else { continue };
            let mut parts = rest.components();
            let (Some(first), more) = (parts.next(), parts.next().is_some()) else { continue };
            out.insert((path.join(first), more));
        }
        Ok(out.into_iter().map(|(path, is_dir)| DirEntry { path, is_dir }).collect())
    }
}

fn text_of(fs: &MemFs, path: &Path) -> Option<String> {
    let bytes = fs.files.get(path)?;
    let text = String::from_utf8(bytes.clone()).ok()?;
    Some(text.strip_prefix('\u{feff}').map(str::to_owned).unwrap_or(text))
}

fn check(set: &MemorySet, fs: &MemFs, config: &MemoryConfig) {
    let entries = set.entries();
    let mut placed = BTreeSet::new();
    let mut import_chars: BTreeMap<&Path, usize> = BTreeMap::new();
    let reads = fs.reads.borrow();
    for entry in entries {
        assert!(reads.contains(&entry.path), "{} was never read", entry.path.display());
        assert!(set.watched().contains_key(&entry.path), "{} is not watched", entry.path.display());
        let chars = entry.content.chars().count();
        assert!(chars <= config.max_file_chars, "{}: {chars} characters", entry.path.display());
        if entry.status == Status::Active {
            assert!(placed.insert(entry.path.clone()), "{} is in the context twice", entry.path.display());
        }
        if entry.kind == MemoryKind::Import {
            let Some(root) = entry.imported_by.first() else {
                panic!("import {} without a chain", entry.path.display());
            };
            assert!(entry.imported_by.len() <= config.max_import_depth, "{:?}", entry.imported_by);
            assert!(!entry.imported_by.contains(&entry.path), "cycle followed: {:?}", entry.imported_by);
            let root_entry = entries.iter().find(|e| &e.path == root && e.kind != MemoryKind::Import);
            assert!(
                root_entry.is_some(),
                "chain of {} starts at {}, not a memory file",
                entry.path.display(),
                root.display()
            );
            *import_chars.entry(root.as_path()).or_default() += chars;
            if entry.cut.is_none() {
                assert_eq!(Some(&entry.content), text_of(fs, &entry.path).as_ref(), "{}", entry.path.display());
            }
        } else {
            assert!(entry.imported_by.is_empty());
        }
        if entry.kind == MemoryKind::Rule {
            // The globs and body are the front matter's; without globs it is active now.
            if let Some(text) = text_of(fs, &entry.path) {
                let front = frontmatter::parse(&text);
                assert_eq!(entry.rule_paths, front.paths.clone().unwrap_or_default(), "{}", entry.path.display());
                if entry.cut.is_none() {
                    assert_eq!(entry.content, front.body);
                }
            }
            if entry.rule_paths.is_empty() {
                assert_eq!(entry.status, Status::Active);
            }
        } else {
            assert!(entry.rule_paths.is_empty());
            assert_eq!(entry.status, Status::Active);
        }
    }
    for (root, chars) in import_chars {
        assert!(chars <= config.max_import_chars, "imports under {} add {chars} characters", root.display());
    }
    let mut ids = set.ordered_ids();
    ids.sort_unstable();
    assert_eq!(ids, (0..entries.len()).collect::<Vec<_>>());
    // Every active entry is rendered, in placement order.
    let rendered = memory::render_user_context(set, "2026-01-01");
    let mut from = 0;
    for entry in set.active() {
        let block = memory::render_entry(entry);
        let Some(at) = rendered[from..].find(&block) else {
            panic!("{} missing from the render, or out of order", entry.path.display());
        };
        from += at + block.len();
    }
}

// Input: segments separated by 0xFF. The first holds the limits and the reads: hop
// limit, file cap (2 bytes), import budget (2 bytes), which place is unreadable (0xFE:
// none), then one byte per read. Each other segment is a file: a byte for its place,
// then its contents.
fuzz_target!(|data: &[u8]| {
    let mut segments = data.split(|b| *b == 0xff);
    let head = segments.next().unwrap_or_default();
    let byte = |i: usize| head.get(i).copied().unwrap_or(0);
    let place = |b: u8| PathBuf::from(PLACES[usize::from(b) % PLACES.len()]);
    let mut fs = MemFs::default();
    for segment in segments {
        if let Some((at, bytes)) = segment.split_first() {
            fs.files.insert(place(*at), bytes.to_vec());
        }
    }
    fs.unreadable = (byte(5) != 0xfe).then(|| place(byte(5)));
    let mut config = MemoryConfig::new(HOME);
    config.max_import_depth = usize::from(byte(0) % 7);
    config.max_file_chars = usize::from(u16::from_le_bytes([byte(1), byte(2)]) % 2000) + 1;
    config.max_import_chars = usize::from(u16::from_le_bytes([byte(3), byte(4)]) % 4000);
    config.managed_path = Some(PathBuf::from("/etc/m.md"));
    let reads = head.get(6..).unwrap_or_default();

    let mut set = memory::discover(Path::new(CWD), &config, &fs);
    check(&set, &fs, &config);
    let again = memory::discover(Path::new(CWD), &config, &fs);
    assert_eq!(again, set, "discovery is not a function of the files");

    for read in reads.iter().take(8) {
        let before: Vec<Status> = set.entries().iter().map(|e| e.status).collect();
        let added = set.on_file_read(Path::new(READS[usize::from(*read) % READS.len()]), &fs);
        for id in &added {
            let Some(entry) = set.entry(*id) else {
                panic!("read returned an unknown id {id}");
            };
            assert_eq!(entry.status, Status::Active);
            assert!(before.get(*id).is_none_or(|s| *s != Status::Active), "id {id} was already active");
        }
        check(&set, &fs, &config);
    }
});
