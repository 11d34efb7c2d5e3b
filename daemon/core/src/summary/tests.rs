//! End-to-end tests of the offline summarizer: whole-summary goldens of hand-written
//! sessions, invariants over sessions from the project's generator (`ctxd_gen`), the real
//! Claude Code transcript, and the reply parser applied to offline output.
//!
//! The generated sessions are checked by an independent reading of the same JSONL with
//! `serde_json::Value`, not by the summarizer's own scanner.

use std::collections::BTreeSet;

use expect_test::expect;
use serde_json::Value;

use super::*;
use crate::record::Record;

const LEXER: &str = include_str!("testdata/lexer_session.jsonl");
const CONTINUED: &str = include_str!("testdata/continued_session.jsonl");
/// Generated sessions, named by seed and turns: `(name, JSONL)`.
fn generated() -> Vec<(String, String)> {
    [(42, 4), (21, 3), (3, 2)]
        .into_iter()
        .map(|(seed, turns)| {
            let opts = ctxd_gen::Options { seed, ..ctxd_gen::Options::turns(turns) };
            (format!("seed {seed}, {turns} turns"), ctxd_gen::jsonl(&opts))
        })
        .collect()
}
/// A real Claude Code 2.1.332 transcript (`tests/fixtures/transcripts`, see its
/// `SOURCES.md`); embedded, so a checkout without it does not build its tests.
const REAL_TRANSCRIPT: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/transcripts/claude-code-2.1.332/manual-compact.jsonl"
));

fn records(jsonl: &str) -> Vec<Record> {
    jsonl.lines().filter(|l| !l.trim().is_empty()).map(|l| Record::parse(l).unwrap()).collect()
}

fn with_cap(cap: u64) -> OfflineOptions {
    OfflineOptions { max_output_tokens: cap, ..OfflineOptions::default() }
}

/// The most a summary written under `cap` may take: the cap, plus what its files'
/// paths ("   - path" lines) need of the file list's allowance.
fn bound(summary: &OfflineSummary, cap: u64) -> u64 {
    let paths: usize = summary.files.iter().map(|f| "   - \n".len() + f.path.len()).sum();
    cap.saturating_add((paths as u64).div_ceil(4).min(file_list_allowance_tokens(cap)))
}

/// The body of section `n` in a summary text.
fn section_body(text: &str, n: u8) -> String {
    let body = parse_summary_reply(text).unwrap();
    split_sections(&body).into_iter().find(|s| s.number == n).map(|s| s.body.to_owned()).unwrap_or_default()
}

/// Shape every offline summary has, whatever the cap.
fn assert_well_formed(summary: &OfflineSummary) {
    let text = &summary.text;
    assert!(text.starts_with("<summary>\n"), "{text}");
    assert!(text.ends_with("\n</summary>"), "{text}");
    assert_eq!(summary.tokens, estimate_tokens(text));
    let body = parse_summary_reply(text).unwrap();
    let sections = split_sections(&body);
    let numbers: Vec<u8> = sections.iter().map(|s| s.number).collect();
    assert_eq!(numbers, (1..=9).collect::<Vec<u8>>(), "{text}");
    for (section, title) in sections.iter().zip(SECTION_TITLES) {
        assert_eq!(section.title, title);
    }
}

/// What a session holds, read independently of the summarizer.
struct Oracle {
    prompts: Vec<String>,
    read_paths: BTreeSet<String>,
    edited_paths: BTreeSet<String>,
}

fn oracle(jsonl: &str) -> Oracle {
    let mut o = Oracle { prompts: Vec::new(), read_paths: BTreeSet::new(), edited_paths: BTreeSet::new() };
    for line in jsonl.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let content = &v["message"]["content"];
        match v["type"].as_str() {
            Some("user") => {
                if let Some(text) = content.as_str() {
                    o.prompts.push(text.to_owned());
                }
            }
            Some("assistant") => {
                for block in content.as_array().unwrap() {
                    if block["type"] == "tool_use" {
                        let path = block["input"]["file_path"].as_str().map(str::to_owned);
                        match (block["name"].as_str(), path) {
                            (Some("Read"), Some(p)) => {
                                o.read_paths.insert(p);
                            }
                            (Some("Edit"), Some(p)) => {
                                o.edited_paths.insert(p);
                            }
                            _ => {}
                        }
                    }
                }
            }
            _ => {}
        }
    }
    o
}

// ----------------------------------------------------------------------------------
// Golden renders.

#[test]
fn golden_lexer_session() {
    let options = OfflineOptions { max_user_message_chars: 200, ..OfflineOptions::default() };
    let summary = summarize_offline(&records(LEXER), &options);
    expect![[r#"
        <summary>
        1. Primary Request and Intent:
           - First request: The tokenizer test `lexes_numbers` fails on main. Find out why and fix it; keep the public API unchanged.
           - Latest request: Before anything else: what does `peek_next_is_digit` return at the end of the input?
           - Scope of this summary: 3 user messages, 7 tool calls (2 failed), 2 files touched.

        2. Key Technical Concepts:
           - Identifiers: `lexes_numbers` (11), `lexes_exponents` (5), `peek_digit` (4), `peek_next_is_digit` (4), `scan_number` (2)
           - Recurring terms: messages (20), read (18), carefully (16), characters (16), columns (16), convert (16), count (16), editors (16), users (16), lexer (13), error (8), fails (6), anything (4), attached (4), behaviour (4)
           - File types: .rs (2 files)
           - Tools used: Bash ×2, TodoWrite ×2, Edit ×1, Read ×1, Write ×1

        3. Files and Code Sections:
           - /work/lexer/tests/exponents.rs: written (4 lines)
           - /work/lexer/src/lexer.rs: read lines 70–109 of 212; edited. Last edit: `…== '.' && self.peek_digit() {` → `…== '.' && self.peek_next_is_digit() {`

        4. Errors and Fixes:
           - Bash `cargo test -p lexer lexes_numbers` failed: Exit code 101 / thread 'lexes_numbers' panicked at src/lexer.rs:88:9: / assertion `left == right` failed. Then: Read /work/lexer/src/lexer.rs (lines 70–109); Edit /work/lexer/src/lexer.rs; Bash `cargo test -p lexer` (failed).
           - Bash `cargo test -p lexer` failed: test lexes_exponents ... FAILED. Then: Write /work/lexer/tests/exponents.rs (4 lines); TodoWrite (4 items).

        5. Problem Solving:
           - After Bash `cargo test -p lexer lexes_numbers` failed: The lexer reads `12.0` as an integer: the fraction branch in `scan_number` never runs because `peek_digit` looks at the dot itself. Let me read that part.
           - After Bash `cargo test -p lexer` failed: `lexes_numbers` passes now, but `lexes_exponents` broke: the exponent check relied on the old `peek_digit` behaviour. I'll pin that down with a regression test.
             The number fix is in and `lexes_numbers` passes. `lexes_exponents` still fails; I added tests/exponents.rs to pin the expected behaviour and will fix the exponent branch next.

        6. All User Messages:
           - The tokenizer test `lexes_numbers` fails on main. Find out why and fix it; keep the public API unchanged.
           - Also, while you are at it: the error messages of the lexer should name the line and the column, not the byte [… 412 characters cut …] not change the error type's public fields.

             [image attached]
           - Before anything else: what does `peek_next_is_digit` return at the end of the input?

        7. Pending Tasks:
           - [in_progress] Run the whole suite
           - [pending] Make lexes_exponents pass again
           - Not yet answered: Also, while you are at it: the error messages of the lexer should name the line and the column, not the byte [… 412 characters cut …] not change the error type's public fields.

             [image attached]
           - Not yet answered: Before anything else: what does `peek_next_is_digit` return at the end of the input?

        8. Current Work:
           - Working on: “Before anything else: what does `peek_next_is_digit` return at the end of the input?”
           - Last assistant message (before the latest request): The number fix is in and `lexes_numbers` passes. `lexes_exponents` still fails; I added tests/exponents.rs to pin the expected behaviour and will fix the exponent branch next.

        9. Optional Next Step:
           - Answer the latest request: “Before anything else: what does `peek_next_is_digit` return at the end of the input?”
        </summary>"#]].assert_eq(&summary.text);
    assert_well_formed(&summary);
    assert!(!summary.trimmed);
    assert_eq!(summary.user_messages, 3);
    let paths: Vec<&str> = summary.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["/work/lexer/tests/exponents.rs", "/work/lexer/src/lexer.rs"]);
    let lexer = &summary.files[1];
    assert!(lexer.read && lexer.edited && !lexer.written);
    assert_eq!(lexer.ranges, vec![LineRange { start: 70, end: 109 }]);
    assert_eq!(lexer.total_lines, Some(212));
    assert_eq!(summary.files[0].written_lines, Some(4));
}

#[test]
fn golden_continued_session() {
    let summary = summarize_offline(&records(CONTINUED), &OfflineOptions::default());
    expect![[r#"
        <summary>
        1. Primary Request and Intent:
           - Earlier: The user wants a TOML config loader with defaults.
           - Request: Now add environment variable overrides, prefixed with SVC_.
           - Scope of this summary: 1 user message, 1 tool call (0 failed), 2 files touched.

        2. Key Technical Concepts:
           - Recurring terms: environment (4), loader (4), overrides (4), prefixed (4), svc_ (4), variable (4), across (2), compaction (2), config (2), defaults (2), falls (2), kept (2), reading (2), reads (2), toml (2)
           - File types: .rs (2 files)
           - Tools used: Read ×1

        3. Files and Code Sections:
           - /work/cfg/src/config.rs: read in full (30 lines); re-attached after the previous compaction
           - /work/cfg/src/big_table.rs: too large to re-attach after the previous compaction; read it again when needed
           - src/config.rs: the loader

        4. Errors and Fixes:
           - No tool call failed in this part of the conversation.

        5. Problem Solving:
           - Nothing to add beyond Current Work.

        6. All User Messages:
           - Build a TOML config loader for the service.
           - Now add environment variable overrides, prefixed with SVC_.

        7. Pending Tasks:
           - From before the previous compaction (may be done by now): Add environment overrides
           - Not yet answered: Now add environment variable overrides, prefixed with SVC_.

        8. Current Work:
           - Working on: “Now add environment variable overrides, prefixed with SVC_.”
           - Steps since that request (1): Read /work/cfg/src/config.rs (no result yet)
           - Last assistant message: Reading the loader first.
           - In flight: Read /work/cfg/src/config.rs was called and has no result yet.

        9. Optional Next Step:
           - Continue working on the latest request: “Now add environment variable overrides, prefixed with SVC_.”
        </summary>"#]].assert_eq(&summary.text);
    assert_well_formed(&summary);
    // The request from before the boundary is represented only through the earlier
    // summary; the reply the boundary kept is back in view.
    assert_eq!(summary.user_messages, 1);
    let config = summary.files.iter().find(|f| f.path == "/work/cfg/src/config.rs").unwrap();
    assert!(config.restored && config.read, "the pending Read counts as a read: {config:?}");
    let table = summary.files.iter().find(|f| f.path == "/work/cfg/src/big_table.rs").unwrap();
    assert!(table.referenced && !table.read);
    let facts = scan::scan(&records(CONTINUED));
    assert!(facts.said.iter().any(|s| s.text.contains("kept verbatim across the compaction")));
    assert!(facts.prior_summary.as_deref().is_some_and(|s| s.contains("TOML config loader")));
}

#[test]
fn golden_tight_cap_with_focus() {
    let options = OfflineOptions {
        max_output_tokens: 420,
        focus: Some("the exponent regression".to_owned()),
        max_user_message_chars: 2_000,
    };
    let summary = summarize_offline(&records(LEXER), &options);
    expect![[r#"
        <summary>
        1. Primary Request and Intent:
           - Focus requested for this summary: the exponent regression
           - First request: The tokenizer test `lexes_numbers` fails on main. [… 56 characters cut …]
           - Latest request: Before anything else: what does `peek_next_is_digit` [… 32 characters cut …]
           - [… 1 more entry cut …]

        2. Key Technical Concepts:
           - Identifiers: `lexes_numbers` (11), `lexes_exponents` (5), …
           - [… 3 more entries cut …]

        3. Files and Code Sections:
           - /work/lexer/tests/exponents.rs: written (4 lines)
           - /work/lexer/src/lexer.rs

        4. Errors and Fixes:
           - [… 1 more error cut …]
           - Bash `cargo test -p lexer` failed: test lexes_exponents ... FAILED. Then: Write …

        5. Problem Solving:
           - [… 1 more entry cut …]
           - After Bash `cargo test -p lexer` failed: `lexes_numbers` passes now, but `lexes_exponents` broke: …

        6. All User Messages:
           - The tokenizer test `lexes_numbers` fails on main. Find …
           - Also, while you are at it: the error messages of the …
           - Before anything else: what does `peek_next_is_digit` …

        7. Pending Tasks:
           - [… 2 more tasks cut …]
           - [pending] Make lexes_exponents pass again
           - Not yet answered: Before anything else: what does `peek_next_is_digit` return at the end of the input?

        8. Current Work:
           - Working on: “Before anything else: what does `peek_next_is_digit` return at …
           - Last assistant message (before the latest request): The number fix is in and `lexes_numbers` passes. [… 127 characters cut …]

        9. Optional Next Step:
           - Answer the latest request: “Before anything else: what does [… 54 characters cut …]
        </summary>"#]].assert_eq(&summary.text);
    assert_well_formed(&summary);
    assert!(summary.trimmed);
    assert!(summary.tokens <= 420, "{}", summary.tokens);
    assert!(section_body(&summary.text, 1).contains("Focus requested for this summary: the exponent regression"));
}

// ----------------------------------------------------------------------------------
// Parsing, merging and filtering.

#[test]
fn split_lines_merge_and_host_records_are_ignored() {
    let facts = scan::scan(&records(LEXER));
    // msg_A … msg_G: the side chain and the API error stand-in are not messages.
    assert_eq!(facts.messages.len(), 7);
    // The Read line the host wrote twice is one step.
    let labels: Vec<&str> = facts.steps.iter().map(|s| s.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "TodoWrite (3 items)",
            "Bash `cargo test -p lexer lexes_numbers`",
            "Read /work/lexer/src/lexer.rs (lines 70–109)",
            "Edit /work/lexer/src/lexer.rs",
            "Bash `cargo test -p lexer`",
            "Write /work/lexer/tests/exponents.rs (4 lines)",
            "TodoWrite (4 items)",
        ]
    );
    assert!(facts.said.iter().all(|s| !s.text.contains("SIDECHAIN") && !s.text.contains("API Error")));
    // Both failures are seen: one flagged by the host, one only in the output text.
    let failed: Vec<&str> = facts
        .steps
        .iter()
        .filter_map(|s| match &s.outcome {
            scan::Outcome::Failed(why) => Some(why.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 2);
    assert!(failed[0].starts_with("Exit code 101"));
    assert!(failed[1].contains("FAILED"));
    // The latest todo list wins.
    let todos = facts.todos.unwrap();
    assert_eq!(todos.len(), 4);
    assert_eq!(todos[2].status, "in_progress");
    // Command echoes, caveats, interruptions: not prompts.
    assert_eq!(facts.prompts.len(), 3);
    assert!(facts.prompts[1].text.ends_with("[image attached]"));
}

#[test]
fn long_messages_are_cut_with_a_visible_marker() {
    let options = OfflineOptions { max_user_message_chars: 200, ..OfflineOptions::default() };
    let summary = summarize_offline(&records(LEXER), &options);
    let messages = section_body(&summary.text, 6);
    let long = messages.lines().find(|l| l.contains("while you are at it")).unwrap();
    assert!(long.contains("characters cut …]"), "{long}");
    // The head and the tail of the message both survive.
    assert!(long.starts_with("   - Also, while you are at it"), "{long}");
    assert!(messages.contains("[image attached]"));
    // Without the limit the message is whole.
    let whole = summarize_offline(&records(LEXER), &OfflineOptions::default());
    assert!(section_body(&whole.text, 6).contains("Do not change the error type's public fields."));
    assert!(!section_body(&whole.text, 6).contains("characters cut"));
}

#[test]
fn empty_and_bookkeeping_only_input() {
    for input in [
        "",
        "{\"type\":\"file-history-snapshot\",\"messageId\":\"m\"}\n{\"type\":\"system\",\"subtype\":\"turn_duration\"}",
    ] {
        let summary = summarize_offline(&records(input), &OfflineOptions::default());
        assert_well_formed(&summary);
        assert_eq!(summary.user_messages, 0);
        assert!(summary.files.is_empty());
        assert!(summary.text.contains("- No user message in this part of the conversation."));
        assert_eq!(
            section_body(&summary.text, 9),
            "   - None: the assistant's last reply finished its turn. Wait for the user's next message."
        );
    }
}

#[test]
fn side_chains_count_only_when_they_are_the_whole_transcript() {
    let side_prompt = r#"{"type":"user","isSidechain":true,"uuid":"a","message":{"role":"user","content":"Survey the config module."}}"#;
    let side_reply = r#"{"type":"assistant","isSidechain":true,"uuid":"b","message":{"id":"m1","role":"assistant","content":[{"type":"text","text":"Surveyed."}],"stop_reason":"end_turn"}}"#;
    let main_prompt = r#"{"type":"user","uuid":"c","message":{"role":"user","content":"Ship it."}}"#;
    // A subagent's own transcript: everything is side chain.
    let own = records(&[side_prompt, side_reply].join("\n"));
    let summary = summarize_offline(&own, &OfflineOptions::default());
    assert_eq!(summary.user_messages, 1);
    assert!(section_body(&summary.text, 6).contains("- Survey the config module."));
    // Inside a main transcript, side-chain records are someone else's.
    let mixed = records(&[main_prompt, side_prompt, side_reply].join("\n"));
    let summary = summarize_offline(&mixed, &OfflineOptions::default());
    assert_eq!(summary.user_messages, 1);
    assert_eq!(section_body(&summary.text, 6), "   - Ship it.");
    assert!(!summary.text.contains("Surveyed."));
}

#[test]
fn an_unflagged_earlier_summary_is_carried_not_quoted() {
    let line = serde_json::json!({
        "type": "user",
        "uuid": "s",
        "message": {"role": "user", "content": "This session is being continued from a previous conversation that ran out of context.\n\nSummary:\n1. Primary Request and Intent:\n   Port the CLI to clap.\n6. All User Messages:\n   - Port the CLI to clap.\n"}
    });
    let summary = summarize_offline(&records(&line.to_string()), &OfflineOptions::default());
    assert_eq!(summary.user_messages, 0);
    // Carried as content, not quoted under a "before the previous compaction" wrapper.
    assert!(section_body(&summary.text, 1).contains("   - Earlier: Port the CLI to clap."));
    assert_eq!(section_body(&summary.text, 6), "   - Port the CLI to clap.");
}

#[test]
fn parallel_calls_failing_together_make_one_error_entry() {
    let lines = [
        r#"{"type":"user","uuid":"u1","message":{"role":"user","content":"Read the three modules."}}"#,
        r#"{"type":"assistant","uuid":"a1","message":{"id":"m1","role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Read","input":{"file_path":"/p/a.rs"}}],"stop_reason":"tool_use"}}"#,
        r#"{"type":"assistant","uuid":"a2","message":{"id":"m1","role":"assistant","content":[{"type":"tool_use","id":"t2","name":"Read","input":{"file_path":"/p/b.rs"}}],"stop_reason":"tool_use"}}"#,
        r#"{"type":"assistant","uuid":"a3","message":{"id":"m1","role":"assistant","content":[{"type":"tool_use","id":"t3","name":"Read","input":{"file_path":"/p/c.rs"}}],"stop_reason":"tool_use"}}"#,
        r#"{"type":"user","uuid":"r1","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","is_error":true,"content":"<tool_use_error>File does not exist.</tool_use_error>"}]}}"#,
        r#"{"type":"user","uuid":"r2","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t2","is_error":true,"content":[{"type":"text","text":"<tool_use_error>Sibling tool call errored</tool_use_error>"}]}]}}"#,
        r#"{"type":"user","uuid":"r3","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t3","is_error":true,"content":"<tool_use_error>Sibling tool call errored</tool_use_error>"}]}}"#,
    ];
    let summary = summarize_offline(&records(&lines.join("\n")), &OfflineOptions::default());
    assert_eq!(
        section_body(&summary.text, 4),
        "   - Read /p/a.rs failed: File does not exist. Nothing was done about it yet.\n   \
         - Read /p/b.rs and 1 more call failed: Sibling tool call errored. Nothing was done about it yet."
    );
    // Failed reads are not files that were read.
    assert!(summary.files.is_empty(), "{:?}", summary.files);
    assert!(section_body(&summary.text, 9).contains("Continue working on the latest request"));
}

#[test]
fn the_offline_text_goes_through_the_reply_parser() {
    let summary = summarize_offline(&records(LEXER), &OfflineOptions::default());
    let body = parse_summary_reply(&summary.text).unwrap();
    assert!(body.starts_with("1. Primary Request and Intent:\n"));
    assert!(body.ends_with("return at the end of the input?”"), "{body}");
    // A model reply shaped the same way parses to the same kind of body.
    let reply = format!("<analysis>\ndraft\n</analysis>\n\n{}", summary.text);
    assert_eq!(parse_summary_reply(&reply).unwrap(), body);
}

#[test]
fn output_is_deterministic() {
    for (_, jsonl) in generated() {
        let recs = records(&jsonl);
        let a = summarize_offline(&recs, &with_cap(1_000));
        let b = summarize_offline(&recs, &with_cap(1_000));
        assert_eq!(a, b);
    }
}

// ----------------------------------------------------------------------------------
// Generated sessions.

#[test]
fn generated_sessions_keep_every_message_file_and_the_last_request() {
    for (name, jsonl) in generated() {
        let o = oracle(&jsonl);
        let summary = summarize_offline(&records(&jsonl), &OfflineOptions::default());
        assert_well_formed(&summary);
        assert_eq!(summary.user_messages, o.prompts.len(), "{name}");
        let messages = section_body(&summary.text, 6);
        for prompt in &o.prompts {
            assert!(
                messages.contains(&format!("- {prompt}\n")) || messages.ends_with(&format!("- {prompt}")),
                "{name}: {prompt}"
            );
        }
        let files = section_body(&summary.text, 3);
        for path in o.read_paths.iter().chain(&o.edited_paths) {
            assert!(files.contains(&format!("- {path}: ")), "{name}: {path}");
            assert!(summary.files.iter().any(|f| &f.path == path), "{name}: {path}");
        }
        for path in &o.read_paths {
            let f = summary.files.iter().find(|f| &f.path == path).unwrap();
            assert!(f.read && !f.ranges.is_empty() && f.ranges[0].start == 1, "{name}: {f:?}");
        }
        let last = o.prompts.last().unwrap();
        assert!(section_body(&summary.text, 1).contains(&format!("Latest request: {last}")), "{name}");
        let head: String = last.chars().take(60).collect();
        assert!(section_body(&summary.text, 8).contains(&format!("Working on: “{head}")), "{name}");
        // Every generated turn ends with a reply: nothing is pending.
        assert_eq!(section_body(&summary.text, 7), "   - None recorded.", "{name}");
    }
}

#[test]
fn generated_sessions_respect_every_cap() {
    for (name, jsonl) in generated() {
        let recs = records(&jsonl);
        let o = oracle(&jsonl);
        let full = summarize_offline(&recs, &with_cap(u64::MAX));
        assert!(!full.trimmed);
        for cap in [20_000, 4_000, 1_500, 600, 250] {
            let summary = summarize_offline(&recs, &with_cap(cap));
            assert_well_formed(&summary);
            let bound = bound(&summary, cap);
            assert!(summary.tokens <= bound, "{name} cap {cap}: {} tokens", summary.tokens);
            assert_eq!(summary.trimmed, full.tokens > bound, "{name} cap {cap}");
            if !summary.trimmed {
                assert_eq!(summary.text, full.text);
            }
            // These sessions have few messages: every one survives, at least cut.
            let messages = section_body(&summary.text, 6);
            for prompt in &o.prompts {
                assert!(in_short_form(&messages, prompt), "{name} cap {cap}: {prompt}\n{messages}");
            }
        }
    }
}

/// True when a line of section 6 is `prompt`, whole or cut (its head, a marker, and
/// possibly its tail, or its first words and an ellipsis).
fn in_short_form(messages: &str, prompt: &str) -> bool {
    messages.lines().filter_map(|l| l.strip_prefix("   - ")).any(|line| {
        if line == prompt {
            return true;
        }
        // The brief form: its first words and an ellipsis.
        if let Some(head) = line.strip_suffix(" …") {
            return head.len() >= 5 && prompt.starts_with(head);
        }
        let Some((head, rest)) = line.split_once(" [… ") else {
            return false;
        };
        let tail = rest.split_once(" characters cut …]").map_or("", |(_, t)| t.trim_start());
        head.len() >= 5 && prompt.starts_with(head) && prompt.ends_with(tail)
    })
}

#[test]
fn a_cap_below_the_headings_still_writes_the_headings() {
    let summary = summarize_offline(&records(&generated()[0].1), &with_cap(10));
    assert_well_formed(&summary);
    assert!(summary.trimmed);
    assert!(summary.tokens > 10);
    let body = parse_summary_reply(&summary.text).unwrap();
    assert!(split_sections(&body).iter().all(|s| s.body.is_empty()), "{body}");
}

#[test]
fn focus_keeps_matching_entries_when_others_are_dropped() {
    let recs = records(&generated()[0].1);
    let full = summarize_offline(&recs, &with_cap(u64::MAX));
    let newest = full.files.first().unwrap().path.clone();
    let oldest = full.files.last().unwrap().path.clone();
    // A cap where the file list is cut: the newest file stays, the oldest goes.
    let cap = (200..4_000)
        .step_by(50)
        .find(|&cap| {
            let text = summarize_offline(&recs, &with_cap(cap)).text;
            text.contains(&format!("- {newest}: ")) && !text.contains(&format!("- {oldest}: "))
        })
        .unwrap();
    let focused = OfflineOptions { focus: Some(format!("the file {oldest}")), ..with_cap(cap) };
    let summary = summarize_offline(&recs, &focused);
    assert!(summary.tokens <= bound(&summary, cap));
    assert!(section_body(&summary.text, 3).contains(&format!("- {oldest}: ")), "cap {cap}:\n{}", summary.text);
    assert!(section_body(&summary.text, 1).contains(&oldest));
}

// ----------------------------------------------------------------------------------
// The real transcript.

#[test]
fn real_transcript_after_its_compaction() {
    let recs = records(REAL_TRANSCRIPT);
    let summary = summarize_offline(&recs, &OfflineOptions::default());
    assert_well_formed(&summary);
    assert!(!summary.trimmed);
    // Only the prompt after the boundary is a user message; the /compact echo, the
    // caveat and the command output are not.
    assert_eq!(summary.user_messages, 1);
    let messages = section_body(&summary.text, 6);
    assert!(messages.contains("- After compaction: what files did we read? [[READ:src/util.py]]"), "{messages}");
    assert!(!messages.contains("command-name") && !messages.contains("Compacted"));
    // The earlier summary's intent is carried forward.
    assert!(section_body(&summary.text, 1).contains("The user asked to inspect files app.py, util.py and README.md."));
    // Files: read after the boundary, re-attached, or named as too large.
    let find = |suffix: &str| summary.files.iter().find(|f| f.path.ends_with(suffix)).unwrap();
    let util = find("/src/util.py");
    assert!(util.read && util.restored);
    assert_eq!(util.ranges, vec![LineRange { start: 1, end: 10 }]);
    assert!(find("/README.md").restored);
    assert!(find("/src/app.py").restored);
    assert!(find("/src/big.py").referenced);
    assert_eq!(summary.files[0].path, "/home/dev/proj/src/util.py", "newest first");
    // The reply the boundary kept verbatim is in view again.
    let facts = scan::scan(&recs);
    assert!(facts.said.iter().any(|s| s.text == "STUB reply #7 (messages=12). Done."));
    assert!(section_body(&summary.text, 8).contains("Last assistant message: STUB reply #11 (messages=8). Done."));
}

#[test]
fn real_transcript_before_its_compaction() {
    let recs = records(REAL_TRANSCRIPT);
    let boundary = recs.iter().position(Record::is_compact_boundary).unwrap();
    let summary = summarize_offline(&recs[..boundary], &OfflineOptions::default());
    assert_well_formed(&summary);
    assert_eq!(summary.user_messages, 3);
    let messages = section_body(&summary.text, 6);
    let expected = [
        "   - Please read the app and util files. [[READ:src/app.py,src/util.py]]",
        "   - Now read the big file and README in parallel. [[READPAR:src/big.py,README.md]]",
        "   - What does util.py export? Answer briefly.",
    ];
    assert_eq!(messages, expected.join("\n"));
    let files: Vec<(&str, bool, Vec<LineRange>)> =
        summary.files.iter().map(|f| (f.path.rsplit('/').next().unwrap(), f.read, f.ranges.clone())).collect();
    let r = |end| vec![LineRange { start: 1, end }];
    assert_eq!(
        files,
        [("big.py", true, r(1201)), ("README.md", true, r(4)), ("util.py", true, r(10)), ("app.py", true, r(11))]
    );
    assert!(section_body(&summary.text, 1).contains("Latest request: What does util.py export? Answer briefly."));
    assert_eq!(section_body(&summary.text, 4), "   - No tool call failed in this part of the conversation.");
    // Small caps hold too, on real data.
    for cap in [300, 150] {
        let s = summarize_offline(&recs, &with_cap(cap));
        assert_well_formed(&s);
        assert!(s.tokens <= bound(&s, cap), "{cap}: {}", s.tokens);
    }
}

// ----------------------------------------------------------------------------------
// Many compactions: every user message stays accounted for, and summaries do not nest
// or grow.

/// Replays a generated session through `compactions` offline compactions (one every
/// `every` turns), each summarizing the previous summary plus the turns that followed,
/// as ctxd installs them. Calls `check` after each with every prompt so far and the
/// records it summarized.
fn replay_compactions(
    seed: u64,
    turns: usize,
    every: usize,
    options: &OfflineOptions,
    mut check: impl FnMut(usize, &[String], &OfflineSummary, &[Record]),
) {
    use crate::compact::{KeptMessages, SummaryMessage, summary_message_text};
    let jsonl = ctxd_gen::jsonl(&ctxd_gen::Options { seed, ..ctxd_gen::Options::turns(turns) });
    let o = oracle(&jsonl);
    let mut live: Vec<Record> = Vec::new();
    let mut seen = 0usize;
    let mut turn = 0usize;
    let mut compaction = 0usize;
    let lines: Vec<&str> = jsonl.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        live.push(Record::parse(line).unwrap());
        let v: Value = serde_json::from_str(line).unwrap();
        if v["type"] == "user" && v["message"]["content"].is_string() {
            seen += 1;
        }
        // A turn ends with the assistant's closing reply, before the next prompt.
        let next_is_prompt = lines.get(i + 1).is_none_or(|next| {
            let n: Value = serde_json::from_str(next).unwrap();
            n["type"] == "user" && n["message"]["content"].is_string()
        });
        if !next_is_prompt {
            continue;
        }
        turn += 1;
        if !turn.is_multiple_of(every) {
            continue;
        }
        let summary = summarize_offline(&live, options);
        compaction += 1;
        check(compaction, &o.prompts[..seen], &summary, &live);
        let body = parse_summary_reply(&summary.text).unwrap();
        let text = summary_message_text(&SummaryMessage {
            body,
            transcript_path: None,
            history_tools: None,
            tools_used: Vec::new(),
            kept: KeptMessages::None,
        });
        let boundary = serde_json::json!({"type": "system", "subtype": "compact_boundary", "uuid": format!("b{compaction}"), "content": "Conversation compacted", "compactMetadata": {"trigger": "auto"}});
        let installed = serde_json::json!({"type": "user", "uuid": format!("s{compaction}"), "isCompactSummary": true, "message": {"role": "user", "content": text}});
        live = vec![Record::parse(&boundary.to_string()).unwrap(), Record::parse(&installed.to_string()).unwrap()];
    }
}

/// The "[… N more user messages cut …]" counts of a section 6 body.
fn folded_in(messages: &str) -> usize {
    messages.lines().filter_map(|l| l.trim().strip_prefix("- ")).filter_map(carry::folded_count).sum()
}

#[test]
fn every_user_message_survives_many_compactions() {
    // At the 200k window's cap every message of these sessions fits at least cut.
    let options = with_cap(offline_cap_tokens(167_000));
    for (seed, turns, every) in [(1, 60, 5), (7, 45, 3), (11, 80, 8), (23, 30, 1)] {
        let mut sizes = Vec::new();
        replay_compactions(seed, turns, every, &options, |n, prompts, summary, _| {
            assert_well_formed(summary);
            assert!(
                summary.tokens <= bound(summary, options.max_output_tokens),
                "seed {seed} #{n}: {}",
                summary.tokens
            );
            assert!(!summary.text.contains("as summarized then"), "seed {seed} #{n}: nested");
            let messages = section_body(&summary.text, 6);
            assert_eq!(folded_in(&messages), 0, "seed {seed} #{n}: a message was left out\n{messages}");
            let entries = carry::entries(&messages);
            assert_eq!(entries.len(), prompts.len(), "seed {seed} #{n}: one entry per message\n{messages}");
            for (prompt, entry) in prompts.iter().zip(&entries) {
                assert!(
                    entry == prompt || in_short_form(&format!("   - {entry}"), prompt),
                    "seed {seed} #{n}: {prompt}\nas: {entry}"
                );
            }
            sizes.push(summary.tokens);
        });
        assert!(sizes.len() >= 3, "seed {seed}: {} compactions", sizes.len());
    }
}

#[test]
fn a_tight_cap_counts_every_message_it_cannot_show() {
    // 80 turns compacted every 4 under a 1,500-token cap: most messages cannot be
    // shown, and each one is either an entry of its own or counted in the marker.
    let options = with_cap(1_500);
    replay_compactions(5, 80, 4, &options, |n, prompts, summary, _| {
        assert!(summary.tokens <= bound(summary, 1_500), "#{n}: {}", summary.tokens);
        let messages = section_body(&summary.text, 6);
        let entries: Vec<String> =
            carry::entries(&messages).into_iter().filter(|e| carry::folded_count(e).is_none()).collect();
        // Identical messages are one entry with their count.
        let shown: usize = entries.iter().map(|e| carry::split_times(e).0).sum();
        assert_eq!(shown + folded_in(&messages), prompts.len(), "#{n}\n{messages}");
        // The first and the latest are always shown; whatever is shown is in order.
        assert!(in_short_form(&format!("   - {}", entries[0]), &prompts[0]), "#{n}: {}", entries[0]);
        let last = entries.last().unwrap();
        assert!(in_short_form(&format!("   - {last}"), prompts.last().unwrap()), "#{n}: {last}");
        let mut from = 0;
        for entry in &entries {
            let entry = carry::split_times(entry).1;
            let at = prompts[from..].iter().position(|p| entry == p || in_short_form(&format!("   - {entry}"), p));
            from += at.unwrap_or_else(|| panic!("#{n}: {entry} is no message, or out of order")) + 1;
        }
    });
}

#[test]
fn summary_size_stays_flat_over_many_compactions() {
    let options = with_cap(offline_cap_tokens(167_000));
    let mut sizes = Vec::new();
    let cap = options.max_output_tokens;
    let mut bounded = true;
    replay_compactions(3, 120, 6, &options, |_, _, summary, _| {
        bounded &= summary.tokens <= bound(summary, cap);
        sizes.push(summary.tokens);
    });
    assert!(sizes.len() >= 15);
    // Bounded by the cap (and the file list's allowance) whatever the number of
    // compactions; late summaries are not much larger than those of the middle of the
    // session.
    let middle = sizes[sizes.len() / 2];
    let last = *sizes.last().unwrap();
    assert!(bounded && sizes.iter().all(|&t| t <= cap + file_list_allowance_tokens(cap)), "{sizes:?}");
    assert!(last <= middle * 2, "{sizes:?}");
}

#[test]
fn identical_messages_are_one_counted_entry() {
    let prompt = |u: &str, text: &str| {
        serde_json::json!({"type": "user", "uuid": u, "message": {"role": "user", "content": text}}).to_string()
    };
    let lines = [
        prompt("u1", "Run the tests."),
        prompt("u2", "Fix the parser."),
        prompt("u3", "Run the tests."),
        prompt("u4", "Run the tests."),
        prompt("u5", "Thanks."),
    ];
    let summary = summarize_offline(&records(&lines.join("\n")), &OfflineOptions::default());
    assert_eq!(
        section_body(&summary.text, 6),
        "   - Fix the parser.\n   - (sent 3 times) Run the tests.\n   - Thanks."
    );
    // Read back by the next compaction, the count carries.
    let (times, text) = carry::split_times("(sent 3 times) Run the tests.");
    assert_eq!((times, text), (3, "Run the tests."));
}

#[test]
fn a_message_sent_several_times_counts_as_many_when_left_out() {
    // "Run the tests." three times early on, then many longer messages than the cap
    // holds: the repeated message is one entry, and when it is left out the marker
    // counts three messages, not one.
    let prompt = |u: usize, text: &str| {
        serde_json::json!({"type": "user", "uuid": format!("u{u}"), "message": {"role": "user", "content": text}})
            .to_string()
    };
    let mut lines = vec![prompt(0, "Port the command-line parser to the new argument model.")];
    lines.extend((1..=3).map(|u| prompt(u, "Run the tests.")));
    lines.extend((4..200).map(|u| prompt(u, &format!("Message {u}: rename the field number {u} and update callers."))));
    let summary = summarize_offline(&records(&lines.join("\n")), &with_cap(800));
    let messages = section_body(&summary.text, 6);
    assert!(!messages.contains("Run the tests."), "the cap leaves the repeated message out:\n{messages}");
    let entries = carry::entries(&messages);
    let shown: usize =
        entries.iter().filter(|e| carry::folded_count(e).is_none()).map(|e| carry::split_times(e).0).sum();
    assert_eq!(shown + folded_in(&messages), lines.len(), "{messages}");
}

#[test]
fn a_large_session_accounts_for_every_user_message() {
    // Far more messages than the cap can show: each is shown (whole or cut, with its
    // own marker) or counted in the one marker, and the summary stays under the cap.
    let jsonl = ctxd_gen::jsonl(&ctxd_gen::Options { seed: 9, ..ctxd_gen::Options::turns(500) });
    let o = oracle(&jsonl);
    let summary = summarize_offline(&records(&jsonl), &with_cap(4_000));
    assert_well_formed(&summary);
    assert!(summary.tokens <= bound(&summary, 4_000), "{}", summary.tokens);
    let messages = section_body(&summary.text, 6);
    let entries: Vec<String> =
        carry::entries(&messages).into_iter().filter(|e| carry::folded_count(e).is_none()).collect();
    let folded = folded_in(&messages);
    assert!(folded > 0 && entries.len() > 20, "{} shown, {folded} counted", entries.len());
    assert_eq!(entries.len() + folded, o.prompts.len());
    for entry in &entries {
        assert!(o.prompts.iter().any(|p| entry == p || in_short_form(&format!("   - {entry}"), p)), "{entry}");
    }
}

#[test]
fn an_earlier_summarys_messages_carry_even_when_they_read_like_placeholders() {
    let line = serde_json::json!({
        "type": "user",
        "uuid": "s",
        "isCompactSummary": true,
        "message": {"role": "user", "content": "Summary:\n1. Primary Request and Intent:\n   - First request: Port the CLI.\n6. All User Messages:\n   - Port the CLI.\n   - [… 4 more user messages cut …]\n   - none\n7. Pending Tasks:\n   - None recorded.\n"}
    });
    let prompt = serde_json::json!({"type": "user", "uuid": "u", "message": {"role": "user", "content": "Go on."}});
    let summary = summarize_offline(&records(&format!("{line}\n{prompt}")), &OfflineOptions::default());
    assert_eq!(
        section_body(&summary.text, 6),
        "   - Port the CLI.\n   - [… 4 more user messages cut …]\n   - none\n   - Go on."
    );
    assert!(section_body(&summary.text, 1).starts_with("   - First request: Port the CLI.\n"));
    // The earlier "None recorded." is no task; the new prompt has no reply yet.
    assert_eq!(section_body(&summary.text, 7), "   - Not yet answered: Go on.");
}

#[test]
fn a_branch_the_host_rewound_away_from_is_not_summarized() {
    // Turns 1 to 4, then the user went back to turn 2's reply and asked something
    // else; that question has no reply yet. A session's view leaves turns 3 and 4 out,
    // so its summary must too: neither as messages nor as work pending.
    let line = |v: Value| v.to_string();
    let turn = |n: &str, parent: &str| {
        [
            line(serde_json::json!({"type": "user", "uuid": format!("u{n}"), "parentUuid": parent,
                "message": {"role": "user", "content": format!("Question {n} about the lexer.")}})),
            line(serde_json::json!({"type": "assistant", "uuid": format!("a{n}"), "parentUuid": format!("u{n}"),
                "message": {"role": "assistant", "id": format!("m{n}"), "stop_reason": "end_turn",
                    "content": [{"type": "text", "text": format!("Answer {n}.")}]}})),
        ]
    };
    let mut lines: Vec<String> = Vec::new();
    lines.extend(turn("1", "root"));
    lines.extend(turn("2", "a1"));
    lines.extend(turn("3", "a2"));
    lines.extend(turn("4", "a3"));
    lines.push(line(serde_json::json!({"type": "user", "uuid": "u5", "parentUuid": "a2",
        "message": {"role": "user", "content": "Question 5, asked instead of 3."}})));
    let summary = summarize_offline(&records(&lines.join("\n")), &OfflineOptions::default());
    for gone in ["Question 3", "Question 4", "Answer 3", "Answer 4"] {
        assert!(!summary.text.contains(gone), "{gone}:\n{}", summary.text);
    }
    assert_eq!(summary.user_messages, 3);
    assert_eq!(
        section_body(&summary.text, 6),
        "   - Question 1 about the lexer.\n   - Question 2 about the lexer.\n   - Question 5, asked instead of 3."
    );
    assert_eq!(section_body(&summary.text, 7), "   - Not yet answered: Question 5, asked instead of 3.");
    // The fidelity check a provider's summary goes through sees the same messages.
    let facts = crate::compact::FidelityFacts::from_records(&records(&lines.join("\n")), 3);
    assert_eq!(facts.user_messages, ["Question 1 about the lexer.", "Question 2 about the lexer."]);
    assert_eq!(facts.last_request.as_deref(), Some("Question 5, asked instead of 3."));
}

/// Paths the tool calls of `records` read or changed (`file_path`), read with
/// `serde_json` rather than the summarizer's scanner.
fn touched_paths(records: &[Record]) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    for record in records {
        let v = record.to_value();
        for block in v["message"]["content"].as_array().into_iter().flatten() {
            let file_tool = matches!(block["name"].as_str(), Some("Read" | "Edit" | "MultiEdit" | "Write"));
            if block["type"] == "tool_use"
                && file_tool
                && let Some(path) = block["input"]["file_path"].as_str()
            {
                paths.insert(path.to_owned());
            }
        }
    }
    paths
}

/// Over generated sessions of `turns` turns compacted every `every` at a 100k window's
/// cap (3,190 tokens, and the file list's allowance): files touched since the previous
/// compaction, those of them the files section does not name (seed, compaction, path),
/// and the user messages so far against those shown (whole, cut or brief).
struct FilesNamed {
    touched: usize,
    unnamed: Vec<(u64, usize, String)>,
    prompts: usize,
    shown: usize,
}

fn files_named(turns: usize, every: usize) -> FilesNamed {
    let options = with_cap(offline_cap_tokens(67_000));
    let mut out = FilesNamed { touched: 0, unnamed: Vec::new(), prompts: 0, shown: 0 };
    for seed in [1, 4, 9] {
        replay_compactions(seed, turns, every, &options, |n, prompts, summary, summarized| {
            assert!(
                summary.tokens <= bound(summary, options.max_output_tokens),
                "seed {seed} #{n}: {}",
                summary.tokens
            );
            let files = section_body(&summary.text, 3);
            let touched = touched_paths(summarized);
            out.touched += touched.len();
            out.unnamed
                .extend(touched.into_iter().filter(|p| !files.contains(&format!("- {p}"))).map(|p| (seed, n, p)));
            let messages = section_body(&summary.text, 6);
            // Identical messages are one entry with their count.
            let entries = carry::entries(&messages);
            let shown: usize =
                entries.iter().filter(|e| carry::folded_count(e).is_none()).map(|e| carry::split_times(e).0).sum();
            assert_eq!(shown + folded_in(&messages), prompts.len(), "seed {seed} #{n}: every message accounted for");
            out.shown += shown;
            out.prompts += prompts.len();
        });
    }
    out
}

#[test]
fn every_file_touched_since_the_previous_compaction_is_named() {
    // 100 turns compacted every 20: far more files and messages than the cap holds in
    // full. Each file read or changed since the previous compaction keeps at least its
    // path, and every user message stays shown: the files are paid for by the other
    // sections.
    let r = files_named(100, 20);
    assert!(
        r.unnamed.is_empty(),
        "{} of {} files not named, the first: {:?}",
        r.unnamed.len(),
        r.touched,
        r.unnamed.first()
    );
    assert_eq!(r.shown, r.prompts, "every user message is shown");
    assert!(r.touched > 400, "{} files checked", r.touched);
}

#[test]
fn every_file_is_named_in_long_sessions_too() {
    // 240 turns compacted every 30, then 400 compacted every 40 (up to 94 files in one
    // part): late summaries hold more messages than 80 % of the cap holds even briefly.
    // The messages keep their share of the cap; the paths have their own room beside
    // it (before it: 1,227 of 1,276 and 1,902 of 2,187 named).
    for (turns, every) in [(240, 30), (400, 40)] {
        let r = files_named(turns, every);
        assert!(
            r.unnamed.is_empty(),
            "{turns} turns: {} of {} files not named, the first: {:?}",
            r.unnamed.len(),
            r.touched,
            r.unnamed.first()
        );
        assert!(r.touched > 1_000, "{} files checked", r.touched);
    }
}

/// One request, then `files` reads of as many files, each answered, and a closing reply.
fn session_reading(files: usize) -> Vec<Record> {
    let line = |v: Value| v.to_string();
    let mut lines = vec![line(serde_json::json!({"type": "user", "uuid": "u0",
        "message": {"role": "user", "content": "Read every source file and list what each one exports."}}))];
    for i in 0..files {
        lines.push(line(serde_json::json!({"type": "assistant", "uuid": format!("a{i}"),
            "message": {"role": "assistant", "id": format!("m{i}"), "stop_reason": "tool_use", "content": [
                {"type": "tool_use", "id": format!("t{i}"), "name": "Read",
                    "input": {"file_path": format!("/home/dev/project/src/module_{i:05}.rs")}}]}})));
        lines.push(line(serde_json::json!({"type": "user", "uuid": format!("r{i}"),
            "message": {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": format!("t{i}"), "content": "pub fn run() {}"}]}})));
    }
    lines.push(line(serde_json::json!({"type": "assistant", "uuid": "end",
        "message": {"role": "assistant", "id": "mend", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "Each module exports `run`."}]}})));
    records(&lines.join("\n"))
}

#[test]
fn more_files_than_their_allowance_holds_name_the_newest_and_count_the_rest() {
    // 10,000 files read since the previous compaction: more paths than the file list's
    // room holds at a 100k window (threshold 67k) or a one-million-token one (967k).
    let files = 10_000;
    let recs = session_reading(files);
    for threshold in [67_000, 967_000] {
        let cap = offline_cap_tokens(threshold);
        let summary = summarize_offline(&recs, &with_cap(cap));
        assert_well_formed(&summary);
        // Bounded: the cap plus the allowance, of which the paths took all.
        assert!(summary.tokens <= cap + file_list_allowance_tokens(cap), "{threshold}: {} tokens", summary.tokens);
        assert!(summary.tokens > cap + file_list_allowance_tokens(cap) * 9 / 10, "{threshold}: {}", summary.tokens);
        let list = section_body(&summary.text, 3);
        let named: Vec<usize> =
            (0..files).filter(|i| list.contains(&format!("- /home/dev/project/src/module_{i:05}.rs"))).collect();
        // The newest are named, every one of them down to the oldest named.
        assert!(named.len() > 100, "{threshold}: {} named", named.len());
        assert_eq!(named, (files - named.len()..files).collect::<Vec<_>>(), "{threshold}");
        // The rest are counted, with where to find them, and read back as counted.
        let left_out = files - named.len();
        let marker = format!(
            "- [… {} more files cut …] (the oldest; the transcript has their reads and edits)",
            text::thousands(left_out)
        );
        assert!(list.contains(&marker), "{threshold}: {marker}");
        let counted: usize = carry::entries(&list).iter().filter_map(|e| carry::folded_count(e)).sum();
        assert_eq!(counted, left_out, "{threshold}");
        // The request is still there in full.
        assert!(section_body(&summary.text, 6).contains("- Read every source file and list what each one exports."));
        println!(
            "threshold {threshold}: cap {cap}, summary {} tokens, {} of {files} files named",
            summary.tokens,
            named.len()
        );
    }
}
