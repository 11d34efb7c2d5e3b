//! JSON-RPC decoding of a frame body (`ctxd::transport::decode`).
//!
//! Inputs: arbitrary text, a frame the reader rejected, and a message assembled from
//! chosen parts (id of every JSON type, method, params of every type, `jsonrpc` right or
//! wrong, result/error).
//!
//! Properties:
//! - any text: an empty body is nothing; text that is not JSON is a parse error; every
//!   error reply ctxd would send is itself a well-formed JSON-RPC response (it decodes as
//!   one), carries a standard code (ctxd's own for an oversized frame), and names the
//!   request's id or null;
//! - a request decodes to a request only if it is valid, and then with its method, id and
//!   params exactly as sent;
//! - an assembled message gets the outcome the protocol prescribes for its shape.

#![no_main]

use ctxd::transport::framing::FrameError;
use ctxd::transport::{Incoming, decode};
use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};
use tower_lsp_server::jsonrpc::Response;

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;

#[derive(Debug, Arbitrary)]
struct Message {
    not_an_object: Option<Json>,
    jsonrpc: Option<Json>,
    id: Option<Json>,
    method: Option<Json>,
    params: Option<Json>,
    result: Option<Json>,
    error: Option<Json>,
    /// Field order: rotate the keys by this much.
    rotate: u8,
}

#[derive(Debug, Clone, Arbitrary)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Big(u64),
    Float(f64),
    Str(String),
    Version,
    Array(Vec<i8>),
    Object(Vec<(String, i8)>),
}

impl Json {
    fn value(&self) -> Value {
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => json!(b),
            Json::Int(n) => json!(n),
            Json::Big(n) => json!(n),
            Json::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Json::Str(s) => json!(s),
            Json::Version => json!("2.0"),
            Json::Array(items) => json!(items),
            Json::Object(fields) => Value::Object(fields.iter().map(|(k, v)| (k.clone(), json!(v))).collect()),
        }
    }
}

/// The reply as JSON, checked to be a JSON-RPC error response that decodes as one.
fn check_reply(reply: &Response) -> (Value, i64) {
    let text = serde_json::to_string(reply).unwrap_or_default();
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    assert_eq!(value["jsonrpc"], "2.0", "{text}");
    let Some(code) = value["error"]["code"].as_i64() else {
        panic!("error reply without a code: {text}");
    };
    assert!(value["error"]["message"].is_string(), "{text}");
    assert!(value.get("id").is_some(), "reply without an id: {text}");
    // The client reads it back as a response.
    assert!(
        matches!(decode(Ok(text.clone())), Incoming::Response(_)),
        "own reply does not decode as a response: {text}"
    );
    (value["id"].clone(), code)
}

/// What decoding `body` must give, from the protocol rules, for a body that is a JSON
/// value.
#[derive(Debug, PartialEq)]
enum Want {
    Request { method: String, id: Value, params: Option<Value> },
    Response,
    Invalid { id: Value },
    NothingOrResponse,
}

fn want(value: &Value) -> Want {
    let Value::Object(object) = value else {
        return Want::Invalid { id: Value::Null };
    };
    let id = match object.get("id") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::Number(n)) if n.is_i64() => Value::Number(n.clone()),
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(_) => return Want::Invalid { id: Value::Null },
    };
    if object.get("jsonrpc") != Some(&json!("2.0")) {
        return Want::Invalid { id };
    }
    match object.get("method") {
        Some(Value::String(method)) => match object.get("params") {
            None => Want::Request { method: method.clone(), id, params: None },
            Some(p @ (Value::Object(_) | Value::Array(_) | Value::Null)) => {
                Want::Request { method: method.clone(), id, params: Some(p.clone()) }
            }
            Some(_) => Want::Invalid { id },
        },
        Some(_) => Want::Invalid { id },
        None if object.contains_key("result") || object.contains_key("error") => {
            // A response with an unreadable error object is dropped.
            let well_formed = object.contains_key("id")
                && (object.contains_key("result") != object.contains_key("error"))
                && object.get("error").is_none_or(|e| e["code"].is_i64() && e["message"].is_string());
            if well_formed { Want::Response } else { Want::NothingOrResponse }
        }
        None => Want::Invalid { id },
    }
}

fn check(body: String) {
    let parsed: Result<Value, _> = serde_json::from_str(&body);
    let blank = body.trim().is_empty();
    match decode(Ok(body.clone())) {
        Incoming::Nothing => {
            if !blank {
                let Ok(value) = &parsed else {
                    panic!("non-JSON body {body:?} decoded to nothing");
                };
                assert_eq!(want(value), Want::NothingOrResponse, "{body:?}");
            }
        }
        Incoming::Invalid(reply) => {
            assert!(!blank);
            let (id, code) = check_reply(&reply);
            match &parsed {
                Err(_) => assert_eq!((id, code), (Value::Null, PARSE_ERROR), "{body:?}"),
                Ok(value) => {
                    assert_eq!(code, INVALID_REQUEST, "{body:?}");
                    assert_eq!(want(value), Want::Invalid { id }, "{body:?}");
                }
            }
        }
        Incoming::Request(request) => {
            let Ok(value) = &parsed else {
                panic!("non-JSON body {body:?} decoded to a request");
            };
            let got_id = request.id().map_or(Value::Null, |id| serde_json::to_value(id).unwrap_or(json!("?")));
            let got =
                Want::Request { method: request.method().to_owned(), id: got_id, params: request.params().cloned() };
            assert_eq!(got, want(value), "{body:?}");
        }
        Incoming::Response(_) => {
            let Ok(value) = &parsed else {
                panic!("non-JSON body {body:?} decoded to a response");
            };
            assert!(matches!(want(value), Want::Response | Want::NothingOrResponse), "{body:?}");
        }
    }
}

// Input: `m` then bytes for an assembled message, `f` then a kind and a length for a
// rejected frame; anything else is a frame body as it arrived.
fuzz_target!(|data: &[u8]| {
    match data {
        [b'm', rest @ ..] => {
            let Ok(m) = Message::arbitrary_take_rest(Unstructured::new(rest)) else { return };
            let body = match &m.not_an_object {
                Some(json) => json.value(),
                None => {
                    let mut fields: Vec<(&str, Value)> = [
                        ("jsonrpc", &m.jsonrpc),
                        ("id", &m.id),
                        ("method", &m.method),
                        ("params", &m.params),
                        ("result", &m.result),
                        ("error", &m.error),
                    ]
                    .into_iter()
                    .filter_map(|(k, v)| v.as_ref().map(|v| (k, v.value())))
                    .collect();
                    if !fields.is_empty() {
                        let by = usize::from(m.rotate) % fields.len();
                        fields.rotate_left(by);
                    }
                    Value::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect::<Map<_, _>>())
                }
            };
            check(body.to_string());
        }
        [b'f', kind, lo, hi, ..] => {
            let (kind, len) = (*kind, u16::from_le_bytes([*lo, *hi]));
            let error = match kind % 5 {
                0 => FrameError::MissingContentLength,
                1 => FrameError::BadHeader,
                2 => FrameError::TooLarge { len: usize::from(len) + 1, max: usize::from(len) },
                3 => FrameError::Truncated { got: 0, want: usize::from(len) + 1 },
                _ => FrameError::InvalidUtf8("invalid utf-8 sequence".to_owned()),
            };
            let too_large = matches!(error, FrameError::TooLarge { .. });
            let Incoming::Invalid(reply) = decode(Err(error)) else {
                panic!("a bad frame must be answered");
            };
            let (id, code) = check_reply(&reply);
            assert_eq!(id, Value::Null);
            if too_large {
                assert_eq!(code, ctxd_proto::error_codes::MESSAGE_TOO_LARGE);
            } else {
                assert_eq!(code, PARSE_ERROR);
            }
        }
        _ => check(String::from_utf8_lossy(data).into_owned()),
    }
});
