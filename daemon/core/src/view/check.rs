//! Stage 6: should the session compact before this request is sent?
//!
//! A decision only; the actor runs the compaction and assembles again. The token count
//! is the provider-anchored one when the caller has it (the last response's usage plus
//! an estimate after it), minus what this request's valves freed, since the anchored
//! figure still counts what snip, microcompact and collapse removed; otherwise the
//! estimate of the request itself.

use super::Applied;

/// What the check decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactDecision {
    Continue,
    Compact { tokens: u64, threshold: u64 },
}

/// The inputs of the check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactCheck {
    /// The auto-compact threshold; `None` when auto compaction is off.
    pub threshold: Option<u64>,
    /// Tokens the provider reported for the session, plus the estimate after it.
    pub anchored_tokens: Option<u64>,
}

/// Decides from the request estimate and the tokens the valves freed.
pub fn check_compaction(check: &CompactCheck, estimate_tokens: u64, freed_tokens: u64) -> (CompactDecision, Applied) {
    let tokens = match check.anchored_tokens {
        Some(anchored) => anchored.saturating_sub(freed_tokens),
        None => estimate_tokens,
    };
    let decision = match check.threshold {
        Some(threshold) if tokens >= threshold => CompactDecision::Compact { tokens, threshold },
        _ => CompactDecision::Continue,
    };
    let detail = match check.threshold {
        Some(threshold) => format!("{tokens} of {threshold} tokens"),
        None => format!("{tokens} tokens, no threshold"),
    };
    let applied = Applied {
        stage: super::Stage::CompactCheck,
        acted: matches!(decision, CompactDecision::Compact { .. }),
        tokens_freed: 0,
        detail,
    };
    (decision, applied)
}
