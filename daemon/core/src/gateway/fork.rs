//! The preparation request: a fork of a live session's newest request that asks for the
//! summary Claude Code will want at its next compaction.
//!
//! The fork is the newest request byte for byte up to the `]` that closes its
//! messages (model, system, tools, thinking, betas and cache markers unchanged), with
//! one user message appended after the last: the summary instruction, as Claude Code
//! appends it for `/compact`. Everything in front of the instruction is what the
//! upstream already holds in its prompt cache from that request, so the fork reads it
//! instead of paying for the conversation again. The instruction is ctxd's own
//! (`compact::summary_instruction`): it asks for the same `<analysis>` draft and nine
//! `<summary>` sections Claude Code's does.

use super::conversation::Conversation;
use crate::compact::{PromptSpec, summary_instruction};

/// The fork of `conversation`'s request, as bytes to send.
pub fn fork_body(conversation: &Conversation<'_>) -> Vec<u8> {
    let instruction = serde_json::json!({
        "role": "user",
        "content": [{"type": "text", "text": summary_instruction(&PromptSpec::full())}],
    });
    let body = conversation.body.as_bytes();
    let (head, tail) = body.split_at(conversation.messages_end);
    let instruction = instruction.to_string();
    let mut out = Vec::with_capacity(body.len() + instruction.len() + 1);
    out.extend_from_slice(head);
    out.push(b',');
    out.extend_from_slice(instruction.as_bytes());
    out.extend_from_slice(tail);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::conversation::{CompactionForm, compaction_ask, read};
    use serde_json::{Value, json};

    const BODY: &str = r#"{"model":"claude-opus-5-5","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":"yo"},{"role":"user","content":[{"type":"text","text":"go on","cache_control":{"type":"ephemeral"}}]} ],"system":[{"type":"text","text":"s"}],"tools":[],"thinking":{"type":"adaptive"},"max_tokens":32000,"stream":true}"#;

    #[test]
    fn the_fork_is_the_request_byte_for_byte_with_the_instruction_appended() {
        let conversation = read(BODY.as_bytes()).unwrap();
        let fork = fork_body(&conversation);
        let cut = BODY.find(" ],\"system\"").unwrap() + 1;
        assert!(fork.starts_with(&BODY.as_bytes()[..cut]), "everything up to the last message is unchanged");
        assert!(fork.ends_with(&BODY.as_bytes()[cut..]), "and everything after the list");
        let value: Value = serde_json::from_slice(&fork).unwrap();
        let messages = value["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 4);
        assert_eq!(messages[3]["role"], "user");
        assert_eq!(value["thinking"], json!({"type": "adaptive"}));
        let text = messages[3]["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("<summary>") && text.contains("<analysis>"));
    }

    #[test]
    fn the_fork_reads_back_as_a_compaction_of_the_whole_request_in_ctxds_own_words() {
        // Not Claude Code's instruction, so the gateway never takes its own fork for one.
        let fork = fork_body(&read(BODY.as_bytes()).unwrap());
        let values = read(&fork).unwrap().values().unwrap();
        assert_eq!(compaction_ask(values).map(|a| a.form), None::<CompactionForm>);
    }
}
