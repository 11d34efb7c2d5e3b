//! LSP base-protocol framing: `Content-Length` headers, then a UTF-8 JSON body.
//!
//! The reader never gives up on a stream. Every malformed frame becomes a
//! [`FrameError`] for that frame alone, and the reader finds the next frame: after a bad
//! header it skips to the next `Content-Length`; an oversized body is reported at once
//! and skipped by its declared length without being buffered, unless a new header turns
//! up inside it (a raw line break cannot be part of a JSON body, so the declared length
//! was wrong) and reading goes on from there. Header names are matched without regard to
//! case and `Content-Type` is accepted and ignored, as editors differ there.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Longest header block accepted before the reader treats the bytes as garbage.
const MAX_HEADER_BYTES: usize = 8 * 1024;
const CONTENT_LENGTH: &[u8] = b"content-length";

/// Why one frame could not be read. The stream itself goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame has no Content-Length header")]
    MissingContentLength,
    #[error("Content-Length is not a number: {0:?}")]
    BadContentLength(String),
    #[error("header block is longer than {MAX_HEADER_BYTES} bytes or not text; skipped to the next Content-Length")]
    BadHeader,
    #[error("message of {len} bytes exceeds the limit of {max} bytes; skipped")]
    TooLarge { len: usize, max: usize },
    #[error("message body is not valid UTF-8: {0}")]
    InvalidUtf8(String),
    #[error("stream ended inside a message body ({got} of {want} bytes)")]
    Truncated { got: usize, want: usize },
}

/// Reads frames from a byte stream.
///
/// [`FrameReader::next_frame`] is cancel-safe: its only await point is a read into the
/// buffer, and the frame state lives in the reader, so dropping the future (as
/// `tokio::select!` does) loses nothing.
#[derive(Debug)]
pub struct FrameReader<R> {
    input: R,
    buf: BytesMut,
    max_body: usize,
    eof: bool,
    state: State,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Header,
    Body(usize),
    Skip { remaining: usize },
}

/// Bytes kept back while skipping, enough to hold `Content-Length: <20 digits>\r\n`.
const HEADER_TAIL: usize = 64;

/// Where a frame header starts in `bytes`: `Content-Length:` (any case), a number and a
/// raw line break, something a JSON body cannot hold.
fn next_header_in(bytes: &[u8]) -> Option<usize> {
    let mut from = 0;
    while from < bytes.len() {
        let at = from + memchr::memmem::find_iter(&bytes[from..], b":").next()?;
        from = at + 1;
        let name_start = at.checked_sub(CONTENT_LENGTH.len())?;
        if !bytes[name_start..at].eq_ignore_ascii_case(CONTENT_LENGTH) {
            continue;
        }
        let rest = &bytes[at + 1..];
        let spaces = rest.iter().take_while(|b| **b == b' ' || **b == b'\t').count();
        let digits = rest[spaces..].iter().take_while(|b| b.is_ascii_digit()).count();
        let after = &rest[spaces + digits..];
        if digits > 0 && (after.starts_with(b"\r\n") || after.starts_with(b"\n")) {
            return Some(name_start);
        }
    }
    None
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(input: R, max_body: usize) -> Self {
        FrameReader { input, buf: BytesMut::with_capacity(64 * 1024), max_body, eof: false, state: State::Header }
    }

    /// The next frame's body, an error for a malformed frame, or `None` at the end of
    /// the stream.
    pub async fn next_frame(&mut self) -> Option<Result<String, FrameError>> {
        loop {
            match self.state {
                State::Header => match self.parse_header() {
                    HeaderParse::Complete { header_len, content_length } => match content_length {
                        Ok(len) => {
                            self.buf.advance(header_len);
                            if len > self.max_body {
                                // Said at once: a client that declared a huge length
                                // and sent a small body must not wait for the skip.
                                self.state = State::Skip { remaining: len };
                                return Some(Err(FrameError::TooLarge { len, max: self.max_body }));
                            }
                            self.state = State::Body(len);
                        }
                        Err(e) => {
                            tracing::debug!(buffered = %String::from_utf8_lossy(&self.buf[..self.buf.len().min(300)]), "bad header block");
                            // The block may have swallowed the start of a real frame:
                            // look for the next header from just past this one's start.
                            self.buf.advance(1);
                            self.resync();
                            return Some(Err(e));
                        }
                    },
                    HeaderParse::Garbage => {
                        self.buf.advance(1);
                        self.resync();
                        return Some(Err(FrameError::BadHeader));
                    }
                    HeaderParse::Partial => {
                        if self.eof {
                            // Trailing whitespace at the end of a stream is not a frame.
                            if self.buf.iter().all(u8::is_ascii_whitespace) {
                                return None;
                            }
                            self.buf.clear();
                            return Some(Err(FrameError::MissingContentLength));
                        }
                        self.fill().await;
                    }
                },
                State::Body(len) => {
                    if self.buf.len() >= len {
                        self.state = State::Header;
                        let body = self.buf.split_to(len);
                        return Some(
                            String::from_utf8(body.to_vec())
                                .map_err(|e| FrameError::InvalidUtf8(e.utf8_error().to_string())),
                        );
                    }
                    if self.eof {
                        self.state = State::Header;
                        let got = self.buf.len();
                        self.buf.clear();
                        return Some(Err(FrameError::Truncated { got, want: len }));
                    }
                    self.buf.reserve(len - self.buf.len());
                    self.fill().await;
                }
                State::Skip { remaining } => {
                    let scope = remaining.min(self.buf.len());
                    if let Some(at) = next_header_in(&self.buf[..scope]) {
                        tracing::warn!(
                            skipped = at,
                            "a new frame header inside an oversized body: its length was wrong; reading on from the header"
                        );
                        self.buf.advance(at);
                        self.state = State::Header;
                        continue;
                    }
                    // Keep a tail that could be the start of a header still arriving.
                    let take =
                        if remaining <= self.buf.len() || self.eof { scope } else { scope.saturating_sub(HEADER_TAIL) };
                    self.buf.advance(take);
                    let remaining = remaining - take;
                    if remaining == 0 || self.eof {
                        self.state = State::Header;
                        continue;
                    }
                    self.state = State::Skip { remaining };
                    self.fill().await;
                }
            }
        }
    }

    fn parse_header(&self) -> HeaderParse {
        let data = &self.buf[..];
        // Leading line breaks between frames are tolerated.
        let start = data.iter().take_while(|b| **b == b'\r' || **b == b'\n').count();
        let data = &data[start..];
        // The header ends at the first blank line, whichever line break it uses: a later
        // `\r\n\r\n` (the next frame's) must not win over this frame's `\n\n`.
        let crlf = memchr::memmem::find(data, b"\r\n\r\n").map(|i| (i, i + 4));
        let lf_scope = crlf.map_or(data.len(), |(_, end)| end);
        let lf = memchr::memmem::find(&data[..lf_scope], b"\n\n").map(|i| (i, i + 2));
        let end = match (crlf, lf) {
            (Some(crlf), Some(lf)) => Some(if lf.0 < crlf.0 { lf } else { crlf }),
            (crlf, lf) => crlf.or(lf),
        };
        let Some((block_end, header_end)) = end else {
            return if data.len() > MAX_HEADER_BYTES { HeaderParse::Garbage } else { HeaderParse::Partial };
        };
        if block_end > MAX_HEADER_BYTES {
            return HeaderParse::Garbage;
        }
        let Ok(block) = std::str::from_utf8(&data[..block_end]) else {
            return HeaderParse::Garbage;
        };
        let mut content_length = Err(FrameError::MissingContentLength);
        for line in block.split('\n') {
            let line = line.trim_end_matches('\r');
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            if name.trim().eq_ignore_ascii_case("content-length") {
                let value = value.trim();
                content_length =
                    value.parse::<usize>().map_err(|_| FrameError::BadContentLength(value.chars().take(40).collect()));
            }
        }
        HeaderParse::Complete { header_len: start + header_end, content_length }
    }

    /// Drops bytes up to the next `Content-Length` header, keeping a tail that could be
    /// the start of one still arriving.
    fn resync(&mut self) {
        let lower: Vec<u8> = self.buf.iter().map(u8::to_ascii_lowercase).collect();
        match memchr::memmem::find(&lower, CONTENT_LENGTH) {
            Some(at) => self.buf.advance(at),
            None => {
                let keep = (1..CONTENT_LENGTH.len().min(lower.len() + 1))
                    .rev()
                    .find(|&n| lower.ends_with(&CONTENT_LENGTH[..n]))
                    .unwrap_or(0);
                let drop = self.buf.len() - keep;
                self.buf.advance(drop);
            }
        }
    }

    async fn fill(&mut self) {
        if self.buf.capacity() - self.buf.len() < 8 * 1024 {
            self.buf.reserve(64 * 1024);
        }
        match self.input.read_buf(&mut self.buf).await {
            Ok(0) | Err(_) => self.eof = true,
            Ok(_) => {}
        }
    }
}

enum HeaderParse {
    Complete { header_len: usize, content_length: Result<usize, FrameError> },
    Partial,
    Garbage,
}

/// Frames a message body for writing.
pub fn encode(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 32);
    encode_into(body, &mut out);
    out
}

/// [`encode`], appending the frame to `out`.
pub fn encode_into(body: &[u8], out: &mut Vec<u8>) {
    out.reserve(body.len() + 32);
    out.extend_from_slice(header(body.len()).as_bytes());
    out.extend_from_slice(body);
}

/// The header in front of a body of `length` bytes.
pub fn header(length: usize) -> String {
    format!("Content-Length: {length}\r\n\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read_all(input: &[u8], max: usize) -> Vec<Result<String, FrameError>> {
        let mut reader = FrameReader::new(input, max);
        let mut out = Vec::new();
        while let Some(frame) = reader.next_frame().await {
            out.push(frame);
        }
        out
    }

    fn frame(body: &str) -> Vec<u8> {
        encode(body.as_bytes())
    }

    #[tokio::test]
    async fn reads_consecutive_frames_and_ignores_header_case_and_content_type() {
        let mut input = frame("{\"a\":1}");
        input.extend_from_slice(
            b"content-length: 7\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n{\"b\":2}",
        );
        let frames = read_all(&input, 1024).await;
        assert_eq!(frames, vec![Ok("{\"a\":1}".to_string()), Ok("{\"b\":2}".to_string())]);
    }

    #[tokio::test]
    async fn recovers_after_each_kind_of_bad_frame() {
        let good = frame("{}");
        let mut input = Vec::new();
        input.extend_from_slice(b"Content-Type: x\r\n\r\n"); // no length
        input.extend_from_slice(&good);
        input.extend_from_slice(b"Content-Length: lots\r\n\r\n{}"); // bad length
        input.extend_from_slice(&good);
        input.extend_from_slice(b"Content-Length: 4\r\n\r\n\xff\xfe\xfd\xfc"); // bad utf-8
        input.extend_from_slice(&good);
        input.extend_from_slice(b"Content-Length: 50\r\n\r\n"); // oversized, skipped by length
        input.extend_from_slice(&[b'x'; 50]);
        input.extend_from_slice(&good);
        input.extend_from_slice(b"garbage garbage\r\n\r\n"); // not a header at all
        input.extend_from_slice(&good);
        let frames = read_all(&input, 20).await;
        let oks = frames.iter().filter(|f| f.as_ref().is_ok_and(|b| b == "{}")).count();
        assert_eq!(oks, 5, "{frames:?}");
        assert!(frames.contains(&Err(FrameError::MissingContentLength)));
        assert!(frames.contains(&Err(FrameError::BadContentLength("lots".into()))));
        assert!(frames.iter().any(|f| matches!(f, Err(FrameError::InvalidUtf8(_)))));
        assert!(frames.contains(&Err(FrameError::TooLarge { len: 50, max: 20 })));
    }

    /// A declared length far beyond the limit with a small body: the error comes at
    /// once and the next frame is read, without waiting for the declared bytes.
    #[tokio::test]
    async fn an_oversized_length_is_reported_at_once_and_reading_resumes_at_the_next_header() {
        use tokio::io::AsyncWriteExt;
        for declared in ["73400320", "4611686018427387904"] {
            let (client, mut server) = tokio::io::duplex(1 << 16);
            let mut reader = FrameReader::new(client, 1024);
            server.write_all(format!("Content-Length: {declared}\r\n\r\n{{}}").as_bytes()).await.unwrap();
            assert!(matches!(reader.next_frame().await, Some(Err(FrameError::TooLarge { .. }))));
            // The stream stays open: the next frame arrives later, in two pieces.
            server.write_all(b"Content-Len").await.unwrap();
            server.write_all(b"gth: 7\r\n\r\n{\"b\":2}").await.unwrap();
            assert_eq!(reader.next_frame().await, Some(Ok("{\"b\":2}".to_owned())), "{declared}");
        }
    }

    #[test]
    fn a_header_is_found_only_with_a_number_and_a_raw_line_break() {
        assert_eq!(next_header_in(b"xx}content-length: 12\r\n\r\n"), Some(3));
        assert_eq!(next_header_in(b"Content-Length:7\n"), Some(0));
        assert_eq!(next_header_in(b"\"Content-Length: 12\\r\\n\""), None, "escaped, inside a JSON string");
        assert_eq!(next_header_in(b"Content-Length: lots\r\n"), None);
        assert_eq!(next_header_in(b"Content-Length: 12"), None, "not complete yet");
    }

    #[tokio::test]
    async fn a_bad_header_does_not_eat_the_next_frame_when_it_arrives_later() {
        use tokio::io::AsyncWriteExt;
        let (client, mut server) = tokio::io::duplex(1 << 16);
        let mut reader = FrameReader::new(client, 1024);
        server.write_all(&frame("{\"a\":1}")).await.unwrap();
        assert_eq!(reader.next_frame().await, Some(Ok("{\"a\":1}".into())));
        server.write_all(b"Content-Type: application/json\r\n\r\n{}").await.unwrap();
        assert_eq!(reader.next_frame().await, Some(Err(FrameError::MissingContentLength)));
        server.write_all(b"Con").await.unwrap();
        server.write_all(&frame("{\"b\":2}")[3..]).await.unwrap();
        assert_eq!(reader.next_frame().await, Some(Ok("{\"b\":2}".into())));
    }

    // Found by the `framing` fuzz target: with both frames buffered, the second frame's
    // `\r\n\r\n` was taken as the end of the first one's `\n\n` header, and the two
    // frames came out as one.
    #[tokio::test]
    async fn a_header_ends_at_its_own_blank_line_when_the_next_frame_uses_crlf() {
        let input = b"\nContent-Type: x\nContent-Length: 0\n\nContent-Length: 0\r\n\r\n";
        assert_eq!(read_all(input, 1024).await, vec![Ok(String::new()), Ok(String::new())]);
        let input = b"Content-Length: 2\n\n{}Content-Length: 7\r\n\r\n{\"b\":2}";
        assert_eq!(read_all(input, 1024).await, vec![Ok("{}".to_string()), Ok("{\"b\":2}".to_string())]);
    }

    #[tokio::test]
    async fn truncated_body_at_end_of_stream() {
        let frames = read_all(b"Content-Length: 10\r\n\r\n{\"a\"", 1024).await;
        assert_eq!(frames, vec![Err(FrameError::Truncated { got: 4, want: 10 })]);
    }

    #[tokio::test]
    async fn frames_split_across_reads() {
        let input = frame("{\"hello\":\"world\"}");
        let (client, mut server) = tokio::io::duplex(4);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for chunk in input.chunks(3) {
                server.write_all(chunk).await.unwrap();
            }
        });
        let mut reader = FrameReader::new(client, 1024);
        assert_eq!(reader.next_frame().await, Some(Ok("{\"hello\":\"world\"}".to_string())));
        writer.await.unwrap();
    }
}
