//! Small transcripts written as text, one record per line.
//!
//! ```text
//! user u1 "Please read the file"        a prompt
//! meta m1 "<local-command-caveat>…"     an isMeta user record
//! summary s1 "This session continues…"  the compaction summary
//! say a1 m1 "Let me look"               an assistant line (uuid, message id, text)
//! call a2 m1 t1 Read [t2 Bash …]        an assistant line with tool_use blocks
//! think a3 m1 signed|unsigned           an assistant thinking line
//! error a4                              the host's stand-in for a failed request
//! result r1 t1 3400 [error] [toolref]   a tool result of 3400 bytes (or "text")
//! images r2 t1 3                        a tool result holding 3 images
//! picture p1 meta|prompt                a user record with an image
//! attach at1 file "rendered text"       an attachment with rendered text
//! attach at2 prompt_snapshot            an attachment without rendered text
//! side x1 "text"                        a sidechain user record
//! noise                                 a progress record (no uuid)
//! step p1                               a progress record in the chain
//! note n1 "rendered text"               an attachment without a parent (as ctxd writes)
//! from a2                               the next record hangs off a2 (a rewind, a fork)
//! boundary b1 [head anchor tail]        a compact boundary (and preserved segment)
//! snip u2 a3 …                          a ctxd-snip record
//! collapse a2 r4 "summary text"         a ctxd-collapse record
//! replace t1 "preview"                  a ctxd-tool-result-replacement record
//! cleared t1 t2 …                       a ctxd-microcompact record (time gap)
//! edits u1 t1 t2 …                      a ctxd-microcompact record (cache edits pinned to u1)
//! wait 10                               the clock moves 10 minutes
//! ```
//!
//! Parent pointers chain the message records in order (a boundary starts a new chain);
//! timestamps start at 2026-11-29T10:00:00Z and advance a second per record.

use serde_json::{Value, json};

use crate::record::Record;
use crate::view::parse_rfc3339_ms;

/// Records of a fixture plus the time just after the last one.
pub struct Fixture {
    pub records: Vec<Record>,
    /// One second after the last record.
    pub end_ms: i64,
}

fn tokens(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '"' {
            chars.next();
            let mut s = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => match chars.next() {
                        Some('n') => s.push('\n'),
                        Some(other) => s.push(other),
                        None => {}
                    },
                    other => s.push(other),
                }
            }
            out.push(s);
        } else {
            let mut s = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                s.push(c);
                chars.next();
            }
            out.push(s);
        }
    }
    out
}

fn timestamp(ms: i64) -> String {
    let secs = ms / 1000;
    let base = parse_rfc3339_ms("2026-11-29T00:00:00Z").unwrap() / 1000;
    let day_secs = secs - base;
    assert!((0..86_400 * 28).contains(&day_secs), "fixture clock left November");
    let day = 29 + day_secs / 86_400;
    let (month, day) = if day > 30 { (12, day - 30) } else { (11, day) };
    let rem = day_secs % 86_400;
    format!("2026-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, rem / 60 % 60, rem % 60, ms % 1000)
}

/// A text of `bytes` bytes that reads like tool output.
pub fn filler(bytes: usize) -> String {
    let line = "fn example() { let value = compute(42); }\n";
    let mut s = line.repeat(bytes / line.len() + 1);
    s.truncate(bytes);
    s
}

/// Builds the records of a fixture.
pub fn fixture(spec: &str) -> Fixture {
    let mut records = Vec::new();
    let mut clock = parse_rfc3339_ms("2026-11-29T10:00:00Z").unwrap();
    let mut parent: Value = Value::Null;
    for line in spec.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let t = tokens(line);
        let arg = |i: usize| t.get(i).cloned().unwrap_or_default();
        if t[0] == "wait" {
            clock += arg(1).parse::<i64>().unwrap() * 60_000;
            continue;
        }
        if t[0] == "from" {
            parent = json!(arg(1));
            continue;
        }
        clock += 1_000;
        let ts = timestamp(clock);
        let mut message = |kind: &str, uuid: &str, body: Value| -> Value {
            let mut rec = json!({"parentUuid": parent, "isSidechain": false, "type": kind, "uuid": uuid, "timestamp": ts, "sessionId": "s"});
            if let (Value::Object(r), Value::Object(b)) = (&mut rec, body) {
                r.extend(b);
            }
            parent = json!(uuid);
            rec
        };
        let record = match t[0].as_str() {
            "user" => message("user", &arg(1), json!({"message": {"role": "user", "content": arg(2)}})),
            "meta" => message("user", &arg(1), json!({"isMeta": true, "message": {"role": "user", "content": arg(2)}})),
            "summary" => message(
                "user",
                &arg(1),
                json!({"isCompactSummary": true, "isVisibleInTranscriptOnly": true, "message": {"role": "user", "content": arg(2)}}),
            ),
            "say" => message(
                "assistant",
                &arg(1),
                json!({"message": {"id": arg(2), "role": "assistant", "model": "claude-x", "content": [{"type": "text", "text": arg(3)}]}}),
            ),
            "call" => {
                let uses: Vec<Value> = t[3..]
                    .chunks(2)
                    .map(|c| json!({"type": "tool_use", "id": c[0], "name": c[1], "input": {"path": "/src/lib.rs"}, "caller": {"type": "direct"}}))
                    .collect();
                message(
                    "assistant",
                    &arg(1),
                    json!({"message": {"id": arg(2), "role": "assistant", "model": "claude-x", "content": uses}}),
                )
            }
            "think" => {
                let signature = if arg(3) == "signed" { "c2lnbmF0dXJl" } else { "" };
                message(
                    "assistant",
                    &arg(1),
                    json!({"message": {"id": arg(2), "role": "assistant", "model": "claude-x", "content": [{"type": "thinking", "thinking": "Hmm.", "signature": signature}]}}),
                )
            }
            "error" => message(
                "assistant",
                &arg(1),
                json!({"isApiErrorMessage": true, "message": {"id": "err", "role": "assistant", "model": "<synthetic>", "content": [{"type": "text", "text": "API Error: overloaded"}]}}),
            ),
            "result" => {
                let body = arg(3);
                let mut content = match body.parse::<usize>() {
                    Ok(n) => json!(filler(n)),
                    Err(_) => json!(body),
                };
                if t.iter().any(|x| x == "toolref") {
                    content = json!([{"type": "text", "text": "Loaded."}, {"type": "tool_reference", "tool_name": "CronCreate"}]);
                }
                let mut block = json!({"type": "tool_result", "tool_use_id": arg(2), "content": content});
                if t.iter().any(|x| x == "error") {
                    block["is_error"] = json!(true);
                }
                message(
                    "user",
                    &arg(1),
                    json!({"message": {"role": "user", "content": [block]}, "toolUseResult": {"stdout": "…"}}),
                )
            }
            "images" => {
                let n: usize = arg(3).parse().unwrap();
                let content: Vec<Value> = (0..n)
                    .map(|_| json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo".repeat(50)}}))
                    .collect();
                message(
                    "user",
                    &arg(1),
                    json!({"message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": arg(2), "content": content}]}}),
                )
            }
            "picture" => {
                let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo"}});
                let meta = arg(2) == "meta";
                message(
                    "user",
                    &arg(1),
                    json!({"isMeta": meta, "message": {"role": "user", "content": [{"type": "text", "text": "see this"}, image]}}),
                )
            }
            "attach" => {
                let mut body = json!({"attachment": {"type": arg(2)}});
                if t.len() > 3 {
                    body["rendered"] = json!([{"content": arg(3)}]);
                    body["renderedRole"] = json!("user");
                }
                message("attachment", &arg(1), body)
            }
            "side" => {
                let rec = json!({"parentUuid": null, "isSidechain": true, "type": "user", "uuid": arg(1), "timestamp": ts, "message": {"role": "user", "content": arg(2)}});
                rec
            }
            "noise" => json!({"type": "progress", "timestamp": ts, "data": {"n": 1}}),
            "step" => message("progress", &arg(1), json!({"data": {"type": "hook_progress"}})),
            "note" => json!({"type": "attachment", "uuid": arg(1), "timestamp": ts, "isSidechain": false,
                "attachment": {"type": "changed_files", "source": "ctxd"}, "rendered": [{"content": arg(2)}], "renderedRole": "user"}),
            "boundary" => {
                let mut rec = json!({"parentUuid": null, "logicalParentUuid": parent, "type": "system", "subtype": "compact_boundary", "uuid": arg(1), "timestamp": ts, "compactMetadata": {"trigger": "manual", "preTokens": 1000}});
                if t.len() > 2 {
                    rec["compactMetadata"]["preservedSegment"] =
                        json!({"headUuid": arg(2), "anchorUuid": arg(3), "tailUuid": arg(4)});
                }
                parent = json!(arg(1));
                rec
            }
            "snip" => json!({"type": "ctxd-snip", "timestamp": ts, "removedUuids": t[1..]}),
            "collapse" => {
                json!({"type": "ctxd-collapse", "timestamp": ts, "from": arg(1), "to": arg(2), "summary": arg(3)})
            }
            "cleared" => {
                json!({"type": "ctxd-microcompact", "timestamp": ts, "trigger": "time_gap", "gapAfterUuid": "earlier", "clearedToolUseIds": t[1..]})
            }
            "edits" => {
                json!({"type": "ctxd-microcompact", "timestamp": ts, "trigger": "cache_edits", "pinnedToUuid": arg(1), "clearedToolUseIds": t[2..]})
            }
            "replace" => {
                json!({"type": "ctxd-tool-result-replacement", "toolUseId": arg(1), "path": format!("/store/{}.txt", arg(1)), "preview": arg(2), "originalBytes": 1})
            }
            other => panic!("unknown fixture line {other:?}"),
        };
        records.push(Record::parse(&serde_json::to_string(&record).unwrap()).unwrap());
    }
    Fixture { records, end_ms: clock + 1_000 }
}

#[test]
fn fixtures_read_as_records() {
    let f = fixture(
        r#"
        user u1 "hi \"there\""
        call a1 m1 t1 Read t2 Bash
        wait 10
        result r1 t1 12 error
        "#,
    );
    assert_eq!(f.records.len(), 3);
    let v = f.records[1].to_value();
    assert_eq!(v["parentUuid"], "u1");
    assert_eq!(v["message"]["content"][1]["name"], "Bash");
    let r = f.records[2].to_value();
    assert_eq!(r["message"]["content"][0]["content"].as_str().unwrap().len(), 12);
    assert_eq!(r["timestamp"], "2026-11-29T10:10:03.000Z");
    assert_eq!(f.end_ms, parse_rfc3339_ms("2026-11-29T10:10:04Z").unwrap());
}
