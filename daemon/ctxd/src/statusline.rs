//! `ctxd statusline`: Claude Code's `statusLine` command. Reads the JSON Claude Code
//! passes on stdin (`transcript_path`, `model`, `context_window`, …) and prints one
//! line: model, context used and percent, tokens until auto-compact, level.
//!
//! What the program says about itself wins: `context_window.context_window_size` is the
//! window, `current_usage` the tokens and `used_percentage` the percent (of the whole
//! window, as the program counts). The transcript fills in what the input lacks. Before
//! the first turn there is no transcript yet: the line shows a zero state. Right after a
//! compaction, the tokens are the boundary's `postTokens` (the program's own count of
//! what it kept) unless the input carries a usage, and the line says "just compacted".
//!
//! It reads the transcript from its end, block by block, only until it meets the last
//! main-chain response that reported usage (or a compact boundary: right after a
//! compaction the old usage no longer counts, a mistake other status lines make). So its
//! cost depends on the size of the last turn, not of the transcript. The numbers come
//! from the same core functions as the daemon's (`Tally`, `budget`).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use ctxd_core::budget::{EnvConfig, Level, WindowInputs, resolve_window, thresholds};
use ctxd_core::record::{Kind, Record};
use ctxd_core::tally::Tally;
use serde::Deserialize;

/// The part of Claude Code's status-line input ctxd reads.
#[derive(Debug, Default, Deserialize)]
pub struct StatusInput {
    #[serde(default)]
    pub transcript_path: Option<String>,
    #[serde(default)]
    pub model: Option<ModelField>,
    #[serde(default)]
    pub context_window: Option<ContextWindowField>,
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
    /// The last response's usage (null before the first response and right after a
    /// compaction).
    #[serde(default)]
    pub current_usage: Option<ctxd_core::record::TokenUsage>,
    #[serde(default)]
    pub used_percentage: Option<f64>,
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
    for record in newest_first.iter().rev() {
        tally.observe(record);
    }
    // A skipped giant line came after the last report (the walk stops at a report).
    count_unparsed(&mut tally, skipped);
    Ok(TailUsage { tally, after_compaction, post_tokens, model })
}

enum Stop {
    Usage,
    Boundary(Option<u64>),
}

/// `compactMetadata.postTokens` of a boundary line.
pub fn post_tokens(line: &str) -> Option<u64> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Boundary {
        compact_metadata: Option<Metadata>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Metadata {
        post_tokens: Option<u64>,
    }
    serde_json::from_str::<Boundary>(line).ok()?.compact_metadata?.post_tokens
}

/// Looks at one line (newest first); says when the walk can stop.
fn consider(line: &[u8], newest_first: &mut Vec<Record>, model: &mut Option<String>) -> Option<Stop> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let record = std::str::from_utf8(line).ok().and_then(|t| Record::parse(t).ok())?;
    let head = record.head();
    if record.is_compact_boundary() {
        return Some(Stop::Boundary(post_tokens(record.line())));
    }
    let reported = head.kind == Kind::Assistant
        && head.usage.is_some()
        && !head.is_sidechain
        && !head.is_api_error
        && head.model.as_deref() != Some("<synthetic>");
    if reported && model.is_none() {
        *model = head.model.as_deref().map(str::to_owned);
    }
    newest_first.push(record);
    reported.then_some(Stop::Usage)
}

/// Builds the status line from the input JSON and the environment's budget overrides.
pub fn render(input: &StatusInput, env: &EnvConfig) -> String {
    let tail = input.transcript_path.as_deref().map(|p| tail_usage(Path::new(p)));
    let tail = match tail {
        Some(Ok(t)) => Some(t),
        // Before the first turn Claude Code names a transcript it has not written yet.
        Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => None,
        Some(Err(e)) => return format!("ctx: cannot read transcript ({e})"),
        None => None,
    };
    let (tally, after_compaction, post, transcript_model) = match tail {
        Some(t) => (t.tally, t.after_compaction, t.post_tokens, t.model),
        None => (Tally::default(), false, None, None),
    };
    let model_id =
        input.model.as_ref().and_then(|m| m.id.clone()).or(transcript_model).unwrap_or_else(|| "unknown".to_owned());
    let name = input.model.as_ref().and_then(|m| m.display_name.clone()).unwrap_or_else(|| model_id.clone());
    let host = input.context_window.as_ref();
    let host_window = host.and_then(|c| c.context_window_size).filter(|&w| w > 0);
    let inputs = WindowInputs { host_model_window: host_window, ..WindowInputs::default() };
    let resolved = resolve_window(&model_id, &inputs, env);
    if let Some(note) = &resolved.unknown_model {
        tracing::info!("{note}");
    }
    let levels = thresholds(&resolved, env, true);
    let host_tokens = host.and_then(|c| c.current_usage.as_ref()).map(ctxd_core::record::TokenUsage::request_tokens);
    let tokens = match (host_tokens, after_compaction) {
        (Some(t), _) => t,
        (None, true) => post.unwrap_or(0).max(tally.total()),
        (None, false) => tally.total(),
    };
    let percent = match (host.and_then(|c| c.used_percentage), host_window) {
        (Some(p), _) if host_tokens.is_some() && p.is_finite() => p,
        // The program's convention: a share of the whole window.
        (_, Some(w)) => (tokens as f64 / w as f64 * 1000.0).round() / 10.0,
        (_, None) => levels.percent_used(tokens),
    };
    let level = match levels.level(tokens) {
        Level::Ok => "ok",
        Level::Warning => "warning",
        Level::Blocked => "blocked",
    };
    let compacted = if after_compaction { " · just compacted" } else { "" };
    let until = if levels.shows_compact_figure {
        format!(" · {} to compact", short(levels.tokens_until_compact(tokens)))
    } else if !levels.auto_compact_enabled {
        " · auto-compact off".to_owned()
    } else {
        // The program makes no auto-compact decision for this model: no figure to show.
        String::new()
    };
    format!("{name} · ctx {} / {} ({percent:.1}%){until} · {level}{compacted}", short(tokens), short(levels.window))
}

/// 1234 → "1.2k", 1234567 → "1.23M", under 1000 as is.
fn short(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.2}M", n as f64 / 1e6),
    }
}

/// Reads the input from `stdin` text; bad input still gives a line, never a failure,
/// since Claude Code shows whatever the command prints. `env` is the budget overrides
/// `main` read from the environment.
pub fn run(stdin: &str, env: &EnvConfig) -> String {
    let input: StatusInput = serde_json::from_str(stdin).unwrap_or_default();
    render(&input, env)
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
        let line = render(&input_for(f.path()), &EnvConfig::default());
        assert_eq!(line, "Opus 4.6 · ctx 101.1k / 200.0k (56.2%) · 65.9k to compact · ok");
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
        let line = render(&input_for(f.path()), &EnvConfig::default());
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
        let line = render(&input_for(f.path()), &EnvConfig::default());
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
        // No input at all still prints a line.
        assert!(
            run("garbage", &EnvConfig::default()).starts_with("unknown · ctx 0"),
            "{}",
            run("garbage", &EnvConfig::default())
        );
        // A path that is not a readable file is still said plainly.
        let dir = tempfile::tempdir().unwrap();
        let not_a_file = run(&serde_json::json!({"transcript_path": dir.path()}).to_string(), &EnvConfig::default());
        assert!(not_a_file.contains("cannot read transcript"), "{not_a_file}");
    }

    #[test]
    fn before_the_first_turn_a_zero_state() {
        let input = serde_json::json!({
            "transcript_path": "/nonexistent/b7d55388.jsonl",
            "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"},
            "context_window": {"context_window_size": 1_000_000, "current_usage": null, "used_percentage": null},
        });
        let line = render(&serde_json::from_value(input).unwrap(), &EnvConfig::default());
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
        let line = render(&serde_json::from_value(input).unwrap(), &EnvConfig::default());
        assert_eq!(line, "Opus 5.5 · ctx 150.0k / 1.00M (15.0%) · 817.0k to compact · ok");
        // Without the program's figures the table knows the model: the same window.
        let bare = serde_json::json!({"transcript_path": f.path(), "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"}});
        let line = render(&serde_json::from_value(bare).unwrap(), &EnvConfig::default());
        assert_eq!(line, "Opus 5.5 · ctx 149.1k / 1.00M (15.2%) · 817.9k to compact · ok");
        // An unknown model takes the host's window.
        let unknown = serde_json::json!({
            "transcript_path": f.path(),
            "model": {"id": "claude-opus-7", "display_name": "Opus 7"},
            "context_window": {"context_window_size": 500_000},
        });
        let line = render(&serde_json::from_value(unknown).unwrap(), &EnvConfig::default());
        assert_eq!(line, "Opus 7 · ctx 149.1k / 500.0k (29.8%) · 317.9k to compact · ok");
    }

    #[test]
    fn no_compact_figure_where_the_program_makes_no_decision() {
        let f = transcript(&[user("a"), assistant("m1", 50_000)]);
        for (id, name) in [("claude-sonnet-4-5-20250929", "Sonnet 4.5"), ("claude-haiku-4-5", "Haiku 4.5")] {
            let input = serde_json::json!({"transcript_path": f.path(), "model": {"id": id, "display_name": name}});
            let line = render(&serde_json::from_value(input).unwrap(), &EnvConfig::default());
            assert_eq!(line, format!("{name} · ctx 50.1k / 200.0k (27.8%) · ok"));
        }
    }

    #[test]
    fn after_a_compaction_the_programs_post_tokens() {
        let boundary = r#"{"type":"system","subtype":"compact_boundary","uuid":"b","parentUuid":null,"compactMetadata":{"trigger":"manual","preTokens":25429,"postTokens":3258}}"#.to_owned();
        let summary =
            r#"{"type":"user","isCompactSummary":true,"message":{"role":"user","content":"short"}}"#.to_owned();
        let f = transcript(&[user("a"), assistant("m1", 25_000), boundary, summary]);
        let line = render(&input_for(f.path()), &EnvConfig::default());
        assert_eq!(line, "Opus 4.6 · ctx 3.3k / 200.0k (1.8%) · 163.7k to compact · ok · just compacted");
        // The program's current usage, when it gives one, wins.
        let mut input = input_for(f.path());
        input.context_window = Some(ContextWindowField {
            context_window_size: Some(200_000),
            current_usage: Some(ctxd_core::record::TokenUsage { input_tokens: 14_300, ..Default::default() }),
            used_percentage: Some(7.0),
        });
        let line = render(&input, &EnvConfig::default());
        assert_eq!(line, "Opus 4.6 · ctx 14.3k / 200.0k (7.0%) · 152.7k to compact · ok · just compacted");
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
        let line = render(&serde_json::from_value(input).unwrap(), &EnvConfig::default());
        assert_eq!(line, "Opus 5.5 · ctx 3.0k / 1.00M (0.3%) · 964.0k to compact · ok · just compacted");
        // The whole file: the turn after the compaction reported its usage.
        let f = transcript(&text.lines().map(str::to_owned).collect::<Vec<_>>());
        let line = render(&serde_json::from_value(serde_json::json!({"transcript_path": f.path(), "model": {"id": "claude-opus-5-5", "display_name": "Opus 5.5"}})).unwrap(), &EnvConfig::default());
        assert_eq!(line, "Opus 5.5 · ctx 13.9k / 1.00M (1.4%) · 953.0k to compact · ok");
    }
}
