//! Any sequence of appends, snips, collapses, boundaries and rewinds gives a valid
//! request, and the view cache gives the same request as assembling from scratch after
//! every append.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::pipeline::assert_same;
use super::*;

const TOOLS: [&str; 4] = ["Read", "Bash", "Grep", "Gone"];

#[derive(Debug, Clone)]
enum Op {
    Prompt(usize),
    /// A response: optional text, thinking (signed or not), calls (tool, later result
    /// size), written as one line or one line per block.
    Respond {
        text: bool,
        thinking: Option<bool>,
        calls: Vec<(usize, u32)>,
        split: bool,
    },
    /// Results for the last response's calls: which ones, in which order, one record or
    /// one per result.
    Results {
        keep: Vec<bool>,
        reverse: bool,
        together: bool,
        /// As Claude Code writes parallel calls: each result hangs off its call's line,
        /// and what follows hangs off the first result only.
        hang: bool,
    },
    Attachment,
    ApiError,
    Snip {
        from: usize,
        len: usize,
    },
    Collapse {
        from: usize,
        len: usize,
    },
    Boundary,
    Wait(i64),
    /// A result for an older call.
    LateResult(usize),
    /// A record appended a second time.
    Duplicate(usize),
    /// A stored-output record for an existing call.
    Replace(usize),
    /// A snip naming records not appended yet.
    SnipAhead,
    /// A collapse from an existing record to one not appended yet.
    CollapseAhead(usize),
    /// A prompt hanging off an earlier record (the k-th back): the host rewound.
    Rewind(usize),
    /// A progress record in the chain.
    Progress,
    /// An attachment without a parent, as the daemon writes its notes.
    Note,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![8 => 10u32..3_000, 1 => 30_000u32..130_000];
    prop_oneof![
        3 => (1usize..400).prop_map(Op::Prompt),
        5 => (any::<bool>(), proptest::option::of(any::<bool>()), prop::collection::vec((0usize..4, size), 0..4), any::<bool>())
            .prop_map(|(text, thinking, calls, split)| Op::Respond { text, thinking, calls, split }),
        5 => (prop::collection::vec(prop::bool::weighted(0.85), 4), any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(keep, reverse, together, hang)| Op::Results { keep, reverse, together, hang }),
        1 => Just(Op::Attachment),
        1 => Just(Op::ApiError),
        1 => (0usize..60, 1usize..6).prop_map(|(from, len)| Op::Snip { from, len }),
        1 => (0usize..60, 1usize..8).prop_map(|(from, len)| Op::Collapse { from, len }),
        1 => prop::bool::weighted(0.3).prop_map(|b| if b { Op::Boundary } else { Op::Wait(1) }),
        2 => (1i64..20).prop_map(Op::Wait),
        1 => (0usize..30).prop_map(Op::LateResult),
        1 => (0usize..60).prop_map(Op::Duplicate),
        1 => (0usize..30).prop_map(Op::Replace),
        1 => Just(Op::SnipAhead),
        1 => (0usize..60).prop_map(Op::CollapseAhead),
        2 => (0usize..12).prop_map(Op::Rewind),
        1 => Just(Op::Progress),
        1 => Just(Op::Note),
    ]
}

/// Turns operations into transcript lines.
struct Builder {
    lines: Vec<Value>,
    uuids: Vec<String>,
    calls: Vec<String>,
    pending: Vec<(String, u32)>,
    /// The line each call is on.
    call_lines: std::collections::HashMap<String, String>,
    parent: Value,
    clock: i64,
    next: usize,
}

impl Builder {
    fn id(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }

    fn message(&mut self, kind: &str, body: Value) {
        self.clock += 1_000;
        let uuid = self.id("u");
        let mut rec = json!({"parentUuid": self.parent, "isSidechain": false, "type": kind, "uuid": uuid, "timestamp": stamp(self.clock)});
        if let (Value::Object(r), Value::Object(b)) = (&mut rec, body) {
            r.extend(b);
        }
        self.parent = json!(uuid);
        self.uuids.push(uuid);
        self.lines.push(rec);
    }

    fn result_body(id: &str, size: u32) -> Value {
        json!({"type": "tool_result", "tool_use_id": id, "content": "r".repeat(size as usize)})
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Prompt(n) => self.message("user", json!({"message": {"role": "user", "content": "p".repeat(*n)}})),
            Op::Respond { text, thinking, calls, split } => {
                let mut blocks = Vec::new();
                if let Some(signed) = thinking {
                    blocks.push(json!({"type": "thinking", "thinking": "hm", "signature": if *signed { "sig" } else { "" }}));
                }
                if *text {
                    blocks.push(json!({"type": "text", "text": "answer"}));
                }
                self.pending.clear();
                for (tool, size) in calls {
                    let id = self.id("toolu_");
                    blocks.push(json!({"type": "tool_use", "id": id, "name": TOOLS[*tool], "input": {"q": 1}}));
                    self.pending.push((id.clone(), *size));
                    self.calls.push(id);
                }
                let message_id = self.id("msg_");
                let groups: Vec<Vec<Value>> =
                    if *split { blocks.into_iter().map(|b| vec![b]).collect() } else { vec![blocks] };
                for content in groups {
                    let ids: Vec<String> =
                        content.iter().filter_map(|b| b["id"].as_str().map(String::from)).collect();
                    self.message(
                        "assistant",
                        json!({"message": {"id": message_id, "role": "assistant", "model": "m", "content": content}}),
                    );
                    for id in ids {
                        self.call_lines.insert(id, self.uuids.last().cloned().unwrap_or_default());
                    }
                }
            }
            Op::Results { keep, reverse, together, hang } => {
                let mut answered: Vec<(String, u32)> = self
                    .pending
                    .iter()
                    .zip(keep.iter().chain(std::iter::repeat(&true)))
                    .filter(|(_, k)| **k)
                    .map(|(p, _)| p.clone())
                    .collect();
                if *reverse {
                    answered.reverse();
                }
                self.pending.clear();
                if *hang {
                    let mut first = None;
                    for (id, n) in answered {
                        if let Some(line) = self.call_lines.get(&id) {
                            self.parent = json!(line);
                        }
                        let content = vec![Builder::result_body(&id, n)];
                        self.message("user", json!({"message": {"role": "user", "content": content}}));
                        first = first.or_else(|| self.uuids.last().cloned());
                    }
                    if let Some(first) = first {
                        self.parent = json!(first);
                    }
                } else if *together && !answered.is_empty() {
                    let content: Vec<Value> = answered.iter().map(|(id, n)| Builder::result_body(id, *n)).collect();
                    self.message("user", json!({"message": {"role": "user", "content": content}}));
                } else {
                    for (id, n) in answered {
                        let content = vec![Builder::result_body(&id, n)];
                        self.message("user", json!({"message": {"role": "user", "content": content}}));
                    }
                }
            }
            Op::Attachment => self.message(
                "attachment",
                json!({"attachment": {"type": "file"}, "rendered": [{"content": "<system-reminder>a file</system-reminder>"}]}),
            ),
            Op::ApiError => self.message(
                "assistant",
                json!({"isApiErrorMessage": true, "message": {"id": "e", "role": "assistant", "model": "<synthetic>", "content": [{"type": "text", "text": "API Error"}]}}),
            ),
            Op::Snip { from, len } => {
                if !self.uuids.is_empty() {
                    let start = from % self.uuids.len();
                    let removed: Vec<&String> = self.uuids.iter().skip(start).take(*len).collect();
                    self.lines.push(json!({"type": "ctxd-snip", "removedUuids": removed}));
                }
            }
            Op::Collapse { from, len } => {
                if !self.uuids.is_empty() {
                    let start = from % self.uuids.len();
                    let end = (start + len).min(self.uuids.len() - 1);
                    let (a, b) = (self.uuids[start].clone(), self.uuids[end].clone());
                    self.lines.push(json!({"type": "ctxd-collapse", "from": a, "to": b, "summary": "earlier work"}));
                }
            }
            Op::Boundary => {
                self.clock += 1_000;
                let uuid = self.id("b");
                self.lines.push(json!({"parentUuid": null, "type": "system", "subtype": "compact_boundary", "uuid": uuid, "timestamp": stamp(self.clock)}));
                self.parent = json!(uuid);
                self.uuids.clear();
                self.pending.clear();
                self.message("user", json!({"isCompactSummary": true, "message": {"role": "user", "content": "summary so far"}}));
            }
            Op::Wait(minutes) => self.clock += minutes * 60_000,
            Op::LateResult(k) => {
                if !self.calls.is_empty() {
                    let id = self.calls[k % self.calls.len()].clone();
                    self.message("user", json!({"message": {"role": "user", "content": [Builder::result_body(&id, 50)]}}));
                }
            }
            Op::Duplicate(k) => {
                if !self.lines.is_empty() {
                    let again = self.lines[k % self.lines.len()].clone();
                    self.lines.push(again);
                }
            }
            Op::SnipAhead => {
                let ahead: Vec<String> = (1..=4).map(|d| format!("u{}", self.next + d)).collect();
                self.lines.push(json!({"type": "ctxd-snip", "removedUuids": ahead}));
            }
            Op::CollapseAhead(k) => {
                if !self.uuids.is_empty() {
                    let from = self.uuids[k % self.uuids.len()].clone();
                    let to = format!("u{}", self.next + 3);
                    self.lines.push(json!({"type": "ctxd-collapse", "from": from, "to": to, "summary": "later work"}));
                }
            }
            Op::Rewind(k) => {
                if !self.uuids.is_empty() {
                    self.parent = json!(self.uuids[self.uuids.len() - 1 - k % self.uuids.len()]);
                    self.pending.clear();
                    self.message("user", json!({"message": {"role": "user", "content": "instead, do this"}}));
                }
            }
            Op::Progress => self.message("progress", json!({"data": {"type": "hook_progress"}})),
            Op::Note => {
                self.clock += 1_000;
                let uuid = self.id("n");
                self.lines.push(json!({"type": "attachment", "uuid": uuid, "timestamp": stamp(self.clock),
                    "attachment": {"type": "changed_files"}, "rendered": [{"content": "<system-reminder>a note</system-reminder>"}]}));
            }
            Op::Replace(k) => {
                if !self.calls.is_empty() {
                    let id = self.calls[k % self.calls.len()].clone();
                    self.lines.push(json!({"type": "ctxd-tool-result-replacement", "toolUseId": id, "path": "/x", "preview": "[stored]"}));
                }
            }
        }
    }
}

fn stamp(ms: i64) -> String {
    // Minutes and seconds past a fixed hour are enough for the gaps tested here.
    let base = parse_rfc3339_ms("2026-11-29T00:00:00Z").unwrap_or(0);
    let s = (ms - base) / 1000;
    format!("2026-11-29T{:02}:{:02}:{:02}Z", s / 3600 % 24, s / 60 % 60, s % 60)
}

fn build(ops: &[Op]) -> Vec<Record> {
    let mut b = Builder {
        lines: Vec::new(),
        uuids: Vec::new(),
        calls: Vec::new(),
        pending: Vec::new(),
        call_lines: std::collections::HashMap::new(),
        parent: Value::Null,
        clock: parse_rfc3339_ms("2026-11-29T08:00:00Z").unwrap_or(0),
        next: 0,
    };
    for op in ops {
        b.apply(op);
    }
    b.lines.iter().map(|l| Record::parse(&l.to_string()).unwrap()).collect()
}

fn settings() -> impl Strategy<Value = PipelineConfig> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(snip, edits, tight, strip)| {
        let mut config = PipelineConfig::default();
        config.snip.enabled = snip;
        config.snip.reminder_after_tokens = 2_000;
        config.microcompact.cache_editing = edits;
        config.microcompact.min_saved_tokens = 500;
        config.microcompact.keep_recent = 2;
        if tight {
            config.budget.per_result_tokens = 2_000;
            config.budget.per_message_tokens = 3_000;
        }
        config.strip_meta_media = strip;
        config
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn any_history_gives_a_valid_request_and_the_cache_agrees(
        ops in prop::collection::vec(op(), 1..45),
        config in settings(),
        fork in proptest::option::of(any::<bool>()),
        context in any::<bool>(),
    ) {
        let source = build(&ops);
        let mut setup = Setup::new(0);
        setup.config = config;
        setup.tools = tools(&TOOLS[..3]);
        setup.fork = fork.map(|skip| Fork { instruction: "Summarize.".into(), skip_cache_write: skip });
        if context {
            setup.base.user_context = Some("memory".into());
        }
        let mut records: Vec<Record> = Vec::new();
        let mut cache = ViewCache::new();
        for record in source {
            records.push(record.clone());
            if let Some(at) = record.head().timestamp.as_deref().and_then(parse_rfc3339_ms) {
                setup.now_ms = at + 30_000;
            }
            let input = setup.input(&records);
            let kept = cache.assemble(&input);
            let fresh = assemble(&input);
            assert_same(&kept, &fresh, records.len());
            persist(&mut records, &kept);
        }
    }
}
