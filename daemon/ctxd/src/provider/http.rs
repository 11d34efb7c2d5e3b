//! The HTTP plumbing both providers share: building the client, sending with retries,
//! and reading a streamed body under the read timeout and the caller's cancellation.
//!
//! Retries happen only before a response body is consumed. Once text has been streamed
//! to the caller, starting over would hand it the same text twice, so failures past
//! that point go back to the caller as errors that say whether a new attempt may help.

use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::{RequestBuilder, Response};
use tokio_util::sync::CancellationToken;

use super::config::{HttpConfig, RetryPolicy};
use super::error::{ProviderError, TimeoutPhase, Verdict, classify, scrub};
use super::sse::{SseEvent, SseParser};

/// Error bodies are read up to this size; the rest is not needed to classify them.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The process's HTTP client for these timeouts. Clients are shared, one per timeout
/// pair: building one loads the TLS root store (several milliseconds of a runtime
/// worker, once per compaction before this), and a shared client keeps its connections
/// to the provider open between compactions.
pub(super) fn build_client(http: &HttpConfig) -> Result<reqwest::Client, ProviderError> {
    static CLIENTS: Mutex<Vec<((Duration, Duration), reqwest::Client)>> = Mutex::new(Vec::new());
    let key = (http.connect_timeout, http.read_timeout);
    let mut clients = CLIENTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, client)) = clients.iter().find(|(k, _)| *k == key) {
        return Ok(client.clone());
    }
    install_crypto_provider();
    let client = reqwest::Client::builder()
        .connect_timeout(http.connect_timeout)
        .read_timeout(http.read_timeout)
        .user_agent(concat!("ctxd/", env!("CARGO_PKG_VERSION")))
        .redirect(same_origin_redirects())
        .build()
        .map_err(|e| ProviderError::Config(format!("cannot build the HTTP client: {}", e.without_url())))?;
    clients.push((key, client.clone()));
    Ok(client)
}

/// Redirects are followed only within the origin the request was sent to: the key
/// (`x-api-key`, `Authorization`) never reaches another scheme, host or port. A redirect
/// elsewhere is answered to the caller as the 3xx it is, and fails with its reason.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let first = attempt.previous().first().map(reqwest::Url::origin);
        if attempt.previous().len() > 5 {
            attempt.error("more than 5 redirects")
        } else if first.is_some_and(|first| first != attempt.url().origin()) {
            attempt.stop()
        } else {
            attempt.follow()
        }
    })
}

/// reqwest is built without a default crypto provider (see the module docs of
/// `provider`); rustls needs one installed before the first client is built.
pub(crate) fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // An error means another part of the process installed one first; that one
        // serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// `{base}/{path}` with exactly one slash between them.
pub(super) fn endpoint(base: &str, path: &str) -> String {
    format!("{}/{}", base.trim_end_matches('/'), path.trim_start_matches('/'))
}

/// Scheme, host and port of a URL, for logs: no credentials, path or query.
pub(super) fn origin(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => match (u.host_str(), u.port()) {
            (Some(h), Some(p)) => format!("{}://{h}:{p}", u.scheme()),
            (Some(h), None) => format!("{}://{h}", u.scheme()),
            _ => u.scheme().to_owned(),
        },
        Err(_) => "<invalid url>".to_owned(),
    }
}

/// Sends the request built by `make` until it gets a success status, retrying
/// transient failures as `http.retry` allows. `secret` is scrubbed from error messages.
pub(super) async fn send_with_retry(
    http: &HttpConfig,
    cancel: &CancellationToken,
    secret: Option<&str>,
    make: impl Fn() -> RequestBuilder,
) -> Result<Response, ProviderError> {
    let policy = &http.retry;
    let started = Instant::now();
    let max_attempts = policy.max_attempts.max(1);
    let mut attempt = 0;
    loop {
        attempt += 1;
        if cancel.is_cancelled() {
            return Err(ProviderError::Cancelled);
        }
        let sent = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(ProviderError::Cancelled),
            sent = make().send() => sent,
        };
        let (error, retry_after) = match sent {
            Ok(response) if response.status().is_success() => return Ok(response),
            Ok(response) => {
                let status = response.status().as_u16();
                let headers = response.headers().clone();
                let body = read_error_body(response, cancel).await?;
                match classify(status, &headers, &body, secret) {
                    Verdict::Fail(error) => {
                        tracing::warn!(status, attempt, error = %error, "provider request failed");
                        return Err(error);
                    }
                    Verdict::Retry { error, retry_after } => (error, retry_after),
                }
            }
            Err(e) if e.is_timeout() && !e.is_connect() => {
                return Err(ProviderError::Timeout { phase: TimeoutPhase::Read, after: http.read_timeout });
            }
            Err(e) if e.is_timeout() => {
                (ProviderError::Timeout { phase: TimeoutPhase::Connect, after: http.connect_timeout }, None)
            }
            Err(e) => (ProviderError::Connect(scrub(&error_chain(e), secret)), None),
        };

        let delay = retry_after.unwrap_or_else(|| backoff(policy, attempt));
        let past_budget = started.elapsed() + delay > policy.total_budget;
        if attempt >= max_attempts || past_budget {
            tracing::warn!(attempt, error = %error, past_budget, "provider request failed; no retries left");
            return Err(if max_attempts == 1 {
                error
            } else {
                ProviderError::RetriesExhausted { attempts: attempt, last: Box::new(error) }
            });
        }
        tracing::warn!(
            attempt,
            max_attempts,
            delay_ms = millis(delay),
            error = %error,
            "provider request failed; retrying"
        );
        tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(ProviderError::Cancelled),
            () = tokio::time::sleep(delay) => {}
        }
    }
}

/// A duration in whole milliseconds, for log fields.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Exponential back-off with jitter for retry number `attempt` (1 for the first retry):
/// `initial * 2^(attempt-1)`, capped, then scaled by a random factor in [0.75, 1] so that
/// many clients turned away at once do not come back at once.
pub(super) fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    let exp = policy.initial_backoff.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
    exp.min(policy.max_backoff).mul_f64(1.0 - 0.25 * fastrand::f64())
}

async fn read_error_body(mut response: Response, cancel: &CancellationToken) -> Result<Vec<u8>, ProviderError> {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        let chunk = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(ProviderError::Cancelled),
            chunk = response.chunk() => chunk,
        };
        match chunk {
            Ok(Some(bytes)) => body.extend_from_slice(&bytes),
            // A broken error body still has a status worth classifying.
            Ok(None) | Err(_) => break,
        }
    }
    Ok(body)
}

/// Reads a whole (small) success body, for answers that are not streamed.
pub(super) async fn read_body(
    mut response: Response,
    cancel: &CancellationToken,
    limit: usize,
    http: &HttpConfig,
) -> Result<Vec<u8>, ProviderError> {
    let status = response.status().as_u16();
    let mut body = Vec::new();
    loop {
        let chunk = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(ProviderError::Cancelled),
            chunk = response.chunk() => chunk,
        };
        match chunk {
            Ok(Some(bytes)) if body.len() + bytes.len() > limit => {
                return Err(ProviderError::Protocol { status, message: format!("an answer over {limit} bytes") });
            }
            Ok(Some(bytes)) => body.extend_from_slice(&bytes),
            Ok(None) => return Ok(body),
            Err(e) if e.is_timeout() => {
                return Err(ProviderError::Timeout { phase: TimeoutPhase::Read, after: http.read_timeout });
            }
            Err(e) => {
                return Err(ProviderError::StreamCut {
                    status,
                    bytes: body.len() as u64,
                    cause: format!(" ({})", error_chain(e)),
                });
            }
        }
    }
}

/// Reads a streamed response body as server-sent events.
pub(super) struct EventStream {
    response: Response,
    parser: SseParser,
    pending: std::collections::VecDeque<SseEvent>,
    scratch: Vec<SseEvent>,
    pub(super) status: u16,
    pub(super) bytes: u64,
    read_timeout: Duration,
}

impl EventStream {
    /// Checks the content type first: a proxy's HTML page or a JSON body from a server
    /// that ignored `stream: true` is a protocol error, not an empty stream.
    pub(super) fn new(response: Response, read_timeout: Duration) -> Result<EventStream, ProviderError> {
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        if !content_type.is_empty() && !content_type.starts_with("text/event-stream") {
            return Err(ProviderError::Protocol {
                status,
                message: format!("expected an event stream, got content-type {content_type}"),
            });
        }
        Ok(EventStream {
            response,
            parser: SseParser::default(),
            pending: std::collections::VecDeque::new(),
            scratch: Vec::new(),
            status,
            bytes: 0,
            read_timeout,
        })
    }

    /// The next event; `None` when the connection ended (cleanly or not: the caller
    /// decides whether its end marker came first).
    pub(super) async fn next(&mut self, cancel: &CancellationToken) -> Result<Option<SseEvent>, ProviderError> {
        loop {
            // Checked before every event, not only while waiting for bytes: the caller
            // may cancel from its delta callback, and the rest of the piece must not
            // reach it.
            if cancel.is_cancelled() {
                return Err(ProviderError::Cancelled);
            }
            if let Some(event) = self.pending.pop_front() {
                return Ok(Some(event));
            }
            let chunk = tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(ProviderError::Cancelled),
                chunk = self.response.chunk() => chunk,
            };
            let chunk: Bytes = match chunk {
                Ok(Some(chunk)) => chunk,
                Ok(None) => return Ok(None),
                Err(e) if e.is_timeout() => {
                    return Err(ProviderError::Timeout { phase: TimeoutPhase::Read, after: self.read_timeout });
                }
                Err(e) => return Err(self.cut(&format!(" ({})", error_chain(e)))),
            };
            self.bytes += chunk.len() as u64;
            self.parser
                .feed(&chunk, &mut self.scratch)
                .map_err(|e| ProviderError::Protocol { status: self.status, message: e.to_string() })?;
            self.pending.extend(self.scratch.drain(..));
        }
    }

    /// The error for a stream that stopped before its end marker.
    pub(super) fn cut(&self, cause: &str) -> ProviderError {
        ProviderError::StreamCut { status: self.status, bytes: self.bytes, cause: cause.to_owned() }
    }

    pub(super) fn protocol(&self, message: String) -> ProviderError {
        ProviderError::Protocol { status: self.status, message }
    }
}

/// A reqwest error and its causes, without the URL (it may carry credentials).
fn error_chain(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_jitters_down_only() {
        let policy = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(700),
            total_budget: Duration::from_secs(60),
        };
        for _ in 0..50 {
            for (attempt, nominal) in [(1, 100), (2, 200), (3, 400), (4, 700), (9, 700), (40, 700)] {
                let d = backoff(&policy, attempt).as_secs_f64() * 1000.0;
                let nominal = nominal as f64;
                assert!(d <= nominal + 1e-6 && d >= nominal * 0.75 - 1e-6, "attempt {attempt}: {d}");
            }
        }
    }

    #[test]
    fn endpoints_and_origins() {
        assert_eq!(endpoint("https://api.anthropic.com/", "/v1/messages"), "https://api.anthropic.com/v1/messages");
        assert_eq!(endpoint("http://h:1/prefix", "v1/messages"), "http://h:1/prefix/v1/messages");
        assert_eq!(origin("https://user:pw@proxy.example:8443/a?key=1"), "https://proxy.example:8443");
        assert_eq!(origin("not a url"), "<invalid url>");
    }
}
