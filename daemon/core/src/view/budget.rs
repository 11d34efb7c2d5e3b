//! Stage 2: the tool-result budget.
//!
//! A new tool result too large for the context is stored on disk and the model sees a
//! preview with the file's path instead; the new results of one message also share an
//! aggregate budget. The core only decides: it names the results to store, gives their
//! full text and the preview, and the daemon writes the file once and appends a
//! replacement record. From then on the recorded replacement is applied the same way on
//! every request and after resume, whatever the budget settings say, so the prompt
//! prefix stays stable.
//!
//! "New" means not answered by the model yet (after the last response): a result the
//! model already saw in full keeps being sent in full.
//!
//! [`carried_bytes`] says what a record just appended will weigh in the next request,
//! so the session's usage, its compaction triggers and a compaction's own estimates
//! count an oversized result by its preview from the start, not at full size until the
//! next response reports.

use std::collections::BTreeMap;

use super::Applied;
use super::config::BudgetConfig;
use super::content::ContentRules;
use super::item::{BYTES_PER_TOKEN, Block, Item, Role};
use super::raw;
use super::state::{Offload, Replacement};
use crate::record::{Kind, Record};

/// Bytes of `record`'s content as the next request carries it: a new tool result over
/// the budget by its preview (the request offloads it before carrying it), an attachment
/// by its rendered text (what the model is sent of it), anything else as stored
/// (`content_bytes`). Only a record too large to stay whole is parsed.
///
/// The aggregate budget is applied to the record's own results; results of several
/// records merged into one message can share it too, which this does not see.
pub fn carried_bytes(record: &Record, config: &BudgetConfig) -> u64 {
    let head = record.head();
    let stored = u64::from(head.content_bytes);
    match head.kind {
        Kind::User if stored / BYTES_PER_TOKEN > config.per_result_tokens => {
            let Some(item) = Item::from_record(record) else { return stored };
            let (_, saved) = decide_offloads(std::slice::from_ref(&item), &BTreeMap::new(), config, "");
            stored.saturating_sub(saved.saturating_mul(BYTES_PER_TOKEN))
        }
        Kind::Attachment => Item::from_record(record).map_or(0, |item| item.tokens().saturating_mul(BYTES_PER_TOKEN)),
        _ => stored,
    }
}

/// The file a result is stored in: `<dir>/<tool_use_id>.txt`, with any character that
/// is not safe in a file name replaced.
pub fn offload_path(dir: &str, tool_use_id: &str) -> String {
    let name: String =
        tool_use_id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    format!("{}/{name}.txt", dir.trim_end_matches('/'))
}

/// The text the model sees instead of a stored result.
pub fn preview_text(content: &str, path: &str, config: &BudgetConfig) -> String {
    let head_end = content.floor_char_boundary(config.preview_head_bytes);
    let tail_start = content.ceil_char_boundary(content.len().saturating_sub(config.preview_tail_bytes).max(head_end));
    let tokens = content.len() as u64 / BYTES_PER_TOKEN;
    let mut out = format!(
        "[This output was too large for the context: {} bytes, about {tokens} tokens. It is stored in full at {path}; read that file for any part not shown below.]\n\n",
        content.len()
    );
    out.push_str(&content[..head_end]);
    if tail_start > head_end {
        out.push_str(&format!("\n\n[… {} bytes not shown …]\n\n", tail_start - head_end));
        out.push_str(&content[tail_start..]);
    }
    out
}

/// A result block whose content is the replacement's preview.
pub fn replaced(block: &Block, replacement: &Replacement) -> Block {
    match block.result() {
        Some(r) if !r.replaced && !r.cleared => {
            block.rebuild_result(&[("content", &raw::string(&replacement.preview))], |r| r.replaced = true)
        }
        _ => block.clone(),
    }
}

/// Chooses which new results to store. `unanswered` are the items after the last
/// response; results already recorded are left alone. Returns the offloads (in view
/// order) and the tokens they save.
pub fn decide_offloads(
    unanswered: &[Item],
    recorded: &BTreeMap<String, Replacement>,
    config: &BudgetConfig,
    dir: &str,
) -> (Vec<Offload>, u64) {
    let candidates: Vec<&Block> = unanswered
        .iter()
        .filter(|item| item.role == Role::User && !item.snipped)
        .flat_map(|item| item.blocks.iter())
        .filter(|b| {
            b.result().is_some_and(|r| !r.replaced && !r.cleared && !recorded.contains_key(r.tool_use_id.as_ref()))
        })
        .collect();
    let mut chosen: Vec<bool> = candidates.iter().map(|b| b.tokens() > config.per_result_tokens).collect();
    let mut total: u64 = candidates.iter().zip(&chosen).filter(|(_, c)| !**c).map(|(b, _)| b.tokens()).sum();
    if total > config.per_message_tokens {
        // Largest first; among equals the earliest, so the choice is deterministic.
        let mut order: Vec<usize> = (0..candidates.len()).filter(|&i| !chosen[i]).collect();
        order.sort_by(|&a, &b| candidates[b].tokens().cmp(&candidates[a].tokens()).then(a.cmp(&b)));
        for i in order {
            if total <= config.per_message_tokens {
                break;
            }
            chosen[i] = true;
            total -= candidates[i].tokens();
        }
    }
    let mut saved = 0;
    let offloads = candidates
        .iter()
        .zip(&chosen)
        .filter(|(_, c)| **c)
        .filter_map(|(block, _)| {
            let id = block.result()?.tool_use_id.to_string();
            let content = block.result_text();
            let path = offload_path(dir, &id);
            let replacement = Replacement {
                preview: preview_text(&content, &path, config),
                path,
                original_bytes: content.len() as u64,
            };
            saved += block.tokens().saturating_sub(replaced(block, &replacement).tokens());
            Some(Offload { tool_use_id: id, replacement, content })
        })
        .collect();
    (offloads, saved)
}

/// The stage: every replacement in `replacements` (recorded, plus any just decided)
/// applied to the view.
pub fn apply_tool_result_budget(items: Vec<Item>, replacements: &BTreeMap<String, Replacement>) -> Vec<Item> {
    let rules = ContentRules { replacements, ..ContentRules::NONE };
    items.into_iter().map(|item| rules.apply_to_item(item)).collect()
}

/// The stage's report.
pub(crate) fn budget_applied(offloads: &[Offload], saved: u64, recorded: usize) -> Applied {
    Applied {
        stage: super::Stage::ToolResultBudget,
        acted: !offloads.is_empty(),
        tokens_freed: saved,
        detail: format!("{} new results stored, {recorded} recorded replacements", offloads.len()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn record(value: serde_json::Value) -> Record {
        Record::from_object(value.as_object().unwrap()).unwrap()
    }

    fn tool_result(size: usize) -> Record {
        record(json!({
            "type": "user", "uuid": "r1", "parentUuid": "a1", "isSidechain": false,
            "message": {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x".repeat(size)}
            ]},
        }))
    }

    #[test]
    fn an_oversized_result_counts_as_its_preview() {
        let config = BudgetConfig::default();
        let big = tool_result(200_000);
        let carried = carried_bytes(&big, &config);
        let preview = preview_text(&"x".repeat(200_000), &offload_path("", "toolu_1"), &config).len() as u64;
        assert!(carried < 2 * preview, "{carried} bytes carried for a {preview}-byte preview");
        assert!(carried >= preview, "{carried} < {preview}");
        // Under the budget, the result is carried whole.
        let small = tool_result(50_000);
        assert_eq!(carried_bytes(&small, &config), u64::from(small.head().content_bytes));
        // A smaller budget offloads it too.
        let tight = BudgetConfig { per_result_tokens: 5_000, ..config };
        assert!(carried_bytes(&small, &tight) < 10_000);
    }

    #[test]
    fn an_oversized_result_starts_no_compaction_the_request_would_not_need() {
        let prompt = record(json!({
            "type": "user", "uuid": "u1", "isSidechain": false,
            "message": {"role": "user", "content": "Read the build log."},
        }));
        let call = record(json!({
            "type": "assistant", "uuid": "a1", "parentUuid": "u1", "isSidechain": false,
            "message": {"id": "msg_1", "role": "assistant", "model": "m", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "cat build.log"}}
            ], "usage": {"input_tokens": 60_000, "output_tokens": 50}},
        }));
        let records = [prompt, call, tool_result(200_000)];
        let config = BudgetConfig::default();
        let mut tally = crate::tally::Tally::default();
        for r in &records {
            tally.observe_sized(r, carried_bytes(r, &config));
        }
        let mut at_full_size = crate::tally::Tally::default();
        records.iter().for_each(|r| at_full_size.observe(r));
        let threshold = 67_000;
        assert!(at_full_size.total() > threshold, "the result is worth a compaction at full size");
        assert!(tally.total() < 62_000, "the trigger's figure: {}", tally.total());
        // The request, assembled with that figure as its anchor, agrees: under the
        // threshold, its result carried as the preview.
        let input = crate::view::AssembleInput {
            records: &records,
            system: &[],
            tools: &[json!({"name": "Bash", "input_schema": {"type": "object"}})],
            model: "m",
            max_tokens: 8_000,
            thinking: None,
            fork: None,
            base: &crate::view::BaseContext::default(),
            now_ms: 0,
            state: &crate::view::PipelineState::default(),
            config: &crate::view::PipelineConfig::default(),
            tool_results_dir: "/store",
            compact: crate::view::CompactCheck { threshold: Some(threshold), anchored_tokens: Some(tally.total()) },
        };
        let assembled = crate::view::assemble(&input);
        assert_eq!(assembled.decision, crate::view::CompactDecision::Continue);
        assert!(assembled.estimate_tokens < 5_000, "{}", assembled.estimate_tokens);
        assert_eq!(assembled.new_state.offloads.len(), 1, "the request offloads the result");
    }

    #[test]
    fn an_attachment_counts_as_its_rendered_text() {
        let text = "y".repeat(8_000);
        let attachment = record(json!({
            "type": "attachment", "uuid": "t1", "isSidechain": false,
            "attachment": {"type": "file", "filename": "/p/a.rs"},
            "rendered": [{"content": text}], "renderedRole": "user",
        }));
        assert_eq!(attachment.head().content_bytes, 0, "no message content is stored");
        let carried = carried_bytes(&attachment, &BudgetConfig::default());
        assert!((8_000..8_100).contains(&carried), "{carried}");
    }
}
