//! One request through the gateway: routed by the core (`ctxd_core::gateway::route`),
//! then answered here (`/ctxd/sessions`, refusals) or forwarded to the upstream with
//! its headers and body unchanged but for what HTTP says a proxy must change: `Host`
//! (the upstream's), and the hop-by-hop headers (`Connection` and the headers it names,
//! `Keep-Alive`, `Transfer-Encoding`, `TE`, `Trailer`, `Upgrade`, `Proxy-*`, and
//! `Expect`, which the gateway's own server already answered). The upstream's status,
//! headers (less its hop-by-hop ones) and body reach the client the same way, errors
//! included. When the upstream cannot be reached the client gets the API's error shape
//! with 502 (or 504 after the connect timeout), naming ctxd and the cause.

use std::sync::Arc;

use ctxd_core::gateway::{self as decide, AnswerKind, Route};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};

use super::body::{Coding, DownBody, Exchange, GatewayBody, OnRequestEnd, Recorder, TooLarge, UpBody};
use super::{Gateway, SESSION_HEADER};

/// Answers one request; never fails (every failure is an answer).
pub async fn handle(gateway: Arc<Gateway>, request: Request<hyper::body::Incoming>) -> Response<GatewayBody> {
    let target = request.uri().to_string();
    let method = request.method().as_str().to_owned();
    let hosts: Vec<&[u8]> = request.headers().get_all(header::HOST).iter().map(HeaderValue::as_bytes).collect();
    let head = decide::Head { method: &method, target: &target, hosts: &hosts };
    let route = decide::route(&head, gateway.config.allow_remote);
    match route {
        Err(refusal) => {
            tracing::info!(method, status = refusal.status, reason = %refusal.reason, "gateway: request refused");
            let kind = match refusal.status {
                404 => "not_found_error",
                _ => "invalid_request_error",
            };
            let status = StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::BAD_REQUEST);
            error(status, kind, &format!("ctxd gateway: {}", refusal.reason))
        }
        Ok(Route::Sessions) => {
            let body = serde_json::to_vec(&gateway.live.snapshot()).unwrap_or_default();
            let mut response = Response::new(GatewayBody::full(body));
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        Ok(Route::Forward) => forward(gateway, request, &method, &target).await,
    }
}

async fn forward(
    gateway: Arc<Gateway>,
    request: Request<hyper::body::Incoming>,
    method: &str,
    target: &str,
) -> Response<GatewayBody> {
    let limits = &gateway.config.limits;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body_bytes) {
        return too_large(limits.max_body_bytes);
    }
    let Ok(permit) = gateway.streams.clone().try_acquire_owned() else {
        tracing::warn!(limit = limits.max_streams, "gateway: too many requests in flight; one refused");
        return error(
            StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            "overloaded_error",
            &format!("ctxd gateway: more than {} requests in flight", limits.max_streams),
        );
    };
    let url_text = decide::upstream_url(gateway.upstream.as_str(), target);
    let url = match reqwest::Url::parse(&url_text) {
        Ok(url) if url.origin() == gateway.upstream.origin() => url,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "ctxd gateway: the request path is not a path",
            );
        }
    };
    let turn = decide::is_messages_request(method, target);
    let header_session =
        request.headers().get(SESSION_HEADER).and_then(|v| decide::session_id(Some(v.as_bytes()), &Default::default()));
    let (parts, incoming) = request.into_parts();
    // Instant compaction reads a Messages request whole first (see `instant`).
    let (inbound, in_flight) = match &gateway.preparer {
        Some(preparer) if turn => {
            match super::instant::intercept(&gateway, preparer, &parts, incoming, target, header_session.clone()).await
            {
                super::instant::Intercepted::Answered(response) => return response,
                super::instant::Intercepted::Forward(inbound, in_flight) => (inbound, in_flight),
            }
        }
        _ => (super::instant::Inbound::Streaming(incoming), None),
    };
    let exchange = Arc::new(Exchange::default());
    let on_end: OnRequestEnd = {
        let live = gateway.live.clone();
        let header_session = header_session.clone();
        Box::new(move |facts| {
            if turn && let Some(session) = header_session.or_else(|| facts.session_id.clone()) {
                live.request_sent(&session);
            }
        })
    };
    let body = UpBody::new(inbound, turn, limits.max_body_bytes, exchange.clone(), on_end);
    let Ok(method_up) = reqwest::Method::from_bytes(method.as_bytes()) else {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", "ctxd gateway: a method HTTP does not know");
    };
    let sent = gateway
        .client
        .request(method_up, url)
        .version(reqwest::Version::HTTP_11)
        .headers(forwardable(&parts.headers, true))
        .body(reqwest::Body::wrap(body))
        .send()
        .await;
    let answer = match sent {
        Ok(answer) => answer,
        Err(_) if exchange.too_large() => return too_large(limits.max_body_bytes),
        Err(e) => return unreachable(&gateway, &e),
    };
    let status = answer.status();
    let headers = forwardable(answer.headers(), false);
    let coding = Coding::from_header(headers.get(header::CONTENT_ENCODING).map(HeaderValue::as_bytes));
    let kind = AnswerKind::from_content_type(headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()));
    let read = (turn && status.is_success() && kind != AnswerKind::Other).then_some(kind);
    if read.is_some() && coding.is_none() {
        tracing::debug!("gateway: an answer in a coding ctxd does not read; its figures are not read");
    }
    let recorder = read.zip(coding).map(|(kind, coding)| {
        let cache_ttl_seconds = gateway.config.env.as_ref().and_then(|env| env.cache_ttl_override());
        (
            kind,
            coding,
            Recorder { live: gateway.live.clone(), exchange: exchange.clone(), header_session, cache_ttl_seconds },
        )
    });
    let upstream: Response<reqwest::Body> = answer.into();
    let mut body = DownBody::new(upstream.into_body(), recorder, permit);
    body.hold(in_flight);
    let mut response = Response::new(GatewayBody::Down(Box::new(body)));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// The headers to pass on: all but the hop-by-hop ones and those `Connection` names;
/// a request also loses `Host` (the upstream's is set from its URL) and `Expect`.
pub(super) fn forwardable(headers: &HeaderMap, request: bool) -> HeaderMap {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let hop = matches!(
            name.as_str(),
            "connection"
                | "keep-alive"
                | "proxy-connection"
                | "proxy-authenticate"
                | "proxy-authorization"
                | "te"
                | "trailer"
                | "transfer-encoding"
                | "upgrade"
        ) || (request && (name == header::HOST || name == header::EXPECT))
            || named.contains(name);
        if !hop {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

pub(super) fn error(status: StatusCode, kind: &str, message: &str) -> Response<GatewayBody> {
    let mut response = Response::new(GatewayBody::full(decide::error_body(kind, message)));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn too_large(limit: u64) -> Response<GatewayBody> {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
        &TooLarge { limit }.to_string().replacen("the", "ctxd gateway: the", 1),
    )
}

/// The upstream could not be reached (or stopped answering before its headers).
fn unreachable(gateway: &Gateway, e: &reqwest::Error) -> Response<GatewayBody> {
    let mut cause = String::new();
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !cause.contains(&text) {
            if !cause.is_empty() {
                cause.push_str(": ");
            }
            cause.push_str(&text);
        }
        source = s.source();
    }
    let origin = gateway.upstream.origin().ascii_serialization();
    let (status, what) = if e.is_timeout() {
        (StatusCode::GATEWAY_TIMEOUT, "did not answer in time")
    } else {
        (StatusCode::BAD_GATEWAY, "cannot be reached")
    };
    tracing::warn!(upstream = %origin, %cause, status = status.as_u16(), "gateway: upstream failed");
    error(status, "api_error", &format!("ctxd gateway: the upstream {origin} {what}: {cause}"))
}
