//! The runtime view's unit: one message-bearing record, parsed once.
//!
//! A transcript line is parsed into an [`Item`] the first time the pipeline sees it, and
//! the item is reused on every later request: stages look at typed metadata (role,
//! tool ids, sizes) and never parse an old record's JSON again. Each content block
//! keeps its JSON text so a request is serialized by copying it.

use std::sync::Arc;

use serde::Deserialize;
use serde::ser::{Serialize, Serializer};
use serde_json::value::RawValue;

use super::raw::{self, Fields, Str};
use crate::record::{Kind, Record};

/// Tokens counted for one image, wherever it appears (the image's base64 text says
/// nothing about what the model is charged).
pub const IMAGE_TOKENS: u64 = 2_000;

/// Bytes of JSON per estimated token: the one rate of ctxd.
pub use crate::tally::BYTES_PER_TOKEN;

/// Whose turn a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// Where an item came from; stages treat some origins differently (tags, protection,
/// media stripping).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Text the user typed.
    Prompt,
    /// A user record carrying `tool_result` blocks.
    ToolResults,
    /// A user record the host marked `isMeta`.
    Meta,
    /// The summary a compaction installed.
    CompactSummary,
    /// An `attachment` record; the value is its `attachment.type`.
    Attachment(Arc<str>),
    /// A model response (one line of it).
    Response,
    /// The summary standing for a collapsed span.
    Collapse,
    /// The user context the pipeline places first.
    Context,
    /// Text the daemon adds for one request (changed files, notices, reminders).
    Extra,
    /// The instruction of a fork request.
    ForkInstruction,
}

impl Origin {
    /// Host-made context rather than conversation: the kind of message that
    /// oversized-media stripping applies to.
    pub fn is_meta_like(&self) -> bool {
        matches!(self, Origin::Meta | Origin::Attachment(_) | Origin::Context | Origin::Extra)
    }
}

/// One message-bearing record of the view.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub uuid: Option<Arc<str>>,
    pub parent_uuid: Option<Arc<str>>,
    pub role: Role,
    pub origin: Origin,
    /// `message.id` of a response line; the lines of one response share it.
    pub message_id: Option<Arc<str>>,
    pub timestamp_ms: Option<i64>,
    pub blocks: Vec<Block>,
    /// Removed by a snip but kept for a UI view (`include_snipped`); never sent.
    pub snipped: bool,
}

impl Item {
    /// A user item with one text block and no record behind it.
    pub fn user_text(origin: Origin, text: &str) -> Item {
        Item {
            uuid: None,
            parent_uuid: None,
            role: Role::User,
            origin,
            message_id: None,
            timestamp_ms: None,
            blocks: Block::text(text).into_iter().collect(),
            snipped: false,
        }
    }

    pub fn tokens(&self) -> u64 {
        self.blocks.iter().map(Block::tokens).sum()
    }

    /// Reads a record; `None` for records that never reach a model (system, bookkeeping,
    /// sidechain, API-error stand-ins) or that carry no content.
    ///
    /// Decided from Claude Code 2.1.332's own requests (its transcript keeps them as
    /// `api-request-blob` lines): the compaction summary is sent although it is marked
    /// `isVisibleInTranscriptOnly`, so that flag filters nothing; meta user records
    /// (command caveats, command output) are sent; an attachment is sent as the text of
    /// its `rendered` parts, and one without `rendered` (`prompt_snapshot`) is host
    /// bookkeeping. Parts the host renders with the `system` role go in as user text too:
    /// ctxd follows the seeds, which have no mid-conversation system messages.
    pub fn from_record(record: &Record) -> Option<Item> {
        let head = record.head();
        if head.is_sidechain {
            return None;
        }
        let (role, origin, blocks) = match head.kind {
            Kind::User => {
                let body: LineBody<'_> = serde_json::from_str(record.line()).ok()?;
                let blocks = content_blocks(body.message?.content?, Role::User);
                let origin = if head.is_compact_summary {
                    Origin::CompactSummary
                } else if head.is_meta {
                    Origin::Meta
                } else if blocks.iter().any(|b| matches!(b.kind, BlockKind::ToolResult(_))) {
                    Origin::ToolResults
                } else {
                    Origin::Prompt
                };
                (Role::User, origin, blocks)
            }
            Kind::Assistant => {
                // A failed request's stand-in was written by the host, not the model.
                if head.is_api_error || head.model.as_deref() == Some("<synthetic>") {
                    return None;
                }
                let body: LineBody<'_> = serde_json::from_str(record.line()).ok()?;
                (Role::Assistant, Origin::Response, content_blocks(body.message?.content?, Role::Assistant))
            }
            Kind::Attachment => {
                let body: LineBody<'_> = serde_json::from_str(record.line()).ok()?;
                let kind = body.attachment.and_then(|a| a.kind).map(|s| Arc::from(s.0.as_ref()))?;
                (Role::User, Origin::Attachment(kind), rendered_blocks(body.rendered?))
            }
            _ => return None,
        };
        if blocks.is_empty() {
            return None;
        }
        Some(Item {
            uuid: head.uuid.as_deref().map(Arc::from),
            parent_uuid: head.parent_uuid.as_deref().map(Arc::from),
            role,
            origin,
            message_id: head.message_id.as_deref().map(Arc::from),
            timestamp_ms: head.timestamp.as_deref().and_then(super::time::parse_rfc3339_ms),
            blocks,
            snipped: false,
        })
    }
}

#[derive(Deserialize)]
struct LineBody<'a> {
    #[serde(borrow, default)]
    message: Option<MessageBody<'a>>,
    #[serde(borrow, default)]
    attachment: Option<AttachmentBody<'a>>,
    #[serde(borrow, default)]
    rendered: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct MessageBody<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct AttachmentBody<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Str<'a>>,
}

#[derive(Deserialize)]
struct RenderedPart<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// `message.content`: a string is one text block; an array is read block by block.
fn content_blocks(content: &RawValue, role: Role) -> Vec<Block> {
    if content.get().starts_with('"') {
        return Block::text_from_raw(content).into_iter().collect();
    }
    let Ok(parts) = serde_json::from_str::<Vec<&RawValue>>(content.get()) else {
        return Vec::new();
    };
    parts.into_iter().filter_map(Block::parse).filter(|b| b.belongs_to(role)).collect()
}

/// An attachment's `rendered` text: `[{"content": "…"}, …]` or a plain string.
fn rendered_blocks(rendered: &RawValue) -> Vec<Block> {
    if rendered.get().starts_with('"') {
        return Block::text_from_raw(rendered).into_iter().collect();
    }
    let Ok(parts) = serde_json::from_str::<Vec<RenderedPart<'_>>>(rendered.get()) else {
        return Vec::new();
    };
    parts
        .into_iter()
        .filter_map(|p| p.content)
        .filter(|c| c.get().starts_with('"'))
        .filter_map(Block::text_from_raw)
        .collect()
}

/// One content block: typed metadata plus its JSON text.
#[derive(Debug, Clone)]
pub struct Block {
    pub kind: BlockKind,
    json: Arc<RawValue>,
    tokens: u64,
    /// The host put a `cache_control` marker on this block.
    host_marker: bool,
}

/// What a block is, with the facts stages decide on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockKind {
    Text,
    ToolUse {
        id: Arc<str>,
        name: Arc<str>,
    },
    ToolResult(ToolResult),
    Thinking,
    RedactedThinking,
    Image,
    Document,
    /// A `cache_edits` directive (cached microcompact).
    CacheEdits,
    /// Any other type, kept as it is (server tool blocks and the like).
    Other(Arc<str>),
}

/// The facts about a `tool_result` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResult {
    pub tool_use_id: Arc<str>,
    pub is_error: bool,
    /// Bytes of the `content` JSON, images excluded.
    pub content_bytes: u64,
    pub images: u32,
    /// The content holds `tool_reference` blocks (tools loaded by a tool search).
    pub has_tool_reference: bool,
    /// Content replaced by a stored-output preview.
    pub replaced: bool,
    /// Content replaced by the microcompact placeholder.
    pub cleared: bool,
    pub cache_reference: bool,
}

// Members the Messages API accepts, per block type; others are dropped so a field a
// newer host writes into its transcript (`caller`, …) cannot make a request invalid.
const TEXT_KEYS: &[&str] = &["type", "text", "citations", "cache_control"];
const TOOL_USE_KEYS: &[&str] = &["type", "id", "name", "input", "cache_control"];
const TOOL_RESULT_KEYS: &[&str] = &["type", "tool_use_id", "content", "is_error", "cache_control", "cache_reference"];
const THINKING_KEYS: &[&str] = &["type", "thinking", "signature"];
const REDACTED_THINKING_KEYS: &[&str] = &["type", "data"];
const IMAGE_KEYS: &[&str] = &["type", "source", "cache_control"];
const DOCUMENT_KEYS: &[&str] = &["type", "source", "title", "context", "citations", "cache_control"];

impl PartialEq for Block {
    fn eq(&self, other: &Block) -> bool {
        self.kind == other.kind && self.json.get() == other.json.get()
    }
}

impl Serialize for Block {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(serializer)
    }
}

impl Block {
    pub fn json(&self) -> &str {
        self.json.get()
    }

    pub fn raw(&self) -> &RawValue {
        &self.json
    }

    /// Estimated tokens: JSON bytes / 4, images at a flat rate.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    pub fn has_host_marker(&self) -> bool {
        self.host_marker
    }

    /// The facts of a `tool_result` block.
    pub fn result(&self) -> Option<&ToolResult> {
        match &self.kind {
            BlockKind::ToolResult(r) => Some(r),
            _ => None,
        }
    }

    /// A new text block; `None` for blank text, which the API refuses.
    pub fn text(text: &str) -> Option<Block> {
        if text.trim().is_empty() {
            return None;
        }
        Some(Block::text_from_json_string(&raw::string(text)))
    }

    /// A text block around a raw JSON string; `None` when the string is blank.
    fn text_from_raw(string: &RawValue) -> Option<Block> {
        if raw::is_blank_string(string) {
            return None;
        }
        Some(Block::text_from_json_string(string))
    }

    fn text_from_json_string(string: &RawValue) -> Block {
        let ty = raw::string("text");
        let json = raw::object(&[("type", &ty), ("text", string)]);
        Block::new(BlockKind::Text, json, false)
    }

    fn new(kind: BlockKind, json: Arc<RawValue>, host_marker: bool) -> Block {
        let len = json.get().len() as u64;
        let tokens = match &kind {
            BlockKind::Image => IMAGE_TOKENS,
            _ => len / BYTES_PER_TOKEN,
        }
        .max(1);
        Block { kind, json, tokens, host_marker }
    }

    /// Reads one block of `message.content`; `None` for blocks that cannot be sent: not
    /// an object, blank text, thinking without a signature, a tool block without ids.
    pub fn parse(raw: &RawValue) -> Option<Block> {
        let fields = Fields::parse(raw.get())?;
        let ty = fields.str("type")?;
        let host_marker = fields.has("cache_control");
        let keep = |known: &[&str]| {
            if fields.has_other_than(known) { fields.keep_only(known) } else { raw::shared(raw) }
        };
        let block = match ty.as_ref() {
            "text" => {
                let text = fields.get("text")?;
                if !text.get().starts_with('"') || raw::is_blank_string(text) {
                    return None;
                }
                Block::new(BlockKind::Text, keep(TEXT_KEYS), host_marker)
            }
            "tool_use" => {
                let id: Arc<str> = Arc::from(fields.str("id")?.as_ref());
                let name: Arc<str> = Arc::from(fields.str("name")?.as_ref());
                let json = if fields.has("input") {
                    keep(TOOL_USE_KEYS)
                } else {
                    // `input` is required; an absent one is an empty object.
                    let empty = raw::to_raw(&serde_json::Map::new());
                    Fields::parse(keep(TOOL_USE_KEYS).get())?.with("input", &empty)
                };
                Block::new(BlockKind::ToolUse { id, name }, json, host_marker)
            }
            "tool_result" => {
                let tool_use_id: Arc<str> = Arc::from(fields.str("tool_use_id")?.as_ref());
                let content = fields.get("content");
                let info = ContentInfo::of(content);
                let result = ToolResult {
                    tool_use_id,
                    is_error: fields.get("is_error").is_some_and(|v| v.get() == "true"),
                    content_bytes: info.bytes,
                    images: info.images,
                    has_tool_reference: info.tool_reference,
                    replaced: false,
                    cleared: content.and_then(raw::as_str).as_deref() == Some(super::microcompact::CLEARED),
                    cache_reference: fields.has("cache_reference"),
                };
                Block::result_block(result, keep(TOOL_RESULT_KEYS), host_marker, info.image_bytes)
            }
            "thinking" => {
                let signed = fields.str("signature").is_some_and(|s| !s.is_empty());
                if !signed {
                    return None;
                }
                Block::new(BlockKind::Thinking, keep(THINKING_KEYS), false)
            }
            "redacted_thinking" => {
                if fields.str("data").is_none_or(|d| d.is_empty()) {
                    return None;
                }
                Block::new(BlockKind::RedactedThinking, keep(REDACTED_THINKING_KEYS), false)
            }
            "image" => Block::new(BlockKind::Image, keep(IMAGE_KEYS), host_marker),
            "document" => Block::new(BlockKind::Document, keep(DOCUMENT_KEYS), host_marker),
            // A request directive, never content: the pipeline makes its own.
            "cache_edits" => return None,
            other => Block::new(BlockKind::Other(Arc::from(other)), raw::shared(raw), host_marker),
        };
        Some(block)
    }

    fn result_block(result: ToolResult, json: Arc<RawValue>, host_marker: bool, image_bytes: u64) -> Block {
        let len = json.get().len() as u64;
        let tokens =
            (len.saturating_sub(image_bytes) / BYTES_PER_TOKEN + u64::from(result.images) * IMAGE_TOKENS).max(1);
        Block { kind: BlockKind::ToolResult(result), json, tokens, host_marker }
    }

    /// A tool result rebuilt with new members (`content`, `cache_reference`, …) and new
    /// facts; the content is re-measured.
    pub(crate) fn rebuild_result(&self, edits: &[(&str, &RawValue)], update: impl FnOnce(&mut ToolResult)) -> Block {
        let BlockKind::ToolResult(old) = &self.kind else {
            return self.clone();
        };
        let Some(fields) = Fields::parse(self.json.get()) else {
            return self.clone();
        };
        let json = fields.with_all(edits);
        let info = match Fields::parse(json.get()) {
            Some(f) => ContentInfo::of(f.get("content")),
            None => return self.clone(),
        };
        let mut result = old.clone();
        result.content_bytes = info.bytes;
        result.images = info.images;
        result.has_tool_reference = info.tool_reference;
        update(&mut result);
        Block::result_block(result, json, self.host_marker, info.image_bytes)
    }

    /// The block with a `cache_control` marker (no-op when it has one).
    pub(crate) fn with_cache_marker(&self) -> Block {
        if self.host_marker {
            return self.clone();
        }
        let marker = raw::to_raw(&serde_json::json!({"type": "ephemeral"}));
        match Fields::parse(self.json.get()) {
            Some(fields) => {
                let json = fields.with("cache_control", &marker);
                let mut block = self.clone();
                block.tokens += (json.get().len() - self.json.get().len()) as u64 / BYTES_PER_TOKEN;
                block.json = json;
                block.host_marker = true;
                block
            }
            None => self.clone(),
        }
    }

    /// The block without its `cache_control` marker.
    pub(crate) fn without_cache_marker(&self) -> Block {
        if !self.host_marker {
            return self.clone();
        }
        match Fields::parse(self.json.get()) {
            Some(fields) => {
                let mut block = self.clone();
                block.json = fields.without("cache_control");
                block.host_marker = false;
                block
            }
            None => self.clone(),
        }
    }

    /// Blocks a role may carry: results only from the user, tool calls and thinking
    /// only from the assistant.
    fn belongs_to(&self, role: Role) -> bool {
        !matches!(
            (&self.kind, role),
            (BlockKind::ToolResult(_) | BlockKind::CacheEdits, Role::Assistant)
                | (BlockKind::ToolUse { .. } | BlockKind::Thinking | BlockKind::RedactedThinking, Role::User)
        )
    }

    /// Builds a block from JSON the pipeline made itself.
    pub(crate) fn from_json(json: Arc<RawValue>) -> Option<Block> {
        Block::parse(&json)
    }

    /// A `cache_edits` block from its JSON.
    pub(crate) fn cache_edits(json: Arc<RawValue>) -> Block {
        Block::new(BlockKind::CacheEdits, json, false)
    }

    /// The text of a result's content, for previews and for turning a result into
    /// text: strings as they are, text blocks joined, other blocks noted.
    pub fn result_text(&self) -> String {
        let Some(fields) = Fields::parse(self.json.get()) else {
            return String::new();
        };
        let Some(content) = fields.get("content") else {
            return String::new();
        };
        if let Some(text) = raw::as_str(content) {
            return text.into_owned();
        }
        let Ok(parts) = serde_json::from_str::<Vec<&RawValue>>(content.get()) else {
            return String::new();
        };
        let mut out = String::new();
        for part in parts {
            let Some(f) = Fields::parse(part.get()) else { continue };
            if !out.is_empty() {
                out.push('\n');
            }
            match (f.str("type").as_deref(), f.str("text")) {
                (Some("text"), Some(text)) => out.push_str(&text),
                (Some(other), _) => {
                    out.push('[');
                    out.push_str(other);
                    out.push_str(" omitted]");
                }
                (None, _) => {}
            }
        }
        out
    }
}

/// Sizes and flags of a `tool_result`'s content.
struct ContentInfo {
    bytes: u64,
    images: u32,
    image_bytes: u64,
    tool_reference: bool,
}

impl ContentInfo {
    fn of(content: Option<&RawValue>) -> ContentInfo {
        let mut info = ContentInfo { bytes: 0, images: 0, image_bytes: 0, tool_reference: false };
        let Some(content) = content else {
            return info;
        };
        let text = content.get();
        if !text.starts_with('[') {
            info.bytes = text.len() as u64;
            return info;
        }
        let Ok(parts) = serde_json::from_str::<Vec<&RawValue>>(text) else {
            info.bytes = text.len() as u64;
            return info;
        };
        for part in parts {
            let len = part.get().len() as u64;
            match Fields::parse(part.get()).and_then(|f| f.str("type").map(|t| t.into_owned())).as_deref() {
                Some("image") => {
                    info.images += 1;
                    info.image_bytes += len;
                }
                Some("tool_reference") => {
                    info.tool_reference = true;
                    info.bytes += len;
                }
                _ => info.bytes += len,
            }
        }
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(json: &str) -> Option<Block> {
        Block::parse(&RawValue::from_string(json.to_owned()).unwrap())
    }

    #[test]
    fn unsendable_blocks_are_dropped() {
        assert!(block(r#"{"type":"text","text":"  \n"}"#).is_none());
        assert!(block(r#"{"type":"thinking","thinking":"hm","signature":""}"#).is_none());
        assert!(block(r#"{"type":"thinking","thinking":"hm"}"#).is_none());
        assert!(block(r#"{"type":"tool_use","name":"Read","input":{}}"#).is_none());
        assert!(block(r#"["text"]"#).is_none());
        assert!(block(r#"{"type":"thinking","thinking":"hm","signature":"sig"}"#).is_some());
    }

    #[test]
    fn unknown_members_are_dropped_and_markers_seen() {
        let b =
            block(r#"{"type":"tool_use","id":"t1","name":"Read","input":{"a":1},"caller":{"type":"direct"}}"#).unwrap();
        assert_eq!(b.json(), r#"{"type":"tool_use","id":"t1","name":"Read","input":{"a":1}}"#);
        let b = block(r#"{"type":"tool_use","id":"t1","name":"Read"}"#).unwrap();
        assert_eq!(b.json(), r#"{"type":"tool_use","id":"t1","name":"Read","input":{}}"#);
        let b = block(r#"{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}"#).unwrap();
        assert!(b.has_host_marker());
        assert!(!b.without_cache_marker().json().contains("cache_control"));
    }

    #[test]
    fn result_facts() {
        let b = block(
            r#"{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":[{"type":"text","text":"abcd"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}},{"type":"tool_reference","tool_name":"X"}]}"#,
        )
        .unwrap();
        let r = b.result().unwrap();
        assert!(r.is_error && r.has_tool_reference);
        assert_eq!(r.images, 1);
        assert!(b.tokens() > IMAGE_TOKENS && b.tokens() < IMAGE_TOKENS + 40);
        assert_eq!(b.result_text(), "abcd\n[image omitted]\n[tool_reference omitted]");
    }
}
