//! The base context's memo hit path (what every request pays when no memory file
//! changed) against discovering the same memory files from disk, and the file-read
//! ledger's size and append cost at 10,000 entries.
//!
//! ```text
//! cargo bench -p ctxd --bench base_context
//! cargo bench -p ctxd --bench base_context -- --quick      # criterion's quick mode
//! ```
//!
//! The memo hit is measured as the session actor does it before each `ctx/assemble`:
//! rebuild only if a watched source changed (it did not), then take the user context
//! and the git snapshot for the pipeline. The bench fails if that path touches the disk.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // a bench binary: it reports on stdout and stops on a broken step

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::Criterion;
use ctxd::context::base::{BaseContext, MemoryCache};
use ctxd::context::fs::RealFs;
use ctxd_core::ledger::{FileRead, Ledger, LedgerEntry};
use ctxd_core::memory::{self, MemoryConfig};

fn main() {
    ledger_figures();
    let mut criterion = Criterion::default().configure_from_args();
    memo_hit(&mut criterion);
    criterion.final_summary();
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A project like a real one: a git repository, a 4 KB CLAUDE.md with an import, a
/// local file, two rules (one waiting for a read), user memory and auto memory.
fn project(dir: &Path) -> (std::path::PathBuf, MemoryConfig) {
    let home = dir.join("home");
    let cwd = dir.join("repo");
    let rules: String =
        (0..80).map(|n| format!("- Rule {n}: keep functions short and named for what they do.\n")).collect();
    write(&cwd.join("CLAUDE.md"), &format!("# Project\n@docs/testing.md\n{rules}"));
    write(&cwd.join("docs/testing.md"), "Run the tests with cargo nextest.\n");
    write(&cwd.join("CLAUDE.local.md"), "My sandbox is at ~/sandbox.\n");
    write(&cwd.join(".claude/rules/style.md"), "Prefer iterators.\n");
    write(&cwd.join(".claude/rules/sql.md"), "---\npaths: \"**/*.sql\"\n---\nUse bind parameters.\n");
    write(&home.join(".claude/CLAUDE.md"), "Answer briefly.\n");
    write(&memory::auto_memory_path(&home, &cwd), "- The build needs 2 cores.\n");
    let git = |args: &[&str]| {
        let ok =
            std::process::Command::new("git").args(args).current_dir(&cwd).output().is_ok_and(|o| o.status.success());
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["-c", "user.name=Bench", "-c", "user.email=b@example.invalid", "add", "."]);
    git(&["-c", "user.name=Bench", "-c", "user.email=b@example.invalid", "commit", "-q", "-m", "first"]);
    (cwd, MemoryConfig::new(home))
}

fn memo_hit(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let (cwd, config) = project(dir.path());
    let cache = MemoryCache::default();
    let fs = RealFs::new();
    let mut base = BaseContext::load(&cwd, config.clone(), &cache, &fs, "2026-11-29".into());
    assert!(base.system_context().is_some(), "git snapshot taken");
    let user = base.user_context().map_or(0, |u| u.len());
    let system = base.system_context().map_or(0, |s| s.len());
    println!("memo: user context {user} bytes, system context {system} bytes");
    let (reads, lists) = (fs.reads(), fs.lists());

    let mut group = c.benchmark_group("base_context");
    group.bench_function("memo_hit", |b| {
        b.iter(|| {
            let rebuilt = base.rebuild_if_dirty(&cache, &fs, &[]);
            let for_request = ctxd_core::view::BaseContext {
                system_context: base.system_context().map(|s| s.to_string()),
                user_context: base.user_context().map(|s| s.to_string()),
                attachments: Vec::new(),
            };
            black_box((rebuilt, for_request))
        });
    });
    assert_eq!((fs.reads(), fs.lists()), (reads, lists), "the memo hit read nothing from disk");
    println!("memo_hit: 0 reads, 0 listings over every iteration (counted by RealFs)");

    // The baseline: the memory files found and read again from disk (git not included).
    group.bench_function("discover_from_disk", |b| {
        b.iter(|| black_box(memory::discover(&cwd, &config, &fs)));
    });
    group.finish();
}

fn read(n: usize) -> FileRead {
    FileRead {
        path: format!("/home/dev/project/src/module_{:03}/file_{n}.rs", n % 500),
        start_line: 1,
        num_lines: 120,
        total_lines: Some(120),
        content: "x".repeat(3_000),
        source_uuid: Some(format!("{n:08}-0000-4000-8000-000000000000")),
        timestamp: Some("2026-11-29T10:00:00.000Z".to_owned()),
    }
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

/// Size of 10,000 entries (resident memory added while building them, and the bytes the
/// entries hold), and recording 1,000 new reads into an empty ledger against one that
/// already has 10,000 entries, medians of 21 runs.
fn ledger_figures() {
    const ENTRIES: usize = 10_000;
    let before = rss_kib();
    let mut ledger = Ledger::default();
    for n in 0..ENTRIES {
        ledger.record(&read(n));
    }
    let after = rss_kib();
    let held: usize = ledger
        .newest_first()
        .iter()
        .map(|e| {
            std::mem::size_of::<LedgerEntry>()
                + e.path.capacity()
                + e.source_uuid.as_ref().map_or(0, String::capacity)
                + e.read_at.as_ref().map_or(0, String::capacity)
        })
        .sum();
    println!(
        "ledger: {ENTRIES} entries: +{:.2} MB resident while building, {:.2} MB in entries and their strings (map slots not included)",
        (after.saturating_sub(before)) as f64 / 1024.0,
        held as f64 / (1024.0 * 1024.0)
    );

    // The same entries persisted the way the daemon does when a compaction boundary puts
    // them before the view: one batch.
    let dir = tempfile::tempdir().unwrap();
    let index = ctxd::store::index::Index::open_or_rebuild(&dir.path().join("index")).unwrap();
    let entries: Vec<LedgerEntry> = ledger.newest_first().into_iter().cloned().collect();
    let before = rss_kib();
    let started = Instant::now();
    index.put_ledger_batch("session", &entries);
    let each = started.elapsed() / ENTRIES as u32;
    std::thread::sleep(Duration::from_millis(1_500));
    let after = rss_kib();
    println!(
        "ledger: {ENTRIES} entries written to the index in one batch (its reads file): {:.1} µs each, +{:.2} MB resident",
        each.as_secs_f64() * 1e6,
        (after.saturating_sub(before)) as f64 / 1024.0
    );
    drop(index);

    let reads: Vec<FileRead> = (ENTRIES..ENTRIES + 1_000).map(read).collect();
    let time = |start: &Ledger| {
        let runs: Vec<Duration> = (0..21)
            .map(|_| {
                let mut ledger = start.clone();
                let started = Instant::now();
                for r in &reads {
                    black_box(ledger.record(r));
                }
                started.elapsed()
            })
            .collect();
        median(runs) / reads.len() as u32
    };
    let empty = time(&Ledger::default());
    let full = time(&ledger);
    println!(
        "ledger: record a new read: {:.0} ns into an empty ledger, {:.0} ns into {ENTRIES} entries ({:.2}x)",
        empty.as_secs_f64() * 1e9,
        full.as_secs_f64() * 1e9,
        full.as_secs_f64() / empty.as_secs_f64()
    );
}
