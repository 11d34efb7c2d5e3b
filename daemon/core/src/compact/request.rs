//! The two ways of asking a model for the summary.
//!
//! **Path 1, the cache-sharing fork.** The parent's request already sits in the
//! provider's prompt cache. A request with the same model, system blocks, tools,
//! thinking settings and message prefix reads that cache instead of paying for the
//! whole conversation again, so the fork changes nothing in front of the instruction:
//! it appends the instruction and keeps the cache breakpoint at the end of the shared
//! prefix so the instruction itself is read but not written to the cache (the parent
//! will never continue from it). It keeps the parent's `tool_choice` too: Anthropic's
//! caching rules count a change of `tool_choice` among the changes that invalidate the
//! cached message blocks, so a fork that set `{"type": "none"}` would read only tools
//! and system from the cache. A tool call in the fork's reply is refused on ctxd's side
//! instead (asked once more for text, then the fallback).
//!
//! **Path 2, the streaming fallback** (fork disabled, failed, or gave no usable text).
//! It cannot share the cache, so it rewrites the input to suit a summarizer: its own
//! system prompt, thinking off, a capped reply, reminders that will be injected afresh
//! after compaction removed, media replaced by markers, and tool calls and results
//! rendered as text so no tool schema is needed.
//!
//! Both return bodies valid for the Anthropic Messages API: roles alternate, the first
//! message is a user message, every tool result follows its tool use, at most four
//! cache breakpoints.

use serde_json::{Map, Value, json};

use super::content::{block_type, blocks, role};
use super::prompt::fallback_system_prompt;

/// The most cache breakpoints a request may carry (Anthropic's limit).
pub const MAX_CACHE_BREAKPOINTS: usize = 4;

/// The fallback's reply cap, in tokens: the summary's own budget.
pub const FALLBACK_MAX_TOKENS: u64 = 20_000;

/// Where the fork puts the summary instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkStyle {
    /// As a separate final user message (manual compaction, which runs between turns).
    SeparateMessage,
    /// As a text block appended to the last user message (automatic compaction, which
    /// can run in the middle of a turn right after a tool result).
    AppendToLastUser,
}

/// How the fork keeps the model from using tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ToolRefusal {
    /// `tool_choice: {"type": "none"}`: the provider itself refuses tool use, at the
    /// price of the cached messages (a changed `tool_choice` invalidates them).
    ToolChoiceNone,
    /// Keep the parent's `tool_choice`, so the whole prefix is read from the cache; the
    /// driver refuses a tool call in the reply (one re-ask, then the fallback).
    #[default]
    KeepParentToolChoice,
}

/// What decides whether a summary is asked of the cache-sharing fork first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkChoice<'a> {
    pub trigger: super::Trigger,
    /// The fork is allowed (the `compactFork` setting, `CTXD_DISABLE_COMPACT_FORK`).
    pub enabled: bool,
    /// The parent is the request the host would be sent now, its own system blocks and
    /// tools included (the host assembled in this daemon's lifetime, and the whole view
    /// is summarized).
    pub host_parent: bool,
    /// The model the summary would be asked of.
    pub summary_model: &'a str,
    /// The parent request's model.
    pub parent_model: &'a str,
}

/// Why the summary goes straight to the streaming fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ForkSkip {
    #[error("the cache-sharing fork is turned off")]
    Disabled,
    #[error("no request from the host to share a cache with")]
    NoHostRequest,
    /// A different model cannot read the parent's cache.
    #[error("the summary model is not the session's model")]
    OtherModel,
    /// The provider just refused the parent as too long; the same prefix would be too.
    #[error("the provider refused the session's request as too long")]
    ParentRefused,
}

/// Whether to try the fork first, and with which [`ForkStyle`]: the instruction as its
/// own message when the user asked (between turns), appended to the last user message
/// when ctxd started the compaction (possibly mid-turn, right after a tool result).
pub fn choose_fork(choice: &ForkChoice<'_>) -> Result<ForkStyle, ForkSkip> {
    use super::Trigger;
    if !choice.enabled {
        return Err(ForkSkip::Disabled);
    }
    if !choice.host_parent {
        return Err(ForkSkip::NoHostRequest);
    }
    if choice.summary_model != choice.parent_model {
        return Err(ForkSkip::OtherModel);
    }
    match choice.trigger {
        Trigger::Reactive => Err(ForkSkip::ParentRefused),
        Trigger::Manual | Trigger::Partial => Ok(ForkStyle::SeparateMessage),
        Trigger::Auto | Trigger::Idle | Trigger::Precomputed => Ok(ForkStyle::AppendToLastUser),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkOptions {
    pub style: ForkStyle,
    pub tool_refusal: ToolRefusal,
}

/// A fork request and what was done to build it.
#[derive(Debug, Clone, PartialEq)]
pub struct ForkRequest {
    pub body: Value,
    pub report: ForkReport,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkReport {
    /// The style used. It differs from the one asked for when the roles require:
    /// a separate user message cannot follow a user message, and there is no user
    /// message to append to after an assistant message.
    pub style: ForkStyle,
    /// Number of parent messages sent unchanged in front of the instruction.
    pub prefix_messages: usize,
    /// Cache breakpoints in the body.
    pub cache_markers: usize,
    /// Breakpoints removed to stay within [`MAX_CACHE_BREAKPOINTS`].
    pub markers_removed: usize,
}

/// Why a request could not be built. All of them mean the parent request given was not
/// a Messages API body: rebuild it; asking again with the same input will not help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the parent request is not a JSON object")]
    NotAnObject,
    #[error("the parent request has no model")]
    NoModel,
    #[error("the parent request has no messages")]
    NoMessages,
    #[error("message {index} of the parent request has no valid role or content")]
    BadMessage { index: usize },
}

/// Checks the parent body and returns its object and messages.
fn parent_parts(parent: &Value) -> Result<(&Map<String, Value>, &Vec<Value>), RequestError> {
    let object = parent.as_object().ok_or(RequestError::NotAnObject)?;
    if !object.get("model").is_some_and(Value::is_string) {
        return Err(RequestError::NoModel);
    }
    let messages =
        object.get("messages").and_then(Value::as_array).filter(|m| !m.is_empty()).ok_or(RequestError::NoMessages)?;
    for (index, message) in messages.iter().enumerate() {
        let role_ok = matches!(role(message), "user" | "assistant");
        let content_ok = message.get("content").is_some_and(|c| c.is_string() || c.is_array());
        if !role_ok || !content_ok {
            return Err(RequestError::BadMessage { index });
        }
    }
    Ok((object, messages))
}

/// Builds the cache-sharing fork from the parent's assembled request body.
///
/// Everything of the parent is kept as it was (model, system, tools, thinking,
/// `max_tokens`, beta fields, the messages) except:
/// - the instruction is added, per [`ForkStyle`] (adjusted when the roles require);
/// - `tool_choice` becomes `{"type": "none"}` only when the parent offers tools and
///   [`ToolRefusal::ToolChoiceNone`] is asked for (the default keeps the parent's);
/// - the last block of the parent's messages carries a cache breakpoint (the parent's
///   own latest message breakpoint value, so a one-hour TTL stays one hour) and the
///   instruction carries none; older message breakpoints are removed first, then
///   system and tool ones, until at most [`MAX_CACHE_BREAKPOINTS`] remain.
pub fn fork_request(parent: &Value, instruction: &str, options: ForkOptions) -> Result<ForkRequest, RequestError> {
    let (object, messages) = parent_parts(parent)?;
    let mut messages = messages.clone();
    let last_role = messages.last().map(role).unwrap_or("");
    let style = match (options.style, last_role) {
        (ForkStyle::SeparateMessage, "user") => ForkStyle::AppendToLastUser,
        (ForkStyle::AppendToLastUser, "assistant") => ForkStyle::SeparateMessage,
        (style, _) => style,
    };
    let prefix_messages = messages.len();

    // The breakpoint goes where the parent's prefix ends, with the parent's own value.
    let marker = latest_message_marker(&messages).unwrap_or_else(|| json!({"type": "ephemeral"}));
    let end = place_prefix_marker(&mut messages, marker);

    let instruction_block = json!({"type": "text", "text": instruction});
    match style {
        ForkStyle::SeparateMessage => {
            messages.push(json!({"role": "user", "content": [instruction_block]}));
        }
        ForkStyle::AppendToLastUser => {
            if let Some(last) = messages.last_mut() {
                push_block(last, instruction_block);
            }
        }
    }

    let mut body = object.clone();
    body.insert("messages".to_owned(), Value::Array(messages));
    let has_tools = body.get("tools").and_then(Value::as_array).is_some_and(|t| !t.is_empty());
    if options.tool_refusal == ToolRefusal::ToolChoiceNone && has_tools {
        body.insert("tool_choice".to_owned(), json!({"type": "none"}));
    }
    if !body.contains_key("max_tokens") {
        body.insert("max_tokens".to_owned(), json!(FALLBACK_MAX_TOKENS));
    }
    let mut body = Value::Object(body);
    let markers_removed = limit_markers(&mut body, end);
    Ok(ForkRequest {
        report: ForkReport { style, prefix_messages, cache_markers: count_cache_markers(&body), markers_removed },
        body,
    })
}

/// Appends a block to a message, turning string content into blocks first.
fn push_block(message: &mut Value, block: Value) {
    let mut content = blocks(message.get("content").unwrap_or(&Value::Null));
    content.push(block);
    if let Some(object) = message.as_object_mut() {
        object.insert("content".to_owned(), Value::Array(content));
    }
}

/// The `cache_control` value of the newest marked block in the messages.
fn latest_message_marker(messages: &[Value]) -> Option<Value> {
    messages.iter().rev().find_map(|m| {
        m.get("content")
            .and_then(Value::as_array)
            .and_then(|blocks| blocks.iter().rev().find_map(|b| b.get("cache_control").cloned()))
    })
}

/// Blocks that may not carry a breakpoint.
fn unmarkable(block: &Value) -> bool {
    matches!(block_type(block), "thinking" | "redacted_thinking")
        || (block_type(block) == "text" && block.get("text").and_then(Value::as_str).is_some_and(|t| t.is_empty()))
}

/// Puts `marker` on the last markable block of the messages (string content becomes a
/// text block) and returns its position (message, block).
fn place_prefix_marker(messages: &mut [Value], marker: Value) -> Option<(usize, usize)> {
    for m in (0..messages.len()).rev() {
        let content = blocks(messages[m].get("content").unwrap_or(&Value::Null));
        let Some(b) = content.iter().rposition(|block| !unmarkable(block)) else {
            continue;
        };
        let mut content = content;
        if let Some(block) = content[b].as_object_mut() {
            block.insert("cache_control".to_owned(), marker);
        }
        if let Some(object) = messages[m].as_object_mut() {
            object.insert("content".to_owned(), Value::Array(content));
        }
        return Some((m, b));
    }
    None
}

/// Every place a breakpoint can sit, in request order: system blocks, tools, then
/// message blocks (and blocks nested in tool results).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MarkerAt {
    System(usize),
    Tool(usize),
    Message(usize, usize, Option<usize>),
}

fn marker_positions(body: &Value) -> Vec<MarkerAt> {
    let mut out = Vec::new();
    let marked = |v: &Value| v.get("cache_control").is_some_and(|c| !c.is_null());
    if let Some(system) = body.get("system").and_then(Value::as_array) {
        out.extend(system.iter().enumerate().filter(|(_, b)| marked(b)).map(|(i, _)| MarkerAt::System(i)));
    }
    if let Some(tools) = body.get("tools").and_then(Value::as_array) {
        out.extend(tools.iter().enumerate().filter(|(_, t)| marked(t)).map(|(i, _)| MarkerAt::Tool(i)));
    }
    if let Some(messages) = body.get("messages").and_then(Value::as_array) {
        for (m, message) in messages.iter().enumerate() {
            let Some(content) = message.get("content").and_then(Value::as_array) else {
                continue;
            };
            for (b, block) in content.iter().enumerate() {
                if marked(block) {
                    out.push(MarkerAt::Message(m, b, None));
                }
                if let Some(nested) = block.get("content").and_then(Value::as_array) {
                    for (n, inner) in nested.iter().enumerate() {
                        if marked(inner) {
                            out.push(MarkerAt::Message(m, b, Some(n)));
                        }
                    }
                }
            }
        }
    }
    out
}

/// Number of cache breakpoints in a request body.
pub fn count_cache_markers(body: &Value) -> usize {
    marker_positions(body).len()
}

fn remove_marker(body: &mut Value, at: MarkerAt) {
    let target = match at {
        MarkerAt::System(i) => body.get_mut("system").and_then(|s| s.get_mut(i)),
        MarkerAt::Tool(i) => body.get_mut("tools").and_then(|t| t.get_mut(i)),
        MarkerAt::Message(m, b, nested) => {
            let block = body
                .get_mut("messages")
                .and_then(|ms| ms.get_mut(m))
                .and_then(|msg| msg.get_mut("content"))
                .and_then(|c| c.get_mut(b));
            match nested {
                None => block,
                Some(n) => block.and_then(|blk| blk.get_mut("content")).and_then(|c| c.get_mut(n)),
            }
        }
    };
    if let Some(object) = target.and_then(Value::as_object_mut) {
        object.remove("cache_control");
    }
}

/// Removes breakpoints until at most [`MAX_CACHE_BREAKPOINTS`] remain, never the one at
/// `keep`: older message breakpoints go first (the one at the end of the prefix reads
/// everything they would), then tool and system ones from the front. Returns how many
/// were removed.
fn limit_markers(body: &mut Value, keep: Option<(usize, usize)>) -> usize {
    let positions = marker_positions(body);
    let excess = positions.len().saturating_sub(MAX_CACHE_BREAKPOINTS);
    if excess == 0 {
        return 0;
    }
    let is_kept =
        |at: &MarkerAt| matches!((at, keep), (MarkerAt::Message(m, b, None), Some((km, kb))) if *m == km && *b == kb);
    let mut order: Vec<MarkerAt> =
        positions.iter().copied().filter(|at| matches!(at, MarkerAt::Message(..)) && !is_kept(at)).collect();
    order.extend(positions.iter().copied().filter(|at| !matches!(at, MarkerAt::Message(..))));
    let mut removed = 0;
    for at in order.into_iter().take(excess) {
        remove_marker(body, at);
        removed += 1;
    }
    removed
}

// ---------------------------------------------------------------------------------
// Path 2: the streaming fallback.

/// How the fallback request is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FallbackOptions {
    /// Reply cap; the parent's `max_tokens` wins when it is lower.
    pub max_tokens: u64,
    /// Offer the parent's `Read` schema (never used: `tool_choice` is `none`), for
    /// models that expect to see it. No other tool is offered.
    pub offer_read: bool,
}

impl Default for FallbackOptions {
    fn default() -> FallbackOptions {
        FallbackOptions { max_tokens: FALLBACK_MAX_TOKENS, offer_read: false }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct FallbackRequest {
    pub body: Value,
    pub report: FallbackReport,
}

/// What the fallback did to the parent's messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FallbackReport {
    /// `<system-reminder>` sections removed (memory files, date, listings and other
    /// context injected afresh after compaction).
    pub reminders_stripped: usize,
    /// Image and document blocks replaced by `[image]` / `[document]`.
    pub media_replaced: usize,
    /// `tool_use` and `tool_result` blocks rendered as text.
    pub tool_blocks_rendered: usize,
    /// Thinking blocks dropped (thinking is off).
    pub thinking_dropped: usize,
    /// Messages left empty and dropped.
    pub messages_dropped: usize,
    /// Messages merged into their predecessor of the same role.
    pub messages_merged: usize,
}

const REMINDER_OPEN: &str = "<system-reminder>";
const REMINDER_CLOSE: &str = "</system-reminder>";

/// Placeholder first message when the conversation would otherwise start with the
/// assistant.
const LEADING_GAP: &str = "[The start of the conversation was left out here.]";

/// Builds the streaming fallback request from the parent's assembled request body.
///
/// The reminders stripped are every `<system-reminder>…</system-reminder>` span in user
/// text and tool results: ctxd and the host wrap injected context in them (memory
/// files, date, git status, skill and tool listings, restored files), and all of it is
/// loaded again after compaction, so summarizing it only spends the summary's budget on
/// text the model will see anyway.
pub fn fallback_request(
    parent: &Value,
    instruction: &str,
    options: &FallbackOptions,
) -> Result<FallbackRequest, RequestError> {
    let (object, messages) = parent_parts(parent)?;
    let mut report = FallbackReport::default();
    let mut tool_names: Vec<(String, String)> = Vec::new();
    let mut out: Vec<Value> = Vec::new();
    for message in messages {
        let role = role(message).to_owned();
        let mut rewritten: Vec<Value> = Vec::new();
        for block in blocks(message.get("content").unwrap_or(&Value::Null)) {
            if let Some(text) = rewrite_block(&role, &block, &mut tool_names, &mut report) {
                rewritten.push(json!({"type": "text", "text": text}));
            }
        }
        if rewritten.is_empty() {
            report.messages_dropped += 1;
            continue;
        }
        match out.last_mut() {
            Some(prev) if self::role(prev) == role => {
                report.messages_merged += 1;
                if let Some(content) = prev.get_mut("content").and_then(Value::as_array_mut) {
                    content.extend(rewritten);
                }
            }
            _ => out.push(json!({"role": role, "content": rewritten})),
        }
    }
    if out.first().is_some_and(|m| self::role(m) == "assistant") {
        out.insert(0, json!({"role": "user", "content": [{"type": "text", "text": LEADING_GAP}]}));
    }
    // One breakpoint at the end of the conversation: asking again (no <summary>) or
    // retrying resends the same conversation with a different instruction.
    if let Some(last) = out.last_mut()
        && let Some(block) = last
            .get_mut("content")
            .and_then(Value::as_array_mut)
            .and_then(|c| c.last_mut())
            .and_then(Value::as_object_mut)
    {
        block.insert("cache_control".to_owned(), json!({"type": "ephemeral"}));
    }
    let instruction_block = json!({"type": "text", "text": instruction});
    match out.last_mut() {
        Some(last) if self::role(last) == "user" => push_block(last, instruction_block),
        _ => out.push(json!({"role": "user", "content": [instruction_block]})),
    }

    let parent_max = object.get("max_tokens").and_then(Value::as_u64);
    let max_tokens = parent_max.map_or(options.max_tokens, |p| p.min(options.max_tokens));
    let mut body = Map::new();
    body.insert("model".to_owned(), object.get("model").cloned().unwrap_or(Value::Null));
    body.insert("system".to_owned(), json!([{"type": "text", "text": fallback_system_prompt()}]));
    body.insert("messages".to_owned(), Value::Array(out));
    body.insert("max_tokens".to_owned(), json!(max_tokens));
    body.insert("thinking".to_owned(), json!({"type": "disabled"}));
    if options.offer_read
        && let Some(read) = object
            .get("tools")
            .and_then(Value::as_array)
            .and_then(|tools| tools.iter().find(|t| t.get("name").and_then(Value::as_str) == Some("Read")))
    {
        let mut read = read.clone();
        if let Some(tool) = read.as_object_mut() {
            tool.remove("cache_control");
        }
        body.insert("tools".to_owned(), json!([read]));
        body.insert("tool_choice".to_owned(), json!({"type": "none"}));
    }
    Ok(FallbackRequest { body: Value::Object(body), report })
}

/// The text a block becomes in the fallback, or `None` when it is dropped.
fn rewrite_block(
    role: &str,
    block: &Value,
    tool_names: &mut Vec<(String, String)>,
    report: &mut FallbackReport,
) -> Option<String> {
    let str_field = |name: &str| block.get(name).and_then(Value::as_str).unwrap_or("");
    match block_type(block) {
        "text" => {
            let text =
                if role == "user" { strip_reminders(str_field("text"), report) } else { str_field("text").to_owned() };
            let text = text.trim();
            (!text.is_empty()).then(|| text.to_owned())
        }
        "image" => {
            report.media_replaced += 1;
            Some("[image]".to_owned())
        }
        "document" => {
            report.media_replaced += 1;
            Some("[document]".to_owned())
        }
        "thinking" | "redacted_thinking" => {
            report.thinking_dropped += 1;
            None
        }
        "tool_use" | "server_tool_use" => {
            report.tool_blocks_rendered += 1;
            let name = str_field("name").to_owned();
            tool_names.push((str_field("id").to_owned(), name.clone()));
            let input = block.get("input").map_or_else(String::new, Value::to_string);
            Some(format!("[tool call: {name} {input}]"))
        }
        "tool_result" => {
            report.tool_blocks_rendered += 1;
            let id = str_field("tool_use_id");
            let name = tool_names.iter().rev().find(|(i, _)| i == id).map_or("tool", |(_, n)| n.as_str());
            let error = block.get("is_error").and_then(Value::as_bool) == Some(true);
            let body = tool_result_text(block.get("content").unwrap_or(&Value::Null), report);
            let label = if error { format!("[tool result: {name}, failed]") } else { format!("[tool result: {name}]") };
            Some(if body.is_empty() { label } else { format!("{label}\n{body}") })
        }
        other => Some(format!("[{}]", if other.is_empty() { "block" } else { other })),
    }
}

/// The text of a tool result's content, media replaced and reminders removed.
fn tool_result_text(content: &Value, report: &mut FallbackReport) -> String {
    let parts: Vec<String> = blocks(content)
        .iter()
        .filter_map(|b| match block_type(b) {
            "text" => Some(strip_reminders(b.get("text").and_then(Value::as_str).unwrap_or(""), report)),
            "image" => {
                report.media_replaced += 1;
                Some("[image]".to_owned())
            }
            "document" => {
                report.media_replaced += 1;
                Some("[document]".to_owned())
            }
            "" => None,
            other => Some(format!("[{other}]")),
        })
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .collect();
    parts.join("\n")
}

/// `text` without its `<system-reminder>` spans. An unclosed reminder runs to the end.
fn strip_reminders(text: &str, report: &mut FallbackReport) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(REMINDER_OPEN) {
        report.reminders_stripped += 1;
        out.push_str(&rest[..start]);
        let after = &rest[start + REMINDER_OPEN.len()..];
        rest = match after.find(REMINDER_CLOSE) {
            Some(end) => &after[end + REMINDER_CLOSE.len()..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}
