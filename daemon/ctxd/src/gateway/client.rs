//! Reading a running gateway's figures from another process, without a runtime: for
//! `ctxd statusline`, which Claude Code runs on every refresh and which must answer in
//! milliseconds. One `GET /ctxd/sessions` over a plain loopback connection, bounded in
//! time and size; any failure is "no figures" (the gateway may not be running).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ctxd_proto::{GatewaySession, GatewaySessions};

/// The most read back (the registry holds at most 1,000 sessions of ~400 bytes).
const MAX_ANSWER: u64 = 1 << 20;

/// The gateway's sessions at `addr`, or `None` when it does not answer within
/// `timeout` (connect, write and each read), or answers something else.
pub fn sessions(addr: SocketAddr, timeout: Duration) -> Option<GatewaySessions> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    let request = format!("GET /ctxd/sessions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    stream.take(MAX_ANSWER).read_to_end(&mut answer).ok()?;
    let split = memchr::memmem::find(&answer, b"\r\n\r\n")?;
    let (head, body) = (&answer[..split], &answer[split + 4..]);
    if !head.starts_with(b"HTTP/1.1 200 ") {
        return None;
    }
    // The gateway answers with a length, never chunked.
    serde_json::from_slice(body).ok()
}

/// The figures of one Claude Code session, if the gateway at `addr` has them.
pub fn session(addr: SocketAddr, session_id: &str, timeout: Duration) -> Option<GatewaySession> {
    sessions(addr, timeout)?.sessions.into_iter().find(|s| s.session_id == session_id)
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
        };
        let bound = runtime.block_on(crate::gateway::bind(config, live)).unwrap();
        let addr = bound.local_addr().unwrap();
        runtime.spawn(bound.serve());
        let got = session(addr, "s1", Duration::from_secs(10)).unwrap();
        assert_eq!((got.input_tokens, got.requests), (77, 1));
        assert_eq!(session(addr, "other", Duration::from_secs(10)), None);
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        assert_eq!(sessions(closed, Duration::from_secs(1)), None);
    }
}
