//! The view cache: per-turn cost follows the change, not the session.
//!
//! The daemon keeps one [`ViewCache`] per session between requests. It holds three
//! layers, each reused as long as its inputs are unchanged:
//!
//! 1. the parsed items of the records after the latest boundary ([`Ingest`]): a record is
//!    parsed once, ever (until a new boundary starts a new view);
//! 2. the structural plans: which records snips remove (and how parents relink), which
//!    spans collapses replace;
//! 3. the normalized messages, sealed as soon as the next response begins
//!    ([`Normalizer`]).
//!
//! A request after appended records parses those records, runs them through the plans
//! and pushes them into the normalizer; only the open end of the view (the last response
//! and what follows) is rendered again. The layers below are rebuilt only when their
//! inputs change: a new boundary, a different record list or a rewind (message records
//! leaving or joining the active chain) re-parses from the boundary;
//! a snip, a collapse, a cleared or replaced result that is already in a sealed message,
//! a time-gap microcompact, or a change of settings, tools, user context or outside state
//! re-runs the plans over the parsed items (no JSON is parsed again). A state record that
//! only touches the open end (the usual replacement of a just-stored result) is absorbed
//! without a rebuild, and cache edits never need one: they are added to their pinned
//! message when the request is put together. The system blocks and tools are reused,
//! with their markers, while the host passes the same ones.
//!
//! Assembling from scratch is this same code with an empty cache ([`super::assemble`]),
//! and tests check that both give the same result after every append.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use super::budget::{budget_applied, decide_offloads};
use super::chain::Pushed;
use super::check::check_compaction;
use super::collapse::{CollapsePlan, collapse_applied, plan_collapses};
use super::config::PipelineConfig;
use super::content::ContentRules;
use super::ingest::{Ingest, Ingested};
use super::item::{Block, Item, Origin, Role};
use super::microcompact::{self, DecideInput, cache_edits_block, microcompact_applied, result_ids};
use super::normalize::Normalizer;
use super::place::{HostCarries, context_item, extra_items, host_states_date, place_applied, system_blocks};
use super::request::{ApiMessage, Request};
use super::slice::{Slice, slice_after_boundary};
use super::snip::{SnipPlan, apply_snips, efficiency_reminder, snip_applied};
use super::state::{Offload, PipelineState, Replacement, StateChanges, StateRecord, Trigger};
use super::{AssembleInput, Assembled, cache};

/// The first message when the view would otherwise start with a response.
pub const CONTINUES: &str = "[The conversation continues from earlier messages that are not shown.]";

/// How often each layer was rebuilt (for tests and diagnostics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// Records parsed again from the boundary.
    pub resets: u32,
    /// Plans and messages built again from the parsed items.
    pub rebuilds: u32,
    /// Requests served by extending what was there.
    pub extensions: u32,
}

/// Plain data the daemon keeps per session between requests.
#[derive(Debug, Default)]
pub struct ViewCache {
    built: Option<Built>,
    counters: CacheCounters,
}

#[derive(Debug)]
struct Built {
    // What the build depends on besides the records.
    config: PipelineConfig,
    offered: Vec<String>,
    user_context: Option<String>,
    /// The base-context sources the host's own records carry (ctxd leaves them out).
    host: HostCarries,
    extra_state: PipelineState,
    // Records consumed so far.
    consumed: usize,
    last_line: Option<Arc<str>>,
    slice: Slice,
    ingest: Ingest,
    /// Ingested state plus the caller's: what requests must apply.
    current: PipelineState,
    /// The state the plans and sealed messages were built with: `current`, plus a
    /// microcompact decision the daemon has not recorded yet.
    folded: PipelineState,
    folded_is_current: bool,
    snip: SnipPlan,
    collapse: CollapsePlan,
    /// Tokens freed by snips and collapses recorded after the last response.
    freed_since_response: u64,
    /// Results in records the plans removed (their sizes are in the plans' reports).
    hidden_results: HashSet<Arc<str>>,
    /// The head (system blocks, tools) of the last request, kept while the host's
    /// blocks do not change so it is neither copied nor measured again.
    head: Option<Head>,
    normalizer: Normalizer,
}

fn offered_tools(tools: &[serde_json::Value]) -> Vec<String> {
    let mut names: Vec<String> =
        tools.iter().filter_map(|t| t.get("name").and_then(|n| n.as_str()).map(String::from)).collect();
    names.sort();
    names.dedup();
    names
}

impl ViewCache {
    pub fn new() -> ViewCache {
        ViewCache::default()
    }

    pub fn counters(&self) -> CacheCounters {
        self.counters
    }

    /// Assembles the request for the session's records, reusing what the previous call
    /// built when its inputs still hold.
    pub fn assemble(&mut self, input: &AssembleInput<'_>) -> Assembled {
        let offered = offered_tools(input.tools);
        let built = match self.built.take() {
            Some(mut built) if built.extends(input.records) => {
                if built.sync(input, offered, &mut self.counters) {
                    built
                } else {
                    self.counters.resets += 1;
                    Built::fresh(input, offered_tools(input.tools), &mut self.counters)
                }
            }
            _ => {
                self.counters.resets += 1;
                Built::fresh(input, offered, &mut self.counters)
            }
        };
        let built = self.built.insert(built);
        built.request(input, &mut self.counters)
    }
}

impl Built {
    fn fresh(input: &AssembleInput<'_>, offered: Vec<String>, counters: &mut CacheCounters) -> Built {
        let (slice, _) = slice_after_boundary(input.records);
        let ingest = Ingest::from_records(input.records, &slice);
        let mut current = ingest.state.clone();
        current.merge(input.state);
        let mut built = Built {
            config: input.config.clone(),
            offered,
            user_context: input.base.user_context.clone(),
            host: HostCarries::default(),
            extra_state: input.state.clone(),
            consumed: input.records.len(),
            last_line: input.records.last().map(|r| r.line_arc().clone()),
            slice,
            ingest,
            folded: current.clone(),
            current,
            folded_is_current: true,
            snip: SnipPlan::default(),
            collapse: CollapsePlan::default(),
            freed_since_response: 0,
            hidden_results: HashSet::new(),
            head: None,
            normalizer: Normalizer::default(),
        };
        built.rebuild(None, counters);
        built
    }

    /// True when `records` are the records this build consumed, plus maybe more.
    fn extends(&self, records: &[crate::record::Record]) -> bool {
        if records.len() < self.consumed {
            return false;
        }
        match (self.consumed.checked_sub(1).and_then(|i| records.get(i)), &self.last_line) {
            (None, None) => true,
            (Some(record), Some(line)) => Arc::ptr_eq(record.line_arc(), line) || record.line() == line.as_ref(),
            _ => false,
        }
    }

    /// Takes in the records appended since the last call. Returns false when the view
    /// must be parsed again (a new boundary, the anchor of a preserved segment, or a
    /// rewind that moved message records on or off the active chain).
    fn sync(&mut self, input: &AssembleInput<'_>, offered: Vec<String>, counters: &mut CacheCounters) -> bool {
        let mut dirty = false;
        if self.config != *input.config
            || self.offered != offered
            || self.user_context != input.base.user_context
            || self.extra_state != *input.state
        {
            self.config = input.config.clone();
            self.offered = offered;
            self.user_context = input.base.user_context.clone();
            self.extra_state = input.state.clone();
            self.current = self.ingest.state.clone();
            self.current.merge(input.state);
            dirty = true;
        }
        let start = self.consumed;
        for (offset, record) in input.records[start..].iter().enumerate() {
            // A new boundary starts a new view; the anchor of a preserved segment puts
            // the segment in its place.
            if record.is_compact_boundary()
                || (self.slice.awaited_anchor.is_some() && record.uuid() == self.slice.awaited_anchor.as_deref())
            {
                return false;
            }
            self.slice.order.push(start + offset);
            match self.slice.chain.push(input.records, start + offset) {
                // Messages left or joined the chain: parse again from the boundary.
                Pushed::Rewound => return false,
                Pushed::LeftOut => continue,
                Pushed::Kept => {}
            }
            let responses_before = self.ingest.last_response_index;
            match self.ingest.push(record) {
                Ingested::State(state) => {
                    self.current.apply(&state);
                    if !dirty {
                        if self.absorbable(&state) {
                            self.folded.apply(&state);
                        } else {
                            dirty = true;
                        }
                    }
                }
                Ingested::Item(index) => {
                    if self.ingest.last_response_index != responses_before {
                        // Usage reported for the next response will reflect every snip
                        // and collapse recorded so far.
                        self.freed_since_response = 0;
                    }
                    if !dirty {
                        dirty = !self.extend_with(index);
                    }
                }
                Ingested::Skipped => {}
            }
        }
        self.consumed = input.records.len();
        self.last_line = input.records.last().map(|r| r.line_arc().clone());
        if dirty {
            self.folded = self.current.clone();
            self.folded_is_current = true;
            self.rebuild(None, counters);
        } else {
            counters.extensions += 1;
        }
        true
    }

    /// Pushes one new item through the plans; false when the plans must be rebuilt.
    fn extend_with(&mut self, index: usize) -> bool {
        let Some(item) = self.ingest.items.get(index) else { return true };
        if self.snip.touches(item) || self.collapse.touches(item) {
            return false;
        }
        if let Some(item) = self.snip.project(item.clone(), false) {
            // Host context that ctxd's own first message must now leave out.
            let mut host = self.host;
            host.note(&item);
            // Only while the view's opening grows can it start stating the date.
            host.date |= self.ingest.last_response_index.is_none() && host_states_date(std::slice::from_ref(&item));
            if host != self.host {
                return false;
            }
            let rules = self.fold_rules();
            let rules = rules.as_rules(&self.folded);
            self.normalizer.push(item, &rules);
        }
        true
    }

    /// True when a state record changes nothing already sealed.
    fn absorbable(&self, state: &StateRecord) -> bool {
        let folded = &self.folded;
        match state {
            StateRecord::Snip(s) => folded.snips.contains(s),
            StateRecord::Collapse(c) => folded.collapses.contains(c),
            StateRecord::Microcompact(m) => match m.trigger {
                Trigger::TimeGap => {
                    m.cleared_tool_use_ids.iter().all(|id| folded.cleared.contains(id) || self.only_open(id))
                }
                // Cache edits are placed when the request is put together.
                Trigger::CacheEdits => true,
            },
            // The first record for an id wins: a later one changes nothing.
            StateRecord::Replacement { tool_use_id, .. } => {
                folded.replacements.contains_key(tool_use_id) || self.only_open(tool_use_id)
            }
        }
    }

    /// True when a result is nowhere but in the open end of the view (or not appended
    /// yet): a rule for it changes nothing built.
    fn only_open(&self, tool_use_id: &str) -> bool {
        !self.normalizer.is_sealed_result(tool_use_id) && !self.hidden_results.contains(tool_use_id)
    }

    fn fold_rules(&self) -> FoldRules {
        FoldRules {
            cache_reference: self.config.microcompact.cache_editing,
            strip_meta_media: self.config.strip_meta_media,
        }
    }

    /// Re-runs the plans over the parsed items and refolds the messages, with `folded`
    /// plus an optional unrecorded decision.
    fn rebuild(&mut self, decision: Option<&StateRecord>, counters: &mut CacheCounters) {
        counters.rebuilds += 1;
        if let Some(decision) = decision {
            self.folded = self.current.clone();
            self.folded.apply(decision);
            self.folded_is_current = false;
        }
        let state = &self.folded;
        let config = &self.config;
        let fold_rules = self.fold_rules();
        let rules = fold_rules.as_rules(state);
        let (items, snip) = apply_snips(self.ingest.items.clone(), &state.snips, &config.snip, &rules, false);
        let collapse = plan_collapses(&items, &state.collapses, &config.collapse, &rules);
        self.hidden_results =
            result_ids(items.iter().zip(collapse.survivors(items.len())).filter(|(_, s)| !*s).map(|(i, _)| i));
        self.hidden_results.extend(
            self.ingest
                .items
                .iter()
                .filter(|i| i.uuid.as_deref().is_some_and(|u| snip.removes(u)))
                .flat_map(|i| i.blocks.iter().filter_map(|b| b.result().map(|r| r.tool_use_id.clone()))),
        );
        let items = collapse.apply(items, &state.collapses);
        let mut normalizer = Normalizer::new(self.offered.iter().cloned());
        self.host = HostCarries::of(&items);
        if let Some(context) = context_item(self.user_context.as_deref(), self.host) {
            normalizer.push(context, &rules);
        }
        for item in items {
            normalizer.push(item, &rules);
        }
        self.freed_since_response = freed_since_response(&self.ingest, &snip, &collapse, state);
        self.snip = snip;
        self.collapse = collapse;
        self.normalizer = normalizer;
    }

    /// This request: the decisions, then the messages and the report.
    fn request(&mut self, input: &AssembleInput<'_>, counters: &mut CacheCounters) -> Assembled {
        let config = input.config;
        // A decision the daemon did not record is not repeated from memory: it is made
        // again below if it still holds.
        if !self.folded_is_current {
            if !same_fold(&self.folded, &self.current) {
                self.folded = self.current.clone();
                self.rebuild(None, counters);
            } else {
                self.folded = self.current.clone();
            }
            self.folded_is_current = true;
        }

        // Stage 2 decisions: new results over budget.
        let unanswered = &self.ingest.items[self.ingest.unanswered_from().min(self.ingest.items.len())..];
        let (offloads, budget_saved) =
            decide_offloads(unanswered, &self.current.replacements, &config.budget, input.tool_results_dir);
        let decided: BTreeMap<String, Replacement> =
            offloads.iter().map(|o| (o.tool_use_id.clone(), o.replacement.clone())).collect();

        let reminder = efficiency_reminder(self.ingest.growth_tokens, &config.snip);
        let extras = extra_items(&input.base.attachments, reminder.as_ref(), input.fork);
        let mut tail = self.finish(&extras, &decided);

        // Stage 4 decision: microcompact, over the results the request carries.
        let may_act = microcompact::may_act(
            &self.current,
            self.ingest.last_response.as_ref(),
            input.now_ms,
            &config.microcompact,
        );
        let decision = if !may_act {
            None
        } else {
            let tail_results = tail.messages.iter().flat_map(|m| m.content.iter()).filter(|b| b.result().is_some());
            let results: Vec<&Block> = self.normalizer.placed_results().iter().chain(tail_results).collect();
            microcompact::decide(&DecideInput {
                results: &results,
                tool_names: &self.ingest.tool_names,
                state: &self.current,
                decided: &decided,
                last_response: self.ingest.last_response.as_ref(),
                last_user_uuid: self.normalizer.last_user_uuid(),
                now_ms: input.now_ms,
                config: &config.microcompact,
            })
        };
        if let Some((record, _)) = &decision {
            let trigger = record.trigger;
            let record = StateRecord::Microcompact(record.clone());
            match trigger {
                // Cleared results change sealed messages.
                Trigger::TimeGap => {
                    self.rebuild(Some(&record), counters);
                    tail = self.finish(&extras, &decided);
                }
                // Cache edits are added below, to the messages as they are.
                Trigger::CacheEdits => {
                    self.folded.apply(&record);
                    self.folded_is_current = false;
                }
            }
        }
        let normalize_stats = tail.stats;

        // The messages: sealed ones shared, the open end new.
        let mut messages: Vec<Arc<ApiMessage>> = Vec::with_capacity(self.normalizer.sealed().len() + 3);
        let first_is_user =
            self.normalizer.sealed().first().map(|m| m.role).or_else(|| tail.messages.first().map(|m| m.role))
                == Some(Role::User);
        if !first_is_user {
            let placeholder = Item::user_text(Origin::Context, CONTINUES);
            messages.push(Arc::new(ApiMessage { role: Role::User, content: placeholder.blocks }));
        }
        let offset = messages.len();
        messages.extend(self.normalizer.sealed().iter().cloned());
        let tail_start = messages.len();
        messages.extend(tail.messages.into_iter().map(Arc::new));
        if config.microcompact.cache_editing && !self.folded.cache_edits.is_empty() {
            self.pin_cache_edits(&mut messages, offset, tail_start);
        }
        let mut host_markers: Vec<(usize, usize)> =
            self.normalizer.sealed_markers().iter().map(|&(m, b)| (m + offset, b)).collect();
        for (k, message) in messages.iter().enumerate().skip(tail_start) {
            host_markers
                .extend(message.content.iter().enumerate().filter(|(_, b)| b.has_host_marker()).map(|(j, _)| (k, j)));
        }
        let head = self.head(input);
        let new_tokens: u64 = messages[..offset].iter().chain(&messages[tail_start..]).map(|m| m.tokens()).sum();
        let estimate = self.normalizer.sealed_tokens() + new_tokens + head.tokens;
        let mut request = Request {
            model: input.model.to_owned(),
            max_tokens: input.max_tokens,
            system: head.system.clone(),
            messages,
            tools: head.tools.clone(),
            thinking: input.thinking.cloned(),
        };
        let skip_write = input.fork.is_some_and(|f| f.skip_cache_write);
        let (cache_applied, head_stripped) = cache::place(&mut request, skip_write, &host_markers);
        self.head =
            (!head_stripped).then(|| Head { system: request.system.clone(), tools: request.tools.clone(), ..head });

        let mc_saved = decision.as_ref().map_or(0, |(_, saved)| *saved);
        // The anchored figure counts a new oversized result by its preview already
        // (`budget::carried_bytes`): what the budget saves is not taken off it again.
        let freed = mc_saved + self.freed_since_response;
        let (decision_to_compact, check_applied) = check_compaction(&input.compact, estimate, freed);

        let applied = vec![
            super::slice::slice_applied(&self.slice),
            budget_applied(&offloads, budget_saved, self.current.replacements.len()),
            snip_applied(&self.snip.report, config.snip.enabled, reminder.as_ref()),
            microcompact_applied(decision.as_ref(), &self.folded),
            collapse_applied(&self.collapse, self.folded.collapses.len()),
            check_applied,
            place_applied(input.base, extras.len()),
            super::normalize_applied(&normalize_stats),
            cache_applied,
        ];
        let new_state = StateChanges {
            offloads: offloads.into_iter().collect::<Vec<Offload>>(),
            microcompact: decision.map(|(record, _)| record),
            reminder,
        };
        Assembled { request, applied, estimate_tokens: estimate, decision: decision_to_compact, new_state }
    }

    /// The head of this request: the last one's when the host's blocks are the same.
    fn head(&mut self, input: &AssembleInput<'_>) -> Head {
        let system_context = super::place::system_context(input.base, self.host);
        match self.head.take() {
            Some(head)
                if head.host_system.as_slice() == input.system
                    && head.host_tools.as_slice() == input.tools
                    && head.system_context.as_deref() == system_context =>
            {
                head
            }
            _ => {
                let system = system_blocks(input.system, system_context);
                let tokens = value_tokens(&system) + value_tokens(input.tools);
                Head {
                    host_system: input.system.to_vec(),
                    host_tools: input.tools.to_vec(),
                    system_context: system_context.map(String::from),
                    tokens,
                    system: Arc::new(system),
                    tools: Arc::new(input.tools.to_vec()),
                }
            }
        }
    }

    /// The open end of the view for this request.
    fn finish(&self, extras: &[Item], decided: &BTreeMap<String, Replacement>) -> super::normalize::Tail {
        let fold_rules = self.fold_rules();
        let mut rules = fold_rules.as_rules(&self.folded);
        rules.decided = decided;
        self.normalizer.finish(extras, &rules)
    }

    /// Adds each pinned `cache_edits` block at the end of the message of its user record,
    /// deleting only references the request carries.
    fn pin_cache_edits(&self, messages: &mut [Arc<ApiMessage>], offset: usize, tail_start: usize) {
        let present: HashSet<&str> = messages[tail_start..]
            .iter()
            .flat_map(|m| m.content.iter())
            .filter_map(|b| b.result().map(|r| r.tool_use_id.as_ref()))
            .filter(|id| !self.normalizer.is_placed(id))
            .collect();
        let mut blocks: Vec<(usize, Block)> = Vec::new();
        for pinned in &self.folded.cache_edits {
            let at = match self.normalizer.sealed_message_of(&pinned.pinned_to_uuid) {
                Some(index) => Some(index + offset),
                None if self.normalizer.is_open(&pinned.pinned_to_uuid) => {
                    messages.len().checked_sub(1).filter(|&i| i >= tail_start)
                }
                None => None,
            };
            let ids: Vec<&str> = pinned
                .tool_use_ids
                .iter()
                .map(String::as_str)
                .filter(|id| self.normalizer.is_placed(id) || present.contains(id))
                .collect();
            if let (Some(at), Some(block)) = (at, cache_edits_block(&ids)) {
                blocks.push((at, block));
            }
        }
        for (at, block) in blocks {
            if let Some(message) = messages.get_mut(at) {
                Arc::make_mut(message).content.push(block);
            }
        }
    }
}

/// True when two states build the same messages (cache edits and handled gaps are
/// applied when the request is put together).
fn same_fold(a: &PipelineState, b: &PipelineState) -> bool {
    a.replacements == b.replacements && a.cleared == b.cleared && a.snips == b.snips && a.collapses == b.collapses
}

/// System blocks and tools as the host gave them and as the last request sent them
/// (with the pipeline's markers).
#[derive(Debug)]
struct Head {
    host_system: Vec<serde_json::Value>,
    host_tools: Vec<serde_json::Value>,
    system_context: Option<String>,
    tokens: u64,
    system: Arc<Vec<serde_json::Value>>,
    tools: Arc<Vec<serde_json::Value>>,
}

/// The settings the block rules take from the configuration.
#[derive(Debug, Clone, Copy)]
struct FoldRules {
    cache_reference: bool,
    strip_meta_media: bool,
}

impl FoldRules {
    fn as_rules<'a>(&self, state: &'a PipelineState) -> ContentRules<'a> {
        ContentRules {
            replacements: &state.replacements,
            cleared: &state.cleared,
            cache_reference: self.cache_reference,
            strip_meta_media: self.strip_meta_media,
            ..ContentRules::NONE
        }
    }
}

/// Tokens freed by snips and collapses recorded after the last response: the provider's
/// last reported usage still counts them.
fn freed_since_response(ingest: &Ingest, snip: &SnipPlan, collapse: &CollapsePlan, state: &PipelineState) -> u64 {
    let pending = ingest.state_since_response();
    if pending.is_empty() {
        return 0;
    }
    let named: HashSet<&str> = pending
        .iter()
        .filter_map(|s| match s {
            StateRecord::Snip(snip) => Some(snip.removed_uuids.iter().map(String::as_str)),
            _ => None,
        })
        .flatten()
        .collect();
    let snipped: u64 = ingest
        .items
        .iter()
        .filter(|item| item.uuid.as_deref().is_some_and(|u| named.contains(u) && snip.removes(u)))
        .map(Item::tokens)
        .sum();
    let collapsed: u64 = state
        .collapses
        .iter()
        .enumerate()
        .filter(|(_, c)| pending.iter().any(|s| matches!(s, StateRecord::Collapse(p) if p == *c)))
        .map(|(k, _)| collapse.freed_by(k))
        .sum();
    snipped + collapsed
}

/// Estimated tokens of JSON values (system blocks, tools).
fn value_tokens(values: &[serde_json::Value]) -> u64 {
    values.iter().map(|v| serde_json::to_string(v).map_or(0, |s| s.len() as u64)).sum::<u64>()
        / super::item::BYTES_PER_TOKEN
}

/// Runs the whole pipeline on a fresh cache.
pub(crate) fn assemble_fresh(input: &AssembleInput<'_>) -> Assembled {
    ViewCache::new().assemble(input)
}
