//! Base context I/O: what the pure context builders in `ctxd_core` need from the
//! outside world, kept apart from the session actors that use it.
//!
//! - [`base`]: a session's memoized base context (memory files, git), shared per directory.
//! - [`fs`]: the real disk behind `ctxd_core::memory::MemoryFs`, with counters that show
//!   when a memoized context was served without touching the disk.
//! - [`git`]: git facts for the system context, captured once at session start.
//! - [`watcher`]: one daemon-wide filesystem watcher that tells each session which of
//!   its memory files and read files changed, so contexts are rebuilt only on change.

pub mod base;
pub mod fs;
pub mod git;
pub mod watcher;
