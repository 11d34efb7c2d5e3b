//! `ctxd replay FILE.jsonl`: drives a transcript through a daemon over the real protocol,
//! record by record as a host would (each assistant reply preceded by the `ctx/assemble`
//! of the request it answers, which waits for a compaction running), and prints one
//! line per turn.
//!
//! The daemon runs in-process on an in-memory pipe with a temporary store (unless a
//! state directory is given), so the command needs no server, no key and no network.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use ctxd_core::record::{Kind, Record};
use ctxd_core::summary::thousands;
use serde_json::{Value, json};

use crate::client::RpcClient;
use crate::server::{ServeOptions, Server};
use crate::transport::{self, Limits};

/// What `ctxd replay` was asked to do.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub transcript: PathBuf,
    pub model: Option<String>,
    pub state_dir: Option<PathBuf>,
    /// The environment `main` read, for the in-process daemon.
    pub env: std::sync::Arc<crate::process_env::ProcessEnv>,
}

/// Runs the replay and writes its report to `out`.
pub async fn run(options: ReplayOptions, out: &mut dyn Write) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&options.transcript)
        .with_context(|| format!("cannot read {}", options.transcript.display()))?;
    let mut records = Vec::new();
    let mut skipped = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<serde_json::Map<String, Value>>(line) {
            Ok(object) => records.push(object),
            Err(e) => skipped.push(format!("line {}: {e}", n + 1)),
        }
    }
    let model =
        options.model.clone().or_else(|| first_model(&records)).unwrap_or_else(|| "claude-sonnet-4-5".to_owned());
    let cwd = records.iter().find_map(|r| r.get("cwd").and_then(Value::as_str)).unwrap_or("/").to_owned();

    let temp;
    let state_dir = match &options.state_dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::Builder::new().prefix("ctxd-replay-").tempdir_in(options.env.temp_dir())?;
            temp.path().to_owned()
        }
    };

    // The daemon, in-process, on an in-memory pipe.
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let (server_read, server_write) = tokio::io::split(server_io);
    let (server, outflow) =
        Server::new(ServeOptions { state_dir: state_dir.clone(), env: options.env.clone(), sharing: None });
    let daemon = tokio::spawn(transport::serve(
        server_read,
        server_write,
        std::sync::Arc::new(server),
        Limits::default(),
        outflow,
    ));
    let (client_read, client_write) = tokio::io::split(client_io);
    let client = RpcClient::new(client_read, client_write);

    client.request("initialize", json!({"capabilities": {}, "processId": null})).await?;
    client.notify("initialized", json!({})).await?;
    let opened = client.request("ctx/openSession", json!({"cwd": cwd, "model": model})).await?;
    let session_id = opened["sessionId"].as_str().unwrap_or_default().to_owned();
    let usage = &opened["usage"];
    writeln!(
        out,
        "replaying {} ({} records) · model {model} · window {} ({} usable, the rest kept for the reply) · compact at {} · warning at {} · blocked at {}",
        display_name(&options.transcript),
        records.len(),
        thousands(usage["window"].as_u64().unwrap_or(0)),
        thousands(usage["effectiveWindow"].as_u64().unwrap_or(0)),
        thousands(usage["threshold"].as_u64().unwrap_or(0)),
        thousands(usage["warning"].as_u64().unwrap_or(0)),
        thousands(usage["blocked"].as_u64().unwrap_or(0)),
    )?;
    for line in &skipped {
        writeln!(out, "skipped malformed {line}")?;
    }

    let mut turn = 0usize;
    let mut last_usage: Option<Value> = None;
    let (mut compactions, mut requests, mut own_records) = (0usize, 0usize, 0usize);
    // A compaction is under way: the latest append's answer said so and no announcement
    // of its end has been read since (the end can be announced before or after that
    // answer). Every append sets it anew.
    let mut running = false;
    for object in &records {
        let parsed = Record::from_object(object).ok();
        let starts_turn = parsed.as_ref().is_some_and(is_prompt);
        if starts_turn {
            if let Some(usage) = last_usage.take() {
                report(out, turn, &usage)?;
                // A host asks for its next request only once the compaction that is
                // running is installed; the next prompt starts from the compacted view.
                if running {
                    compactions += wait_for_compaction(&client, out).await?.installed;
                }
            }
            turn += 1;
        } else if object.get("type").and_then(Value::as_str) == Some("assistant") {
            // Each assistant record answers a model request: the host assembles it first
            // (which starts a compaction at the threshold) and sends it once a running
            // compaction is installed. One installed while assembling (a summary
            // prepared ahead) counts before the record goes in: the record's usage
            // no longer applies.
            let assembled =
                client.request("ctx/assemble", json!({"sessionId": session_id, "maxTokens": REPLY_TOKENS})).await?;
            requests += 1;
            let seen = announce_pending(&client, out).await?;
            compactions += seen.installed;
            if assembled["usage"]["level"] == "compacting" && !seen.ended {
                compactions += wait_for_compaction(&client, out).await?.installed;
            }
        }
        // After a compaction the transcript's recorded usage describes a context the
        // model no longer has (a live host would report smaller figures), so it is left
        // out and ctxd counts by estimate.
        let mut object = object.clone();
        if compactions > 0
            && let Some(Value::Object(message)) = object.get_mut("message")
        {
            message.remove("usage");
        }
        // ctxd's own bookkeeping records are written by the daemon, never appended: an
        // undo record is replayed as the `ctx/undoCompact` that wrote it (the daemon goes
        // back to the view before that compaction, as it did live); the others (and the
        // copies a compaction kept in view) are written again by the daemon as the replay reaches the same point.
        let own = parsed
            .as_ref()
            .and_then(ctxd_core::admit::own_kind)
            .or_else(|| object.contains_key(ctxd_core::compact::KEPT_FROM).then(String::new));
        let result = if parsed.as_ref().is_some_and(ctxd_core::compact::is_undo_record) {
            let undone = client.request("ctx/undoCompact", json!({"sessionId": session_id})).await?;
            writeln!(
                out,
                "      compaction undone: back to {} tokens",
                thousands(undone["usage"]["tokens"].as_u64().unwrap_or(0))
            )?;
            undone
        } else if own.is_some() {
            own_records += 1;
            continue;
        } else {
            client.request("ctx/append", json!({"sessionId": session_id, "records": [object]})).await?
        };
        last_usage = Some(result["usage"].clone());
        // Compactions run in the background; report each as it is announced.
        let seen = announce_pending(&client, out).await?;
        compactions += seen.installed;
        running = result["usage"]["level"] == "compacting" && !seen.ended;
    }
    if let Some(usage) = last_usage {
        report(out, turn, &usage)?;
        // A compaction still running at the end: wait for it, then show where it left
        // the session.
        if running && wait_for_compaction(&client, out).await?.installed > 0 {
            let now = client.request("ctx/usage", json!({"sessionId": session_id})).await?;
            report(out, turn, &now["usage"])?;
        }
    }
    if own_records > 0 {
        writeln!(out, "{own_records} of ctxd's own bookkeeping records left to the daemon, which writes its own")?;
    }
    write!(out, "{requests} model requests assembled")?;
    if compactions > 0 {
        write!(
            out,
            ", {compactions} compaction(s); the summaries were written by the built-in offline summarizer (no model, no network)"
        )?;
    }
    writeln!(out)?;
    client.request("ctx/closeSession", json!({"sessionId": session_id})).await?;
    client.request("shutdown", Value::Null).await?;
    client.notify("exit", Value::Null).await?;
    drop(client);
    let _ = daemon.await;
    Ok(())
}

fn first_model(records: &[serde_json::Map<String, Value>]) -> Option<String> {
    records
        .iter()
        .find_map(|r| r.get("message")?.get("model")?.as_str().filter(|m| !m.starts_with('<')).map(str::to_owned))
}

/// A turn starts at a user prompt: a user record that is not a tool result and not
/// meta.
fn is_prompt(record: &Record) -> bool {
    let head = record.head();
    if head.kind != Kind::User || head.is_meta || head.is_sidechain || head.is_compact_summary {
        return false;
    }
    let value = record.to_value();
    match &value["message"]["content"] {
        Value::String(_) => true,
        Value::Array(blocks) => !blocks.iter().any(|b| b["type"] == "tool_result"),
        _ => false,
    }
}

/// Compaction announcements read and reported.
#[derive(Debug, Default, Clone, Copy)]
struct Announced {
    /// Compactions installed.
    installed: usize,
    /// Whether any compaction ended (installed or failed).
    ended: bool,
}

/// Waits (up to a minute) for the running compaction to be announced and reports it.
async fn wait_for_compaction<W>(client: &RpcClient<W>, out: &mut dyn Write) -> anyhow::Result<Announced> {
    let mut notes = client.notifications.lock().await;
    let waited = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some((method, params)) = notes.recv().await {
            if method.as_str() == "ctx/compacted" || method.as_str() == "ctx/compactFailed" {
                return Some((method, params));
            }
        }
        None
    })
    .await;
    match waited {
        Ok(Some((method, params))) => announce(out, &method, &params),
        _ => {
            writeln!(out, "      compaction did not finish within 60 s")?;
            Ok(Announced::default())
        }
    }
}

/// Reports the compactions announced so far.
async fn announce_pending<W>(client: &RpcClient<W>, out: &mut dyn Write) -> anyhow::Result<Announced> {
    let mut notes = client.notifications.lock().await;
    let mut seen = Announced::default();
    while let Ok((method, params)) = notes.try_recv() {
        let one = announce(out, &method, &params)?;
        seen = Announced { installed: seen.installed + one.installed, ended: seen.ended || one.ended };
    }
    Ok(seen)
}

/// Prints a compaction notification (other notifications are ignored).
fn announce(out: &mut dyn Write, method: &str, params: &Value) -> anyhow::Result<Announced> {
    match method {
        "ctx/compacted" => {
            writeln!(
                out,
                "      compacted ({}): {} → {} tokens",
                params["trigger"].as_str().unwrap_or("?"),
                thousands(params["preTokens"].as_u64().unwrap_or(0)),
                thousands(params["postTokens"].as_u64().unwrap_or(0)),
            )?;
            Ok(Announced { installed: 1, ended: true })
        }
        "ctx/compactFailed" => {
            writeln!(out, "      compaction failed: {}", params["reason"].as_str().unwrap_or("?"))?;
            Ok(Announced { installed: 0, ended: true })
        }
        _ => Ok(Announced::default()),
    }
}

/// The reply cap of the requests replay assembles (a coding agent's usual output cap).
const REPLY_TOKENS: u64 = 32_000;

fn report(out: &mut dyn Write, turn: usize, usage: &Value) -> anyhow::Result<()> {
    let tokens = usage["tokens"].as_u64().unwrap_or(0);
    // `percentUsed` is of the whole window, as Claude Code counts.
    let window = usage["window"].as_u64().unwrap_or(0);
    writeln!(
        out,
        "turn {turn:>4}  {:>9} / {} tokens  {:>5.1}% used  {:>9} until compact  {}",
        thousands(tokens),
        thousands(window),
        usage["percentUsed"].as_f64().unwrap_or(0.0),
        thousands(usage["tokensUntilCompact"].as_u64().unwrap_or(0)),
        usage["level"].as_str().unwrap_or("?"),
    )?;
    Ok(())
}

fn display_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}
