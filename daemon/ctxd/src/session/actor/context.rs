//! What the session knows of its context beyond the transcript: files that changed on disk,
//! memory files activated by reads, the budget notice, and the context view.

use ctxd_core::ledger::{LedgerEntry, file_read_in};

use super::{ContextView, Session};
use crate::context::base::BaseContext;

/// Most tokens of a changed-file note (a diff or the new content).
const CHANGED_FILE_BUDGET_TOKENS: u64 = 4_000;

impl Session {
    /// The watcher says these paths changed: memory sources mark the memo dirty (rebuilt
    /// on the next request), read files that really differ from what was read are marked
    /// stale (the next request tells the model), and the client hears which paths.
    pub(super) async fn files_changed(&mut self, paths: Vec<std::path::PathBuf>) {
        let mut memory = false;
        let mut read_files = Vec::new();
        for path in &paths {
            if self.base.as_ref().is_some_and(|b| b.is_memory_source(path)) {
                memory = true;
            }
            if let Some(entry) = path.to_str().and_then(|p| self.ledger.get(p)) {
                read_files.push(entry.clone());
            }
        }
        if memory {
            if let Some(base) = &mut self.base {
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
            self.ledger.mark_stale(path);
            self.ledger_stale_unsaved.push(path.clone());
        }
        let reported: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        tracing::debug!(paths = ?reported, memory, stale = checked.len(), "files changed");
        self.notifier.context_changed(&self.id, reported).await;
    }

    /// The context view; a dirty memo is rebuilt first so the view is current.
    pub(super) async fn context_view(&mut self) -> ContextView {
        if let Some(mut base) = self.base.take() {
            let services = self.setup.services.clone();
            let reads = self.reads_since_compaction();
            let rebuilt = tokio::task::spawn_blocking(move || {
                base.rebuild_if_dirty(&services.memory_cache, &services.fs, &reads);
                base
            })
            .await;
            if let Ok(base) = rebuilt {
                self.base = Some(base);
                self.resubscribe();
            }
        }
        let base = self.base.as_ref();
        ContextView {
            usage: self.usage(),
            memory_files: base.map(BaseContext::files).unwrap_or_default(),
            memory_tokens: base.map_or(0, BaseContext::memory_tokens),
            diagnostics: base.map(BaseContext::diagnostics).unwrap_or_default(),
            files_read: self.ledger.len(),
            stale_files: self.ledger.newest_first().iter().filter(|e| e.stale).map(|e| e.path.clone()).collect(),
            git: base.is_some_and(|b| b.system_context().is_some()),
            prepared_ahead: self.ahead.as_ref().map(|a| a.prepared.estimated_post_tokens),
        }
    }

    /// Changed read files (once each), memory files activated by reads since the last
    /// request, and a budget notice on crossing, as (attachment type, text).
    pub(super) async fn take_context_notes(&mut self) -> Vec<(&'static str, String)> {
        let mut notes: Vec<(&'static str, String)> =
            std::mem::take(&mut self.pending_notes).into_iter().map(|n| ("nested_memory", n)).collect();
        if let Some(notice) = self.notice.check(self.next_tokens(), &self.thresholds) {
            notes.push(("total_tokens_reminder", notice));
        }
        let stale: Vec<LedgerEntry> = self.ledger.newest_first().into_iter().filter(|e| e.stale).cloned().collect();
        if stale.is_empty() {
            return notes;
        }
        // The text as the agent read it, when its record is still in the view.
        let old_texts: Vec<Option<String>> = stale
            .iter()
            .map(|e| {
                let uuid = e.source_uuid.as_deref()?;
                let record = self.view.iter().rev().find(|r| r.uuid() == Some(uuid))?;
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
            self.ledger.clear_stale(&entry.path);
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
