//! The way in: a frame becomes a message to route, by one decoding path.
//!
//! Every well-formed request is read borrowed from its frame: the envelope (`jsonrpc`,
//! `id`, `method`) is parsed once and the params are kept as the raw text the client
//! sent, for the handler to decode once. Anything unusual (escapes in `method`, a
//! duplicate key, deep nesting, a response, bad JSON) falls to [`decode`], which reads a
//! value tree and says exactly what is wrong.

use serde_json::Value;
use serde_json::value::RawValue;
use tokio::io::AsyncRead;
use tower_lsp_server::jsonrpc::{Error, ErrorCode, Id, Request, Response};

use super::framing::FrameError;

/// A message from the client, as the transport read it: borrowed from its frame.
pub struct Message<'a> {
    /// `None` for a notification.
    pub id: Option<Id>,
    pub method: &'a str,
    /// The params' JSON text as sent, decoded once by the handler that takes them.
    pub params: Option<&'a RawValue>,
}

/// A blocking reader as an `AsyncRead`, for a thread of its own that does nothing but
/// wait for input: each poll blocks in `read` until bytes come.
pub(super) struct BlockingRead<R>(pub(super) R);

impl<R: std::io::Read + Unpin> AsyncRead for BlockingRead<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let read = loop {
            match self.0.read(buf.initialize_unfilled()) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        std::task::Poll::Ready(read.map(|n| buf.advance(n)))
    }
}

/// A frame as the reader hands it on.
pub(super) type FromReader = Result<String, FrameError>;

/// A frame, read: a message to route (borrowed from the frame, or as [`decode`] read
/// it), nothing to do (an empty body, or a response from the client: ctxd sends no
/// requests, so there is nothing to match it with), or the error reply the client should
/// get.
pub(super) enum Read<'a> {
    Message(Message<'a>),
    Decoded(Decoded),
    Ignored,
    Invalid(Response),
}

/// A message [`decode`] read as a value tree (anything unusual): its params re-encoded.
pub(super) struct Decoded {
    id: Option<Id>,
    method: String,
    params: Option<Box<RawValue>>,
}

impl Decoded {
    pub(super) fn message(&self) -> Message<'_> {
        Message { id: self.id.clone(), method: &self.method, params: self.params.as_deref() }
    }
}

/// The message's fields as a borrowed reading finds them: what every well-formed
/// request looks like. Anything else (escapes in `method`, a duplicate key, an id of
/// another type, a response, deep nesting) fails here and is read by [`decode`],
/// which answers exactly what is wrong.
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    jsonrpc: &'a str,
    #[serde(default)]
    id: Option<Id>,
    #[serde(borrow)]
    method: &'a str,
    #[serde(default, borrow)]
    params: Option<&'a RawValue>,
}

/// Deepest nesting serde_json reads into a value tree (its recursion limit is 128).
/// The borrowed reading skips params without that limit, so a deeper frame is read by
/// [`decode`], which refuses it as invalid JSON.
const MAX_NESTING: usize = 127;

/// Reads a frame: a message (borrowed from it where it can be, its envelope parsed
/// once), a response to drop, or the error reply the client should get.
pub(super) fn read(frame: &FromReader) -> Read<'_> {
    if let Ok(body) = frame
        && !nested_deeper_than(body, MAX_NESTING)
        && let Ok(envelope) = serde_json::from_str::<Envelope<'_>>(body)
        && envelope.jsonrpc == "2.0"
        && !matches!(envelope.id, Some(Id::Null))
        && envelope.params.is_none_or(|p| p.get().starts_with(['{', '[']) || p.get() == "null")
    {
        return Read::Message(Message { id: envelope.id, method: envelope.method, params: envelope.params });
    }
    match decode_frame(frame) {
        Incoming::Request(request) => {
            let (method, id, params) = request.into_parts();
            let params = params.and_then(|p| serde_json::value::to_raw_value(&p).ok());
            Read::Decoded(Decoded { id, method: method.into_owned(), params })
        }
        Incoming::Response(_) => {
            tracing::debug!("a response from the client, to no request of ctxd's; dropped");
            Read::Ignored
        }
        Incoming::Invalid(response) => Read::Invalid(response),
        Incoming::Nothing => Read::Ignored,
    }
}

/// Whether the JSON `text` nests arrays and objects deeper than `limit` (brackets inside
/// strings do not count).
fn nested_deeper_than(text: &str, limit: usize) -> bool {
    let bytes = text.as_bytes();
    // Fewer opening brackets than the limit cannot nest deeper than it.
    if bytes.iter().filter(|b| matches!(b, b'{' | b'[')).count() <= limit {
        return false;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// A frame read as a JSON-RPC message. Public, hidden, for the fuzz targets in `fuzz/`.
#[doc(hidden)]
pub enum Incoming {
    Request(Request),
    Response(Response),
    /// An error to send back: the frame or message could not be understood.
    Invalid(Response),
    /// Nothing to do (an empty body).
    Nothing,
}

pub(super) fn rpc_error(code: ErrorCode, message: String) -> Error {
    let mut error = Error::new(code);
    error.message = message.into();
    error
}

/// Turns a frame into a message, or into the error reply the client should get.
#[doc(hidden)]
pub fn decode(frame: Result<String, FrameError>) -> Incoming {
    decode_frame(&frame)
}

/// [`decode`], the frame borrowed.
fn decode_frame(frame: &FromReader) -> Incoming {
    let body = match frame {
        Ok(body) => body,
        Err(e) => {
            tracing::warn!(error = %e, "malformed frame");
            let code = match e {
                FrameError::TooLarge { .. } => ErrorCode::ServerError(ctxd_proto::error_codes::MESSAGE_TOO_LARGE),
                _ => ErrorCode::ParseError,
            };
            return Incoming::Invalid(Response::from_error(Id::Null, rpc_error(code, e.to_string())));
        }
    };
    if body.trim().is_empty() {
        return Incoming::Nothing;
    }
    let value: Value = match serde_json::from_str(body) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "invalid JSON");
            // A well-formed message whose only fault is strict JSON (a lone surrogate
            // escape, a number out of range) is answered under its own id.
            let (id, message) = match (id_of(body), ctxd_core::admit::strict_json(body)) {
                (Some(id), Err(reason)) => {
                    (id, format!("invalid JSON: {reason}; ctxd accepts strict JSON only; nothing was done"))
                }
                _ => (Id::Null, format!("invalid JSON: {e}")),
            };
            return Incoming::Invalid(Response::from_error(id, rpc_error(ErrorCode::ParseError, message)));
        }
    };
    classify(value)
}

/// The id of a message that is well-formed JSON but not strict JSON: the values it
/// holds are skipped unchecked, only `id` is read.
fn id_of(body: &str) -> Option<Id> {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(default)]
        id: Option<Id>,
    }
    serde_json::from_str::<Head>(body).ok()?.id
}

fn classify(value: Value) -> Incoming {
    let invalid =
        |id: Id, why: String| Incoming::Invalid(Response::from_error(id, rpc_error(ErrorCode::InvalidRequest, why)));
    let Value::Object(object) = &value else {
        let why = if value.is_array() {
            "batch requests are not supported; send one JSON-RPC message per frame".to_owned()
        } else {
            "a JSON-RPC message must be a JSON object".to_owned()
        };
        return invalid(Id::Null, why);
    };
    let id = match object.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_i64() {
            Some(n) => Some(Id::Number(n)),
            None => return invalid(Id::Null, format!("request id {n} is not an integer")),
        },
        Some(Value::String(s)) => Some(Id::String(s.clone())),
        Some(other) => return invalid(Id::Null, format!("request id must be a number or a string, not {other}")),
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid(id.unwrap_or(Id::Null), "missing or wrong \"jsonrpc\": \"2.0\"".to_owned());
    }
    match object.get("method") {
        Some(Value::String(_)) => {
            if let Some(params) = object.get("params")
                && !(params.is_object() || params.is_array() || params.is_null())
            {
                return invalid(id.unwrap_or(Id::Null), "\"params\" must be an object or an array".to_owned());
            }
            match serde_json::from_value::<Request>(value) {
                Ok(request) => Incoming::Request(request),
                Err(e) => invalid(id.unwrap_or(Id::Null), format!("not a JSON-RPC request: {e}")),
            }
        }
        Some(_) => invalid(id.unwrap_or(Id::Null), "\"method\" must be a string".to_owned()),
        None if object.contains_key("result") || object.contains_key("error") => {
            match serde_json::from_value::<Response>(value) {
                Ok(response) => Incoming::Response(response),
                Err(e) => {
                    tracing::warn!(error = %e, "malformed response from the client; dropped");
                    Incoming::Nothing
                }
            }
        }
        None => invalid(id.unwrap_or(Id::Null), "a request needs a \"method\"".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_well_formed_request_is_read_borrowed_and_anything_else_as_decode_reads_it() {
        let message = |body: &str| {
            let frame = Ok(body.to_owned());
            let fields = |m: Message<'_>, decoded| {
                Some((m.id.clone(), m.method.to_owned(), m.params.map(|p| p.get().to_owned()), decoded))
            };
            match read(&frame) {
                Read::Message(m) => fields(m, false),
                Read::Decoded(d) => fields(d.message(), true),
                _ => None,
            }
        };
        let borrowed = message(r#"{"jsonrpc":"2.0","id":3,"method":"ctx/usage","params":{"sessionId":"s"}}"#);
        assert_eq!(
            borrowed,
            Some((Some(Id::Number(3)), "ctx/usage".into(), Some(r#"{"sessionId":"s"}"#.into()), false))
        );
        // An escape in the method: read as a value tree, the same message.
        let decoded = message(r#"{"jsonrpc":"2.0","id":"a","method":"ctx\/usage","params":{"sessionId":"s"}}"#);
        assert_eq!(
            decoded,
            Some((Some(Id::String("a".into())), "ctx/usage".into(), Some(r#"{"sessionId":"s"}"#.into()), true))
        );
        // Wrong version, params a string, a float id: the errors decode gives.
        for bad in [
            r#"{"jsonrpc":"1.0","id":1,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":"x"}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"m"}"#,
        ] {
            match read(&Ok(bad.to_owned())) {
                Read::Invalid(response) => {
                    assert!(serde_json::to_string(&response).unwrap().contains("-32600"), "{bad}")
                }
                _ => panic!("{bad} was read as a message"),
            }
        }
    }
}
