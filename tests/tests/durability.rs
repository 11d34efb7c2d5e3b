//! Durability over real pipes and real crashes: every acknowledged append survives
//! `kill -9`; the sled index can be deleted or damaged without losing anything.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::io::Write;

use ctxd_e2e::{Daemon, log_field, stored_uuids, user_record};
use serde_json::json;

fn open(daemon: &mut Daemon, id: &str) -> serde_json::Value {
    daemon.request("ctx/openSession", json!({"cwd": "/p", "model": "claude-sonnet-4-5", "sessionId": id})).unwrap()
}

/// Streams appends with many in flight, kills the daemon with SIGKILL while they are
/// being written, restarts, and checks that every acknowledged record is stored, in
/// order, and that the store opens cleanly. Repeated several times on one store.
#[test]
fn kill_9_in_the_middle_of_a_stream_of_appends_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut acknowledged: Vec<String> = Vec::new();
    let mut next = 0usize;
    for round in 0..5 {
        let mut daemon = Daemon::started(&state).unwrap();
        let opened = open(&mut daemon, "crashy");
        assert_eq!(opened["resumed"], round > 0);
        // What is stored now must start with everything acknowledged before, in order.
        let stored = stored_uuids(&state, "crashy").unwrap();
        assert!(stored.len() >= acknowledged.len(), "round {round}: lost records");
        assert_eq!(stored[..acknowledged.len()], acknowledged[..], "round {round}: order or content differs");
        assert_eq!(opened["records"].as_u64().unwrap(), stored.len() as u64);
        // Records written but never acknowledged (the crash came first) are kept; they
        // count as acknowledged from here on, since they are durable.
        acknowledged = stored;
        next = next.max(acknowledged.len());

        // Pipeline a burst, read some of the replies, then crash with the rest in flight.
        let mut in_flight = Vec::new();
        for _ in 0..400 {
            let uuid = format!("r{next:06}");
            next += 1;
            let records = json!([user_record(&uuid, None, &"payload ".repeat(100))]);
            let id = daemon.send_request("ctx/append", json!({"sessionId": "crashy", "records": records})).unwrap();
            in_flight.push((id, uuid));
        }
        let take = 50 + round * 60;
        for (id, uuid) in in_flight.iter().take(take) {
            let response = daemon.response(*id).unwrap();
            assert!(response.get("error").is_none(), "{response}");
            acknowledged.push(uuid.clone());
        }
        daemon.kill9().unwrap();
    }
    let mut daemon = Daemon::started(&state).unwrap();
    let opened = open(&mut daemon, "crashy");
    assert!(
        opened.get("diagnostics").is_none_or(|d| d
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m.as_str().unwrap().contains("torn"))),
        "{opened}"
    );
    let stored = stored_uuids(&state, "crashy").unwrap();
    assert_eq!(stored[..acknowledged.len()], acknowledged[..]);
    // No record is stored twice.
    let mut unique = stored.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), stored.len());
}

#[test]
fn a_torn_last_line_is_cut_and_the_session_opens() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "torn");
    let records = json!([user_record("u1", None, "a"), user_record("u2", Some("u1"), "b")]);
    daemon.request("ctx/append", json!({"sessionId": "torn", "records": records})).unwrap();
    daemon.kill9().unwrap();
    // A crash in the middle of a write leaves half a line.
    let path = state.join("sessions/torn.jsonl");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"{\"type\":\"user\",\"uuid\":\"u3\",\"mess")
        .unwrap();

    let mut daemon = Daemon::started(&state).unwrap();
    let opened = open(&mut daemon, "torn");
    assert_eq!(opened["records"], 2);
    let diagnostics = opened["diagnostics"].to_string();
    assert!(diagnostics.contains("torn"), "{diagnostics}");
    let records = json!([user_record("u3", Some("u2"), "c")]);
    daemon.request("ctx/append", json!({"sessionId": "torn", "records": records})).unwrap();
    assert_eq!(stored_uuids(&state, "torn").unwrap(), ["u1", "u2", "u3"]);
}

fn boundary(uuid: &str) -> serde_json::Value {
    json!({"parentUuid": null, "logicalParentUuid": "x", "type": "system", "subtype": "compact_boundary",
           "content": "Conversation compacted", "uuid": uuid, "compactMetadata": {"trigger": "manual", "preTokens": 1000}})
}

#[test]
fn deleting_or_damaging_the_index_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "indexed");
    let records = json!([user_record("u1", None, "before"), boundary("b1"), user_record("u2", Some("b1"), "after"),]);
    let appended = daemon.request("ctx/append", json!({"sessionId": "indexed", "records": records})).unwrap();
    let usage = appended["usage"].clone();
    assert!(daemon.stop().unwrap().success());
    let expected = stored_uuids(&state, "indexed").unwrap();

    // Deleted.
    std::fs::remove_dir_all(state.join("index")).unwrap();
    let mut daemon = Daemon::started(&state).unwrap();
    let opened = open(&mut daemon, "indexed");
    assert_eq!(opened["records"], 3);
    assert_eq!(opened["usage"], usage, "usage counts only what follows the boundary");
    assert!(daemon.stop().unwrap().success());

    // Damaged: every file of the index overwritten with garbage.
    for entry in walk(&state.join("index")) {
        std::fs::write(&entry, b"\x00garbage\xff not a sled file").unwrap();
    }
    let mut daemon = Daemon::started(&state).unwrap();
    let opened = open(&mut daemon, "indexed");
    assert_eq!(opened["records"], 3);
    assert_eq!(opened["usage"], usage);
    assert_eq!(stored_uuids(&state, "indexed").unwrap(), expected);
    // The damaged index is kept aside, never deleted.
    let aside = std::fs::read_dir(&state)
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().starts_with("index.damaged-"));
    assert!(aside, "damaged index should be moved aside");
}

#[test]
fn an_index_pointing_at_the_wrong_place_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "stale");
    let records = json!([user_record("u1", None, "one"), boundary("b1"), user_record("u2", Some("b1"), "two")]);
    daemon.request("ctx/append", json!({"sessionId": "stale", "records": records})).unwrap();
    assert!(daemon.stop().unwrap().success());
    // The transcript is replaced behind the daemon's back by one without a boundary at
    // the indexed offset (as if restored from an older backup).
    let path = state.join("sessions/stale.jsonl");
    let old = std::fs::read_to_string(&path).unwrap();
    let first_line = old.lines().next().unwrap();
    let padded = format!("{first_line}\n{first_line}\n{first_line}\n");
    std::fs::write(&path, padded).unwrap();
    let mut daemon = Daemon::started(&state).unwrap();
    let opened = open(&mut daemon, "stale");
    assert_eq!(opened["records"], 3);
}

/// A crash can lose the index's note of the newest boundary (sled writes it back later
/// than the transcript is synced), so the index points at an older boundary. Loading
/// from there walks over the newer one; the entry written back must name that newer
/// boundary with its own count, or every later resume over-counts the records before it.
#[test]
fn an_index_lagging_behind_a_newer_boundary_is_repaired_not_made_inconsistent() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "lag");
    let first = json!([user_record("u1", None, "one"), boundary("b1"), user_record("u2", Some("b1"), "two")]);
    daemon.request("ctx/append", json!({"sessionId": "lag", "records": first})).unwrap();
    assert!(daemon.stop().unwrap().success());
    let lagging = dir.path().join("index-lagging");
    ctxd_e2e::copy_dir(&state.join("index"), &lagging).unwrap();

    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "lag");
    let second = json!([
        user_record("u3", Some("u2"), "three"),
        user_record("u4", Some("u3"), "four"),
        boundary("b2"),
        user_record("u5", Some("b2"), "five")
    ]);
    let appended = daemon.request("ctx/append", json!({"sessionId": "lag", "records": second})).unwrap();
    assert_eq!(appended["records"], 7);
    let usage = appended["usage"].clone();
    assert!(daemon.stop().unwrap().success());
    // The index as a crash could leave it: it still knows only the first boundary.
    std::fs::remove_dir_all(state.join("index")).unwrap();
    ctxd_e2e::copy_dir(&lagging, &state.join("index")).unwrap();

    for restart in 0..3 {
        let mut daemon = Daemon::started(&state).unwrap();
        let opened = open(&mut daemon, "lag");
        assert_eq!(opened["records"], 7, "restart {restart}: {opened}");
        assert_eq!(opened["usage"], usage, "restart {restart}");
        assert!(daemon.stop().unwrap().success());
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// The `ctxd::latency` log accounts for each append and each assemble: its steps follow
/// one another, add up to the time in the daemon, and the frame was read while the test
/// waited.
#[test]
fn each_append_and_assemble_reports_where_its_time_went() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    open(&mut daemon, "timed");
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64;
    let mut parent: Option<String> = None;
    for i in 0..3 {
        let uuid = format!("timed-{i}");
        let answer = daemon
            .request(
                "ctx/append",
                json!({"sessionId": "timed", "records": [user_record(&uuid, parent.as_deref(), "hello")]}),
            )
            .unwrap();
        assert_eq!(answer["appended"], 1);
        parent = Some(uuid);
        daemon.request("ctx/assemble", json!({"sessionId": "timed", "maxTokens": 1000})).unwrap();
    }
    let after = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64;
    daemon.stop().unwrap();
    let log = std::fs::read_to_string(state.with_extension("log")).unwrap();
    let lines: Vec<&str> =
        log.lines().filter(|l| l.contains("ctxd::latency") && l.contains("session=\"timed\"")).collect();
    let (appends, assembles): (Vec<&str>, Vec<&str>) = lines.into_iter().partition(|l| l.contains("append steps"));
    assert_eq!((appends.len(), assembles.len()), (3, 3), "{log}");
    for line in assembles {
        let field = |name: &str| -> u64 {
            log_field(line, name).unwrap_or_else(|| panic!("no {name} in {line}")).parse().unwrap()
        };
        let steps = ["parse", "to_actor", "build", "to_reply", "encode"].map(field);
        let (sum, total) = (steps.iter().sum::<u64>(), field("in_daemon"));
        assert!(sum <= total && total - sum < 6, "steps {steps:?} do not add up to {total}: {line}");
        assert!(field("build") > 0 && field("bytes") > 100, "{line}");
        assert!((before..=after).contains(&field("read_unix_us")), "{line}");
    }
    for line in appends {
        let field = |name: &str| -> u64 {
            log_field(line, name).unwrap_or_else(|| panic!("no {name} in {line}")).parse().unwrap()
        };
        let steps = ["parse", "to_actor", "to_write", "write_sync", "to_resume", "apply", "to_reply"].map(field);
        let (sum, total) = (steps.iter().sum::<u64>(), field("in_daemon"));
        // Each step is rounded down to whole µs on its own.
        assert!(sum <= total && total - sum < 8, "steps {steps:?} do not add up to {total}: {line}");
        assert!(field("write_sync") > 0, "{line}");
        let read = field("read_unix_us");
        assert!((before..=after).contains(&read), "read at {read}, not between {before} and {after}: {line}");
    }
}
