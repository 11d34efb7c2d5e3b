//! The OpenAI-compatible provider against local servers.

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::super::{Provider, ProviderError, StopReason, SummaryReply, Usage};
use super::server::{Step, head_until_close, serve};
use super::{Collected, fork_request, openai_at};

const LOCAL_KEY: &str = "sk-local-key-123456";

/// A llama.cpp-style stream: a role chunk, content chunks, a finish chunk, then (when
/// `usage`) a usage chunk with no choices, then `[DONE]`.
fn chat_stream(parts: &[&str], usage: bool, done: bool) -> String {
    let mut s = String::new();
    let mut data = |v: Value| s.push_str(&format!("data: {v}\n\n"));
    let base = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": "qwen2.5-7b",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    data(base(json!({"role": "assistant", "content": null}), Value::Null));
    data(base(json!({"reasoning_content": "Thinking about it."}), Value::Null));
    for part in parts {
        data(base(json!({"content": part}), Value::Null));
    }
    data(base(json!({}), json!("stop")));
    if usage {
        data(json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "qwen2.5-7b", "choices": [],
                    "usage": {"prompt_tokens": 5_000, "completion_tokens": 420, "total_tokens": 5_420,
                              "prompt_tokens_details": {"cached_tokens": 4_096}}}));
    }
    if done {
        s.push_str("data: [DONE]\n\n");
    }
    s
}

const PARTS: &[&str] = &["<summary>\n", "Fixed the bug — ", "tests pass ✓\n", "</summary>"];

async fn mock_chat(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST")).and(path("/v1/chat/completions")).respond_with(response).mount(server).await;
}

async fn send(base: &str, key: Option<&str>, include_usage: bool) -> (Result<SummaryReply, ProviderError>, Collected) {
    let provider = openai_at(base, key, include_usage);
    let mut collected = Collected::default();
    let result = provider.send(&fork_request(), &CancellationToken::new(), &mut collected.sink()).await;
    (result, collected)
}

#[tokio::test]
async fn streams_with_usage_and_renders_tool_blocks_as_text() {
    let server = MockServer::start().await;
    mock_chat(&server, ResponseTemplate::new(200).set_body_raw(chat_stream(PARTS, true, true), "text/event-stream"))
        .await;
    let (reply, collected) = send(&server.uri(), Some(LOCAL_KEY), true).await;
    let reply = reply.unwrap();

    assert_eq!(reply.text, PARTS.concat());
    assert_eq!(collected.text, reply.text);
    assert_eq!(collected.thinking, "Thinking about it.");
    assert_eq!(reply.stop_reason, Some(StopReason::EndTurn));
    assert_eq!(reply.model.as_deref(), Some("qwen2.5-7b"));
    assert_eq!(
        reply.usage,
        Some(Usage {
            input_tokens: 904,
            output_tokens: 420,
            cache_read_input_tokens: 4_096,
            cache_creation_input_tokens: 0,
            cache_deleted_input_tokens: None,
        })
    );

    let received = server.received_requests().await.unwrap();
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert_eq!(request.headers.get("authorization").unwrap(), &format!("Bearer {LOCAL_KEY}"));
    assert!(request.headers.get("x-api-key").is_none());
    let sent: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(
        sent,
        json!({
            "model": "claude-sonnet-4-5",
            "messages": [
                {"role": "system", "content": "You are Claude Code.\n\ngitStatus: clean"},
                {"role": "user", "content": "Fix the bug in a.rs"},
                {"role": "assistant", "content": "[Tool call: Read (id toolu_01)]\n{\"file_path\":\"/src/a.rs\"}"},
                {"role": "user", "content": "[Tool result for toolu_01]\nfn a() {}\n\nSummarize the conversation so far. Reply in <summary> tags."}
            ],
            "max_tokens": 20000,
            "stream": true,
            "stream_options": {"include_usage": true}
        })
    );
}

#[tokio::test]
async fn streams_without_usage_or_key() {
    let server = MockServer::start().await;
    mock_chat(&server, ResponseTemplate::new(200).set_body_raw(chat_stream(PARTS, false, true), "text/event-stream"))
        .await;
    let (reply, _) = send(&format!("{}/v1", server.uri()), None, false).await;
    let reply = reply.unwrap();
    assert_eq!(reply.text, PARTS.concat());
    assert_eq!(reply.usage, None);

    let received = server.received_requests().await.unwrap();
    assert!(received[0].headers.get("authorization").is_none());
    let sent: Value = serde_json::from_slice(&received[0].body).unwrap();
    assert!(sent.get("stream_options").is_none(), "{sent}");
    assert_eq!(sent["stream"], json!(true));
}

#[tokio::test]
async fn a_cut_before_the_finish_is_an_error_but_a_missing_done_after_it_is_not() {
    let full = chat_stream(PARTS, true, false);
    let before_finish = &full[..full.find("\"finish_reason\":\"stop\"").unwrap()];
    let before_finish = &before_finish[..before_finish.rfind("data: ").unwrap()];
    let served = serve(vec![head_until_close(), Step::Send(before_finish.as_bytes().to_vec()), Step::Cut]).await;
    let (result, collected) = send(&served.base, None, true).await;
    assert!(matches!(result, Err(ProviderError::StreamCut { .. })), "{result:?}");
    assert_eq!(collected.text, PARTS.concat());

    let served = serve(vec![head_until_close(), Step::Send(full.into_bytes()), Step::Cut]).await;
    let (result, _) = send(&served.base, None, true).await;
    let reply = result.unwrap();
    assert_eq!(reply.text, PARTS.concat());
    assert_eq!(reply.usage.map(|u| u.output_tokens), Some(420));
}

#[tokio::test]
async fn an_error_chunk_mid_stream_fails_the_reply() {
    let mut body = chat_stream(&PARTS[..2], false, false);
    let body_end = body.rfind("data: ").unwrap();
    body.truncate(body_end);
    body.push_str(
        "data: {\"error\":{\"message\":\"llama_decode failed: out of memory\",\"type\":\"server_error\"}}\n\n",
    );
    let server = MockServer::start().await;
    mock_chat(&server, ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")).await;
    let (result, _) = send(&server.uri(), None, true).await;
    let err = result.unwrap_err();
    assert_eq!(
        err.to_string(),
        "HTTP 200: the provider reported an error mid-stream (server_error): llama_decode failed: out of memory"
    );
}

#[tokio::test]
async fn context_overflow_is_prompt_too_long() {
    let server = MockServer::start().await;
    mock_chat(
        &server,
        ResponseTemplate::new(400).set_body_json(json!({"object": "error", "type": "BadRequestError", "code": 400,
            "message": "This model's maximum context length is 32768 tokens. However, you requested 40000 tokens (20000 in the messages, 20000 in the completion)."})),
    )
    .await;
    let (result, _) = send(&server.uri(), None, true).await;
    assert!(matches!(result, Err(ProviderError::PromptTooLong { tokens: 40_000, max: 32_768 })), "{result:?}");
}

#[tokio::test]
async fn a_bad_key_is_an_auth_error_without_the_key() {
    let server = MockServer::start().await;
    mock_chat(
        &server,
        ResponseTemplate::new(401)
            .set_body_json(json!({"error": {"message": format!("Incorrect API key provided: {LOCAL_KEY}"),
            "type": "invalid_request_error", "code": "invalid_api_key"}})),
    )
    .await;
    let (result, _) = send(&server.uri(), Some(LOCAL_KEY), true).await;
    let err = result.unwrap_err();
    assert!(matches!(err, ProviderError::Auth { status: 401, .. }), "{err:?}");
    assert!(!err.to_string().contains(LOCAL_KEY), "{err}");
    assert!(err.to_string().contains("Incorrect API key provided: [redacted]"), "{err}");
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn openai_compatible_servers_cannot_count_tokens() {
    let provider = openai_at("http://127.0.0.1:9", None, true);
    assert_eq!(provider.count_tokens(&fork_request(), &CancellationToken::new()).await.unwrap(), None);
}
