//! Compacting a Claude Code transcript in place, and taking that back: what to append
//! and what to check. Pure: the daemon reads the file, asks here, and writes.
//!
//! Claude Code resumes a session from its own transcript file, so a compaction ctxd
//! gives a Claude Code user must be records in the program's own shapes, appended to
//! that file: a compact boundary (`compactMetadata` with `trigger`, `preTokens`,
//! `postTokens` and, when the newest messages stay in view, `preservedSegment` and
//! `preservedMessages` pointing at them where they stand), then the summary message and
//! the files the session read, re-attached (`file`, or `compact_file_reference` for one
//! too large), and the session's plan (`plan_file_reference`), as the program does after
//! its own compactions.
//! Nothing earlier is touched. The boundary also carries `ctxdBatch` (how many lines
//! ctxd appended), which is how [`plan_undo`] knows the tail of the file is ctxd's own
//! install and nothing came after it.

use std::borrow::Cow;

use crate::budget::{EnvConfig, WindowInputs, resolve_window, thresholds};
use crate::compact::{
    DEFAULT_RECENT_TURNS, FidelityFacts, FileReadEntry, HistoryTools, InstallInput, KeptMessages, PlanFile,
    RestoreBudget, RestoreInput, SummaryMessage, Trigger, appended_budget, build_post_compact, check_fidelity,
    common_fields, kept_tail_start, plan_restoration, summary_message_text, tools_used,
};
use crate::ledger::file_read_in;
use crate::record::{Kind, Record};
use crate::summary::{
    DEFAULT_MAX_OUTPUT_TOKENS, OfflineOptions, offline_cap_tokens, parse_summary_reply, summarize_offline,
};
use crate::tally::Tally;

/// Field of the boundary: lines of ctxd's install, the boundary included.
pub use crate::compact::BATCH_FIELD;

/// The lines to append to a Claude Code transcript, and what they do.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaudeCompaction {
    /// Whole JSON lines, without line breaks, in order.
    pub lines: Vec<String>,
    pub boundary_uuid: String,
    pub session_id: Option<String>,
    pub pre_tokens: u64,
    pub post_tokens: u64,
    /// Messages kept in view by reference.
    pub kept: usize,
    /// Items the summary missed (user messages, files, todos) that were appended to it.
    pub fidelity_appended: usize,
}

/// Why a transcript is left as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not a Claude Code transcript: no user or assistant record with a uuid and a sessionId")]
    NotClaudeCode,
    #[error("nothing to summarize since the last compaction")]
    NothingToSummarize,
    #[error("the offline summary could not be read: {0}")]
    Summary(String),
    #[error("could not build the records: {0}")]
    Build(String),
    #[error("the last compaction is not ctxd's: nothing to undo")]
    NotOurs,
    #[error("{0} lines came after ctxd's compaction: undoing it would take them away")]
    ContinuedSince(usize),
}

fn is_message(record: &Record) -> bool {
    let head = record.head();
    !head.is_sidechain && matches!(head.kind, Kind::User | Kind::Assistant)
}

/// A file the session read, as the caller found it on disk now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileNow {
    pub path: String,
    pub exists: bool,
    /// Its text, when it was read (not too large, not binary).
    pub content: Option<String>,
}

/// Paths of the files the session read (its Read results), oldest read first, each once
/// (at its latest read): what the caller looks up on disk for [`plan_compaction`].
pub fn files_read(records: &[Record]) -> Vec<String> {
    files_read_in(records)
}

fn files_read_in<'a>(records: impl IntoIterator<Item = &'a Record>) -> Vec<String> {
    let mut order: Vec<String> = Vec::new();
    for record in records {
        if let Some(read) = file_read_in(record) {
            order.retain(|p| *p != read.path);
            order.push(read.path);
        }
    }
    order
}

/// The session's plan name: the program keeps a session's plan in
/// `<config>/plans/<slug>.md` and writes the `slug` on its records. `None` when no
/// record has one or it is not a plain name (it becomes part of a path).
pub fn plan_slug(records: &[Record]) -> Option<String> {
    let slug = records.iter().rev().find_map(|r| {
        if !r.line().contains("\"slug\"") {
            return None;
        }
        r.to_value()["slug"].as_str().map(str::to_owned)
    })?;
    let plain = !slug.is_empty()
        && slug.len() <= 128
        && slug.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    plain.then_some(slug)
}

/// Where a transcript splits for a compaction: what is summarized and what stays in
/// view. Indices into the records [`prepare`] was given, so the summary can be written
/// elsewhere (by the offline summarizer, or by a provider while the caller waits)
/// between [`prepare`] and [`plan_compaction_with`], over the same records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// Records `..split` are summarized (everything before the last boundary included:
    /// its summary is part of what the new one replaces), but for `off_chain`;
    /// `split..` stay in view.
    pub split: usize,
    /// Records between the last boundary and `split` that are off the active chain, in
    /// file order: a branch the user rewound away from. The program resumes from its
    /// newest message up through `parentUuid`, so a summary that told of these would
    /// bring back prompts the user took back, as pending work.
    pub off_chain: Vec<usize>,
    /// The last boundary's index plus one (0 without one): the session in view starts here.
    pub start: usize,
    /// The newest user or assistant record with a uuid and a `sessionId`, whose common
    /// fields the appended records copy.
    pub last_message: usize,
    /// The summary's cap in estimated tokens (see [`summary_cap_tokens`]).
    pub summary_cap_tokens: u64,
}

impl Prepared {
    /// The records the summary replaces, without those off the active chain (borrowed
    /// when there are none, the common case).
    pub fn summarized<'a>(&self, records: &'a [Record]) -> Cow<'a, [Record]> {
        let summarized = &records[..self.split.min(records.len())];
        if self.off_chain.is_empty() {
            return Cow::Borrowed(summarized);
        }
        let mut off = self.off_chain.iter().peekable();
        let on_chain = summarized.iter().enumerate().filter(|(i, _)| off.next_if_eq(&i).is_none());
        Cow::Owned(on_chain.map(|(_, r)| r.clone()).collect())
    }

    /// The records that stay in view after the summary.
    pub fn kept<'a>(&self, records: &'a [Record]) -> &'a [Record] {
        &records[self.split..]
    }

    /// Whether a message stays in view after the summary (the summary prompt says so).
    pub fn keeps_messages(&self, records: &[Record]) -> bool {
        self.kept(records).iter().any(is_message)
    }
}

/// Chooses what a compaction of the transcript whose lines are `records` (in file order)
/// summarizes and keeps, or why there is nothing to do.
///
/// The newest messages stay in view (an assistant's last reply, or the tool round in
/// progress, as [`kept_tail_start`] chooses) by reference; everything since the last
/// boundary before them is summarized, as far as it is on the active chain (the path
/// the program resumes: from the newest message up through `parentUuid`).
pub fn prepare(records: &[Record], env: &EnvConfig) -> Result<Prepared, Refusal> {
    let last_message = records
        .iter()
        .rposition(|r| is_message(r) && r.uuid().is_some() && r.line().contains("\"sessionId\""))
        .ok_or(Refusal::NotClaudeCode)?;
    let start = records.iter().rposition(Record::is_compact_boundary).map_or(0, |b| b + 1);
    let active = &records[start..];
    let kept_from = kept_tail_start(active).unwrap_or(active.len());
    let split = start + kept_from;
    let off_chain = off_chain(records, start..split);
    // A reply since the last boundary, before what stays: else the summary would only
    // restate the last one (the command lines of a `/compact` are no conversation).
    let on_chain_reply = (start..split)
        .filter(|i| off_chain.binary_search(i).is_err())
        .any(|i| is_message(&records[i]) && records[i].head().kind == Kind::Assistant);
    if !on_chain_reply {
        return Err(Refusal::NothingToSummarize);
    }
    Ok(Prepared { split, off_chain, start, last_message, summary_cap_tokens: summary_cap_tokens(records, env) })
}

/// The records in `range` (after the last boundary) that are off the chain the program
/// resumes, in file order.
fn off_chain(records: &[Record], range: std::ops::Range<usize>) -> Vec<usize> {
    let (mut slice, _) = crate::view::slice::slice_after_boundary(records);
    slice.end_at_newest_message(records);
    let mut on: Vec<bool> = vec![false; records.len()];
    for i in slice.on_chain() {
        on[i] = true;
    }
    range.filter(|&i| !on[i]).collect()
}

/// The model of the session's newest main-chain reply (a subagent's sidechain may run
/// another; `<synthetic>` stands for no model).
pub fn session_model(records: &[Record]) -> Option<&str> {
    records
        .iter()
        .rev()
        .filter(|r| r.head().kind == Kind::Assistant && !r.head().is_sidechain)
        .find_map(|r| r.head().model.as_deref().filter(|m| !m.starts_with('<')))
}

/// The summary's cap for a Claude Code session: the offline summary's cap for the
/// threshold of the session's model, so a session on a one-million-token window gets
/// room to name many more of its messages, and never below the program's own cap on a
/// summary reply.
pub fn summary_cap_tokens(records: &[Record], env: &EnvConfig) -> u64 {
    let model = session_model(records).unwrap_or_default();
    let levels = thresholds(&resolve_window(model, &WindowInputs::default(), env), env, true);
    offline_cap_tokens(levels.threshold).max(DEFAULT_MAX_OUTPUT_TOKENS)
}

/// The offline summarizer's summary body of what `prepared` summarizes, focused by
/// `instructions`.
pub fn offline_summary(records: &[Record], prepared: &Prepared, instructions: Option<&str>) -> Result<String, Refusal> {
    let offline = summarize_offline(
        &prepared.summarized(records),
        &OfflineOptions {
            focus: instructions.map(str::to_owned),
            max_output_tokens: prepared.summary_cap_tokens,
            ..OfflineOptions::default()
        },
    );
    parse_summary_reply(&offline.text).map_err(|e| Refusal::Summary(e.to_string()))
}

/// Plans a compaction with the offline summarizer: [`prepare`], [`offline_summary`] and
/// [`plan_compaction_with`] in one step.
pub fn plan_compaction(
    records: &[Record],
    files: &[FileNow],
    plan: Option<PlanFile>,
    instructions: Option<&str>,
    timestamp: &str,
    new_uuid: &mut dyn FnMut() -> String,
) -> Result<ClaudeCompaction, Refusal> {
    let prepared = prepare(records, &EnvConfig::default())?;
    let body = offline_summary(records, &prepared, instructions)?;
    plan_compaction_with(records, &prepared, &body, files, plan, &Lookup::default(), timestamp, new_uuid)
}

/// Where the summary tells the model the earlier conversation can be looked up: the
/// session's transcript and, when the caller found them configured for the project,
/// the history tools. The caller finds both; nothing here looks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookup {
    pub transcript_path: Option<String>,
    pub history_tools: Option<HistoryTools>,
}

/// The records that install `summary_body` (a summary's body, without its `<summary>`
/// tags) as the compaction `prepared` chose, over the same `records`.
///
/// The body is checked for fidelity first, as a session's own compaction does: user
/// messages, recent files and open todos of the summarized part it does not mention are
/// appended to it. `postTokens` is the session's fixed part (the first request's
/// reported size, which carried the system prompt, tools and memory) plus the estimate
/// of what the boundary leaves in view. `plan` is the session's plan file as the caller
/// found it now (see [`plan_slug`]), re-attached after the summary; `lookup` is what
/// the summary's closing line names.
#[allow(clippy::too_many_arguments)] // each is a separate input the caller found; a struct would only rename them
pub fn plan_compaction_with(
    records: &[Record],
    prepared: &Prepared,
    summary_body: &str,
    files: &[FileNow],
    plan: Option<PlanFile>,
    lookup: &Lookup,
    timestamp: &str,
    new_uuid: &mut dyn FnMut() -> String,
) -> Result<ClaudeCompaction, Refusal> {
    let last_message = records.get(prepared.last_message).ok_or(Refusal::NotClaudeCode)?;
    if prepared.split > records.len() || prepared.start > prepared.split {
        return Err(Refusal::NothingToSummarize);
    }
    let summarized = prepared.summarized(records);
    let kept = prepared.kept(records);
    // Records before the last boundary are never off the chain: the boundary keeps its
    // index among the summarized records.
    let in_view = &summarized[prepared.start..];
    // Checked against the part in view, as a session's own compaction checks its view:
    // what lay before the last boundary is in that boundary's summary.
    let facts = FidelityFacts::from_records(in_view, DEFAULT_RECENT_TURNS);
    let appended = appended_budget(prepared.summary_cap_tokens, summary_body.len());
    let checked = check_fidelity(summary_body, &facts, appended);
    let summary_text = summary_message_text(&SummaryMessage {
        body: checked.summary,
        transcript_path: lookup.transcript_path.clone(),
        history_tools: lookup.history_tools.clone(),
        tools_used: tools_used(&summarized),
        kept: if prepared.keeps_messages(records) { KeptMessages::After } else { KeptMessages::None },
    });
    let mut tally = Tally::default();
    for record in in_view.iter().chain(kept) {
        tally.observe(record);
    }
    let fixed = records.iter().find_map(|r| {
        let head = r.head();
        (head.kind == Kind::Assistant && !head.is_sidechain).then_some(())?;
        let usage = head.usage.as_ref()?;
        Some(usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens)
    });
    // The files read, newest first by the order of their reads; those whose read is in
    // the kept messages are there already. Only the program's own attachment shapes.
    let read = files_read_in(summarized.iter().chain(kept));
    let in_kept: Vec<String> = kept.iter().filter_map(file_read_in).map(|r| r.path).collect();
    let entries: Vec<FileReadEntry> = files
        .iter()
        .filter_map(|f| {
            let order = read.iter().position(|p| *p == f.path)?;
            Some(FileReadEntry {
                path: f.path.clone(),
                read_order: order as u64 + 1,
                tokens: f.content.as_deref().map_or(0, crate::summary::estimate_tokens),
                exists: f.exists,
                content: f.content.clone(),
                changed_since_read: false,
                in_kept_tail: in_kept.contains(&f.path),
            })
        })
        .collect();
    let cwd = common_fields(last_message).get("cwd").and_then(|v| v.as_str()).map(str::to_owned);
    let restored = plan_restoration(&RestoreInput {
        files: entries,
        skills: Vec::new(),
        plan,
        budget: RestoreBudget::default(),
        cwd,
    });
    let attachments: Vec<_> = restored
        .attachments
        .into_iter()
        .filter(|a| {
            matches!(a.attachment["type"].as_str(), Some("file" | "compact_file_reference" | "plan_file_reference"))
        })
        .collect();
    let input = InstallInput {
        trigger: Trigger::Manual,
        last_uuid: records.iter().rev().find_map(|r| r.uuid().map(str::to_owned)),
        pre_tokens: tally.total(),
        fixed_prefix_tokens: Some(fixed.unwrap_or(0)),
        duration_ms: 0,
        summary_text,
        kept_before: &[],
        kept_after: kept,
        attachments: &attachments,
        hook_outputs: &[],
        common: common_fields(last_message),
        timestamp: timestamp.to_owned(),
        tokens_per_kib: None,
        attachment_links: crate::compact::AttachmentLinks::Chained,
    };
    let built = build_post_compact(&input, new_uuid).map_err(|e| Refusal::Build(e.to_string()))?;
    let post_tokens = fixed.unwrap_or(0) + built.installed_tokens;
    let lines: Vec<String> = built.records.iter().map(|r| r.line().to_owned()).collect();
    Ok(ClaudeCompaction {
        lines,
        boundary_uuid: built.boundary_uuid,
        session_id: common_fields(last_message).get("sessionId").and_then(|v| v.as_str()).map(str::to_owned),
        pre_tokens: tally.total(),
        post_tokens,
        kept: built.referenced.len(),
        fidelity_appended: checked.report.missing_before.len(),
    })
}

/// Where the file is cut to take ctxd's compaction back: the offset of its boundary
/// (the byte length the file had before), when the last lines are exactly ctxd's install
/// and nothing came after them. `records` are the file's lines with their offsets.
pub fn plan_undo(records: &[(u64, Record)]) -> Result<u64, Refusal> {
    let (at, (offset, boundary)) =
        records.iter().enumerate().rev().find(|(_, (_, r))| r.is_compact_boundary()).ok_or(Refusal::NotOurs)?;
    let batch = boundary.to_value()["compactMetadata"][BATCH_FIELD].as_u64().ok_or(Refusal::NotOurs)?;
    let after = records.len() - at;
    match after.cmp(&usize::try_from(batch).unwrap_or(usize::MAX)) {
        std::cmp::Ordering::Equal => Ok(*offset),
        std::cmp::Ordering::Greater => Err(Refusal::ContinuedSince(after - batch as usize)),
        std::cmp::Ordering::Less => Err(Refusal::NotOurs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Vec<Record> {
        include_str!("../../../tests/fixtures/transcripts/claude-code-2.1.332/manual-compact.jsonl")
            .lines()
            .map(|l| Record::parse(l).unwrap())
            .collect()
    }

    /// A real rewind (`tests/fixtures/SOURCES.md`): five turns, the fourth reading
    /// `abandoned.txt`, then the program resumed at turn 2's reply
    /// (`--resume-session-at`) with a branch of two turns, the first reading
    /// `active.txt`. A plain `--resume` afterwards carried turns 1, 2 and the branch.
    fn rewound() -> Vec<Record> {
        include_str!("../../../tests/fixtures/transcripts/claude-code-2.1.332/rewind.jsonl")
            .lines()
            .map(|l| Record::parse(l).unwrap())
            .collect()
    }

    fn counter() -> impl FnMut() -> String {
        let mut n = 0;
        move || {
            n += 1;
            format!("c-{n}")
        }
    }

    #[test]
    fn compacts_the_captured_session_before_its_own_compact() {
        // Up to the reply before the program's own /compact.
        let records: Vec<Record> = fixture().into_iter().take(57).collect();
        assert_eq!(
            files_read(&records),
            [
                "/home/dev/proj/src/app.py",
                "/home/dev/proj/src/util.py",
                "/home/dev/proj/README.md",
                "/home/dev/proj/src/big.py"
            ]
        );
        let files = [
            FileNow { path: "/home/dev/proj/src/app.py".into(), exists: true, content: Some("print(1)\n".into()) },
            FileNow { path: "/home/dev/proj/src/big.py".into(), exists: true, content: Some("x = 1\n".repeat(20_000)) },
            FileNow { path: "/home/dev/proj/README.md".into(), exists: false, content: None },
        ];
        let plan =
            plan_compaction(&records, &files, None, Some("the files read"), "2026-12-02T10:00:00.000Z", &mut counter())
                .unwrap();
        assert_eq!(plan.lines.len(), 4, "boundary, summary, two attachments");
        let attachments: Vec<serde_json::Value> =
            plan.lines[2..].iter().map(|l| serde_json::from_str(l).unwrap()).collect();
        // The big file is named, the small one re-attached in the program's `file` shape;
        // the deleted README is left out; util.py was not looked up.
        assert_eq!(attachments[0]["attachment"]["type"], "compact_file_reference");
        assert_eq!(attachments[0]["attachment"]["filename"], "/home/dev/proj/src/big.py");
        assert_eq!(attachments[1]["attachment"]["type"], "file");
        assert_eq!(attachments[1]["attachment"]["content"]["file"]["content"], "print(1)\n");
        assert_eq!(attachments[1]["attachment"]["displayPath"], "src/app.py");
        let boundary: serde_json::Value = serde_json::from_str(&plan.lines[0]).unwrap();
        let summary: serde_json::Value = serde_json::from_str(&plan.lines[1]).unwrap();
        let metadata = &boundary["compactMetadata"];
        assert_eq!(metadata["trigger"], "manual");
        assert_eq!(metadata[BATCH_FIELD], 4);
        // The last reply stays in view by reference, anchored to the summary.
        assert_eq!(metadata["preservedSegment"]["headUuid"], "5c6554ca-da77-489c-9d0c-42beef9a12a7");
        assert_eq!(metadata["preservedSegment"]["anchorUuid"], summary["uuid"]);
        assert_eq!(plan.kept, 1);
        assert_eq!(boundary["logicalParentUuid"], "5c6554ca-da77-489c-9d0c-42beef9a12a7");
        assert_eq!(boundary["sessionId"], "b7d55388-c9ad-4169-a8d1-459fc6bdb46f");
        assert_eq!(summary["isCompactSummary"], true);
        assert_eq!(summary["parentUuid"], boundary["uuid"]);
        let text = summary["message"]["content"].as_str().unwrap();
        for prompt in ["Please read the app and util files", "What does util.py export?"] {
            assert!(text.contains(prompt), "every user message is in the summary: {text}");
        }
        // The fixed part is the first request's 12,881 tokens.
        assert!(plan.post_tokens > 12_881 && plan.post_tokens < plan.pre_tokens + 12_881, "{plan:?}");
        assert_eq!(plan.session_id.as_deref(), Some("b7d55388-c9ad-4169-a8d1-459fc6bdb46f"));
        // Read back, the view keeps the reply right after the summary.
        let mut all = records.clone();
        all.extend(plan.lines.iter().map(|l| Record::parse(l).unwrap()));
        let kept = crate::preserved::preserved(&all[57], &all[..57]);
        assert_eq!(kept.kept, vec![55]);
    }

    #[test]
    fn the_sessions_plan_comes_back_after_the_summary() {
        let records: Vec<Record> = fixture().into_iter().take(57).collect();
        // The program writes a slug on its records from its first compaction on.
        assert_eq!(plan_slug(&records), None);
        assert_eq!(plan_slug(&fixture()).as_deref(), Some("robust-snuggling-aho"));
        let plan = PlanFile {
            path: "/home/dev/.claude/plans/robust-snuggling-aho.md".into(),
            content: "1. Read util.py\n2. MARKER-PLAN-STEP".into(),
        };
        let compaction = plan_compaction(&records, &[], Some(plan), None, "t", &mut counter()).unwrap();
        let last: serde_json::Value = serde_json::from_str(compaction.lines.last().unwrap()).unwrap();
        assert_eq!(last["attachment"]["type"], "plan_file_reference");
        assert_eq!(last["attachment"]["planFilePath"], "/home/dev/.claude/plans/robust-snuggling-aho.md");
        assert!(last["attachment"]["planContent"].as_str().unwrap().contains("MARKER-PLAN-STEP"));
        let boundary: serde_json::Value = serde_json::from_str(&compaction.lines[0]).unwrap();
        assert_eq!(boundary["compactMetadata"][BATCH_FIELD], compaction.lines.len());
        // A slug that is not a plain name is no plan name.
        let odd = Record::parse(r#"{"type":"user","uuid":"u","sessionId":"s","slug":"../../etc/passwd"}"#).unwrap();
        assert_eq!(plan_slug(&[odd]), None);
    }

    #[test]
    fn a_summary_written_elsewhere_is_installed_and_checked_for_fidelity() {
        let records: Vec<Record> = fixture().into_iter().take(57).collect();
        let prepared = prepare(&records, &EnvConfig::default()).unwrap();
        // The last reply stays; everything before it is summarized.
        assert_eq!(prepared.split, 55);
        assert_eq!(prepared.summarized(&records).len(), 55);
        assert!(prepared.keeps_messages(&records));
        // The offline path is prepare + offline_summary + plan_compaction_with.
        let body = offline_summary(&records, &prepared, Some("files")).unwrap();
        let one_step = plan_compaction(&records, &[], None, Some("files"), "t", &mut counter()).unwrap();
        let split =
            plan_compaction_with(&records, &prepared, &body, &[], None, &Lookup::default(), "t", &mut counter())
                .unwrap();
        assert_eq!(one_step, split);
        assert_eq!(split.fidelity_appended, 0, "the offline summary holds every user message");

        // A provider's body that names one request only: the others are appended to it.
        let remote = "1. Primary Request and Intent:\n   REMOTE-BODY: read the app file.";
        let plan =
            plan_compaction_with(&records, &prepared, remote, &[], None, &Lookup::default(), "t", &mut counter())
                .unwrap();
        let summary: serde_json::Value = serde_json::from_str(&plan.lines[1]).unwrap();
        let text = summary["message"]["content"].as_str().unwrap();
        assert!(text.contains("REMOTE-BODY"), "{text}");
        assert!(text.contains("What does util.py export?"), "a missed user message is appended: {text}");
        assert!(plan.fidelity_appended > 0);
        assert_eq!(plan.kept, 1);
        assert_eq!(plan.pre_tokens, one_step.pre_tokens);
    }

    #[test]
    fn refusals() {
        let not_claude = vec![Record::parse(r#"{"type":"user","message":{"role":"user","content":"hi"}}"#).unwrap()];
        assert_eq!(plan_compaction(&not_claude, &[], None, None, "t", &mut counter()), Err(Refusal::NotClaudeCode));
        // Right after the program's own compaction and one reply: nothing new to summarize.
        let records: Vec<Record> = fixture().into_iter().take(76).collect();
        assert_eq!(plan_compaction(&records, &[], None, None, "t", &mut counter()), Err(Refusal::NothingToSummarize));
    }

    #[test]
    fn undo_takes_back_exactly_ctxds_install() {
        let records: Vec<Record> = fixture().into_iter().take(57).collect();
        let plan = plan_compaction(&records, &[], None, None, "t", &mut counter()).unwrap();
        let mut offset = 0u64;
        let mut lines: Vec<(u64, Record)> = Vec::new();
        for record in records.iter().cloned().chain(plan.lines.iter().map(|l| Record::parse(l).unwrap())) {
            let len = record.line().len() as u64 + 1;
            lines.push((offset, record));
            offset += len;
        }
        let before: u64 = records.iter().map(|r| r.line().len() as u64 + 1).sum();
        assert_eq!(plan_undo(&lines), Ok(before));
        // A turn after it: refused.
        let mut more = lines.clone();
        more.push((offset, records[54].clone()));
        assert_eq!(plan_undo(&more), Err(Refusal::ContinuedSince(1)));
        // The program's own compaction is not ctxd's to undo.
        let theirs: Vec<(u64, Record)> = fixture().into_iter().enumerate().map(|(i, r)| (i as u64, r)).collect();
        assert_eq!(plan_undo(&theirs), Err(Refusal::NotOurs));
    }

    /// A session of `turns` prompt-and-reply pairs on `model`, each prompt naming its
    /// turn in its first words and running on for 300 bytes.
    fn long_session(model: &str, turns: usize) -> Vec<Record> {
        let mut lines = Vec::new();
        let mut parent = serde_json::Value::Null;
        for n in 0..turns {
            let (u, a) = (format!("u-{n}"), format!("a-{n}"));
            let prompt = format!("Turn {n:04} asks for this. {}", "more words of the request ".repeat(11));
            lines.push(serde_json::json!({"type": "user", "uuid": u, "parentUuid": parent, "sessionId": "s",
                "isSidechain": false, "message": {"role": "user", "content": prompt}}));
            lines.push(serde_json::json!({"type": "assistant", "uuid": a, "parentUuid": u, "sessionId": "s",
                "isSidechain": false, "message": {"role": "assistant", "model": model, "id": format!("m-{n}"),
                    "content": [{"type": "text", "text": format!("Done with turn {n}.")}],
                    "usage": {"input_tokens": 1000 + n, "output_tokens": 10}}}));
            parent = serde_json::Value::String(a);
        }
        lines.iter().map(|l| Record::parse(&l.to_string()).unwrap()).collect()
    }

    #[test]
    fn the_summary_cap_follows_the_models_window() {
        let env = EnvConfig::default();
        let big = summary_cap_tokens(&long_session("claude-opus-5-5", 2), &env);
        assert!(big > 40_000 && big <= crate::summary::MAX_OFFLINE_CAP_TOKENS, "{big}");
        // A 200k window keeps the program's own cap on a summary reply.
        assert_eq!(summary_cap_tokens(&long_session("claude-sonnet-4-5", 2), &env), DEFAULT_MAX_OUTPUT_TOKENS);
        assert_eq!(summary_cap_tokens(&long_session("some-unknown-model", 2), &env), DEFAULT_MAX_OUTPUT_TOKENS);
    }

    #[test]
    fn a_long_session_on_a_million_token_window_keeps_every_user_message() {
        let records = long_session("claude-opus-5-5", 1_200);
        let plan = plan_compaction(&records, &[], None, None, "t", &mut counter()).unwrap();
        let summary: serde_json::Value = serde_json::from_str(&plan.lines[1]).unwrap();
        let text = summary["message"]["content"].as_str().unwrap();
        // All but the newest turn, whose reply stays in view.
        for n in 0..1_199 {
            assert!(text.contains(&format!("Turn {n:04} asks")), "turn {n} is missing");
        }
        assert!(!text.contains("more user messages cut"));
        // The same session on a 200k window: the newest stay, the oldest are counted.
        let records = long_session("claude-sonnet-4-5", 2_500);
        let plan = plan_compaction(&records, &[], None, None, "t", &mut counter()).unwrap();
        let summary: serde_json::Value = serde_json::from_str(&plan.lines[1]).unwrap();
        let text = summary["message"]["content"].as_str().unwrap();
        assert!(text.contains("Turn 2498 asks") && !text.contains("Turn 0001 asks"));
        assert!(text.contains("more user messages cut …]"));
    }

    #[test]
    fn a_providers_short_summary_of_a_long_session_gets_every_user_message_added() {
        // 2,400 prompts: briefly (about 50 bytes each) past half the cap, within all of it.
        let records = long_session("claude-opus-5-5", 2_400);
        let prepared = prepare(&records, &EnvConfig::default()).unwrap();
        let remote = "1. Primary Request and Intent:\n   The user worked through many turns.";
        let plan =
            plan_compaction_with(&records, &prepared, remote, &[], None, &Lookup::default(), "t", &mut counter())
                .unwrap();
        let summary: serde_json::Value = serde_json::from_str(&plan.lines[1]).unwrap();
        let text = summary["message"]["content"].as_str().unwrap();
        let missing: Vec<usize> = (0..2_399).filter(|n| !text.contains(&format!("Turn {n:04} asks"))).collect();
        assert!(missing.is_empty(), "{} of 2,399 missing, the first {:?}", missing.len(), missing.first());
        let cap_bytes = prepared.summary_cap_tokens * crate::tally::BYTES_PER_TOKEN;
        assert!(text.len() as u64 <= cap_bytes + 4_096, "{} bytes, cap {cap_bytes}", text.len());
    }

    #[test]
    fn a_rewound_branch_is_not_summarized() {
        let records = rewound();
        let prepared = prepare(&records, &EnvConfig::default()).unwrap();
        let body = offline_summary(&records, &prepared, None).unwrap();
        for active in ["MARK-REWIND-1", "MARK-REWIND-2", "MARK-BRANCH-3"] {
            assert!(body.contains(active), "{active} is on the active chain:\n{body}");
        }
        for abandoned in ["MARK-REWIND-3", "MARK-REWIND-4", "MARK-REWIND-5", "abandoned.txt", "STUB-REPLY-6"] {
            assert!(!body.contains(abandoned), "{abandoned} was rewound away from:\n{body}");
        }
        // The kept tail is the newest reply, as without a rewind.
        let last_reply = records.iter().rposition(|r| is_message(r) && r.head().kind == Kind::Assistant).unwrap();
        assert_eq!(prepared.split, last_reply);
        let files = [
            FileNow { path: "/tmp/rw/w/proj/abandoned.txt".into(), exists: true, content: Some("gone\n".into()) },
            FileNow { path: "/tmp/rw/w/proj/active.txt".into(), exists: true, content: Some("here\n".into()) },
        ];
        let plan = plan_compaction(&records, &files, None, None, "t", &mut counter()).unwrap();
        let text = plan.lines.join("\n");
        assert!(!text.contains("MARK-REWIND-3") && !text.contains("MARK-REWIND-5"), "{text}");
        assert!(!text.contains("abandoned.txt"), "a file read on the abandoned branch is not restored: {text}");
        assert!(text.contains("active.txt"));
        let boundary: serde_json::Value = serde_json::from_str(&plan.lines[0]).unwrap();
        assert_eq!(boundary["logicalParentUuid"], records[last_reply].uuid().unwrap());
        assert_eq!(boundary["compactMetadata"]["preservedSegment"]["headUuid"], records[last_reply].uuid().unwrap());
        assert_eq!(plan.kept, 1);
    }

    /// Turns of a branch: each prompt (`{name} {n:02} asks`) hangs off `parent`, its
    /// reply reads `/p/{name}-{n}.rs` with a tool call and answers. The last record's uuid
    /// is the next parent.
    fn branch(name: &str, turns: std::ops::Range<usize>, mut parent: String) -> (Vec<Record>, String) {
        let mut lines = Vec::new();
        for n in turns {
            let id = |part: &str| format!("{name}-{n}-{part}");
            let path = format!("/p/{name}-{n}.rs");
            lines.push(serde_json::json!({"type": "user", "uuid": id("u"), "parentUuid": parent, "sessionId": "s",
                "isSidechain": false, "message": {"role": "user", "content": format!("{name} {n:02} asks for a change.")}}));
            lines.push(
                serde_json::json!({"type": "assistant", "uuid": id("c"), "parentUuid": id("u"), "sessionId": "s",
                "isSidechain": false, "message": {"role": "assistant", "model": "claude-sonnet-4-5", "id": id("m1"),
                    "content": [{"type": "tool_use", "id": id("t"), "name": "Read", "input": {"file_path": path}}],
                    "usage": {"input_tokens": 1000 + n, "output_tokens": 10}}}),
            );
            lines.push(serde_json::json!({"type": "user", "uuid": id("r"), "parentUuid": id("c"), "sessionId": "s",
                "isSidechain": false, "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id("t"), "content": "fn x() {}"}]},
                "toolUseResult": {"type": "text", "file": {"filePath": path, "content": "fn x() {}", "numLines": 1, "startLine": 1, "totalLines": 1}}}));
            lines.push(
                serde_json::json!({"type": "assistant", "uuid": id("a"), "parentUuid": id("r"), "sessionId": "s",
                "isSidechain": false, "message": {"role": "assistant", "model": "claude-sonnet-4-5", "id": id("m2"),
                    "content": [{"type": "text", "text": format!("{name} {n:02} is done.")}],
                    "usage": {"input_tokens": 1100 + n, "output_tokens": 10}}}),
            );
            parent = id("a");
        }
        (lines.iter().map(|l| Record::parse(&l.to_string()).unwrap()).collect(), parent)
    }

    #[test]
    fn a_rewind_after_a_compaction_summarizes_the_active_chain_only() {
        // Ten turns, compacted by ctxd (a boundary keeping the last reply by reference);
        // then twenty turns, of which the user rewound the last ten: a new branch of
        // five hangs off turn 9's reply.
        let (mut records, _) = branch("Before", 0..10, String::new());
        let first = plan_compaction(&records, &[], None, None, "t0", &mut counter()).unwrap();
        records.extend(first.lines.iter().map(|l| Record::parse(l).unwrap()));
        // The program goes on from the kept reply, which it puts back after the summary.
        assert_eq!(first.kept, 1);
        let (after, tip) = branch("Turn", 0..10, "Before-9-a".to_owned());
        records.extend(after);
        let (abandoned, _) = branch("Abandoned", 10..20, tip.clone());
        let (active, _) = branch("Again", 10..15, tip);
        let without: Vec<Record> = records.iter().chain(&active).cloned().collect();
        records.extend(abandoned);
        records.extend(active);

        let prepared = prepare(&records, &EnvConfig::default()).unwrap();
        assert_eq!(prepared.off_chain.len(), 40, "the ten abandoned turns");
        let body = offline_summary(&records, &prepared, None).unwrap();
        assert!(!body.contains("Abandoned"), "{body}");
        for n in 0..10 {
            assert!(body.contains(&format!("Turn {n:02} asks")), "turn {n}: {body}");
        }
        for n in 10..14 {
            assert!(body.contains(&format!("Again {n:02} asks")), "turn {n}: {body}");
        }
        // The whole install is the one the transcript without the abandoned branch gets:
        // the same summary, kept tail, boundary (its logical parent and preserved
        // segment), restored files and token counts.
        let files: Vec<FileNow> = files_read(&records)
            .into_iter()
            .map(|path| FileNow { content: Some(format!("// {path}\n")), path, exists: true })
            .collect();
        let plan = plan_compaction(&records, &files, None, None, "t1", &mut counter()).unwrap();
        let expected = plan_compaction(&without, &files, None, None, "t1", &mut counter()).unwrap();
        assert_eq!(plan, expected);
        assert!(!plan.lines.join("\n").contains("Abandoned"), "{:?}", plan.lines);
        let boundary: serde_json::Value = serde_json::from_str(&plan.lines[0]).unwrap();
        assert_eq!(boundary["logicalParentUuid"], "Again-14-a");
        assert_eq!(boundary["compactMetadata"]["preservedSegment"]["headUuid"], "Again-14-a");
        // A provider's summary that names nothing: the fidelity check adds the active
        // chain's prompts, not the abandoned ones.
        let remote = "1. Primary Request and Intent:\n   Nothing recorded.";
        let plan =
            plan_compaction_with(&records, &prepared, remote, &[], None, &Lookup::default(), "t", &mut counter())
                .unwrap();
        let text = plan.lines[1].as_str();
        assert!(text.contains("Again 13 asks") && !text.contains("Abandoned"), "{text}");
    }

    #[test]
    fn the_summary_closes_with_the_history_tools_when_the_caller_found_them() {
        let records = fixture();
        let prepared = prepare(&records, &EnvConfig::default()).unwrap();
        let body = offline_summary(&records, &prepared, None).unwrap();
        let summary_of = |lookup: &Lookup| {
            let plan =
                plan_compaction_with(&records, &prepared, &body, &[], None, lookup, "t", &mut counter()).unwrap();
            let summary: serde_json::Value = serde_json::from_str(&plan.lines[1]).unwrap();
            summary["message"]["content"].as_str().unwrap().to_owned()
        };
        let path = Some("/home/u/.claude/projects/-p/s.jsonl".to_owned());
        let tools = HistoryTools { search: "mcp__ctxd__search_history".into(), read: "mcp__ctxd__read_history".into() };
        let with = summary_of(&Lookup { transcript_path: path.clone(), history_tools: Some(tools) });
        assert!(with.contains("searched with the mcp__ctxd__search_history tool"), "{with}");
        assert!(
            with.contains("mcp__ctxd__read_history (it is the file /home/u/.claude/projects/-p/s.jsonl)"),
            "{with}"
        );
        let without = summary_of(&Lookup { transcript_path: path, history_tools: None });
        assert!(without.contains("is the file /home/u/.claude/projects/-p/s.jsonl. Search it"), "{without}");
        assert!(!without.contains("mcp__"), "{without}");
        // Only that line differs.
        let strip =
            |text: &str| text.split("\n\n").filter(|p| !p.contains("complete record")).collect::<Vec<_>>().join("\n\n");
        assert_eq!(strip(&with), strip(&without));
    }
}
