//! Appending to the transcript: a group of appends written with one sync, then folded and
//! acknowledged; and the commands that append a record of ctxd's own (undo, an explicit read,
//! a snip or collapse).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use ctxd_core::compact::{CompactGuards, build_undo_record, common_fields, is_undo_record, undo_target};
use ctxd_core::ledger::{ReadMarker, ReadOutcome};
use ctxd_core::record::Record;

use super::load::carried_bytes;
use super::{
    AppendSteps, Appended, FileReadAnswer, PendingAppend, Reduced, Reduction, Session, UndoAnswer, now_rfc3339,
};
use crate::session::SessionError;

impl Session {
    /// Writes a group of host appends with one sync, then acknowledges each (before any
    /// compaction the appends start).
    pub(super) async fn commit(&mut self, group: Vec<PendingAppend>) {
        if group.is_empty() {
            return;
        }
        let (batches, replies): (Vec<Vec<Record>>, Vec<_>) = group.into_iter().unzip();
        let written = self.write_group(batches).await;
        for (ack, reply) in written.acks.into_iter().zip(replies) {
            let _ = reply.send(ack);
        }
        self.after_commit(written.undo_seen).await;
    }

    /// Appends records ctxd made itself (an attachment, the pipeline's state, an undo, an
    /// explicit read) as one group, with what a host's append sets off.
    pub(super) async fn commit_own(&mut self, records: Vec<Record>) -> Result<(), SessionError> {
        let written = self.write_group(vec![records]).await;
        let ack = written.acks.into_iter().next().unwrap_or_else(|| Err(SessionError::Closed(self.id.clone())));
        self.after_commit(written.undo_seen).await;
        ack.map(drop)
    }

    /// Appends records of compaction's own (its install, the guard state) as one group:
    /// the status bars hear of them, and no threshold check follows (what follows an
    /// install is the lifecycle's to decide).
    pub(super) async fn write_own(&mut self, records: Vec<Record>) -> Result<(), SessionError> {
        let written = self.write_group(vec![records]).await;
        let ack = written.acks.into_iter().next().unwrap_or_else(|| Err(SessionError::Closed(self.id.clone())));
        let usage = self.usage();
        self.usage_changed(usage).await;
        ack.map(drop)
    }

    /// Writes batches of records with one sync and folds them in: one acknowledgement per
    /// batch, in order. Records already stored (same uuid) or repeated are dropped.
    async fn write_group(&mut self, batches: Vec<Vec<Record>>) -> Written {
        let commit_started = Instant::now();
        let mut seen: HashSet<Arc<str>> = HashSet::new();
        let mut plan = Vec::with_capacity(batches.len());
        let mut lines: Vec<Record> = Vec::new();
        for records in batches {
            let mut fresh = Vec::with_capacity(records.len());
            let mut duplicates = 0u64;
            for record in records {
                let dup = record.uuid().is_some_and(|u| self.view.uuids.contains(u) || !seen.insert(Arc::from(u)));
                if dup {
                    duplicates += 1;
                } else {
                    fresh.push(record);
                }
            }
            plan.push((fresh.len(), duplicates));
            lines.extend(fresh);
        }
        let failed = |plan: &[(usize, u64)], error: SessionError| Written {
            acks: plan.iter().map(|_| Err(error.clone())).collect(),
            undo_seen: false,
        };
        let Some(mut transcript) = self.transcript.take() else {
            return failed(&plan, SessionError::Internal("transcript is not open".into()));
        };
        let text: Vec<Arc<str>> = lines.iter().map(|r| r.line_arc().clone()).collect();
        let written = tokio::task::spawn_blocking(move || {
            let write_started = Instant::now();
            let refs: Vec<&str> = text.iter().map(|l| l.as_ref()).collect();
            let result = if refs.is_empty() { Ok(Vec::new()) } else { transcript.append(&refs) };
            (transcript, result, (write_started, Instant::now()))
        })
        .await;
        let resumed = Instant::now();
        let (transcript, result, (write_started, synced)) = match written {
            Ok(pair) => pair,
            // The blocking task panicked: the file handle is gone with it.
            Err(e) => return failed(&plan, SessionError::Internal(format!("write task failed: {e}"))),
        };
        self.transcript = Some(transcript);
        let offsets = match result {
            Ok(offsets) => offsets,
            Err(e) => {
                tracing::error!(error = %e, "append failed; nothing acknowledged");
                return failed(&plan, SessionError::Store(e.to_string()));
            }
        };
        let mut boundary_seen = false;
        let mut undo_seen = false;
        let mut records = lines.into_iter().zip(offsets);
        let mut counts = Vec::with_capacity(plan.len());
        for (count, duplicates) in plan {
            for (record, offset) in records.by_ref().take(count) {
                // A new model response is a turn for the guards.
                self.compaction.observe(&record);
                boundary_seen |= record.is_compact_boundary();
                undo_seen |= is_undo_record(&record);
                self.apply(record, Some(offset));
            }
            counts.push((count as u64, duplicates, self.view.total_records));
        }
        if boundary_seen {
            self.flush_index();
        }
        // An undo takes the view back to an earlier boundary: its records come from disk.
        let restored = if undo_seen { self.restore_view().await } else { Ok(()) };
        let usage = self.usage();
        let steps = AppendSteps { commit_started, write_started, synced, resumed, answered: Instant::now() };
        let acks = counts
            .into_iter()
            .map(|(appended, duplicates, records)| match &restored {
                Ok(()) => Ok(Appended { appended, duplicates, records, usage: usage.clone(), steps }),
                Err(e) => Err(SessionError::Store(format!(
                    "the records are stored, but the view could not be rebuilt after the undo: {e}"
                ))),
            })
            .collect();
        Written { acks, undo_seen }
    }

    /// Tells the tally what a snip, collapse or time-gap microcompact record takes out of
    /// the next request, as the request pipeline counts it: the last reported usage still
    /// counts those records until the next report, and without this the usage and the
    /// append's threshold check would stay above the request just assembled. Called for
    /// every record folded into the view, committed now or read back on load (a restart
    /// between the record and the next report counts the same). Snips and collapses are
    /// `freed` (the pipeline's own check takes them off itself), cleared tool results
    /// `cleared`. Any other record costs a type test.
    pub(super) fn count_reduction(&mut self, record: &Record) {
        use ctxd_core::view::state::{StateRecord, Trigger};
        match StateRecord::from_record(record) {
            Some(StateRecord::Snip(snip)) => {
                let freed = self.snipped_tokens(&snip.removed_uuids);
                self.view.tally.freed(freed);
            }
            Some(StateRecord::Collapse(collapse)) => {
                if let Some(freed) = self.collapsed_tokens(&collapse.from, &collapse.to, &collapse.summary) {
                    self.view.tally.freed(freed);
                }
            }
            Some(StateRecord::Microcompact(mc)) if mc.trigger == Trigger::TimeGap => {
                let cleared = self.cleared_tokens(&mc.cleared_tool_use_ids);
                self.view.tally.cleared(cleared);
            }
            _ => {}
        }
    }

    /// Tokens the view's records with these uuids carry.
    fn snipped_tokens(&self, uuids: &[String]) -> u64 {
        let rate = self.view.tally.calibration;
        self.view
            .records
            .iter()
            .filter(|r| r.uuid().is_some_and(|u| uuids.iter().any(|k| k == u)))
            .map(|r| rate.tokens(carried_bytes(r)))
            .sum()
    }

    /// Tokens a collapse of the view's span `from`..=`to` (either order) into `summary`
    /// frees; `None` when an end is not in the view.
    fn collapsed_tokens(&self, from: &str, to: &str, summary: &str) -> Option<u64> {
        let position = |uuid: &str| self.view.records.iter().position(|r| r.uuid() == Some(uuid));
        let (a, b) = (position(from)?, position(to)?);
        let span_bytes = self.view.records[a.min(b)..=a.max(b)].iter().map(carried_bytes).sum();
        Some(self.view.tally.calibration.collapse_freed(span_bytes, summary))
    }

    /// Tokens clearing these tool results takes out, less their placeholders. A walk of
    /// the view's tool results, paid once per cold-cache gap.
    fn cleared_tokens(&self, ids: &[String]) -> u64 {
        if ids.is_empty() {
            return 0;
        }
        let ids: HashSet<&str> = ids.iter().map(String::as_str).collect();
        self.view
            .records
            .iter()
            .filter(|r| r.head().kind == ctxd_core::record::Kind::User && r.line().contains("tool_result"))
            .filter_map(ctxd_core::view::Item::from_record)
            .flat_map(|item| item.blocks)
            .filter(|block| block.result().is_some_and(|r| !r.cleared && ids.contains(r.tool_use_id.as_ref())))
            .map(|block| block.tokens().saturating_sub(ctxd_core::view::microcompact::cleared(&block).tokens()))
            .sum()
    }

    /// What follows stored records: the threshold is checked, the status bars hear of
    /// the new usage.
    async fn after_commit(&mut self, undo_seen: bool) {
        // Compacting the view an undo brought back would take the undo back at once; the
        // next append or request decides.
        if !undo_seen {
            self.check_threshold().await;
        }
        let usage = self.usage();
        self.usage_changed(usage).await;
    }

    /// `ctx/undoCompact`: appends the record that undoes the latest compaction not undone
    /// yet, as long as no new turn followed it; [`Session::commit`] then brings back the
    /// view it replaced and pushes the usage.
    pub(super) async fn undo_compact(&mut self) -> Result<UndoAnswer, SessionError> {
        if !self.before_undo().await {
            return Err(SessionError::Busy(
                "a compaction of this session is running; undo after it is installed".into(),
            ));
        }
        let boundary = undo_target(&self.view.records).map_err(SessionError::CannotUndo)?;
        let Some(undone) = boundary.uuid().map(str::to_owned) else {
            return Err(SessionError::InvalidParams(
                "the latest compact boundary has no uuid, so no record can name it".into(),
            ));
        };
        let common = self.view.records.iter().rev().find(|r| r.uuid().is_some()).map(common_fields).unwrap_or_default();
        let uuid = uuid::Uuid::new_v4().to_string();
        let record = build_undo_record(boundary, &common, &uuid, &now_rfc3339())
            .map_err(|e| SessionError::Internal(e.to_string()))?;
        let pre_tokens = self.next_tokens();
        self.commit_own(vec![record]).await?;
        // The undone compaction's bookkeeping goes with it (a refill it counted, a failure
        // after it): the guards are the restored view's, as a restart would read them.
        self.compaction.restore_guards(CompactGuards::restore(&self.view.records));
        tracing::info!(boundary = %undone, pre_tokens, post_tokens = self.next_tokens(), "compaction undone");
        Ok(UndoAnswer {
            boundary: undone,
            undo_record: uuid,
            pre_tokens,
            post_tokens: self.next_tokens(),
            usage: self.usage(),
        })
    }

    /// An explicit read: measure the file now, store a marker record (so the ledger can be
    /// rebuilt from the transcript), record it in the ledger.
    pub(super) async fn file_read(
        &mut self,
        path: String,
        start_line: Option<u64>,
        num_lines: Option<u64>,
    ) -> Result<FileReadAnswer, SessionError> {
        let reading = path.clone();
        let text = tokio::task::spawn_blocking(move || {
            crate::outside::read(std::path::Path::new(&reading), crate::outside::READ_FILE)
        })
        .await
        .map_err(|e| SessionError::Internal(format!("read task failed: {e}")))?
        .map_err(|e| SessionError::InvalidParams(format!("cannot read {path}: {e}")))?;
        let text = String::from_utf8_lossy(&text);
        let marker = ReadMarker::measure(&path, &text, start_line, num_lines, Some(now_rfc3339()));
        let before = self.context.reads.ledger().get(&path).cloned();
        let record = Record::from_object(&marker.to_record(&uuid::Uuid::new_v4().to_string()))
            .map_err(|e| SessionError::Internal(format!("marker record: {e}")))?;
        self.commit_own(vec![record]).await?;
        let entry = self.context.reads.ledger().get(&path).cloned();
        let entry = entry.ok_or_else(|| SessionError::Internal("ledger entry missing".into()))?;
        let outcome = match before {
            None => ReadOutcome::New,
            Some(old) => ReadOutcome::Reread {
                unchanged: old.hash == entry.hash
                    && old.start_line == entry.start_line
                    && old.num_lines == entry.num_lines,
            },
        };
        Ok(FileReadAnswer { outcome, entry })
    }

    /// Appends a snip or collapse record; the pipeline applies it at read time and the
    /// tally stops counting what it removed.
    pub(super) async fn reduce(&mut self, reduction: Reduction) -> Result<Reduced, SessionError> {
        let position = |uuid: &str| self.view.records.iter().position(|r| r.uuid() == Some(uuid));
        let (object, freed, unknown) = match reduction {
            Reduction::Snip { uuids } => {
                let (known, unknown): (Vec<String>, Vec<String>) =
                    uuids.into_iter().partition(|u| position(u).is_some());
                if known.is_empty() {
                    return Err(SessionError::InvalidParams(format!(
                        "no record of the current view has these uuids: {unknown:?}"
                    )));
                }
                let freed = self.snipped_tokens(&known);
                (serde_json::json!({"type": ctxd_core::view::SNIP_RECORD, "removedUuids": known}), freed, unknown)
            }
            Reduction::Collapse { from, to, summary } => {
                let (Some(a), Some(b)) = (position(&from), position(&to)) else {
                    return Err(SessionError::InvalidParams(format!(
                        "the span {from}..{to} is not in the current view"
                    )));
                };
                let summary = match summary {
                    Some(s) => s,
                    None => {
                        let span = &self.view.records[a.min(b)..=a.max(b)];
                        let options =
                            ctxd_core::summary::OfflineOptions { max_output_tokens: 2_000, ..Default::default() };
                        let written = ctxd_core::summary::summarize_offline(span, &options);
                        ctxd_core::summary::parse_summary_reply(&written.text).unwrap_or(written.text)
                    }
                };
                let freed = self.collapsed_tokens(&from, &to, &summary).unwrap_or(0);
                (
                    serde_json::json!({"type": ctxd_core::view::COLLAPSE_RECORD, "from": from, "to": to, "summary": summary}),
                    freed,
                    Vec::new(),
                )
            }
        };
        let (record, uuid) = own_record(object.as_object().cloned().unwrap_or_default())?;
        // Folding the record tells the tally what it frees (`count_reduction`).
        self.commit_own(vec![record]).await?;
        let usage = self.usage();
        self.usage_changed(usage.clone()).await;
        Ok(Reduced { record_uuid: uuid, tokens_freed: freed, unknown, usage })
    }
}

/// An attachment record ctxd adds to the session (a changed file, a memory file a read
/// activated): the model sees its rendered text once, where it was added.
pub(super) fn attachment_record(kind: &str, text: &str) -> Result<Record, SessionError> {
    let value = serde_json::json!({
        "type": "attachment",
        "isSidechain": false,
        "attachment": {"type": kind, "source": "ctxd"},
        "rendered": [{"content": format!("<system-reminder>\n{text}\n</system-reminder>")}],
        "renderedRole": "user",
    });
    own_record(value.as_object().cloned().unwrap_or_default()).map(|(record, _)| record)
}

/// A record of ctxd's own from its fields: a new uuid and the current time stamped on it.
/// Returns the record and its uuid.
pub(super) fn own_record(
    mut object: serde_json::Map<String, serde_json::Value>,
) -> Result<(Record, String), SessionError> {
    let uuid = uuid::Uuid::new_v4().to_string();
    object.insert("uuid".into(), uuid.clone().into());
    object.insert("timestamp".into(), now_rfc3339().into());
    let record = Record::from_object(&object).map_err(|e| SessionError::Internal(e.to_string()))?;
    Ok((record, uuid))
}

/// The outcome of [`Session::write_group`].
struct Written {
    /// One per batch, in order.
    acks: Vec<Result<Appended, SessionError>>,
    undo_seen: bool,
}
