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

/// Every schema: the settings and capabilities, then each method's params and result
/// (from [`each_method`], so a method gets its schemas by being listed), the methods'
/// names, and the data of errors that carry some.
pub fn all() -> Vec<SchemaFile> {
    let mut files = vec![
        file::<InitializationOptions>("initializationOptions"),
        file::<Settings>("settings"),
        file::<CtxdCapabilities>("capabilities"),
        file::<GatewaySessions>("gateway.sessions"),
    ];
    let mut methods = MethodFiles::default();
    each_method(&mut methods);
    files.append(&mut methods.files);
    files.push(names("requests", "CtxRequestMethod", "Every `ctx/` request ctxd answers.", &methods.requests));
    files.push(names(
        "notifications",
        "CtxNotificationMethod",
        "Every `ctx/` notification ctxd sends.",
        &methods.notifications,
    ));
    files.push(file::<CannotUndoData>("ctx.undoCompact.error"));
    files
}

/// The schema files of each method, and its name with its documentation.
#[derive(Default)]
struct MethodFiles {
    files: Vec<SchemaFile>,
    requests: Vec<(&'static str, &'static str)>,
    notifications: Vec<(&'static str, &'static str)>,
}

impl Methods for MethodFiles {
    fn request<R: Request>(&mut self, doc: &'static str) {
        let stem = R::METHOD.replace('/', ".");
        self.files.push(file::<R::Params>(&format!("{stem}.params")));
        let result = file::<R::Result>(&format!("{stem}.result"));
        // A request answered with `null` has no result type to describe.
        if result.schema.get("type") != Some(&serde_json::Value::from("null")) {
            self.files.push(result);
        }
        self.requests.push((R::METHOD, doc));
    }

    fn notification<N: Notification>(&mut self, doc: &'static str) {
        let stem = N::METHOD.replace('/', ".");
        self.files.push(file::<N::Params>(&format!("{stem}.params")));
        self.notifications.push((N::METHOD, doc));
    }
}

/// A schema of the method names `methods` (a string, one of them), each described by
/// its documentation, for clients to generate their method constants from.
fn names(name: &str, title: &str, description: &str, methods: &[(&str, &str)]) -> SchemaFile {
    let one_of: Vec<serde_json::Value> = methods
        .iter()
        .map(|(method, doc)| {
            let doc: Vec<&str> = doc.lines().map(str::trim).collect();
            serde_json::json!({ "const": method, "description": doc.join("\n").trim() })
        })
        .collect();
    let schema = serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": title,
        "description": description,
        "type": "string",
        "oneOf": one_of,
    });
    SchemaFile { name: format!("{name}.json"), schema: Schema::try_from(schema).unwrap_or_default() }
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
