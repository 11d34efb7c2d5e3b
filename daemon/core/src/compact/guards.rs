//! The guards that keep automatic compaction from looping.
//!
//! Automatic compaction runs without anyone watching, so its failure modes must end on
//! their own and say why once:
//! - **circuit breaker**: after [`CIRCUIT_BREAKER_FAILURES`] automatic compactions in a
//!   row fail, automatic compaction stops for the session (each attempt costs a large
//!   request);
//! - **thrashing**: when the context refills to the threshold within [`THRASH_TURNS`]
//!   turns of the previous compaction [`THRASH_REFILLS`] times in a row, compacting is
//!   not keeping up with what each turn adds; automatic compaction stops with a message
//!   beginning [`THRASHING_MESSAGE`];
//! - **fixed prefix**: when the part compaction cannot remove (system prompt, tools,
//!   memory files) is already above the threshold, no summary can bring the context
//!   under it; that is reported once instead of compacting every turn;
//! - **follow-ups**: a compaction that leaves the session at or above the threshold
//!   (records appended while it ran, restored files) is followed at once by another, at
//!   most [`MAX_FOLLOW_UPS`] times, then reported ([`CompactGuards::after_install`]).
//!   Follow-ups are not refills: they do not count toward thrashing.
//!
//! A stop holds for every path that starts a compaction on its own (after an append,
//! before a request, idle, preparing a summary ahead, a follow-up):
//! [`CompactGuards::allows_automatic`] is the one gate.
//! A manual compaction is the user taking over: it lifts a stop and clears the counts.
//! The state is a small serializable struct the daemon keeps per session.
//!
//! **Durable.** A stop must outlive the daemon, or a restart would let a thrashing
//! session compact again. The transcript is the source of truth, so the state is
//! written there as a record of ctxd's own (no uuid: it is no message) whenever its
//! lasting part changes ([`CompactGuards::lasting_change`]), and after an install
//! whose state is not the fresh one a resumed view would start from:
//!
//! ```json
//! {"type":"ctxd-compact-guards","guards":{"consecutiveFailures":0,"stopped":{"kind":"thrashing"},…}}
//! ```
//!
//! Loading folds the view (which starts at the latest boundary) with
//! [`CompactGuards::restore`]: the newest such record, then one turn per model response
//! after it; without one after the boundary, the counts start afresh there. A record
//! is never needed from before the latest boundary: the install wrote the state after
//! it unless it was that fresh one.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::budget::Thresholds;
use crate::record::{Kind, Record};

use super::Trigger;

/// Consecutive failed automatic compactions that stop automatic compaction.
pub const CIRCUIT_BREAKER_FAILURES: u32 = 3;
/// A refill within this many turns of the previous compaction counts as quick.
pub const THRASH_TURNS: u32 = 3;
/// Quick refills in a row that stop automatic compaction.
pub const THRASH_REFILLS: u32 = 3;
/// Compactions that may follow at once one that left the session above its threshold.
pub const MAX_FOLLOW_UPS: u32 = 2;
/// The start of the message automatic compaction stops with when it thrashes.
pub const THRASHING_MESSAGE: &str = "Autocompact is thrashing: the context refilled to the limit within 3 turns of the previous compact, 3 times in a row";

/// `type` of the record that holds the guard state in the transcript.
pub const GUARDS_RECORD: &str = "ctxd-compact-guards";

/// Why automatic compaction stopped for the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum StopReason {
    /// Too many automatic compactions in a row failed; `last` is the latest reason.
    CircuitBreaker { failures: u32, last: String },
    /// The context kept refilling right after each compaction.
    Thrashing,
}

impl StopReason {
    /// The message for the user (`ctx/compactFailed`).
    pub fn message(&self) -> String {
        match self {
            StopReason::CircuitBreaker { failures, last } => format!(
                "Automatic compaction is off for this session after {failures} failed attempts in a row \
                 (the last one: {last}). Compact manually to turn it back on."
            ),
            StopReason::Thrashing => format!(
                "{THRASHING_MESSAGE}. Automatic compaction is off for this session: each turn adds more than \
                 compaction can take away (large file reads or tool outputs, or a large fixed context). \
                 Compact manually to turn it back on, or use a larger window."
            ),
        }
    }
}

/// What the caller should do about automatic compaction now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AutoDecision {
    /// Below the threshold, or automatic compaction is disabled: nothing to do.
    NotDue,
    /// Compact now.
    Compact,
    /// Automatic compaction is stopped for the session. `notify` is true only the
    /// first time (send `ctx/compactFailed` with `message`).
    Stopped { reason: StopReason, message: String, notify: bool },
    /// The fixed prefix alone is at or above the threshold: compacting cannot help.
    /// `notify` is true once per episode (until the prefix drops below the threshold).
    CannotHelp { message: String, notify: bool },
}

/// A failed compaction, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailureRecord {
    pub trigger: Trigger,
    pub reason: String,
}

/// The guard state of one session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactGuards {
    /// Automatic compactions that failed in a row.
    pub consecutive_failures: u32,
    pub last_failure: Option<FailureRecord>,
    /// Turns since the latest successful compaction; `None` before the first.
    pub turns_since_compact: Option<u32>,
    /// Automatic compactions in a row that came within [`THRASH_TURNS`] turns of the
    /// previous one.
    pub quick_refills: u32,
    /// Set once automatic compaction stopped.
    pub stopped: Option<StopReason>,
    /// The fixed prefix above the threshold was reported and has not dropped since.
    pub fixed_prefix_reported: bool,
    /// Follow-up compactions started since one left the session above its threshold.
    #[serde(default)]
    pub follow_ups: u32,
}

/// What follows an installed compaction ([`CompactGuards::after_install`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterInstall {
    /// Under the threshold (or nothing more may run): done.
    Done,
    /// Still at or above the threshold: compact again now; this is follow-up `step`.
    CompactAgain { step: u32 },
    /// Still above after every follow-up: say so once (`ctx/compactFailed`) and wait
    /// for the next turn.
    StillAbove { message: String },
}

impl CompactGuards {
    /// The record's own fields (the daemon adds a `timestamp`).
    pub fn to_record(&self) -> Map<String, Value> {
        let value = json!({"type": GUARDS_RECORD, "guards": self});
        value.as_object().cloned().unwrap_or_default()
    }

    /// The state a guards record holds; `None` for any other record (and for a guards
    /// record that cannot be read, which is then ignored like any unknown line).
    pub fn from_record(record: &Record) -> Option<CompactGuards> {
        // Cheap test first: most records are messages.
        if record.head().kind != Kind::Other || !record.line().contains(GUARDS_RECORD) {
            return None;
        }
        #[derive(Deserialize)]
        struct Line {
            #[serde(rename = "type")]
            kind: String,
            guards: CompactGuards,
        }
        serde_json::from_str::<Line>(record.line()).ok().filter(|line| line.kind == GUARDS_RECORD).map(|l| l.guards)
    }

    /// The state of a session whose view (from its latest boundary on) is `records`:
    /// the newest guards record, then a turn for every model response after it. Without
    /// one (a session from before guards were written, or never compacted) the counts
    /// start afresh, turns counted from the boundary when there is one.
    pub fn restore(records: &[Record]) -> CompactGuards {
        let newest = records.iter().rposition(|r| CompactGuards::from_record(r).is_some());
        let boundary = records.iter().rposition(Record::is_compact_boundary);
        let (mut guards, from) = match (newest, boundary) {
            (Some(at), _) => (CompactGuards::from_record(&records[at]).unwrap_or_default(), at + 1),
            (None, Some(at)) => (CompactGuards { turns_since_compact: Some(0), ..CompactGuards::default() }, at + 1),
            (None, None) => (CompactGuards::default(), 0),
        };
        let mut last_id: Option<&str> = None;
        for record in &records[from..] {
            let head = record.head();
            // The lines of one response split over several records are one turn.
            if super::lifecycle::is_model_response(record)
                && (head.message_id.is_none() || head.message_id.as_deref() != last_id)
            {
                last_id = head.message_id.as_deref();
                guards.record_turn();
            }
        }
        guards
    }

    /// Whether the part of the state that must survive a restart differs from
    /// `saved`: the stop, the failure streak, the refill streak. Turns are counted again
    /// from the transcript, and the follow-up count and the fixed-prefix note only
    /// matter within one daemon's run.
    pub fn lasting_change(&self, saved: &CompactGuards) -> bool {
        self.stopped != saved.stopped
            || self.consecutive_failures != saved.consecutive_failures
            || self.last_failure != saved.last_failure
            || self.quick_refills != saved.quick_refills
    }

    /// Whether ctxd may start a compaction on its own now: not after a stop (thrashing,
    /// circuit breaker), until a manual compaction lifts it. Every automatic path asks.
    pub fn allows_automatic(&self) -> bool {
        self.stopped.is_none()
    }

    /// An automatic compaction was installed and the session holds `tokens` now: compact
    /// again at once while it is still at or above the threshold, at most
    /// [`MAX_FOLLOW_UPS`] times, unless a stop holds or the fixed prefix alone is over
    /// the threshold (no summary can help; [`CompactGuards::check_auto`] says so).
    pub fn after_install(&mut self, tokens: u64, thresholds: &Thresholds, fixed_prefix: u64) -> AfterInstall {
        if !thresholds.should_auto_compact(tokens) || !self.allows_automatic() || fixed_prefix >= thresholds.threshold {
            self.follow_ups = 0;
            return AfterInstall::Done;
        }
        if self.follow_ups >= MAX_FOLLOW_UPS {
            let steps = self.follow_ups;
            self.follow_ups = 0;
            return AfterInstall::StillAbove {
                message: format!(
                    "Compaction left the session at {tokens} tokens, at or above its compact threshold ({} tokens), \
                     after {steps} further compactions at once; the next turn tries again. What stays is the part \
                     compaction keeps: the latest messages, restored files, memory files, tools and system prompt.",
                    thresholds.threshold
                ),
            };
        }
        self.follow_ups += 1;
        AfterInstall::CompactAgain { step: self.follow_ups }
    }

    /// Decides whether automatic compaction should run at `tokens`, given the part of
    /// the context compaction cannot remove (`fixed_prefix`).
    pub fn check_auto(&mut self, tokens: u64, thresholds: &Thresholds, fixed_prefix: u64) -> AutoDecision {
        if fixed_prefix < thresholds.threshold {
            self.fixed_prefix_reported = false;
        }
        if !thresholds.should_auto_compact(tokens) {
            return AutoDecision::NotDue;
        }
        if let Some(reason) = &self.stopped {
            return AutoDecision::Stopped { message: reason.message(), reason: reason.clone(), notify: false };
        }
        if fixed_prefix >= thresholds.threshold {
            let notify = !self.fixed_prefix_reported;
            self.fixed_prefix_reported = true;
            return AutoDecision::CannotHelp {
                message: format!(
                    "Compaction cannot help: the part of the context it cannot remove (system prompt, tools and \
                     memory files, {fixed_prefix} tokens) is already at or above the compact threshold \
                     ({} tokens). Remove tools, MCP servers or memory files, or use a model with a larger window.",
                    thresholds.threshold
                ),
                notify,
            };
        }
        let quick = self.turns_since_compact.is_some_and(|t| t <= THRASH_TURNS);
        if quick && self.quick_refills + 1 >= THRASH_REFILLS {
            let reason = StopReason::Thrashing;
            self.stopped = Some(reason.clone());
            return AutoDecision::Stopped { message: reason.message(), reason, notify: true };
        }
        AutoDecision::Compact
    }

    /// One model turn finished (the caller decides what a turn is: one request to the
    /// model).
    pub fn record_turn(&mut self) {
        self.turns_since_compact = self.turns_since_compact.map(|t| t.saturating_add(1));
    }

    /// A manual compaction is starting: the user takes over, so a stop is lifted and
    /// the counts start again.
    pub fn note_manual_compact(&mut self) {
        self.follow_ups = 0;
        self.consecutive_failures = 0;
        self.last_failure = None;
        self.quick_refills = 0;
        self.stopped = None;
    }

    /// A compaction was installed.
    pub fn record_success(&mut self, trigger: Trigger) {
        self.consecutive_failures = 0;
        self.last_failure = None;
        let quick = self.turns_since_compact.is_some_and(|t| t <= THRASH_TURNS);
        if self.follow_ups == 0 {
            self.quick_refills = if trigger.is_automatic() && quick { self.quick_refills + 1 } else { 0 };
        }
        // A follow-up continues the compaction before it: nothing refilled in between.
        self.turns_since_compact = Some(0);
    }

    /// A compaction failed. Returns the stop reason when this failure stopped automatic
    /// compaction (send `ctx/compactFailed` with its message). The user's own attempts
    /// (manual, partial) do not count toward the breaker.
    pub fn record_failure(&mut self, trigger: Trigger, reason: &str) -> Option<StopReason> {
        self.last_failure = Some(FailureRecord { trigger, reason: reason.to_owned() });
        self.follow_ups = 0;
        if !trigger.is_automatic() {
            return None;
        }
        self.consecutive_failures += 1;
        if self.consecutive_failures >= CIRCUIT_BREAKER_FAILURES && self.stopped.is_none() {
            let stop = StopReason::CircuitBreaker { failures: self.consecutive_failures, last: reason.to_owned() };
            self.stopped = Some(stop.clone());
            return Some(stop);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn rec(value: Value) -> Record {
        Record::parse(&value.to_string()).unwrap()
    }

    fn response(uuid: &str, message_id: &str) -> Record {
        rec(json!({"type": "assistant", "uuid": uuid, "message": {"id": message_id, "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": "ok"}]}}))
    }

    fn boundary() -> Record {
        rec(json!({"type": "system", "subtype": "compact_boundary", "uuid": "b", "content": "Conversation compacted"}))
    }

    fn written(guards: &CompactGuards, at: &str) -> Record {
        let mut object = guards.to_record();
        object.insert("timestamp".to_owned(), json!(at));
        Record::from_object(&object).unwrap()
    }

    #[test]
    fn a_stop_is_restored_from_the_newest_record_with_the_turns_since() {
        let mut stopped = CompactGuards { turns_since_compact: Some(0), quick_refills: 2, ..CompactGuards::default() };
        stopped.stopped = Some(StopReason::Thrashing);
        let older = CompactGuards { turns_since_compact: Some(0), quick_refills: 1, ..CompactGuards::default() };
        let view = vec![
            boundary(),
            written(&older, "g1"),
            response("a1", "msg_1"),
            written(&stopped, "g2"),
            // One response split over two lines is one turn; another is a second.
            response("a2", "msg_2"),
            response("a3", "msg_2"),
            response("a4", "msg_3"),
        ];
        let restored = CompactGuards::restore(&view);
        assert_eq!(restored.stopped, Some(StopReason::Thrashing));
        assert_eq!(restored.quick_refills, 2);
        assert_eq!(restored.turns_since_compact, Some(2));
        assert!(!restored.allows_automatic());
        // The breaker's streak too.
        let mut failing = CompactGuards::default();
        for _ in 0..CIRCUIT_BREAKER_FAILURES {
            failing.record_failure(Trigger::Auto, "provider down");
        }
        let restored = CompactGuards::restore(&[written(&failing, "g")]);
        assert!(matches!(restored.stopped, Some(StopReason::CircuitBreaker { failures: 3, .. })), "{restored:?}");
    }

    #[test]
    fn without_a_record_the_counts_start_afresh_from_the_boundary() {
        let view = vec![response("a0", "msg_0"), boundary(), response("a1", "msg_1")];
        assert_eq!(
            CompactGuards::restore(&view),
            CompactGuards { turns_since_compact: Some(1), ..CompactGuards::default() }
        );
        assert_eq!(CompactGuards::restore(&[response("a1", "msg_1")]), CompactGuards::default());
        // A line that only looks like one is ignored.
        let odd = rec(json!({"type": GUARDS_RECORD, "uuid": "x", "guards": "not a state"}));
        assert_eq!(CompactGuards::from_record(&odd), None);
    }

    #[test]
    fn only_the_lasting_part_is_worth_a_record() {
        let saved = CompactGuards::default();
        let mut g = saved.clone();
        g.record_turn();
        g.fixed_prefix_reported = true;
        g.follow_ups = 1;
        assert!(!g.lasting_change(&saved));
        g.record_failure(Trigger::Auto, "x");
        assert!(g.lasting_change(&saved));
        let saved = g.clone();
        g.note_manual_compact();
        assert!(g.lasting_change(&saved), "a reset is written too");
    }
}
