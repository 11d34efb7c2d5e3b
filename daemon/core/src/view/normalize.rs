//! Stage 8: normalization, from the view's items to messages the Messages API accepts.
//!
//! Rules (each repair is counted in [`NormalizeStats`]):
//!
//! - Lines of one response (same `message.id`) become one assistant message, blocks in
//!   order, repeated blocks dropped. Responses with nothing between them (an error
//!   stand-in dropped, a retried request) become one message too, so roles alternate.
//! - Everything user-side between two responses is one user message: prompts, tool
//!   results, meta records, attachments (as text), summaries.
//! - Each `tool_use` has exactly one `tool_result`, first in the next user message, in
//!   the order the transcript recorded them (parallel calls finish in any order). A
//!   call without one gets a synthetic error result; a result whose call is not in the
//!   previous message (late, duplicated, cut off by a snip or collapse edge) becomes
//!   text; a repeated result is dropped.
//! - A call to a tool the request does not offer becomes text, and so does its result:
//!   the API refuses `tool_use` blocks naming tools it was not given.
//! - Blank text, unsigned thinking and other blocks the API refuses were already dropped
//!   when the records were read. Thinking with a signature is kept in every response:
//!   the API accepts it, and removing it from older turns would change the prompt prefix
//!   on every turn and defeat the cache.
//!
//! The normalizer is a fold: items are pushed one at a time and a message is sealed (and
//! its block rules applied) once the next response begins, since nothing after that can
//! change it. Only the last response and what follows it stay open, and each request
//! renders them afresh. Pushing one appended item costs that item, not the session.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::content::ContentRules;
use super::item::{Block, BlockKind, Item, Role};
use super::raw::{self, Fields};
use super::request::ApiMessage;

/// The text of a result the transcript does not have.
pub const MISSING_RESULT: &str = "[tool result missing]";

/// Repairs made while normalizing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NormalizeStats {
    /// Response lines merged into the message of their `message.id`.
    pub merged_lines: u32,
    /// Consecutive responses merged into one message.
    pub merged_responses: u32,
    pub synthetic_results: u32,
    /// Results without their call, turned into text.
    pub orphan_results: u32,
    /// Repeated blocks, calls or results dropped.
    pub duplicates: u32,
    /// Calls to tools not offered, turned into text with their results.
    pub converted_calls: u32,
}

impl NormalizeStats {
    fn add(&mut self, other: &NormalizeStats) {
        self.merged_lines += other.merged_lines;
        self.merged_responses += other.merged_responses;
        self.synthetic_results += other.synthetic_results;
        self.orphan_results += other.orphan_results;
        self.duplicates += other.duplicates;
        self.converted_calls += other.converted_calls;
    }

    pub fn total(&self) -> u32 {
        self.merged_lines
            + self.merged_responses
            + self.synthetic_results
            + self.orphan_results
            + self.duplicates
            + self.converted_calls
    }
}

#[derive(Debug, Clone)]
struct OpenResponse {
    message_id: Option<Arc<str>>,
    blocks: Vec<Block>,
    /// Ids of the calls kept as `tool_use` blocks, in order.
    tool_uses: Vec<Arc<str>>,
}

/// The fold from items to messages.
#[derive(Debug, Clone, Default)]
pub struct Normalizer {
    offered: HashSet<String>,
    sealed: Vec<Arc<ApiMessage>>,
    sealed_tokens: u64,
    sealed_result_ids: HashSet<Arc<str>>,
    /// Blocks of sealed messages that carry a host cache marker: (message, block).
    sealed_markers: Vec<(usize, usize)>,
    /// Every call kept so far, to drop a repeated id.
    tool_uses: HashSet<Arc<str>>,
    /// Calls rendered as text, with their tool name.
    converted: HashMap<Arc<str>, Arc<str>>,
    response: Option<OpenResponse>,
    /// User items after the open response.
    pending: Vec<Item>,
    stats: NormalizeStats,
    /// `tool_result` blocks of sealed messages, in order (after block rules).
    placed: Vec<Block>,
    placed_ids: HashSet<Arc<str>>,
    /// Sealed message of each user record.
    message_of: HashMap<Arc<str>, usize>,
    last_user_uuid: Option<Arc<str>>,
}

/// The open end of the view rendered for one request.
#[derive(Debug, Clone, Default)]
pub struct Tail {
    pub messages: Vec<ApiMessage>,
    pub stats: NormalizeStats,
}

impl Normalizer {
    /// A normalizer for a request offering these tool names.
    pub fn new(offered: impl IntoIterator<Item = String>) -> Normalizer {
        Normalizer { offered: offered.into_iter().collect(), ..Normalizer::default() }
    }

    pub fn sealed(&self) -> &[Arc<ApiMessage>] {
        &self.sealed
    }

    pub fn sealed_tokens(&self) -> u64 {
        self.sealed_tokens
    }

    pub fn sealed_markers(&self) -> &[(usize, usize)] {
        &self.sealed_markers
    }

    /// True when a sealed message was built from a result for this call.
    pub fn is_sealed_result(&self, tool_use_id: &str) -> bool {
        self.sealed_result_ids.contains(tool_use_id)
    }

    /// `tool_result` blocks of sealed messages, in order.
    pub fn placed_results(&self) -> &[Block] {
        &self.placed
    }

    /// True when a sealed message carries this call's `tool_result`.
    pub fn is_placed(&self, tool_use_id: &str) -> bool {
        self.placed_ids.contains(tool_use_id)
    }

    /// Index among the sealed messages of the message holding a user record; `None`
    /// when the record is not sealed (open, removed, or unknown).
    pub fn sealed_message_of(&self, uuid: &str) -> Option<usize> {
        self.message_of.get(uuid).copied()
    }

    /// True when a user record is in the open end of the view.
    pub fn is_open(&self, uuid: &str) -> bool {
        self.pending.iter().any(|i| i.uuid.as_deref() == Some(uuid))
    }

    /// The last user record pushed.
    pub fn last_user_uuid(&self) -> Option<&str> {
        self.last_user_uuid.as_deref()
    }

    /// Pushes one item of the view.
    pub fn push(&mut self, item: Item, rules: &ContentRules<'_>) {
        if item.snipped || item.blocks.is_empty() {
            return;
        }
        match item.role {
            Role::User => {
                if item.uuid.is_some() {
                    self.last_user_uuid = item.uuid.clone();
                }
                self.pending.push(item);
            }
            Role::Assistant => self.push_response(item, rules),
        }
    }

    fn push_response(&mut self, item: Item, rules: &ContentRules<'_>) {
        let blocks = self.admit_response_blocks(item.blocks);
        if blocks.is_empty() {
            return;
        }
        if let Some(open) = &mut self.response
            && item.message_id.is_some()
            && open.message_id == item.message_id
        {
            self.stats.merged_lines += 1;
            extend_response(open, blocks, &mut self.stats);
            return;
        }
        match self.response.take() {
            Some(mut open) => {
                let (assistant, user, stats) = render(Some(&open), &self.pending, &[], rules, &self.converted);
                if user.is_none() && open.tool_uses.is_empty() {
                    // Nothing between two responses: one assistant message.
                    self.stats.merged_responses += 1;
                    open.message_id = item.message_id;
                    extend_response(&mut open, blocks, &mut self.stats);
                    self.response = Some(open);
                    return;
                }
                self.stats.add(&stats);
                self.seal(assistant);
                self.seal(user);
            }
            None => {
                let (_, user, stats) = render(None, &self.pending, &[], rules, &self.converted);
                self.stats.add(&stats);
                self.seal(user);
            }
        }
        // Every result sealed counts, also those rendered as text or dropped: a rule
        // recorded for one of them later would change sealed content.
        let user_message = self.sealed.len().checked_sub(1);
        for item in self.pending.drain(..) {
            if let (Some(uuid), Some(index)) = (&item.uuid, user_message) {
                self.message_of.insert(uuid.clone(), index);
            }
            for block in &item.blocks {
                if let Some(r) = block.result() {
                    self.sealed_result_ids.insert(r.tool_use_id.clone());
                }
            }
        }
        let mut open = OpenResponse { message_id: item.message_id, blocks: Vec::new(), tool_uses: Vec::new() };
        extend_response(&mut open, blocks, &mut self.stats);
        self.response = Some(open);
    }

    /// Drops repeated calls and turns calls to tools not offered into text.
    fn admit_response_blocks(&mut self, blocks: Vec<Block>) -> Vec<Block> {
        let mut out = Vec::with_capacity(blocks.len());
        for block in blocks {
            if let BlockKind::ToolUse { id, name } = &block.kind {
                if !self.tool_uses.insert(id.clone()) {
                    self.stats.duplicates += 1;
                    continue;
                }
                if !self.offered.contains(name.as_ref()) {
                    self.converted.insert(id.clone(), name.clone());
                    self.stats.converted_calls += 1;
                    out.extend(call_as_text(&block));
                    continue;
                }
            }
            out.push(block);
        }
        out
    }

    fn seal(&mut self, message: Option<ApiMessage>) {
        let Some(message) = message else { return };
        let index = self.sealed.len();
        for (j, block) in message.content.iter().enumerate() {
            self.sealed_tokens += block.tokens();
            if block.has_host_marker() {
                self.sealed_markers.push((index, j));
            }
            if let Some(r) = block.result() {
                self.sealed_result_ids.insert(r.tool_use_id.clone());
                self.placed_ids.insert(r.tool_use_id.clone());
                self.placed.push(block.clone());
            }
        }
        self.sealed.push(Arc::new(message));
    }

    /// Renders the open end of the view, with `extras` (user items for this request
    /// only) joining the last user message.
    pub fn finish(&self, extras: &[Item], rules: &ContentRules<'_>) -> Tail {
        let (assistant, user, stats) = render(self.response.as_ref(), &self.pending, extras, rules, &self.converted);
        let mut total = self.stats;
        total.add(&stats);
        Tail { messages: assistant.into_iter().chain(user).collect(), stats: total }
    }
}

fn extend_response(open: &mut OpenResponse, blocks: Vec<Block>, stats: &mut NormalizeStats) {
    for block in blocks {
        if let BlockKind::ToolUse { id, .. } = &block.kind {
            open.tool_uses.push(id.clone());
        } else if open.blocks.contains(&block) {
            stats.duplicates += 1;
            continue;
        }
        open.blocks.push(block);
    }
}

/// One response and the user items after it, as (at most) two messages.
fn render(
    response: Option<&OpenResponse>,
    pending: &[Item],
    extras: &[Item],
    rules: &ContentRules<'_>,
    converted: &HashMap<Arc<str>, Arc<str>>,
) -> (Option<ApiMessage>, Option<ApiMessage>, NormalizeStats) {
    let mut stats = NormalizeStats::default();
    let assistant = response.map(|r| ApiMessage { role: Role::Assistant, content: r.blocks.clone() });
    let uses: &[Arc<str>] = response.map_or(&[], |r| &r.tool_uses);
    let materialized: Vec<Vec<Block>> = pending.iter().chain(extras).map(|item| rules.materialize(item)).collect();
    let mut content = Vec::new();
    // Results first, as the API requires, in the order the transcript recorded them:
    // parallel calls finish in any order, and hosts (and the real program) keep that
    // order, so reordering would make ctxd's bytes differ from theirs. Calls without a
    // result get a synthetic one after the recorded results, in call order.
    let mut placed: HashSet<&str> = HashSet::new();
    for block in materialized.iter().flatten() {
        if let Some(r) = block.result().filter(|r| uses.contains(&r.tool_use_id))
            && placed.insert(r.tool_use_id.as_ref())
        {
            content.push(block.clone());
        }
    }
    for id in uses.iter().filter(|id| !placed.contains(id.as_ref())) {
        stats.synthetic_results += 1;
        // Under the same rules as real results (a cache reference, say).
        content.extend(missing_result(id).map(|b| rules.apply_block(&b, false)));
    }
    let mut seen: HashSet<&str> = HashSet::new();
    for block in materialized.iter().flatten() {
        match block.result() {
            Some(r) if uses.contains(&r.tool_use_id) => {
                if !seen.insert(r.tool_use_id.as_ref()) {
                    stats.duplicates += 1;
                }
            }
            Some(r) => {
                let name = converted.get(&r.tool_use_id);
                if name.is_none() {
                    stats.orphan_results += 1;
                }
                content.extend(result_as_text(block, name.map(|n| n.as_ref())));
            }
            None => content.push(block.clone()),
        }
    }
    let user = (!content.is_empty()).then_some(ApiMessage { role: Role::User, content });
    (assistant, user, stats)
}

fn missing_result(tool_use_id: &str) -> Option<Block> {
    let json = raw::to_raw(&serde_json::json!({
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": MISSING_RESULT,
        "is_error": true,
    }));
    Block::from_json(json)
}

/// A call to a tool that is not offered, as text.
fn call_as_text(block: &Block) -> Option<Block> {
    let BlockKind::ToolUse { id, name } = &block.kind else { return None };
    let input = Fields::parse(block.json()).and_then(|f| f.get("input").map(|v| v.get().to_owned()));
    Block::text(&format!(
        "[Called the tool {name} (no longer available), call {id}, with input: {}]",
        input.unwrap_or_else(|| "{}".to_owned())
    ))
}

/// A result that cannot stay a `tool_result`, as text.
fn result_as_text(block: &Block, converted_tool: Option<&str>) -> Option<Block> {
    let r = block.result()?;
    let label = match converted_tool {
        Some(name) => format!("[Result of the {name} call {}]", r.tool_use_id),
        None => format!("[Result of an earlier tool call {}]", r.tool_use_id),
    };
    let text = block.result_text();
    if text.trim().is_empty() {
        return Block::text(&label);
    }
    Block::text(&format!("{label}\n{text}"))
}

/// The stage over a whole view: every item pushed, then the open end rendered.
pub fn normalize(
    items: Vec<Item>,
    offered: impl IntoIterator<Item = String>,
    rules: &ContentRules<'_>,
) -> (Vec<ApiMessage>, NormalizeStats) {
    let mut normalizer = Normalizer::new(offered);
    for item in items {
        normalizer.push(item, rules);
    }
    let tail = normalizer.finish(&[], rules);
    let mut messages: Vec<ApiMessage> = normalizer.sealed.iter().map(|m| (**m).clone()).collect();
    messages.extend(tail.messages);
    (messages, tail.stats)
}
