//! What went wrong talking to a provider, sorted by what the caller should do.
//!
//! Error responses of Anthropic and of OpenAI-compatible servers share a shape
//! (`{"error": {"type", "message", …}}`), so one classifier serves both. It decides
//! between "retry after a while" and "stop, and here is why", and pulls out the two
//! refusals compaction reacts to: a prompt that is too long, and a long-context request
//! that needs usage credits.
//!
//! Messages quote the server's text (shortened) but never the API key: any copy of the
//! key in a server message is replaced before it is stored.

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde::Deserialize;

/// Which wait ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutPhase {
    Connect,
    /// Waiting for the response or for the next piece of the stream.
    Read,
}

impl std::fmt::Display for TimeoutPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimeoutPhase::Connect => "connecting",
            TimeoutPhase::Read => "waiting for data",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The settings cannot work (unknown provider, missing key or URL, a model or path
    /// the server does not know). Fix the configuration; retrying will not help.
    #[error("provider configuration: {0}")]
    Config(String),

    /// 401 or 403: the key is missing, wrong or not allowed. Not retried.
    #[error(
        "HTTP {status}: the provider refused the credentials ({message}); check the apiKey setting or the provider's \
         API key variable (ANTHROPIC_API_KEY, OPENAI_API_KEY)"
    )]
    Auth { status: u16, message: String },

    /// The prompt is over the model's window. Compact harder (drop the oldest rounds)
    /// and send again.
    #[error("HTTP 400: prompt is too long: {tokens} tokens > {max} maximum")]
    PromptTooLong { tokens: u64, max: u64 },

    /// A long-context request needs usage credits the account does not have. Compact to
    /// the standard window and send again.
    #[error("HTTP {status}: usage credits are required for this long-context request: {message}")]
    CreditsRequired { status: u16, message: String },

    /// The account's spend limit is reached; it will keep failing until someone raises
    /// it. Not retried.
    #[error("HTTP {status}: spend limit reached: {message}")]
    SpendLimit { status: u16, message: String },

    /// The provider rejected the request itself (other 4xx). Not retried: the same
    /// request would fail again.
    #[error("HTTP {status}: request rejected ({error_type}): {message}")]
    BadRequest { status: u16, error_type: String, message: String },

    /// A failure worth retrying (429, 529, other 5xx, 408). Seen alone only when the
    /// policy allows one attempt; otherwise inside [`ProviderError::RetriesExhausted`].
    #[error("HTTP {status}: provider unavailable ({error_type}): {message}")]
    Unavailable { status: u16, error_type: String, message: String },

    /// The connection could not be made or broke before a response arrived.
    #[error("connection failed: {0}")]
    Connect(String),

    /// Transient failures went on past the attempt or time budget. Try again later.
    #[error("gave up after {attempts} attempts: {last}")]
    RetriesExhausted { attempts: u32, last: Box<ProviderError> },

    /// The server went silent for longer than allowed.
    #[error("timed out {phase} after {after:?}")]
    Timeout { phase: TimeoutPhase, after: Duration },

    /// The connection ended before the stream's end marker: the reply is incomplete
    /// and must not be used.
    #[error("HTTP {status}: the stream ended before its end marker after {bytes} bytes{cause}")]
    StreamCut { status: u16, bytes: u64, cause: String },

    /// The provider sent an `error` event in the middle of the stream.
    #[error("HTTP {status}: the provider reported an error mid-stream ({error_type}): {message}")]
    StreamError { status: u16, error_type: String, message: String },

    /// The caller cancelled; the HTTP request was dropped.
    #[error("cancelled")]
    Cancelled,

    /// The response could not be understood (not an event stream, invalid JSON, an
    /// event stream that never ends a line).
    #[error("HTTP {status}: unexpected response: {message}")]
    Protocol { status: u16, message: String },
}

impl ProviderError {
    /// Whether sending the same request again later may succeed: transient failures, a
    /// cut stream, an `overloaded_error` or `api_error` event mid-stream, a timeout.
    pub fn is_transient(&self) -> bool {
        match self {
            ProviderError::Unavailable { .. }
            | ProviderError::Connect(_)
            | ProviderError::RetriesExhausted { .. }
            | ProviderError::Timeout { .. }
            | ProviderError::StreamCut { .. } => true,
            ProviderError::StreamError { error_type, .. } => {
                matches!(error_type.as_str(), "overloaded_error" | "api_error" | "rate_limit_error" | "timeout_error")
            }
            _ => false,
        }
    }
}

/// A refusal that compaction can answer, read from a provider's error message (as a
/// host reports it with `ctx/reportProviderError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// "prompt is too long: N tokens > M maximum".
    PromptTooLong { tokens: u64, max: u64 },
    /// A long-context request refused for want of usage credits.
    CreditsRequired,
}

/// Reads a provider error message (and its HTTP status, when known) for a refusal that
/// compaction can answer.
pub fn refusal_of(status: Option<u16>, message: &str) -> Option<Refusal> {
    if let Some((tokens, max)) = prompt_too_long(message) {
        return Some(Refusal::PromptTooLong { tokens, max });
    }
    if status.is_none_or(|s| matches!(s, 400 | 429)) && credits_required(message) {
        return Some(Refusal::CreditsRequired);
    }
    None
}

/// What the retry loop does with a failed response.
#[derive(Debug)]
pub(super) enum Verdict {
    Retry { error: ProviderError, retry_after: Option<Duration> },
    Fail(ProviderError),
}

/// Classifies a non-success response. `secret` is scrubbed from every quoted text.
pub(super) fn classify(status: u16, headers: &HeaderMap, body: &[u8], secret: Option<&str>) -> Verdict {
    let parsed = ErrorBody::parse(body);
    let error_type = parsed.error_type.clone().unwrap_or_else(|| "unknown".to_owned());
    let message = scrub(&parsed.message.unwrap_or_else(|| body_excerpt(body, status)), secret);

    if let Some((tokens, max)) = parsed.context_overflow.or_else(|| prompt_too_long(&message)) {
        return Verdict::Fail(ProviderError::PromptTooLong { tokens, max });
    }
    if matches!(status, 400 | 429) && credits_required(&message) {
        return Verdict::Fail(ProviderError::CreditsRequired { status, message });
    }
    if matches!(status, 400 | 429) && spend_limit(parsed.error_code.as_deref(), &message) {
        return Verdict::Fail(ProviderError::SpendLimit { status, message });
    }
    match status {
        300..=399 => {
            let to = headers.get(reqwest::header::LOCATION).and_then(|l| l.to_str().ok()).unwrap_or("nowhere");
            Verdict::Fail(ProviderError::Config(format!(
                "HTTP {status}: the provider redirects to another origin ({}); ctxd never sends the key across origins: set baseUrl to the endpoint itself",
                super::http::origin(to)
            )))
        }
        401 | 403 => Verdict::Fail(ProviderError::Auth { status, message }),
        404 => Verdict::Fail(ProviderError::Config(format!(
            "HTTP 404 ({error_type}): {message}; check baseUrl and the model name"
        ))),
        408 | 429 | 500..=599 => Verdict::Retry {
            error: ProviderError::Unavailable { status, error_type, message },
            retry_after: retry_after(headers),
        },
        _ => Verdict::Fail(ProviderError::BadRequest { status, error_type, message }),
    }
}

/// The fields of an error body that decisions depend on.
#[derive(Debug, Default)]
struct ErrorBody {
    error_type: Option<String>,
    message: Option<String>,
    /// `error.details.error_code` (Anthropic's spend limit).
    error_code: Option<String>,
    /// llama.cpp's `exceed_context_size_error` carries both numbers as fields.
    context_overflow: Option<(u64, u64)>,
}

impl ErrorBody {
    fn parse(body: &[u8]) -> ErrorBody {
        #[derive(Deserialize)]
        struct Outer {
            error: Option<Inner>,
            message: Option<String>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Inner {
            Object {
                #[serde(rename = "type")]
                error_type: Option<String>,
                message: Option<String>,
                details: Option<Details>,
                n_prompt_tokens: Option<u64>,
                n_ctx: Option<u64>,
            },
            // Ollama's native errors: `{"error": "message"}`.
            Text(String),
        }
        #[derive(Deserialize)]
        struct Details {
            error_code: Option<String>,
        }

        let Ok(outer) = serde_json::from_slice::<Outer>(body) else { return ErrorBody::default() };
        match outer.error {
            Some(Inner::Object { error_type, message, details, n_prompt_tokens, n_ctx }) => ErrorBody {
                error_type,
                message: message.or(outer.message),
                error_code: details.and_then(|d| d.error_code),
                context_overflow: n_prompt_tokens.zip(n_ctx),
            },
            Some(Inner::Text(message)) => ErrorBody { message: Some(message), ..ErrorBody::default() },
            None => ErrorBody { message: outer.message, ..ErrorBody::default() },
        }
    }
}

/// A short, printable piece of a body that is not the expected JSON (an HTML error page
/// from a proxy, plain text).
fn body_excerpt(body: &[u8], status: u16) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return format!("empty body (status {status})");
    }
    shorten(text, 300)
}

pub(super) fn shorten(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Replaces every copy of the key in `text`.
pub(super) fn scrub(text: &str, secret: Option<&str>) -> String {
    match secret {
        // Very short "keys" (placeholders for local servers) would blank out ordinary
        // words; they are not secrets worth hiding.
        Some(secret) if secret.len() >= 8 && text.contains(secret) => text.replace(secret, "[redacted]"),
        _ => text.to_owned(),
    }
}

/// Reads the two numbers out of the refusals of a prompt over the window:
/// Anthropic's "prompt is too long: 208746 tokens > 200000 maximum", and the
/// OpenAI/vLLM form "This model's maximum context length is 4096 tokens. However, you
/// requested 5000 tokens (…)" / "… your messages resulted in 5000 tokens".
pub(super) fn prompt_too_long(message: &str) -> Option<(u64, u64)> {
    let lower = message.to_ascii_lowercase();
    if let Some(rest) = after(&lower, "prompt is too long:") {
        let (tokens, rest) = leading_number(rest)?;
        let rest = after(rest, ">")?;
        let (max, _) = leading_number(rest)?;
        return Some((tokens, max));
    }
    let max = leading_number(after(&lower, "maximum context length is")?)?.0;
    let tokens = after(&lower, "you requested")
        .or_else(|| after(&lower, "resulted in"))
        .and_then(leading_number)
        .map(|(n, _)| n)?;
    Some((tokens, max))
}

fn credits_required(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    (lower.contains("credit") || lower.contains("extra usage")) && lower.contains("context")
}

fn spend_limit(error_code: Option<&str>, message: &str) -> bool {
    error_code == Some("enforced_spend_limit_reached") || message.to_ascii_lowercase().contains("usage limit")
}

/// `retry-after-ms` (milliseconds, sent by some OpenAI-compatible servers) or
/// `retry-after` in seconds. The HTTP-date form is ignored: the back-off applies.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| -> Option<f64> {
        let v: f64 = headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
        (v.is_finite() && v >= 0.0).then_some(v)
    };
    number("retry-after-ms")
        .map(|ms| Duration::from_secs_f64(ms / 1000.0))
        .or_else(|| number("retry-after").map(Duration::from_secs_f64))
}

fn after<'a>(haystack: &'a str, needle: &str) -> Option<&'a str> {
    haystack.find(needle).map(|i| &haystack[i + needle.len()..])
}

/// The first number in `text` (digits, allowing `,` and `_` separators), skipping
/// leading spaces.
fn leading_number(text: &str) -> Option<(u64, &str)> {
    let text = text.trim_start();
    let end = text.find(|c: char| !(c.is_ascii_digit() || c == ',' || c == '_')).unwrap_or(text.len());
    let digits: String = text[..end].chars().filter(char::is_ascii_digit).collect();
    Some((digits.parse().ok()?, &text[end..]))
}

#[cfg(test)]
mod refusal_tests {
    use super::*;

    #[test]
    fn refusals_hosts_report() {
        assert_eq!(
            refusal_of(Some(400), "prompt is too long: 212345 tokens > 200000 maximum"),
            Some(Refusal::PromptTooLong { tokens: 212_345, max: 200_000 })
        );
        assert_eq!(refusal_of(None, "Usage credits required for 1M context"), Some(Refusal::CreditsRequired));
        assert_eq!(refusal_of(Some(529), "Overloaded"), None);
        assert_eq!(refusal_of(Some(400), "Your credit balance is too low"), None);
    }
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    fn anthropic_body(error_type: &str, message: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "type": "error", "error": {"type": error_type, "message": message}, "request_id": "req_1"
        }))
        .unwrap()
    }

    #[test]
    fn prompt_too_long_numbers() {
        assert_eq!(prompt_too_long("prompt is too long: 208746 tokens > 200000 maximum"), Some((208_746, 200_000)));
        assert_eq!(
            prompt_too_long(
                "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion)."
            ),
            Some((5000, 4096))
        );
        assert_eq!(
            prompt_too_long(
                "This model's maximum context length is 8,192 tokens. However, your messages resulted in 9,001 tokens."
            ),
            Some((9001, 8192))
        );
        assert_eq!(prompt_too_long("prompt is too long"), None);
        assert_eq!(prompt_too_long("something else"), None);
    }

    #[test]
    fn classify_prompt_too_long_400() {
        let body = anthropic_body("invalid_request_error", "prompt is too long: 1000001 tokens > 1000000 maximum");
        let verdict = classify(400, &HeaderMap::new(), &body, None);
        assert!(matches!(verdict, Verdict::Fail(ProviderError::PromptTooLong { tokens: 1_000_001, max: 1_000_000 })));
    }

    #[test]
    fn classify_llama_cpp_context_overflow() {
        let body = br#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9000,"n_ctx":8192}}"#;
        let verdict = classify(400, &HeaderMap::new(), body, None);
        assert!(
            matches!(verdict, Verdict::Fail(ProviderError::PromptTooLong { tokens: 9000, max: 8192 })),
            "{verdict:?}"
        );
    }

    #[test]
    fn classify_credits_required_on_429_and_400() {
        for (status, message) in
            [(429, "Extra usage is required for long context requests"), (400, "Usage credits required for 1M context")]
        {
            let verdict = classify(status, &HeaderMap::new(), &anthropic_body("rate_limit_error", message), None);
            assert!(matches!(verdict, Verdict::Fail(ProviderError::CreditsRequired { .. })), "{status}: {verdict:?}");
        }
        // A low balance is not a long-context refusal: compacting would not help.
        let body =
            anthropic_body("invalid_request_error", "Your credit balance is too low to access the Anthropic API");
        assert!(matches!(
            classify(400, &HeaderMap::new(), &body, None),
            Verdict::Fail(ProviderError::BadRequest { .. })
        ));
    }

    #[test]
    fn classify_spend_limit_is_never_retried() {
        let body = serde_json::to_vec(&serde_json::json!({"type": "error", "error": {
            "type": "rate_limit_error", "message": "You have reached your API usage limits",
            "details": {"error_code": "enforced_spend_limit_reached"}}}))
        .unwrap();
        assert!(matches!(
            classify(429, &HeaderMap::new(), &body, None),
            Verdict::Fail(ProviderError::SpendLimit { status: 429, .. })
        ));
    }

    #[test]
    fn classify_retryable_statuses_and_retry_after() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", HeaderValue::from_static("7"));
        let verdict = classify(429, &headers, &anthropic_body("rate_limit_error", "slow down"), None);
        let Verdict::Retry { retry_after, error } = verdict else { panic!("not retried") };
        assert_eq!(retry_after, Some(Duration::from_secs(7)));
        assert_eq!(error.to_string(), "HTTP 429: provider unavailable (rate_limit_error): slow down");

        headers.insert("retry-after-ms", HeaderValue::from_static("250"));
        let Verdict::Retry { retry_after, .. } = classify(529, &headers, b"", None) else { panic!("not retried") };
        assert_eq!(retry_after, Some(Duration::from_millis(250)));

        for status in [500, 502, 503, 504, 529, 408] {
            assert!(matches!(classify(status, &HeaderMap::new(), b"oops", None), Verdict::Retry { .. }), "{status}");
        }
        for status in [400, 401, 403, 404, 413, 422] {
            assert!(matches!(classify(status, &HeaderMap::new(), b"oops", None), Verdict::Fail(_)), "{status}");
        }
    }

    #[test]
    fn messages_never_carry_the_key() {
        let key = "sk-ant-api03-SECRETSECRET";
        let body = anthropic_body("authentication_error", &format!("invalid x-api-key {key}"));
        let Verdict::Fail(err) = classify(401, &HeaderMap::new(), &body, Some(key)) else { panic!("retried") };
        let text = err.to_string();
        assert!(!text.contains(key), "{text}");
        assert!(text.starts_with("HTTP 401: "), "{text}");
    }

    #[test]
    fn odd_bodies() {
        let Verdict::Fail(err) = classify(400, &HeaderMap::new(), br#"{"error":"model is required"}"#, None) else {
            panic!()
        };
        assert_eq!(err.to_string(), "HTTP 400: request rejected (unknown): model is required");
        let html = "<html>".to_owned() + &"x".repeat(1000);
        let Verdict::Fail(err) = classify(418, &HeaderMap::new(), html.as_bytes(), None) else { panic!() };
        assert!(err.to_string().chars().count() < 400, "{err}");
        let Verdict::Fail(err) = classify(400, &HeaderMap::new(), b"", None) else { panic!() };
        assert!(err.to_string().contains("empty body"), "{err}");
    }
}
