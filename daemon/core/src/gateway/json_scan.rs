//! A streaming scanner that finds a few scalar values in a JSON document as its bytes
//! pass, without holding the document.
//!
//! The gateway forwards request and answer bodies chunk by chunk and must not keep them
//! whole (a request may be 32 MB), yet it wants a handful of values from them: the
//! request's `metadata.user_id` and cache markers, an answer's `usage`. The scanner
//! keeps the path of containers it is in (a key per object, bounded in length) and
//! reports each scalar with its path; strings are captured only up to a bound (longer
//! ones are reported as cut), and the bytes inside a string are skipped with `memchr`,
//! so the cost is one pass over the structure. Invalid JSON, or nesting past the depth
//! bound, stops the scan (`failed`): the scanner reports nothing further and the body
//! still passes untouched.

/// One step of a path: an object's key (`None` when longer than the bound, which no
/// caller asks for) or a position in an array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Key(Option<String>),
    Index,
}

impl Step {
    /// Whether this step is the key `name`.
    pub fn is(&self, name: &str) -> bool {
        matches!(self, Step::Key(Some(k)) if k == name)
    }
}

/// A scalar as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scalar {
    /// A string, decoded; `None` when it was longer than the capture bound or its
    /// escapes did not decode.
    Str(Option<String>),
    /// A number's text (at most 40 bytes kept; longer is `None`).
    Number(Option<String>),
    Bool(bool),
    Null,
}

impl Scalar {
    /// The value as a whole number, when it is one that fits.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Scalar::Number(Some(text)) => text.parse().ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Scalar::Str(Some(s)) => Some(s),
            _ => None,
        }
    }
}

/// Keys longer than this are kept as `Step::Key(None)`.
const MAX_KEY: usize = 64;
/// Numbers longer than this are kept as `Scalar::Number(None)`.
const MAX_NUMBER: usize = 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A value is expected (document start, after `:`, after `[` or `,` in an array).
    Value,
    /// After `{`: a key or `}`.
    KeyOrClose,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value inside a container: `,` or the container's close.
    CommaOrClose,
    /// Inside a string (a key when `key`); `escaped` after a backslash.
    Str {
        key: bool,
        escaped: bool,
    },
    Number,
    /// Inside `true`, `false` or `null`; the bytes left to check.
    Literal {
        rest: &'static [u8],
        value: LiteralValue,
    },
    /// The top-level value ended: only whitespace may follow.
    Done,
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LiteralValue {
    True,
    False,
    Null,
}

/// The scanner. Feed it the document in pieces of any size; each scalar is handed to
/// the sink with its path (outermost first).
#[derive(Debug, Clone)]
pub struct JsonScan {
    path: Vec<Step>,
    state: State,
    /// The string or number being read, up to its bound.
    text: Vec<u8>,
    /// The current string outgrew `max_string` (or the number `MAX_NUMBER`).
    cut: bool,
    max_string: usize,
    max_depth: usize,
}

impl JsonScan {
    /// `max_string`: longest string value captured, in bytes of JSON text;
    /// `max_depth`: deepest nesting followed.
    pub fn new(max_string: usize, max_depth: usize) -> JsonScan {
        JsonScan { path: Vec::new(), state: State::Value, text: Vec::new(), cut: false, max_string, max_depth }
    }

    /// The input was not JSON, or nested too deeply: nothing more is reported.
    pub fn failed(&self) -> bool {
        self.state == State::Failed
    }

    /// The top-level value is complete.
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// Scans the next piece of the document.
    pub fn feed(&mut self, mut bytes: &[u8], sink: &mut impl FnMut(&[Step], Scalar)) {
        while !bytes.is_empty() {
            match self.state {
                State::Failed => return,
                State::Str { key, escaped } => {
                    let mut at = 0;
                    if escaped {
                        self.keep(&bytes[..1], key);
                        at = 1;
                    }
                    match memchr::memchr2(b'"', b'\\', &bytes[at..]) {
                        None => {
                            self.keep(&bytes[at..], key);
                            self.state = State::Str { key, escaped: false };
                            return;
                        }
                        Some(found) => {
                            let end = at + found;
                            self.keep(&bytes[at..end], key);
                            if bytes[end] == b'\\' {
                                self.keep(b"\\", key);
                                self.state = State::Str { key, escaped: true };
                            } else {
                                self.end_string(key, sink);
                            }
                            bytes = &bytes[end + 1..];
                        }
                    }
                }
                State::Number => {
                    let end = bytes.iter().position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'));
                    let digits = &bytes[..end.unwrap_or(bytes.len())];
                    if self.text.len() + digits.len() > MAX_NUMBER {
                        self.cut = true;
                    } else {
                        self.text.extend_from_slice(digits);
                    }
                    let Some(end) = end else { return };
                    let text = (!std::mem::take(&mut self.cut))
                        .then(|| String::from_utf8(std::mem::take(&mut self.text)).ok())
                        .flatten();
                    self.text.clear();
                    sink(&self.path, Scalar::Number(text));
                    self.after_value();
                    bytes = &bytes[end..];
                }
                State::Literal { rest, value } => {
                    let n = rest.len().min(bytes.len());
                    if bytes[..n] != rest[..n] {
                        self.state = State::Failed;
                        return;
                    }
                    bytes = &bytes[n..];
                    if n < rest.len() {
                        self.state = State::Literal { rest: &rest[n..], value };
                        return;
                    }
                    sink(
                        &self.path,
                        match value {
                            LiteralValue::True => Scalar::Bool(true),
                            LiteralValue::False => Scalar::Bool(false),
                            LiteralValue::Null => Scalar::Null,
                        },
                    );
                    self.after_value();
                }
                _ => {
                    let byte = bytes[0];
                    bytes = &bytes[1..];
                    if matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
                        continue;
                    }
                    self.structural(byte);
                }
            }
        }
    }

    fn structural(&mut self, byte: u8) {
        self.state = match (self.state, byte) {
            (State::Value, b'{') => {
                if self.path.len() >= self.max_depth {
                    State::Failed
                } else {
                    self.path.push(Step::Key(None));
                    State::KeyOrClose
                }
            }
            (State::Value, b'[') => {
                if self.path.len() >= self.max_depth {
                    State::Failed
                } else {
                    self.path.push(Step::Index);
                    State::Value
                }
            }
            // An empty array: `]` where its first value would be.
            (State::Value, b']') if matches!(self.path.last(), Some(Step::Index)) => self.close(),
            (State::Value, b'"') => State::Str { key: false, escaped: false },
            (State::Value, b'-' | b'0'..=b'9') => {
                self.text.clear();
                self.text.push(byte);
                State::Number
            }
            (State::Value, b't') => State::Literal { rest: b"rue", value: LiteralValue::True },
            (State::Value, b'f') => State::Literal { rest: b"alse", value: LiteralValue::False },
            (State::Value, b'n') => State::Literal { rest: b"ull", value: LiteralValue::Null },
            (State::KeyOrClose, b'}') => self.close(),
            (State::KeyOrClose | State::Key, b'"') => State::Str { key: true, escaped: false },
            (State::Colon, b':') => State::Value,
            (State::CommaOrClose, b',') => match self.path.last() {
                Some(Step::Index) => State::Value,
                Some(Step::Key(_)) => State::Key,
                None => State::Failed,
            },
            (State::CommaOrClose, b'}') if matches!(self.path.last(), Some(Step::Key(_))) => self.close(),
            (State::CommaOrClose, b']') if matches!(self.path.last(), Some(Step::Index)) => self.close(),
            _ => State::Failed,
        };
    }

    /// Closes the innermost container; the state after it.
    fn close(&mut self) -> State {
        self.path.pop();
        if self.path.is_empty() { State::Done } else { State::CommaOrClose }
    }

    fn after_value(&mut self) {
        self.state = if self.path.is_empty() { State::Done } else { State::CommaOrClose };
    }

    /// Keeps string bytes while they fit the bound (a key's own bound, or the value's).
    fn keep(&mut self, bytes: &[u8], key: bool) {
        let bound = if key { MAX_KEY + 2 } else { self.max_string };
        if self.cut || self.text.len() + bytes.len() > bound {
            self.cut = true;
        } else {
            self.text.extend_from_slice(bytes);
        }
    }

    fn end_string(&mut self, key: bool, sink: &mut impl FnMut(&[Step], Scalar)) {
        let decoded = if std::mem::take(&mut self.cut) { None } else { decode_string(&self.text) };
        self.text.clear();
        if key {
            if let Some(last) = self.path.last_mut() {
                *last = Step::Key(decoded.filter(|k| k.len() <= MAX_KEY));
            }
            self.state = State::Colon;
        } else {
            sink(&self.path, Scalar::Str(decoded));
            self.after_value();
        }
    }
}

/// The text between a string's quotes, its escapes decoded.
fn decode_string(inner: &[u8]) -> Option<String> {
    if memchr::memchr(b'\\', inner).is_none() {
        return String::from_utf8(inner.to_vec()).ok();
    }
    let mut quoted = Vec::with_capacity(inner.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(inner);
    quoted.push(b'"');
    serde_json::from_slice(&quoted).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_in_pieces(text: &str, piece: usize) -> (Vec<(String, Scalar)>, JsonScan) {
        let mut scan = JsonScan::new(256, 64);
        let mut found = Vec::new();
        for chunk in text.as_bytes().chunks(piece.max(1)) {
            scan.feed(chunk, &mut |path, value| {
                let path: Vec<String> = path
                    .iter()
                    .map(|s| match s {
                        Step::Key(Some(k)) => k.clone(),
                        Step::Key(None) => "?".into(),
                        Step::Index => "[]".into(),
                    })
                    .collect();
                found.push((path.join("."), value));
            });
        }
        (found, scan)
    }

    const DOC: &str = r#" {"model":"claude-opus-5-5","messages":[{"role":"user","content":[{"type":"text","text":"say \"hi\" \\ \u00e9","cache_control":{"type":"ephemeral","ttl":"1h"}}]},[]],
        "metadata":{"user_id":"{\"session_id\":\"abc\"}"},"stream":true,"n":-12.5e3,"x":null,"f":false,"e":{},"a":[1,[2]]} "#;

    #[test]
    fn every_scalar_with_its_path_whatever_the_piece_size() {
        let whole = scan_in_pieces(DOC, DOC.len()).0;
        let want: Vec<(String, Scalar)> = vec![
            ("model".into(), Scalar::Str(Some("claude-opus-5-5".into()))),
            ("messages.[].role".into(), Scalar::Str(Some("user".into()))),
            ("messages.[].content.[].type".into(), Scalar::Str(Some("text".into()))),
            ("messages.[].content.[].text".into(), Scalar::Str(Some("say \"hi\" \\ é".into()))),
            ("messages.[].content.[].cache_control.type".into(), Scalar::Str(Some("ephemeral".into()))),
            ("messages.[].content.[].cache_control.ttl".into(), Scalar::Str(Some("1h".into()))),
            ("metadata.user_id".into(), Scalar::Str(Some(r#"{"session_id":"abc"}"#.into()))),
            ("stream".into(), Scalar::Bool(true)),
            ("n".into(), Scalar::Number(Some("-12.5e3".into()))),
            ("x".into(), Scalar::Null),
            ("f".into(), Scalar::Bool(false)),
            ("a.[]".into(), Scalar::Number(Some("1".into()))),
            ("a.[].[]".into(), Scalar::Number(Some("2".into()))),
        ];
        assert_eq!(whole, want);
        for piece in 1..12 {
            let (found, scan) = scan_in_pieces(DOC, piece);
            assert_eq!(found, want, "pieces of {piece}");
            assert!(scan.done() && !scan.failed());
        }
    }

    #[test]
    fn long_strings_are_cut_and_the_scan_goes_on() {
        let long = "x".repeat(1000);
        let text = format!(r#"{{"text":"{long}","model":"m","{long}":1}}"#);
        let (found, scan) = scan_in_pieces(&text, 7);
        assert_eq!(found[0], ("text".into(), Scalar::Str(None)));
        assert_eq!(found[1], ("model".into(), Scalar::Str(Some("m".into()))));
        assert_eq!(found[2], ("?".into(), Scalar::Number(Some("1".into()))));
        assert!(scan.done());
    }

    #[test]
    fn invalid_or_too_deep_input_stops_the_scan() {
        for bad in [r#"{"a":1,}"#, r#"{"a" 1}"#, "[1 2]", r#"{"a":tru}"#, "}", r#"{"a":1}}"#] {
            let (_, scan) = scan_in_pieces(bad, 3);
            assert!(scan.failed(), "{bad}");
        }
        let deep = "[".repeat(100) + &"]".repeat(100);
        let (_, scan) = scan_in_pieces(&deep, 5);
        assert!(scan.failed(), "deeper than 64");
        let (found, scan) = scan_in_pieces(&("[".repeat(60) + "7" + &"]".repeat(60)), 5);
        assert!(scan.done() && found.len() == 1);
    }
}
