//! Compaction planning: everything about replacing a long conversation with a summary
//! that can be decided without I/O.
//!
//! Compaction is split in two. This module is the pure half: it builds the summary
//! request, reads the reply, shrinks the request when the provider says it is too long,
//! checks that the summary kept what matters, chooses what to restore, builds the
//! records that install the result, and keeps the guards that stop automatic compaction
//! from looping. The async driver in the daemon does the other half: it calls the
//! provider (with retries and back-off), runs hooks, reads files from disk, appends the
//! records durably and notifies. Every function here takes plain data (JSON values,
//! records, numbers) and returns plain data plus a report, so the whole recovery point
//! is tested without a runtime, a disk or a network.
//!
//! The order the driver follows:
//!
//! ```text
//! guards.check_auto(..)                      is automatic compaction allowed at all?
//! kept_tail_start(view) / partial_plan(..)   what stays verbatim; the rest is summarized
//! instruction = summary_instruction(..)      prompt text (prompt)
//! choose_fork(..)                            may the fork share the parent's cache?
//! fork_request(parent, ..)                   path 1: the parent body of the summarized
//!   or fallback_request(parent, ..)          part; path 2: rewritten input, own system
//!                                            (also when the fork gave no usable text)
//! on "prompt is too long": truncate_for_retry(body, ..), send again (ptl)
//! read_summary_reply(reply, attempt, ..)     summary, or ask once more (reply)
//! check_fidelity(summary, facts, budget)     append what the summary left out, bounded
//! plan_restoration(input)                    files, skills, plan, read-files digest
//! summary_message_text(..) + build_post_compact(..)   the records to append (install)
//! guards.record_success(..) / record_failure(..)
//! ```
//!
//! Layout:
//! - `prompt`: the summary instruction in its three forms, the ask-again note, and the
//!   text of the installed summary message. The wording lives in `templates/`.
//! - `request`: the fork and fallback request bodies, and when the fork is tried.
//! - `ptl`: dropping the oldest API rounds after a "prompt is too long" answer.
//! - `reply`: reading the `<summary>` out of a reply (reuses [`crate::summary`]).
//! - `fidelity`: what the summary must mention, and the section that adds what it missed.
//! - `restore`: which files, skills and plan come back after the summary, within budget.
//! - `install`: the post-compact records, the kept tail, partial compaction, undo.
//! - `guards`: circuit breaker, thrashing, and a fixed prefix compaction cannot shrink.
//! - `ladder`: the order of cheaper and costlier ways to make room.

pub mod ahead;
mod content;
mod fidelity;
mod guards;
mod install;
mod ladder;
pub mod lifecycle;
mod prompt;
mod ptl;
mod reply;
mod request;
mod restore;
mod text;

#[cfg(test)]
mod tests;

pub use fidelity::{
    DEFAULT_RECENT_TURNS, FidelityFacts, FidelityItem, FidelityOutcome, FidelityReport, OpenTodo, appended_budget,
    check_fidelity,
};
pub use guards::{
    AfterInstall, AutoDecision, CIRCUIT_BREAKER_FAILURES, CompactGuards, FailureRecord, GUARDS_RECORD, MAX_FOLLOW_UPS,
    StopReason, THRASH_REFILLS, THRASH_TURNS, THRASHING_MESSAGE,
};
pub use install::{
    AttachmentLinks, BATCH_FIELD, CompactionView, InstallError, InstallInput, KEPT_FROM, MAX_KEPT_SHARE, PartialPlan,
    PostCompact, RATE_FIELD, REQUEST_TOKENS_FIELD, SplitDirection, UNDO_SUBTYPE, UndoError, boundary_rate,
    boundary_request_tokens, build_post_compact, build_undo_record, carried_tokens, common_fields, compaction_view,
    is_undo_record, keep_tail, kept_tail, kept_tail_start, partial_plan, safe_split, stamp_request_tokens, tools_used,
    torn_install, undo_target,
};
pub use ladder::{
    DEFAULT_MIN_CUT_PERCENT, Ladder, LadderError, LadderPolicy, LadderStep, Rung, RungAttempt, RungOutcome, RungVerdict,
};
pub use prompt::{
    HistoryTools, KeptMessages, PromptForm, PromptSpec, SummaryMessage, fallback_system_prompt, history_tools_line,
    merge_instructions, reask_note, summary_instruction, summary_message_text,
};
pub use ptl::{MAX_PTL_RETRIES, Overflow, PtlCut, truncate_for_retry};
pub use reply::{ReplyAttempt, ReplyError, ReplyVerdict, read_summary_reply};
pub use request::{
    FALLBACK_MAX_TOKENS, FallbackOptions, FallbackReport, FallbackRequest, ForkChoice, ForkOptions, ForkReport,
    ForkRequest, ForkSkip, ForkStyle, MAX_CACHE_BREAKPOINTS, RequestError, ToolRefusal, choose_fork,
    count_cache_markers, fallback_request, fork_request,
};
pub use restore::{
    FileOutcome, FileReadEntry, MAX_DIGEST_TOKENS, MAX_FILE_TOKENS, MAX_RESTORED_FILES, MAX_SKILL_TOKENS,
    MAX_TOKENS_PER_FILE, MAX_TOKENS_PER_SKILL, PlanFile, PostCompactSizes, RESTORE_ROOM_PERCENT, RestoreBudget,
    RestoreInput, RestorePlan, RestoreReport, RestoredAttachment, SkillEntry, plan_restoration,
};

use serde::{Deserialize, Serialize};

/// What started a compaction. Written to the boundary's `compactMetadata.trigger`, and
/// the protocol's `trigger`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    /// The user asked (`compact [focus]`).
    Manual,
    /// The context reached the compact threshold.
    Auto,
    /// The provider refused a request as too long (or asked for long-context credits).
    Reactive,
    /// The session sat idle long enough with enough tokens.
    Idle,
    /// The user summarized from, or up to, a chosen message.
    Partial,
    /// A summary prepared ahead of time replaced the conversation.
    Precomputed,
}

impl Trigger {
    /// The value written to the transcript.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Manual => "manual",
            Trigger::Auto => "auto",
            Trigger::Reactive => "reactive",
            Trigger::Idle => "idle",
            Trigger::Partial => "partial",
            Trigger::Precomputed => "precomputed",
        }
    }

    /// The `trigger` field hooks receive, which knows only `manual` and `auto`: what
    /// the user asked for directly is manual, everything ctxd started is auto.
    pub fn hook_trigger(self) -> &'static str {
        match self {
            Trigger::Manual | Trigger::Partial => "manual",
            Trigger::Auto | Trigger::Reactive | Trigger::Idle | Trigger::Precomputed => "auto",
        }
    }

    /// True when ctxd started the compaction on its own: those failures count toward
    /// the circuit breaker, the user's own attempts do not.
    pub fn is_automatic(self) -> bool {
        self.hook_trigger() == "auto"
    }
}
