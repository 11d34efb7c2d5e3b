//! The usage of a Messages answer, read as its bytes pass through the gateway.
//!
//! A streamed answer (`text/event-stream`) reports usage twice: `message_start` carries
//! the input side (fresh, cache read, cache written) and a first output count, and
//! `message_delta` the final output count (and, from newer API versions, the input
//! fields again); a field the later event gives replaces the earlier. Only lines are
//! kept, each up to a bound: a longer line (a big text delta) is skipped without being
//! held, and the usage events are small. A whole JSON answer is read with
//! [`JsonScan`] for its `usage` and `model`.

use super::json_scan::{JsonScan, Step};
use crate::record::TokenUsage;

/// Longest SSE line kept for reading; longer ones pass unread.
pub const MAX_EVENT_LINE: usize = 64 * 1024;

/// What an answer reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnswerFacts {
    pub message_id: Option<String>,
    pub model: Option<String>,
    /// `None` until an event or the body gave usage.
    pub usage: Option<TokenUsage>,
    /// `message_stop` was seen (a stream that ended cleanly).
    pub stopped: bool,
}

/// The answer's body kind, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerKind {
    EventStream,
    Json,
    /// Anything else: not read.
    Other,
}

impl AnswerKind {
    pub fn from_content_type(content_type: Option<&str>) -> AnswerKind {
        let mime = content_type.unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        match mime.as_str() {
            "text/event-stream" => AnswerKind::EventStream,
            "application/json" => AnswerKind::Json,
            _ => AnswerKind::Other,
        }
    }
}

/// Reads an answer in pieces of any size.
#[derive(Debug, Clone)]
pub struct AnswerScan {
    kind: AnswerKind,
    line: Vec<u8>,
    /// The current line outgrew [`MAX_EVENT_LINE`]; skipped to its end.
    skipping: bool,
    json: JsonScan,
    facts: AnswerFacts,
}

impl AnswerScan {
    pub fn new(kind: AnswerKind) -> AnswerScan {
        AnswerScan {
            kind,
            line: Vec::new(),
            skipping: false,
            json: JsonScan::new(256, 64),
            facts: AnswerFacts::default(),
        }
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        match self.kind {
            AnswerKind::EventStream => self.feed_events(bytes),
            AnswerKind::Json => {
                let facts = &mut self.facts;
                self.json.feed(bytes, &mut |path, value| match path {
                    [top] if top.is("id") => facts.message_id = value.as_str().map(str::to_owned),
                    [top] if top.is("model") => facts.model = value.as_str().map(str::to_owned),
                    [usage, Step::Key(Some(name))] if usage.is("usage") => {
                        if let Some(n) = value.as_u64() {
                            set_usage(facts.usage.get_or_insert_with(TokenUsage::default), name, n);
                        }
                    }
                    _ => {}
                });
            }
            AnswerKind::Other => {}
        }
    }

    /// What was read so far; after the last piece, what the answer reported.
    pub fn facts(&self) -> &AnswerFacts {
        &self.facts
    }

    pub fn into_facts(self) -> AnswerFacts {
        self.facts
    }

    fn feed_events(&mut self, mut bytes: &[u8]) {
        while let Some(at) = memchr::memchr2(b'\n', b'\r', bytes) {
            if !self.skipping {
                if self.line.is_empty() {
                    self.event_line(&bytes[..at]);
                } else if self.line.len() + at <= MAX_EVENT_LINE {
                    let mut line = std::mem::take(&mut self.line);
                    line.extend_from_slice(&bytes[..at]);
                    self.event_line(&line);
                    line.clear();
                    self.line = line;
                }
            }
            self.line.clear();
            self.skipping = false;
            bytes = &bytes[at + 1..];
        }
        if self.skipping {
            return;
        }
        if self.line.len() + bytes.len() > MAX_EVENT_LINE {
            self.line.clear();
            self.skipping = true;
        } else {
            // Exact: the line's buffer stays within the bound rather than doubling past it.
            self.line.reserve_exact(bytes.len());
            self.line.extend_from_slice(bytes);
        }
    }

    /// One whole line of the stream (`\r\n` gives an extra empty line, which is no
    /// data line either).
    fn event_line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else { return };
        // Only events that carry usage or the stop are worth decoding: a `"usage"` or
        // `"message_stop"` with both quotes bare is structure, never string content.
        let usage = memchr::memmem::find(data, b"\"usage\"").is_some();
        if !usage && memchr::memmem::find(data, b"\"message_stop\"").is_none() {
            return;
        }
        #[derive(serde::Deserialize)]
        struct Event {
            #[serde(rename = "type")]
            kind: String,
            message: Option<Message>,
            usage: Option<serde_json::Map<String, serde_json::Value>>,
        }
        #[derive(serde::Deserialize)]
        struct Message {
            id: Option<String>,
            model: Option<String>,
            usage: Option<serde_json::Map<String, serde_json::Value>>,
        }
        let Ok(event) = serde_json::from_slice::<Event>(data) else { return };
        match event.kind.as_str() {
            "message_start" => {
                if let Some(message) = event.message {
                    self.facts.message_id = message.id.or(self.facts.message_id.take());
                    self.facts.model = message.model.or(self.facts.model.take());
                    if let Some(fields) = message.usage {
                        self.merge(&fields);
                    }
                }
            }
            "message_delta" => {
                if let Some(fields) = event.usage {
                    self.merge(&fields);
                }
            }
            "message_stop" => self.facts.stopped = true,
            _ => {}
        }
    }

    fn merge(&mut self, fields: &serde_json::Map<String, serde_json::Value>) {
        let usage = self.facts.usage.get_or_insert_with(TokenUsage::default);
        for (name, value) in fields {
            if let Some(n) = value.as_u64() {
                set_usage(usage, name, n);
            }
        }
    }
}

/// One usage field by its API name; the others (`cache_creation`, `service_tier`, …)
/// are not figures the gateway shows.
fn set_usage(usage: &mut TokenUsage, name: &str, n: u64) {
    match name {
        "input_tokens" => usage.input_tokens = n,
        "cache_read_input_tokens" => usage.cache_read_input_tokens = n,
        "cache_creation_input_tokens" => usage.cache_creation_input_tokens = n,
        "output_tokens" => usage.output_tokens = n,
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream as the stub (and the API) sends it.
    fn stream(text: &str) -> String {
        let events = [
            (
                "message_start",
                r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-opus-5-5","content":[],"stop_reason":null,"usage":{"input_tokens":12305,"output_tokens":1,"cache_creation_input_tokens":40,"cache_read_input_tokens":900}}}"#
                    .to_owned(),
            ),
            ("ping", r#"{"type":"ping"}"#.to_owned()),
            (
                "content_block_delta",
                serde_json::json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":text}})
                    .to_string(),
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":8}}"#.to_owned(),
            ),
            ("message_stop", r#"{"type":"message_stop"}"#.to_owned()),
        ];
        events.iter().map(|(e, d)| format!("event: {e}\r\ndata: {d}\r\n\r\n")).collect()
    }

    fn read(kind: AnswerKind, body: &str, piece: usize) -> AnswerFacts {
        let mut scan = AnswerScan::new(kind);
        for chunk in body.as_bytes().chunks(piece) {
            scan.feed(chunk);
        }
        scan.into_facts()
    }

    const WANT: TokenUsage = TokenUsage {
        input_tokens: 12305,
        cache_creation_input_tokens: 40,
        cache_read_input_tokens: 900,
        output_tokens: 8,
    };

    #[test]
    fn a_stream_gives_start_usage_with_the_final_output_count() {
        let body = stream("hello \"usage\": {\"input_tokens\": 1}");
        for piece in [1, 2, 3, 17, body.len()] {
            let facts = read(AnswerKind::EventStream, &body, piece);
            assert_eq!(facts.usage, Some(WANT), "pieces of {piece}");
            assert_eq!(facts.model.as_deref(), Some("claude-opus-5-5"));
            assert_eq!(facts.message_id.as_deref(), Some("msg_1"));
            assert!(facts.stopped);
        }
    }

    #[test]
    fn input_fields_in_message_delta_replace_the_start() {
        let body = stream("x")
            .replace(r#""usage":{"output_tokens":8}"#, r#""usage":{"output_tokens":8,"input_tokens":12400}"#);
        assert_eq!(read(AnswerKind::EventStream, &body, 9).usage, Some(TokenUsage { input_tokens: 12400, ..WANT }));
    }

    #[test]
    fn a_huge_delta_line_is_skipped_unheld_and_usage_still_read() {
        let body = stream(&"y".repeat(3 * MAX_EVENT_LINE));
        let mut scan = AnswerScan::new(AnswerKind::EventStream);
        let mut held = 0;
        for chunk in body.as_bytes().chunks(4096) {
            scan.feed(chunk);
            held = held.max(scan.line.capacity());
        }
        assert!(held <= MAX_EVENT_LINE + 4096, "held {held}");
        assert_eq!(scan.facts().usage, Some(WANT));
    }

    #[test]
    fn a_cut_stream_has_usage_but_no_stop() {
        let body = stream("x");
        let cut = &body[..body.find("event: message_delta").unwrap_or(0)];
        let facts = read(AnswerKind::EventStream, cut, 5);
        assert!(!facts.stopped);
        assert_eq!(facts.usage.map(|u| u.output_tokens), Some(1));
    }

    #[test]
    fn a_json_answer_gives_its_usage_and_model() {
        let body = r#"{"id":"msg_2","type":"message","role":"assistant","model":"claude-opus-5-5","content":[{"type":"text","text":"\"usage\":{}"}],"usage":{"input_tokens":12305,"cache_creation_input_tokens":40,"cache_read_input_tokens":900,"output_tokens":8,"cache_creation":{"ephemeral_5m_input_tokens":40}}}"#;
        for piece in [1, 4, body.len()] {
            let facts = read(AnswerKind::Json, body, piece);
            assert_eq!(facts.usage, Some(WANT));
            assert_eq!(facts.message_id.as_deref(), Some("msg_2"));
        }
        assert_eq!(read(AnswerKind::Json, r#"{"type":"error","error":{"type":"overloaded_error"}}"#, 3).usage, None);
    }

    #[test]
    fn content_types() {
        assert_eq!(AnswerKind::from_content_type(Some("text/event-stream; charset=utf-8")), AnswerKind::EventStream);
        assert_eq!(AnswerKind::from_content_type(Some("Application/JSON")), AnswerKind::Json);
        assert_eq!(AnswerKind::from_content_type(None), AnswerKind::Other);
    }
}
