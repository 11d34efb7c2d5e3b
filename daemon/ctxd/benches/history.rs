//! The history index (issue 36) over generated Claude Code transcripts: build speed,
//! index size, how soon an appended line is found, query latency, and how soon a fresh
//! `ctxd mcp` answers its first search.
//!
//! ```text
//! cargo build --release -p ctxd && cargo bench -p ctxd --bench history                  # 1 GB in 200 sessions
//! cargo bench -p ctxd --bench history -- --mb 256 --sessions 50                         # scaled down
//! ```
//!
//! Sessions come from `ctxd-gen` (Claude Code shaped, heavy-tailed tool results, an
//! auto-compaction every 150k tokens), spread over 10 project folders of a temporary
//! Claude Code config directory. Figures are printed as `name: value` lines. The MCP
//! figure spawns `target/release/ctxd` (or `CTXD_BIN`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // a bench binary: it reports on stdout and stops on a broken step

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ctxd::history::{ALL, History, Origin, Roots, SearchRequest, Source};
use ctxd_core::recall::{self, What};

const PROJECTS: usize = 10;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: u64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let mb = flag("--mb", 1024);
    let sessions = flag("--sessions", 200) as usize;
    let dir = tempfile::tempdir().unwrap();
    let claude = dir.path().join("claude");
    let state = dir.path().join("state");

    let started = Instant::now();
    let (bytes, cwds) = generate(dir.path(), &claude.join("projects"), mb << 20, sessions);
    println!(
        "generated: {} sessions, {:.1} MB in {:.1} s",
        sessions,
        bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );

    let roots = Roots { store: Some(state.join("sessions")), claude: Some(claude.join("projects")) };
    let history = History::open(&state, roots.clone()).unwrap();
    let all = roots.claude_sources();
    let started = Instant::now();
    let built = history.refresh(&all).unwrap();
    let took = started.elapsed().as_secs_f64();
    println!(
        "index build: {:.1} MB/s ({:.1} MB, {} records, {:.1} s; peak RSS {} MB)",
        built.bytes as f64 / 1e6 / took,
        built.bytes as f64 / 1e6,
        built.records,
        took,
        peak_rss_kb() / 1024
    );
    let size = history.disk_bytes();
    println!(
        "index size: {:.1} % of the transcripts ({:.1} MB)",
        size as f64 * 100.0 / bytes as f64,
        size as f64 / 1e6
    );

    let queries = sample_queries(&all, 100);
    for (scope, label) in [
        (Scope::Session, "one session"),
        (Scope::Project, "one project (\"all\")"),
        (Scope::Everything, "every session"),
    ] {
        let mut times = Vec::new();
        let mut found = 0;
        for (i, query) in queries.iter().enumerate() {
            let (sources, preferred) = scope.sources(&history, &all, &cwds, i);
            let started = Instant::now();
            let hits = history
                .search(&SearchRequest {
                    query,
                    sources: &sources,
                    preferred: preferred.as_deref(),
                    limit: 10,
                    before_compaction_only: false,
                })
                .unwrap()
                .hits;
            times.push(started.elapsed());
            found += usize::from(!hits.is_empty());
        }
        let (median, p95) = median_p95(&mut times);
        println!("query, {label}: median {median:.2?}, p95 {p95:.2?} ({} queries, {found} with hits)", times.len());
    }

    // An appended line, until a search finds it (the search brings the index up to date).
    let mut times = Vec::new();
    for trial in 0..30 {
        let source = &all[trial % all.len()];
        let word = format!("zqvisible{trial}");
        let line = serde_json::json!({"type": "user", "uuid": format!("vis-{trial}"), "parentUuid": null,
            "message": {"role": "user", "content": format!("the word {word} appears")}});
        let started = Instant::now();
        let mut file = std::fs::OpenOptions::new().append(true).open(&source.path).unwrap();
        writeln!(file, "{line}").unwrap();
        drop(file);
        loop {
            let request = SearchRequest {
                query: &word,
                sources: std::slice::from_ref(source),
                preferred: None,
                limit: 1,
                before_compaction_only: false,
            };
            if !history.search(&request).unwrap().hits.is_empty() {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{word} never found");
        }
        times.push(started.elapsed());
    }
    let (median, p95) = median_p95(&mut times);
    println!("appended line found: median {median:.2?}, p95 {p95:.2?} (30 appends)");
    drop(history);

    mcp_first_answer(&state, &claude, &cwds[0]);
}

/// Writes `sessions` sessions of `total / sessions` bytes each, in 10 project folders;
/// returns the bytes written and each project's working directory (real directories
/// under `root`, so `ctxd mcp` can be started in one).
fn generate(root: &Path, projects: &Path, total: u64, sessions: usize) -> (u64, Vec<PathBuf>) {
    let cwds: Vec<PathBuf> = (0..PROJECTS)
        .map(|p| {
            let cwd = root.join(format!("work/project-{p}"));
            std::fs::create_dir_all(&cwd).unwrap();
            std::fs::canonicalize(cwd).unwrap()
        })
        .collect();
    let mut bytes = 0;
    for s in 0..sessions {
        let cwd = &cwds[s % PROJECTS];
        let folder = projects.join(ctxd::history::sources::project_folder(cwd));
        std::fs::create_dir_all(&folder).unwrap();
        let opts = ctxd_gen::Options {
            seed: s as u64 + 1,
            until: ctxd_gen::Until::Bytes(total / sessions as u64),
            cwd: cwd.display().to_string(),
            compact_at: Some(150_000),
            parallel: 0.2,
            errors: 0.05,
            start_ms: ctxd_gen::Options::default().start_ms + s as i64 * 3_600_000,
            ..ctxd_gen::Options::default()
        };
        let tmp = folder.join("writing.tmp");
        let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp).unwrap());
        let stats = ctxd_gen::write(&opts, &mut out).unwrap();
        out.flush().unwrap();
        drop(out);
        std::fs::rename(&tmp, folder.join(format!("{}.jsonl", stats.session_id))).unwrap();
        bytes += stats.bytes;
    }
    (bytes, cwds)
}

#[derive(Clone, Copy)]
enum Scope {
    Session,
    Project,
    Everything,
}

impl Scope {
    fn sources(self, history: &History, all: &[Source], cwds: &[PathBuf], i: usize) -> (Vec<Source>, Option<String>) {
        match self {
            Scope::Session => (vec![all[i % all.len()].clone()], Some(all[i % all.len()].key.clone())),
            Scope::Project => {
                let scope = history.scope(Some(ALL), Some(&cwds[i % cwds.len()]), Origin::Claude).unwrap();
                (scope.sources, scope.preferred)
            }
            Scope::Everything => (all.to_vec(), None),
        }
    }
}

/// Queries as a model would type them: a word or two from the records' own text.
fn sample_queries(sources: &[Source], n: usize) -> Vec<String> {
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut queries = Vec::new();
    while queries.len() < n {
        let source = &sources[next() as usize % sources.len()];
        let text = std::fs::read_to_string(&source.path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let line = lines[next() as usize % lines.len()];
        let Some(recall::Line { what: What::Entry(entry), .. }) = recall::extract(line, 1 << 16) else { continue };
        let words: Vec<&str> =
            entry.text.split(|c: char| !c.is_alphanumeric()).filter(|w| w.len() >= 5 && w.len() <= 20).collect();
        if words.len() < 2 {
            continue;
        }
        let at = next() as usize % (words.len() - 1);
        queries.push(if queries.len() % 3 == 0 {
            format!("\"{} {}\"", words[at], words[at + 1])
        } else {
            words[at].to_owned()
        });
    }
    queries
}

fn median_p95(times: &mut [Duration]) -> (Duration, Duration) {
    times.sort();
    (times[times.len() / 2], times[(times.len() * 95 / 100).min(times.len() - 1)])
}

fn peak_rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Spawn → `initialize` → the first `search_history` answered, over the built index.
fn mcp_first_answer(state: &Path, claude: &Path, cwd: &Path) {
    let env = ctxd::process_env::ProcessEnv::from_process();
    let bin = env
        .var("CTXD_BIN")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/ctxd"), PathBuf::from);
    if !bin.exists() {
        println!("ctxd mcp first answer: skipped, no {} (cargo build --release -p ctxd)", bin.display());
        return;
    }
    let mut times = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        let mut child = Command::new(&bin)
            .arg("--state-dir")
            .arg(state)
            .arg("mcp")
            .current_dir(cwd)
            .env("CLAUDE_CONFIG_DIR", claude)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let messages = [
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}),
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "search_history", "arguments": {"query": "error"}}}),
        ];
        for m in &messages {
            writeln!(stdin, "{m}").unwrap();
        }
        let mut line = String::new();
        loop {
            line.clear();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "ctxd mcp closed its output");
            let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
            if answer["id"] == 2 {
                assert!(answer["result"]["isError"] != true, "{answer}");
                break;
            }
        }
        times.push(started.elapsed());
        drop(stdin);
        child.wait().unwrap();
    }
    let (median, p95) = median_p95(&mut times);
    println!("ctxd mcp spawn to first search answered: median {median:.2?}, p95 {p95:.2?} (10 starts)");
}
