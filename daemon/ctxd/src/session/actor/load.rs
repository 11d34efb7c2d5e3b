//! Loading a session: the transcript from the boundary in force on (a torn install cut,
//! the messages a boundary keeps read back), the ledger of file reads, the base context; and
//! folding records into the in-memory [`View`].

use std::collections::HashSet;
use std::sync::Arc;

use ctxd_core::breakdown::Composition;
use ctxd_core::compact::{CompactGuards, boundary_rate, compaction_view, is_undo_record, torn_install};
use ctxd_core::invoked::Invoked;
use ctxd_core::record::Record;
use ctxd_core::tally::Tally;

use super::Session;
use crate::session::SessionError;
use crate::store::transcript::Transcript;
use crate::store::{SessionEntry, Store};

/// The records the model sees, and what the session counts of them.
#[derive(Default)]
pub(super) struct View {
    /// Records from the boundary in force (the latest one not undone) on, without the
    /// compactions undone after it (everything else is only on disk).
    pub(super) records: Vec<Record>,
    /// Uuids in `records`, to drop records a host re-sends after a lost acknowledgement.
    pub(super) uuids: HashSet<Arc<str>>,
    /// Records in the transcript, before the boundary included.
    pub(super) total_records: u64,
    pub(super) records_before: u64,
    /// Where the boundary the view starts at begins in the file (none: at its start).
    pub(super) offset: Option<u64>,
    pub(super) tally: Tally,
    /// Bytes of the view's messages by kind, for the breakdown.
    pub(super) composition: Composition,
    /// Skills and plan file of the view, restored after a compaction.
    pub(super) invoked: Invoked,
    /// Bumped at every boundary and every rebuild, so a compaction prepared on an older
    /// view is not installed.
    pub(super) generation: u64,
}

impl View {
    /// Empties the view for records that start it afresh (a boundary, a rebuild).
    fn restart(&mut self) {
        self.records.clear();
        self.uuids.clear();
        self.composition = Composition::default();
        self.invoked = Invoked::default();
    }

    /// Adds `record` at the end, counted as the next request carries it.
    fn push(&mut self, record: Record) {
        let bytes = carried_bytes(&record);
        self.tally.observe_sized(&record, bytes);
        self.composition.observe_sized(&record, bytes);
        self.invoked.observe(&record);
        if let Some(uuid) = record.uuid() {
            self.uuids.insert(Arc::from(uuid));
        }
        self.records.push(record);
    }
}

impl Session {
    /// Loads the transcript from the latest compact boundary on. The index says where
    /// that boundary is; it is checked against the file, and rebuilt by a scan when it is
    /// missing or wrong.
    pub(super) async fn load(&mut self, create: bool) -> Result<(), SessionError> {
        if let Some(source) = self.setup.import.take() {
            let (store, id) = (self.store.clone(), self.id.clone());
            let imported = tokio::task::spawn_blocking(move || crate::interop::import(&store, &id, &source))
                .await
                .map_err(|e| SessionError::Internal(format!("import task failed: {e}")))??;
            tracing::info!(records = imported.records, skipped = imported.skipped.len(), "imported a transcript");
            const SHOWN: usize = 50;
            let more = imported.skipped.len().saturating_sub(SHOWN);
            self.diagnostics.extend(imported.skipped.into_iter().take(SHOWN).map(|l| format!("import: skipped {l}")));
            if more > 0 {
                self.diagnostics.push(format!("import: {more} more lines skipped (see the log)"));
            }
            if imported.repaired > 0 {
                self.diagnostics.push(format!(
                    "import: {} lines repaired (ctxd's own fields removed, unpaired surrogates replaced)",
                    imported.repaired
                ));
            }
        }
        let path = self.store.transcript_path(&self.id)?;
        let exists = path.exists();
        if !exists && !create {
            return Err(SessionError::UnknownSession(self.id.clone()));
        }
        let store = self.store.clone();
        let id = self.id.clone();
        let transcript = self.transcript.take();
        drop(transcript); // reopened below; the OS keeps appends ordered
        let loaded = tokio::task::spawn_blocking(move || load_from_disk(&store, &id, &path))
            .await
            .map_err(|e| SessionError::Internal(format!("loading task failed: {e}")))??;
        let LoadResult {
            transcript,
            records,
            records_before,
            view_offset,
            damaged,
            torn_bytes,
            rebuilt_index,
            earlier,
        } = loaded;
        if torn_bytes > 0 {
            self.diagnostics.push(format!("cut {torn_bytes} bytes of a torn last line (never acknowledged)"));
        }
        if rebuilt_index {
            tracing::info!("index entry rebuilt from the transcript");
        }
        self.diagnostics.extend(damaged);
        self.diagnostics.extend(self.setup.problems.iter().cloned());
        self.resumed = exists;
        self.transcript = Some(transcript);
        // The ledger: what the index kept of reads before the boundary (or, when the
        // index is new, what a scan of that part found), then the reads in the view.
        self.context.reads.restore(self.store.index().ledger_entries(&self.id));
        for record in &earlier {
            self.note_read(record, true);
        }
        if !earlier.is_empty() {
            // Found by a scan: kept, so the next resume need not scan again.
            let _ = self.save_ledger().await;
        }
        self.fold_loaded(records, records_before, view_offset, true);
        // A stop (thrashing, circuit breaker) outlives the daemon: the view holds the
        // guard state as it was last written, and the turns since.
        let guards = CompactGuards::restore(&self.view.records);
        if let Some(stopped) = &guards.stopped {
            tracing::info!(reason = %stopped.message(), "automatic compaction stays stopped for this session");
        }
        self.compaction.restore_guards(guards);
        let entry = self.index_entry();
        if self.store.index().get(&self.id).as_ref() != Some(&entry) {
            // New or rebuilt: flushed now, so a client can resume the session by id
            // after a crash without reopening it (the index remembers cwd and model).
            self.store.index().put(&self.id, &entry);
            self.store.index().flush();
        }
        self.load_base().await;
        tracing::info!(
            records = self.view.total_records,
            in_view = self.view.records.len(),
            resumed = self.resumed,
            "session loaded"
        );
        Ok(())
    }

    pub(super) fn index_entry(&self) -> SessionEntry {
        SessionEntry {
            boundary_offset: self.view.offset,
            records_before_boundary: self.view.records_before,
            cwd: self.setup.cwd.clone(),
            model: self.setup.model.clone(),
            agent_window: self.setup.agent_window,
        }
    }

    pub(super) fn flush_index(&self) {
        self.store.index().put(&self.id, &self.index_entry());
    }

    /// Folds one record just appended into the in-memory state, `offset` its byte offset.
    pub(super) fn apply(&mut self, record: Record, offset: Option<u64>) {
        self.note_read(&record, offset.is_some());
        self.fold(record, offset);
    }

    /// Builds the view from records read from disk, from the boundary the view starts at
    /// (or earlier) to the end: as [`compaction_view`] says, the view starts at the latest
    /// boundary not undone and leaves out each undone compaction, boundary through undo
    /// record; what it leaves out is only counted. `note_reads` replays their file reads
    /// into the ledger (on load; an undo keeps the ledger it has). A boundary newer than
    /// the indexed one (a crash lost the index's note of it) moves `view_offset`, so the
    /// entry written next pairs its offset with its count.
    pub(super) fn fold_loaded(
        &mut self,
        records: Vec<(u64, Record)>,
        records_before: u64,
        view_offset: Option<u64>,
        note_reads: bool,
    ) {
        self.view.restart();
        self.view.tally = Tally::default();
        self.requests.view_replaced();
        // A compaction prepared on the view this replaces is not installed.
        self.view.generation += 1;
        self.view.offset = view_offset;
        // Records before the boundary the view starts at are the messages it keeps
        // (read back by `with_preserved`): already counted, their reads already noted.
        let earlier = view_offset.map_or(0, |v| records.iter().take_while(|(o, _)| *o < v).count());
        self.view.records_before = records_before.saturating_sub(earlier as u64);
        self.view.total_records = self.view.records_before;
        let (offsets, records): (Vec<u64>, Vec<Record>) = records.into_iter().unzip();
        let spans = compaction_view(&records);
        for (i, (offset, record)) in offsets.into_iter().zip(records).enumerate() {
            if note_reads && i >= earlier {
                self.note_read(&record, false);
            }
            if spans.skipped.iter().any(|undone| undone.contains(&i)) {
                self.view.total_records += 1;
            } else {
                self.fold(record, Some(offset));
            }
        }
    }

    /// Adds one record to the view (a boundary starts it afresh). `offset`, when known,
    /// is where a boundary starts, for the index.
    pub(super) fn fold(&mut self, record: Record, offset: Option<u64>) {
        if record.is_compact_boundary() {
            if offset.is_some() && self.context.reads.unsaved() {
                // The reads before a new boundary are no longer replayed on resume: the
                // index must have them (before the session entry points past them).
                let entries = self.context.reads.take_unsaved();
                self.store.index().put_ledger_batch(&self.id, &entries);
            }
            // The model sees nothing before the latest boundary but the messages the
            // boundary keeps (Claude Code's `preservedSegment`): they stay in the view,
            // before the boundary, where the slice relinks them after its anchor.
            let found = ctxd_core::preserved::preserved(&record, &self.view.records);
            let kept: Vec<Record> = found.kept.iter().map(|&i| self.view.records[i].clone()).collect();
            if let Some(note) = found.note {
                tracing::warn!(boundary = ?record.uuid(), "a compact boundary {note}; its kept messages are left out");
            }
            self.view.records_before = self.view.total_records;
            self.view.restart();
            self.view.tally.restart();
            for kept in kept {
                if let Some(uuid) = kept.uuid() {
                    self.view.uuids.insert(Arc::from(uuid));
                }
                // Counted as part of the new context; their usage measured the old one.
                let counted = ctxd_core::preserved::without_usage(&kept);
                let bytes = carried_bytes(&counted);
                self.view.tally.observe_sized(&counted, bytes);
                self.view.composition.observe_sized(&counted, bytes);
                self.view.records.push(kept);
            }
            // The request handed out last shows the old view: no later one shares with it
            // more than a message, and it would keep the old view's messages alive.
            self.requests.boundary_folded();
            if let Some(rate) = boundary_rate(&record) {
                self.view.tally.calibration.tokens_per_kib = rate;
            }
            // Until the next report, the usage is the request assembled over the install.
            if let Some((tokens, batch)) = ctxd_core::compact::boundary_request_tokens(&record) {
                self.view.tally.anchor_install(tokens, batch);
            }
            self.view.generation += 1;
            if offset.is_some() {
                self.view.offset = offset;
            }
        }
        self.view.total_records += 1;
        self.count_reduction(&record);
        self.view.push(record);
    }

    /// Rebuilds the view after an undo record was stored. The boundary now in force lies
    /// before the one the view started at, so the records come from disk, read as a
    /// resume reads them (one scan for the compaction records, one read from that
    /// boundary on), and the index learns where the view starts now.
    pub(super) async fn restore_view(&mut self) -> Result<(), SessionError> {
        let path = self.store.transcript_path(&self.id)?;
        let read = tokio::task::spawn_blocking(move || read_view(&path))
            .await
            .map_err(|e| SessionError::Internal(format!("reading task failed: {e}")))??;
        let offset = read.view_offset;
        self.fold_loaded(read.records, read.records_before, offset, false);
        self.flush_index();
        tracing::info!(records = self.view.records.len(), boundary_offset = ?offset, "view restored after an undo");
        Ok(())
    }
}

struct LoadResult {
    transcript: Transcript,
    /// Records of the view with their byte offsets.
    records: Vec<(u64, Record)>,
    records_before: u64,
    view_offset: Option<u64>,
    damaged: Vec<String>,
    torn_bytes: u64,
    rebuilt_index: bool,
    /// Records before the boundary that carry file reads (only when the index had to be
    /// rebuilt, so its ledger entries are missing).
    earlier: Vec<Record>,
}

/// Puts the messages the first record (the boundary the view starts at) keeps from
/// before it in front of `records`, read back from the file; nothing when it keeps none
/// or they cannot be found (logged: the view then lacks them, as it did before).
fn with_preserved(path: &std::path::Path, records: &mut Vec<(u64, Record)>) -> Result<(), SessionError> {
    let Some((offset, boundary)) = records.first().filter(|(_, r)| r.is_compact_boundary()) else {
        return Ok(());
    };
    let Some(head) = ctxd_core::preserved::segment_head(boundary) else {
        return Ok(());
    };
    match crate::store::transcript::records_back_to(path, *offset, &head)? {
        Some(mut earlier) => {
            earlier.append(records);
            *records = earlier;
        }
        None => {
            tracing::warn!(head, offset, "the messages a compact boundary keeps are not within the look-back before it")
        }
    }
    Ok(())
}

/// Opens the transcript and reads it from the latest compact boundary. Runs on a
/// blocking thread.
fn load_from_disk(store: &Store, id: &str, path: &std::path::Path) -> Result<LoadResult, SessionError> {
    let mut loaded = load_with_torn_install(store, id, path)?;
    with_preserved(path, &mut loaded.records)?;
    Ok(loaded)
}

fn load_with_torn_install(store: &Store, id: &str, path: &std::path::Path) -> Result<LoadResult, SessionError> {
    let mut loaded = load_latest(store, id, path)?;
    if let Some(offset) = torn_install(&loaded.records) {
        tracing::warn!(offset, "a compaction was cut off while being installed; resuming the view from before it");
        // The install was never acknowledged: cut it (saved aside), as a torn line is.
        loaded.transcript.cut_unacknowledged(offset, "torn-compaction")?;
        // The file ends where the install began now.
        let (previous, before) = boundary_in_force(path)?;
        let (transcript, from) = Transcript::open(path, false, previous.unwrap_or(0))?;
        loaded.transcript = transcript;
        loaded.records = from.records;
        loaded.records_before = before;
        loaded.view_offset = previous;
        loaded.damaged.push(format!("byte {offset}: an interrupted compaction was not installed"));
    }
    Ok(loaded)
}

fn load_latest(store: &Store, id: &str, path: &std::path::Path) -> Result<LoadResult, SessionError> {
    let entry = store.index().get(id);
    // First try the indexed boundary; confirm the line there really is a boundary.
    if let Some(SessionEntry { boundary_offset: Some(offset), records_before_boundary, .. }) = entry {
        let (transcript, loaded) = Transcript::open(path, false, offset)?;
        let first_is_boundary = loaded.records.first().is_some_and(|(o, r)| *o == offset && r.is_compact_boundary());
        let undone = first_is_boundary && starts_undone(&loaded.records);
        if first_is_boundary && !undone {
            return Ok(LoadResult {
                transcript,
                records: loaded.records,
                records_before: records_before_boundary,
                view_offset: Some(offset),
                damaged: loaded.damaged,
                torn_bytes: loaded.torn_bytes,
                rebuilt_index: false,
                earlier: Vec::new(),
            });
        }
        if undone {
            tracing::info!(offset, "the indexed boundary was undone; scanning the transcript for the one in force");
        } else {
            tracing::warn!(offset, "index points at no compact boundary; scanning the transcript");
        }
    }
    // An entry that knows of no boundary: load from the start (a boundary written after
    // the entry was saved is still found, as loading applies boundaries as it goes).
    // No usable entry: a quick scan for the boundary in force (the latest not undone),
    // then load from it.
    let exists = path.exists();
    let trusted_no_boundary = matches!(entry, Some(SessionEntry { boundary_offset: None, .. }));
    let (offset, before) = if exists && !trusted_no_boundary { boundary_in_force(path)? } else { (None, 0) };
    let (transcript, loaded) = Transcript::open(path, true, offset.unwrap_or(0))?;
    // A rebuilt index has no ledger: find the reads before the boundary in the file.
    let earlier = match offset {
        Some(offset) if offset > 0 && store.index().ledger_entries(id).is_empty() => {
            crate::store::transcript::records_with_reads(path, offset)?
        }
        _ => Vec::new(),
    };
    Ok(LoadResult {
        transcript,
        records: loaded.records,
        records_before: before,
        view_offset: offset,
        damaged: loaded.damaged,
        torn_bytes: loaded.torn_bytes,
        rebuilt_index: exists && !trusted_no_boundary,
        earlier,
    })
}

/// Where the view starts by the whole transcript: (offset of the latest boundary not
/// undone, records before it), or the start of the file. Reads every line, parses only
/// compaction records.
fn boundary_in_force(path: &std::path::Path) -> Result<(Option<u64>, u64), SessionError> {
    let found = crate::store::transcript::scan_compactions(path)?;
    Ok(match compaction_view(&found.records).boundary {
        Some(i) => (Some(found.offsets[i]), found.before[i]),
        None => (None, 0),
    })
}

/// Whether the records read from a boundary on undo that boundary (and every later one):
/// then the view starts before them. Only compaction records are looked at.
fn starts_undone(records: &[(u64, Record)]) -> bool {
    if !records.iter().any(|(_, r)| is_undo_record(r)) {
        return false;
    }
    let marks: Vec<Record> =
        records.iter().map(|(_, r)| r).filter(|r| r.is_compact_boundary() || is_undo_record(r)).cloned().collect();
    compaction_view(&marks).boundary.is_none()
}

/// The view's records as the transcript has them now.
struct ViewOnDisk {
    /// From the boundary in force to the end, with their offsets.
    records: Vec<(u64, Record)>,
    records_before: u64,
    /// Where the boundary in force starts (none: the view starts at the file's start).
    view_offset: Option<u64>,
}

fn read_view(path: &std::path::Path) -> Result<ViewOnDisk, SessionError> {
    let (view_offset, records_before) = boundary_in_force(path)?;
    let mut loaded = crate::store::transcript::read_from(path, view_offset.unwrap_or(0))?;
    with_preserved(path, &mut loaded.records)?;
    Ok(ViewOnDisk { records: loaded.records, records_before, view_offset })
}

/// Bytes of `record` the next request carries (a new oversized tool result by its
/// preview, an attachment by its rendered text): what the tally and every trigger count.
pub(super) fn carried_bytes(record: &Record) -> u64 {
    ctxd_core::view::budget::carried_bytes(record, &ctxd_core::view::BudgetConfig::default())
}
