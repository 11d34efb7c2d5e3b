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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime};

use ctxd_core::memory::WatchKind;
use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify::{EventKind, RecursiveMode};
use notify_debouncer_full::{DebounceEventResult, DebouncedEvent, Debouncer, RecommendedCache};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

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

/// What a file (or folder) looked like when it was last seen, to tell later whether it
/// changed without a watch. Compares modification time, size, identity (a rename over
/// the file makes a new inode) and, on Unix, the status-change time (which tools that
/// restore an old modification time cannot set back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    identity: (u64, u64),
    status_changed: (i64, i64),
}

impl FileStamp {
    /// The stamp of what is at `path` now, following symlinks; `None` when nothing is
    /// there (or it cannot be looked at).
    pub fn of(path: &Path) -> Option<FileStamp> {
        let meta = std::fs::metadata(path).ok()?;
        #[cfg(unix)]
        let (identity, status_changed) = {
            use std::os::unix::fs::MetadataExt;
            ((meta.dev(), meta.ino()), (meta.ctime(), meta.ctime_nsec()))
        };
        #[cfg(not(unix))]
        let (identity, status_changed) = ((0, 0), (0, 0));
        Some(FileStamp { modified: meta.modified().ok(), len: meta.len(), identity, status_changed })
    }

    pub fn modified(&self) -> Option<SystemTime> {
        self.modified
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The paths whose stamp now differs from the one seen (`None`: it did not exist), in
/// the order given. The fallback for a [`Watcher::degraded`] watcher: one `stat` per
/// path, cheap enough to run before each request.
pub fn changed_since(seen: &[(PathBuf, Option<FileStamp>)]) -> Vec<PathBuf> {
    seen.iter().filter(|(path, stamp)| FileStamp::of(path) != *stamp).map(|(path, _)| path.clone()).collect()
}

/// One look at every watched path for a [`Watcher::degraded`] watcher: returns the paths
/// that changed since `seen` (the stamps kept from the previous look) and the stamps to
/// keep for the next one.
///
/// `memory` are memory sources: one seen before is reported when its stamp differs; one
/// not seen before (found by the last rebuild, which just read it) gets its first stamp.
/// `reads` are the read files with what was read: one not seen before was read since the
/// previous look, so it is compared by content with what the agent read, and reported if
/// that differs (or is gone); a change between the read and this look is not lost.
/// Blocking: a `stat` per path, and a read per file read since the previous look.
pub fn look_again(
    seen: &[(PathBuf, Option<FileStamp>)],
    memory: Vec<PathBuf>,
    reads: &[ctxd_core::ledger::LedgerEntry],
) -> (Vec<PathBuf>, Vec<(PathBuf, Option<FileStamp>)>) {
    let before: HashMap<&Path, Option<FileStamp>> = seen.iter().map(|(path, stamp)| (path.as_path(), *stamp)).collect();
    let mut now: BTreeMap<PathBuf, Option<FileStamp>> = BTreeMap::new();
    let mut changed = BTreeSet::new();
    for path in memory {
        let stamp = FileStamp::of(&path);
        if before.get(path.as_path()).is_some_and(|old| *old != stamp) {
            changed.insert(path.clone());
        }
        now.insert(path, stamp);
    }
    for entry in reads {
        let path = PathBuf::from(&entry.path);
        if now.contains_key(&path) && !before.contains_key(path.as_path()) {
            continue;
        }
        let stamp = FileStamp::of(&path);
        let differs = match before.get(path.as_path()) {
            Some(old) => *old != stamp,
            None => match std::fs::read(&path) {
                Ok(bytes) => ctxd_core::ledger::has_changed(entry, &String::from_utf8_lossy(&bytes)),
                Err(_) => true,
            },
        };
        if differs {
            changed.insert(path.clone());
        }
        now.insert(path, stamp);
    }
    (changed.into_iter().collect(), now.into_iter().collect())
}

struct Shared {
    state: Mutex<State>,
    degraded: Arc<AtomicBool>,
    next_id: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock leaves maps that are still consistent enough to serve.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct State {
    backend: Option<Backend>,
    debounce: Duration,
    subs: HashMap<SubscriptionId, Sub>,
    /// Every path some subscriber wants, and who wants it how. Sorted so the paths below
    /// a changed directory are one range.
    interests: BTreeMap<PathBuf, Wanters>,
    /// Directories whose events reveal changes to interests: a file's parent, a listed
    /// folder and its parent. Each rests on the watch of its nearest existing ancestor.
    needs: BTreeMap<PathBuf, Need>,
    /// Directories watched with the OS, with how many needs rest on each.
    armed: HashMap<PathBuf, usize>,
    /// Watched directories that were removed, renamed or replaced: their OS watch may be
    /// dead or follow a folder that is now elsewhere.
    stale: BTreeSet<PathBuf>,
    degraded: Arc<AtomicBool>,
    warned_limit: bool,
    warned_dirs: HashSet<PathBuf>,
}

/// Who wants one path watched, and how. Nearly always one subscriber, kept inline: a
/// session can watch thousands of read files, and a map per path would cost more than
/// the path.
enum Wanters {
    One(SubscriptionId, WatchKind),
    Many(Vec<(SubscriptionId, WatchKind)>),
}

impl Default for Wanters {
    fn default() -> Self {
        Wanters::Many(Vec::new())
    }
}

impl Wanters {
    fn insert(&mut self, id: SubscriptionId, kind: WatchKind) {
        match self {
            Wanters::One(only, k) if *only == id => *k = kind,
            Wanters::One(only, k) => *self = Wanters::Many(vec![(*only, *k), (id, kind)]),
            Wanters::Many(list) if list.is_empty() => *self = Wanters::One(id, kind),
            Wanters::Many(list) => match list.iter_mut().find(|(i, _)| *i == id) {
                Some(slot) => slot.1 = kind,
                None => list.push((id, kind)),
            },
        }
    }

    fn remove(&mut self, id: &SubscriptionId) {
        match self {
            Wanters::One(only, _) if only == id => *self = Wanters::Many(Vec::new()),
            Wanters::One(..) => {}
            Wanters::Many(list) => list.retain(|(i, _)| i != id),
        }
    }

    fn is_empty(&self) -> bool {
        matches!(self, Wanters::Many(list) if list.is_empty())
    }

    fn iter(&self) -> impl Iterator<Item = (&SubscriptionId, &WatchKind)> {
        let (one, many) = match self {
            Wanters::One(id, kind) => (Some((id, kind)), &[][..]),
            Wanters::Many(list) => (None, list.as_slice()),
        };
        one.into_iter().chain(many.iter().map(|(id, kind)| (id, kind)))
    }

    fn keys(&self) -> impl Iterator<Item = &SubscriptionId> {
        self.iter().map(|(id, _)| id)
    }
}

struct Need {
    refs: usize,
    /// The directory whose OS watch covers this need; `None` when none could be armed.
    armed_at: Option<PathBuf>,
}

struct Sub {
    targets: BTreeMap<PathBuf, WatchKind>,
    tx: UnboundedSender<Vec<PathBuf>>,
    pending: BTreeSet<PathBuf>,
    first_pending: Option<Instant>,
    due: Option<Instant>,
}

impl Sub {
    fn new(tx: UnboundedSender<Vec<PathBuf>>) -> Self {
        Self { targets: BTreeMap::new(), tx, pending: BTreeSet::new(), first_pending: None, due: None }
    }
}

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

/// The directories whose events tell about `target`.
fn needs_of(path: &Path, kind: WatchKind) -> Vec<PathBuf> {
    let parent = path.parent().map(Path::to_path_buf);
    match kind {
        WatchKind::File => parent.into_iter().collect(),
        WatchKind::Dir => std::iter::once(path.to_path_buf()).chain(parent).collect(),
    }
}

fn collect_targets<T: Into<Target>>(targets: impl IntoIterator<Item = T>) -> BTreeMap<PathBuf, WatchKind> {
    let mut out = BTreeMap::new();
    for target in targets {
        let Target { path, kind } = target.into();
        if !path.is_absolute() || path.parent().is_none() {
            tracing::debug!(path = %path.display(), "not watched: not an absolute path below a folder");
            continue;
        }
        // A folder also asked for as a file is reported for both reasons.
        let slot = out.entry(path).or_insert(kind);
        if kind == WatchKind::Dir {
            *slot = WatchKind::Dir;
        }
    }
    out
}

fn nearest_existing_dir(path: &Path) -> Option<PathBuf> {
    path.ancestors().find(|dir| dir.is_dir()).map(Path::to_path_buf)
}

/// Whether a watch error means the OS ran out of watches (or of descriptors for them).
fn is_limit(err: &notify::Error) -> bool {
    const EMFILE: i32 = 24;
    match &err.kind {
        notify::ErrorKind::MaxFilesWatch => true,
        notify::ErrorKind::Io(io) => io.kind() == std::io::ErrorKind::StorageFull || io.raw_os_error() == Some(EMFILE),
        _ => false,
    }
}

enum Armed {
    Yes,
    /// The directory vanished before the watch was added; try its parent.
    Gone,
    Failed,
}

impl State {
    fn new(backend: Option<Backend>, debounce: Duration, degraded: Arc<AtomicBool>) -> Self {
        Self {
            backend,
            debounce,
            subs: HashMap::new(),
            interests: BTreeMap::new(),
            needs: BTreeMap::new(),
            armed: HashMap::new(),
            stale: BTreeSet::new(),
            degraded,
            warned_limit: false,
            warned_dirs: HashSet::new(),
        }
    }

    fn set_targets(&mut self, id: SubscriptionId, new: BTreeMap<PathBuf, WatchKind>) {
        let Some(sub) = self.subs.get_mut(&id) else {
            tracing::debug!(?id, "update of an unknown subscription ignored");
            return;
        };
        let old = std::mem::replace(&mut sub.targets, new.clone());
        sub.pending.retain(|path| new.contains_key(path));
        if sub.pending.is_empty() {
            sub.first_pending = None;
            sub.due = None;
        }

        for path in old.keys() {
            if let Some(subs) = self.interests.get_mut(path) {
                subs.remove(&id);
                if subs.is_empty() {
                    self.interests.remove(path);
                }
            }
        }
        for (path, kind) in &new {
            self.interests.entry(path.clone()).or_default().insert(id, *kind);
        }
        // New needs first, so a directory needed before and after keeps its watch.
        for (path, kind) in &new {
            for need in needs_of(path, *kind) {
                self.add_need(need);
            }
        }
        for (path, kind) in &old {
            for need in needs_of(path, *kind) {
                self.remove_need(&need);
            }
        }
    }

    fn add_targets(&mut self, id: SubscriptionId, extra: BTreeMap<PathBuf, WatchKind>) {
        let Some(sub) = self.subs.get_mut(&id) else {
            tracing::debug!(?id, "addition to an unknown subscription ignored");
            return;
        };
        // (path, how it was wanted before, how it is wanted now)
        let mut changed = Vec::new();
        for (path, kind) in extra {
            let old = sub.targets.get(&path).copied();
            if old == Some(WatchKind::Dir) || old == Some(kind) {
                continue;
            }
            sub.targets.insert(path.clone(), kind);
            changed.push((path, old, kind));
        }
        for (path, old, kind) in changed {
            self.interests.entry(path.clone()).or_default().insert(id, kind);
            for need in needs_of(&path, kind) {
                self.add_need(need);
            }
            for need in old.map(|old| needs_of(&path, old)).unwrap_or_default() {
                self.remove_need(&need);
            }
        }
    }

    fn remove_sub(&mut self, id: SubscriptionId) {
        if self.subs.contains_key(&id) {
            self.set_targets(id, BTreeMap::new());
            self.subs.remove(&id);
        }
    }

    fn add_need(&mut self, need: PathBuf) {
        if let Some(entry) = self.needs.get_mut(&need) {
            entry.refs += 1;
            return;
        }
        let armed_at = self.arm_nearest(&need);
        self.needs.insert(need, Need { refs: 1, armed_at });
    }

    fn remove_need(&mut self, need: &Path) {
        let Some(entry) = self.needs.get_mut(need) else {
            return;
        };
        entry.refs -= 1;
        if entry.refs > 0 {
            return;
        }
        let armed_at = entry.armed_at.take();
        self.needs.remove(need);
        if let Some(dir) = armed_at {
            self.disarm(&dir);
        }
    }

    /// Watches the nearest existing ancestor of `need` (or `need` itself).
    fn arm_nearest(&mut self, need: &Path) -> Option<PathBuf> {
        let mut dir = nearest_existing_dir(need)?;
        loop {
            match self.arm(&dir) {
                Armed::Yes => return Some(dir),
                Armed::Gone => dir = nearest_existing_dir(dir.parent()?)?,
                Armed::Failed => return None,
            }
        }
    }

    fn arm(&mut self, dir: &Path) -> Armed {
        if let Some(count) = self.armed.get_mut(dir) {
            *count += 1;
            return Armed::Yes;
        }
        let Some(backend) = self.backend.as_mut() else {
            return Armed::Failed;
        };
        match backend.watch(dir, RecursiveMode::NonRecursive) {
            Ok(()) => {
                // From here on a change in `dir` is delivered: what a test waits for
                // before it makes one.
                tracing::debug!(dir = %dir.display(), "watching");
                self.armed.insert(dir.to_path_buf(), 1);
                Armed::Yes
            }
            Err(err) if matches!(err.kind, notify::ErrorKind::PathNotFound) => Armed::Gone,
            Err(err) => {
                self.watch_failed(dir, &err);
                Armed::Failed
            }
        }
    }

    fn disarm(&mut self, dir: &Path) {
        let Some(count) = self.armed.get_mut(dir) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        self.armed.remove(dir);
        self.stale.remove(dir);
        if let Some(backend) = self.backend.as_mut()
            && let Err(err) = backend.unwatch(dir)
        {
            // Usually the watch died with its directory.
            tracing::debug!(dir = %dir.display(), "unwatch: {err}");
        }
    }

    fn watch_failed(&mut self, dir: &Path, err: &notify::Error) {
        self.degraded.store(true, Ordering::Relaxed);
        if is_limit(err) {
            if !self.warned_limit {
                self.warned_limit = true;
                tracing::warn!(
                    dir = %dir.display(),
                    "the OS limit on file watches is reached ({err}); changed files will be \
                     found by comparing modification times before each request"
                );
            }
        } else if self.warned_dirs.insert(dir.to_path_buf()) {
            tracing::warn!(
                dir = %dir.display(),
                "cannot watch directory ({err}); changes in it will be found by comparing \
                 modification times before each request"
            );
        }
    }

    /// Moves each need's watch to its nearest existing ancestor as it is now, and renews
    /// watches that may have died.
    fn reconcile(&mut self) {
        for dir in std::mem::take(&mut self.stale) {
            if self.armed.remove(&dir).is_none() {
                continue;
            }
            if let Some(backend) = self.backend.as_mut() {
                // Fails when the OS already dropped the watch with the directory.
                let _ = backend.unwatch(&dir);
            }
            for need in self.needs.values_mut() {
                if need.armed_at.as_deref() == Some(dir.as_path()) {
                    need.armed_at = None;
                }
            }
        }
        let paths: Vec<PathBuf> = self.needs.keys().cloned().collect();
        for path in paths {
            let have = self.needs.get(&path).and_then(|need| need.armed_at.clone());
            if nearest_existing_dir(&path) == have {
                continue;
            }
            let now = self.arm_nearest(&path);
            if let Some(old) = have {
                self.disarm(&old);
            }
            if let Some(need) = self.needs.get_mut(&path) {
                need.armed_at = now;
            }
        }
    }

    /// Matches a batch from the debouncer to subscribers. Quiet periods are counted from
    /// when each change happened (the debouncer's own timestamp), not from when the
    /// debouncer handed it over: the time it held the event to pair renames is part of
    /// the quiet period rather than added to it.
    fn ingest(&mut self, events: Vec<DebouncedEvent>, now: Instant) {
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

    fn backend_errors(&mut self, errors: Vec<notify::Error>) {
        for err in errors {
            if is_limit(&err) {
                let dir = err.paths.first().cloned().unwrap_or_default();
                self.watch_failed(&dir, &err);
            } else {
                tracing::debug!("file watcher error: {err}");
            }
        }
    }

    /// Sends what is due and returns when the next delivery is due.
    fn flush_due(&mut self, now: Instant) -> Option<Instant> {
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
fn serve(shared: Weak<Shared>, events: mpsc::Receiver<DebounceEventResult>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::time::timeout;

    const DEBOUNCE: Duration = Duration::from_millis(50);
    /// Generous: a loaded test machine can be slow, and no test asserts a tight bound.
    const WAIT: Duration = Duration::from_secs(5);
    /// Long enough after a delivery that a second one for the same change would show.
    const SETTLE: Duration = Duration::from_millis(400);

    async fn next(sub: &mut Subscription) -> Vec<PathBuf> {
        match timeout(WAIT, sub.recv()).await {
            Ok(Some(paths)) => paths,
            Ok(None) => panic!("subscription ended"),
            Err(_) => panic!("no change delivered within {WAIT:?}"),
        }
    }

    async fn quiet(sub: &mut Subscription) {
        if let Ok(got) = timeout(SETTLE, sub.recv()).await {
            panic!("expected no delivery, got {got:?}");
        }
    }

    fn atomic_save(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp~");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[tokio::test]
    async fn a_write_is_delivered_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("CLAUDE.md");
        std::fs::write(&file, "one").unwrap();
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe([file.clone()]);

        std::fs::write(&file, "two").unwrap();
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        quiet(&mut sub).await;
        assert!(!watcher.degraded());
    }

    #[tokio::test]
    async fn a_file_created_after_subscribing_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("CLAUDE.local.md");
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe([file.clone()]);

        std::fs::write(&file, "new").unwrap();
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        quiet(&mut sub).await;
    }

    #[tokio::test]
    async fn atomic_saves_are_seen_every_time() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("notes.md");
        std::fs::write(&file, "v1").unwrap();
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe([file.clone()]);

        atomic_save(&file, "v2");
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        quiet(&mut sub).await;
        // A watch on the file itself would be dead now; the folder watch is not.
        atomic_save(&file, "v3");
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        quiet(&mut sub).await;
    }

    #[tokio::test]
    async fn delete_and_recreate_are_both_seen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.md");
        std::fs::write(&file, "x").unwrap();
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe([file.clone()]);

        std::fs::remove_file(&file).unwrap();
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        quiet(&mut sub).await;
        std::fs::write(&file, "y").unwrap();
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        quiet(&mut sub).await;
    }

    #[tokio::test]
    async fn a_burst_of_writes_is_one_delivery() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("busy.md");
        std::fs::write(&file, "0").unwrap();
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe([file.clone()]);

        for n in 0..20 {
            std::fs::write(&file, n.to_string()).unwrap();
        }
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        quiet(&mut sub).await;
    }

    #[tokio::test]
    async fn writes_closer_than_the_debounce_are_one_delivery() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("slow-burst.md");
        let watcher = Watcher::start(Duration::from_millis(300));
        let mut sub = watcher.subscribe([file.clone()]);

        // Gaps well under the 300 ms quiet period, spread over more than one period.
        for n in 0..6 {
            std::fs::write(&file, n.to_string()).unwrap();
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        if let Ok(got) = timeout(Duration::from_millis(800), sub.recv()).await {
            panic!("expected one delivery, got another: {got:?}");
        }
    }

    #[tokio::test]
    async fn each_subscriber_hears_only_its_own_paths() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.md");
        let b = dir.path().join("b.md");
        let shared = dir.path().join("shared.md");
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub_a = watcher.subscribe([a.clone(), shared.clone()]);
        let mut sub_b = watcher.subscribe([b.clone(), shared.clone()]);
        assert_eq!(watcher.watched_dirs(), vec![dir.path().to_path_buf()]);

        std::fs::write(&a, "a").unwrap();
        assert_eq!(next(&mut sub_a).await, vec![a.clone()]);
        quiet(&mut sub_b).await;

        std::fs::write(&b, "b").unwrap();
        assert_eq!(next(&mut sub_b).await, vec![b.clone()]);
        quiet(&mut sub_a).await;

        std::fs::write(&shared, "s").unwrap();
        assert_eq!(next(&mut sub_a).await, vec![shared.clone()]);
        assert_eq!(next(&mut sub_b).await, vec![shared.clone()]);
    }

    #[tokio::test]
    async fn changes_to_several_paths_come_together() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.md");
        let b = dir.path().join("sub/b.md");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe([a.clone(), b.clone()]);

        std::fs::write(&a, "a").unwrap();
        std::fs::write(&b, "b").unwrap();
        std::fs::write(&a, "a2").unwrap();
        assert_eq!(next(&mut sub).await, vec![a, b]);
        quiet(&mut sub).await;
    }

    #[tokio::test]
    async fn unsubscribing_stops_deliveries_and_frees_watches() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.md");
        let watcher = Watcher::start(DEBOUNCE);
        let mut kept = watcher.subscribe([file.clone()]);
        let mut gone = watcher.subscribe([file.clone()]);

        watcher.unsubscribe(gone.id());
        std::fs::write(&file, "x").unwrap();
        assert_eq!(next(&mut kept).await, vec![file.clone()]);
        // The stream of the removed subscriber ends without a delivery.
        assert_eq!(timeout(WAIT, gone.recv()).await.unwrap(), None);

        assert_eq!(watcher.watched_dirs(), vec![dir.path().to_path_buf()]);
        drop(kept);
        assert_eq!(watcher.watched_dirs(), Vec::<PathBuf>::new());
    }

    #[tokio::test]
    async fn update_replaces_the_paths() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("other")).unwrap();
        let old = dir.path().join("old.md");
        let new = dir.path().join("other/new.md");
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe([old.clone()]);

        sub.update([new.clone()]);
        assert_eq!(watcher.watched_dirs(), vec![dir.path().join("other")]);
        std::fs::write(&old, "x").unwrap();
        std::fs::write(&new, "y").unwrap();
        assert_eq!(next(&mut sub).await, vec![new.clone()]);
        quiet(&mut sub).await;
    }

    #[tokio::test]
    async fn added_paths_join_the_others() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let first = dir.path().join("first.md");
        let second = dir.path().join("sub/second.md");
        let rules = dir.path().join("rules");
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe([first.clone()]);

        sub.add([second.clone(), first.clone()]);
        assert_eq!(watcher.watched_dirs(), vec![dir.path().to_path_buf(), dir.path().join("sub")]);
        std::fs::write(&first, "1").unwrap();
        assert_eq!(next(&mut sub).await, vec![first.clone()]);
        std::fs::write(&second, "2").unwrap();
        assert_eq!(next(&mut sub).await, vec![second.clone()]);

        // A file wanted again as a folder: its entries count now too.
        sub.add([Target::file(&rules)]);
        sub.add([Target::dir(&rules)]);
        std::fs::create_dir(&rules).unwrap();
        assert_eq!(next(&mut sub).await, vec![rules.clone()]);
        quiet(&mut sub).await;
        assert!(watcher.watched_dirs().contains(&rules));
        std::fs::write(rules.join("r.md"), "r").unwrap();
        assert_eq!(next(&mut sub).await, vec![rules.clone()]);

        // Every watch is released with the subscription: adding twice counted once.
        drop(sub);
        assert_eq!(watcher.watched_dirs(), Vec::<PathBuf>::new());
    }

    #[tokio::test]
    async fn reading_and_listing_are_not_changes() {
        use ctxd_core::memory::MemoryFs;

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("CLAUDE.md");
        let rules = dir.path().join("rules");
        std::fs::write(&file, "x").unwrap();
        std::fs::create_dir(&rules).unwrap();
        std::fs::write(rules.join("r.md"), "r").unwrap();
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe([Target::file(&file), Target::dir(&rules)]);

        let fs = super::super::fs::RealFs::new();
        for _ in 0..3 {
            fs.read(&file).unwrap();
            fs.list_dir(&rules).unwrap();
            fs.read(&rules.join("r.md")).unwrap();
        }
        quiet(&mut sub).await;
    }

    #[tokio::test]
    async fn a_listed_folder_reports_new_and_removed_entries() {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join(".claude/rules");
        std::fs::create_dir_all(&rules).unwrap();
        std::fs::write(rules.join("old.md"), "x").unwrap();
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe([(rules.clone(), WatchKind::Dir)]);

        std::fs::write(rules.join("new.md"), "y").unwrap();
        assert_eq!(next(&mut sub).await, vec![rules.clone()]);
        quiet(&mut sub).await;
        std::fs::remove_file(rules.join("old.md")).unwrap();
        assert_eq!(next(&mut sub).await, vec![rules.clone()]);
        quiet(&mut sub).await;
    }

    #[tokio::test]
    async fn a_file_under_folders_that_do_not_exist_yet_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a/b/c/CLAUDE.md");
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe([file.clone()]);
        assert_eq!(watcher.watched_dirs(), vec![dir.path().to_path_buf()]);

        // Folders and file appear at once, before any deeper watch can exist.
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "x").unwrap();
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        quiet(&mut sub).await;
        assert_eq!(watcher.watched_dirs(), vec![dir.path().join("a/b/c")]);

        // The re-armed watch sees the next edit, an atomic save included.
        atomic_save(&file, "y");
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
    }

    #[tokio::test]
    async fn a_folder_removed_and_made_again_is_watched_again() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("proj");
        let file = folder.join("CLAUDE.md");
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(&file, "x").unwrap();
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe([file.clone()]);
        assert_eq!(watcher.watched_dirs(), vec![folder.clone()]);

        std::fs::remove_dir_all(&folder).unwrap();
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        quiet(&mut sub).await;
        assert_eq!(watcher.watched_dirs(), vec![dir.path().to_path_buf()]);

        std::fs::create_dir(&folder).unwrap();
        // Seen through the ancestor watch, then through the folder's own.
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        quiet(&mut sub).await;
        assert_eq!(watcher.watched_dirs(), vec![folder.clone()]);
        std::fs::write(&file, "again").unwrap();
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
    }

    #[tokio::test]
    async fn a_folder_renamed_away_and_replaced_is_watched_again() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("proj");
        let file = folder.join("CLAUDE.md");
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(&file, "x").unwrap();
        // The parent's own file keeps the parent watched too.
        let top = dir.path().join("CLAUDE.md");
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe([file.clone(), top.clone()]);

        // Swap in a new folder in one go, as some tools do.
        let staged = dir.path().join("proj.new");
        std::fs::create_dir(&staged).unwrap();
        std::fs::write(staged.join("CLAUDE.md"), "new").unwrap();
        std::fs::rename(&folder, dir.path().join("proj.old")).unwrap();
        std::fs::rename(&staged, &folder).unwrap();
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        quiet(&mut sub).await;

        std::fs::write(&file, "edited").unwrap();
        assert_eq!(next(&mut sub).await, vec![file.clone()]);
        quiet(&mut sub).await;
        // Edits in the old folder, now elsewhere, are not about this path any more.
        std::fs::write(dir.path().join("proj.old/CLAUDE.md"), "old").unwrap();
        quiet(&mut sub).await;
    }

    #[tokio::test]
    async fn memory_set_paths_can_be_passed_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let mut watched = BTreeMap::new();
        watched.insert(dir.path().join("CLAUDE.md"), WatchKind::File);
        watched.insert(dir.path().join(".claude/rules"), WatchKind::Dir);
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe(watched.iter());

        std::fs::create_dir_all(dir.path().join(".claude/rules")).unwrap();
        let got = next(&mut sub).await;
        assert_eq!(got, vec![dir.path().join(".claude/rules")]);
    }

    /// The three pieces together: discover memory files on the real disk, watch what the
    /// loader looked at, and rebuild only when told.
    #[tokio::test]
    async fn memory_files_found_on_disk_are_watched() {
        use ctxd_core::memory::{MemoryConfig, discover};

        let home = tempfile::tempdir().unwrap();
        let project = tempfile::tempdir().unwrap();
        let cwd = project.path();
        std::fs::write(cwd.join("CLAUDE.md"), "Use tabs.").unwrap();
        let config = MemoryConfig::new(home.path());
        let fs = super::super::fs::RealFs::new();

        let set = discover(cwd, &config, &fs);
        assert_eq!(set.active().count(), 1);
        let reads = fs.reads();
        assert!(reads > 0);
        let watcher = Watcher::start(DEBOUNCE);
        let mut sub = watcher.subscribe(set.watched().iter());

        // Nothing changed: nothing delivered, so the memoized context stays and the disk
        // is not touched again.
        quiet(&mut sub).await;
        assert_eq!(fs.reads(), reads);

        // An editor's atomic save of the project file, and a local file that did not exist.
        atomic_save(&cwd.join("CLAUDE.md"), "Use spaces.");
        std::fs::write(cwd.join("CLAUDE.local.md"), "Mine.").unwrap();
        assert_eq!(next(&mut sub).await, vec![cwd.join("CLAUDE.local.md"), cwd.join("CLAUDE.md")]);
        let set = discover(cwd, &config, &fs);
        let texts: Vec<&str> = set.active().map(|entry| entry.content.as_str()).collect();
        assert_eq!(texts, ["Use spaces.", "Mine."]);

        // A rule added to a rules folder that did not exist at discovery.
        sub.update(set.watched().iter());
        std::fs::create_dir_all(cwd.join(".claude/rules")).unwrap();
        std::fs::write(cwd.join(".claude/rules/style.md"), "Short lines.").unwrap();
        assert!(next(&mut sub).await.contains(&cwd.join(".claude/rules")));
    }

    #[test]
    fn handles_can_move_between_tasks() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Watcher>();
        send_sync::<Subscription>();
    }

    #[test]
    fn relative_paths_are_not_watched() {
        let targets = collect_targets([PathBuf::from("relative/CLAUDE.md"), PathBuf::from("/")]);
        assert!(targets.is_empty());
    }

    #[test]
    fn limit_errors_are_recognised() {
        assert!(is_limit(&notify::Error::new(notify::ErrorKind::MaxFilesWatch)));
        assert!(is_limit(&notify::Error::io(std::io::Error::from_raw_os_error(28))));
        assert!(is_limit(&notify::Error::io(std::io::Error::from_raw_os_error(24))));
        assert!(!is_limit(&notify::Error::path_not_found()));
        assert!(!is_limit(&notify::Error::io(std::io::Error::from_raw_os_error(13))));
    }

    /// The debouncer holds events for a while to pair renames; the quiet period runs
    /// from when the change happened, so that hold is not added on top of it.
    #[test]
    fn the_quiet_period_counts_from_the_change_not_from_its_hand_over() {
        let mut state = State::new(None, DEBOUNCE, Arc::new(AtomicBool::new(false)));
        let (tx, _rx) = unbounded_channel();
        let id = SubscriptionId(1);
        state.subs.insert(id, Sub::new(tx));
        let file = PathBuf::from("/w/CLAUDE.md");
        state.set_targets(id, collect_targets([file.clone()]));
        let modified = |time: Instant| DebouncedEvent {
            event: notify::Event::new(EventKind::Modify(ModifyKind::Any)).add_path(file.clone()),
            time,
        };

        let now = Instant::now() + Duration::from_secs(10);
        let changed = now - Duration::from_millis(30);
        state.ingest(vec![modified(changed)], now);
        assert_eq!(state.subs[&id].due, Some(changed + DEBOUNCE));
        // A newer change moves the deadline on; an older one handed over late does not
        // pull it back.
        state.ingest(vec![modified(now)], now);
        assert_eq!(state.subs[&id].due, Some(now + DEBOUNCE));
        state.ingest(vec![modified(changed)], now);
        assert_eq!(state.subs[&id].due, Some(now + DEBOUNCE));
        // Under a steady stream, the first change still caps the wait.
        let much_later = changed + DEBOUNCE * (MAX_DELAY_FACTOR + 2);
        state.ingest(vec![modified(much_later)], much_later);
        assert_eq!(state.subs[&id].due, Some(changed + DEBOUNCE * MAX_DELAY_FACTOR));
        // A timestamp from the future (it cannot be, but clocks are clocks) counts as now.
        let mut state = State::new(None, DEBOUNCE, Arc::new(AtomicBool::new(false)));
        let (tx, _rx) = unbounded_channel();
        state.subs.insert(id, Sub::new(tx));
        state.set_targets(id, collect_targets([file.clone()]));
        state.ingest(vec![modified(now + Duration::from_secs(5))], now);
        assert_eq!(state.subs[&id].due, Some(now + DEBOUNCE));
        assert_eq!(state.subs[&id].pending.iter().collect::<Vec<_>>(), [&file]);
    }

    #[test]
    fn hitting_the_limit_degrades_and_warns_once() {
        let degraded = Arc::new(AtomicBool::new(false));
        let mut state = State::new(None, DEBOUNCE, Arc::clone(&degraded));
        let limit = notify::Error::new(notify::ErrorKind::MaxFilesWatch);
        state.watch_failed(Path::new("/a"), &limit);
        state.watch_failed(Path::new("/b"), &limit);
        assert!(degraded.load(Ordering::Relaxed));
        assert!(state.warned_limit);
        assert!(state.warned_dirs.is_empty());
    }

    #[test]
    fn without_an_os_watcher_subscriptions_work_and_report_degraded() {
        let degraded = Arc::new(AtomicBool::new(true));
        let watcher = Watcher {
            shared: Arc::new(Shared {
                state: Mutex::new(State::new(None, DEBOUNCE, Arc::clone(&degraded))),
                degraded,
                next_id: AtomicU64::new(1),
            }),
        };
        let dir = tempfile::tempdir().unwrap();
        let mut sub = watcher.subscribe([dir.path().join("x.md")]);
        assert!(watcher.degraded());
        assert!(watcher.watched_dirs().is_empty());
        sub.update([dir.path().join("y.md")]);
        assert_eq!(sub.try_recv(), None);
    }

    #[test]
    fn stamps_notice_writes_renames_and_removal() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.md");
        let missing = dir.path().join("missing.md");
        let later = dir.path().join("later.md");
        std::fs::write(&file, "one").unwrap();

        let seen = vec![
            (file.clone(), FileStamp::of(&file)),
            (missing.clone(), FileStamp::of(&missing)),
            (later.clone(), FileStamp::of(&later)),
        ];
        assert_eq!(seen[1].1, None);
        assert_eq!(changed_since(&seen), Vec::<PathBuf>::new());

        // Same size, and possibly the same modification time on a coarse clock: the
        // rename still shows as a new file.
        atomic_save(&file, "two");
        std::fs::write(&later, "now").unwrap();
        assert_eq!(changed_since(&seen), vec![file.clone(), later.clone()]);

        let seen = vec![(file.clone(), FileStamp::of(&file))];
        std::fs::remove_file(&file).unwrap();
        assert_eq!(changed_since(&seen), vec![file.clone()]);
    }

    #[test]
    fn looking_again_finds_changed_sources_and_reads_changed_since_they_were_read() {
        use ctxd_core::ledger::{Ledger, ReadMarker};

        let dir = tempfile::tempdir().unwrap();
        let memory = dir.path().join("CLAUDE.md");
        let quiet_read = dir.path().join("quiet.rs");
        let edited_read = dir.path().join("edited.rs");
        std::fs::write(&memory, "v1").unwrap();
        for path in [&quiet_read, &edited_read] {
            std::fs::write(path, "fn a() {}\n").unwrap();
        }
        let mut ledger = Ledger::default();
        for path in [&quiet_read, &edited_read] {
            ledger.record_marker(&ReadMarker::measure(&path.display().to_string(), "fn a() {}\n", None, None, None));
        }
        let reads: Vec<_> = ledger.newest_first().into_iter().cloned().collect();

        // Read and then edited before the first look: found by content.
        std::fs::write(&edited_read, "fn b() {}\n").unwrap();
        let (changed, seen) = look_again(&[], vec![memory.clone()], &reads);
        assert_eq!(changed, vec![edited_read.clone()]);
        assert_eq!(seen.len(), 3);
        // Nothing touched: nothing found.
        let (changed, seen) = look_again(&seen, vec![memory.clone()], &reads);
        assert_eq!(changed, Vec::<PathBuf>::new());
        // A memory source saved atomically and a read file removed.
        atomic_save(&memory, "v2");
        std::fs::remove_file(&quiet_read).unwrap();
        let (changed, _) = look_again(&seen, vec![memory.clone()], &reads);
        assert_eq!(changed, vec![memory.clone(), quiet_read.clone()]);
    }

    #[test]
    fn a_disabled_watcher_is_degraded_and_arms_nothing() {
        let watcher = Watcher::disabled();
        let dir = tempfile::tempdir().unwrap();
        let _sub = watcher.subscribe([dir.path().join("CLAUDE.md")]);
        assert!(watcher.degraded());
        assert!(watcher.watched_dirs().is_empty());
    }

    /// Write-to-delivery latency over 30 edits with the default debounce. Asserts only
    /// that every edit arrives; run with `--nocapture` to see the distribution.
    #[tokio::test]
    async fn write_to_delivery_latency() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("timed.md");
        std::fs::write(&file, "start").unwrap();
        let watcher = Watcher::start(DEFAULT_DEBOUNCE);
        let mut sub = watcher.subscribe([file.clone()]);

        let mut samples = Vec::new();
        for n in 0..30 {
            let started = Instant::now();
            if n % 2 == 0 {
                std::fs::write(&file, format!("edit {n}")).unwrap();
            } else {
                atomic_save(&file, &format!("edit {n}"));
            }
            assert_eq!(next(&mut sub).await, vec![file.clone()]);
            samples.push(started.elapsed());
            // Let the quiet period pass so edits do not merge.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        samples.sort();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        println!(
            "write -> delivery with {DEFAULT_DEBOUNCE:?} debounce over {} edits: min {:?}, median {:?}, p90 {:?}, max {:?}",
            samples.len(),
            samples[0],
            at(0.5),
            at(0.9),
            samples[samples.len() - 1]
        );
    }
}
