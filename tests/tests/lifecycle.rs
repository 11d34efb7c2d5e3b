//! The LSP lifecycle over real pipes: initialize, capabilities, shutdown, exit codes,
//! and one daemon per store.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use ctxd_e2e::Daemon;
use serde_json::{Value, json};

#[test]
fn initialize_announces_ctx_methods_and_shutdown_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start(&dir.path().join("state")).unwrap();
    let result = daemon.initialize().unwrap();
    assert_eq!(result["serverInfo"]["name"], "ctxd");
    assert_eq!(result["serverInfo"]["version"], env!("CARGO_PKG_VERSION"));
    let ctxd = &result["capabilities"]["experimental"]["ctxd"];
    let methods: Vec<&str> = ctxd["methods"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for m in ["ctx/openSession", "ctx/append", "ctx/usage", "ctx/closeSession"] {
        assert!(methods.contains(&m), "{m} missing from {methods:?}");
    }
    assert_eq!(ctxd["stateDir"], dir.path().join("state").display().to_string());
    assert_eq!(ctxd["processId"], daemon.pid());
    let status = daemon.stop().unwrap();
    assert!(status.success(), "{status:?}");
}

/// The daemon widens the pipe it answers on, so that writing a whole assembled request
/// (hundreds of KB) does not block its writer, and every answer queued behind, until
/// the client has read most of it.
#[test]
fn the_answer_pipe_is_widened_to_a_mebibyte() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::started(&dir.path().join("state")).unwrap();
    // The pipe the answer to `initialize` came through, seen via the daemon's descriptor 1.
    let pipe = std::fs::File::open(format!("/proc/{}/fd/1", daemon.pid())).unwrap();
    let size = rustix::pipe::fcntl_getpipe_size(&pipe).unwrap();
    // Checked for exactly 1 MiB on every machine: one where no process of ours may have
    // a pipe that wide (pipe-max-size lowered, no CAP_SYS_RESOURCE) fails here and says
    // so, rather than passing on a weaker check.
    let limit = std::fs::read_to_string("/proc/sys/fs/pipe-max-size").unwrap();
    let (_probe_read, probe) = rustix::pipe::pipe().unwrap();
    let allowed = rustix::pipe::fcntl_setpipe_size(&probe, 1 << 20);
    assert!(
        allowed.is_ok(),
        "this machine lets this process have no 1 MiB pipe (pipe-max-size {}, {allowed:?}): the test cannot check the widening here",
        limit.trim()
    );
    assert_eq!(size, 1 << 20, "the daemon's stdout pipe, widened");
    drop(pipe);
    assert!(daemon.stop().unwrap().success());
}

/// After `shutdown` every request is refused, the per-turn ones (which the daemon
/// answers on a fast path) included, and nothing more is stored.
#[test]
fn requests_after_shutdown_are_refused_the_per_turn_ones_too() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut daemon = Daemon::started(&state).unwrap();
    daemon
        .request("ctx/openSession", json!({"cwd": dir.path(), "model": "claude-sonnet-4-5-20250929", "sessionId": "s"}))
        .unwrap();
    daemon
        .request("ctx/append", json!({"sessionId": "s", "records": [ctxd_e2e::user_record("u1", None, "before")]}))
        .unwrap();
    daemon.request("shutdown", Value::Null).unwrap();
    let refused = [
        ("ctx/append", json!({"sessionId": "s", "records": [ctxd_e2e::user_record("u2", Some("u1"), "after")]})),
        ("ctx/assemble", json!({"sessionId": "s", "maxTokens": 1000})),
        ("ctx/usage", json!({"sessionId": "s"})),
    ];
    for (method, params) in refused {
        let error = daemon.request_error(method, params).unwrap();
        assert_eq!(error["code"], -32600, "{method}: {error}");
    }
    daemon.notify("exit", Value::Null).unwrap();
    assert_eq!(daemon.wait().unwrap().code(), Some(0));
    assert_eq!(ctxd_e2e::stored_uuids(&state, "s").unwrap(), ["u1"]);
}

#[test]
fn exit_without_shutdown_is_code_1_and_closed_stdin_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::started(&dir.path().join("a")).unwrap();
    daemon.notify("exit", Value::Null).unwrap();
    assert_eq!(daemon.wait().unwrap().code(), Some(1));

    let mut daemon = Daemon::started(&dir.path().join("b")).unwrap();
    daemon.close_stdin();
    assert_eq!(daemon.wait().unwrap().code(), Some(0));
}

#[test]
fn requests_before_initialize_are_refused_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start(&dir.path().join("state")).unwrap();
    let error = daemon.request_error("ctx/usage", json!({"sessionId": "x"})).unwrap();
    assert_eq!(error["code"], -32002, "{error}");
    daemon.initialize().unwrap();
    let error = daemon.request_error("ctx/usage", json!({"sessionId": "x"})).unwrap();
    assert_eq!(error["code"], -33001, "{error}");
}

#[test]
fn a_second_editor_on_the_same_store_shares_the_first_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut first = Daemon::started(&state).unwrap();
    let opened = first.request("ctx/openSession", json!({"cwd": "/tmp", "model": "claude-sonnet-4-5"})).unwrap();
    let id = opened["sessionId"].as_str().unwrap().to_owned();

    // The second `ctxd serve` relays to the first: one store, one set of sessions.
    let mut second = Daemon::start(&state).unwrap();
    let initialized = second.initialize().unwrap();
    let capabilities = &initialized["capabilities"]["experimental"]["ctxd"];
    // Its editor's own process is the one it names (the one that editor stops).
    assert_eq!(capabilities["processId"], second.pid(), "{capabilities}");
    assert_eq!(capabilities["stateDir"], state.display().to_string());
    // The same store spelled another way is no other store.
    let mut spelled = Daemon::start(&state).unwrap();
    let slash = format!("{}/", state.display());
    spelled.request("initialize", json!({"capabilities": {}, "initializationOptions": {"stateDir": slash}})).unwrap();
    drop(spelled);
    second.request("ctx/openSession", json!({"sessionId": id, "cwd": "/tmp", "model": "claude-sonnet-4-5"})).unwrap();
    let records = json!([ctxd_e2e::user_record("u1", None, "from the second editor")]);
    second.request("ctx/append", json!({"sessionId": id, "records": records})).unwrap();
    // The first editor sees the append (its usage notification) and the record.
    first.wait_notification("ctx/usageChanged", |p| p["sessionId"] == json!(id)).unwrap();
    let records = json!([ctxd_e2e::user_record("u2", Some("u1"), "from the first editor")]);
    first.request("ctx/append", json!({"sessionId": id, "records": records})).unwrap();
    assert_eq!(ctxd_e2e::stored_uuids(&state, &id).unwrap(), ["u1", "u2"]);

    // A client that asks for another store in initialize alone gets the way to it.
    let mut other = Daemon::start(&state).unwrap();
    let error = other
        .request_error(
            "initialize",
            json!({"capabilities": {}, "initializationOptions": {"stateDir": "/tmp/elsewhere"}}),
        )
        .unwrap();
    assert_eq!(error["code"], -32602, "{error}");
    assert!(error["message"].as_str().unwrap().contains("--state-dir /tmp/elsewhere"), "{error}");
    drop(other);

    // The second editor leaving closes nothing of the first's.
    assert!(second.stop().unwrap().success());
    let usage = first.request("ctx/usage", json!({"sessionId": id})).unwrap()["usage"].clone();
    assert!(usage["tokens"].as_u64().unwrap() > 0, "{usage}");

    // The first editor leaving ends the daemon, and the relay of a third with it: its
    // editor restarts it, and the restarted one is the daemon.
    let mut third = Daemon::started(&state).unwrap();
    assert!(first.stop().unwrap().success());
    let ended = third.wait().unwrap();
    assert_eq!(ended.code(), Some(1), "a relay whose daemon left exits with 1");
    let mut restarted = Daemon::started(&state).unwrap();
    let opened = restarted
        .request("ctx/openSession", json!({"sessionId": id, "cwd": "/tmp", "model": "claude-sonnet-4-5"}))
        .unwrap();
    assert_eq!(opened["usage"]["tokens"], usage["tokens"], "{opened}");
}

#[test]
fn a_store_whose_daemon_does_not_listen_gets_a_clear_error() {
    // A daemon holds the store but serves no socket (here: removed under it).
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let first = Daemon::started(&state).unwrap();
    std::fs::remove_file(state.join("ctxd.sock")).unwrap();
    let mut second = Daemon::start(&state).unwrap();
    let error = second.request_error("initialize", json!({"capabilities": {}})).unwrap();
    assert_eq!(error["code"], -33003, "{error}");
    let message = error["message"].as_str().unwrap();
    // The cause comes before the first ':' (what an editor's status shows), the way out after.
    assert_eq!(message.split(':').next(), Some(format!("store in use by another ctxd (pid {})", first.pid()).as_str()));
    assert!(message.contains(&state.display().to_string()), "{message}");
    assert!(message.contains("its own state directory"), "{message}");
}

#[test]
fn empty_settings_encoded_as_a_list_are_accepted() {
    // Lua encodes an empty table as `[]`.
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start(&dir.path().join("state")).unwrap();
    let result =
        daemon.request("initialize", json!({"capabilities": {}, "initializationOptions": {"settings": []}})).unwrap();
    assert_eq!(result["serverInfo"]["name"], "ctxd");
    let mut daemon = Daemon::start(&dir.path().join("other")).unwrap();
    let error = daemon
        .request_error("initialize", json!({"capabilities": {}, "initializationOptions": {"settings": [1]}}))
        .unwrap();
    assert_eq!(error["code"], -32602, "{error}");
}

#[test]
fn initialization_options_can_move_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("elsewhere");
    let mut daemon = Daemon::start(&dir.path().join("flag")).unwrap();
    let result = daemon
        .request("initialize", json!({"capabilities": {}, "initializationOptions": {"stateDir": elsewhere}}))
        .unwrap();
    assert_eq!(result["capabilities"]["experimental"]["ctxd"]["stateDir"], elsewhere.display().to_string());
    let opened = daemon.request("ctx/openSession", json!({"cwd": "/", "model": "m", "sessionId": "moved"})).unwrap();
    assert_eq!(opened["sessionId"], "moved");
    assert!(elsewhere.join("sessions/moved.jsonl").exists());
}
