//! LSP base-protocol framing (`ctxd::transport::framing`).
//!
//! Two inputs: arbitrary bytes, and a stream of well-formed frames (varied header
//! spelling, both header terminators, blank lines between frames, bodies over the size
//! limit or not UTF-8), optionally after garbage. Both are read in pieces of a size the
//! input chooses, so every split of a header or a body across reads is tried.
//!
//! Properties:
//! - any bytes: the reader ends, never returns a body longer than the limit, and every
//!   body it returns is a run of bytes of the input; errors carry consistent numbers;
//! - well-formed frames: each frame gives exactly its own result, in order (its body,
//!   `TooLarge` or `InvalidUtf8`), whatever the read size and whatever garbage (without a
//!   `Content-Length`) came first; unless a body over the limit holds a `Content-Length`
//!   line of its own, where the reader rightly resynchronizes (a JSON body cannot hold a
//!   raw line break, so such a header means the declared length was wrong), and only the
//!   properties of any bytes apply.

#![no_main]

use std::pin::Pin;
use std::task::{Context, Poll};

use ctxd::transport::framing::{FrameError, FrameReader, encode};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, ReadBuf};

/// A frame of the well-formed stream, from one input segment: the first byte is the
/// style, the rest the body.
struct Frame<'a> {
    /// Bit 0: `\n\n` instead of `\r\n\r\n`; bits 1-2: header name spelling; bit 3: a
    /// `Content-Type` header first; bit 4: after it; bits 5-6: blank lines before.
    style: u8,
    body: &'a [u8],
}

/// Hands out its bytes at most `piece` at a time; always ready.
struct Pieces<'a> {
    data: &'a [u8],
    piece: usize,
}

impl AsyncRead for Pieces<'_> {
    fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let n = self.piece.min(self.data.len()).min(buf.remaining());
        let (now, rest) = self.data.split_at(n);
        buf.put_slice(now);
        self.data = rest;
        Poll::Ready(Ok(()))
    }
}

fn read_all(data: &[u8], piece: usize, max: usize) -> Vec<Result<String, FrameError>> {
    let mut reader = FrameReader::new(Pieces { data, piece }, max);
    let mut out = Vec::new();
    futures::executor::block_on(async {
        while let Some(frame) = reader.next_frame().await {
            out.push(frame);
            // Every result consumes at least one byte, so more results than bytes is a loop.
            assert!(
                out.len() <= data.len() + 1,
                "reader does not end: {} results from {} bytes",
                out.len(),
                data.len()
            );
        }
    });
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

fn check_any(results: &[Result<String, FrameError>], input: &[u8], max: usize) {
    let mut total = 0;
    for result in results {
        match result {
            Ok(body) => {
                assert!(body.len() <= max, "body of {} bytes over the limit {max}", body.len());
                assert!(contains(input, body.as_bytes()), "body {body:?} is not in the input");
                total += body.len();
            }
            Err(FrameError::TooLarge { len, max: m }) => assert!(*len > max && *m == max, "{result:?}"),
            Err(FrameError::Truncated { got, want }) => assert!(got < want && *want <= max, "{result:?}"),
            Err(_) => {}
        }
    }
    assert!(total <= input.len());
}

fn header(frame: &Frame<'_>) -> Vec<u8> {
    let name =
        ["Content-Length", "content-length", "CONTENT-LENGTH", "Content-length"][usize::from(frame.style >> 1 & 3)];
    let end = if frame.style & 1 == 0 { "\r\n" } else { "\n" };
    let mut out = Vec::new();
    for _ in 0..(frame.style >> 5 & 3) {
        out.extend_from_slice(end.as_bytes());
    }
    if frame.style & 8 != 0 {
        out.extend_from_slice(format!("Content-Type: application/vscode-jsonrpc; charset=utf-8{end}").as_bytes());
    }
    out.extend_from_slice(format!("{name}: {}{end}", frame.body.len()).as_bytes());
    if frame.style & 16 != 0 {
        out.extend_from_slice(format!("content-type: x{end}").as_bytes());
    }
    out.extend_from_slice(end.as_bytes());
    out
}

fn expected(frame: &Frame<'_>, max: usize) -> Result<String, FrameError> {
    if frame.body.len() > max {
        return Err(FrameError::TooLarge { len: frame.body.len(), max });
    }
    String::from_utf8(frame.body.to_vec()).map_err(|e| FrameError::InvalidUtf8(e.utf8_error().to_string()))
}

// Input: one byte (high bit: the well-formed mode; the rest: the read size), the body
// limit (two bytes, little-endian), then either the raw stream or segments separated by
// 0xFF: garbage, then one segment per frame.
fuzz_target!(|data: &[u8]| {
    let [mode, lo, hi, rest @ ..] = data else { return };
    let piece = usize::from(mode & 0x7f).max(1);
    let max = usize::from(u16::from_le_bytes([*lo, *hi]));
    if mode & 0x80 == 0 {
        let results = read_all(rest, piece, max);
        check_any(&results, rest, max);
        return;
    }
    let mut segments = rest.split(|b| *b == 0xff);
    let mut garbage = segments.next().unwrap_or_default().to_vec();
    if garbage.to_ascii_lowercase().windows(14).any(|w| w == b"content-length") {
        garbage.clear();
    }
    let frames: Vec<Frame<'_>> = segments
        .map(|s| match s.split_first() {
            Some((style, body)) => Frame { style: *style, body },
            None => Frame { style: 0, body: s },
        })
        .collect();
    let mut stream = garbage.clone();
    let mut want = Vec::new();
    for frame in &frames {
        if frame.style == 0 {
            // The writer's own encoding.
            stream.extend_from_slice(&encode(frame.body));
        } else {
            stream.extend_from_slice(&header(frame));
            stream.extend_from_slice(frame.body);
        }
        want.push(expected(frame, max));
    }
    let results = read_all(&stream, piece, max);
    check_any(&results, &stream, max);
    let resyncs =
        |f: &Frame<'_>| f.body.len() > max && f.body.to_ascii_lowercase().windows(15).any(|w| w == b"content-length:");
    if frames.iter().any(resyncs) {
        return;
    }
    assert!(results.len() >= want.len(), "frames lost: {results:?} for {want:?}");
    let (before, mine) = results.split_at(results.len() - want.len());
    assert_eq!(mine, want.as_slice(), "garbage {garbage:?}");
    assert!(before.iter().all(Result::is_err), "{before:?}");
    if garbage.is_empty() {
        assert!(before.is_empty(), "{before:?}");
    }
});
