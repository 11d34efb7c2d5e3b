//! Which compact boundary of a transcript is the latest in force, followed one line at
//! a time so an index that reads only what was appended keeps it current.
//!
//! A record "stands before the latest compaction" when its offset is below that
//! boundary's: the model of that session no longer sees it (except the few messages a
//! boundary keeps, which the model does see and a search finds all the same). A
//! boundary ctxd's undo took back is not in force; the one before it is again.

use serde::{Deserialize, Serialize};

use super::extract::{Line, What};

/// The compaction facts of one transcript.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Boundaries {
    /// Each compact boundary: its offset and uuid.
    seen: Vec<(u64, Option<String>)>,
    /// Undo records: the boundary uuid each takes back, and the undo's own offset.
    undone: Vec<(String, u64)>,
}

impl Boundaries {
    /// Takes note of the line at `offset`.
    pub fn observe(&mut self, offset: u64, line: &Line) {
        match &line.what {
            What::Boundary => self.seen.push((offset, line.uuid.clone())),
            What::Undo { boundary } => self.undone.push((boundary.clone(), offset)),
            What::Entry(_) | What::Other => {}
        }
    }

    /// Offset of the latest boundary not undone.
    pub fn latest(&self) -> Option<u64> {
        self.seen.iter().rev().find(|(at, uuid)| !self.is_undone(*at, uuid.as_deref())).map(|(at, _)| *at)
    }

    /// Whether the record at `offset` stands before the latest boundary in force.
    pub fn before_latest(&self, offset: u64) -> bool {
        self.latest().is_some_and(|b| offset < b)
    }

    fn is_undone(&self, at: u64, uuid: Option<&str>) -> bool {
        uuid.is_some_and(|u| self.undone.iter().any(|(target, undo_at)| target == u && *undo_at > at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(what: What, uuid: &str) -> Line {
        Line { uuid: Some(uuid.into()), parent: None, timestamp: None, cwd: None, what }
    }

    #[test]
    fn the_latest_boundary_not_undone_is_in_force() {
        let mut b = Boundaries::default();
        assert_eq!(b.latest(), None);
        assert!(!b.before_latest(0), "no boundary: nothing stands before one");
        b.observe(100, &line(What::Boundary, "b1"));
        b.observe(500, &line(What::Boundary, "b2"));
        assert_eq!(b.latest(), Some(500));
        assert!(b.before_latest(499) && !b.before_latest(500) && !b.before_latest(900));
        // ctxd takes b2 back: b1 is in force again.
        b.observe(700, &line(What::Undo { boundary: "b2".into() }, "u"));
        assert_eq!(b.latest(), Some(100));
        assert!(!b.before_latest(499));
        // An undo that names a later boundary than itself undoes nothing.
        let mut early = Boundaries::default();
        early.observe(10, &line(What::Undo { boundary: "b9".into() }, "u"));
        early.observe(20, &line(What::Boundary, "b9"));
        assert_eq!(early.latest(), Some(20));
    }
}
