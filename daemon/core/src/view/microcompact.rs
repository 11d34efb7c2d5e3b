//! Stage 4: microcompact, clearing old tool results without summarizing anything.
//!
//! One of three things happens per request:
//!
//! - **time gap**: the last response is older than the prompt cache lives, so the cache is
//!   presumed cold and rewriting the prefix costs nothing extra. The content of old
//!   results of eligible tools becomes a placeholder, keeping the most recent few, if
//!   that saves enough. The cleared ids are recorded (`ctxd-microcompact`) and stay
//!   cleared on every later request; a gap is handled once (keyed by the response it
//!   follows).
//! - **cache edits** (provider support, `cache_editing`): messages stay as they are;
//!   every tool result carries a `cache_reference` (its `tool_use_id`) and a
//!   `cache_edits` block deleting old results is pinned to the last user record and sent
//!   again, identical, on every later request.
//! - nothing.
//!
//! Savings and "most recent" are counted over the results the request will carry (after
//! snips and collapses): clearing a result a collapse already hides saves nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::json;

use super::Applied;
use super::config::MicrocompactConfig;
use super::content::{ContentRules, placeholder_tokens};
use super::ingest::LastResponse;
use super::item::{Block, Item, Role};
use super::raw;
use super::state::{MicrocompactRecord, PinnedEdits, PipelineState, Replacement, Trigger};

/// What a cleared result's content becomes.
pub const CLEARED: &str = "[Old tool result content cleared]";

/// A result block with its content replaced by the placeholder.
pub fn cleared(block: &Block) -> Block {
    match block.result() {
        Some(r) if !r.cleared => block.rebuild_result(&[("content", &raw::string(CLEARED))], |r| {
            r.cleared = true;
            r.replaced = false;
        }),
        _ => block.clone(),
    }
}

/// A result block carrying `cache_reference` = its `tool_use_id`.
pub fn with_cache_reference(block: &Block) -> Block {
    match block.result() {
        Some(r) if !r.cache_reference => {
            let id = raw::string(&r.tool_use_id);
            block.rebuild_result(&[("cache_reference", &id)], |r| r.cache_reference = true)
        }
        _ => block.clone(),
    }
}

/// A `cache_edits` block deleting the given references.
pub fn cache_edits_block(tool_use_ids: &[&str]) -> Option<Block> {
    if tool_use_ids.is_empty() {
        return None;
    }
    let edits: Vec<_> = tool_use_ids.iter().map(|id| json!({"type": "delete", "cache_reference": id})).collect();
    Some(Block::cache_edits(raw::to_raw(&json!({"type": "cache_edits", "edits": edits}))))
}

/// Tokens a cleared result still costs: the block around the placeholder.
fn cleared_tokens(tool_use_id: &str) -> u64 {
    placeholder_tokens(CLEARED, tool_use_id)
}

/// What a decision looks at.
pub struct DecideInput<'a> {
    /// Tool-result blocks the request will carry, in order.
    pub results: &'a [&'a Block],
    pub tool_names: &'a HashMap<Arc<str>, Arc<str>>,
    pub state: &'a PipelineState,
    /// Replacements decided by this request's budget stage (not recorded yet).
    pub decided: &'a BTreeMap<String, Replacement>,
    pub last_response: Option<&'a LastResponse>,
    /// The last user record of the view: where new cache edits are pinned.
    pub last_user_uuid: Option<&'a str>,
    pub now_ms: i64,
    pub config: &'a MicrocompactConfig,
}

/// Whether microcompact could act at all (a cold cache whose gap is not handled yet,
/// or cache editing on): a cheap test before the results are gathered.
pub fn may_act(
    state: &PipelineState,
    last_response: Option<&LastResponse>,
    now_ms: i64,
    config: &MicrocompactConfig,
) -> bool {
    if !config.enabled {
        return false;
    }
    match last_response.and_then(|last| Some((last.uuid.as_ref()?, last.timestamp_ms?))) {
        Some((uuid, at)) if now_ms.saturating_sub(at) > config.cache_ttl_ms => {
            !state.handled_gaps.contains(uuid.as_ref())
        }
        _ => config.cache_editing,
    }
}

/// Decides whether microcompact acts on this request; returns the record and the tokens
/// it saves.
pub fn decide(input: &DecideInput<'_>) -> Option<(MicrocompactRecord, u64)> {
    let config = input.config;
    if !may_act(input.state, input.last_response, input.now_ms, config) {
        return None;
    }
    let eligible: Vec<&Block> = input
        .results
        .iter()
        .copied()
        .filter(|b| {
            b.result()
                .and_then(|r| input.tool_names.get(&r.tool_use_id))
                .is_some_and(|name| config.eligible_tools.iter().any(|t| t == name.as_ref()))
        })
        .collect();
    let old = &eligible[..eligible.len().saturating_sub(config.keep_recent)];
    let tokens = |b: &Block| -> u64 {
        let Some(r) = b.result() else { return 0 };
        let id = r.tool_use_id.as_ref();
        match input.state.replacements.get(id).or_else(|| input.decided.get(id)) {
            Some(rep) => super::budget::replaced(b, rep).tokens(),
            None => b.tokens(),
        }
    };
    let id_of = |b: &Block| b.result().map(|r| r.tool_use_id.to_string()).unwrap_or_default();

    let gap = input.last_response.and_then(|last| Some((last.uuid.as_ref()?, last.timestamp_ms?)));
    if let Some((uuid, at)) = gap
        && input.now_ms.saturating_sub(at) > config.cache_ttl_ms
    {
        // A cold cache: rewriting is free, cache edits would be pointless.
        if input.state.handled_gaps.contains(uuid.as_ref()) {
            return None;
        }
        let clear: Vec<&Block> = old
            .iter()
            .copied()
            .filter(|b| b.result().is_some_and(|r| !r.cleared && !input.state.cleared.contains(r.tool_use_id.as_ref())))
            .collect();
        let saved: u64 = clear.iter().map(|b| tokens(b).saturating_sub(cleared_tokens(&id_of(b)))).sum();
        if clear.is_empty() || saved < config.min_saved_tokens {
            return None;
        }
        let record = MicrocompactRecord {
            trigger: Trigger::TimeGap,
            gap_after_uuid: Some(uuid.to_string()),
            pinned_to_uuid: None,
            cleared_tool_use_ids: clear.iter().map(|b| id_of(b)).collect(),
        };
        return Some((record, saved));
    }
    if !config.cache_editing {
        return None;
    }
    let pin = input.last_user_uuid?;
    let deleted = input.state.deleted_by_cache_edits();
    let delete: Vec<&Block> = old
        .iter()
        .copied()
        .filter(|b| {
            b.result().is_some_and(|r| {
                !r.cleared
                    && !input.state.cleared.contains(r.tool_use_id.as_ref())
                    && !deleted.contains(r.tool_use_id.as_ref())
            })
        })
        .collect();
    let saved: u64 = delete.iter().map(|b| tokens(b)).sum();
    if delete.is_empty() || saved < config.min_saved_tokens {
        return None;
    }
    let record = MicrocompactRecord {
        trigger: Trigger::CacheEdits,
        gap_after_uuid: None,
        pinned_to_uuid: Some(pin.to_string()),
        cleared_tool_use_ids: delete.iter().map(|b| id_of(b)).collect(),
    };
    Some((record, saved))
}

/// The `cache_edits` block of each pinned user record, keeping only deletions of
/// results present in the view (a reference to a block that is not sent would be
/// dangling).
pub fn pinned_blocks(edits: &[PinnedEdits], present: &HashSet<Arc<str>>) -> HashMap<Arc<str>, Vec<Block>> {
    let mut out: HashMap<Arc<str>, Vec<Block>> = HashMap::new();
    for pinned in edits {
        let ids: Vec<&str> =
            pinned.tool_use_ids.iter().map(String::as_str).filter(|id| present.contains(*id)).collect();
        if let Some(block) = cache_edits_block(&ids) {
            out.entry(Arc::from(pinned.pinned_to_uuid.as_str())).or_default().push(block);
        }
    }
    out
}

/// Adds the pinned `cache_edits` blocks to their user items.
pub fn attach_pinned(items: &mut [Item], pinned: &HashMap<Arc<str>, Vec<Block>>) {
    if pinned.is_empty() {
        return;
    }
    for item in items.iter_mut().filter(|i| i.role == Role::User) {
        if let Some(blocks) = item.uuid.as_ref().and_then(|u| pinned.get(u)) {
            item.blocks.extend(blocks.iter().cloned());
        }
    }
}

/// Result ids of the given items, for [`pinned_blocks`].
pub fn result_ids<'a>(items: impl Iterator<Item = &'a Item>) -> HashSet<Arc<str>> {
    items.flat_map(|i| i.blocks.iter()).filter_map(|b| b.result().map(|r| r.tool_use_id.clone())).collect()
}

/// The stage: cleared results become the placeholder; with cache editing, results carry
/// their `cache_reference` and pinned edits are attached. `present` are the result ids
/// the request will carry (after collapses).
pub fn microcompact(
    mut items: Vec<Item>,
    state: &PipelineState,
    present: &HashSet<Arc<str>>,
    config: &MicrocompactConfig,
) -> Vec<Item> {
    let pinned = if config.cache_editing { pinned_blocks(&state.cache_edits, present) } else { HashMap::new() };
    attach_pinned(&mut items, &pinned);
    let rules = ContentRules { cleared: &state.cleared, cache_reference: config.cache_editing, ..ContentRules::NONE };
    items.into_iter().map(|item| rules.apply_to_item(item)).collect()
}

/// The stage's report.
pub(crate) fn microcompact_applied(decision: Option<&(MicrocompactRecord, u64)>, after: &PipelineState) -> Applied {
    let totals =
        format!("{} cleared, {} deleted by cache edits", after.cleared.len(), after.deleted_by_cache_edits().len());
    match decision {
        Some((record, saved)) => Applied {
            stage: super::Stage::Microcompact,
            acted: true,
            tokens_freed: *saved,
            detail: format!("{}: {} results; {totals}", record.trigger.as_str(), record.cleared_tool_use_ids.len()),
        },
        None => Applied {
            stage: super::Stage::Microcompact,
            acted: false,
            tokens_freed: 0,
            detail: format!("unchanged; {totals}"),
        },
    }
}
