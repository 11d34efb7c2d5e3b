//! Stage 9: prompt-cache breakpoints.
//!
//! Three markers: the last tool and the last system block (the stable head of every
//! request) and the end of the conversation, so the next request reads everything up to
//! here from the cache. A fork that must not write its own tail (`skip_cache_write`)
//! marks the end of the prefix it shares with its parent instead: the block just before
//! its instruction, which is the penultimate message when the view ends with a response
//! and the previous block of the last user message when the instruction joined it. The
//! instruction itself is sent, uncached.
//!
//! The provider accepts at most four markers. Markers the host put on its own system
//! blocks, tools or records are kept while they fit, latest first (a later marker covers
//! more of the prefix); the rest are removed.

use std::sync::Arc;

use serde_json::{Value, json};

use super::Applied;
use super::item::BlockKind;
use super::request::Request;

/// The provider's limit.
pub const MAX_MARKERS: usize = 4;

/// A place a marker can go, in prefix order (tools, then system, then messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Place {
    Tool(usize),
    System(usize),
    Block(usize, usize),
}

fn has_marker(value: &Value) -> bool {
    value.get("cache_control").is_some()
}

/// Where the conversation's own marker goes; `None` when no block can carry one.
fn conversation_place(request: &Request, before_fork_instruction: bool) -> Option<Place> {
    let markable = |m: usize, b: usize| {
        request.messages.get(m).and_then(|msg| msg.content.get(b)).is_some_and(|block| {
            !matches!(block.kind, BlockKind::Thinking | BlockKind::RedactedThinking | BlockKind::CacheEdits)
        })
    };
    // Positions from the end, newest first.
    let mut positions = request
        .messages
        .iter()
        .enumerate()
        .rev()
        .flat_map(|(m, msg)| (0..msg.content.len()).rev().map(move |b| (m, b)));
    if before_fork_instruction {
        positions.next();
    }
    positions.find(|&(m, b)| markable(m, b)).map(|(m, b)| Place::Block(m, b))
}

/// Places the markers. `host_blocks` are message blocks already carrying one (found by
/// the caller, who knows which messages are new).
pub fn place_cache_breakpoints(
    request: &mut Request,
    fork_skips_cache_write: bool,
    host_blocks: &[(usize, usize)],
) -> Applied {
    place(request, fork_skips_cache_write, host_blocks).0
}

/// [`place_cache_breakpoints`], also saying whether a host marker was removed from the
/// system blocks or tools (then they are not the host's blocks plus ours).
pub(crate) fn place(
    request: &mut Request,
    fork_skips_cache_write: bool,
    host_blocks: &[(usize, usize)],
) -> (Applied, bool) {
    let mut ours: Vec<Place> = Vec::new();
    if !request.tools.is_empty() {
        ours.push(Place::Tool(request.tools.len() - 1));
    }
    if !request.system.is_empty() {
        ours.push(Place::System(request.system.len() - 1));
    }
    let conversation = conversation_place(request, fork_skips_cache_write);
    ours.extend(conversation);

    let mut host: Vec<Place> = request
        .tools
        .iter()
        .enumerate()
        .filter(|(_, t)| has_marker(t))
        .map(|(i, _)| Place::Tool(i))
        .chain(request.system.iter().enumerate().filter(|(_, s)| has_marker(s)).map(|(i, _)| Place::System(i)))
        .chain(host_blocks.iter().map(|&(m, b)| Place::Block(m, b)))
        .filter(|p| !ours.contains(p))
        .collect();
    host.sort();
    let room = MAX_MARKERS.saturating_sub(ours.len());
    let strip_count = host.len().saturating_sub(room);
    let stripped: Vec<Place> = host.drain(..strip_count).collect();

    let head_stripped = stripped.iter().any(|p| !matches!(p, Place::Block(..)));
    for place in &stripped {
        match *place {
            Place::Tool(i) => remove_marker(&mut request.tools, i),
            Place::System(i) => remove_marker(&mut request.system, i),
            Place::Block(m, b) => {
                if let Some(msg) = request.messages.get_mut(m) {
                    let msg = Arc::make_mut(msg);
                    if let Some(block) = msg.content.get_mut(b) {
                        *block = block.without_cache_marker();
                    }
                }
            }
        }
    }
    for place in &ours {
        match *place {
            Place::Tool(i) => add_marker(&mut request.tools, i),
            Place::System(i) => add_marker(&mut request.system, i),
            Place::Block(m, b) => {
                if let Some(msg) = request.messages.get_mut(m) {
                    let msg = Arc::make_mut(msg);
                    if let Some(block) = msg.content.get_mut(b) {
                        *block = block.with_cache_marker();
                    }
                }
            }
        }
    }
    let conversation_detail = match conversation {
        Some(Place::Block(m, _)) if fork_skips_cache_write => format!("message {m} (end of the shared prefix)"),
        Some(Place::Block(m, _)) => format!("message {m}"),
        _ => "no message".to_owned(),
    };
    let applied = Applied {
        stage: super::Stage::CacheBreakpoints,
        acted: !ours.is_empty(),
        tokens_freed: 0,
        detail: format!(
            "{} markers ({conversation_detail}), {} host markers kept, {} removed",
            ours.len(),
            host.len(),
            stripped.len()
        ),
    };
    (applied, head_stripped)
}

// Both copy the shared list only when the value actually changes.
fn add_marker(values: &mut Arc<Vec<Value>>, i: usize) {
    if values.get(i).is_some_and(|v| v.is_object() && !has_marker(v))
        && let Some(Value::Object(map)) = Arc::make_mut(values).get_mut(i)
    {
        map.insert("cache_control".to_owned(), json!({"type": "ephemeral"}));
    }
}

fn remove_marker(values: &mut Arc<Vec<Value>>, i: usize) {
    if values.get(i).is_some_and(has_marker)
        && let Some(Value::Object(map)) = Arc::make_mut(values).get_mut(i)
    {
        map.shift_remove("cache_control");
    }
}
