//! Transcript import and export (`ctxd::interop`), and loading what was imported
//! (`ctxd::store::transcript`).
//!
//! Input: the bytes of a transcript file. One store is opened per process in a temporary
//! directory (`scripts/fuzz` points `TMPDIR` at a RAM disk when there is one, so the
//! syncs cost nothing); each input is imported as a new session, then removed.
//!
//! Properties:
//! - every non-blank line is either imported or reported as skipped, with its number;
//! - a line is imported exactly when it is UTF-8, a record and strict JSON once its
//!   unpaired surrogate escapes are replaced, and is not one of ctxd's own records;
//! - it is stored in order, unchanged (line breaks, trailing carriage returns and
//!   replaced surrogates aside) unless it held ctxd's own fields, which are gone while
//!   every other value is the same;
//! - the stored transcript loads back as the same records, with nothing damaged or torn;
//! - export gives back every imported line.

#![no_main]

use std::borrow::Cow;
use std::cell::RefCell;
use std::path::PathBuf;

use ctxd::interop::{self, OWN_TYPE_PREFIX};
use ctxd::store::Store;
use ctxd::store::transcript::Transcript;
use ctxd_core::admit;
use ctxd_core::record::Record;
use libfuzzer_sys::fuzz_target;

struct Env {
    _dir: tempfile::TempDir,
    store: Store,
    source: PathBuf,
    next: u64,
}

thread_local! {
    static ENV: RefCell<Option<Env>> = const { RefCell::new(None) };
}

fn env() -> Env {
    let dir = match tempfile::Builder::new().prefix("ctxd-fuzz-import").tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("no temporary directory: {e}"),
    };
    let store = match Store::open(&dir.path().join("state")) {
        Ok(store) => store,
        Err(e) => panic!("cannot open a store: {e}"),
    };
    let source = dir.path().join("source.jsonl");
    Env { _dir: dir, store, source, next: 0 }
}

#[derive(serde::Deserialize)]
struct TypeOnly<'a> {
    #[serde(borrow, default, rename = "type")]
    ty: Option<Cow<'a, str>>,
}

/// What import must do with each line: `Some(text)` to store, `None` to skip.
fn expected(data: &[u8]) -> (Vec<String>, Vec<u64>) {
    let mut kept = Vec::new();
    let mut skipped = Vec::new();
    let lines: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
    let count = if data.ends_with(b"\n") { lines.len() - 1 } else { lines.len() };
    for (i, line) in lines.iter().take(count).enumerate() {
        let mut line = *line;
        while let Some(rest) = line.strip_suffix(b"\r") {
            line = rest;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let repaired = std::str::from_utf8(line)
            .ok()
            .filter(|text| Record::parse(text).is_ok())
            .map(|text| admit::replace_unpaired_surrogates(text).unwrap_or_else(|| text.to_owned()))
            .filter(|text| Record::parse(text).is_ok() && admit::strict_json(text).is_ok() && !is_own(text));
        match repaired {
            Some(text) => kept.push(text),
            None => skipped.push(i as u64 + 1),
        }
    }
    (kept, skipped)
}

fn is_own(line: &str) -> bool {
    let own_type = serde_json::from_str::<TypeOnly<'_>>(line)
        .ok()
        .and_then(|t| t.ty)
        .is_some_and(|ty| ty.starts_with(OWN_TYPE_PREFIX));
    let record = Record::parse(line).ok();
    let own_subtype =
        record.and_then(|r| r.head().subtype.clone()).is_some_and(|s| s.starts_with(admit::OWN_SUBTYPE_PREFIX));
    own_type
        || (own_subtype
            && serde_json::from_str::<TypeOnly<'_>>(line).ok().and_then(|t| t.ty).as_deref() == Some("system"))
}

/// `line` as a value without ctxd's own fields (top level and `compactMetadata`).
fn without_own_fields(line: &str) -> serde_json::Value {
    let mut value: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("kept line is JSON: {e}"));
    if let Some(object) = value.as_object_mut() {
        object.retain(|k, _| !k.starts_with(admit::OWN_FIELD_PREFIX));
        if let Some(meta) = object.get_mut("compactMetadata").and_then(|m| m.as_object_mut()) {
            meta.retain(|k, _| !k.starts_with(admit::OWN_FIELD_PREFIX));
        }
    }
    value
}

fn run(env: &mut Env, data: &[u8]) {
    if let Err(e) = std::fs::write(&env.source, data) {
        panic!("cannot write the source: {e}");
    }
    env.next += 1;
    let id = format!("s{}", env.next);
    let imported = match interop::import(&env.store, &id, &env.source) {
        Ok(imported) => imported,
        Err(e) => panic!("import failed: {e}"),
    };
    let (kept, skipped) = expected(data);
    assert_eq!(imported.records, kept.len() as u64);
    let numbers: Vec<u64> = imported
        .skipped
        .iter()
        .map(|s| s.strip_prefix("line ").and_then(|s| s.split(':').next()).and_then(|n| n.parse().ok()).unwrap_or(0))
        .collect();
    assert_eq!(numbers, skipped, "{:?}", imported.skipped);

    let path = match env.store.transcript_path(&id) {
        Ok(path) => path,
        Err(e) => panic!("{e}"),
    };
    let (transcript, loaded) = match Transcript::open(&path, false, 0) {
        Ok(opened) => opened,
        Err(e) => panic!("the imported transcript does not open: {e}"),
    };
    assert!(loaded.damaged.is_empty(), "{:?}", loaded.damaged);
    assert_eq!(loaded.torn_bytes, 0);
    let lines: Vec<&str> = loaded.records.iter().map(|(_, r)| r.line()).collect();
    assert_eq!(lines.len(), kept.len());
    for (stored, want) in lines.iter().zip(&kept) {
        if stored != want {
            assert_eq!(without_own_fields(stored), without_own_fields(want), "{stored} / {want}");
            assert!(want.contains(admit::OWN_FIELD_PREFIX), "changed without an own field: {want}");
        }
    }
    let mut offset = 0;
    for (at, record) in &loaded.records {
        assert_eq!(*at, offset);
        assert_eq!(record, &Record::parse(record.line()).unwrap_or_else(|e| panic!("{e}")));
        offset += record.line().len() as u64 + 1;
    }
    assert_eq!(transcript.len(), offset);
    drop(transcript);

    let mut out = Vec::new();
    let written = match interop::export(env.store.root(), &id, &mut out) {
        Ok(n) => n,
        Err(e) => panic!("export failed: {e}"),
    };
    let want: String = lines.iter().map(|l| format!("{l}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&out), want);
    assert_eq!(written, lines.len() as u64);

    if let Err(e) = std::fs::remove_file(&path) {
        panic!("cannot remove {}: {e}", path.display());
    }
}

fuzz_target!(|data: &[u8]| {
    ENV.with(|cell| {
        let mut slot = cell.borrow_mut();
        let env = slot.get_or_insert_with(env);
        run(env, data);
    });
});
