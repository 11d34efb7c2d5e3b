//! The count of a transcript another program writes (Claude Code's, followed by
//! `ctx/observe`), folded one record at a time.
//!
//! It is the same accounting a session of ctxd's own keeps, fed from records ctxd did
//! not write: the [`Tally`] (last report plus the estimate after it), the
//! [`Composition`] of the messages since the boundary in force, the skills they
//! carry, and the files read. A compact boundary restarts the count with the
//! messages it keeps from before it (read back by the caller), and until the next
//! response reports usage its `postTokens` (the program's own count of what it kept)
//! is the floor of the figure, as `ctxd statusline` shows it.
//!
//! What a session of ctxd's own learns from `ctx/assemble` (the host's system blocks
//! and tools), a Claude Code transcript may say itself: the program writes the shape
//! of its requests (`api-request-shape`, its system blocks and tool definitions)
//! beside the messages. When it does, they are the [`Prefix`]'s system prompt and
//! tools; when it does not, they are unknown and left at zero, as for a host that has
//! not assembled yet.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::breakdown::{Breakdown, Composition, Prefix};
use crate::invoked::Invoked;
use crate::ledger::{Ledger, ReadMarker, file_read_in};
use crate::record::{Kind, Record};
use crate::tally::Tally;

/// `type` of the line Claude Code writes with the system blocks and tools of its
/// requests.
pub const REQUEST_SHAPE_TYPE: &str = "api-request-shape";

/// Bytes (JSON text) of the fixed parts of the program's latest request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestShape {
    pub system_bytes: u64,
    pub tools_bytes: u64,
}

impl RequestShape {
    /// The shape a line carries, when it is an `api-request-shape` line.
    pub fn of(record: &Record) -> Option<RequestShape> {
        let line = record.line();
        if record.head().kind != Kind::Other || !line.contains(REQUEST_SHAPE_TYPE) {
            return None;
        }
        #[derive(Deserialize)]
        struct Line<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            #[serde(borrow)]
            shape: Shape<'a>,
        }
        #[derive(Deserialize)]
        struct Shape<'a> {
            #[serde(borrow, default)]
            system: Option<&'a RawValue>,
            #[serde(borrow, default)]
            tools: Option<&'a RawValue>,
        }
        let parsed: Line<'_> = serde_json::from_str(line).ok()?;
        let size = |raw: Option<&RawValue>| raw.map_or(0, |r| r.get().len() as u64);
        (parsed.kind == REQUEST_SHAPE_TYPE)
            .then(|| RequestShape { system_bytes: size(parsed.shape.system), tools_bytes: size(parsed.shape.tools) })
    }
}

/// What ctxd knows of an observed transcript from the records folded in so far.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub tally: Tally,
    /// Message bytes by kind since the boundary in force, its kept messages included.
    pub composition: Composition,
    /// The latest boundary's `postTokens`, until a response reports usage.
    floor: Option<u64>,
    /// The model the latest response named.
    pub model: Option<String>,
    /// The working directory the records name (the first one seen).
    pub cwd: Option<String>,
    shape: Option<RequestShape>,
    invoked: Invoked,
    /// Files read in the transcript (Read results and ctxd's read markers).
    pub ledger: Ledger,
}

impl Observed {
    /// Starts from what is known before the first record: the model the transcript
    /// named and the shape of the program's request before the point it is read from.
    pub fn new(model: Option<String>, shape: Option<RequestShape>) -> Observed {
        Observed { model, shape, ..Observed::default() }
    }

    /// Folds one record in. A compact boundary met here keeps nothing from before it;
    /// use [`Observed::boundary`] when the records before it are at hand.
    pub fn observe(&mut self, record: &Record) {
        if record.is_compact_boundary() {
            self.boundary(record, &[]);
            return;
        }
        self.fold(record);
    }

    /// A compact boundary: the count starts afresh with the messages it keeps from
    /// `before` (records that precede it, all of them or a tail holding its preserved
    /// segment), counted as part of the new context (their usage measured the old one).
    pub fn boundary(&mut self, boundary: &Record, before: &[Record]) {
        let found = crate::preserved::preserved(boundary, before);
        self.tally.restart();
        self.composition = Composition::default();
        self.invoked = Invoked::default();
        self.floor = post_tokens(boundary.line());
        for &i in &found.kept {
            let counted = crate::preserved::without_usage(&before[i]);
            self.tally.observe(&counted);
            self.composition.observe(&counted);
        }
        self.fold(boundary);
    }

    fn fold(&mut self, record: &Record) {
        let head = record.head();
        if let Some(m) = head.model.as_deref().filter(|m| !m.starts_with('<'))
            && self.model.as_deref() != Some(m)
        {
            self.model = Some(m.to_owned());
        }
        if self.cwd.is_none() {
            self.cwd = cwd_of(record);
        }
        if let Some(shape) = RequestShape::of(record) {
            self.shape = Some(shape);
        }
        self.tally.observe(record);
        self.composition.observe(record);
        self.invoked.observe(record);
        if self.tally.reported > 0 {
            self.floor = None;
        }
    }

    /// The tally was given a report from outside the transcript (the gateway saw the
    /// answer first): the boundary's floor no longer applies.
    pub fn reported_outside(&mut self) {
        self.floor = None;
    }

    /// A line too long to parse, counted by its size as message content (as the status
    /// line counts it).
    pub fn unparsed(&mut self, bytes: u64) {
        self.tally.bytes_after += bytes;
        self.composition.other += bytes;
    }

    /// Notes the file read `record` carries, if any.
    pub fn note_read(&mut self, record: &Record) {
        note_read(&mut self.ledger, record);
    }

    /// The tally as shown: right after a boundary, no less than its `postTokens`.
    pub fn shown_tally(&self) -> Tally {
        match self.floor {
            Some(post) if self.tally.reported == 0 && post > self.tally.total() => {
                Tally { reported: post, bytes_after: 0, ..self.tally.clone() }
            }
            _ => self.tally.clone(),
        }
    }

    /// The request's fixed parts: the program's system blocks (plus the system context,
    /// `system_context_bytes` of git facts) and tools when its transcript says them,
    /// the memory files (`memory_tokens`), the skills still in view.
    pub fn prefix(&self, memory_tokens: u64, system_context_bytes: u64) -> Prefix {
        let rate = self.tally.calibration;
        let shape = self.shape.unwrap_or_default();
        Prefix {
            system_prompt: rate.tokens(shape.system_bytes + system_context_bytes),
            tools: rate.tokens(shape.tools_bytes),
            memory_files: memory_tokens,
            skills: rate.tokens(self.invoked.skill_bytes()),
        }
    }
}

impl Observed {
    /// Where the `tokens` of the next request go, with `prefix` its fixed parts: as for
    /// a session of ctxd's own ([`crate::breakdown::split`]), except that summaries and
    /// tool results count no more than their size says. The program's figure holds
    /// more than its records show (its reminders, the first message's context, a
    /// boundary's `postTokens` reckoned another way); shared out by size, that excess
    /// would make a 5 kB summary tens of thousands of tokens. It is "other" instead.
    pub fn split(&self, tokens: u64, prefix: &Prefix) -> Breakdown {
        let mut parts = crate::breakdown::split(tokens, prefix, &self.composition);
        let rate = self.tally.calibration;
        let Breakdown { summaries, tool_results, other_messages, .. } = &mut parts;
        for (part, bytes) in [(summaries, self.composition.summaries), (tool_results, self.composition.tool_results)] {
            let by_size = rate.tokens(bytes);
            if *part > by_size {
                *other_messages += *part - by_size;
                *part = by_size;
            }
        }
        parts
    }
}

/// Notes in `ledger` the file read `record` carries (a Read result or ctxd's read
/// marker), if any.
pub fn note_read(ledger: &mut Ledger, record: &Record) {
    if let Some(read) = file_read_in(record) {
        ledger.record(&read);
    } else if let Some(marker) = ReadMarker::from_record(record) {
        ledger.record_marker(&marker);
    }
}

/// `compactMetadata.postTokens` of a boundary line.
pub fn post_tokens(line: &str) -> Option<u64> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Line {
        compact_metadata: Option<Metadata>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Metadata {
        post_tokens: Option<u64>,
    }
    serde_json::from_str::<Line>(line).ok()?.compact_metadata?.post_tokens
}

/// The `cwd` a record names.
fn cwd_of(record: &Record) -> Option<String> {
    if !record.line().contains("\"cwd\"") {
        return None;
    }
    #[derive(Deserialize)]
    struct Line {
        cwd: Option<String>,
    }
    serde_json::from_str::<Line>(record.line()).ok()?.cwd.filter(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(line: &str) -> Record {
        Record::parse(line).unwrap()
    }

    fn user(uuid: &str, text: &str) -> Record {
        rec(&serde_json::json!({"type": "user", "uuid": uuid, "cwd": "/work/p",
            "message": {"role": "user", "content": text}})
        .to_string())
    }

    fn reply(uuid: &str, input: u64) -> Record {
        rec(&serde_json::json!({"type": "assistant", "uuid": uuid,
            "message": {"id": format!("m-{uuid}"), "model": "claude-opus-5-5", "role": "assistant",
                "content": [{"type": "text", "text": "ok"}], "usage": {"input_tokens": input, "output_tokens": 10}}})
        .to_string())
    }

    #[test]
    fn the_request_shape_gives_the_system_prompt_and_tools() {
        let shape = rec(&serde_json::json!({"type": "api-request-shape", "shape": {
            "system": [{"type": "text", "text": "you are ".repeat(100)}],
            "tools": [{"name": "Read", "description": "reads ".repeat(400), "input_schema": {}}]}})
        .to_string());
        let mut observed = Observed::default();
        assert_eq!(observed.prefix(0, 0), Prefix::default(), "unknown until the program says");
        observed.observe(&shape);
        let prefix = observed.prefix(100, 0);
        assert!(prefix.system_prompt > 0 && prefix.tools > prefix.system_prompt, "{prefix:?}");
        assert_eq!(prefix.memory_files, 100);
        // Another line merely mentioning the type is not a shape.
        assert_eq!(RequestShape::of(&user("u", "api-request-shape")), None);
        assert_eq!(observed.cwd, None);
    }

    #[test]
    fn a_boundary_counts_what_it_keeps_and_its_floor_until_a_report() {
        let mut observed = Observed::default();
        let kept = user("k1", &"kept ".repeat(400));
        observed.observe(&user("u1", "first"));
        observed.observe(&reply("a1", 50_000));
        observed.observe(&kept);
        assert_eq!(observed.model.as_deref(), Some("claude-opus-5-5"));
        assert_eq!(observed.cwd.as_deref(), Some("/work/p"));
        let boundary = rec(
            r#"{"type":"system","subtype":"compact_boundary","uuid":"b","compactMetadata":{"postTokens":9000,"preservedSegment":{"headUuid":"k1","anchorUuid":"s","tailUuid":"k1"}}}"#,
        );
        let summary = rec(
            r#"{"type":"user","uuid":"s","isCompactSummary":true,"message":{"role":"user","content":"the summary"}}"#,
        );
        observed.boundary(&boundary, &[user("u1", "first"), reply("a1", 50_000), kept.clone()]);
        observed.observe(&summary);
        assert!(observed.composition.other >= 2_000, "the kept message is counted: {:?}", observed.composition);
        assert!(observed.composition.summaries > 0);
        assert_eq!(observed.shown_tally().total(), 9_000, "the boundary's own count is the floor");
        observed.observe(&reply("a2", 12_000));
        assert_eq!(observed.shown_tally().total(), 12_010, "a report replaces the floor");
        // The model stays known across the boundary.
        assert_eq!(observed.model.as_deref(), Some("claude-opus-5-5"));
    }

    #[test]
    fn parts_of_a_compacted_session_follow_the_sizes_of_its_messages() {
        // A summary of 4 kB and a kept message of 36 kB after a boundary counted at
        // 12,000 tokens, with 2,000 tokens of fixed parts: the summary takes its share
        // by size, not everything.
        let mut observed = Observed::default();
        let kept = user("k1", &"k".repeat(36_000));
        let boundary = rec(
            r#"{"type":"system","subtype":"compact_boundary","uuid":"b","compactMetadata":{"postTokens":12000,"preservedSegment":{"headUuid":"k1","anchorUuid":"s","tailUuid":"k1"}}}"#,
        );
        observed.boundary(&boundary, std::slice::from_ref(&kept));
        let summary = serde_json::json!({"type": "user", "uuid": "s", "isCompactSummary": true,
            "message": {"role": "user", "content": "s".repeat(4_000)}});
        observed.observe(&rec(&summary.to_string()));
        let prefix = Prefix { system_prompt: 1_500, tools: 500, ..Prefix::default() };
        let parts = observed.split(observed.shown_tally().total(), &prefix);
        assert_eq!(parts.total(), 12_000);
        assert!((900..=1_100).contains(&parts.summaries), "{parts:?}");
        // The program's own prefix unknown: the 10,000 tokens that leaves unexplained do
        // not make the summary bigger than its 4 kB.
        let parts = observed.split(observed.shown_tally().total(), &Prefix::default());
        assert_eq!(parts.total(), 12_000);
        assert!((900..=1_100).contains(&parts.summaries), "{parts:?}");
        assert!(parts.other_messages > 10_000, "{parts:?}");
    }

    #[test]
    fn reads_are_noted_only_when_asked() {
        let read = rec(
            r#"{"type":"user","uuid":"r","toolUseResult":{"type":"text","file":{"filePath":"/p/a.py","content":"x = 1\n"}},"message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x = 1"}]}}"#,
        );
        let mut observed = Observed::default();
        observed.observe(&read);
        assert_eq!(observed.ledger.len(), 0);
        observed.note_read(&read);
        assert_eq!(observed.ledger.len(), 1);
        assert!(observed.ledger.get("/p/a.py").is_some());
    }
}
