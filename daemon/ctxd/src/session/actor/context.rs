//! What the session knows of its context beyond the transcript: the files the agent read
//! (and what of that the index has), files that changed on disk, memory files activated
//! by reads, the budget notice, and the context view.

use std::path::PathBuf;

use ctxd_core::budget::BudgetNotice;
use ctxd_core::ledger::{Ledger, LedgerEntry, ReadMarker, file_read_in};
use ctxd_core::record::Record;

use super::{ContextView, Session, now_rfc3339};
use crate::context::base::BaseContext;
use crate::context::watcher::{FileStamp, Subscription, Target};

/// Most tokens of a changed-file note (a diff or the new content).
const CHANGED_FILE_BUDGET_TOKENS: u64 = 4_000;

/// What the model sees besides the transcript, and what it is built from.
#[derive(Default)]
pub(super) struct Context {
    pub(super) reads: Reads,
    /// Memory files and git snapshot, memoized.
    pub(super) base: Option<BaseContext>,
    /// The watcher's deliveries for this session's memory sources and read files.
    pub(super) subscription: Option<Subscription>,
    /// Memory-file text activated by reads, for the next request.
    pub(super) pending_notes: Vec<String>,
    /// The budget notices the model was given (70, 85, 95 % of the threshold).
    pub(super) notice: BudgetNotice,
    /// Stamps of every watched path when it was last seen, for when the OS watch limit
    /// is hit and changes are found by comparing stamps before each request instead.
    pub(super) stamps: Vec<(PathBuf, Option<FileStamp>)>,
}

/// Every file the agent read in this session (before the boundary too), and what of it
/// the index has.
///
/// Resume reads the index only for reads before the boundary (the view's own reads are
/// replayed from it), so reads are not written one by one: those the index lacks go in
/// one batch when a compaction starts and when a boundary is folded in.
#[derive(Default)]
pub(super) struct Reads {
    ledger: Ledger,
    /// The index has the ledger's reads up to this sequence number.
    saved_through: u64,
    /// Read files marked stale since the ledger was last saved (rare).
    stale_unsaved: Vec<String>,
    /// Reads after this sequence number came after the last post-compact reload: a
    /// rebuilt base context replays them so what they activated stays.
    reloaded_at: u64,
}

impl Reads {
    /// Starts again from what the index kept; all of it is saved.
    pub(super) fn restore(&mut self, entries: impl IntoIterator<Item = LedgerEntry>) {
        self.ledger = Ledger::default();
        self.stale_unsaved.clear();
        for entry in entries {
            self.ledger.restore(entry);
        }
        self.saved_through = self.ledger.last_sequence();
    }

    pub(super) fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Records the file read `record` carries (a Read tool result or ctxd's marker of
    /// an explicit read), and returns its path; `None` for any other record.
    pub(super) fn note(&mut self, record: &Record) -> Option<String> {
        if let Some(read) = file_read_in(record) {
            self.ledger.record(&read);
            Some(read.path)
        } else if let Some(marker) = ReadMarker::from_record(record) {
            self.ledger.record_marker(&marker);
            Some(marker.path)
        } else {
            None
        }
    }

    /// The file changed on disk since the agent read it.
    pub(super) fn mark_stale(&mut self, path: &str) {
        self.ledger.mark_stale(path);
        self.stale_unsaved.push(path.to_owned());
    }

    /// The agent read the file again, or was told it changed.
    pub(super) fn clear_stale(&mut self, path: &str) {
        self.ledger.clear_stale(path);
    }

    /// The index lacks some of the ledger.
    pub(super) fn unsaved(&self) -> bool {
        self.ledger.last_sequence() > self.saved_through || !self.stale_unsaved.is_empty()
    }

    /// The entries the index lacks, each once; from then on it is taken to have them.
    pub(super) fn take_unsaved(&mut self) -> Vec<LedgerEntry> {
        let mut entries: Vec<LedgerEntry> = self.ledger.read_after(self.saved_through).cloned().collect();
        for path in self.stale_unsaved.drain(..) {
            if let Some(entry) = self.ledger.get(&path).filter(|e| e.sequence <= self.saved_through) {
                entries.push(entry.clone());
            }
        }
        self.saved_through = self.ledger.last_sequence();
        entries
    }

    /// The base context was reloaded after a compaction.
    pub(super) fn reloaded(&mut self) {
        self.reloaded_at = self.ledger.last_sequence();
    }

    /// Files read since the last post-compact reload, oldest first.
    pub(super) fn since_reload(&self) -> Vec<PathBuf> {
        let mut reads: Vec<&LedgerEntry> = self.ledger.read_after(self.reloaded_at).collect();
        reads.sort_by_key(|e| e.sequence);
        reads.into_iter().map(|e| PathBuf::from(&e.path)).collect()
    }
}

impl Session {
    /// Loads the base context (shared discovery, git snapshot), replays this session's
    /// reads so their activations hold, and subscribes to changes of its sources.
    pub(super) async fn load_base(&mut self) {
        let (cwd, config, services) = (self.setup.cwd.clone(), self.setup.memory.clone(), self.setup.services.clone());
        let reads: Vec<PathBuf> =
            self.context.reads.ledger().newest_first().iter().rev().map(|e| PathBuf::from(&e.path)).collect();
        let today = now_rfc3339()[..10].to_owned();
        let loaded = tokio::task::spawn_blocking(move || {
            let mut base =
                BaseContext::load(std::path::Path::new(&cwd), config, &services.memory_cache, &services.fs, today);
            for path in &reads {
                base.on_file_read(path, &services.fs);
            }
            base
        })
        .await;
        match loaded {
            Ok(base) => {
                self.context.base = Some(base);
                self.resubscribe();
            }
            Err(e) => tracing::error!(error = %e, "base context could not be loaded"),
        }
    }

    /// Points the watcher at the memory sources and every read file.
    pub(super) fn resubscribe(&mut self) {
        let context = &mut self.context;
        let mut targets: Vec<Target> = match &context.base {
            Some(base) => base.watch_targets().into_iter().map(Target::from).collect(),
            None => Vec::new(),
        };
        targets.extend(context.reads.ledger().paths().map(Target::file));
        match &context.subscription {
            Some(sub) => sub.update(targets),
            None => context.subscription = Some(self.setup.services.watcher.subscribe(targets)),
        }
    }

    /// Writes the ledger entries the index lacks, in one batch off the actor.
    pub(super) fn save_ledger(&mut self) -> tokio::task::JoinHandle<()> {
        let entries = self.context.reads.take_unsaved();
        let (store, id) = (self.store.clone(), self.id.clone());
        tokio::task::spawn_blocking(move || {
            if !entries.is_empty() {
                store.index().put_ledger_batch(&id, &entries);
            }
        })
    }

    /// Records a file read carried by `record`, if any; `persist` writes the entry to the
    /// index (for records just appended, or found by a rebuild scan).
    pub(super) fn note_read(&mut self, record: &Record, persist: bool) {
        let Some(path) = self.context.reads.note(record) else { return };
        // A new read (not a replay while loading): rules and nested memory files may
        // activate, and the file joins the watched set.
        let context = &mut self.context;
        if persist && let Some(base) = &mut context.base {
            if let Some(note) = base.on_file_read(std::path::Path::new(&path), &self.setup.services.fs) {
                context.pending_notes.push(note);
            }
            context.reads.clear_stale(&path);
            // Only what this read added: handing over every read path again would make
            // each read cost O(reads so far).
            let added: Vec<Target> =
                base.new_watch_targets().into_iter().map(Target::from).chain([Target::file(path)]).collect();
            match &context.subscription {
                Some(sub) => sub.add(added),
                None => self.resubscribe(),
            }
        }
    }

    /// The watcher says these paths changed: memory sources mark the memo dirty (rebuilt
    /// on the next request), read files that really differ from what was read are marked
    /// stale (the next request tells the model), and the client hears which paths.
    pub(super) async fn files_changed(&mut self, paths: Vec<std::path::PathBuf>) {
        let mut memory = false;
        let mut read_files = Vec::new();
        for path in &paths {
            if self.context.base.as_ref().is_some_and(|b| b.is_memory_source(path)) {
                memory = true;
            }
            if let Some(entry) = path.to_str().and_then(|p| self.context.reads.ledger().get(p)) {
                read_files.push(entry.clone());
            }
        }
        if memory {
            if let Some(base) = &mut self.context.base {
                base.mark_dirty();
            }
            self.setup.services.memory_cache.invalidate(std::path::Path::new(&self.setup.cwd));
        }
        let checked = tokio::task::spawn_blocking(move || {
            read_files
                .into_iter()
                .filter(|e| match crate::outside::read(std::path::Path::new(&e.path), crate::outside::READ_FILE) {
                    Ok(bytes) => ctxd_core::ledger::has_changed(e, &String::from_utf8_lossy(&bytes)),
                    Err(_) => true,
                })
                .map(|e| e.path)
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for path in &checked {
            self.context.reads.mark_stale(path);
        }
        let reported: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        tracing::debug!(paths = ?reported, memory, stale = checked.len(), "files changed");
        self.notifier.context_changed(&self.id, reported).await;
    }

    /// The context view; a dirty memo is rebuilt first so the view is current.
    pub(super) async fn context_view(&mut self) -> ContextView {
        if let Some(mut base) = self.context.base.take() {
            let services = self.setup.services.clone();
            let reads = self.context.reads.since_reload();
            let rebuilt = tokio::task::spawn_blocking(move || {
                base.rebuild_if_dirty(&services.memory_cache, &services.fs, &reads);
                base
            })
            .await;
            if let Ok(base) = rebuilt {
                self.context.base = Some(base);
                self.resubscribe();
            }
        }
        let base = self.context.base.as_ref();
        let ledger = self.context.reads.ledger();
        ContextView {
            usage: self.usage(),
            memory_files: base.map(BaseContext::files).unwrap_or_default(),
            memory_tokens: base.map_or(0, BaseContext::memory_tokens),
            diagnostics: base.map(BaseContext::diagnostics).unwrap_or_default(),
            files_read: ledger.len(),
            stale_files: ledger.newest_first().iter().filter(|e| e.stale).map(|e| e.path.clone()).collect(),
            git: base.is_some_and(|b| b.system_context().is_some()),
            prepared_ahead: self.compaction.prepared_ahead(),
            instant_compaction: None,
        }
    }

    /// Changed read files (once each), memory files activated by reads since the last
    /// request, and a budget notice on crossing, as (attachment type, text).
    pub(super) async fn take_context_notes(&mut self) -> Vec<(&'static str, String)> {
        let mut notes: Vec<(&'static str, String)> =
            std::mem::take(&mut self.context.pending_notes).into_iter().map(|n| ("nested_memory", n)).collect();
        let tokens = self.next_tokens();
        if let Some(notice) = self.context.notice.check(tokens, &self.setup.thresholds) {
            notes.push(("total_tokens_reminder", notice));
        }
        let stale: Vec<LedgerEntry> =
            self.context.reads.ledger().newest_first().into_iter().filter(|e| e.stale).cloned().collect();
        if stale.is_empty() {
            return notes;
        }
        // The text as the agent read it, when its record is still in the view.
        let old_texts: Vec<Option<String>> = stale
            .iter()
            .map(|e| {
                let uuid = e.source_uuid.as_deref()?;
                let record = self.view.records.iter().rev().find(|r| r.uuid() == Some(uuid))?;
                file_read_in(record).map(|r| r.content)
            })
            .collect();
        let reads = stale.clone();
        let (cwd, env) = (self.setup.cwd.clone(), self.setup.process.clone());
        let imports = self.setup.settings.import_folders.clone();
        // The new text goes into the transcript: read as restored files are.
        let texts = tokio::task::spawn_blocking(move || {
            let allowed = crate::session::compaction::restorable(&cwd, &env, imports.as_deref());
            reads
                .iter()
                .map(|e| {
                    let path = std::path::Path::new(&e.path);
                    crate::outside::read_restorable(path, &allowed, crate::outside::READ_FILE)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for ((entry, old), new) in stale.iter().zip(old_texts).zip(texts) {
            self.context.reads.clear_stale(&entry.path);
            let text = match new {
                Ok(new) => {
                    ctxd_core::ledger::changed_file_note(&entry.path, old.as_deref(), &new, CHANGED_FILE_BUDGET_TOKENS)
                }
                Err(crate::outside::OutsideError::NotAllowed(_)) => {
                    format!("The file {} changed since you read it.", entry.path)
                }
                Err(_) => format!("The file {} was deleted or can no longer be read since you read it.", entry.path),
            };
            notes.push(("edited_text_file", text));
        }
        notes
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::PathBuf;

    use ctxd_core::ledger::{LedgerEntry, ReadMarker};
    use ctxd_core::record::Record;

    use super::Reads;

    /// ctxd's marker of an explicit read of `path`.
    fn read(path: &str, text: &str) -> Record {
        let marker = ReadMarker::measure(path, text, None, None, Some("2026-12-01T10:00:00.000Z".into()));
        Record::from_object(&marker.to_record(&format!("read{path}"))).unwrap()
    }

    fn paths(entries: Vec<LedgerEntry>) -> Vec<String> {
        let mut paths: Vec<String> = entries.into_iter().map(|e| e.path).collect();
        paths.sort();
        paths
    }

    #[test]
    fn the_index_gets_each_read_once_and_a_saved_one_again_when_it_goes_stale() {
        let mut reads = Reads::default();
        assert_eq!(reads.note(&read("/a", "1")).as_deref(), Some("/a"));
        reads.note(&read("/b", "2"));
        assert!(reads.unsaved());
        assert_eq!(paths(reads.take_unsaved()), ["/a", "/b"]);
        assert!(!reads.unsaved());
        assert!(reads.take_unsaved().is_empty());
        // A saved read that went stale is written again; a new one once, stale or not.
        reads.mark_stale("/a");
        reads.note(&read("/c", "3"));
        reads.mark_stale("/c");
        assert!(reads.unsaved());
        assert_eq!(paths(reads.take_unsaved()), ["/a", "/c"]);
        assert!(reads.ledger().get("/a").unwrap().stale);
        reads.clear_stale("/a");
        assert!(!reads.ledger().get("/a").unwrap().stale);
    }

    #[test]
    fn what_the_index_kept_counts_as_saved() {
        let mut reads = Reads::default();
        reads.note(&read("/a", "1"));
        let kept = reads.take_unsaved();
        let mut resumed = Reads::default();
        resumed.restore(kept);
        assert!(!resumed.unsaved());
        assert_eq!(resumed.ledger().len(), 1);
        resumed.note(&read("/b", "2"));
        assert_eq!(paths(resumed.take_unsaved()), ["/b"]);
    }

    #[test]
    fn the_reads_since_the_last_reload_are_replayed_oldest_first() {
        let mut reads = Reads::default();
        reads.note(&read("/a", "1"));
        reads.reloaded();
        reads.note(&read("/c", "3"));
        reads.note(&read("/b", "2"));
        assert_eq!(reads.since_reload(), [PathBuf::from("/c"), PathBuf::from("/b")]);
        let prompt = serde_json::json!({"type": "user", "uuid": "u", "message": {"role": "user", "content": "hi"}});
        assert_eq!(reads.note(&Record::from_object(prompt.as_object().unwrap()).unwrap()), None, "no read in it");
    }
}
