//! ctxd-core: the pure domain of ctxd.
//!
//! Everything here is synchronous and does no I/O: no tokio, no filesystem, no network,
//! no LSP. Functions take plain data and return plain data plus a report of what they
//! did, so they are tested without a runtime, a disk or a network, and the daemon
//! (`ctxd`) owns every side effect.
//!
//! - [`record`]: one transcript line, its exact text and the fields ctxd decides on.
//! - [`tally`]: the running token count of a session (reported usage plus estimate).

pub mod record;
pub mod tally;
