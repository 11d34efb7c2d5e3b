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
use super::item::{BlockKind, Item, Origin, Role};
use super::raw::Fields;
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

/// Which of ctxd's base-context sources the host's own records in the view already
/// carry. ctxd leaves those out of its context so the request holds one copy of each:
/// Claude Code writes its memory files (`instructions`), the date (`date`) and its git
/// snapshot (`session_context`) into the transcript as rendered attachments, and other
/// hosts may date their opening message themselves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCarries {
    pub memory: bool,
    pub date: bool,
    pub git: bool,
}

impl HostCarries {
    /// What the items of a view carry.
    pub fn of(items: &[Item]) -> HostCarries {
        let mut carries = HostCarries { date: host_states_date(items), ..HostCarries::default() };
        items.iter().for_each(|item| carries.note(item));
        carries
    }

    /// Takes one more item of the view into account (attachments only: the opening's
    /// reminders are [`host_states_date`]'s).
    pub fn note(&mut self, item: &Item) {
        let Origin::Attachment(kind) = &item.origin else { return };
        match kind.as_ref() {
            "instructions" => self.memory = true,
            "date" => self.date = true,
            "session_context" => self.git = true,
            _ => {}
        }
    }
}

/// The first item of the view: the user context, wrapped, without the parts the host
/// carries itself (see [`HostCarries`]).
pub fn context_item(user_context: Option<&str>, host: HostCarries) -> Option<Item> {
    let (memory, date) = crate::memory::split_date_line(user_context?);
    let mut text = if host.memory { "" } else { memory }.to_owned();
    if let Some(date) = date.filter(|_| !host.date) {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(date);
    }
    if text.trim().is_empty() {
        return None;
    }
    Some(Item::user_text(Origin::Context, &format!("<system-reminder>\n{text}\n</system-reminder>")))
}

/// The system context unless the host carries its own git snapshot.
pub fn system_context(base: &BaseContext, host: HostCarries) -> Option<&str> {
    base.system_context.as_deref().filter(|_| !host.git)
}

/// Phrases a host uses to state the date in its context reminder (lowercase).
const DATE_PHRASES: &[&str] = &["today's date is", "today is ", "current date", "currentdate"];

/// True when the host's opening (the user items before the first response) states
/// the date inside a `<system-reminder>`, as hosts that build their own context do.
/// Only reminders count: a user who types "today is Friday" has not dated the request.
/// After a compaction the opening is the summary, and ctxd's date is back.
pub fn host_states_date(items: &[Item]) -> bool {
    items
        .iter()
        .take_while(|item| item.role == Role::User)
        .filter(|item| matches!(item.origin, Origin::Prompt | Origin::Meta | Origin::Attachment(_)))
        .flat_map(|item| item.blocks.iter())
        .filter(|block| block.kind == BlockKind::Text)
        .filter_map(|block| Fields::parse(block.json())?.str("text").map(|t| t.to_lowercase()))
        .any(|text| reminders(&text).any(|reminder| DATE_PHRASES.iter().any(|p| reminder.contains(p))))
}

/// The bodies of the `<system-reminder>` blocks in `text`.
fn reminders(text: &str) -> impl Iterator<Item = &str> {
    text.split("<system-reminder>").skip(1).map(|rest| rest.split("</system-reminder>").next().unwrap_or(rest))
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
    let host = HostCarries::of(&items);
    context_item(base.user_context.as_deref(), host)
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
