//! Reading a Claude Code transcript with memory bounded whatever its size.
//!
//! A long session's transcript runs to gigabytes, and a compaction needs only part of
//! it: the newest records in full (what stays in view, the last turns the summary
//! describes, the files read, the model and the project), and from the rest what the
//! summary's fidelity check holds it to, the user's prompts. So the newest
//! [`WINDOW_BYTES`] are read as records, from the first line that starts in them, and
//! the older part is streamed through a bounded line buffer keeping only:
//!
//! - the last compact boundary before the window and its summary (a summary carries
//!   what came before it, so prompts before that boundary are not needed);
//! - the user's prompts since it, each shortened to [`PROMPT_CHARS`] characters and
//!   to the fields the summary reads, at most [`EARLIER_PROMPT_BYTES`] of them (the
//!   first and the newest kept; how many were left out is counted);
//! - the session's first reply with a usage report (its request carried the system
//!   prompt, tools and memory: the fixed part of every request).
//!
//! These records come first, in file order, before the window's. A line of the older
//! part longer than [`EARLIER_LINE_CAP`] (a large tool result) is skipped unread; a
//! shorter one must be JSON, or the transcript is refused as damaged.
//!
//! The numbers. The window is 128 MiB so that the 100 MB session of `BENCHMARKS.md`
//! (24k records, 2,762 prompts) is still read whole: its summary is the one a full
//! read gives, naming every file the session touched, in about the same time (and in
//! 133 MB rather than 211 MB at the peak: the file is read in chunks, never held
//! whole). With a 64 MiB window that session lost a third of its tool calls and files
//! from the summary's scope for a 30 % saving. Past the window only the prompts come
//! through, and the summary's scope (tool calls, files touched) counts the window's;
//! the prompts take a few MB (the 29k prompts of a 1.1 GB generated session, 13 MB)
//! where the summary's cap holds about 200 KB. So a transcript of any size is compacted
//! in about twice the window: 220 MB for that 1.1 GB session.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::SystemTime;

use ctxd_core::record::{Kind, Record};

/// Bytes at the end of a transcript read as whole records.
pub const WINDOW_BYTES: u64 = 128 << 20;
/// A line of the older part longer than this is skipped without being read.
pub const EARLIER_LINE_CAP: usize = 4 << 20;
/// Characters kept of each prompt from the older part.
pub const PROMPT_CHARS: usize = 1_000;
/// Bytes of prompts from the older part kept at most (the newest).
pub const EARLIER_PROMPT_BYTES: usize = 16 << 20;
/// Bytes read at a time.
const CHUNK: usize = 1 << 20;

/// What identifies the file's content for "has it changed": length and modification
/// time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub len: u64,
    pub modified: Option<SystemTime>,
}

impl Stamp {
    pub fn of(file: &File) -> Result<Stamp, String> {
        let meta = file.metadata().map_err(|e| format!("cannot read its length: {e}"))?;
        Ok(Stamp { len: meta.len(), modified: meta.modified().ok() })
    }
}

/// A transcript as read for a compaction or an undo.
#[derive(Debug, Default)]
pub struct Transcript {
    /// The newest records, in full, with their byte offsets.
    pub window: Vec<(u64, Record)>,
    /// From before the window (empty when the window is the whole file): see the
    /// module's documentation.
    pub earlier: Vec<Record>,
    /// Where the window starts (0: the whole file was read).
    pub window_from: u64,
    /// Prompts of the older part left out past [`EARLIER_PROMPT_BYTES`].
    pub prompts_left_out: usize,
    /// Lines of the older part longer than [`EARLIER_LINE_CAP`], skipped.
    pub lines_skipped: usize,
}

impl Transcript {
    /// Every record read, oldest first: the older part's, then the window's.
    pub fn records(self) -> Vec<Record> {
        let mut all = self.earlier;
        all.extend(self.window.into_iter().map(|(_, r)| r));
        all
    }
}

/// Whether the older part is streamed for what a compaction needs, or skipped (an
/// undo needs only the install at the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Older {
    Read,
    Skip,
}

/// Reads `file`'s first `len` bytes (its length when the caller took its stamp) as a
/// Claude Code transcript. Refused: a last line without its line break (the program
/// may be writing it), a damaged line, a newest line larger than the whole window.
pub fn read(file: &File, len: u64, older: Older) -> Result<Transcript, String> {
    read_within(file, len, older, WINDOW_BYTES)
}

/// [`read`] with a window of `window` bytes.
fn read_within(file: &File, len: u64, older: Older, window: u64) -> Result<Transcript, String> {
    let mut read = Transcript::default();
    if len == 0 {
        return Ok(read);
    }
    let mut last = [0u8];
    file.read_exact_at(&mut last, len - 1).map_err(shrank)?;
    if last[0] != b'\n' {
        return Err("its last line is incomplete (the program may be writing it)".to_owned());
    }
    read.window_from = window_start(file, len, window)?;
    if read.window_from > 0 && older == Older::Read {
        let mut earlier = Earlier::default();
        each_line(file, 0, read.window_from, EARLIER_LINE_CAP, |offset, line| earlier.line(offset, line))?;
        read.prompts_left_out = earlier.prompts_left_out;
        read.lines_skipped = earlier.lines_skipped;
        read.earlier = earlier.into_records();
    }
    let window = &mut read.window;
    each_line(file, read.window_from, len, usize::MAX, |offset, line| {
        let Line::Whole(line) = line else { return Ok(()) };
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        let text = std::str::from_utf8(line).map_err(|e| damaged(offset, &format!("not UTF-8: {e}")))?;
        let record = Record::from_line(Arc::from(text)).map_err(|e| damaged(offset, &e.to_string()))?;
        window.push((offset, record));
        Ok(())
    })?;
    Ok(read)
}

fn shrank(e: std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        "it was cut short while being read".to_owned()
    } else {
        format!("cannot read it: {e}")
    }
}

fn damaged(offset: u64, why: &str) -> String {
    format!("it has a line that is not a record (byte {offset}: {why})")
}

/// Where the window starts: 0 for a file within `window` bytes, else the first line
/// that starts in its last `window` bytes.
fn window_start(file: &File, len: u64, window: u64) -> Result<u64, String> {
    if len <= window {
        return Ok(0);
    }
    // A line starts after a line break: look from the byte before the window on.
    let mut at = len - window - 1;
    let mut chunk = vec![0u8; 64 << 10];
    while at < len {
        let n = chunk.len().min(usize::try_from(len - at).unwrap_or(usize::MAX));
        file.read_exact_at(&mut chunk[..n], at).map_err(shrank)?;
        if let Some(i) = memchr::memchr(b'\n', &chunk[..n]) {
            let start = at + i as u64 + 1;
            if start >= len {
                break;
            }
            return Ok(start);
        }
        at += n as u64;
    }
    Err(format!("its newest line is larger than the {} MiB ctxd reads of a transcript", window >> 20))
}

/// A line as [`each_line`] gives it: whole, or only its length when it is over the cap.
enum Line<'a> {
    Whole(&'a [u8]),
    Skipped,
}

/// Calls `f` with each line of `file` in `from..to` (both line starts) and its offset,
/// reading [`CHUNK`] bytes at a time and holding at most `cap` bytes of one line.
fn each_line(
    file: &File,
    from: u64,
    to: u64,
    cap: usize,
    mut f: impl FnMut(u64, Line<'_>) -> Result<(), String>,
) -> Result<(), String> {
    let mut chunk = vec![0u8; CHUNK];
    // A line begun in an earlier chunk; `over` once it passed the cap (then dropped).
    let mut carry: Vec<u8> = Vec::new();
    let mut over = false;
    let mut line_start = from;
    let mut at = from;
    while at < to {
        let n = CHUNK.min(usize::try_from(to - at).unwrap_or(usize::MAX));
        file.read_exact_at(&mut chunk[..n], at).map_err(shrank)?;
        let mut start = 0;
        for end in memchr::memchr_iter(b'\n', &chunk[..n]) {
            let piece = &chunk[start..end];
            if over || carry.len() + piece.len() > cap {
                f(line_start, Line::Skipped)?;
            } else if carry.is_empty() {
                f(line_start, Line::Whole(piece))?;
            } else {
                carry.extend_from_slice(piece);
                f(line_start, Line::Whole(&carry))?;
            }
            carry.clear();
            over = false;
            start = end + 1;
            line_start = at + start as u64;
        }
        let rest = &chunk[start..n];
        if !over {
            if carry.len() + rest.len() > cap {
                over = true;
                carry = Vec::new();
            } else {
                carry.extend_from_slice(rest);
            }
        }
        at += n as u64;
    }
    Ok(())
}

/// What the older part contributes, gathered line by line.
#[derive(Default)]
struct Earlier {
    /// Each with its offset, to be put back in file order.
    first_reply: Option<(u64, Record)>,
    /// The last boundary and the summary after it.
    boundary: Option<(u64, Record)>,
    summary: Option<(u64, Record)>,
    prompts: std::collections::VecDeque<(u64, Record)>,
    prompt_bytes: usize,
    prompts_left_out: usize,
    lines_skipped: usize,
}

impl Earlier {
    fn line(&mut self, offset: u64, line: Line<'_>) -> Result<(), String> {
        let Line::Whole(line) = line else {
            self.lines_skipped += 1;
            return Ok(());
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        // Each field's name and value as the program writes them (no spaces): a quote
        // inside a string is escaped, so these find only the record's own fields.
        let has = |needle: &[u8]| memchr::memmem::find(line, needle).is_some();
        let boundary = has(b"\"compact_boundary\"");
        let summary = has(b"\"isCompactSummary\":true");
        let prompt = has(b"\"type\":\"user\"") && !has(b"\"type\":\"tool_result\"");
        let reply = self.first_reply.is_none() && has(b"\"type\":\"assistant\"") && has(b"\"usage\"");
        if !(boundary || summary || prompt || reply) {
            // Read for its shape only: a damaged line refuses the transcript here too.
            return serde_json::from_slice::<serde::de::IgnoredAny>(line)
                .map(|_| ())
                .map_err(|e| damaged(offset, &e.to_string()));
        }
        let text = std::str::from_utf8(line).map_err(|e| damaged(offset, &format!("not UTF-8: {e}")))?;
        let record = Record::from_line(Arc::from(text)).map_err(|e| damaged(offset, &e.to_string()))?;
        let head = record.head();
        if record.is_compact_boundary() {
            // What came before is in this boundary's summary.
            self.boundary = Some((offset, record));
            self.summary = None;
            self.prompts.clear();
            self.prompt_bytes = 0;
        } else if head.is_compact_summary {
            if self.boundary.is_some() && self.summary.is_none() {
                self.summary = Some((offset, record));
            }
        } else if head.kind == Kind::User && !head.is_meta && !head.is_sidechain {
            let Some(record) = shortened(&record) else { return Ok(()) };
            self.prompt_bytes += record.line().len();
            self.prompts.push_back((offset, record));
            // Past the cap the oldest but the first go: the summary names the first
            // request as such, and the newest lead to the window.
            while self.prompt_bytes > EARLIER_PROMPT_BYTES {
                let Some((_, oldest)) = self.prompts.remove(1) else { break };
                self.prompt_bytes -= oldest.line().len();
                self.prompts_left_out += 1;
            }
        } else if head.kind == Kind::Assistant && !head.is_sidechain && head.usage.is_some() {
            self.first_reply = Some((offset, record));
        }
        Ok(())
    }

    fn into_records(self) -> Vec<Record> {
        let mut records: Vec<(u64, Record)> =
            self.first_reply.into_iter().chain(self.boundary).chain(self.summary).chain(self.prompts).collect();
        records.sort_by_key(|(offset, _)| *offset);
        records.into_iter().map(|(_, r)| r).collect()
    }
}

/// A prompt record as the summary reads it: its chain and session fields and its
/// message, each text cut to [`PROMPT_CHARS`] characters, anything that is not text
/// (an image) left out; the program's other fields (`cwd`, `version`, …) are dropped,
/// so the cap holds three times as many prompts. `None` for a row only the transcript
/// shows.
fn shortened(record: &Record) -> Option<Record> {
    let value = record.to_value();
    if value["isVisibleInTranscriptOnly"] == true {
        return None;
    }
    let cut = |text: &str| match text.char_indices().nth(PROMPT_CHARS) {
        Some((at, _)) => format!("{} …", &text[..at]),
        None => text.to_owned(),
    };
    let content = match &value["message"]["content"] {
        serde_json::Value::String(text) => serde_json::Value::String(cut(text)),
        serde_json::Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .map(|b| serde_json::json!({"type": "text", "text": cut(b["text"].as_str().unwrap_or_default())}))
            .collect(),
        _ => return None,
    };
    let mut object = serde_json::Map::new();
    for key in ["parentUuid", "isSidechain", "type", "uuid", "timestamp", "sessionId"] {
        if let Some(field) = value.get(key) {
            object.insert(key.to_owned(), field.clone());
        }
    }
    object.insert("message".to_owned(), serde_json::json!({"role": "user", "content": content}));
    Record::from_object(&object).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(text: &str, cap: usize) -> Vec<(u64, Option<String>)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, text).unwrap();
        let file = File::open(&path).unwrap();
        let mut out = Vec::new();
        each_line(&file, 0, text.len() as u64, cap, |offset, line| {
            out.push((
                offset,
                match line {
                    Line::Whole(l) => Some(String::from_utf8(l.to_vec()).unwrap()),
                    Line::Skipped => None,
                },
            ));
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn lines_are_given_with_their_offsets_and_long_ones_skipped() {
        let long = "x".repeat(3 * CHUNK + 5);
        let text = format!("a\n{long}\nbc\n\n{}\nd\n", "y".repeat(CHUNK - 1));
        let got = lines_of(&text, 2 * CHUNK);
        let after_long = 2 + long.len() as u64 + 1;
        assert_eq!(
            got,
            vec![
                (0, Some("a".to_owned())),
                (2, None),
                (after_long, Some("bc".to_owned())),
                (after_long + 3, Some(String::new())),
                (after_long + 4, Some("y".repeat(CHUNK - 1))),
                (after_long + 4 + CHUNK as u64, Some("d".to_owned())),
            ]
        );
    }

    #[test]
    fn a_long_transcript_is_read_as_its_window_and_the_prompts_before_it() {
        let reply = r#"{"type":"assistant","uuid":"a0","message":{"role":"assistant","content":[],"usage":{"input_tokens":9}}}"#;
        let mut text = format!("{reply}\n");
        for n in 0..6 {
            text.push_str(&prompt(n, 20));
            text.push('\n');
        }
        let newest = format!("{}\n{}\n", prompt(6, 1), prompt(7, 1));
        text.push_str(&newest);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        std::fs::write(&path, &text).unwrap();
        let file = File::open(&path).unwrap();
        let len = text.len() as u64;
        // A window that starts inside prompt 6's line: the window starts after it.
        let window = newest.len() as u64 - 5;
        let read = read_within(&file, len, Older::Read, window).unwrap();
        assert_eq!(read.window_from, len - prompt(7, 1).len() as u64 - 1);
        let uuids = |records: &[Record]| records.iter().filter_map(|r| r.uuid().map(str::to_owned)).collect::<Vec<_>>();
        assert_eq!(uuids(&read.earlier), ["a0", "u0", "u1", "u2", "u3", "u4", "u5", "u6"]);
        assert_eq!(read.window.len(), 1);
        assert_eq!(read.window[0].0, read.window_from, "offsets are the file's");
        // An undo reads the window only.
        let read = read_within(&file, len, Older::Skip, window).unwrap();
        assert!(read.earlier.is_empty());
        assert_eq!(read.window.len(), 1);
        // A newest line larger than the window is refused.
        let err = read_within(&file, len, Older::Read, 10).unwrap_err();
        assert!(err.contains("newest line is larger"), "{err}");
        // The whole file within the window: nothing is older.
        let read = read_within(&file, len, Older::Read, len).unwrap();
        assert_eq!((read.window_from, read.earlier.len(), read.window.len()), (0, 0, 9));
    }

    fn prompt(n: usize, words: usize) -> String {
        serde_json::json!({"type": "user", "uuid": format!("u{n}"), "sessionId": "s", "cwd": "/p", "version": "2",
            "message": {"role": "user", "content": format!("prompt {n} {}", "word ".repeat(words))}})
        .to_string()
    }

    #[test]
    fn the_older_part_gives_prompts_since_its_last_boundary_shortened() {
        let reply = r#"{"type":"assistant","uuid":"a0","message":{"role":"assistant","content":[],"usage":{"input_tokens":9}}}"#;
        let result = r#"{"type":"user","uuid":"r","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t"}]}}"#;
        let boundary =
            r#"{"type":"system","subtype":"compact_boundary","uuid":"b","compactMetadata":{"trigger":"manual"}}"#;
        let summary =
            r#"{"type":"user","uuid":"s1","isCompactSummary":true,"message":{"role":"user","content":"sum"}}"#;
        let mut earlier = Earlier::default();
        let lines = [reply, &prompt(1, 3), boundary, summary, result, &prompt(2, 3), &prompt(3, 2_000)];
        for (offset, line) in lines.iter().enumerate() {
            earlier.line(offset as u64, Line::Whole(line.as_bytes())).unwrap();
        }
        assert!(earlier.line(0, Line::Whole(b"{not json")).unwrap_err().contains("not a record"));
        let records = earlier.into_records();
        let uuids: Vec<&str> = records.iter().filter_map(Record::uuid).collect();
        assert_eq!(uuids, ["a0", "b", "s1", "u2", "u3"]);
        let long = records[4].to_value()["message"]["content"].as_str().unwrap().to_owned();
        assert!(long.starts_with("prompt 3 word") && long.ends_with(" …") && long.chars().count() == PROMPT_CHARS + 2);
        // Only the fields the summary reads.
        let short = records[3].to_value();
        assert_eq!(
            short,
            serde_json::json!({"type": "user", "uuid": "u2", "sessionId": "s",
            "message": {"role": "user", "content": format!("prompt 2 {}", "word ".repeat(3))}})
        );
    }
}
