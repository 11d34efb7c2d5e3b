//! Block-level rules, applied when a message is materialized.
//!
//! Stored-output previews, cleared placeholders, cache references and media stripping
//! change the content of single blocks and never the shape of the view. They are applied
//! at the last moment (when normalization seals a message, or renders the open tail of
//! the view for one request), so a rule recorded after an item was appended still
//! reaches it, and an item is never transformed twice.

use std::collections::{BTreeMap, BTreeSet};

use super::budget::replaced;
use super::item::{BYTES_PER_TOKEN, Block, BlockKind, Item};
use super::microcompact::{CLEARED, cleared, with_cache_reference};
use super::state::Replacement;

/// Tokens of a result block whose content is `content` (a placeholder or a preview).
pub(crate) fn placeholder_tokens(content: &str, tool_use_id: &str) -> u64 {
    (content.len() + tool_use_id.len() + 60) as u64 / BYTES_PER_TOKEN
}

static NO_REPLACEMENTS: BTreeMap<String, Replacement> = BTreeMap::new();
static NO_IDS: BTreeSet<String> = BTreeSet::new();

/// The text an image or document of a meta message becomes after an oversized-media
/// refusal.
pub const MEDIA_REMOVED: &str = "[media removed: the provider refused it as too large]";

/// What to do to blocks on their way into a request.
#[derive(Debug, Clone, Copy)]
pub struct ContentRules<'a> {
    /// Recorded replacements (stored outputs).
    pub replacements: &'a BTreeMap<String, Replacement>,
    /// Replacements this request decided (not recorded yet).
    pub decided: &'a BTreeMap<String, Replacement>,
    /// Results cleared by time-based microcompact.
    pub cleared: &'a BTreeSet<String>,
    /// Put `cache_reference` on every result (cache editing on).
    pub cache_reference: bool,
    pub strip_meta_media: bool,
}

impl ContentRules<'static> {
    /// Leaves every block as it is.
    pub const NONE: ContentRules<'static> = ContentRules {
        replacements: &NO_REPLACEMENTS,
        decided: &NO_REPLACEMENTS,
        cleared: &NO_IDS,
        cache_reference: false,
        strip_meta_media: false,
    };
}

impl ContentRules<'_> {
    /// One block under the rules; `meta_like` says the item is host-made context.
    pub fn apply_block(&self, block: &Block, meta_like: bool) -> Block {
        match &block.kind {
            BlockKind::ToolResult(r) => {
                let id = r.tool_use_id.as_ref();
                let mut out = match self.replacements.get(id).or_else(|| self.decided.get(id)) {
                    Some(replacement) => replaced(block, replacement),
                    None => block.clone(),
                };
                if self.cleared.contains(id) {
                    out = cleared(&out);
                }
                if self.cache_reference {
                    out = with_cache_reference(&out);
                }
                out
            }
            BlockKind::Image | BlockKind::Document if meta_like && self.strip_meta_media => {
                Block::text(MEDIA_REMOVED).unwrap_or_else(|| block.clone())
            }
            _ => block.clone(),
        }
    }

    /// The blocks of an item under the rules.
    pub fn materialize(&self, item: &Item) -> Vec<Block> {
        let meta_like = item.origin.is_meta_like();
        item.blocks.iter().map(|b| self.apply_block(b, meta_like)).collect()
    }

    /// Estimated tokens of an item under the rules, without building the new blocks
    /// (for reports: what a snip or collapse removes from the request).
    pub fn item_tokens(&self, item: &Item) -> u64 {
        item.blocks
            .iter()
            .map(|block| match block.result() {
                Some(r) if !r.cleared && self.cleared.contains(r.tool_use_id.as_ref()) => {
                    placeholder_tokens(CLEARED, &r.tool_use_id)
                }
                Some(r) if !r.replaced && !r.cleared => {
                    let id = r.tool_use_id.as_ref();
                    match self.replacements.get(id).or_else(|| self.decided.get(id)) {
                        Some(replacement) => placeholder_tokens(&replacement.preview, id),
                        None => block.tokens(),
                    }
                }
                _ => block.tokens(),
            })
            .sum()
    }

    /// An item with its blocks under the rules.
    pub fn apply_to_item(&self, mut item: Item) -> Item {
        item.blocks = self.materialize(&item);
        item
    }
}
