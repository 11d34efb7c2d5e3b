//! Stage 1: the view starts after the latest compact boundary.
//!
//! Everything before a boundary was summarized; the model sees the summary and what
//! follows it. A boundary may name a preserved segment (records kept verbatim by the
//! compaction, stored before the boundary): those records are put back right after the
//! record the boundary anchors them to (the summary), as the host does on resume.
//!
//! Of those records, the view keeps the active chain ([`chain`](super::chain)): a branch
//! the host rewound away from is left out.

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

    /// Record indices of the view, in view order, that are on the active chain or hang
    /// off it (bookkeeping of an abandoned branch left out too): what a summary covers.
    pub fn on_chain(&self) -> impl Iterator<Item = usize> + '_ {
        self.order.iter().enumerate().filter(|(p, _)| self.chain.on_chain(*p)).map(|(_, &i)| i)
    }

    /// Ends the active chain where Claude Code resumes the conversation: at its newest
    /// main-chain user or assistant record, walked up through `parentUuid`. The view's
    /// own rule (the newest record linked to an earlier one) agrees, except when a later
    /// record hangs off an older branch; the program resumes from its newest message.
    pub fn end_at_newest_message(&mut self, records: &[Record]) {
        let newest = self.order.iter().rev().map(|&i| &records[i]).find(|r| {
            let head = r.head();
            !head.is_sidechain && matches!(head.kind, Kind::User | Kind::Assistant) && head.uuid.is_some()
        });
        if let Some(uuid) = newest.and_then(Record::uuid) {
            self.chain.run_through(records, uuid);
        }
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
    Applied { stage: super::Stage::Slice, acted: slice.boundary.is_some(), tokens_freed: 0, detail }
}

fn splice_preserved(records: &[Record], boundary: usize, slice: &mut Slice) {
    let found = crate::preserved::preserved(&records[boundary], &records[..boundary]);
    slice.note = found.note;
    if found.kept.is_empty() {
        return;
    }
    let anchor = found.anchor.as_deref();
    let at = match anchor.and_then(|a| slice.order.iter().position(|&i| records[i].uuid() == Some(a))) {
        Some(p) => p + 1,
        None => {
            slice.awaited_anchor = found.anchor.clone();
            0
        }
    };
    slice.preserved = found.kept.len();
    slice.order.splice(at..at, found.kept);
}
