//! A Messages request read as a conversation, for instant compaction on the gateway:
//! which messages it carries, whether it is Claude Code's compaction request, and the
//! hashes that say whether a summary prepared earlier stands for it.
//!
//! A prepared summary may answer a compaction request only when it was made for the
//! same conversation: the same model, system blocks and tools (the *shape*), and a
//! messages list that starts with exactly the messages the summary covers (the
//! *prefix*). Both are compared by SHA-256 over a canonical form of the JSON, so the
//! comparison costs one pass and the store keeps 32 bytes, not the conversation. The
//! canonical form sorts object keys and leaves out `cache_control`: Claude Code moves
//! its cache markers to the newest message on every request, and a marker says nothing
//! about what the model reads. A message whose `content` is a plain string counts as the
//! one text block the API reads it as.
//!
//! Claude Code 2.1.332 asks for a summary with the conversation unchanged and its
//! summary instruction appended: as a user message of its own for `/compact`, as the
//! last text block of the last user message for automatic and reactive compaction. The
//! instruction is recognised by how it opens (it tells the model to answer with text
//! only) and by naming the `<summary>` block it asks for.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

/// A SHA-256 digest.
pub type Hash = [u8; 32];

/// How Claude Code's summary instruction opens.
pub const INSTRUCTION_OPENING: &str = "CRITICAL: Respond with TEXT ONLY";
/// What the instruction asks for, somewhere in it.
const INSTRUCTION_ASKS_FOR: &str = "<summary>";
/// Where the instruction carries the user's `/compact <focus>` text (2.1.332: a line of
/// its own, the focus on the lines after it, up to a blank line).
const FOCUS_HEADING: &str = "\nAdditional Instructions:\n";

/// A request body read far enough to compare conversations. Borrows the body.
#[derive(Debug)]
pub struct Conversation<'a> {
    pub body: &'a str,
    pub model: String,
    pub stream: bool,
    /// Each message's JSON text, as sent.
    pub messages: Vec<&'a RawValue>,
    /// Byte offset in `body` of the `]` that closes `messages`.
    pub messages_end: usize,
    system: Option<&'a RawValue>,
    tools: Option<&'a RawValue>,
    /// The request offers tools: a turn of the agent's loop, not a side request (a
    /// title, a classification) that Claude Code sends with the same session id.
    pub has_tools: bool,
}

/// Why a body is not a conversation the gateway can compare.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("the body is not a JSON object of the Messages API ({0})")]
    NotJson(String),
    #[error("the body names no model")]
    NoModel,
    #[error("the body has no messages")]
    NoMessages,
}

#[derive(Deserialize)]
struct Top<'a> {
    model: Option<String>,
    #[serde(default)]
    stream: bool,
    #[serde(borrow)]
    system: Option<&'a RawValue>,
    #[serde(borrow)]
    tools: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Option<Vec<&'a RawValue>>,
}

/// Where `inner` (a slice of `outer`) starts in `outer`.
fn offset_in(outer: &str, inner: &str) -> Option<usize> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    (start + inner.len() <= outer.len()).then_some(start)
}

/// Reads a request body. A truncated body, a body that is not JSON, or one without a
/// model or messages is [`Unreadable`].
pub fn read(body: &[u8]) -> Result<Conversation<'_>, Unreadable> {
    let text = std::str::from_utf8(body).map_err(|e| Unreadable::NotJson(e.to_string()))?;
    let top: Top<'_> = serde_json::from_str(text).map_err(|e| Unreadable::NotJson(e.to_string()))?;
    let model = top.model.filter(|m| !m.is_empty()).ok_or(Unreadable::NoModel)?;
    let messages = top.messages.filter(|m| !m.is_empty()).ok_or(Unreadable::NoMessages)?;
    let last = messages.last().map(|m| m.get()).unwrap_or_default();
    let after_last = offset_in(text, last).map(|at| at + last.len()).ok_or(Unreadable::NoMessages)?;
    let gap = text[after_last..].bytes().take_while(u8::is_ascii_whitespace).count();
    let messages_end = after_last + gap;
    if text.as_bytes().get(messages_end) != Some(&b']') {
        return Err(Unreadable::NotJson("the messages list does not end where its last message does".into()));
    }
    let has_tools = top.tools.is_some_and(|t| !matches!(t.get().trim(), "[]" | "null"));
    Ok(Conversation {
        body: text,
        model,
        stream: top.stream,
        messages,
        messages_end,
        system: top.system,
        tools: top.tools,
        has_tools,
    })
}

impl Conversation<'_> {
    /// Hash of the model, system blocks and tools (what must be equal for the upstream
    /// to read the same cache, and for a summary to be of this conversation).
    pub fn shape(&self) -> Result<Hash, Unreadable> {
        let mut shape = Sha256::new();
        for (name, part) in [("system", self.system), ("tools", self.tools)] {
            shape.update(name.as_bytes());
            shape.update([0]);
            if let Some(raw) = part {
                let value: Value = serde_json::from_str(raw.get()).map_err(|e| Unreadable::NotJson(e.to_string()))?;
                shape.update(canonical(&value));
            }
            shape.update([0]);
        }
        shape.update(b"model\0");
        shape.update(self.model.as_bytes());
        Ok(shape.finalize().into())
    }

    /// Whether the last message ends with Claude Code's summary instruction: one parse
    /// of that message, so an ordinary turn costs no more.
    pub fn asks_for_summary(&self) -> bool {
        let Some(last) = self.messages.last() else { return false };
        let Ok(last) = serde_json::from_str::<Value>(last.get()) else { return false };
        compaction_ask(vec![last]).is_some()
    }

    /// The messages as values (one parse of each).
    pub fn values(&self) -> Result<Vec<Value>, Unreadable> {
        self.messages
            .iter()
            .map(|raw| serde_json::from_str(raw.get()).map_err(|e| Unreadable::NotJson(e.to_string())))
            .collect()
    }
}

/// The canonical bytes of a JSON value: keys sorted, `cache_control` left out, no
/// whitespace.
pub fn canonical(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().filter(|k| k.as_str() != "cache_control").collect();
            keys.sort_unstable();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                if let Some(v) = map.get(key) {
                    write_canonical(v, out);
                }
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::String(s) => write_string(s, out),
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(Value::String(s.to_owned()).to_string().as_bytes());
}

/// A message with a string `content` as the one text block it stands for.
fn normalized(message: &Value) -> std::borrow::Cow<'_, Value> {
    match message.get("content") {
        Some(Value::String(text)) => {
            let mut copy = message.clone();
            copy["content"] = serde_json::json!([{"type": "text", "text": text}]);
            std::borrow::Cow::Owned(copy)
        }
        _ => std::borrow::Cow::Borrowed(message),
    }
}

/// The running hash of a messages list: after each message, the hash of the prefix so
/// far. Equal hashes at the same count mean equal prefixes.
#[derive(Debug, Clone, Default)]
pub struct PrefixHash {
    state: Hash,
    count: usize,
}

impl PrefixHash {
    pub fn push(&mut self, message: &Value) -> Hash {
        let bytes = canonical(&normalized(message));
        let mut next = Sha256::new();
        next.update(self.state);
        next.update((bytes.len() as u64).to_le_bytes());
        next.update(&bytes);
        self.state = next.finalize().into();
        self.count += 1;
        self.state
    }

    pub fn count(&self) -> usize {
        self.count
    }

    pub fn hash(&self) -> Hash {
        self.state
    }

    /// The hash of the first `n` of `messages` (all of them when fewer).
    pub fn of(messages: &[Value], n: usize) -> PrefixHash {
        let mut hash = PrefixHash::default();
        for message in messages.iter().take(n) {
            hash.push(message);
        }
        hash
    }
}

/// Where Claude Code put its summary instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionForm {
    /// A user message of its own (`/compact`).
    Separate,
    /// The last text block of the last user message (automatic, reactive).
    Appended,
}

/// A compaction request: the messages it asks to have summarized.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionAsk {
    pub form: CompactionForm,
    /// The conversation to summarize: every message but the instruction.
    pub covered: Vec<Value>,
    /// What the user asked the summary to focus on (`/compact <focus>`), if anything.
    pub focus: Option<String>,
}

/// The focus text of a summary instruction, if it carries one.
fn instruction_focus(text: &str) -> Option<String> {
    let after = &text[text.find(FOCUS_HEADING)? + FOCUS_HEADING.len()..];
    let focus = after.split("\n\n").next().unwrap_or("").trim();
    (!focus.is_empty()).then(|| focus.to_owned())
}

/// Whether a text block is Claude Code's summary instruction.
pub fn is_summary_instruction(text: &str) -> bool {
    text.trim_start().starts_with(INSTRUCTION_OPENING) && text.contains(INSTRUCTION_ASKS_FOR)
}

/// Claude Code's compaction request, if `messages` end with its summary instruction.
pub fn compaction_ask(mut messages: Vec<Value>) -> Option<CompactionAsk> {
    let mut last = messages.pop()?;
    if last.get("role").and_then(Value::as_str) != Some("user") {
        return None;
    }
    let (form, focus) = match last.get_mut("content")? {
        Value::String(text) => {
            if !is_summary_instruction(text) {
                return None;
            }
            (CompactionForm::Separate, instruction_focus(text))
        }
        Value::Array(blocks) => {
            let is_instruction = |b: &Value| {
                b.get("type").and_then(Value::as_str) == Some("text")
                    && b.get("text").and_then(Value::as_str).is_some_and(is_summary_instruction)
            };
            if !blocks.last().is_some_and(is_instruction) {
                return None;
            }
            let focus =
                blocks.pop().as_ref().and_then(|b| b.get("text")).and_then(Value::as_str).and_then(instruction_focus);
            (if blocks.is_empty() { CompactionForm::Separate } else { CompactionForm::Appended }, focus)
        }
        _ => return None,
    };
    if form == CompactionForm::Appended {
        messages.push(last);
    }
    Some(CompactionAsk { form, covered: messages, focus })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) const INSTRUCTION: &str =
        "CRITICAL: Respond with TEXT ONLY. (stand-in) Write an <analysis> block, then a <summary> block.";

    fn body(messages: &Value) -> String {
        json!({"model": "claude-opus-5-5", "stream": true, "max_tokens": 32000,
            "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
            "messages": messages})
        .to_string()
    }

    fn turn() -> Value {
        json!([
            {"role": "user", "content": [{"type": "text", "text": "first prompt"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "an answer"}]},
            {"role": "user", "content": [{"type": "text", "text": "second prompt", "cache_control": {"type": "ephemeral"}}]}
        ])
    }

    #[test]
    fn a_compact_focus_is_read_from_the_instruction() {
        let ask = |text: &str| {
            let messages = vec![
                json!({"role": "user", "content": "a prompt"}),
                json!({"role": "user", "content": [{"type": "text", "text": text}]}),
            ];
            compaction_ask(messages).unwrap().focus
        };
        assert_eq!(ask(INSTRUCTION), None);
        let focused = format!(
            "{INSTRUCTION}\n\n\nAdditional Instructions:\nkeep only the parser decisions\n\nREMINDER: text only."
        );
        assert_eq!(ask(&focused).as_deref(), Some("keep only the parser decisions"));
        assert_eq!(ask(&format!("{INSTRUCTION}\nAdditional Instructions:\n  \n\nREMINDER")), None, "an empty focus");
    }

    #[test]
    fn reads_model_messages_and_where_the_list_ends() {
        let text = body(&turn()).replace("]}],\"", "]} ] ,\"");
        let conversation = read(text.as_bytes()).unwrap();
        assert_eq!(conversation.model, "claude-opus-5-5");
        assert!(conversation.stream && conversation.has_tools);
        assert_eq!(conversation.messages.len(), 3);
        let side = text.replace(r#""tools":[{"name":"Read","input_schema":{"type":"object"}}]"#, r#""tools":[]"#);
        assert!(!read(side.as_bytes()).unwrap().has_tools, "a side request offers no tools");
        assert_eq!(&text[conversation.messages_end..conversation.messages_end + 1], "]");
        let last = conversation.messages[2].get();
        assert!(text[..conversation.messages_end].trim_end().ends_with(last));
    }

    #[test]
    fn bad_bodies_are_unreadable() {
        let text = body(&turn());
        assert!(matches!(read(&text.as_bytes()[..text.len() - 9]), Err(Unreadable::NotJson(_))), "truncated");
        assert!(matches!(read(b"\xff\xfe"), Err(Unreadable::NotJson(_))));
        assert_eq!(read(br#"{"messages":[{"role":"user","content":"x"}]}"#).unwrap_err(), Unreadable::NoModel);
        assert_eq!(read(br#"{"model":"m","messages":[]}"#).unwrap_err(), Unreadable::NoMessages);
        assert!(matches!(read(br#"{"model":"m","model":"n","messages":[1]}"#), Err(Unreadable::NotJson(_))));
    }

    #[test]
    fn the_shape_is_model_system_and_tools_but_not_cache_markers() {
        let base = read(body(&turn()).as_bytes()).unwrap().shape().unwrap();
        let moved = body(&turn()).replace(r#","cache_control":{"type":"ephemeral"}}],"tools""#, r#"}],"tools""#);
        assert_ne!(moved, body(&turn()));
        assert_eq!(read(moved.as_bytes()).unwrap().shape().unwrap(), base, "a cache marker moved");
        for other in [
            body(&turn()).replace("claude-opus-5-5", "claude-sonnet-4-5"),
            body(&turn()).replace("\"sys\"", "\"other system\""),
            body(&turn()).replace("\"Read\"", "\"Write\""),
        ] {
            assert_ne!(read(other.as_bytes()).unwrap().shape().unwrap(), base, "{other}");
        }
    }

    #[test]
    fn prefix_hashes_ignore_markers_key_order_and_string_content() {
        let a = turn();
        let b = json!([
            {"content": "first prompt", "role": "user"},
            {"role": "assistant", "content": [{"text": "an answer", "type": "text"}]},
            {"role": "user", "content": [{"type": "text", "text": "second prompt"}]}
        ]);
        let (a, b) = (a.as_array().unwrap(), b.as_array().unwrap());
        assert_eq!(PrefixHash::of(a, 3).hash(), PrefixHash::of(b, 3).hash());
        assert_ne!(PrefixHash::of(a, 2).hash(), PrefixHash::of(a, 3).hash());
        let mut changed = b.clone();
        changed[1]["content"][0]["text"] = json!("another answer");
        assert_ne!(PrefixHash::of(a, 2).hash(), PrefixHash::of(&changed, 2).hash());
        assert_eq!(PrefixHash::of(a, 1).hash(), PrefixHash::of(&changed, 1).hash());
    }

    #[test]
    fn a_manual_compact_is_a_separate_message_and_covers_all_before_it() {
        let mut messages = turn().as_array().unwrap().clone();
        messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": "second answer"}]}));
        messages.push(json!({"role": "user", "content": [{"type": "text", "text": INSTRUCTION}]}));
        let ask = compaction_ask(messages.clone()).unwrap();
        assert_eq!(ask.form, CompactionForm::Separate);
        assert_eq!(ask.covered, messages[..4]);
        let text = body(&Value::Array(messages.clone()));
        assert!(read(text.as_bytes()).unwrap().asks_for_summary());
        assert!(!read(body(&turn()).as_bytes()).unwrap().asks_for_summary());
        messages[4] = json!({"role": "user", "content": INSTRUCTION});
        assert_eq!(compaction_ask(messages).unwrap().covered.len(), 4, "string content");
    }

    #[test]
    fn an_automatic_compact_appends_a_block_to_the_last_user_message() {
        let mut messages = turn().as_array().unwrap().clone();
        let original = messages.clone();
        messages[2]["content"].as_array_mut().unwrap().push(json!({"type": "text", "text": INSTRUCTION}));
        let ask = compaction_ask(messages).unwrap();
        assert_eq!(ask.form, CompactionForm::Appended);
        assert_eq!(ask.covered, original, "the last user message without the instruction");
    }

    #[test]
    fn ordinary_turns_are_not_compaction_requests() {
        let messages = turn().as_array().unwrap().clone();
        assert_eq!(compaction_ask(messages.clone()), None);
        let mut quoting = messages.clone();
        quoting.push(
            json!({"role": "user", "content": "please explain what CRITICAL: Respond with TEXT ONLY <summary> means"}),
        );
        assert_eq!(compaction_ask(quoting), None, "a prompt that quotes the words is no instruction");
        let mut earlier = messages;
        earlier[2]["content"].as_array_mut().unwrap().insert(0, json!({"type": "text", "text": INSTRUCTION}));
        assert_eq!(compaction_ask(earlier), None, "the instruction must come last");
        assert_eq!(compaction_ask(vec![]), None);
        assert_eq!(compaction_ask(vec![json!({"role": "assistant", "content": INSTRUCTION})]), None);
    }
}
