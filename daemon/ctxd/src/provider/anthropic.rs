//! The Anthropic Messages API: a streamed `POST /v1/messages` for the summary and
//! `POST /v1/messages/count_tokens` to measure a prompt before sending it.
//!
//! The request is the caller's blocks as they are, plus `stream: true`: the
//! cache-sharing fork reads the parent's cached prefix only if system, tools and
//! messages match it exactly, `cache_control` markers included.
//!
//! A reply counts only once `message_stop` arrived. The stream is read event by event
//! (`message_start` carries the input usage, `content_block_delta` the text,
//! `message_delta` the stop reason and output usage, `ping` keeps the connection
//! alive); an `error` event or a connection that ends before `message_stop` is an
//! error, so a summary cut in half is never installed as if it were whole. Event types
//! this code does not know are skipped, as the API's versioning policy asks.

use std::time::Instant;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::config::{AnthropicConfig, HttpConfig};
use super::error::{ProviderError, scrub, shorten};
use super::http::{EventStream, build_client, endpoint, millis, origin, send_with_retry};
use super::sse::SseEvent;
use super::{Delta, Provider, StopReason, SummaryReply, SummaryRequest, Usage};

/// The API version this code speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// A client for one Anthropic endpoint and key.
#[derive(Clone)]
pub struct AnthropicProvider {
    client: reqwest::Client,
    config: AnthropicConfig,
    http: HttpConfig,
    messages_url: String,
    count_url: String,
}

impl std::fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicProvider").field("origin", &origin(&self.messages_url)).finish_non_exhaustive()
    }
}

impl AnthropicProvider {
    pub fn new(config: AnthropicConfig, http: HttpConfig) -> Result<AnthropicProvider, ProviderError> {
        let messages_url = endpoint(&config.base_url, "v1/messages");
        if reqwest::Url::parse(&messages_url).is_err() {
            return Err(ProviderError::Config("baseUrl (or ANTHROPIC_BASE_URL) is not a valid URL".to_owned()));
        }
        if HeaderValue::from_str(config.api_key.expose()).is_err() {
            return Err(ProviderError::Config(
                "the API key contains characters that cannot be sent in an HTTP header".to_owned(),
            ));
        }
        let count_url = endpoint(&config.base_url, "v1/messages/count_tokens");
        Ok(AnthropicProvider { client: build_client(&http)?, config, http, messages_url, count_url })
    }

    fn headers(&self, betas: &[String]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        // Checked in `new`; a failure here would only drop the header and get a 401.
        if let Ok(mut key) = HeaderValue::from_str(self.config.api_key.expose()) {
            key.set_sensitive(true);
            headers.insert("x-api-key", key);
        }
        headers.insert("anthropic-version", HeaderValue::from_static(ANTHROPIC_VERSION));
        if let Some(beta) = beta_header(betas) {
            headers.insert("anthropic-beta", beta);
        }
        headers.insert(reqwest::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers
    }

    async fn stream_reply(
        &self,
        request: &SummaryRequest,
        cancel: &CancellationToken,
        on_delta: &mut (dyn FnMut(Delta<'_>) + Send),
    ) -> Result<SummaryReply, ProviderError> {
        let started = Instant::now();
        let body = Bytes::from(serde_json::to_vec(&messages_body(request)).unwrap_or_default());
        let mut headers = self.headers(&request.betas);
        headers.insert(reqwest::header::ACCEPT, HeaderValue::from_static("text/event-stream"));
        let secret = Some(self.config.api_key.expose());
        let response = send_with_retry(&self.http, cancel, secret, || {
            self.client.post(&self.messages_url).headers(headers.clone()).body(body.clone())
        })
        .await?;
        let request_id = request_id(response.headers());
        let mut events = EventStream::new(response, self.http.read_timeout)?;
        let mut reply = ReplyBuilder::default();
        while let Some(event) = events.next(cancel).await? {
            if reply.apply(&event, on_delta, &events, secret)? {
                let reply = reply.finish();
                tracing::info!(
                    request_id,
                    elapsed_ms = millis(started.elapsed()),
                    text_bytes = reply.text.len(),
                    stop_reason = ?reply.stop_reason,
                    usage = ?reply.usage,
                    "summary received"
                );
                return Ok(reply);
            }
        }
        let error = events.cut("");
        tracing::warn!(request_id, error = %error, "summary stream cut");
        Err(error)
    }
}

impl Provider for AnthropicProvider {
    async fn send(
        &self,
        request: &SummaryRequest,
        cancel: &CancellationToken,
        on_delta: &mut (dyn FnMut(Delta<'_>) + Send),
    ) -> Result<SummaryReply, ProviderError> {
        let span = tracing::info_span!(
            "provider_send",
            provider = "anthropic",
            origin = %origin(&self.messages_url),
            model = %request.model,
            messages = request.messages.len(),
        );
        self.stream_reply(request, cancel, on_delta).instrument(span).await
    }

    async fn count_tokens(
        &self,
        request: &SummaryRequest,
        cancel: &CancellationToken,
    ) -> Result<Option<u64>, ProviderError> {
        let span = tracing::info_span!("provider_count_tokens", provider = "anthropic", model = %request.model);
        async {
            let body = Bytes::from(serde_json::to_vec(&count_tokens_body(request)).unwrap_or_default());
            let headers = self.headers(&request.betas);
            let secret = Some(self.config.api_key.expose());
            let response = send_with_retry(&self.http, cancel, secret, || {
                self.client.post(&self.count_url).headers(headers.clone()).body(body.clone())
            })
            .await?;
            let status = response.status().as_u16();
            let body = super::http::read_body(response, cancel, 1024 * 1024, &self.http).await?;
            let count: CountReply = serde_json::from_slice(&body).map_err(|e| ProviderError::Protocol {
                status,
                message: format!("count_tokens answer is not {{\"input_tokens\": N}}: {e}"),
            })?;
            Ok(Some(count.input_tokens))
        }
        .instrument(span)
        .await
    }
}

/// The streamed `/v1/messages` body for `request`.
pub fn messages_body(request: &SummaryRequest) -> Value {
    let mut body = Map::new();
    body.insert("model".to_owned(), json!(request.model));
    body.insert("max_tokens".to_owned(), json!(request.max_tokens));
    shared_fields(request, &mut body);
    body.insert("stream".to_owned(), Value::Bool(true));
    for (key, value) in &request.extra {
        if !body.contains_key(key) {
            body.insert(key.clone(), value.clone());
        }
    }
    Value::Object(body)
}

/// The `/v1/messages/count_tokens` body: the prompt without output settings.
/// `extra` is left out: the counting endpoint accepts fewer fields than `/v1/messages`.
pub fn count_tokens_body(request: &SummaryRequest) -> Value {
    let mut body = Map::new();
    body.insert("model".to_owned(), json!(request.model));
    shared_fields(request, &mut body);
    Value::Object(body)
}

fn shared_fields(request: &SummaryRequest, body: &mut Map<String, Value>) {
    if !request.system.is_empty() {
        body.insert("system".to_owned(), Value::Array(request.system.clone()));
    }
    body.insert("messages".to_owned(), Value::Array(request.messages.clone()));
    if !request.tools.is_empty() {
        body.insert("tools".to_owned(), Value::Array(request.tools.clone()));
    }
    if let Some(thinking) = &request.thinking {
        body.insert("thinking".to_owned(), thinking.clone());
    }
}

/// The betas as one comma-separated header, blanks and repeats dropped.
fn beta_header(betas: &[String]) -> Option<HeaderValue> {
    let mut seen: Vec<&str> = Vec::new();
    for beta in betas.iter().map(|b| b.trim()).filter(|b| !b.is_empty()) {
        if !seen.contains(&beta) {
            seen.push(beta);
        }
    }
    if seen.is_empty() { None } else { HeaderValue::from_str(&seen.join(",")).ok() }
}

fn request_id(headers: &HeaderMap) -> Option<String> {
    headers.get("request-id").and_then(|v| v.to_str().ok()).map(str::to_owned)
}

#[derive(Deserialize)]
struct CountReply {
    input_tokens: u64,
}

/// The events of the Messages stream that matter here.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    MessageStart {
        message: StartMessage,
    },
    ContentBlockStart {
        content_block: StartBlock,
    },
    ContentBlockDelta {
        delta: BlockDelta,
    },
    ContentBlockStop,
    MessageDelta {
        delta: MessageDeltaBody,
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error {
        error: WireError,
    },
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
struct StartMessage {
    id: Option<String>,
    model: Option<String>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct StartBlock {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    thinking: Option<String>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta {
        text: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct MessageDeltaBody {
    stop_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_deleted_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WireError {
    #[serde(rename = "type")]
    error_type: Option<String>,
    message: Option<String>,
}

#[derive(Default)]
struct ReplyBuilder {
    reply: SummaryReply,
    usage: Option<Usage>,
}

impl ReplyBuilder {
    /// Applies one event; `true` once the reply is complete.
    fn apply(
        &mut self,
        event: &SseEvent,
        on_delta: &mut (dyn FnMut(Delta<'_>) + Send),
        stream: &EventStream,
        secret: Option<&str>,
    ) -> Result<bool, ProviderError> {
        let parsed: Event = serde_json::from_str(&event.data).map_err(|e| {
            let name = if event.event.is_empty() { "unnamed" } else { event.event.as_str() };
            stream.protocol(format!("invalid JSON in a {name} event: {e}"))
        })?;
        match parsed {
            Event::MessageStart { message } => {
                self.reply.id = message.id;
                self.reply.model = message.model;
                self.merge_usage(message.usage);
            }
            Event::ContentBlockStart { content_block } => match content_block.kind.as_str() {
                "text" => self.text(content_block.text.as_deref().unwrap_or(""), on_delta),
                "tool_use" | "server_tool_use" => self.reply.tool_calls += 1,
                "thinking" => {
                    if let Some(t) = content_block.thinking.as_deref().filter(|t| !t.is_empty()) {
                        on_delta(Delta::Thinking(t));
                    }
                }
                _ => {}
            },
            Event::ContentBlockDelta { delta: BlockDelta::TextDelta { text } } => self.text(&text, on_delta),
            Event::ContentBlockDelta { delta: BlockDelta::ThinkingDelta { thinking } } => {
                on_delta(Delta::Thinking(&thinking));
            }
            Event::MessageDelta { delta, usage } => {
                if let Some(reason) = delta.stop_reason {
                    self.reply.stop_reason = Some(StopReason::from_anthropic(&reason));
                }
                self.merge_usage(usage);
            }
            Event::MessageStop => return Ok(true),
            Event::Error { error } => {
                return Err(ProviderError::StreamError {
                    status: stream.status,
                    error_type: error.error_type.unwrap_or_else(|| "unknown".to_owned()),
                    message: shorten(&scrub(&error.message.unwrap_or_default(), secret), 300),
                });
            }
            Event::ContentBlockDelta { delta: BlockDelta::Other }
            | Event::ContentBlockStop
            | Event::Ping
            | Event::Unknown => {}
        }
        Ok(false)
    }

    fn text(&mut self, text: &str, on_delta: &mut (dyn FnMut(Delta<'_>) + Send)) {
        if !text.is_empty() {
            self.reply.text.push_str(text);
            on_delta(Delta::Text(text));
        }
    }

    /// `message_delta` usage is cumulative: a field it carries replaces the one from
    /// `message_start`.
    fn merge_usage(&mut self, wire: Option<WireUsage>) {
        let Some(wire) = wire else { return };
        let usage = self.usage.get_or_insert_with(Usage::default);
        let set = |field: &mut u64, value: Option<u64>| {
            if let Some(v) = value {
                *field = v;
            }
        };
        set(&mut usage.input_tokens, wire.input_tokens);
        set(&mut usage.output_tokens, wire.output_tokens);
        set(&mut usage.cache_read_input_tokens, wire.cache_read_input_tokens);
        set(&mut usage.cache_creation_input_tokens, wire.cache_creation_input_tokens);
        if wire.cache_deleted_input_tokens.is_some() {
            usage.cache_deleted_input_tokens = wire.cache_deleted_input_tokens;
        }
    }

    fn finish(mut self) -> SummaryReply {
        self.reply.usage = self.usage;
        self.reply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_keeps_blocks_and_puts_core_fields_first() {
        let mut extra = Map::new();
        extra.insert("stream".to_owned(), json!(false));
        extra.insert("context_management".to_owned(), json!({"edits": []}));
        let request = SummaryRequest {
            model: "claude-test".to_owned(),
            system: vec![json!({"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}})],
            messages: vec![json!({"role": "user", "content": "hi"})],
            tools: vec![],
            max_tokens: 100,
            thinking: None,
            betas: vec![],
            extra,
        };
        let body = messages_body(&request);
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"model":"claude-test","max_tokens":100,"system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}],"stream":true,"context_management":{"edits":[]}}"#
        );
        assert_eq!(
            serde_json::to_string(&count_tokens_body(&request)).unwrap(),
            r#"{"model":"claude-test","system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}]}"#
        );
    }

    #[test]
    fn betas_are_joined_once() {
        let betas = ["a-1", " b-2 ", "", "a-1"].map(str::to_owned);
        assert_eq!(beta_header(&betas).unwrap(), "a-1,b-2");
        assert!(beta_header(&[]).is_none());
    }
}
