//! Whole sessions: real Claude Code transcripts and sessions from the project's
//! generator (`ctxd_gen`), from scratch and through the view cache, with the daemon's
//! persistence of each request's decisions simulated.

use super::pipeline::assert_same;
use super::*;

/// Generated sessions, named by seed and turns (30 turns would be 700 KB or more each,
/// so they are shorter): `(name, JSONL)`.
pub(crate) fn generated() -> Vec<(String, String)> {
    [(15, 8), (51, 6), (49, 4)]
        .into_iter()
        .map(|(seed, turns)| {
            let opts = ctxd_gen::Options { seed, ..ctxd_gen::Options::turns(turns) };
            (format!("seed {seed}, {turns} turns"), ctxd_gen::jsonl(&opts))
        })
        .collect()
}

/// A real Claude Code 2.1.332 transcript (`tests/fixtures/transcripts`, see its
/// `SOURCES.md`); embedded, so a checkout without it does not build its tests.
const REAL_TRANSCRIPT: (&str, &str) = (
    "claude-code-2.1.332/manual-compact.jsonl",
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/transcripts/claude-code-2.1.332/manual-compact.jsonl"
    )),
);
/// Real Claude Code 2.1.38/2.1.39 transcripts (thinking, `caller` on tool calls, two
/// boundaries, a thousand progress lines).
const OLDER_TRANSCRIPTS: [(&str, &str); 3] = [
    (
        "spotter/4d5611e5-241a-462a-8d15-5122611a9569.jsonl",
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/transcripts/spotter/4d5611e5-241a-462a-8d15-5122611a9569.jsonl"
        )),
    ),
    (
        "spotter/tool_heavy.jsonl",
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/transcripts/spotter/tool_heavy.jsonl")),
    ),
    (
        "spotter/short.jsonl",
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/transcripts/spotter/short.jsonl")),
    ),
];

fn records(jsonl: &str) -> Vec<Record> {
    jsonl.lines().filter(|l| !l.trim().is_empty()).filter_map(|l| Record::parse(l).ok()).collect()
}

fn last_timestamp(records: &[Record]) -> i64 {
    records.iter().rev().find_map(|r| r.head().timestamp.as_deref().and_then(parse_rfc3339_ms)).unwrap_or(0)
}

/// Messages sent to a host that keeps its last request, against whole requests.
#[derive(Debug, Default)]
struct Sent {
    whole: usize,
    delta: usize,
}

/// Appends the records one at a time as a daemon would: assemble (through the cache and
/// from scratch, which must agree), persist the decisions, send. `now` follows the
/// records' own clock. A host that kept the previous request and is sent only the
/// messages after the shared ones rebuilds exactly this request.
fn simulate(setup: &mut Setup, source: &[Record]) -> (Vec<Record>, CacheCounters, Sent) {
    let mut records: Vec<Record> = Vec::new();
    let mut cache = ViewCache::new();
    let mut host: Vec<std::sync::Arc<ApiMessage>> = Vec::new();
    let mut sent = Sent::default();
    for record in source {
        records.push(record.clone());
        if let Some(at) = record.head().timestamp.as_deref().and_then(parse_rfc3339_ms) {
            setup.now_ms = at + 1_000;
        }
        let input = setup.input(&records);
        let kept = cache.assemble(&input);
        let fresh = assemble(&input);
        assert_same(&kept, &fresh, records.len());
        let shared = shared_messages(&host, &kept.request.messages);
        let delta = kept.request.messages_from(shared);
        host.truncate(shared);
        host.extend(delta.messages.iter().cloned());
        // Everything but the messages is sent whole.
        assert_eq!(delta.messages_from(delta.messages.len()), kept.request.messages_from(kept.request.messages.len()));
        assert!(
            host.iter().map(|m| &**m).eq(kept.request.messages.iter().map(|m| &**m)),
            "record {}: the spliced request differs",
            records.len()
        );
        sent.whole += kept.request.messages.len();
        sent.delta += delta.messages.len();
        persist(&mut records, &kept);
    }
    (records, cache.counters(), sent)
}

#[test]
fn the_real_transcript_becomes_a_valid_request() {
    let records = records(REAL_TRANSCRIPT.1);
    let mut setup = Setup::new(last_timestamp(&records) + 1_000);
    // ctxd's own copy of the same sources: the program's transcript carries its memory
    // files, date and git snapshot as rendered attachments, so none of this is sent.
    setup.base.user_context = Some("=== CLAUDE.md ===\nMARKER-CLAUDE-MD-1\n\nCurrent date: 2026-12-02".into());
    setup.base.system_context = Some("ctxd's git snapshot".into());
    let out = setup.run(&records);
    let sent = out.request.to_json();
    assert_eq!(sent.matches("MARKER-CLAUDE-MD-1").count(), 1, "one copy of CLAUDE.md");
    assert_eq!(sent.matches("Today's date is 2026-11-29").count(), 1, "the program's date");
    assert!(!sent.contains("2026-12-02") && !sent.contains("ctxd's git snapshot"), "no second date or snapshot");
    expect_test::expect![[r#"
        system: text("You are a coding agent.")+cache
        tools: Read Bash Grep Glob Edit Write Task+cache
        user: text("This session is being continued …")
        assistant: text("STUB reply #7 (messages=12). Don…")
        user: text("<local-command-caveat>The comman…") text("<command-name>/compact</command-…") text("<local-command-stdout>Compacted …") text("<system-reminder>⏎Note: /home/de…") text("<system-reminder>⏎Called the Rea…") text("<system-reminder>⏎Result of call…") text("<system-reminder>⏎Called the Rea…") text("<system-reminder>⏎Result of call…") text("<system-reminder>⏎Called the Rea…") text("<system-reminder>⏎Result of call…") text("<system-reminder>⏎The following …") text("<system-reminder>⏎Available agen…") text("<system-reminder>⏎The following …") text("<system-reminder>⏎# Environment⏎…") text("<system-reminder>⏎You are powere…") text("After compaction: what files did…") text("<system-reminder>⏎Codebase and u…") text("<system-reminder>⏎As you answer …") text("<system-reminder>⏎Today's date i…") text("<system-reminder>⏎Attribution fo…")
        assistant: text("Let me look at that (step 1).") tool_use(toolu_stub_0f3bdc46e55b435baf02 Read)
        user: tool_result(toolu_stub_0f3bdc46e55b435baf02, 119b)
        assistant: text("STUB reply #11 (messages=8). Don…")+cache
    "#]]
    .assert_eq(&rendered(&out));
    assert!(out.applied[0].detail.contains("1 preserved"), "{}", out.applied[0].detail);

    // The records from the boundary on: the same minus the preserved response.
    let boundary = records.iter().rposition(Record::is_compact_boundary).unwrap();
    let from_boundary = setup.run(&records[boundary..]);
    assert_eq!(from_boundary.request.messages.len(), out.request.messages.len() - 2);

    // Every prefix, through the cache and from scratch.
    let mut setup = Setup::new(last_timestamp(&records) + 1_000);
    let (_, counters, sent) = simulate(&mut setup, &records);
    assert!(sent.delta * 5 < sent.whole, "{sent:?}");
    assert!(counters.extensions > 60, "{counters:?}");
}

#[test]
fn older_real_transcripts_become_valid_requests() {
    for (path, jsonl) in OLDER_TRANSCRIPTS {
        let records = records(jsonl);
        let setup = Setup::new(last_timestamp(&records) + 1_000);
        let out = setup.run(&records);
        let value = out.request.to_value();
        // `caller` on tool calls is not sent; signed thinking is.
        assert!(!value.to_string().contains("\"caller\""), "{path}");
        assert!(out.request.messages.len() > 2, "{path}");
    }
    let mut setup = Setup::new(0);
    simulate(&mut setup, &records(OLDER_TRANSCRIPTS[1].1));
}

#[test]
fn generated_sessions_become_valid_requests() {
    for (name, jsonl) in generated() {
        let records = records(&jsonl);
        let mut setup = Setup::new(last_timestamp(&records) + 1_000);
        setup.base = BaseContext {
            system_context: Some("branch main, clean".into()),
            user_context: Some("Memory.".into()),
            attachments: vec!["A file changed.".into()],
        };
        let out = setup.run(&records);
        let tool_calls = records.iter().filter(|r| r.line().contains("\"tool_use\"")).count();
        let sent = out.request.to_json().matches("\"type\":\"tool_result\"").count();
        assert_eq!(sent, tool_calls, "{name}");
        // The estimate is the content's size / 4, give or take the JSON around it.
        let content: u64 = records.iter().map(|r| u64::from(r.head().content_bytes)).sum::<u64>() / 4;
        assert!(
            out.estimate_tokens > content && out.estimate_tokens < content + content / 10 + 200,
            "{name}: {} for {content}",
            out.estimate_tokens
        );
    }
}

#[test]
fn generated_sessions_agree_through_the_cache_under_every_setting() {
    type Variant = (&'static str, Box<dyn Fn(&mut Setup)>);
    let variants: Vec<Variant> = vec![
        ("defaults", Box::new(|_| {})),
        (
            "tight budgets, snip on",
            Box::new(|s| {
                s.config.budget.per_result_tokens = 1_500;
                s.config.budget.per_message_tokens = 2_000;
                s.config.snip.enabled = true;
                s.config.snip.reminder_after_tokens = 3_000;
            }),
        ),
        (
            "cache editing, low microcompact bar",
            Box::new(|s| {
                s.config.microcompact.cache_editing = true;
                s.config.microcompact.min_saved_tokens = 2_000;
                s.config.microcompact.keep_recent = 2;
            }),
        ),
        (
            "short cache life",
            Box::new(|s| {
                s.config.microcompact.cache_ttl_ms = 20_000;
                s.config.microcompact.min_saved_tokens = 1_000;
                s.fork = Some(Fork { instruction: "Summarize.".into(), skip_cache_write: true });
            }),
        ),
    ];
    for (name, jsonl) in generated() {
        let source = records(&jsonl);
        for (variant, apply) in &variants {
            let mut setup = Setup::new(0);
            apply(&mut setup);
            let (records, counters, sent) = simulate(&mut setup, &source);
            assert!(counters.extensions as usize > source.len() / 2, "{name}, {variant}: {counters:?}");
            assert!(sent.delta * 4 < sent.whole, "{name}, {variant}: {sent:?}");
            let decided = records.len() - source.len();
            if *variant != "defaults" {
                assert!(decided > 0, "{name}, {variant}: nothing was decided");
            }
        }
    }
}

#[test]
fn real_transcripts_are_one_chain() {
    // Parallel tool calls (results hanging off their own call's line, calls after progress
    // records), progress and system records in the chain, sidechains: none of it reads as a
    // rewind, and nothing is left out.
    for (path, jsonl) in OLDER_TRANSCRIPTS.into_iter().chain([REAL_TRANSCRIPT]) {
        let records = records(jsonl);
        let (slice, _) = slice::slice_after_boundary(&records);
        let mut chain = chain::Chain::new(&records, slice.boundary);
        for &i in &slice.order {
            assert_ne!(chain.push(&records, i), chain::Pushed::Rewound, "{path}: record {i}");
        }
        assert_eq!(chain.left_out(), 0, "{path}");
    }
}
