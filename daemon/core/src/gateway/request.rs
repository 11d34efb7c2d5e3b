//! What the gateway learns from a Messages request as it passes: the Claude Code
//! session it belongs to, the model asked for, and how long its prompt cache lives.
//!
//! Claude Code 2.1.332 names its session in a header (`X-Claude-Code-Session-Id`) and
//! again in the body, as `metadata.user_id`, a JSON text
//! `{"device_id":…,"account_uuid":…,"session_id":…}` (older versions wrote
//! `user_<hash>_account_<uuid>_session_<uuid>`); the header wins. The cache lives 5
//! minutes unless every `cache_control` marker of the request asks for `ttl: "1h"`
//! (with mixed markers the shorter-lived part goes cold first).

use super::json_scan::{JsonScan, Scalar};

/// Lifetime of a prompt-cache entry written without a `ttl`.
pub const DEFAULT_CACHE_TTL_SECONDS: u64 = 300;
/// Lifetime of one written with `ttl: "1h"`.
pub const LONG_CACHE_TTL_SECONDS: u64 = 3600;

/// Longest session id taken from a request.
const MAX_SESSION_ID: usize = 128;

/// What a request's body said, as far as the gateway reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFacts {
    pub model: Option<String>,
    pub stream: bool,
    /// From `metadata.user_id`.
    pub session_id: Option<String>,
    /// `cache_control` markers, and those of them with `ttl: "1h"`.
    pub cache_markers: u32,
    pub long_cache_markers: u32,
}

impl RequestFacts {
    /// Seconds the prompt cache this request writes stays warm.
    pub fn cache_ttl_seconds(&self) -> u64 {
        if self.cache_markers > 0 && self.long_cache_markers == self.cache_markers {
            LONG_CACHE_TTL_SECONDS
        } else {
            DEFAULT_CACHE_TTL_SECONDS
        }
    }
}

/// Reads a request body in pieces (see [`JsonScan`]); memory stays within the scanner's
/// bounds whatever the body's size.
#[derive(Debug, Clone)]
pub struct RequestScan {
    scan: JsonScan,
    facts: RequestFacts,
}

impl Default for RequestScan {
    fn default() -> RequestScan {
        // `user_id` is about 150 bytes; the model id and markers are short.
        RequestScan { scan: JsonScan::new(1024, 128), facts: RequestFacts::default() }
    }
}

impl RequestScan {
    pub fn feed(&mut self, bytes: &[u8]) {
        let facts = &mut self.facts;
        self.scan.feed(bytes, &mut |path, value| match path {
            [top] if top.is("model") => facts.model = value.as_str().map(str::to_owned),
            [top] if top.is("stream") => facts.stream = value == Scalar::Bool(true),
            [meta, user] if meta.is("metadata") && user.is("user_id") => {
                facts.session_id = value.as_str().and_then(session_id_from_user_id);
            }
            [.., marker, field] if marker.is("cache_control") => {
                if field.is("type") {
                    facts.cache_markers += 1;
                } else if field.is("ttl") && value.as_str() == Some("1h") {
                    facts.long_cache_markers += 1;
                }
            }
            _ => {}
        });
    }

    /// What was read (everything up to where the body stopped or stopped being JSON).
    pub fn facts(&self) -> &RequestFacts {
        &self.facts
    }

    pub fn into_facts(self) -> RequestFacts {
        self.facts
    }
}

/// The session id inside Claude Code's `metadata.user_id`.
pub fn session_id_from_user_id(user_id: &str) -> Option<String> {
    if user_id.trim_start().starts_with('{') {
        #[derive(serde::Deserialize)]
        struct Ids {
            session_id: Option<String>,
        }
        let ids: Ids = serde_json::from_str(user_id).ok()?;
        return ids.session_id.and_then(|s| valid_session_id(&s).then_some(s));
    }
    let (_, id) = user_id.rsplit_once("_session_")?;
    valid_session_id(id).then(|| id.to_owned())
}

/// A session id the gateway keeps: short, of the characters a UUID or a file stem of
/// Claude Code's uses. Anything else (a header someone crafted) is no session.
pub fn valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_SESSION_ID
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && id != "."
        && id != ".."
}

/// The session a request belongs to: the header when it holds a valid id, else the
/// body's.
pub fn session_id(header: Option<&[u8]>, facts: &RequestFacts) -> Option<String> {
    header
        .and_then(|h| std::str::from_utf8(h).ok())
        .map(str::trim)
        .filter(|h| valid_session_id(h))
        .map(str::to_owned)
        .or_else(|| facts.session_id.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body shape Claude Code 2.1.332 sends (captured against the stub), shortened.
    const CLAUDE_BODY: &str = r#"{"model":"claude-opus-5-5","messages":[{"role":"user","content":[{"type":"text","text":"Turn one: say hello","cache_control":{"type":"ephemeral"}}]}],"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.332.93d;"},{"type":"text","text":"You are a Claude agent.","cache_control":{"type":"ephemeral"}}],"tools":[],"metadata":{"user_id":"{\"device_id\":\"f17554d9\",\"account_uuid\":\"\",\"session_id\":\"6b3aa261-c3af-47d7-b1af-d98e352f013e\"}"},"max_tokens":32000,"stream":true}"#;

    fn facts_of(body: &str, piece: usize) -> RequestFacts {
        let mut scan = RequestScan::default();
        for chunk in body.as_bytes().chunks(piece) {
            scan.feed(chunk);
        }
        scan.into_facts()
    }

    #[test]
    fn claude_codes_body_names_its_session_model_and_markers() {
        for piece in [1, 5, 64, CLAUDE_BODY.len()] {
            let facts = facts_of(CLAUDE_BODY, piece);
            assert_eq!(facts.session_id.as_deref(), Some("6b3aa261-c3af-47d7-b1af-d98e352f013e"));
            assert_eq!(facts.model.as_deref(), Some("claude-opus-5-5"));
            assert!(facts.stream);
            assert_eq!((facts.cache_markers, facts.long_cache_markers), (2, 0));
            assert_eq!(facts.cache_ttl_seconds(), 300);
        }
    }

    #[test]
    fn an_hour_only_when_every_marker_asks_for_it() {
        let all = CLAUDE_BODY.replace(r#"{"type":"ephemeral"}"#, r#"{"type":"ephemeral","ttl":"1h"}"#);
        assert_eq!(facts_of(&all, 7).cache_ttl_seconds(), 3600);
        let one = CLAUDE_BODY.replacen(r#"{"type":"ephemeral"}"#, r#"{"ttl":"1h","type":"ephemeral"}"#, 1);
        assert_eq!(facts_of(&one, 7).cache_ttl_seconds(), 300);
        assert_eq!(facts_of(r#"{"messages":[]}"#, 3).cache_ttl_seconds(), 300, "no marker: nothing cached");
    }

    #[test]
    fn session_ids_from_both_user_id_forms_and_the_header() {
        assert_eq!(session_id_from_user_id(r#"{"session_id":"abc-1"}"#).as_deref(), Some("abc-1"));
        assert_eq!(
            session_id_from_user_id("user_0f3a_account_9c1d-aa_session_5e2b6a1c-0000-4000-8000-000000000001")
                .as_deref(),
            Some("5e2b6a1c-0000-4000-8000-000000000001")
        );
        assert_eq!(session_id_from_user_id("user_0f3a"), None);
        assert_eq!(session_id_from_user_id(r#"{"session_id":"../../etc"}"#), None);
        assert_eq!(session_id_from_user_id(r#"{"session_id":7}"#), None);
        let facts = RequestFacts { session_id: Some("from-body".into()), ..RequestFacts::default() };
        assert_eq!(session_id(Some(b"from-header"), &facts).as_deref(), Some("from-header"));
        assert_eq!(session_id(Some(b"bad id\n"), &facts).as_deref(), Some("from-body"));
        assert_eq!(session_id(Some(&[b'a'; 200]), &facts).as_deref(), Some("from-body"));
        assert_eq!(session_id(None, &RequestFacts::default()), None);
    }

    #[test]
    fn a_body_that_is_not_json_yields_nothing_and_no_panic() {
        let facts = facts_of("\u{0}\u{1}not json {\"model\":\"x\"}", 2);
        assert_eq!(facts, RequestFacts::default());
    }
}
