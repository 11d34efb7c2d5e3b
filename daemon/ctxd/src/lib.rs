//! ctxd: the daemon. Everything that touches the outside world lives here.
//!
//! - [`transport`]: LSP base-protocol framing on stdio, the one read-and-dispatch loop,
//!   the one queue out.
//! - [`server`]: the protocol surface: one table from method to handler (lifecycle and
//!   every `ctx/` method), params decoded once, answers encoded once.
//! - [`wire`]: domain values to protocol types, in one place.
//! - [`session`]: one actor per open session; the registry that routes commands to them.
//! - [`shared`]: one daemon for every editor on a store (a socket, and relays to it).
//! - [`settings`]: settings files, stacked per working directory.
//! - [`setup`]: `ctxd claude setup` (status line and `claude` shell function, undone byte
//!   for byte), `ctxd claude run` and `ctxd claude env`.
//! - [`context`]: the real filesystem for memory files, git facts, the file watcher.
//! - [`store`]: transcripts on disk (the truth) and the rebuildable sled index.
//! - [`provider`]: who writes compaction summaries: Anthropic and OpenAI-compatible
//!   endpoints over HTTP (streaming, retries, typed failures).
//! - [`gateway`]: the HTTP gateway on the Messages API path (`ctxd gateway`): forwards
//!   Claude Code's requests and reads each answer's usage as it passes; its `client`
//!   sees a running gateway from outside (its address, its owner, its live sessions).
//! - [`history`]: the history index (tantivy) over every transcript, for `ctxd mcp`
//!   ([`mcp`]) and `ctx/searchHistory`/`ctx/readHistory`.
//! - [`hooks`]: PreCompact, PostCompact and SessionStart(compact) commands.
//! - [`interop`]: import and export of Claude Code transcripts.
//! - [`live`]: whether Claude Code is running for a session, so its transcript is left alone.
//! - [`replay`], [`client`]: `ctxd replay`, driving a daemon the way an editor would.
//! - [`statusline`]: `ctxd statusline`, Claude Code's status line from the transcript tail.
//! - [`background`]: low-priority threads for compaction's CPU-heavy parts.
//! - [`outside`]: the one bounded, non-blocking reader of files ctxd did not write.
//! - [`process_env`]: the environment, read once by `main` and passed down.
//! - [`logging`]: where logs go.

pub mod background;
pub mod claude;
pub mod client;
#[cfg(test)]
mod code_size;
pub mod context;
pub mod gateway;
pub mod history;
pub mod hooks;
pub mod interop;
pub mod live;
pub mod logging;
pub mod mcp;
pub mod mcp_config;
pub mod outside;
pub mod process_env;
pub mod provider;
pub mod replay;
pub mod server;
pub mod session;
pub mod settings;
pub mod setup;
pub mod shared;
pub mod statusline;
pub mod store;
pub mod transport;
pub mod wire;
