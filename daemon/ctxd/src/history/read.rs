//! `read_history`: one record's full text and its neighbours on the session's chain,
//! read from the transcript itself (the index is not needed, nor trusted, for it).
//!
//! The file is streamed once through the bounded reader, keeping per line only its
//! offset and hashed links (24 bytes a record), then the few records shown are read
//! again at their offsets. Backwards the chain is the parent links (a compact boundary
//! continues from the record before the compaction); forwards, the child written last
//! (a host that rewound continues on its newest branch). Records without text (progress,
//! bookkeeping) are walked through, not shown. The text shown is bounded in all: the
//! record asked for first, then its neighbours nearest first, each cut with a note.

use std::collections::HashMap;

use ctxd_core::ledger::fnv1a;
use ctxd_core::recall::{self, Boundaries, Role, What};

use super::lines::{Item, Lines, line_at};
use super::{HistoryError, LINE_CAP, MAX_INDEXED_TEXT, Source};

/// One record shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRecord {
    pub uuid: String,
    pub timestamp: Option<String>,
    pub role: Role,
    pub text: String,
    /// The record asked for.
    pub target: bool,
    pub before_compaction: bool,
}

/// The records shown, in chain order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub records: Vec<ReadRecord>,
    /// What was cut to stay within the budget.
    pub truncated: Option<String>,
}

/// A line's place and links.
struct Node {
    offset: u64,
    uuid: u64,
    parent: Option<u64>,
    has_text: bool,
}

/// Characters of the budget kept for each neighbour while the record asked for is cut.
const NEIGHBOUR_RESERVE: usize = 500;

/// Links are followed at most this far (a damaged file could loop).
const MAX_WALK: usize = 100_000;

pub fn read(source: &Source, uuid: &str, before: usize, after: usize, max_chars: usize) -> Result<Read, HistoryError> {
    let io = |e: std::io::Error| HistoryError::Io { path: source.path.clone(), source: e };
    let (file, len) = crate::outside::open_regular(&source.path).map_err(|e| io(e.into()))?;
    let mut nodes: Vec<Node> = Vec::new();
    let mut by_uuid: HashMap<u64, usize> = HashMap::new();
    let mut boundaries = Boundaries::default();
    let mut lines = Lines::from_file(file.try_clone().map_err(io)?, 0, len, LINE_CAP).map_err(io)?;
    while let Some(item) = lines.next_item().map_err(io)? {
        let Item::Line { offset, bytes } = item else { continue };
        // Text is not kept here: a zero cap still says whether a record has any.
        let Some(line) = std::str::from_utf8(bytes).ok().and_then(|t| recall::extract(t, 0)) else { continue };
        boundaries.observe(offset, &line);
        let Some(id) = line.uuid.as_deref() else { continue };
        let key = fnv1a(id.as_bytes());
        by_uuid.insert(key, nodes.len());
        nodes.push(Node {
            offset,
            uuid: key,
            parent: line.parent.as_deref().map(|p| fnv1a(p.as_bytes())),
            has_text: matches!(line.what, What::Entry(_)),
        });
    }
    let target = *by_uuid
        .get(&fnv1a(uuid.as_bytes()))
        .ok_or_else(|| HistoryError::NotFound(format!("no record {uuid} in {}", source.path.display())))?;
    if !nodes[target].has_text {
        return Err(HistoryError::NotFound(format!("record {uuid} has no text to read")));
    }
    // Backwards along the parents.
    let mut earlier = Vec::new();
    let mut at = target;
    for _ in 0..MAX_WALK {
        if earlier.len() == before {
            break;
        }
        let Some(&parent) = nodes[at].parent.as_ref().and_then(|p| by_uuid.get(p)) else { break };
        if parent == at {
            break;
        }
        at = parent;
        if nodes[at].has_text {
            earlier.push(at);
        }
    }
    // Forwards along the last child of each.
    let mut later = Vec::new();
    let mut at = target;
    let mut steps = 0;
    while later.len() < after && steps < MAX_WALK {
        let me = nodes[at].uuid;
        let Some(child) = (at + 1..nodes.len()).rev().find(|&i| nodes[i].parent == Some(me)) else { break };
        at = child;
        steps += 1;
        if nodes[at].has_text {
            later.push(at);
        }
    }
    // The budget: the target first, then the nearest neighbours.
    let mut order = vec![target];
    for i in 0..earlier.len().max(later.len()) {
        order.extend(earlier.get(i));
        order.extend(later.get(i));
    }
    // The neighbours keep a little of the budget (most are a line or two: the call
    // before a result, the reply after it), at most half.
    let reserve = (NEIGHBOUR_RESERVE * (order.len() - 1)).min(max_chars / 2);
    let mut left = max_chars;
    let mut shown: HashMap<usize, ReadRecord> = HashMap::new();
    let mut cuts: Vec<String> = Vec::new();
    for &i in &order {
        let allowance = if i == target { max_chars - reserve } else { left };
        let node = &nodes[i];
        let Some(bytes) = line_at(&file, node.offset, LINE_CAP).map_err(io)? else { continue };
        let Some(line) = std::str::from_utf8(&bytes).ok().and_then(|t| recall::extract(t, MAX_INDEXED_TEXT * 4)) else {
            continue;
        };
        let (What::Entry(entry), Some(id)) = (line.what, line.uuid) else { continue };
        let total = entry.text.chars().count();
        if allowance == 0 {
            cuts.push(format!("{id}: not shown ({total} characters)"));
            continue;
        }
        let text: String = entry.text.chars().take(allowance).collect();
        let kept = text.chars().count();
        left -= kept;
        if kept < total || entry.cut {
            cuts.push(format!("{id}: {kept} of {}{} characters shown", total, if entry.cut { "+" } else { "" }));
        }
        shown.insert(
            i,
            ReadRecord {
                uuid: id,
                timestamp: line.timestamp,
                role: entry.role,
                text,
                target: i == target,
                before_compaction: boundaries.before_latest(node.offset),
            },
        );
    }
    let mut chain: Vec<usize> = earlier.into_iter().rev().chain([target]).chain(later).collect();
    chain.retain(|i| shown.contains_key(i));
    let records = chain.into_iter().filter_map(|i| shown.remove(&i)).collect();
    let truncated = (!cuts.is_empty()).then(|| {
        format!(
            "text cut to stay within {max_chars} characters ({}); ask again with fewer neighbours or a larger maxChars",
            cuts.join("; ")
        )
    });
    Ok(Read { records, truncated })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Origin;

    fn source(dir: &std::path::Path, lines: &[String]) -> Source {
        let path = dir.join("s.jsonl");
        std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
        Source { key: "store/s".into(), path, session: "s".into(), origin: Origin::Store, project: None }
    }

    fn user(uuid: &str, parent: Option<&str>, text: &str) -> String {
        serde_json::json!({"type": "user", "uuid": uuid, "parentUuid": parent, "message": {"content": text}})
            .to_string()
    }

    #[test]
    fn neighbours_follow_the_chain_through_records_without_text_and_a_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let lines = vec![
            user("a", None, "first"),
            serde_json::json!({"type": "progress", "uuid": "p", "parentUuid": "a"}).to_string(),
            user("b", Some("p"), "second"),
            // A branch the host rewound away from: b's older child.
            user("old", Some("b"), "abandoned"),
            user("c", Some("b"), "third"),
            serde_json::json!({"type": "system", "subtype": "compact_boundary", "uuid": "k", "parentUuid": null, "logicalParentUuid": "c"}).to_string(),
            user("d", Some("k"), "after the compaction"),
        ];
        let s = source(dir.path(), &lines);
        let read = read(&s, "b", 5, 5, 10_000).unwrap();
        let shown: Vec<(&str, bool, bool)> =
            read.records.iter().map(|r| (r.uuid.as_str(), r.target, r.before_compaction)).collect();
        assert_eq!(shown, [("a", false, true), ("b", true, true), ("c", false, true), ("d", false, false)]);
        assert_eq!(read.truncated, None);
        assert!(matches!(super::read(&s, "zzz", 0, 0, 100), Err(HistoryError::NotFound(_))));
        assert!(matches!(super::read(&s, "p", 0, 0, 100), Err(HistoryError::NotFound(_))), "no text");
    }

    #[test]
    fn the_budget_goes_to_the_record_asked_for_first_with_room_kept_for_neighbours() {
        let dir = tempfile::tempdir().unwrap();
        let long = "x".repeat(500);
        let s = source(dir.path(), &[user("a", None, "neighbour text"), user("b", Some("a"), &long)]);
        // No neighbour asked for: the whole budget is the record's.
        let alone = read(&s, "b", 0, 0, 100).unwrap();
        assert_eq!(alone.records[0].text, "x".repeat(100));
        assert!(alone.truncated.unwrap().contains("b: 100 of 500 characters shown"));
        // One neighbour: half the budget at most is kept for it.
        let both = read(&s, "b", 1, 0, 100).unwrap();
        let texts: Vec<&str> = both.records.iter().map(|r| r.text.as_str()).collect();
        assert_eq!(texts, ["neighbour text", &"x".repeat(50)]);
        assert!(both.truncated.unwrap().contains("b: 50 of 500 characters shown"));
    }
}
