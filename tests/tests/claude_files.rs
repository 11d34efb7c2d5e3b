//! Claude Code's files are the user's (issue 33): what `ctxd claude compact`/`undo` and
//! `ctx/claudeCompact`/`ctx/claudeUndo` may do to a transcript the program writes, held
//! through the real binary against real files.
//!
//! - An undo racing a writer that appends as the program does (open, one line, close)
//!   never cuts one of its lines; a compaction racing it never leaves ctxd's lines
//!   among the program's, nor writes when it refuses (loops with a stated trial count,
//!   0 failing allowed).
//! - An undo takes back exactly ctxd's bytes: whitespace after the install refuses it.
//! - A FIFO or a device named as the transcript is refused at once; the daemon keeps
//!   serving and parks no thread.
//! - Nothing of `/proc` goes into a transcript: a Read of `/proc/self/environ` is named,
//!   never restored, in a Claude Code session and in ctxd's own.
//! - A transcript larger than the window ctxd reads compacts under an address-space
//!   limit that the whole file would not fit in.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use ctxd_e2e::{Daemon, claude_code_home};
use serde_json::{Value, json};

const SESSION: &str = "b7d55388-c9ad-4169-a8d1-459fc6bdb46f";

/// A Claude Code home with one project (see [`claude_code_home`]). Returns (home,
/// transcript, project).
fn claude_home(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    claude_code_home(dir, str::to_owned)
}

/// `ctxd claude ARGS` with `home` as HOME and the extra environment `env`.
fn ctxd_claude(dir: &Path, home: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = claude_command(dir, home, args, env);
    command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    command.output().unwrap()
}

/// [`ctxd_e2e::claude_command`] with the extra environment `env`, its output dropped.
fn claude_command(dir: &Path, home: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Command {
    let mut command = ctxd_e2e::claude_command(dir, home, args);
    command
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    command
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A line as the program writes one: a user record of the session, with a uuid.
fn program_line(project: &Path, trial: usize, n: usize) -> String {
    let record = json!({"parentUuid": null, "isSidechain": false, "userType": "external", "cwd": project,
        "sessionId": SESSION, "version": "2.1.332", "type": "user",
        "message": {"role": "user", "content": format!("writer trial {trial} line {n}")},
        "uuid": format!("w-{trial}-{n}"), "timestamp": "2026-11-29T21:30:00.000Z"});
    format!("{record}\n")
}

/// One trial of a race: `path` holds `start`; `command` runs while a writer appends
/// `lines` as Claude Code appends (open, one line, close, each time), starting after
/// `delay`, 300 µs between lines. Returns how the command ended and the file after both.
fn race(
    path: &Path,
    start: &[u8],
    mut command: std::process::Command,
    lines: &[String],
    delay: Duration,
) -> (std::process::ExitStatus, Vec<u8>) {
    std::fs::write(path, start).unwrap();
    let mut child = command.spawn().unwrap();
    let (target, lines) = (path.to_owned(), lines.to_vec());
    let writer = std::thread::spawn(move || {
        std::thread::sleep(delay);
        for line in lines {
            let mut file = std::fs::OpenOptions::new().append(true).open(&target).unwrap();
            file.write_all(line.as_bytes()).unwrap();
            drop(file);
            std::thread::sleep(Duration::from_micros(300));
        }
    });
    let status = child.wait().unwrap();
    writer.join().unwrap();
    (status, std::fs::read(path).unwrap())
}

/// The writer's delays for a command that takes `span` here: from before it reads the
/// file to after it is done.
fn delays(seed: u64, span: Duration) -> impl FnMut() -> Duration {
    let mut rng = ctxd_gen::rng::Rng::new(seed);
    move || Duration::from_micros(rng.between(0, span.as_micros() as u64 * 3 / 2))
}

/// How many of `lines` are in `bytes`.
fn held(lines: &[String], bytes: &[u8]) -> usize {
    lines.iter().filter(|l| bytes.windows(l.len()).any(|w| w == l.as_bytes())).count()
}

/// The transcript as ctxd's compaction left it: the bytes ctxd appended (`ours`) cut out
/// of `after`, at the line where its boundary stands; `None` when `after` holds no line
/// of ctxd's.
fn without_install(after: &[u8]) -> Option<(Vec<u8>, Vec<u8>, usize)> {
    let text = std::str::from_utf8(after).unwrap();
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let at = lines.iter().position(|l| l.contains("\"ctxdBatch\""))?;
    let boundary: Value = serde_json::from_str(lines[at]).unwrap();
    let batch = boundary["compactMetadata"]["ctxdBatch"].as_u64().unwrap() as usize;
    let ours: String = lines[at..at + batch].concat();
    let rest: String = lines[..at].concat() + &lines[at + batch..].concat();
    Some((rest.into_bytes(), ours.into_bytes(), at))
}

/// How long one run of `command` takes here.
fn timed(mut command: std::process::Command) -> Duration {
    let started = Instant::now();
    command.output().unwrap();
    started.elapsed()
}

#[test]
fn undo_never_cuts_a_line_the_program_appends_while_it_runs() {
    const TRIALS: usize = 200;
    const LINES: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let (home, path, project) = claude_home(dir.path());
    let original = std::fs::read(&path).unwrap();
    let out = ctxd_claude(dir.path(), &home, &["compact", "--offline", SESSION], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let installed = std::fs::read(&path).unwrap();
    let undo = || claude_command(dir.path(), &home, &["undo", SESSION], &[]);
    let mut delay = delays(33, timed(undo()));
    let (mut lost, mut undone, mut refused) = (Vec::new(), 0, 0);
    for trial in 0..TRIALS {
        let lines: Vec<String> = (0..LINES).map(|n| program_line(&project, trial, n)).collect();
        let (status, after) = race(&path, &installed, undo(), &lines, delay());
        let written = lines.concat().into_bytes();
        // Undone (the program's lines after the cut) or refused (after the install):
        // every line of the program's is there either way.
        let as_undone = [&original[..], &written].concat();
        let as_refused = [&installed[..], &written].concat();
        if status.success() && after == as_undone {
            undone += 1;
        } else if !status.success() && after == as_refused {
            refused += 1;
        } else {
            lost.push(format!("trial {trial}: exit {status}, {} of {LINES} program lines left", held(&lines, &after)));
        }
    }
    println!("{TRIALS} undo trials against a writer: {undone} undone, {refused} refused, {} lost lines", lost.len());
    assert!(lost.is_empty(), "{} of {TRIALS} trials lost the program's lines: {lost:#?}", lost.len());
    // The writer raced the undo from both sides, or the trials proved nothing.
    assert!(undone > 0 && refused > 0, "{undone} undone, {refused} refused");
}

#[test]
fn a_compaction_racing_the_program_writes_all_of_its_lines_after_what_it_read_or_none() {
    const TRIALS: usize = 150;
    const LINES: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let (home, path, project) = claude_home(dir.path());
    let original = std::fs::read(&path).unwrap();
    let compact = || claude_command(dir.path(), &home, &["compact", "--offline", SESSION], &[]);
    let mut delay = delays(34, timed(compact()));
    let (mut bad, mut installed, mut refused) = (Vec::new(), 0, 0);
    for trial in 0..TRIALS {
        let lines: Vec<String> = (0..LINES).map(|n| program_line(&project, trial, n)).collect();
        let (status, after) = race(&path, &original, compact(), &lines, delay());
        let expected = [&original[..], lines.concat().as_bytes()].concat();
        match (status.success(), without_install(&after)) {
            // Refused: not a byte of ctxd's.
            (false, None) if after == expected => refused += 1,
            // Installed: right after the last line it read (the newest with a uuid is
            // its logical parent), the program's lines all there around it.
            (true, Some((rest, ours, at))) if rest == expected => {
                let text = String::from_utf8(after.clone()).unwrap();
                let read: Vec<Value> = text.lines().take(at).map(|l| serde_json::from_str(l).unwrap()).collect();
                let newest = read.iter().rev().find_map(|r| r["uuid"].as_str()).unwrap();
                let boundary: Value =
                    serde_json::from_str(std::str::from_utf8(&ours).unwrap().lines().next().unwrap()).unwrap();
                if boundary["logicalParentUuid"] == newest {
                    installed += 1;
                } else {
                    bad.push(format!("trial {trial}: a line of the program's stands before ctxd's boundary unread"));
                }
            }
            (ok, found) => bad.push(format!(
                "trial {trial}: exit ok={ok}, ctxd's lines {}, the program's lines {}",
                if found.is_some() { "in the file" } else { "absent" },
                if held(&lines, &after) == LINES { "all there" } else { "missing" }
            )),
        }
    }
    println!("{TRIALS} compact trials against a writer: {installed} installed, {refused} refused, {} bad", bad.len());
    assert!(bad.is_empty(), "{} of {TRIALS} trials: {bad:#?}", bad.len());
    assert!(installed > 0 && refused > 0, "{installed} installed, {refused} refused");
}

#[test]
fn undo_refuses_when_anything_but_ctxds_install_follows_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (home, path, _project) = claude_home(dir.path());
    let out = ctxd_claude(dir.path(), &home, &["compact", "--offline", SESSION], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Whitespace of the program's after the install (no line that is a record).
    let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(b"\n   \n\t\n").unwrap();
    drop(file);
    let before = std::fs::read(&path).unwrap();
    let out = ctxd_claude(dir.path(), &home, &["undo", SESSION], &[]);
    assert!(!out.status.success(), "the undo must refuse: {}", stderr(&out));
    assert!(stderr(&out).contains("not all ctxd's"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&path).unwrap(), before, "the transcript is left byte for byte");
}

/// Threads of process `pid` now.
fn threads(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap()
}

#[test]
fn a_fifo_or_a_device_as_the_transcript_is_refused_at_once_and_the_daemon_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let (_home, path, _project) = claude_home(dir.path());
    let fifo = dir.path().join("transcript.fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        0,
    )
    .unwrap();
    // Under an address-space limit: a daemon that read /dev/zero to its end would stop
    // at the limit, not at the machine's memory.
    let mut daemon = Daemon::start_bounded(&dir.path().join("state"), 2 << 30, &[]).unwrap();
    daemon.initialize().unwrap();
    let cases = [
        ("/dev/zero".to_owned(), "is a character device"),
        (fifo.display().to_string(), "is a FIFO"),
        (dir.path().display().to_string(), "is a directory"),
    ];
    let ask = |daemon: &mut Daemon| {
        for (target, kind) in &cases {
            for method in ["ctx/claudeCompact", "ctx/claudeUndo"] {
                let error = daemon.request_error(method, json!({"transcript": target})).unwrap();
                let message = error["message"].as_str().unwrap_or_default();
                assert!(message.contains(kind), "{method} {target}: {error}");
            }
        }
    };
    ask(&mut daemon);
    let settled = threads(daemon.pid());
    // 50 rounds, 300 requests (100 naming the FIFO): each answered, and no thread left
    // waiting on one.
    for _ in 0..50 {
        ask(&mut daemon);
    }
    // A thread parked per request would add 100 for the FIFO's; the blocking pool may
    // start a few more when a request comes before the last one's thread is idle again.
    let after = threads(daemon.pid());
    println!("threads: {settled} after the first round, {after} after 300 more requests");
    assert!(after <= settled + 16, "threads grew from {settled} to {after}");
    // Pipelined too: every one answered.
    let ids: Vec<i64> =
        (0..100).map(|_| daemon.send_request("ctx/claudeUndo", json!({"transcript": fifo})).unwrap()).collect();
    for id in ids {
        let answer = daemon.response(id).unwrap();
        assert!(answer["error"]["message"].as_str().unwrap_or_default().contains("is a FIFO"), "{answer}");
    }
    // And a real transcript is still compacted.
    let done = daemon.request("ctx/claudeCompact", json!({"transcript": path})).unwrap();
    assert!(done["lines"].as_u64().unwrap() >= 2, "{done}");
    daemon.stop().unwrap();
}

const CANARY: &str = "ctxd-canary-7f3a9e1b55";

/// The fixture with its Read of `src/app.py` turned into a Read of `/proc/self/environ`
/// (and its util.py read from the project, which exists with a marker).
fn reads_proc(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let project = dir.join("proj");
    let (home, path, project) = claude_code_home(dir, |line| {
        line.replace("/home/dev/proj/src/app.py", "/proc/self/environ")
            .replace("/home/dev/proj/src/util.py", &format!("{}/util.py", project.display()))
    });
    std::fs::write(project.join("util.py"), "def add(a, b):\n    return a + b  # MARKER-RESTORED\n").unwrap();
    (home, path, project)
}

#[test]
fn claude_compact_never_restores_proc_self_environ() {
    let dir = tempfile::tempdir().unwrap();
    let (home, path, _project) = reads_proc(dir.path());
    assert!(std::fs::read_to_string(&path).unwrap().contains("\"filePath\":\"/proc/self/environ\""));
    let out = ctxd_claude(dir.path(), &home, &["compact", "--offline", SESSION], &[("CTXD_TEST_CANARY", CANARY)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains(CANARY), "ctxd's environment went into the transcript");
    // The file of the project is re-attached; /proc/self/environ at most named.
    let (_, ours, _) = without_install(text.as_bytes()).unwrap();
    let ours = String::from_utf8(ours).unwrap();
    assert!(ours.contains("MARKER-RESTORED"), "{ours}");
    let environ: Vec<Value> = ours
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r.to_string().contains("/proc/self/environ"))
        .collect();
    assert!(environ.iter().all(|r| r["attachment"]["type"] != "file"), "{environ:?}");
}

#[test]
fn a_sessions_own_compaction_never_restores_proc_self_environ() {
    let dir = tempfile::tempdir().unwrap();
    let (_home, path, project) = reads_proc(dir.path());
    let state = dir.path().join("state");
    let mut daemon = Daemon::start_with(&state, &[], &[("CTXD_TEST_CANARY", CANARY)]).unwrap();
    daemon.initialize().unwrap();
    let model = "claude-opus-5-5";
    daemon
        .request("ctx/openSession", json!({"cwd": project, "model": model, "sessionId": "own", "import": path}))
        .unwrap();
    daemon.request("ctx/compact", json!({"sessionId": "own"})).unwrap();
    let stored = std::fs::read_to_string(state.join("sessions/own.jsonl")).unwrap();
    assert!(stored.contains("MARKER-RESTORED"), "the project's file is restored");
    assert!(!stored.contains(CANARY), "ctxd's environment went into the session's transcript");
    daemon.stop().unwrap();
}

/// A Claude Code session of about `bytes` bytes in `project`: turns of a prompt, a Read
/// call, its result (about 380 KB: few enough prompts for the summary to name each)
/// and a reply with usage. The result's text is escaped once and spliced into each
/// line: serializing it per turn would make this the slowest part of the test.
fn large_session(path: &Path, project: &Path, bytes: u64) -> usize {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let body = serde_json::to_string(&"let value = compute(input); // line of a source file\n".repeat(7_200)).unwrap();
    let (mut written, mut turns, mut parent) = (0u64, 0usize, Value::Null);
    while written < bytes {
        let n = turns;
        let common = |uuid: String, parent: &Value| {
            json!({"parentUuid": parent, "isSidechain": false, "userType": "external", "cwd": project,
                "sessionId": SESSION, "version": "2.1.332", "uuid": uuid, "timestamp": "2026-11-29T21:30:00.000Z"})
        };
        let mut prompt = common(format!("p-{n}"), &parent);
        prompt["type"] = json!("user");
        prompt["message"] = json!({"role": "user", "content": format!("Turn {n:06} asks to read file {n}.")});
        let mut call = common(format!("c-{n}"), &json!(format!("p-{n}")));
        call["type"] = json!("assistant");
        call["message"] = json!({"id": format!("m-{n}"), "role": "assistant", "model": "claude-opus-5-5",
            "content": [{"type": "tool_use", "id": format!("t-{n}"), "name": "Read",
                         "input": {"file_path": format!("{}/f{n}.rs", project.display())}}],
            "usage": {"input_tokens": 20_000 + n, "output_tokens": 10}});
        let mut result = common(format!("r-{n}"), &json!(format!("c-{n}")));
        result["type"] = json!("user");
        result["message"] = json!({"role": "user",
            "content": [{"type": "tool_result", "tool_use_id": format!("t-{n}"), "content": "@BODY@"}]});
        let mut reply = common(format!("a-{n}"), &json!(format!("r-{n}")));
        reply["type"] = json!("assistant");
        reply["message"] = json!({"id": format!("n-{n}"), "role": "assistant", "model": "claude-opus-5-5",
            "content": [{"type": "text", "text": format!("Read file {n}.")}],
            "usage": {"input_tokens": 30_000 + n, "output_tokens": 10}});
        for record in [prompt, call, result, reply] {
            let line = format!("{record}\n").replacen("\"@BODY@\"", &body, 1);
            out.write_all(line.as_bytes()).unwrap();
            written += line.len() as u64;
        }
        parent = json!(format!("a-{n}"));
        turns += 1;
    }
    out.flush().unwrap();
    turns
}

#[test]
fn a_transcript_larger_than_memory_allows_is_compacted_within_it() {
    // 300 MB under a 384 MiB address space: read whole it does not fit (ctxd before
    // the window took twice the file at its peak, 794 MB for 400 MB of these turns;
    // with the window, 142 MB).
    const BYTES: u64 = 300_000_000;
    const ADDRESS_SPACE_KB: u64 = 384 << 10;
    let dir = tempfile::tempdir().unwrap();
    let (home, _, project) = claude_home(dir.path());
    let path = dir.path().join("home/.claude/projects/-proj/large.jsonl");
    let turns = large_session(&path, &project, BYTES);
    let size = std::fs::metadata(&path).unwrap().len();
    let ctxd = ctxd_e2e::ctxd_bin();
    let script = format!("ulimit -v {ADDRESS_SPACE_KB} && exec \"$0\" \"$@\"");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(script)
        .arg(&ctxd)
        .arg("--state-dir")
        .arg(dir.path().join("cli-state"))
        .arg("--log-stderr")
        .args(["claude", "compact", "--offline"])
        .arg(&path)
        .env("HOME", &home)
        .env_remove("CLAUDE_CONFIG_DIR")
        // glibc reserves 64 MiB of address space per malloc arena and makes more arenas
        // when threads contend, which a loaded machine decides; a fixed count keeps the
        // limit about ctxd's heap, not about the machine's load.
        .env("MALLOC_ARENA_MAX", "2")
        .output()
        .unwrap();
    assert!(out.status.success(), "exit {}: {}", out.status, stderr(&out));
    // Appended only, and the summary names the oldest prompts too (the older part
    // gives them) as well as the newest.
    let mut file = std::fs::File::open(&path).unwrap();
    use std::io::{Read, Seek};
    file.seek(std::io::SeekFrom::Start(size)).unwrap();
    let mut added = String::new();
    file.read_to_string(&mut added).unwrap();
    let summary =
        added.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).find(|r| r["isCompactSummary"] == true);
    let text = summary.unwrap()["message"]["content"].as_str().unwrap().to_owned();
    assert!(text.contains("Turn 000000 asks"), "the first prompt is in the summary");
    assert!(text.contains(&format!("Turn {:06} asks", turns - 2)), "a newest prompt is in the summary");
}
