//! Claude Code interoperability: import a transcript into the store, export a session
//! as a transcript Claude Code can resume.
//!
//! ctxd's transcript lines are Claude Code's, so import copies every readable line
//! verbatim (malformed lines are reported by line number and skipped) and export copies
//! them back, leaving out only ctxd's own bookkeeping records (`ctxd-*` types). Import
//! then export thus gives back the original records, line for line. What a source file
//! cannot carry into a store is decided by `ctxd_core::admit`: ctxd's own records and
//! fields stay out (only ctxd decides what is its own), and an unpaired surrogate escape
//! becomes U+FFFD.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use ctxd_core::admit;
use ctxd_core::record::Record;

use crate::store::{Store, StoreError};

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Imported {
    pub records: u64,
    /// Lines left out: "line N: why" (malformed, or one of ctxd's own records).
    pub skipped: Vec<String>,
    /// Lines kept with a repair: ctxd's own fields removed, or an unpaired surrogate
    /// escape replaced by U+FFFD.
    pub repaired: u64,
}

/// Prefix of the record types ctxd writes for itself.
pub const OWN_TYPE_PREFIX: &str = admit::OWN_TYPE_PREFIX;

/// Copies the readable lines of `source` into a new session `id` in `store`. Fails if the
/// session exists (import never overwrites).
///
/// One pass, line by line: each line is checked and written on to a temporary file, which
/// is synced once and renamed to the session's name. Memory stays at a few buffers
/// whatever the transcript's size, and the disk writes back while later lines are read.
pub fn import(store: &Store, id: &str, source: &Path) -> Result<Imported, StoreError> {
    let target = store.transcript_path(id)?;
    if target.exists() {
        return Err(StoreError::io(
            &target,
            std::io::Error::new(std::io::ErrorKind::AlreadyExists, "a session with this id exists"),
        ));
    }
    let (file, _) = crate::outside::open_regular(source).map_err(|e| StoreError::io(source, e.into()))?;
    // Write to a temporary name and rename, so a crash never leaves half an import
    // under the session's name.
    let partial = target.with_extension("jsonl.importing");
    let _ = std::fs::remove_file(&partial);
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .map_err(|e| StoreError::io(&partial, e))?;
    let copied = copy_readable(
        BufReader::with_capacity(1 << 20, file),
        BufWriter::with_capacity(1 << 20, out),
        source,
        &partial,
    )
    .and_then(|imported| std::fs::rename(&partial, &target).map(|()| imported).map_err(|e| StoreError::io(&target, e)));
    let imported = match copied {
        Ok(imported) => imported,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    for line in &imported.skipped {
        tracing::warn!(source = %source.display(), %line, "line left out on import");
    }
    Ok(imported)
}

/// Copies every readable line of `reader` to `out` (one per line, without `\r`), then
/// flushes and syncs `out`.
fn copy_readable(
    mut reader: impl BufRead,
    mut out: BufWriter<std::fs::File>,
    source: &Path,
    partial: &Path,
) -> Result<Imported, StoreError> {
    let written = |e| StoreError::io(partial, e);
    let mut imported = Imported::default();
    let mut buf = Vec::new();
    let mut number = 0u64;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(|e| StoreError::io(source, e))?;
        if n == 0 {
            break;
        }
        number += 1;
        while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            buf.pop();
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let checked = std::str::from_utf8(&buf).map_err(|e| format!("not UTF-8: {e}")).and_then(|text| {
            Record::parse(text).map_err(|e| e.to_string())?;
            admit::from_import(text)
        });
        match checked {
            Ok(admit::Imported::Keep { line, repaired }) => {
                out.write_all(line.as_bytes()).and_then(|()| out.write_all(b"\n")).map_err(written)?;
                imported.records += 1;
                imported.repaired += u64::from(repaired);
            }
            Ok(admit::Imported::Own(kind)) => {
                imported.skipped.push(format!("line {number}: {kind} is ctxd's own bookkeeping, not imported"))
            }
            Err(why) => imported.skipped.push(format!("line {number}: {why}")),
        }
    }
    let file = out.into_inner().map_err(|e| written(e.into_error()))?;
    file.sync_data().map_err(written)?;
    Ok(imported)
}

/// Writes session `id`'s records to `out` as a Claude Code transcript.
pub fn export(store_root: &Path, id: &str, out: &mut dyn Write) -> Result<u64, StoreError> {
    crate::store::validate_session_id(id)?;
    let path = store_root.join("sessions").join(format!("{id}.jsonl"));
    let file = std::fs::File::open(&path).map_err(|e| StoreError::io(&path, e))?;
    let reader = BufReader::with_capacity(1 << 20, file);
    let mut written = 0u64;
    for line in reader.split(b'\n') {
        let line = line.map_err(|e| StoreError::io(&path, e))?;
        if line.is_empty() || is_own_record(&line) {
            continue;
        }
        out.write_all(&line)
            .and_then(|()| out.write_all(b"\n"))
            .map_err(|e| StoreError::io(Path::new("<output>"), e))?;
        written += 1;
    }
    out.flush().map_err(|e| StoreError::io(Path::new("<output>"), e))?;
    Ok(written)
}

fn is_own_record(line: &[u8]) -> bool {
    // Only the type is read, skipping the rest as the record parser does: a stored line
    // can hold JSON that a full value tree refuses (nesting past 128, unpaired surrogate
    // escapes, numbers past f64), and such a line is still ctxd's own if its type says so.
    #[derive(serde::Deserialize)]
    struct Type<'a> {
        #[serde(borrow, default, rename = "type")]
        ty: Option<std::borrow::Cow<'a, str>>,
    }
    if memchr::memmem::find(line, OWN_TYPE_PREFIX.as_bytes()).is_none() {
        return false;
    }
    std::str::from_utf8(line)
        .ok()
        .and_then(|t| serde_json::from_str::<Type<'_>>(t).ok())
        .and_then(|t| t.ty)
        .is_some_and(|t| t.starts_with(OWN_TYPE_PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_skips_malformed_lines_and_export_gives_the_rest_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state")).unwrap();
        let source = dir.path().join("in.jsonl");
        let good1 = r#"{"type":"user","uuid":"a","message":{"role":"user","content":"hi"}}"#;
        let good2 = r#"{"type":"progress","data":{"x":1},"future":[1,2]}"#;
        std::fs::write(&source, format!("{good1}\nnot json\n\n[1]\n{good2}\n{{\"type\":\"user\",\"trunc")).unwrap();
        let imported = import(&store, "imp", &source).unwrap();
        assert_eq!(imported.records, 2);
        assert_eq!(imported.skipped.len(), 3, "{:?}", imported.skipped);
        assert!(imported.skipped[0].starts_with("line 2:"), "{:?}", imported.skipped);
        assert!(imported.skipped[2].starts_with("line 6:"), "{:?}", imported.skipped);
        // ctxd's own records are left out of an export.
        let path = store.transcript_path("imp").unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        writeln!(f, r#"{{"type":"ctxd-file-read","path":"/x"}}"#).unwrap();
        let mut out = Vec::new();
        assert_eq!(export(store.root(), "imp", &mut out).unwrap(), 2);
        assert_eq!(String::from_utf8(out).unwrap(), format!("{good1}\n{good2}\n"));
        // Never overwrites.
        assert!(import(&store, "imp", &source).is_err());
    }

    #[test]
    fn a_failed_import_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state")).unwrap();
        // A directory opens but fails on the first read: after the temporary file exists.
        let source = dir.path().join("not-a-file");
        std::fs::create_dir(&source).unwrap();
        assert!(import(&store, "bad", &source).is_err());
        assert_eq!(store.session_ids().unwrap(), Vec::<String>::new());
        let left: Vec<_> =
            std::fs::read_dir(store.transcript_path("bad").unwrap().parent().unwrap()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_large_import_keeps_every_line_without_carriage_returns() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state")).unwrap();
        let source = dir.path().join("big.jsonl");
        let mut text = String::new();
        for i in 0..20_000 {
            text.push_str(&format!(
                "{{\"type\":\"user\",\"uuid\":\"u{i}\",\"message\":{{\"role\":\"user\",\"content\":\"{}\"}}}}\r\n",
                "x".repeat(i % 300)
            ));
        }
        std::fs::write(&source, &text).unwrap();
        let imported = import(&store, "big", &source).unwrap();
        assert_eq!(imported.records, 20_000);
        let stored = std::fs::read_to_string(store.transcript_path("big").unwrap()).unwrap();
        assert_eq!(stored, text.replace("\r\n", "\n"));
    }

    // Found by the `import` fuzz target: export read the type through a full JSON value,
    // which refuses an unpaired surrogate escape or a number past f64 that the record
    // parser accepts, so these own records were exported.
    #[test]
    fn own_records_are_left_out_even_when_a_value_tree_would_refuse_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state")).unwrap();
        let source = dir.path().join("in.jsonl");
        let user = r#"{"type":"user","uuid":"a","message":{"role":"user","content":"hi"}}"#;
        let own = [r#"{"type":"ctxd-file-read","path":"/w/\udc00.rs"}"#, r#"{"type":"ctxd-x","n":-1e999}"#];
        std::fs::write(&source, format!("{user}\n")).unwrap();
        assert_eq!(import(&store, "own", &source).unwrap().records, 1);
        // Written by the store itself (an import leaves such records out).
        let path = store.transcript_path("own").unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        writeln!(f, "{}\n{}", own[0], own[1]).unwrap();
        let mut out = Vec::new();
        assert_eq!(export(store.root(), "own", &mut out).unwrap(), 1);
        assert_eq!(String::from_utf8(out).unwrap(), format!("{user}\n"));
    }

    #[test]
    fn an_import_leaves_ctxds_own_records_and_fields_out_and_repairs_surrogates() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state")).unwrap();
        let source = dir.path().join("in.jsonl");
        let lines = [
            r#"{"type":"user","uuid":"u1","message":{"role":"user","content":"one"}}"#,
            r#"{"type":"system","subtype":"compact_boundary","uuid":"b1","compactMetadata":{"ctxdBatch":50,"trigger":"manual"}}"#,
            r#"{"type":"ctxd-snip","uuid":"s","removedUuids":["u2"]}"#,
            r#"{"type":"system","subtype":"ctxd_undo_compact","uuid":"x","boundaryUuid":"b1"}"#,
            r#"{"type":"user","uuid":"u2","message":{"role":"user","content":"two \ud800"}}"#,
        ];
        std::fs::write(&source, lines.join("\n")).unwrap();
        let imported = import(&store, "imp", &source).unwrap();
        assert_eq!(imported.records, 3);
        assert_eq!(imported.repaired, 2);
        assert_eq!(imported.skipped.len(), 2, "{:?}", imported.skipped);
        assert!(imported.skipped[0].starts_with("line 3: ctxd-snip is ctxd's own"), "{:?}", imported.skipped);
        let stored = std::fs::read_to_string(store.transcript_path("imp").unwrap()).unwrap();
        let stored: Vec<&str> = stored.lines().collect();
        assert_eq!(stored[0], lines[0]);
        assert_eq!(
            stored[1],
            r#"{"type":"system","subtype":"compact_boundary","uuid":"b1","compactMetadata":{"trigger":"manual"}}"#
        );
        assert_eq!(stored[2], r#"{"type":"user","uuid":"u2","message":{"role":"user","content":"two \ufffd"}}"#);
    }
}
