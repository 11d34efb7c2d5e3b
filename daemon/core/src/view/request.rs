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
