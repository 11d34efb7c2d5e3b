//! LLM providers: the network side of compaction.
//!
//! Compaction needs a model to write the summary. The planner in `ctxd-core` builds the
//! request as plain JSON blocks; this module sends it to a remote model, streams the
//! answer back as it is written, and turns every way that can go wrong into a
//! [`ProviderError`] variant that tells the compaction driver what to do next.
//!
//! - [`config`]: which provider to use, from settings and the environment. "offline" is
//!   a variant the caller handles itself ([`ProviderChoice::Offline`]); nothing here
//!   sends anything for it.
//! - [`anthropic`]: the Messages API (`/v1/messages`, `/v1/messages/count_tokens`).
//! - [`openai`]: OpenAI-compatible chat completions, for llama.cpp server, Ollama, vLLM.
//! - [`sse`]: an incremental server-sent-events parser shared by both.
//! - `http`: the client, the retry loop and the body reader both providers share.
//!
//! ```text
//! let config = ProviderConfig::from_env(&settings, &process_env)?;
//! match config.connect()? {
//!     ProviderChoice::Remote(provider) => {
//!         let reply = provider.send(&request, &cancel, &mut |delta| progress(delta)).await?;
//!     }
//!     ProviderChoice::Offline => { /* ctxd-core's offline summarizer */ }
//! }
//! ```
//!
//! TLS: reqwest's `rustls-no-provider` feature with rustls' `ring` crypto provider
//! instead of the default `aws-lc-rs`. On the project's 2-core machine a clean build of
//! a crate using reqwest and tokio took 135 s with aws-lc-rs and 84 s with ring: aws-lc-sys
//! compiles a large C library, ring's C and assembly part is small. Certificates are
//! verified the same way either way (rustls-platform-verifier, the system trust store).
//! ring becomes the process-wide default when the first client is built, unless some
//! other code installed a provider before (see `http::build_client`).

pub mod anthropic;
pub mod config;
pub mod error;
mod http;
pub mod openai;
pub mod sse;

pub(crate) use self::http::install_crypto_provider;

#[cfg(test)]
mod tests;

use std::future::Future;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use anthropic::AnthropicProvider;
pub use config::{
    AnthropicConfig, ApiKey, Backend, HttpConfig, OpenAiConfig, ProviderConfig, ProviderSettings, RetryPolicy,
};
pub use error::{ProviderError, Refusal, TimeoutPhase, refusal_of};
pub use openai::OpenAiProvider;

/// One request for a summary, in Anthropic Messages API shape.
///
/// Blocks are kept as JSON so that whatever the parent request carried (`cache_control`
/// markers, `cache_reference`, `cache_edits`, images) reaches the Anthropic API byte for
/// byte: the cache-sharing fork only reads the parent's cached prefix if its system,
/// tools and message prefix are identical.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SummaryRequest {
    pub model: String,
    /// System blocks (`{"type":"text","text":…}` objects), sent as given.
    pub system: Vec<Value>,
    /// Messages (`{"role":…, "content":…}` objects), sent as given.
    pub messages: Vec<Value>,
    /// Tool schemas. The fork keeps the parent's tools so the prefix stays cacheable.
    pub tools: Vec<Value>,
    pub max_tokens: u32,
    /// The `thinking` object as the parent request had it (`{"type":"enabled",
    /// "budget_tokens":…}`, `{"type":"disabled"}`, …); `None` leaves it out.
    pub thinking: Option<Value>,
    /// `anthropic-beta` values, joined with commas into one header.
    pub betas: Vec<String>,
    /// Other top-level body fields for the Anthropic API (`context_management`,
    /// `tool_choice`, `metadata`, …). They never replace the fields above, and the
    /// OpenAI-compatible provider ignores them (it sends no tools either, so a
    /// `tool_choice` of `none` holds there too).
    pub extra: serde_json::Map<String, Value>,
}

/// A streamed piece of the reply, handed to the caller as it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delta<'a> {
    /// Part of the visible answer; [`SummaryReply::text`] is the concatenation of these.
    Text(&'a str),
    /// Part of the model's reasoning (not part of the summary); useful for progress.
    Thinking(&'a str),
}

/// A complete reply: the stream reached its end marker.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SummaryReply {
    /// All text blocks of the answer, concatenated in order.
    pub text: String,
    /// Tool calls in the answer (`tool_use` blocks). Never executed: a summary is text
    /// only, so a reply that calls a tool gave no usable summary.
    pub tool_calls: u32,
    pub id: Option<String>,
    pub model: Option<String>,
    pub stop_reason: Option<StopReason>,
    /// `None` when the provider did not report usage (an OpenAI-compatible server
    /// that ignores `stream_options.include_usage`).
    pub usage: Option<Usage>,
}

/// Why the model stopped writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    EndTurn,
    /// The output cap was hit: the text is complete as sent, but the summary may be cut.
    MaxTokens,
    StopSequence,
    ToolUse,
    Refusal,
    Other(String),
}

impl StopReason {
    fn from_anthropic(s: &str) -> StopReason {
        match s {
            "end_turn" => StopReason::EndTurn,
            "max_tokens" => StopReason::MaxTokens,
            "stop_sequence" => StopReason::StopSequence,
            "tool_use" => StopReason::ToolUse,
            "refusal" => StopReason::Refusal,
            other => StopReason::Other(other.to_owned()),
        }
    }

    fn from_openai(s: &str) -> StopReason {
        match s {
            "stop" => StopReason::EndTurn,
            "length" => StopReason::MaxTokens,
            "tool_calls" | "function_call" => StopReason::ToolUse,
            "content_filter" => StopReason::Refusal,
            other => StopReason::Other(other.to_owned()),
        }
    }
}

/// Token usage of one reply, in Anthropic's terms: `input_tokens` excludes the tokens
/// read from or written to the prompt cache, so the prompt's size is the sum of the
/// three input fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub cache_creation_input_tokens: u64,
    /// Tokens a cache edit removed from the cached prefix, where the provider reports it.
    pub cache_deleted_input_tokens: Option<u64>,
}

impl Usage {
    /// The size of the prompt as the provider counted it.
    pub fn prompt_tokens(&self) -> u64 {
        self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens
    }
}

/// A remote model that can write a summary.
///
/// A trait so that the compaction driver can be tested with a scripted fake.
pub trait Provider: Send + Sync {
    /// Sends `request` and streams the answer into `on_delta`. Returns only once the
    /// provider's end marker arrived: a stream that stops early is
    /// [`ProviderError::StreamCut`], never a shorter reply. Cancelling `cancel` aborts
    /// the HTTP request and returns [`ProviderError::Cancelled`].
    fn send(
        &self,
        request: &SummaryRequest,
        cancel: &CancellationToken,
        on_delta: &mut (dyn FnMut(Delta<'_>) + Send),
    ) -> impl Future<Output = Result<SummaryReply, ProviderError>> + Send;

    /// The prompt size of `request` in tokens, or `None` where the provider has no way
    /// to count.
    fn count_tokens(
        &self,
        request: &SummaryRequest,
        cancel: &CancellationToken,
    ) -> impl Future<Output = Result<Option<u64>, ProviderError>> + Send;
}

/// A connected remote provider.
#[derive(Debug, Clone)]
pub enum RemoteProvider {
    Anthropic(AnthropicProvider),
    OpenAi(OpenAiProvider),
}

impl RemoteProvider {
    /// "anthropic" or "openai", for logs and status.
    pub fn name(&self) -> &'static str {
        match self {
            RemoteProvider::Anthropic(_) => "anthropic",
            RemoteProvider::OpenAi(_) => "openai",
        }
    }
}

impl Provider for RemoteProvider {
    async fn send(
        &self,
        request: &SummaryRequest,
        cancel: &CancellationToken,
        on_delta: &mut (dyn FnMut(Delta<'_>) + Send),
    ) -> Result<SummaryReply, ProviderError> {
        match self {
            RemoteProvider::Anthropic(p) => p.send(request, cancel, on_delta).await,
            RemoteProvider::OpenAi(p) => p.send(request, cancel, on_delta).await,
        }
    }

    async fn count_tokens(
        &self,
        request: &SummaryRequest,
        cancel: &CancellationToken,
    ) -> Result<Option<u64>, ProviderError> {
        match self {
            RemoteProvider::Anthropic(p) => p.count_tokens(request, cancel).await,
            RemoteProvider::OpenAi(p) => p.count_tokens(request, cancel).await,
        }
    }
}

/// What [`ProviderConfig::connect`] decided. The offline summarizer lives in `ctxd-core`
/// and has no network side, so the caller handles that case itself.
#[derive(Debug, Clone)]
pub enum ProviderChoice {
    Remote(RemoteProvider),
    Offline,
}
