//! What the agent invoked that must outlive a compaction: skills (with the content the
//! model was given) and the plan file.
//!
//! Everything is derived from records, so a resumed session knows the same as the live
//! one: ctxd's own markers (`ctx/skillInvoked`, `ctx/setPlan`), `Skill` tool calls with
//! their results, and the `invoked_skills` / `plan_file_reference` attachments a
//! compaction installs (which carry the state across the boundary). Only candidate
//! lines are parsed, so observing a record costs a substring check in the common case.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

use crate::compact::SkillEntry;
use crate::record::{Kind, Record};

/// `type` of the record `ctx/skillInvoked` appends (never sent to a model).
pub const SKILL_MARKER: &str = "ctxd-skill-invoked";
/// `type` of the record `ctx/setPlan` appends (never sent to a model).
pub const PLAN_MARKER: &str = "ctxd-plan";
/// The agent's tool for running a skill.
const SKILL_TOOL: &str = "Skill";

/// Skills and plan of one session since its latest compact boundary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Invoked {
    /// One entry per skill name, the latest content; `order` grows with each invocation.
    pub skills: Vec<SkillEntry>,
    pub plan_path: Option<String>,
    /// `Skill` tool calls waiting for their result: tool use id → skill name.
    pending: HashMap<String, String>,
    next_order: u64,
}

impl Invoked {
    /// Folds one record in.
    pub fn observe(&mut self, record: &Record) {
        let line = record.line();
        let head = record.head();
        if head.is_sidechain {
            return;
        }
        match head.kind {
            Kind::Other if line.contains(SKILL_MARKER) || line.contains(PLAN_MARKER) => self.marker(line),
            Kind::Attachment if line.contains("invoked_skills") || line.contains("plan_file_reference") => {
                self.restored(line);
            }
            Kind::Assistant if line.contains(SKILL_TOOL) => self.skill_calls(line),
            Kind::User if !self.pending.is_empty() && line.contains("tool_result") => self.skill_results(line),
            _ => {}
        }
    }

    /// Estimated tokens of the skills' content (the part of the messages they take).
    pub fn skill_bytes(&self) -> u64 {
        self.skills.iter().map(|s| s.content.len() as u64).sum()
    }

    /// A skill ran with `content`; a skill run again replaces its earlier content.
    pub fn skill(&mut self, name: &str, content: &str) {
        self.skills.retain(|s| s.name != name);
        self.skills.push(SkillEntry { name: name.to_owned(), content: content.to_owned(), order: self.next_order });
        self.next_order += 1;
    }

    fn marker(&mut self, line: &str) {
        #[derive(Deserialize)]
        struct Marker {
            #[serde(rename = "type")]
            ty: String,
            name: Option<String>,
            content: Option<String>,
            path: Option<String>,
        }
        let Ok(m) = serde_json::from_str::<Marker>(line) else { return };
        match m.ty.as_str() {
            SKILL_MARKER => {
                if let (Some(name), Some(content)) = (m.name, m.content) {
                    self.skill(&name, &content);
                }
            }
            PLAN_MARKER => self.plan_path = m.path,
            _ => {}
        }
    }

    fn restored(&mut self, line: &str) {
        let Ok(value) = serde_json::from_str::<Value>(line) else { return };
        let attachment = &value["attachment"];
        match attachment["type"].as_str() {
            Some("invoked_skills") => {
                for skill in attachment["skills"].as_array().into_iter().flatten() {
                    if let (Some(name), Some(content)) = (skill["name"].as_str(), skill["content"].as_str()) {
                        self.skill(name, content);
                    }
                }
            }
            Some("plan_file_reference") => {
                if let Some(path) = attachment["planFilePath"].as_str() {
                    self.plan_path = Some(path.to_owned());
                }
            }
            _ => {}
        }
    }

    fn skill_calls(&mut self, line: &str) {
        let Ok(value) = serde_json::from_str::<Value>(line) else { return };
        for block in value["message"]["content"].as_array().into_iter().flatten() {
            if block["type"] == "tool_use" && block["name"] == SKILL_TOOL {
                let input = &block["input"];
                let name =
                    input["skill"].as_str().or_else(|| input["command"].as_str()).or_else(|| input["name"].as_str());
                if let (Some(id), Some(name)) = (block["id"].as_str(), name) {
                    self.pending.insert(id.to_owned(), name.to_owned());
                }
            }
        }
    }

    fn skill_results(&mut self, line: &str) {
        let Ok(value) = serde_json::from_str::<Value>(line) else { return };
        for block in value["message"]["content"].as_array().into_iter().flatten() {
            if block["type"] != "tool_result" || block["is_error"] == true {
                continue;
            }
            let Some(name) = block["tool_use_id"].as_str().and_then(|id| self.pending.remove(id)) else { continue };
            let content = match &block["content"] {
                Value::String(text) => text.clone(),
                Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n"),
                _ => String::new(),
            };
            if !content.is_empty() {
                self.skill(&name, &content);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(value: Value) -> Record {
        Record::from_object(value.as_object().unwrap()).unwrap()
    }

    #[test]
    fn markers_tool_calls_and_restored_attachments_all_count() {
        let mut invoked = Invoked::default();
        invoked.observe(&rec(
            serde_json::json!({"type": SKILL_MARKER, "uuid": "m1", "name": "deploy", "content": "Run make deploy."}),
        ));
        invoked.observe(&rec(
            serde_json::json!({"type": "assistant", "uuid": "a1", "message": {"id": "x", "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_9", "name": "Skill", "input": {"skill": "review"}}]}}),
        ));
        invoked.observe(&rec(serde_json::json!({"type": "user", "uuid": "u1", "message": {"role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": [{"type": "text", "text": "Check every diff hunk."}]}]}})));
        invoked.observe(&rec(serde_json::json!({"type": PLAN_MARKER, "uuid": "p1", "path": "/work/plan.md"})));
        let names: Vec<&str> = invoked.skills.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["deploy", "review"]);
        assert_eq!(invoked.skills[1].content, "Check every diff hunk.");
        assert_eq!(invoked.plan_path.as_deref(), Some("/work/plan.md"));
        // Running a skill again moves it to the newest place with its new content.
        invoked.observe(&rec(
            serde_json::json!({"type": SKILL_MARKER, "uuid": "m2", "name": "deploy", "content": "Run make deploy-v2."}),
        ));
        assert_eq!(invoked.skills.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["review", "deploy"]);
        assert!(invoked.skills[1].order > invoked.skills[0].order);

        // What a compaction installs carries the state across the boundary.
        let mut after = Invoked::default();
        after.observe(&rec(
            serde_json::json!({"type": "attachment", "uuid": "r1", "attachment": {"type": "invoked_skills",
            "skills": [{"name": "review", "content": "Check every diff hunk."}]}}),
        ));
        after.observe(&rec(
            serde_json::json!({"type": "attachment", "uuid": "r2", "attachment": {"type": "plan_file_reference",
            "planFilePath": "/work/plan.md", "planContent": "1. do it"}}),
        ));
        assert_eq!(after.skills.len(), 1);
        assert_eq!(after.plan_path.as_deref(), Some("/work/plan.md"));
    }

    #[test]
    fn failed_skill_calls_and_sidechains_do_not_count() {
        let mut invoked = Invoked::default();
        invoked.observe(&rec(
            serde_json::json!({"type": "assistant", "uuid": "a1", "message": {"id": "x", "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Skill", "input": {"skill": "nope"}}]}}),
        ));
        invoked.observe(&rec(serde_json::json!({"type": "user", "uuid": "u1", "message": {"role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true, "content": "Unknown skill"}]}})));
        invoked.observe(&rec(
            serde_json::json!({"type": SKILL_MARKER, "uuid": "m1", "isSidechain": true, "name": "sub", "content": "x"}),
        ));
        assert!(invoked.skills.is_empty());
    }
}
