//! Transcript lines read with a cap on each: a hostile or broken transcript with a
//! 500 MB line costs the time to skip it, never the memory to hold it.
//!
//! [`Lines`] streams complete lines (each ending in a line break) from an offset; a line
//! over the cap is reported by its offset and length and skipped. A last line without
//! its line break is not returned: the writer may be in the middle of it, so the reader
//! stops before it and the next read starts there. [`line_at`] reads the one line at an
//! offset, for a hit's snippet or a record's full text.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};

/// One step of [`Lines`].
#[derive(Debug, PartialEq, Eq)]
pub enum Item<'a> {
    /// A complete line (without its line break) starting at `offset`.
    Line { offset: u64, bytes: &'a [u8] },
    /// A complete line longer than the cap, skipped.
    TooLong { offset: u64, len: u64 },
}

/// Complete lines of a file from a given offset, each at most `cap` bytes held.
pub struct Lines<R> {
    reader: BufReader<R>,
    cap: usize,
    line: Vec<u8>,
    /// Offset of the next byte to read.
    at: u64,
    /// Offset just past the last complete line returned or skipped.
    complete_to: u64,
}

impl Lines<io::Take<File>> {
    /// Lines of `file` from `from` up to `end` (the length seen when it was opened: bytes
    /// appended later wait for the next read).
    pub fn from_file(mut file: File, from: u64, end: u64, cap: usize) -> io::Result<Self> {
        file.seek(SeekFrom::Start(from))?;
        Ok(Lines::new(file.take(end.saturating_sub(from)), from, cap))
    }
}

impl<R: Read> Lines<R> {
    pub fn new(reader: R, from: u64, cap: usize) -> Self {
        Lines {
            reader: BufReader::with_capacity(256 * 1024, reader),
            cap,
            line: Vec::new(),
            at: from,
            complete_to: from,
        }
    }

    /// Offset just past the last complete line: where the next read should start.
    pub fn complete_to(&self) -> u64 {
        self.complete_to
    }

    /// The next complete line, or `None` at the end (a torn last line is left unread).
    pub fn next_item(&mut self) -> io::Result<Option<Item<'_>>> {
        self.line.clear();
        let start = self.complete_to;
        let mut len: u64 = 0;
        let mut too_long = false;
        loop {
            let available = match self.reader.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if available.is_empty() {
                // The end, inside a line with no break yet: not complete.
                return Ok(None);
            }
            let (piece, found) = match memchr::memchr(b'\n', available) {
                Some(i) => (i, true),
                None => (available.len(), false),
            };
            len += piece as u64;
            if !too_long {
                if self.line.len() + piece > self.cap {
                    too_long = true;
                    self.line = Vec::new();
                } else {
                    self.line.extend_from_slice(&available[..piece]);
                }
            }
            let consumed = piece + usize::from(found);
            self.reader.consume(consumed);
            self.at += consumed as u64;
            if found {
                self.complete_to = self.at;
                return Ok(Some(if too_long {
                    Item::TooLong { offset: start, len }
                } else {
                    Item::Line { offset: start, bytes: &self.line }
                }));
            }
        }
    }
}

/// The line starting at `offset` (without its break), if it is complete and at most
/// `cap` bytes.
pub fn line_at(file: &File, offset: u64, cap: usize) -> io::Result<Option<Vec<u8>>> {
    let mut handle = file.try_clone()?;
    handle.seek(SeekFrom::Start(offset))?;
    let mut lines = Lines::new(handle, offset, cap);
    Ok(match lines.next_item()? {
        Some(Item::Line { bytes, .. }) => Some(bytes.to_vec()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(bytes: &[u8], cap: usize) -> (Vec<String>, u64) {
        let mut lines = Lines::new(bytes, 0, cap);
        let mut out = Vec::new();
        while let Some(item) = lines.next_item().unwrap() {
            out.push(match item {
                Item::Line { offset, bytes } => format!("{offset}:{}", String::from_utf8_lossy(bytes)),
                Item::TooLong { offset, len } => format!("{offset}:too long ({len})"),
            });
        }
        (out, lines.complete_to())
    }

    #[test]
    fn complete_lines_with_offsets_and_a_torn_tail_left_unread() {
        let (lines, to) = all(b"a\n\nbcd\nef", 16);
        assert_eq!(lines, ["0:a", "2:", "3:bcd"]);
        assert_eq!(to, 7, "the next read starts at the torn line");
        assert_eq!(all(b"", 16), (vec![], 0));
    }

    #[test]
    fn a_line_over_the_cap_is_skipped_and_the_next_is_read() {
        let mut text = b"ok\n".to_vec();
        text.extend(std::iter::repeat_n(b'x', 1000));
        text.extend(b"\nafter\n");
        let (lines, to) = all(&text, 10);
        assert_eq!(lines, ["0:ok", "3:too long (1000)", "1004:after"]);
        assert_eq!(to, text.len() as u64);
    }

    #[test]
    fn a_giant_line_costs_the_cap_not_its_size() {
        // 64 MiB of one line streamed through a 1 KiB cap: the reader holds the cap and
        // its buffer, never the line.
        struct Endless(u64);
        impl Read for Endless {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = (buf.len() as u64).min(self.0) as usize;
                buf[..n].fill(b'y');
                self.0 -= n as u64;
                if self.0 == 0 && n < buf.len() {
                    buf[n] = b'\n';
                    return Ok(n + 1);
                }
                Ok(n)
            }
        }
        let mut lines = Lines::new(Endless(64 << 20), 0, 1024);
        assert_eq!(lines.next_item().unwrap(), Some(Item::TooLong { offset: 0, len: 64 << 20 }));
        assert!(lines.line.capacity() <= 1024, "{}", lines.line.capacity());
    }

    #[test]
    fn one_line_at_an_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        std::fs::write(&path, "first\nsecond\nthird-torn").unwrap();
        let file = File::open(&path).unwrap();
        assert_eq!(line_at(&file, 6, 100).unwrap().as_deref(), Some(&b"second"[..]));
        assert_eq!(line_at(&file, 13, 100).unwrap(), None, "no line break yet");
        assert_eq!(line_at(&file, 6, 3).unwrap(), None, "over the cap");
    }
}
