//! Which provider compaction talks to, and how.
//!
//! The settings module fills [`ProviderSettings`] from the user's settings (keys
//! `provider`, `model`, `baseUrl`, `apiKey`, `compactModel`, `largerModelRetry`);
//! [`ProviderConfig::resolve`] adds the environment fallbacks and decides. The
//! environment is passed in as a lookup function (in the daemon, over the
//! [`ProcessEnv`] `main` read), so tests never touch the process environment.
//!
//! API keys live in [`ApiKey`], whose `Debug` prints no part of the key and which has
//! no `Display`, so neither a log line nor an error message can carry one by accident.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::error::ProviderError;
use super::{AnthropicProvider, OpenAiProvider, ProviderChoice, RemoteProvider};
use crate::process_env::ProcessEnv;

/// The Anthropic API, when neither settings nor `ANTHROPIC_BASE_URL` name another.
pub const DEFAULT_ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";

/// Environment variable with the longest silence, in milliseconds, allowed while waiting
/// for a provider's response or the next piece of its stream (default 300,000).
pub const READ_TIMEOUT_ENV: &str = "CTXD_PROVIDER_READ_TIMEOUT_MS";

/// The provider keys of the user's settings, as written there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProviderSettings {
    /// "anthropic", "openai" or "offline"; unset: Anthropic if a key is known,
    /// offline otherwise.
    pub provider: Option<String>,
    pub model: Option<String>,
    pub base_url: Option<String>,
    pub api_key: Option<ApiKey>,
    /// A separate model for summaries.
    pub compact_model: Option<String>,
    /// A model with a larger window to retry a failed compaction on.
    pub larger_model_retry: Option<String>,
}

/// A secret. `Debug` shows only whether it is empty; there is no `Display`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    /// The key itself, for the one place that puts it in a header.
    pub(super) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() { f.write_str("ApiKey(<empty>)") } else { f.write_str("ApiKey(<redacted>)") }
    }
}

/// Timeouts and retries of one provider's HTTP client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Time allowed to open the TCP and TLS connection.
    pub connect_timeout: Duration,
    /// Longest silence allowed while waiting for the response or for the next piece of
    /// the stream. Anthropic sends `ping` events while a long prompt is being read, so
    /// a healthy stream is never silent this long.
    pub read_timeout: Duration,
    pub retry: RetryPolicy,
}

impl Default for HttpConfig {
    fn default() -> HttpConfig {
        HttpConfig {
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(300),
            retry: RetryPolicy::default(),
        }
    }
}

/// Retries of transient failures (429, 529, other 5xx, 408, connection failures).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 1 means no retry.
    pub max_attempts: u32,
    /// The back-off before the first retry; it doubles with each further retry.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// No retry starts later than this after the first attempt began; a `retry-after`
    /// that points past it ends the retries at once.
    pub total_budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            total_budget: Duration::from_secs(600),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnthropicConfig {
    /// Without the `/v1` suffix (`https://api.anthropic.com`).
    pub base_url: String,
    pub api_key: ApiKey,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// With or without a trailing `/v1` (`http://127.0.0.1:8080`).
    pub base_url: String,
    /// Sent as `Authorization: Bearer …` when set; local servers usually need none.
    pub api_key: Option<ApiKey>,
    /// Ask for usage in the last chunk (`stream_options.include_usage`). Servers that
    /// reject unknown fields may need this off.
    pub include_usage: bool,
}

/// Where summaries are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Anthropic(AnthropicConfig),
    OpenAi(OpenAiConfig),
    /// No model: the offline summarizer in `ctxd-core`.
    Offline,
}

/// Everything compaction needs to know about its model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    pub backend: Backend,
    /// The `model` setting.
    pub model: Option<String>,
    /// The `compactModel` setting.
    pub compact_model: Option<String>,
    /// The `largerModelRetry` setting.
    pub larger_model_retry: Option<String>,
    pub http: HttpConfig,
}

impl ProviderConfig {
    /// Decides the provider from settings, falling back to the environment through `env`
    /// (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_BASE_URL`),
    /// and takes the read timeout from [`READ_TIMEOUT_ENV`]. Empty values count as unset.
    pub fn resolve(
        settings: &ProviderSettings,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<ProviderConfig, ProviderError> {
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let setting = |v: &Option<String>| v.as_deref().map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned);
        let key_setting = settings.api_key.clone().filter(|k| !k.expose().trim().is_empty());

        let provider = setting(&settings.provider).map(|p| p.to_ascii_lowercase());
        let backend = match provider.as_deref() {
            Some("anthropic") => {
                let api_key = key_setting.or_else(|| env("ANTHROPIC_API_KEY").map(ApiKey)).ok_or_else(|| {
                    ProviderError::Config(
                        "provider \"anthropic\" needs an API key: set apiKey or ANTHROPIC_API_KEY".to_owned(),
                    )
                })?;
                Backend::Anthropic(AnthropicConfig { base_url: anthropic_base(settings, &env), api_key })
            }
            Some("openai") => {
                let base_url = setting(&settings.base_url).or_else(|| env("OPENAI_BASE_URL")).ok_or_else(|| {
                    ProviderError::Config(
                        "provider \"openai\" needs baseUrl (or OPENAI_BASE_URL), for example http://127.0.0.1:8080 \
                         for a llama.cpp server"
                            .to_owned(),
                    )
                })?;
                let api_key = key_setting.or_else(|| env("OPENAI_API_KEY").map(ApiKey));
                Backend::OpenAi(OpenAiConfig { base_url, api_key, include_usage: true })
            }
            Some("offline") => Backend::Offline,
            Some(other) => {
                return Err(ProviderError::Config(format!(
                    "unknown provider \"{other}\": expected \"anthropic\", \"openai\" or \"offline\""
                )));
            }
            // A key given without a provider can only be meant for the default one.
            None => match key_setting.or_else(|| env("ANTHROPIC_API_KEY").map(ApiKey)) {
                Some(api_key) => {
                    Backend::Anthropic(AnthropicConfig { base_url: anthropic_base(settings, &env), api_key })
                }
                None => Backend::Offline,
            },
        };
        let mut http = HttpConfig::default();
        if let Some(ms) = env(READ_TIMEOUT_ENV).and_then(|v| v.trim().parse::<u64>().ok()).filter(|ms| *ms > 0) {
            http.read_timeout = Duration::from_millis(ms);
        }
        Ok(ProviderConfig {
            backend,
            model: setting(&settings.model),
            compact_model: setting(&settings.compact_model),
            larger_model_retry: setting(&settings.larger_model_retry),
            http,
        })
    }

    /// [`ProviderConfig::resolve`] over the environment `main` read.
    pub fn from_env(settings: &ProviderSettings, env: &ProcessEnv) -> Result<ProviderConfig, ProviderError> {
        ProviderConfig::resolve(settings, |name| env.var(name).map(str::to_owned))
    }

    /// The model for a summary written outside the cache-sharing fork: `compactModel`,
    /// else `model`. The fork itself must use the parent request's model.
    pub fn summary_model(&self) -> Option<&str> {
        self.compact_model.as_deref().or(self.model.as_deref())
    }

    /// Builds the HTTP client for a remote backend, or says the caller is on its own.
    pub fn connect(&self) -> Result<ProviderChoice, ProviderError> {
        Ok(match &self.backend {
            Backend::Anthropic(c) => {
                ProviderChoice::Remote(RemoteProvider::Anthropic(AnthropicProvider::new(c.clone(), self.http.clone())?))
            }
            Backend::OpenAi(c) => {
                ProviderChoice::Remote(RemoteProvider::OpenAi(OpenAiProvider::new(c.clone(), self.http.clone())?))
            }
            Backend::Offline => ProviderChoice::Offline,
        })
    }
}

fn anthropic_base(settings: &ProviderSettings, env: &impl Fn(&str) -> Option<String>) -> String {
    settings
        .base_url
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .or_else(|| env("ANTHROPIC_BASE_URL"))
        .unwrap_or_else(|| DEFAULT_ANTHROPIC_BASE_URL.to_owned())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |name| map.get(name).cloned()
    }

    fn settings(provider: Option<&str>) -> ProviderSettings {
        ProviderSettings { provider: provider.map(str::to_owned), ..ProviderSettings::default() }
    }

    #[test]
    fn no_provider_and_no_key_is_offline() {
        let config = ProviderConfig::resolve(&settings(None), env_of(&[])).unwrap();
        assert_eq!(config.backend, Backend::Offline);
    }

    #[test]
    fn no_provider_with_env_key_is_anthropic_with_default_base() {
        let config = ProviderConfig::resolve(&settings(None), env_of(&[("ANTHROPIC_API_KEY", "sk-env")])).unwrap();
        assert_eq!(
            config.backend,
            Backend::Anthropic(AnthropicConfig {
                base_url: DEFAULT_ANTHROPIC_BASE_URL.to_owned(),
                api_key: ApiKey::new("sk-env"),
            })
        );
    }

    #[test]
    fn settings_win_over_env() {
        let s = ProviderSettings {
            provider: Some("Anthropic".to_owned()),
            base_url: Some("http://127.0.0.1:9".to_owned()),
            api_key: Some(ApiKey::new("sk-setting")),
            model: Some("claude-x".to_owned()),
            compact_model: Some("claude-small".to_owned()),
            larger_model_retry: Some("claude-x[1m]".to_owned()),
        };
        let env = env_of(&[("ANTHROPIC_API_KEY", "sk-env"), ("ANTHROPIC_BASE_URL", "http://env")]);
        let config = ProviderConfig::resolve(&s, env).unwrap();
        assert_eq!(
            config.backend,
            Backend::Anthropic(AnthropicConfig {
                base_url: "http://127.0.0.1:9".to_owned(),
                api_key: ApiKey::new("sk-setting"),
            })
        );
        assert_eq!(config.summary_model(), Some("claude-small"));
        assert_eq!(config.larger_model_retry.as_deref(), Some("claude-x[1m]"));
    }

    #[test]
    fn env_base_url_is_a_fallback() {
        let env = env_of(&[("ANTHROPIC_API_KEY", "k"), ("ANTHROPIC_BASE_URL", "http://proxy.local")]);
        let config = ProviderConfig::resolve(&settings(Some("anthropic")), env).unwrap();
        let Backend::Anthropic(a) = config.backend else { panic!("not anthropic") };
        assert_eq!(a.base_url, "http://proxy.local");
    }

    #[test]
    fn anthropic_without_key_is_a_config_error() {
        let err =
            ProviderConfig::resolve(&settings(Some("anthropic")), env_of(&[("ANTHROPIC_API_KEY", " ")])).unwrap_err();
        assert!(matches!(err, ProviderError::Config(_)), "{err:?}");
        assert!(err.to_string().contains("ANTHROPIC_API_KEY"), "{err}");
    }

    #[test]
    fn openai_needs_a_base_url_and_takes_an_optional_key() {
        let err = ProviderConfig::resolve(&settings(Some("openai")), env_of(&[])).unwrap_err();
        assert!(err.to_string().contains("baseUrl"), "{err}");

        let env = env_of(&[("OPENAI_BASE_URL", "http://127.0.0.1:8080")]);
        let config = ProviderConfig::resolve(&settings(Some("openai")), env).unwrap();
        assert_eq!(
            config.backend,
            Backend::OpenAi(OpenAiConfig {
                base_url: "http://127.0.0.1:8080".to_owned(),
                api_key: None,
                include_usage: true,
            })
        );
    }

    #[test]
    fn the_read_timeout_comes_from_the_environment_when_valid() {
        let read_timeout = |value: &str| {
            let pairs = [(READ_TIMEOUT_ENV, value)];
            ProviderConfig::resolve(&settings(Some("offline")), env_of(&pairs)).unwrap().http.read_timeout
        };
        assert_eq!(read_timeout("750"), Duration::from_millis(750));
        assert_eq!(read_timeout("0"), HttpConfig::default().read_timeout);
        assert_eq!(read_timeout("soon"), HttpConfig::default().read_timeout);
        assert_eq!(HttpConfig::default().read_timeout, Duration::from_secs(300));
    }

    #[test]
    fn offline_and_unknown_providers() {
        let env = env_of(&[("ANTHROPIC_API_KEY", "k")]);
        let config = ProviderConfig::resolve(&settings(Some("offline")), &env).unwrap();
        assert_eq!(config.backend, Backend::Offline);
        assert!(matches!(config.connect().unwrap(), ProviderChoice::Offline));

        let err = ProviderConfig::resolve(&settings(Some("gemini")), &env).unwrap_err();
        assert_eq!(
            err.to_string(),
            "provider configuration: unknown provider \"gemini\": expected \"anthropic\", \"openai\" or \"offline\""
        );
    }

    #[test]
    fn settings_deserialize_from_camel_case_and_debug_hides_the_key() {
        let s: ProviderSettings = serde_json::from_value(serde_json::json!({
            "provider": "openai", "baseUrl": "http://h", "apiKey": "sk-secret-123",
            "compactModel": "small", "largerModelRetry": "big"
        }))
        .unwrap();
        assert_eq!(s.api_key, Some(ApiKey::new("sk-secret-123")));
        let shown = format!("{s:?}");
        assert!(!shown.contains("sk-secret-123"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        let config = ProviderConfig::resolve(&s, |_| None).unwrap();
        assert!(!format!("{config:?}").contains("sk-secret-123"));
    }
}
