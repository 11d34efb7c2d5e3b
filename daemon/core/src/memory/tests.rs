//! Behaviour tests of discovery, imports, activation and rendering over an in-memory
//! filesystem, so every rule of the module is checked without a disk.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use expect_test::expect;

use super::*;

/// A filesystem in a map: files by path, plus paths that exist but cannot be read.
/// Folders exist implicitly when a file lies below them. Reads are logged.
#[derive(Default)]
struct MemFs {
    files: HashMap<PathBuf, Vec<u8>>,
    unreadable: HashSet<PathBuf>,
    reads: RefCell<Vec<PathBuf>>,
}

impl MemFs {
    fn new() -> Self {
        Self::default()
    }

    fn file(mut self, path: &str, text: &str) -> Self {
        self.files.insert(PathBuf::from(path), text.as_bytes().to_vec());
        self
    }

    fn bytes(mut self, path: &str, bytes: &[u8]) -> Self {
        self.files.insert(PathBuf::from(path), bytes.to_vec());
        self
    }

    fn unreadable(mut self, path: &str) -> Self {
        self.unreadable.insert(PathBuf::from(path));
        self
    }

    fn was_read(&self, path: &str) -> bool {
        self.read_count(path) > 0
    }

    fn read_count(&self, path: &str) -> usize {
        self.reads.borrow().iter().filter(|p| *p == Path::new(path)).count()
    }
}

impl MemoryFs for MemFs {
    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, String> {
        self.reads.borrow_mut().push(path.to_path_buf());
        if self.unreadable.contains(path) {
            return Err("permission denied".to_owned());
        }
        Ok(self.files.get(path).cloned())
    }

    fn list_dir(&self, path: &Path) -> Result<Vec<DirEntry>, String> {
        if self.unreadable.contains(path) {
            return Err("permission denied".to_owned());
        }
        let mut out = BTreeSet::new();
        for file in self.files.keys() {
            let Ok(rest) = file.strip_prefix(path) else {
                continue;
            };
            let mut parts = rest.components();
            let (Some(first), more) = (parts.next(), parts.next().is_some()) else {
                continue;
            };
            out.insert((path.join(first), more));
        }
        Ok(out.into_iter().map(|(path, is_dir)| DirEntry { path, is_dir }).collect())
    }
}

const CWD: &str = "/work/app";

fn config() -> MemoryConfig {
    MemoryConfig::new("/home/u")
}

fn kinds_and_paths(set: &MemorySet) -> Vec<(MemoryKind, String)> {
    set.active().map(|e| (e.kind, e.path.display().to_string())).collect()
}

fn active_paths(set: &MemorySet) -> Vec<String> {
    set.active().map(|e| e.path.display().to_string()).collect()
}

#[test]
fn sources_are_placed_lowest_precedence_first() {
    let fs = MemFs::new()
        .file("/work/app/.claude/rules/b.md", "rule b")
        .file("/work/app/.claude/rules/a.md", "rule a")
        .file("/work/app/.claude/rules/api/c.md", "rule c")
        .file("/home/u/.claude/projects/-work-app/memory/MEMORY.md", "remembered")
        .file("/work/app/CLAUDE.local.md", "local app")
        .file("/CLAUDE.local.md", "local root")
        .file("/work/app/.claude/CLAUDE.md", "app dot-claude")
        .file("/work/app/CLAUDE.md", "app")
        .file("/work/CLAUDE.md", "work")
        .file("/CLAUDE.md", "root")
        .file("/home/u/.claude/CLAUDE.md", "user")
        .file("/etc/claude-code/CLAUDE.md", "managed");
    let mut cfg = config();
    cfg.managed_path = Some("/etc/claude-code/CLAUDE.md".into());
    let set = discover(Path::new(CWD), &cfg, &fs);
    use MemoryKind::*;
    let expected = [
        (Managed, "/etc/claude-code/CLAUDE.md"),
        (User, "/home/u/.claude/CLAUDE.md"),
        (Project, "/CLAUDE.md"),
        (Project, "/work/CLAUDE.md"),
        (Project, "/work/app/CLAUDE.md"),
        (Project, "/work/app/.claude/CLAUDE.md"),
        (Local, "/CLAUDE.local.md"),
        (Local, "/work/app/CLAUDE.local.md"),
        (Rule, "/work/app/.claude/rules/a.md"),
        (Rule, "/work/app/.claude/rules/api/c.md"),
        (Rule, "/work/app/.claude/rules/b.md"),
        (AutoMemory, "/home/u/.claude/projects/-work-app/memory/MEMORY.md"),
    ];
    let expected: Vec<(MemoryKind, String)> = expected.iter().map(|(k, p)| (*k, (*p).to_owned())).collect();
    assert_eq!(kinds_and_paths(&set), expected);
    assert!(set.diagnostics().is_empty(), "{:?}", set.diagnostics());
}

#[test]
fn rendered_user_context() {
    let fs = MemFs::new()
        .file("/etc/claude-code/CLAUDE.md", "Never push to main.\n")
        .file("/home/u/.claude/CLAUDE.md", "Answer briefly.\n")
        .file("/work/app/CLAUDE.md", "# App\nRun `cargo test`.\nStyle: @docs/style.md\n")
        .file("/work/app/docs/style.md", "Four spaces.\n")
        .file("/work/app/CLAUDE.local.md", "My sandbox is at /tmp/sb.\n")
        .file("/work/app/.claude/rules/ts.md", "---\npaths: \"web/**/*.ts\"\n---\nPrefer `unknown` to `any`.\n")
        .file("/home/u/.claude/projects/-work-app/memory/MEMORY.md", "- tests are slow\n");
    let mut cfg = config();
    cfg.managed_path = Some("/etc/claude-code/CLAUDE.md".into());
    let mut set = discover(Path::new(CWD), &cfg, &fs);
    set.on_file_read(Path::new("web/src/main.ts"), &fs);
    expect![[r#"
        Standing instructions from the user's memory files follow, lowest precedence first: where two of them disagree, the later one applies.

        === /etc/claude-code/CLAUDE.md (managed) ===
        Never push to main.

        === /home/u/.claude/CLAUDE.md (user) ===
        Answer briefly.

        === /work/app/CLAUDE.md (project) ===
        # App
        Run `cargo test`.
        Style: @docs/style.md

        === /work/app/docs/style.md (import via /work/app/CLAUDE.md) ===
        Four spaces.

        === /work/app/CLAUDE.local.md (local) ===
        My sandbox is at /tmp/sb.

        === /work/app/.claude/rules/ts.md (rule for web/**/*.ts) ===
        Prefer `unknown` to `any`.

        === /home/u/.claude/projects/-work-app/memory/MEMORY.md (auto-memory) ===
        - tests are slow

        Current date: 2026-05-04"#]]
    .assert_eq(&render_user_context(&set, "2026-05-04"));
}

#[test]
fn no_memory_files_render_only_the_date() {
    let fs = MemFs::new();
    let set = discover(Path::new(CWD), &config(), &fs);
    assert_eq!(set.active().count(), 0);
    expect![["Current date: 2026-01-02"]].assert_eq(&render_user_context(&set, "2026-01-02"));
}

#[test]
fn imports_resolve_relative_home_and_absolute_paths_in_order() {
    let fs = MemFs::new()
        .file("/work/app/CLAUDE.md", "@docs/a.md\nthen @~/shared.md and @/opt/team.md\n")
        .file("/work/app/docs/a.md", "see @../b.md\n")
        .file("/work/app/b.md", "b")
        .file("/home/u/shared.md", "shared")
        .file("/opt/team.md", "team");
    let config = MemoryConfig { import_roots: vec!["/home/u".into(), "/opt".into()], ..config() };
    let set = discover(Path::new(CWD), &config, &fs);
    assert_eq!(
        active_paths(&set),
        ["/work/app/CLAUDE.md", "/work/app/docs/a.md", "/work/app/b.md", "/home/u/shared.md", "/opt/team.md"]
    );
    let b = set.active().find(|e| e.path == Path::new("/work/app/b.md")).map(|e| e.imported_by.clone());
    assert_eq!(b, Some(vec![PathBuf::from("/work/app/CLAUDE.md"), PathBuf::from("/work/app/docs/a.md")]));
    assert!(set.active().skip(1).all(|e| e.kind == MemoryKind::Import));
}

#[test]
fn import_chain_stops_after_five_hops() {
    let mut fs = MemFs::new().file("/work/app/CLAUDE.md", "@i1.md");
    for i in 1..=6 {
        fs = fs.file(&format!("/work/app/i{i}.md"), &format!("hop {i} @i{}.md", i + 1));
    }
    let set = discover(Path::new(CWD), &config(), &fs);
    let imported: Vec<String> =
        set.active().filter(|e| e.kind == MemoryKind::Import).map(|e| e.path.display().to_string()).collect();
    assert_eq!(
        imported,
        ["/work/app/i1.md", "/work/app/i2.md", "/work/app/i3.md", "/work/app/i4.md", "/work/app/i5.md"]
    );
    assert!(!fs.was_read("/work/app/i6.md"));
    let too_deep: Vec<&Diagnostic> =
        set.diagnostics().iter().filter(|d| matches!(d.problem, Problem::ImportTooDeep { max_depth: 5, .. })).collect();
    assert_eq!(too_deep.len(), 1);
    assert_eq!(too_deep[0].path, Path::new("/work/app/i6.md"));
}

#[test]
fn import_cycle_is_reported_and_not_followed() {
    let fs = MemFs::new()
        .file("/work/app/CLAUDE.md", "@a.md")
        .file("/work/app/a.md", "@b.md")
        .file("/work/app/b.md", "@a.md @c.md @CLAUDE.md")
        .file("/work/app/c.md", "c");
    let set = discover(Path::new(CWD), &config(), &fs);
    assert_eq!(active_paths(&set), ["/work/app/CLAUDE.md", "/work/app/a.md", "/work/app/b.md", "/work/app/c.md"]);
    let cycles: Vec<String> = set
        .diagnostics()
        .iter()
        .filter(|d| matches!(d.problem, Problem::ImportCycle { .. }))
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        cycles,
        [
            "/work/app/a.md: import cycle skipped (/work/app/CLAUDE.md -> /work/app/a.md -> /work/app/b.md -> /work/app/a.md)",
            "/work/app/CLAUDE.md: import cycle skipped (/work/app/CLAUDE.md -> /work/app/a.md -> /work/app/b.md -> /work/app/CLAUDE.md)",
        ]
    );
}

#[test]
fn imports_in_code_spans_and_fences_are_not_loaded() {
    let fs = MemFs::new()
        .file(
            "/work/app/CLAUDE.md",
            "Use `@span.md` here.\n```\n@fenced.md\n```\n~~~\n@tilde.md\n~~~\nMail me at me@mail.md\n@real.md\n",
        )
        .file("/work/app/span.md", "x")
        .file("/work/app/fenced.md", "x")
        .file("/work/app/tilde.md", "x")
        .file("/work/app/real.md", "real");
    let set = discover(Path::new(CWD), &config(), &fs);
    assert_eq!(active_paths(&set), ["/work/app/CLAUDE.md", "/work/app/real.md"]);
    for path in ["/work/app/span.md", "/work/app/fenced.md", "/work/app/tilde.md", "/work/app/mail.md"] {
        assert!(!fs.was_read(path), "{path} was read");
    }
}

#[test]
fn rule_with_paths_activates_only_on_a_matching_read() {
    let fs = MemFs::new()
        .file(
            "/work/app/.claude/rules/api.md",
            "---\npaths:\n  - \"src/api/**/*.rs\"\n  - docs/api.md\n---\nAPI rule @../../docs/api-extra.md\n",
        )
        .file("/work/app/docs/api-extra.md", "extra")
        .file("/work/app/.claude/rules/always.md", "---\ntitle: x\n---\nalways on");
    let mut set = discover(Path::new(CWD), &config(), &fs);
    assert_eq!(active_paths(&set), ["/work/app/.claude/rules/always.md"]);
    assert!(!render_user_context(&set, "d").contains("API rule"));
    // The pending rule's own import is not read until the rule applies.
    assert!(!fs.was_read("/work/app/docs/api-extra.md"));

    assert!(set.on_file_read(Path::new("/work/app/src/main.rs"), &fs).is_empty());
    assert!(set.on_file_read(Path::new("/elsewhere/src/api/x.rs"), &fs).is_empty());
    let rule = set.entries().iter().position(|e| e.path.ends_with("api.md")).unwrap_or(usize::MAX);
    assert_eq!(set.entry(rule).map(|e| e.status), Some(Status::Pending));

    let added = set.on_file_read(Path::new("/work/app/src/api/v1/users.rs"), &fs);
    let added_paths: Vec<String> =
        added.iter().filter_map(|&id| set.entry(id)).map(|e| e.path.display().to_string()).collect();
    assert_eq!(added_paths, ["/work/app/.claude/rules/api.md", "/work/app/docs/api-extra.md"]);
    assert_eq!(set.entry(rule).map(|e| e.status), Some(Status::Active));
    // Front matter is not part of what the model sees.
    assert_eq!(set.entry(rule).map(|e| e.content.as_str()), Some("API rule @../../docs/api-extra.md\n"));
    assert_eq!(
        active_paths(&set),
        ["/work/app/.claude/rules/always.md", "/work/app/.claude/rules/api.md", "/work/app/docs/api-extra.md"]
    );
    assert!(set.on_file_read(Path::new("src/api/other.rs"), &fs).is_empty(), "activates once");
}

#[test]
fn rule_with_single_string_path_activates_on_relative_read() {
    let fs = MemFs::new().file("/work/app/.claude/rules/md.md", "---\npaths: '*.md'\n---\nWrap at 80.");
    let mut set = discover(Path::new(CWD), &config(), &fs);
    assert_eq!(set.active().count(), 0);
    assert!(set.on_file_read(Path::new("notes.txt"), &fs).is_empty());
    let added = set.on_file_read(Path::new("docs/guide/intro.md"), &fs);
    assert_eq!(added.len(), 1);
    expect![[r#"
        === /work/app/.claude/rules/md.md (rule for *.md) ===
        Wrap at 80."#]]
    .assert_eq(&render_entries(&set, &added));
}

#[test]
fn nested_memory_loads_on_a_read_below_it_without_a_tree_walk() {
    let fs = MemFs::new()
        .file("/work/app/CLAUDE.md", "top")
        .file("/work/app/src/CLAUDE.md", "src rules")
        .file("/work/app/src/net/AGENTS.md", "net rules @proto.md")
        .file("/work/app/src/net/proto.md", "proto")
        .file("/work/app/lib/CLAUDE.md", "lib rules");
    let mut set = discover(Path::new(CWD), &config(), &fs);
    assert_eq!(active_paths(&set), ["/work/app/CLAUDE.md"]);
    assert!(!fs.was_read("/work/app/src/CLAUDE.md"), "discovery must not look below cwd");

    // A file directly in the working directory adds nothing.
    assert!(set.on_file_read(Path::new("/work/app/README.md"), &fs).is_empty());
    let added = set.on_file_read(Path::new("/work/app/src/net/tcp/conn.rs"), &fs);
    let added_paths: Vec<String> =
        added.iter().filter_map(|&id| set.entry(id)).map(|e| e.path.display().to_string()).collect();
    assert_eq!(added_paths, ["/work/app/src/CLAUDE.md", "/work/app/src/net/AGENTS.md", "/work/app/src/net/proto.md"]);
    let added_kinds: Vec<MemoryKind> = added.iter().filter_map(|&id| set.entry(id)).map(|e| e.kind).collect();
    assert_eq!(added_kinds, [MemoryKind::Nested, MemoryKind::Nested, MemoryKind::Import]);
    assert!(!fs.was_read("/work/app/lib/CLAUDE.md"));
    // Checked folders become watched, including where a file could still appear.
    let watch = set.watch_paths();
    assert!(watch.contains(&PathBuf::from("/work/app/src/net/tcp/CLAUDE.md")));
    assert!(watch.contains(&PathBuf::from("/work/app/src/.claude/CLAUDE.md")));
    // Reading there again neither loads twice nor looks at the folder again.
    assert!(set.on_file_read(Path::new("/work/app/src/x.rs"), &fs).is_empty());
    assert_eq!(fs.read_count("/work/app/src/.claude/CLAUDE.md"), 1);
    // The project file found at discovery stays first.
    let top = set.active().next().map(|e| e.kind);
    assert_eq!(top, Some(MemoryKind::Project));
}

#[test]
fn nested_memory_sorts_between_rules_and_auto_memory() {
    let fs = MemFs::new()
        .file("/work/app/.claude/rules/r.md", "rule")
        .file("/work/app/sub/CLAUDE.md", "nested")
        .file("/home/u/.claude/projects/-work-app/memory/MEMORY.md", "auto");
    let mut set = discover(Path::new(CWD), &config(), &fs);
    set.on_file_read(Path::new("sub/file.rs"), &fs);
    let kinds: Vec<MemoryKind> = set.active().map(|e| e.kind).collect();
    assert_eq!(kinds, [MemoryKind::Rule, MemoryKind::Nested, MemoryKind::AutoMemory]);
}

fn memory_md(lines: usize, width: usize) -> String {
    (0..lines).map(|i| format!("{:0width$}\n", i, width = width - 1)).collect()
}

const MEMORY_MD: &str = "/home/u/.claude/projects/-work-app/memory/MEMORY.md";

#[test]
fn auto_memory_is_cut_at_200_lines_with_a_note() {
    let fs = MemFs::new().file(MEMORY_MD, &memory_md(300, 10));
    let set = discover(Path::new(CWD), &config(), &fs);
    let entry = set.active().next().cloned();
    let Some(entry) = entry else { panic!("MEMORY.md not loaded") };
    assert_eq!(entry.content.lines().count(), 200);
    assert_eq!(entry.content.lines().last(), Some("000000199"));
    expect![["[Cut: only lines 1-200 (2000 bytes) of 300 lines (3000 bytes) are shown. Keep this file short and move details into separate files.]"]]
        .assert_eq(render_entry(&entry).lines().last().unwrap_or_default());
}

#[test]
fn auto_memory_is_cut_at_25_kb_when_that_comes_first() {
    // 100 lines of 300 bytes: under 200 lines, over 25,600 bytes.
    let fs = MemFs::new().file(MEMORY_MD, &memory_md(100, 300));
    let set = discover(Path::new(CWD), &config(), &fs);
    let Some(entry) = set.active().next() else { panic!("MEMORY.md not loaded") };
    assert_eq!(entry.content.len(), 85 * 300);
    assert!(entry.content.len() <= 25_600);
    assert_eq!(
        entry.cut,
        Some(Cut::AutoMemory { kept_lines: 85, total_lines: 100, kept_bytes: 25_500, total_bytes: 30_000 })
    );
    assert!(render_entry(entry).ends_with("are shown. Keep this file short and move details into separate files.]"));
}

#[test]
fn auto_memory_imports_are_not_followed() {
    let fs = MemFs::new().file(MEMORY_MD, "@/secret.md\n").file("/secret.md", "x");
    let set = discover(Path::new(CWD), &config(), &fs);
    assert_eq!(set.active().count(), 1);
    assert!(!fs.was_read("/secret.md"));
}

#[test]
fn agents_md_is_accepted_and_names_are_configurable() {
    let fs = MemFs::new().file("/work/app/AGENTS.md", "agents").file("/work/app/CLAUDE.md", "claude");
    let set = discover(Path::new(CWD), &config(), &fs);
    assert_eq!(active_paths(&set), ["/work/app/CLAUDE.md", "/work/app/AGENTS.md"]);

    let mut only_agents = config();
    only_agents.file_names = vec!["AGENTS.md".to_owned()];
    let set = discover(Path::new(CWD), &only_agents, &fs);
    assert_eq!(active_paths(&set), ["/work/app/AGENTS.md"]);
}

#[test]
fn unreadable_and_non_utf8_files_become_diagnostics_while_the_rest_loads() {
    let fs = MemFs::new()
        .bytes("/work/CLAUDE.md", b"ok\xff\xfe")
        .file("/work/app/CLAUDE.md", "fine @broken.md")
        .unreadable("/work/app/broken.md")
        .unreadable("/home/u/.claude/CLAUDE.md")
        .unreadable("/work/app/.claude/rules")
        .file("/work/app/CLAUDE.local.md", "local");
    let set = discover(Path::new(CWD), &config(), &fs);
    assert_eq!(active_paths(&set), ["/work/app/CLAUDE.md", "/work/app/CLAUDE.local.md"]);
    let messages: Vec<String> = set.diagnostics().iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "/home/u/.claude/CLAUDE.md: not loaded, cannot read: permission denied",
            "/work/CLAUDE.md: not loaded, not UTF-8 text (bad byte at offset 2)",
            "/work/app/broken.md: not loaded, cannot read: permission denied",
            "/work/app/.claude/rules: cannot list directory: permission denied",
        ]
    );
}

#[test]
fn watch_paths_cover_reads_listings_and_absent_candidates() {
    let fs = MemFs::new().file("/work/app/CLAUDE.local.md", "see @missing.md");
    let mut cfg = config();
    cfg.managed_path = Some("/etc/claude-code/CLAUDE.md".into());
    let set = discover(Path::new(CWD), &cfg, &fs);
    let watched = set.watched();
    for (path, kind) in [
        ("/work/app/CLAUDE.md", WatchKind::File),
        ("/work/app/.claude/CLAUDE.md", WatchKind::File),
        ("/work/app/AGENTS.md", WatchKind::File),
        ("/CLAUDE.md", WatchKind::File),
        ("/etc/claude-code/CLAUDE.md", WatchKind::File),
        ("/home/u/.claude/CLAUDE.md", WatchKind::File),
        ("/work/app/CLAUDE.local.md", WatchKind::File),
        ("/work/app/missing.md", WatchKind::File),
        ("/work/app/.claude/rules", WatchKind::Dir),
        ("/.claude/rules", WatchKind::Dir),
        (MEMORY_MD, WatchKind::File),
    ] {
        assert_eq!(watched.get(Path::new(path)), Some(&kind), "{path}");
    }
    assert_eq!(set.watch_paths().len(), watched.len());
    assert!(
        set.diagnostics()
            .iter()
            .any(|d| d.path == Path::new("/work/app/missing.md")
                && matches!(d.problem, Problem::ImportNotFound { .. }))
    );
}

#[test]
fn watched_since_gives_only_what_a_read_added() {
    let fs = MemFs::new().file("/work/app/pkg/CLAUDE.md", "nested");
    let mut set = discover(Path::new(CWD), &config(), &fs);
    let mark = set.watch_mark();
    assert_eq!(mark, set.watched().len());
    assert_eq!(set.watched_since(mark), []);

    set.on_file_read(Path::new("/work/app/pkg/lib.rs"), &fs);
    let added = set.watched_since(mark);
    let expected: Vec<(PathBuf, WatchKind)> = [
        "/work/app/pkg/CLAUDE.md",
        "/work/app/pkg/AGENTS.md",
        "/work/app/pkg/.claude/CLAUDE.md",
        "/work/app/pkg/.claude/AGENTS.md",
    ]
    .iter()
    .map(|p| (PathBuf::from(p), WatchKind::File))
    .collect();
    assert_eq!(added, expected);
    assert_eq!(set.watch_mark(), mark + 4);
    // The same folder again adds nothing; a mark past the end is just empty.
    let mark = set.watch_mark();
    set.on_file_read(Path::new("/work/app/pkg/other.rs"), &fs);
    assert_eq!(set.watched_since(mark), []);
    assert_eq!(set.watched_since(mark + 100), []);
}

#[test]
fn a_file_reached_twice_is_placed_once() {
    // The user's own .claude folder is also a project folder when cwd is under home,
    // and both memory files import the same file.
    let fs = MemFs::new()
        .file("/home/u/.claude/CLAUDE.md", "user @../common.md")
        .file("/home/u/proj/CLAUDE.md", "proj @../common.md")
        .file("/home/u/common.md", "common");
    let config = MemoryConfig { import_roots: vec!["/home/u".into()], ..config() };
    let set = discover(Path::new("/home/u/proj"), &config, &fs);
    assert_eq!(
        kinds_and_paths(&set),
        [
            (MemoryKind::User, "/home/u/.claude/CLAUDE.md".to_owned()),
            (MemoryKind::Import, "/home/u/common.md".to_owned()),
            (MemoryKind::Project, "/home/u/proj/CLAUDE.md".to_owned()),
        ]
    );
    assert!(set.diagnostics().is_empty(), "{:?}", set.diagnostics());
}

#[test]
fn rule_already_in_context_through_an_import_becomes_duplicate() {
    let fs = MemFs::new()
        .file("/work/app/.claude/rules/db.md", "---\npaths: db/**/*.sql\n---\ndb rule")
        .file("/work/app/db/CLAUDE.md", "@../.claude/rules/db.md");
    let mut set = discover(Path::new(CWD), &config(), &fs);
    // A read in db/ loads the nested file, which imports the still pending rule file.
    let added = set.on_file_read(Path::new("db/README.md"), &fs);
    let added_kinds: Vec<MemoryKind> = added.iter().filter_map(|&id| set.entry(id)).map(|e| e.kind).collect();
    assert_eq!(added_kinds, [MemoryKind::Nested, MemoryKind::Import]);
    // The rule matching later must not place the same text a second time.
    assert!(set.on_file_read(Path::new("db/schema.sql"), &fs).is_empty());
    let rule = set.entries().iter().find(|e| e.kind == MemoryKind::Rule).map(|e| e.status);
    assert_eq!(rule, Some(Status::Duplicate));
    assert_eq!(render_user_context(&set, "d").matches("db rule").count(), 1);
}

#[test]
fn rule_matching_in_the_same_read_as_a_nested_importer_is_placed_as_the_rule() {
    let fs = MemFs::new()
        .file("/work/app/.claude/rules/db.md", "---\npaths: db/**\n---\ndb rule")
        .file("/work/app/db/CLAUDE.md", "@../.claude/rules/db.md");
    let mut set = discover(Path::new(CWD), &config(), &fs);
    let added = set.on_file_read(Path::new("db/schema.sql"), &fs);
    let added_kinds: Vec<MemoryKind> = added.iter().filter_map(|&id| set.entry(id)).map(|e| e.kind).collect();
    assert_eq!(added_kinds, [MemoryKind::Rule, MemoryKind::Nested]);
    assert_eq!(render_user_context(&set, "d").matches("db rule").count(), 1);
}

#[test]
fn oversized_file_is_cut_with_a_note() {
    let fs = MemFs::new().file("/work/app/CLAUDE.md", &"x".repeat(40_010));
    let set = discover(Path::new(CWD), &config(), &fs);
    let Some(entry) = set.active().next() else { panic!("not loaded") };
    assert_eq!(entry.content.len(), 40_000);
    assert_eq!(entry.cut, Some(Cut::FileCap { kept_chars: 40_000, total_chars: 40_010 }));
    assert!(render_entry(entry).ends_with("[Cut: the file has 40010 characters and only the first 40000 are shown.]"));
}

#[test]
fn imports_under_one_file_share_a_budget() {
    let fs = MemFs::new()
        .file("/work/app/CLAUDE.md", "@a.md @b.md @c.md")
        .file("/work/app/a.md", &"a".repeat(60))
        .file("/work/app/b.md", &"b".repeat(60))
        .file("/work/app/c.md", "c");
    let mut cfg = config();
    cfg.max_import_chars = 100;
    let set = discover(Path::new(CWD), &cfg, &fs);
    let sizes: Vec<(String, usize)> = set.active().map(|e| (e.path.display().to_string(), e.content.len())).collect();
    assert_eq!(
        sizes,
        [("/work/app/CLAUDE.md".to_owned(), 17), ("/work/app/a.md".to_owned(), 60), ("/work/app/b.md".to_owned(), 40)]
    );
    assert!(!fs.was_read("/work/app/c.md"));
    assert!(set.diagnostics().iter().any(|d| d.path == Path::new("/work/app/c.md")
        && matches!(d.problem, Problem::ImportBudgetSpent { budget_chars: 100, .. })));
}

#[test]
fn normalize_resolves_dots_lexically() {
    assert_eq!(normalize(Path::new("/a/./b/../c")), PathBuf::from("/a/c"));
    assert_eq!(normalize(Path::new("/../x")), PathBuf::from("/x"));
    assert_eq!(normalize(Path::new("../../x")), PathBuf::from("../../x"));
    assert_eq!(normalize(Path::new("a/../../x")), PathBuf::from("../x"));
}

#[test]
fn token_estimate_is_rendered_bytes_over_four_rounded_up() {
    assert_eq!(estimate_tokens(""), 0);
    assert_eq!(estimate_tokens("abcd"), 1);
    assert_eq!(estimate_tokens("abcde"), 2);
    let fs = MemFs::new().file("/work/app/CLAUDE.md", "hello");
    let set = discover(Path::new(CWD), &config(), &fs);
    let Some(entry) = set.active().next() else { panic!("not loaded") };
    // "=== /work/app/CLAUDE.md (project) ===\nhello" is 43 bytes.
    assert_eq!(render_entry(entry).len(), 43);
    assert_eq!(entry_tokens(entry), 11);
}

#[test]
fn unclosed_front_matter_is_reported_and_rule_loads_as_text() {
    let fs = MemFs::new().file("/work/app/.claude/rules/r.md", "---\npaths: src/**\nbody");
    let set = discover(Path::new(CWD), &config(), &fs);
    assert_eq!(set.active().map(|e| e.content.as_str()).collect::<Vec<_>>(), ["---\npaths: src/**\nbody"]);
    assert_eq!(set.diagnostics().iter().map(|d| &d.problem).collect::<Vec<_>>(), [&Problem::UnclosedFrontMatter]);
}

/// Imports read only from the project, `~/.claude`, the importing file's own folder and
/// allowed folders; never from system folders, even when allowed.
#[test]
fn imports_outside_the_allowed_folders_are_refused_with_a_reason() {
    let fs = MemFs::new()
        .file(
            "/work/app/CLAUDE.md",
            "@/proc/self/environ @/etc/shadow @~/.ssh/id_ed25519 @../other/secret.md @~/.claude/ok.md @docs/ok.md @/opt/team.md",
        )
        .file("/proc/self/environ", "ANTHROPIC_API_KEY=sk-secret")
        .file("/etc/shadow", "root:hash")
        .file("/home/u/.ssh/id_ed25519", "PRIVATE KEY")
        .file("/work/other/secret.md", "other project")
        .file("/home/u/.claude/ok.md", "user claude folder")
        .file("/work/app/docs/ok.md", "project")
        .file("/opt/team.md", "allowed");
    let config = MemoryConfig { import_roots: vec!["/opt".into(), "/".into()], ..config() };
    let without_root = MemoryConfig { import_roots: vec!["/opt".into()], ..config.clone() };
    let set = discover(Path::new(CWD), &without_root, &fs);
    assert_eq!(
        active_paths(&set),
        ["/work/app/CLAUDE.md", "/home/u/.claude/ok.md", "/work/app/docs/ok.md", "/opt/team.md"]
    );
    let refused: Vec<String> = set
        .diagnostics()
        .iter()
        .filter(|d| matches!(d.problem, Problem::ImportOutside { .. }))
        .map(|d| d.path.display().to_string())
        .collect();
    assert_eq!(refused, ["/proc/self/environ", "/etc/shadow", "/home/u/.ssh/id_ed25519", "/work/other/secret.md"]);
    assert!(set.diagnostics()[0].to_string().contains("never system folders"), "{}", set.diagnostics()[0]);
    // Allowing `/` opens the rest, never /proc.
    let set = discover(Path::new(CWD), &config, &fs);
    assert!(!active_paths(&set).contains(&"/proc/self/environ".to_owned()));
    assert!(active_paths(&set).contains(&"/etc/shadow".to_owned()));
}
