//! An incremental parser for server-sent events (the `text/event-stream` format both
//! providers stream in).
//!
//! The network hands over bytes in arbitrary pieces: a piece can end inside a UTF-8
//! character, between the `\r` and `\n` of a line end, or in the middle of a 1 MB data
//! line. The parser keeps only the unfinished line and looks at every byte once, so a
//! long stream costs time in proportion to its length whatever the piece sizes.
//! Lines are decoded as UTF-8 only once complete, so a split character is whole again
//! by then.
//!
//! Only what the providers use is kept: the `event` name and the `data` lines (joined
//! with `\n`). `id` and `retry` serve reconnection, which a one-shot request never does.
//! An event still open when the stream ends is dropped, as the format prescribes; the
//! provider then notices its end marker is missing.

/// One dispatched event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; empty when the server gave none (the format's "message").
    pub event: String,
    pub data: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("an event of more than {limit} bytes")]
    TooLarge { limit: usize },
}

/// A guard against a server that never ends a line or an event.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 32 * 1024 * 1024;

#[derive(Debug)]
pub struct SseParser {
    /// The bytes of the line not ended yet.
    line: Vec<u8>,
    /// The previous piece ended with `\r`: a `\n` first in the next piece belongs to it.
    after_cr: bool,
    /// No line processed yet: a byte-order mark may lead it.
    at_start: bool,
    event: String,
    data: String,
    has_data: bool,
    max_event_bytes: usize,
}

impl Default for SseParser {
    fn default() -> SseParser {
        SseParser::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl SseParser {
    pub fn new(max_event_bytes: usize) -> SseParser {
        SseParser {
            line: Vec::new(),
            after_cr: false,
            at_start: true,
            event: String::new(),
            data: String::new(),
            has_data: false,
            max_event_bytes,
        }
    }

    /// Feeds the next piece of the stream; complete events are appended to `out`.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if std::mem::take(&mut self.after_cr)
            && let Some((b'\n', rest)) = chunk.split_first()
        {
            chunk = rest;
        }
        while let Some(at) = memchr::memchr2(b'\n', b'\r', chunk) {
            if self.line.is_empty() {
                self.process_line(&chunk[..at], out);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(&chunk[..at]);
                self.process_line(&line, out);
                line.clear();
                self.line = line;
            }
            let ended_by_cr = chunk[at] == b'\r';
            chunk = &chunk[at + 1..];
            if ended_by_cr {
                match chunk.split_first() {
                    Some((b'\n', rest)) => chunk = rest,
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        self.line.extend_from_slice(chunk);
        if self.line.len() + self.data.len() > self.max_event_bytes {
            return Err(SseError::TooLarge { limit: self.max_event_bytes });
        }
        Ok(())
    }

    /// Whether an event or line was open when the stream stopped.
    pub fn has_partial(&self) -> bool {
        !self.line.is_empty() || self.has_data
    }

    fn process_line(&mut self, mut line: &[u8], out: &mut Vec<SseEvent>) {
        if std::mem::take(&mut self.at_start) {
            line = line.strip_prefix("\u{feff}".as_bytes()).unwrap_or(line);
        }
        if line.is_empty() {
            if std::mem::take(&mut self.has_data) {
                out.push(SseEvent { event: std::mem::take(&mut self.event), data: std::mem::take(&mut self.data) });
            } else {
                self.event.clear();
            }
            return;
        }
        if line[0] == b':' {
            return; // A comment; servers send them as keep-alives.
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        match field {
            b"event" => {
                self.event.clear();
                self.event.push_str(&String::from_utf8_lossy(value));
            }
            b"data" => {
                if std::mem::replace(&mut self.has_data, true) {
                    self.data.push('\n');
                }
                self.data.push_str(&String::from_utf8_lossy(value));
            }
            _ => {}
        }
    }
}

/// Parses `input` fed in pieces of `chunk_size` bytes and returns (events, data bytes).
/// Exists to measure the parser and to check that the piece size changes nothing.
pub fn parse_chunked(input: &[u8], chunk_size: usize) -> Result<(usize, usize), SseError> {
    let mut parser = SseParser::default();
    let mut out = Vec::new();
    let (mut events, mut bytes) = (0, 0);
    for chunk in input.chunks(chunk_size.max(1)) {
        parser.feed(chunk, &mut out)?;
        events += out.len();
        bytes += out.iter().map(|e| e.data.len()).sum::<usize>();
        out.clear();
    }
    Ok((events, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in(pieces: &[&[u8]]) -> Vec<SseEvent> {
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        for piece in pieces {
            parser.feed(piece, &mut out).unwrap();
        }
        out
    }

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent { event: event.to_owned(), data: data.to_owned() }
    }

    const SAMPLE: &str = "\u{feff}: keep-alive\r\nevent: message_start\r\ndata: {\"a\":\"é😀\"}\r\n\r\n\
        event: ping\ndata: {\"type\": \"ping\"}\n\n\
        data: first\rdata:second\r\rdata: [DONE]\n\nevent: dropped\n\n";

    #[test]
    fn fields_line_ends_comments_and_bom() {
        let expected = vec![
            ev("message_start", "{\"a\":\"é😀\"}"),
            ev("ping", "{\"type\": \"ping\"}"),
            ev("", "first\nsecond"),
            ev("", "[DONE]"),
        ];
        assert_eq!(parse_in(&[SAMPLE.as_bytes()]), expected);
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let bytes = SAMPLE.as_bytes();
        let whole = parse_in(&[bytes]);
        // Two pieces at every position (inside "😀", inside "\r\n", inside the BOM)...
        for at in 0..=bytes.len() {
            assert_eq!(parse_in(&[&bytes[..at], &bytes[at..]]), whole, "split at {at}");
        }
        // ...and one byte at a time.
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(parse_in(&singles), whole);
    }

    #[test]
    fn a_cr_at_the_end_of_a_piece_then_more_text() {
        // "\r" ends the line; the next piece starts a new line, not a continuation.
        assert_eq!(parse_in(&[b"data: a\r", b"\r", b"data: b\r", b"\n\r\n"]), vec![ev("", "a"), ev("", "b")]);
    }

    #[test]
    fn an_unfinished_event_is_not_dispatched() {
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        parser.feed(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n", &mut out).unwrap();
        assert!(out.is_empty());
        assert!(parser.has_partial());
    }

    #[test]
    fn oversized_events_are_refused() {
        let mut parser = SseParser::new(64);
        let mut out = Vec::new();
        let err = parser.feed(&[b'x'; 100], &mut out).unwrap_err();
        assert_eq!(err, SseError::TooLarge { limit: 64 });
    }

    #[test]
    fn ten_megabytes_in_seven_byte_pieces() {
        // Realistic delta events plus one 1 MB data line that spans ~150,000 pieces: a
        // parser that rescanned its buffer per piece would take minutes here.
        let event = "event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\
            \"delta\":{\"type\":\"text_delta\",\"text\":\"Résumé of the work so far — 😀 \"}}\r\n\r\n";
        let mut input = String::with_capacity(10 * 1024 * 1024 + 2 * 1024 * 1024);
        let big = "y".repeat(1024 * 1024);
        input.push_str(&format!("event: big\ndata: {big}\n\n"));
        let mut count = 1;
        while input.len() < 10 * 1024 * 1024 {
            input.push_str(event);
            count += 1;
        }
        let whole = parse_chunked(input.as_bytes(), input.len()).unwrap();
        let pieces = parse_chunked(input.as_bytes(), 7).unwrap();
        assert_eq!(whole.0, count);
        assert_eq!(pieces, whole);
    }
}
