//! JSON Schemas of every `ctx/` message, generated from the types in this crate.
//!
//! `schemas/` at the repository root holds the committed output; the test below
//! regenerates it and fails when the files differ. Run
//! `UPDATE_SCHEMAS=1 cargo test -p ctxd-proto` to rewrite them after a change.

use schemars::{JsonSchema, Schema, schema_for};

use crate::*;

/// One schema file: its name in `schemas/` and its content.
#[derive(Debug)]
pub struct SchemaFile {
    pub name: String,
    pub schema: Schema,
}

fn file<T: JsonSchema>(name: &str) -> SchemaFile {
    SchemaFile { name: format!("{name}.json"), schema: schema_for!(T) }
}

/// Every schema, in a stable order.
pub fn all() -> Vec<SchemaFile> {
    vec![
        file::<InitializationOptions>("initializationOptions"),
        file::<Settings>("settings"),
        file::<CtxdCapabilities>("capabilities"),
        file::<OpenSessionParams>("ctx.openSession.params"),
        file::<OpenSessionResult>("ctx.openSession.result"),
        file::<AppendParams>("ctx.append.params"),
        file::<AppendResult>("ctx.append.result"),
        file::<SessionParams>("ctx.usage.params"),
        file::<UsageResult>("ctx.usage.result"),
        file::<SessionParams>("ctx.closeSession.params"),
        file::<UsageChangedNotification>("ctx.usageChanged.params"),
        file::<SetAutoCompactWindowParams>("ctx.setAutoCompactWindow.params"),
        file::<FileReadParams>("ctx.fileRead.params"),
        file::<SessionParams>("ctx.context.params"),
        file::<CompactParams>("ctx.compact.params"),
        file::<CompactResult>("ctx.compact.result"),
        file::<UndoCompactParams>("ctx.undoCompact.params"),
        file::<UndoCompactResult>("ctx.undoCompact.result"),
        file::<ClaudeSessionParams>("ctx.claudeCompact.params"),
        file::<ClaudeCompactResult>("ctx.claudeCompact.result"),
        file::<ClaudeSessionParams>("ctx.claudeUndo.params"),
        file::<ClaudeUndoResult>("ctx.claudeUndo.result"),
        file::<CompactedNotification>("ctx.compacted.params"),
        file::<ReportProviderErrorParams>("ctx.reportProviderError.params"),
        file::<ReportProviderErrorResult>("ctx.reportProviderError.result"),
        file::<SessionParams>("ctx.clear.params"),
        file::<AssembleParams>("ctx.assemble.params"),
        file::<SnipParams>("ctx.snip.params"),
        file::<ObserveParams>("ctx.observe.params"),
        file::<ObserveResult>("ctx.observe.result"),
        file::<SnipResult>("ctx.snip.result"),
        file::<CollapseParams>("ctx.collapse.params"),
        file::<CollapseResult>("ctx.collapse.result"),
        file::<AssembleResult>("ctx.assemble.result"),
        file::<ClearResult>("ctx.clear.result"),
        file::<CompactFailedNotification>("ctx.compactFailed.params"),
        file::<ContextResult>("ctx.context.result"),
        file::<ContextChangedNotification>("ctx.contextChanged.params"),
        file::<FileReadResult>("ctx.fileRead.result"),
        file::<SetAutoCompactWindowResult>("ctx.setAutoCompactWindow.result"),
        file::<SkillInvokedParams>("ctx.skillInvoked.params"),
        file::<UsageResult>("ctx.skillInvoked.result"),
        file::<SetPlanParams>("ctx.setPlan.params"),
        file::<UsageResult>("ctx.setPlan.result"),
        file::<GatewaySessions>("gateway.sessions"),
        file::<SearchHistoryParams>("ctx.searchHistory.params"),
        file::<SearchHistoryResult>("ctx.searchHistory.result"),
        file::<ReadHistoryParams>("ctx.readHistory.params"),
        file::<ReadHistoryResult>("ctx.readHistory.result"),
    ]
}

/// Renders a schema the way it is committed: pretty JSON with a trailing newline.
pub fn render(schema: &Schema) -> String {
    let mut text = serde_json::to_string_pretty(schema).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn schemas_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schemas")
    }

    #[test]
    fn committed_schemas_are_fresh() {
        let dir = schemas_dir();
        let update = std::env::var_os("UPDATE_SCHEMAS").is_some();
        let mut stale = Vec::new();
        let mut expected_names = Vec::new();
        for SchemaFile { name, schema } in all() {
            let path = dir.join(&name);
            let want = render(&schema);
            expected_names.push(name.clone());
            let have = std::fs::read_to_string(&path).unwrap_or_default();
            if have != want {
                if update {
                    std::fs::create_dir_all(&dir).unwrap();
                    std::fs::write(&path, want).unwrap();
                } else {
                    stale.push(name);
                }
            }
        }
        // A schema file whose type was removed is stale too.
        for entry in std::fs::read_dir(&dir).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if name.starts_with("ctx.") && !expected_names.contains(&name) {
                if update {
                    std::fs::remove_file(dir.join(&name)).unwrap();
                } else {
                    stale.push(name);
                }
            }
        }
        assert!(stale.is_empty(), "schemas/ is stale: {stale:?}; run `UPDATE_SCHEMAS=1 cargo test -p ctxd-proto`");
    }
}
