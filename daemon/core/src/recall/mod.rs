//! Recall: what the history search needs to know about transcripts, without any I/O.
//!
//! After a compaction the model no longer sees what came before the boundary, but the
//! transcript still holds it. The daemon indexes those records (`ctxd::history`, over
//! tantivy) and answers searches for agents (`ctxd mcp`) and hosts
//! (`ctx/searchHistory`, `ctx/readHistory`); the decisions that do not depend on the
//! disk or the search library live here:
//!
//! - [`extract`]: what one transcript line contributes: its searchable text and role, a
//!   compact boundary, an undo of one, or nothing.
//! - [`boundary`]: which boundary is the session's latest in force, followed line by
//!   line, so "stands before the latest compaction" is a comparison of offsets.
//! - [`snippet`]: the bounded piece of a record's text shown with a hit.
//! - [`rank`]: the final order of hits (roles that restate earlier text weigh less, one
//!   hit per record across sessions that copied it).

pub mod boundary;
pub mod extract;
pub mod rank;
pub mod snippet;

pub use boundary::Boundaries;
pub use extract::{Entry, Line, Role, What, extract};
pub use rank::{Candidate, rerank};
pub use snippet::{query_terms, snippet};
