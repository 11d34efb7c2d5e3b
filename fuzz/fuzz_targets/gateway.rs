//! The gateway's request parsing (`ctxd_core::gateway`): the route of a request head,
//! and the body scanners that read a request and an answer as they stream past.
//!
//! Input: a head (method, target, `Host` values), a body and the places the network cut
//! it into pieces. Properties:
//! - routing never panics; a forwarded target is a path (`/`, not `//`), so the upstream
//!   URL is the configured base followed by it, and nothing else;
//! - the request and answer scanners find the same facts however the body is cut
//!   (pieces of any size, down to single bytes), and never fail on any bytes;
//! - on a body that is a JSON object, the request facts are the object's own: its
//!   `model`, `stream`, and the session id in `metadata.user_id`.

#![no_main]

use ctxd_core::gateway::{self, AnswerKind, AnswerScan, Head, RequestScan, Route};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

#[derive(Debug, Arbitrary)]
struct Input {
    method: String,
    target: String,
    hosts: Vec<Vec<u8>>,
    remote: bool,
    body: Vec<u8>,
    cuts: Vec<u16>,
}

/// `body` in the pieces `cuts` make (each cut a length, taken in turn).
fn pieces<'a>(body: &'a [u8], cuts: &[u16]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = body;
    for cut in cuts.iter().cycle().take(body.len() + 1) {
        if rest.is_empty() {
            break;
        }
        let n = usize::from(*cut).clamp(1, rest.len());
        out.push(&rest[..n]);
        rest = &rest[n..];
    }
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

/// A body the comparison with serde_json's reading is exact for: within the scanner's
/// bounds (nesting, 1 KB strings), no `\u` escapes (which could spell a key), and each
/// key the facts come from at most once (serde_json keeps the last of repeated keys,
/// and a repeated object could hide an earlier value from it).
fn plain(body: &[u8]) -> bool {
    let count = |needle: &[u8]| body.windows(needle.len()).filter(|w| *w == needle).count();
    body.len() < 900
        && body.iter().filter(|b| **b == b'{' || **b == b'[').count() < 100
        && count(b"\\u") == 0
        && [&b"\"model\""[..], b"\"stream\"", b"\"metadata\"", b"\"user_id\""].iter().all(|k| count(k) <= 1)
}

fuzz_target!(|input: Input| {
    let hosts: Vec<&[u8]> = input.hosts.iter().map(Vec::as_slice).collect();
    let head = Head { method: &input.method, target: &input.target, hosts: &hosts };
    if let Ok(Route::Forward) = gateway::route(&head, input.remote) {
        assert!(input.target.starts_with('/') && !input.target.starts_with("//"), "{:?}", input.target);
        let url = gateway::upstream_url("https://api.anthropic.com", &input.target);
        assert_eq!(&url["https://api.anthropic.com".len()..], input.target);
    }

    let whole = {
        let mut scan = RequestScan::default();
        scan.feed(&input.body);
        scan.into_facts()
    };
    let mut cut = RequestScan::default();
    for piece in pieces(&input.body, &input.cuts) {
        cut.feed(piece);
    }
    assert_eq!(cut.into_facts(), whole, "request facts depend on the cuts");
    if let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(&input.body)
        && plain(&input.body)
    {
        assert_eq!(whole.model.as_deref(), object.get("model").and_then(Value::as_str));
        assert_eq!(whole.stream, object.get("stream") == Some(&Value::Bool(true)));
        let user_id = object.get("metadata").and_then(|m| m.get("user_id")).and_then(Value::as_str);
        assert_eq!(whole.session_id, user_id.and_then(gateway::request::session_id_from_user_id));
    }

    for kind in [AnswerKind::EventStream, AnswerKind::Json] {
        let mut whole = AnswerScan::new(kind);
        whole.feed(&input.body);
        let mut cut = AnswerScan::new(kind);
        for piece in pieces(&input.body, &input.cuts) {
            cut.feed(piece);
        }
        assert_eq!(cut.facts(), whole.facts(), "answer facts depend on the cuts ({kind:?})");
    }
});
