//! Stage 5: committed span summaries replace their spans at read time.
//!
//! A collapse names the first and last record of a span (view order) and a summary of
//! it: `M1 M2 … M10` with `C1 = summary(M2…M8)` reads as `M1 C1 M9 M10`. The transcript
//! keeps the originals. Collapses apply in commit order; a later one whose span contains
//! an earlier summary absorbs it, and one whose endpoints are not both in the view (not
//! appended yet, before the boundary, snipped) waits. A tool call cut in two by a span
//! edge is repaired by normalization (the orphaned half becomes text).

use std::collections::HashSet;
use std::sync::Arc;

use super::Applied;
use super::config::CollapseConfig;
use super::content::ContentRules;
use super::item::{Item, Origin};
use super::state::Collapse;

/// The text standing for a collapsed span.
pub fn summary_item(collapse: &Collapse) -> Item {
    let text = format!("[Earlier messages, collapsed into a summary]\n\n{}", collapse.summary);
    Item::user_text(Origin::Collapse, &text)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Item(usize),
    Summary(usize),
}

/// The collapses resolved against a view.
#[derive(Debug, Clone, Default)]
pub struct CollapsePlan {
    slots: Vec<Slot>,
    /// Endpoints not found: a record appended later with one of these uuids means the
    /// plan must be made again.
    unresolved: HashSet<Arc<str>>,
    pub applied: usize,
    pub tokens_freed: u64,
    /// Tokens freed by each collapse, by its index in the list given.
    freed: Vec<u64>,
    /// For each input item, the collapse whose summary stands for it in the view.
    covered: Vec<Option<usize>>,
}

/// Resolves the collapses against the items (after snips); `rules` say what the
/// replaced items would have cost in the request.
pub fn plan_collapses(
    items: &[Item],
    collapses: &[Collapse],
    config: &CollapseConfig,
    rules: &ContentRules<'_>,
) -> CollapsePlan {
    let mut plan = CollapsePlan { slots: (0..items.len()).map(Slot::Item).collect(), ..CollapsePlan::default() };
    if !config.enabled {
        return plan;
    }
    plan.freed = vec![0; collapses.len()];
    plan.covered = vec![None; items.len()];
    let mut absorbed: Vec<Option<usize>> = vec![None; collapses.len()];
    let slot_tokens = |slot: &Slot| match slot {
        Slot::Item(i) => rules.item_tokens(&items[*i]),
        Slot::Summary(k) => summary_item(&collapses[*k]).tokens(),
    };
    for (k, collapse) in collapses.iter().enumerate() {
        let find = |uuid: &str| {
            plan.slots.iter().position(|s| matches!(s, Slot::Item(i) if items[*i].uuid.as_deref() == Some(uuid)))
        };
        match (find(&collapse.from), find(&collapse.to)) {
            (Some(from), Some(to)) if from <= to => {
                let span: u64 = plan.slots[from..=to].iter().map(slot_tokens).sum();
                plan.freed[k] = span.saturating_sub(summary_item(collapse).tokens());
                for slot in plan.slots.splice(from..=to, [Slot::Summary(k)]) {
                    match slot {
                        Slot::Item(i) => plan.covered[i] = Some(k),
                        Slot::Summary(j) => absorbed[j] = Some(k),
                    }
                }
                plan.applied += 1;
            }
            (from, to) => {
                if from.is_none() {
                    plan.unresolved.insert(Arc::from(collapse.from.as_str()));
                }
                if to.is_none() {
                    plan.unresolved.insert(Arc::from(collapse.to.as_str()));
                }
            }
        }
    }
    // An item in a span that a later collapse absorbed is stood for by the later one.
    for covered in plan.covered.iter_mut() {
        while let Some(later) = covered.and_then(|k| absorbed[k]) {
            *covered = Some(later);
        }
    }
    let kept: u64 = plan.slots.iter().map(slot_tokens).sum();
    let before: u64 = items.iter().map(|i| rules.item_tokens(i)).sum();
    plan.tokens_freed = before.saturating_sub(kept);
    plan
}

impl CollapsePlan {
    /// For each input item, whether it is still in the view.
    pub fn survivors(&self, len: usize) -> Vec<bool> {
        let mut out = vec![false; len];
        for slot in &self.slots {
            if let Slot::Item(i) = slot
                && let Some(s) = out.get_mut(*i)
            {
                *s = true;
            }
        }
        out
    }

    /// The view with the spans replaced.
    pub fn apply(&self, items: Vec<Item>, collapses: &[Collapse]) -> Vec<Item> {
        if self.applied == 0 {
            return items;
        }
        let mut items: Vec<Option<Item>> = items.into_iter().map(Some).collect();
        self.slots
            .iter()
            .filter_map(|slot| match slot {
                Slot::Item(i) => items.get_mut(*i).and_then(Option::take),
                Slot::Summary(k) => collapses.get(*k).map(summary_item),
            })
            .collect()
    }

    /// For each input item, the index of the collapse whose summary stands for it in the
    /// view (`None`: the item itself is there). Empty when collapses are off.
    pub fn covering(&self) -> &[Option<usize>] {
        &self.covered
    }

    /// Tokens the collapse at index `k` freed (0 when it did not apply).
    pub fn freed_by(&self, k: usize) -> u64 {
        self.freed.get(k).copied().unwrap_or(0)
    }

    /// True when a newly appended item is an endpoint the plan is waiting for.
    pub fn touches(&self, item: &Item) -> bool {
        item.uuid.as_ref().is_some_and(|u| self.unresolved.contains(u))
    }
}

/// The stage.
pub fn apply_collapses(
    items: Vec<Item>,
    collapses: &[Collapse],
    config: &CollapseConfig,
    rules: &ContentRules<'_>,
) -> (Vec<Item>, Applied) {
    let plan = plan_collapses(&items, collapses, config, rules);
    let applied = collapse_applied(&plan, collapses.len());
    (plan.apply(items, collapses), applied)
}

/// The stage's report.
pub(crate) fn collapse_applied(plan: &CollapsePlan, committed: usize) -> Applied {
    Applied {
        stage: super::Stage::Collapse,
        acted: plan.applied > 0,
        tokens_freed: plan.tokens_freed,
        detail: format!("{} of {committed} collapses applied", plan.applied),
    }
}
