//! The compaction lifecycle of one session, as a state machine.
//!
//! A session compacts in phases: nothing running ([`Phase::Idle`]), a summary being
//! prepared ahead of the threshold ([`Phase::PreparingAhead`]), one prepared and waiting
//! for the threshold ([`Phase::Ready`]), a compaction running ([`Phase::Running`]) and
//! its records being written ([`Phase::Installing`]). Requests join the compaction that
//! runs or queue behind it, the guards decide what may start on its own, and every end
//! is told to whoever waits for it.
//!
//! Why a machine of its own: those decisions used to be spread over a dozen fields of the
//! session actor and taken in the middle of its I/O, so that no one could say which
//! states were possible or test an outcome without a runtime. Here each event is one
//! transition ([`Lifecycle::request`], [`Lifecycle::done`], [`Lifecycle::installed`],
//! [`Lifecycle::cancel`], [`Lifecycle::threshold`], [`Lifecycle::idle`]) over plain
//! data and the facts the caller hands in ([`Now`]); it returns the [`Effect`]s the
//! session actor then carries out in order: start or stop the background job, install a
//! summary, write the guard state, reply, notify, log. An effect that needs the actor
//! to look again ([`Effect::Install`], [`Effect::CheckThreshold`]) ends in another
//! transition, whose effects the actor carries out before the rest, so no transition
//! ever calls the actor back.
//!
//! The machine holds what a compaction is (trigger, view it was taken on, who waits)
//! and leaves the I/O handles (the task, its start time, reply channels) to the actor:
//! a requester is an opaque [`Host::Requester`] it only moves and asks
//! [`Host::gone`] about.

use std::collections::VecDeque;
use std::fmt::Display;

use super::ahead::{Stale, check_prepared, should_prepare};
use super::guards::{AfterInstall, AutoDecision, CompactGuards};
use super::{SplitDirection, Trigger, partial_plan};
use crate::budget::Thresholds;
use crate::record::{Kind, Record};
use crate::tally::Calibration;

/// The types of the session the machine runs for.
pub trait Host {
    /// Whoever asked for a compaction and waits for its answer.
    type Requester;
    /// A summary the background job prepared, ready to install.
    type Prepared;
    /// What an installed compaction answers.
    type Answer: Clone;
    type Error: Clone + Display;
    /// The requester stopped waiting (its client cancelled or went away).
    fn gone(requester: &Self::Requester) -> bool;
    /// Tokens the session would hold right after installing `prepared`.
    fn estimated_post_tokens(prepared: &Self::Prepared) -> u64;
    /// The error a requester is answered with for `failure`.
    fn error(failure: Failure) -> Self::Error;
}

/// Why the machine itself ended a compaction without installing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Everyone who asked for it went away.
    Cancelled,
    /// A boundary or an undo replaced the view it was taken on.
    ViewReplaced,
    /// A partial compaction keeps records before its summary: records appended
    /// meanwhile would have no place.
    AppendedDuringPartial,
    /// Compaction is turned off (`DISABLE_COMPACT`).
    Disabled,
    /// A partial compaction names a record the view does not hold.
    NoSuchRecord(String),
}

/// Which compaction an answer reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The request's own.
    Requested,
    /// One that was running when the request came, with the same instructions.
    Joined,
    /// The request's own, run after the one before it.
    Queued,
}

/// A `ctx/compact` request: manual, reactive or partial.
pub struct Request<R> {
    pub trigger: Trigger,
    pub instructions: Option<String>,
    /// Around the record with this uuid: which side is summarized.
    pub partial: Option<(SplitDirection, String)>,
    pub requester: R,
}

/// The session as the caller sees it when a transition runs.
#[derive(Debug, Clone, Copy)]
pub struct Now<'a> {
    /// The view's records (from the boundary in force on).
    pub view: &'a [Record],
    /// Bumped at every boundary and undo: a summary of an older view is stale.
    pub view_generation: u64,
    /// Tokens the next request carries.
    pub tokens: u64,
    /// The part of them no compaction can remove (system prompt, tools, memory files).
    pub fixed_prefix: u64,
    pub thresholds: &'a Thresholds,
    /// The session's tokens per byte.
    pub rate: Calibration,
}

impl Now<'_> {
    /// Tokens of the records appended after the first `len`, as the tally counts them.
    fn tokens_since(&self, len: usize) -> u64 {
        let config = crate::view::BudgetConfig::default();
        let since = self.view.get(len..).unwrap_or_default();
        since.iter().map(|r| self.rate.tokens(crate::view::budget::carried_bytes(r, &config))).sum()
    }
}

/// The phase a session's compaction is in (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Idle,
    PreparingAhead,
    /// A summary prepared ahead waits for the threshold (and nothing runs).
    Ready,
    Running,
    Installing,
}

/// What the session actor does next, in order.
pub enum Effect<H: Host> {
    /// Take a snapshot of the view and start the background job.
    Start(Start),
    /// Stop job `generation`'s task: nothing of it is installed.
    Abort { generation: u64 },
    /// Write the summary's records, then call [`Lifecycle::installed`].
    Install(Install<H::Prepared>),
    /// Write [`Lifecycle::guards`] to the transcript: its lasting part changed.
    SaveGuards,
    /// Answer a requester that joined a compaction (its progress ends too).
    Reply { to: H::Requester, outcome: Result<H::Answer, H::Error>, origin: Origin },
    /// Answer a request that started nothing (no progress was begun for it).
    Refuse { to: H::Requester, error: H::Error },
    /// A compaction ended: end its requester's progress, say so (`ctx/compacted`, or
    /// `ctx/compactFailed` with `compact_failed`), answer its requester.
    Finished(Finished<H>),
    /// The requester of a compaction cancelled by its client: end its progress.
    Abandoned { requester: H::Requester },
    /// Send `ctx/compactFailed` with this message.
    CompactFailed(String),
    /// The usage may have changed: push it (at the usual rate).
    UsageChanged,
    /// Push the usage now.
    UsageNow,
    /// Count the next request's tokens as the threshold sees them and call
    /// [`Lifecycle::threshold`].
    CheckThreshold,
    /// Something the log should say.
    Note(Note<H::Error>),
}

/// [`Effect::Start`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub generation: u64,
    pub trigger: Trigger,
    pub focus: Option<String>,
    /// A partial compaction: which side of this index into the view is summarized.
    pub partial: Option<(SplitDirection, usize)>,
    pub pre_tokens: u64,
    /// Preparing a summary ahead of the threshold (not shown as compacting).
    pub ahead: bool,
}

/// [`Effect::Install`].
pub struct Install<P> {
    pub trigger: Trigger,
    pub prepared: P,
    pub pre_tokens: u64,
    /// The job that prepared it, if it just finished (not a summary prepared ahead).
    pub generation: Option<u64>,
}

/// [`Effect::Finished`].
pub struct Finished<H: Host> {
    pub trigger: Trigger,
    pub outcome: Result<H::Answer, H::Error>,
    pub origin: Origin,
    pub requester: Option<H::Requester>,
    /// The `ctx/compactFailed` message, when the failure is told that way.
    pub compact_failed: Option<String>,
}

/// [`Effect::Note`]: what happened, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note<E> {
    /// A request waits for the running compaction's result.
    Joined {
        trigger: Trigger,
    },
    /// A request with instructions of its own runs after the running compaction.
    Queued {
        trigger: Trigger,
    },
    PreparingAhead {
        tokens: u64,
    },
    PreparingStopped,
    AheadReady {
        estimated_post: u64,
    },
    AheadDropped,
    AheadFailed(E),
    /// The threshold came while a summary was prepared ahead: it becomes the compaction.
    AheadBecomesAuto,
    InstallingAhead {
        estimate: u64,
        appended_since: u64,
    },
    AheadNotUsed(Stale),
    CancelledByClient {
        trigger: Trigger,
    },
    IdleButStopped {
        reason: String,
    },
    IdleCompacting {
        tokens: u64,
    },
    FollowUp {
        tokens: u64,
        step: u32,
    },
    StillAbove {
        tokens: u64,
        message: String,
    },
}

/// A compaction's background job.
struct Job<R> {
    generation: u64,
    trigger: Trigger,
    pre_tokens: u64,
    /// The view's generation when it started: a new boundary makes it stale.
    view_generation: u64,
    /// Records in the view when it started.
    snapshot_len: usize,
    focus: Option<String>,
    origin: Origin,
    partial: Option<SplitDirection>,
    requester: Option<R>,
    /// Requests that came while it ran and wait for its result.
    joiners: Vec<R>,
}

impl<R> Job<R> {
    /// Whether everyone who asked for it is gone (an automatic one: never).
    fn abandoned<H: Host<Requester = R>>(&self) -> bool {
        self.requester.as_ref().is_some_and(H::gone) && self.joiners.iter().all(H::gone)
    }
}

/// Who a compaction being installed answers.
struct Ending<R> {
    trigger: Trigger,
    origin: Origin,
    requester: Option<R>,
    joiners: Vec<R>,
}

/// A summary prepared ahead, waiting for the threshold.
struct Ready<P> {
    prepared: P,
    /// The view it was prepared on; a boundary or an undo since makes it stale.
    view_generation: u64,
    /// Records of the view it covers; those appended since are kept after it.
    snapshot_len: usize,
}

enum State<R> {
    Idle,
    Preparing(Job<R>),
    Running(Job<R>),
    Installing(Ending<R>),
}

/// The compaction state of one session.
pub struct Lifecycle<H: Host> {
    state: State<H::Requester>,
    /// A summary prepared ahead. Kept while a manual or idle compaction runs: if that
    /// one fails, the threshold can still use it.
    ready: Option<Ready<H::Prepared>>,
    /// The view generation on which preparing ahead failed: not tried again on it.
    ahead_failed: Option<u64>,
    /// Requests with other instructions than the running compaction's (or partial
    /// ones): each runs once the one before it is done.
    queued: VecDeque<Request<H::Requester>>,
    generation: u64,
    guards: CompactGuards,
    /// `message.id` of the latest model response counted: the lines of one response
    /// are one turn.
    last_response: Option<Box<str>>,
}

impl<H: Host> Default for Lifecycle<H> {
    fn default() -> Self {
        Lifecycle {
            state: State::Idle,
            ready: None,
            ahead_failed: None,
            queued: VecDeque::new(),
            generation: 0,
            guards: CompactGuards::default(),
            last_response: None,
        }
    }
}

type Effects<H> = Vec<Effect<H>>;

impl<H: Host> Lifecycle<H> {
    pub fn phase(&self) -> Phase {
        match self.state {
            State::Idle if self.ready.is_some() => Phase::Ready,
            State::Idle => Phase::Idle,
            State::Preparing(_) => Phase::PreparingAhead,
            State::Running(_) => Phase::Running,
            State::Installing(_) => Phase::Installing,
        }
    }

    /// A compaction runs that the session is shown as compacting for (not a summary
    /// prepared ahead).
    pub fn compacting(&self) -> bool {
        matches!(self.state, State::Running(_))
    }

    /// The summary prepared ahead, if one waits.
    pub fn prepared_ahead(&self) -> Option<&H::Prepared> {
        self.ready.as_ref().map(|r| &r.prepared)
    }

    /// Who asked for job `generation`, while it runs.
    pub fn requester(&self, generation: u64) -> Option<&H::Requester> {
        match &self.state {
            State::Running(job) if job.generation == generation => job.requester.as_ref(),
            _ => None,
        }
    }

    pub fn guards(&self) -> &CompactGuards {
        &self.guards
    }

    /// The guard state read back from the view (on load, after an undo).
    pub fn restore_guards(&mut self, guards: CompactGuards) {
        self.guards = guards;
    }

    /// A record was stored: a new model response is a turn for the guards.
    pub fn observe(&mut self, record: &Record) {
        let head = record.head();
        if !is_model_response(record) || (head.message_id.is_some() && head.message_id == self.last_response) {
            return;
        }
        self.last_response = head.message_id.clone();
        self.guards.record_turn();
    }

    /// Whether `ctx/assemble` may be answered now at `tokens` (the next request) and
    /// `total` (the tally): not while a compaction (or a preparation ahead) runs and the
    /// request would be over the blocked level; it waits for the compacted view.
    pub fn assemble_allowed(&self, tokens: u64, total: u64, thresholds: &Thresholds) -> bool {
        let busy = !matches!(self.state, State::Idle);
        !(busy && (tokens >= thresholds.blocked || thresholds.rejects_request(total)))
    }

    /// Whether an idle compaction could start now.
    pub fn idle_possible(&self, thresholds: &Thresholds) -> bool {
        matches!(self.state, State::Idle) && thresholds.compact_enabled
    }

    /// Whether [`Lifecycle::threshold`] would look at the figure (nothing running but
    /// maybe a preparation ahead): the caller counts it only then.
    pub fn checks_threshold(&self) -> bool {
        matches!(self.state, State::Idle | State::Preparing(_))
    }

    /// `ctx/compact`: compact now, join the compaction running, or queue behind it.
    /// `origin` is what the answer reports when this request's own compaction runs.
    pub fn request(&mut self, request: Request<H::Requester>, origin: Origin, now: &Now<'_>) -> Effects<H> {
        let mut fx = Vec::new();
        self.request_into(request, origin, now, &mut fx);
        fx
    }

    fn request_into(&mut self, request: Request<H::Requester>, origin: Origin, now: &Now<'_>, fx: &mut Effects<H>) {
        self.stop_preparing(fx);
        let Request { trigger, instructions, partial, requester } = request;
        // The provider refused the request as too long: a summary prepared ahead
        // answers at once, with no model call before the host can retry.
        let requester =
            if trigger == Trigger::Reactive && matches!(self.state, State::Idle) && now.thresholds.compact_enabled {
                let Err(Some(requester)) = self.install_ready(Some(requester), now, fx) else { return };
                requester
            } else {
                requester
            };
        match &mut self.state {
            // One already runs (automatic, or another request's): with the same focus
            // the request waits for its result; with its own, it runs next.
            State::Running(job) if partial.is_none() && (instructions.is_none() || instructions == job.focus) => {
                fx.push(Effect::Note(Note::Joined { trigger }));
                job.joiners.push(requester);
            }
            State::Running(_) | State::Installing(_) => {
                fx.push(Effect::Note(Note::Queued { trigger }));
                self.queued.push_back(Request { trigger, instructions, partial, requester });
            }
            State::Idle | State::Preparing(_) if !now.thresholds.compact_enabled => {
                fx.push(Effect::Refuse { to: requester, error: H::error(Failure::Disabled) });
            }
            State::Idle | State::Preparing(_) => {
                if trigger == Trigger::Manual {
                    // A manual compaction resets the circuit breaker and lifts a stop,
                    // for good: a restart does not bring the stop back.
                    let saved = self.guards.clone();
                    self.guards.note_manual_compact();
                    self.save_guards_against(&saved, fx);
                }
                let split = match partial {
                    None => None,
                    Some((direction, uuid)) => match now.view.iter().position(|r| r.uuid() == Some(uuid.as_str())) {
                        // The split moves so no tool use is parted from its result.
                        Some(at) => {
                            let plan = partial_plan(now.view, at, direction);
                            let split = match direction {
                                SplitDirection::From => plan.summarize.start,
                                SplitDirection::UpTo => plan.keep.start,
                            };
                            Some((direction, split))
                        }
                        None => {
                            fx.push(Effect::Refuse { to: requester, error: H::error(Failure::NoSuchRecord(uuid)) });
                            return;
                        }
                    },
                };
                self.start(trigger, instructions, Some(requester), split, origin, false, now, fx);
            }
        }
    }

    /// The background part of job `generation` finished: a summary prepared ahead is
    /// kept (or dropped), a compaction installed, or its failure told.
    pub fn done(&mut self, generation: u64, result: Result<H::Prepared, H::Error>, now: &Now<'_>) -> Effects<H> {
        let mut fx = Vec::new();
        let job = match std::mem::replace(&mut self.state, State::Idle) {
            State::Preparing(job) if job.generation == generation => {
                match result {
                    Ok(prepared) if job.view_generation == now.view_generation => {
                        let estimated_post = H::estimated_post_tokens(&prepared);
                        fx.push(Effect::Note(Note::AheadReady { estimated_post }));
                        let (view_generation, snapshot_len) = (job.view_generation, job.snapshot_len);
                        self.ready = Some(Ready { prepared, view_generation, snapshot_len });
                    }
                    Ok(_) => fx.push(Effect::Note(Note::AheadDropped)),
                    Err(error) => {
                        // Nothing is lost: at the threshold a normal compaction runs.
                        fx.push(Effect::Note(Note::AheadFailed(error)));
                        self.ahead_failed = Some(job.view_generation);
                    }
                }
                // The threshold may have come meanwhile.
                fx.push(Effect::CheckThreshold);
                return fx;
            }
            State::Running(job) if job.generation == generation => job,
            other => {
                // An older job (stopped meanwhile): nothing of it counts.
                self.state = other;
                return fx;
            }
        };
        let failure = match result {
            _ if job.abandoned::<H>() => H::error(Failure::Cancelled),
            _ if job.view_generation != now.view_generation => H::error(Failure::ViewReplaced),
            // Kept before the summary, the records appended meanwhile would have no place.
            Ok(_) if job.partial == Some(SplitDirection::From) && now.view.len() != job.snapshot_len => {
                H::error(Failure::AppendedDuringPartial)
            }
            Ok(prepared) => {
                let install = Install {
                    trigger: job.trigger,
                    prepared,
                    pre_tokens: job.pre_tokens,
                    generation: Some(generation),
                };
                self.state = State::Installing(job.into_ending());
                fx.push(Effect::Install(install));
                return fx;
            }
            Err(error) => error,
        };
        self.finish(job.into_ending(), Err(failure), now, &mut fx);
        fx
    }

    /// The install [`Effect::Install`] asked for is written (or failed): everyone
    /// waiting hears of it, and what follows an install runs (a follow-up, the threshold
    /// check, the next queued request).
    pub fn installed(&mut self, outcome: Result<H::Answer, H::Error>, now: &Now<'_>) -> Effects<H> {
        let mut fx = Vec::new();
        let ending = match std::mem::replace(&mut self.state, State::Idle) {
            State::Installing(ending) => ending,
            other => {
                self.state = other;
                return fx;
            }
        };
        if outcome.is_ok() {
            self.guards.record_success(ending.trigger);
            // A resumed view starts at the new boundary, with the counts afresh: the
            // state is written after it only when it is not that (a streak of refills).
            self.save_guards_against(&CompactGuards::default(), &mut fx);
        }
        self.finish(ending, outcome, now, &mut fx);
        fx
    }

    /// The client gave up on the compaction it asked for: stopped, provider call
    /// included, with nothing installed, when everyone who asked for it is gone.
    pub fn cancel(&mut self) -> Effects<H> {
        if !matches!(&self.state, State::Running(job) if job.abandoned::<H>()) {
            return Vec::new();
        }
        let State::Running(job) = std::mem::replace(&mut self.state, State::Idle) else { return Vec::new() };
        let mut fx = vec![
            Effect::Abort { generation: job.generation },
            Effect::Note(Note::CancelledByClient { trigger: job.trigger }),
        ];
        fx.extend(job.requester.map(|requester| Effect::Abandoned { requester }));
        fx.push(Effect::UsageNow);
        fx
    }

    /// The threshold check after appends (`tokens` as the next request counts them):
    /// compact when it is reached (installing a summary prepared ahead if one still
    /// fits), or start preparing one when the session is close to it.
    pub fn threshold(&mut self, tokens: u64, now: &Now<'_>) -> Effects<H> {
        let mut fx = Vec::new();
        if self.checks_threshold() {
            let may_prepare = matches!(self.state, State::Idle);
            self.check(tokens, may_prepare, now, &mut fx);
        }
        fx
    }

    /// The request pipeline found the request at `tokens` over the threshold: through
    /// the same guards as the threshold check, without preparing ahead.
    pub fn pipeline_due(&mut self, tokens: u64, now: &Now<'_>) -> Effects<H> {
        let mut fx = Vec::new();
        self.check(tokens, false, now, &mut fx);
        fx
    }

    /// The user is away: compact in the background while the prompt cache is still
    /// warm, if the session holds at least `floor` tokens.
    pub fn idle(&mut self, floor: u64, now: &Now<'_>) -> Effects<H> {
        let mut fx = Vec::new();
        if let Some(stopped) = &self.guards.stopped {
            fx.push(Effect::Note(Note::IdleButStopped { reason: stopped.message() }));
        } else if now.tokens >= floor && matches!(self.state, State::Idle) {
            fx.push(Effect::Note(Note::IdleCompacting { tokens: now.tokens }));
            self.start(Trigger::Idle, None, None, None, Origin::Requested, false, now, &mut fx);
        }
        fx
    }

    /// Before an undo: a preparation ahead stops; `false` when a compaction runs (the
    /// undo must wait for its install).
    pub fn before_undo(&mut self) -> (Effects<H>, bool) {
        let mut fx = Vec::new();
        self.stop_preparing(&mut fx);
        (fx, matches!(self.state, State::Idle))
    }

    fn check(&mut self, tokens: u64, may_prepare: bool, now: &Now<'_>, fx: &mut Effects<H>) {
        let saved = self.guards.clone();
        let decision = self.guards.check_auto(tokens, now.thresholds, now.fixed_prefix);
        self.save_guards_against(&saved, fx);
        match decision {
            AutoDecision::Compact => self.compact_now(now, fx),
            AutoDecision::Stopped { message, notify: true, .. }
            | AutoDecision::CannotHelp { message, notify: true } => {
                fx.push(Effect::CompactFailed(message));
            }
            AutoDecision::NotDue if may_prepare => self.prepare_ahead(tokens, now, fx),
            _ => {}
        }
    }

    /// The threshold is reached: a summary being prepared ahead becomes this compaction;
    /// one already prepared is installed with what was appended since, if it still
    /// leaves room; otherwise a compaction starts.
    fn compact_now(&mut self, now: &Now<'_>, fx: &mut Effects<H>) {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Preparing(mut job) => {
                fx.push(Effect::Note(Note::AheadBecomesAuto));
                job.trigger = Trigger::Auto;
                self.state = State::Running(job);
            }
            State::Idle => {
                if self.install_ready(None, now, fx).is_err() {
                    self.start(Trigger::Auto, None, None, None, Origin::Requested, false, now, fx);
                }
            }
            other => self.state = other,
        }
    }

    /// Installs the summary prepared ahead for `requester` if it still leaves room;
    /// otherwise hands `requester` back for a normal compaction. The prepared summary is
    /// used once either way.
    fn install_ready(
        &mut self,
        requester: Option<H::Requester>,
        now: &Now<'_>,
        fx: &mut Effects<H>,
    ) -> Result<(), Option<H::Requester>> {
        let Some(ready) = self.ready.take() else { return Err(requester) };
        let appended_since = now.tokens_since(ready.snapshot_len);
        let same_view = ready.view_generation == now.view_generation;
        let estimated_post = H::estimated_post_tokens(&ready.prepared);
        match check_prepared(estimated_post, appended_since, same_view, now.thresholds) {
            Ok(estimate) => {
                fx.push(Effect::Note(Note::InstallingAhead { estimate, appended_since }));
                let trigger = Trigger::Precomputed;
                self.state =
                    State::Installing(Ending { trigger, origin: Origin::Requested, requester, joiners: Vec::new() });
                fx.push(Effect::Install(Install {
                    trigger,
                    prepared: ready.prepared,
                    pre_tokens: now.tokens,
                    generation: None,
                }));
                Ok(())
            }
            Err(stale) => {
                fx.push(Effect::Note(Note::AheadNotUsed(stale)));
                Err(requester)
            }
        }
    }

    /// Starts preparing a summary in the background once the session passes the
    /// precompute start, unless one is ready or failed on this view.
    fn prepare_ahead(&mut self, tokens: u64, now: &Now<'_>, fx: &mut Effects<H>) {
        let ready = self.ready.as_ref().is_some_and(|r| r.view_generation == now.view_generation);
        let failed = self.ahead_failed == Some(now.view_generation);
        if ready || failed || !now.thresholds.compact_enabled || !self.guards.allows_automatic() {
            return;
        }
        if !should_prepare(tokens, now.thresholds) {
            return;
        }
        fx.push(Effect::Note(Note::PreparingAhead { tokens }));
        self.start(Trigger::Precomputed, None, None, None, Origin::Requested, true, now, fx);
    }

    /// Stops preparing a summary ahead (another compaction or an undo replaces it).
    fn stop_preparing(&mut self, fx: &mut Effects<H>) {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Preparing(job) => {
                fx.push(Effect::Abort { generation: job.generation });
                fx.push(Effect::Note(Note::PreparingStopped));
            }
            other => self.state = other,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn start(
        &mut self,
        trigger: Trigger,
        focus: Option<String>,
        requester: Option<H::Requester>,
        partial: Option<(SplitDirection, usize)>,
        origin: Origin,
        ahead: bool,
        now: &Now<'_>,
        fx: &mut Effects<H>,
    ) {
        self.generation += 1;
        let job = Job {
            generation: self.generation,
            trigger,
            pre_tokens: now.tokens,
            view_generation: now.view_generation,
            snapshot_len: now.view.len(),
            focus: focus.clone(),
            origin,
            partial: partial.map(|(direction, _)| direction),
            requester,
            joiners: Vec::new(),
        };
        fx.push(Effect::Start(Start {
            generation: self.generation,
            trigger,
            focus,
            partial,
            pre_tokens: now.tokens,
            ahead,
        }));
        self.state = if ahead { State::Preparing(job) } else { State::Running(job) };
    }

    /// Tells everyone how a compaction ended, then runs what follows it: after an
    /// install, a follow-up or the threshold check; then the next queued request.
    fn finish(
        &mut self,
        ending: Ending<H::Requester>,
        outcome: Result<H::Answer, H::Error>,
        now: &Now<'_>,
        fx: &mut Effects<H>,
    ) {
        self.state = State::Idle;
        let Ending { trigger, origin, requester, joiners } = ending;
        for joiner in joiners {
            fx.push(Effect::Reply { to: joiner, outcome: outcome.clone(), origin: Origin::Joined });
        }
        let compact_failed = match &outcome {
            Ok(_) => None,
            Err(error) => {
                let saved = self.guards.clone();
                let stop = self.guards.record_failure(trigger, &error.to_string());
                self.save_guards_against(&saved, fx);
                match stop {
                    Some(stop) => Some(stop.message()),
                    // No one asked: the failure is told to every client.
                    None => requester.is_none().then(|| error.to_string()),
                }
            }
        };
        let installed = outcome.is_ok();
        fx.push(Effect::Finished(Finished { trigger, outcome, origin, requester, compact_failed }));
        fx.push(Effect::UsageChanged);
        if installed {
            self.follow_up(now, fx);
        }
        // A request with its own focus instructions waited for this one: it runs now
        // (and when it starts nothing, the one after it).
        while !matches!(self.state, State::Running(_) | State::Installing(_))
            && let Some(next) = self.queued.pop_front()
        {
            self.request_into(next, Origin::Queued, now, fx);
        }
    }

    /// An install that left the session at or above its threshold (records appended
    /// while it ran, restored files) is followed at once by another compaction, as far
    /// as the guards allow; below it, the threshold check an append makes runs now (it
    /// may prepare a summary ahead).
    fn follow_up(&mut self, now: &Now<'_>, fx: &mut Effects<H>) {
        let tokens = now.tokens;
        match self.guards.after_install(tokens, now.thresholds, now.fixed_prefix) {
            AfterInstall::CompactAgain { step } => {
                fx.push(Effect::Note(Note::FollowUp { tokens, step }));
                self.start(Trigger::Auto, None, None, None, Origin::Requested, false, now, fx);
                fx.push(Effect::UsageChanged);
            }
            AfterInstall::StillAbove { message } => {
                fx.push(Effect::Note(Note::StillAbove { tokens, message: message.clone() }));
                fx.push(Effect::CompactFailed(message));
            }
            AfterInstall::Done => fx.push(Effect::CheckThreshold),
        }
    }

    /// Asks for the guard state to be written when its lasting part changed from `saved`
    /// (a stop, a failure, a reset), so a restart resumes it.
    fn save_guards_against(&self, saved: &CompactGuards, fx: &mut Effects<H>) {
        if self.guards.lasting_change(saved) {
            fx.push(Effect::SaveGuards);
        }
    }
}

impl<R> Job<R> {
    fn into_ending(self) -> Ending<R> {
        Ending { trigger: self.trigger, origin: self.origin, requester: self.requester, joiners: self.joiners }
    }
}

/// A model response: a turn (not a side chain's, not an error the host wrote for a
/// failed call, not a synthetic message).
pub fn is_model_response(record: &Record) -> bool {
    let head = record.head();
    head.kind == Kind::Assistant
        && !head.is_sidechain
        && !head.is_api_error
        && head.model.as_deref() != Some("<synthetic>")
}

#[cfg(test)]
mod tests {
    //! One test per way a job's end is told apart, and the transitions around them. The
    //! effects are read as short sentences, so each test states the order they come in.
    #![allow(clippy::unwrap_used)]

    use std::cell::Cell;
    use std::rc::Rc;

    use serde_json::json;

    use super::*;
    use crate::compact::CIRCUIT_BREAKER_FAILURES;

    struct Test;

    /// A client waiting for an answer; `gone` is shared so a test can make it leave.
    struct Asker {
        name: &'static str,
        gone: Rc<Cell<bool>>,
    }

    impl Host for Test {
        type Requester = Asker;
        /// The summary's estimated tokens after installing it.
        type Prepared = u64;
        type Answer = &'static str;
        type Error = String;
        fn gone(requester: &Asker) -> bool {
            requester.gone.get()
        }
        fn estimated_post_tokens(prepared: &u64) -> u64 {
            *prepared
        }
        fn error(failure: Failure) -> String {
            format!("{failure:?}")
        }
    }

    fn asker(name: &'static str) -> (Asker, Rc<Cell<bool>>) {
        let gone = Rc::new(Cell::new(false));
        (Asker { name, gone: gone.clone() }, gone)
    }

    fn thresholds() -> Thresholds {
        crate::compact::tests::levels()
    }

    /// A user record of about `tokens` tokens (four bytes each at the default rate).
    fn user(uuid: &str, tokens: usize) -> Record {
        let value = json!({"type": "user", "uuid": uuid, "isSidechain": false,
            "message": {"role": "user", "content": "word".repeat(tokens)}});
        Record::from_object(value.as_object().unwrap()).unwrap()
    }

    fn response(uuid: &str, id: &str) -> Record {
        let value = json!({"type": "assistant", "uuid": uuid, "isSidechain": false,
            "message": {"id": id, "role": "assistant", "model": "claude-x", "content": [{"type": "text", "text": "ok"}]}});
        Record::from_object(value.as_object().unwrap()).unwrap()
    }

    /// The session's facts for a transition.
    struct Session {
        view: Vec<Record>,
        generation: u64,
        tokens: u64,
        fixed_prefix: u64,
        thresholds: Thresholds,
    }

    impl Session {
        fn new() -> Session {
            let view = (0..4).map(|i| user(&format!("u{i}"), 10)).collect();
            Session { view, generation: 1, tokens: 100_000, fixed_prefix: 5_000, thresholds: thresholds() }
        }

        fn at(&mut self, tokens: u64) -> &mut Session {
            self.tokens = tokens;
            self
        }

        fn now(&self) -> Now<'_> {
            Now {
                view: &self.view,
                view_generation: self.generation,
                tokens: self.tokens,
                fixed_prefix: self.fixed_prefix,
                thresholds: &self.thresholds,
                rate: Calibration::default(),
            }
        }
    }

    fn manual(requester: Asker) -> Request<Asker> {
        Request { trigger: Trigger::Manual, instructions: None, partial: None, requester }
    }

    /// The effects as short sentences.
    fn said(effects: &[Effect<Test>]) -> Vec<String> {
        let outcome = |o: &Result<&str, String>| match o {
            Ok(answer) => format!("ok {answer}"),
            Err(e) => format!("error {e}"),
        };
        effects
            .iter()
            .map(|effect| match effect {
                Effect::Start(s) => {
                    format!("start {} {:?}{}", s.generation, s.trigger, if s.ahead { " ahead" } else { "" })
                }
                Effect::Abort { generation } => format!("abort {generation}"),
                Effect::Install(i) => format!("install {:?} of {}", i.trigger, i.prepared),
                Effect::SaveGuards => "save guards".to_owned(),
                Effect::Reply { to, outcome: o, origin } => format!("reply {} {origin:?} {}", to.name, outcome(o)),
                Effect::Refuse { to, error } => format!("refuse {} {error}", to.name),
                Effect::Finished(f) => format!(
                    "finished {:?} {:?} {} to {}{}",
                    f.trigger,
                    f.origin,
                    outcome(&f.outcome),
                    f.requester.as_ref().map_or("no one", |r| r.name),
                    f.compact_failed.as_ref().map(|m| format!(", compactFailed: {m}")).unwrap_or_default()
                ),
                Effect::Abandoned { requester } => format!("abandoned {}", requester.name),
                Effect::CompactFailed(message) => format!("compactFailed: {message}"),
                Effect::UsageChanged => "usage".to_owned(),
                Effect::UsageNow => "usage now".to_owned(),
                Effect::CheckThreshold => "check threshold".to_owned(),
                Effect::Note(note) => format!("note {note:?}"),
            })
            .collect()
    }

    fn take_install(effects: Vec<Effect<Test>>) -> Install<u64> {
        effects
            .into_iter()
            .find_map(|e| match e {
                Effect::Install(install) => Some(install),
                _ => None,
            })
            .unwrap()
    }

    // --- The outcomes of `done`. ---

    #[test]
    fn a_result_of_a_job_that_no_longer_runs_is_ignored() {
        let s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        let (a, _) = asker("a");
        assert_eq!(said(&machine.request(manual(a), Origin::Requested, &s.now())), ["start 1 Manual"]);
        assert!(said(&machine.done(7, Ok(1_000), &s.now())).is_empty());
        assert_eq!(machine.phase(), Phase::Running);
        // Its own result still counts.
        assert_eq!(said(&machine.done(1, Ok(1_000), &s.now())), ["install Manual of 1000"]);
    }

    #[test]
    fn a_summary_prepared_ahead_on_the_same_view_waits_for_the_threshold() {
        let mut s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        assert!(said(&machine.threshold(150_000, &s.at(150_000).now())).is_empty(), "below the precompute start");
        let started = machine.threshold(161_000, &s.at(161_000).now());
        assert_eq!(said(&started), ["note PreparingAhead { tokens: 161000 }", "start 1 Precomputed ahead"]);
        assert_eq!(machine.phase(), Phase::PreparingAhead);
        assert!(!machine.compacting(), "not shown as compacting");
        let done = machine.done(1, Ok(40_000), &s.now());
        assert_eq!(said(&done), ["note AheadReady { estimated_post: 40000 }", "check threshold"]);
        assert_eq!(machine.phase(), Phase::Ready);
        assert_eq!(machine.prepared_ahead(), Some(&40_000));
        // Ready on this view: not prepared again.
        assert!(said(&machine.threshold(162_000, &s.at(162_000).now())).is_empty());
    }

    #[test]
    fn a_summary_prepared_ahead_on_a_replaced_view_is_dropped() {
        let mut s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        machine.threshold(161_000, &s.at(161_000).now());
        s.generation += 1;
        assert_eq!(said(&machine.done(1, Ok(40_000), &s.now())), ["note AheadDropped", "check threshold"]);
        assert_eq!((machine.phase(), machine.prepared_ahead()), (Phase::Idle, None));
        assert_eq!(said(&machine.threshold(161_000, &s.now()))[1], "start 2 Precomputed ahead");
    }

    #[test]
    fn a_failed_preparation_is_not_tried_again_on_the_same_view() {
        let mut s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        machine.threshold(161_000, &s.at(161_000).now());
        let done = machine.done(1, Err("the provider is down".into()), &s.now());
        assert_eq!(said(&done), ["note AheadFailed(\"the provider is down\")", "check threshold"]);
        assert!(said(&machine.threshold(162_000, &s.at(162_000).now())).is_empty());
        // Nothing is lost: the threshold compacts normally, and a new view may prepare.
        assert_eq!(said(&machine.threshold(167_000, &s.at(167_000).now())), ["start 2 Auto"]);
        machine.done(2, Err("again".into()), &s.now());
        s.generation += 1;
        assert_eq!(said(&machine.threshold(161_000, &s.at(161_000).now()))[1], "start 3 Precomputed ahead");
    }

    #[test]
    fn a_compaction_everyone_stopped_waiting_for_is_not_installed() {
        let s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        let ((a, a_gone), (b, b_gone)) = (asker("a"), asker("b"));
        machine.request(manual(a), Origin::Requested, &s.now());
        machine.request(manual(b), Origin::Requested, &s.now());
        a_gone.set(true);
        b_gone.set(true);
        assert_eq!(
            said(&machine.done(1, Ok(1_000), &s.now())),
            [
                "reply b Joined error Cancelled",
                "save guards",
                "finished Manual Requested error Cancelled to a",
                "usage",
            ]
        );
        assert_eq!(machine.guards().consecutive_failures, 0, "a manual failure does not count toward the breaker");
        assert_eq!(machine.phase(), Phase::Idle);
    }

    #[test]
    fn a_compaction_of_a_replaced_view_is_dropped() {
        let mut s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        machine.threshold(170_000, &s.at(170_000).now());
        s.generation += 1;
        assert_eq!(
            said(&machine.done(1, Ok(1_000), &s.now())),
            [
                "save guards",
                "finished Auto Requested error ViewReplaced to no one, compactFailed: ViewReplaced",
                "usage",
            ]
        );
        assert_eq!(machine.guards().consecutive_failures, 1);
    }

    #[test]
    fn a_partial_compaction_that_keeps_records_before_its_summary_installs_nothing_after_appends() {
        let mut s = Session::new();
        for (direction, installs) in [(SplitDirection::From, false), (SplitDirection::UpTo, true)] {
            s.view.truncate(4);
            let mut machine = Lifecycle::<Test>::default();
            let (a, _) = asker("a");
            let request = Request {
                trigger: Trigger::Manual,
                instructions: None,
                partial: Some((direction, "u2".into())),
                requester: a,
            };
            let start = machine.request(request, Origin::Requested, &s.now());
            let Some(Effect::Start(start)) = start.first() else { panic!("{:?}", said(&start)) };
            let plan = partial_plan(&s.view, 2, direction);
            let split = if direction == SplitDirection::From { plan.summarize.start } else { plan.keep.start };
            assert_eq!(start.partial, Some((direction, split)));
            s.view.push(user("late", 10));
            let done = said(&machine.done(1, Ok(1_000), &s.now()));
            if installs {
                assert_eq!(done, ["install Manual of 1000"], "{direction:?}");
            } else {
                assert_eq!(
                    done,
                    ["save guards", "finished Manual Requested error AppendedDuringPartial to a", "usage"],
                    "{direction:?}"
                );
            }
        }
    }

    #[test]
    fn an_installed_compaction_answers_everyone_waiting_then_runs_the_next_request() {
        let mut s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        let ((a, _), (b, _), (c, _)) = (asker("a"), asker("b"), asker("c"));
        machine.request(manual(a), Origin::Requested, &s.now());
        // The same (no) focus joins; its own focus queues.
        let joined = machine.request(manual(b), Origin::Requested, &s.now());
        assert_eq!(said(&joined), ["note Joined { trigger: Manual }"]);
        let focused = Request { instructions: Some("the parser".into()), ..manual(c) };
        assert_eq!(said(&machine.request(focused, Origin::Requested, &s.now())), ["note Queued { trigger: Manual }"]);
        let install = take_install(machine.done(1, Ok(1_000), &s.now()));
        assert_eq!((install.trigger, install.pre_tokens, install.generation), (Trigger::Manual, 100_000, Some(1)));
        assert_eq!(machine.phase(), Phase::Installing);
        let after = machine.installed(Ok("compacted"), &s.at(40_000).now());
        assert_eq!(
            said(&after),
            [
                "reply b Joined ok compacted",
                "finished Manual Requested ok compacted to a",
                "usage",
                "check threshold",
                "start 2 Manual",
            ]
        );
        let Some(Effect::Start(next)) = after.last() else { unreachable!() };
        assert_eq!(next.focus.as_deref(), Some("the parser"));
        assert!(machine.compacting());
        machine.done(2, Ok(2_000), &s.now());
        assert_eq!(
            said(&machine.installed(Ok("again"), &s.now()))[..2],
            ["finished Manual Queued ok again to c", "usage"]
        );
    }

    #[test]
    fn a_failed_automatic_compaction_is_told_to_every_client_until_the_breaker_stops_it() {
        let mut s = Session::new();
        s.at(170_000);
        let mut machine = Lifecycle::<Test>::default();
        for attempt in 1..=u64::from(CIRCUIT_BREAKER_FAILURES) {
            assert_eq!(said(&machine.threshold(170_000, &s.now())), [format!("start {attempt} Auto")]);
            let failed = said(&machine.done(attempt, Err("no summary".into()), &s.now()));
            assert_eq!(failed[0], "save guards");
            if attempt < u64::from(CIRCUIT_BREAKER_FAILURES) {
                assert_eq!(failed[1], "finished Auto Requested error no summary to no one, compactFailed: no summary");
            } else {
                assert!(failed[1].contains("compactFailed: Automatic compaction is off"), "{failed:?}");
            }
        }
        // Stopped: the threshold starts nothing more (and says so once, already).
        assert!(said(&machine.threshold(170_000, &s.now())).is_empty());
        assert_eq!(said(&machine.idle(10_000, &s.now())).len(), 1, "idle only notes the stop");
        // A manual compaction lifts the stop.
        let (a, _) = asker("a");
        assert_eq!(said(&machine.request(manual(a), Origin::Requested, &s.now())), ["save guards", "start 4 Manual"]);
    }

    #[test]
    fn a_failed_install_is_told_as_a_failure_and_the_queued_request_runs_next() {
        let s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        let ((a, _), (b, _), (c, _)) = (asker("a"), asker("b"), asker("c"));
        machine.request(manual(a), Origin::Requested, &s.now());
        machine.request(manual(b), Origin::Requested, &s.now());
        let focused = Request { instructions: Some("the parser".into()), ..manual(c) };
        machine.request(focused, Origin::Requested, &s.now());
        take_install(machine.done(1, Ok(1_000), &s.now()));
        assert_eq!(
            said(&machine.installed(Err("the transcript could not be written".into()), &s.now())),
            [
                "reply b Joined error the transcript could not be written",
                "save guards",
                "finished Manual Requested error the transcript could not be written to a",
                "usage",
                // The queued request is manual too: it lifts the failure just recorded.
                "save guards",
                "start 2 Manual",
            ],
            "no follow-up after a failure, and the queued request is not lost"
        );
        assert_eq!(machine.guards().consecutive_failures, 0, "a manual failure does not count toward the breaker");
    }

    #[test]
    fn a_refused_queued_request_lets_the_one_after_it_run() {
        let mut s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        let ((a, _), (b, _), (c, _)) = (asker("a"), asker("b"), asker("c"));
        machine.request(manual(a), Origin::Requested, &s.now());
        let nowhere = Request { partial: Some((SplitDirection::UpTo, "nowhere".into())), ..manual(b) };
        machine.request(nowhere, Origin::Requested, &s.now());
        let focused = Request { instructions: Some("the parser".into()), ..manual(c) };
        machine.request(focused, Origin::Requested, &s.now());
        machine.done(1, Ok(1_000), &s.now());
        let after = said(&machine.installed(Ok("x"), &s.at(40_000).now()));
        assert_eq!(after[3..], ["refuse b NoSuchRecord(\"nowhere\")", "start 2 Manual"], "{after:?}");
        machine.done(2, Ok(1_000), &s.now());
        assert_eq!(said(&machine.installed(Ok("y"), &s.now()))[0], "finished Manual Queued ok y to c");
    }

    #[test]
    fn a_refusal_as_too_long_compacts_normally_when_the_ready_summary_no_longer_fits() {
        let mut s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        machine.threshold(161_000, &s.at(161_000).now());
        machine.done(1, Ok(40_000), &s.now());
        s.view.push(user("since", 80_000));
        let (a, _) = asker("a");
        let reactive = Request { trigger: Trigger::Reactive, ..manual(a) };
        let fx = said(&machine.request(reactive, Origin::Requested, &s.now()));
        assert!(fx[0].starts_with("note AheadNotUsed(TooMuchSince"), "{fx:?}");
        assert_eq!(fx[1..], ["start 2 Reactive"]);
        take_install(machine.done(2, Ok(2_000), &s.now()));
        assert_eq!(
            said(&machine.installed(Ok("reactive"), &s.at(40_000).now()))[0],
            "finished Reactive Requested ok reactive to a"
        );
    }

    // --- The other transitions. ---

    #[test]
    fn a_request_is_refused_when_compaction_is_off_or_its_record_is_not_in_view() {
        let mut s = Session::new();
        s.thresholds.compact_enabled = false;
        let mut machine = Lifecycle::<Test>::default();
        let (a, _) = asker("a");
        assert_eq!(said(&machine.request(manual(a), Origin::Requested, &s.now())), ["refuse a Disabled"]);
        s.thresholds.compact_enabled = true;
        let (b, _) = asker("b");
        let partial = Request { partial: Some((SplitDirection::UpTo, "nowhere".into())), ..manual(b) };
        assert_eq!(
            said(&machine.request(partial, Origin::Requested, &s.now())),
            ["refuse b NoSuchRecord(\"nowhere\")"]
        );
        assert_eq!(machine.phase(), Phase::Idle);
    }

    #[test]
    fn cancel_stops_only_a_compaction_everyone_left() {
        let mut s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        // An automatic compaction has no one to leave it.
        machine.threshold(170_000, &s.at(170_000).now());
        assert!(said(&machine.cancel()).is_empty());
        machine.done(1, Err("x".into()), &s.now());
        let ((a, a_gone), (b, b_gone)) = (asker("a"), asker("b"));
        machine.request(manual(a), Origin::Requested, &s.now());
        machine.request(manual(b), Origin::Requested, &s.now());
        a_gone.set(true);
        assert!(said(&machine.cancel()).is_empty(), "b still waits");
        b_gone.set(true);
        assert_eq!(
            said(&machine.cancel()),
            ["abort 2", "note CancelledByClient { trigger: Manual }", "abandoned a", "usage now"]
        );
        assert_eq!(machine.phase(), Phase::Idle);
        // Its task's result, if it still comes, is ignored.
        assert!(said(&machine.done(2, Ok(1), &s.now())).is_empty());
    }

    #[test]
    fn an_assemble_waits_only_while_something_runs_and_the_request_is_over_the_blocked_level() {
        let mut s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        let th = thresholds();
        assert!(machine.assemble_allowed(190_000, 190_000, &th), "nothing runs");
        machine.threshold(161_000, &s.at(161_000).now());
        assert!(machine.assemble_allowed(170_000, 170_000, &th), "below the blocked level");
        assert!(!machine.assemble_allowed(177_000, 170_000, &th), "a preparation ahead is waited for too");
        // With automatic compaction off, the tally alone can block.
        let manual_only = Thresholds { auto_compact_enabled: false, ..th };
        assert!(!machine.assemble_allowed(100_000, 180_000, &manual_only));
    }

    #[test]
    fn the_threshold_turns_a_preparation_into_the_compaction() {
        let mut s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        machine.threshold(161_000, &s.at(161_000).now());
        assert_eq!(said(&machine.threshold(168_000, &s.at(168_000).now())), ["note AheadBecomesAuto"]);
        assert!(machine.compacting());
        assert!(!machine.checks_threshold());
        let install = take_install(machine.done(1, Ok(30_000), &s.now()));
        assert_eq!((install.trigger, install.pre_tokens), (Trigger::Auto, 161_000));
    }

    #[test]
    fn a_ready_summary_is_installed_at_the_threshold_only_while_it_leaves_room() {
        for (appended, installs) in [(1_000, true), (80_000, false)] {
            let mut s = Session::new();
            let mut machine = Lifecycle::<Test>::default();
            machine.threshold(161_000, &s.at(161_000).now());
            machine.done(1, Ok(40_000), &s.now());
            s.view.push(user("since", appended));
            let since = s.now().tokens_since(4);
            assert!((appended as u64..appended as u64 + 10).contains(&since), "{since}");
            let at = machine.threshold(168_000, &s.at(168_000).now());
            if installs {
                assert_eq!(
                    said(&at),
                    [
                        format!("note InstallingAhead {{ estimate: {}, appended_since: {since} }}", 40_000 + since),
                        "install Precomputed of 40000".into()
                    ]
                );
                let after = said(&machine.installed(Ok("precomputed"), &s.at(45_000).now()));
                assert_eq!(
                    after,
                    ["finished Precomputed Requested ok precomputed to no one", "usage", "check threshold"]
                );
            } else {
                assert_eq!(
                    said(&at),
                    [
                        format!(
                            "note AheadNotUsed(TooMuchSince {{ estimated_after: {}, limit: 83500 }})",
                            40_000 + since
                        ),
                        "start 2 Auto".into()
                    ]
                );
            }
            assert_eq!(machine.prepared_ahead(), None, "used once");
        }
    }

    #[test]
    fn a_refusal_as_too_long_installs_the_ready_summary_at_once() {
        let mut s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        machine.threshold(161_000, &s.at(161_000).now());
        machine.done(1, Ok(40_000), &s.now());
        let (a, _) = asker("a");
        let reactive = Request { trigger: Trigger::Reactive, ..manual(a) };
        let fx = machine.request(reactive, Origin::Requested, &s.now());
        assert_eq!(said(&fx)[1], "install Precomputed of 40000");
        assert_eq!(
            said(&machine.installed(Ok("x"), &s.at(42_000).now()))[0],
            "finished Precomputed Requested ok x to a"
        );
    }

    #[test]
    fn an_install_left_above_the_threshold_is_followed_up_twice_then_reported() {
        let mut s = Session::new();
        s.at(170_000);
        let mut machine = Lifecycle::<Test>::default();
        machine.threshold(170_000, &s.now());
        for generation in 1..=3 {
            machine.done(generation, Ok(1), &s.now());
            let after = said(&machine.installed(Ok("x"), &s.now()));
            if generation < 3 {
                assert_eq!(
                    after[2..],
                    [
                        format!("note FollowUp {{ tokens: 170000, step: {generation} }}"),
                        format!("start {} Auto", generation + 1),
                        "usage".into()
                    ]
                );
            } else {
                assert!(after[2].starts_with("note StillAbove") && after[3].starts_with("compactFailed"), "{after:?}");
                assert_eq!(machine.phase(), Phase::Idle);
            }
        }
    }

    #[test]
    fn idle_compacts_above_the_floor_with_nothing_running() {
        let mut s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        let th = thresholds();
        assert!(said(&machine.idle(120_000, &s.at(100_000).now())).is_empty(), "below the floor");
        assert!(machine.idle_possible(&th));
        assert_eq!(said(&machine.idle(50_000, &s.now())), ["note IdleCompacting { tokens: 100000 }", "start 1 Idle"]);
        assert!(!machine.idle_possible(&th));
        assert!(said(&machine.idle(50_000, &s.now())).is_empty(), "one at a time");
    }

    #[test]
    fn an_undo_stops_a_preparation_and_waits_for_a_compaction() {
        let mut s = Session::new();
        let mut machine = Lifecycle::<Test>::default();
        machine.threshold(161_000, &s.at(161_000).now());
        let (fx, allowed) = machine.before_undo();
        assert_eq!((said(&fx), allowed), (vec!["abort 1".to_owned(), "note PreparingStopped".into()], true));
        machine.threshold(170_000, &s.at(170_000).now());
        assert!(!machine.before_undo().1);
    }

    #[test]
    fn the_lines_of_one_response_are_one_turn() {
        let mut machine = Lifecycle::<Test>::default();
        machine.restore_guards(CompactGuards { turns_since_compact: Some(0), ..CompactGuards::default() });
        for record in [response("a1", "msg_1"), response("a2", "msg_1"), user("u", 1), response("b", "msg_2")] {
            machine.observe(&record);
        }
        assert_eq!(machine.guards().turns_since_compact, Some(2));
    }
}
