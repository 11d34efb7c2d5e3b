//! The decisions of ctxd's gateway on the Messages API path (`ctxd gateway`), as pure
//! functions over bytes: the daemon's `gateway` module moves the bytes and asks these.
//!
//! - [`head`]: forward, answer or refuse a request, from its method, target and `Host`;
//!   the upstream URL; the API's error shape.
//! - [`request`]: what a request body says as it streams past (session, model, cache
//!   lifetime).
//! - [`answer`]: the usage an answer reports, streamed (SSE) or whole (JSON).
//! - [`json_scan`]: the bounded streaming JSON scanner both readers use.
//! - Instant compaction: [`conversation`] (a request as a conversation: Claude Code's
//!   compaction request, the prefix and shape hashes), [`fork`] (the preparation
//!   request), [`prepare`] (when to prepare), [`instant`] (the answer and its stream),
//!   [`costs`] (what preparing cost and answering at once saved).

pub mod answer;
pub mod conversation;
pub mod costs;
pub mod fork;
pub mod head;
pub mod instant;
pub mod json_scan;
pub mod prepare;
pub mod request;

pub use answer::{AnswerFacts, AnswerKind, AnswerScan};
pub use head::{Head, Refusal, Route, SESSIONS_PATH, error_body, route, upstream_url};
pub use request::{RequestFacts, RequestScan, session_id, valid_session_id};

/// Whether a request's answer reports the figures of a conversation turn: a Messages
/// request (`POST /v1/messages`, any query), not `count_tokens` or another path.
pub fn is_messages_request(method: &str, target: &str) -> bool {
    let path = target.split(['?', '#']).next().unwrap_or("");
    method == "POST" && path.trim_end_matches('/') == "/v1/messages"
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_messages_posts_are_turns() {
        assert!(super::is_messages_request("POST", "/v1/messages?beta=true"));
        assert!(!super::is_messages_request("POST", "/v1/messages/count_tokens"));
        assert!(!super::is_messages_request("GET", "/v1/messages"));
    }
}
