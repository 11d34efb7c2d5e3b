//! The UI view: every message of the active chain, marked with why the model does not
//! see it.

use std::fmt::Write as _;

use expect_test::expect;

use super::fixture::fixture;
use super::*;
use crate::view::render::render_block;
use crate::view::scrollback::{Hidden, ResultChange};

/// One line per entry: index, role, kind, uuid, the marks, the content.
fn render(s: &Scrollback) -> String {
    let mut out = format!("off chain: {}\n", s.off_chain);
    for (n, e) in s.entries.iter().enumerate() {
        let kind = serde_json::to_value(e.kind).unwrap();
        let _ = write!(out, "#{n} {:?} {} {}", e.role, kind.as_str().unwrap(), e.uuid.as_deref().unwrap_or("-"));
        match &e.hidden {
            Some(Hidden::Compacted { boundary_uuid }) => {
                let _ = write!(out, " [compacted by {}]", boundary_uuid.as_deref().unwrap_or("?"));
            }
            Some(Hidden::Snipped) => out.push_str(" [snipped]"),
            Some(Hidden::Collapsed { summary_entry }) => {
                let _ = write!(out, " [collapsed into #{summary_entry}]");
            }
            None => {}
        }
        for mark in &e.results {
            let change = match &mark.change {
                ResultChange::Cleared => "cleared".to_owned(),
                ResultChange::DeletedFromCache => "deleted from cache".to_owned(),
                ResultChange::Replaced { path, .. } => format!("replaced, stored at {path}"),
            };
            let _ = write!(out, " [{} {change}]", mark.tool_use_id);
        }
        if let Some(span) = &e.span {
            let _ = write!(out, " (stands for {}..{})", span.from, span.to);
        }
        out.push(':');
        for block in &e.content {
            out.push(' ');
            out.push_str(&render_block(block));
        }
        out.push('\n');
    }
    out
}

const SESSION: &str = r#"
    user u0 "an old task"
    say a0 m0 "old task done"
    boundary b1
    summary s1 "Earlier: an old task."
    user u1 "read the files"
    call a1 m1 t1 Read
    result r1 t1 120000
    replace t1 "[the file, stored]"
    say a2 m2 "read it"
    user u2 "grep for it"
    call a3 m3 t2 Grep
    result r2 t2 300
    say a4 m4 "nothing found"
    user u3 "try another way"
    call a5 m5 t3 Bash
    result r3 t3 500
    say a6 m6 "tried"
    cleared t3
    user u4 "a side idea"
    say a7 m7 "side answer"
    from a6
    user u5 "back on track"
    call a8 m8 t4 Read
    result r4 t4 200
    edits u5 t1
    snip u2 a3 r2 a4
    collapse u3 a6 "Tried another way; it worked."
"#;

#[test]
fn every_message_with_why_the_model_does_not_see_it() {
    let f = fixture(SESSION);
    let mut config = PipelineConfig::default();
    config.microcompact.cache_editing = true;
    let s = scrollback(&f.records, &PipelineState::default(), &config);
    expect![[r#"
        off chain: 2
        #0 User prompt u0 [compacted by b1]: text("an old task")
        #1 Assistant response a0 [compacted by b1]: text("old task done")
        #2 User compactSummary s1: text("Earlier: an old task.")
        #3 User prompt u1: text("read the files")
        #4 Assistant response a1: tool_use(t1 Read)
        #5 User toolResults r1 [t1 replaced, stored at /store/t1.txt] [t1 deleted from cache]: tool_result(t1, 120000b)
        #6 Assistant response a2: text("read it")
        #7 User prompt u2 [snipped]: text("grep for it")
        #8 Assistant response a3 [snipped]: tool_use(t2 Grep)
        #9 User toolResults r2 [snipped]: tool_result(t2, 300b)
        #10 Assistant response a4 [snipped]: text("nothing found")
        #11 User prompt u3 [collapsed into #15]: text("try another way")
        #12 Assistant response a5 [collapsed into #15]: tool_use(t3 Bash)
        #13 User toolResults r3 [collapsed into #15] [t3 cleared]: tool_result(t3, 500b)
        #14 Assistant response a6 [collapsed into #15]: text("tried")
        #15 User collapseSummary - (stands for u3..a6): text("[Earlier messages, collapsed int…")
        #16 User prompt u5: text("back on track")
        #17 Assistant response a8: tool_use(t4 Read)
        #18 User toolResults r4: tool_result(t4, 200b)
    "#]]
    .assert_eq(&render(&s));

    // The request agrees: what is marked is what it leaves out or changes.
    let mut setup = Setup::new(f.end_ms);
    setup.config = config.clone();
    let request = rendered(&setup.run(&f.records));
    for gone in ["old task done", "grep for it", "side idea", "try another way"] {
        assert!(!request.contains(gone), "{gone}: {request}");
    }
    assert!(request.contains("tool_result(t1 \"[the file, stored]\""), "{request}");
    assert!(request.contains("cache_edits(delete t1)"), "{request}");

    // Without cache editing, the pinned edits are not sent, and not marked.
    let s = scrollback(&f.records, &PipelineState::default(), &PipelineConfig::default());
    assert_eq!(s.entries[5].results.len(), 1);

    // From the boundary on (what the daemon keeps): the same, without the compacted part.
    let tail = scrollback(&f.records[2..], &PipelineState::default(), &config);
    assert_eq!(tail.entries.len(), 17);
    assert_eq!(
        serde_json::to_value(&tail.entries[..13]).unwrap(),
        serde_json::to_value(&scrollback(&f.records, &PipelineState::default(), &config).entries[2..15])
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let mut e = e.clone();
                if let Some(n) = e.pointer_mut("/hidden/summaryEntry") {
                    *n = json!(n.as_u64().unwrap() - 2);
                }
                e
            })
            .collect::<Value>()
    );
}

#[test]
fn compacted_conversations_end_where_their_boundary_says() {
    // Two compactions. Before the first one the host rewound (u2b) and went back again:
    // the boundary's logicalParentUuid names the branch the compaction summarized.
    let f = fixture(
        r#"
        user u1 "first"
        say a1 m1 "answer one"
        user u2 "second"
        say a2 m2 "answer two"
        from a1
        user u2b "second, again"
        from a2
        boundary b1
        summary s1 "Summary one."
        user u3 "third"
        boundary b2
        summary s2 "Summary two."
        user u4 "fourth"
        "#,
    );
    expect![[r#"
        off chain: 1
        #0 User prompt u1 [compacted by b1]: text("first")
        #1 Assistant response a1 [compacted by b1]: text("answer one")
        #2 User prompt u2 [compacted by b1]: text("second")
        #3 Assistant response a2 [compacted by b1]: text("answer two")
        #4 User compactSummary s1 [compacted by b2]: text("Summary one.")
        #5 User prompt u3 [compacted by b2]: text("third")
        #6 User compactSummary s2: text("Summary two.")
        #7 User prompt u4: text("fourth")
    "#]]
    .assert_eq(&render(&scrollback(&f.records, &PipelineState::default(), &PipelineConfig::default())));
}

#[test]
fn the_wire_shape_is_camel_case_with_tagged_marks() {
    let f = fixture(SESSION);
    let s = scrollback(&f.records, &PipelineState::default(), &PipelineConfig::default());
    let mut value = serde_json::to_value(&s).unwrap();
    value["entries"] = json!([s.entries[1], s.entries[5], s.entries[11], s.entries[15]]);
    for e in value["entries"].as_array_mut().unwrap() {
        e["content"] = json!(["…"]);
        if e.get("timestampMs").is_some() {
            e["timestampMs"] = json!(0);
        }
    }
    expect![[r#"
        {
          "entries": [
            {
              "uuid": "a0",
              "parentUuid": "u0",
              "role": "assistant",
              "kind": "response",
              "timestampMs": 0,
              "content": [
                "…"
              ],
              "tokens": 9,
              "hidden": {
                "reason": "compacted",
                "boundaryUuid": "b1"
              }
            },
            {
              "uuid": "r1",
              "parentUuid": "a1",
              "role": "user",
              "kind": "toolResults",
              "timestampMs": 0,
              "content": [
                "…"
              ],
              "tokens": 30727,
              "results": [
                {
                  "toolUseId": "t1",
                  "block": 0,
                  "change": {
                    "kind": "replaced",
                    "path": "/store/t1.txt",
                    "originalBytes": 1
                  }
                }
              ]
            },
            {
              "uuid": "u3",
              "parentUuid": "a4",
              "role": "user",
              "kind": "prompt",
              "timestampMs": 0,
              "content": [
                "…"
              ],
              "tokens": 10,
              "hidden": {
                "reason": "collapsed",
                "summaryEntry": 15
              }
            },
            {
              "role": "user",
              "kind": "collapseSummary",
              "content": [
                "…"
              ],
              "tokens": 25,
              "span": {
                "from": "u3",
                "to": "a6"
              }
            }
          ],
          "boundaryUuid": "b1",
          "offChain": 2
        }"#]]
    .assert_eq(&serde_json::to_string_pretty(&value).unwrap());
    // And back.
    let text = serde_json::to_string(&s).unwrap();
    assert_eq!(serde_json::from_str::<Scrollback>(&text).unwrap(), s);
}
