//! The Anthropic provider against local servers.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::super::anthropic::{count_tokens_body, messages_body};
use super::super::{Delta, Provider, ProviderError, StopReason, TimeoutPhase, Usage};
use super::server::{Step, chunk, head_chunked, head_until_close, last_chunk, serve};
use super::{Collected, KEY, LogCapture, SUMMARY_PARTS, anthropic_at, anthropic_stream, fast_http, fork_request};

fn sse(body: impl Into<String>) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(body.into(), "text/event-stream")
}

fn api_error(status: u16, error_type: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({
        "type": "error", "error": {"type": error_type, "message": message}, "request_id": "req_011CTest"
    }))
}

async fn mock_messages(server: &MockServer, response: ResponseTemplate, times: Option<u64>) {
    let mock = Mock::given(method("POST")).and(path("/v1/messages")).respond_with(response);
    let mock = match times {
        Some(n) => mock.up_to_n_times(n),
        None => mock,
    };
    mock.mount(server).await;
}

async fn send(
    base: &str,
    http: super::super::HttpConfig,
) -> (Result<super::super::SummaryReply, ProviderError>, Collected) {
    let provider = anthropic_at(base, http);
    let mut collected = Collected::default();
    let result = provider.send(&fork_request(), &CancellationToken::new(), &mut collected.sink()).await;
    (result, collected)
}

async fn requests(server: &MockServer) -> Vec<wiremock::Request> {
    server.received_requests().await.unwrap()
}

#[tokio::test]
async fn streams_a_summary_and_sends_the_exact_request() {
    let server = MockServer::start().await;
    mock_messages(&server, sse(anthropic_stream(SUMMARY_PARTS)), None).await;

    let (reply, collected) = send(&server.uri(), fast_http()).await;
    let reply = reply.unwrap();

    let expected_text = SUMMARY_PARTS.concat();
    assert_eq!(reply.text, expected_text);
    assert_eq!(collected.text, expected_text);
    assert_eq!(collected.thinking, "The user wants a summary.");
    assert_eq!(reply.id.as_deref(), Some("msg_01XYZ"));
    assert_eq!(reply.model.as_deref(), Some("claude-sonnet-4-5-20250929"));
    assert_eq!(reply.stop_reason, Some(StopReason::EndTurn));
    assert_eq!(
        reply.usage,
        Some(Usage {
            input_tokens: 12,
            output_tokens: 873,
            cache_read_input_tokens: 45_000,
            cache_creation_input_tokens: 300,
            cache_deleted_input_tokens: Some(1_200),
        })
    );

    let received = requests(&server).await;
    assert_eq!(received.len(), 1);
    let request = &received[0];
    let header = |name: &str| request.headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(header("x-api-key").as_deref(), Some(KEY));
    assert_eq!(header("anthropic-version").as_deref(), Some("2023-06-01"));
    assert_eq!(header("anthropic-beta").as_deref(), Some("prompt-caching-2024-07-31,context-management-2025-06-27"));
    assert_eq!(header("content-type").as_deref(), Some("application/json"));
    assert_eq!(header("accept").as_deref(), Some("text/event-stream"));

    // Byte for byte: the blocks as given, cache markers where they were, then stream.
    let original = fork_request();
    let expected = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 20000,
        "system": original.system,
        "messages": original.messages,
        "tools": original.tools,
        "thinking": {"type": "enabled", "budget_tokens": 4096},
        "stream": true,
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
        "tool_choice": {"type": "none"}
    });
    let sent = String::from_utf8(request.body.clone()).unwrap();
    assert_eq!(sent, serde_json::to_string(&expected).unwrap());
    assert_eq!(sent, serde_json::to_string(&messages_body(&original)).unwrap());
    let sent: Value = serde_json::from_str(&sent).unwrap();
    assert_eq!(sent["system"][1]["cache_control"], json!({"type": "ephemeral"}));
    assert_eq!(sent["messages"][2]["content"][0]["cache_control"], json!({"type": "ephemeral", "ttl": "1h"}));
    assert_eq!(sent["tools"][0]["cache_control"], json!({"type": "ephemeral"}));
}

#[tokio::test]
async fn a_tool_call_in_the_reply_is_counted_not_taken_for_text() {
    let server = MockServer::start().await;
    let events = [
        json!({"type": "message_start", "message": {"id": "msg_2", "type": "message", "role": "assistant", "content": [],
               "model": "claude-sonnet-4-5", "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me look."}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1,
               "content_block": {"type": "tool_use", "id": "toolu_9", "name": "Read", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1,
               "delta": {"type": "input_json_delta", "partial_json": "{\"file_path\": \"/a.rs\"}"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 20}}),
        json!({"type": "message_stop"}),
    ];
    let body: String =
        events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect();
    mock_messages(&server, sse(body), None).await;
    let (reply, _) = send(&server.uri(), fast_http()).await;
    let reply = reply.unwrap();
    assert_eq!(reply.text, "Let me look.", "the tool's input is not text");
    assert_eq!(reply.tool_calls, 1);
    assert_eq!(reply.stop_reason, Some(StopReason::ToolUse));
}

#[tokio::test]
async fn pieces_split_anywhere_on_the_wire_give_the_same_reply() {
    // CRLF line ends, an unknown event type, and 7-byte HTTP chunks that cut through
    // multi-byte characters and CRLF pairs.
    let stream = anthropic_stream(SUMMARY_PARTS).replace('\n', "\r\n").replacen(
        "event: ping",
        "event: future_event\r\ndata: {\"type\":\"future_event\",\"x\":1}\r\n\r\nevent: ping",
        1,
    );
    let pieces: Vec<&[u8]> = stream.as_bytes().chunks(7).collect();
    assert!(pieces.iter().any(|p| std::str::from_utf8(p).is_err()), "no piece splits a character");
    assert!(pieces.iter().any(|p| p.ends_with(b"\r")), "no piece splits a CRLF");

    let mut steps = vec![head_chunked()];
    for piece in &pieces {
        steps.push(chunk(piece));
        steps.push(Step::Pause(Duration::ZERO));
    }
    steps.push(last_chunk());
    steps.push(Step::Hang);
    let served = serve(steps).await;

    let (reply, collected) = send(&served.base, fast_http()).await;
    let reply = reply.unwrap();
    assert_eq!(reply.text, SUMMARY_PARTS.concat());
    assert_eq!(collected.text, reply.text);
    assert_eq!(reply.usage.map(|u| u.output_tokens), Some(873));

    let raw = served.request.await.unwrap();
    assert!(raw.starts_with("POST /v1/messages HTTP/1.1\r\n"), "{raw}");
    assert!(raw.contains(&format!("x-api-key: {KEY}\r\n")), "{raw}");
    assert!(raw.ends_with(&serde_json::to_string(&messages_body(&fork_request())).unwrap()), "{raw}");
}

#[tokio::test]
async fn an_error_event_mid_stream_fails_the_reply() {
    let full = anthropic_stream(SUMMARY_PARTS);
    // Just before the text block closes.
    let cut_at = full.rfind("event: content_block_stop").unwrap();
    let body = format!(
        "{}event: error\ndata: {}\n\n",
        &full[..cut_at],
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    );
    let server = MockServer::start().await;
    mock_messages(&server, sse(body), None).await;

    let (result, collected) = send(&server.uri(), fast_http()).await;
    let err = result.unwrap_err();
    assert!(
        matches!(&err, ProviderError::StreamError { status: 200, error_type, message }
            if error_type == "overloaded_error" && message == "Overloaded"),
        "{err:?}"
    );
    assert!(err.is_transient());
    assert_eq!(err.to_string(), "HTTP 200: the provider reported an error mid-stream (overloaded_error): Overloaded");
    // The text streamed before the error reached the caller, but no reply was made of it.
    assert_eq!(collected.text, SUMMARY_PARTS.concat());
    assert_eq!(requests(&server).await.len(), 1, "a stream that started is not retried");
}

fn partial_stream() -> String {
    let full = anthropic_stream(SUMMARY_PARTS);
    let at = full.find("event: message_delta").unwrap();
    full[..at].to_owned()
}

#[tokio::test]
async fn a_connection_closed_before_message_stop_is_a_cut_stream() {
    let served = serve(vec![head_until_close(), Step::Send(partial_stream().into_bytes()), Step::Cut]).await;
    let (result, collected) = send(&served.base, fast_http()).await;
    let err = result.unwrap_err();
    assert!(matches!(err, ProviderError::StreamCut { status: 200, bytes, .. } if bytes > 0), "{err:?}");
    assert!(err.to_string().starts_with("HTTP 200: the stream ended before its end marker"), "{err}");
    assert_eq!(collected.text, SUMMARY_PARTS.concat());
}

#[tokio::test]
async fn a_chunked_body_cut_mid_chunk_is_a_cut_stream() {
    let partial = partial_stream();
    let mut half = format!("{:x}\r\n", partial.len() * 2).into_bytes();
    half.extend_from_slice(partial.as_bytes());
    let served = serve(vec![head_chunked(), Step::Send(half), Step::Cut]).await;
    let (result, _) = send(&served.base, fast_http()).await;
    let err = result.unwrap_err();
    assert!(matches!(err, ProviderError::StreamCut { .. }), "{err:?}");
}

#[tokio::test]
async fn a_complete_http_body_without_message_stop_is_a_cut_stream() {
    let served = serve(vec![head_chunked(), chunk(partial_stream().as_bytes()), last_chunk(), Step::Hang]).await;
    let (result, _) = send(&served.base, fast_http()).await;
    assert!(matches!(result, Err(ProviderError::StreamCut { .. })), "{result:?}");
}

#[tokio::test]
async fn retry_after_is_honoured_on_429() {
    let server = MockServer::start().await;
    mock_messages(
        &server,
        api_error(429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit")
            .insert_header("retry-after", "1"),
        Some(1),
    )
    .await;
    mock_messages(&server, sse(anthropic_stream(SUMMARY_PARTS)), None).await;

    let started = Instant::now();
    let (reply, _) = send(&server.uri(), fast_http()).await;
    assert_eq!(reply.unwrap().text, SUMMARY_PARTS.concat());
    // The back-off alone is a few milliseconds: waiting a second means retry-after won.
    assert!(started.elapsed() >= Duration::from_secs(1), "{:?}", started.elapsed());
    assert_eq!(requests(&server).await.len(), 2);
}

#[tokio::test]
async fn overloaded_twice_then_success() {
    let server = MockServer::start().await;
    mock_messages(&server, api_error(529, "overloaded_error", "Overloaded"), Some(2)).await;
    mock_messages(&server, sse(anthropic_stream(SUMMARY_PARTS)), None).await;

    let (reply, _) = send(&server.uri(), fast_http()).await;
    assert_eq!(reply.unwrap().text, SUMMARY_PARTS.concat());
    let received = requests(&server).await;
    assert_eq!(received.len(), 3);
    assert!(received.iter().all(|r| r.body == received[0].body), "every attempt sends the same body");
}

#[tokio::test]
async fn server_error_then_success() {
    let server = MockServer::start().await;
    mock_messages(&server, api_error(500, "api_error", "Internal server error"), Some(1)).await;
    mock_messages(&server, sse(anthropic_stream(SUMMARY_PARTS)), None).await;

    let (reply, _) = send(&server.uri(), fast_http()).await;
    assert!(reply.is_ok(), "{reply:?}");
    assert_eq!(requests(&server).await.len(), 2);
}

#[tokio::test]
async fn retries_stop_at_the_attempt_limit() {
    let server = MockServer::start().await;
    mock_messages(&server, api_error(529, "overloaded_error", "Overloaded"), None).await;

    let (result, _) = send(&server.uri(), fast_http()).await;
    let err = result.unwrap_err();
    assert_eq!(
        err.to_string(),
        "gave up after 4 attempts: HTTP 529: provider unavailable (overloaded_error): Overloaded"
    );
    assert!(matches!(&err, ProviderError::RetriesExhausted { attempts: 4, last }
        if matches!(**last, ProviderError::Unavailable { status: 529, .. })));
    assert_eq!(requests(&server).await.len(), 4);
}

#[tokio::test]
async fn a_retry_after_past_the_time_budget_ends_the_retries_at_once() {
    let server = MockServer::start().await;
    mock_messages(&server, api_error(429, "rate_limit_error", "slow down").insert_header("retry-after", "3600"), None)
        .await;
    let started = Instant::now();
    let (result, _) = send(&server.uri(), fast_http()).await;
    assert!(matches!(result, Err(ProviderError::RetriesExhausted { attempts: 1, .. })), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(requests(&server).await.len(), 1);
}

#[tokio::test]
async fn refused_connections_are_retried_then_reported() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (result, _) = send(&format!("http://127.0.0.1:{port}"), fast_http()).await;
    let err = result.unwrap_err();
    assert!(
        matches!(&err, ProviderError::RetriesExhausted { attempts: 4, last } if matches!(**last, ProviderError::Connect(_))),
        "{err:?}"
    );
}

#[tokio::test]
async fn prompt_too_long_is_typed_and_not_retried() {
    let server = MockServer::start().await;
    mock_messages(
        &server,
        api_error(400, "invalid_request_error", "prompt is too long: 208746 tokens > 200000 maximum"),
        None,
    )
    .await;
    let (result, _) = send(&server.uri(), fast_http()).await;
    let err = result.unwrap_err();
    assert!(matches!(err, ProviderError::PromptTooLong { tokens: 208_746, max: 200_000 }), "{err:?}");
    assert_eq!(err.to_string(), "HTTP 400: prompt is too long: 208746 tokens > 200000 maximum");
    assert_eq!(requests(&server).await.len(), 1);
}

#[tokio::test]
async fn long_context_credit_refusal_is_typed_and_not_retried() {
    let server = MockServer::start().await;
    mock_messages(
        &server,
        api_error(429, "rate_limit_error", "Extra usage is required for long context requests"),
        None,
    )
    .await;
    let (result, _) = send(&server.uri(), fast_http()).await;
    assert!(matches!(result, Err(ProviderError::CreditsRequired { status: 429, .. })), "{result:?}");
    assert_eq!(requests(&server).await.len(), 1);
}

#[tokio::test]
async fn spend_limit_429_is_not_retried() {
    let server = MockServer::start().await;
    let body = json!({"type": "error", "error": {"type": "rate_limit_error",
        "message": "You have reached your API usage limits", "details": {"error_code": "enforced_spend_limit_reached"}}});
    mock_messages(&server, ResponseTemplate::new(429).set_body_json(body), None).await;
    let (result, _) = send(&server.uri(), fast_http()).await;
    assert!(matches!(result, Err(ProviderError::SpendLimit { status: 429, .. })), "{result:?}");
    assert_eq!(requests(&server).await.len(), 1);
}

#[tokio::test]
async fn unauthorized_is_not_retried_and_the_key_stays_out_of_messages_and_logs() {
    let logs = LogCapture::default();
    let _guard = tracing::subscriber::set_default(logs.subscriber());

    let server = MockServer::start().await;
    mock_messages(&server, api_error(401, "authentication_error", "invalid x-api-key"), None).await;
    let provider = anthropic_at(&server.uri(), fast_http());
    let result = provider.send(&fork_request(), &CancellationToken::new(), &mut |_: Delta<'_>| {}).await;

    let err = result.unwrap_err();
    assert!(matches!(err, ProviderError::Auth { status: 401, .. }), "{err:?}");
    let message = err.to_string();
    assert_eq!(
        message,
        "HTTP 401: the provider refused the credentials (invalid x-api-key); check the apiKey setting or the provider's \
         API key variable (ANTHROPIC_API_KEY, OPENAI_API_KEY)"
    );
    assert_eq!(requests(&server).await.len(), 1);

    assert!(!message.contains(KEY));
    assert!(!format!("{err:?}").contains(KEY));
    assert!(!format!("{provider:?}").contains(KEY));
    let logged = logs.text();
    assert!(logged.contains("401"), "the failure was logged: {logged}");
    assert!(logged.contains("provider_send"), "inside the send span: {logged}");
    assert!(!logged.contains(KEY), "{logged}");
    assert!(!logged.contains("SECRET"), "{logged}");
}

#[tokio::test]
async fn a_server_that_never_answers_hits_the_read_timeout() {
    let served = serve(vec![Step::Hang]).await;
    let mut http = fast_http();
    http.read_timeout = Duration::from_millis(300);
    let (result, _) = send(&served.base, http).await;
    assert!(
        matches!(result, Err(ProviderError::Timeout { phase: TimeoutPhase::Read, after }) if after == Duration::from_millis(300)),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_stream_that_stalls_hits_the_read_timeout() {
    let served = serve(vec![head_chunked(), chunk(partial_stream().as_bytes()), Step::Hang]).await;
    let mut http = fast_http();
    http.read_timeout = Duration::from_millis(300);
    let (result, collected) = send(&served.base, http).await;
    let err = result.unwrap_err();
    assert!(matches!(err, ProviderError::Timeout { phase: TimeoutPhase::Read, .. }), "{err:?}");
    assert_eq!(err.to_string(), "timed out waiting for data after 300ms");
    assert_eq!(collected.text, SUMMARY_PARTS.concat());
}

#[tokio::test]
async fn cancelling_mid_stream_drops_the_connection() {
    let served = serve(vec![head_chunked(), chunk(partial_stream().as_bytes()), Step::Hang]).await;
    let provider = anthropic_at(&served.base, fast_http());
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    let mut seen = String::new();
    let result = provider
        .send(&fork_request(), &cancel, &mut |delta: Delta<'_>| {
            if let Delta::Text(t) = delta {
                seen.push_str(t);
                trigger.cancel();
            }
        })
        .await;
    assert!(matches!(result, Err(ProviderError::Cancelled)), "{result:?}");
    assert_eq!(seen, SUMMARY_PARTS[0], "no delta is handed over after the cancel");
    // The server sees the connection go away without waiting for any timeout.
    tokio::time::timeout(Duration::from_secs(5), served.client_closed).await.unwrap().unwrap();
}

#[tokio::test]
async fn cancelling_during_a_back_off_returns_at_once() {
    let server = MockServer::start().await;
    mock_messages(&server, api_error(429, "rate_limit_error", "slow down").insert_header("retry-after", "15"), None)
        .await;
    let provider = anthropic_at(&server.uri(), fast_http());
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        trigger.cancel();
    });
    let result =
        tokio::time::timeout(Duration::from_secs(10), provider.send(&fork_request(), &cancel, &mut |_: Delta<'_>| {}))
            .await
            .unwrap();
    assert!(matches!(result, Err(ProviderError::Cancelled)), "{result:?}");
    assert_eq!(requests(&server).await.len(), 1);
}

#[tokio::test]
async fn an_already_cancelled_token_sends_nothing() {
    let server = MockServer::start().await;
    mock_messages(&server, sse(anthropic_stream(SUMMARY_PARTS)), None).await;
    let provider = anthropic_at(&server.uri(), fast_http());
    let cancel = CancellationToken::new();
    cancel.cancel();
    let result = provider.send(&fork_request(), &cancel, &mut |_: Delta<'_>| {}).await;
    assert!(matches!(result, Err(ProviderError::Cancelled)));
    assert!(requests(&server).await.is_empty());
}

#[tokio::test]
async fn a_json_answer_instead_of_a_stream_is_a_protocol_error() {
    let server = MockServer::start().await;
    mock_messages(&server, ResponseTemplate::new(200).set_body_json(json!({"type": "message", "content": []})), None)
        .await;
    let (result, _) = send(&server.uri(), fast_http()).await;
    let err = result.unwrap_err();
    assert!(matches!(err, ProviderError::Protocol { status: 200, .. }), "{err:?}");
    assert!(err.to_string().contains("application/json"), "{err}");
}

#[tokio::test]
async fn garbage_in_an_event_is_a_protocol_error() {
    let server = MockServer::start().await;
    mock_messages(&server, sse("event: message_start\ndata: {not json\n\n"), None).await;
    let (result, _) = send(&server.uri(), fast_http()).await;
    let err = result.unwrap_err();
    assert!(
        err.to_string().starts_with("HTTP 200: unexpected response: invalid JSON in a message_start event"),
        "{err}"
    );
}

#[tokio::test]
async fn count_tokens_sends_the_prompt_and_reads_the_count() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages/count_tokens"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"input_tokens": 45_312})))
        .expect(1)
        .mount(&server)
        .await;
    let provider = anthropic_at(&server.uri(), fast_http());
    let count = provider.count_tokens(&fork_request(), &CancellationToken::new()).await.unwrap();
    assert_eq!(count, Some(45_312));

    let received = requests(&server).await;
    let request = &received[0];
    assert_eq!(request.headers.get("x-api-key").unwrap(), KEY);
    assert_eq!(request.headers.get("anthropic-version").unwrap(), "2023-06-01");
    assert_eq!(
        request.headers.get("anthropic-beta").unwrap(),
        "prompt-caching-2024-07-31,context-management-2025-06-27"
    );
    let sent = String::from_utf8(request.body.clone()).unwrap();
    assert_eq!(sent, serde_json::to_string(&count_tokens_body(&fork_request())).unwrap());
    let sent: Value = serde_json::from_str(&sent).unwrap();
    assert!(sent.get("stream").is_none() && sent.get("max_tokens").is_none(), "{sent}");
    assert_eq!(sent["thinking"], json!({"type": "enabled", "budget_tokens": 4096}));
}

#[tokio::test]
async fn count_tokens_errors_are_classified_too() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages/count_tokens"))
        .respond_with(api_error(404, "not_found_error", "model: claude-nope"))
        .mount(&server)
        .await;
    let provider = anthropic_at(&server.uri(), fast_http());
    let err = provider.count_tokens(&fork_request(), &CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, ProviderError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("HTTP 404"), "{err}");
}
