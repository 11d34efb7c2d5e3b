//! The load benchmark's correctness-only short form: sessions appending and assembling
//! at once over one connection while some of them compact. Every answer is checked
//! and every appended record is stored, in order. (Latencies are the benchmark's
//! business: `cargo bench -p ctxd-e2e --bench load`.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::time::{Duration, Instant};

use ctxd_e2e::load::{Background, Compactions, Mux, Workload, check_stored, open_and_seed, session_id};
use ctxd_e2e::stored_uuids;

#[test]
fn concurrent_sessions_with_compactions_answer_everything_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mux = Mux::start(&state, &[]).unwrap();
    let workload = Workload {
        name: "bg".to_owned(),
        sessions: 12,
        compacting: 3,
        compactions: Compactions::EveryAppends(15),
        assemble_every: 3,
        pause: Duration::ZERO,
        operations: Some(60),
        keep_requests: false,
    };
    let seeded: Vec<Vec<String>> = (0..workload.sessions)
        .map(|i| {
            open_and_seed(&mux, &session_id(i, &workload), if i < workload.compacting { 150 } else { 20 }).unwrap()
        })
        .collect();
    let logs = Background::start(&mux, &workload, seeded).join().unwrap();
    let compactions: u64 = logs.iter().map(|l| l.compactions).sum();
    let appends: u64 = logs.iter().map(|l| l.appends).sum();
    let assembles: u64 = logs.iter().map(|l| l.assembles).sum();
    println!("{appends} appends, {assembles} assembles, {compactions} compactions, all answered and checked");
    // 60 operations each: 20 assembles and 40 appends; a compaction after the 15th and
    // the 30th append of each compacting session.
    assert_eq!(compactions, 3 * 2);
    assert_eq!(appends, 12 * 40);
    assert_eq!(assembles, 12 * 20);
    check_stored(&state, &logs).unwrap();
}

/// Sessions compacting back to back on a second client while their first client
/// appends and assembles: every record appended during a compaction is stored, in order.
#[test]
fn sessions_compacting_back_to_back_keep_every_record_appended_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mux = Mux::start(&state, &[]).unwrap();
    let workload = Workload {
        name: "cont".to_owned(),
        sessions: 6,
        compacting: 2,
        compactions: Compactions::Continuous,
        assemble_every: 3,
        pause: Duration::from_millis(2),
        operations: Some(90),
        // Assembles `since` the last answer while compactions replace the view under them.
        keep_requests: true,
    };
    let seeded: Vec<Vec<String>> = (0..workload.sessions)
        .map(|i| {
            open_and_seed(&mux, &session_id(i, &workload), if i < workload.compacting { 150 } else { 20 }).unwrap()
        })
        .collect();
    let logs = Background::start(&mux, &workload, seeded).join().unwrap();
    for log in &logs[..2] {
        assert!(log.compactions >= 1, "{}: no compaction ran", log.id);
        assert_eq!(log.summarizers.get("offline"), Some(&log.compactions), "{}: {:?}", log.id, log.summarizers);
    }
    assert!(logs[2..].iter().all(|l| l.compactions == 0));
    assert_eq!(logs.iter().map(|l| l.appends).sum::<u64>(), 6 * 60);
    check_stored(&state, &logs).unwrap();
}

/// A paused background sends nothing until resumed, and every answer it waited for has
/// arrived when `pause` returns: what lets the benchmark measure an idle daemon between
/// loaded windows. Read from the store: no session's transcript grows while paused, and
/// every one grows again after the resume.
#[test]
fn a_paused_background_sends_nothing_until_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mux = Mux::start(&state, &[]).unwrap();
    let workload = Workload {
        name: "gate".to_owned(),
        sessions: 6,
        compacting: 2,
        compactions: Compactions::Continuous,
        assemble_every: 3,
        pause: Duration::from_millis(5),
        operations: None,
        keep_requests: true,
    };
    let seeded: Vec<Vec<String>> = (0..workload.sessions)
        .map(|i| {
            open_and_seed(&mux, &session_id(i, &workload), if i < workload.compacting { 150 } else { 20 }).unwrap()
        })
        .collect();
    // Records in each transcript on disk, compaction records included.
    let records = || -> Vec<usize> {
        (0..workload.sessions).map(|i| stored_uuids(&state, &session_id(i, &workload)).unwrap().len()).collect()
    };
    // Every session goes on past `before`: waited for, failing after a minute.
    let every_session_grows = |before: &[usize]| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = records();
            if before.iter().zip(&now).all(|(b, n)| n > b) {
                return;
            }
            assert!(Instant::now() < deadline, "not every session went on: {before:?} -> {now:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut before = records();
    let background = Background::start(&mux, &workload, seeded);
    for _ in 0..3 {
        every_session_grows(&before);
        background.pause();
        // Every client and compacting thread waits at the gate: none is about to send.
        background.wait_parked(Duration::from_secs(60)).unwrap();
        let paused = records();
        // Nothing is stored over the next 150 ms either.
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(records(), paused, "records were appended while paused");
        background.resume();
        before = paused;
    }
    every_session_grows(&before);
    let logs = background.stop().unwrap();
    assert!(logs[..2].iter().all(|l| l.compactions >= 1), "the compacting sessions did not compact");
    check_stored(&state, &logs).unwrap();
}
