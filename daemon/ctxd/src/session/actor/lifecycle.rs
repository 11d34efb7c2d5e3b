//! The compaction lifecycle inside the actor: when one starts (automatic, idle, prepared
//! ahead), its snapshot handed to the driver ([`super::super::compaction`]), and how its result
//! is installed or its failure reported.

use std::time::Instant;

use ctxd_core::compact::{AfterInstall, AutoDecision, InstallInput, Trigger, build_post_compact, common_fields};
use ctxd_core::record::Record;
use tokio::sync::oneshot;
use tracing::Instrument;

use super::{Ahead, Command, CompactAnswer, CompactRequest, Running, Session, now_rfc3339};
use crate::session::SessionError;
use crate::session::compaction::{self, CompactFailure, Job, Prepared};

impl Session {
    /// Takes a snapshot and runs the slow part of a compaction in the background.
    pub(super) fn start_compaction(
        &mut self,
        trigger: Trigger,
        focus: Option<String>,
        reply: Option<oneshot::Sender<Result<CompactAnswer, SessionError>>>,
        progress: Option<crate::session::Progress>,
    ) {
        self.start_compaction_with(trigger, focus, reply, progress, None);
    }

    pub(super) fn start_compaction_with(
        &mut self,
        trigger: Trigger,
        focus: Option<String>,
        reply: Option<oneshot::Sender<Result<CompactAnswer, SessionError>>>,
        progress: Option<crate::session::Progress>,
        partial: Option<(ctxd_core::compact::SplitDirection, usize)>,
    ) {
        self.compaction_generation += 1;
        let generation = self.compaction_generation;
        let pre_tokens = self.next_tokens();
        // What ctxd starts on its own forks the newest request the model answered, byte
        // for byte (its one-time notes and breakpoints included), so the fork reads all
        // of it from the provider's cache. Only when everything appended since is in the
        // tail kept verbatim after the summary: the summary is written from the part
        // before that tail, which that request shows whole.
        let answered = (partial.is_none() && trigger.is_automatic() && trigger != Trigger::Reactive)
            .then(|| self.fork_parents.answered(&self.view, self.view_generation))
            .flatten()
            .filter(|p| {
                let from = ctxd_core::compact::kept_tail_start(&self.view).unwrap_or(self.view.len());
                let kept: u64 = self.view[from..].iter().map(ctxd_core::compact::carried_tokens).sum();
                from <= p.view_len && ctxd_core::compact::keep_tail(kept, self.thresholds.threshold)
            })
            .map(|p| p.request.to_value());
        // Otherwise the request the host would be sent now, to fork; a partial compaction
        // summarizes only the side it replaces, which no host request ever was.
        let (parent, host_parent) = match (partial, self.host_request.clone()) {
            (None, Some(_)) if answered.is_some() => (answered.unwrap_or_default(), true),
            (None, Some(host)) => (self.run_pipeline(host.blocks(), None).request.to_value(), true),
            (None, None) => (self.parent_request(&self.view), false),
            (Some((ctxd_core::compact::SplitDirection::UpTo, split)), _) => {
                (self.parent_request(&self.view[..split]), false)
            }
            (Some((ctxd_core::compact::SplitDirection::From, split)), _) => {
                (self.parent_request(&self.view[split..]), false)
            }
        };
        let job = Job {
            session_id: self.id.clone(),
            trigger,
            focus: focus.clone(),
            records: self.view.clone(),
            ledger: self.ledger.newest_first().into_iter().cloned().collect(),
            pre_tokens,
            threshold: self.thresholds.threshold,
            fixed_prefix: self.fixed_prefix(),
            settings: self.setup.settings.clone(),
            transcript_path: self.transcript.as_ref().map(|t| t.path().display().to_string()).unwrap_or_default(),
            cwd: self.setup.cwd.clone(),
            model: self.setup.model.clone(),
            parent: Some(parent),
            host_parent,
            partial,
            skills: self.invoked.skills.clone(),
            plan_path: self.invoked.plan_path.clone(),
            progress: progress.clone(),
            env: self.setup.process.clone(),
        };
        tracing::info!(?trigger, pre_tokens, records = job.records.len(), "compaction started");
        self.compaction = Some(Running {
            generation,
            trigger,
            started: Instant::now(),
            pre_tokens,
            view_generation: self.view_generation,
            reply,
            focus,
            origin: ctxd_proto::CompactOrigin::Requested,
            joiners: Vec::new(),
            task: None,
            progress,
            snapshot_len: self.view.len(),
            ledger_saved: Some(self.save_ledger()),
            ahead: false,
        });
        let tx = self.self_tx.clone();
        // Spawned tasks do not inherit the actor's span: this one names the session and
        // the compaction, so its log lines (hooks, provider, fallback) say whose they are.
        let span = tracing::info_span!("compaction", session = %self.id, generation, trigger = ?trigger);
        let task = tokio::spawn(
            async move {
                let result = compaction::prepare(job).await;
                let _ = tx.send(Command::CompactionDone { generation, result });
            }
            .instrument(span),
        );
        if let Some(running) = &mut self.compaction {
            running.task = Some(task.abort_handle());
        }
    }

    /// Installs a prepared compaction, or reports its failure.
    pub(super) async fn compaction_done(&mut self, generation: u64, result: Result<Prepared, CompactFailure>) {
        let Some(running) = self.compaction.take_if(|r| r.generation == generation) else {
            return;
        };
        let Running {
            trigger,
            started,
            pre_tokens,
            view_generation,
            reply,
            progress,
            snapshot_len,
            ledger_saved,
            ahead,
            origin,
            joiners,
            ..
        } = running;
        // The index must hold every read before the new boundary before the boundary is
        // written; the bulk went off the actor when the compaction started.
        if let Some(saved) = ledger_saved {
            let _ = saved.await;
        }
        if ahead {
            match result {
                Ok(prepared) if view_generation == self.view_generation => {
                    tracing::info!(
                        estimated_post = prepared.estimated_post_tokens,
                        "summary prepared ahead of the threshold"
                    );
                    self.ahead = Some(Ahead { prepared, view_generation, snapshot_len });
                }
                Ok(_) => tracing::info!("summary prepared ahead dropped: the view changed meanwhile"),
                Err(failure) => {
                    // Nothing is lost: at the threshold a normal compaction runs.
                    tracing::info!(%failure, "preparing a summary ahead failed; the threshold will compact normally");
                    self.ahead_failed = Some(view_generation);
                }
            }
            // The threshold may have come meanwhile.
            self.maybe_auto_compact().await;
            return;
        }
        // Cancelled when everyone who asked for it is gone (an automatic one: never).
        let cancelled = reply.as_ref().is_some_and(oneshot::Sender::is_closed)
            && joiners.iter().all(|(reply, _)| reply.is_closed());
        let mut outcome = match result {
            _ if cancelled => {
                Err(SessionError::Cancelled("the compaction was cancelled; nothing was installed".into()))
            }
            _ if view_generation != self.view_generation => Err(SessionError::Busy(
                "the session was compacted by another path meanwhile; this compaction was dropped".into(),
            )),
            // Kept before the summary, the records appended meanwhile would have no place.
            Ok(prepared) if prepared.kept_before.is_some() && self.view.len() != snapshot_len => {
                Err(SessionError::Busy(
                    "records were appended during the partial compaction; nothing was installed, try again".into(),
                ))
            }
            Ok(prepared) => self.install(trigger, started, pre_tokens, prepared).await,
            Err(failure) => Err(SessionError::CompactFailed(failure.to_string())),
        };
        if let Ok(answer) = &mut outcome {
            answer.origin = origin;
        }
        for (joiner, progress) in joiners {
            let joined =
                outcome.clone().map(|answer| CompactAnswer { origin: ctxd_proto::CompactOrigin::Joined, ..answer });
            if let Some(progress) = progress {
                progress.end(compaction_end_message(&joined)).await;
            }
            let _ = joiner.send(joined);
        }
        self.finish_compaction(trigger, outcome, reply, progress).await;
        // A request with its own focus instructions waited for this one: it runs now.
        if self.compaction.as_ref().is_none_or(|running| running.ahead)
            && let Some(next) = self.queued_compacts.pop_front()
        {
            Box::pin(self.compact_requested(next, ctxd_proto::CompactOrigin::Queued)).await;
        }
    }

    /// `ctx/compact`: compact now, join the compaction running, or queue behind it.
    /// `origin` is what the answer reports when this request's own compaction runs.
    pub(super) async fn compact_requested(&mut self, request: CompactRequest, origin: ctxd_proto::CompactOrigin) {
        let CompactRequest { trigger, instructions, partial, progress, reply } = request;
        self.drop_precompute();
        // The provider refused the request as too long: a summary prepared ahead
        // answers at once, with no model call before the host can retry.
        if trigger == Trigger::Reactive
            && self.compaction.is_none()
            && self.thresholds.compact_enabled
            && let Some(outcome) = self.install_ahead().await
        {
            self.finish_compaction(Trigger::Precomputed, outcome, Some(reply), progress).await;
            return;
        }
        if let Some(running) = &mut self.compaction {
            // One already runs (automatic, or another request's): with the same focus
            // the request waits for its result; with its own, it runs next.
            if partial.is_none() && (instructions.is_none() || instructions == running.focus) {
                tracing::info!(?trigger, "a compaction is running; the request waits for its result");
                running.joiners.push((reply, progress));
            } else {
                tracing::info!(?trigger, "a compaction is running; the request's own runs after it");
                self.queued_compacts.push_back(CompactRequest { trigger, instructions, partial, progress, reply });
            }
        } else if !self.thresholds.compact_enabled {
            let _ = reply.send(Err(SessionError::CompactFailed("compaction is turned off (DISABLE_COMPACT)".into())));
        } else {
            if trigger == Trigger::Manual {
                // A manual compaction resets the circuit breaker and lifts a stop, for
                // good: a restart does not bring the stop back.
                let saved = self.guards.clone();
                self.guards.note_manual_compact();
                self.save_guards(&saved).await;
            }
            let split = match partial {
                None => Ok(None),
                Some((direction, uuid)) => match self.view.iter().position(|r| r.uuid() == Some(uuid.as_str())) {
                    // The split moves so no tool use is parted from its result.
                    Some(at) => {
                        let plan = ctxd_core::compact::partial_plan(&self.view, at, direction);
                        let split = match direction {
                            ctxd_core::compact::SplitDirection::From => plan.summarize.start,
                            ctxd_core::compact::SplitDirection::UpTo => plan.keep.start,
                        };
                        Ok(Some((direction, split)))
                    }
                    None => {
                        Err(SessionError::InvalidParams(format!("no record {uuid:?} in the session's current view")))
                    }
                },
            };
            match split {
                Ok(partial) => {
                    self.start_compaction_with(trigger, instructions, Some(reply), progress, partial);
                    if let Some(running) = &mut self.compaction {
                        running.origin = origin;
                    }
                }
                Err(e) => drop(reply.send(Err(e))),
            }
        }
    }

    /// Tells everyone how a compaction ended: its `$/progress`, `ctx/compacted` or
    /// `ctx/compactFailed`, the requester, the guards, the status bars.
    pub(super) async fn finish_compaction(
        &mut self,
        trigger: Trigger,
        outcome: Result<CompactAnswer, SessionError>,
        reply: Option<oneshot::Sender<Result<CompactAnswer, SessionError>>>,
        progress: Option<crate::session::Progress>,
    ) {
        if let Some(progress) = &progress {
            progress.end(compaction_end_message(&outcome)).await;
        }
        match &outcome {
            Ok(answer) => {
                tracing::info!(?trigger, pre = answer.pre_tokens, post = answer.post_tokens, "compaction installed");
                self.notifier.compacted(&self.id, trigger, answer.pre_tokens, answer.post_tokens).await;
            }
            Err(e) => {
                tracing::warn!(?trigger, error = %e, "compaction failed");
                let saved = self.guards.clone();
                let stop = self.guards.record_failure(trigger, &e.to_string());
                self.save_guards(&saved).await;
                if let Some(stop) = stop {
                    self.notifier.compact_failed(&self.id, &stop.message()).await;
                } else if reply.is_none() {
                    self.notifier.compact_failed(&self.id, &e.to_string()).await;
                }
            }
        }
        let installed = outcome.is_ok();
        if let Some(reply) = reply {
            let _ = reply.send(outcome);
        }
        let usage = self.usage();
        self.usage_changed(usage).await;
        if installed {
            self.follow_up().await;
        }
    }

    /// An install that left the session at or above its threshold (records appended
    /// while it ran, restored files) is followed at once by another compaction, as far
    /// as the guards allow, instead of waiting for the next request; below it, the
    /// threshold check an append makes runs now (it may prepare a summary ahead).
    async fn follow_up(&mut self) {
        if self.compaction.is_some() {
            return;
        }
        let tokens = self.next_tokens();
        match self.guards.after_install(tokens, &self.thresholds, self.fixed_prefix()) {
            AfterInstall::CompactAgain { step } => {
                tracing::info!(tokens, step, "the compaction left the session above its threshold; compacting again");
                self.start_compaction(Trigger::Auto, None, None, None);
                let usage = self.usage();
                self.usage_changed(usage).await;
            }
            AfterInstall::StillAbove { message } => {
                tracing::warn!(tokens, "{message}");
                self.notifier.compact_failed(&self.id, &message).await;
            }
            // Boxed: the check may install a summary prepared ahead, which follows up.
            AfterInstall::Done => Box::pin(self.maybe_auto_compact()).await,
        }
    }

    /// Appends the post-compact records in one batch (one sync), keeping every record
    /// appended since the snapshot after the summary, then reloads the base context.
    pub(super) async fn install(
        &mut self,
        trigger: Trigger,
        started: Instant,
        pre_tokens: u64,
        prepared: Prepared,
    ) -> Result<CompactAnswer, SessionError> {
        // The split was chosen on the snapshot; a tool result appended since may answer
        // a call on the summarized side (the snapshot ended mid-round). Keep that round
        // too rather than refuse the install: the call is then both summarized and kept.
        let kept_from = ctxd_core::compact::safe_split(&self.view, prepared.kept_from);
        if kept_from != prepared.kept_from {
            tracing::info!(
                from = prepared.kept_from,
                to = kept_from,
                "a result appended during the compaction answers a summarized call; its round is kept"
            );
        }
        // A branch the host rewound away from meanwhile is not kept: after the summary it
        // would be back in the view for good.
        let kept = ctxd_core::compact::kept_tail(&self.view, kept_from);
        let kept_before: Vec<Record> =
            prepared.kept_before.and_then(|n| self.view.get(..n)).map(<[Record]>::to_vec).unwrap_or_default();
        let last = self.view.iter().rev().find(|r| r.uuid().is_some());
        let common = last.map(common_fields).unwrap_or_default();
        let input = InstallInput {
            trigger,
            last_uuid: last.and_then(|r| r.uuid().map(str::to_owned)),
            pre_tokens,
            fixed_prefix_tokens: Some(self.fixed_prefix()),
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            summary_text: prepared.summary_text.clone(),
            kept_before: &kept_before,
            kept_after: &kept,
            attachments: &prepared.attachments,
            hook_outputs: &prepared.hook_outputs,
            common,
            timestamp: now_rfc3339(),
            tokens_per_kib: Some(self.tally.calibration.tokens_per_kib),
            attachment_links: ctxd_core::compact::AttachmentLinks::Loose,
        };
        let mut post = build_post_compact(&input, &mut || uuid::Uuid::new_v4().to_string())
            .map_err(|e| SessionError::CompactFailed(e.to_string()))?;
        // The usage until the next report stands on the request assembled over the
        // installed view, written on the boundary so a resume or an undo reads it too.
        if let Some(tokens) = self.installed_request_tokens(&kept, &post.records) {
            ctxd_core::compact::stamp_request_tokens(&mut post, tokens)
                .map_err(|e| SessionError::CompactFailed(e.to_string()))?;
        }
        self.installing = true;
        let committed = self.commit_own(post.records).await;
        self.installing = false;
        committed?;
        // Instructions come back from disk, not from what the summary kept.
        self.base_reads_from = self.ledger.last_sequence();
        if let Some(mut base) = self.base.take() {
            let services = self.setup.services.clone();
            if let Ok(base) = tokio::task::spawn_blocking(move || {
                base.reload(&services.memory_cache, &services.fs);
                base
            })
            .await
            {
                self.base = Some(base);
                self.resubscribe();
            }
        }
        self.guards.record_success(trigger);
        // A resumed view starts at the new boundary, with the counts afresh: the state
        // is written after it only when it is not that (a streak of quick refills).
        self.save_guards(&ctxd_core::compact::CompactGuards::default()).await;
        let post_tokens = self.next_tokens();
        let transcript_path = self.transcript.as_ref().map(|t| t.path().display().to_string()).unwrap_or_default();
        let span = tracing::info_span!("post_compact", session = %self.id, trigger = ?trigger);
        tokio::spawn(
            compaction::after_install(
                self.setup.settings.clone(),
                self.id.clone(),
                transcript_path,
                trigger,
                prepared.summary.clone(),
            )
            .instrument(span),
        );
        Ok(CompactAnswer {
            boundary: post.boundary_uuid,
            trigger,
            pre_tokens,
            post_tokens,
            summary: prepared.summary,
            summarizer: prepared.summarizer,
            fidelity_appended: prepared.fidelity.missing_before.len(),
            problems: prepared.problems,
            origin: ctxd_proto::CompactOrigin::Requested,
        })
    }

    /// Tokens of the request the host's last blocks would make of the view after an
    /// install: the kept messages (before the boundary, where the view keeps them) and
    /// the install's records. `None` before any request was assembled (the host's
    /// tools are not known). Costs one assembly of the new view, a few records.
    fn installed_request_tokens(&self, kept: &[Record], installed: &[Record]) -> Option<u64> {
        let host = self.host_request.as_ref()?;
        let records: Vec<Record> = kept.iter().chain(installed).cloned().collect();
        let base = ctxd_core::view::BaseContext {
            system_context: self.base.as_ref().and_then(|b| b.system_context().map(|s| s.to_string())),
            user_context: self.base.as_ref().and_then(|b| b.user_context().map(|s| s.to_string())),
            attachments: Vec::new(),
        };
        let now_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let blocks = host.blocks();
        let input = ctxd_core::view::AssembleInput {
            records: &records,
            system: blocks.system,
            tools: blocks.tools,
            model: &self.setup.model,
            max_tokens: blocks.max_tokens,
            thinking: blocks.thinking,
            fork: None,
            base: &base,
            now_ms,
            state: &ctxd_core::view::PipelineState::default(),
            config: &ctxd_core::view::PipelineConfig::default(),
            tool_results_dir: &self.tool_results_dir(),
            compact: ctxd_core::view::CompactCheck::default(),
        };
        Some(ctxd_core::view::assemble(&input).estimate_tokens)
    }

    /// When an idle compaction would be due, if it could be.
    pub(super) fn idle_deadline(&self) -> Option<tokio::time::Instant> {
        let after = self.setup.idle_after?;
        let worth = !self.idle_done && self.compaction.is_none() && self.thresholds.compact_enabled;
        worth.then(|| self.last_activity + after)
    }

    /// The user is away: compact in the background while the prompt cache is still
    /// warm, if the session is big enough to be worth it.
    pub(super) async fn idle(&mut self) {
        self.idle_done = true;
        let tokens = self.next_tokens();
        if let Some(stopped) = &self.guards.stopped {
            tracing::info!(reason = %stopped.message(), "session idle; automatic compaction is stopped, so no idle compaction");
            return;
        }
        if tokens >= self.setup.idle_floor && self.compaction.is_none() {
            tracing::info!(tokens, "session idle; compacting in the background");
            self.start_compaction(Trigger::Idle, None, None, None);
        }
    }

    /// After appends: compact when the threshold is reached (installing a summary
    /// prepared ahead if there is a usable one), or start preparing one when the session
    /// is close to it.
    pub(super) async fn maybe_auto_compact(&mut self) {
        let running_ahead = self.compaction.as_ref().map(|r| r.ahead);
        if running_ahead == Some(false) {
            return;
        }
        let tokens = self.tokens_after_valves(self.next_tokens());
        self.auto_compact_guarded(tokens, running_ahead.is_none()).await;
    }

    /// `tokens` less what the next request's microcompact will clear that the tally
    /// cannot know of yet: after a gap longer than the prompt cache lives, the request
    /// clears old tool results (seen: 27,674 tokens, a 67,294-token session assembled
    /// at 39,232), and a compaction started on the tally's figure would be needless.
    /// The pipeline runs only at or over the threshold, where the compaction it
    /// prevents would run it anyway for its parent; below, `tokens` as given.
    fn tokens_after_valves(&mut self, tokens: u64) -> u64 {
        if tokens < self.thresholds.threshold || !self.thresholds.auto_compact_enabled {
            return tokens;
        }
        // Without the host's tools the pipeline turns every tool call into text, and
        // finds no result to clear: no request was assembled yet, the figure stands.
        let Some(host) = self.host_request.clone() else {
            return tokens;
        };
        let assembled = self.run_pipeline(host.blocks(), None);
        let cleared: u64 = assembled
            .applied
            .iter()
            .filter(|a| a.stage == ctxd_core::view::Stage::Microcompact)
            .map(|a| a.tokens_freed)
            .sum();
        if cleared > 0 {
            tracing::info!(tokens, cleared, "the next request clears old tool results (cold cache); counted first");
        }
        tokens.saturating_sub(cleared)
    }

    /// Automatic compaction at `tokens`, if the guards allow it; below the threshold,
    /// starts preparing a summary ahead when `may_prepare`.
    pub(super) async fn auto_compact_guarded(&mut self, tokens: u64, may_prepare: bool) {
        let saved = self.guards.clone();
        let decision = self.guards.check_auto(tokens, &self.thresholds, self.fixed_prefix());
        self.save_guards(&saved).await;
        match decision {
            AutoDecision::Compact => self.auto_compact_now().await,
            AutoDecision::Stopped { message, notify: true, .. }
            | AutoDecision::CannotHelp { message, notify: true, .. } => {
                self.notifier.compact_failed(&self.id, &message).await;
            }
            AutoDecision::NotDue if may_prepare => self.maybe_prepare_ahead(tokens),
            _ => {}
        }
    }

    /// The threshold is reached: a summary being prepared ahead becomes this compaction;
    /// one already prepared is installed with what was appended since, if it still
    /// leaves room; otherwise a compaction starts.
    pub(super) async fn auto_compact_now(&mut self) {
        if let Some(running) = &mut self.compaction {
            if running.ahead {
                tracing::info!("threshold reached while a summary was being prepared ahead; installing it when ready");
                running.ahead = false;
                running.trigger = Trigger::Auto;
            }
            return;
        }
        if let Some(outcome) = self.install_ahead().await {
            self.finish_compaction(Trigger::Precomputed, outcome, None, None).await;
            return;
        }
        self.start_compaction(Trigger::Auto, None, None, None);
    }

    /// Installs the summary prepared ahead, if there is one and it still leaves room
    /// (`None` otherwise: the caller compacts normally).
    pub(super) async fn install_ahead(&mut self) -> Option<Result<CompactAnswer, SessionError>> {
        let ahead = self.ahead.take()?;
        let rate = self.tally.calibration;
        let appended_since: u64 = self
            .view
            .get(ahead.snapshot_len..)
            .unwrap_or_default()
            .iter()
            .map(|r| rate.tokens(super::load::carried_bytes(r)))
            .sum();
        let same_view = ahead.view_generation == self.view_generation;
        match ctxd_core::compact::ahead::check_prepared(
            ahead.prepared.estimated_post_tokens,
            appended_since,
            same_view,
            &self.thresholds,
        ) {
            Ok(estimate) => {
                tracing::info!(estimate, appended_since, "installing the summary prepared ahead");
                let started = Instant::now();
                let pre_tokens = self.next_tokens();
                // Boxed: installing appends, and appending may compact.
                Some(Box::pin(self.install(Trigger::Precomputed, started, pre_tokens, ahead.prepared)).await)
            }
            Err(stale) => {
                tracing::info!(?stale, "summary prepared ahead not used; compacting now");
                None
            }
        }
    }

    /// Starts preparing a summary in the background once the session passes the
    /// precompute start, unless one is ready or failed on this view.
    pub(super) fn maybe_prepare_ahead(&mut self, tokens: u64) {
        let ready = self.ahead.as_ref().is_some_and(|a| a.view_generation == self.view_generation);
        let failed = self.ahead_failed == Some(self.view_generation);
        if ready || failed || !self.thresholds.compact_enabled || !self.guards.allows_automatic() {
            return;
        }
        if !ctxd_core::compact::ahead::should_prepare(tokens, &self.thresholds) {
            return;
        }
        tracing::info!(tokens, "preparing a summary ahead");
        self.start_compaction(Trigger::Precomputed, None, None, None);
        if let Some(running) = &mut self.compaction {
            running.ahead = true;
        }
    }

    /// Writes the guard state to the transcript when its lasting part changed from
    /// `saved` (a stop, a failure, a reset), so a restart resumes it. The record is
    /// ctxd's own bookkeeping: writing it starts no threshold check (a failed automatic
    /// compaction is not retried at once because its failure was recorded). A failed
    /// write is logged: the state in memory still holds for this run.
    pub(super) async fn save_guards(&mut self, saved: &ctxd_core::compact::CompactGuards) {
        if !self.guards.lasting_change(saved) {
            return;
        }
        // No uuid: it is no message, and the records that take their common fields and
        // parent from the newest record with one (an install, an undo) must not find it.
        let mut object = self.guards.to_record();
        object.insert("timestamp".into(), now_rfc3339().into());
        let record = match Record::from_object(&object) {
            Ok(record) => record,
            Err(e) => {
                tracing::error!(error = %e, "the compaction guards could not be written");
                return;
            }
        };
        let checking = std::mem::replace(&mut self.installing, true);
        // Boxed: an append may compact, and a compaction's end writes the guards.
        let written = Box::pin(self.commit_own(vec![record])).await;
        self.installing = checking;
        if let Err(e) = written {
            tracing::error!(error = %e, "the compaction guards could not be written; a restart would reset them");
        }
    }

    /// Stops preparing a summary ahead (another compaction or an undo replaces it).
    pub(super) fn drop_precompute(&mut self) {
        if let Some(running) = self.compaction.take_if(|r| r.ahead) {
            if let Some(task) = running.task {
                task.abort();
            }
            tracing::info!("preparing a summary ahead stopped");
        }
    }
}

/// The end of a compaction's `$/progress`.
fn compaction_end_message(outcome: &Result<CompactAnswer, SessionError>) -> String {
    match outcome {
        Ok(answer) => format!("compacted {} → {} tokens", answer.pre_tokens, answer.post_tokens),
        Err(e) => format!("not compacted: {e}"),
    }
}
