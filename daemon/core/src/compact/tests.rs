//! Tests of the planner over small fixtures: a session shaped like a real Claude Code
//! transcript, and request bodies shaped like what `ctx/assemble` returns.

use expect_test::expect;
use serde_json::{Value, json};

use super::*;
use crate::budget::Thresholds;
use crate::record::Record;

// ---------------------------------------------------------------------------------
// Fixtures.

fn rec(value: Value) -> Record {
    let Value::Object(object) = value else {
        panic!("fixture must be an object");
    };
    Record::from_object(&object).unwrap()
}

const COMMON: &str = r#"{"userType":"external","cwd":"/p","sessionId":"s1","version":"2.1.332","gitBranch":"main"}"#;

fn with_common(mut value: Value) -> Value {
    let common: Value = serde_json::from_str(COMMON).unwrap();
    if let (Some(object), Some(common)) = (value.as_object_mut(), common.as_object()) {
        for (k, v) in common {
            object.insert(k.clone(), v.clone());
        }
    }
    value
}

fn user(uuid: &str, parent: Option<&str>, text: &str) -> Record {
    rec(with_common(json!({
        "parentUuid": parent, "isSidechain": false, "type": "user",
        "message": {"role": "user", "content": text},
        "uuid": uuid, "timestamp": "2026-11-29T10:00:00.000Z",
    })))
}

fn assistant(uuid: &str, parent: &str, msg_id: &str, block: Value) -> Record {
    rec(with_common(json!({
        "parentUuid": parent, "isSidechain": false,
        "message": {"id": msg_id, "type": "message", "role": "assistant", "model": "claude-x",
                    "content": [block], "stop_reason": "tool_use",
                    "usage": {"input_tokens": 150000, "cache_creation_input_tokens": 0,
                              "cache_read_input_tokens": 0, "output_tokens": 50}},
        "type": "assistant", "uuid": uuid, "timestamp": "2026-11-29T10:00:01.000Z",
    })))
}

fn tool_use(id: &str, name: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": id, "name": name, "input": input})
}

fn tool_result(uuid: &str, parent: &str, tool_use_id: &str, text: &str) -> Record {
    rec(with_common(json!({
        "parentUuid": parent, "isSidechain": false, "type": "user",
        "message": {"role": "user", "content": [{"tool_use_id": tool_use_id, "type": "tool_result", "content": text}]},
        "uuid": uuid, "timestamp": "2026-11-29T10:00:02.000Z",
        "sourceToolAssistantUUID": parent,
    })))
}

/// A two-turn session: read and fix app.py, then write a test (the last tool round is
/// still open: automatic compaction fires before the next model call).
fn session() -> Vec<Record> {
    vec![
        user("u1", None, "Please read src/app.py and fix the add function; it subtracts."),
        assistant("a1", "u1", "msg_1", json!({"type": "text", "text": "Let me look."})),
        assistant("a2", "a1", "msg_1", tool_use("toolu_1", "Read", json!({"file_path": "/p/src/app.py"}))),
        tool_result("r1", "a2", "toolu_1", "1\tdef add(a, b):\n2\t    return a - b"),
        assistant(
            "a3",
            "r1",
            "msg_2",
            tool_use(
                "toolu_2",
                "Edit",
                json!({"file_path": "/p/src/app.py", "old_string": "a - b", "new_string": "a + b"}),
            ),
        ),
        tool_result("r2", "a3", "toolu_2", "The file /p/src/app.py has been updated."),
        assistant("a4", "r2", "msg_3", json!({"type": "text", "text": "Fixed: add now adds."})),
        user("u2", Some("a4"), "Now add a test in tests/test_app.py"),
        rec(json!({"type": "last-prompt", "lastPrompt": "Now add a test", "sessionId": "s1"})),
        assistant(
            "a5",
            "u2",
            "msg_4",
            tool_use(
                "toolu_3",
                "Write",
                json!({"file_path": "/p/tests/test_app.py", "content": "from app import add\n"}),
            ),
        ),
        rec(json!({"type": "progress", "data": {"type": "hook_progress"}, "uuid": "pg1", "sessionId": "s1"})),
        tool_result("r3", "a5", "toolu_3", "File created successfully at: /p/tests/test_app.py"),
    ]
}

fn counter() -> impl FnMut() -> String {
    let mut n = 0;
    move || {
        n += 1;
        format!("uuid-{n}")
    }
}

fn lines(records: &[Record]) -> String {
    records.iter().map(Record::line).collect::<Vec<_>>().join("\n")
}

fn value(record: &Record) -> Value {
    record.to_value()
}

// ---------------------------------------------------------------------------------
// Installation.

#[test]
fn kept_tail_start_keeps_the_open_tool_round() {
    let records = session();
    assert_eq!(kept_tail_start(&records), Some(9), "the Write call a5");
    // Ending with a real prompt: keep the prompt.
    assert_eq!(kept_tail_start(&records[..9]), Some(7));
    // Ending with a finished answer: keep the answer.
    assert_eq!(kept_tail_start(&records[..7]), Some(6));
    // No messages: nothing to keep.
    assert_eq!(kept_tail_start(&[]), None);
    // A response split over lines is kept whole: from a1, not a2.
    assert_eq!(kept_tail_start(&records[..4]), Some(1));
}

fn restored_attachments() -> Vec<RestoredAttachment> {
    let plan = plan_restoration(&RestoreInput {
        files: vec![
            FileReadEntry {
                path: "/p/src/app.py".to_owned(),
                read_order: 2,
                tokens: 10,
                exists: true,
                content: Some("def add(a, b):\n    return a + b\n".to_owned()),
                changed_since_read: true,
                in_kept_tail: false,
            },
            FileReadEntry {
                path: "/p/src/big.py".to_owned(),
                read_order: 1,
                tokens: 9_000,
                exists: true,
                content: None,
                changed_since_read: false,
                in_kept_tail: false,
            },
        ],
        cwd: Some("/p".to_owned()),
        ..RestoreInput::default()
    });
    plan.attachments
}

fn auto_install<'a>(
    records: &'a [Record],
    attachments: &'a [RestoredAttachment],
    hooks: &'a [String],
) -> InstallInput<'a> {
    let kept_from = kept_tail_start(records).unwrap();
    let summary_text = summary_message_text(&SummaryMessage {
        body: "1. Primary Request and Intent:\n   Fix add; write a test.".to_owned(),
        transcript_path: None,
        history_tools: None,
        tools_used: tools_used(&records[..kept_from]),
        kept: KeptMessages::After,
    });
    InstallInput {
        trigger: Trigger::Auto,
        last_uuid: records.last().and_then(|r| r.uuid().map(str::to_owned)),
        pre_tokens: 150_050,
        fixed_prefix_tokens: Some(12_000),
        duration_ms: 840,
        summary_text,
        kept_before: &[],
        kept_after: &records[kept_from..],
        attachments,
        hook_outputs: hooks,
        common: common_fields(&records[0]),
        timestamp: "2026-11-29T10:05:00.000Z".to_owned(),
        tokens_per_kib: None,
        attachment_links: super::AttachmentLinks::Loose,
    }
}

#[test]
fn post_compact_records_for_automatic_compaction() {
    let records = session();
    let attachments = restored_attachments();
    let hooks = vec!["Remember: run pytest before committing.".to_owned(), "  ".to_owned()];
    let input = auto_install(&records, &attachments, &hooks);
    let mut next = counter();
    let built = build_post_compact(&input, &mut next).unwrap();
    expect![[r#"
        {"parentUuid":null,"logicalParentUuid":"r3","isSidechain":false,"type":"system","subtype":"compact_boundary","content":"Conversation compacted","isMeta":false,"timestamp":"2026-11-29T10:05:00.000Z","uuid":"uuid-1","level":"info","compactMetadata":{"trigger":"auto","preTokens":150050,"postTokens":12436,"durationMs":840,"preservedSegment":{"headUuid":"a5","anchorUuid":"uuid-2","tailUuid":"r3"},"preservedMessages":{"anchorUuid":"uuid-2","uuids":["a5","r3"],"allUuids":["a5","r3"]},"ctxdReferences":true,"ctxdBatch":6},"userType":"external","cwd":"/p","sessionId":"s1","version":"2.1.332","gitBranch":"main"}
        {"parentUuid":"uuid-1","isSidechain":false,"type":"user","message":{"role":"user","content":"This session picks up where an earlier conversation left off when it ran out of context; the summary below takes the place of that conversation.\n\nTools used before this summary: Read, Edit.\n\nSummary:\n1. Primary Request and Intent:\n   Fix add; write a test.\n\nKeep working on the task that was in progress. Ask the user nothing further, and do not recap, acknowledge or announce anything about this summary: your next message simply takes the next step of that task.\n\nBelow this summary come the last messages from before compaction, unchanged. The summary was not written from them, so where the two disagree (a step it lists as pending may already be done there), the messages are right."},"isVisibleInTranscriptOnly":true,"isCompactSummary":true,"uuid":"uuid-2","timestamp":"2026-11-29T10:05:00.000Z","userType":"external","cwd":"/p","sessionId":"s1","version":"2.1.332","gitBranch":"main"}
        {"parentUuid":null,"isSidechain":false,"attachment":{"type":"file","filename":"/p/src/app.py","content":{"type":"text","file":{"filePath":"/p/src/app.py","content":"def add(a, b):\n    return a + b\n","numLines":3,"startLine":1,"totalLines":3}},"displayPath":"src/app.py"},"type":"attachment","uuid":"uuid-3","timestamp":"2026-11-29T10:05:00.000Z","rendered":[{"content":"<system-reminder>\nRead call, restored after compaction: {\"file_path\":\"/p/src/app.py\"}\n</system-reminder>"},{"content":"<system-reminder>\nRead result:\n1\tdef add(a, b):\n2\t    return a + b\n3\t\n</system-reminder>"}],"renderedRole":"user","userType":"external","cwd":"/p","sessionId":"s1","version":"2.1.332","gitBranch":"main"}
        {"parentUuid":null,"isSidechain":false,"attachment":{"type":"compact_file_reference","filename":"/p/src/big.py","displayPath":"src/big.py"},"type":"attachment","uuid":"uuid-4","timestamp":"2026-11-29T10:05:00.000Z","rendered":[{"content":"<system-reminder>\n/p/src/big.py (read earlier in this session) is not shown again here: it is too large. Use the Read tool on it if you need its content.\n</system-reminder>"}],"renderedRole":"system","userType":"external","cwd":"/p","sessionId":"s1","version":"2.1.332","gitBranch":"main"}
        {"parentUuid":null,"isSidechain":false,"attachment":{"type":"ctxd_read_files","files":[{"path":"/p/src/app.py","exists":true,"changedSinceRead":true},{"path":"/p/src/big.py","exists":true,"changedSinceRead":false}]},"type":"attachment","uuid":"uuid-5","timestamp":"2026-11-29T10:05:00.000Z","rendered":[{"content":"<system-reminder>\nFiles read before this conversation was summarized, newest first. \"unchanged\" means the file still has the content that was read; read a file again only when you need text that is not shown here.\n- src/app.py (changed since it was read, shown above)\n- src/big.py (unchanged)\n</system-reminder>"}],"renderedRole":"system","userType":"external","cwd":"/p","sessionId":"s1","version":"2.1.332","gitBranch":"main"}
        {"parentUuid":null,"isSidechain":false,"attachment":{"type":"hook_additional_context","hookEvent":"SessionStart","hookName":"SessionStart:compact","content":["Remember: run pytest before committing."]},"type":"attachment","uuid":"uuid-6","timestamp":"2026-11-29T10:05:00.000Z","rendered":[{"content":"<system-reminder>\nOutput of the SessionStart hook that runs after compaction:\nRemember: run pytest before committing.\n</system-reminder>"}],"renderedRole":"user","userType":"external","cwd":"/p","sessionId":"s1","version":"2.1.332","gitBranch":"main"}"#]]
    .assert_eq(&lines(&built.records));
    assert_eq!(built.boundary_uuid, "uuid-1");
    assert_eq!(built.summary_uuid, "uuid-2");
    assert!(built.copies.is_empty());
    assert_eq!(built.referenced, vec!["a5".to_owned(), "r3".to_owned()]);
    // The progress line in the kept tail is not a message: not referenced.
    assert_eq!(built.not_copied, vec![1]);
}

/// Every key path of a JSON value (`.a.b`, arrays as `[]`).
fn key_paths(value: &Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
    match value {
        Value::Object(object) => {
            for (k, v) in object {
                let path = format!("{prefix}.{k}");
                out.insert(path.clone());
                key_paths(v, &path, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                key_paths(item, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

/// Key paths of the records Claude Code 2.1.332 wrote for a manual compaction
/// (`manual-compact.jsonl`: the boundary, the summary, a `compact_file_reference` and a
/// `file` attachment), host fields left out.
const REAL_PATHS: &[&str] = &[
    ".compactMetadata",
    ".compactMetadata.cumulativeDroppedTokens",
    ".compactMetadata.durationMs",
    ".compactMetadata.postTokens",
    ".compactMetadata.preCompactOrganizationsCoverStart",
    ".compactMetadata.preTokens",
    ".compactMetadata.preservedMessages",
    ".compactMetadata.preservedMessages.allUuids",
    ".compactMetadata.preservedMessages.anchorUuid",
    ".compactMetadata.preservedMessages.uuids",
    ".compactMetadata.preservedSegment",
    ".compactMetadata.preservedSegment.anchorUuid",
    ".compactMetadata.preservedSegment.headUuid",
    ".compactMetadata.preservedSegment.tailUuid",
    ".compactMetadata.trigger",
    ".content",
    ".isMeta",
    ".isSidechain",
    ".level",
    ".logicalParentUuid",
    ".parentUuid",
    ".subtype",
    ".timestamp",
    ".type",
    ".uuid",
    ".isCompactSummary",
    ".isVisibleInTranscriptOnly",
    ".message",
    ".message.content",
    ".message.role",
    ".attachment",
    ".attachment.displayPath",
    ".attachment.filename",
    ".attachment.type",
    ".rendered",
    ".renderedRole",
    ".rendered[].content",
    ".attachment.content",
    ".attachment.content.file",
    ".attachment.content.file.content",
    ".attachment.content.file.filePath",
    ".attachment.content.file.numLines",
    ".attachment.content.file.startLine",
    ".attachment.content.file.totalLines",
    ".attachment.content.type",
];

#[test]
fn built_records_use_the_host_record_shapes() {
    let records = session();
    let attachments = restored_attachments();
    let input = InstallInput { common: serde_json::Map::new(), ..auto_install(&records, &attachments, &[]) };
    let built = build_post_compact(&input, &mut counter()).unwrap();
    // Boundary, summary, file, file reference: every field is one the host writes, but
    // for ctxd's own marks on the boundary's metadata (its install's size, its rate).
    for index in [0, 1, 2, 3] {
        let mut paths = std::collections::BTreeSet::new();
        key_paths(&value(&built.records[index]), "", &mut paths);
        let foreign: Vec<_> = paths
            .iter()
            .filter(|p| !REAL_PATHS.contains(&p.as_str()) && !p.starts_with(".compactMetadata.ctxd"))
            .collect();
        assert!(foreign.is_empty(), "record {index} has fields the host does not write: {foreign:?}");
    }
    assert_eq!(value(&built.records[2])["attachment"]["type"], "file");
    assert_eq!(value(&built.records[3])["attachment"]["type"], "compact_file_reference");
}

#[test]
fn post_compact_records_chain_and_read_back() {
    let records = session();
    let attachments = restored_attachments();
    let input = auto_install(&records, &attachments, &[]);
    let built = build_post_compact(&input, &mut counter()).unwrap();
    let first = &built.records[0];
    assert!(first.is_compact_boundary());
    assert_eq!(first.head().parent_uuid, None);
    assert_eq!(first.head().logical_parent_uuid.as_deref(), Some("r3"));
    // The summary follows the boundary; the restored files hang off no parent (they
    // continue from the kept messages the view puts before them).
    assert_eq!(built.records[1].head().parent_uuid.as_deref(), first.uuid());
    for attachment in &built.records[2..] {
        assert_eq!(attachment.head().parent_uuid, None, "{}", attachment.line());
    }
    assert!(built.records[1].head().is_compact_summary);
    assert_eq!(value(&built.records[1])["isVisibleInTranscriptOnly"], json!(true));
    // The kept tool round is referenced where it stands, not copied: the boundary names
    // it, and the one reader of kept messages finds exactly it.
    assert_eq!(built.referenced, vec!["a5".to_owned(), "r3".to_owned()]);
    assert!(built.copies.is_empty());
    let kept = crate::preserved::preserved(first, &records);
    let kept: Vec<_> = kept.kept.iter().map(|&i| records[i].uuid().unwrap_or("")).collect();
    assert_eq!(kept, ["a5", "r3"]);
    assert_eq!(value(first)["compactMetadata"]["preservedSegment"]["anchorUuid"], json!(built.summary_uuid));
    let mut tally = crate::tally::Tally::default();
    for record in &built.records {
        tally.observe(record);
    }
    assert!(tally.total() < 2_000, "tally after compaction: {}", tally.total());
    // The view after the boundary is exactly what was built.
    let mut all = records.clone();
    all.extend(built.records.iter().cloned());
    let view = compaction_view(&all);
    assert_eq!(view.boundary, Some(records.len()));
    assert_eq!(view.select(&all).len(), built.records.len() - 1);
    // installed_tokens is what postTokens adds to the fixed prefix.
    assert_eq!(value(first)["compactMetadata"]["postTokens"], json!(12_000 + built.installed_tokens));
}

/// The uuids of the messages the view shows of `records`, in view order.
fn viewed(records: &[Record]) -> Vec<String> {
    let (slice, _) = crate::view::slice::slice_after_boundary(records);
    slice.kept().filter_map(|i| records[i].uuid().map(str::to_owned)).collect()
}

#[test]
fn a_prompt_appended_during_the_compaction_and_the_restored_files_stay_in_view() {
    // The compaction ran on the session; meanwhile the host appended the next prompt,
    // which follows the last tool result. Install keeps it with the tool round.
    let mut records = session();
    records.push(user("u9", Some("r3"), "Now run the tests, please."));
    let attachments = restored_attachments();
    let hooks = vec!["Remember: run pytest before committing.".to_owned()];
    let input = InstallInput { kept_after: &records[9..], ..auto_install(&records[..12], &attachments, &hooks) };
    assert_eq!(records[9].uuid(), Some("a5"));
    let built = build_post_compact(&input, &mut counter()).unwrap();
    assert_eq!(built.referenced, ["a5", "r3", "u9"]);
    let installed: Vec<String> = built.records[1..].iter().filter_map(|r| r.uuid().map(str::to_owned)).collect();
    let mut all = records.clone();
    all.extend(built.records.iter().cloned());
    // Right after the install: the summary, the kept messages, the restored files.
    let mut expected = vec![installed[0].clone(), "a5".into(), "r3".into(), "u9".into()];
    expected.extend(installed[1..].iter().cloned());
    assert_eq!(viewed(&all), expected);
    // The host's reply names the prompt as its parent: nothing leaves the view.
    all.push(assistant("a9", "u9", "msg_9", json!({"type": "text", "text": "Running them."})));
    expected.push("a9".into());
    assert_eq!(viewed(&all), expected);
}

#[test]
fn in_a_claude_code_transcript_the_restored_files_and_hook_output_are_chained_after_the_summary() {
    // The program walks parentUuid from its newest record: a record off that chain is
    // left out of its request, so the install links each after the one before.
    let records = session();
    let attachments = restored_attachments();
    let hooks = vec!["Remember: run pytest before committing.".to_owned()];
    let loose = build_post_compact(&auto_install(&records, &attachments, &hooks), &mut counter()).unwrap();
    let input =
        InstallInput { attachment_links: AttachmentLinks::Chained, ..auto_install(&records, &attachments, &hooks) };
    let chained = build_post_compact(&input, &mut counter()).unwrap();
    let parents = |built: &PostCompact| -> Vec<Value> {
        built.records[2..].iter().map(|r| r.to_value()["parentUuid"].clone()).collect()
    };
    let added = chained.records.len() - 2;
    assert!(added > attachments.len(), "files and the hook output");
    assert_eq!(parents(&loose), vec![Value::Null; added]);
    let mut expected = Vec::new();
    for pair in chained.records[1..].windows(2) {
        expected.push(json!(pair[0].uuid().unwrap()));
    }
    assert_eq!(parents(&chained), expected, "each after the one before, the first after the summary");
    assert_eq!(chained.records[1].uuid(), Some(chained.summary_uuid.as_str()));
}

#[test]
fn the_request_tokens_stamped_on_a_boundary_read_back_with_its_batch() {
    let records = session();
    let attachments = restored_attachments();
    let mut built = build_post_compact(&auto_install(&records, &attachments, &[]), &mut counter()).unwrap();
    assert_eq!(boundary_request_tokens(&built.records[0]), None);
    stamp_request_tokens(&mut built, 14_233).unwrap();
    let batch = built.records.len() as u64;
    assert_eq!(boundary_request_tokens(&built.records[0]), Some((14_233, batch)));
    assert_eq!(built.records[0].uuid(), Some(built.boundary_uuid.as_str()));
    // Folded as a session folds it: the base stands for the whole install.
    let mut tally = crate::tally::Tally::default();
    tally.anchor_install(14_233, batch);
    for record in &built.records {
        tally.observe(record);
    }
    assert_eq!(tally.total(), 14_233);
}

#[test]
fn nothing_kept_means_no_preserved_segment() {
    let records = session();
    let mut input = auto_install(&records, &[], &[]);
    input.kept_after = &[];
    input.fixed_prefix_tokens = None;
    input.trigger = Trigger::Manual;
    let built = build_post_compact(&input, &mut counter()).unwrap();
    assert_eq!(built.records.len(), 2);
    let metadata = &value(&built.records[0])["compactMetadata"];
    assert_eq!(metadata["trigger"], json!("manual"));
    assert_eq!(metadata.get("preservedSegment"), None);
    assert_eq!(metadata.get("postTokens"), None);
}

#[test]
fn invalid_kept_slices_are_refused() {
    let records = session();
    let mut input = auto_install(&records, &[], &[]);
    // The tool result r3 without the Write call that asked for it.
    input.kept_after = &records[11..];
    assert_eq!(
        build_post_compact(&input, &mut counter()),
        Err(InstallError::OrphanToolResult { tool_use_id: "toolu_3".to_owned() })
    );
    // The earliest messages ending with a call whose result would be summarized.
    input.kept_after = &[];
    input.kept_before = &records[..3];
    assert_eq!(
        build_post_compact(&input, &mut counter()),
        Err(InstallError::UnansweredToolUse { tool_use_id: "toolu_1".to_owned() })
    );
    input.kept_after = &records[9..];
    assert_eq!(build_post_compact(&input, &mut counter()), Err(InstallError::KeptOnBothSides));
    input.kept_before = &[];
    input.summary_text = " \n".to_owned();
    assert_eq!(build_post_compact(&input, &mut counter()), Err(InstallError::EmptySummary));
}

#[test]
fn safe_split_never_separates_a_call_from_its_result() {
    let records = session();
    // Between a2 (the Read call) and r1 (its result): back to a1, the response's start.
    assert_eq!(safe_split(&records, 3), 1);
    // Between the two lines of one response.
    assert_eq!(safe_split(&records, 2), 1);
    // At a prompt: already safe.
    assert_eq!(safe_split(&records, 7), 7);
    assert_eq!(safe_split(&records, 0), 0);
    assert_eq!(safe_split(&records, 99), records.len());
}

#[test]
fn partial_compaction_in_both_directions() {
    let records = session();
    // Summarize from the second prompt on; keep the first turn.
    let from = partial_plan(&records, 7, SplitDirection::From);
    assert_eq!((from.summarize.clone(), from.keep.clone()), (7..12, 0..7));
    // Summarize up to the first answer; keep the second turn.
    let up_to = partial_plan(&records, 6, SplitDirection::UpTo);
    assert_eq!((up_to.summarize.clone(), up_to.keep.clone()), (0..7, 7..12));
    // Up to the Read call: its result would be cut off, so the split moves back.
    let moved = partial_plan(&records, 2, SplitDirection::UpTo);
    assert_eq!(moved.summarize, 0..1);

    let text = summary_message_text(&SummaryMessage {
        body: "Recent part: a test for add is being written.".to_owned(),
        transcript_path: None,
        history_tools: None,
        tools_used: Vec::new(),
        kept: KeptMessages::Before,
    });
    let input = InstallInput {
        trigger: Trigger::Partial,
        last_uuid: Some("r3".to_owned()),
        pre_tokens: 1_000,
        fixed_prefix_tokens: None,
        duration_ms: 5,
        summary_text: text,
        kept_before: &records[from.keep.clone()],
        kept_after: &[],
        attachments: &[],
        hook_outputs: &[],
        common: common_fields(&records[0]),
        timestamp: "t".to_owned(),
        tokens_per_kib: None,
        attachment_links: super::AttachmentLinks::Loose,
    };
    let built = build_post_compact(&input, &mut counter()).unwrap();
    let kinds: Vec<String> = built
        .records
        .iter()
        .map(|r| {
            let v = value(r);
            format!(
                "{} {}{}",
                v["type"].as_str().unwrap_or(""),
                v["uuid"].as_str().unwrap_or(""),
                v.get("ctxdKeptFrom").map(|k| format!(" <- {}", k.as_str().unwrap_or(""))).unwrap_or_default()
            )
        })
        .collect();
    expect![[r#"
        system uuid-1
        user uuid-3 <- u1
        assistant uuid-4 <- a1
        assistant uuid-5 <- a2
        user uuid-6 <- r1
        assistant uuid-7 <- a3
        user uuid-8 <- r2
        assistant uuid-9 <- a4
        user uuid-2"#]]
    .assert_eq(&kinds.join("\n"));
    // The earliest messages hang after the boundary, as copies only: the boundary does
    // not also point at the originals.
    assert_eq!(value(&built.records[0])["compactMetadata"].get("preservedSegment"), None);
    assert_eq!(built.records[1].head().parent_uuid.as_deref(), Some("uuid-1"));
    assert_eq!(built.records[8].head().parent_uuid.as_deref(), Some("uuid-9"));
    assert!(built.records[8].head().is_compact_summary);
}

#[test]
fn undo_restores_the_previous_view_until_a_new_turn() {
    let records = session();
    let input = auto_install(&records, &[], &[]);
    let built = build_post_compact(&input, &mut counter()).unwrap();
    let mut all = records.clone();
    all.extend(built.records.iter().cloned());

    // Nothing after the compaction yet: it can be undone.
    let target = undo_target(&all).unwrap();
    assert_eq!(target.uuid(), Some("uuid-1"));
    let undo = build_undo_record(target, &common_fields(&records[0]), "undo-1", "t2").unwrap();
    expect![[r#"{"parentUuid":"r3","isSidechain":false,"type":"system","subtype":"ctxd_undo_compact","content":"Compaction undone","isMeta":false,"undoes":"uuid-1","timestamp":"t2","uuid":"undo-1","level":"info","userType":"external","cwd":"/p","sessionId":"s1","version":"2.1.332","gitBranch":"main"}"#]]
        .assert_eq(undo.line());
    all.push(undo);

    let view = compaction_view(&all);
    assert!(view.latest_undone);
    assert_eq!(view.boundary, None);
    assert_eq!(view.skipped, vec![records.len()..all.len()]);
    // The view is the original conversation again.
    let uuids: Vec<_> = view.select(&all).iter().filter_map(|r| r.uuid()).collect();
    assert_eq!(uuids, vec!["u1", "a1", "a2", "r1", "a3", "r2", "a4", "u2", "a5", "pg1", "r3"]);
    assert_eq!(undo_target(&all).map(|r| r.uuid()), Err(UndoError::NothingToUndo));

    // A new prompt after a compaction: too late to undo.
    let mut later = records.clone();
    later.extend(built.records.iter().cloned());
    later.push(user("u9", Some("uuid-8"), "thanks, continue"));
    assert_eq!(undo_target(&later).map(|r| r.uuid()), Err(UndoError::NewTurnSince));
}

#[test]
fn undoing_the_second_of_two_compactions_returns_to_the_first() {
    let records = session();
    let mut all = records.clone();
    let input = auto_install(&records, &[], &[]);
    let first = build_post_compact(&input, &mut counter()).unwrap();
    all.extend(first.records.iter().cloned());
    let after_first = all.len();
    all.push(user("u3", Some("uuid-4"), "one more thing"));
    let mut next = {
        let mut n = 100;
        move || {
            n += 1;
            format!("uuid-{n}")
        }
    };
    let second_input =
        InstallInput { kept_after: &[], last_uuid: Some("u3".to_owned()), ..auto_install(&records, &[], &[]) };
    let second = build_post_compact(&second_input, &mut next).unwrap();
    all.extend(second.records.iter().cloned());
    let undo = build_undo_record(undo_target(&all).unwrap(), &Default::default(), "undo-2", "t").unwrap();
    all.push(undo);
    let view = compaction_view(&all);
    assert_eq!(view.boundary, Some(records.len()), "back to the first boundary");
    let visible = view.visible(all.len());
    assert_eq!(visible.first(), Some(&(records.len() + 1)));
    assert_eq!(visible.last(), Some(&after_first), "the prompt after the first compaction");
    // The first compaction had a turn after it: it stays.
    assert_eq!(undo_target(&all).map(|r| r.uuid()), Err(UndoError::NewTurnSince));
}

#[test]
fn tools_used_in_order_of_first_use() {
    assert_eq!(tools_used(&session()), vec!["Read", "Edit", "Write"]);
}

// ---------------------------------------------------------------------------------
// Fidelity facts from records.

#[test]
fn fidelity_facts_come_from_real_user_messages_and_recent_tool_calls() {
    let mut records = session();
    records.push(assistant(
        "a6",
        "r3",
        "msg_5",
        tool_use(
            "toolu_4",
            "TodoWrite",
            json!({"todos": [
                {"content": "Fix add", "status": "completed", "activeForm": "Fixing add"},
                {"content": "Write the add test", "status": "in_progress", "activeForm": "Writing"},
                {"content": "Run pytest", "status": "pending", "activeForm": "Running"}
            ]}),
        ),
    ));
    // Host-written rows and host commands are not user messages; other slash commands
    // are, as typed.
    records.push(user("m1", Some("a6"), "<local-command-stdout>Compacted</local-command-stdout>"));
    records.push(user("m2", Some("m1"), "<command-name>/compact</command-name>\n<command-args></command-args>"));
    records.push(user(
        "m3",
        Some("m2"),
        "<command-name>/review</command-name>\n<command-args>src/app.py</command-args>",
    ));
    let facts = FidelityFacts::from_records(&records, 2);
    assert_eq!(
        facts,
        FidelityFacts {
            user_messages: vec![
                "Please read src/app.py and fix the add function; it subtracts.".to_owned(),
                "Now add a test in tests/test_app.py".to_owned(),
            ],
            last_request: Some("/review src/app.py".to_owned()),
            // The last two turns: the Write, not the Read and Edit of the first turn.
            recent_files: vec!["/p/tests/test_app.py".to_owned()],
            open_todos: vec![
                OpenTodo { content: "Write the add test".to_owned(), status: "in_progress".to_owned() },
                OpenTodo { content: "Run pytest".to_owned(), status: "pending".to_owned() },
            ],
        }
    );
    let wider = FidelityFacts::from_records(&records, DEFAULT_RECENT_TURNS);
    assert_eq!(wider.recent_files, vec!["/p/src/app.py", "/p/tests/test_app.py"]);
}

// ---------------------------------------------------------------------------------
// Requests.

fn parent_body() -> Value {
    json!({
        "model": "claude-x",
        "max_tokens": 32000,
        "thinking": {"type": "enabled", "budget_tokens": 8000},
        "system": [
            {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "gitStatus: clean", "cache_control": {"type": "ephemeral"}}
        ],
        "tools": [
            {"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}},
            {"name": "Edit", "description": "Edit a file", "input_schema": {"type": "object"},
             "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>\nContents of CLAUDE.md: use tabs\nToday's date is 2026-11-29.\n</system-reminder>"},
                {"type": "text", "text": "Fix the add function in app.py"}
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "look first", "signature": "sig"},
                {"type": "text", "text": "Reading it."},
                {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/p/app.py"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                    {"type": "text", "text": "1\tdef add(a, b): return a - b"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}
                ]},
                {"type": "text", "text": "<system-reminder>\nThe file was modified by the user.\n</system-reminder>"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "spec"}},
                {"type": "text", "text": "Also look at this screenshot.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
            ]}
        ]
    })
}

/// Checks the Messages API rules the planner promises.
fn assert_valid(body: &Value) {
    let messages = body["messages"].as_array().unwrap();
    assert!(!messages.is_empty());
    assert_eq!(messages[0]["role"], "user", "first message must be a user message");
    let mut open: Vec<String> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        if i > 0 {
            assert_ne!(message["role"], messages[i - 1]["role"], "roles must alternate at {i}");
        }
        let blocks = match &message["content"] {
            Value::Array(b) => b.clone(),
            Value::String(_) => Vec::new(),
            other => panic!("bad content {other}"),
        };
        if message["role"] == "user" {
            let results: Vec<String> = blocks
                .iter()
                .filter(|b| b["type"] == "tool_result")
                .map(|b| b["tool_use_id"].as_str().unwrap().to_owned())
                .collect();
            for id in &results {
                assert!(open.contains(id), "tool result {id} without its tool use");
            }
            open.clear();
        } else {
            open = blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .map(|b| b["id"].as_str().unwrap().to_owned())
                .collect();
        }
        for block in &blocks {
            if block["type"] == "text" {
                assert!(!block["text"].as_str().unwrap().is_empty(), "empty text block");
            }
        }
    }
    assert!(count_cache_markers(body) <= MAX_CACHE_BREAKPOINTS);
}

fn without_markers(mut value: Value) -> Value {
    match &mut value {
        Value::Object(o) => {
            o.remove("cache_control");
            for v in o.values_mut() {
                *v = without_markers(v.take());
            }
        }
        Value::Array(a) => {
            for v in a.iter_mut() {
                *v = without_markers(v.take());
            }
        }
        _ => {}
    }
    value
}

#[test]
fn fork_appends_to_the_last_user_message_and_shares_the_prefix() {
    let parent = parent_body();
    let fork = fork_request(
        &parent,
        "SUMMARIZE",
        ForkOptions { style: ForkStyle::AppendToLastUser, tool_refusal: ToolRefusal::ToolChoiceNone },
    )
    .unwrap();
    let body = &fork.body;
    assert_valid(body);
    // Everything in front of the instruction is the parent's, byte for byte.
    for key in ["model", "system", "tools", "thinking", "max_tokens"] {
        assert_eq!(body[key], parent[key], "{key}");
    }
    let parent_messages = parent["messages"].as_array().unwrap();
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), parent_messages.len());
    assert_eq!(messages[..2], parent_messages[..2]);
    let last = messages[2]["content"].as_array().unwrap();
    let parent_last = parent_messages[2]["content"].as_array().unwrap();
    assert_eq!(last[..parent_last.len()], parent_last[..]);
    // The instruction is the one block after the prefix, without a breakpoint; the
    // breakpoint (the parent's own, 1 h TTL) sits on the block before it.
    assert_eq!(last.last().unwrap(), &json!({"type": "text", "text": "SUMMARIZE"}));
    assert_eq!(last[last.len() - 2]["cache_control"], json!({"type": "ephemeral", "ttl": "1h"}));
    assert_eq!(body["tool_choice"], json!({"type": "none"}));
    assert_eq!(
        fork.report,
        ForkReport { style: ForkStyle::AppendToLastUser, prefix_messages: 3, cache_markers: 4, markers_removed: 0 }
    );
}

#[test]
fn fork_as_a_separate_message_marks_the_penultimate_message() {
    let mut parent = parent_body();
    // A manual compaction between turns: the parent ends with the assistant's answer.
    parent["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": [{"type": "text", "text": "Fixed it."}]}));
    let fork = fork_request(
        &parent,
        "SUMMARIZE",
        ForkOptions { style: ForkStyle::SeparateMessage, tool_refusal: ToolRefusal::ToolChoiceNone },
    )
    .unwrap();
    let body = &fork.body;
    assert_valid(body);
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 5);
    assert_eq!(messages[4], json!({"role": "user", "content": [{"type": "text", "text": "SUMMARIZE"}]}));
    // The breakpoint moved to the end of the shared prefix (the penultimate message),
    // keeping the parent's value; the parent's older message breakpoint went, so the
    // total stays at four.
    assert_eq!(messages[3]["content"][0]["cache_control"], json!({"type": "ephemeral", "ttl": "1h"}));
    assert_eq!(messages[2]["content"][4].get("cache_control"), None);
    assert_eq!(fork.report.cache_markers, 4);
    assert_eq!(fork.report.markers_removed, 1);
    assert_eq!(fork.report.style, ForkStyle::SeparateMessage);
    // Apart from markers, the prefix is the parent's.
    assert_eq!(without_markers(Value::Array(messages[..4].to_vec())), without_markers(parent["messages"].clone()));
    assert_eq!(body["system"], parent["system"]);
    assert_eq!(body["tools"], parent["tools"]);
}

#[test]
fn fork_style_follows_the_roles() {
    // Asked for a separate message after a user message: appended instead.
    let fork = fork_request(
        &parent_body(),
        "S",
        ForkOptions { style: ForkStyle::SeparateMessage, tool_refusal: ToolRefusal::KeepParentToolChoice },
    )
    .unwrap();
    assert_eq!(fork.report.style, ForkStyle::AppendToLastUser);
    assert_eq!(fork.body["messages"].as_array().unwrap().len(), 3);
    assert_eq!(fork.body.get("tool_choice"), None, "parent's tool_choice kept (none given)");
    assert_valid(&fork.body);
    // A string-content parent: the marker needs a block, so the string becomes one.
    let parent = json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]});
    let fork = fork_request(
        &parent,
        "S",
        ForkOptions { style: ForkStyle::SeparateMessage, tool_refusal: ToolRefusal::ToolChoiceNone },
    )
    .unwrap();
    expect![[r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hello","cache_control":{"type":"ephemeral"}},{"type":"text","text":"S"}]}],"max_tokens":20000}"#]]
        .assert_eq(&fork.body.to_string());
}

#[test]
fn the_fork_is_tried_only_where_it_can_read_the_parents_cache() {
    let choice = |trigger, enabled, host_parent, summary_model| {
        choose_fork(&ForkChoice { trigger, enabled, host_parent, summary_model, parent_model: "claude-a" })
    };
    // Who asked decides where the instruction goes.
    assert_eq!(choice(Trigger::Manual, true, true, "claude-a"), Ok(ForkStyle::SeparateMessage));
    assert_eq!(choice(Trigger::Auto, true, true, "claude-a"), Ok(ForkStyle::AppendToLastUser));
    assert_eq!(choice(Trigger::Idle, true, true, "claude-a"), Ok(ForkStyle::AppendToLastUser));
    // Every reason to go straight to the fallback, in the order they are checked.
    assert_eq!(choice(Trigger::Manual, false, true, "claude-a"), Err(ForkSkip::Disabled));
    assert_eq!(choice(Trigger::Manual, true, false, "claude-a"), Err(ForkSkip::NoHostRequest));
    assert_eq!(choice(Trigger::Manual, true, true, "claude-b"), Err(ForkSkip::OtherModel));
    assert_eq!(choice(Trigger::Reactive, true, true, "claude-a"), Err(ForkSkip::ParentRefused));
    assert_eq!(choice(Trigger::Auto, false, false, "claude-b"), Err(ForkSkip::Disabled));
}

#[test]
fn fork_refuses_bodies_that_are_not_requests() {
    let opts = ForkOptions { style: ForkStyle::SeparateMessage, tool_refusal: ToolRefusal::ToolChoiceNone };
    assert_eq!(fork_request(&json!([1]), "s", opts), Err(RequestError::NotAnObject));
    assert_eq!(fork_request(&json!({"messages": []}), "s", opts), Err(RequestError::NoModel));
    assert_eq!(fork_request(&json!({"model": "m", "messages": []}), "s", opts), Err(RequestError::NoMessages));
    assert_eq!(
        fork_request(
            &json!({"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "tool"}]}),
            "s",
            opts
        ),
        Err(RequestError::BadMessage { index: 1 })
    );
}

#[test]
fn fork_keeps_at_most_four_breakpoints() {
    let mut parent = parent_body();
    // Five breakpoints already: every message block marked.
    for m in parent["messages"].as_array_mut().unwrap() {
        for b in m["content"].as_array_mut().unwrap() {
            if b["type"] == "text" {
                b["cache_control"] = json!({"type": "ephemeral"});
            }
        }
    }
    assert!(count_cache_markers(&parent) > 4);
    let fork = fork_request(
        &parent,
        "S",
        ForkOptions { style: ForkStyle::AppendToLastUser, tool_refusal: ToolRefusal::ToolChoiceNone },
    )
    .unwrap();
    assert_eq!(count_cache_markers(&fork.body), 4);
    let last = fork.body["messages"][2]["content"].as_array().unwrap();
    assert!(last[last.len() - 2].get("cache_control").is_some(), "the prefix end keeps its breakpoint");
    // System and tool breakpoints go last: they are all still there.
    assert_eq!(fork.body["system"], parent["system"]);
    assert_eq!(fork.body["tools"], parent["tools"]);
}

#[test]
fn fallback_rewrites_the_input_for_a_summarizer() {
    let parent = parent_body();
    let fallback = fallback_request(&parent, "SUMMARIZE", &FallbackOptions::default()).unwrap();
    let body = &fallback.body;
    assert_valid(body);
    assert_eq!(body["system"], json!([{"type": "text", "text": fallback_system_prompt()}]));
    assert_eq!(body["thinking"], json!({"type": "disabled"}));
    assert_eq!(body["max_tokens"], json!(FALLBACK_MAX_TOKENS));
    assert_eq!(body.get("tools"), None);
    assert_eq!(body["model"], parent["model"]);
    // Only text blocks are left.
    let rendered: Vec<String> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| {
            let role = m["role"].as_str().unwrap().to_owned();
            m["content"].as_array().unwrap().iter().map(move |b| {
                assert_eq!(b["type"], "text");
                format!("{role}: {}", b["text"].as_str().unwrap().replace('\n', "⏎"))
            })
        })
        .collect();
    expect![[r#"
        user: Fix the add function in app.py
        assistant: Reading it.
        assistant: [tool call: Read {"file_path":"/p/app.py"}]
        user: [tool result: Read]⏎1	def add(a, b): return a - b⏎[image]
        user: [image]
        user: [document]
        user: Also look at this screenshot.
        user: SUMMARIZE"#]]
    .assert_eq(&rendered.join("\n"));
    assert_eq!(
        fallback.report,
        FallbackReport {
            reminders_stripped: 2,
            media_replaced: 3,
            tool_blocks_rendered: 2,
            thinking_dropped: 1,
            messages_dropped: 0,
            messages_merged: 0
        }
    );
    // One breakpoint, on the end of the conversation, not on the instruction.
    assert_eq!(count_cache_markers(body), 1);
    let last = body["messages"][2]["content"].as_array().unwrap();
    assert!(last[last.len() - 2].get("cache_control").is_some());
    assert_eq!(last[last.len() - 1].get("cache_control"), None);
}

#[test]
fn fallback_caps_output_offers_only_read_and_keeps_roles_valid() {
    let mut parent = parent_body();
    parent["max_tokens"] = json!(128_000);
    // A first message made only of reminders disappears; the conversation would then
    // start with the assistant, so a placeholder user message goes first.
    parent["messages"][0]["content"] = json!([{"type": "text", "text": "<system-reminder>memory</system-reminder>"}]);
    let fallback = fallback_request(&parent, "S", &FallbackOptions { max_tokens: 20_000, offer_read: true }).unwrap();
    let body = &fallback.body;
    assert_valid(body);
    assert_eq!(body["max_tokens"], json!(20_000));
    let tools = body["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0]["name"], "Read");
    assert_eq!(body["tool_choice"], json!({"type": "none"}));
    assert_eq!(fallback.report.messages_dropped, 1);
    assert_eq!(body["messages"][0]["content"][0]["text"], "[The start of the conversation was left out here.]");
    // A lower parent cap wins.
    let mut small = parent_body();
    small["max_tokens"] = json!(4_096);
    let fallback = fallback_request(&small, "S", &FallbackOptions::default()).unwrap();
    assert_eq!(fallback.body["max_tokens"], json!(4_096));
}

// ---------------------------------------------------------------------------------
// Prompt-too-long retries.

/// A fork body with a first prompt, `rounds` tool rounds of `bytes` each, and the
/// instruction appended to the last tool result.
fn long_fork(rounds: usize, bytes: usize) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "The task: refactor the parser."})];
    for i in 0..rounds {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": format!("t{i}"), "name": "Read", "input": {"file_path": format!("/f{i}")}}
        ]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("t{i}"), "content": "x".repeat(bytes)}
        ]}));
    }
    let parent = json!({"model": "m", "max_tokens": 1000, "messages": messages});
    fork_request(
        &parent,
        "SUMMARIZE",
        ForkOptions { style: ForkStyle::AppendToLastUser, tool_refusal: ToolRefusal::ToolChoiceNone },
    )
    .unwrap()
    .body
}

#[test]
fn ptl_drops_the_oldest_rounds_and_keeps_the_task_and_the_last_round() {
    let body = long_fork(10, 4_000);
    // About 10,000 tokens; the provider counts 10,000 against a 7,000 maximum.
    let cut = truncate_for_retry(&body, Some(Overflow { tokens: 10_000, max: 7_000 }), 0).unwrap();
    assert_valid(&cut.body);
    // Needed: the 3,000 overflow scaled to the estimate, plus a tenth and the margin.
    assert!(cut.needed_tokens >= 3_000 + 300 + 2_000, "{}", cut.needed_tokens);
    assert!(cut.dropped_tokens >= cut.needed_tokens);
    assert_eq!(cut.dropped_groups, 6);
    assert_eq!(cut.dropped_messages, 12);
    assert!(!cut.head_dropped);
    let messages = cut.body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 21 - 12);
    // The task stays, with a note that something was left out after it.
    assert_eq!(messages[0]["content"][0]["text"], "The task: refactor the parser.");
    assert!(messages[0]["content"][1]["text"].as_str().unwrap().contains("left out"));
    // The oldest kept round is round 6; the last round still carries the instruction.
    assert_eq!(messages[1]["content"][0]["id"], "t6");
    let last = messages.last().unwrap()["content"].as_array().unwrap();
    assert_eq!(last.last().unwrap()["text"], "SUMMARIZE");
    assert_eq!(cut.body["model"], body["model"]);
}

#[test]
fn ptl_is_bounded_and_ends_when_nothing_can_go() {
    let body = long_fork(3, 400);
    assert_eq!(truncate_for_retry(&body, Some(Overflow { tokens: 900, max: 800 }), MAX_PTL_RETRIES), None);
    // A huge overflow: every droppable round goes, then the task itself.
    let first = truncate_for_retry(&body, Some(Overflow { tokens: 1_000_000, max: 1_000 }), 0).unwrap();
    assert_valid(&first.body);
    assert_eq!(first.dropped_groups, 2);
    assert!(first.head_dropped);
    let messages = first.body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    assert!(messages[0]["content"][0]["text"].as_str().unwrap().starts_with("[The start of this conversation"));
    // Nothing is left to drop: only the placeholder and the instruction's round.
    assert_eq!(truncate_for_retry(&first.body, Some(Overflow { tokens: 900, max: 800 }), 1), None);
    // A request that is one message is never cut.
    let single = json!({"model": "m", "messages": [{"role": "user", "content": "only the instruction"}]});
    assert_eq!(truncate_for_retry(&single, None, 0), None);
}

#[test]
fn ptl_without_numbers_drops_a_quarter() {
    let body = long_fork(8, 1_000);
    let cut = truncate_for_retry(&body, None, 0).unwrap();
    assert_valid(&cut.body);
    assert_eq!(cut.dropped_groups, 2, "a quarter of the 7 droppable rounds, rounded up to whole rounds");
}

proptest::proptest! {
    #[test]
    fn ptl_always_leaves_a_valid_smaller_request(
        rounds in 1usize..12,
        bytes in 1usize..3_000,
        over in 1u64..50_000,
        retries in 0u32..3,
    ) {
        let body = long_fork(rounds, bytes);
        let before = body["messages"].as_array().unwrap().len();
        if let Some(cut) = truncate_for_retry(&body, Some(Overflow { tokens: 10_000 + over, max: 10_000 }), retries) {
            assert_valid(&cut.body);
            let after = cut.body["messages"].as_array().unwrap();
            proptest::prop_assert!(after.len() < before || cut.head_dropped);
            proptest::prop_assert_eq!(
                after.last().unwrap()["content"].as_array().unwrap().last().unwrap()["text"].clone(),
                json!("SUMMARIZE")
            );
        }
    }
}

// ---------------------------------------------------------------------------------
// Restoration.

fn file(path: &str, order: u64, tokens: u64) -> FileReadEntry {
    FileReadEntry {
        path: path.to_owned(),
        read_order: order,
        tokens,
        exists: true,
        content: Some(format!("content of {path}")),
        changed_since_read: false,
        in_kept_tail: false,
    }
}

fn outcomes(plan: &RestorePlan) -> Vec<(String, FileOutcome)> {
    plan.report.files.clone()
}

#[test]
fn at_most_five_files_newest_first() {
    let files: Vec<_> = (1..=6).map(|i| file(&format!("/p/f{i}"), i, 100)).collect();
    let plan = plan_restoration(&RestoreInput { files, ..RestoreInput::default() });
    assert_eq!(
        outcomes(&plan),
        vec![
            ("/p/f6".to_owned(), FileOutcome::Restored),
            ("/p/f5".to_owned(), FileOutcome::Restored),
            ("/p/f4".to_owned(), FileOutcome::Restored),
            ("/p/f3".to_owned(), FileOutcome::Restored),
            ("/p/f2".to_owned(), FileOutcome::Restored),
            ("/p/f1".to_owned(), FileOutcome::NotRestored),
        ]
    );
    let files: Vec<_> = plan
        .attachments
        .iter()
        .filter(|a| a.attachment["type"] == "file")
        .map(|a| a.attachment["filename"].as_str().unwrap())
        .collect();
    assert_eq!(files, vec!["/p/f6", "/p/f5", "/p/f4", "/p/f3", "/p/f2"]);
    assert_eq!(plan.report.file_tokens, 500);
}

#[test]
fn a_file_over_five_thousand_tokens_comes_back_as_its_path() {
    let plan = plan_restoration(&RestoreInput {
        files: vec![file("/p/exact", 2, 5_000), file("/p/over", 1, 5_001)],
        ..RestoreInput::default()
    });
    assert_eq!(
        outcomes(&plan),
        vec![("/p/exact".to_owned(), FileOutcome::Restored), ("/p/over".to_owned(), FileOutcome::ReferenceTooLarge),]
    );
    assert_eq!(plan.attachments[1].attachment["type"], "compact_file_reference");
    assert_eq!(plan.attachments[1].rendered_role, "system");
    assert!(
        plan.attachments[1].rendered[0]
            .contains("/p/over (read earlier in this session) is not shown again here: it is too large.")
    );
}

#[test]
fn fifty_thousand_tokens_is_a_ceiling() {
    // With room for more files, the total ceiling binds: ten files of 5,000 fill it
    // exactly; the eleventh gets nothing (not even a note fits).
    let files: Vec<_> = (1..=11).map(|i| file(&format!("/p/f{i:02}"), i, 5_000)).collect();
    let budget = RestoreBudget { max_files: 20, ..RestoreBudget::default() };
    let plan = plan_restoration(&RestoreInput { files, budget, ..RestoreInput::default() });
    let restored = outcomes(&plan).iter().filter(|(_, o)| *o == FileOutcome::Restored).count();
    assert_eq!(restored, 10);
    assert_eq!(plan.report.file_tokens, 50_000);
    assert_eq!(outcomes(&plan)[10], ("/p/f01".to_owned(), FileOutcome::NotRestored));
    // A file that does not fit what is left comes back as a note when the note fits.
    let files = vec![file("/p/a", 3, 4_990), file("/p/b", 2, 4_990), file("/p/c", 1, 100)];
    let budget = RestoreBudget { max_file_tokens: 10_000, ..RestoreBudget::default() };
    let plan = plan_restoration(&RestoreInput { files, budget, ..RestoreInput::default() });
    assert_eq!(
        outcomes(&plan),
        vec![
            ("/p/a".to_owned(), FileOutcome::Restored),
            ("/p/b".to_owned(), FileOutcome::Restored),
            ("/p/c".to_owned(), FileOutcome::NotRestored),
        ]
    );
    let budget = RestoreBudget { max_file_tokens: 10_100, ..RestoreBudget::default() };
    let files = vec![file("/p/a", 3, 4_990), file("/p/b", 2, 4_990), file("/p/c", 1, 200)];
    let plan = plan_restoration(&RestoreInput { files, budget, ..RestoreInput::default() });
    assert_eq!(outcomes(&plan)[2], ("/p/c".to_owned(), FileOutcome::ReferenceOverBudget));
    assert!(plan.report.file_tokens <= 10_100);
}

#[test]
fn files_in_the_kept_tail_or_deleted_are_not_restored() {
    let mut kept = file("/p/kept", 100, 100);
    kept.in_kept_tail = true;
    let mut gone = file("/p/gone", 99, 100);
    gone.exists = false;
    let mut changed = file("/p/changed", 98, 100);
    changed.changed_since_read = true;
    let mut files = vec![kept, gone, changed];
    // Five older files: the kept and deleted ones used no place, so four of them
    // restore after the changed one.
    files.extend((10..15).map(|i| file(&format!("/p/old{i}"), 20 - i, 10)));
    let plan = plan_restoration(&RestoreInput { files, ..RestoreInput::default() });
    let report = outcomes(&plan);
    assert_eq!(report[0], ("/p/kept".to_owned(), FileOutcome::InKeptTail));
    assert_eq!(report[6], ("/p/old13".to_owned(), FileOutcome::Restored));
    let by_path = |p: &str| report.iter().find(|(path, _)| path == p).map(|(_, o)| *o);
    assert_eq!(by_path("/p/kept"), Some(FileOutcome::InKeptTail));
    assert_eq!(by_path("/p/gone"), Some(FileOutcome::Deleted));
    assert_eq!(by_path("/p/changed"), Some(FileOutcome::Restored));
    assert_eq!(report.iter().filter(|(_, o)| *o == FileOutcome::Restored).count(), 5);
    assert_eq!(by_path("/p/old14"), Some(FileOutcome::NotRestored));
    // The digest names them all, with their state.
    let digest = plan.attachments.last().unwrap();
    assert_eq!(digest.attachment["type"], "ctxd_read_files");
    let text = &digest.rendered[0];
    assert!(text.contains("- /p/kept (unchanged, shown in the recent messages)"), "{text}");
    assert!(text.contains("- /p/gone (deleted since it was read)"));
    assert!(text.contains("- /p/changed (changed since it was read, shown above)"));
    assert!(text.contains("- /p/old14 (unchanged)\n"));
}

fn skill(name: &str, order: u64, tokens: usize) -> SkillEntry {
    SkillEntry { name: name.to_owned(), content: "s".repeat(tokens * 4), order }
}

#[test]
fn skills_five_thousand_each_twenty_five_thousand_in_all_oldest_dropped() {
    let skills: Vec<_> = (1..=6).map(|i| skill(&format!("skill{i}"), i, 5_000)).collect();
    let plan = plan_restoration(&RestoreInput { skills, ..RestoreInput::default() });
    assert_eq!(plan.report.skills_restored, vec!["skill6", "skill5", "skill4", "skill3", "skill2"]);
    assert_eq!(plan.report.skills_dropped, vec!["skill1"]);
    assert_eq!(plan.report.skill_tokens, 25_000);
    let attachment = &plan.attachments[0];
    assert_eq!(attachment.attachment["type"], "invoked_skills");
    let names: Vec<_> =
        attachment.attachment["skills"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["skill2", "skill3", "skill4", "skill5", "skill6"], "oldest first, as used");

    // One over the limit is cut to it, visibly.
    let plan = plan_restoration(&RestoreInput { skills: vec![skill("big", 1, 5_001)], ..RestoreInput::default() });
    assert_eq!(plan.report.skills_cut, vec!["big"]);
    assert!(plan.report.skill_tokens <= 5_000);
    assert!(plan.attachments[0].rendered[0].contains("[… skill cut here to fit the post-compact budget …]"));

    // What is left of the ceiling cuts the next skill when enough is left; a sliver
    // drops it.
    let skills = vec![skill("a", 3, 5_000), skill("b", 2, 5_000), skill("c", 1, 5_000)];
    let budget = RestoreBudget { max_skill_tokens: 12_000, ..RestoreBudget::default() };
    let plan = plan_restoration(&RestoreInput { skills: skills.clone(), budget, ..RestoreInput::default() });
    assert_eq!((plan.report.skills_restored.len(), plan.report.skills_cut.clone()), (2, vec!["c".to_owned()]));
    let budget = RestoreBudget { max_skill_tokens: 10_100, ..RestoreBudget::default() };
    let plan = plan_restoration(&RestoreInput { skills, budget, ..RestoreInput::default() });
    assert_eq!(plan.report.skills_dropped, vec!["c"]);
}

#[test]
fn the_plan_comes_back_first() {
    let plan = plan_restoration(&RestoreInput {
        plan: Some(PlanFile { path: "/p/.claude/plans/plan.md".to_owned(), content: "1. fix add\n2. test".to_owned() }),
        files: vec![file("/p/a", 1, 10)],
        ..RestoreInput::default()
    });
    assert!(plan.report.plan_restored);
    assert!(!plan.report.plan_cut);
    expect![[r#"
        <system-reminder>
        The plan for this session is in /p/.claude/plans/plan.md. Its current content:
        1. fix add
        2. test
        </system-reminder>"#]]
    .assert_eq(&plan.attachments[0].rendered[0]);
    assert_eq!(plan.attachments[0].attachment["type"], "plan_file_reference");
    let long = plan_restoration(&RestoreInput {
        plan: Some(PlanFile { path: "/p/plan.md".to_owned(), content: "step\n".repeat(10_000) }),
        ..RestoreInput::default()
    });
    assert!(long.report.plan_cut);
    assert!(long.report.file_tokens <= MAX_TOKENS_PER_FILE);
}

#[test]
fn small_windows_shrink_the_budget_below_the_threshold() {
    // A 100K window: threshold 67,000. Fixed prefix 20,000, summary 4,000, kept 3,000.
    let sizes = PostCompactSizes { fixed_prefix: 20_000, summary: 4_000, kept: 3_000, hook_output: 0 };
    let budget = RestoreBudget::fitted(67_000, &sizes);
    assert_eq!(
        budget,
        RestoreBudget {
            max_files: 5,
            max_tokens_per_file: 5_000,
            max_file_tokens: 12_000,
            max_tokens_per_skill: 5_000,
            max_skill_tokens: 6_000,
            max_digest_tokens: 2_000,
        }
    );
    assert_eq!(budget.ceiling(), 20_000, "half of the 40,000 left under the threshold");
    let files: Vec<_> = (1..=8).map(|i| file(&format!("/p/f{i}"), i, 4_000)).collect();
    let skills: Vec<_> = (1..=3).map(|i| skill(&format!("s{i}"), i, 5_000)).collect();
    let plan = plan_restoration(&RestoreInput { files, skills, budget, ..RestoreInput::default() });
    assert!(plan.report.total_tokens() <= budget.ceiling());
    assert!(plan.report.file_tokens <= 12_000 && plan.report.skill_tokens <= 6_000);
    // Framing included, the context ends well below the threshold: no re-trigger.
    let post = sizes.total() + plan.report.rendered_tokens;
    assert!(post < 67_000 - 15_000, "post-compact {post}");

    // A large window keeps the fixed limits.
    let big = RestoreBudget::fitted(967_000, &PostCompactSizes { fixed_prefix: 30_000, ..Default::default() });
    assert_eq!(big, RestoreBudget::default());
    // No room at all: nothing is restored.
    let none = RestoreBudget::fitted(67_000, &PostCompactSizes { fixed_prefix: 70_000, ..Default::default() });
    assert_eq!(none.ceiling(), 0);
    let plan = plan_restoration(&RestoreInput {
        files: vec![file("/p/a", 1, 10)],
        skills: vec![skill("s", 1, 10)],
        budget: none,
        ..RestoreInput::default()
    });
    assert_eq!(plan.attachments, Vec::new());
    assert_eq!(plan.report.rendered_tokens, 0);
}

proptest::proptest! {
    #[test]
    fn fitted_restoration_never_reaches_the_threshold(
        threshold in 50_000u64..1_000_000,
        fixed in 0u64..200_000,
        summary in 0u64..20_000,
        n_files in 0usize..10,
        file_tokens in 1u64..8_000,
    ) {
        let sizes = PostCompactSizes { fixed_prefix: fixed, summary, kept: 0, hook_output: 0 };
        let budget = RestoreBudget::fitted(threshold, &sizes);
        let files: Vec<_> = (0..n_files).map(|i| file(&format!("/p/f{i}"), i as u64, file_tokens)).collect();
        let plan = plan_restoration(&RestoreInput { files, budget, ..RestoreInput::default() });
        proptest::prop_assert!(plan.report.total_tokens() <= budget.ceiling());
        if sizes.total() < threshold {
            proptest::prop_assert!(sizes.total() + plan.report.total_tokens() < threshold);
        } else {
            proptest::prop_assert_eq!(plan.report.total_tokens(), 0);
        }
    }
}

// ---------------------------------------------------------------------------------
// Guards.

/// A 200,000-token window: threshold 167,000, precompute start 160,000, blocked 177,000.
pub(super) fn levels() -> Thresholds {
    Thresholds {
        window: 200_000,
        effective_window: 180_000,
        threshold: 167_000,
        warning: 147_000,
        blocked: 177_000,
        auto_compact_enabled: true,
        compact_enabled: true,
        shows_compact_figure: true,
        enforce_window: true,
    }
}

#[test]
fn circuit_breaker_stops_after_three_failures_and_manual_compact_resets_it() {
    let t = levels();
    let mut g = CompactGuards::default();
    assert_eq!(g.check_auto(100_000, &t, 10_000), AutoDecision::NotDue);
    assert_eq!(g.check_auto(170_000, &t, 10_000), AutoDecision::Compact);
    assert_eq!(g.record_failure(Trigger::Auto, "HTTP 529"), None);
    assert_eq!(g.record_failure(Trigger::Reactive, "HTTP 529"), None);
    // The user's own failure does not count.
    assert_eq!(g.record_failure(Trigger::Manual, "cancelled"), None);
    assert_eq!(g.consecutive_failures, 2);
    let stop = g.record_failure(Trigger::Idle, "no <summary>");
    assert_eq!(stop, Some(StopReason::CircuitBreaker { failures: 3, last: "no <summary>".to_owned() }));
    let AutoDecision::Stopped { notify, message, .. } = g.check_auto(170_000, &t, 10_000) else {
        panic!("expected Stopped");
    };
    assert!(!notify, "the failure itself was the notification");
    assert!(message.contains("after 3 failed attempts in a row (the last one: no <summary>)"), "{message}");
    // A manual compaction lifts the stop.
    g.note_manual_compact();
    assert_eq!(g.check_auto(170_000, &t, 10_000), AutoDecision::Compact);
    // A success resets the count.
    g.record_failure(Trigger::Auto, "x");
    g.record_failure(Trigger::Auto, "x");
    g.record_success(Trigger::Auto);
    assert_eq!(g.consecutive_failures, 0);
    assert_eq!(g.record_failure(Trigger::Auto, "x"), None);
}

#[test]
fn thrashing_stops_on_the_third_quick_refill_in_a_row() {
    let t = levels();
    let mut g = CompactGuards::default();
    // First compaction: nothing to compare with.
    assert_eq!(g.check_auto(170_000, &t, 10_000), AutoDecision::Compact);
    g.record_success(Trigger::Auto);
    for refill in 1..=2 {
        g.record_turn();
        g.record_turn();
        assert_eq!(g.check_auto(170_000, &t, 10_000), AutoDecision::Compact, "refill {refill}");
        g.record_success(Trigger::Auto);
    }
    g.record_turn();
    g.record_turn();
    g.record_turn();
    let decision = g.check_auto(170_000, &t, 10_000);
    let AutoDecision::Stopped { reason, message, notify } = decision else {
        panic!("expected Stopped, got {decision:?}");
    };
    assert_eq!(reason, StopReason::Thrashing);
    assert!(notify);
    assert!(message.starts_with(
        "Autocompact is thrashing: the context refilled to the limit within 3 turns of the previous compact, 3 times in a row"
    ));
    assert_eq!(g.stopped, Some(StopReason::Thrashing));
}

#[test]
fn a_slow_refill_breaks_the_thrashing_streak() {
    let t = levels();
    let mut g = CompactGuards::default();
    g.record_success(Trigger::Auto);
    for _ in 0..2 {
        g.record_turn();
        assert_eq!(g.check_auto(170_000, &t, 0), AutoDecision::Compact);
        g.record_success(Trigger::Auto);
    }
    // Four turns this time: not quick, the streak starts over.
    for _ in 0..4 {
        g.record_turn();
    }
    assert_eq!(g.check_auto(170_000, &t, 0), AutoDecision::Compact);
    g.record_success(Trigger::Auto);
    assert_eq!(g.quick_refills, 0);
    // A manual compaction also starts the streak over.
    g.record_turn();
    g.record_success(Trigger::Manual);
    assert_eq!(g.quick_refills, 0);
}

#[test]
fn a_fixed_prefix_above_the_threshold_is_reported_once() {
    let t = levels();
    let mut g = CompactGuards::default();
    let AutoDecision::CannotHelp { notify, message } = g.check_auto(175_000, &t, 168_000) else {
        panic!("expected CannotHelp");
    };
    assert!(notify);
    assert!(message.starts_with("Compaction cannot help"), "{message}");
    assert!(message.contains("168000 tokens") && message.contains("167000 tokens"));
    assert!(matches!(g.check_auto(175_000, &t, 168_000), AutoDecision::CannotHelp { notify: false, .. }));
    assert!(matches!(g.check_auto(176_000, &t, 170_000), AutoDecision::CannotHelp { notify: false, .. }));
    // The prefix shrank (a tool was removed): compaction can help again, and a later
    // recurrence is reported again.
    assert_eq!(g.check_auto(170_000, &t, 50_000), AutoDecision::Compact);
    assert!(matches!(g.check_auto(175_000, &t, 168_000), AutoDecision::CannotHelp { notify: true, .. }));
}

#[test]
fn guards_round_trip_through_json() {
    let mut g = CompactGuards::default();
    g.record_success(Trigger::Auto);
    g.record_turn();
    g.record_failure(Trigger::Auto, "x");
    g.stopped = Some(StopReason::Thrashing);
    let text = serde_json::to_string(&g).unwrap();
    expect![[r#"{"consecutiveFailures":1,"lastFailure":{"trigger":"auto","reason":"x"},"turnsSinceCompact":1,"quickRefills":0,"stopped":{"kind":"thrashing"},"fixedPrefixReported":false,"followUps":0}"#]]
        .assert_eq(&text);
    let back: CompactGuards = serde_json::from_str(&text).unwrap();
    assert_eq!(back, g);
}

#[test]
fn disabled_auto_compaction_is_never_due() {
    let mut t = levels();
    t.auto_compact_enabled = false;
    let mut g = CompactGuards::default();
    assert_eq!(g.check_auto(176_000, &t, 0), AutoDecision::NotDue);
}

// ---------------------------------------------------------------------------------
// The whole path, end to end over the pure pieces.

#[test]
fn a_missing_summary_is_asked_for_again_then_installed_with_fidelity_additions() {
    let records = session();
    let kept_from = kept_tail_start(&records).unwrap();
    let instruction = summary_instruction(&PromptSpec {
        form: PromptForm::Full,
        additional: merge_instructions(Some("keep the test plan"), &[]),
        newer_messages_kept: true,
    });
    let first = read_summary_reply("I summarized it all in my head.", ReplyAttempt::First, &instruction);
    let Ok(ReplyVerdict::AskAgain { instruction: again }) = first else {
        panic!("expected AskAgain, got {first:?}");
    };
    assert!(again.ends_with(reask_note()));
    let reply =
        "<analysis>draft</analysis>\n<summary>\n1. Primary Request and Intent:\n   Fix add in src/app.py.\n</summary>";
    let Ok(ReplyVerdict::Summary(body)) = read_summary_reply(reply, ReplyAttempt::Reasked, &again) else {
        panic!("expected a summary");
    };
    let facts = FidelityFacts::from_records(&records[..kept_from], DEFAULT_RECENT_TURNS);
    let checked = check_fidelity(&body, &facts, usize::MAX);
    assert_eq!(
        checked.report.missing_before,
        vec![FidelityItem::LatestRequest("Now add a test in tests/test_app.py".to_owned())]
    );
    let text = summary_message_text(&SummaryMessage {
        body: checked.summary,
        transcript_path: Some("/state/s1.jsonl".to_owned()),
        history_tools: None,
        tools_used: tools_used(&records[..kept_from]),
        kept: KeptMessages::After,
    });
    assert!(text.contains("- Latest user request: \"Now add a test in tests/test_app.py\""));
    assert!(!text.contains("draft"));
}

// ---------------------------------------------------------------------------------
// Preparing a summary ahead of the threshold.

#[test]
fn prepares_ahead_only_between_the_start_and_the_threshold() {
    use super::ahead::should_prepare;
    let t = levels();
    let start = t.precompute_start();
    assert_eq!(start, 160_000);
    assert!(!should_prepare(start - 1, &t));
    assert!(should_prepare(start, &t));
    assert!(should_prepare(t.threshold - 1, &t));
    assert!(!should_prepare(t.threshold, &t), "at the threshold the compaction itself runs");
    let off = Thresholds { auto_compact_enabled: false, ..t };
    assert!(!should_prepare(start, &off));
    let unenforced = Thresholds { enforce_window: false, ..t };
    assert!(!should_prepare(start, &unenforced));
}

#[test]
fn a_prepared_summary_is_installed_while_it_still_leaves_room() {
    use super::ahead::{Stale, check_prepared};
    let t = levels();
    assert_eq!(check_prepared(30_000, 7_000, true, &t), Ok(37_000));
    assert_eq!(check_prepared(30_000, 7_000, false, &t), Err(Stale::ViewReplaced));
    assert_eq!(
        check_prepared(30_000, 60_000, true, &t),
        Err(Stale::TooMuchSince { estimated_after: 90_000, limit: 83_500 })
    );
}

#[test]
fn the_boundary_marks_its_batch_and_rate_and_a_torn_install_is_found() {
    let records = session();
    let attachments = restored_attachments();
    let input = InstallInput { tokens_per_kib: Some(301), ..auto_install(&records, &attachments, &[]) };
    let built = build_post_compact(&input, &mut counter()).unwrap();
    let boundary = &built.records[0];
    assert_eq!(value(boundary)["compactMetadata"][BATCH_FIELD].as_u64(), Some(built.records.len() as u64));
    assert_eq!(boundary_rate(boundary), Some(301));
    let without = build_post_compact(&auto_install(&records, &attachments, &[]), &mut counter()).unwrap();
    assert_eq!(boundary_rate(&without.records[0]), None);
    // Read back with offsets: whole, the install stands; one record short, it is torn.
    let on_disk: Vec<(u64, Record)> =
        records.iter().chain(&built.records).cloned().enumerate().map(|(i, r)| (i as u64 * 100, r)).collect();
    assert_eq!(torn_install(&on_disk), None);
    let at = records.len() as u64 * 100;
    assert_eq!(torn_install(&on_disk[..on_disk.len() - 1]), Some(at));
    assert_eq!(torn_install(&on_disk[..records.len() + 1]), Some(at), "the boundary alone");
    assert_eq!(torn_install(&on_disk[..records.len()]), None, "no boundary");
}

#[test]
fn a_compaction_left_above_the_threshold_is_followed_at_once_a_bounded_number_of_times() {
    let t = levels();
    let mut g = CompactGuards::default();
    g.record_success(Trigger::Auto);
    assert_eq!(g.after_install(100_000, &t, 10_000), AfterInstall::Done, "under the threshold");
    for step in 1..=MAX_FOLLOW_UPS {
        assert_eq!(g.after_install(170_000, &t, 10_000), AfterInstall::CompactAgain { step });
        g.record_success(Trigger::Auto);
    }
    let AfterInstall::StillAbove { message } = g.after_install(170_000, &t, 10_000) else {
        panic!("expected StillAbove");
    };
    assert!(message.contains("at 170000 tokens") && message.contains("(167000 tokens)"), "{message}");
    // Follow-ups are no refills: they brought no thrashing stop.
    assert_eq!(g.quick_refills, 0);
    assert!(g.allows_automatic());
    // The count starts again after a report, and at once under the threshold.
    assert_eq!(g.after_install(170_000, &t, 10_000), AfterInstall::CompactAgain { step: 1 });
    assert_eq!(g.after_install(100_000, &t, 10_000), AfterInstall::Done);
    assert_eq!(g.follow_ups, 0);
}

#[test]
fn no_follow_up_after_a_stop_or_when_the_fixed_prefix_is_over_the_threshold() {
    let t = levels();
    let mut g = CompactGuards::default();
    assert_eq!(g.after_install(170_000, &t, 168_000), AfterInstall::Done, "no summary can help");
    g.stopped = Some(StopReason::Thrashing);
    assert!(!g.allows_automatic());
    assert_eq!(g.after_install(170_000, &t, 10_000), AfterInstall::Done, "the stop holds");
    g.note_manual_compact();
    assert!(g.allows_automatic());
    assert_eq!(g.after_install(170_000, &t, 10_000), AfterInstall::CompactAgain { step: 1 });
}

#[test]
fn the_default_fork_keeps_the_parents_tool_choice() {
    let mut parent = parent_body();
    parent["tool_choice"] = json!({"type": "auto", "disable_parallel_tool_use": true});
    let options = ForkOptions { style: ForkStyle::AppendToLastUser, tool_refusal: ToolRefusal::default() };
    let fork = fork_request(&parent, "S", options).unwrap();
    for key in ["model", "system", "tools", "thinking", "max_tokens", "tool_choice"] {
        assert_eq!(fork.body[key], parent[key], "{key}");
    }
    // Asked for, `none` replaces it (and costs the cached messages).
    let none = ForkOptions { tool_refusal: ToolRefusal::ToolChoiceNone, ..options };
    assert_eq!(fork_request(&parent, "S", none).unwrap().body["tool_choice"], json!({"type": "none"}));
}

// ---------------------------------------------------------------------------------
// Kept messages after an install (issue #24): the view's active-chain rule must not
// drop a message the boundary keeps, nor one appended while the compaction ran or
// after it. Every record below carries a marker (`[[uuid]]`) in what the model reads,
// so the assembled request shows where each message went.

fn marker(uuid: &str) -> String {
    format!("[[{uuid}]]")
}

fn prompt(uuid: &str, parent: Option<&str>) -> Record {
    user(uuid, parent, &format!("prompt {}", marker(uuid)))
}

fn reply(uuid: &str, parent: &str, msg_id: &str) -> Record {
    assistant(uuid, parent, msg_id, json!({"type": "text", "text": format!("reply {}", marker(uuid))}))
}

fn call(uuid: &str, parent: &str, msg_id: &str, tool_use_id: &str) -> Record {
    assistant(uuid, parent, msg_id, tool_use(tool_use_id, "Read", json!({"file_path": format!("/p/{}", marker(uuid))})))
}

fn result(uuid: &str, parent: &str, tool_use_id: &str) -> Record {
    tool_result(uuid, parent, tool_use_id, &format!("result {}", marker(uuid)))
}

/// One of ctxd's own notes (budget notice, date, changed files): an attachment with no
/// parent, as ctxd writes them.
fn ctxd_note(uuid: &str) -> Record {
    rec(with_common(json!({
        "parentUuid": null, "isSidechain": false, "type": "attachment",
        "attachment": {"type": "ctxd_note", "source": "ctxd"},
        "rendered": [{"content": format!("<system-reminder>\nnote {}\n</system-reminder>", marker(uuid))}],
        "renderedRole": "user", "uuid": uuid, "timestamp": "2026-11-29T10:00:03.000Z",
    })))
}

/// The turn the summary replaces: a prompt, a tool round and the answer.
fn summarized_turn() -> Vec<Record> {
    vec![
        prompt("s1", None),
        call("s2", "s1", "msg_s2", "toolu_s2"),
        result("s3", "s2", "toolu_s2"),
        reply("s4", "s3", "msg_s4"),
    ]
}

/// Installs a compaction of `view` as the daemon does: the split chosen on what the
/// compaction started on (`kept_from`), moved by [`safe_split`] over the whole view
/// (records appended while it ran may answer a call on the summarized side), and
/// everything from there kept after the summary, with restored files and hook output.
/// Returns the transcript after the install and the uuids of what the install wrote
/// for the model (the summary, then the attachments).
fn install_over(view: &[Record], kept_from: usize) -> (Vec<Record>, Vec<String>) {
    let attachments = restored_attachments();
    let hooks = vec!["Remember: run pytest before committing.".to_owned()];
    let kept_from = safe_split(view, kept_from);
    let summary_text = summary_message_text(&SummaryMessage {
        body: "1. Primary Request and Intent:\n   Read the file.".to_owned(),
        transcript_path: None,
        history_tools: None,
        tools_used: tools_used(&view[..kept_from]),
        kept: KeptMessages::After,
    });
    let input = InstallInput {
        trigger: Trigger::Auto,
        last_uuid: view.iter().rev().find_map(|r| r.uuid().map(str::to_owned)),
        pre_tokens: 150_000,
        fixed_prefix_tokens: Some(12_000),
        duration_ms: 900,
        summary_text,
        kept_before: &[],
        kept_after: &kept_tail(view, kept_from),
        attachments: &attachments,
        hook_outputs: &hooks,
        common: common_fields(&view[0]),
        timestamp: "2026-11-29T10:05:00.000Z".to_owned(),
        tokens_per_kib: None,
        attachment_links: super::AttachmentLinks::Loose,
    };
    let built = build_post_compact(&input, &mut counter()).unwrap();
    let installed = built.records[1..].iter().filter_map(|r| r.uuid().map(str::to_owned)).collect();
    let mut all = view.to_vec();
    all.extend(built.records);
    (all, installed)
}

/// The request assembled over `records`, as JSON text. The daemon's view cache, fed
/// the transcript as it grew (up to the install, then record by record), must agree.
fn assembled_text(records: &[Record]) -> String {
    let base = crate::view::BaseContext::default();
    let state = crate::view::PipelineState::default();
    let config = crate::view::PipelineConfig::default();
    let system = vec![json!({"type": "text", "text": "You are a coding agent."})];
    let tools = vec![json!({"name": "Read", "description": "Reads a file.", "input_schema": {"type": "object"}})];
    let input = |records| crate::view::AssembleInput {
        records,
        system: &system,
        tools: &tools,
        model: "claude-x",
        max_tokens: 8_000,
        thinking: None,
        fork: None,
        base: &base,
        // Minutes after the install: no time-gap clearing of old tool results.
        now_ms: crate::view::parse_rfc3339_ms("2026-11-29T10:06:00.000Z").unwrap(),
        state: &state,
        config: &config,
        tool_results_dir: "/store",
        compact: crate::view::CompactCheck::default(),
    };
    let out = crate::view::assemble(&input(records));
    let value = out.request.to_value();
    let boundary = records.iter().rposition(Record::is_compact_boundary).unwrap_or(0);
    let mut cache = crate::view::ViewCache::new();
    for end in boundary..=records.len() {
        let cached = cache.assemble(&input(&records[..end]));
        if end == records.len() {
            assert_eq!(cached.request.to_value(), value, "the view cache disagrees with a fresh assembly");
        }
    }
    if let Err(errors) = crate::view::validate_request(&value) {
        panic!("invalid request: {errors:#?}\n{}", crate::view::render_request(&value));
    }
    serde_json::to_string(&value["messages"]).unwrap()
}

/// Asserts the view after the install is the summary, then `kept`, then the restored
/// files and hook output, then `appended` (uuids, in order, each once), and that every
/// marker of `kept` and `appended` is in the assembled request exactly once, in order.
fn assert_nothing_falls_off(all: &[Record], installed: &[String], kept: &[&str], appended: &[&str]) {
    let mut expected: Vec<String> = vec![installed[0].clone()];
    expected.extend(kept.iter().map(|u| (*u).to_owned()));
    expected.extend(installed[1..].iter().cloned());
    expected.extend(appended.iter().map(|u| (*u).to_owned()));
    assert_eq!(viewed(all), expected, "the view after the install");
    let text = assembled_text(all);
    let mut last = 0;
    let kind = |uuid: &str| all.iter().find(|r| r.uuid() == Some(uuid)).map(|r| r.head().kind.clone());
    for uuid in kept.iter().chain(appended) {
        if matches!(kind(uuid), Some(crate::record::Kind::System | crate::record::Kind::Other)) {
            // Bookkeeping: in the view's order, never in the request.
            continue;
        }
        let m = marker(uuid);
        assert_eq!(text.matches(&m).count(), 1, "{uuid} in the request:\n{text}");
        // A note between a call and its result goes after the result (results lead
        // their message): notes are checked for presence, the conversation for order.
        let note = kind(uuid) == Some(crate::record::Kind::Attachment);
        let at = text.find(&m).unwrap_or(0);
        if !note {
            assert!(at >= last, "{uuid} out of order in the request:\n{text}");
            last = at;
        }
    }
    for gone in ["[[s1]]", "[[s2]]", "[[s3]]", "[[s4]]"] {
        assert!(!text.contains(gone), "summarized {gone} still in the request");
    }
}

#[test]
fn a_kept_tail_starting_with_a_reply_whose_parent_was_summarized_stays_whole() {
    // The shape reported on the cache-sharing fork: the tail starts with a model reply
    // whose parent is summarized, a ctxd note with no parent follows it, then a reply
    // whose parent is that first reply.
    let mut view = summarized_turn();
    view.extend([prompt("u1", Some("s4")), reply("n1", "u1", "msg_n1"), ctxd_note("n2"), reply("n3", "n1", "msg_n3")]);
    let (mut all, installed) = install_over(&view, 5);
    assert_nothing_falls_off(&all, &installed, &["n1", "n2", "n3"], &[]);
    // The host goes on from its last reply; then the date changes and it goes on again.
    all.extend([prompt("u4", Some("n3")), reply("a4", "u4", "msg_a4"), ctxd_note("d5"), prompt("u5", Some("a4"))]);
    assert_nothing_falls_off(&all, &installed, &["n1", "n2", "n3"], &["u4", "a4", "d5", "u5"]);
}

#[test]
fn parentless_notes_between_kept_records_and_after_the_install_stay_in_order() {
    let mut view = summarized_turn();
    view.extend([
        prompt("u1", Some("s4")),
        ctxd_note("d1"),
        call("a1", "u1", "msg_a1", "toolu_a1"),
        ctxd_note("b1"),
        result("r1", "a1", "toolu_a1"),
        ctxd_note("c1"),
    ]);
    let from = kept_tail_start(&view).unwrap();
    assert_eq!(view[from].uuid(), Some("a1"), "the open tool round");
    let (mut all, installed) = install_over(&view, 4);
    assert_nothing_falls_off(&all, &installed, &["u1", "d1", "a1", "b1", "r1", "c1"], &[]);
    all.extend([ctxd_note("b2"), reply("a2", "r1", "msg_a2"), ctxd_note("d2"), prompt("u2", Some("a2"))]);
    assert_nothing_falls_off(&all, &installed, &["u1", "d1", "a1", "b1", "r1", "c1"], &["b2", "a2", "d2", "u2"]);
}

#[test]
fn records_appended_while_the_compaction_ran_stay_after_the_kept_tail() {
    // The compaction started on a view ending with an open tool call; while it ran the
    // host appended the call's result, a reply, a note, a prompt and a reply to it.
    let mut view = summarized_turn();
    view.extend([prompt("u1", Some("s4")), call("a1", "u1", "msg_a1", "toolu_a1")]);
    let from = kept_tail_start(&view).unwrap();
    assert_eq!(view[from].uuid(), Some("a1"));
    view.extend([
        result("r1", "a1", "toolu_a1"),
        reply("a2", "r1", "msg_a2"),
        ctxd_note("n1"),
        prompt("u2", Some("a2")),
        reply("a3", "u2", "msg_a3"),
    ]);
    let (mut all, installed) = install_over(&view, from);
    let kept = ["a1", "r1", "a2", "n1", "u2", "a3"];
    assert_nothing_falls_off(&all, &installed, &kept, &[]);
    all.extend([prompt("u3", Some("a3")), call("a4", "u3", "msg_a4", "toolu_a4"), result("r4", "a4", "toolu_a4")]);
    assert_nothing_falls_off(&all, &installed, &kept, &["u3", "a4", "r4"]);
}

#[test]
fn a_kept_call_answered_after_the_install_and_a_reply_to_a_kept_prompt_stay() {
    // The install lands mid-turn: the kept tail is one open call, its result comes
    // after the restored files and hook output, and the turn goes on from it.
    let mut view = summarized_turn();
    view.extend([prompt("u1", Some("s4")), call("a1", "u1", "msg_a1", "toolu_a1")]);
    let (mut all, installed) = install_over(&view, kept_tail_start(&view).unwrap());
    assert_nothing_falls_off(&all, &installed, &["a1"], &[]);
    all.extend([result("r1", "a1", "toolu_a1"), reply("a2", "r1", "msg_a2")]);
    assert_nothing_falls_off(&all, &installed, &["a1"], &["r1", "a2"]);

    // A kept prompt alone, answered after the install.
    let mut view = summarized_turn();
    view.push(prompt("u1", Some("s4")));
    let (mut all, installed) = install_over(&view, kept_tail_start(&view).unwrap());
    all.extend([ctxd_note("n1"), reply("a1", "u1", "msg_a1")]);
    assert_nothing_falls_off(&all, &installed, &["u1"], &["n1", "a1"]);
}

#[test]
fn a_parallel_tool_round_split_at_the_kept_boundary_stays_whole() {
    // Two calls of one response, each its own line (a progress record between them),
    // each result hanging off its call's line. The compaction started after the first
    // result; the second came while it ran, and after the install the next response
    // follows only the first result, as Claude Code writes it.
    let mut view = summarized_turn();
    view.extend([
        prompt("u1", Some("s4")),
        call("a1", "u1", "msg_a1", "toolu_a1"),
        rec(json!({"type": "progress", "uuid": "p1", "parentUuid": "a1", "data": {"type": "hook_progress"}})),
        call("a2", "p1", "msg_a1", "toolu_a2"),
        result("r1", "a1", "toolu_a1"),
    ]);
    let from = kept_tail_start(&view).unwrap();
    assert_eq!(view[from].uuid(), Some("a1"), "the round from its first line");
    // A split chosen between the two lines moves back to the first.
    assert_eq!(safe_split(&view, from + 2), from);
    view.push(result("r2", "a2", "toolu_a2"));
    let (mut all, installed) = install_over(&view, from + 2);
    let kept = ["a1", "a2", "r1", "r2"];
    assert_nothing_falls_off(&all, &installed, &kept, &[]);
    all.extend([reply("a3", "r1", "msg_a3"), prompt("u2", Some("a3"))]);
    assert_nothing_falls_off(&all, &installed, &kept, &["a3", "u2"]);
    // The next response follows the second result instead: the first stays too.
    all.truncate(all.len() - 2);
    all.extend([reply("a3", "r2", "msg_a3"), prompt("u2", Some("a3"))]);
    assert_nothing_falls_off(&all, &installed, &kept, &["a3", "u2"]);
}

#[test]
fn a_summary_prepared_ahead_keeps_every_turn_the_host_appended_since() {
    // The summary was prepared on a view ending with a prompt; before the threshold was
    // reached the host appended several turns (tool rounds, notes, replies, prompts),
    // all kept after the summary when the prepared summary is installed.
    let mut view = summarized_turn();
    view.push(prompt("u1", Some("s4")));
    let from = kept_tail_start(&view).unwrap();
    assert_eq!(view[from].uuid(), Some("u1"));
    view.extend([
        call("a1", "u1", "msg_a1", "toolu_a1"),
        result("r1", "a1", "toolu_a1"),
        ctxd_note("n1"),
        reply("a2", "r1", "msg_a2"),
        prompt("u2", Some("a2")),
        call("a3", "u2", "msg_a3", "toolu_a3"),
        call("a4", "a3", "msg_a3", "toolu_a4"),
        result("r3", "a3", "toolu_a3"),
        result("r4", "a4", "toolu_a4"),
        ctxd_note("n2"),
        reply("a5", "r3", "msg_a5"),
        prompt("u3", Some("a5")),
    ]);
    let (mut all, installed) = install_over(&view, from);
    let kept = ["u1", "a1", "r1", "n1", "a2", "u2", "a3", "a4", "r3", "r4", "n2", "a5", "u3"];
    assert_nothing_falls_off(&all, &installed, &kept, &[]);
    all.extend([reply("a6", "u3", "msg_a6"), prompt("u4", Some("a6"))]);
    assert_nothing_falls_off(&all, &installed, &kept, &["a6", "u4"]);

    // Prepared ahead on a view ending with a reply whose parent the summary takes, the
    // reported shape, with turns appended since.
    let mut view = summarized_turn();
    view.extend([prompt("u1", Some("s4")), reply("n1", "u1", "msg_n1")]);
    let from = kept_tail_start(&view).unwrap();
    assert_eq!(view[from].uuid(), Some("n1"));
    view.extend([ctxd_note("n2"), reply("n3", "n1", "msg_n3"), prompt("u2", Some("n3")), reply("a2", "u2", "msg_a2")]);
    let (all, installed) = install_over(&view, from);
    assert_nothing_falls_off(&all, &installed, &["n1", "n2", "n3", "u2", "a2"], &[]);
}

#[test]
fn kept_messages_whose_parent_is_a_bookkeeping_record_stay_in_view() {
    // The boundary keeps messages only: the host's system and progress records in the
    // kept range stay out of the view, so a message hanging off one has no parent in
    // it. The turn-duration record between a reply and the next prompt, and a progress
    // record a tool result hangs off, are the shapes Claude Code writes.
    let system = |uuid: &str, parent: &str| {
        rec(json!({"type": "system", "subtype": "turn_duration", "uuid": uuid, "parentUuid": parent,
            "isSidechain": false, "durationMs": 1200, "timestamp": "2026-11-29T10:00:01.500Z"}))
    };
    let progress = |uuid: &str, parent: &str| {
        rec(json!({"type": "progress", "uuid": uuid, "parentUuid": parent, "isSidechain": false,
            "data": {"type": "hook_progress"}, "timestamp": "2026-11-29T10:00:01.600Z"}))
    };
    let mut view = summarized_turn();
    view.extend([prompt("u1", Some("s4")), reply("a1", "u1", "msg_a1"), system("y1", "a1")]);
    let from = kept_tail_start(&view).unwrap();
    assert_eq!(view[from].uuid(), Some("a1"));
    view.extend([
        prompt("u2", Some("y1")),
        call("a2", "u2", "msg_a2", "toolu_a2"),
        progress("p2", "a2"),
        result("r2", "p2", "toolu_a2"),
        reply("a3", "r2", "msg_a3"),
        system("y3", "a3"),
    ]);
    let (mut all, installed) = install_over(&view, from);
    let kept = ["a1", "u2", "a2", "r2", "a3"];
    assert_nothing_falls_off(&all, &installed, &kept, &[]);
    all.extend([prompt("u4", Some("y3")), reply("a4", "u4", "msg_a4"), system("y4", "a4"), prompt("u5", Some("y4"))]);
    assert_nothing_falls_off(&all, &installed, &kept, &["u4", "a4", "y4", "u5"]);
}

#[test]
fn a_branch_the_host_rewound_away_from_while_the_compaction_ran_stays_out_of_view() {
    // The compaction started on a view ending with a prompt; while it ran the model
    // answered, then the user rewound to before that prompt (the summarized answer s4)
    // and asked again. The view had left the first prompt and its answer out.
    let mut view = summarized_turn();
    view.push(prompt("u1", Some("s4")));
    let from = kept_tail_start(&view).unwrap();
    view.extend([reply("a1", "u1", "msg_a1"), prompt("u1b", Some("s4")), reply("a1b", "u1b", "msg_a1b")]);
    assert_eq!(viewed(&view), ["s1", "s2", "s3", "s4", "u1b", "a1b"]);
    // Kept after the summary, the abandoned branch would come back: the record the host
    // rewound to is summarized, so nothing after the install shows the rewind.
    let (mut all, installed) = install_over(&view, from);
    assert_nothing_falls_off(&all, &installed, &["u1b", "a1b"], &[]);
    let text = assembled_text(&all);
    assert!(!text.contains("[[u1]]") && !text.contains("[[a1]]"), "the abandoned branch is back:\n{text}");
    all.push(prompt("u2", Some("a1b")));
    assert_nothing_falls_off(&all, &installed, &["u1b", "a1b"], &["u2"]);
}
