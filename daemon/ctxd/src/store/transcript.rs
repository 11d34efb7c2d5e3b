//! One session's transcript: an append-only JSONL file, the source of truth.
//!
//! Appends write whole lines and call `sync_data` before anyone is told they are stored;
//! a batch of lines shares one sync (the caller batches concurrent appends). Loading
//! starts at a byte offset (the compact boundary the view starts at, from the index) so
//! resuming a long session reads only what the model can still see. A last line without its line
//! break is a write a crash interrupted: it was never acknowledged, so it is copied to a
//! side file for inspection and cut off. A damaged line in the middle is reported and
//! skipped, never removed.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ctxd_core::record::Record;

use super::StoreError;

/// An open transcript file.
#[derive(Debug)]
pub struct Transcript {
    file: File,
    path: PathBuf,
    len: u64,
}

/// What loading a transcript found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Records from the load offset on, in file order, each with its byte offset.
    pub records: Vec<(u64, Record)>,
    /// Lines that could not be read: where and why.
    pub damaged: Vec<String>,
    /// Bytes cut from the end (a torn last line), if any.
    pub torn_bytes: u64,
}

impl Transcript {
    /// Opens (creating when asked) the transcript at `path`, cuts a torn tail, and loads
    /// the records from byte `from` on. `from` must be the start of a line; an offset
    /// past the end loads nothing.
    pub fn open(path: &Path, create: bool, from: u64) -> Result<(Transcript, Loaded), StoreError> {
        let io = |e: std::io::Error| StoreError::io(path, e);
        let file = OpenOptions::new().read(true).append(true).create(create).mode(0o600).open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut transcript = Transcript { file, path: path.to_owned(), len };
        let torn_bytes = transcript.cut_torn_tail()?;
        let mut loaded = Loaded { torn_bytes, ..Loaded::default() };
        if from < transcript.len {
            let mut bytes = Vec::with_capacity((transcript.len - from) as usize);
            let file = &mut transcript.file;
            file.seek(SeekFrom::Start(from)).map_err(io)?;
            file.take(transcript.len - from).read_to_end(&mut bytes).map_err(io)?;
            parse_lines(&bytes, from, &mut loaded);
        }
        Ok((transcript, loaded))
    }

    /// If the file does not end with a line break, the last line is a torn write: save
    /// it beside the transcript and cut it off. Returns the bytes cut.
    fn cut_torn_tail(&mut self) -> Result<u64, StoreError> {
        let io = |e: std::io::Error| StoreError::io(&self.path, e);
        if self.len == 0 {
            return Ok(0);
        }
        // Find the last line break by reading backwards in blocks.
        let mut end = self.len;
        let mut keep = None;
        let mut block = vec![0u8; 64 * 1024];
        while end > 0 {
            let start = end.saturating_sub(block.len() as u64);
            let n = (end - start) as usize;
            self.file.seek(SeekFrom::Start(start)).map_err(io)?;
            self.file.read_exact(&mut block[..n]).map_err(io)?;
            if let Some(i) = memchr::memrchr(b'\n', &block[..n]) {
                keep = Some(start + i as u64 + 1);
                break;
            }
            end = start;
        }
        let keep = keep.unwrap_or(0);
        if keep == self.len {
            return Ok(0);
        }
        let torn = self.len - keep;
        let mut tail = Vec::with_capacity(torn as usize);
        self.file.seek(SeekFrom::Start(keep)).map_err(io)?;
        (&mut self.file).take(torn).read_to_end(&mut tail).map_err(io)?;
        let side = self.path.with_extension(format!("jsonl.torn-{keep}"));
        std::fs::write(&side, &tail).map_err(|e| StoreError::io(&side, e))?;
        self.file.set_len(keep).map_err(io)?;
        self.file.sync_data().map_err(io)?;
        tracing::warn!(
            path = %self.path.display(),
            bytes = torn,
            saved_to = %side.display(),
            "cut a torn last line left by an interrupted write (it was never acknowledged)"
        );
        self.len = keep;
        Ok(torn)
    }

    /// Cuts the file back to `offset` (a line start), saving what is cut beside it. Used
    /// for writes that were never acknowledged: a torn line, or a compaction install a
    /// crash interrupted. Returns the bytes cut.
    pub fn cut_unacknowledged(&mut self, offset: u64, why: &str) -> Result<u64, StoreError> {
        if offset >= self.len {
            return Ok(0);
        }
        let io = |e: std::io::Error| StoreError::io(&self.path, e);
        let cut = self.len - offset;
        let mut tail = Vec::with_capacity(cut as usize);
        self.file.seek(SeekFrom::Start(offset)).map_err(io)?;
        (&mut self.file).take(cut).read_to_end(&mut tail).map_err(io)?;
        let side = self.path.with_extension(format!("jsonl.{why}-{offset}"));
        std::fs::write(&side, &tail).map_err(|e| StoreError::io(&side, e))?;
        self.file.set_len(offset).map_err(io)?;
        self.file.sync_data().map_err(io)?;
        tracing::warn!(path = %self.path.display(), bytes = cut, saved_to = %side.display(), why, "cut unacknowledged records");
        self.len = offset;
        Ok(cut)
    }

    /// Appends lines (each without a line break) and syncs them to disk. Returns the
    /// byte offset of each line. On error nothing is acknowledged and the file is cut
    /// back to its previous length, so a failed batch never leaves half its lines.
    pub fn append(&mut self, lines: &[&str]) -> Result<Vec<u64>, StoreError> {
        let mut buf = Vec::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
        let mut offsets = Vec::with_capacity(lines.len());
        for line in lines {
            offsets.push(self.len + buf.len() as u64);
            buf.extend_from_slice(line.as_bytes());
            buf.push(b'\n');
        }
        let result = self.file.write_all(&buf).and_then(|()| self.file.sync_data());
        match result {
            Ok(()) => {
                self.len += buf.len() as u64;
                Ok(offsets)
            }
            Err(e) => {
                // Best effort: drop whatever part of the batch reached the file.
                let _ = self.file.set_len(self.len);
                Err(StoreError::io(&self.path, e))
            }
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Splits `bytes` (starting at file offset `base`) into records.
pub fn parse_lines(bytes: &[u8], base: u64, loaded: &mut Loaded) {
    let mut start = 0usize;
    for end in memchr::memchr_iter(b'\n', bytes) {
        let line = &bytes[start..end];
        let offset = base + start as u64;
        start = end + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let parsed = std::str::from_utf8(line)
            .map_err(|e| format!("not UTF-8: {e}"))
            .and_then(|text| Record::from_line(Arc::from(text)).map_err(|e| e.to_string()));
        match parsed {
            Ok(record) => loaded.records.push((offset, record)),
            Err(why) => loaded.damaged.push(format!("byte {offset}: {why}")),
        }
    }
}

/// The compaction records of a transcript: every compact boundary and every undo record
/// (`system/ctxd_undo_compact`), in file order, with where each starts.
#[derive(Debug, Default)]
pub struct Compactions {
    pub records: Vec<Record>,
    /// Byte offset of each record's line.
    pub offsets: Vec<u64>,
    /// Records in the file before each one.
    pub before: Vec<u64>,
    /// Records in the file.
    pub total: u64,
}

/// Scans a whole transcript for its compaction records without keeping the others, so
/// the boundary the view starts at can be found (the latest one not undone) by reading
/// each line once and parsing only the few that name a compaction.
pub fn scan_compactions(path: &Path) -> Result<Compactions, StoreError> {
    let bytes = std::fs::read(path).map_err(|e| StoreError::io(path, e))?;
    let mut found = Compactions::default();
    let mut start = 0usize;
    for end in memchr::memchr_iter(b'\n', &bytes) {
        let line = &bytes[start..end];
        let offset = start as u64;
        start = end + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if let Some(record) = compaction_record(line) {
            found.records.push(record);
            found.offsets.push(offset);
            found.before.push(found.total);
        }
        found.total += 1;
    }
    Ok(found)
}

/// The record `line` holds when it is a compaction record (a compact boundary or an
/// undo record); every other line costs two substring searches, no parse.
pub fn compaction_record(line: &[u8]) -> Option<Record> {
    // Cheap pre-check before parsing: both kinds name their subtype.
    let candidate = memchr::memmem::find(line, b"compact_boundary").is_some()
        || memchr::memmem::find(line, ctxd_core::compact::UNDO_SUBTYPE.as_bytes()).is_some();
    if !candidate {
        return None;
    }
    let record = Record::parse(std::str::from_utf8(line).ok()?).ok()?;
    (record.is_compact_boundary() || ctxd_core::compact::is_undo_record(&record)).then_some(record)
}

/// Whether `line` may carry a file read (a Read result or an explicit read marker):
/// only those are parsed to rebuild a ledger.
pub fn may_carry_read(line: &[u8]) -> bool {
    memchr::memmem::find(line, b"\"filePath\"").is_some()
        || memchr::memmem::find(line, ctxd_core::ledger::READ_MARKER_TYPE.as_bytes()).is_some()
}

/// Reads the records from byte `from` (a line start) to the end, without opening the
/// transcript for appending.
pub fn read_from(path: &Path, from: u64) -> Result<Loaded, StoreError> {
    let io = |e: std::io::Error| StoreError::io(path, e);
    let mut file = File::open(path).map_err(io)?;
    file.seek(SeekFrom::Start(from)).map_err(io)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(io)?;
    let mut loaded = Loaded::default();
    parse_lines(&bytes, from, &mut loaded);
    Ok(loaded)
}

/// Most bytes before a boundary read to find the messages it keeps in view
/// (`preservedSegment`): the segment is the end of the conversation it summarized, so
/// it lies just before the boundary; a head further back than this is not looked for.
pub const PRESERVED_LOOKBACK: u64 = 64 * 1024 * 1024;

/// The records before byte `end` (a line start: a boundary's offset) from the last line
/// whose record has uuid `head` on, read backwards in growing blocks up to
/// [`PRESERVED_LOOKBACK`]. `None` when it is not found there.
pub fn records_back_to(path: &Path, end: u64, head: &str) -> Result<Option<Vec<(u64, Record)>>, StoreError> {
    let io = |e: std::io::Error| StoreError::io(path, e);
    let mut file = File::open(path).map_err(io)?;
    let needle = format!("\"uuid\":\"{head}\"");
    let mut span = 64 * 1024u64;
    loop {
        let start = end.saturating_sub(span);
        let mut bytes = Vec::with_capacity((end - start) as usize);
        file.seek(SeekFrom::Start(start)).map_err(io)?;
        (&mut file).take(end - start).read_to_end(&mut bytes).map_err(io)?;
        // Whole lines only: what precedes the first line break may be a line's end.
        let skip = if start == 0 { 0 } else { memchr::memchr(b'\n', &bytes).map_or(bytes.len(), |i| i + 1) };
        if let Some(found) = memchr::memmem::rfind(&bytes[skip..], needle.as_bytes()) {
            let line_start = memchr::memrchr(b'\n', &bytes[..skip + found]).map_or(0, |i| i + 1);
            let mut loaded = Loaded::default();
            parse_lines(&bytes[line_start..], start + line_start as u64, &mut loaded);
            if loaded.records.first().is_some_and(|(_, r)| r.uuid() == Some(head)) {
                return Ok(Some(loaded.records));
            }
        }
        if start == 0 || span >= PRESERVED_LOOKBACK {
            return Ok(None);
        }
        span = (span * 4).min(PRESERVED_LOOKBACK);
    }
}

/// The records before byte `end` that carry a file read (a Read result or an explicit
/// read marker), for rebuilding a lost ledger.
pub fn records_with_reads(path: &Path, end: u64) -> Result<Vec<Record>, StoreError> {
    let mut file = File::open(path).map_err(|e| StoreError::io(path, e))?;
    let mut bytes = Vec::with_capacity(end as usize);
    (&mut file).take(end).read_to_end(&mut bytes).map_err(|e| StoreError::io(path, e))?;
    let mut out = Vec::new();
    for line in bytes.split(|b| *b == b'\n') {
        if may_carry_read(line)
            && let Ok(text) = std::str::from_utf8(line)
            && let Ok(record) = Record::parse(text)
        {
            out.push(record);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_then_reload_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let (mut t, loaded) = Transcript::open(&path, true, 0).unwrap();
        assert!(loaded.records.is_empty());
        let offsets = t.append(&[r#"{"type":"user","uuid":"a"}"#, r#"{"type":"user","uuid":"b"}"#]).unwrap();
        assert_eq!(offsets[0], 0);
        t.append(&[r#"{"type":"user","uuid":"c"}"#]).unwrap();
        drop(t);
        let (_, loaded) = Transcript::open(&path, false, 0).unwrap();
        let uuids: Vec<_> = loaded.records.iter().map(|(_, r)| r.uuid().unwrap().to_owned()).collect();
        assert_eq!(uuids, ["a", "b", "c"]);
        // Loading from the second line's offset skips the first.
        let (_, from) = Transcript::open(&path, false, offsets[1]).unwrap();
        assert_eq!(from.records.len(), 2);
    }

    #[test]
    fn torn_tail_is_cut_and_saved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        std::fs::write(&path, "{\"uuid\":\"a\"}\n{\"uuid\":\"b\"}\n{\"uuid\":\"c\",\"te").unwrap();
        let (t, loaded) = Transcript::open(&path, false, 0).unwrap();
        assert_eq!(loaded.records.len(), 2);
        assert_eq!(loaded.torn_bytes, "{\"uuid\":\"c\",\"te".len() as u64);
        assert_eq!(t.len(), std::fs::metadata(&path).unwrap().len());
        let side: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains("torn"))
            .collect();
        assert_eq!(side.len(), 1);
        assert_eq!(std::fs::read_to_string(side[0].path()).unwrap(), "{\"uuid\":\"c\",\"te");
    }

    #[test]
    fn damaged_middle_line_is_reported_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let content = "{\"uuid\":\"a\"}\nnot json at all\n{\"uuid\":\"c\"}\n";
        std::fs::write(&path, content).unwrap();
        let (_, loaded) = Transcript::open(&path, false, 0).unwrap();
        assert_eq!(loaded.records.len(), 2);
        assert_eq!(loaded.damaged.len(), 1);
        assert!(loaded.damaged[0].starts_with("byte 13:"), "{:?}", loaded.damaged);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), content, "nothing is deleted");
    }

    #[test]
    fn compaction_scan_finds_boundaries_and_undo_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let b = r#"{"type":"system","subtype":"compact_boundary","uuid":"b"}"#;
        let u = r#"{"type":"system","subtype":"ctxd_undo_compact","undoes":"b","uuid":"u"}"#;
        // A message that only mentions the words is not one of them.
        let m =
            r#"{"type":"user","uuid":"m","message":{"role":"user","content":"compact_boundary ctxd_undo_compact"}}"#;
        let text = format!("{{\"uuid\":\"a\"}}\n{b}\n{m}\n{u}\n{{\"uuid\":\"d\"}}\n");
        std::fs::write(&path, &text).unwrap();
        let found = scan_compactions(&path).unwrap();
        assert_eq!(found.total, 5);
        assert_eq!(found.before, [1, 3]);
        let uuids: Vec<_> = found.records.iter().map(|r| r.uuid().unwrap()).collect();
        assert_eq!(uuids, ["b", "u"]);
        assert_eq!(&text[found.offsets[0] as usize..][..b.len()], b);
        let tail = read_from(&path, found.offsets[1]).unwrap();
        let uuids: Vec<_> = tail.records.iter().map(|(_, r)| r.uuid().unwrap()).collect();
        assert_eq!(uuids, ["u", "d"]);
    }
}
