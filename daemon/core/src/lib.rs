//! ctxd-core: the pure domain of ctxd.
//!
//! Everything here is synchronous and does no I/O: no tokio, no filesystem, no network,
//! no LSP. Functions take plain data and return plain data plus a report of what they
//! did, so they are tested without a runtime, a disk or a network, and the daemon
//! (`ctxd`) owns every side effect.
//!
//! - [`admit`]: what ctxd accepts from outside (strict JSON, none of its own records).
//! - [`budget`]: windows, thresholds and levels (what "full" means for a model).
//! - [`cache_state`]: a session's prompt cache (warm, time left, what a cold turn
//!   re-writes and its estimated price from the dated table `prices.json`).
//! - [`compact`]: the compaction planner: summary prompts and requests (fork and
//!   fallback), reply reading, prompt-too-long cuts, fidelity check, restoration,
//!   post-compact records, undo, guards and the reduction ladder.
//! - [`gateway`]: the gateway's decisions: routing a request, reading the session,
//!   cache lifetime and usage from bodies as they stream past.
//! - [`ledger`]: the file-read ledger (what the agent read, and whether it changed).
//! - [`memory`]: which memory files (CLAUDE.md and friends) a session loads, over an
//!   injected filesystem, and the user-context text they render to.
//! - [`observed`]: the count of a transcript another program writes (`ctx/observe`).
//! - [`recall`]: what the history search reads from a transcript line (text, role,
//!   boundaries), its snippets and the final order of its hits.
//! - [`record`]: one transcript line, its exact text and the fields ctxd decides on.
//! - [`summary`]: the offline summarizer (nine sections from the transcript itself) and
//!   the parser for a model's `<summary>` reply.
//! - [`view`]: the request pipeline: from records to a provider-valid request body,
//!   stage by stage (slice, budget, snip, microcompact, collapse, check, place, normalize,
//!   cache breakpoints), incrementally.
//! - [`tally`]: the running token count of a session (reported usage plus estimate).

pub mod admit;
pub mod breakdown;
pub mod budget;
pub mod cache_state;
pub mod claude;
pub mod compact;
pub mod gateway;
pub mod invoked;
pub mod ledger;
pub mod memory;
pub mod observed;
pub mod preserved;
pub mod recall;
pub mod record;
pub mod summary;
pub mod tally;
pub mod view;
