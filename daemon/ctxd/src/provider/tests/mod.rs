//! Provider tests over real HTTP on loopback: wiremock where matching and verifying
//! requests is the point, a scripted TCP server (`server`) where the shape of the byte
//! stream in time is (pieces, stalls, a connection cut mid-body).

mod anthropic;
mod openai;
mod server;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::config::{AnthropicConfig, ApiKey, HttpConfig, OpenAiConfig, RetryPolicy};
use super::{AnthropicProvider, Delta, OpenAiProvider, SummaryRequest};

pub(super) const KEY: &str = "sk-ant-test-0123456789-SECRET";

/// Short timeouts and back-offs so failure paths take milliseconds.
pub(super) fn fast_http() -> HttpConfig {
    HttpConfig {
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_secs(5),
        retry: RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
            total_budget: Duration::from_secs(20),
        },
    }
}

pub(super) fn anthropic_at(base: &str, http: HttpConfig) -> AnthropicProvider {
    AnthropicProvider::new(AnthropicConfig { base_url: base.to_owned(), api_key: ApiKey::new(KEY) }, http).unwrap()
}

pub(super) fn openai_at(base: &str, key: Option<&str>, include_usage: bool) -> OpenAiProvider {
    OpenAiProvider::new(
        OpenAiConfig { base_url: base.to_owned(), api_key: key.map(ApiKey::new), include_usage },
        fast_http(),
    )
    .unwrap()
}

/// A fork-style request: cache markers on the last system block, on a tool and inside
/// the last message, thinking on, two betas, a context-management field and tool use
/// refused.
pub(super) fn fork_request() -> SummaryRequest {
    let mut extra = serde_json::Map::new();
    extra.insert("context_management".to_owned(), json!({"edits": [{"type": "clear_tool_uses_20250919"}]}));
    extra.insert("tool_choice".to_owned(), json!({"type": "none"}));
    SummaryRequest {
        model: "claude-sonnet-4-5".to_owned(),
        system: vec![
            json!({"type": "text", "text": "You are Claude Code."}),
            json!({"type": "text", "text": "gitStatus: clean", "cache_control": {"type": "ephemeral"}}),
        ],
        messages: vec![
            json!({"role": "user", "content": [{"type": "text", "text": "Fix the bug in a.rs"}]}),
            json!({"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "/src/a.rs"}}
            ]}),
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "fn a() {}",
                 "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                {"type": "text", "text": "Summarize the conversation so far. Reply in <summary> tags."}
            ]}),
        ],
        tools: vec![json!({
            "name": "Read", "description": "Read a file",
            "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
            "cache_control": {"type": "ephemeral"}
        })],
        max_tokens: 20_000,
        thinking: Some(json!({"type": "enabled", "budget_tokens": 4096})),
        betas: vec!["prompt-caching-2024-07-31".to_owned(), "context-management-2025-06-27".to_owned()],
        extra,
    }
}

/// A realistic Messages stream: thinking, then `texts` as deltas of one text block,
/// pings, and usage split across `message_start` and `message_delta`.
pub(super) fn anthropic_stream(texts: &[&str]) -> String {
    let mut s = String::new();
    let mut event = |name: &str, data: Value| {
        s.push_str(&format!("event: {name}\ndata: {data}\n\n"));
    };
    event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_01XYZ", "type": "message", "role": "assistant", "content": [],
            "model": "claude-sonnet-4-5-20250929", "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 12, "cache_creation_input_tokens": 300, "cache_read_input_tokens": 45_000,
                      "cache_deleted_input_tokens": 1_200, "output_tokens": 1}
        }}),
    );
    event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0,
        "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
    );
    event("ping", json!({"type": "ping"}));
    event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "thinking_delta", "thinking": "The user wants a summary."}}),
    );
    event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM"}}),
    );
    event("content_block_stop", json!({"type": "content_block_stop", "index": 0}));
    event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 1,
        "content_block": {"type": "text", "text": ""}}),
    );
    for text in texts {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "text_delta", "text": text}}),
        );
    }
    event("content_block_stop", json!({"type": "content_block_stop", "index": 1}));
    event(
        "message_delta",
        json!({"type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": null},
        "usage": {"output_tokens": 873}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
    s
}

pub(super) const SUMMARY_PARTS: &[&str] = &[
    "<analysis>Draft.</analysis>\n",
    "<summary>\n1. Primary Request and Intent: fix ",
    "the bug in a.rs — ",
    "done ✓\n</summary>",
];

/// Collects deltas: the text, and how many thinking pieces came.
#[derive(Default)]
pub(super) struct Collected {
    pub text: String,
    pub thinking: String,
}

impl Collected {
    pub fn sink(&mut self) -> impl FnMut(Delta<'_>) + Send + '_ {
        |delta| match delta {
            Delta::Text(t) => self.text.push_str(t),
            Delta::Thinking(t) => self.thinking.push_str(t),
        }
    }
}

/// A `tracing` writer that keeps everything written, to search the logs in a test.
#[derive(Clone, Default)]
pub(super) struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// A subscriber at TRACE level writing here; install with `set_default`.
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        let capture = self.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || capture.clone())
            .finish()
    }
}

impl Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
