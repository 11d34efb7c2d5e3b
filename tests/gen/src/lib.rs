//! Claude Code sessions for ctxd's tests and benchmarks, generated from a seed.
//!
//! A session is a chain of turns. Each turn is a user prompt, one to six agent steps
//! (an assistant message with some text and one or more `tool_use` blocks, then one user
//! record per `tool_result`), and a closing assistant reply. Tool results have a
//! heavy-tailed size (most a few kilobytes, a few near 200 KB); Reads carry the file in
//! `toolUseResult` the way Claude Code records it, and some files are read again or
//! edited later. Every assistant record carries `message.usage` whose total follows the
//! context's growth, so usage-based tools see a session that fills its window. With
//! [`Options::compact_at`] the session compacts itself when it passes that many tokens:
//! a `compact_boundary` record and a summary record, after which the context starts
//! again from the summary.
//!
//! The same [`Options`] always give the same bytes on a given platform (the random
//! numbers come from [`rng::Rng`], not from a crate that may change its algorithm).
//!
//! ```
//! let opts = ctxd_gen::Options { seed: 7, ..ctxd_gen::Options::turns(3) };
//! let text = ctxd_gen::jsonl(&opts);
//! assert_eq!(text, ctxd_gen::jsonl(&opts));
//! assert!(text.lines().count() > 6);
//! ```

pub mod rng;
mod text;
pub mod time;

use std::io::{self, Write};
use std::path::PathBuf;

use serde_json::{Map, Value, json};

use crate::rng::Rng;

/// Tokens of system prompt, tool definitions and memory before the first message.
pub const SYSTEM_TOKENS: u64 = 14_000;
/// Characters per token in the context estimate behind the generated usage.
pub const CHARS_PER_TOKEN: u64 = 4;
/// The default start of the session's clock.
pub const DEFAULT_START: &str = "2026-11-01T09:00:00Z";
/// The Claude Code version written on every record.
pub const CLAUDE_CODE_VERSION: &str = "2.1.0";

/// When the session ends (checked before each turn).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// After this many turns.
    Turns(usize),
    /// Once the estimated context reaches this many tokens.
    Tokens(u64),
    /// Once this many bytes are written.
    Bytes(u64),
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    pub until: Until,
    /// The session's working directory: files read live under it.
    pub cwd: String,
    pub model: String,
    /// The first record's clock, in milliseconds since the Unix epoch.
    pub start_ms: i64,
    /// Compact (a boundary and a summary) whenever a turn starts at or over this many tokens.
    pub compact_at: Option<u64>,
    /// Probability that an agent step calls two or three tools at once.
    pub parallel: f64,
    /// Probability that a Bash call fails (`is_error`).
    pub errors: f64,
    /// Also write every file that is read under this directory (at its path relative to
    /// `cwd`), with the content the session says it read.
    pub files_dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            seed: 1,
            until: Until::Turns(100),
            cwd: "/home/dev/project".to_owned(),
            model: "claude-sonnet-4-5-20250929".to_owned(),
            start_ms: time::parse_ms(DEFAULT_START).unwrap_or_default(),
            compact_at: None,
            parallel: 0.0,
            errors: 0.0,
            files_dir: None,
        }
    }
}

impl Options {
    /// Defaults, ending after `n` turns.
    pub fn turns(n: usize) -> Options {
        Options { until: Until::Turns(n), ..Options::default() }
    }

    /// Defaults, ending once the context reaches `tokens`.
    pub fn tokens(tokens: u64) -> Options {
        Options { until: Until::Tokens(tokens), ..Options::default() }
    }
}

/// What was written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub session_id: String,
    pub records: usize,
    pub bytes: u64,
    pub turns: usize,
    pub tool_calls: usize,
    pub boundaries: usize,
    /// The estimated context at the end (what the last usage reports).
    pub tokens: u64,
}

/// Writes the session as JSONL to `out`.
pub fn write(opts: &Options, out: &mut impl Write) -> io::Result<Stats> {
    let mut session = Session::new(opts, out);
    session.run()?;
    Ok(session.stats)
}

/// The session as JSONL text.
pub fn jsonl(opts: &Options) -> String {
    let mut out = Vec::new();
    // Writing to a Vec fails only with `files_dir` set and unwritable; the text so far
    // is still the session's beginning.
    let _ = write(opts, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// The session as parsed records.
pub fn records(opts: &Options) -> Vec<Value> {
    jsonl(opts).lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// A file the session has read: where, and what it held.
struct File {
    path: String,
    body: String,
}

/// One call of an agent step: the `tool_use` block, and the `tool_result` record's
/// content, error flag and `toolUseResult`.
struct Call {
    block: Value,
    result: String,
    is_error: bool,
    recorded: Value,
}

struct Session<'a, W: Write> {
    opts: &'a Options,
    out: &'a mut W,
    rng: Rng,
    session_id: String,
    clock_ms: i64,
    parent: Option<String>,
    context_chars: u64,
    files: Vec<File>,
    stats: Stats,
}

impl<'a, W: Write> Session<'a, W> {
    fn new(opts: &'a Options, out: &'a mut W) -> Self {
        let mut rng = Rng::new(opts.seed);
        let session_id = rng.uuid();
        let stats = Stats { session_id: session_id.clone(), ..Stats::default() };
        Session {
            opts,
            out,
            rng,
            session_id,
            clock_ms: opts.start_ms,
            parent: None,
            context_chars: 0,
            files: Vec::new(),
            stats,
        }
    }

    fn tokens(&self) -> u64 {
        SYSTEM_TOKENS + self.context_chars / CHARS_PER_TOKEN
    }

    fn done(&self) -> bool {
        match self.opts.until {
            Until::Turns(n) => self.stats.turns >= n,
            Until::Tokens(t) => self.tokens() >= t,
            Until::Bytes(b) => self.stats.bytes >= b,
        }
    }

    fn run(&mut self) -> io::Result<()> {
        while !self.done() {
            if self.opts.compact_at.is_some_and(|at| self.tokens() >= at) {
                self.compact()?;
            }
            self.turn()?;
        }
        self.stats.tokens = self.tokens();
        self.out.flush()
    }

    fn turn(&mut self) -> io::Result<()> {
        let prompt = text::prompt(&mut self.rng);
        self.context_chars += prompt.len() as u64;
        let at = self.tick(30, 600);
        self.emit(vec![("type", json!("user")), ("message", json!({"role": "user", "content": prompt}))], at)?;
        for _ in 0..self.rng.count(1, 6) {
            self.step()?;
        }
        let reply = text::sentences(&mut self.rng, 20, 200);
        self.assistant(vec![json!({"type": "text", "text": reply})], "end_turn")?;
        self.stats.turns += 1;
        Ok(())
    }

    /// An assistant message with tool calls, then one result record per call.
    fn step(&mut self) -> io::Result<()> {
        let n = if self.rng.chance(self.opts.parallel) { self.rng.count(2, 3) } else { 1 };
        let calls: Vec<Call> = (0..n).map(|_| self.call()).collect::<io::Result<_>>()?;
        let mut content = vec![json!({"type": "text", "text": text::sentences(&mut self.rng, 5, 30)})];
        content.extend(calls.iter().map(|c| c.block.clone()));
        self.assistant(content, "tool_use")?;
        for call in calls {
            self.context_chars += call.result.len() as u64;
            let mut result = json!({"tool_use_id": call.block["id"], "type": "tool_result", "content": call.result});
            if call.is_error {
                result["is_error"] = json!(true);
            }
            let at = self.tick(1, 30);
            self.emit(
                vec![
                    ("type", json!("user")),
                    ("message", json!({"role": "user", "content": [result]})),
                    ("toolUseResult", call.recorded),
                ],
                at,
            )?;
            self.stats.tool_calls += 1;
        }
        Ok(())
    }

    fn call(&mut self) -> io::Result<Call> {
        let id = format!("toolu_01{}", self.rng.hex(22));
        let size = text::result_size(&mut self.rng);
        // Reads are the most common call, as in a real coding session.
        let call = match *self.rng.pick(&["Read", "Read", "Read", "Bash", "Grep", "Edit", "Glob"]) {
            "Read" => self.read(size)?,
            "Bash" => self.bash(size),
            "Grep" => self.grep(size),
            "Edit" => self.edit(),
            _ => self.glob(size),
        };
        let (name, input) = call.0;
        Ok(Call {
            block: json!({"type": "tool_use", "id": id, "name": name, "input": input}),
            result: call.1,
            is_error: call.2,
            recorded: call.3,
        })
    }

    fn read(&mut self, size: usize) -> io::Result<ToolOutcome> {
        // A fifth of the reads look at a file again (unchanged on disk).
        let again = !self.files.is_empty() && self.rng.chance(0.2);
        let file = if again {
            self.rng.count(0, self.files.len() - 1)
        } else {
            let relative = text::source_path(&mut self.rng);
            let body = text::code(&mut self.rng, size);
            if let Some(dir) = &self.opts.files_dir {
                let full = dir.join(&relative);
                if let Some(parent) = full.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(full, &body)?;
            }
            self.files.push(File { path: format!("{}/{relative}", self.opts.cwd), body });
            self.files.len() - 1
        };
        let File { path, body } = &self.files[file];
        let lines: Vec<&str> = body.split('\n').collect();
        let numbered: Vec<String> = lines.iter().enumerate().map(|(i, l)| format!("{:>6}\u{2192}{l}", i + 1)).collect();
        let recorded = json!({"type": "text", "file": {
            "filePath": path, "content": body, "numLines": lines.len(), "startLine": 1, "totalLines": lines.len()
        }});
        Ok((("Read", json!({"file_path": path})), numbered.join("\n"), false, recorded))
    }

    fn bash(&mut self, size: usize) -> ToolOutcome {
        let command = text::command(&mut self.rng);
        let output = text::log(&mut self.rng, size);
        let input = json!({"command": command, "description": text::sentences(&mut self.rng, 2, 6)});
        if self.rng.chance(self.opts.errors) {
            let result = format!("Exit code 101\n{output}");
            return (("Bash", input), result.clone(), true, json!(format!("Error: {result}")));
        }
        let recorded = json!({"stdout": output, "stderr": "", "interrupted": false, "isImage": false});
        (("Bash", input), output, false, recorded)
    }

    fn grep(&mut self, size: usize) -> ToolOutcome {
        let pattern = text::word(&mut self.rng).to_owned();
        let (output, lines) = text::matches(&mut self.rng, size);
        let recorded = json!({"mode": "content", "numFiles": 0, "filenames": [], "content": output, "numLines": lines});
        (
            ("Grep", json!({"pattern": pattern, "path": self.opts.cwd, "output_mode": "content"})),
            output,
            false,
            recorded,
        )
    }

    fn glob(&mut self, size: usize) -> ToolOutcome {
        let names: Vec<String> = (0..(size / 50).max(1))
            .map(|_| format!("{}/{}", self.opts.cwd, text::source_path(&mut self.rng)))
            .collect();
        let recorded = json!({"filenames": names, "durationMs": self.rng.between(2, 90), "numFiles": names.len(), "truncated": false});
        (("Glob", json!({"pattern": "**/*.rs"})), names.join("\n"), false, recorded)
    }

    fn edit(&mut self) -> ToolOutcome {
        // Claude Code edits files it has read; now and then one it has not.
        let path = if !self.files.is_empty() && self.rng.chance(0.8) {
            self.files[self.rng.count(0, self.files.len() - 1)].path.clone()
        } else {
            format!("{}/{}", self.opts.cwd, text::source_path(&mut self.rng))
        };
        let old = text::phrase(&mut self.rng, 6);
        let new = text::phrase(&mut self.rng, 8);
        let result = format!(
            "The file {path} has been updated. Here's the result of running `cat -n` on a snippet of the edited file:\n{:>6}\u{2192}{new}",
            self.rng.between(1, 400)
        );
        let recorded =
            json!({"filePath": path, "oldString": old, "newString": new, "replaceAll": false, "userModified": false});
        (("Edit", json!({"file_path": path, "old_string": old, "new_string": new})), result, false, recorded)
    }

    /// An assistant record whose usage reports the context after it.
    fn assistant(&mut self, content: Vec<Value>, stop_reason: &str) -> io::Result<()> {
        let out_chars: u64 = content.iter().map(|c| c.to_string().len() as u64).sum();
        self.context_chars += out_chars;
        let total = self.tokens();
        let output = (out_chars / CHARS_PER_TOKEN).max(1);
        // Most of the prompt is a cache hit; what is new since the last call is written.
        let read = (total as f64 * (0.85 + 0.12 * self.rng.unit())) as u64;
        let created = total.saturating_sub(read + output + 3);
        let usage = json!({
            "input_tokens": 3,
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": created, "ephemeral_1h_input_tokens": 0},
            "output_tokens": output,
            "service_tier": "standard",
        });
        let message = json!({
            "model": self.opts.model,
            "id": format!("msg_01{}", self.rng.hex(22)),
            "type": "message",
            "role": "assistant",
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": null,
            "usage": usage,
        });
        let request = format!("req_011C{}", self.rng.hex(20));
        let at = self.tick(2, 40);
        self.emit(vec![("message", message), ("requestId", json!(request)), ("type", json!("assistant"))], at)
    }

    /// An automatic compaction: the boundary (which starts a new chain) and the summary
    /// the next context starts from.
    fn compact(&mut self) -> io::Result<()> {
        let before = self.tokens();
        let at = self.tick(5, 30);
        let logical_parent = self.parent.take();
        self.emit(
            vec![
                ("logicalParentUuid", json!(logical_parent)),
                ("type", json!("system")),
                ("subtype", json!("compact_boundary")),
                ("content", json!("Conversation compacted")),
                ("isMeta", json!(false)),
                ("level", json!("info")),
                ("compactMetadata", json!({"trigger": "auto", "preTokens": before})),
            ],
            at,
        )?;
        let summary = format!(
            "This session is being continued from a previous conversation that ran out of context. \
             The summary below covers the earlier portion of the conversation.\n\nSummary:\n{}",
            text::sentences(&mut self.rng, 1_200, 1_800)
        );
        self.context_chars = summary.len() as u64;
        let at = self.tick(1, 2);
        self.emit(
            vec![
                ("type", json!("user")),
                ("message", json!({"role": "user", "content": summary})),
                ("isVisibleInTranscriptOnly", json!(true)),
                ("isCompactSummary", json!(true)),
            ],
            at,
        )?;
        self.stats.boundaries += 1;
        Ok(())
    }

    /// Advances the clock by `lo..=hi` seconds (and some milliseconds); the new time.
    fn tick(&mut self, lo: u64, hi: u64) -> i64 {
        let ms = self.rng.between(lo * 1_000, hi * 1_000 + 999);
        self.clock_ms += i64::try_from(ms).unwrap_or(i64::MAX);
        self.clock_ms
    }

    /// Writes one record: the fields every Claude Code line starts with, then `fields`,
    /// then its uuid and timestamp. The record becomes the parent of the next.
    fn emit(&mut self, fields: Vec<(&str, Value)>, at_ms: i64) -> io::Result<()> {
        let uuid = self.rng.uuid();
        let mut record = Map::new();
        record.insert("parentUuid".into(), json!(self.parent));
        record.insert("isSidechain".into(), json!(false));
        record.insert("userType".into(), json!("external"));
        record.insert("cwd".into(), json!(self.opts.cwd));
        record.insert("sessionId".into(), json!(self.session_id));
        record.insert("version".into(), json!(CLAUDE_CODE_VERSION));
        record.insert("gitBranch".into(), json!("main"));
        for (key, value) in fields {
            record.insert(key.into(), value);
        }
        record.insert("uuid".into(), json!(uuid));
        record.insert("timestamp".into(), json!(time::format_ms(at_ms)));
        let mut line = serde_json::to_vec(&Value::Object(record))?;
        line.push(b'\n');
        self.out.write_all(&line)?;
        self.stats.records += 1;
        self.stats.bytes += line.len() as u64;
        self.parent = Some(uuid);
        Ok(())
    }
}

/// A tool's name and input, its result text, whether it failed, and its `toolUseResult`.
type ToolOutcome = ((&'static str, Value), String, bool, Value);

#[cfg(test)]
mod tests;
