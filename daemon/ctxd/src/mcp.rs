//! `ctxd mcp`: the history search as an MCP server on stdio, for the agent itself.
//!
//! After a compaction the model sees a summary; the transcript still holds everything
//! before it. Claude Code starts this server (`claude mcp add ctxd -- ctxd mcp`) in
//! the project's folder, and the model gets two tools: `search_history` (ranked hits
//! with a snippet each) and `read_history` (one record in full with its neighbours).
//! By default they look at the newest Claude Code session of the server's working
//! directory (the one the program is writing); `session: "all"` covers every session of
//! the project, and any session id (Claude Code's or the store's) names one.
//!
//! The server does not need the daemon: it reads the transcripts and shares the
//! history index under the state directory with it (see `crate::history`). Built on
//! the official SDK (`rmcp`), written out by hand (no macros): two tools, their
//! argument types, and the `tools/list` and `tools/call` handlers.

use std::path::PathBuf;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};

use crate::history::{self, History, HistoryError, Origin, Scope, SearchRequest};

pub const SEARCH_TOOL: &str = "search_history";
pub const READ_TOOL: &str = "read_history";

const SEARCH_DESCRIPTION: &str = "Search the full history of this project's sessions, including \
everything from before a compaction that is no longer in your context. Use it after a compaction, \
or whenever you need an exact earlier message, decision, error or file content, instead of \
guessing or redoing work. Returns ranked hits (session, uuid, timestamp, role, a snippet of about \
300 characters, and whether the record stands before the session's latest compaction); read a hit \
in full with read_history. Words match anywhere; put an exact phrase in double quotes.";

const READ_DESCRIPTION: &str = "Read one record of a session's history in full, as search_history \
named it (session and uuid), with its neighbours on the conversation before and after it. Use it \
to recover the exact text of an earlier message, tool call or tool result. Text is bounded \
(20,000 characters by default, with a note when cut).";

const INSTRUCTIONS: &str = "ctxd keeps every session's transcript. After a compaction, or when you \
need an exact earlier message, decision, error or file content, call search_history, then \
read_history on a hit.";

/// `search_history` arguments.
#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct SearchArgs {
    /// Words to find; an exact phrase in double quotes.
    query: String,
    /// A session id; by default the newest session of this project (the current one);
    /// "all" searches every session of this project.
    #[serde(default)]
    session: Option<String>,
    /// Most hits (default 10, at most 50).
    #[serde(default)]
    limit: Option<u32>,
    /// Only records from before the session's latest compaction (what you no longer see).
    #[serde(default)]
    before_compaction_only: Option<bool>,
}

/// `read_history` arguments.
#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct ReadArgs {
    /// The session, as the hit names it (default: this project's newest).
    #[serde(default)]
    session: Option<String>,
    /// The record's uuid, as the hit names it.
    uuid: String,
    /// Records before it to show too (default 2, at most 50).
    #[serde(default)]
    before: Option<u32>,
    /// Records after it to show too (default 2, at most 50).
    #[serde(default)]
    after: Option<u32>,
}

/// A hit as the model reads it.
#[derive(Debug, Serialize)]
struct HitOut {
    session: String,
    uuid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<String>,
    role: &'static str,
    before_compaction: bool,
    snippet: String,
}

#[derive(Debug, Serialize)]
struct SearchOut {
    hits: Vec<HitOut>,
    sessions_searched: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
}

/// The MCP server: the history index and the project it serves.
#[derive(Debug, Clone)]
pub struct HistoryServer {
    history: Arc<History>,
    /// The working directory: its project's sessions are the default scope.
    cwd: PathBuf,
}

impl HistoryServer {
    pub fn new(history: Arc<History>, cwd: PathBuf) -> HistoryServer {
        HistoryServer { history, cwd }
    }

    fn scope(&self, session: Option<&str>) -> Result<Scope, HistoryError> {
        match session {
            None => self.history.newest_session(&self.cwd),
            Some(name) => self.history.scope(Some(name), Some(&self.cwd), Origin::Claude),
        }
    }

    /// `search_history`, as the text the model reads.
    pub fn search(&self, args: &serde_json::Map<String, serde_json::Value>) -> Result<String, String> {
        let args: SearchArgs = parse(args)?;
        let scope = self.scope(args.session.as_deref()).map_err(|e| e.to_string())?;
        let limit = args.limit.map_or(history::DEFAULT_LIMIT, |l| (l as usize).clamp(1, history::MAX_LIMIT));
        let found = self
            .history
            .search(&SearchRequest {
                query: &args.query,
                sources: &scope.sources,
                preferred: scope.preferred.as_deref(),
                limit,
                before_compaction_only: args.before_compaction_only.unwrap_or(false),
            })
            .map_err(|e| e.to_string())?;
        let out = SearchOut {
            hits: found
                .hits
                .into_iter()
                .map(|h| HitOut {
                    session: h.source.session,
                    uuid: h.uuid,
                    timestamp: h.timestamp,
                    role: h.role.as_str(),
                    before_compaction: h.before_compaction,
                    snippet: h.snippet,
                })
                .collect(),
            sessions_searched: scope.sources.len(),
            notes: found.notes,
        };
        serde_json::to_string_pretty(&out).map_err(|e| e.to_string())
    }

    /// `read_history`, as the text the model reads.
    pub fn read(&self, args: &serde_json::Map<String, serde_json::Value>) -> Result<String, String> {
        let args: ReadArgs = parse(args)?;
        let source = match args.session.as_deref() {
            None => self.history.newest_session(&self.cwd).map_err(|e| e.to_string())?.sources.remove(0),
            Some(name) => self.history.session(name, Origin::Claude).map_err(|e| e.to_string())?,
        };
        let count = |n: Option<u32>| n.map_or(history::DEFAULT_NEIGHBOURS, |n| n as usize);
        let read = self
            .history
            .read(&source, &args.uuid, count(args.before), count(args.after), history::DEFAULT_READ_CHARS)
            .map_err(|e| e.to_string())?;
        let mut out = format!("session {} ({} records shown)\n", source.session, read.records.len());
        for r in &read.records {
            out.push_str(&format!(
                "\n--- {} {}{}{}{}\n",
                r.uuid,
                r.role.as_str(),
                r.timestamp.as_deref().map(|t| format!(" {t}")).unwrap_or_default(),
                if r.before_compaction { " [before compaction]" } else { "" },
                if r.target { " [the record asked for]" } else { "" },
            ));
            out.push_str(&r.text);
            out.push('\n');
        }
        if let Some(note) = &read.truncated {
            out.push_str(&format!("\n[{note}]\n"));
        }
        Ok(out)
    }

    fn tools() -> Vec<Tool> {
        let read_only = ToolAnnotations::new().read_only(true).destructive(false).idempotent(true).open_world(false);
        vec![
            Tool::new(SEARCH_TOOL, SEARCH_DESCRIPTION, rmcp::handler::server::common::schema_for_type::<SearchArgs>())
                .with_annotations(read_only.clone()),
            Tool::new(READ_TOOL, READ_DESCRIPTION, rmcp::handler::server::common::schema_for_type::<ReadArgs>())
                .with_annotations(read_only),
        ]
    }
}

fn parse<T: serde::de::DeserializeOwned>(args: &serde_json::Map<String, serde_json::Value>) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::Object(args.clone())).map_err(|e| format!("invalid arguments: {e}"))
}

impl ServerHandler for HistoryServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("ctxd", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(HistoryServer::tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        HistoryServer::tools().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        if name != SEARCH_TOOL && name != READ_TOOL {
            return Err(ErrorData::invalid_params(format!("unknown tool {name}"), None));
        }
        let args = request.arguments.unwrap_or_default();
        let server = self.clone();
        // The index and the transcripts are read on the blocking pool.
        let answer =
            tokio::task::spawn_blocking(
                move || {
                    if name == SEARCH_TOOL { server.search(&args) } else { server.read(&args) }
                },
            )
            .await
            .unwrap_or_else(|e| Err(format!("the tool failed: {e}")));
        // An error the model can read and act on, not a protocol error it never sees.
        Ok(match answer {
            Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Err(why) => CallToolResult::error(vec![ContentBlock::text(why)]),
        }
        .into())
    }
}

/// `ctxd mcp`: serves until the client closes stdin.
pub async fn run(state_dir: PathBuf, env: Arc<crate::process_env::ProcessEnv>) -> anyhow::Result<()> {
    let cwd = std::env::current_dir()?;
    let roots = history::Roots::new(&state_dir, &env);
    let history = Arc::new(tokio::task::spawn_blocking(move || History::open(&state_dir, roots)).await??);
    // Bring the project's sessions up to date while the client starts, so its first
    // search finds the index built.
    let warm = history.clone();
    let folder = history::sources::project_folder(&cwd);
    tokio::task::spawn_blocking(move || {
        let sources = warm.roots().claude_project(&folder);
        if let Err(e) = warm.refresh(&sources) {
            tracing::warn!(error = %e, "history index: the first update failed");
        }
    });
    let server = HistoryServer::new(history, cwd);
    let running = server.serve(rmcp::transport::stdio_pipes()).await?;
    running.waiting().await?;
    Ok(())
}
