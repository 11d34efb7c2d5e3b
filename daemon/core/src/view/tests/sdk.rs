//! Requests for many generated sessions, as a host's agent loop would ask for them (one
//! before every model call), under variants that bring in every kind of content and every
//! valve: thinking and images, a compaction, snips and collapses with tight budgets, a
//! rewind, a cold cache with a fork, base context, cache editing.
//!
//! Every request is checked here against the Messages API's rules ([`validate_request`]).
//! With `CTXD_DUMP_REQUESTS=DIR` the requests are also written to `DIR` (one JSON body per
//! file) for `tests/sdk/check_requests.py`, which checks them against the request types
//! of the official `anthropic` Python SDK (`tests/sdk/run` does both). The sessions are
//! the generated ones of [`super::sessions::generated`], plus every `*.jsonl` in `CTXD_SESSIONS=DIR` when
//! set (`ctxd-gen-session` output, see `tests/sdk/run`). Requests with cache edits are checked here only: the
//! public SDK has no type for `cache_edits` or `cache_reference`.

use std::collections::HashSet;
use std::path::PathBuf;

use serde_json::{Value, json};

use super::*;

/// A 1×1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

fn sessions() -> Vec<(String, Vec<Value>)> {
    let mut out: Vec<(String, String)> =
        super::sessions::generated().into_iter().map(|(name, text)| (name.replace([' ', ','], "_"), text)).collect();
    if let Some(dir) = std::env::var_os("CTXD_SESSIONS") {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect();
        paths.sort();
        assert!(!paths.is_empty(), "no *.jsonl in {dir:?}");
        for path in paths {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            out.push((name, std::fs::read_to_string(&path).unwrap()));
        }
    }
    out.into_iter()
        .map(|(name, text)| {
            let lines = text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap());
            (name, lines.collect())
        })
        .collect()
}

fn is_prompt(v: &Value) -> bool {
    v["type"] == "user" && v["message"]["content"].is_string()
}

fn uuid(v: &Value) -> String {
    v["uuid"].as_str().unwrap_or_default().to_owned()
}

/// Signed thinking first in every response, an image in the first prompt and in every
/// third tool result.
fn with_thinking_and_images(mut lines: Vec<Value>) -> Vec<Value> {
    let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}});
    let mut results = 0;
    let mut first_prompt = true;
    for line in &mut lines {
        let assistant = line["type"] == "assistant";
        let content = &mut line["message"]["content"];
        if assistant {
            if let Some(blocks) = content.as_array_mut() {
                blocks.insert(0, json!({"type": "thinking", "thinking": "Let me think.", "signature": "c2lnbmVk"}));
            }
        } else if first_prompt && content.is_string() {
            *content = json!([{"type": "text", "text": content.clone()}, image]);
            first_prompt = false;
        } else if let Some(block) = content.get_mut(0).filter(|b| b["type"] == "tool_result") {
            results += 1;
            if results % 3 == 0 {
                let text = block["content"].clone();
                block["content"] = json!([{"type": "text", "text": text}, image]);
            }
        }
    }
    lines
}

/// A compaction before the prompt in the middle: boundary, summary, and the rest chained
/// after the summary.
fn compacted(mut lines: Vec<Value>) -> Vec<Value> {
    let prompts: Vec<usize> = (0..lines.len()).filter(|&i| is_prompt(&lines[i])).collect();
    let Some(&at) = prompts.get(prompts.len() / 2).filter(|&&i| i > 0) else { return lines };
    let before = lines[at - 1].clone();
    let boundary = json!({
        "parentUuid": null, "logicalParentUuid": before["uuid"], "isSidechain": false, "type": "system",
        "subtype": "compact_boundary", "content": "Conversation compacted", "uuid": "boundary-1",
        "timestamp": before["timestamp"], "compactMetadata": {"trigger": "auto", "preTokens": 150_000},
    });
    let summary = json!({
        "parentUuid": "boundary-1", "isSidechain": false, "type": "user", "uuid": "summary-1",
        "isCompactSummary": true, "isVisibleInTranscriptOnly": true, "timestamp": before["timestamp"],
        "message": {"role": "user", "content": "This session is being continued from an earlier conversation. Summary: the work so far."},
    });
    lines[at]["parentUuid"] = json!("summary-1");
    lines.splice(at..at, [boundary, summary]);
    lines
}

/// A snip of a middle range after half the records, a collapse after three quarters.
fn reduced(mut lines: Vec<Value>) -> Vec<Value> {
    let n = lines.len();
    let uuids: Vec<String> = lines.iter().map(uuid).collect();
    let snip = json!({"type": "ctxd-snip", "uuid": "snip-1", "removedUuids": uuids[n / 8..n / 8 + 3]});
    let collapse = json!({"type": "ctxd-collapse", "uuid": "collapse-1", "from": uuids[n / 4], "to": uuids[n / 3], "summary": "Earlier: files were read and searched."});
    lines.insert(3 * n / 4, collapse);
    lines.insert(n / 2, snip);
    lines
}

/// A rewind: at two thirds, a prompt hanging off the record before the prompt at one
/// third, and the rest of the session following it. Returns the tool ids of the
/// abandoned branch.
fn rewound(mut lines: Vec<Value>) -> (Vec<Value>, HashSet<String>) {
    let prompts: Vec<usize> = (0..lines.len()).filter(|&i| is_prompt(&lines[i])).collect();
    let (Some(&from), Some(&at)) =
        (prompts.get(prompts.len() / 3).filter(|&&i| i > 0), prompts.get(2 * prompts.len() / 3))
    else {
        return (lines, HashSet::new());
    };
    if at <= from {
        return (lines, HashSet::new());
    }
    let abandoned: HashSet<String> = lines[from..at]
        .iter()
        .flat_map(|l| l["message"]["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|b| b["id"].as_str().map(String::from))
        .collect();
    let prompt = json!({
        "parentUuid": lines[from - 1]["uuid"], "isSidechain": false, "type": "user", "uuid": "rewind-1",
        "timestamp": lines[at - 1]["timestamp"],
        "message": {"role": "user", "content": "Let us go back: try a different approach instead."},
    });
    lines[at]["parentUuid"] = json!("rewind-1");
    lines.insert(at, prompt);
    (lines, abandoned)
}

struct Variant {
    name: &'static str,
    /// Written for the SDK check.
    dump: bool,
    setup: fn(&mut Setup),
}

fn variants() -> Vec<Variant> {
    vec![
        Variant { name: "plain", dump: true, setup: |_| {} },
        Variant { name: "thinking_images", dump: true, setup: |_| {} },
        Variant { name: "compacted", dump: true, setup: |_| {} },
        Variant {
            name: "reduced",
            dump: true,
            setup: |s| {
                s.config.budget.per_result_tokens = 1_500;
                s.config.budget.per_message_tokens = 2_000;
                s.config.snip.enabled = true;
                s.config.snip.reminder_after_tokens = 3_000;
            },
        },
        Variant { name: "rewound", dump: true, setup: |_| {} },
        Variant {
            name: "cold_cache_fork",
            dump: true,
            setup: |s| {
                s.config.microcompact.cache_ttl_ms = 20_000;
                s.config.microcompact.min_saved_tokens = 1_000;
                s.config.microcompact.keep_recent = 2;
                s.fork =
                    Some(Fork { instruction: "Summarize the conversation so far.".into(), skip_cache_write: true });
            },
        },
        Variant {
            name: "context",
            dump: true,
            setup: |s| {
                s.base = BaseContext {
                    system_context: Some("gitStatus: branch main, clean".into()),
                    user_context: Some("# CLAUDE.md\nRun the tests before committing.".into()),
                    attachments: vec!["<system-reminder>src/lib.rs changed on disk.</system-reminder>".into()],
                };
                s.fork = Some(Fork { instruction: "Summarize.".into(), skip_cache_write: false });
            },
        },
        Variant {
            name: "cache_editing",
            dump: false,
            setup: |s| {
                s.config.microcompact.cache_editing = true;
                s.config.microcompact.min_saved_tokens = 2_000;
                s.config.microcompact.keep_recent = 2;
            },
        },
    ]
}

#[test]
fn generated_sessions_give_valid_requests_for_the_sdk_check() {
    let dump = std::env::var_os("CTXD_DUMP_REQUESTS").map(PathBuf::from);
    if let Some(dir) = &dump {
        std::fs::create_dir_all(dir).unwrap();
    }
    let (mut checked, mut written) = (0, 0);
    let mut seen: HashSet<&str> = HashSet::new();
    for (session, source) in sessions() {
        for variant in variants() {
            let mut abandoned = HashSet::new();
            let lines = match variant.name {
                "thinking_images" => with_thinking_and_images(source.clone()),
                "compacted" => compacted(source.clone()),
                "reduced" => reduced(source.clone()),
                "rewound" => {
                    let (lines, gone) = rewound(source.clone());
                    abandoned = gone;
                    lines
                }
                _ => source.clone(),
            };
            let mut setup = Setup::new(0);
            (variant.setup)(&mut setup);
            let mut records: Vec<Record> = Vec::new();
            let mut cache = ViewCache::new();
            let mut rewound_yet = false;
            for (k, line) in lines.iter().enumerate() {
                records.push(Record::parse(&line.to_string()).unwrap());
                rewound_yet |= line["uuid"] == "rewind-1";
                let next_is_model_call = lines.get(k + 1).is_none_or(|l| l["type"] == "assistant");
                if !next_is_model_call {
                    continue;
                }
                if let Some(at) = records.last().and_then(|r| r.head().timestamp.as_deref()).and_then(parse_rfc3339_ms)
                {
                    setup.now_ms = at + 1_000;
                }
                let out = cache.assemble(&setup.input(&records));
                persist(&mut records, &out);
                let body = out.request.to_json();
                assert_valid(&out);
                checked += 1;
                for feature in ["image", "thinking", "tool_result", "cache_edits"] {
                    if body.contains(&format!("\"type\":\"{feature}\"")) {
                        seen.insert(feature);
                    }
                }
                if rewound_yet {
                    for id in &abandoned {
                        assert!(
                            !body.contains(id.as_str()),
                            "{session}/{}: {id} of the abandoned branch was sent",
                            variant.name
                        );
                    }
                }
                if body.contains(microcompact::CLEARED) {
                    seen.insert("cleared");
                }
                if let (Some(dir), true) = (&dump, variant.dump) {
                    std::fs::write(dir.join(format!("{session}-{}-{k:04}.json", variant.name)), &body).unwrap();
                    written += 1;
                }
            }
            if variant.name == "rewound" {
                assert!(rewound_yet && !abandoned.is_empty(), "{session}: no rewind");
            }
        }
    }
    for feature in ["image", "thinking", "tool_result", "cache_edits", "cleared"] {
        assert!(seen.contains(feature), "no request had {feature}");
    }
    assert!(checked > 100, "{checked}");
    if dump.is_some() {
        eprintln!("{checked} requests checked, {written} written for the SDK check");
    }
}
