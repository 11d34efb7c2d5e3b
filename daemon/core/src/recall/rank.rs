//! The final order of search hits, on top of the index's text score (BM25).
//!
//! The text score alone ranks a compaction's summary, which restates everything in a
//! few words, and the host's attachments, which repeat files already read, alongside
//! the originals; after a compaction the model has the summary already and wants the
//! original. So restating roles weigh less, a prompt the user wrote weighs a little
//! more, the session asked about first, the newer record first on a tie, and a record
//! copied into another session (a resumed or forked Claude Code session keeps its
//! uuids) is one hit.

use std::collections::HashSet;

use super::extract::Role;

/// A hit as the index scored it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate<T> {
    /// The index's text score.
    pub score: f32,
    pub role: Role,
    pub uuid: String,
    /// Larger is newer (a timestamp's milliseconds, or an offset within one file).
    pub recency: i64,
    /// In the session the search was asked about (when it spans several).
    pub preferred: bool,
    pub item: T,
}

/// How much a role's text score counts.
pub fn role_weight(role: Role) -> f32 {
    match role {
        Role::User => 1.2,
        Role::Assistant => 1.0,
        Role::ToolResult => 0.9,
        Role::Attachment => 0.7,
        Role::Summary | Role::Meta => 0.5,
    }
}

/// Weighs, orders and deduplicates `candidates`; at most `limit` come back.
pub fn rerank<T>(candidates: Vec<Candidate<T>>, limit: usize) -> Vec<Candidate<T>> {
    let weighted = |c: &Candidate<T>| c.score * role_weight(c.role) * if c.preferred { 1.1 } else { 1.0 };
    let mut scored: Vec<(f32, Candidate<T>)> = candidates.into_iter().map(|c| (weighted(&c), c)).collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.recency.cmp(&a.1.recency)));
    let mut seen = HashSet::new();
    scored.into_iter().map(|(_, c)| c).filter(|c| seen.insert(c.uuid.clone())).take(limit).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(score: f32, role: Role, uuid: &str, recency: i64) -> Candidate<&'static str> {
        Candidate { score, role, uuid: uuid.into(), recency, preferred: false, item: "" }
    }

    fn order<T>(hits: &[Candidate<T>]) -> Vec<&str> {
        hits.iter().map(|h| h.uuid.as_str()).collect()
    }

    #[test]
    fn originals_outrank_the_summary_that_restates_them() {
        let hits = rerank(vec![c(10.0, Role::Summary, "s", 9), c(6.0, Role::Assistant, "a", 1)], 10);
        assert_eq!(order(&hits), ["a", "s"]);
        // A much better match still wins whatever its role.
        let hits = rerank(vec![c(30.0, Role::Summary, "s", 9), c(6.0, Role::Assistant, "a", 1)], 10);
        assert_eq!(order(&hits), ["s", "a"]);
    }

    #[test]
    fn ties_go_to_the_newer_record_and_copies_are_one_hit() {
        let mut preferred = c(5.0, Role::User, "x", 1);
        preferred.preferred = true;
        let hits = rerank(
            vec![c(5.0, Role::User, "old", 1), c(5.0, Role::User, "new", 2), c(5.0, Role::User, "x", 3), preferred],
            10,
        );
        assert_eq!(order(&hits), ["x", "new", "old"]);
        assert!(hits[0].preferred, "the copy in the session asked about is the one kept");
        assert_eq!(rerank(vec![c(1.0, Role::User, "a", 0), c(2.0, Role::User, "b", 0)], 1).len(), 1);
    }
}
