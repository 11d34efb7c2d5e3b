//! The compaction lifecycle inside the actor: what `ctxd_core::compact::lifecycle`
//! decides (when a compaction starts, joins or queues, how its end is told, what follows
//! an install) carried out here. This file does the I/O of each [`Effect`]: the snapshot
//! handed to the driver ([`super::super::compaction`]) and its task, the install's
//! records, the guard state, the replies, notifications and log lines.
//!
//! Effects are carried out in order by one loop ([`Session::carry_out`]); an effect that
//! ends in another transition (an install, the threshold check) puts that transition's
//! effects first. Nothing carried out here calls the loop again, so it needs no boxed
//! re-entry: installs and guard records are written with `write_own`, which checks no
//! threshold.

use std::collections::VecDeque;
use std::time::Instant;

use ctxd_core::compact::lifecycle::{self, Effect, Failure, Finished, Host, Install, Lifecycle, Note, Now, Origin};
use ctxd_core::compact::{CompactGuards, InstallInput, SplitDirection, Trigger, build_post_compact, common_fields};
use ctxd_core::record::Record;
use tokio::sync::oneshot;
use tracing::Instrument;

use super::{AssembleAnswer, AssembleRequest, Command, CompactAnswer, Session, now_rfc3339};
use crate::session::SessionError;
use crate::session::compaction::{self, CompactFailure, Job, Prepared};

/// The actor's side of the lifecycle's types.
pub(super) enum Actor {}

/// Who asked for a compaction: where its answer goes, and its `$/progress`.
pub(super) struct Requester {
    pub(super) reply: oneshot::Sender<Result<CompactAnswer, SessionError>>,
    pub(super) progress: Option<crate::session::Progress>,
}

impl Host for Actor {
    type Requester = Requester;
    type Prepared = Prepared;
    type Answer = CompactAnswer;
    type Error = SessionError;

    fn gone(requester: &Requester) -> bool {
        requester.reply.is_closed()
    }

    fn estimated_post_tokens(prepared: &Prepared) -> u64 {
        prepared.estimated_post_tokens
    }

    fn error(failure: Failure) -> SessionError {
        match failure {
            Failure::Cancelled => SessionError::Cancelled("the compaction was cancelled; nothing was installed".into()),
            Failure::ViewReplaced => SessionError::Busy(
                "the session was compacted by another path meanwhile; this compaction was dropped".into(),
            ),
            Failure::AppendedDuringPartial => SessionError::Busy(
                "records were appended during the partial compaction; nothing was installed, try again".into(),
            ),
            Failure::Disabled => SessionError::CompactFailed("compaction is turned off (DISABLE_COMPACT)".into()),
            Failure::NoSuchRecord(uuid) => {
                SessionError::InvalidParams(format!("no record {uuid:?} in the session's current view"))
            }
        }
    }
}

type AssembleReply = oneshot::Sender<Result<AssembleAnswer, SessionError>>;

/// The session's compaction: the core's lifecycle, the job it runs, who waits for it,
/// and when the session was last active (for idle compaction).
pub(super) struct Compaction {
    lifecycle: Lifecycle<Actor>,
    /// The background job started last.
    job: Option<JobHandle>,
    /// Assemble requests waiting for a compaction (the session was at the blocked level).
    waiting: Vec<(AssembleRequest, AssembleReply)>,
    /// Last append or request, for idle compaction.
    last_activity: tokio::time::Instant,
    /// An idle compaction already ran since the last activity.
    idle_done: bool,
}

/// A compaction's background task, as the actor holds it.
struct JobHandle {
    generation: u64,
    started: Instant,
    /// Aborting it drops the provider's HTTP request.
    task: tokio::task::AbortHandle,
    /// Writing the ledger entries the index lacked at the start; done before installing.
    ledger_saved: Option<tokio::task::JoinHandle<()>>,
}

impl Compaction {
    pub(super) fn new() -> Compaction {
        Compaction {
            lifecycle: Lifecycle::default(),
            job: None,
            waiting: Vec::new(),
            last_activity: tokio::time::Instant::now(),
            idle_done: false,
        }
    }

    /// The session was used (an append or a request): the idle timer starts again.
    pub(super) fn active(&mut self) {
        self.last_activity = tokio::time::Instant::now();
        self.idle_done = false;
    }

    /// Shown as compacting (not a summary prepared ahead).
    pub(super) fn compacting(&self) -> bool {
        self.lifecycle.compacting()
    }

    /// Estimated tokens after installing the summary prepared ahead, if one waits.
    pub(super) fn prepared_ahead(&self) -> Option<u64> {
        self.lifecycle.prepared_ahead().map(|p| p.estimated_post_tokens)
    }

    pub(super) fn observe(&mut self, record: &Record) {
        self.lifecycle.observe(record);
    }

    pub(super) fn restore_guards(&mut self, guards: CompactGuards) {
        self.lifecycle.restore_guards(guards);
    }

    /// Stops job `generation`'s task, if it is the one held.
    fn abort(&mut self, generation: u64) {
        if let Some(job) = self.job.take_if(|job| job.generation == generation) {
            job.task.abort();
        }
    }
}

impl Session {
    /// The lifecycle, and the facts it decides on, borrowed apart.
    fn lifecycle(&mut self) -> (&mut Lifecycle<Actor>, Now<'_>) {
        let (tokens, fixed_prefix) = (self.next_tokens(), self.fixed_prefix());
        let now = Now {
            view: &self.view.records,
            view_generation: self.view.generation,
            tokens,
            fixed_prefix,
            thresholds: &self.setup.thresholds,
            rate: self.view.tally.calibration,
        };
        (&mut self.compaction.lifecycle, now)
    }

    /// `ctx/compact`: compact now, join the compaction running, or queue behind it.
    pub(super) async fn compact_requested(
        &mut self,
        trigger: Trigger,
        instructions: Option<String>,
        partial: Option<(SplitDirection, String)>,
        requester: Requester,
    ) {
        let request = lifecycle::Request { trigger, instructions, partial, requester };
        let (lifecycle, now) = self.lifecycle();
        let effects = lifecycle.request(request, Origin::Requested, &now);
        self.carry_out(effects).await;
    }

    /// The background part of a compaction finished: installed, kept for the threshold,
    /// or its failure told; then requests held at the blocked level go.
    pub(super) async fn compaction_done(&mut self, generation: u64, result: Result<Prepared, CompactFailure>) {
        // The index must hold every read before the new boundary before the boundary is
        // written; the bulk went off the actor when the compaction started.
        let saving = self.compaction.job.as_mut().filter(|job| job.generation == generation);
        if let Some(saved) = saving.and_then(|job| job.ledger_saved.take()) {
            let _ = saved.await;
        }
        let result = result.map_err(|failure| SessionError::CompactFailed(failure.to_string()));
        let (lifecycle, now) = self.lifecycle();
        let effects = lifecycle.done(generation, result, &now);
        self.carry_out(effects).await;
        self.answer_waiting().await;
    }

    /// The client gave up on a compaction it asked for (`$/cancelRequest`, or it went
    /// away): stopped if everyone who asked for it is gone. Requests held at the blocked
    /// level for it go then: no `CompactionDone` of it will come to let them go.
    pub(super) async fn cancel_compaction(&mut self) {
        let effects = self.compaction.lifecycle.cancel();
        self.carry_out(effects).await;
        self.answer_waiting().await;
    }

    /// `ctx/assemble`, unless it must wait for a compaction: a request at the blocked
    /// level would be refused (an imported session, a burst of appends), so the session
    /// compacts first and answers from the new view.
    pub(super) async fn assemble_or_wait(&mut self, request: AssembleRequest, reply: AssembleReply) {
        let thresholds = self.setup.thresholds;
        if thresholds.enforce_window && self.next_tokens() >= thresholds.blocked {
            self.check_threshold().await;
        }
        if self.assemble_allowed() {
            let answer = self.assemble(request, true).await;
            let _ = reply.send(answer);
        } else {
            tracing::info!("the request is at the blocked level while a compaction runs; it waits for the compaction");
            self.compaction.waiting.push((request, reply));
        }
    }

    fn assemble_allowed(&self) -> bool {
        let (tokens, total) = (self.next_tokens(), self.view.tally.total());
        self.compaction.lifecycle.assemble_allowed(tokens, total, &self.setup.thresholds)
    }

    /// Requests held at the blocked level go once no compaction keeps them waiting, from
    /// the new view.
    async fn answer_waiting(&mut self) {
        if self.compaction.waiting.is_empty() || !self.assemble_allowed() {
            return;
        }
        for (request, reply) in std::mem::take(&mut self.compaction.waiting) {
            let answer = self.assemble(request, false).await;
            let _ = reply.send(answer);
        }
    }

    /// After appends and settings changes: the threshold check.
    pub(super) async fn check_threshold(&mut self) {
        self.carry_out(vec![Effect::CheckThreshold]).await;
    }

    /// The request pipeline found the request at `tokens` over the threshold.
    pub(super) async fn pipeline_due(&mut self, tokens: u64) {
        let (lifecycle, now) = self.lifecycle();
        let effects = lifecycle.pipeline_due(tokens, &now);
        self.carry_out(effects).await;
    }

    /// Before an undo: a summary being prepared ahead stops; `false` while a compaction
    /// runs.
    pub(super) async fn before_undo(&mut self) -> bool {
        let (effects, allowed) = self.compaction.lifecycle.before_undo();
        self.carry_out(effects).await;
        allowed
    }

    /// When an idle compaction would be due, if it could be.
    pub(super) fn idle_deadline(&self) -> Option<tokio::time::Instant> {
        let after = self.setup.idle_after?;
        let worth = !self.compaction.idle_done && self.compaction.lifecycle.idle_possible(&self.setup.thresholds);
        worth.then(|| self.compaction.last_activity + after)
    }

    /// The user is away: compact in the background while the prompt cache is still
    /// warm, if the session is big enough to be worth it.
    pub(super) async fn idle(&mut self) {
        self.compaction.idle_done = true;
        let floor = self.setup.idle_floor;
        let (lifecycle, now) = self.lifecycle();
        let effects = lifecycle.idle(floor, &now);
        self.carry_out(effects).await;
    }

    /// Carries out `effects` in order; those an effect leads to come before the rest.
    async fn carry_out(&mut self, effects: Vec<Effect<Actor>>) {
        let mut queue = VecDeque::from(effects);
        while let Some(effect) = queue.pop_front() {
            let next = match effect {
                Effect::Start(start) => {
                    self.start_job(start);
                    Vec::new()
                }
                Effect::Abort { generation } => {
                    self.compaction.abort(generation);
                    Vec::new()
                }
                Effect::Install(install) => {
                    let outcome = self.install(install).await;
                    let (lifecycle, now) = self.lifecycle();
                    lifecycle.installed(outcome, &now)
                }
                Effect::SaveGuards => {
                    self.save_guards().await;
                    Vec::new()
                }
                Effect::Reply { to, outcome, origin } => {
                    let outcome = outcome.map(|answer| CompactAnswer { origin, ..answer });
                    if let Some(progress) = &to.progress {
                        progress.end(compaction_end_message(&outcome)).await;
                    }
                    let _ = to.reply.send(outcome);
                    Vec::new()
                }
                Effect::Refuse { to, error } => {
                    let _ = to.reply.send(Err(error));
                    Vec::new()
                }
                Effect::Finished(finished) => {
                    self.finished(finished).await;
                    Vec::new()
                }
                Effect::Abandoned { requester } => {
                    if let Some(progress) = &requester.progress {
                        progress.end("cancelled; nothing was installed".to_owned()).await;
                    }
                    Vec::new()
                }
                Effect::CompactFailed(message) => {
                    self.notifier.compact_failed(&self.id, &message).await;
                    Vec::new()
                }
                Effect::UsageChanged => {
                    let usage = self.usage();
                    self.usage_changed(usage).await;
                    Vec::new()
                }
                Effect::UsageNow => {
                    self.push_usage_now().await;
                    Vec::new()
                }
                Effect::CheckThreshold if self.compaction.lifecycle.checks_threshold() => {
                    let tokens = self.tokens_after_valves(self.next_tokens());
                    let (lifecycle, now) = self.lifecycle();
                    lifecycle.threshold(tokens, &now)
                }
                Effect::CheckThreshold => Vec::new(),
                Effect::Note(note) => {
                    log(note);
                    Vec::new()
                }
            };
            for effect in next.into_iter().rev() {
                queue.push_front(effect);
            }
        }
    }

    /// Takes a snapshot and runs the slow part of a compaction in the background.
    fn start_job(&mut self, start: lifecycle::Start) {
        let lifecycle::Start { generation, trigger, focus, partial, pre_tokens, ahead: _ } = start;
        let progress = self.compaction.lifecycle.requester(generation).and_then(|r| r.progress.clone());
        let view = &self.view.records;
        // A whole-view compaction forks the newest request the model answered, byte for
        // byte (its one-time notes and breakpoints included), so the fork reads all of it
        // from the provider's cache: the host's `/compact` right after a turn as much as
        // ctxd's own. A request built now would differ from it where notes were given
        // once, and read only up to there. Only when everything appended since is in
        // the tail kept verbatim after the summary: the summary is written from the part
        // before that tail, which that request shows whole. Not after "prompt is too
        // long": that request is the one refused.
        let answered = (partial.is_none() && trigger != Trigger::Reactive)
            .then(|| self.requests.answered_parent(view, self.view.generation))
            .flatten()
            .filter(|p| {
                let from = ctxd_core::compact::kept_tail_start(view).unwrap_or(view.len());
                let kept: u64 = view[from..].iter().map(ctxd_core::compact::carried_tokens).sum();
                from <= p.view_len && ctxd_core::compact::keep_tail(kept, self.setup.thresholds.threshold)
            })
            .map(|p| p.request.to_value());
        // Otherwise the request the host would be sent now, to fork; a partial compaction
        // summarizes only the side it replaces, which no host request ever was.
        let (parent, host_parent) = match (partial, self.requests.host()) {
            (None, Some(_)) if answered.is_some() => (answered.unwrap_or_default(), true),
            (None, Some(host)) => (self.run_pipeline(host.blocks(), None).request.to_value(), true),
            (None, None) => (self.parent_request(&self.view.records), false),
            (Some((SplitDirection::UpTo, split)), _) => (self.parent_request(&self.view.records[..split]), false),
            (Some((SplitDirection::From, split)), _) => (self.parent_request(&self.view.records[split..]), false),
        };
        let job = Job {
            session_id: self.id.clone(),
            trigger,
            focus,
            records: self.view.records.clone(),
            ledger: self.context.reads.ledger().newest_first().into_iter().cloned().collect(),
            pre_tokens,
            threshold: self.setup.thresholds.threshold,
            fixed_prefix: self.fixed_prefix(),
            settings: self.setup.settings.clone(),
            transcript_path: self.transcript.as_ref().map(|t| t.path().display().to_string()).unwrap_or_default(),
            cwd: self.setup.cwd.clone(),
            model: self.setup.model.clone(),
            parent: Some(parent),
            host_parent,
            partial,
            skills: self.view.invoked.skills.clone(),
            plan_path: self.view.invoked.plan_path.clone(),
            progress,
            env: self.setup.process.clone(),
        };
        tracing::info!(?trigger, pre_tokens, records = job.records.len(), "compaction started");
        let ledger_saved = Some(self.save_ledger());
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
        let handle = JobHandle { generation, started: Instant::now(), task: task.abort_handle(), ledger_saved };
        self.compaction.job = Some(handle);
    }

    /// Appends the post-compact records in one batch (one sync), keeping every record
    /// appended since the snapshot after the summary, then reloads the base context.
    async fn install(&mut self, install: Install<Prepared>) -> Result<CompactAnswer, SessionError> {
        let Install { trigger, prepared, pre_tokens, generation } = install;
        let job = generation.and_then(|generation| self.compaction.job.take_if(|job| job.generation == generation));
        let started = job.map_or_else(Instant::now, |job| job.started);
        let view = &self.view.records;
        // The split was chosen on the snapshot; a tool result appended since may answer
        // a call on the summarized side (the snapshot ended mid-round). Keep that round
        // too rather than refuse the install: the call is then both summarized and kept.
        let kept_from = ctxd_core::compact::safe_split(view, prepared.kept_from);
        if kept_from != prepared.kept_from {
            tracing::info!(
                from = prepared.kept_from,
                to = kept_from,
                "a result appended during the compaction answers a summarized call; its round is kept"
            );
        }
        // A branch the host rewound away from meanwhile is not kept: after the summary it
        // would be back in the view for good.
        let kept = ctxd_core::compact::kept_tail(view, kept_from);
        let kept_before: Vec<Record> =
            prepared.kept_before.and_then(|n| view.get(..n)).map(<[Record]>::to_vec).unwrap_or_default();
        let last = view.iter().rev().find(|r| r.uuid().is_some());
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
            tokens_per_kib: Some(self.view.tally.calibration.tokens_per_kib),
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
        self.write_own(post.records).await?;
        // Instructions come back from disk, not from what the summary kept.
        self.context.reads.reloaded();
        if let Some(mut base) = self.context.base.take() {
            let services = self.setup.services.clone();
            if let Ok(base) = tokio::task::spawn_blocking(move || {
                base.reload(&services.memory_cache, &services.fs);
                base
            })
            .await
            {
                self.context.base = Some(base);
                self.resubscribe();
            }
        }
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
            origin: Origin::Requested,
        })
    }

    /// Tokens of the request the host's last blocks would make of the view after an
    /// install: the kept messages (before the boundary, where the view keeps them) and
    /// the install's records. `None` before any request was assembled (the host's
    /// tools are not known). Costs one assembly of the new view, a few records.
    fn installed_request_tokens(&self, kept: &[Record], installed: &[Record]) -> Option<u64> {
        let host = self.requests.host()?;
        let records: Vec<Record> = kept.iter().chain(installed).cloned().collect();
        let base = self.base_for_pipeline();
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

    /// Tells everyone how a compaction ended: its `$/progress`, `ctx/compacted` or
    /// `ctx/compactFailed`, the requester.
    async fn finished(&mut self, finished: Finished<Actor>) {
        let Finished { trigger, outcome, origin, requester, compact_failed } = finished;
        let outcome = outcome.map(|answer| CompactAnswer { origin, ..answer });
        if let Some(progress) = requester.as_ref().and_then(|r| r.progress.as_ref()) {
            progress.end(compaction_end_message(&outcome)).await;
        }
        match &outcome {
            Ok(answer) => {
                tracing::info!(?trigger, pre = answer.pre_tokens, post = answer.post_tokens, "compaction installed");
                self.notifier.compacted(&self.id, trigger, answer.pre_tokens, answer.post_tokens).await;
            }
            Err(e) => tracing::warn!(?trigger, error = %e, "compaction failed"),
        }
        if let Some(message) = compact_failed {
            self.notifier.compact_failed(&self.id, &message).await;
        }
        if let Some(requester) = requester {
            let _ = requester.reply.send(outcome);
        }
    }

    /// `tokens` less what the next request's microcompact will clear that the tally
    /// cannot know of yet: after a gap longer than the prompt cache lives, the request
    /// clears old tool results (seen: 27,674 tokens, a 67,294-token session assembled
    /// at 39,232), and a compaction started on the tally's figure would be needless.
    /// The pipeline runs only at or over the threshold, where the compaction it
    /// prevents would run it anyway for its parent; below, `tokens` as given.
    fn tokens_after_valves(&mut self, tokens: u64) -> u64 {
        let thresholds = self.setup.thresholds;
        if tokens < thresholds.threshold || !thresholds.auto_compact_enabled {
            return tokens;
        }
        // Without the host's tools the pipeline turns every tool call into text, and
        // finds no result to clear: no request was assembled yet, the figure stands.
        let Some(host) = self.requests.host() else {
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

    /// Writes the guard state to the transcript (its lasting part changed: a stop, a
    /// failure, a reset), so a restart resumes it. The record is ctxd's own bookkeeping:
    /// writing it starts no threshold check (a failed automatic compaction is not
    /// retried at once because its failure was recorded). A failed write is logged: the
    /// state in memory still holds for this run.
    async fn save_guards(&mut self) {
        // No uuid: it is no message, and the records that take their common fields and
        // parent from the newest record with one (an install, an undo) must not find it.
        let mut object = self.compaction.lifecycle.guards().to_record();
        object.insert("timestamp".into(), now_rfc3339().into());
        let record = match Record::from_object(&object) {
            Ok(record) => record,
            Err(e) => {
                tracing::error!(error = %e, "the compaction guards could not be written");
                return;
            }
        };
        if let Err(e) = self.write_own(vec![record]).await {
            tracing::error!(error = %e, "the compaction guards could not be written; a restart would reset them");
        }
    }
}

/// Says in the log what the lifecycle noted.
fn log(note: Note<SessionError>) {
    match note {
        Note::Joined { trigger } => {
            tracing::info!(?trigger, "a compaction is running; the request waits for its result");
        }
        Note::Queued { trigger } => {
            tracing::info!(?trigger, "a compaction is running; the request's own runs after it");
        }
        Note::PreparingAhead { tokens } => tracing::info!(tokens, "preparing a summary ahead"),
        Note::PreparingStopped => tracing::info!("preparing a summary ahead stopped"),
        Note::AheadReady { estimated_post } => {
            tracing::info!(estimated_post, "summary prepared ahead of the threshold");
        }
        Note::AheadDropped => tracing::info!("summary prepared ahead dropped: the view changed meanwhile"),
        Note::AheadFailed(failure) => {
            tracing::info!(%failure, "preparing a summary ahead failed; the threshold will compact normally");
        }
        Note::AheadBecomesAuto => {
            tracing::info!("threshold reached while a summary was being prepared ahead; installing it when ready");
        }
        Note::InstallingAhead { estimate, appended_since } => {
            tracing::info!(estimate, appended_since, "installing the summary prepared ahead");
        }
        Note::AheadNotUsed(stale) => tracing::info!(?stale, "summary prepared ahead not used; compacting now"),
        Note::CancelledByClient { trigger } => {
            tracing::info!(?trigger, "compaction cancelled by the client; nothing installed");
        }
        Note::IdleButStopped { reason } => {
            tracing::info!(%reason, "session idle; automatic compaction is stopped, so no idle compaction");
        }
        Note::IdleCompacting { tokens } => tracing::info!(tokens, "session idle; compacting in the background"),
        Note::FollowUp { tokens, step } => {
            tracing::info!(tokens, step, "the compaction left the session above its threshold; compacting again");
        }
        Note::StillAbove { tokens, message } => tracing::warn!(tokens, "{message}"),
    }
}

/// The end of a compaction's `$/progress`.
fn compaction_end_message(outcome: &Result<CompactAnswer, SessionError>) -> String {
    match outcome {
        Ok(answer) => format!("compacted {} → {} tokens", answer.pre_tokens, answer.post_tokens),
        Err(e) => format!("not compacted: {e}"),
    }
}
