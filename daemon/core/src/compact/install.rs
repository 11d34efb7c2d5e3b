//! Installing a compaction: the records that replace the conversation, in the order the
//! model will read them, and the record that takes a compaction back.
//!
//! A compaction appends, it never rewrites: the transcript keeps every earlier record,
//! and the view starts after the latest boundary. What gets appended, in order:
//!
//! ```text
//! boundary      system/compact_boundary, parentUuid null, logicalParentUuid = last record
//! [kept before] partial compaction "from": the earliest messages, copied
//! summary       user, isCompactSummary, isVisibleInTranscriptOnly
//! attachments   restored plan, files, skills, read-files digest (parentUuid null;
//!               chained after the summary in a Claude Code transcript)
//! hook output   SessionStart(compact) (likewise)
//! ```
//!
//! Each kept message is either referenced or copied, never both:
//!
//! - The newest messages (automatic compaction's latest tool round, partial "up to",
//!   and everything appended while the compaction ran) are the end of the file before
//!   the boundary. They stay where they are and the boundary points at them, as Claude
//!   Code's own compactions do: `preservedSegment` (head, tail, anchored to the summary)
//!   and `preservedMessages` (their uuids). Readers relink them after the summary
//!   (Claude Code on resume, ctxd's [`crate::preserved`]), and the transcript does not
//!   grow by a second copy of them.
//! - The earliest messages (partial "from") come before the summary, so they cannot be
//!   a segment anchored after it: they are copied with fresh uuids, chained after the
//!   boundary, carrying `ctxdKeptFrom` (the original uuid) and without `message.usage`
//!   (that number measured the context before compaction, and a tally that read it
//!   would think the context still full). Such a boundary names no segment.
//!
//! Undo (`ctx/undoCompact`) is another appended record, `system/ctxd_undo_compact`
//! naming the boundary it undoes; [`compaction_view`] tells which records the view
//! then spans.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use serde_json::{Map, Value, json};

use crate::record::{Kind, Record, RecordError};

use super::Trigger;
use super::content::{record_object, tool_calls, tool_result_ids, user_prompt};
use super::restore::RestoredAttachment;
use super::text::estimate_tokens;

/// `subtype` of the record that undoes a compaction.
pub const UNDO_SUBTYPE: &str = "ctxd_undo_compact";

/// Field a copied record carries: the uuid of the original.
/// Field on the copy of a message a compaction kept in view, naming the original.
pub const KEPT_FROM: &str = "ctxdKeptFrom";

/// Host fields copied from the last record onto the records built here.
const COMMON_FIELDS: &[&str] = &["userType", "entrypoint", "cwd", "sessionId", "version", "gitBranch"];

/// The host fields (`sessionId`, `cwd`, `version`, `gitBranch`, `userType`,
/// `entrypoint`) of a record, to stamp on the records a compaction builds.
pub fn common_fields(record: &Record) -> Map<String, Value> {
    let object = record_object(record);
    COMMON_FIELDS.iter().filter_map(|k| object.get(*k).map(|v| ((*k).to_owned(), v.clone()))).collect()
}

/// Names of the tools the conversation used, in order of first use.
pub fn tools_used(records: &[Record]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for record in records.iter().filter(|r| !r.head().is_sidechain) {
        for call in tool_calls(record) {
            if !call.name.is_empty() && !out.contains(&call.name) {
                out.push(call.name);
            }
        }
    }
    out
}

/// What to install.
#[derive(Debug, Clone, PartialEq)]
pub struct InstallInput<'a> {
    pub trigger: Trigger,
    /// Uuid of the last record before compaction (`logicalParentUuid`).
    pub last_uuid: Option<String>,
    /// Context tokens before compaction.
    pub pre_tokens: u64,
    /// Tokens of the part compaction cannot remove (system, tools, memory). When given,
    /// `postTokens` is written: this plus the estimate of what is installed.
    pub fixed_prefix_tokens: Option<u64>,
    pub duration_ms: u64,
    /// The summary message text ([`super::summary_message_text`]).
    pub summary_text: String,
    /// Earliest messages kept verbatim, placed before the summary (partial "from").
    pub kept_before: &'a [Record],
    /// Newest messages kept verbatim, placed after the summary (automatic compaction's
    /// latest tool round, partial "up to").
    pub kept_after: &'a [Record],
    pub attachments: &'a [RestoredAttachment],
    /// SessionStart(compact) hook output, one entry per hook.
    pub hook_outputs: &'a [String],
    /// Host fields stamped on every record built ([`common_fields`]).
    pub common: Map<String, Value>,
    /// Timestamp of the records built (copies keep their own).
    pub timestamp: String,
    /// The session's learned tokens-per-KiB rate, written on the boundary
    /// ([`RATE_FIELD`]) so a resumed session estimates what follows as the live one did.
    pub tokens_per_kib: Option<u64>,
    /// How restored files and hook output are linked: [`AttachmentLinks::Loose`] for
    /// ctxd's own sessions, [`AttachmentLinks::Chained`] in a transcript Claude Code reads.
    pub attachment_links: AttachmentLinks,
}

/// How an install links the records it adds after the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachmentLinks {
    /// `parentUuid` null. ctxd's view reads such a record as continuing from whatever
    /// precedes it in view order (the last kept message). Chained after the summary
    /// instead, they would be a branch beside the kept messages, and the chain would
    /// drop one side: the kept messages after the first (a prompt appended while the
    /// compaction ran), or, once the host's next record names the last kept message as
    /// its parent, the restored files.
    Loose,
    /// Each after the previous one, the first after the summary, as the program writes
    /// them: Claude Code walks `parentUuid` and leaves out a record off its chain.
    Chained,
}

/// Field of the boundary's `compactMetadata`: how many records its install has, the
/// boundary included, so an install cut by a crash is recognised on resume.
pub const BATCH_FIELD: &str = "ctxdBatch";

/// Field of the boundary's `compactMetadata`: the session's tokens-per-KiB rate when it
/// compacted ([`InstallInput::tokens_per_kib`]).
pub const RATE_FIELD: &str = "ctxdTokensPerKib";

/// Field of the boundary's `compactMetadata`: the tokens of the request assembled over
/// the installed view (summary, kept messages, restored files, the host's system prompt
/// and tools), as `ctx/assemble` counts them. Until the first report after it, the
/// session's usage stands on this figure, live and on resume alike
/// ([`crate::tally::Tally::anchor_install`]).
pub const REQUEST_TOKENS_FIELD: &str = "ctxdRequestTokens";

/// The request tokens a boundary carries ([`REQUEST_TOKENS_FIELD`]) and the size of
/// its install batch ([`BATCH_FIELD`]), if it carries both.
pub fn boundary_request_tokens(boundary: &Record) -> Option<(u64, u64)> {
    if !boundary.line().contains(REQUEST_TOKENS_FIELD) {
        return None;
    }
    let value = boundary.to_value();
    let metadata = &value["compactMetadata"];
    Some((metadata[REQUEST_TOKENS_FIELD].as_u64()?, metadata[BATCH_FIELD].as_u64()?))
}

/// Writes `tokens` on the boundary of `post` ([`REQUEST_TOKENS_FIELD`]): measured once
/// the records are built, since the request is assembled over them.
pub fn stamp_request_tokens(post: &mut PostCompact, tokens: u64) -> Result<(), InstallError> {
    let Some(boundary) = post.records.first_mut().filter(|r| r.is_compact_boundary()) else {
        return Ok(());
    };
    let mut object = record_object(boundary);
    if let Some(Value::Object(metadata)) = object.get_mut("compactMetadata") {
        metadata.insert(REQUEST_TOKENS_FIELD.to_owned(), json!(tokens));
    }
    *boundary = Record::from_object(&object)?;
    Ok(())
}

/// The rate a boundary carries ([`RATE_FIELD`]), if it carries one.
pub fn boundary_rate(boundary: &Record) -> Option<u64> {
    if !boundary.line().contains(RATE_FIELD) {
        return None;
    }
    boundary.to_value()["compactMetadata"][RATE_FIELD].as_u64()
}

/// When the records read from disk end in a boundary whose install batch is not all
/// there (the daemon died while writing it), the install never happened: the offset of
/// that boundary, where the file is cut. `records` are the lines with their offsets.
pub fn torn_install(records: &[(u64, Record)]) -> Option<u64> {
    let last = records.iter().rposition(|(_, r)| r.is_compact_boundary())?;
    let (offset, boundary) = &records[last];
    if !boundary.line().contains(BATCH_FIELD) {
        return None;
    }
    let batch = boundary.to_value()["compactMetadata"][BATCH_FIELD].as_u64().unwrap_or(0);
    ((records.len() - last) as u64 <= batch.saturating_sub(1)).then_some(*offset)
}

/// The records to append, in order, and where things went.
#[derive(Debug, Clone, PartialEq)]
pub struct PostCompact {
    pub records: Vec<Record>,
    pub boundary_uuid: String,
    pub summary_uuid: String,
    /// (original uuid, copy uuid) for every copied message (kept before the summary).
    pub copies: Vec<(String, String)>,
    /// Indices (into the kept slice given, before then after) of records neither copied
    /// nor referenced: host bookkeeping lines and records without a uuid never reach
    /// the model.
    pub not_copied: Vec<usize>,
    /// Uuids of the messages kept after the summary, referenced by the boundary's
    /// `preservedSegment` where they stand.
    pub referenced: Vec<String>,
    /// Estimated tokens of what the model will see of these records.
    pub installed_tokens: u64,
}

/// Why the records could not be built. Each names what the caller must change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstallError {
    /// The summary text is empty: there is nothing to install.
    #[error("the summary is empty")]
    EmptySummary,
    /// Messages kept on both sides of the summary; choose one direction.
    #[error("messages are kept both before and after the summary")]
    KeptOnBothSides,
    /// A kept tool result answers a tool use that is not kept; move the split with
    /// [`safe_split`].
    #[error("kept tool result {tool_use_id} answers a tool use that is summarized")]
    OrphanToolResult { tool_use_id: String },
    /// The kept earliest messages end with a tool use whose result is summarized; move
    /// the split with [`safe_split`].
    #[error("kept tool use {tool_use_id} has its result in the summarized part")]
    UnansweredToolUse { tool_use_id: String },
    /// A built record is not a valid record (a bug, not an input problem).
    #[error("built record is invalid: {0}")]
    Record(#[from] RecordError),
}

/// Builds the post-compact records. `new_uuid` supplies every uuid (tests pass a
/// counter).
pub fn build_post_compact(
    input: &InstallInput<'_>,
    new_uuid: &mut dyn FnMut() -> String,
) -> Result<PostCompact, InstallError> {
    if input.summary_text.trim().is_empty() {
        return Err(InstallError::EmptySummary);
    }
    if !input.kept_before.is_empty() && !input.kept_after.is_empty() {
        return Err(InstallError::KeptOnBothSides);
    }
    check_pairs(input.kept_before, true)?;
    check_pairs(input.kept_after, false)?;

    let boundary_uuid = new_uuid();
    let summary_uuid = new_uuid();
    let mut records: Vec<Map<String, Value>> = Vec::new();
    let mut copies: Vec<(String, String)> = Vec::new();
    let mut not_copied: Vec<usize> = Vec::new();
    let mut installed_tokens = estimate_tokens(&input.summary_text);
    let mut prev = boundary_uuid.clone();

    // The boundary is written once its metadata is known; reserve its place.
    let kept_before = copy_records(input.kept_before, 0, &mut prev, new_uuid, &mut copies, &mut not_copied);
    let summary = summary_record(input, &summary_uuid, &prev);
    let mut referenced: Vec<String> = Vec::new();
    for (i, record) in input.kept_after.iter().enumerate() {
        match record.uuid().filter(|_| is_message(record)) {
            Some(uuid) => {
                referenced.push(uuid.to_owned());
                installed_tokens += carried_tokens(record);
            }
            None => not_copied.push(input.kept_before.len() + i),
        }
    }
    for copy in &kept_before {
        installed_tokens += copy_tokens(copy);
    }
    // Restored files and hook output: linked as `attachment_links` says.
    let mut parent = match input.attachment_links {
        AttachmentLinks::Loose => None,
        AttachmentLinks::Chained => Some(summary_uuid.clone()),
    };
    let mut tail: Vec<Map<String, Value>> = Vec::new();
    for attachment in input.attachments {
        let uuid = new_uuid();
        installed_tokens += attachment.tokens;
        tail.push(attachment_record(
            input,
            &uuid,
            parent.as_deref(),
            attachment.attachment.clone(),
            &attachment.rendered,
            attachment.rendered_role,
        ));
        if parent.is_some() {
            parent = Some(uuid);
        }
    }
    for output in input.hook_outputs.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        let uuid = new_uuid();
        let rendered = vec![format!(
            "<system-reminder>\nOutput of the SessionStart hook that runs after compaction:\n{output}\n</system-reminder>"
        )];
        installed_tokens += estimate_tokens(&rendered[0]);
        let attachment = json!({
            "type": "hook_additional_context",
            "hookEvent": "SessionStart",
            "hookName": "SessionStart:compact",
            "content": [output],
        });
        tail.push(attachment_record(input, &uuid, parent.as_deref(), attachment, &rendered, "user"));
        if parent.is_some() {
            parent = Some(uuid);
        }
    }

    let post_tokens = input.fixed_prefix_tokens.map(|f| f + installed_tokens);
    let batch = 2 + kept_before.len() + tail.len();
    let stamps = BoundaryStamps { referenced: &referenced, post_tokens, batch };
    records.push(boundary_record(input, &boundary_uuid, &summary_uuid, &stamps));
    records.extend(kept_before);
    records.push(summary);
    records.extend(tail);

    let records = records.iter().map(Record::from_object).collect::<Result<Vec<_>, _>>()?;
    Ok(PostCompact { records, boundary_uuid, summary_uuid, copies, not_copied, referenced, installed_tokens })
}

fn stamp(object: &mut Map<String, Value>, common: &Map<String, Value>) {
    for (k, v) in common {
        if !object.contains_key(k) {
            object.insert(k.clone(), v.clone());
        }
    }
}

/// What the boundary's metadata says of the install it starts.
struct BoundaryStamps<'a> {
    /// Uuids of the messages kept after the summary.
    referenced: &'a [String],
    post_tokens: Option<u64>,
    /// Records of the install, the boundary included.
    batch: usize,
}

fn boundary_record(
    input: &InstallInput<'_>,
    uuid: &str,
    summary_uuid: &str,
    stamps: &BoundaryStamps<'_>,
) -> Map<String, Value> {
    let (referenced, post_tokens) = (stamps.referenced, stamps.post_tokens);
    let mut metadata = Map::new();
    metadata.insert("trigger".to_owned(), json!(input.trigger.as_str()));
    metadata.insert("preTokens".to_owned(), json!(input.pre_tokens));
    if let Some(post) = post_tokens {
        metadata.insert("postTokens".to_owned(), json!(post));
    }
    metadata.insert("durationMs".to_owned(), json!(input.duration_ms));
    if let (Some(head), Some(tail)) = (referenced.first(), referenced.last()) {
        metadata.insert(
            "preservedSegment".to_owned(),
            json!({"headUuid": head, "anchorUuid": summary_uuid, "tailUuid": tail}),
        );
        metadata.insert(
            "preservedMessages".to_owned(),
            json!({"anchorUuid": summary_uuid, "uuids": referenced, "allUuids": referenced}),
        );
        // Kept messages referenced where they stand (older ctxd boundaries named copies).
        metadata.insert(crate::preserved::REFERENCES_FIELD.to_owned(), json!(true));
    }
    metadata.insert(BATCH_FIELD.to_owned(), json!(stamps.batch));
    if let Some(rate) = input.tokens_per_kib {
        metadata.insert(RATE_FIELD.to_owned(), json!(rate));
    }
    let mut object = Map::new();
    object.insert("parentUuid".to_owned(), Value::Null);
    object.insert("logicalParentUuid".to_owned(), json!(input.last_uuid));
    object.insert("isSidechain".to_owned(), json!(false));
    object.insert("type".to_owned(), json!("system"));
    object.insert("subtype".to_owned(), json!("compact_boundary"));
    object.insert("content".to_owned(), json!("Conversation compacted"));
    object.insert("isMeta".to_owned(), json!(false));
    object.insert("timestamp".to_owned(), json!(input.timestamp));
    object.insert("uuid".to_owned(), json!(uuid));
    object.insert("level".to_owned(), json!("info"));
    object.insert("compactMetadata".to_owned(), Value::Object(metadata));
    stamp(&mut object, &input.common);
    object
}

fn summary_record(input: &InstallInput<'_>, uuid: &str, parent: &str) -> Map<String, Value> {
    let mut object = Map::new();
    object.insert("parentUuid".to_owned(), json!(parent));
    object.insert("isSidechain".to_owned(), json!(false));
    object.insert("type".to_owned(), json!("user"));
    object.insert("message".to_owned(), json!({"role": "user", "content": input.summary_text}));
    object.insert("isVisibleInTranscriptOnly".to_owned(), json!(true));
    object.insert("isCompactSummary".to_owned(), json!(true));
    object.insert("uuid".to_owned(), json!(uuid));
    object.insert("timestamp".to_owned(), json!(input.timestamp));
    stamp(&mut object, &input.common);
    object
}

fn attachment_record(
    input: &InstallInput<'_>,
    uuid: &str,
    parent: Option<&str>,
    attachment: Value,
    rendered: &[String],
    role: &str,
) -> Map<String, Value> {
    let mut object = Map::new();
    object.insert("parentUuid".to_owned(), parent.map_or(Value::Null, |p| json!(p)));
    object.insert("isSidechain".to_owned(), json!(false));
    object.insert("attachment".to_owned(), attachment);
    object.insert("type".to_owned(), json!("attachment"));
    object.insert("uuid".to_owned(), json!(uuid));
    object.insert("timestamp".to_owned(), json!(input.timestamp));
    object.insert("rendered".to_owned(), Value::Array(rendered.iter().map(|r| json!({"content": r})).collect()));
    object.insert("renderedRole".to_owned(), json!(role));
    stamp(&mut object, &input.common);
    object
}

/// Copies the message records of `kept`, chained after `prev`. Uuids inside the copies
/// that name a copied original (`sourceToolAssistantUUID`) are rewritten to the copy.
fn copy_records(
    kept: &[Record],
    index_offset: usize,
    prev: &mut String,
    new_uuid: &mut dyn FnMut() -> String,
    copies: &mut Vec<(String, String)>,
    not_copied: &mut Vec<usize>,
) -> Vec<Map<String, Value>> {
    let mut renamed: HashMap<String, String> = HashMap::new();
    let mut out = Vec::new();
    for (i, record) in kept.iter().enumerate() {
        let Some(original) = record.uuid().filter(|_| is_message(record)) else {
            not_copied.push(index_offset + i);
            continue;
        };
        let uuid = new_uuid();
        let mut object = record_object(record);
        object.insert("parentUuid".to_owned(), json!(prev));
        object.insert("uuid".to_owned(), json!(uuid));
        object.insert(KEPT_FROM.to_owned(), json!(original));
        if let Some(Value::Object(message)) = object.get_mut("message") {
            message.remove("usage");
        }
        if let Some(source) = object.get("sourceToolAssistantUUID").and_then(Value::as_str)
            && let Some(copy) = renamed.get(source)
        {
            let copy = copy.clone();
            object.insert("sourceToolAssistantUUID".to_owned(), json!(copy));
        }
        renamed.insert(original.to_owned(), uuid.clone());
        copies.push((original.to_owned(), uuid.clone()));
        *prev = uuid;
        out.push(object);
    }
    out
}

/// Estimated tokens of a copied record's message (or rendered attachment).
fn is_message(record: &Record) -> bool {
    matches!(record.head().kind, Kind::User | Kind::Assistant | Kind::Attachment)
}

/// Estimated tokens of `record` as the next request carries it: an oversized new tool
/// result by its preview, an attachment by its rendered text
/// ([`crate::view::budget::carried_bytes`]).
pub fn carried_tokens(record: &Record) -> u64 {
    let config = crate::view::BudgetConfig::default();
    crate::view::budget::carried_bytes(record, &config).div_ceil(crate::tally::BYTES_PER_TOKEN)
}

fn copy_tokens(object: &Map<String, Value>) -> u64 {
    let part = object.get("message").and_then(|m| m.get("content")).or_else(|| object.get("rendered"));
    part.and_then(|p| serde_json::to_string(p).ok()).map_or(0, |s| estimate_tokens(&s))
}

/// Checks that the kept records are valid on their own: no tool result without its tool
/// use, and (for the earliest messages, which the summary follows) no tool use without
/// its result.
fn check_pairs(kept: &[Record], results_required: bool) -> Result<(), InstallError> {
    let mut uses: Vec<String> = Vec::new();
    let mut answered: HashSet<String> = HashSet::new();
    for record in kept {
        for call in tool_calls(record) {
            uses.push(call.id);
        }
        for id in tool_result_ids(record) {
            if !uses.contains(&id) {
                return Err(InstallError::OrphanToolResult { tool_use_id: id });
            }
            answered.insert(id);
        }
    }
    if results_required && let Some(id) = uses.into_iter().find(|id| !answered.contains(id)) {
        return Err(InstallError::UnansweredToolUse { tool_use_id: id });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Choosing what to keep.

/// Where the kept tail starts: the newest messages that stay verbatim after the
/// summary, or `None` to keep nothing. The summary request covers only the records
/// before it.
///
/// - The records end in a tool round (an assistant response that called tools, then
///   its tool results and attachments): keep the round from the response's first line,
///   so the turn carries on from the results (automatic compaction mid-turn).
/// - The records end with a real user message: keep that message; the summary leads up
///   to it.
/// - The records end with an assistant response: keep that response, so the model sees
///   its own last words exactly (Claude Code keeps it on manual compaction too).
pub fn kept_tail_start(records: &[Record]) -> Option<usize> {
    let relevant = |r: &Record| !r.head().is_sidechain && matches!(r.head().kind, Kind::User | Kind::Assistant);
    let last = records.iter().rposition(relevant)?;
    let record = &records[last];
    if user_prompt(record).is_some() {
        return Some(last);
    }
    if record.head().kind == Kind::Assistant {
        return Some(response_start(records, last));
    }
    if tool_result_ids(record).is_empty() {
        // A user record that is neither a prompt nor a tool result (meta, summary).
        return None;
    }
    // Walk back over the tool results to the response that asked for them.
    let assistant = records[..last].iter().rposition(|r| relevant(r) && r.head().kind == Kind::Assistant)?;
    if tool_calls(&records[assistant]).is_empty() {
        return None;
    }
    let start = response_start(records, assistant);
    Some(safe_split(records, start))
}

/// The records of `view[from..]` a compaction keeps after its summary (`view` as the
/// session holds it: a boundary's kept messages, the boundary, what follows): all but
/// the messages off the view's active chain, a branch the host rewound away from while
/// the compaction ran. Kept after the summary, such a branch would come back into the
/// view for good: the record the host rewound to is summarized, so nothing after the
/// install shows the rewind.
pub fn kept_tail(view: &[Record], from: usize) -> Vec<Record> {
    let (slice, _) = crate::view::slice::slice_after_boundary(view);
    let on_chain: HashSet<usize> = slice.kept().filter(|&i| i >= from).collect();
    let kept = |i: usize, r: &Record| !is_message(r) || r.head().is_sidechain || on_chain.contains(&i);
    view.iter().enumerate().skip(from).filter(|&(i, r)| kept(i, r)).map(|(_, r)| r.clone()).collect()
}

/// The verbatim tail may take at most this share (1/N) of the compact threshold. A
/// larger tail (one giant message or tool result) is summarized with the rest, cut with
/// a marker there once, instead of being kept whole by this compaction and every one
/// after it, none of which could then bring the context under the threshold.
pub const MAX_KEPT_SHARE: u64 = 4;

/// Whether a tail of `kept_tokens` may stay verbatim under `threshold`.
pub fn keep_tail(kept_tokens: u64, threshold: u64) -> bool {
    kept_tokens <= threshold / MAX_KEPT_SHARE
}

/// The first line of the response `records[i]` belongs to (lines of one response share
/// `message.id`).
fn response_start(records: &[Record], i: usize) -> usize {
    let Some(id) = records[i].head().message_id.as_deref() else {
        return i;
    };
    let mut start = i;
    // Hosts may interleave a response's lines with the results of its tool calls, so
    // walk back over tool results and attachments; a real prompt or another response
    // ends the search.
    for j in (0..i).rev() {
        let head = records[j].head();
        if head.is_sidechain {
            continue;
        }
        match head.kind {
            Kind::Assistant if head.message_id.as_deref() == Some(id) => start = j,
            Kind::Assistant => break,
            Kind::User if user_prompt(&records[j]).is_some() => break,
            _ => {}
        }
    }
    start
}

/// Direction of a partial compaction around a chosen message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitDirection {
    /// Summarize from the message on; keep what precedes it.
    From,
    /// Summarize up to and including the message; keep what follows it.
    UpTo,
}

/// Which records a partial compaction summarizes and which it keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartialPlan {
    pub direction: SplitDirection,
    /// Records to summarize (send with [`super::PromptForm::RecentOnly`] for `From`).
    pub summarize: Range<usize>,
    /// Records to keep verbatim: `kept_before` for `From`, `kept_after` for `UpTo`.
    pub keep: Range<usize>,
}

/// Splits `records` (the current view) around the chosen message `at` for a partial
/// compaction. The split is moved earlier when it would separate a tool use from its
/// result ([`safe_split`]), so with `UpTo` the chosen message itself may end up kept.
pub fn partial_plan(records: &[Record], at: usize, direction: SplitDirection) -> PartialPlan {
    let len = records.len();
    let split = match direction {
        SplitDirection::From => at.min(len),
        SplitDirection::UpTo => at.saturating_add(1).min(len),
    };
    let split = safe_split(records, split);
    match direction {
        SplitDirection::From => PartialPlan { direction, summarize: split..len, keep: 0..split },
        SplitDirection::UpTo => PartialPlan { direction, summarize: 0..split, keep: split..len },
    }
}

/// Moves a split point earlier until no tool use and its result lie on different sides
/// and no response is cut between its lines. Records `..split` and `split..` are then
/// each valid on their own, whichever side is kept.
pub fn safe_split(records: &[Record], split: usize) -> usize {
    let mut split = split.min(records.len());
    loop {
        let mut moved = split;
        if moved < records.len() && moved > 0 && records[moved].head().kind == Kind::Assistant {
            moved = moved.min(response_start(records, moved));
        }
        let after_results: HashSet<String> = records[moved..].iter().flat_map(tool_result_ids).collect();
        for (i, record) in records[..moved].iter().enumerate() {
            if tool_calls(record).iter().any(|c| after_results.contains(&c.id)) {
                moved = moved.min(response_start(records, i));
                break;
            }
        }
        if moved == split {
            return split;
        }
        split = moved;
    }
}

// ---------------------------------------------------------------------------------
// Undo.

/// Why a compaction cannot be undone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UndoError {
    /// There is no compaction left to undo.
    #[error("there is no compaction to undo")]
    NothingToUndo,
    /// The conversation went on after the compaction; undoing would drop that turn.
    #[error("a new turn was appended after the compaction; it can no longer be undone")]
    NewTurnSince,
}

/// The boundary that `ctx/undoCompact` would undo: the latest one not undone yet, as
/// long as no new turn (a real user message or a new model response) followed it.
pub fn undo_target(records: &[Record]) -> Result<&Record, UndoError> {
    let view = compaction_view(records);
    let b = view.boundary.ok_or(UndoError::NothingToUndo)?;
    let new_turn = view.visible(records.len()).into_iter().any(|i| {
        let record = &records[i];
        if record.head().is_sidechain || record_object(record).contains_key(KEPT_FROM) {
            return false;
        }
        match record.head().kind {
            Kind::Assistant => true,
            Kind::User => user_prompt(record).is_some(),
            _ => false,
        }
    });
    if new_turn {
        return Err(UndoError::NewTurnSince);
    }
    Ok(&records[b])
}

/// The record that undoes `boundary`. It continues the chain from the record before
/// the compaction (the boundary's `logicalParentUuid`), so a reader walking parent
/// links from the newest record sees the conversation as it was.
pub fn build_undo_record(
    boundary: &Record,
    common: &Map<String, Value>,
    uuid: &str,
    timestamp: &str,
) -> Result<Record, RecordError> {
    let mut object = Map::new();
    object.insert("parentUuid".to_owned(), json!(boundary.head().logical_parent_uuid));
    object.insert("isSidechain".to_owned(), json!(false));
    object.insert("type".to_owned(), json!("system"));
    object.insert("subtype".to_owned(), json!(UNDO_SUBTYPE));
    object.insert("content".to_owned(), json!("Compaction undone"));
    object.insert("isMeta".to_owned(), json!(false));
    object.insert("undoes".to_owned(), json!(boundary.uuid()));
    object.insert("timestamp".to_owned(), json!(timestamp));
    object.insert("uuid".to_owned(), json!(uuid));
    object.insert("level".to_owned(), json!("info"));
    stamp(&mut object, common);
    Record::from_object(&object)
}

/// Whether `record` undoes a compaction (`system/ctxd_undo_compact`).
pub fn is_undo_record(record: &Record) -> bool {
    record.head().kind == Kind::System && record.head().subtype.as_deref() == Some(UNDO_SUBTYPE)
}

/// Which records the view spans, with undone compactions taken into account.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactionView {
    /// Index of the boundary the view starts after; `None`: from the first record.
    pub boundary: Option<usize>,
    /// Ranges after it that belong to undone compactions (boundary through undo
    /// record): not part of the view.
    pub skipped: Vec<Range<usize>>,
    /// The newest compaction in the records was undone.
    pub latest_undone: bool,
}

impl CompactionView {
    /// Indices of the records in the view, in order.
    pub fn visible(&self, len: usize) -> Vec<usize> {
        let start = self.boundary.map_or(0, |b| b + 1);
        (start..len).filter(|i| !self.skipped.iter().any(|r| r.contains(i))).collect()
    }

    /// The records in the view.
    pub fn select<'a>(&self, records: &'a [Record]) -> Vec<&'a Record> {
        self.visible(records.len()).into_iter().map(|i| &records[i]).collect()
    }
}

/// Reads boundaries and undo records: the view starts after the latest boundary that
/// was not undone, and skips each undone compaction from its boundary to its undo
/// record.
pub fn compaction_view(records: &[Record]) -> CompactionView {
    let mut undone: HashMap<String, usize> = HashMap::new();
    for (i, record) in records.iter().enumerate() {
        if is_undo_record(record)
            && let Some(target) = record_object(record).get("undoes").and_then(Value::as_str)
        {
            undone.entry(target.to_owned()).or_insert(i);
        }
    }
    let mut view = CompactionView::default();
    let mut latest_seen = false;
    for (i, record) in records.iter().enumerate().rev() {
        if !record.is_compact_boundary() {
            continue;
        }
        let undo_at = record.uuid().and_then(|u| undone.get(u)).copied().filter(|&u| u > i);
        if !latest_seen {
            latest_seen = true;
            view.latest_undone = undo_at.is_some();
        }
        match undo_at {
            Some(u) => view.skipped.push(i..u + 1),
            None => {
                view.boundary = Some(i);
                break;
            }
        }
    }
    view.skipped.reverse();
    view
}
