//! The history index against real files: incremental updates, rewrites, damage, bad
//! queries, hostile transcripts.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::*;

struct World {
    _dir: tempfile::TempDir,
    state: PathBuf,
    project: PathBuf,
    history: History,
}

const FOLDER: &str = "-home-u-proj";

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let claude = dir.path().join("claude/projects");
    std::fs::create_dir_all(state.join("sessions")).unwrap();
    std::fs::create_dir_all(claude.join(FOLDER)).unwrap();
    let roots = Roots { store: Some(state.join("sessions")), claude: Some(claude.clone()) };
    let history = History::open(&state, roots).unwrap();
    World { project: claude.join(FOLDER), _dir: dir, state, history }
}

fn user(uuid: &str, parent: Option<&str>, text: &str) -> String {
    json!({"type": "user", "uuid": uuid, "parentUuid": parent, "cwd": "/home/u/proj",
           "timestamp": "2026-11-01T09:00:00Z", "message": {"role": "user", "content": text}})
    .to_string()
}

fn assistant(uuid: &str, parent: &str, text: &str) -> String {
    json!({"type": "assistant", "uuid": uuid, "parentUuid": parent,
           "message": {"role": "assistant", "content": [{"type": "text", "text": text}]}})
    .to_string()
}

fn boundary(uuid: &str, after: &str) -> String {
    json!({"type": "system", "subtype": "compact_boundary", "uuid": uuid, "parentUuid": null,
           "logicalParentUuid": after, "content": "Conversation compacted"})
    .to_string()
}

fn append(path: &Path, lines: &[String]) {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
}

impl World {
    fn transcript(&self, id: &str) -> PathBuf {
        self.project.join(format!("{id}.jsonl"))
    }

    fn search(&self, query: &str, before_only: bool) -> Found {
        let scope = self.history.scope(Some(ALL), Some(Path::new("/home/u/proj")), Origin::Claude).unwrap();
        self.history
            .search(&SearchRequest {
                query,
                sources: &scope.sources,
                preferred: scope.preferred.as_deref(),
                limit: 10,
                before_compaction_only: before_only,
            })
            .unwrap()
    }

    fn uuids(&self, query: &str) -> Vec<String> {
        self.search(query, false).hits.into_iter().map(|h| h.uuid).collect()
    }
}

#[test]
fn appended_records_are_found_and_the_boundary_flag_follows_the_latest_compaction() {
    let w = world();
    let t = w.transcript("s1");
    append(&t, &[user("u1", None, "the PURPLE-OCTOPUS phrase"), assistant("a1", "u1", "noted the octopus")]);
    let found = w.search("purple octopus", false);
    assert_eq!(found.hits.len(), 2, "{found:?}");
    assert_eq!(found.hits[0].uuid, "u1", "all the words, and a prompt, rank first");
    assert_eq!(found.hits[0].role, Role::User);
    assert_eq!(found.hits[0].source.session, "s1");
    assert!(!found.hits[0].before_compaction);
    assert!(found.hits[0].snippet.contains("PURPLE-OCTOPUS"), "{:?}", found.hits[0].snippet);
    // No compaction yet: nothing stands before one.
    let found = w.search("octopus", true);
    assert!(found.hits.is_empty() && found.notes.iter().any(|n| n.contains("compacted")), "{found:?}");
    // A compaction, then more: the old records stand before it, the new ones do not.
    append(&t, &[boundary("b1", "a1"), user("u2", Some("b1"), "another octopus question")]);
    let hits = w.search("octopus", true).hits;
    assert_eq!(hits.iter().map(|h| h.uuid.as_str()).collect::<Vec<_>>(), ["u1", "a1"]);
    assert!(hits.iter().all(|h| h.before_compaction));
    let all = w.search("octopus", false).hits;
    assert_eq!(all.len(), 3);
    assert!(!all.iter().find(|h| h.uuid == "u2").unwrap().before_compaction);
}

#[test]
fn only_what_was_appended_is_read_and_a_torn_line_waits() {
    let w = world();
    let t = w.transcript("s1");
    append(&t, &[user("u1", None, "alpha")]);
    let first = w.history.refresh(&w.history.roots.claude_project(FOLDER)).unwrap();
    assert_eq!((first.records, first.reindexed), (1, 0));
    // Nothing changed: nothing read.
    assert_eq!(w.history.refresh(&w.history.roots.claude_project(FOLDER)).unwrap(), Refreshed::default());
    // A line being written (no line break yet) is not indexed until it is whole.
    let line = user("u2", Some("u1"), "beta");
    let mut f = std::fs::OpenOptions::new().append(true).open(&t).unwrap();
    write!(f, "{}", &line[..10]).unwrap();
    assert!(w.uuids("beta").is_empty());
    writeln!(f, "{}", &line[10..]).unwrap();
    let second = w.history.refresh(&w.history.roots.claude_project(FOLDER)).unwrap();
    assert_eq!((second.records, second.reindexed), (1, 0), "only the new line: {second:?}");
    assert_eq!(w.uuids("beta"), ["u2"]);
    assert_eq!(w.uuids("alpha"), ["u1"], "the first record is still there once");
}

#[test]
fn a_transcript_cut_or_rewritten_is_indexed_again() {
    let w = world();
    let t = w.transcript("s1");
    append(&t, &[user("u1", None, "kept words"), user("u2", Some("u1"), "words cut away later")]);
    assert_eq!(w.uuids("words").len(), 2);
    // Cut back (as `ctxd claude undo` does): the cut record is gone from the index.
    let first_line = user("u1", None, "kept words").len() as u64 + 1;
    std::fs::OpenOptions::new().write(true).open(&t).unwrap().set_len(first_line).unwrap();
    assert_eq!(w.uuids("words"), ["u1"]);
    // Rewritten in place to the same length with other bytes under the offset.
    let other = user("u9", None, "new words");
    assert!(other.len() < first_line as usize);
    let mut bytes = other.into_bytes();
    bytes.resize(first_line as usize - 1, b' ');
    bytes.push(b'\n');
    std::fs::write(&t, &bytes).unwrap();
    assert_eq!(w.uuids("words"), ["u9"]);
    // Replaced by another file.
    let replacement = w.project.join("tmp");
    std::fs::write(&replacement, format!("{}\n", user("u7", None, "replaced words"))).unwrap();
    std::fs::rename(&replacement, &t).unwrap();
    assert_eq!(w.uuids("words"), ["u7"]);
}

#[test]
fn a_damaged_index_is_moved_aside_and_rebuilt_from_the_transcripts() {
    let w = world();
    append(&w.transcript("s1"), &[user("u1", None, "survives damage")]);
    assert_eq!(w.uuids("damage"), ["u1"]);
    let dir = w.history.dir().to_owned();
    let roots = w.history.roots.clone();
    drop(w.history);
    // Every file of the index overwritten with garbage.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::write(&path, b"\x00garbage{").unwrap();
        }
    }
    let history = History::open(&w.state, roots).unwrap();
    assert!(dir.with_extension("damaged").is_dir(), "the damaged index is kept aside once");
    let scope = history.newest_session(Path::new("/home/u/proj")).unwrap();
    let found = history
        .search(&SearchRequest {
            query: "damage",
            sources: &scope.sources,
            preferred: None,
            limit: 5,
            before_compaction_only: false,
        })
        .unwrap();
    assert_eq!(found.hits.len(), 1);
}

#[test]
fn a_hit_the_file_no_longer_confirms_is_dropped_and_its_transcript_indexed_again() {
    let w = world();
    let t = w.transcript("s1");
    append(&t, &[user("u1", None, "original words here")]);
    assert_eq!(w.uuids("original"), ["u1"]);
    // Same length, same tail, same identity, other record under the offset: a change
    // the stamps miss (mtime put back), but the read-back of the hit does not.
    let meta = std::fs::metadata(&t).unwrap();
    let forged = user("u8", None, "forged!! words here");
    assert_eq!(forged.len(), user("u1", None, "original words here").len());
    std::fs::OpenOptions::new().write(true).open(&t).unwrap().write_all(forged.as_bytes()).unwrap();
    let times = std::fs::FileTimes::new().set_modified(meta.modified().unwrap());
    std::fs::File::options().write(true).open(&t).unwrap().set_times(times).unwrap();
    assert!(w.uuids("original").is_empty(), "the stale document is not shown");
    assert_eq!(w.uuids("forged"), ["u8"], "the next search reads the transcript again");
}

#[test]
fn query_syntax_errors_become_plain_word_searches() {
    let w = world();
    append(&w.transcript("s1"), &[user("u1", None, "fn main() { println!(\"x\") } AND more")]);
    for query in ["main(", "\"main", "println!(", "nofield:main", "[[main", "main AND", "{main"] {
        let found = w.search(query, false);
        assert_eq!(found.hits.len(), 1, "{query}: {found:?}");
    }
    let found = w.search("main(", false);
    assert!(found.notes.iter().any(|n| n.contains("plain text")), "{found:?}");
    // A query with no words at all is answered, with a note, not an error.
    let found = w.search("((( )))", false);
    assert!(found.hits.is_empty() && !found.notes.is_empty(), "{found:?}");
    // Phrases and roles work as written.
    assert_eq!(w.search("\"println x\"", false).hits.len(), 1);
    assert!(w.search("\"x println\"", false).hits.is_empty());
    assert!(w.search("+role:assistant +main", false).hits.is_empty());
    assert_eq!(w.search("+role:user +main", false).hits.len(), 1);
    // Too long, or empty: a clear refusal.
    let scope = w.history.newest_session(Path::new("/home/u/proj")).unwrap();
    let search = |query: &str| {
        w.history.search(&SearchRequest {
            query,
            sources: &scope.sources,
            preferred: None,
            limit: 5,
            before_compaction_only: false,
        })
    };
    assert!(matches!(search("  "), Err(HistoryError::Invalid(_))));
    assert!(matches!(search(&"x".repeat(MAX_QUERY + 1)), Err(HistoryError::Invalid(_))));
}

#[test]
fn a_hostile_transcript_costs_bounded_memory_and_bounded_answers() {
    let w = world();
    let t = w.transcript("s1");
    // A line of 40 MiB (over the cap): skipped, the lines around it indexed.
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&t).unwrap();
    writeln!(f, "{}", user("u1", None, "before the giant")).unwrap();
    let giant = format!(r#"{{"type":"user","uuid":"g","message":{{"content":"{}"}}}}"#, "giant ".repeat(7 << 20));
    writeln!(f, "{giant}").unwrap();
    writeln!(f, "{}", user("u2", Some("u1"), "after the giant")).unwrap();
    drop(f);
    let mut giant_hits = w.uuids("giant");
    giant_hits.sort();
    assert_eq!(giant_hits, ["u1", "u2"]);
    let state = w.history.read_inner(|i| i.state()).unwrap();
    assert_eq!(state.sources["claude/-home-u-proj/s1"].skipped, 1);
    // Many matching records: at most the limit, each snippet bounded.
    let many: Vec<String> =
        (0..300).map(|i| user(&format!("m{i}"), None, &format!("needle {}", "hay ".repeat(400)))).collect();
    append(&t, &many);
    let found = w.search("needle", false);
    assert_eq!(found.hits.len(), 10);
    assert!(found.hits.iter().all(|h| h.snippet.chars().count() <= SNIPPET_CHARS + 2));
}

#[test]
fn the_store_and_other_projects_are_separate_scopes() {
    let w = world();
    append(&w.transcript("s1"), &[user("u1", None, "shared word")]);
    // A session of the store whose records name the project's directory joins "all".
    append(&w.state.join("sessions/mine.jsonl"), &[user("m1", None, "shared word from ctxd")]);
    // Another project is not searched.
    let other = w.project.parent().unwrap().join("-elsewhere");
    std::fs::create_dir_all(&other).unwrap();
    append(&other.join("x.jsonl"), &[user("x1", None, "shared word elsewhere")]);
    let mut uuids = w.uuids("shared");
    uuids.sort();
    assert_eq!(uuids, ["m1", "u1"]);
    // By name: the store's session, the Claude Code one, an unknown one.
    assert_eq!(w.history.session("mine", Origin::Claude).unwrap().origin, Origin::Store);
    assert_eq!(w.history.session("s1", Origin::Store).unwrap().origin, Origin::Claude);
    assert!(matches!(w.history.session("nope", Origin::Claude), Err(HistoryError::NotFound(_))));
    assert!(matches!(w.history.session("../../etc/passwd", Origin::Claude), Err(HistoryError::NotFound(_))));
}

#[test]
fn two_processes_share_the_index_one_updating_at_a_time() {
    // Two `History` values on one directory stand for two processes: tantivy's writer
    // lock is a file lock, held by one of them at a time.
    let w = world();
    let roots = w.history.roots.clone();
    let second = &History::open(&w.state, roots).unwrap();
    let t = w.transcript("s1");
    for round in 0..20 {
        append(&t, &[user(&format!("r{round}"), None, &format!("round{round} words"))]);
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| w.uuids(&format!("round{round}")));
            let scope = second.newest_session(Path::new("/home/u/proj")).unwrap();
            let b = s.spawn(move || {
                second
                    .search(&SearchRequest {
                        query: &format!("round{round}"),
                        sources: &scope.sources,
                        preferred: None,
                        limit: 5,
                        before_compaction_only: false,
                    })
                    .unwrap()
            });
            (a.join().unwrap(), b.join().unwrap())
        });
        assert_eq!(a, [format!("r{round}")], "round {round}");
        assert!(
            b.hits.len() == 1 || b.notes.iter().any(|n| n.contains("another ctxd process")),
            "round {round}: {b:?}"
        );
    }
}
