//! Shrinking a summary request the provider refused as too long.
//!
//! The summary request carries the conversation that filled the window, so it can be
//! refused itself ("prompt is too long: N tokens > M maximum"). The only input that can
//! go without breaking the request is the oldest history: whole API rounds (an assistant
//! response and the user message carrying its tool results) are dropped from the front,
//! keeping the first user message (usually the task and its constraints) for as long as
//! possible and never touching the last round, which holds the instruction. This loses
//! information, so it is bounded: [`MAX_PTL_RETRIES`] retries, then the compaction
//! fails.
//!
//! The same function serves both paths because it works on the request body that was
//! actually sent: the fork's (the parent's messages plus the instruction) or the
//! fallback's (already rewritten).

use serde_json::{Value, json};

use super::content::{blocks, role};
use super::text::json_tokens;

/// Retries after "prompt is too long" before the compaction fails.
pub const MAX_PTL_RETRIES: u32 = 3;

/// Extra tokens dropped beyond the reported overflow, on top of a tenth of it: the
/// estimate and the provider's count never agree exactly.
const MARGIN_TOKENS: u64 = 2_000;

/// Without numbers from the provider, drop this share of the droppable history.
const UNKNOWN_OVERFLOW_SHARE: u64 = 4;

/// Note added to the first message once history after it was dropped.
const GAP_NOTE: &str = "[Earlier messages that followed this one were left out so that the summary request fits.]";
/// The first message, once it had to go too.
const HEAD_GONE: &str = "[The start of this conversation was left out so that the summary request fits.]";

/// What the provider said: `tokens` in the prompt, `max` allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    pub tokens: u64,
    pub max: u64,
}

/// A shrunk request.
#[derive(Debug, Clone, PartialEq)]
pub struct PtlCut {
    pub body: Value,
    /// API rounds dropped.
    pub dropped_groups: usize,
    /// Messages dropped (the first message replaced by a placeholder counts).
    pub dropped_messages: usize,
    /// Estimated tokens of what was dropped.
    pub dropped_tokens: u64,
    /// Estimated tokens this cut aimed to drop.
    pub needed_tokens: u64,
    /// The first user message had to go as well.
    pub head_dropped: bool,
}

/// Drops the oldest API rounds from `body` (the summary request last sent) so that it
/// fits, or returns `None` when `retries_done` reached [`MAX_PTL_RETRIES`] or nothing
/// more can be dropped.
///
/// How much: the overflow `N − M` converted into estimate units with the ratio between
/// the provider's count and this body's estimate (whichever is larger, so a wrong
/// estimate errs toward dropping more), plus a tenth and 2,000 tokens. Without
/// numbers, a quarter of the droppable history. When every round is gone and that is
/// still not enough, the first message is replaced by a short placeholder; a cut that
/// drops everything droppable is returned even if the estimate says it may not be
/// enough, and the next refusal ends the retries.
pub fn truncate_for_retry(body: &Value, overflow: Option<Overflow>, retries_done: u32) -> Option<PtlCut> {
    if retries_done >= MAX_PTL_RETRIES {
        return None;
    }
    let messages = body.get("messages").and_then(Value::as_array)?;
    if messages.is_empty() {
        return None;
    }
    let layout = Layout::of(messages);
    let droppable: u64 = layout.groups.iter().map(|g| g.tokens).sum();
    // The head can go only while something after it carries the instruction.
    let head_droppable =
        layout.head.is_some_and(|h| h < layout.keep_from && h + 1 < messages.len() && !is_placeholder(&messages[h]));
    if layout.groups.is_empty() && !head_droppable {
        return None;
    }

    let needed = match overflow {
        Some(o) if o.tokens > o.max => {
            let over = o.tokens - o.max;
            let estimate = json_tokens(body);
            let scaled = u64::try_from(u128::from(over) * u128::from(estimate) / u128::from(o.tokens.max(1)))
                .unwrap_or(u64::MAX);
            over.max(scaled) + over / 10 + MARGIN_TOKENS
        }
        _ => (droppable / UNKNOWN_OVERFLOW_SHARE).max(1),
    };

    let mut dropped_tokens = 0u64;
    let mut dropped_groups = 0usize;
    for group in &layout.groups {
        if dropped_tokens >= needed {
            break;
        }
        dropped_tokens += group.tokens;
        dropped_groups += 1;
    }
    let head_dropped = dropped_tokens < needed && head_droppable;
    let dropped_range_end = if dropped_groups == 0 { layout.keep_from } else { layout.groups[dropped_groups - 1].end };
    let first_kept = layout.groups.first().map_or(layout.keep_from, |g| g.start);
    let mut dropped_messages = dropped_range_end - first_kept;

    let mut out: Vec<Value> = Vec::with_capacity(messages.len());
    match layout.head {
        Some(h) if head_dropped => {
            dropped_tokens += json_tokens(&messages[h]);
            dropped_messages += 1;
            out.push(json!({"role": "user", "content": [{"type": "text", "text": HEAD_GONE}]}));
        }
        Some(h) => {
            let mut head = messages[h].clone();
            if dropped_groups > 0 && !has_gap_note(&head) {
                let mut content = blocks(head.get("content").unwrap_or(&Value::Null));
                content.push(json!({"type": "text", "text": GAP_NOTE}));
                if let Some(object) = head.as_object_mut() {
                    object.insert("content".to_owned(), Value::Array(content));
                }
            }
            out.push(head);
        }
        None => out.push(json!({"role": "user", "content": [{"type": "text", "text": HEAD_GONE}]})),
    }
    out.extend(messages[dropped_range_end.max(first_kept)..].iter().cloned());
    if dropped_messages == 0 && !head_dropped {
        return None;
    }

    let mut body = body.clone();
    if let Some(object) = body.as_object_mut() {
        object.insert("messages".to_owned(), Value::Array(out));
    }
    Some(PtlCut { body, dropped_groups, dropped_messages, dropped_tokens, needed_tokens: needed, head_dropped })
}

/// One API round: an assistant message and the user messages after it.
#[derive(Debug, Clone, Copy)]
struct Group {
    start: usize,
    end: usize,
    tokens: u64,
}

/// The head (first user message), the droppable rounds after it, and where the kept
/// tail starts: the last assistant message, whose round holds the instruction.
struct Layout {
    head: Option<usize>,
    groups: Vec<Group>,
    keep_from: usize,
}

impl Layout {
    fn of(messages: &[Value]) -> Layout {
        let head = (role(&messages[0]) == "user").then_some(0);
        let first = usize::from(head.is_some());
        let last_assistant = messages.iter().rposition(|m| role(m) == "assistant");
        let keep_from = match last_assistant {
            Some(a) if a >= first => a,
            // No assistant message after the head: only the last message is kept.
            _ => (messages.len() - 1).max(first),
        };
        let mut groups: Vec<Group> = Vec::new();
        let mut i = first;
        while i < keep_from {
            let start = i;
            i += 1;
            // A round runs to the next assistant message.
            while i < keep_from && role(&messages[i]) != "assistant" {
                i += 1;
            }
            let tokens = messages[start..i].iter().map(json_tokens).sum();
            groups.push(Group { start, end: i, tokens });
        }
        Layout { head, groups, keep_from }
    }
}

fn text_blocks_contain(message: &Value, needle: &str) -> bool {
    blocks(message.get("content").unwrap_or(&Value::Null))
        .iter()
        .any(|b| b.get("text").and_then(Value::as_str) == Some(needle))
}

fn is_placeholder(message: &Value) -> bool {
    text_blocks_contain(message, HEAD_GONE)
}

fn has_gap_note(message: &Value) -> bool {
    text_blocks_contain(message, GAP_NOTE)
}
