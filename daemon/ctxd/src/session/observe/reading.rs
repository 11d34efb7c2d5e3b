//! Reading an observed transcript: from the compact boundary in force to the end when
//! the follower starts, and again whenever the file got shorter or was rewritten; in
//! between, only the bytes appended since the last read.
//!
//! A transcript is not only appended to. `ctxd claude undo` cuts it back to before a
//! compaction, the program or its user may rewrite it, and either may then grow it
//! again past the old end. Reading on from the old end would then count half lines and
//! miss what changed, so before each read the follower checks the file against what it
//! read: shorter than the offset reached, or different in the last [`TAIL`] bytes before
//! it (kept as read; one small read to compare), and the whole is read again from the
//! boundary in force now.
//!
//! Reading again costs one pass over the file that parses only compaction records,
//! file reads, replies and request shapes (to find that boundary, the files read before
//! it, and the model and request shape named before it), and one that folds every record from the boundary on. Both
//! go a chunk ([`CHUNK`]) at a time with [`Lines`]' cap on a line, so memory stays
//! bounded whatever the file holds.

use std::io::{Read, Seek, SeekFrom};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use ctxd_core::compact::compaction_view;
use ctxd_core::ledger::Ledger;
use ctxd_core::observed::{Observed, REQUEST_SHAPE_TYPE, RequestShape};
use ctxd_core::record::{Kind, Record};

use super::CHUNK;
use crate::statusline::MAX_LINE;
use crate::store::transcript::{compaction_record, may_carry_read, records_back_to};

/// Bytes before the offset reached that are kept as read, to tell a rewritten file from
/// one only appended to.
pub const TAIL: usize = 4096;

/// What a catch-up found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caught {
    /// The file is as it was when last read.
    Nothing,
    /// Bytes were appended and read.
    Appended,
    /// The file got shorter or was rewritten: it was read again from its boundary.
    Reread,
}

/// What the follower knows from the bytes read so far.
pub struct Reading {
    path: PathBuf,
    /// Where the next read starts: the end of what was read.
    pub offset: u64,
    lines: LineReader,
    pub observed: Observed,
    /// The last bytes before `offset`, as they were read.
    tail: Vec<u8>,
    /// Whether lines read note their file reads (a load's scan noted those before its end).
    note_reads: bool,
    /// Undone compactions (boundary through undo record, by where their lines start),
    /// which are not counted.
    undone: Vec<RangeInclusive<u64>>,
}

/// How long to wait before looking again at a transcript under a write lease.
pub const LEASED_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// Looks at a leased transcript this often before the first read gives up.
const LEASED_TRIES: u32 = 40;

/// Whether `error` says the file is under a write lease: ctxd holds one on a Claude Code
/// transcript for the few writes of a compaction or an undo, and a read that does not
/// wait on an open ([`crate::outside::open_regular`]) is refused meanwhile. The file is
/// there; it is read once the lease is let go.
pub fn is_leased(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::WouldBlock
}

impl Reading {
    /// [`Reading::load`], waiting (a couple of seconds at most) while the file is under
    /// a write lease.
    pub fn load_when_free(path: &Path) -> std::io::Result<Reading> {
        let mut tries = 0;
        loop {
            match Reading::load(path) {
                Err(e) if is_leased(&e) && tries < LEASED_TRIES => {
                    tries += 1;
                    std::thread::sleep(LEASED_PAUSE);
                }
                read => return read,
            }
        }
    }

    /// Reads the transcript at `path` from the compact boundary in force to its end.
    pub fn load(path: &Path) -> std::io::Result<Reading> {
        let (mut file, len) = crate::outside::open_regular(path)?;
        let scan = Scan::of(&mut file, len)?;
        let view = compaction_view(&scan.records);
        let (from, model, shape) = match view.boundary {
            Some(i) => (scan.offsets[i], scan.model_before[i].clone(), scan.shape_before[i]),
            None => (0, None, None),
        };
        let undone = view.skipped.iter().map(|span| scan.offsets[span.start]..=scan.offsets[span.end - 1]).collect();
        let mut observed = Observed::new(model, shape);
        observed.ledger = scan.ledger;
        let mut reading = Reading {
            path: path.to_owned(),
            offset: from,
            lines: LineReader::at(from),
            observed,
            tail: Vec::new(),
            note_reads: false,
            undone,
        };
        reading.read_to(&mut file, len)?;
        reading.note_reads = true;
        Ok(reading)
    }

    /// Reads what changed since the last read: the bytes appended, or the whole file
    /// again from its boundary when it got shorter or was rewritten.
    pub fn catch_up(&mut self) -> std::io::Result<Caught> {
        let (mut file, len) = crate::outside::open_regular(&self.path)?;
        if len < self.offset || !self.tail_intact(&mut file)? {
            drop(file);
            let mut again = Reading::load(&self.path)?;
            // What the file no longer says, it still was (the model of a session whose
            // last reply was cut away).
            if again.observed.model.is_none() {
                again.observed.model = self.observed.model.take();
            }
            if again.observed.cwd.is_none() {
                again.observed.cwd = self.observed.cwd.take();
            }
            *self = again;
            return Ok(Caught::Reread);
        }
        if len == self.offset {
            return Ok(Caught::Nothing);
        }
        self.read_to(&mut file, len)?;
        Ok(Caught::Appended)
    }

    /// Whether the bytes before the offset reached are still those read.
    fn tail_intact(&self, file: &mut std::fs::File) -> std::io::Result<bool> {
        if self.tail.is_empty() {
            return Ok(true);
        }
        let mut now = vec![0u8; self.tail.len()];
        file.seek(SeekFrom::Start(self.offset - self.tail.len() as u64))?;
        match file.read_exact(&mut now) {
            Ok(()) => Ok(now == self.tail),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Reads from the offset reached to `len`, a chunk at a time.
    fn read_to(&mut self, file: &mut std::fs::File, len: u64) -> std::io::Result<()> {
        let (mut lines, mut tail) = (std::mem::take(&mut self.lines), std::mem::take(&mut self.tail));
        let read = lines.read(
            file,
            self.offset,
            len,
            |chunk| keep_tail(&mut tail, chunk),
            |start, piece| self.line(start, piece),
        );
        (self.lines, self.tail) = (lines, tail);
        self.offset += read?;
        Ok(())
    }

    /// Folds in one line starting at byte `start`.
    fn line(&mut self, start: u64, piece: Piece<'_>) {
        if self.undone.iter().any(|span| span.contains(&start)) {
            return;
        }
        let bytes = match piece {
            Piece::TooLong(size) => return self.observed.unparsed(size),
            Piece::Line(bytes) => bytes,
        };
        let Some(record) = parse(bytes) else { return };
        if self.note_reads {
            self.observed.note_read(&record);
        }
        if record.is_compact_boundary() {
            let before = self.kept_before(start, &record);
            self.observed.boundary(&record, &before);
        } else {
            self.observed.observe(&record);
        }
    }

    /// The records before a boundary at byte `at` from the first message it keeps on
    /// (none when it keeps none, or they are not within the look-back).
    fn kept_before(&self, at: u64, boundary: &Record) -> Vec<Record> {
        let Some(head) = ctxd_core::preserved::segment_head(boundary) else { return Vec::new() };
        match records_back_to(&self.path, at, &head) {
            Ok(Some(records)) => records.into_iter().map(|(_, r)| r).collect(),
            Ok(None) => {
                tracing::warn!(path = %self.path.display(), at, "the messages an observed compact boundary keeps are not within the look-back before it");
                Vec::new()
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read the messages an observed compact boundary keeps");
                Vec::new()
            }
        }
    }
}

/// Keeps the last [`TAIL`] bytes of what was read in `tail`, `chunk` the latest read.
fn keep_tail(tail: &mut Vec<u8>, chunk: &[u8]) {
    if chunk.len() >= TAIL {
        tail.clear();
        tail.extend_from_slice(&chunk[chunk.len() - TAIL..]);
    } else {
        tail.extend_from_slice(chunk);
        let over = tail.len().saturating_sub(TAIL);
        tail.drain(..over);
    }
}

fn parse(line: &[u8]) -> Option<Record> {
    std::str::from_utf8(line).ok().and_then(|t| Record::parse(t).ok())
}

/// What one pass over a whole transcript finds without parsing most of it.
#[derive(Default)]
struct Scan {
    /// Compact boundaries and undo records, with where each starts, the model the
    /// latest reply before it named and the latest request shape before it (the system
    /// prompt and tools stay known when reading starts at a boundary).
    records: Vec<Record>,
    offsets: Vec<u64>,
    model_before: Vec<Option<String>>,
    shape_before: Vec<Option<RequestShape>>,
    /// Every file read in the file.
    ledger: Ledger,
}

impl Scan {
    fn of(file: &mut std::fs::File, len: u64) -> std::io::Result<Scan> {
        let mut scan = Scan::default();
        let mut model: Option<String> = None;
        let mut shape: Option<RequestShape> = None;
        LineReader::at(0).read(
            file,
            0,
            len,
            |_| {},
            |start, piece| {
                let Piece::Line(line) = piece else { return };
                if let Some(record) = compaction_record(line) {
                    scan.records.push(record);
                    scan.offsets.push(start);
                    scan.model_before.push(model.clone());
                    scan.shape_before.push(shape);
                } else if memchr::memmem::find(line, REQUEST_SHAPE_TYPE.as_bytes()).is_some()
                    && let Some(found) = parse(line).as_ref().and_then(RequestShape::of)
                {
                    shape = Some(found);
                } else if may_carry_read(line) {
                    if let Some(record) = parse(line) {
                        ctxd_core::observed::note_read(&mut scan.ledger, &record);
                    }
                } else if may_name_model(line)
                    && let Some(record) = parse(line)
                    && record.head().kind == Kind::Assistant
                    && !record.head().is_sidechain
                    && let Some(m) = record.head().model.as_deref().filter(|m| !m.starts_with('<'))
                    && model.as_deref() != Some(m)
                {
                    model = Some(m.to_owned());
                }
            },
        )?;
        Ok(scan)
    }
}

/// Whether `line` may be a reply that names its model (only those are parsed).
fn may_name_model(line: &[u8]) -> bool {
    memchr::memmem::find(line, br#""assistant""#).is_some() && memchr::memmem::find(line, br#""model""#).is_some()
}

/// Splits a file's bytes into lines as they are read, knowing where each starts.
#[derive(Debug, Default)]
struct LineReader {
    lines: Lines,
    /// Where the line being put together starts.
    line_start: u64,
}

impl LineReader {
    fn at(offset: u64) -> LineReader {
        LineReader { lines: Lines::default(), line_start: offset }
    }

    /// Reads `file` from `from` to `to` a chunk at a time, handing each chunk to
    /// `chunk` and each line finished in it to `each` with where it starts; returns the
    /// bytes read (fewer than asked when the file ended first).
    fn read(
        &mut self,
        file: &mut std::fs::File,
        from: u64,
        to: u64,
        mut chunk: impl FnMut(&[u8]),
        mut each: impl FnMut(u64, Piece<'_>),
    ) -> std::io::Result<u64> {
        if to <= from {
            return Ok(0);
        }
        file.seek(SeekFrom::Start(from))?;
        let mut left = to - from;
        let mut buffer = vec![0u8; usize::try_from(left).unwrap_or(CHUNK).min(CHUNK)];
        let mut read = 0u64;
        while left > 0 {
            let want = usize::try_from(left).unwrap_or(CHUNK).min(CHUNK);
            let n = match file.read(&mut buffer[..want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            read += n as u64;
            left -= n as u64;
            chunk(&buffer[..n]);
            let line_start = &mut self.line_start;
            self.lines.split(&buffer[..n], |piece| {
                let start = *line_start;
                *line_start += piece.len() + 1;
                each(start, piece);
            });
        }
        Ok(read)
    }
}

/// A piece of the bytes read: a whole line (without its line break), or the size of
/// one too long to keep.
pub enum Piece<'a> {
    Line(&'a [u8]),
    TooLong(u64),
}

impl Piece<'_> {
    /// Bytes of the line, its line break left out.
    fn len(&self) -> u64 {
        match self {
            Piece::Line(line) => line.len() as u64,
            Piece::TooLong(size) => *size,
        }
    }
}

/// Splits bytes into lines as they come, keeping at most [`MAX_LINE`] bytes of a line
/// not finished yet: past that the line is only measured.
#[derive(Debug, Default)]
pub struct Lines {
    /// The start of the line not finished yet.
    unfinished: Vec<u8>,
    /// Bytes so far of a line too long to keep (its start was let go).
    too_long: Option<u64>,
}

impl Lines {
    pub fn split(&mut self, mut bytes: &[u8], mut each: impl FnMut(Piece<'_>)) {
        while let Some(nl) = memchr::memchr(b'\n', bytes) {
            let end = &bytes[..nl];
            bytes = &bytes[nl + 1..];
            let size = self.unfinished.len() + end.len();
            if let Some(so_far) = self.too_long.take() {
                each(Piece::TooLong(so_far + end.len() as u64));
            } else if size > MAX_LINE {
                each(Piece::TooLong(size as u64));
                self.let_go();
            } else if self.unfinished.is_empty() {
                each(Piece::Line(end));
            } else {
                self.unfinished.extend_from_slice(end);
                each(Piece::Line(&self.unfinished));
                self.let_go();
            }
        }
        let size = self.unfinished.len() + bytes.len();
        if let Some(so_far) = &mut self.too_long {
            *so_far += bytes.len() as u64;
        } else if size > MAX_LINE {
            self.too_long = Some(size as u64);
            self.let_go();
        } else {
            self.unfinished.extend_from_slice(bytes);
        }
    }

    /// Empties the unfinished line, giving back a large buffer.
    fn let_go(&mut self) {
        self.unfinished.clear();
        if self.unfinished.capacity() > CHUNK {
            self.unfinished = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// The pieces `bytes` gives when fed in `pieces` parts.
    fn split_in(bytes: &[u8], pieces: usize) -> (Vec<String>, Vec<u64>, Lines) {
        let mut lines = Lines::default();
        let (mut whole, mut too_long) = (Vec::new(), Vec::new());
        for part in bytes.chunks(bytes.len().div_ceil(pieces).max(1)) {
            lines.split(part, |piece| match piece {
                Piece::Line(l) => whole.push(String::from_utf8_lossy(l).into_owned()),
                Piece::TooLong(n) => too_long.push(n),
            });
        }
        (whole, too_long, lines)
    }

    #[test]
    fn lines_come_whole_however_the_bytes_are_cut() {
        let text = b"one\ntwo\n\nthree\nunfinished";
        for pieces in [1, 2, 3, 7, text.len()] {
            let (whole, too_long, lines) = split_in(text, pieces);
            assert_eq!(whole, ["one", "two", "", "three"], "{pieces} pieces");
            assert!(too_long.is_empty());
            assert_eq!(lines.unfinished, b"unfinished");
        }
    }

    #[test]
    fn a_line_over_the_cap_is_counted_by_its_size_not_kept() {
        let mut text = vec![b'x'; MAX_LINE + 10];
        text.extend_from_slice(b"\nafter\n");
        text.extend(std::iter::repeat_n(b'y', MAX_LINE + 1));
        for pieces in [1, 5, 64] {
            let (whole, too_long, lines) = split_in(&text, pieces);
            assert_eq!(whole, ["after"], "{pieces} pieces");
            assert_eq!(too_long, [(MAX_LINE + 10) as u64]);
            // The endless last line: measured, nothing of it kept.
            assert_eq!(lines.too_long, Some(MAX_LINE as u64 + 1));
            assert!(lines.unfinished.capacity() <= CHUNK, "{}", lines.unfinished.capacity());
        }
        // At the cap exactly, a line is still read.
        let mut text = vec![b'z'; MAX_LINE];
        text.push(b'\n');
        let (whole, too_long, _) = split_in(&text, 3);
        assert_eq!((whole.len(), too_long.len()), (1, 0));
    }

    fn user(uuid: &str, text: &str) -> String {
        serde_json::json!({"type": "user", "uuid": uuid, "message": {"role": "user", "content": text}}).to_string()
    }

    fn reply(uuid: &str, input: u64) -> String {
        serde_json::json!({"type": "assistant", "uuid": uuid, "message": {"id": format!("m-{uuid}"),
            "model": "claude-opus-5-5", "role": "assistant", "content": [{"type": "text", "text": "ok"}],
            "usage": {"input_tokens": input, "output_tokens": 10}}})
        .to_string()
    }

    fn boundary(uuid: &str, post: u64) -> String {
        serde_json::json!({"type": "system", "subtype": "compact_boundary", "uuid": uuid,
            "compactMetadata": {"trigger": "manual", "preTokens": 1, "postTokens": post}})
        .to_string()
    }

    fn append(path: &Path, lines: &[String]) {
        let mut file = std::fs::OpenOptions::new().append(true).create(true).open(path).unwrap();
        for line in lines {
            writeln!(file, "{line}").unwrap();
        }
    }

    #[test]
    fn a_file_cut_back_is_read_again_from_its_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        append(&path, &[user("u1", "hello"), reply("a1", 40_000), boundary("b1", 3_000), user("u2", "more")]);
        let mut reading = Reading::load(&path).unwrap();
        assert_eq!(reading.observed.shown_tally().total(), 3_000, "the boundary's count is the floor");
        assert_eq!(reading.observed.model.as_deref(), Some("claude-opus-5-5"), "the model named before the boundary");
        let before = std::fs::metadata(&path).unwrap().len();
        append(&path, &[reply("a2", 5_000), boundary("b2", 1_000)]);
        assert_eq!(reading.catch_up().unwrap(), Caught::Appended);
        assert_eq!(reading.observed.shown_tally().total(), 1_000);
        // Cut back to before the second boundary, as an undo does.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(before).unwrap();
        append(&path, &[reply("a2", 5_000)]);
        assert_eq!(reading.catch_up().unwrap(), Caught::Reread);
        assert_eq!(reading.observed.shown_tally().total(), 5_010);
        assert_eq!(reading.catch_up().unwrap(), Caught::Nothing);
    }

    #[test]
    fn the_request_shape_before_the_boundary_is_known_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let shape = serde_json::json!({"type": "api-request-shape", "shape": {
            "system": [{"type": "text", "text": "you are ".repeat(100)}], "tools": [{"name": "Read"}]}})
        .to_string();
        append(&path, &[user("u1", "hello"), shape, reply("a1", 40_000), boundary("b1", 3_000)]);
        let reading = Reading::load(&path).unwrap();
        assert_eq!(reading.offset, std::fs::metadata(&path).unwrap().len());
        let prefix = reading.observed.prefix(0, 0);
        assert!(prefix.system_prompt > 0 && prefix.tools > 0, "{prefix:?}");
    }

    #[test]
    fn a_rewrite_of_the_same_length_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        append(&path, &[user("u1", "hello"), reply("a1", 40_000)]);
        let mut reading = Reading::load(&path).unwrap();
        assert_eq!(reading.observed.shown_tally().total(), 40_010);
        let text = std::fs::read_to_string(&path).unwrap().replace("40000", "50000");
        std::fs::write(&path, text).unwrap();
        assert_eq!(reading.catch_up().unwrap(), Caught::Reread);
        assert_eq!(reading.observed.shown_tally().total(), 50_010);
    }

    #[test]
    fn reads_before_the_boundary_are_known_and_none_is_counted_twice() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let read = |uuid: &str, file: &str| {
            serde_json::json!({"type": "user", "uuid": uuid,
                "toolUseResult": {"type": "text", "file": {"filePath": file, "content": "x\n"}},
                "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}})
            .to_string()
        };
        append(&path, &[read("r1", "/p/a.py"), boundary("b1", 100), read("r2", "/p/b.py")]);
        let mut reading = Reading::load(&path).unwrap();
        assert_eq!(reading.observed.ledger.len(), 2);
        assert_eq!(reading.observed.ledger.get("/p/b.py").map(|e| e.reads), Some(1));
        append(&path, &[read("r3", "/p/c.py")]);
        reading.catch_up().unwrap();
        assert_eq!(reading.observed.ledger.len(), 3);
    }
}
