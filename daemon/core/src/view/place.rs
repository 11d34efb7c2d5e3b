//! Stage 7: where the base context and per-request extras go.
//!
//! System context (git facts captured at session start) is appended to the host's system
//! blocks. User context (memory files, the date) becomes the first message: a meta user
//! message wrapped in `<system-reminder>`; the wrapper does not change its role, and
//! normalization merges it with a user message that follows. Extras the daemon passes
//! for this request only (changed-file notes, budget notices, the context-efficiency
//! reminder, a fork's instruction) join the last user message as text blocks; when the
//! view ends with a response they form a new last user message.

use serde_json::{Value, json};

use super::Applied;
use super::item::{Item, Origin};
use super::state::Reminder;

/// The memoized base context and this request's extras.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BaseContext {
    pub system_context: Option<String>,
    pub user_context: Option<String>,
    /// Text blocks for the last user message of this request only.
    pub attachments: Vec<String>,
}

/// A side request sharing the session's prefix (a compaction summary, for one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fork {
    pub instruction: String,
    /// Do not write the fork's tail to the cache: mark the end of the shared prefix.
    pub skip_cache_write: bool,
}

/// The system blocks: the host's, then the system context.
pub fn system_blocks(host: &[Value], system_context: Option<&str>) -> Vec<Value> {
    let mut blocks = host.to_vec();
    if let Some(text) = system_context.filter(|t| !t.trim().is_empty()) {
        blocks.push(json!({"type": "text", "text": text}));
    }
    blocks
}

/// The first item of the view: the user context, wrapped.
pub fn context_item(user_context: Option<&str>) -> Option<Item> {
    let text = user_context.filter(|t| !t.trim().is_empty())?;
    Some(Item::user_text(Origin::Context, &format!("<system-reminder>\n{text}\n</system-reminder>")))
}

/// The items added after the view for this request, in order: attachments, the
/// reminder, the fork's instruction.
pub fn extra_items(attachments: &[String], reminder: Option<&Reminder>, fork: Option<&Fork>) -> Vec<Item> {
    let attachments = attachments.iter().map(|text| Item::user_text(Origin::Extra, text));
    let reminder = reminder.map(|r| Item::user_text(Origin::Extra, &r.text));
    let fork = fork.map(|f| Item::user_text(Origin::ForkInstruction, &f.instruction));
    attachments.chain(reminder).chain(fork).filter(|i| !i.blocks.is_empty()).collect()
}

/// The stage over a whole view: context first, extras last.
pub fn place_base_context(
    items: Vec<Item>,
    base: &BaseContext,
    reminder: Option<&Reminder>,
    fork: Option<&Fork>,
) -> Vec<Item> {
    context_item(base.user_context.as_deref())
        .into_iter()
        .chain(items)
        .chain(extra_items(&base.attachments, reminder, fork))
        .collect()
}

/// The stage's report.
pub(crate) fn place_applied(base: &BaseContext, extras: usize) -> Applied {
    let system = base.system_context.as_deref().is_some_and(|t| !t.trim().is_empty());
    let user = base.user_context.as_deref().is_some_and(|t| !t.trim().is_empty());
    Applied {
        stage: super::Stage::Place,
        acted: system || user || extras > 0,
        tokens_freed: 0,
        detail: format!(
            "system context {}, user context {}, {extras} extra blocks",
            if system { "appended" } else { "none" },
            if user { "first" } else { "none" }
        ),
    }
}
