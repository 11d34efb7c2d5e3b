//! What "is Claude Code running for this session?" costs (`ctxd::live::running_for`,
//! asked before every idle compaction and twice per `ctxd claude compact`) on a machine
//! with many processes: 1,000 `sleep`s beside what already runs, then also 10 programs
//! named `claude` working elsewhere (so each is read further and the transcript's ends
//! are read for its ids and directories). For scale, the open-file check
//! (`ctxd::claude::opened_by`) that every compaction already makes.
//!
//! ```text
//! cargo bench -p ctxd --bench live
//! cargo bench -p ctxd --bench live -- --quick      # criterion's quick mode
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // a bench binary: it reports on stdout and stops on a broken step

use std::hint::black_box;
use std::process::{Child, Command, Stdio};

use criterion::Criterion;

const SLEEPERS: usize = 1_000;
const OTHER_PROGRAMS: usize = 10;

/// Children that end with the bench.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn(program: &std::path::Path, args: &[&str], cwd: &std::path::Path) -> Child {
    Command::new(program).args(args).current_dir(cwd).stdin(Stdio::null()).spawn().unwrap()
}

fn processes() -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .count()
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let proj = dir.path().join("proj");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    let folder = dir.path().join("projects").join(ctxd::live::project_folder_name(&proj));
    std::fs::create_dir_all(&folder).unwrap();
    let path = folder.join("b7d55388-c9ad-4169-a8d1-459fc6bdb46f.jsonl");
    let line = format!(
        "{{\"type\":\"user\",\"cwd\":\"{}\",\"sessionId\":\"b7d55388-c9ad-4169-a8d1-459fc6bdb46f\",\"message\":{{\"content\":\"{}\"}}}}\n",
        proj.display(),
        "x".repeat(2_000)
    );
    std::fs::write(&path, line.repeat(500)).unwrap();

    let mut criterion = Criterion::default().configure_from_args();
    let sleep = std::path::Path::new("/bin/sleep");
    let mut children = Children((0..SLEEPERS).map(|_| spawn(sleep, &["600"], &elsewhere)).collect());
    let listed = processes();
    println!("live: {listed} processes in /proc");
    assert_eq!(ctxd::live::running_for(&path), None);
    criterion.bench_function(&format!("running_for, {listed} processes, no claude"), |b| {
        b.iter(|| black_box(ctxd::live::running_for(black_box(&path))))
    });
    criterion.bench_function("session_of (the transcript's two ends)", |b| {
        b.iter(|| black_box(ctxd::live::session_of(black_box(&path))))
    });
    // For scale: the open-file check every compaction already makes.
    criterion.bench_function(&format!("claude::opened_by, {listed} processes"), |b| {
        b.iter(|| black_box(ctxd::claude::opened_by(black_box(&path))))
    });

    let claude = dir.path().join("bin/claude");
    std::fs::create_dir_all(claude.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(sleep, &claude).unwrap();
    children.0.extend((0..OTHER_PROGRAMS).map(|_| spawn(&claude, &["600"], &elsewhere)));
    // Until each has executed, /proc shows it under the bench's name.
    while std::fs::read_to_string(format!("/proc/{}/comm", children.0.last().unwrap().id()))
        .map_or(true, |c| c.trim() != "claude")
    {
        std::thread::yield_now();
    }
    assert_eq!(ctxd::live::running_for(&path), None);
    criterion.bench_function(&format!("running_for, {listed} processes, {OTHER_PROGRAMS} claude elsewhere"), |b| {
        b.iter(|| black_box(ctxd::live::running_for(black_box(&path))))
    });
    criterion.final_summary();
    drop(children);
}
