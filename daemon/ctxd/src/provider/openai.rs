//! OpenAI-compatible chat completions (`POST {base}/v1/chat/completions`), so a local
//! model served by llama.cpp, Ollama or vLLM can write summaries.
//!
//! The summary request is in Anthropic's shape; it is mapped down to plain text chat:
//! the system blocks become one system message, and every content block becomes text.
//! Tool calls and tool results are written out in a fixed textual form
//! (`[Tool call: Read (id toolu_1)]` and `[Tool result for toolu_1]`, each followed by
//! its content) because many local models have no tool support and the summary only
//! needs to read them. No tool schemas are sent, so the model cannot call one.
//! Thinking blocks and `cache_edits` are dropped; images and documents become markers.
//!
//! The reply is complete at `data: [DONE]`. A connection that ends after a choice's
//! `finish_reason` but before `[DONE]` still carries the whole text (only the usage
//! chunk may be missing) and is accepted; one that ends earlier is a cut stream.
//! Usage comes from the final chunk when the server honours
//! `stream_options.include_usage`; `prompt_tokens` includes cached tokens there, so the
//! cached part is moved to `cache_read_input_tokens` to match Anthropic's terms.

use std::time::Instant;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::config::{ApiKey, HttpConfig, OpenAiConfig};
use super::error::{ProviderError, scrub, shorten};
use super::http::{EventStream, build_client, endpoint, millis, origin, send_with_retry};
use super::{Delta, Provider, StopReason, SummaryReply, SummaryRequest, Usage};

/// A client for one OpenAI-compatible server.
#[derive(Clone)]
pub struct OpenAiProvider {
    client: reqwest::Client,
    config: OpenAiConfig,
    http: HttpConfig,
    url: String,
}

impl std::fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiProvider").field("origin", &origin(&self.url)).finish_non_exhaustive()
    }
}

impl OpenAiProvider {
    pub fn new(config: OpenAiConfig, http: HttpConfig) -> Result<OpenAiProvider, ProviderError> {
        let url = chat_completions_url(&config.base_url);
        if reqwest::Url::parse(&url).is_err() {
            return Err(ProviderError::Config("baseUrl (or OPENAI_BASE_URL) is not a valid URL".to_owned()));
        }
        if let Some(key) = &config.api_key
            && HeaderValue::from_str(&format!("Bearer {}", key.expose())).is_err()
        {
            return Err(ProviderError::Config(
                "the API key contains characters that cannot be sent in an HTTP header".to_owned(),
            ));
        }
        Ok(OpenAiProvider { client: build_client(&http)?, config, http, url })
    }

    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(key) = &self.config.api_key
            && let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
        {
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        headers.insert(reqwest::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(reqwest::header::ACCEPT, HeaderValue::from_static("text/event-stream"));
        headers
    }

    async fn stream_reply(
        &self,
        request: &SummaryRequest,
        cancel: &CancellationToken,
        on_delta: &mut (dyn FnMut(Delta<'_>) + Send),
    ) -> Result<SummaryReply, ProviderError> {
        let started = Instant::now();
        let body = Bytes::from(serde_json::to_vec(&chat_body(request, self.config.include_usage)).unwrap_or_default());
        let headers = self.headers();
        let secret = self.config.api_key.as_ref().map(ApiKey::expose);
        let response = send_with_retry(&self.http, cancel, secret, || {
            self.client.post(&self.url).headers(headers.clone()).body(body.clone())
        })
        .await?;
        let mut events = EventStream::new(response, self.http.read_timeout)?;
        let mut reply = SummaryReply::default();
        let mut finished = false;
        while let Some(event) = events.next(cancel).await? {
            let data = event.data.trim();
            if data == "[DONE]" {
                return Ok(done(reply, started));
            }
            let chunk: Chunk = serde_json::from_str(data)
                .map_err(|e| events.protocol(format!("invalid JSON in a chat completion chunk: {e}")))?;
            if let Some(error) = chunk.error {
                let (error_type, message) = error.parts();
                return Err(ProviderError::StreamError {
                    status: events.status,
                    error_type,
                    message: shorten(&scrub(&message, secret), 300),
                });
            }
            if reply.id.is_none() {
                reply.id = chunk.id;
            }
            if reply.model.is_none() {
                reply.model = chunk.model;
            }
            if let Some(usage) = chunk.usage {
                reply.usage = Some(usage.into_usage());
            }
            // One choice is asked for (no `n`); others are ignored.
            if let Some(choice) = chunk.choices.into_iter().find(|c| c.index.unwrap_or(0) == 0) {
                if let Some(delta) = choice.delta {
                    if let Some(t) = delta.reasoning_content.or(delta.reasoning).filter(|t| !t.is_empty()) {
                        on_delta(Delta::Thinking(&t));
                    }
                    if let Some(t) = delta.content.filter(|t| !t.is_empty()) {
                        reply.text.push_str(&t);
                        on_delta(Delta::Text(&t));
                    }
                }
                if let Some(reason) = choice.finish_reason {
                    reply.stop_reason = Some(StopReason::from_openai(&reason));
                    finished = true;
                }
            }
        }
        if finished {
            tracing::debug!("stream ended after finish_reason without [DONE]; the text is complete");
            return Ok(done(reply, started));
        }
        let error = events.cut("");
        tracing::warn!(error = %error, "summary stream cut");
        Err(error)
    }
}

fn done(reply: SummaryReply, started: Instant) -> SummaryReply {
    tracing::info!(
        elapsed_ms = millis(started.elapsed()),
        text_bytes = reply.text.len(),
        stop_reason = ?reply.stop_reason,
        usage = ?reply.usage,
        "summary received"
    );
    reply
}

impl Provider for OpenAiProvider {
    async fn send(
        &self,
        request: &SummaryRequest,
        cancel: &CancellationToken,
        on_delta: &mut (dyn FnMut(Delta<'_>) + Send),
    ) -> Result<SummaryReply, ProviderError> {
        let span = tracing::info_span!(
            "provider_send",
            provider = "openai",
            origin = %origin(&self.url),
            model = %request.model,
            messages = request.messages.len(),
        );
        self.stream_reply(request, cancel, on_delta).instrument(span).await
    }

    /// OpenAI-compatible servers have no standard way to count a chat prompt.
    async fn count_tokens(
        &self,
        _request: &SummaryRequest,
        _cancel: &CancellationToken,
    ) -> Result<Option<u64>, ProviderError> {
        Ok(None)
    }
}

/// `{base}/v1/chat/completions`, accepting a base that already ends in `/v1`.
pub fn chat_completions_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    match base.strip_suffix("/v1") {
        Some(root) => endpoint(root, "v1/chat/completions"),
        None => endpoint(base, "v1/chat/completions"),
    }
}

/// The streamed chat completion body for `request`.
pub fn chat_body(request: &SummaryRequest, include_usage: bool) -> Value {
    let mut body = Map::new();
    body.insert("model".to_owned(), json!(request.model));
    body.insert("messages".to_owned(), Value::Array(chat_messages(request)));
    body.insert("max_tokens".to_owned(), json!(request.max_tokens));
    body.insert("stream".to_owned(), Value::Bool(true));
    if include_usage {
        body.insert("stream_options".to_owned(), json!({"include_usage": true}));
    }
    Value::Object(body)
}

/// System blocks as one system message, then every message with its content as text.
/// A message left with no text (only thinking, say) is dropped.
pub fn chat_messages(request: &SummaryRequest) -> Vec<Value> {
    let mut out = Vec::with_capacity(request.messages.len() + 1);
    let system = join(request.system.iter().filter_map(render_block));
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system}));
    }
    for message in &request.messages {
        let role = match message.get("role").and_then(Value::as_str) {
            Some("assistant") => "assistant",
            _ => "user",
        };
        let content = render_content(message.get("content").unwrap_or(&Value::Null));
        if !content.is_empty() {
            out.push(json!({"role": role, "content": content}));
        }
    }
    out
}

/// Message or tool-result content: a string, or a list of blocks.
fn render_content(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => join(blocks.iter().filter_map(render_block)),
        _ => String::new(),
    }
}

fn render_block(block: &Value) -> Option<String> {
    let block = match block {
        Value::String(s) => return Some(s.clone()),
        Value::Object(o) => o,
        _ => return None,
    };
    let field = |name: &str| block.get(name).and_then(Value::as_str).unwrap_or("");
    let kind = field("type");
    Some(match kind {
        "text" => field("text").to_owned(),
        "tool_use" | "server_tool_use" => {
            let input = block.get("input").map(Value::to_string).unwrap_or_else(|| "{}".to_owned());
            format!("[Tool call: {} (id {})]\n{input}", field("name"), field("id"))
        }
        "tool_result" => {
            let error = if block.get("is_error").and_then(Value::as_bool) == Some(true) { ", error" } else { "" };
            let content = render_content(block.get("content").unwrap_or(&Value::Null));
            format!("[Tool result for {}{error}]\n{content}", field("tool_use_id"))
        }
        "image" => "[image]".to_owned(),
        "document" => match block.get("title").and_then(Value::as_str) {
            Some(title) => format!("[document: {title}]"),
            None => "[document]".to_owned(),
        },
        // Private reasoning and cache bookkeeping say nothing the summary needs.
        "thinking" | "redacted_thinking" | "cache_edits" => return None,
        _ => match block.get("text").and_then(Value::as_str) {
            Some(text) => text.to_owned(),
            None => format!("[{kind} block]"),
        },
    })
    .filter(|s| !s.is_empty())
}

fn join(parts: impl Iterator<Item = String>) -> String {
    parts.collect::<Vec<_>>().join("\n\n")
}

#[derive(Deserialize)]
struct Chunk {
    id: Option<String>,
    model: Option<String>,
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<WireUsage>,
    error: Option<WireError>,
}

#[derive(Deserialize)]
struct Choice {
    index: Option<u32>,
    delta: Option<ChoiceDelta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ChoiceDelta {
    content: Option<String>,
    /// llama.cpp and vLLM stream reasoning here, Ollama in `reasoning`.
    reasoning_content: Option<String>,
    reasoning: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
}

impl WireUsage {
    fn into_usage(self) -> Usage {
        let cached = self.prompt_tokens_details.and_then(|d| d.cached_tokens).unwrap_or(0).min(self.prompt_tokens);
        Usage {
            input_tokens: self.prompt_tokens - cached,
            output_tokens: self.completion_tokens,
            cache_read_input_tokens: cached,
            cache_creation_input_tokens: 0,
            cache_deleted_input_tokens: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum WireError {
    Object {
        #[serde(rename = "type")]
        error_type: Option<String>,
        message: Option<String>,
    },
    Text(String),
}

impl WireError {
    fn parts(self) -> (String, String) {
        match self {
            WireError::Object { error_type, message } => {
                (error_type.unwrap_or_else(|| "unknown".to_owned()), message.unwrap_or_default())
            }
            WireError::Text(message) => ("unknown".to_owned(), message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(chat_completions_url("http://127.0.0.1:8080"), "http://127.0.0.1:8080/v1/chat/completions");
        assert_eq!(chat_completions_url("http://127.0.0.1:11434/v1/"), "http://127.0.0.1:11434/v1/chat/completions");
        assert_eq!(chat_completions_url("http://h/proxy"), "http://h/proxy/v1/chat/completions");
    }

    #[test]
    fn blocks_render_as_text() {
        let request = SummaryRequest {
            model: "m".to_owned(),
            system: vec![
                json!({"type": "text", "text": "You are a summarizer.", "cache_control": {"type": "ephemeral"}}),
                json!({"type": "text", "text": "Be brief."}),
            ],
            messages: vec![
                json!({"role": "user", "content": "Read a.rs"}),
                json!({"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "private", "signature": "s"},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/a.rs"}}
                ]}),
                json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "fn main() {}"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true, "content": "no such file"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                    {"type": "cache_edits", "edits": [{"type": "delete", "cache_reference": "toolu_0"}]}
                ]}),
                json!({"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}),
            ],
            ..SummaryRequest::default()
        };
        let messages = chat_messages(&request);
        assert_eq!(
            Value::Array(messages),
            json!([
                {"role": "system", "content": "You are a summarizer.\n\nBe brief."},
                {"role": "user", "content": "Read a.rs"},
                {"role": "assistant", "content": "Reading.\n\n[Tool call: Read (id toolu_1)]\n{\"file_path\":\"/a.rs\"}"},
                {"role": "user", "content": "[Tool result for toolu_1]\nfn main() {}\n\n[Tool result for toolu_2, error]\nno such file\n\n[image]"}
            ])
        );
    }

    #[test]
    fn usage_moves_cached_tokens_out_of_input() {
        let wire: WireUsage = serde_json::from_value(json!({
            "prompt_tokens": 1000, "completion_tokens": 50, "prompt_tokens_details": {"cached_tokens": 600}
        }))
        .unwrap();
        assert_eq!(
            wire.into_usage(),
            Usage {
                input_tokens: 400,
                output_tokens: 50,
                cache_read_input_tokens: 600,
                cache_creation_input_tokens: 0,
                cache_deleted_input_tokens: None
            }
        );
    }
}
