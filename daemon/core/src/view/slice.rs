//! Stage 1: the view starts after the latest compact boundary.
//!
//! Everything before a boundary was summarized; the model sees the summary and what
//! follows it. A boundary may name a preserved segment (records kept verbatim by the
//! compaction, stored before the boundary): those records are put back right after the
//! record the boundary anchors them to (the summary), as the host does on resume.
//!
//! Of those records, the view keeps the active chain ([`chain`](super::chain)): a branch
//! the host rewound away from is left out.

use serde::Deserialize;

use super::Applied;
use super::chain::Chain;
use crate::record::{Kind, Record};

/// Which records make up the view, in view order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slice {
    /// Index of the latest compact boundary.
    pub boundary: Option<usize>,
    /// Index of the first record after the boundary (0 without one).
    pub start: usize,
    /// Record indices in view order: those after the boundary, with the preserved
    /// segment spliced in after its anchor. Records off the active chain are included;
    /// [`Slice::keeps`] tells them apart.
    pub order: Vec<usize>,
    /// The active chain over `order`.
    pub chain: Chain,
    /// How many records of a preserved segment were put back.
    pub preserved: usize,
    /// Why a preserved segment the boundary names could not be put back.
    pub note: Option<&'static str>,
    /// The record the preserved segment follows, when it is not appended yet (the
    /// segment then leads the view until it is).
    pub awaited_anchor: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BoundaryLine {
    #[serde(default)]
    compact_metadata: Option<CompactMetadata>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CompactMetadata {
    #[serde(default)]
    preserved_segment: Option<PreservedSegment>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PreservedSegment {
    head_uuid: String,
    anchor_uuid: String,
    tail_uuid: String,
}

/// Finds the latest boundary and the records of the view.
pub fn slice_after_boundary(records: &[Record]) -> (Slice, Applied) {
    let boundary = records.iter().rposition(Record::is_compact_boundary);
    let start = boundary.map_or(0, |b| b + 1);
    let mut slice = Slice { boundary, start, order: (start..records.len()).collect(), ..Slice::default() };
    if let Some(b) = boundary {
        splice_preserved(records, b, &mut slice);
    }
    slice.chain = Chain::build(records, boundary, &slice.order);
    let applied = slice_applied(&slice);
    (slice, applied)
}

impl Slice {
    /// Record indices of the view, in view order, without the records off the active
    /// chain.
    pub fn kept(&self) -> impl Iterator<Item = usize> + '_ {
        self.order.iter().enumerate().filter(|(p, _)| self.chain.keeps(*p)).map(|(_, &i)| i)
    }
}

/// The stage's report.
pub(crate) fn slice_applied(slice: &Slice) -> Applied {
    let detail = match slice.boundary {
        Some(b) => {
            let mut d = format!("after the boundary at record {b}: {} records", slice.order.len());
            if slice.preserved > 0 {
                d.push_str(&format!(", {} preserved before it", slice.preserved));
            }
            if let Some(note) = slice.note {
                d.push_str("; ");
                d.push_str(note);
            }
            d
        }
        None => format!("no boundary: {} records", slice.order.len()),
    };
    let detail = match slice.chain.left_out() {
        0 => detail,
        n => format!("{detail}; {n} off the active chain left out"),
    };
    Applied { stage: "slice", acted: slice.boundary.is_some(), tokens_freed: 0, detail }
}

fn splice_preserved(records: &[Record], boundary: usize, slice: &mut Slice) {
    let Ok(line) = serde_json::from_str::<BoundaryLine>(records[boundary].line()) else {
        return;
    };
    let Some(segment) = line.compact_metadata.and_then(|m| m.preserved_segment) else {
        return;
    };
    let before = &records[..boundary];
    let head = before.iter().position(|r| r.uuid() == Some(segment.head_uuid.as_str()));
    let tail = before.iter().rposition(|r| r.uuid() == Some(segment.tail_uuid.as_str()));
    let (Some(head), Some(tail)) = (head, tail) else {
        slice.note = Some("its preserved segment is not among the records given");
        return;
    };
    if head > tail {
        slice.note = Some("its preserved segment ends before it starts");
        return;
    }
    // File order between head and tail: a parent-pointer walk would miss parallel tool
    // results, which hang off different tool_use lines.
    let kept: Vec<usize> = (head..=tail)
        .filter(|&i| {
            let h = records[i].head();
            !h.is_sidechain && matches!(h.kind, Kind::User | Kind::Assistant | Kind::Attachment)
        })
        .collect();
    let anchor = match slice.order.iter().position(|&i| records[i].uuid() == Some(segment.anchor_uuid.as_str())) {
        Some(p) => p + 1,
        None => {
            slice.awaited_anchor = Some(segment.anchor_uuid.clone());
            0
        }
    };
    slice.preserved = kept.len();
    slice.order.splice(anchor..anchor, kept);
}
