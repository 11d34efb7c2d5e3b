//! The stages together, decisions that must hold across requests, and the view cache
//! against assembling from scratch.

use expect_test::expect;

use super::fixture::fixture;
use super::stages::{reads, rounds};
use super::*;

/// Assembles every prefix of `records` twice, with one cache kept across prefixes and
/// from scratch, and checks they agree and are valid. Returns the cache's counters.
pub(crate) fn check_incremental(setup: &Setup, records: &[Record]) -> CacheCounters {
    let mut cache = ViewCache::new();
    for n in 0..=records.len() {
        let input = setup.input(&records[..n]);
        let kept = cache.assemble(&input);
        let fresh = assemble(&input);
        assert_same(&kept, &fresh, n);
    }
    cache.counters()
}

pub(crate) fn assert_same(kept: &Assembled, fresh: &Assembled, n: usize) {
    assert_valid(fresh);
    let (a, b) = (kept.request.to_json(), fresh.request.to_json());
    if a != b {
        let at = a.bytes().zip(b.bytes()).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
        let window = |s: &str| s.get(at.saturating_sub(150)..(at + 150).min(s.len())).unwrap_or("").to_owned();
        panic!(
            "after {n} records the cached request differs:\n--- cached\n{}--- fresh\n{}--- at byte {at}\n{}\n{}",
            rendered(kept),
            rendered(fresh),
            window(&a),
            window(&b)
        );
    }
    assert_eq!(kept.applied, fresh.applied, "after {n} records");
    assert_eq!(kept.new_state, fresh.new_state, "after {n} records");
    assert_eq!(kept.estimate_tokens, fresh.estimate_tokens, "after {n} records");
    assert_eq!(kept.decision, fresh.decision, "after {n} records");
}

#[test]
fn stages_apply_in_order() {
    let f = fixture(&format!(
        r#"
        user u0 "an old task"
        say a0 m0 "old task done"
        boundary b1
        summary s1 "Earlier: an old task, done."
        user u1 "the new task"
        call a1 m1 t1 Grep
        result r1 t1 300
        say a2 m2 "grep found nothing"
        user u2 "look at the logs"
        call a3 m3 t2 Bash
        result r2 t2 110000
        replace t2 "[the log, stored]"
        say a4 m4 "the log says: disk full"
        {}
        snip a1 r1 a2
        collapse u2 a4 "The logs said the disk was full."
        wait 6
        user u3 "back: what now?"
        "#,
        rounds("x", 10)
    ));
    let out = Setup::new(f.end_ms).run(&f.records);
    expect![[r#"
        system: text("You are a coding agent.")+cache
        tools: Read Bash Grep Glob Edit Write Task+cache
        user: text("Earlier: an old task, done.") text("the new task") text("[Earlier messages, collapsed int…")
        assistant: tool_use(xt1 Read)
        user: tool_result(xt1 "[Old tool result content cleared…")
        assistant: tool_use(xt2 Read)
        user: tool_result(xt2 "[Old tool result content cleared…")
        assistant: tool_use(xt3 Read)
        user: tool_result(xt3 "[Old tool result content cleared…")
        assistant: tool_use(xt4 Read)
        user: tool_result(xt4 "[Old tool result content cleared…")
        assistant: tool_use(xt5 Read)
        user: tool_result(xt5 "[Old tool result content cleared…")
        assistant: tool_use(xt6 Read)
        user: tool_result(xt6, 19000b)
        assistant: tool_use(xt7 Read)
        user: tool_result(xt7, 19000b)
        assistant: tool_use(xt8 Read)
        user: tool_result(xt8, 19000b)
        assistant: tool_use(xt9 Read)
        user: tool_result(xt9, 19000b)
        assistant: tool_use(xt10 Read)
        user: tool_result(xt10, 19000b)
        assistant: text("all read")
        user: text("back: what now?")+cache
    "#]]
    .assert_eq(&rendered(&out));
    expect![[r#"
        slice*: after the boundary at record 2: 34 records
        tool_result_budget: 0 new results stored, 1 recorded replacements
        snip*: 3 named, 3 removed, 0 protected (freed 118)
        microcompact*: time_gap: 5 results; 5 cleared, 0 deleted by cache edits (freed 24260)
        collapse*: 1 of 1 collapses applied (freed 33)
        compact_check: 24888 tokens, no threshold
        place: system context none, user context none, 0 extra blocks
        normalize: 0 lines merged, 0 responses merged, 0 synthetic results, 0 orphan results as text, 0 calls to missing tools as text, 0 duplicates dropped
        cache_breakpoints*: 3 markers (message 22), 0 host markers kept, 0 removed
    "#]]
    .assert_eq(&report(&out));
}

#[test]
fn a_time_gap_clears_once_and_the_cleared_prefix_stays() {
    let mut f = fixture(&format!("{}wait 6\nuser u1 \"back after lunch\"\n", reads(10)));
    let mut setup = Setup::new(f.end_ms);
    let first = setup.run(&f.records);
    assert!(first.new_state.microcompact.is_some());
    persist(&mut f.records, &first);

    // A retry a minute later: the gap is the same one, nothing new is decided, and the
    // request is the same.
    setup.now_ms += 60_000;
    let retry = setup.run(&f.records);
    assert_eq!(retry.new_state, StateChanges::default());
    assert_eq!(retry.request.to_json(), first.request.to_json());

    // The model answers, the user follows up at once: the cleared prefix is unchanged.
    let more = fixture("say a11 z11 \"here is the plan\"\nuser u2 \"go on\"");
    f.records.extend(more.records);
    setup.now_ms += 60_000;
    let next = setup.run(&f.records);
    assert!(next.new_state.microcompact.is_none());
    let before = first.request.to_value()["messages"].as_array().unwrap().clone();
    let after = next.request.to_value()["messages"].as_array().unwrap().clone();
    let unmarked = |m: &Value| m.to_string().replace(r#","cache_control":{"type":"ephemeral"}"#, "");
    assert_eq!(before.len() + 2, after.len());
    for (a, b) in before.iter().zip(&after) {
        assert_eq!(unmarked(a), unmarked(b));
    }

    // Another gap: the old results are already cleared, so nothing is left to save.
    setup.now_ms += 10 * 60_000;
    assert!(setup.run(&f.records).new_state.microcompact.is_none());
    // Checked through the cache as well as from scratch.
    check_incremental(&setup, &f.records);
}

#[test]
fn pinned_cache_edits_are_sent_again_identically() {
    let mut f = fixture(&format!("{}user u1 \"continue\"\n", reads(10)));
    let mut setup = Setup::new(f.end_ms);
    setup.config.microcompact.cache_editing = true;
    let first = setup.run(&f.records);
    persist(&mut f.records, &first);
    let edits_of = |out: &Assembled| -> Vec<(usize, usize, String)> {
        out.request
            .messages
            .iter()
            .enumerate()
            .flat_map(|(m, msg)| {
                msg.content
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.kind == BlockKind::CacheEdits)
                    .map(move |(j, b)| (m, j, b.json().to_owned()))
            })
            .collect()
    };
    let pinned = edits_of(&first);
    assert_eq!(pinned.len(), 1);

    let more = fixture(&format!("say a11 z11 \"continuing\"\nuser u2 \"more\"\n{}", rounds("n", 6)));
    f.records.extend(more.records.clone());
    let next = setup.run(&f.records);
    let now = edits_of(&next);
    assert_eq!(now[0], pinned[0], "the first edits moved or changed");
    // The new results pushed t6..t10 and nt1 out of the five most recent: a second
    // edit, pinned to the new last user record.
    let record = next.new_state.microcompact.clone().unwrap();
    assert_eq!(record.cleared_tool_use_ids, ["t6", "t7", "t8", "t9", "t10", "nt1"]);
    assert_eq!(record.pinned_to_uuid.as_deref(), Some("nr6"));
    assert_eq!(now.len(), 2);
    persist(&mut f.records, &next);
    let third = setup.run(&f.records);
    assert_eq!(edits_of(&third), now);
    check_incremental(&setup, &f.records);
}

#[test]
fn the_cache_extends_instead_of_rebuilding() {
    let f = fixture(&format!(
        "{}{}",
        reads(12),
        r#"
        user u1 "and now"
        call b1 n1 x1 Bash
        result q1 x1 130000
        replace x1 "[stored]"
        say b2 n2 "stored it"
        snip c3 r3
        user u2 "then"
        collapse c5 r6 "Reads five and six."
        user u3 "end"
        "#
    ));
    let counters = check_incremental(&Setup::new(f.end_ms), &f.records);
    // One parse of everything, a rebuild per snip and collapse (and one at the start);
    // the replacement of the open result is absorbed.
    assert_eq!(counters.resets, 1, "{counters:?}");
    assert!(counters.rebuilds <= 4, "{counters:?}");
    assert!(counters.extensions as usize >= f.records.len() - 4, "{counters:?}");
}

#[test]
fn settings_and_records_changes_are_seen() {
    let f = fixture(&reads(3));
    let mut setup = Setup::new(f.end_ms);
    let mut cache = ViewCache::new();
    let a = cache.assemble(&setup.input(&f.records));
    // Different tools: the calls to Read become text.
    setup.tools = tools(&["Bash"]);
    let b = cache.assemble(&setup.input(&f.records));
    assert_same(&b, &assemble(&setup.input(&f.records)), f.records.len());
    assert_ne!(a.request.to_json(), b.request.to_json());
    // Different user context.
    setup.base.user_context = Some("memory".into());
    let c = cache.assemble(&setup.input(&f.records));
    assert_same(&c, &assemble(&setup.input(&f.records)), f.records.len());
    // A shorter, different record list: parsed again.
    let other = fixture("user x1 \"other\"");
    let d = cache.assemble(&setup.input(&other.records));
    assert_same(&d, &assemble(&setup.input(&other.records)), 1);
    // State from outside the transcript.
    setup.state.collapses.push(Collapse { from: "c1".into(), to: "r2".into(), summary: "Two reads.".into() });
    let e = cache.assemble(&setup.input(&f.records));
    assert_same(&e, &assemble(&setup.input(&f.records)), f.records.len());
    assert!(rendered(&e).contains("collapsed"));
    assert_eq!(cache.counters().resets, 3);
}

#[test]
fn a_new_boundary_starts_a_new_view() {
    let mut f = fixture(&reads(3));
    let setup = Setup::new(f.end_ms + 10_000);
    let mut cache = ViewCache::new();
    cache.assemble(&setup.input(&f.records));
    f.records.extend(fixture("boundary b9\nsummary s9 \"Three reads.\"\nuser u9 \"next\"").records);
    let out = cache.assemble(&setup.input(&f.records));
    assert_same(&out, &assemble(&setup.input(&f.records)), f.records.len());
    assert_eq!(out.request.messages.len(), 1);
}
