//! Properties every generated session has, read back with `serde_json` only.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::collections::HashMap;

use serde_json::Value;

use super::*;

fn parse(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).expect("every line is a JSON object")).collect()
}

fn usage_total(record: &Value) -> u64 {
    let u = &record["message"]["usage"];
    ["input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"]
        .iter()
        .map(|k| u[k].as_u64().unwrap())
        .sum()
}

fn is_prompt(record: &Value) -> bool {
    record["type"] == "user" && record["message"]["content"].is_string() && record.get("isCompactSummary").is_none()
}

#[test]
fn same_options_same_bytes_and_seeds_differ() {
    let opts = Options { seed: 5, parallel: 0.3, errors: 0.2, ..Options::turns(6) };
    assert_eq!(jsonl(&opts), jsonl(&opts));
    assert_ne!(jsonl(&opts), jsonl(&Options { seed: 6, ..opts.clone() }));
}

#[test]
fn turns_are_prompt_calls_results_and_a_reply() {
    for seed in 0..20 {
        let opts = Options { seed, parallel: 0.3, errors: 0.1, ..Options::turns(5) };
        let mut out = Vec::new();
        let stats = write(&opts, &mut out).unwrap();
        let records = parse(std::str::from_utf8(&out).unwrap());
        assert_eq!(stats.records, records.len());
        assert_eq!(stats.bytes, out.len() as u64);
        assert_eq!(records.iter().filter(|r| is_prompt(r)).count(), 5, "seed {seed}");
        assert_eq!(stats.turns, 5);
        assert!(is_prompt(&records[0]));
        let last = records.last().unwrap();
        assert_eq!(
            (last["type"].as_str(), last["message"]["stop_reason"].as_str()),
            (Some("assistant"), Some("end_turn"))
        );

        // One chain, one session, time moving forward.
        let mut parent = Value::Null;
        let mut clock = 0;
        for r in &records {
            assert_eq!(r["parentUuid"], parent, "seed {seed}: {r}");
            assert_eq!(r["sessionId"].as_str(), Some(stats.session_id.as_str()));
            parent = r["uuid"].clone();
            let at = time::parse_ms(r["timestamp"].as_str().unwrap()).unwrap();
            assert!(at > clock, "seed {seed}: {r}");
            clock = at;
        }

        // Every call answered once, right after its message, in call order.
        let mut pending: Vec<String> = Vec::new();
        let mut calls = 0;
        for r in &records {
            let content = &r["message"]["content"];
            if r["type"] == "assistant" {
                assert!(pending.is_empty(), "seed {seed}: unanswered {pending:?}");
                for block in content.as_array().unwrap().iter().filter(|b| b["type"] == "tool_use") {
                    pending.push(block["id"].as_str().unwrap().to_owned());
                    calls += 1;
                }
                let tool_use = r["message"]["stop_reason"] == "tool_use";
                assert_eq!(tool_use, !pending.is_empty(), "seed {seed}: {r}");
            } else if let Some(blocks) = content.as_array() {
                assert_eq!(blocks.len(), 1);
                assert_eq!(blocks[0]["type"], "tool_result");
                assert_eq!(blocks[0]["tool_use_id"].as_str(), Some(pending.remove(0).as_str()), "seed {seed}");
                assert!(r.get("toolUseResult").is_some());
            } else {
                assert!(pending.is_empty() && is_prompt(r), "seed {seed}: {r}");
            }
        }
        assert!(pending.is_empty());
        assert_eq!(calls, stats.tool_calls);
    }
}

#[test]
fn reads_record_the_file_they_return() {
    let dir = std::env::temp_dir().join(format!("ctxd-gen-test-{}", std::process::id()));
    let opts = Options { seed: 3, files_dir: Some(dir.clone()), ..Options::turns(12) };
    let records = records(&opts);
    let mut names: HashMap<String, String> = HashMap::new();
    for r in &records {
        if r["type"] == "assistant" {
            for block in r["message"]["content"].as_array().unwrap() {
                names
                    .insert(block["id"].as_str().unwrap_or("").to_owned(), block["name"].as_str().unwrap_or("").into());
            }
        }
    }
    let mut reads = 0;
    for r in records.iter().filter(|r| r["toolUseResult"]["file"].is_object()) {
        let block = &r["message"]["content"][0];
        assert_eq!(names[block["tool_use_id"].as_str().unwrap()], "Read");
        let file = &r["toolUseResult"]["file"];
        let body = file["content"].as_str().unwrap();
        let lines: Vec<&str> = body.split('\n').collect();
        assert_eq!(file["numLines"], lines.len());
        // The result is the file with numbered lines.
        let shown: Vec<String> = lines.iter().enumerate().map(|(i, l)| format!("{:>6}\u{2192}{l}", i + 1)).collect();
        assert_eq!(block["content"].as_str().unwrap(), shown.join("\n"));
        let path = file["filePath"].as_str().unwrap();
        let relative = path.strip_prefix("/home/dev/project/").unwrap();
        assert_eq!(std::fs::read_to_string(dir.join(relative)).unwrap(), body);
        reads += 1;
    }
    assert!(reads > 5, "{reads}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn usage_follows_the_context_to_the_target() {
    let mut out = Vec::new();
    let stats = write(&Options { seed: 11, ..Options::tokens(260_000) }, &mut out).unwrap();
    let records = parse(std::str::from_utf8(&out).unwrap());
    let totals: Vec<u64> = records.iter().filter(|r| r["type"] == "assistant").map(usage_total).collect();
    assert!(totals.windows(2).all(|w| w[0] < w[1]), "usage only grows without compaction");
    assert_eq!(*totals.last().unwrap(), stats.tokens);
    assert!(stats.tokens >= 260_000 && stats.tokens < 400_000, "{stats:?}");
    // Tool results are most of a coding session's context, some of them large.
    let results: Vec<usize> = records
        .iter()
        .filter_map(|r| r["message"]["content"][0]["content"].as_str().filter(|_| r["type"] == "user"))
        .map(str::len)
        .collect();
    assert!(results.iter().any(|&n| n > 20_000), "a heavy tail");
    assert!(results.iter().filter(|&&n| n < 4_000).count() * 2 > results.len(), "mostly small");
}

#[test]
fn compaction_keeps_every_part_under_its_threshold() {
    let opts = Options { seed: 2, compact_at: Some(60_000), until: Until::Bytes(1_500_000), ..Options::default() };
    let mut out = Vec::new();
    let stats = write(&opts, &mut out).unwrap();
    assert!(stats.bytes >= 1_500_000 && stats.boundaries >= 3, "{stats:?}");
    let records = parse(std::str::from_utf8(&out).unwrap());
    let mut previous = Value::Null;
    for (i, r) in records.iter().enumerate() {
        if r["subtype"] == "compact_boundary" {
            assert_eq!(r["parentUuid"], Value::Null);
            assert_eq!(r["logicalParentUuid"], previous);
            assert!(r["compactMetadata"]["preTokens"].as_u64().unwrap() >= 60_000);
            let summary = &records[i + 1];
            assert_eq!(summary["isCompactSummary"], true);
            assert_eq!(summary["parentUuid"], r["uuid"]);
            let first = records[i + 1..].iter().find(|r| r["type"] == "assistant").unwrap();
            assert!(usage_total(first) < 60_000, "{}", usage_total(first));
        }
        previous = r["uuid"].clone();
    }
    assert_eq!(records.iter().filter(|r| r["subtype"] == "compact_boundary").count(), stats.boundaries);
}
