//! The request body the pipeline returns.
//!
//! A struct rather than a `serde_json::Value`: its messages share their blocks (and most
//! messages themselves) with the view cache, so producing it after one appended record
//! copies pointers, not a session's text, and serializing it copies each block's stored
//! JSON text verbatim. `to_value` gives a `Value` for callers (and tests) that want one.

use std::sync::Arc;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::Value;

use super::item::{Block, Role};

/// One message of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiMessage {
    pub role: Role,
    pub content: Vec<Block>,
}

impl ApiMessage {
    pub fn tokens(&self) -> u64 {
        self.content.iter().map(Block::tokens).sum()
    }
}

impl Serialize for ApiMessage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("role", self.role.as_str())?;
        map.serialize_entry("content", &self.content)?;
        map.end()
    }
}

/// A Messages API request body: `model`, `max_tokens`, `system`, `messages`, `tools`,
/// and the host's `thinking` settings as it sent them. Metadata and betas are the
/// host's to add (betas are HTTP headers).
#[derive(Debug, Clone, Serialize)]
pub struct Request {
    pub model: String,
    pub max_tokens: u64,
    /// Shared with the view cache while the host's blocks do not change.
    #[serde(skip_serializing_if = "is_empty", serialize_with = "serialize_values")]
    pub system: Arc<Vec<Value>>,
    #[serde(serialize_with = "serialize_messages")]
    pub messages: Vec<Arc<ApiMessage>>,
    #[serde(skip_serializing_if = "is_empty", serialize_with = "serialize_values")]
    pub tools: Arc<Vec<Value>>,
    /// The host's extended-thinking settings, passed through: a compaction fork keeps
    /// them, and the provider reads the cached prefix only with the same settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Value>,
}

fn is_empty(values: &Arc<Vec<Value>>) -> bool {
    values.is_empty()
}

fn serialize_values<S: Serializer>(values: &Arc<Vec<Value>>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(values.iter())
}

fn serialize_messages<S: Serializer>(messages: &[Arc<ApiMessage>], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(messages.iter().map(|m| &**m))
}

impl Request {
    /// The body as a JSON value.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The body as JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// How many leading messages two requests share: the part of `current` a host that kept
/// `previous` already has. Messages the view cache did not touch are the same `Arc`, so
/// the usual case compares pointers; the messages around the newest cache breakpoint,
/// rebuilt every turn, compare by value.
pub fn shared_messages(previous: &[Arc<ApiMessage>], current: &[Arc<ApiMessage>]) -> usize {
    previous.iter().zip(current).take_while(|(a, b)| Arc::ptr_eq(a, b) || a == b).count()
}

impl Request {
    /// The exact length of the `messages` array's JSON text, from the blocks' stored
    /// lengths: sizes the buffer a whole request is encoded into, so that hundreds of KB
    /// are written once rather than grown into (each doubling copies all of it again).
    pub fn messages_json_len(&self) -> usize {
        // `{"role":"` + role + `","content":[` + blocks and commas + `]}`
        let message = |m: &Arc<ApiMessage>| {
            let blocks: usize = m.content.iter().map(|b| b.json().len()).sum();
            9 + m.role.as_str().len() + 13 + blocks + m.content.len().saturating_sub(1) + 2
        };
        2 + self.messages.iter().map(message).sum::<usize>() + self.messages.len().saturating_sub(1)
    }

    /// The same request with only the messages from index `from` on (all of the other
    /// fields): what a host that kept the first `from` messages is sent.
    pub fn messages_from(&self, from: usize) -> Request {
        // Field by field: `..self.clone()` would clone every message pointer only to drop
        // them, a cost in the session's length on the per-turn path.
        Request {
            model: self.model.clone(),
            max_tokens: self.max_tokens,
            system: self.system.clone(),
            messages: self.messages.get(from..).unwrap_or_default().to_vec(),
            tools: self.tools.clone(),
            thinking: self.thinking.clone(),
        }
    }
}

impl PartialEq for Request {
    fn eq(&self, other: &Request) -> bool {
        self.model == other.model
            && self.max_tokens == other.max_tokens
            && self.system == other.system
            && self.tools == other.tools
            && self.thinking == other.thinking
            && self.messages.len() == other.messages.len()
            && self.messages.iter().zip(&other.messages).all(|(a, b)| a == b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::item::Block;

    fn message(role: Role, text: &str) -> Arc<ApiMessage> {
        Arc::new(ApiMessage { role, content: Block::text(text).into_iter().collect() })
    }

    #[test]
    fn shared_messages_compare_pointers_then_values() {
        let first = message(Role::User, "hello");
        let previous = vec![first.clone(), message(Role::Assistant, "hi"), message(Role::User, "old")];
        // The same Arc, an equal copy, then a different message.
        let current =
            vec![first, message(Role::Assistant, "hi"), message(Role::User, "new"), message(Role::Assistant, "ok")];
        assert_eq!(shared_messages(&previous, &current), 2);
        assert_eq!(shared_messages(&previous[..1], &current), 1);
        assert_eq!(shared_messages(&[], &current), 0);
        // A shorter request (after a compaction) shares at most its own length.
        assert_eq!(shared_messages(&current, &previous[..2]), 2);
    }

    #[test]
    fn messages_from_keeps_every_other_field() {
        let request = Request {
            model: "m".into(),
            max_tokens: 10,
            system: Arc::new(vec![Value::from("s")]),
            messages: vec![message(Role::User, "a"), message(Role::Assistant, "b")],
            tools: Arc::default(),
            thinking: None,
        };
        let tail = request.messages_from(1);
        assert_eq!(tail.messages.len(), 1);
        assert_eq!(tail.messages[0], request.messages[1]);
        assert_eq!((tail.model.as_str(), tail.max_tokens, tail.system.len()), ("m", 10, 1));
        assert!(request.messages_from(2).messages.is_empty());
        assert!(request.messages_from(9).messages.is_empty());
    }

    #[test]
    fn messages_json_len_is_the_length_serde_writes() {
        let two_blocks = Arc::new(ApiMessage {
            role: Role::Assistant,
            content: [Block::text("x"), Block::text("\"quoted\" ünï")].into_iter().flatten().collect(),
        });
        let empty = Arc::new(ApiMessage { role: Role::User, content: Vec::new() });
        for messages in [vec![], vec![message(Role::User, "a")], vec![message(Role::User, "hello"), two_blocks, empty]]
        {
            let request = Request {
                model: "m".into(),
                max_tokens: 1,
                system: Arc::default(),
                messages,
                tools: Arc::default(),
                thinking: None,
            };
            let written = serde_json::to_string(&request.messages.iter().map(|m| &**m).collect::<Vec<_>>()).unwrap();
            assert_eq!(request.messages_json_len(), written.len(), "{written}");
        }
    }
}
