//! Stage 3: snip, the model-chosen removal of middle ranges.
//!
//! The model names records to drop (through the daemon's snip tool, by the `[id:…]` tags
//! this stage adds to user messages); the daemon appends a `ctxd-snip` record with their
//! uuids, and from then on the view leaves them out. Parent pointers are relinked across
//! the gap so the chain stays whole. What is protected, even when named:
//!
//! - the compaction summary (the recovery point);
//! - records carrying `tool_reference` blocks (they load tools the model may call);
//! - one half of a tool call: when a snip takes a `tool_use` but not its `tool_result`
//!   (or the reverse), the taken half is kept, so the pair is never split. This repeats
//!   until stable (keeping a response line can keep another of its calls).
//!
//! After enough growth without a snip, a context-efficiency reminder invites the model
//! to use the tool.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::Applied;
use super::config::SnipConfig;
use super::content::ContentRules;
use super::item::{Block, BlockKind, Item, Origin, Role};
use super::state::{Reminder, Snip};

/// The `[id:…]` tag of a record: the first eight letters and digits of its uuid, so the
/// same record has the same tag on every request.
pub fn id_tag(uuid: &str) -> String {
    let short: String = uuid.chars().filter(char::is_ascii_alphanumeric).take(8).collect();
    format!("[id:{short}]")
}

/// What applying the snips found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnipReport {
    /// Uuids named by snips that are in the view.
    pub requested: usize,
    pub removed: usize,
    /// Named but kept by a protection rule.
    pub protected: usize,
    pub tokens_freed: u64,
}

/// The snips resolved against a view: what to remove and how to relink.
#[derive(Debug, Clone, Default)]
pub struct SnipPlan {
    requested: HashSet<Arc<str>>,
    removed: HashSet<Arc<str>>,
    /// Parent of each removed record, for relinking across the gap.
    removed_parents: HashMap<Arc<str>, Option<Arc<str>>>,
    /// Tool ids held by removed records.
    removed_tool_ids: HashSet<Arc<str>>,
    tag: bool,
    pub report: SnipReport,
}

fn tool_ids(item: &Item) -> impl Iterator<Item = &Arc<str>> {
    item.blocks.iter().filter_map(|b| match &b.kind {
        BlockKind::ToolUse { id, .. } => Some(id),
        BlockKind::ToolResult(r) => Some(&r.tool_use_id),
        _ => None,
    })
}

fn is_protected(item: &Item) -> bool {
    item.origin == Origin::CompactSummary
        || item.blocks.iter().any(|b| b.result().is_some_and(|r| r.has_tool_reference))
}

/// Resolves the snips against the items of the view; `rules` say what removed items
/// would have cost in the request.
pub fn plan_snips(items: &[Item], snips: &[Snip], config: &SnipConfig, rules: &ContentRules<'_>) -> SnipPlan {
    let requested: HashSet<Arc<str>> =
        snips.iter().flat_map(|s| s.removed_uuids.iter()).map(|u| Arc::from(u.as_str())).collect();
    let named: Vec<usize> = items
        .iter()
        .enumerate()
        .filter(|(_, item)| item.uuid.as_ref().is_some_and(|u| requested.contains(u)))
        .map(|(i, _)| i)
        .collect();
    let mut removed: Vec<bool> = vec![false; items.len()];
    for &i in &named {
        removed[i] = !is_protected(&items[i]);
    }
    // Keep the half of any tool call whose other half stays, until nothing changes.
    let mut kept_ids: HashSet<&Arc<str>> =
        items.iter().zip(&removed).filter(|(_, r)| !**r).flat_map(|(item, _)| tool_ids(item)).collect();
    loop {
        let mut changed = false;
        for &i in &named {
            if removed[i] && tool_ids(&items[i]).any(|id| kept_ids.contains(id)) {
                removed[i] = false;
                kept_ids.extend(tool_ids(&items[i]));
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut plan = SnipPlan { requested, tag: config.enabled, ..SnipPlan::default() };
    plan.report.requested = named.len();
    for &i in &named {
        let item = &items[i];
        let Some(uuid) = &item.uuid else { continue };
        if removed[i] {
            plan.removed.insert(uuid.clone());
            plan.removed_parents.insert(uuid.clone(), item.parent_uuid.clone());
            plan.removed_tool_ids.extend(tool_ids(item).cloned());
            plan.report.removed += 1;
            plan.report.tokens_freed += rules.item_tokens(item);
        } else {
            plan.report.protected += 1;
        }
    }
    plan
}

impl SnipPlan {
    /// One item through the plan: `None` when removed (or, with `include_snipped`,
    /// marked), its parent relinked past removed records, and its tag added.
    pub fn project(&self, mut item: Item, include_snipped: bool) -> Option<Item> {
        if item.uuid.as_ref().is_some_and(|u| self.removed.contains(u)) {
            if !include_snipped {
                return None;
            }
            item.snipped = true;
            return Some(item);
        }
        if !self.removed.is_empty() {
            let mut parent = item.parent_uuid.take();
            while let Some(p) = parent.as_ref().filter(|p| self.removed.contains(*p)) {
                parent = self.removed_parents.get(p).cloned().flatten();
            }
            item.parent_uuid = parent;
        }
        if self.tag
            && item.role == Role::User
            && matches!(item.origin, Origin::Prompt | Origin::ToolResults)
            && let Some(tag) = item.uuid.as_deref().map(id_tag).and_then(|t| Block::text(&t))
        {
            item.blocks.push(tag);
        }
        Some(item)
    }

    /// True when the record with this uuid is removed.
    pub fn removes(&self, uuid: &str) -> bool {
        self.removed.contains(uuid)
    }

    /// True when a newly appended item interacts with the snips (it is named by one, or
    /// holds a tool id of a removed record), so the plan must be made again.
    pub fn touches(&self, item: &Item) -> bool {
        item.uuid.as_ref().is_some_and(|u| self.requested.contains(u))
            || (!self.removed_tool_ids.is_empty() && tool_ids(item).any(|id| self.removed_tool_ids.contains(id)))
    }
}

/// The reminder, when the view grew enough without a snip.
pub fn efficiency_reminder(growth_tokens: u64, config: &SnipConfig) -> Option<Reminder> {
    if !config.enabled || growth_tokens < config.reminder_after_tokens {
        return None;
    }
    let text = format!(
        "<system-reminder>\nThis conversation has grown by about {growth_tokens} tokens since messages were last removed from it. \
         If some earlier messages no longer matter for the task (finished explorations, superseded file contents, long outputs already acted on), \
         remove them with the snip tool, naming them by their [id:…] tags. Keep the task, its constraints and anything still relied on.\n</system-reminder>"
    );
    Some(Reminder { growth_tokens, text })
}

/// The stage: resolves the snips and projects every item.
pub fn apply_snips(
    items: Vec<Item>,
    snips: &[Snip],
    config: &SnipConfig,
    rules: &ContentRules<'_>,
    include_snipped: bool,
) -> (Vec<Item>, SnipPlan) {
    let plan = plan_snips(&items, snips, config, rules);
    let items = items.into_iter().filter_map(|item| plan.project(item, include_snipped)).collect();
    (items, plan)
}

/// The stage's report.
pub(crate) fn snip_applied(report: &SnipReport, tags: bool, reminder: Option<&Reminder>) -> Applied {
    let mut detail = format!("{} named, {} removed, {} protected", report.requested, report.removed, report.protected);
    if tags {
        detail.push_str("; id tags on");
    }
    if let Some(r) = reminder {
        detail.push_str(&format!("; reminder after {} tokens", r.growth_tokens));
    }
    Applied {
        stage: super::Stage::Snip,
        acted: report.removed > 0 || reminder.is_some(),
        tokens_freed: report.tokens_freed,
        detail,
    }
}
