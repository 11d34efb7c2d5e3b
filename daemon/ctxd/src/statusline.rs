//! `ctxd statusline`: Claude Code's `statusLine` command. Reads the JSON Claude Code
//! passes on stdin (`transcript_path`, `model`, `context_window`, `prompt_cache`, …) and
//! prints one line: model, context used and percent, tokens until auto-compact, level,
//! and the prompt cache (warm and for how long, or cold and what the next turn
//! re-writes, with its estimated price).
//!
//! What the program says about itself wins: `context_window.context_window_size` is the
//! window, `current_usage` the tokens, `prompt_cache` the cache. The percent is always of
//! the window printed, by the program's rule (a share of the whole window). The
//! transcript fills in what the input lacks; ctxd's gateway, when one runs for the
//! user, fills in the cache (and the tokens when nothing else has them), asked within
//! [`GATEWAY_DEADLINE`] and left out when it does not answer. Right after a compaction
//! Claude Code sends a usage of zeros: the tokens are then the boundary's `postTokens`
//! (the program's own count of what it kept) and the line says "just compacted". Before
//! the first turn there is no transcript yet: the line shows the baseline (system
//! prompt, tools, memory) the program reported for the newest earlier session of the
//! project on the same model, else zero. Input that is not Claude Code's JSON is said to
//! be so, never shown as a figure.
//!
//! It reads the transcript from its end, block by block, only until it meets the last
//! main-chain response that reported usage (or a compact boundary: right after a
//! compaction the old usage no longer counts, a mistake other status lines make). So its
//! cost depends on the size of the last turn, not of the transcript. The numbers come
//! from the same core functions as the daemon's (`Tally`, `budget`, `cache_state`).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::Duration;

use ctxd_core::budget::{EnvConfig, Level, WindowInputs, resolve_window, thresholds};
use ctxd_core::cache_state::{CacheState, FIVE_MINUTES_SECS, cache_state, prices_for, ttl_seconds};
use ctxd_core::record::{Kind, Record};
use ctxd_core::tally::Tally;
use serde::Deserialize;

use crate::gateway::client;
use crate::process_env::ProcessEnv;
use ctxd_proto::GatewaySession;

/// How long the status line waits for the gateway, connecting, asking and reading
/// together. Loopback answers in well under a millisecond; a gateway that is stuck
/// costs the line its cache figures, never Claude Code a pause.
pub const GATEWAY_DEADLINE: Duration = Duration::from_millis(100);

/// The part of Claude Code's status-line input ctxd reads.
#[derive(Debug, Default, Deserialize)]
pub struct StatusInput {
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub transcript_path: Option<String>,
    #[serde(default)]
    pub model: Option<ModelField>,
    #[serde(default)]
    pub context_window: Option<ContextWindowField>,
    /// Claude Code 2.1.332 and later, once the session has sent a request.
    #[serde(default)]
    pub prompt_cache: Option<PromptCacheField>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ModelField {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub display_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ContextWindowField {
    #[serde(default)]
    pub context_window_size: Option<u64>,
    /// The last response's usage: null before the first response, all zeros right after
    /// a compaction.
    #[serde(default)]
    pub current_usage: Option<ctxd_core::record::TokenUsage>,
}

/// Claude Code's own account of the session's prompt cache (`prompt_cache`).
#[derive(Debug, Default, Deserialize)]
pub struct PromptCacheField {
    #[serde(default)]
    pub warm: Option<bool>,
    /// `false` while no request has read or written the cache.
    #[serde(default)]
    pub caching_observed: Option<bool>,
    /// `"5m"` or `"1h"`.
    #[serde(default)]
    pub ttl: Option<String>,
    /// Unix seconds at which the cache goes cold; null without caching.
    #[serde(default)]
    pub expires_at: Option<i64>,
    /// The last request's input tokens; null when the program expects the next prefix
    /// to differ anyway (a compaction).
    #[serde(default)]
    pub recache_tokens_if_cold: Option<u64>,
}

/// Bytes read by the first step backwards: a status line is usually asked for right
/// after a response, so its usage is in the last few kilobytes. Each further step reads
/// twice as much, up to `MAX_BLOCK`.
const FIRST_BLOCK: u64 = 8 * 1024;
const MAX_BLOCK: u64 = 1024 * 1024;
/// Give up looking for a reported usage after this much of the tail (then estimate).
const MAX_TAIL: u64 = 64 * 1024 * 1024;
/// A line longer than this is not parsed: its bytes are counted as message content
/// (an estimate, [`count_unparsed`]) and the walk goes on before it, so one giant
/// message cannot hide the usage reported before it. The observer's follower keeps no
/// more of a line either.
pub(crate) const MAX_LINE: usize = 16 * 1024 * 1024;

/// Counts a line too long to parse ([`MAX_LINE`]) by its size, as message content.
pub(crate) fn count_unparsed(tally: &mut Tally, bytes: u64) {
    tally.bytes_after += bytes;
}

/// What the tail of a transcript says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailUsage {
    pub tally: Tally,
    /// A compact boundary came after the last reported usage.
    pub after_compaction: bool,
    /// That boundary's `compactMetadata.postTokens`.
    pub post_tokens: Option<u64>,
    /// Model named by the last response, if any.
    pub model: Option<String>,
    /// The walk found a response that reported usage (else the tally is all estimate).
    pub reported: bool,
}

/// Reads the transcript backwards until the last main-chain usage or compact boundary.
pub fn tail_usage(path: &Path) -> std::io::Result<TailUsage> {
    let (mut file, len) = crate::outside::open_regular(path)?;
    let mut pos = len;
    // Lines collected newest first; `carry` is the partial line at the last block's start.
    let mut newest_first: Vec<Record> = Vec::new();
    let mut carry: Vec<u8> = Vec::new();
    let mut stop = None;
    let mut model = None;
    let mut step = FIRST_BLOCK;
    // Bytes of lines too long to parse (skipped, counted by size), and whether the walk
    // is inside one now.
    let (mut skipped, mut skipping) = (0u64, false);
    'blocks: while pos > 0 && len - pos - skipped < MAX_TAIL {
        let start = pos.saturating_sub(step);
        step = (step * 2).min(MAX_BLOCK);
        let want = pos - start;
        // Read into spare capacity (no zeroing) with room for the carried partial line.
        let mut block = Vec::with_capacity(want as usize + carry.len());
        file.seek(SeekFrom::Start(start))?;
        (&mut file).take(want).read_to_end(&mut block)?;
        if block.len() as u64 != want {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        block.extend_from_slice(&carry);
        pos = start;
        let mut end = block.len();
        if skipping {
            // Inside a giant line: only its start (the previous line break) matters.
            match memchr::memrchr(b'\n', &block) {
                Some(nl) => {
                    skipped += (block.len() - nl - 1) as u64;
                    skipping = false;
                    end = nl;
                }
                None => {
                    skipped += block.len() as u64;
                    carry = Vec::new();
                    continue;
                }
            }
        }
        // Whole lines, newest first; what precedes the block's first line break is the
        // end of a line that starts in an earlier block (or the file's first line).
        while let Some(nl) = memchr::memrchr(b'\n', &block[..end]) {
            if let Some(found) = consider(&block[nl + 1..end], &mut newest_first, &mut model) {
                stop = Some(found);
                break 'blocks;
            }
            end = nl;
        }
        block.truncate(end);
        carry = block;
        if carry.len() > MAX_LINE {
            skipped += carry.len() as u64;
            skipping = true;
            carry = Vec::new();
        }
        if pos == 0 && !skipping {
            stop = consider(&carry, &mut newest_first, &mut model);
        }
    }
    let mut tally = Tally::default();
    let (after_compaction, post_tokens) = match stop {
        Some(Stop::Boundary(post)) => (true, post),
        _ => (false, None),
    };
    let reported = matches!(stop, Some(Stop::Usage));
    for record in newest_first.iter().rev() {
        tally.observe(record);
    }
    // A skipped giant line came after the last report (the walk stops at a report).
    count_unparsed(&mut tally, skipped);
    Ok(TailUsage { tally, after_compaction, post_tokens, model, reported })
}

enum Stop {
    Usage,
    Boundary(Option<u64>),
}

/// Looks at one line (newest first); says when the walk can stop.
fn consider(line: &[u8], newest_first: &mut Vec<Record>, model: &mut Option<String>) -> Option<Stop> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let record = std::str::from_utf8(line).ok().and_then(|t| Record::parse(t).ok())?;
    let head = record.head();
    if record.is_compact_boundary() {
        return Some(Stop::Boundary(ctxd_core::observed::post_tokens(record.line())));
    }
    let reported = is_reported_response(&record);
    if reported && model.is_none() {
        *model = head.model.as_deref().map(str::to_owned);
    }
    newest_first.push(record);
    reported.then_some(Stop::Usage)
}

/// Whether a line is a response whose usage counts for the main conversation.
fn is_reported_response(record: &Record) -> bool {
    let head = record.head();
    head.kind == Kind::Assistant
        && head.usage.is_some()
        && !head.is_sidechain
        && !head.is_api_error
        && head.model.as_deref() != Some("<synthetic>")
}

/// Where the tokens on the line come from, when it matters to the reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokensFrom {
    /// The program's input, the transcript or the gateway: this session's own figure.
    Session,
    /// Nothing of this session yet: the baseline of an earlier session of the project.
    Baseline,
}

/// Builds the status line. `now_ms` is the time (Unix milliseconds); `gateway` asks
/// ctxd's gateway for a session's figures (called at most once, and only for what the
/// input and the transcript lack).
pub fn render(
    input: &StatusInput,
    env: &EnvConfig,
    now_ms: i64,
    gateway: &mut dyn FnMut(&str) -> Option<GatewaySession>,
) -> String {
    let path = input.transcript_path.as_deref().map(Path::new);
    let tail = match path.map(tail_usage) {
        Some(Ok(t)) => Some(t),
        // Before the first turn Claude Code names a transcript it has not written yet.
        Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => None,
        Some(Err(e)) => return format!("ctx: cannot read transcript ({e})"),
        None => None,
    };
    let transcript_model = tail.as_ref().and_then(|t| t.model.clone());
    let host = input.context_window.as_ref();
    // Zeros are no figure: the program sends them right after a compaction.
    let host_tokens = host
        .and_then(|c| c.current_usage.as_ref())
        .map(ctxd_core::record::TokenUsage::request_tokens)
        .filter(|&tokens| tokens > 0);
    let after_compaction = tail.as_ref().is_some_and(|t| t.after_compaction);
    let transcript_reported = tail.as_ref().is_some_and(|t| t.reported);

    let session_id = input.session_id.as_deref().filter(|id| !id.is_empty());
    // A cold cache is when a prepared summary matters: only the gateway knows of one.
    let program_cold = input.prompt_cache.as_ref().and_then(|p| program_cache(p, now_ms, "")).is_some_and(|c| !c.warm);
    let needs_gateway = input.prompt_cache.is_none()
        || program_cold
        || (host_tokens.is_none() && !after_compaction && !transcript_reported);
    let live = match session_id {
        Some(id) if needs_gateway => gateway(id),
        _ => None,
    };
    let model_id = input
        .model
        .as_ref()
        .and_then(|m| m.id.clone())
        .or(transcript_model)
        .or_else(|| live.as_ref().map(|l| l.model.clone()).filter(|m| !m.is_empty()))
        .unwrap_or_else(|| "unknown".to_owned());
    let name = input.model.as_ref().and_then(|m| m.display_name.clone()).unwrap_or_else(|| model_id.clone());
    let host_window = host.and_then(|c| c.context_window_size).filter(|&w| w > 0);
    let inputs = WindowInputs { host_model_window: host_window, ..WindowInputs::default() };
    let resolved = resolve_window(&model_id, &inputs, env);
    if let Some(note) = &resolved.unknown_model {
        tracing::info!("{note}");
    }
    let levels = thresholds(&resolved, env, true);

    let estimated_after = tail.as_ref().map_or(0, |t| t.tally.total());
    let (tokens, from) = if let Some(tokens) = host_tokens {
        (tokens, TokensFrom::Session)
    } else if let Some(t) = tail.as_ref().filter(|t| t.after_compaction) {
        (t.post_tokens.unwrap_or(0).max(t.tally.total()), TokensFrom::Session)
    } else if transcript_reported {
        (estimated_after, TokensFrom::Session)
    } else if let Some(usage) = live.as_ref().map(client::token_usage).filter(|u| u.request_tokens() > 0) {
        (usage.request_tokens().saturating_add(usage.output_tokens), TokensFrom::Session)
    } else {
        match path.and_then(|p| sibling_baseline(p, &model_id)) {
            // What is already written of this session (its first prompt) comes on top.
            Some(baseline) => (baseline.saturating_add(estimated_after), TokensFrom::Baseline),
            None => (estimated_after, TokensFrom::Session),
        }
    };
    let percent = levels.percent_used(tokens);
    let level = match levels.level(tokens) {
        Level::Ok => "ok",
        Level::Warning => "warning",
        Level::Blocked => "blocked",
    };
    let until = if levels.shows_compact_figure {
        format!(" · {} to compact", short(levels.tokens_until_compact(tokens)))
    } else if !levels.auto_compact_enabled {
        " · auto-compact off".to_owned()
    } else {
        // The program makes no auto-compact decision for this model: no figure to show.
        String::new()
    };
    let mut line =
        format!("{name} · ctx {} / {} ({percent:.1}%){until} · {level}", short(tokens), short(levels.window));
    if after_compaction {
        line.push_str(" · just compacted");
    }
    if from == TokensFrom::Baseline {
        line.push_str(" · new session");
    }
    let cache = match &input.prompt_cache {
        Some(program) => program_cache(program, now_ms, &model_id),
        None => live.as_ref().and_then(|l| client::cache_state(l, now_ms, &model_id)),
    };
    if let Some(cache) = cache {
        line.push_str(" · ");
        line.push_str(&cache_text(&cache, live.as_ref().is_some_and(|l| l.summary_ready)));
    }
    line
}

/// The cache state from Claude Code's own `prompt_cache`; `None` while no request has
/// used the cache.
fn program_cache(program: &PromptCacheField, now_ms: i64, model_id: &str) -> Option<CacheState> {
    if program.caching_observed == Some(false) {
        return None;
    }
    let expires_ms = program.expires_at?.checked_mul(1_000)?;
    let ttl = program.ttl.as_deref().and_then(ttl_seconds).unwrap_or(FIVE_MINUTES_SECS);
    let last_ms = expires_ms.saturating_sub(i64::try_from(ttl * 1_000).unwrap_or(i64::MAX));
    // The program already found it cold: so it is, whatever the clocks say.
    let now_ms = if program.warm == Some(false) { now_ms.max(expires_ms) } else { now_ms };
    let tokens = program.recache_tokens_if_cold.filter(|&t| t > 0);
    Some(cache_state(now_ms, last_ms, ttl, tokens, prices_for(model_id)))
}

/// "cache warm (cold in 4m)", "cache cold: next turn re-writes 612.0k tokens (~$3.06)",
/// and once cold with a summary ready (`summary_ready`, the gateway's word) the fix:
/// "; /compact is instant (summary ready)". The editors say the same.
fn cache_text(cache: &CacheState, summary_ready: bool) -> String {
    if cache.warm {
        let minutes = cache.seconds_left / 60;
        return if minutes == 0 {
            "cache warm (cold in <1m)".to_owned()
        } else {
            format!("cache warm (cold in {minutes}m)")
        };
    }
    let mut text = match (cache.recache_tokens, cache.recache_cost_usd) {
        (Some(tokens), Some(cost)) => {
            format!("cache cold: next turn re-writes {} tokens ({})", short(tokens), dollars(cost))
        }
        (Some(tokens), None) => format!("cache cold: next turn re-writes {} tokens", short(tokens)),
        (None, _) => "cache cold".to_owned(),
    };
    if summary_ready {
        text.push_str("; /compact is instant (summary ready)");
    }
    text
}

/// "~$3.06"; under a cent, "<$0.01".
fn dollars(usd: f64) -> String {
    if usd < 0.005 { "<$0.01".to_owned() } else { format!("~${usd:.2}") }
}

/// Most earlier transcripts of the project looked at for a baseline, newest first.
const BASELINE_SIBLINGS: usize = 3;
/// A project folder with more entries than this gets no baseline: finding the newest
/// costs a `stat` per entry (about 10 ms per thousand here), on every refresh.
const BASELINE_FOLDER_ENTRIES: usize = 2_000;
/// Bytes of an earlier transcript's head read looking for its first response.
const BASELINE_HEAD: u64 = 256 * 1024;

/// The program's baseline for a new session (system prompt, tools, memory: what its
/// first request carries before the first prompt): the first reported request of the
/// newest earlier transcript in the same project folder on the same model, less that
/// session's own prompts before it (estimated). `None` when no such transcript is there.
fn sibling_baseline(transcript: &Path, model_id: &str) -> Option<u64> {
    let folder = transcript.parent()?;
    let own = transcript.file_name()?;
    let entries: Vec<std::fs::DirEntry> =
        std::fs::read_dir(folder).ok()?.filter_map(Result::ok).take(BASELINE_FOLDER_ENTRIES + 1).collect();
    if entries.len() > BASELINE_FOLDER_ENTRIES {
        return None;
    }
    let mut siblings: Vec<(std::time::SystemTime, std::path::PathBuf)> = entries
        .into_iter()
        .filter(|entry| entry.file_name() != own && entry.path().extension().is_some_and(|e| e == "jsonl"))
        .filter_map(|entry| Some((entry.metadata().ok()?.modified().ok()?, entry.path())))
        .collect();
    siblings.sort_by_key(|entry| std::cmp::Reverse(entry.0));
    siblings.into_iter().take(BASELINE_SIBLINGS).find_map(|(_, path)| first_request_baseline(&path, model_id))
}

/// [`sibling_baseline`] of one transcript.
fn first_request_baseline(path: &Path, model_id: &str) -> Option<u64> {
    let (file, _) = crate::outside::open_regular(path).ok()?;
    let mut head = Vec::with_capacity(BASELINE_HEAD as usize);
    file.take(BASELINE_HEAD).read_to_end(&mut head).ok()?;
    let mut prompts = 0u64;
    // The last line may be cut by the read: only whole lines count.
    for line in head.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let Some(record) = std::str::from_utf8(line).ok().and_then(|t| Record::parse(t).ok()) else { continue };
        let h = record.head();
        if h.kind == Kind::User && !h.is_meta && !h.is_sidechain && !h.is_compact_summary {
            prompts += u64::from(h.content_bytes).div_ceil(ctxd_core::tally::BYTES_PER_TOKEN);
        }
        if is_reported_response(&record) {
            let same_model = h.model.as_deref().is_none_or(|m| m == model_id || model_id == "unknown");
            let usage = h.usage?;
            return same_model.then(|| usage.request_tokens().saturating_sub(prompts));
        }
    }
    None
}

/// 1234 → "1.2k", 1234567 → "1.23M", under 1000 as is.
fn short(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.2}M", n as f64 / 1e6),
    }
}

/// The input as Claude Code sends it, or the line that says it is not.
pub fn parse_input(stdin: &str) -> Result<StatusInput, String> {
    if stdin.trim().is_empty() {
        return Err("ctx: no status line input (Claude Code passes the session as JSON on stdin)".to_owned());
    }
    serde_json::from_str(stdin).map_err(|e| format!("ctx: cannot read the status line input: {e}"))
}

/// The status line for `stdin`: a figure for Claude Code's input, a plain sentence for
/// anything else, never a failure (Claude Code shows whatever the command prints).
/// `env` gives the budget overrides and where the gateway listens.
pub fn run(stdin: &str, env: &ProcessEnv) -> String {
    let input = match parse_input(stdin) {
        Ok(input) => input,
        Err(line) => return line,
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    // No owner check here (it reads /proc/net/tcp, ~10 ms on a busy machine, on every
    // refresh): the request names nothing (the session is picked from the list here),
    // and the answer is only shown.
    let mut gateway = |session_id: &str| {
        let (addr, _) = client::listen_address(env);
        client::session(addr, session_id, GATEWAY_DEADLINE)
    };
    render(&input, env.budget(), now_ms, &mut gateway)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn transcript(lines: &[String]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for l in lines {
            writeln!(f, "{l}").unwrap();
        }
        f
    }

    fn assistant(id: &str, input: u64) -> String {
        format!(
            r#"{{"type":"assistant","message":{{"id":"{id}","model":"claude-sonnet-4-5-20250929","content":[{{"type":"text","text":"x"}}],"usage":{{"input_tokens":{input},"output_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}}}}"#
        )
    }

    fn user(text: &str) -> String {
        format!(r#"{{"type":"user","message":{{"role":"user","content":"{text}"}}}}"#)
    }

    /// A fixed "now" for the tests (2026-11-29T21:20:00Z).
    const NOW: i64 = 1_796_073_600_000;

    fn status(input: &StatusInput) -> String {
        render(input, &EnvConfig::default(), NOW, &mut |_| None)
    }

    fn input_for(path: &Path) -> StatusInput {
        serde_json::from_value(serde_json::json!({"transcript_path": path, "model": {"id": "claude-opus-4-6", "display_name": "Opus 4.6"}})).unwrap()
    }

    #[test]
    fn last_usage_plus_what_follows() {
        let f = transcript(&[
            user("a"),
            assistant("m1", 50_000),
            user(&"y".repeat(3998)),
            assistant("m2", 100_000),
            user(&"z".repeat(3998)),
        ]);
        let tail = tail_usage(f.path()).unwrap();
        assert_eq!(tail.tally.reported, 100_100);
        assert_eq!(tail.tally.estimated(), 1_000);
        assert!(!tail.after_compaction);
        let line = status(&input_for(f.path()));
        assert_eq!(line, "Opus 4.6 · ctx 101.1k / 200.0k (50.6%) · 65.9k to compact · ok");
    }

    #[test]
    fn right_after_a_compaction_the_old_usage_does_not_count() {
        let boundary = r#"{"type":"system","subtype":"compact_boundary","uuid":"b","parentUuid":null,"compactMetadata":{"trigger":"auto","preTokens":170000}}"#.to_owned();
        let summary = format!(
            r#"{{"type":"user","isCompactSummary":true,"message":{{"role":"user","content":"{}"}}}}"#,
            "s".repeat(39_998)
        );
        let f = transcript(&[user("a"), assistant("m1", 170_000), boundary, summary]);
        let tail = tail_usage(f.path()).unwrap();
        assert!(tail.after_compaction);
        assert_eq!(tail.tally.total(), 10_000);
        let line = status(&input_for(f.path()));
        assert!(line.contains("ctx 10.0k / 200.0k"), "{line}");
        assert!(line.ends_with("just compacted"), "{line}");
    }

    #[test]
    fn reads_only_the_tail_of_a_long_transcript() {
        // 40 MB of old turns, then the last response: found without reading them all.
        let mut lines: Vec<String> = (0..10_000).map(|i| assistant(&format!("old{i}"), 1_000)).collect();
        let filler = user(&"q".repeat(4_000));
        lines.extend(std::iter::repeat_n(filler, 10_000));
        lines.push(assistant("last", 42_000));
        let f = transcript(&lines);
        let tail = tail_usage(f.path()).unwrap();
        assert_eq!(tail.tally.total(), 42_100);
    }

    #[test]
    fn a_giant_last_line_is_counted_by_size_and_the_report_before_it_still_found() {
        // 80 MB in one line, more than the whole tail the walk reads.
        let giant = user(&"g".repeat(80 * 1024 * 1024));
        let f = transcript(&[user("a"), assistant("m1", 185_000), giant]);
        let tail = tail_usage(f.path()).unwrap();
        assert_eq!(tail.tally.reported, 185_100);
        assert!(tail.tally.estimated() > 20_000_000, "{}", tail.tally.estimated());
        let line = status(&input_for(f.path()));
        assert!(line.ends_with("blocked"), "{line}");
    }

    #[test]
    fn lines_longer_than_a_block_and_a_first_line_without_a_break() {
        // The response spans several blocks; what follows it too.
        let long = assistant("m1", 60_000).replace(r#""text":"x""#, &format!(r#""text":"{}""#, "x".repeat(300_000)));
        let f = transcript(&[user("a"), long.clone(), user(&"z".repeat(19_998))]);
        let tail = tail_usage(f.path()).unwrap();
        assert_eq!(tail.tally.reported, 60_100);
        assert_eq!(tail.tally.estimated(), 5_000);
        // The only line, without a final line break, longer than the first block.
        let only = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(only.path(), &long).unwrap();
        assert_eq!(tail_usage(only.path()).unwrap().tally.total(), 60_100);
    }

    #[test]
    fn split_responses_sidechains_and_garbage() {
        let side = r#"{"type":"assistant","isSidechain":true,"message":{"id":"s","model":"m","content":"x","usage":{"input_tokens":999999,"output_tokens":1}}}"#.to_owned();
        let f = transcript(&[assistant("m1", 30_000), assistant("m1", 30_000), "not json".to_owned(), side]);
        assert_eq!(tail_usage(f.path()).unwrap().tally.total(), 30_100);
        // A path that is not a readable file is said plainly.
        let dir = tempfile::tempdir().unwrap();
        let not_a_file = status(&serde_json::from_value(serde_json::json!({"transcript_path": dir.path()})).unwrap());
        assert!(not_a_file.contains("cannot read transcript"), "{not_a_file}");
    }

    #[test]
    fn input_that_is_not_claude_codes_json_is_said_to_be_so() {
        let env = ProcessEnv::from_pairs([("HOME", "/nonexistent")]);
        for (stdin, says) in [
            ("", "ctx: no status line input"),
            ("  \n", "ctx: no status line input"),
            ("garbage", "ctx: cannot read the status line input"),
            ("[1, 2]", "ctx: cannot read the status line input"),
            ("{\"transcript_path\": ", "ctx: cannot read the status line input"),
            ("{\"model\": 7}", "ctx: cannot read the status line input"),
        ] {
            let out = run(stdin, &env);
            assert!(out.starts_with(says), "{stdin:?}: {out}");
            assert!(!out.contains("ctx 0"), "{stdin:?}: {out}");
        }
    }

    #[test]
    fn before_the_first_turn_a_zero_state() {
        let input = serde_json::json!({
            "transcript_path": "/nonexistent/b7d55388.jsonl",
            "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"},
            "context_window": {"context_window_size": 1_000_000, "current_usage": null, "used_percentage": null},
        });
        let line = status(&serde_json::from_value(input).unwrap());
        assert_eq!(line, "Opus 5.5 · ctx 0 / 1.00M (0.0%) · 967.0k to compact · ok");
    }

    #[test]
    fn the_programs_own_window_usage_and_percent() {
        // 150k tokens on the 1M default model: 15 %, far from compacting.
        let f = transcript(&[user("a"), assistant("m1", 149_000)]);
        let input = serde_json::json!({
            "transcript_path": f.path(),
            "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"},
            "context_window": {
                "context_window_size": 1_000_000,
                "current_usage": {"input_tokens": 1_000, "output_tokens": 100, "cache_creation_input_tokens": 9_000, "cache_read_input_tokens": 140_000},
                "used_percentage": 15,
            },
        });
        let line = status(&serde_json::from_value(input).unwrap());
        assert_eq!(line, "Opus 5.5 · ctx 150.0k / 1.00M (15.0%) · 817.0k to compact · ok");
        // Without the program's figures the table knows the model: the same window.
        let bare = serde_json::json!({"transcript_path": f.path(), "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"}});
        let line = status(&serde_json::from_value(bare).unwrap());
        assert_eq!(line, "Opus 5.5 · ctx 149.1k / 1.00M (14.9%) · 817.9k to compact · ok");
        // An unknown model takes the host's window.
        let unknown = serde_json::json!({
            "transcript_path": f.path(),
            "model": {"id": "claude-opus-7", "display_name": "Opus 7"},
            "context_window": {"context_window_size": 500_000},
        });
        let line = status(&serde_json::from_value(unknown).unwrap());
        assert_eq!(line, "Opus 7 · ctx 149.1k / 500.0k (29.8%) · 317.9k to compact · ok");
    }

    #[test]
    fn no_compact_figure_where_the_program_makes_no_decision() {
        let f = transcript(&[user("a"), assistant("m1", 50_000)]);
        for (id, name) in [("claude-sonnet-4-5-20250929", "Sonnet 4.5"), ("claude-haiku-4-5", "Haiku 4.5")] {
            let input = serde_json::json!({"transcript_path": f.path(), "model": {"id": id, "display_name": name}});
            let line = status(&serde_json::from_value(input).unwrap());
            assert_eq!(line, format!("{name} · ctx 50.1k / 200.0k (25.1%) · ok"));
        }
    }

    #[test]
    fn after_a_compaction_the_programs_post_tokens() {
        let boundary = r#"{"type":"system","subtype":"compact_boundary","uuid":"b","parentUuid":null,"compactMetadata":{"trigger":"manual","preTokens":25429,"postTokens":3258}}"#.to_owned();
        let summary =
            r#"{"type":"user","isCompactSummary":true,"message":{"role":"user","content":"short"}}"#.to_owned();
        let f = transcript(&[user("a"), assistant("m1", 25_000), boundary, summary]);
        let line = status(&input_for(f.path()));
        assert_eq!(line, "Opus 4.6 · ctx 3.3k / 200.0k (1.6%) · 163.7k to compact · ok · just compacted");
        // The program's current usage, when it gives one, wins.
        let mut input = input_for(f.path());
        input.context_window = Some(ContextWindowField {
            context_window_size: Some(200_000),
            current_usage: Some(ctxd_core::record::TokenUsage { input_tokens: 14_300, ..Default::default() }),
        });
        let line = status(&input);
        assert_eq!(line, "Opus 4.6 · ctx 14.3k / 200.0k (7.2%) · 152.7k to compact · ok · just compacted");
    }

    /// Line `n` of the real program's status-line inputs (see `tests/fixtures/SOURCES.md`):
    /// 0 a new session, 1 and 2 after turns, 3 right after `/compact`, 4 the turn after.
    fn captured(n: usize) -> serde_json::Value {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/transcripts/claude-code-2.1.332/statusline-inputs.jsonl"
        ))
        .unwrap();
        serde_json::from_str(text.lines().nth(n).unwrap()).unwrap()
    }

    fn manual_compact_fixture() -> String {
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/transcripts/claude-code-2.1.332/manual-compact.jsonl"
        ))
        .unwrap()
    }

    fn expires_ms(input: &serde_json::Value) -> i64 {
        input["prompt_cache"]["expires_at"].as_i64().unwrap() * 1_000
    }

    fn no_gateway(_: &str) -> Option<GatewaySession> {
        panic!("the gateway is asked only for what the input lacks")
    }

    #[test]
    fn right_after_compact_the_programs_zeros_give_way_to_the_boundary() {
        // The real program's input right after `/compact` (usage all zeros), beside the
        // real transcript cut right after its `/compact`: the boundary's 3,0xx tokens,
        // not "ctx 0".
        let lines: Vec<String> = manual_compact_fixture().lines().take(79).map(str::to_owned).collect();
        let f = transcript(&lines);
        let mut input = captured(3);
        assert_eq!(input["context_window"]["current_usage"]["input_tokens"], 0);
        input["transcript_path"] = serde_json::json!(f.path());
        let now = expires_ms(&input) - 240_000;
        let line = render(&serde_json::from_value(input).unwrap(), &EnvConfig::default(), now, &mut no_gateway);
        assert_eq!(
            line,
            "Opus 5.5 · ctx 3.0k / 1.00M (0.3%) · 964.0k to compact · ok · just compacted · cache warm (cold in 4m)"
        );
    }

    #[test]
    fn a_new_session_shows_the_programs_baseline_from_the_projects_last_session() {
        // The project folder holds an earlier session whose first request reported
        // 12,881 tokens for a prompt of 69 bytes (18 tokens): the baseline is 12,863.
        let project = tempfile::tempdir().unwrap();
        std::fs::write(project.path().join("earlier.jsonl"), manual_compact_fixture()).unwrap();
        let mut input = captured(0);
        assert!(input["context_window"]["current_usage"].is_null() && input.get("prompt_cache").is_none());
        input["transcript_path"] = serde_json::json!(project.path().join("new-session.jsonl"));
        let line = render(&serde_json::from_value(input.clone()).unwrap(), &EnvConfig::default(), NOW, &mut |_| None);
        assert_eq!(line, "Opus 5.5 · ctx 12.9k / 1.00M (1.3%) · 954.1k to compact · ok · new session");
        // The first prompt, once written, comes on top (20,000 bytes: 5,000 tokens).
        std::fs::write(project.path().join("new-session.jsonl"), format!("{}\n", user(&"p".repeat(19_998)))).unwrap();
        let line = render(&serde_json::from_value(input.clone()).unwrap(), &EnvConfig::default(), NOW, &mut |_| None);
        assert!(line.starts_with("Opus 5.5 · ctx 17.9k / 1.00M (1.8%)"), "{line}");
        std::fs::remove_file(project.path().join("new-session.jsonl")).unwrap();
        // Another model's session is no baseline for this one.
        input["model"] = serde_json::json!({"id": "claude-opus-4-6", "display_name": "Opus 4.6"});
        let line = render(&serde_json::from_value(input).unwrap(), &EnvConfig::default(), NOW, &mut |_| None);
        assert!(line.starts_with("Opus 4.6 · ctx 0 /"), "{line}");
    }

    #[test]
    fn the_programs_cache_warm_then_cold_with_the_re_write_priced() {
        let mut input = captured(2);
        input.as_object_mut().unwrap().remove("transcript_path");
        let expires = expires_ms(&input);
        // The gateway is asked only once the cache is cold (for a summary ready); here
        // none answers.
        let at = |now: i64, input: &serde_json::Value| {
            let mut asked_warm = |_: &str| -> Option<GatewaySession> { panic!("asked while warm") };
            let mut none = |_: &str| None;
            let warm = input["prompt_cache"]["warm"] != false && now < expires;
            let gateway: &mut dyn FnMut(&str) -> Option<GatewaySession> =
                if warm { &mut asked_warm } else { &mut none };
            render(&serde_json::from_value(input.clone()).unwrap(), &EnvConfig::default(), now, gateway)
        };
        // 14,268 tokens on the program's input, its 5-minute cache just written.
        let warm = at(expires - 299_999, &input);
        assert_eq!(warm, "Opus 5.5 · ctx 14.3k / 1.00M (1.4%) · 952.7k to compact · ok · cache warm (cold in 5m)");
        assert!(at(expires - 239_000, &input).ends_with("cache warm (cold in 3m)"));
        assert!(at(expires - 30_000, &input).ends_with("cache warm (cold in <1m)"));
        // Cold: the whole prefix is written again at $5 per million (claude-opus-5-5).
        assert!(
            at(expires, &input).ends_with("cache cold: next turn re-writes 14.3k tokens (~$0.07)"),
            "{}",
            at(expires, &input)
        );
        // The program said cold: cold, whatever the clocks say.
        input["prompt_cache"]["warm"] = serde_json::json!(false);
        assert!(at(expires - 200_000, &input).contains("cache cold: next turn"), "{}", at(expires - 200_000, &input));
        // A model without a price: the tokens alone.
        input["model"] = serde_json::json!({"id": "claude-opus-9", "display_name": "Opus 9"});
        assert!(
            at(expires, &input).ends_with("cache cold: next turn re-writes 14.3k tokens"),
            "{}",
            at(expires, &input)
        );
        // Nothing cached yet: no cache figure.
        input["prompt_cache"]["caching_observed"] = serde_json::json!(false);
        assert!(!at(expires, &input).contains("cache"), "{}", at(expires, &input));
    }

    #[test]
    fn once_cold_the_gateways_ready_summary_is_the_fix() {
        // The real program's input after a turn, its cache gone cold: the gateway is
        // asked, and says whether a summary covering the session's newest request is
        // ready.
        let mut input = captured(2);
        input.as_object_mut().unwrap().remove("transcript_path");
        let expires = expires_ms(&input);
        let sid = input["session_id"].as_str().unwrap().to_owned();
        let figures = |ready: bool| GatewaySession {
            session_id: sid.clone(),
            model: "claude-opus-5-5".to_owned(),
            cache_read_input_tokens: 14_000,
            answered_at: ctxd_core::view::format_rfc3339_ms(expires - 300_000),
            cache_ttl_seconds: 300,
            summary_ready: ready,
            ..GatewaySession::default()
        };
        let line = |now: i64, ready: bool| {
            let mut asked = 0;
            let text = render(&serde_json::from_value(input.clone()).unwrap(), &EnvConfig::default(), now, &mut |_| {
                asked += 1;
                Some(figures(ready))
            });
            (text, asked)
        };
        let cold = "cache cold: next turn re-writes 14.3k tokens (~$0.07)";
        for (now, ready, ends, asked) in [
            (expires, true, format!("{cold}; /compact is instant (summary ready)"), 1),
            (expires + 3_600_000, true, format!("{cold}; /compact is instant (summary ready)"), 1),
            (expires, false, cold.to_owned(), 1),
            // Warm: a ready summary is no news, and the gateway is not asked.
            (expires - 60_000, true, "cache warm (cold in 1m)".to_owned(), 0),
        ] {
            let (text, n) = line(now, ready);
            assert!(text.ends_with(&format!(" · {ends}")), "{now} {ready}: {text}");
            assert_eq!(n, asked, "{text}");
        }
        // No gateway: today's cold line.
        let text =
            render(&serde_json::from_value(input.clone()).unwrap(), &EnvConfig::default(), expires, &mut |_| None);
        assert!(text.ends_with(&format!(" · {cold}")), "{text}");
        // The gateway's own cold cache says it the same way.
        let mut bare = input.clone();
        bare.as_object_mut().unwrap().remove("prompt_cache");
        let text = render(&serde_json::from_value(bare).unwrap(), &EnvConfig::default(), expires, &mut |_| {
            Some(figures(true))
        });
        assert!(
            text.ends_with(
                "cache cold: next turn re-writes 14.0k tokens (~$0.07); /compact is instant (summary ready)"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_gateways_cache_when_the_program_gives_none() {
        let mut input = captured(1);
        input.as_object_mut().unwrap().remove("prompt_cache");
        input.as_object_mut().unwrap().remove("transcript_path");
        let sid = input["session_id"].as_str().unwrap().to_owned();
        let mut asked = Vec::new();
        let answered = ctxd_core::view::format_rfc3339_ms(NOW - 6 * 60_000);
        let mut gateway = |id: &str| {
            asked.push(id.to_owned());
            Some(GatewaySession {
                session_id: id.to_owned(),
                model: "claude-opus-5-5".to_owned(),
                input_tokens: 1,
                cache_read_input_tokens: 12_000,
                cache_creation_input_tokens: 599_999,
                output_tokens: 8,
                answered_at: answered.clone(),
                cache_ttl_seconds: 300,
                requests: 3,
                ..GatewaySession::default()
            })
        };
        let line = render(&serde_json::from_value(input).unwrap(), &EnvConfig::default(), NOW, &mut gateway);
        assert_eq!(asked, vec![sid]);
        assert!(line.ends_with(" · cache cold: next turn re-writes 612.0k tokens (~$3.06)"), "{line}");
        // The program's own tokens still make the figure.
        assert!(line.starts_with("Opus 5.5 · ctx 14.2k / 1.00M"), "{line}");
    }

    #[test]
    fn the_captured_manual_compaction() {
        // The real program's transcript cut right after its `/compact` (the boundary, the
        // summary, the command lines and the re-attached files): its postTokens stand.
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/transcripts/claude-code-2.1.332/manual-compact.jsonl"
        ))
        .unwrap();
        let lines: Vec<String> = text.lines().take(79).map(str::to_owned).collect();
        let f = transcript(&lines);
        let input = serde_json::json!({"transcript_path": f.path(), "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"}, "context_window": {"context_window_size": 1_000_000}});
        let line = status(&serde_json::from_value(input).unwrap());
        assert_eq!(line, "Opus 5.5 · ctx 3.0k / 1.00M (0.3%) · 964.0k to compact · ok · just compacted");
        // The whole file: the turn after the compaction reported its usage.
        let f = transcript(&text.lines().map(str::to_owned).collect::<Vec<_>>());
        let line = status(&serde_json::from_value(serde_json::json!({"transcript_path": f.path(), "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"}})).unwrap());
        assert_eq!(line, "Opus 5.5 · ctx 13.9k / 1.00M (1.4%) · 953.0k to compact · ok");
    }
}
