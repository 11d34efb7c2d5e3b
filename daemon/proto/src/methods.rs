//! Every `ctx/` method as a type, listed once.
//!
//! A request is a unit type implementing [`Request`] (its method name, params and
//! result types) and a notification one implementing [`Notification`], as `lsp-types`
//! does for the LSP's own methods. The one [`protocol!`] list below defines them all;
//! from it come the method names the daemon announces ([`REQUESTS`],
//! [`NOTIFICATIONS`]), the schema files of `schemas/` (through [`each_method`]) and
//! the daemon's dispatch table, which pairs each type with a handler whose params and
//! result must be the type's.

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A `ctx/` request: its method name and the types of its params and result.
pub trait Request {
    const METHOD: &'static str;
    type Params: Serialize + DeserializeOwned + JsonSchema;
    /// `()` for a request answered with `null`.
    type Result: Serialize + DeserializeOwned + JsonSchema;
}

/// A notification ctxd sends: its method name and the type of its params.
pub trait Notification {
    const METHOD: &'static str;
    type Params: Serialize + DeserializeOwned + JsonSchema;
}

/// Something that walks every method of the protocol ([`each_method`]), each with the
/// sentences its definition documents it by.
pub trait Methods {
    fn request<R: Request>(&mut self, doc: &'static str);
    fn notification<N: Notification>(&mut self, doc: &'static str);
}

/// Defines each method's type once, and the lists derived from them.
macro_rules! protocol {
    (
        requests { $( $(#[doc = $rdoc:literal])* $req:ident = $rmethod:literal, $rparams:ty => $rresult:ty; )* }
        notifications { $( $(#[doc = $ndoc:literal])* $note:ident = $nmethod:literal, $nparams:ty; )* }
    ) => {
        /// The `ctx/` requests ctxd answers, one type each.
        pub mod request {
            #[allow(unused_imports)]
            use crate::*;
            $(
                $(#[doc = $rdoc])*
                #[derive(Debug)]
                pub enum $req {}

                impl crate::Request for $req {
                    const METHOD: &'static str = $rmethod;
                    type Params = $rparams;
                    type Result = $rresult;
                }
            )*
        }

        /// The `ctx/` notifications ctxd sends, one type each.
        pub mod notification {
            #[allow(unused_imports)]
            use crate::*;
            $(
                $(#[doc = $ndoc])*
                #[derive(Debug)]
                pub enum $note {}

                impl crate::Notification for $note {
                    const METHOD: &'static str = $nmethod;
                    type Params = $nparams;
                }
            )*
        }

        /// Every `ctx/` request method this build of ctxd answers, as announced in
        /// `initialize` under `capabilities.experimental.ctxd.methods`.
        pub const REQUESTS: &[&str] = &[$(<request::$req as Request>::METHOD),*];

        /// Every `ctx/` notification this build of ctxd sends.
        pub const NOTIFICATIONS: &[&str] = &[$(<notification::$note as Notification>::METHOD),*];

        /// Calls `methods` once per method, requests first, in the order listed.
        pub fn each_method(methods: &mut impl Methods) {
            $( methods.request::<request::$req>(concat!($($rdoc, "\n"),*)); )*
            $( methods.notification::<notification::$note>(concat!($($ndoc, "\n"),*)); )*
        }
    };
}

protocol! {
    requests {
        /// Opens (or resumes) a session. The daemon also pushes `ctx/usageChanged` for it,
        /// which may arrive before this answer. A session in the store that is not open
        /// (after a daemon restart or `ctx/closeSession`) is resumed on its first use by
        /// id anyway; only an id the store never had gives -33001.
        OpenSession = "ctx/openSession", OpenSessionParams => OpenSessionResult;
        /// Appends records to a session's transcript; answered once they are on disk.
        Append = "ctx/append", AppendParams => AppendResult;
        /// The session's usage.
        Usage = "ctx/usage", SessionParams => UsageResult;
        /// Closes the session (its transcript stays in the store).
        CloseSession = "ctx/closeSession", SessionParams => ();
        /// Saves the window for a model (`"auto"` clears it); the model's open sessions
        /// take it at once and push `ctx/usageChanged`. A window that is neither a count
        /// nor `"auto"` is error -32602.
        SetAutoCompactWindow = "ctx/setAutoCompactWindow", SetAutoCompactWindowParams => SetAutoCompactWindowResult;
        /// The agent read a file by some means ctxd does not see in the transcript.
        FileRead = "ctx/fileRead", FileReadParams => FileReadResult;
        /// What the model sees, by source.
        Context = "ctx/context", SessionParams => ContextResult;
        /// Compacts a session now; answered once the compaction is installed. The daemon
        /// also sends `ctx/compacted` and pushes the new usage. Sent while one runs, it
        /// waits for it (`origin: joined`) or runs next (`queued`). Errors: -33009 (the
        /// compaction failed, e.g. nothing to compact; nothing was installed).
        Compact = "ctx/compact", CompactParams => CompactResult;
        /// The host's model request failed: ctxd compacts (trigger `reactive`) when the
        /// refusal is one compaction answers (prompt too long, long-context credits).
        ReportProviderError = "ctx/reportProviderError", ReportProviderErrorParams => ReportProviderErrorResult;
        /// Closes the session and starts a new, empty one in its place (like `/clear`).
        Clear = "ctx/clear", SessionParams => ClearResult;
        /// Builds the session's next model request.
        Assemble = "ctx/assemble", AssembleParams => AssembleResult;
        /// Removes records from the model's view; tool pairs and tool references are
        /// protected.
        Snip = "ctx/snip", SnipParams => SnipResult;
        /// Replaces the span `from`..`to` with a summary in what the model sees.
        Collapse = "ctx/collapse", CollapseParams => CollapseResult;
        /// Follows a running Claude Code session's transcript and publishes its usage.
        Observe = "ctx/observe", ObserveParams => ObserveResult;
        /// A skill ran and the model was given `content` (restored after a compaction).
        SkillInvoked = "ctx/skillInvoked", SkillInvokedParams => UsageResult;
        /// The session's plan file, read again from disk after a compaction (null
        /// forgets it).
        SetPlan = "ctx/setPlan", SetPlanParams => UsageResult;
        /// Takes back the session's latest compaction: the model sees the conversation it
        /// replaced again (the transcript keeps both and gains an undo record). Errors:
        /// -33010 (`data` is a `CannotUndoData`; nothing was appended), -33008 (a
        /// compaction of the session is running).
        UndoCompact = "ctx/undoCompact", UndoCompactParams => UndoCompactResult;
        /// Compacts a Claude Code transcript in place, in the program's own record shapes.
        ClaudeCompact = "ctx/claudeCompact", ClaudeSessionParams => ClaudeCompactResult;
        /// Takes ctxd's last compaction of a Claude Code transcript back, byte for byte.
        ClaudeUndo = "ctx/claudeUndo", ClaudeSessionParams => ClaudeUndoResult;
        /// Searches a session's history (its compacted past included), or every session
        /// of a project.
        SearchHistory = "ctx/searchHistory", SearchHistoryParams => SearchHistoryResult;
        /// One record of a session's history in full, with its neighbours on the chain.
        ReadHistory = "ctx/readHistory", ReadHistoryParams => ReadHistoryResult;
    }
    notifications {
        /// A session's usage changed.
        UsageChanged = "ctx/usageChanged", UsageChangedNotification;
        /// Memory files or files the agent read changed on disk; `ctx/context` has the
        /// new state.
        ContextChanged = "ctx/contextChanged", ContextChangedNotification;
        /// A compaction of the session was installed.
        Compacted = "ctx/compacted", CompactedNotification;
        /// An automatic compaction failed, or automatic compaction stopped (circuit
        /// breaker).
        CompactFailed = "ctx/compactFailed", CompactFailedNotification;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_is_named_once_under_ctx() {
        let mut all: Vec<&str> = REQUESTS.iter().chain(NOTIFICATIONS).copied().collect();
        assert!(all.iter().all(|m| m.starts_with("ctx/")), "{all:?}");
        let count = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), count, "a method name is listed twice");
    }
}
