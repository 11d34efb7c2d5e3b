//! The file-read ledger: every file the agent read, with what it saw, so ctxd can tell
//! the model when a file changed under it, tell an agent it already has a file, and
//! choose what to restore after compaction.
//!
//! Reads come from two places: Read tool results in appended records (Claude Code puts
//! the file's path, line range and raw content in `toolUseResult.file`), and explicit
//! `ctx/fileRead` calls. An entry keeps a hash of the lines read, not the lines: the
//! record that carried them is in the transcript, and the daemon fetches the old text
//! from there when it needs a diff. That keeps 10,000 entries to a few megabytes.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::record::{Kind, Record};

/// One read, as found in a record or reported by a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRead {
    pub path: String,
    /// First line read, 1-based.
    pub start_line: u64,
    /// Lines read.
    pub num_lines: u64,
    /// Lines in the file at the time, when known.
    pub total_lines: Option<u64>,
    /// The raw text read (no line-number prefixes).
    pub content: String,
    /// The record that carried the read, when it came from one.
    pub source_uuid: Option<String>,
    pub timestamp: Option<String>,
}

impl FileRead {
    /// True when the whole file was read.
    pub fn is_whole_file(&self) -> bool {
        self.start_line <= 1 && self.total_lines.is_none_or(|t| self.num_lines >= t)
    }
}

/// A ledger entry: the latest read of one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LedgerEntry {
    pub path: String,
    pub start_line: u64,
    pub num_lines: u64,
    pub total_lines: Option<u64>,
    /// FNV-1a hash of the text read.
    pub hash: u64,
    pub bytes: u64,
    /// Estimated tokens of the text read (bytes / 4, rounded up).
    pub tokens: u64,
    /// How many times the path was read.
    pub reads: u32,
    /// Order of the latest read across the session (higher is newer).
    pub sequence: u64,
    pub source_uuid: Option<String>,
    pub read_at: Option<String>,
    /// Set when the file changed on disk after this read and the model was not told yet.
    pub stale: bool,
}

/// What recording a read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    /// First read of this path.
    New,
    /// Read again; `unchanged` when the same lines had the same content.
    Reread { unchanged: bool },
}

/// All reads of a session, by path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Boxed: a session can hold many thousands of entries, and the map's table (about
    /// twice the entries' count in slots) then stays a fraction of their size.
    entries: HashMap<String, Box<LedgerEntry>>,
    next_sequence: u64,
}

impl Ledger {
    /// Records a read.
    pub fn record(&mut self, read: &FileRead) -> ReadOutcome {
        let hash = text_hash(&read.content);
        let bytes = read.content.len() as u64;
        self.next_sequence += 1;
        let sequence = self.next_sequence;
        let entry = LedgerEntry {
            path: read.path.clone(),
            start_line: read.start_line,
            num_lines: read.num_lines,
            total_lines: read.total_lines,
            hash,
            bytes,
            tokens: bytes.div_ceil(4),
            reads: 1,
            sequence,
            source_uuid: read.source_uuid.clone(),
            read_at: read.timestamp.clone(),
            stale: false,
        };
        match self.entries.get_mut(&read.path) {
            Some(old) => {
                let unchanged =
                    old.hash == hash && old.start_line == read.start_line && old.num_lines == read.num_lines;
                let reads = old.reads.saturating_add(1);
                **old = LedgerEntry { reads, ..entry };
                ReadOutcome::Reread { unchanged }
            }
            None => {
                self.entries.insert(read.path.clone(), Box::new(entry));
                ReadOutcome::New
            }
        }
    }

    /// Records a read known only by its hash (an explicit `ctx/fileRead`, replayed from
    /// its marker record).
    pub fn record_marker(&mut self, marker: &ReadMarker) -> ReadOutcome {
        self.next_sequence += 1;
        let entry = LedgerEntry {
            path: marker.path.clone(),
            start_line: marker.start_line,
            num_lines: marker.num_lines,
            total_lines: marker.total_lines,
            hash: marker.hash,
            bytes: marker.bytes,
            tokens: marker.bytes.div_ceil(4),
            reads: 1,
            sequence: self.next_sequence,
            source_uuid: None,
            read_at: marker.timestamp.clone(),
            stale: false,
        };
        match self.entries.get_mut(&marker.path) {
            Some(old) => {
                let unchanged =
                    old.hash == entry.hash && old.start_line == entry.start_line && old.num_lines == entry.num_lines;
                let reads = old.reads.saturating_add(1);
                **old = LedgerEntry { reads, ..entry };
                ReadOutcome::Reread { unchanged }
            }
            None => {
                self.entries.insert(marker.path.clone(), Box::new(entry));
                ReadOutcome::New
            }
        }
    }

    /// Puts back an entry loaded from the index.
    pub fn restore(&mut self, entry: LedgerEntry) {
        self.next_sequence = self.next_sequence.max(entry.sequence);
        self.entries.insert(entry.path.clone(), Box::new(entry));
    }

    pub fn get(&self, path: &str) -> Option<&LedgerEntry> {
        self.entries.get(path).map(|e| &**e)
    }

    /// The sequence number of the newest read (0 before any).
    pub fn last_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// Entries read after the read numbered `sequence`, in no order: what is new since
    /// the ledger was last persisted.
    pub fn read_after(&self, sequence: u64) -> impl Iterator<Item = &LedgerEntry> {
        self.entries.values().map(|e| &**e).filter(move |e| e.sequence > sequence)
    }

    /// Marks a path as changed on disk since it was read.
    pub fn mark_stale(&mut self, path: &str) -> bool {
        match self.entries.get_mut(path) {
            Some(e) => {
                e.stale = true;
                true
            }
            None => false,
        }
    }

    /// The model was told about the change (or read the file again).
    pub fn clear_stale(&mut self, path: &str) {
        if let Some(e) = self.entries.get_mut(path) {
            e.stale = false;
        }
    }

    /// Entries, newest read first.
    pub fn newest_first(&self) -> Vec<&LedgerEntry> {
        let mut all: Vec<&LedgerEntry> = self.entries.values().map(|e| &**e).collect();
        all.sort_by_key(|e| std::cmp::Reverse(e.sequence));
        all
    }

    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The read carried by a record, if it is a Read tool result with the file's content.
pub fn file_read_in(record: &Record) -> Option<FileRead> {
    let head = record.head();
    if head.kind != Kind::User || head.is_sidechain {
        return None;
    }
    let line = record.line();
    // Cheap pre-check before parsing: most records carry no file result.
    if !line.contains("\"toolUseResult\"") || !line.contains("\"filePath\"") {
        return None;
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Outer {
        tool_use_result: Option<ToolUseResult>,
        uuid: Option<String>,
        timestamp: Option<String>,
    }
    #[derive(Deserialize)]
    struct ToolUseResult {
        #[serde(rename = "type")]
        kind: Option<String>,
        file: Option<FileField>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct FileField {
        file_path: String,
        content: Option<String>,
        start_line: Option<u64>,
        num_lines: Option<u64>,
        total_lines: Option<u64>,
    }
    let outer: Outer = serde_json::from_str(line).ok()?;
    let result = outer.tool_use_result?;
    if result.kind.as_deref().is_some_and(|k| k != "text") {
        return None;
    }
    let file = result.file?;
    let content = file.content?;
    let num_lines = file.num_lines.unwrap_or_else(|| content.lines().count() as u64);
    Some(FileRead {
        path: file.file_path,
        start_line: file.start_line.unwrap_or(1),
        num_lines,
        total_lines: file.total_lines,
        content,
        source_uuid: outer.uuid,
        timestamp: outer.timestamp,
    })
}

/// Record type ctxd appends for an explicit `ctx/fileRead`, so the ledger can be rebuilt
/// from the transcript. Never sent to a model.
pub const READ_MARKER_TYPE: &str = "ctxd-file-read";

/// An explicit read, as stored in its marker record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadMarker {
    pub path: String,
    pub start_line: u64,
    pub num_lines: u64,
    pub total_lines: Option<u64>,
    /// Hash of the text read, as hex (JSON numbers lose precision past 2^53).
    #[serde(with = "hex_u64")]
    pub hash: u64,
    pub bytes: u64,
    pub timestamp: Option<String>,
}

impl ReadMarker {
    /// Measures a read of `text` (the whole file) or of a line range of it.
    pub fn measure(
        path: &str,
        text: &str,
        start_line: Option<u64>,
        num_lines: Option<u64>,
        timestamp: Option<String>,
    ) -> ReadMarker {
        let total = text.split_inclusive('\n').count() as u64;
        let start = start_line.unwrap_or(1).max(1);
        let num = num_lines.unwrap_or(total.saturating_sub(start - 1));
        let seen = if start == 1 && num >= total { text.to_owned() } else { line_range(text, start, num) };
        ReadMarker {
            path: path.to_owned(),
            start_line: start,
            num_lines: num,
            total_lines: Some(total),
            hash: text_hash(&seen),
            bytes: seen.len() as u64,
            timestamp,
        }
    }

    /// The record that stores this read in the transcript.
    pub fn to_record(&self, uuid: &str) -> serde_json::Map<String, serde_json::Value> {
        let mut object = serde_json::Map::new();
        object.insert("type".into(), READ_MARKER_TYPE.into());
        object.insert("uuid".into(), uuid.into());
        if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(self) {
            object.extend(fields);
        }
        object
    }

    /// The marker a record holds, if it is one.
    pub fn from_record(record: &Record) -> Option<ReadMarker> {
        if record.head().kind != Kind::Other || !record.line().contains(READ_MARKER_TYPE) {
            return None;
        }
        let value: serde_json::Value = serde_json::from_str(record.line()).ok()?;
        if value.get("type")?.as_str()? != READ_MARKER_TYPE {
            return None;
        }
        serde_json::from_value(value).ok()
    }
}

mod hex_u64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{value:016x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let text = String::deserialize(d)?;
        u64::from_str_radix(&text, 16).map_err(serde::de::Error::custom)
    }
}

/// The lines `start_line..start_line + num_lines` (1-based) of `text`.
pub fn line_range(text: &str, start_line: u64, num_lines: u64) -> String {
    let start = start_line.saturating_sub(1) as usize;
    text.split_inclusive('\n').skip(start).take(num_lines as usize).collect()
}

/// Hash of text as read. Trailing line breaks are not part of what a read shows (a
/// range read may or may not keep its last one), so they are left out on both sides.
fn text_hash(text: &str) -> u64 {
    fnv1a(text.trim_end_matches(['\n', '\r']).as_bytes())
}

/// Whether the current text of a file differs from what an entry saw.
pub fn has_changed(entry: &LedgerEntry, current: &str) -> bool {
    let whole = entry.start_line <= 1 && entry.total_lines.is_none_or(|t| entry.num_lines >= t);
    let seen = if whole { current.to_owned() } else { line_range(current, entry.start_line, entry.num_lines) };
    text_hash(&seen) != entry.hash
}

/// The text of a changed-file note for the model: the path, then a unified diff against
/// what was read when the old text is known, else the new content, cut to `budget_tokens`.
pub fn changed_file_note(path: &str, old: Option<&str>, new: &str, budget_tokens: u64) -> String {
    let budget_bytes = (budget_tokens * 4) as usize;
    let mut note = format!("The file {path} changed on disk after you read it. ");
    let body = match old {
        Some(old) => {
            let diff = similar::TextDiff::from_lines(old, new);
            let unified = diff.unified_diff().context_radius(2).header("as read", "now").to_string();
            note.push_str("What changed (unified diff):\n");
            unified
        }
        None => {
            note.push_str("Its current content:\n");
            new.to_owned()
        }
    };
    if body.len() > budget_bytes {
        let cut = body.floor_char_boundary(budget_bytes);
        note.push_str(&body[..cut]);
        note.push_str(&format!("\n[… {} more bytes not shown; read the file for the rest]", body.len() - cut));
    } else {
        note.push_str(&body);
    }
    note
}

/// 64-bit FNV-1a: small, fast, stable across runs and builds (the hash is persisted).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_record(path: &str, content: &str, start: u64, num: u64, total: u64) -> Record {
        let value = serde_json::json!({
            "type": "user", "uuid": "u1", "timestamp": "2026-11-29T10:00:00Z",
            "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "1\tx"}]},
            "toolUseResult": {"type": "text", "file": {"filePath": path, "content": content, "numLines": num, "startLine": start, "totalLines": total}}
        });
        Record::from_object(value.as_object().unwrap()).unwrap()
    }

    #[test]
    fn reads_come_from_read_tool_results() {
        let rec = read_record("/p/a.rs", "fn main() {}\n", 1, 1, 1);
        let read = file_read_in(&rec).unwrap();
        assert_eq!(read.path, "/p/a.rs");
        assert!(read.is_whole_file());
        assert_eq!(read.source_uuid.as_deref(), Some("u1"));
        let edit = serde_json::json!({"type": "user", "toolUseResult": {"type": "update", "filePath": "/p/a.rs"}});
        assert_eq!(file_read_in(&Record::from_object(edit.as_object().unwrap()).unwrap()), None);
        let plain = serde_json::json!({"type": "user", "message": {"role": "user", "content": "read /p/a.rs"}});
        assert_eq!(file_read_in(&Record::from_object(plain.as_object().unwrap()).unwrap()), None);
    }

    #[test]
    fn rereads_say_whether_anything_changed_and_order_is_newest_first() {
        let mut ledger = Ledger::default();
        let a = file_read_in(&read_record("/p/a", "one\n", 1, 1, 1)).unwrap();
        let b = file_read_in(&read_record("/p/b", "two\n", 1, 1, 1)).unwrap();
        assert_eq!(ledger.record(&a), ReadOutcome::New);
        assert_eq!(ledger.record(&b), ReadOutcome::New);
        assert_eq!(ledger.record(&a), ReadOutcome::Reread { unchanged: true });
        let a2 = FileRead { content: "one!\n".into(), ..a.clone() };
        assert_eq!(ledger.record(&a2), ReadOutcome::Reread { unchanged: false });
        let order: Vec<_> = ledger.newest_first().iter().map(|e| e.path.clone()).collect();
        assert_eq!(order, ["/p/a", "/p/b"]);
        assert_eq!(ledger.get("/p/a").unwrap().reads, 3);
    }

    #[test]
    fn change_detection_follows_the_range_read() {
        let mut ledger = Ledger::default();
        let file = "l1\nl2\nl3\nl4\n";
        let read = file_read_in(&read_record("/p/f", "l2\nl3\n", 2, 2, 4)).unwrap();
        ledger.record(&read);
        let entry = ledger.get("/p/f").unwrap();
        assert!(!has_changed(entry, file));
        assert!(
            !has_changed(entry, "l1 edited\nl2\nl3\nl4\n"),
            "a change outside the range is not a change of what was read"
        );
        assert!(has_changed(entry, "l1\nl2 edited\nl3\nl4\n"));
        let whole = file_read_in(&read_record("/p/g", file, 1, 4, 4)).unwrap();
        ledger.record(&whole);
        assert!(has_changed(ledger.get("/p/g").unwrap(), "l1\n"));
    }

    #[test]
    fn changed_file_note_has_a_diff_or_the_content_within_budget() {
        let note = changed_file_note("/p/f", Some("a\nb\nc\n"), "a\nB\nc\n", 1_000);
        assert!(note.contains("/p/f"));
        assert!(note.contains("-b\n+B"), "{note}");
        let note = changed_file_note("/p/f", None, &"x".repeat(10_000), 100);
        assert!(note.contains("more bytes not shown"));
        assert!(note.len() < 600, "{}", note.len());
    }

    #[test]
    fn explicit_reads_round_trip_through_their_marker_record() {
        let marker = ReadMarker::measure("/p/f", "a\nb\nc\n", Some(2), Some(1), Some("t".into()));
        assert_eq!((marker.start_line, marker.num_lines, marker.total_lines), (2, 1, Some(3)));
        let record = Record::from_object(&marker.to_record("m1")).unwrap();
        assert_eq!(ReadMarker::from_record(&record), Some(marker.clone()));
        let mut ledger = Ledger::default();
        assert_eq!(ledger.record_marker(&marker), ReadOutcome::New);
        let entry = ledger.get("/p/f").unwrap();
        assert!(!has_changed(entry, "a\nb\nc\n"));
        assert!(has_changed(entry, "a\nB\nc\n"));
        assert_eq!(ledger.record_marker(&marker), ReadOutcome::Reread { unchanged: true });
    }

    #[test]
    fn ten_thousand_entries_stay_small() {
        let mut ledger = Ledger::default();
        for i in 0..10_000 {
            ledger.record(&FileRead {
                path: format!("/home/dev/project/src/module_{i}/file_{i}.rs"),
                start_line: 1,
                num_lines: 100,
                total_lines: Some(100),
                content: "x".repeat(2_000),
                source_uuid: Some(format!("{i:036}")),
                timestamp: Some("2026-11-29T10:00:00.000Z".into()),
            });
        }
        // Per entry: the struct plus its three strings (path, uuid, timestamp).
        let per_entry = std::mem::size_of::<LedgerEntry>() + 45 + 36 + 24 + 64;
        assert!(per_entry * ledger.len() < 10 * 1024 * 1024, "{} bytes", per_entry * ledger.len());
        assert_eq!(ledger.len(), 10_000);
    }
}
