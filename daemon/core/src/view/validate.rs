//! The Messages API's rules for a request body, checked without sending it.
//!
//! Used by tests over many generated and real sessions, and available to the daemon as a
//! last guard: a request that fails here would fail at the provider with a 400, which is
//! worse to diagnose. The checks are the provider's documented rules for message order,
//! tool pairing, content and cache markers; they are independent of how the pipeline
//! built the body.

use std::collections::HashSet;

use serde_json::Value;

/// Checks a request body; every violation is listed.
pub fn validate_request(body: &Value) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    let Some(obj) = body.as_object() else {
        return Err(vec!["the body is not a JSON object".to_owned()]);
    };
    match obj.get("model") {
        Some(Value::String(model)) if !model.is_empty() => {}
        _ => errors.push("model must be a non-empty string".to_owned()),
    }
    if obj.get("max_tokens").and_then(Value::as_u64).is_none_or(|n| n == 0) {
        errors.push("max_tokens must be a positive integer".to_owned());
    }
    let mut markers = 0;
    match obj.get("system") {
        None => {}
        Some(Value::String(text)) if text.trim().is_empty() => {
            errors.push("system: empty text".to_owned());
        }
        Some(Value::Array(blocks)) => {
            for (i, block) in blocks.iter().enumerate() {
                if block.get("type").and_then(Value::as_str) != Some("text") {
                    errors.push(format!("system[{i}]: not a text block"));
                }
                if block.get("text").and_then(Value::as_str).is_none_or(|t| t.trim().is_empty()) {
                    errors.push(format!("system[{i}]: empty text"));
                }
                markers += count_markers(block);
            }
        }
        Some(_) => errors.push("system must be a string or an array of text blocks".to_owned()),
    }
    let tool_names: Option<HashSet<&str>> = match obj.get("tools") {
        None => None,
        Some(Value::Array(tools)) => {
            let mut names = HashSet::new();
            for (i, tool) in tools.iter().enumerate() {
                match tool.get("name").and_then(Value::as_str) {
                    Some(name) => {
                        if !names.insert(name) {
                            errors.push(format!("tools[{i}]: duplicate name {name}"));
                        }
                    }
                    None => errors.push(format!("tools[{i}]: no name")),
                }
                markers += count_markers(tool);
            }
            Some(names)
        }
        Some(_) => {
            errors.push("tools must be an array".to_owned());
            None
        }
    };
    let Some(messages) = obj.get("messages").and_then(Value::as_array) else {
        errors.push("messages must be an array".to_owned());
        return Err(errors);
    };
    if messages.is_empty() {
        errors.push("messages is empty".to_owned());
    }
    let mut all_uses: HashSet<&str> = HashSet::new();
    let mut all_results: HashSet<&str> = HashSet::new();
    let mut references: HashSet<&str> = HashSet::new();
    let mut deleted: Vec<(usize, &str)> = Vec::new();
    let mut pending_uses: Vec<&str> = Vec::new();
    let mut previous_role: Option<&str> = None;
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        if role != "user" && role != "assistant" {
            errors.push(format!("messages[{i}]: role must be user or assistant, not {role:?}"));
        }
        if i == 0 && role != "user" {
            errors.push("messages[0]: the first message must be from the user".to_owned());
        }
        if previous_role == Some(role) {
            errors.push(format!("messages[{i}]: two {role} messages in a row"));
        }
        previous_role = Some(role);
        let blocks: Vec<&Value> = match message.get("content") {
            Some(Value::String(text)) => {
                if text.trim().is_empty() {
                    errors.push(format!("messages[{i}]: empty text content"));
                }
                Vec::new()
            }
            Some(Value::Array(blocks)) => {
                if blocks.is_empty() {
                    errors.push(format!("messages[{i}]: empty content array"));
                }
                blocks.iter().collect()
            }
            _ => {
                errors.push(format!("messages[{i}]: content must be a string or an array"));
                Vec::new()
            }
        };
        let expected = std::mem::take(&mut pending_uses);
        let mut answered: Vec<&str> = Vec::new();
        let mut other_seen = false;
        for (j, block) in blocks.iter().enumerate() {
            let at = format!("messages[{i}].content[{j}]");
            markers += count_markers(block);
            let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
            match (role, kind) {
                (_, "text") => {
                    if block.get("text").and_then(Value::as_str).is_none_or(|t| t.trim().is_empty()) {
                        errors.push(format!("{at}: empty text block"));
                    }
                    other_seen = true;
                }
                ("assistant", "tool_use") => {
                    let id = block.get("id").and_then(Value::as_str).unwrap_or("");
                    let name = block.get("name").and_then(Value::as_str).unwrap_or("");
                    if id.is_empty() || !all_uses.insert(id) {
                        errors.push(format!("{at}: tool_use id {id:?} missing or repeated"));
                    }
                    match &tool_names {
                        Some(names) if names.contains(name) => {}
                        Some(_) => errors.push(format!("{at}: tool_use names {name}, which is not offered")),
                        None => errors.push(format!("{at}: tool_use without a tools list")),
                    }
                    if !block.get("input").is_some_and(Value::is_object) {
                        errors.push(format!("{at}: tool_use input must be an object"));
                    }
                    pending_uses.push(id);
                }
                ("assistant", "thinking") => {
                    if block.get("signature").and_then(Value::as_str).is_none_or(str::is_empty) {
                        errors.push(format!("{at}: thinking without a signature"));
                    }
                }
                (
                    "assistant",
                    "redacted_thinking" | "server_tool_use" | "web_search_tool_result" | "web_fetch_tool_result",
                ) => {}
                ("user", "tool_result") => {
                    let id = block.get("tool_use_id").and_then(Value::as_str).unwrap_or("");
                    if other_seen {
                        errors.push(format!("{at}: tool_result after other content (results must come first)"));
                    }
                    if !expected.contains(&id) {
                        errors.push(format!("{at}: tool_result {id:?} has no tool_use in the previous message"));
                    }
                    if !all_results.insert(id) || answered.contains(&id) {
                        errors.push(format!("{at}: tool_result {id:?} repeated"));
                    }
                    answered.push(id);
                    if let Some(reference) = block.get("cache_reference").and_then(Value::as_str) {
                        references.insert(reference);
                    }
                    if let Some(Value::Array(inner)) = block.get("content") {
                        for b in inner {
                            markers += count_markers(b);
                        }
                    }
                }
                ("user", "cache_edits") => {
                    for edit in block.get("edits").and_then(Value::as_array).into_iter().flatten() {
                        match edit.get("cache_reference").and_then(Value::as_str) {
                            Some(reference) if edit.get("type").and_then(Value::as_str) == Some("delete") => {
                                deleted.push((i, reference));
                            }
                            _ => errors.push(format!("{at}: a cache edit must be a delete with a cache_reference")),
                        }
                    }
                }
                ("user", "image" | "document") => other_seen = true,
                ("assistant", "image" | "document") => {}
                (_, "") => errors.push(format!("{at}: block without a type")),
                (_, other) => errors.push(format!("{at}: a {role} message cannot carry a {other} block")),
            }
        }
        for id in &expected {
            if !answered.contains(id) {
                errors.push(format!("messages[{i}]: no tool_result for tool_use {id:?} of the previous message"));
            }
        }
        if !expected.is_empty() && role != "user" {
            errors.push(format!("messages[{i}]: tool_use results must follow in a user message"));
        }
    }
    if !pending_uses.is_empty() {
        errors.push("the last message has tool_use blocks without results".to_owned());
    }
    for (i, reference) in deleted {
        if !references.contains(reference) {
            errors.push(format!("messages[{i}]: cache edit deletes {reference:?}, which no tool_result references"));
        }
    }
    if markers > 4 {
        errors.push(format!("{markers} cache_control markers; at most 4 are allowed"));
    }
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}

fn count_markers(value: &Value) -> usize {
    usize::from(value.get("cache_control").is_some())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::validate_request;

    fn errors(body: serde_json::Value) -> Vec<String> {
        validate_request(&body).err().unwrap_or_default()
    }

    fn body(messages: serde_json::Value) -> serde_json::Value {
        json!({"model": "m", "max_tokens": 10, "tools": [{"name": "Read"}], "messages": messages})
    }

    #[test]
    fn a_valid_exchange_passes() {
        let ok = body(json!([
            {"role": "user", "content": "read it"},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}, {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}, {"type": "text", "text": "thanks"}]},
        ]));
        assert_eq!(validate_request(&ok), Ok(()));
    }

    #[test]
    fn each_rule_is_enforced() {
        let cases = [
            (json!([{"role": "assistant", "content": "hi"}]), "first message"),
            (json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]), "in a row"),
            (json!([{"role": "user", "content": [{"type": "text", "text": " "}]}]), "empty text block"),
            (json!([{"role": "user", "content": []}]), "empty content array"),
            (
                json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]}]),
                "without results",
            ),
            (
                json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]}, {"role": "user", "content": "b"}]),
                "no tool_result for tool_use",
            ),
            (
                json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}]}]),
                "has no tool_use",
            ),
            (
                json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]}, {"role": "user", "content": [{"type": "text", "text": "b"}, {"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}]),
                "results must come first",
            ),
            (
                json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}]),
                "not offered",
            ),
            (
                json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": ""}, {"type": "text", "text": "b"}]}]),
                "without a signature",
            ),
            (
                json!([{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "c", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "d", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "e", "cache_control": {"type": "ephemeral"}}]}]),
                "at most 4",
            ),
            (
                json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "cache_edits", "edits": [{"type": "delete", "cache_reference": "t1"}]}]}]),
                "no tool_result references",
            ),
        ];
        for (messages, expected) in cases {
            let found = errors(body(messages.clone()));
            assert!(found.iter().any(|e| e.contains(expected)), "{expected}: {found:?} for {messages}");
        }
        assert!(errors(json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Read", "input": {}}]}]})).iter().any(|e| e.contains("without a tools list")));
        assert!(errors(json!([])).iter().any(|e| e.contains("not a JSON object")));
    }
}
