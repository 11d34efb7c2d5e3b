//! The settings file format: the keys ctxd reads from settings files,
//! `initializationOptions.settings` and `workspace/didChangeConfiguration`.
//!
//! Layers, lowest first: Claude Code's own settings (`~/.claude/settings.json`,
//! `<project>/.claude/settings.json`, `<project>/.claude/settings.local.json`; only the
//! context keys), user (`~/.config/ctxd/settings.json`), project (`.ctxd/settings.json`),
//! local (`.ctxd/settings.local.json`), the client's `initializationOptions.settings`, and
//! `workspace/didChangeConfiguration`. A later layer wins key by key; `modelSettings`
//! merges per model; `hooks` add up across settings files (hooks from a client are
//! ignored: commands run only from files on disk).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// ctxd settings. Every key is optional; unknown keys are reported and ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Settings {
    /// Context window (tokens, 100,000 to 1,000,000) that compaction decisions use, for
    /// every model; `modelSettings` can set it per model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_compact_window: Option<u64>,
    /// Compact automatically at the threshold (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_compact_enabled: Option<bool>,
    /// Compact a session in the background while its user is away (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_compaction: Option<bool>,
    /// Seconds without activity before a session counts as idle (default 240, inside a
    /// 5-minute prompt-cache lifetime so the summary request reads a warm cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_compact_after_seconds: Option<u64>,
    /// Compact an observed Claude Code session while its user is away (default false):
    /// once it has been idle `claudeIdleCompactAfterSeconds` and stands above
    /// `claudeIdleCompactPercent` of its compact threshold, records in the program's own
    /// shapes are appended to its transcript (as `ctxd claude compact` does), only when no
    /// process has the transcript open and it has not changed since the preparation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude_idle_compaction: Option<bool>,
    /// Seconds an observed Claude Code session must be idle (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude_idle_compact_after_seconds: Option<u64>,
    /// Share of the compact threshold, in percent, an idle Claude Code session must have
    /// reached to be worth compacting (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude_idle_compact_percent: Option<u8>,
    /// Per-model settings, keyed by model id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_settings: Option<BTreeMap<String, ModelSettings>>,
    /// Commands run around compaction, by event (`PreCompact`, `PostCompact`,
    /// `SessionStart`), in Claude Code's format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<BTreeMap<String, Vec<HookMatcher>>>,
    /// Who writes compaction summaries: `anthropic`, `openai` (any OpenAI-compatible
    /// endpoint) or `offline` (built in, no network). Default: anthropic when
    /// `ANTHROPIC_API_KEY` is set, offline otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderKind>,
    /// Model the provider is asked for (default: the session's model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A separate, e.g. cheaper or larger-window, model for summaries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_model: Option<String>,
    /// Model to retry a failed compaction on (a larger window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub larger_model_retry: Option<String>,
    /// Ask the provider for the summary first with the cache-sharing fork of the
    /// session's request (same system, tools, model and message prefix, so it reads the
    /// prompt cache); default true. Set false for a provider without prompt caching.
    /// `CTXD_DISABLE_COMPACT_FORK=1` turns it off too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_fork: Option<bool>,
    /// Provider endpoint (default `https://api.anthropic.com`, or `ANTHROPIC_BASE_URL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key (the key itself is never
    /// written in settings files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// File names loaded as memory files in every project directory (default
    /// `["CLAUDE.md", "AGENTS.md"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_file_names: Option<Vec<String>>,
    /// Folders `@path` imports in memory files may read from, besides the project, the
    /// user's `~/.claude` and the importing file's own folder (`~` is the home). Like the
    /// provider keys, a repository's own files may set it only in a trusted folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import_folders: Option<Vec<String>>,
    /// Follow running Claude Code sessions: every project under `~/.claude/projects`
    /// is observed (its newest transcript, and each new one), and their usage published
    /// with `ctx/usageChanged` (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observe_claude_projects: Option<bool>,
    /// Folders whose own settings files (`.ctxd/settings*.json`, `.claude/settings*.json`)
    /// may choose the provider, its URL, its key variable and hooks. Read only from the
    /// user's settings file: a client's is ignored, and a repository cannot trust itself.
    /// `~` is the home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_folders: Option<Vec<String>>,
    /// The gateway on the Messages API path (`ctxd gateway`): `enabled` runs it inside
    /// the shared daemon, `listen` and `upstream` say where. A repository's own files
    /// may not set it (it chooses where API keys go).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<crate::gateway::GatewaySettings>,
}

/// Settings of one model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_compact_window: Option<u64>,
}

/// Hooks of one event that apply when `matcher` matches (e.g. `compact` for
/// SessionStart, `auto`/`manual` for PreCompact); no matcher matches everything.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookMatcher {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<String>,
    pub hooks: Vec<HookCommand>,
}

/// One hook command: run with JSON on stdin, its stdout read back.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookCommand {
    /// Always `command`.
    #[serde(rename = "type", default = "command_type")]
    pub kind: String,
    pub command: String,
    /// Seconds before the command is killed (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
}

fn command_type() -> String {
    "command".to_owned()
}

/// Which provider writes summaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    Anthropic,
    Openai,
    Offline,
}

impl Settings {
    /// The top-level keys a settings file may have.
    pub const KEYS: &'static [&'static str] = &[
        "autoCompactWindow",
        "autoCompactEnabled",
        "idleCompaction",
        "idleCompactAfterSeconds",
        "claudeIdleCompaction",
        "claudeIdleCompactAfterSeconds",
        "claudeIdleCompactPercent",
        "modelSettings",
        "hooks",
        "trustedFolders",
        "provider",
        "model",
        "compactModel",
        "largerModelRetry",
        "compactFork",
        "baseUrl",
        "apiKeyEnv",
        "memoryFileNames",
        "importFolders",
        "observeClaudeProjects",
        "gateway",
    ];

    /// The keys ctxd reads from Claude Code's settings files.
    pub const CLAUDE_KEYS: &'static [&'static str] =
        &["autoCompactWindow", "autoCompactEnabled", "idleCompaction", "modelSettings", "hooks"];

    /// Removes the keys only a trusted source may set (where summaries are sent, with
    /// which key, and what commands run), returning the names of those that were set.
    pub fn remove_trust_keys(&mut self) -> Vec<&'static str> {
        let mut removed = Vec::new();
        if self.provider.take().is_some() {
            removed.push("provider");
        }
        if self.base_url.take().is_some() {
            removed.push("baseUrl");
        }
        if self.api_key_env.take().is_some() {
            removed.push("apiKeyEnv");
        }
        if self.hooks.take().is_some() {
            removed.push("hooks");
        }
        if self.import_folders.take().is_some() {
            removed.push("importFolders");
        }
        if self.gateway.take().is_some() {
            removed.push("gateway");
        }
        removed
    }

    /// Overlays `upper` on `self`: a key set in `upper` wins; `modelSettings` merges per
    /// model; `hooks` add up.
    pub fn overlay(&mut self, upper: Settings) {
        macro_rules! take {
            ($($field:ident),*) => { $( if upper.$field.is_some() { self.$field = upper.$field; } )* };
        }
        take!(
            auto_compact_window,
            auto_compact_enabled,
            idle_compaction,
            idle_compact_after_seconds,
            claude_idle_compaction,
            claude_idle_compact_after_seconds,
            claude_idle_compact_percent,
            provider,
            model,
            compact_model,
            larger_model_retry,
            compact_fork,
            base_url,
            api_key_env,
            memory_file_names,
            import_folders,
            observe_claude_projects,
            trusted_folders
        );
        if let Some(models) = upper.model_settings {
            let mine = self.model_settings.get_or_insert_with(BTreeMap::new);
            for (model, settings) in models {
                let entry = mine.entry(model).or_default();
                if settings.auto_compact_window.is_some() {
                    entry.auto_compact_window = settings.auto_compact_window;
                }
            }
        }
        if let Some(gateway) = upper.gateway {
            self.gateway.get_or_insert_with(Default::default).overlay(gateway);
        }
        if let Some(hooks) = upper.hooks {
            let mine = self.hooks.get_or_insert_with(BTreeMap::new);
            for (event, matchers) in hooks {
                mine.entry(event).or_default().extend(matchers);
            }
        }
    }

    /// The `autoCompactWindow` for a model: its `modelSettings` entry, else the global one.
    pub fn window_for(&self, model: &str) -> Option<u64> {
        self.model_settings
            .as_ref()
            .and_then(|m| m.get(model))
            .and_then(|s| s.auto_compact_window)
            .or(self.auto_compact_window)
    }
}

/// Reads one settings layer from a JSON object, key by key: a key of the wrong type is an
/// error naming it, an unknown key a warning; the rest loads. `only` limits the keys read
/// (for Claude Code's files, whose other keys are not ctxd's business).
pub fn parse_layer(
    source: &str,
    object: &serde_json::Map<String, serde_json::Value>,
    only: Option<&[&str]>,
) -> (Settings, Vec<String>) {
    let mut settings = Settings::default();
    let mut problems = Vec::new();
    for (key, value) in object {
        if let Some(only) = only
            && !only.contains(&key.as_str())
        {
            continue;
        }
        if !Settings::KEYS.contains(&key.as_str()) {
            problems.push(format!("{source}: unknown key `{key}` ignored"));
            continue;
        }
        let mut single = serde_json::Map::new();
        single.insert(key.clone(), value.clone());
        match serde_json::from_value::<Settings>(serde_json::Value::Object(single)) {
            Ok(one) => settings.overlay(one),
            Err(e) => problems.push(format!("{source}: key `{key}`: {e}")),
        }
    }
    (settings, problems)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn wrong_types_name_the_file_and_key_and_the_rest_loads() {
        let (s, problems) = parse_layer(
            "/p/.ctxd/settings.json",
            &object(json!({"autoCompactWindow": "lots", "autoCompactEnabled": false, "colour": "blue"})),
            None,
        );
        assert_eq!(s.auto_compact_enabled, Some(false));
        assert_eq!(s.auto_compact_window, None);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("/p/.ctxd/settings.json: key `autoCompactWindow`"), "{problems:?}");
        assert!(problems[1].contains("unknown key `colour`"), "{problems:?}");
    }

    #[test]
    fn claude_layer_reads_only_context_keys() {
        let (s, problems) = parse_layer(
            "~/.claude/settings.json",
            &object(json!({"autoCompactWindow": 500000, "permissions": {"allow": []}, "model": "opus"})),
            Some(Settings::CLAUDE_KEYS),
        );
        assert_eq!(s.auto_compact_window, Some(500_000));
        assert_eq!(s.model, None);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn overlay_wins_per_key_merges_models_and_adds_hooks() {
        let hook = |c: &str| HookMatcher {
            matcher: None,
            hooks: vec![HookCommand { kind: "command".into(), command: c.into(), timeout: None }],
        };
        let mut low = Settings {
            auto_compact_window: Some(300_000),
            idle_compaction: Some(true),
            model_settings: Some(BTreeMap::from([("a".into(), ModelSettings { auto_compact_window: Some(400_000) })])),
            hooks: Some(BTreeMap::from([("PreCompact".into(), vec![hook("one")])])),
            ..Settings::default()
        };
        low.overlay(Settings {
            idle_compaction: Some(false),
            model_settings: Some(BTreeMap::from([("b".into(), ModelSettings { auto_compact_window: Some(200_000) })])),
            hooks: Some(BTreeMap::from([("PreCompact".into(), vec![hook("two")])])),
            ..Settings::default()
        });
        assert_eq!(low.auto_compact_window, Some(300_000));
        assert_eq!(low.idle_compaction, Some(false));
        assert_eq!(low.window_for("a"), Some(400_000));
        assert_eq!(low.window_for("b"), Some(200_000));
        assert_eq!(low.window_for("c"), Some(300_000));
        let commands: Vec<_> = low.hooks.unwrap()["PreCompact"].iter().map(|m| m.hooks[0].command.clone()).collect();
        assert_eq!(commands, ["one", "two"]);
    }

    #[test]
    fn keys_list_matches_the_type() {
        let schema = serde_json::to_value(schemars::schema_for!(Settings)).unwrap();
        let mut props: Vec<String> = schema["properties"].as_object().unwrap().keys().cloned().collect();
        props.sort();
        let mut keys: Vec<String> = Settings::KEYS.iter().map(|k| (*k).to_owned()).collect();
        keys.sort();
        assert_eq!(props, keys);
    }
}
