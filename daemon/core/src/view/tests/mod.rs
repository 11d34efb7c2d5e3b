//! Tests of the request pipeline: goldens per stage over small text fixtures, the stages
//! together, the real Claude Code transcript, generated sessions, and the view cache
//! against assembling from scratch (examples and a property test).

mod fixture;
mod pipeline;
mod properties;
mod scrollback;
mod sdk;
mod sessions;
mod stages;

use serde_json::{Value, json};

use super::*;
use crate::record::Record;

/// The inputs of a test request, with defaults that make a plain request.
pub(crate) struct Setup {
    pub config: PipelineConfig,
    pub state: PipelineState,
    pub base: BaseContext,
    pub system: Vec<Value>,
    pub tools: Vec<Value>,
    pub fork: Option<Fork>,
    pub thinking: Option<Value>,
    pub now_ms: i64,
    pub compact: CompactCheck,
}

pub(crate) fn tools(names: &[&str]) -> Vec<Value> {
    names
        .iter()
        .map(|n| json!({"name": n, "description": format!("The {n} tool."), "input_schema": {"type": "object"}}))
        .collect()
}

impl Setup {
    pub fn new(now_ms: i64) -> Setup {
        Setup {
            config: PipelineConfig::default(),
            state: PipelineState::default(),
            base: BaseContext::default(),
            system: vec![json!({"type": "text", "text": "You are a coding agent."})],
            tools: tools(&["Read", "Bash", "Grep", "Glob", "Edit", "Write", "Task"]),
            fork: None,
            thinking: None,
            now_ms,
            compact: CompactCheck::default(),
        }
    }

    pub fn input<'a>(&'a self, records: &'a [Record]) -> AssembleInput<'a> {
        AssembleInput {
            records,
            system: &self.system,
            tools: &self.tools,
            model: "claude-x",
            max_tokens: 8_000,
            thinking: self.thinking.as_ref(),
            fork: self.fork.as_ref(),
            base: &self.base,
            now_ms: self.now_ms,
            state: &self.state,
            config: &self.config,
            tool_results_dir: "/store",
            compact: self.compact,
        }
    }

    /// Assembles from scratch and checks the request is valid.
    pub fn run(&self, records: &[Record]) -> Assembled {
        let out = assemble(&self.input(records));
        assert_valid(&out);
        out
    }
}

/// Fails with the request and the violations when a request is not valid.
pub(crate) fn assert_valid(out: &Assembled) -> Value {
    let value = out.request.to_value();
    if let Err(errors) = validate_request(&value) {
        panic!("invalid request:\n{}\n{errors:#?}", render_request(&value));
    }
    value
}

/// The request, one line per message.
pub(crate) fn rendered(out: &Assembled) -> String {
    render_request(&out.request.to_value())
}

/// The reports, one line per stage.
pub(crate) fn report(out: &Assembled) -> String {
    out.applied
        .iter()
        .map(|a| {
            format!(
                "{}{}: {}{}\n",
                a.stage.as_str(),
                if a.acted { "*" } else { "" },
                a.detail,
                if a.tokens_freed > 0 { format!(" (freed {})", a.tokens_freed) } else { String::new() }
            )
        })
        .collect()
}

/// Appends what a request decided, as the daemon would.
pub(crate) fn persist(records: &mut Vec<Record>, out: &Assembled) {
    for map in out.new_state.records() {
        records.push(Record::from_object(&map).unwrap());
    }
}
