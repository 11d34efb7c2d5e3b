//! `scrollback` of `ctx/assemble` (with `includeSnipped`): the whole conversation for a
//! client to draw, each message marked with why the model no longer sees it. The core
//! builds it (`ctxd_core::view::scrollback`) in the shape the wire carries, so these are
//! the core's types, defined once.

pub use ctxd_core::view::scrollback::{
    EntryKind, EntryRole, Hidden, ResultChange, ResultMark, Scrollback, ScrollbackEntry, Span,
};
