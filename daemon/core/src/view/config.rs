//! Settings of the request pipeline, with the defaults ctxd ships.
//!
//! Every number a stage decides with lives here so the daemon can expose it as a setting
//! and the view cache can tell when a change means the view must be rebuilt.

/// All pipeline settings. `PartialEq` matters: the view cache rebuilds when it changes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PipelineConfig {
    pub budget: BudgetConfig,
    pub snip: SnipConfig,
    pub microcompact: MicrocompactConfig,
    pub collapse: CollapseConfig,
    /// The provider refused a request for oversized media: drop images and documents
    /// from meta messages (attachments, meta user records, base context, extras).
    pub strip_meta_media: bool,
    /// For a UI view only: keep snipped items, marked, instead of removing them. Requests
    /// never carry snipped items.
    pub include_snipped: bool,
}

/// Tool-result budget. Sizes are estimated tokens (JSON bytes / 4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetConfig {
    /// A new result above this is stored on disk and replaced by a preview. 25,000 tokens
    /// is about 100 KB of text: a long file read or a noisy build log, not a normal one.
    pub per_result_tokens: u64,
    /// The new results of one message together may not exceed this; the largest are
    /// offloaded first until they fit. Twice the single-result budget, so one large
    /// result alone never trips it.
    pub per_message_tokens: u64,
    /// Bytes of the start of the content kept in the preview.
    pub preview_head_bytes: usize,
    /// Bytes of the end of the content kept in the preview (errors tend to be last).
    pub preview_tail_bytes: usize,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            per_result_tokens: 25_000,
            per_message_tokens: 50_000,
            preview_head_bytes: 2_000,
            preview_tail_bytes: 1_000,
        }
    }
}

/// Snip: model-chosen removal of middle ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnipConfig {
    /// The snip tool is offered: user messages carry `[id:…]` tags and the
    /// context-efficiency reminder can be added. Snip records already in the transcript
    /// apply either way (they are recorded decisions).
    pub enabled: bool,
    /// Growth of the view, in tokens, without a snip (or a previous reminder) after which
    /// the reminder is added.
    pub reminder_after_tokens: u64,
}

impl Default for SnipConfig {
    fn default() -> Self {
        SnipConfig { enabled: false, reminder_after_tokens: 40_000 }
    }
}

/// Microcompact: clearing old tool results, by rewriting (cold cache) or by cache edits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicrocompactConfig {
    pub enabled: bool,
    /// How long the provider keeps a prompt cache; a longer gap since the last response
    /// means the cache is cold and rewriting old results costs nothing extra.
    pub cache_ttl_ms: i64,
    /// Most recent eligible results that are never cleared.
    pub keep_recent: usize,
    /// Clearing runs only when it saves at least this many tokens.
    pub min_saved_tokens: u64,
    /// Tools whose old results may be cleared (their output can be produced again).
    pub eligible_tools: Vec<String>,
    /// The provider supports cache editing: delete old results from the cached prefix
    /// with `cache_edits` instead of rewriting messages.
    pub cache_editing: bool,
}

impl Default for MicrocompactConfig {
    fn default() -> Self {
        MicrocompactConfig {
            enabled: true,
            cache_ttl_ms: 5 * 60 * 1_000,
            keep_recent: 5,
            min_saved_tokens: 20_000,
            eligible_tools: ["Read", "Bash", "Grep", "Glob", "WebSearch", "WebFetch", "Edit", "Write"]
                .into_iter()
                .map(String::from)
                .collect(),
            cache_editing: false,
        }
    }
}

/// Context collapse: committed span summaries replace their spans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollapseConfig {
    pub enabled: bool,
}

impl Default for CollapseConfig {
    fn default() -> Self {
        CollapseConfig { enabled: true }
    }
}
