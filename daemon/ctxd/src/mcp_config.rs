//! Whether `ctxd mcp` is one of the MCP servers Claude Code starts in a project, read
//! the way the program reads its MCP configuration.
//!
//! A summary ctxd writes ends with where the earlier conversation can be looked up.
//! When the model has the history tools in that project, the line names them (as the
//! program names an MCP server's tool: `mcp__<server>__<tool>`); otherwise a tool
//! name would send it after something it cannot call, and only the path is given.
//!
//! Claude Code's three places, the nearer overriding the farther under the same
//! server name: the user's (`mcpServers` at the top of `~/.claude.json`, or of
//! `$CLAUDE_CONFIG_DIR/.claude.json`), the project's (`.mcp.json` in the folder or one
//! above it, the nearest winning) and the local one (`projects[<project>].mcpServers`
//! of the same file, keyed by the project's git root, else the folder itself). A server
//! is ctxd's when its command is a program named `ctxd` and `mcp` is among its
//! arguments (`claude mcp add ctxd -- ctxd [--state-dir DIR] mcp`).
//!
//! Every file goes through the bounded reader; one that is missing, unreadable or not
//! JSON counts as naming no server (the summary then names the path only).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ctxd_core::compact::HistoryTools;
use serde_json::Value;

use crate::mcp::{READ_TOOL, SEARCH_TOOL};
use crate::outside::{self, Cap};
use crate::process_env::ProcessEnv;

/// Claude Code's own file grows with every project it has seen.
const CLAUDE_JSON: Cap = Cap { bytes: 16 << 20, what: "Claude Code's configuration" };
/// A project's `.mcp.json`.
const MCP_JSON: Cap = Cap { bytes: 1 << 20, what: "an MCP configuration" };
/// Bytes of a server's name that go into a tool's name.
const MAX_SERVER_NAME: usize = 64;

/// The history tools as the model in `project` calls them, when `ctxd mcp` is
/// configured there; `None` otherwise (or without a project).
pub fn history_tools(project: Option<&Path>, env: &ProcessEnv) -> Option<HistoryTools> {
    let project = project?;
    let global = env.claude_global_config().and_then(|path| read_json(&path, CLAUDE_JSON));
    let mut servers: BTreeMap<String, Value> = BTreeMap::new();
    if let Some(global) = &global {
        add_servers(&mut servers, &global["mcpServers"]);
    }
    let folders: Vec<&Path> = project.ancestors().collect();
    for folder in folders.iter().rev() {
        if let Some(file) = read_json(&folder.join(".mcp.json"), MCP_JSON) {
            add_servers(&mut servers, &file["mcpServers"]);
        }
    }
    if let Some(global) = &global {
        let key = config_key(project);
        add_servers(&mut servers, &global["projects"][key.to_string_lossy().as_ref()]["mcpServers"]);
    }
    // The conventional name first, else the first by name: the same answer every time.
    // A name longer than any real one would only swell every summary: not used.
    let name = if servers.get("ctxd").is_some_and(is_ctxd_mcp) {
        "ctxd".to_owned()
    } else {
        servers.iter().find(|(name, server)| name.len() <= MAX_SERVER_NAME && is_ctxd_mcp(server))?.0.clone()
    };
    Some(HistoryTools { search: tool_name(&name, SEARCH_TOOL), read: tool_name(&name, READ_TOOL) })
}

/// How Claude Code names an MCP server's tool: characters other than letters, digits,
/// `_` and `-` in the server's name become `_`.
fn tool_name(server: &str, tool: &str) -> String {
    let server: String =
        server.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    format!("mcp__{server}__{tool}")
}

fn read_json(path: &Path, cap: Cap) -> Option<Value> {
    let text = outside::read_text(path, cap).ok()?;
    serde_json::from_str(&text).ok()
}

fn add_servers(servers: &mut BTreeMap<String, Value>, from: &Value) {
    if let Some(map) = from.as_object() {
        servers.extend(map.iter().map(|(name, server)| (name.clone(), server.clone())));
    }
}

/// The key of the project's entry in `projects`: its git root, else the folder.
fn config_key(project: &Path) -> PathBuf {
    project.ancestors().find(|dir| dir.join(".git").exists()).unwrap_or(project).to_owned()
}

/// The user's MCP server named `name` in Claude Code's own file `config` (its top-level
/// `mcpServers`), read only. `Ok(None)`: no such server, or no file; `Err`: the file is
/// there but cannot be read as JSON (then nothing can be said about it).
pub fn user_server(config: &Path, name: &str) -> Result<Option<Value>, String> {
    let text = match outside::read_text(config, CLAUDE_JSON) {
        Ok(text) => text,
        Err(outside::OutsideError::Missing) => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", config.display())),
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", config.display()))?;
    Ok(value.get("mcpServers").and_then(|servers| servers.get(name)).cloned())
}

/// A stdio server that runs `ctxd … mcp`.
pub fn is_ctxd_mcp(server: &Value) -> bool {
    let stdio = server["type"].as_str().is_none_or(|kind| kind == "stdio");
    let ctxd = server["command"].as_str().and_then(|c| Path::new(c).file_name()).is_some_and(|name| name == "ctxd");
    let mcp = server["args"].as_array().is_some_and(|args| args.iter().any(|a| a == "mcp"));
    stdio && ctxd && mcp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(home: &Path) -> ProcessEnv {
        ProcessEnv::from_pairs([("HOME", home.to_str().unwrap())])
    }

    fn ctxd_server() -> Value {
        serde_json::json!({"type": "stdio", "command": "/usr/local/bin/ctxd", "args": ["--state-dir", "/s", "mcp"]})
    }

    #[test]
    fn each_of_claude_codes_three_places_names_the_tools() {
        let home = tempfile::tempdir().unwrap();
        let project = home.path().join("work/proj");
        std::fs::create_dir_all(project.join("src")).unwrap();
        let none = history_tools(Some(&project), &env(home.path()));
        assert_eq!(none, None);
        // The project's file, from a folder below it too.
        std::fs::write(
            project.join(".mcp.json"),
            serde_json::json!({"mcpServers": {"history": ctxd_server()}}).to_string(),
        )
        .unwrap();
        let tools = history_tools(Some(&project.join("src")), &env(home.path())).unwrap();
        assert_eq!(tools.search, "mcp__history__search_history");
        assert_eq!(tools.read, "mcp__history__read_history");
        std::fs::remove_file(project.join(".mcp.json")).unwrap();
        // The user's, in ~/.claude.json, or under $CLAUDE_CONFIG_DIR when it is set.
        let user = serde_json::json!({"mcpServers": {"ctxd": ctxd_server()}}).to_string();
        std::fs::write(home.path().join(".claude.json"), &user).unwrap();
        assert_eq!(history_tools(Some(&project), &env(home.path())).unwrap().search, "mcp__ctxd__search_history");
        let config = home.path().join("config");
        std::fs::create_dir(&config).unwrap();
        let moved = ProcessEnv::from_pairs([
            ("HOME", home.path().to_str().unwrap()),
            ("CLAUDE_CONFIG_DIR", config.to_str().unwrap()),
        ]);
        assert_eq!(history_tools(Some(&project), &moved), None, "the file of $CLAUDE_CONFIG_DIR is read instead");
        std::fs::write(config.join(".claude.json"), &user).unwrap();
        assert!(history_tools(Some(&project), &moved).is_some());
        // The local one: the project's entry, keyed by its git root.
        std::fs::create_dir(project.join(".git")).unwrap();
        let local =
            serde_json::json!({"projects": {project.to_str().unwrap(): {"mcpServers": {"mine": ctxd_server()}}}});
        std::fs::write(home.path().join(".claude.json"), local.to_string()).unwrap();
        let tools = history_tools(Some(&project.join("src")), &env(home.path())).unwrap();
        assert_eq!(tools.search, "mcp__mine__search_history");
    }

    #[test]
    fn only_a_ctxd_mcp_server_counts_and_the_nearer_place_wins() {
        let home = tempfile::tempdir().unwrap();
        let project = home.path().join("proj");
        std::fs::create_dir(&project).unwrap();
        let user = serde_json::json!({"mcpServers": {"ctxd": ctxd_server()},
            "projects": {project.to_str().unwrap(): {"mcpServers": {"ctxd": {"command": "ctxd", "args": ["serve"]}}}}});
        std::fs::write(home.path().join(".claude.json"), user.to_string()).unwrap();
        assert_eq!(history_tools(Some(&project), &env(home.path())), None, "the local `ctxd` is another command");
        for other in [
            serde_json::json!({"command": "node", "args": ["ctxd", "mcp"]}),
            serde_json::json!({"command": "ctxd", "args": ["serve"]}),
            serde_json::json!({"type": "http", "url": "http://127.0.0.1:1/mcp", "command": "ctxd", "args": ["mcp"]}),
        ] {
            assert!(!is_ctxd_mcp(&other), "{other}");
        }
        assert!(is_ctxd_mcp(&serde_json::json!({"command": "ctxd", "args": ["mcp"]})));
        assert_eq!(tool_name("my history.{file}", "search_history"), "mcp__my_history__file___search_history");
        let long = serde_json::json!({"mcpServers": {"h".repeat(65): {"command": "ctxd", "args": ["mcp"]}}});
        std::fs::write(project.join(".mcp.json"), long.to_string()).unwrap();
        assert_eq!(history_tools(Some(&project), &env(home.path())), None, "a name of 65 bytes");
        let long = serde_json::json!({"mcpServers": {"h".repeat(64): {"command": "ctxd", "args": ["mcp"]}}});
        std::fs::write(project.join(".mcp.json"), long.to_string()).unwrap();
        assert!(history_tools(Some(&project), &env(home.path())).is_some(), "a name of 64 bytes");
        // Files that are not JSON, or not files, name nothing and fail nothing.
        std::fs::write(home.path().join(".claude.json"), "{not json").unwrap();
        std::fs::remove_file(project.join(".mcp.json")).unwrap();
        std::fs::create_dir(project.join(".mcp.json")).unwrap();
        assert_eq!(history_tools(Some(&project), &env(home.path())), None);
        assert_eq!(history_tools(None, &env(home.path())), None);
    }
}
