//! From OS events to the lists subscribers get: which interests an event bears on
//! ([`classify`], [`State::ingest`]), the trailing-edge quiet period with its cap
//! ([`State::flush_due`]), and the thread that runs both ([`serve`]).

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Instant;

use ctxd_core::memory::WatchKind;
use notify::EventKind;
use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify_debouncer_full::{DebounceEventResult, DebouncedEvent};

use super::state::{Shared, State};
use super::{MAX_DELAY_FACTOR, SubscriptionId};

/// How an event bears on the paths it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// The contents or metadata of the path changed.
    Content,
    /// The path appeared, disappeared or was renamed: folders' entries and watches change.
    Structural,
}

fn classify(kind: &EventKind) -> Option<Class> {
    match kind {
        EventKind::Create(_) | EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_)) => Some(Class::Structural),
        EventKind::Modify(_) | EventKind::Any => Some(Class::Content),
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => Some(Class::Content),
        EventKind::Access(_) | EventKind::Other => None,
    }
}

impl State {
    /// Matches a batch from the debouncer to subscribers. Quiet periods are counted from
    /// when each change happened (the debouncer's own timestamp), not from when the
    /// debouncer handed it over: the time it held the event to pair renames is part of
    /// the quiet period rather than added to it.
    pub(super) fn ingest(&mut self, events: Vec<DebouncedEvent>, now: Instant) {
        let mut hits: Vec<(SubscriptionId, PathBuf, Instant)> = Vec::new();
        let mut reconcile = false;
        for event in &events {
            let at = event.time.min(now);
            if event.need_rescan() {
                // Events were lost: anything may have changed.
                tracing::debug!("watch events were dropped by the OS; reporting every path");
                reconcile = true;
                for (id, sub) in &self.subs {
                    hits.extend(sub.targets.keys().map(|path| (*id, path.clone(), at)));
                }
                continue;
            }
            let Some(class) = classify(&event.kind) else {
                continue;
            };
            for path in &event.paths {
                self.match_path(path, class, at, &mut hits);
                if class == Class::Structural {
                    if self.armed.contains_key(path) {
                        self.stale.insert(path.clone());
                        reconcile = true;
                    }
                    let at_or_above_need = self
                        .needs
                        .range::<Path, _>((Bound::Included(path.as_path()), Bound::Unbounded))
                        .next()
                        .is_some_and(|(need, _)| need.starts_with(path));
                    reconcile |= at_or_above_need;
                }
            }
        }
        if reconcile {
            self.reconcile();
        }
        for (id, path, at) in hits {
            let Some(sub) = self.subs.get_mut(&id) else {
                continue;
            };
            sub.pending.insert(path);
            let first = sub.first_pending.map_or(at, |first| first.min(at));
            sub.first_pending = Some(first);
            // Trailing edge: one period after the latest change, within the cap.
            let quiet_until = at + self.debounce;
            let due = sub.due.map_or(quiet_until, |due| due.max(quiet_until));
            sub.due = Some(due.min(first + self.debounce * MAX_DELAY_FACTOR));
        }
    }

    /// Collects the interests an event on `path`, which happened `at`, bears on.
    fn match_path(&self, path: &Path, class: Class, at: Instant, hits: &mut Vec<(SubscriptionId, PathBuf, Instant)>) {
        // The path itself and, for a folder that appeared, vanished or moved, everything
        // below it.
        let at_or_below = self
            .interests
            .range::<Path, _>((Bound::Included(path), Bound::Unbounded))
            .take_while(|(interest, _)| interest.starts_with(path));
        for (interest, subs) in at_or_below {
            if interest.as_path() != path && class != Class::Structural {
                continue;
            }
            hits.extend(subs.keys().map(|id| (*id, interest.clone(), at)));
        }
        // A listed folder whose entries changed.
        if class == Class::Structural
            && let Some((parent, subs)) = path.parent().and_then(|p| self.interests.get_key_value(p))
        {
            hits.extend(
                subs.iter().filter(|(_, kind)| **kind == WatchKind::Dir).map(|(id, _)| (*id, parent.clone(), at)),
            );
        }
    }

    /// Sends what is due and returns when the next delivery is due.
    pub(super) fn flush_due(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut gone = Vec::new();
        for (id, sub) in &mut self.subs {
            let Some(due) = sub.due else {
                continue;
            };
            if due > now {
                next = Some(next.map_or(due, |next| next.min(due)));
                continue;
            }
            let paths: Vec<PathBuf> = std::mem::take(&mut sub.pending).into_iter().collect();
            sub.first_pending = None;
            sub.due = None;
            if !paths.is_empty() && sub.tx.send(paths).is_err() {
                gone.push(*id);
            }
        }
        // A receiver that is gone without unsubscribing still frees its watches.
        for id in gone {
            self.remove_sub(id);
        }
        next
    }
}

/// The service loop: takes the debouncer's batches, matches them to subscribers, and
/// delivers when each subscriber's quiet period is over. Ends when the watcher is
/// dropped (the debouncer, and with it the sending side, goes away).
pub(super) fn serve(shared: Weak<Shared>, events: mpsc::Receiver<DebounceEventResult>) {
    let mut due: Option<Instant> = None;
    loop {
        let message = match due {
            None => match events.recv() {
                Ok(message) => Some(message),
                Err(_) => return,
            },
            Some(at) => match events.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(message) => Some(message),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            },
        };
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut state = shared.lock();
        match message {
            Some(Ok(batch)) => state.ingest(batch, Instant::now()),
            Some(Err(errors)) => state.backend_errors(errors),
            None => {}
        }
        due = state.flush_due(Instant::now());
    }
}
