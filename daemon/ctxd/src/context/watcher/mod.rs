//! One filesystem watcher for the whole daemon, shared by every session.
//!
//! A session's base context is memoized and rebuilt only when one of its memory files
//! changes, and the files the agent read must be re-checked when they change on disk.
//! Both need to hear about changes to a set of paths, some of which do not exist yet.
//! This module turns OS notifications into one short list per session: "these of your
//! paths changed".
//!
//! How it watches, and why:
//! - It watches the **parent directory** of each file, never the file: a watch on a file
//!   follows the inode, so it goes deaf after the first save that writes a temporary file
//!   and renames it over the original, and a file that does not exist yet cannot be
//!   watched at all. Events are matched to subscribers by full path.
//! - Directories are watched non-recursively and shared: each OS watch is
//!   reference-counted and removed when the last path that needed it goes away.
//! - A directory that does not exist yet is covered by a watch on its nearest existing
//!   ancestor. When something appears or disappears on the way down, the watches are
//!   recomputed (re-armed one level deeper, or moved up when a directory is removed), and
//!   every path below the changed directory is reported, since files may have appeared
//!   in it before its own watch was in place.
//! - Reads are not changes: opening, reading and listing produce events on Linux, and
//!   counting them would make each rebuild (which reads the files) trigger the next one.
//! - Delivery is trailing-edge: a subscriber gets one list once its paths have been
//!   quiet for the debounce period (or, under a steady stream of changes, at most
//!   [`MAX_DELAY_FACTOR`] periods after the first one). `notify-debouncer-full` sits in
//!   front with a short timeout to pair renames and drop duplicate events; it emits each
//!   event on its own once that event is old enough, so on its own a burst can straddle
//!   two of its ticks and arrive as two batches. The quiet period is counted from when
//!   each change happened (the debouncer's timestamp), not from when the debouncer let
//!   it go, so its hold (at most two of its timeouts, well under the debounce period)
//!   adds nothing to the delay: an edit is delivered one debounce period after it.
//! - When the OS runs out of watches (or a directory cannot be watched at all) the
//!   watcher reports [`Watcher::degraded`]; callers then compare [`FileStamp`]s with
//!   [`look_again`] before each request.
//!
//! The OS watcher and the debouncer run on their own threads, and a thread of this module
//! matches events to subscribers and times deliveries. [`Watcher::subscribe`],
//! [`Watcher::update`] and [`Watcher::unsubscribe`] take a short lock and add or remove
//! OS watches; they return quickly and are fine to call from an async task.
//!
//! Paths are compared as given: they must be absolute, and a symlinked file is watched as
//! the link (an edit to the file it points to elsewhere is not seen).
//!
//! The parts: this file is the API (the service, a subscription, what a subscriber can
//! ask for); `state` keeps who wants which path and which directories that needs;
//! `os_watches` keeps those directories watched with the OS as folders come and go;
//! `delivery` matches the OS events to subscribers and times the lists they get; `stamp`
//! is the fallback that compares files when the OS does not deliver.

mod delivery;
mod os_watches;
mod stamp;
mod state;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use ctxd_core::memory::WatchKind;
use notify_debouncer_full::{Debouncer, RecommendedCache};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use delivery::serve;
pub use stamp::{FileStamp, changed_since, look_again};
use state::{Shared, State, Sub, collect_targets};

/// The quiet period before a delivery when the caller has no reason to pick another.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(50);

/// Under a steady stream of changes a subscriber still hears at most this many debounce
/// periods after the first change it has not been told about.
pub const MAX_DELAY_FACTOR: u32 = 8;

/// The longest quiet period [`Watcher::start`] accepts.
const MAX_DEBOUNCE: Duration = Duration::from_secs(60);

/// Bounds of the debouncer's own timeout (and tick). It only has to pair the two halves
/// of a rename, which arrive together; longer would add latency, shorter would wake its
/// thread more often.
const STITCH_MIN: Duration = Duration::from_millis(5);
const STITCH_MAX: Duration = Duration::from_millis(25);

type Backend = Debouncer<notify::RecommendedWatcher, RecommendedCache>;

/// Identifies one subscriber (a session) to [`Watcher::update`] and
/// [`Watcher::unsubscribe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SubscriptionId(u64);

/// A path a subscriber wants to hear about.
///
/// A `File` is reported when it is created, written, has its metadata changed, is
/// removed, or is renamed to or from. A `Dir` (a folder whose entries were listed) is
/// reported when an entry is created, removed or renamed, or when the folder itself is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Target {
    pub path: PathBuf,
    pub kind: WatchKind,
}

impl Target {
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), kind: WatchKind::File }
    }

    pub fn dir(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into(), kind: WatchKind::Dir }
    }
}

impl From<PathBuf> for Target {
    fn from(path: PathBuf) -> Self {
        Self::file(path)
    }
}

impl From<&Path> for Target {
    fn from(path: &Path) -> Self {
        Self::file(path)
    }
}

impl From<(PathBuf, WatchKind)> for Target {
    fn from((path, kind): (PathBuf, WatchKind)) -> Self {
        Self { path, kind }
    }
}

/// So `MemorySet::watched().iter()` can be passed as it is.
impl From<(&PathBuf, &WatchKind)> for Target {
    fn from((path, kind): (&PathBuf, &WatchKind)) -> Self {
        Self { path: path.clone(), kind: *kind }
    }
}

/// The daemon-wide watcher service. Cheap to clone; the service stops when the last
/// clone (including those held by [`Subscription`]s) is dropped.
#[derive(Clone)]
pub struct Watcher {
    shared: Arc<Shared>,
}

/// One subscriber's interest and the stream of its changed paths. Dropping it removes
/// the interest.
pub struct Subscription {
    id: SubscriptionId,
    changes: UnboundedReceiver<Vec<PathBuf>>,
    watcher: Watcher,
}

impl Watcher {
    /// Starts the service. `debounce` is the quiet period after the last change before a
    /// subscriber is told ([`DEFAULT_DEBOUNCE`] unless there is a reason). Never fails:
    /// when the OS watcher cannot be created the service runs degraded, delivers
    /// nothing, and says so through [`Watcher::degraded`].
    pub fn start(debounce: Duration) -> Watcher {
        // Keeps deadline arithmetic far from overflow; nobody wants a longer quiet period.
        let debounce = debounce.min(MAX_DEBOUNCE);
        let degraded = Arc::new(AtomicBool::new(false));
        let (events_tx, events_rx) = mpsc::channel();
        let stitch = (debounce / 4).clamp(STITCH_MIN, STITCH_MAX);
        let backend = match notify_debouncer_full::new_debouncer(stitch, Some(stitch), events_tx) {
            Ok(backend) => Some(backend),
            Err(err) => {
                degraded.store(true, Ordering::Relaxed);
                tracing::warn!(
                    "cannot start the file watcher ({err}); changed files will be found by \
                     comparing modification times"
                );
                None
            }
        };
        let has_backend = backend.is_some();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(backend, debounce, Arc::clone(&degraded))),
            degraded,
            next_id: AtomicU64::new(1),
        });
        if has_backend {
            let weak = Arc::downgrade(&shared);
            let spawned =
                std::thread::Builder::new().name("ctxd-watch".to_owned()).spawn(move || serve(weak, events_rx));
            if let Err(err) = spawned {
                shared.degraded.store(true, Ordering::Relaxed);
                tracing::warn!("cannot start the file watcher thread ({err}); changes will not be delivered");
            }
        }
        Watcher { shared }
    }

    /// A watcher that asks the OS for nothing and reports [`Watcher::degraded`] from the
    /// start, so callers find changes by comparing stamps before each request
    /// ([`look_again`]). For filesystems whose changes the OS does not report (some
    /// network mounts), chosen with `CTXD_NO_WATCH=1`.
    pub fn disabled() -> Watcher {
        let degraded = Arc::new(AtomicBool::new(true));
        Watcher {
            shared: Arc::new(Shared {
                state: Mutex::new(State::new(None, DEFAULT_DEBOUNCE, Arc::clone(&degraded))),
                degraded,
                next_id: AtomicU64::new(1),
            }),
        }
    }

    /// Registers a subscriber interested in `targets` (plain paths are files). Paths that
    /// do not exist yet, even under folders that do not exist yet, are fine. The OS
    /// watches are in place when this returns, so subscribe before reading the files (or
    /// compare [`FileStamp`]s afterwards) to not miss a change made in between.
    pub fn subscribe<T: Into<Target>>(&self, targets: impl IntoIterator<Item = T>) -> Subscription {
        let id = SubscriptionId(self.shared.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, changes) = unbounded_channel();
        let mut state = self.shared.lock();
        state.subs.insert(id, Sub::new(tx));
        state.set_targets(id, collect_targets(targets));
        drop(state);
        Subscription { id, changes, watcher: self.clone() }
    }

    /// Replaces the subscriber's paths with `targets`. Pending changes to paths that are
    /// no longer wanted are dropped; to extend the set, pass the old paths too.
    pub fn update<T: Into<Target>>(&self, id: SubscriptionId, targets: impl IntoIterator<Item = T>) {
        let targets = collect_targets(targets);
        self.shared.lock().set_targets(id, targets);
    }

    /// Adds `targets` to the subscriber's paths and keeps the others. Costs what the new
    /// paths cost, however many the subscriber has: the way to follow one more read file.
    /// A path already wanted as a file and now as a folder is reported for both reasons.
    pub fn add<T: Into<Target>>(&self, id: SubscriptionId, targets: impl IntoIterator<Item = T>) {
        let targets = collect_targets(targets);
        self.shared.lock().add_targets(id, targets);
    }

    /// Removes the subscriber: its OS watches go when nobody else needs them, and its
    /// stream ends. Unknown or already removed ids are ignored.
    pub fn unsubscribe(&self, id: SubscriptionId) {
        self.shared.lock().remove_sub(id);
    }

    /// True once some path could not be watched: the OS limit on watches was reached
    /// (warned once), a directory refused a watch, or the watcher could not start. From
    /// then on callers should compare [`FileStamp`]s with [`look_again`] before each
    /// request, since changes to those paths will not be delivered.
    pub fn degraded(&self) -> bool {
        self.shared.degraded.load(Ordering::Relaxed)
    }

    /// The directories currently watched with the OS, sorted. For diagnostics and tests.
    pub fn watched_dirs(&self) -> Vec<PathBuf> {
        let state = self.shared.lock();
        let mut dirs: Vec<PathBuf> = state.armed.keys().cloned().collect();
        dirs.sort();
        dirs
    }
}

impl fmt::Debug for Watcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watcher").field("degraded", &self.degraded()).finish_non_exhaustive()
    }
}

impl Subscription {
    pub fn id(&self) -> SubscriptionId {
        self.id
    }

    /// The next list of this subscriber's paths that changed: sorted, without duplicates,
    /// never empty. `None` once the subscription was removed through
    /// [`Watcher::unsubscribe`].
    pub async fn recv(&mut self) -> Option<Vec<PathBuf>> {
        self.changes.recv().await
    }

    /// A list already waiting, if any.
    pub fn try_recv(&mut self) -> Option<Vec<PathBuf>> {
        self.changes.try_recv().ok()
    }

    /// [`Watcher::update`] for this subscription.
    pub fn update<T: Into<Target>>(&self, targets: impl IntoIterator<Item = T>) {
        self.watcher.update(self.id, targets);
    }

    /// [`Watcher::add`] for this subscription.
    pub fn add<T: Into<Target>>(&self, targets: impl IntoIterator<Item = T>) {
        self.watcher.add(self.id, targets);
    }

    /// The watcher this subscription belongs to (for [`Watcher::degraded`]).
    pub fn watcher(&self) -> &Watcher {
        &self.watcher
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.watcher.unsubscribe(self.id);
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription").field("id", &self.id).finish_non_exhaustive()
    }
}
