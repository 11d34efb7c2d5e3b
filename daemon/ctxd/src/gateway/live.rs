//! The live figures of each Claude Code session whose requests pass through the
//! gateway, kept for `GET /ctxd/sessions` and handed to whoever follows the session.
//!
//! One registry per daemon (in `session::Services`): the gateway writes an entry when
//! an answer's last byte has passed, and the follower of an observed transcript
//! (`session::observe`, keyed by the transcript's file stem, which is Claude Code's
//! session id) watches its entry and publishes `ctx/usageChanged` with the exact
//! figures at once, instead of after the program writes its transcript. The registry
//! keeps at most [`MAX_SESSIONS`]; the one answered longest ago goes first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use ctxd_core::record::TokenUsage;
use ctxd_core::tally::Tally;
use ctxd_proto::{GatewaySession, GatewaySessions};
use tokio::sync::watch;

/// Sessions remembered; a gateway that has served more forgets the oldest.
pub const MAX_SESSIONS: usize = 1000;

/// One answer's figures, as followers get them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Live {
    pub figures: GatewaySession,
    /// The answer's `message.id`: the transcript's record of the same answer repeats it.
    pub message_id: Option<String>,
}

impl Live {
    pub fn usage(&self) -> TokenUsage {
        super::client::token_usage(&self.figures)
    }

    /// An answer newer than what the tally has read: its figure becomes the tally's
    /// report (what came before it in the transcript is in it).
    pub fn apply(&self, tally: &mut Tally) {
        tally.reported = self.usage().context_tokens();
        tally.reported_message_id = self.message_id.as_deref().map(Box::from);
        tally.bytes_after = 0;
        tally.freed_since_report = 0;
        tally.reduced_since_report = 0;
        tally.estimated_base = 0;
        tally.base_covers = 0;
    }

    /// After the transcript's records were read: when the last report is this answer's
    /// (its lines may carry a partial output count), the gateway's exact figure holds.
    pub fn reconcile(&self, tally: &mut Tally) {
        if self.message_id.is_some() && tally.reported_message_id.as_deref() == self.message_id.as_deref() {
            tally.reported = self.usage().context_tokens();
        }
    }
}

#[derive(Debug)]
struct Entry {
    /// Messages requests forwarded.
    requests: u64,
    /// The last answer's figures, and everyone following them.
    live: watch::Sender<Option<Arc<Live>>>,
    /// Order of the last change, for eviction.
    touched: u64,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<String, Entry>,
    clock: u64,
}

/// See the module docs. Cheap to clone (one shared registry).
#[derive(Debug, Clone, Default)]
pub struct LiveFigures {
    inner: Arc<Mutex<Inner>>,
}

impl LiveFigures {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every update is a whole insert or field store: a poisoned lock is consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn entry<'a>(inner: &'a mut Inner, session_id: &str) -> &'a mut Entry {
        inner.clock += 1;
        let touched = inner.clock;
        if !inner.sessions.contains_key(session_id) && inner.sessions.len() >= MAX_SESSIONS {
            let oldest = inner.sessions.iter().min_by_key(|(_, e)| e.touched).map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                inner.sessions.remove(&oldest);
            }
        }
        let entry = inner.sessions.entry(session_id.to_owned()).or_insert_with(|| Entry {
            requests: 0,
            live: watch::channel(None).0,
            touched,
        });
        entry.touched = touched;
        entry
    }

    /// A Messages request of the session was forwarded; returns its count so far.
    pub fn request_sent(&self, session_id: &str) -> u64 {
        let mut inner = self.lock();
        let entry = Self::entry(&mut inner, session_id);
        entry.requests += 1;
        entry.requests
    }

    /// An answer of the session was read to its last byte.
    pub fn answered(&self, mut live: Live) {
        let mut inner = self.lock();
        let entry = Self::entry(&mut inner, &live.figures.session_id);
        live.figures.requests = entry.requests.max(1);
        entry.live.send_replace(Some(Arc::new(live)));
    }

    /// Whether a prepared summary covers the session's newest request (see
    /// `prepare::Preparer`): its followers are told when that changes. A session
    /// without an answer has nothing to say it on.
    pub fn set_summary_ready(&self, session_id: &str, ready: bool) {
        let inner = self.lock();
        let Some(entry) = inner.sessions.get(session_id) else { return };
        entry.live.send_if_modified(|current| match current {
            Some(live) if live.figures.summary_ready != ready => {
                let mut changed = Live::clone(live);
                changed.figures.summary_ready = ready;
                *current = Some(Arc::new(changed));
                true
            }
            _ => false,
        });
    }

    /// The session's newest figures, if it has an answer (the registry is not touched).
    pub fn latest(&self, session_id: &str) -> Option<Arc<Live>> {
        self.lock().sessions.get(session_id).and_then(|e| e.live.borrow().clone())
    }

    /// Follows a session's figures (the current ones, if any, are there at once).
    pub fn watch(&self, session_id: &str) -> watch::Receiver<Option<Arc<Live>>> {
        let mut inner = self.lock();
        Self::entry(&mut inner, session_id).live.subscribe()
    }

    /// Every session with an answer, the most recent answer first.
    pub fn snapshot(&self) -> GatewaySessions {
        let inner = self.lock();
        let mut sessions: Vec<(u64, GatewaySession)> = inner
            .sessions
            .values()
            .filter_map(|e| {
                let live = e.live.borrow().clone()?;
                let mut figures = live.figures.clone();
                figures.requests = e.requests.max(figures.requests);
                Some((e.touched, figures))
            })
            .collect();
        sessions.sort_by(|a, b| b.1.answered_at.cmp(&a.1.answered_at).then(b.0.cmp(&a.0)));
        GatewaySessions { sessions: sessions.into_iter().map(|(_, s)| s).collect() }
    }
}

/// The next figures a follower is told of; pending forever when there is no registry
/// or it is gone, so a `select!` arm on it simply never fires.
pub async fn next(live: &mut Option<watch::Receiver<Option<Arc<Live>>>>) -> Arc<Live> {
    loop {
        let Some(rx) = live.as_mut() else { return std::future::pending().await };
        if rx.changed().await.is_err() {
            *live = None;
            continue;
        }
        if let Some(figures) = rx.borrow_and_update().clone() {
            return figures;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(session: &str, input: u64, at: &str) -> Live {
        Live {
            figures: GatewaySession {
                session_id: session.into(),
                model: "m".into(),
                input_tokens: input,
                output_tokens: 5,
                answered_at: at.into(),
                ..GatewaySession::default()
            },
            message_id: Some(format!("msg_{input}")),
        }
    }

    #[test]
    fn counts_requests_keeps_the_last_answer_and_lists_newest_first() {
        let registry = LiveFigures::default();
        registry.request_sent("a");
        registry.request_sent("a");
        registry.answered(live("a", 10, "2026-01-01T00:00:01.000Z"));
        registry.request_sent("b");
        assert_eq!(registry.snapshot().sessions.len(), 1, "b has no answer yet");
        registry.answered(live("b", 20, "2026-01-01T00:00:02.000Z"));
        let listed = registry.snapshot().sessions;
        assert_eq!(listed.iter().map(|s| s.session_id.as_str()).collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!((listed[1].requests, listed[1].input_tokens), (2, 10));
    }

    #[test]
    fn a_follower_gets_each_answer_and_the_registry_stays_bounded() {
        let registry = LiveFigures::default();
        let mut rx = Some(registry.watch("a"));
        registry.answered(live("a", 10, "t1"));
        let got = futures::executor::block_on(next(&mut rx));
        assert_eq!(got.figures.input_tokens, 10);
        for n in 0..(MAX_SESSIONS + 10) {
            registry.answered(live(&format!("s{n}"), 1, "t"));
        }
        assert_eq!(registry.lock().sessions.len(), MAX_SESSIONS);
    }

    #[test]
    fn a_ready_summary_is_told_to_followers_once_and_a_new_answer_clears_it() {
        let registry = LiveFigures::default();
        registry.set_summary_ready("a", true);
        assert!(registry.snapshot().sessions.is_empty(), "no answer, nothing to say it on");
        let mut rx = Some(registry.watch("a"));
        registry.answered(live("a", 10, "t1"));
        assert!(!futures::executor::block_on(next(&mut rx)).figures.summary_ready);
        registry.set_summary_ready("a", true);
        let got = futures::executor::block_on(next(&mut rx));
        assert!(got.figures.summary_ready && got.figures.input_tokens == 10);
        assert!(registry.snapshot().sessions[0].summary_ready);
        registry.set_summary_ready("a", true);
        assert!(!rx.as_mut().unwrap().has_changed().unwrap(), "unchanged: no wake-up");
        registry.answered(live("a", 20, "t2"));
        assert!(!futures::executor::block_on(next(&mut rx)).figures.summary_ready);
        registry.set_summary_ready("a", true);
        registry.set_summary_ready("a", false);
        assert!(!registry.snapshot().sessions[0].summary_ready);
    }

    #[test]
    fn the_tally_takes_the_gateways_figure_for_the_same_answer_only() {
        let figures = live("a", 1000, "t");
        let mut tally = Tally { reported: 50, bytes_after: 4096, ..Tally::default() };
        figures.apply(&mut tally);
        assert_eq!((tally.reported, tally.bytes_after), (1005, 0));
        tally.reported = 1001;
        figures.reconcile(&mut tally);
        assert_eq!(tally.reported, 1005, "the transcript's line of the same answer");
        tally.reported_message_id = Some("msg_other".into());
        tally.reported = 2000;
        figures.reconcile(&mut tally);
        assert_eq!(tally.reported, 2000, "a later answer stands");
    }
}
