//! Preparing live sessions' summaries in the background, so that Claude Code's next
//! compaction can be answered at once ([`super::instant`]).
//!
//! For each session the gateway keeps the newest ordinary Messages request it forwarded
//! (body, the headers it went with, its path) and counts the session's requests in
//! flight. Once a second the [`Preparer`] asks the core's policy
//! (`ctxd_core::gateway::prepare::decide`) about each session with a kept request, using
//! the figures of its newest answer (`LiveFigures`), and for a session that is due it
//! sends the fork of that request (`ctxd_core::gateway::fork`) to the upstream with the
//! same headers, so the upstream reads the session's prompt cache and bills the same
//! account the session does. The reply, checked for fidelity, becomes the session's
//! [`Prepared`] record, in memory and on disk ([`PreparedStore`]). What each fork cost
//! and what each instant answer saved go to the session's cost ledger ([`CostLedger`]).
//!
//! Memory: kept request bodies are at most [`MAX_KEPT_BYTES`] together (the least
//! recently used session's body is dropped first, and a body alone past it is not
//! kept), sessions at most [`MAX_SESSIONS`], a preparation's answer is read up to
//! [`MAX_REPLY_BYTES`]. Headers are kept in memory only, never written anywhere.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ctxd_core::gateway::conversation::{PrefixHash, read};
use ctxd_core::gateway::costs::{CompactionFacts, CostEntry, CostKind, estimate_compaction_call, usage_cost_usd};
use ctxd_core::gateway::prepare::{NotPrepared, PrepareDecision, PrepareSettings, SessionNow, decide, threshold};
use ctxd_core::gateway::{AnswerKind, fork, instant};
use hyper::header::{self, HeaderMap};

use super::Gateway;
use super::costs::CostLedger;
use super::live::LiveFigures;
use super::prepared::{Cover, Prepared, PreparedStore};

/// Request bodies kept for forks, all sessions together.
pub const MAX_KEPT_BYTES: usize = 256 << 20;
/// Sessions tracked; past it the least recently used is forgotten.
pub const MAX_SESSIONS: usize = 1000;
/// The most of a preparation's answer read.
pub const MAX_REPLY_BYTES: usize = 4 << 20;
/// How often sessions are looked at.
const TICK: Duration = Duration::from_secs(1);

/// The newest ordinary request of a session, as it was forwarded.
#[derive(Debug, Clone)]
pub struct Newest {
    pub body: Bytes,
    pub headers: HeaderMap,
    pub target: String,
    /// The request's model: the fork is sent with it and priced by it.
    pub model: String,
}

#[derive(Debug, Default)]
struct Slot {
    newest: Option<Newest>,
    in_flight: u32,
    answered_at: Option<Instant>,
    /// When a preparation's fork last got its answer (it read the cache, which keeps it
    /// warm as an answer of the session does).
    forked_at: Option<Instant>,
    /// The log said the model has no price (once per session and process).
    said_unpriced: bool,
    preparing: bool,
    prepared: Option<Arc<Prepared>>,
    /// What identifies the kept request's whole conversation, once a preparation has
    /// read it (cleared when another request is kept): a summary covering it exactly
    /// is ready for the session's `/compact`.
    newest_cover: Option<Cover>,
    /// The disk was asked for a record (once per process).
    looked_on_disk: bool,
    /// Context tokens at the last preparation tried (done or failed).
    tried_at_tokens: Option<u64>,
    touched: u64,
}

#[derive(Debug)]
struct Inner {
    slots: HashMap<String, Slot>,
    kept_bytes: usize,
    /// [`MAX_KEPT_BYTES`] but in tests.
    max_kept_bytes: usize,
    clock: u64,
}

impl Default for Inner {
    fn default() -> Inner {
        Inner { slots: HashMap::new(), kept_bytes: 0, max_kept_bytes: MAX_KEPT_BYTES, clock: 0 }
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Preparer {
    settings: PrepareSettings,
    store: Option<PreparedStore>,
    costs: Option<CostLedger>,
    live: LiveFigures,
    inner: Arc<Mutex<Inner>>,
    /// Counts preparations ended (done or failed): what a held compaction waits on.
    ended: tokio::sync::watch::Sender<u64>,
}

/// A request of a session in flight; dropped when its answer has passed (or failed).
#[derive(Debug)]
pub struct InFlight {
    inner: Arc<Mutex<Inner>>,
    session: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = inner.slots.get_mut(&self.session) {
            slot.in_flight = slot.in_flight.saturating_sub(1);
            slot.answered_at = Some(Instant::now());
        }
    }
}

impl Inner {
    fn slot(&mut self, session: &str) -> &mut Slot {
        self.clock += 1;
        let touched = self.clock;
        if !self.slots.contains_key(session) && self.slots.len() >= MAX_SESSIONS {
            let oldest = self.slots.iter().min_by_key(|(_, s)| s.touched).map(|(k, _)| k.clone());
            if let Some(slot) = oldest.and_then(|k| self.slots.remove(&k)) {
                self.kept_bytes -= slot.newest.map_or(0, |n| n.body.len());
            }
        }
        let slot = self.slots.entry(session.to_owned()).or_default();
        slot.touched = touched;
        slot
    }

    /// Drops the least recently used kept bodies until `more` bytes fit.
    fn make_room(&mut self, more: usize) {
        while self.kept_bytes + more > self.max_kept_bytes {
            let oldest = self
                .slots
                .iter()
                .filter(|(_, s)| s.newest.is_some())
                .min_by_key(|(_, s)| s.touched)
                .map(|(k, _)| k.clone());
            let Some(key) = oldest else { return };
            if let Some(newest) = self.slots.get_mut(&key).and_then(|s| s.newest.take()) {
                self.kept_bytes -= newest.body.len();
                tracing::debug!(session = %key, "gateway: a kept request dropped for room; that session is not prepared");
            }
        }
    }
}

impl Preparer {
    pub fn new(
        settings: PrepareSettings,
        store: Option<PreparedStore>,
        costs: Option<CostLedger>,
        live: LiveFigures,
    ) -> Preparer {
        Preparer { settings, store, costs, live, inner: Arc::default(), ended: tokio::sync::watch::Sender::new(0) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A Messages request of `session` goes upstream; `newest` when it is a turn of the
    /// agent's loop whose body may be forked later (it replaces the one kept; other
    /// requests leave it).
    pub fn sent(&self, session: &str, newest: Option<Newest>) -> InFlight {
        let mut inner = self.lock();
        let mut unready = false;
        if let Some(newest) = newest {
            let size = newest.body.len();
            let slot = inner.slot(session);
            let old = slot.newest.take();
            // The same bytes again (a retry) are the same conversation.
            if old.as_ref().is_none_or(|old| old.body != newest.body) {
                unready = slot.newest_cover.take().is_some();
            }
            inner.kept_bytes -= old.map_or(0, |n| n.body.len());
            if size <= inner.max_kept_bytes {
                inner.make_room(size);
                inner.kept_bytes += size;
                inner.slot(session).newest = Some(newest);
            }
        }
        inner.slot(session).in_flight += 1;
        drop(inner);
        if unready {
            self.live.set_summary_ready(session, false);
        }
        InFlight { inner: self.inner.clone(), session: session.to_owned() }
    }

    /// The session compacts: its kept request stands for a conversation about to be
    /// replaced, so it is not forked again.
    pub fn compacting(&self, session: &str) {
        let mut inner = self.lock();
        let slot = inner.slot(session);
        let old = slot.newest.take().map_or(0, |n| n.body.len());
        slot.newest_cover = None;
        inner.kept_bytes -= old;
        drop(inner);
        self.live.set_summary_ready(session, false);
    }

    /// Whether the session's prepared summary (the lookup [`Preparer::prepared`] does)
    /// covers its newest request exactly.
    pub fn summary_ready(&self, session: &str) -> bool {
        let Some(cover) = self.lock().slots.get(session).and_then(|s| s.newest_cover.clone()) else { return false };
        self.prepared(session).0.is_some_and(|prepared| prepared.covers_exactly(&cover))
    }

    /// The session's prepared summary, if any (from memory, else once from disk), and
    /// whether a preparation is running.
    pub fn prepared(&self, session: &str) -> (Option<Arc<Prepared>>, bool) {
        let look = {
            let mut inner = self.lock();
            let slot = inner.slot(session);
            if slot.prepared.is_some() || slot.looked_on_disk || self.store.is_none() {
                return (slot.prepared.clone(), slot.preparing);
            }
            slot.looked_on_disk = true;
            true
        };
        let loaded = if look { self.store.as_ref().and_then(|s| s.load(session)).map(Arc::new) } else { None };
        let mut inner = self.lock();
        let slot = inner.slot(session);
        if slot.prepared.is_none() {
            slot.tried_at_tokens = slot.tried_at_tokens.or(loaded.as_ref().map(|p| p.at_tokens));
            slot.prepared = loaded;
        }
        (slot.prepared.clone(), slot.preparing)
    }

    /// Waits, at most `limit`, until no preparation of `session` runs; whether none does.
    pub async fn preparation_ended(&self, session: &str, limit: Duration) -> bool {
        // Subscribed before the first look, so an end between the look and the wait
        // still wakes it.
        let mut ended = self.ended.subscribe();
        let running = || self.lock().slots.get(session).is_some_and(|s| s.preparing);
        let wait = async {
            while running() {
                if ended.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok() && !running()
    }

    /// Looks at every session once a second and starts the preparations due, until the
    /// gateway stops.
    pub async fn run(self: Arc<Self>, gateway: Arc<Gateway>) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for (session, newest, tokens, ttl) in self.due() {
                let me = self.clone();
                let gateway = gateway.clone();
                tokio::spawn(async move { me.prepare(gateway, session, newest, tokens, ttl).await });
            }
        }
    }

    /// The sessions to prepare now, marked as preparing, with the context they stand at
    /// and their cache's lifetime.
    fn due(&self) -> Vec<(String, Newest, u64, u64)> {
        let mut inner = self.lock();
        let mut out = Vec::new();
        for (session, slot) in &mut inner.slots {
            let Some(newest) = &slot.newest else { continue };
            if slot.preparing {
                continue;
            }
            let Some(live) = self.live.latest(session) else { continue };
            let figures = &live.figures;
            let tokens = live.usage().context_tokens();
            let now = SessionNow {
                model: &newest.model,
                tokens,
                idle_seconds: slot.answered_at.map_or(0, |at| at.elapsed().as_secs()),
                cache_ttl_seconds: figures.cache_ttl_seconds,
                in_flight: slot.in_flight,
                prepared_at_tokens: slot.tried_at_tokens,
                have_request: true,
            };
            match decide(&self.settings, &now) {
                PrepareDecision::Prepare(reason) => {
                    tracing::info!(session = %session, tokens, ?reason, "gateway: preparing the session's summary");
                    slot.preparing = true;
                    slot.tried_at_tokens = Some(tokens);
                    out.push((session.clone(), newest.clone(), tokens, figures.cache_ttl_seconds));
                }
                PrepareDecision::No(NotPrepared::UnpricedModel) if !slot.said_unpriced => {
                    slot.said_unpriced = true;
                    tracing::info!(
                        session = %session,
                        model = %newest.model,
                        "gateway: not preparing: the price table does not know the model, so what a preparation costs could not be told"
                    );
                }
                _ => {}
            }
        }
        out
    }

    async fn prepare(&self, gateway: Arc<Gateway>, session: String, newest: Newest, tokens: u64, ttl: u64) {
        let result = self.fork(&gateway, &session, &newest, tokens, ttl).await;
        let mut inner = self.lock();
        let slot = inner.slot(&session);
        slot.preparing = false;
        slot.forked_at = Some(Instant::now());
        match result {
            Ok(prepared) => {
                tracing::info!(
                    session = %session,
                    covered = prepared.covered,
                    input = prepared.usage.input_tokens,
                    cache_read = prepared.usage.cache_read_input_tokens,
                    cache_write = prepared.usage.cache_creation_input_tokens,
                    output = prepared.usage.output_tokens,
                    "gateway: summary prepared"
                );
                // The fork read the whole of the kept request: when that is still the
                // session's newest, what identifies it is known now.
                if slot.newest.as_ref().is_some_and(|kept| kept.body == newest.body) {
                    slot.newest_cover = Some(Cover {
                        model: prepared.model.clone(),
                        shape: prepared.shape,
                        messages: prepared.covered,
                        prefix: prepared.prefix,
                    });
                }
                slot.prepared = Some(Arc::new(prepared));
            }
            Err(why) => tracing::warn!(session = %session, "gateway: the preparation failed: {why}"),
        }
        drop(inner);
        self.ended.send_modify(|n| *n += 1);
        let ready = self.summary_ready(&session);
        self.live.set_summary_ready(&session, ready);
    }

    /// Sends the fork and reads its reply into a record (saved before it is returned).
    async fn fork(
        &self,
        gateway: &Gateway,
        session: &str,
        newest: &Newest,
        tokens: u64,
        ttl: u64,
    ) -> Result<Prepared, String> {
        let conversation = read(&newest.body).map_err(|e| e.to_string())?;
        let values = conversation.values().map_err(|e| e.to_string())?;
        let body = fork::fork_body(&conversation);
        let url_text = ctxd_core::gateway::upstream_url(gateway.upstream.as_str(), &newest.target);
        let url = reqwest::Url::parse(&url_text).map_err(|e| e.to_string())?;
        let mut headers = newest.headers.clone();
        // The reply is read here, uncompressed; its length is the fork's.
        headers.remove(header::ACCEPT_ENCODING);
        headers.remove(header::CONTENT_LENGTH);
        let answer = gateway
            .client
            .post(url)
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| format!("the upstream cannot be reached: {}", e.without_url()))?;
        let status = answer.status();
        let kind =
            AnswerKind::from_content_type(answer.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()));
        let mut bytes = Vec::new();
        let mut answer = answer;
        while let Some(chunk) =
            answer.chunk().await.map_err(|e| format!("the answer broke off: {}", e.without_url()))?
        {
            if bytes.len() + chunk.len() > MAX_REPLY_BYTES {
                return Err(format!("the answer is longer than {MAX_REPLY_BYTES} bytes"));
            }
            bytes.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(format!("the upstream answered {status}"));
        }
        let (reply, usage) = instant::reply_of(kind, &bytes).ok_or("the answer reported no usage")?;
        // Spent whether or not the reply passes the check below.
        if let Some(prices) = ctxd_core::cache_state::prices_for(&conversation.model) {
            let entry = CostEntry {
                at: crate::session::actor::now_rfc3339(),
                session_id: session.to_owned(),
                model: conversation.model.clone(),
                kind: CostKind::Preparation,
                usage,
                usd: usage_cost_usd(prices, &usage, ttl),
                cold_rewrite_usd: 0.0,
            };
            self.record(entry).await;
        }
        let cap = threshold(&conversation.model)
            .map_or(ctxd_core::summary::DEFAULT_MAX_OUTPUT_TOKENS, ctxd_core::summary::offline_cap_tokens)
            .max(ctxd_core::summary::DEFAULT_MAX_OUTPUT_TOKENS);
        let values_for_check = values.clone();
        let reply = tokio::task::spawn_blocking(move || instant::checked_reply(&reply, &values_for_check, cap))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let prepared = Prepared {
            session_id: session.to_owned(),
            model: conversation.model.clone(),
            shape: conversation.shape().map_err(|e| e.to_string())?,
            covered: values.len(),
            prefix: PrefixHash::of(&values, values.len()).hash(),
            reply,
            usage,
            at_tokens: tokens,
        };
        if let Some(store) = &self.store
            && let Err(e) = store.save(&prepared)
        {
            tracing::warn!(session, error = %e, "gateway: a prepared summary cannot be saved; kept in memory only");
        }
        Ok(prepared)
    }
}

impl Preparer {
    /// Writes a ledger line (off the runtime's workers); a failure is said in the log.
    async fn record(&self, entry: CostEntry) {
        let Some(costs) = self.costs.clone() else { return };
        let kind = entry.kind;
        let session = entry.session_id.clone();
        let written = tokio::task::spawn_blocking(move || costs.append(&entry)).await;
        match written {
            Ok(Ok(())) => tracing::info!(session = %session, ?kind, "gateway: cost recorded"),
            Ok(Err(e)) => tracing::warn!(session = %session, error = %e, "gateway: a cost cannot be recorded"),
            Err(e) => tracing::warn!(session = %session, error = %e, "gateway: a cost cannot be recorded"),
        }
    }

    /// A compaction of `session` was answered from `prepared` with `text`: the call it
    /// avoided is estimated (`ctxd_core::gateway::costs`) and recorded in the background.
    pub fn answered_instantly(self: &Arc<Self>, session: &str, prepared: &Prepared, text: &str) {
        let Some(prices) = ctxd_core::cache_state::prices_for(&prepared.model) else { return };
        let cache_used = {
            let mut inner = self.lock();
            let slot = inner.slot(session);
            slot.answered_at.into_iter().chain(slot.forked_at).max()
        };
        let live = self.live.latest(session);
        let ttl = live.as_ref().map_or(ctxd_core::cache_state::FIVE_MINUTES_SECS, |l| l.figures.cache_ttl_seconds);
        // Without the gateway's figures (it restarted): the context prepared at, taken
        // as cached and warm, the lower estimate.
        let (prompt_tokens, cached_tokens) = live.as_ref().map_or((prepared.at_tokens, prepared.at_tokens), |l| {
            let usage = l.usage();
            (usage.context_tokens(), usage.request_tokens())
        });
        let facts = CompactionFacts {
            prompt_tokens,
            cached_tokens,
            summary_tokens: ctxd_core::tally::estimate_tokens(text),
            cache_warm: cache_used.is_none_or(|at| at.elapsed().as_secs() < ttl),
            ttl_seconds: ttl,
        };
        let estimate = estimate_compaction_call(prices, &facts);
        let entry = CostEntry {
            at: crate::session::actor::now_rfc3339(),
            session_id: session.to_owned(),
            model: prepared.model.clone(),
            kind: CostKind::InstantCompaction,
            usage: estimate.usage,
            usd: estimate.call_usd,
            cold_rewrite_usd: estimate.cold_rewrite_usd,
        };
        let me = self.clone();
        tokio::spawn(async move { me.record(entry).await });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn newest(bytes: usize) -> Option<Newest> {
        Some(Newest {
            body: Bytes::from(vec![b'x'; bytes]),
            headers: HeaderMap::new(),
            target: "/v1/messages".into(),
            model: "claude-opus-5-5".into(),
        })
    }

    #[test]
    fn kept_bodies_stay_within_the_cap_and_in_flight_marks_count_down() {
        let preparer = Preparer::new(PrepareSettings::default(), None, None, LiveFigures::default());
        preparer.lock().max_kept_bytes = 1000;
        let a = preparer.sent("a", newest(400));
        let b = preparer.sent("b", newest(400));
        let side = preparer.sent("a", None);
        assert!(preparer.lock().slots["a"].newest.is_some(), "a side request leaves the kept one");
        let c = preparer.sent("c", newest(400));
        {
            let inner = preparer.lock();
            assert_eq!(inner.kept_bytes, 800);
            assert!(inner.slots["b"].newest.is_none(), "the least recently used body went first");
            assert_eq!(inner.slots["a"].in_flight, 2);
        }
        let too_big = preparer.sent("d", newest(2000));
        assert!(preparer.lock().slots["d"].newest.is_none(), "a body alone past the cap is not kept");
        drop((a, b, side, c, too_big));
        let inner = preparer.lock();
        assert!(inner.slots.values().all(|s| s.in_flight == 0 && s.answered_at.is_some()));
        assert_eq!(inner.kept_bytes, 800);
        drop(inner);
        preparer.compacting("a");
        assert_eq!(preparer.lock().kept_bytes, 400, "a compacting session's request is let go");
    }
}
