//! A simulation of a provider's prompt cache (Anthropic's rules), applied to the exact
//! request bodies a host or ctxd sends, to price them.
//!
//! The rules modelled, as the provider documents them:
//! - The cached prefix runs in order tools, system, messages; a request is cut into
//!   blocks (each tool, each system block, each content block of each message).
//! - Entries are written only at breakpoints (`cache_control` on a block, or on a block
//!   nested in a tool result), when the prefix up to it holds at least
//!   [`MIN_CACHEABLE_TOKENS`]. An entry lives five minutes (`"ttl": "1h"`: an hour),
//!   and every read renews it.
//! - A read is looked for at each breakpoint and at the [`LOOKBACK_BLOCKS`] block
//!   boundaries before it; the longest prefix found is read.
//! - What a prefix is keyed by: the model, then the blocks without their markers. A
//!   change of `tool_choice` or of the thinking settings invalidates the message blocks
//!   only (tools and system still read); a change of the tools invalidates everything.
//! - Prices, in units of one uncached input token: a read 0.1, a write 1.25 (five
//!   minutes) or 2 (one hour).
//!
//! Token counts are the estimate ctxd uses everywhere (bytes of the block's JSON / 4).

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use serde_json::Value;

/// Shortest prefix the provider caches (Sonnet and Opus models).
pub const MIN_CACHEABLE_TOKENS: u64 = 1_024;
/// Block boundaries before a breakpoint where a read is also looked for.
pub const LOOKBACK_BLOCKS: usize = 20;
/// Lifetime of an entry without a `ttl`, and with `"ttl": "1h"`, in milliseconds.
pub const TTL_5M_MS: u64 = 5 * 60 * 1_000;
pub const TTL_1H_MS: u64 = 60 * 60 * 1_000;
/// Price of a read, and of a write with each lifetime, per uncached input token.
pub const READ_PRICE: f64 = 0.1;
pub const WRITE_5M_PRICE: f64 = 1.25;
pub const WRITE_1H_PRICE: f64 = 2.0;

/// What one request cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Bill {
    /// Every input token of the request.
    pub input: u64,
    /// Read from the cache.
    pub read: u64,
    /// Written to the cache (five-minute and one-hour entries).
    pub written_5m: u64,
    pub written_1h: u64,
    /// In units of one uncached input token.
    pub cost: f64,
}

impl Bill {
    /// What the request would cost with no cache at all.
    pub fn uncached_cost(&self) -> f64 {
        self.input as f64
    }

    pub fn add(&mut self, other: &Bill) {
        self.input += other.input;
        self.read += other.read;
        self.written_5m += other.written_5m;
        self.written_1h += other.written_1h;
        self.cost += other.cost;
    }
}

/// One block of a request's prefix.
struct Block {
    /// Hash of the prefix up to and including this block.
    key: u64,
    tokens: u64,
    /// `Some(ttl_ms)` when the block carries a breakpoint.
    breakpoint: Option<u64>,
}

/// The provider's cache for one account: entries by prefix key, with their expiry.
#[derive(Debug, Default, Clone)]
pub struct PromptCache {
    entries: HashMap<u64, (u64, u64)>, // key → (expires at, ttl)
}

impl PromptCache {
    /// Sends `body` at `now_ms`: returns its bill and updates the cache.
    pub fn send(&mut self, body: &Value, now_ms: u64) -> Bill {
        let blocks = blocks(body);
        self.entries.retain(|_, (expires, _)| *expires > now_ms);
        let prefix: Vec<u64> = blocks
            .iter()
            .scan(0u64, |sum, b| {
                *sum += b.tokens;
                Some(*sum)
            })
            .collect();
        let input = prefix.last().copied().unwrap_or(0);
        // The longest prefix found at a breakpoint or a boundary shortly before one.
        let mut read_end: Option<usize> = None;
        for (p, _) in blocks.iter().enumerate().filter(|(_, b)| b.breakpoint.is_some()) {
            let hit =
                (p.saturating_sub(LOOKBACK_BLOCKS)..=p).rev().find(|&j| self.entries.contains_key(&blocks[j].key));
            if let Some(j) = hit {
                read_end = Some(read_end.map_or(j, |r| r.max(j)));
            }
        }
        let read = read_end.map_or(0, |r| prefix[r]);
        if let Some(r) = read_end
            && let Some((expires, ttl)) = self.entries.get_mut(&blocks[r].key)
        {
            *expires = now_ms + *ttl;
        }
        // Entries are written at the breakpoints past what was read; the tokens between
        // two breakpoints are charged at the later one's lifetime.
        let mut bill = Bill { input, read, ..Bill::default() };
        let mut covered = read;
        for (p, block) in blocks.iter().enumerate() {
            let Some(ttl) = block.breakpoint else { continue };
            if prefix[p] < MIN_CACHEABLE_TOKENS {
                continue;
            }
            let entry = self.entries.entry(block.key).or_insert((0, ttl));
            entry.0 = entry.0.max(now_ms + ttl);
            if prefix[p] > covered {
                let written = prefix[p] - covered;
                if ttl >= TTL_1H_MS {
                    bill.written_1h += written;
                } else {
                    bill.written_5m += written;
                }
                covered = prefix[p];
            }
        }
        let plain = input - bill.read - bill.written_5m - bill.written_1h;
        bill.cost = plain as f64
            + bill.read as f64 * READ_PRICE
            + bill.written_5m as f64 * WRITE_5M_PRICE
            + bill.written_1h as f64 * WRITE_1H_PRICE;
        bill
    }
}

fn hash_of(previous: u64, value: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    previous.hash(&mut h);
    value.hash(&mut h);
    h.finish()
}

/// A block's JSON without its breakpoint (nested ones included), and the breakpoint's
/// lifetime when it has one.
fn unmarked(block: &Value) -> (String, Option<u64>) {
    let mut ttl = None;
    let mut copy = block.clone();
    let mut strip = |v: &mut Value| {
        if let Some(object) = v.as_object_mut()
            && let Some(marker) = object.remove("cache_control")
        {
            let hour = marker.get("ttl").and_then(Value::as_str) == Some("1h");
            let this = if hour { TTL_1H_MS } else { TTL_5M_MS };
            ttl = Some(ttl.map_or(this, |t: u64| t.max(this)));
        }
    };
    strip(&mut copy);
    if let Some(nested) = copy.get_mut("content").and_then(Value::as_array_mut) {
        nested.iter_mut().for_each(&mut strip);
    }
    (copy.to_string(), ttl)
}

fn tokens_of(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

/// The request's prefix as blocks, keyed in order: model, tools, system, then (after
/// `tool_choice` and the thinking settings) the messages' content blocks.
fn blocks(body: &Value) -> Vec<Block> {
    let mut out = Vec::new();
    let mut key = hash_of(0, &body.get("model").map(Value::to_string).unwrap_or_default());
    let mut push = |key: &mut u64, json: String, breakpoint: Option<u64>| {
        *key = hash_of(*key, &json);
        out.push(Block { key: *key, tokens: tokens_of(&json), breakpoint });
    };
    for tool in body.get("tools").and_then(Value::as_array).into_iter().flatten() {
        let (json, ttl) = unmarked(tool);
        push(&mut key, json, ttl);
    }
    match body.get("system") {
        Some(Value::String(text)) => push(&mut key, Value::String(text.clone()).to_string(), None),
        Some(Value::Array(system)) => {
            for block in system {
                let (json, ttl) = unmarked(block);
                push(&mut key, json, ttl);
            }
        }
        _ => {}
    }
    // Settings that invalidate the cached messages but not tools and system.
    let settings = format!(
        "{}|{}",
        body.get("tool_choice").map(Value::to_string).unwrap_or_default(),
        body.get("thinking").map(Value::to_string).unwrap_or_default()
    );
    key = hash_of(key, &settings);
    for message in body.get("messages").and_then(Value::as_array).into_iter().flatten() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        key = hash_of(key, &role);
        match message.get("content") {
            Some(Value::String(text)) => {
                let json = serde_json::json!({"type": "text", "text": text}).to_string();
                push(&mut key, json, None);
            }
            Some(Value::Array(content)) => {
                for block in content {
                    let (json, ttl) = unmarked(block);
                    push(&mut key, json, ttl);
                }
            }
            _ => {}
        }
    }
    out
}

/// Share of `parent`'s input tokens that `fork`, sent right after it, reads from the
/// cache (`parent` sent first into an empty cache).
pub fn fork_read_share(parent: &Value, fork: &Value) -> f64 {
    let mut cache = PromptCache::default();
    let first = cache.send(parent, 0);
    let second = cache.send(fork, 1_000);
    if first.input == 0 { 0.0 } else { second.read as f64 / first.input as f64 }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A text block of about `tokens` tokens.
    fn text(tokens: usize, tag: &str) -> Value {
        json!({"type": "text", "text": format!("{tag} {}", "x".repeat(tokens * 4))})
    }

    fn marked(mut block: Value) -> Value {
        block["cache_control"] = json!({"type": "ephemeral"});
        block
    }

    /// Tools, a marked system prompt, and `turns` user/assistant pairs with the last
    /// block marked.
    fn request(turns: usize) -> Value {
        let mut messages = Vec::new();
        for t in 0..turns {
            messages.push(json!({"role": "user", "content": [text(300, &format!("ask {t}"))]}));
            messages.push(json!({"role": "assistant", "content": [text(300, &format!("answer {t}"))]}));
        }
        if let Some(last) = messages.last_mut() {
            last["content"][0] = marked(last["content"][0].clone());
        }
        json!({
            "model": "m",
            "tools": [{"name": "Read", "description": "x".repeat(2_000)}],
            "system": [marked(text(1_500, "system"))],
            "messages": messages,
        })
    }

    #[test]
    fn the_same_request_reads_what_it_wrote() {
        let mut cache = PromptCache::default();
        let body = request(4);
        let first = cache.send(&body, 0);
        assert_eq!(first.read, 0);
        assert_eq!(first.written_5m, first.input, "marked at the very end: everything written");
        assert!((first.cost - first.input as f64 * WRITE_5M_PRICE).abs() < 1e-6);
        let second = cache.send(&body, 60_000);
        assert_eq!(second.read, second.input);
        assert_eq!(second.written_5m, 0);
        assert!((second.cost - second.input as f64 * READ_PRICE).abs() < 1e-6);
    }

    #[test]
    fn entries_expire_unless_read() {
        let body = request(3);
        let mut cache = PromptCache::default();
        cache.send(&body, 0);
        // Read at 4 minutes: renewed, still there at 8.
        assert_eq!(cache.send(&body, 4 * 60_000).read, cache.send(&body, 8 * 60_000).read);
        assert!(cache.send(&body, 8 * 60_000).read > 0);
        // Five minutes without a read: gone.
        assert_eq!(cache.send(&body, 8 * 60_000 + TTL_5M_MS + 1).read, 0);
        // An hour-long entry survives the gap.
        let mut hour = body.clone();
        hour["system"][0]["cache_control"] = json!({"type": "ephemeral", "ttl": "1h"});
        let mut cache = PromptCache::default();
        let first = cache.send(&hour, 0);
        assert!(first.written_1h > 0);
        assert!(cache.send(&hour, 30 * 60_000).read > 0);
    }

    #[test]
    fn a_read_is_found_up_to_twenty_blocks_back() {
        let grown = |extra: usize| {
            let mut body = request(3);
            let messages = body["messages"].as_array_mut().unwrap();
            // The old breakpoint goes; `extra` more blocks follow, the last one marked.
            messages.last_mut().unwrap()["content"][0].as_object_mut().unwrap().remove("cache_control");
            let blocks: Vec<Value> = (0..extra).map(|i| text(50, &format!("more {i}"))).collect();
            let mut blocks = blocks;
            let last = blocks.pop().unwrap();
            blocks.push(marked(last));
            messages.push(json!({"role": "user", "content": blocks}));
            body
        };
        let base = request(3);
        for (extra, reads_conversation) in [(1, true), (20, true), (21, false), (30, false)] {
            let mut cache = PromptCache::default();
            let first = cache.send(&base, 0);
            let second = cache.send(&grown(extra), 1_000);
            // Without the conversation, only tools and system are read (their marker).
            assert_eq!(second.read == first.input, reads_conversation, "{extra} blocks: {second:?}");
            assert!(second.read > 0, "{extra}: the system breakpoint still reads");
        }
    }

    #[test]
    fn tool_choice_and_thinking_invalidate_the_messages_tools_everything() {
        let body = request(4);
        let system_end = {
            let mut cache = PromptCache::default();
            cache.send(&body, 0);
            let mut other = body.clone();
            other["messages"][0]["content"][0]["text"] = json!("changed");
            cache.send(&other, 1_000).read
        };
        for (field, value) in
            [("tool_choice", json!({"type": "none"})), ("thinking", json!({"type": "enabled", "budget_tokens": 1024}))]
        {
            let mut cache = PromptCache::default();
            cache.send(&body, 0);
            let mut changed = body.clone();
            changed[field] = value;
            assert_eq!(cache.send(&changed, 1_000).read, system_end, "{field}: tools and system only");
        }
        let mut cache = PromptCache::default();
        cache.send(&body, 0);
        let mut changed = body.clone();
        changed["tools"][0]["description"] = json!("shorter");
        assert_eq!(cache.send(&changed, 1_000).read, 0, "new tools: nothing is read");
        // A marker moved or added does not change the prefix it marks.
        let mut cache = PromptCache::default();
        cache.send(&body, 0);
        let mut remarked = body.clone();
        remarked["messages"][0]["content"][0] = marked(remarked["messages"][0]["content"][0].clone());
        assert_eq!(cache.send(&remarked, 1_000).read, cache.send(&body, 2_000).input);
    }

    #[test]
    fn short_prefixes_are_not_cached() {
        let body = json!({"model": "m", "system": [marked(text(100, "s"))], "messages": [{"role": "user", "content": [marked(text(200, "u"))]}]});
        let mut cache = PromptCache::default();
        let first = cache.send(&body, 0);
        assert_eq!(first.written_5m, 0);
        assert_eq!(cache.send(&body, 1_000).read, 0);
        assert!((first.cost - first.input as f64).abs() < 1e-6);
    }

    #[test]
    fn a_fork_that_keeps_the_prefix_reads_it() {
        let parent = request(6);
        let mut fork = parent.clone();
        let last = fork["messages"].as_array().unwrap().len() - 1;
        fork["messages"][last]["content"].as_array_mut().unwrap().push(json!({"type": "text", "text": "SUMMARIZE"}));
        assert!(fork_read_share(&parent, &fork) > 0.99);
        fork["tool_choice"] = json!({"type": "none"});
        assert!(fork_read_share(&parent, &fork) < 0.5, "a changed tool_choice reads tools and system only");
    }
}
