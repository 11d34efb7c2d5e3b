//! What the gateway does with a request, from its head alone: forward it to the
//! configured upstream, answer it itself (`/ctxd/…`), or refuse it.
//!
//! The gateway only ever connects to its configured upstream; nothing in a request may
//! name another place. So the request target must be in origin form (`/path?query`):
//! an absolute-form target (`http://elsewhere/…`, a proxy request), an authority-form
//! one (`CONNECT host:port`) and the asterisk form are refused, and so is a path that
//! starts with `//` (which URL joiners read as another host). `Host` must be given
//! once, and name a loopback host unless the gateway was allowed remote clients: a
//! web page that rebinds its own name to 127.0.0.1 reaches the port but its requests
//! carry its own name, and are refused.

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// To the upstream, path and query unchanged.
    Forward,
    /// `GET /ctxd/sessions`: the live figures, answered by the gateway.
    Sessions,
}

/// Why a request is refused, with the status to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub reason: String,
}

fn refuse(status: u16, reason: impl Into<String>) -> Refusal {
    Refusal { status, reason: reason.into() }
}

/// The parts of a request head that decide its route.
#[derive(Debug, Clone, Copy)]
pub struct Head<'a> {
    pub method: &'a str,
    /// The request target as sent.
    pub target: &'a str,
    /// Every `Host` header's value.
    pub hosts: &'a [&'a [u8]],
}

/// The gateway's read-only list of live sessions, answered on its own port.
pub const SESSIONS_PATH: &str = "/ctxd/sessions";

/// Routes a request. `remote_allowed`: the gateway listens beyond loopback
/// (`--allow-remote`), so any well-formed `Host` is accepted.
pub fn route(head: &Head<'_>, remote_allowed: bool) -> Result<Route, Refusal> {
    if head.method.eq_ignore_ascii_case("CONNECT") {
        return Err(refuse(400, "CONNECT is refused: the gateway forwards only to its configured upstream"));
    }
    if !head.target.starts_with('/') {
        return Err(refuse(
            400,
            "the request target must be a path (origin form): the gateway forwards only to its configured upstream",
        ));
    }
    if head.target.starts_with("//") {
        return Err(refuse(400, "a request path may not start with //"));
    }
    match head.hosts {
        [] => return Err(refuse(400, "the Host header is missing")),
        [one] => check_host(one, remote_allowed)?,
        _ => return Err(refuse(400, "more than one Host header")),
    }
    let path = head.target.split(['?', '#']).next().unwrap_or("");
    if path == "/ctxd" || path.starts_with("/ctxd/") {
        return match path {
            SESSIONS_PATH if head.method == "GET" || head.method == "HEAD" => Ok(Route::Sessions),
            SESSIONS_PATH => Err(refuse(405, "/ctxd/sessions answers GET only")),
            _ => Err(refuse(404, format!("no such path of ctxd's own: {path}"))),
        };
    }
    Ok(Route::Forward)
}

/// `Host`: `name[:port]` or `[v6][:port]`, nothing else; a loopback name unless remote
/// clients are allowed.
fn check_host(value: &[u8], remote_allowed: bool) -> Result<(), Refusal> {
    let bad = || refuse(400, "the Host header is not a host and port");
    let text = std::str::from_utf8(value).map_err(|_| bad())?.trim();
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']').ok_or_else(bad)?;
        if inside.is_empty() || !inside.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.') {
            return Err(bad());
        }
        (inside, after.strip_prefix(':'))
    } else {
        match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if let Some(port) = port
        && (port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(bad());
    }
    if host.is_empty() || !host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':')) {
        return Err(bad());
    }
    if remote_allowed || is_loopback_name(host) {
        Ok(())
    } else {
        Err(refuse(400, format!("Host {host:?} is not this machine's loopback (localhost, 127.0.0.1 or [::1])")))
    }
}

/// `localhost` (and names under it), 127.0.0.0/8 written as four numbers, or `::1`.
fn is_loopback_name(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    if let Ok(v4) = host.parse::<std::net::Ipv4Addr>() {
        return v4.is_loopback();
    }
    host.parse::<std::net::Ipv6Addr>().is_ok_and(|v6| v6.is_loopback())
}

/// The upstream URL of a forwarded request: the configured base (which may carry a
/// path prefix) and the request's own path and query.
pub fn upstream_url(base: &str, target: &str) -> String {
    format!("{}{}", base.trim_end_matches('/'), target)
}

/// An error body in the Messages API's shape, so a client shows it as it shows the
/// API's own: `{"type":"error","error":{"type":…,"message":…}}`.
pub fn error_body(kind: &str, message: &str) -> String {
    serde_json::json!({"type": "error", "error": {"type": kind, "message": message}}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head<'a>(method: &'a str, target: &'a str, hosts: &'a [&'a [u8]]) -> Head<'a> {
        Head { method, target, hosts }
    }

    #[test]
    fn messages_and_any_other_path_are_forwarded() {
        for target in ["/v1/messages", "/v1/messages/count_tokens?beta=true", "/v1/models", "/"] {
            assert_eq!(route(&head("POST", target, &[b"127.0.0.1:8417"]), false), Ok(Route::Forward), "{target}");
        }
        assert_eq!(route(&head("GET", "/ctxd/sessions", &[b"localhost:8417"]), false), Ok(Route::Sessions));
        assert_eq!(route(&head("GET", "/ctxd/sessions?x=1", &[b"[::1]:8417"]), false), Ok(Route::Sessions));
    }

    #[test]
    fn targets_that_could_name_another_place_are_refused() {
        for target in ["http://evil.example/v1/messages", "evil.example:443", "*", "//evil.example/v1", ""] {
            let refused = route(&head("POST", target, &[b"127.0.0.1"]), true).unwrap_err();
            assert_eq!(refused.status, 400, "{target}");
        }
        assert_eq!(route(&head("CONNECT", "/x", &[b"127.0.0.1"]), true).unwrap_err().status, 400);
    }

    #[test]
    fn host_tricks_are_refused() {
        let refused = |hosts: &[&[u8]], remote| route(&head("POST", "/v1/messages", hosts), remote).unwrap_err().status;
        assert_eq!(refused(&[], false), 400);
        assert_eq!(refused(&[b"127.0.0.1", b"127.0.0.1"], false), 400);
        for bad in [
            &b"evil.example"[..],
            b"evil.example:8417",
            b"127.0.0.1.evil.example",
            b"user@127.0.0.1",
            b"127.0.0.1/x",
            b"[::2]:1",
            b"127.0.0.1:99999x",
            b"\xff",
        ] {
            assert_eq!(refused(&[bad], false), 400, "{}", String::from_utf8_lossy(bad));
        }
        // Remote clients allowed: any well-formed name, still no userinfo or path.
        assert_eq!(route(&head("POST", "/v1/messages", &[b"gateway.lan:8417"]), true), Ok(Route::Forward));
        assert_eq!(refused(&[b"user@gateway.lan"], true), 400);
        assert_eq!(refused(&[b"gateway.lan/x"], true), 400);
    }

    #[test]
    fn ctxds_own_paths_are_never_forwarded() {
        assert_eq!(route(&head("POST", "/ctxd/sessions", &[b"localhost"]), false).unwrap_err().status, 405);
        assert_eq!(route(&head("GET", "/ctxd/other", &[b"localhost"]), false).unwrap_err().status, 404);
        assert_eq!(route(&head("GET", "/ctxd", &[b"localhost"]), false).unwrap_err().status, 404);
    }

    #[test]
    fn upstream_url_keeps_the_base_path_and_the_target() {
        assert_eq!(
            upstream_url("https://api.anthropic.com", "/v1/messages?beta=true"),
            "https://api.anthropic.com/v1/messages?beta=true"
        );
        assert_eq!(upstream_url("http://127.0.0.1:9/prefix/", "/v1/messages"), "http://127.0.0.1:9/prefix/v1/messages");
        let body: serde_json::Value = serde_json::from_str(&error_body("api_error", "ctxd gateway: \"x\"")).unwrap();
        assert_eq!(body["error"]["message"], "ctxd gateway: \"x\"");
        assert_eq!(body["type"], "error");
    }
}
