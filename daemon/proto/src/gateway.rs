//! The gateway's own answers on its port (`ctxd gateway`, or `ctxd serve` with
//! `gateway.enabled`): `GET /ctxd/sessions`, the live figures of each Claude Code
//! session whose requests passed through it, for the status line and other tools.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `GET /ctxd/sessions`: every session seen since the gateway started, newest answer
/// first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySessions {
    pub sessions: Vec<GatewaySession>,
}

/// One Claude Code session's last answered Messages request, as its answer's `usage`
/// reported it (`message_start` and `message_delta` of a stream, or the JSON body).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySession {
    /// Claude Code's session id (the `X-Claude-Code-Session-Id` header, else the
    /// `session_id` in `metadata.user_id`): the stem of its transcript file.
    pub session_id: String,
    /// The model that answered.
    pub model: String,
    pub input_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub output_tokens: u64,
    /// When the request's last byte was sent upstream (RFC 3339, UTC).
    pub sent_at: String,
    /// When the answer's last byte arrived (RFC 3339, UTC).
    pub answered_at: String,
    /// How long the prompt cache the request wrote stays warm: 300, or 3600 when every
    /// cache marker asked for `ttl: "1h"`.
    pub cache_ttl_seconds: u64,
    /// Messages requests of the session forwarded so far (answered or not).
    pub requests: u64,
    /// The gateway holds a prepared summary that covers the session's newest request
    /// exactly (same model, system and tools, same messages): its `/compact` is
    /// answered at once. Absent (false) from a gateway without instant compaction.
    #[serde(default)]
    pub summary_ready: bool,
}

/// The gateway's settings (`gateway` in a settings file). Only the user's own files
/// and the client may set them, as they choose where API keys are sent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewaySettings {
    /// Run the gateway inside the shared daemon (`ctxd serve`) too (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Address to listen on (default `127.0.0.1:8417`); loopback only unless
    /// `ctxd gateway --allow-remote`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Where requests are forwarded (default `https://api.anthropic.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Prepare live sessions' summaries in the background and answer Claude Code's
    /// compaction from them at once (default true; off for models ctxd's model table
    /// does not know).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precompute: Option<bool>,
    /// Seconds a session must be idle before its summary is prepared (default 120).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precompute_idle_seconds: Option<u64>,
    /// Least context, in percent of Claude Code's auto-compact threshold, for an idle
    /// session to be prepared (default 60; from 90 % it is prepared between turns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precompute_at_percent: Option<u64>,
}

impl GatewaySettings {
    pub const DEFAULT_LISTEN: &'static str = "127.0.0.1:8417";
    pub const DEFAULT_UPSTREAM: &'static str = "https://api.anthropic.com";

    /// Keys set in `upper` win, one by one.
    pub fn overlay(&mut self, upper: GatewaySettings) {
        if upper.enabled.is_some() {
            self.enabled = upper.enabled;
        }
        if upper.listen.is_some() {
            self.listen = upper.listen;
        }
        if upper.upstream.is_some() {
            self.upstream = upper.upstream;
        }
        if upper.precompute.is_some() {
            self.precompute = upper.precompute;
        }
        if upper.precompute_idle_seconds.is_some() {
            self.precompute_idle_seconds = upper.precompute_idle_seconds;
        }
        if upper.precompute_at_percent.is_some() {
            self.precompute_at_percent = upper.precompute_at_percent;
        }
    }

    pub fn listen_or_default(&self) -> &str {
        self.listen.as_deref().unwrap_or(Self::DEFAULT_LISTEN)
    }

    pub fn upstream_or_default(&self) -> &str {
        self.upstream.as_deref().unwrap_or(Self::DEFAULT_UPSTREAM)
    }
}
