//! One golden per stage: a small fixture, the stage's view or request rendered one line
//! per message, and the facts the stage reports.

use expect_test::expect;

use super::fixture::fixture;
use super::*;

fn view(records: &[Record], config: &PipelineConfig) -> String {
    render_view(&runtime_view(records, &PipelineState::default(), config))
}

#[test]
fn slice_starts_after_the_latest_boundary() {
    let f = fixture(
        r#"
        user u1 "first task"
        say a1 m1 "done first"
        boundary b1
        summary s1 "Summary of the first task."
        user u2 "second task"
        say a2 m2 "done second"
        boundary b2 a2 s2 a2
        summary s2 "Summary of both tasks."
        user u3 "third task"
        "#,
    );
    expect![[r#"
        user[compact-summary] s2 (parent b2): text("Summary of both tasks.")
        assistant a2 (parent u2): text("done second")
        user u3 (parent s2): text("third task")
    "#]]
    .assert_eq(&view(&f.records, &PipelineConfig::default()));
    let out = Setup::new(f.end_ms).run(&f.records);
    expect![[r#"
        system: text("You are a coding agent.")+cache
        tools: Read Bash Grep Glob Edit Write Task+cache
        user: text("Summary of both tasks.")
        assistant: text("done second")
        user: text("third task")+cache
    "#]]
    .assert_eq(&rendered(&out));
    assert_eq!(out.applied[0].detail, "after the boundary at record 6: 3 records, 1 preserved before it");

    // Given only the records from the boundary on, the preserved segment cannot come back.
    let out = Setup::new(f.end_ms).run(&f.records[6..]);
    assert!(out.applied[0].detail.contains("not among the records given"), "{}", out.applied[0].detail);
    assert_eq!(out.request.messages.len(), 1);
}

#[test]
fn a_rewound_branch_leaves_the_view() {
    let f = fixture(
        r#"
        user u1 "write a parser"
        call a1 m1 t1 Read
        result r1 t1 300
        say a2 m2 "the parser reads tokens"
        user u2 "now make it faster"
        call a3 m3 t2 Bash
        result r2 t2 200
        say a4 m4 "it is faster now"
        from a2
        user u3 "no: make it smaller instead"
        say a5 m5 "smaller it is"
        "#,
    );
    expect![[r#"
        user u1: text("write a parser")
        assistant a1: tool_use(t1 Read)
        user r1: tool_result(t1, 300b)
        assistant a2: text("the parser reads tokens")
        user u3: text("no: make it smaller instead")
        assistant a5: text("smaller it is")
    "#]]
    .assert_eq(&view(&f.records, &PipelineConfig::default()));
    let out = Setup::new(f.end_ms).run(&f.records);
    assert_eq!(out.applied[0].detail, "no boundary: 10 records; 4 off the active chain left out");
    assert!(!rendered(&out).contains("faster"));

    // Going back to the first branch brings it back, and leaves the second out.
    let mut records = f.records.clone();
    records.extend(fixture("from a4\n user u4 \"faster is fine after all\"").records);
    expect![[r#"
        user u1: text("write a parser")
        assistant a1: tool_use(t1 Read)
        user r1: tool_result(t1, 300b)
        assistant a2: text("the parser reads tokens")
        user u2: text("now make it faster")
        assistant a3: tool_use(t2 Bash)
        user r2: tool_result(t2, 200b)
        assistant a4: text("it is faster now")
        user u4: text("faster is fine after all")
    "#]]
    .assert_eq(&view(&records, &PipelineConfig::default()));

    // Through the view cache: the same requests, parsed again only at the two switches.
    let counters = pipeline::check_incremental(&Setup::new(f.end_ms), &records);
    assert_eq!((counters.resets, counters.extensions), (3, 9), "{counters:?}");
}

#[test]
fn parallel_calls_progress_sidechains_and_notes_stay_on_the_chain() {
    // As Claude Code writes parallel calls: one line per call (the second after a
    // progress record), each result hanging off its call's line, the next response
    // following one result only. A subagent's sidechain and a note ctxd appended (no
    // parent) sit in between.
    let f = fixture(
        r#"
        user u1 "look at both files"
        say a1 m1 "reading both"
        call a2 m1 t1 Read
        step p1
        call a3 m1 t2 Grep
        side x1 "the subagent's own prompt"
        from a2
        result r1 t1 100
        from a3
        result r2 t2 120
        note n1 "<system-reminder>src/lib.rs changed</system-reminder>"
        from r1
        say a4 m2 "both read"
        user u2 "thanks"
        "#,
    );
    expect![[r#"
        user u1: text("look at both files")
        assistant a1: text("reading both")
        assistant a2: tool_use(t1 Read)
        assistant a3 (parent p1): tool_use(t2 Grep)
        user r1 (parent a2): tool_result(t1, 100b)
        user r2 (parent a3): tool_result(t2, 120b)
        user[attachment:changed_files] n1 (parent none): text("<system-reminder>src/lib.rs chan…")
        assistant a4 (parent r1): text("both read")
        user u2: text("thanks")
    "#]]
    .assert_eq(&view(&f.records, &PipelineConfig::default()));
    let out = Setup::new(f.end_ms).run(&f.records);
    expect![[r#"
        system: text("You are a coding agent.")+cache
        tools: Read Bash Grep Glob Edit Write Task+cache
        user: text("look at both files")
        assistant: text("reading both") tool_use(t1 Read) tool_use(t2 Grep)
        user: tool_result(t1, 100b) tool_result(t2, 120b) text("<system-reminder>src/lib.rs chan…")
        assistant: text("both read")
        user: text("thanks")+cache
    "#]]
    .assert_eq(&rendered(&out));
    assert_eq!(out.applied[0].detail, "no boundary: 11 records");
    let counters = pipeline::check_incremental(&Setup::new(f.end_ms), &f.records);
    assert_eq!(counters.resets, 1, "{counters:?}");
}

#[test]
fn a_rewind_after_a_boundary_stays_after_it() {
    let f = fixture(
        r#"
        user u1 "old task"
        say a1 m1 "old task done"
        boundary b1
        summary s1 "Summary: the old task is done."
        user u2 "new task, step one"
        say a2 m2 "step one done"
        user u3 "step two"
        say a3 m3 "step two done"
        from s1
        user u4 "new task, done differently"
        say a4 m4 "differently it is"
        "#,
    );
    expect![[r#"
        user[compact-summary] s1 (parent b1): text("Summary: the old task is done.")
        user u4: text("new task, done differently")
        assistant a4: text("differently it is")
    "#]]
    .assert_eq(&view(&f.records, &PipelineConfig::default()));
    let out = Setup::new(f.end_ms).run(&f.records);
    assert_eq!(out.applied[0].detail, "after the boundary at record 2: 7 records; 4 off the active chain left out");

    // A record hanging off one from before the boundary (not in the view, and not in
    // the records the daemon holds): read as continuing the view, which still starts
    // after the boundary.
    let mut records = f.records.clone();
    records.extend(fixture("from a1\n user u5 \"back before the compaction\"").records);
    expect![[r#"
        user[compact-summary] s1 (parent b1): text("Summary: the old task is done.")
        user u4: text("new task, done differently")
        assistant a4: text("differently it is")
        user u5 (parent a1): text("back before the compaction")
    "#]]
    .assert_eq(&view(&records, &PipelineConfig::default()));
    pipeline::check_incremental(&Setup::new(f.end_ms), &records);
}

#[test]
fn budget_stores_new_oversized_results_and_replays_recorded_ones() {
    let f = fixture(
        r#"
        user u1 "read the logs"
        call a1 m1 t1 Read
        result r1 t1 120000
        say a2 m2 "big, but already seen"
        replace t1 "[stored earlier]"
        user u2 "now these"
        call a3 m3 t2 Bash t3 Bash t4 Bash t5 Bash
        result r2 t2 110000
        result r3 t3 80000
        result r4 t4 80000
        result r5 t5 2000
        "#,
    );
    let setup = Setup::new(f.end_ms);
    let out = setup.run(&f.records);
    // t2 is over the 25,000-token budget on its own; t3..t5 then total 40,500 tokens,
    // over the 50,000 message budget only with t2, so nothing else goes.
    let stored: Vec<&str> = out.new_state.offloads.iter().map(|o| o.tool_use_id.as_str()).collect();
    assert_eq!(stored, ["t2"]);
    let offload = &out.new_state.offloads[0];
    assert_eq!(offload.replacement.path, "/store/t2.txt");
    assert_eq!(offload.content.len(), 110_000);
    assert!(offload.replacement.preview.contains("/store/t2.txt"));
    assert!(offload.replacement.preview.len() < 4_000);
    expect![[r#"
        system: text("You are a coding agent.")+cache
        tools: Read Bash Grep Glob Edit Write Task+cache
        user: text("read the logs")
        assistant: tool_use(t1 Read)
        user: tool_result(t1 "[stored earlier]")
        assistant: text("big, but already seen")
        user: text("now these")
        assistant: tool_use(t2 Bash) tool_use(t3 Bash) tool_use(t4 Bash) tool_use(t5 Bash)
        user: tool_result(t2 preview) tool_result(t3, 80000b) tool_result(t4, 80000b) tool_result(t5, 2000b)+cache
    "#]]
    .assert_eq(&rendered(&out));
    assert!(out.applied[1].acted && out.applied[1].tokens_freed > 26_000);

    // Without t2 the three others exceed the message budget: the largest goes first.
    let mut setup = Setup::new(f.end_ms);
    setup.config.budget.per_message_tokens = 30_000;
    let out = setup.run(&f.records);
    let stored: Vec<&str> = out.new_state.offloads.iter().map(|o| o.tool_use_id.as_str()).collect();
    assert_eq!(stored, ["t2", "t3"]);

    // Once recorded, a replacement applies whatever the budget says, and is not
    // decided again.
    let mut records = f.records.clone();
    persist(&mut records, &setup.run(&f.records));
    let mut generous = Setup::new(f.end_ms);
    generous.config.budget.per_result_tokens = 1_000_000;
    let again = generous.run(&records);
    assert!(again.new_state.offloads.is_empty());
    assert_eq!(rendered(&again), rendered(&setup.run(&f.records)));
}

const SNIPPY: &str = r#"
    user u1 "the task: fix the parser"
    call a1 m1 t1 Read
    result r1 t1 400
    say a2 m2 "read it"
    user u2 "look around"
    call a3 m3 t2 Grep
    result r2 t2 3000
    say a4 m4 "found nothing useful"
    user u3 "load the cron tools"
    call a5 m5 t3 Task
    result r3 t3 x toolref
    say a6 m6 "loaded"
    user u4 "now fix it"
"#;

#[test]
fn snip_removes_named_records_relinks_and_tags() {
    let mut f = fixture(SNIPPY);
    f.records.extend(fixture("snip u2 a3 r2 a4 r3").records);
    let mut config = PipelineConfig::default();
    config.snip.enabled = true;
    expect![[r#"
        user u1: text("the task: fix the parser") text("[id:u1]")
        assistant a1: tool_use(t1 Read)
        user r1: tool_result(t1, 400b) text("[id:r1]")
        assistant a2: text("read it")
        user u3: text("load the cron tools") text("[id:u3]")
        assistant a5: tool_use(t3 Task)
        user r3: tool_result(t3, 85b) text("[id:r3]")
        assistant a6: text("loaded")
        user u4: text("now fix it") text("[id:u4]")
    "#]]
    .assert_eq(&view(&f.records, &config));
    config.include_snipped = true;
    expect![[r#"
        user u1: text("the task: fix the parser") text("[id:u1]")
        assistant a1: tool_use(t1 Read)
        user r1: tool_result(t1, 400b) text("[id:r1]")
        assistant a2: text("read it")
        user[snipped] u2: text("look around")
        assistant[snipped] a3: tool_use(t2 Grep)
        user[snipped] r2: tool_result(t2, 3000b)
        assistant[snipped] a4: text("found nothing useful")
        user u3 (parent a2): text("load the cron tools") text("[id:u3]")
        assistant a5: tool_use(t3 Task)
        user r3: tool_result(t3, 85b) text("[id:r3]")
        assistant a6: text("loaded")
        user u4: text("now fix it") text("[id:u4]")
    "#]]
    .assert_eq(&view(&f.records, &config));

    // The chain is whole again: u3 hangs off the last record kept before the gap.
    config.include_snipped = false;
    let items = runtime_view(&f.records, &PipelineState::default(), &config);
    let u3 = items.iter().find(|i| i.uuid.as_deref() == Some("u3")).unwrap();
    assert_eq!(u3.parent_uuid.as_deref(), Some("a2"));

    let mut setup = Setup::new(f.end_ms);
    setup.config.snip.enabled = true;
    let out = setup.run(&f.records);
    let snip = &out.applied[2];
    assert_eq!(snip.detail, "5 named, 4 removed, 1 protected; id tags on");
    assert!(snip.tokens_freed > 750 && snip.tokens_freed < 900, "{}", snip.tokens_freed);
}

#[test]
fn a_tool_call_split_by_a_snip_range_is_repaired() {
    let f = fixture(
        r#"
        user u1 "task"
        say a1 m1 "step one"
        call a2 m1 t1 Grep t2 Bash
        result r1 t1 100
        result r2 t2 100
        say a3 m2 "step two"
        call a4 m2 t3 Read
        result r3 t3 100
        say a5 m3 "done"
        user u2 "next"
        snip a1 a2 r1 a4
        "#,
    );
    // a1..r1 would leave t2's result without its call: a2 stays, so r1 stays too.
    // a4 (a call) is named without its result: it stays.
    let out = Setup::new(f.end_ms).run(&f.records);
    expect![[r#"
        system: text("You are a coding agent.")+cache
        tools: Read Bash Grep Glob Edit Write Task+cache
        user: text("task")
        assistant: tool_use(t1 Grep) tool_use(t2 Bash)
        user: tool_result(t1, 100b) tool_result(t2, 100b)
        assistant: text("step two") tool_use(t3 Read)
        user: tool_result(t3, 100b)
        assistant: text("done")
        user: text("next")+cache
    "#]]
    .assert_eq(&rendered(&out));
    assert_eq!(out.applied[2].detail, "4 named, 1 removed, 3 protected");
}

#[test]
fn the_efficiency_reminder_follows_growth_without_a_snip() {
    let f = fixture(SNIPPY);
    let mut setup = Setup::new(f.end_ms);
    setup.config.snip.enabled = true;
    setup.config.snip.reminder_after_tokens = 500;
    let out = setup.run(&f.records);
    let reminder = out.new_state.reminder.clone().unwrap();
    assert!(reminder.growth_tokens >= 500);
    let last = out.request.messages.last().unwrap();
    assert!(last.content.iter().any(|b| b.json().contains("snip tool")));
    // Recorded as an attachment, it resets the growth: no reminder on the next request.
    let mut records = f.records.clone();
    persist(&mut records, &out);
    let next = setup.run(&records);
    assert!(next.new_state.reminder.is_none());
    // It stays where it was put, so the prefix does not change.
    assert_eq!(next.request.messages.last().unwrap().content, last.content);
    // A snip resets it too.
    let mut records = f.records.clone();
    records.extend(fixture("snip a2").records);
    assert!(setup.run(&records).new_state.reminder.is_none());
    // And it is only offered with the snip tool.
    setup.config.snip.enabled = false;
    assert!(setup.run(&f.records).new_state.reminder.is_none());
}

/// `n` rounds of a Read call and its 19,000-byte result (about 4,770 tokens), then a
/// reply; every uuid and id starts with `tag`.
pub(crate) fn rounds(tag: &str, n: usize) -> String {
    let mut spec = String::new();
    for i in 1..=n {
        spec.push_str(&format!("call {tag}c{i} {tag}m{i} {tag}t{i} Read\nresult {tag}r{i} {tag}t{i} 19000\n"));
    }
    spec.push_str(&format!("say {tag}a{n} {tag}z{n} \"all read\"\n"));
    spec
}

/// A prompt, then `n` rounds.
pub(crate) fn reads(n: usize) -> String {
    format!("user u0 \"go\"\n{}", rounds("", n))
}

#[test]
fn microcompact_clears_old_results_after_a_gap_once() {
    let f = fixture(&format!("{}wait 6\nuser u1 \"back after lunch\"\n", reads(10)));
    let setup = Setup::new(f.end_ms);
    let out = setup.run(&f.records);
    let record = out.new_state.microcompact.clone().unwrap();
    assert_eq!(record.trigger, Trigger::TimeGap);
    assert_eq!(record.gap_after_uuid.as_deref(), Some("a10"));
    assert_eq!(record.cleared_tool_use_ids, ["t1", "t2", "t3", "t4", "t5"]);
    expect![[r#"
        system: text("You are a coding agent.")+cache
        tools: Read Bash Grep Glob Edit Write Task+cache
        user: text("go")
        assistant: tool_use(t1 Read)
        user: tool_result(t1 "[Old tool result content cleared…")
        assistant: tool_use(t2 Read)
        user: tool_result(t2 "[Old tool result content cleared…")
        assistant: tool_use(t3 Read)
        user: tool_result(t3 "[Old tool result content cleared…")
        assistant: tool_use(t4 Read)
        user: tool_result(t4 "[Old tool result content cleared…")
        assistant: tool_use(t5 Read)
        user: tool_result(t5 "[Old tool result content cleared…")
        assistant: tool_use(t6 Read)
        user: tool_result(t6, 19000b)
        assistant: tool_use(t7 Read)
        user: tool_result(t7, 19000b)
        assistant: tool_use(t8 Read)
        user: tool_result(t8, 19000b)
        assistant: tool_use(t9 Read)
        user: tool_result(t9, 19000b)
        assistant: tool_use(t10 Read)
        user: tool_result(t10, 19000b)
        assistant: text("all read")
        user: text("back after lunch")+cache
    "#]]
    .assert_eq(&rendered(&out));
    assert!(out.applied[3].tokens_freed >= 20_000);

    // Four old results save under 20,000 tokens (and a gap of 4 minutes is no gap).
    let short = fixture(&format!("{}wait 6\nuser u1 \"back\"\n", reads(9)));
    assert!(Setup::new(short.end_ms).run(&short.records).new_state.microcompact.is_none());
    // No gap, no clearing.
    let warm = fixture(&format!("{}wait 4\nuser u1 \"back\"\n", reads(10)));
    assert!(Setup::new(warm.end_ms).run(&warm.records).new_state.microcompact.is_none());
}

#[test]
fn cache_edits_leave_messages_alone_and_are_pinned() {
    let f = fixture(&format!("{}user u1 \"continue\"\n", reads(10)));
    let mut setup = Setup::new(f.end_ms);
    setup.config.microcompact.cache_editing = true;
    let out = setup.run(&f.records);
    let record = out.new_state.microcompact.clone().unwrap();
    assert_eq!(record.trigger, Trigger::CacheEdits);
    assert_eq!(record.pinned_to_uuid.as_deref(), Some("u1"));
    let text = rendered(&out);
    expect![[r#"
        user: text("go")
        assistant: tool_use(t1 Read)
        user: tool_result(t1, 19000b, ref)
        assistant: tool_use(t2 Read)
    "#]]
    .assert_eq(&text.lines().skip(2).take(4).map(|l| format!("{l}\n")).collect::<String>());
    expect![[r#"
        assistant: text("all read")
        user: text("continue")+cache cache_edits(delete t1 t2 t3 t4 t5)
    "#]]
    .assert_eq(
        &text.lines().rev().take(2).collect::<Vec<_>>().into_iter().rev().map(|l| format!("{l}\n")).collect::<String>(),
    );
}

#[test]
fn collapse_replaces_a_span_with_its_summary() {
    let f = fixture(
        r#"
        user m1 "one"
        say m2 x2 "two"
        user m3 "three"
        say m4 x4 "four"
        user m5 "five"
        say m6 x6 "six"
        user m7 "seven"
        say m8 x8 "eight"
        user m9 "nine"
        say m10 x10 "ten"
        collapse m2 m8 "Two to eight, in short."
        collapse m9 m99 "Waits for m99."
        "#,
    );
    expect![[r#"
        user m1: text("one")
        user[collapse] -: text("[Earlier messages, collapsed int…")
        user m9 (parent m8): text("nine")
        assistant m10: text("ten")
    "#]]
    .assert_eq(&view(&f.records, &PipelineConfig::default()));
    let out = Setup::new(f.end_ms).run(&f.records);
    expect![[r#"
        system: text("You are a coding agent.")+cache
        tools: Read Bash Grep Glob Edit Write Task+cache
        user: text("one") text("[Earlier messages, collapsed int…") text("nine")
        assistant: text("ten")+cache
    "#]]
    .assert_eq(&rendered(&out));
    assert_eq!(out.applied[4].detail, "1 of 2 collapses applied");
    let mut off = Setup::new(f.end_ms);
    off.config.collapse.enabled = false;
    assert_eq!(off.run(&f.records).request.messages.len(), 10);
}

#[test]
fn compaction_check_is_a_decision() {
    let f = fixture(&reads(4));
    let mut setup = Setup::new(f.end_ms);
    let estimate = setup.run(&f.records).estimate_tokens;
    assert!(estimate > 19_000 && estimate < 20_000, "{estimate}");
    setup.compact.threshold = Some(estimate);
    assert_eq!(setup.run(&f.records).decision, CompactDecision::Compact { tokens: estimate, threshold: estimate });
    setup.compact.threshold = Some(estimate + 1);
    assert_eq!(setup.run(&f.records).decision, CompactDecision::Continue);
    // An anchored count is used as given, minus what this request freed.
    setup.compact.anchored_tokens = Some(estimate + 5);
    assert!(
        matches!(setup.run(&f.records).decision, CompactDecision::Compact { tokens, .. } if tokens == estimate + 5)
    );
}

#[test]
fn base_context_goes_first_and_extras_last() {
    let f = fixture(
        r#"
        user u1 "hello"
        say a1 m1 "hi"
        "#,
    );
    let mut setup = Setup::new(f.end_ms);
    setup.base = BaseContext {
        system_context: Some("gitStatus: clean, branch main".into()),
        user_context: Some("# CLAUDE.md\nUse tabs.".into()),
        attachments: vec!["<system-reminder>src/lib.rs changed on disk</system-reminder>".into(), "  ".into()],
    };
    let out = setup.run(&f.records);
    expect![[r#"
        system: text("You are a coding agent.") text("gitStatus: clean, branch main")+cache
        tools: Read Bash Grep Glob Edit Write Task+cache
        user: text("<system-reminder>⏎# CLAUDE.md⏎Us…") text("hello")
        assistant: text("hi")
        user: text("<system-reminder>src/lib.rs chan…")+cache
    "#]]
    .assert_eq(&rendered(&out));
    let first = out.request.to_value()["messages"][0]["content"][0]["text"].as_str().unwrap().to_owned();
    assert_eq!(first, "<system-reminder>\n# CLAUDE.md\nUse tabs.\n</system-reminder>");
    assert_eq!(out.applied[6].detail, "system context appended, user context first, 1 extra blocks");
}

#[test]
fn the_request_carries_one_date() {
    let context = "# CLAUDE.md\nUse tabs.\n\nCurrent date: 2026-12-02";
    let run = |fixture_text: &str| {
        let f = fixture(fixture_text);
        let mut setup = Setup::new(f.end_ms);
        setup.base.user_context = Some(context.into());
        // The cached build agrees with a fresh one at every length, including the
        // first user message arriving after an assemble of nothing.
        super::pipeline::check_incremental(&setup, &f.records);
        setup.run(&f.records).request.to_json()
    };
    // The host dates its opening in a reminder: ctxd's date goes, its memory stays.
    let dated = run(r#"
        user u1 "<system-reminder>\nToday's date is 2026-12-01.\n</system-reminder>\nhello"
        say a1 m1 "hi"
    "#);
    assert!(dated.contains("2026-12-01") && !dated.contains("2026-12-02"), "{dated}");
    assert!(dated.contains("Use tabs."), "{dated}");
    // Typed words are not a date reminder, nor is a reminder after the first response.
    for undated in [
        r#"user u1 "today is Friday, I think""#,
        "user u1 \"hello\"\nsay a1 m1 \"hi\"\nuser u2 \"<system-reminder>Today is Friday</system-reminder>\"",
    ] {
        let text = run(undated);
        assert_eq!(text.matches("Current date: 2026-12-02").count(), 1, "{text}");
    }
    // A context that is only the date, under a dated host: no context message at all.
    let f = fixture(r#"user u1 "<system-reminder>currentDate: 2026-12-01</system-reminder> hi""#);
    let mut setup = Setup::new(f.end_ms);
    setup.base.user_context = Some("Current date: 2026-12-02".into());
    let out = setup.run(&f.records);
    assert_eq!(out.request.messages.len(), 1);
    assert!(!out.request.to_json().contains("2026-12-02"));
}

#[test]
fn normalization_makes_a_messy_transcript_valid() {
    let f = fixture(
        r#"
        attach at0 prompt_snapshot
        say a0 m0 "I start"
        user u1 "start"
        attach at1 date "<system-reminder>Today is Sunday.</system-reminder>"
        say a1 m1 "thinking out loud"
        say a1x m1 "thinking out loud"
        think a1b m1 unsigned
        think a1c m1 signed
        call a2 m1 t1 Read t2 Bash
        noise
        result r2 t2 "bash out"
        result r1 t1 "read out"
        result r1 t1 "read out"
        side x1 "a subagent's prompt"
        error e1
        say a3 m2 "calling a tool that is gone"
        call a4 m2 t3 Gone
        result r3 t3 "gone out"
        result r9 t9 "orphan out"
        say a5 m3 "one reply"
        say a6 m4 "and another"
        user u2 "ok"
        call a7 m5 t4 Read
        "#,
    );
    let out = Setup::new(f.end_ms).run(&f.records);
    expect![[r#"
        system: text("You are a coding agent.")+cache
        tools: Read Bash Grep Glob Edit Write Task+cache
        user: text("[The conversation continues from…")
        assistant: text("I start")
        user: text("start") text("<system-reminder>Today is Sunday…")
        assistant: text("thinking out loud") thinking tool_use(t1 Read) tool_use(t2 Bash)
        user: tool_result(t2, 8b) tool_result(t1, 8b)
        assistant: text("calling a tool that is gone") text("[Called the tool Gone (no longer…")
        user: text("[Result of the Gone call t3]⏎gon…") text("[Result of an earlier tool call …")
        assistant: text("one reply") text("and another")
        user: text("ok")
        assistant: tool_use(t4 Read)
        user: tool_result(t4 "[tool result missing]", error)+cache
    "#]]
    .assert_eq(&rendered(&out));
    expect![[r#"
        slice: no boundary: 23 records
        tool_result_budget: 0 new results stored, 0 recorded replacements
        snip: 0 named, 0 removed, 0 protected
        microcompact: unchanged; 0 cleared, 0 deleted by cache edits
        collapse: 0 of 0 collapses applied
        compact_check: 437 tokens, no threshold
        place: system context none, user context none, 0 extra blocks
        normalize*: 4 lines merged, 1 responses merged, 1 synthetic results, 1 orphan results as text, 1 calls to missing tools as text, 1 duplicates dropped
        cache_breakpoints*: 3 markers (message 10), 0 host markers kept, 0 removed
    "#]]
    .assert_eq(&report(&out));
}

#[test]
fn oversized_media_is_stripped_from_meta_messages_only() {
    let f = fixture(
        r#"
        picture p1 meta
        picture p2 prompt
        "#,
    );
    let mut setup = Setup::new(f.end_ms);
    assert_eq!(rendered(&setup.run(&f.records)).matches("image").count(), 2);
    setup.config.strip_meta_media = true;
    let text = rendered(&setup.run(&f.records));
    assert_eq!(text.matches("image").count(), 1, "{text}");
    assert!(text.contains("[media removed"), "{text}");
}

#[test]
fn cache_markers_end_the_conversation_or_the_shared_prefix() {
    let f = fixture(
        r#"
        user u1 "task"
        call a1 m1 t1 Read
        result r1 t1 100
        say a2 m2 "done"
        "#,
    );
    let mut setup = Setup::new(f.end_ms);
    setup.fork = Some(Fork { instruction: "Summarize the conversation.".into(), skip_cache_write: true });
    expect![[r#"
        system: text("You are a coding agent.")+cache
        tools: Read Bash Grep Glob Edit Write Task+cache
        user: text("task")
        assistant: tool_use(t1 Read)
        user: tool_result(t1, 100b)
        assistant: text("done")+cache
        user: text("Summarize the conversation.")
    "#]]
    .assert_eq(&rendered(&setup.run(&f.records)));
    // When the view ends with a user message the instruction joins it; the marker goes
    // on the block before it.
    let open = &f.records[..3];
    expect![[r#"
        system: text("You are a coding agent.")+cache
        tools: Read Bash Grep Glob Edit Write Task+cache
        user: text("task")
        assistant: tool_use(t1 Read)
        user: tool_result(t1, 100b)+cache text("Summarize the conversation.")
    "#]]
    .assert_eq(&rendered(&setup.run(open)));
    // A fork that may write: the instruction is the end.
    setup.fork = Some(Fork { instruction: "Summarize the conversation.".into(), skip_cache_write: false });
    assert!(rendered(&setup.run(&f.records)).ends_with("text(\"Summarize the conversation.\")+cache\n"));

    // Host markers are kept while they fit, latest first.
    let mut setup = Setup::new(f.end_ms);
    let marked = |text: &str| json!({"type": "text", "text": text, "cache_control": {"type": "ephemeral"}});
    setup.system = vec![marked("a"), marked("b"), marked("c")];
    setup.tools[0]["cache_control"] = json!({"type": "ephemeral"});
    let out = setup.run(&f.records);
    expect![[r#"
        system: text("a") text("b")+cache text("c")+cache
        tools: Read Bash Grep Glob Edit Write Task+cache
        user: text("task")
        assistant: tool_use(t1 Read)
        user: tool_result(t1, 100b)
        assistant: text("done")+cache
    "#]]
    .assert_eq(&rendered(&out));
    assert_eq!(out.applied[8].detail, "3 markers (message 3), 1 host markers kept, 2 removed");
}

#[test]
fn the_hosts_thinking_settings_go_into_the_request_as_sent() {
    let f = fixture(
        r#"
        user u1 "task"
        say a1 m1 "done"
        "#,
    );
    let mut setup = Setup::new(f.end_ms);
    assert!(setup.run(&f.records).request.to_value().get("thinking").is_none(), "none asked, none sent");
    let thinking = json!({"type": "enabled", "budget_tokens": 4_000});
    setup.thinking = Some(thinking.clone());
    let body = setup.run(&f.records).request.to_value();
    assert_eq!(body["thinking"], thinking);
    // A fork shares the whole prefix, thinking settings included.
    setup.fork = Some(Fork { instruction: "Summarize the conversation.".into(), skip_cache_write: true });
    assert_eq!(setup.run(&f.records).request.to_value()["thinking"], thinking);
}
