//! ctxd: the daemon. Everything that touches the outside world lives here.
//!
//! - [`transport`]: LSP base-protocol framing on stdio and the request loop.
//! - [`store`]: transcripts on disk (the truth) and the rebuildable sled index.
//! - [`paths`], [`logging`]: where state and logs go.

pub mod logging;
pub mod paths;
pub mod store;
pub mod transport;
