//! A running gateway seen from another process, without a runtime: where it listens
//! (the setting `gateway.listen` of the user's own settings file), whether the process
//! listening there is the user's own, and its live figures (`GET /ctxd/sessions`).
//!
//! `ctxd statusline` asks the gateway on every refresh and must never make Claude Code
//! wait, so every exchange here has one deadline for connecting, writing and reading
//! together, and any failure is simply "no answer". The request is one HTTP/1.0 `GET`
//! on loopback, written and read with the standard library: an HTTP client library
//! would start a runtime (or a thread pool) per status line for a few hundred bytes.
//! HTTP/1.0 keeps the answer simple to read: the server ends it by closing the
//! connection, never with chunked encoding.
//!
//! Another user on the machine can listen on a loopback port too. Before any process
//! sends Claude Code's traffic (and its key) to the gateway's address (`ctxd claude
//! run`), [`listener_is_ours`] checks that the socket listening there belongs to this
//! user (Linux: `/proc/net/tcp`).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ctxd_core::cache_state::{CacheState, FIVE_MINUTES_SECS, prices_for};
use ctxd_core::gateway::SESSIONS_PATH;
use ctxd_core::record::TokenUsage;
use ctxd_proto::{GatewaySession, GatewaySessions, GatewaySettings};
use serde::Deserialize;

use crate::process_env::ProcessEnv;

/// Where the gateway listens unless the setting says otherwise
/// ([`GatewaySettings::DEFAULT_LISTEN`]).
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8417);
/// Most bytes of an answer read (the registry holds at most 1,000 sessions of ~400
/// bytes).
const MAX_ANSWER: usize = 4 << 20;

/// The user's ctxd settings file (`~/.config/ctxd/settings.json`), where the gateway's
/// address is chosen: the user's choice alone, a project's settings do not move it.
fn user_file(env: &ProcessEnv) -> Option<PathBuf> {
    env.config_home().map(|dir| dir.join("ctxd/settings.json"))
}

/// The `gateway` settings of the user's ctxd settings file, and what was wrong with it.
pub fn user_settings(env: &ProcessEnv) -> (GatewaySettings, Option<String>) {
    user_file(env).map_or_else(|| (GatewaySettings::default(), None), |file| user_settings_in(&file))
}

/// [`user_settings`] from a given settings file.
pub fn user_settings_in(file: &Path) -> (GatewaySettings, Option<String>) {
    let text = match crate::outside::read_text(file, crate::outside::SETTINGS_FILE) {
        Ok(text) => text,
        Err(crate::outside::OutsideError::Missing) => return (GatewaySettings::default(), None),
        Err(e) => return (GatewaySettings::default(), Some(format!("{}: {e}", file.display()))),
    };
    let value: serde_json::Value = match serde_json::from_str(&text) {
        Ok(value) => value,
        Err(e) => return (GatewaySettings::default(), Some(format!("{}: not JSON: {e}", file.display()))),
    };
    match value.get("gateway") {
        None | Some(serde_json::Value::Null) => (GatewaySettings::default(), None),
        Some(gateway) => match GatewaySettings::deserialize(gateway) {
            Ok(settings) => (settings, None),
            Err(e) => (GatewaySettings::default(), Some(format!("{}: gateway: {e}", file.display()))),
        },
    }
}

/// Where the user's gateway listens: `gateway.listen`, else [`DEFAULT_LISTEN`]. A
/// setting that is not an address is reported and the default used.
pub fn listen_address(env: &ProcessEnv) -> (SocketAddr, Option<String>) {
    user_file(env).map_or((DEFAULT_LISTEN, None), |file| listen_address_in(&file))
}

/// [`listen_address`] from a given settings file.
pub fn listen_address_in(file: &Path) -> (SocketAddr, Option<String>) {
    let (settings, problem) = user_settings_in(file);
    let Some(text) = settings.listen else { return (DEFAULT_LISTEN, problem) };
    // Loopback or not is for the caller to judge (the gateway refuses, `claude run` warns).
    match super::listen_address(&text, true) {
        Ok(addr) => (addr, problem),
        Err(e) => (DEFAULT_LISTEN, Some(format!("{}: {e}", file.display()))),
    }
}

/// The base URL Claude Code is given for a gateway at `addr`.
pub fn base_url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

/// A session's last answer as a usage record.
pub fn token_usage(session: &GatewaySession) -> TokenUsage {
    TokenUsage {
        input_tokens: session.input_tokens,
        cache_creation_input_tokens: session.cache_creation_input_tokens,
        cache_read_input_tokens: session.cache_read_input_tokens,
        output_tokens: session.output_tokens,
    }
}

/// The cache state from the gateway's last request of the session at `now_ms`, priced
/// for its model (else `model_id`'s); `None` when that request neither read nor wrote
/// the cache.
pub fn cache_state(session: &GatewaySession, now_ms: i64, model_id: &str) -> Option<CacheState> {
    if session.cache_read_input_tokens == 0 && session.cache_creation_input_tokens == 0 {
        return None;
    }
    let answered_ms = ctxd_core::view::parse_rfc3339_ms(&session.answered_at)?;
    let ttl = Some(session.cache_ttl_seconds).filter(|&t| t > 0).unwrap_or(FIVE_MINUTES_SECS);
    let prices = prices_for(&session.model).or_else(|| prices_for(model_id));
    let tokens = token_usage(session).request_tokens();
    Some(ctxd_core::cache_state::cache_state(now_ms, answered_ms, ttl, Some(tokens).filter(|&t| t > 0), prices))
}

/// The gateway's sessions at `addr`, asked within `deadline`; `None` for no gateway, no
/// answer in time, or an answer that is not the gateway's.
pub fn sessions(addr: SocketAddr, deadline: Duration) -> Option<GatewaySessions> {
    match get(addr, SESSIONS_PATH, deadline) {
        Ok((200, body)) => serde_json::from_slice(&body).ok(),
        _ => None,
    }
}

/// The gateway's figures for `session_id`, as [`sessions`], `None` for no such session.
pub fn session(addr: SocketAddr, session_id: &str, deadline: Duration) -> Option<GatewaySession> {
    sessions(addr, deadline)?.sessions.into_iter().find(|s| s.session_id == session_id)
}

/// Whether a ctxd gateway answers at `addr` within `deadline` (its sessions list, as
/// JSON, with status 200).
pub fn answers(addr: SocketAddr, deadline: Duration) -> bool {
    sessions(addr, deadline).is_some()
}

/// One `GET` over HTTP/1.0, everything within `deadline`: the status and the body.
pub fn get(addr: SocketAddr, path: &str, deadline: Duration) -> std::io::Result<(u16, Vec<u8>)> {
    let start = Instant::now();
    let left = || {
        deadline
            .checked_sub(start.elapsed())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::TimedOut))
    };
    let mut stream = TcpStream::connect_timeout(&addr, left()?)?;
    stream.set_write_timeout(Some(left()?))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n\r\n")?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        stream.set_read_timeout(Some(left()?))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if answer.len() + n > MAX_ANSWER {
            return Err(std::io::Error::other("the answer is too large"));
        }
        answer.extend_from_slice(&buf[..n]);
    }
    parse_answer(&answer)
}

/// The status and body of an HTTP/1.x answer read to its end.
fn parse_answer(answer: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_owned());
    let head_end = memchr::memmem::find(answer, b"\r\n\r\n").ok_or_else(|| bad("no end of headers"))?;
    let head = std::str::from_utf8(&answer[..head_end]).map_err(|_| bad("headers are not text"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| bad("not an HTTP answer"))?;
    let mut body = answer[head_end + 4..].to_vec();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        if name.trim().eq_ignore_ascii_case("transfer-encoding") {
            return Err(bad("an HTTP/1.0 answer cannot be chunked"));
        }
        if name.trim().eq_ignore_ascii_case("content-length") {
            let length: usize = value.trim().parse().map_err(|_| bad("bad Content-Length"))?;
            if body.len() < length {
                return Err(bad("the answer ended early"));
            }
            body.truncate(length);
        }
    }
    Ok((status, body))
}

/// Whether the socket listening on `addr` belongs to this user. Linux reads the owner
/// from `/proc/net/tcp` and `/proc/net/tcp6` (a listener on the wildcard address of the
/// port counts); `false` when nothing listens there or the tables cannot be read.
#[cfg(target_os = "linux")]
pub fn listener_is_ours(addr: SocketAddr) -> bool {
    let uid = rustix::process::getuid().as_raw();
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        let Ok(text) = std::fs::read_to_string(table) else { return false };
        listener_owners(&text, addr).contains(&uid)
    })
}

/// Elsewhere the owner of a socket is not looked up (ctxd is built and tested on Linux
/// only; see the README's platforms).
#[cfg(not(target_os = "linux"))]
pub fn listener_is_ours(_addr: SocketAddr) -> bool {
    true
}

/// Owners (uids) of the listening sockets in a `/proc/net/tcp{,6}` table that accept
/// connections to `addr`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn listener_owners(table: &str, addr: SocketAddr) -> Vec<u32> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, state, uid) = (fields.get(1)?, fields.get(3)?, fields.get(7)?);
            if *state != LISTEN {
                return None;
            }
            let (ip, port) = local.split_once(':')?;
            if u16::from_str_radix(port, 16).ok()? != addr.port() {
                return None;
            }
            let ip = proc_ip(ip)?;
            (ip == addr.ip() || ip.is_unspecified()).then(|| uid.parse().ok()).flatten()
        })
        .collect()
}

/// An address as `/proc/net/tcp` prints it: the network-order bytes of each 32-bit
/// word, printed as a native-endian number.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn proc_ip(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| hex.get(i * 8..i * 8 + 8).and_then(|w| u32::from_str_radix(w, 16).ok());
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?.to_ne_bytes()))),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?.to_ne_bytes());
            }
            Some(IpAddr::V6(Ipv6Addr::from(bytes)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::live::{Live, LiveFigures};

    #[test]
    fn reads_a_running_gateways_figures_and_nothing_from_a_closed_port() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let live = LiveFigures::default();
        live.request_sent("s1");
        let figures = GatewaySession { session_id: "s1".into(), input_tokens: 77, ..GatewaySession::default() };
        live.answered(Live { figures, message_id: None });
        let config = crate::gateway::Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            upstream: "http://127.0.0.1:9".into(),
            allow_remote: false,
            limits: crate::gateway::Limits::default(),
            prepare: Default::default(),
            state_dir: None,
            env: None,
        };
        let bound = runtime.block_on(crate::gateway::bind(config, live)).unwrap();
        let addr = bound.local_addr().unwrap();
        runtime.spawn(bound.serve());
        let got = session(addr, "s1", Duration::from_secs(10)).unwrap();
        assert_eq!((got.input_tokens, got.requests), (77, 1));
        assert_eq!(session(addr, "other", Duration::from_secs(10)), None);
        assert!(answers(addr, Duration::from_secs(10)));
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        assert_eq!(sessions(closed, Duration::from_secs(1)), None);
    }

    #[test]
    fn the_setting_or_the_default() {
        assert_eq!(DEFAULT_LISTEN.to_string(), GatewaySettings::DEFAULT_LISTEN);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("settings.json");
        assert_eq!(listen_address_in(&file), (DEFAULT_LISTEN, None));
        std::fs::write(&file, r#"{"gateway": {"listen": "127.0.0.1:9000"}}"#).unwrap();
        assert_eq!(listen_address_in(&file).0, "127.0.0.1:9000".parse().unwrap());
        std::fs::write(&file, r#"{"provider": "offline"}"#).unwrap();
        assert_eq!(listen_address_in(&file), (DEFAULT_LISTEN, None));
        std::fs::write(&file, r#"{"gateway": {"upstream": "https://llm.corp.example"}}"#).unwrap();
        assert_eq!(user_settings_in(&file).0.upstream.as_deref(), Some("https://llm.corp.example"));
        for bad in [r#"{"gateway": {"listen": "localhost"}}"#, r#"{"gateway": {"listen": 8417}}"#, "not json"] {
            std::fs::write(&file, bad).unwrap();
            let (addr, problem) = listen_address_in(&file);
            assert_eq!(addr, DEFAULT_LISTEN, "{bad}");
            assert!(problem.is_some_and(|p| p.contains("settings.json")), "{bad}");
        }
    }

    #[test]
    fn answers_read_to_their_end() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(parse_answer(ok).unwrap(), (200, b"{}".to_vec()));
        let closed = b"HTTP/1.0 404 Not Found\r\n\r\nnothing here";
        assert_eq!(parse_answer(closed).unwrap(), (404, b"nothing here".to_vec()));
        for bad in
            [&b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}"[..], b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 200"]
        {
            assert!(parse_answer(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        assert!(parse_answer(chunked).is_err());
    }

    #[test]
    fn owners_of_listening_sockets() {
        // As Linux prints them (x86: little-endian words): 127.0.0.1:8417 listening,
        // owned by 1000; the same port connected (state 01) by 0; 0.0.0.0:9000 by 1001.
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 0100007F:20E1 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0 100 0 0 10 0\n\
           1: 0100007F:20E1 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0\n\
           2: 00000000:2328 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 3 1 0 100 0 0 10 0\n";
        if cfg!(target_endian = "little") {
            assert_eq!(listener_owners(table, "127.0.0.1:8417".parse().unwrap()), vec![1000]);
            assert_eq!(listener_owners(table, "127.0.0.1:9000".parse().unwrap()), vec![1001]);
            assert!(listener_owners(table, "127.0.0.1:8418".parse().unwrap()).is_empty());
        }
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid\n\
           0: 00000000000000000000000001000000:20E1 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1002\n";
        if cfg!(target_endian = "little") {
            assert_eq!(listener_owners(v6, "[::1]:8417".parse().unwrap()), vec![1002]);
        }
    }

    #[test]
    fn a_real_listener_of_this_user_is_ours_and_a_free_port_is_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(listener_is_ours(addr));
        drop(listener);
        assert!(!listener_is_ours(addr) || !cfg!(target_os = "linux"));
    }

    #[test]
    fn no_gateway_is_no_answer_within_the_deadline() {
        // A listener that accepts and never answers: the deadline ends the wait (a
        // hang would hang the test).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(session(addr, "s", Duration::from_millis(100)).is_none());
        drop(listener);
        assert!(!answers(addr, Duration::from_millis(100)));
    }
}
