//! The shared daemon against another user and a hostile client: a state directory
//! another user made (or may write to) is refused and left as it was, a lock that is a
//! link or someone else's file is never written, a socket served by another user is
//! never relayed to; a state directory of any depth shares, an editor that comes while
//! the first has not initialized waits for it; and a client cannot trust a folder.
//!
//! The cases with other users need root (to make files of uid 65534): run as another
//! user, they fail, loudly, rather than pass untested.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // test code: a failed step is a failed test

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ctxd_e2e::{Daemon, user_record};
use serde_json::{Value, json};

/// The user the other files belong to.
const NOBODY: u32 = 65_534;

fn must_be_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test makes files of another user (uid {NOBODY}) and must run as root (as CI does)"
    );
}

fn chown(path: &Path, uid: u32) {
    let status = Command::new("chown").arg("-h").arg(format!("{uid}:{uid}")).arg(path).status().unwrap();
    assert!(status.success(), "chown {}", path.display());
}

/// What the directory holds, with each entry's owner and mode, and its own.
fn snapshot(dir: &Path) -> Vec<(String, u32, u32)> {
    let meta = std::fs::symlink_metadata(dir).unwrap();
    let mut entries = vec![(".".to_owned(), meta.uid(), meta.mode())];
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = std::fs::symlink_metadata(entry.path()).unwrap();
        entries.push((entry.file_name().to_string_lossy().into_owned(), meta.uid(), meta.mode()));
    }
    entries.sort();
    entries
}

/// `ctxd serve` on `state` with its default log (under the state directory), asked to
/// initialize; returns its answer.
fn initialize_with_default_log(state: &Path, home: &Path) -> Value {
    let mut child = ctxd_e2e::ctxd_command()
        .arg("--state-dir")
        .arg(state)
        .arg("serve")
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let request = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}});
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&ctxd_e2e::frame(request.to_string().as_bytes())).unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let answer = ctxd_e2e::read_frame(&mut stdout).unwrap().unwrap();
    drop(stdin);
    child.wait().unwrap();
    serde_json::from_slice(&answer).unwrap()
}

#[test]
fn a_state_directory_another_user_made_is_refused_and_left_as_it_was() {
    must_be_root();
    let dir = tempfile::tempdir().unwrap();
    for mode in [0o700, 0o777] {
        let state = dir.path().join(format!("theirs-{mode:o}"));
        std::fs::create_dir(&state).unwrap();
        std::fs::write(state.join("planted"), "theirs").unwrap();
        chown(&state.join("planted"), NOBODY);
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(mode)).unwrap();
        chown(&state, NOBODY);
        let before = snapshot(&state);

        let mut daemon = Daemon::start(&state).unwrap();
        let error = daemon.request_error("initialize", json!({"capabilities": {}})).unwrap();
        let message = error["message"].as_str().unwrap();
        assert!(message.starts_with("state directory of another user:"), "{message}");
        for part in [&state.display().to_string(), "uid 65534", &format!("mode {mode:04o}"), "--state-dir"] {
            assert!(message.contains(part), "{part:?} missing from {message}");
        }
        // Its log (when it is the default one) is not written there either.
        let answer = initialize_with_default_log(&state, &dir.path().join("home"));
        assert!(answer["error"]["message"].as_str().unwrap().contains("another user"), "{answer}");
        assert_eq!(snapshot(&state), before, "nothing made or changed in {}", state.display());
    }
}

#[test]
fn a_state_directory_others_may_write_to_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("open");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let before = snapshot(&state);
    let mut daemon = Daemon::start(&state).unwrap();
    let error = daemon.request_error("initialize", json!({"capabilities": {}})).unwrap();
    let message = error["message"].as_str().unwrap();
    assert!(message.starts_with("state directory writable by others:"), "{message}");
    assert!(message.contains("mode 0777") && message.contains("chmod 700"), "{message}");
    assert_eq!(snapshot(&state), before);
    // Once it is private, it is used.
    drop(daemon);
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    Daemon::started(&state).unwrap();
}

#[test]
fn a_lock_that_is_a_link_or_another_users_file_is_neither_followed_nor_written() {
    must_be_root();
    let dir = tempfile::tempdir().unwrap();
    let precious = dir.path().join("precious");
    std::fs::write(&precious, "keep me\n").unwrap();
    type Plant<'a> = &'a dyn Fn(&Path);
    let cases: [(&str, Plant<'_>, &str); 3] = [
        ("symlink", &|lock| std::os::unix::fs::symlink(&precious, lock).unwrap(), "a symbolic link"),
        ("hard link", &|lock| std::fs::hard_link(&precious, lock).unwrap(), "2 names"),
        (
            "another user's",
            &|lock| {
                std::fs::write(lock, "theirs\n").unwrap();
                chown(lock, NOBODY);
            },
            "owned by uid 65534",
        ),
    ];
    for (name, plant, why) in cases {
        let state = dir.path().join(name.replace(' ', "-"));
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
        let lock = state.join("ctxd.lock");
        plant(&lock);
        let (planted, before) = (std::fs::read(&lock).unwrap(), snapshot(&state));

        let mut daemon = Daemon::start(&state).unwrap();
        let error = daemon.request_error("initialize", json!({"capabilities": {}})).unwrap();
        let message = error["message"].as_str().unwrap();
        assert!(message.starts_with("store lock that is not ctxd's:"), "{name}: {message}");
        assert!(message.contains(why) && message.contains(&lock.display().to_string()), "{name}: {message}");
        assert_eq!(std::fs::read(&lock).unwrap(), planted, "{name}: the lock's file was written");
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me\n", "{name}");
        assert_eq!(snapshot(&state), before, "{name}");
    }
}

/// A child process killed when the test ends, passed or not.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Another user's process that holds the lock of `state` and listens on its socket (it
/// binds as root, then becomes uid 65534 before `listen`, so the socket's peer is that
/// user). It prints `ready`, then for each connection the bytes it received, and
/// answers any `initialize` as a daemon would.
fn foreign_listener(state: &Path) -> Killed {
    const SCRIPT: &str = r#"
import fcntl, os, socket, sys
state = sys.argv[1]
lock = open(os.path.join(state, "ctxd.lock"), "w")
fcntl.flock(lock, fcntl.LOCK_EX)
lock.write(f"{os.getpid()}\n"); lock.flush()
server = socket.socket(socket.AF_UNIX)
server.bind(os.path.join(state, "ctxd.sock"))
os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
server.listen()
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    conn.settimeout(3)
    got = b""
    try:
        got = conn.recv(65536)
        if got:
            body = b'{"jsonrpc":"2.0","id":1,"result":{"capabilities":{},"serverInfo":{"name":"ctxd"}}}'
            conn.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    except OSError:
        pass
    print(f"received {len(got)}", flush=True)
    conn.close()
"#;
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(state)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs the other user's listener");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let child = Killed(child);
    assert_eq!(line.trim(), "ready");
    child
}

#[test]
fn a_socket_another_user_listens_on_is_never_relayed_to() {
    must_be_root();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut listener = foreign_listener(&state);

    let mut daemon = Daemon::start(&state).unwrap();
    let error = daemon.request_error("initialize", json!({"capabilities": {}})).unwrap();
    assert_eq!(error["code"], -33003, "{error}");
    let log = std::fs::read_to_string(state.with_extension("log")).unwrap();
    assert!(log.contains("the store's socket is not served by this user; not relaying to it"), "{log}");
    // The daemon is done with the socket: whatever reached the other user is in its output.
    drop(daemon);
    listener.0.kill().unwrap();
    let mut heard = String::new();
    std::io::Read::read_to_string(listener.0.stdout.as_mut().unwrap(), &mut heard).unwrap();
    assert!(heard.lines().all(|l| l == "received 0"), "the other user's listener got: {heard}");
}

#[test]
fn a_state_directory_deeper_than_a_socket_address_shares_one_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let mut state = dir.path().to_path_buf();
    while state.as_os_str().len() < 200 {
        state = state.join("d".repeat(40));
    }
    assert!(state.join("ctxd.sock").as_os_str().len() > 200);
    let mut first = Daemon::started(&state).unwrap();
    first
        .request("ctx/openSession", json!({"cwd": "/tmp", "model": "claude-sonnet-4-5", "sessionId": "deep"}))
        .unwrap();

    let mut second = Daemon::start(&state).unwrap();
    let initialized = second.initialize().unwrap();
    assert_eq!(initialized["capabilities"]["experimental"]["ctxd"]["processId"], second.pid(), "{initialized}");
    let records = json!([user_record("u1", None, "from the second editor")]);
    second.request("ctx/append", json!({"sessionId": "deep", "records": records})).unwrap();
    first.wait_notification("ctx/usageChanged", |p| p["sessionId"] == "deep").unwrap();
    assert_eq!(ctxd_e2e::stored_uuids(&state, "deep").unwrap(), ["u1"]);
}

#[test]
fn an_editor_that_comes_while_the_first_has_not_initialized_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // The first editor started its daemon and is slow to initialize it.
    let mut first = Daemon::start(&state).unwrap();
    let mut second = Daemon::start(&state).unwrap();
    let asked = second.send_request("initialize", json!({"capabilities": {}})).unwrap();
    // Longer than a starting `ctxd serve` waits for a socket to appear.
    std::thread::sleep(Duration::from_secs(6));
    first.initialize().unwrap();
    let answer = second.response(asked).unwrap();
    assert!(answer.get("error").is_none(), "{answer}");
    let ctxd = &answer["result"]["capabilities"]["experimental"]["ctxd"];
    assert_eq!(ctxd["processId"], second.pid(), "{answer}");
    assert_eq!(ctxd["stateDir"], state.display().to_string(), "{answer}");
    // One daemon: what the second appends, the first sees.
    second.notify("initialized", json!({})).unwrap();
    second.request("ctx/openSession", json!({"cwd": "/tmp", "model": "claude-sonnet-4-5", "sessionId": "w"})).unwrap();
    first.wait_notification("ctx/usageChanged", |p| p["sessionId"] == "w").unwrap();
}

/// A project whose settings run a PreCompact hook that leaves `marker`.
fn project_with_hook(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let project = dir.join("project");
    std::fs::create_dir_all(project.join(".ctxd")).unwrap();
    let marker = dir.join("hook-ran");
    let hooks = json!({"hooks": {"PreCompact": [{"hooks": [
        {"type": "command", "command": format!("touch {}", marker.display())}
    ]}]}});
    std::fs::write(project.join(".ctxd/settings.json"), hooks.to_string()).unwrap();
    (project, marker)
}

/// Opens session `id` in `project`, fills it and compacts it; returns the open's answer.
fn compact_in(daemon: &mut Daemon, project: &Path, id: &str) -> Value {
    let opened = daemon
        .request("ctx/openSession", json!({"cwd": project, "model": "claude-sonnet-4-5", "sessionId": id}))
        .unwrap();
    let records: Vec<Value> = ctxd_e2e::example(40);
    daemon.request("ctx/append", json!({"sessionId": id, "records": records})).unwrap();
    daemon.request("ctx/compact", json!({"sessionId": id})).unwrap();
    opened
}

#[test]
fn a_clients_trusted_folders_do_not_run_a_repositorys_hooks() {
    let dir = tempfile::tempdir().unwrap();
    let (project, marker) = project_with_hook(dir.path());
    let state = dir.path().join("state");
    let trust = json!({"trustedFolders": [project]});
    let mut daemon = Daemon::start(&state).unwrap();
    daemon.request("initialize", json!({"capabilities": {}, "initializationOptions": {"settings": trust}})).unwrap();
    daemon.notify("initialized", json!({})).unwrap();
    let opened = compact_in(&mut daemon, &project, "by-initialize");
    assert!(!marker.exists(), "a client's trustedFolders ran the repository's hook");
    let diagnostics = opened["diagnostics"].to_string();
    assert!(diagnostics.contains("`trustedFolders` ignored: trust is the user's"), "{diagnostics}");
    assert!(diagnostics.contains("`hooks` ignored"), "{diagnostics}");
    // Nor by a later change of the client's settings.
    daemon.notify("workspace/didChangeConfiguration", json!({"settings": trust})).unwrap();
    compact_in(&mut daemon, &project, "by-change");
    assert!(!marker.exists(), "a client's trustedFolders ran the repository's hook");
    drop(daemon);

    // The user's own settings file trusts it: the hook runs (the test can see it run).
    let state = dir.path().join("trusted");
    ctxd_e2e::trust_folder(&state, &project).unwrap();
    let mut daemon = Daemon::started(&state).unwrap();
    compact_in(&mut daemon, &project, "by-the-user");
    assert!(marker.exists(), "the user's trust did not run the hook");
}
